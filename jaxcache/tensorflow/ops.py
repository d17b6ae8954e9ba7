"""Submitting collectives on TensorFlow tensors to the jaxcache runtime (validation, names, run).

Eager tensors are handed to the runtime through DLPack (zero-copy for CPU tensors); the
results are written into NumPy buffers that become tensors with tf.convert_to_tensor. GPU
tensors are staged: TensorFlow copies them to the host (after the work that produced them),
their request counts as CUDA in the signature, and their results go back to their device.
Inside tf.function the same collectives run through tf.py_function: TensorFlow's automatic
control dependencies execute such stateful ops in program order, so every rank submits
them in the same order and a blocked op can never wait for one its own graph has not run.

Allreduce, broadcast and reducescatter results go into NumPy buffers the bridge sizes;
allgather and alltoall results are sized by the runtime from what the ranks agreed (a
different first dimension per rank, per-rank splits), so inside tf.function their first
dimension is unknown until they run.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref

import numpy as np
import tensorflow as tf

from .. import errors, submit
from ..compat import process_sets
from ..compat.process_sets import Resolved
from ..ops import naming, validation
from ..protocol import NUMPY_DTYPES, Device, Kind
from ..ops.reducescatter import scatter_rows


# ---------------------------------------------------------------------------------------------
# Validation


def np_dtype(dtype: tf.DType) -> np.dtype | None:
    try:
        d = np.dtype(dtype.as_numpy_dtype)
    except TypeError:
        return None
    return d if d in NUMPY_DTYPES else None


def as_tensor(x, fn: str, what: str):
    """Tensors, variables, IndexedSlices (densified) and NumPy arrays; TypeError for the rest."""
    if isinstance(x, tf.IndexedSlices):
        x = tf.convert_to_tensor(x)
    elif isinstance(x, tf.Variable) or (hasattr(x, "value") and hasattr(x, "assign")
                                        and hasattr(x, "dtype") and not isinstance(x, tf.Tensor)):
        x = tf.convert_to_tensor(x)  # a tf.Variable or a Keras variable: its current value
    elif isinstance(x, np.ndarray):
        x = tf.convert_to_tensor(x)
    elif not isinstance(x, tf.Tensor):
        raise TypeError(f"jaxcache.tensorflow.{fn}: {what} must be a tf.Tensor, tf.Variable, "
                        f"tf.IndexedSlices or np.ndarray, got {type(x).__name__}")
    if isinstance(x, tf.SparseTensor) or np_dtype(x.dtype) is None:
        raise TypeError(f"jaxcache.tensorflow.{fn}: {what} has unsupported dtype {x.dtype.name}; "
                        "supported: bool, (u)int8-64, float16, bfloat16, float32, float64, "
                        "complex64, complex128")
    return x


def check_reduction(x, op: str, prescale, postscale, fn: str, what: str) -> None:
    validation.check_reduction(np_dtype(x.dtype), op, prescale, postscale, f"tensorflow.{fn}", what)


def set_of(process_set, fn: str, member: bool = True) -> Resolved:
    """The registered process set a call names (resolved when the call is made or traced);
    with `member`, ValueError on a rank that is not a member."""
    return process_sets.resolve(process_set, f"tensorflow.{fn}", member)


def set_root(root_rank, ps: Resolved, fn: str) -> int:
    """A global root rank as the root's rank within `ps` (ValueError if it is not a member)."""
    return process_sets.set_root(root_rank, ps, f"tensorflow.{fn}")


def _global_set() -> Resolved:
    return process_sets.resolve(None, "tensorflow")


def reduce_args(op: str, prescale: float, postscale: float) -> tuple[int, float, float]:
    """Wire op code and scales. The runtime divides an 'average' (by the set's size, or
    with JAXCACHE_JOIN_AVERAGE_BY_SIZE=0 by the ranks that have not joined)."""
    return validation.REDUCE_OPS[op], float(prescale), float(postscale)


# ---------------------------------------------------------------------------------------------
# Errors: Horovod's TensorFlow ops fail with TensorFlow's classes, eagerly and in graphs (a
# tf.py_function passes an OpError's code on). Each class is also jaxcache's own.


class MismatchError(errors.MismatchError, tf.errors.FailedPreconditionError):
    """Ranks disagree on a collective: also tf.errors.FailedPreconditionError, as Horovod's."""

    def __init__(self, message: str):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class InvalidArgumentError(errors.InvalidArgumentError, tf.errors.InvalidArgumentError):
    """The ranks' arguments together are invalid: also tf.errors.InvalidArgumentError."""

    def __init__(self, message: str):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


_TENSORFLOW_CLASSES: dict[type, type] = {errors.MismatchError: MismatchError,
                                         errors.InvalidArgumentError: InvalidArgumentError}


@contextlib.contextmanager
def tensorflow_errors():
    """Re-raises a runtime error as its TensorFlow flavour (the same message)."""
    try:
        yield
    except errors.JaxcacheError as e:
        flavour = _TENSORFLOW_CLASSES.get(type(e))
        if flavour is None:
            raise
        raise flavour(str(e)) from e


# ---------------------------------------------------------------------------------------------
# Names


_per_graph: "weakref.WeakKeyDictionary[object, naming.Instances]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def auto_name(kind: str, name: str | None, fn: str) -> str:
    """The user's name if given; else tf.kind@call-site, with '#k' for the k-th instance of
    the site in one tf.function graph (naming.py's rule; eager calls complete before they
    return, so an eager call site keeps one name)."""
    validation.check_name(name, f"tensorflow.{fn}")
    if name is not None:
        return name
    base = f"tf.{kind}@{naming.call_site()}"
    if tf.executing_eagerly():
        return naming.Automatic(base)
    graph = tf.compat.v1.get_default_graph()
    with _lock:
        instances = _per_graph.setdefault(graph, naming.Instances())
        return naming.Automatic(instances.next(base))


# ---------------------------------------------------------------------------------------------
# Eager execution


def _on_gpu(x: tf.Tensor) -> bool:
    return "GPU" in (x.device or "").upper()


def _cpu(x: tf.Tensor) -> tf.Tensor:
    if _on_gpu(x):
        with tf.device("CPU:0"):
            return tf.identity(x)
    return x


def _device_kind(tensors) -> int:
    return Device.CUDA if any(_on_gpu(t) for t in tensors) else Device.CPU


def submit_eager(kind: int, names: list[str], groups: list[list[tf.Tensor]], *, op: int = 0,
                 prescale: float = 1.0, postscale: float = 1.0, root: int = 0,
                 process_set: Resolved | None = None) -> list[list[np.ndarray]]:
    """Submits one allreduce, broadcast or reducescatter request per (name, tensors) group,
    then waits for all; returns NumPy outputs.

    All requests are in flight together, so ranks may submit them in any order. root: a
    broadcast's root as a rank within the process set (default: the global set).
    """
    ps = process_set or _global_set()
    if kind == Kind.REDUCESCATTER:
        size, rank = ps.size, ps.rank
    in_flight, results, error = [], [], None
    for name, tensors in zip(names, groups):
        ins, outs = [], []
        for t in tensors:
            t = _cpu(t)  # a tf tensor exports DLPack: no copy
            shape = tuple(t.shape)
            if kind == Kind.REDUCESCATTER:
                shape = (scatter_rows(shape[0], size, rank), *shape[1:])
            ins.append(t)
            outs.append(np.empty(shape, np_dtype(t.dtype)))
        try:
            in_flight.append(submit.submit(
                kind, name, ins, outs, submit.codes_of(outs), op=op, prescale=prescale,
                postscale=postscale, root=root, device=_device_kind(tensors), process_set=ps.id,
                refuse_duplicate=not isinstance(name, naming.Automatic)))
        except BaseException as e:  # submit refused: still wait for what is already in flight
            error = e
            break
        results.append(outs)
    with tensorflow_errors():
        submit.wait_all(in_flight, error)
    return results


def submit_allocated_eager(kind: int, names: list[str], groups: list[list[tf.Tensor]],
                           splits: list | None = None,
                           process_set: Resolved | None = None
                           ) -> list[tuple[list[np.ndarray], list[int], int]]:
    """Submits one allgather or alltoall request per (name, tensors) group, then waits for all.

    Returns, per group, the outputs (sized by the runtime; views of its buffers), the
    agreed rows (allgather: `rows[t * size + r]`; alltoall: rows received from each rank;
    ranks and size of the process set) and, for an allgather, the number of ranks whose
    rows it holds (those that had not joined; else the set's size). splits (alltoall): per
    group, the rows sent to each rank, or None for equal blocks.
    """
    ps = process_set or _global_set()
    in_flight, error = [], None
    for i, (name, tensors) in enumerate(zip(names, groups)):
        ins = [_cpu(t) for t in tensors]
        codes = [NUMPY_DTYPES[np_dtype(t.dtype)] for t in ins]
        try:
            in_flight.append(submit.submit_allocated(
                kind, name, ins, codes, splits=(splits or [None] * len(groups))[i] or (),
                device=_device_kind(tensors), process_set=ps.id,
                refuse_duplicate=not isinstance(name, naming.Automatic)))
        except BaseException as e:  # submit refused: still wait for what is already in flight
            error = e
            break
    with tensorflow_errors():
        submit.wait_all(in_flight, error)
    out = []
    for pending, tensors in zip(in_flight, groups):
        arrays = [raw.view(np_dtype(t.dtype)).reshape(shape)
                  for (raw, shape), t in zip(pending.results(), tensors)]
        out.append((arrays, pending.rows(), pending.contributors() or ps.size))
    return out


def _to_tf(a: np.ndarray, like: tf.Tensor | None = None) -> tf.Tensor:
    """A tensor of `a`, on the GPU of `like` when `like` lives on one."""
    if like is not None and _on_gpu(like):
        with tf.device(like.device):
            return tf.identity(tf.convert_to_tensor(a))
    return tf.convert_to_tensor(a)


_last_collective: "weakref.WeakKeyDictionary[object, tf.Operation]" = weakref.WeakKeyDictionary()

# A py_function cannot fail with a chosen TensorFlow class (TensorFlow turns a ValueError or
# TypeError into InvalidArgument and anything else into Unknown), so inside a graph a mismatch
# comes back as a flag and the graph then fails as Horovod's op does, with
# tf.errors.FailedPreconditionError, by reading a variable that never exists. Every rank
# prints the message (the collective's name and each rank's value) on stderr.
MISMATCH_IN_GRAPH = "jaxcache.MismatchError: the ranks disagree on a collective (details on stderr)"


def _failed_precondition_if(failed: tf.Tensor) -> tf.Tensor:
    def fail():
        handle = tf.raw_ops.VarHandleOp(dtype=tf.int32, shape=[], shared_name=MISMATCH_IN_GRAPH)
        return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int32)

    return tf.cond(failed, fail, lambda: tf.constant(0, tf.int32))


def graph_collective(body, inputs: list, Tout: list) -> list[tf.Tensor]:
    """The graph op of a collective: tf.py_function(body, inputs, Tout), where `body`
    returns a list of tensors, failing with tf.errors.FailedPreconditionError on a mismatch.

    In a TF1 graph (a Session runs it) the op also runs after the graph's previous
    collective: a Session runs independent ops in any order on its few inter-op threads,
    each py_function blocks its thread until the other ranks join, so two ranks starting
    different collectives first could fill their pools and wait for each other forever.
    (Inside tf.function, automatic control dependencies already run stateful ops in
    program order.)"""

    def flagged(*tensors):
        try:
            return [*body(*tensors), tf.constant(False)]
        except errors.MismatchError as e:
            print(str(e), file=sys.stderr, flush=True)
            return [tf.zeros([], dtype) for dtype in Tout] + [tf.constant(True)]

    graph = tf.compat.v1.get_default_graph()
    in_session_graph = not graph.building_function
    previous = None
    if in_session_graph:
        with _lock:
            previous = _last_collective.get(graph)
    with tf.control_dependencies([] if previous is None else [previous]):
        *out, failed = tf.py_function(flagged, inputs, Tout=[*Tout, tf.bool])
    failed.set_shape([])
    guard = _failed_precondition_if(failed)
    with tf.control_dependencies([guard]):
        out = [tf.identity(o) for o in out]
    if in_session_graph:
        with _lock:
            _last_collective[graph] = guard.op
    return out


def run(kind: int, names: list[str], groups: list[list[tf.Tensor]], **kw) -> list[list[tf.Tensor]]:
    """Allreduce, broadcast or reducescatter requests, eagerly or (inside tf.function) through
    one tf.py_function for all of them.

    Inside tf.function the device kind in the signature is that of the tensors TensorFlow
    hands to the py_function (it decides where that op runs). `process_set` (a Resolved set,
    default the global one) is fixed when the function is traced.
    """
    flat = [t for g in groups for t in g]
    kw["process_set"] = ps = kw.get("process_set") or _global_set()
    if tf.executing_eagerly():
        return [[_to_tf(o, t) for o, t in zip(outs, g)]
                for outs, g in zip(submit_eager(kind, names, groups, **kw), groups)]
    sizes = [len(g) for g in groups]

    def body(*tensors):
        it = iter(tensors)
        regrouped = [[next(it) for _ in range(n)] for n in sizes]
        outs = submit_eager(kind, names, regrouped, **kw)
        return [_to_tf(o, t) for g_out, g_in in zip(outs, regrouped) for o, t in zip(g_out, g_in)]

    out = graph_collective(body, flat, [t.dtype for t in flat])
    if kind == Kind.REDUCESCATTER:
        size, rank = ps.size, ps.rank
    for o, t in zip(out, flat):
        shape = t.shape
        if kind == Kind.REDUCESCATTER:
            rows = None if shape[0] is None else scatter_rows(int(shape[0]), size, rank)
            shape = tf.TensorShape([rows]).concatenate(shape[1:])
        o.set_shape(shape)
    it = iter(out)
    return [[next(it) for _ in range(n)] for n in sizes]


def _unknown_rows(shape: tf.TensorShape) -> tf.TensorShape:
    # An allgather of scalars gives a vector; otherwise only the first dimension is unknown.
    return tf.TensorShape([None]) if shape.rank == 0 else tf.TensorShape([None]).concatenate(shape[1:])


def run_allocated(kind: int, names: list[str], groups: list[list[tf.Tensor]],
                  splits: list | None = None,
                  process_set: Resolved | None = None
                  ) -> list[tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]]:
    """Allgather or alltoall requests, eagerly or through one tf.py_function for all of them.

    Returns, per group, the result tensors, the agreed rows as an int32 tensor and the
    contributing ranks as an int32 scalar (see submit_allocated_eager). splits (alltoall):
    per group, None or a 1-D integer tensor.
    """
    splits = splits or [None] * len(groups)
    ps = process_set or _global_set()
    if tf.executing_eagerly():
        counts = [None if s is None else _check_splits(s) for s in splits]
        done = submit_allocated_eager(kind, names, groups, counts, ps)
        return [([_to_tf(o, t) for o, t in zip(outs, g)], tf.constant(rows, tf.int32),
                 tf.constant(contributors, tf.int32))
                for (outs, rows, contributors), g in zip(done, groups)]
    sizes = [len(g) for g in groups]
    with_splits = [i for i, s in enumerate(splits) if s is not None]
    flat = [t for g in groups for t in g] + [splits[i] for i in with_splits]

    def body(*tensors):
        it = iter(tensors)
        regrouped = [[next(it) for _ in range(n)] for n in sizes]
        counts = [None] * len(groups)
        for i in with_splits:
            counts[i] = _check_splits(next(it))
        done = submit_allocated_eager(kind, names, regrouped, counts, ps)
        return ([_to_tf(o, t) for (outs, _, _), g in zip(done, regrouped) for o, t in zip(outs, g)]
                + [tf.constant(rows, tf.int32) for _, rows, _ in done]
                + [tf.constant(contributors, tf.int32) for _, _, contributors in done])

    n_out, n_groups = sum(sizes), len(groups)
    out = graph_collective(body, flat, [t.dtype for t in flat[:n_out]] + [tf.int32] * (2 * n_groups))
    for o, t in zip(out, flat[:n_out]):
        o.set_shape(_unknown_rows(t.shape))
    tensors = iter(out[:n_out])
    rows, contributors = out[n_out:n_out + n_groups], out[n_out + n_groups:]
    for r in rows:
        r.set_shape([None])
    for c in contributors:
        c.set_shape([])
    return [([next(tensors) for _ in range(n)], r, c) for n, r, c in zip(sizes, rows, contributors)]


def _check_splits(splits) -> list[int]:
    if isinstance(splits, tf.Tensor):
        if not splits.dtype.is_integer:
            raise TypeError(f"jaxcache.tensorflow.alltoall: splits must be integers, got {splits.dtype.name}")
        splits = splits.numpy()
    return validation.check_splits(np.asarray(splits) if not isinstance(splits, (list, tuple)) else splits,
                                   "tensorflow.alltoall")


# ---------------------------------------------------------------------------------------------
# The public collectives (Horovod's API) are in collectives.py, built on run() above.

# AutoGraph must not rewrite the library's own Python (it is plain Python meant to run at
# trace time); the user's code around the calls is converted as usual.
_api = tf.autograph.experimental.do_not_convert
