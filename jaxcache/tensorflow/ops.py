"""Collectives on TensorFlow tensors, served by the jaxcache runtime.

Eager tensors are handed to the runtime through DLPack (zero-copy for CPU tensors); the
results are written into NumPy buffers that become tensors with tf.convert_to_tensor.
Inside tf.function the same collectives run through tf.py_function: TensorFlow's automatic
control dependencies execute such stateful ops in program order, so every rank submits
them in the same order and a blocked op can never wait for one its own graph has not run.
"""

from __future__ import annotations

import collections
import threading
import weakref

import numpy as np
import tensorflow as tf

from .. import runtime as _runtime
from .._ext import ext
from ..errors import raise_for_status
from ..ops import naming, validation
from ..ops.eager import DTYPE_CODES as _NP_DTYPE_CODES
from ..ops.eager import keep_until_done

KIND_ALLREDUCE, KIND_BROADCAST, KIND_ALLGATHER = 0, 1, 2

_BFLOAT16 = np.dtype(tf.bfloat16.as_numpy_dtype)


# ---------------------------------------------------------------------------------------------
# Validation


def np_dtype(dtype: tf.DType) -> np.dtype | None:
    try:
        d = np.dtype(dtype.as_numpy_dtype)
    except TypeError:
        return None
    return d if d in _NP_DTYPE_CODES else None


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


def reduce_args(op: str, prescale: float, postscale: float) -> tuple[int, float, float]:
    """Wire op code and scales. The runtime divides an 'average' by the ranks that contribute
    (every rank, or those that have not joined)."""
    return validation.REDUCE_OPS[op], float(prescale), float(postscale)


# ---------------------------------------------------------------------------------------------
# Names


_per_graph: "weakref.WeakKeyDictionary[object, collections.Counter]" = weakref.WeakKeyDictionary()
# Names this module made up: a repeated automatic name queues in the runtime, while a
# repeated explicit name still in flight is refused (Horovod's semantics).
_automatic: set[str] = set()
_lock = threading.Lock()


_call_site = naming.call_site


def auto_name(kind: str, name: str | None, fn: str) -> str:
    """User name if given; else kind@call-site (+ '#k' for the k-th call of the site in a tf.function)."""
    validation.check_name(name, f"tensorflow.{fn}")
    if name is not None:
        return name
    base = f"tf.{kind}@{_call_site()}"
    if tf.executing_eagerly():
        _automatic.add(base)
        return base  # eager calls complete before they return: one cached name per site
    graph = tf.compat.v1.get_default_graph()
    with _lock:
        counter = _per_graph.setdefault(graph, collections.Counter())
        k = counter[base]
        counter[base] += 1
        _automatic.add(f"{base}#{k}")
    return f"{base}#{k}"


# ---------------------------------------------------------------------------------------------
# Eager execution


def _cpu(x: tf.Tensor) -> tf.Tensor:
    if "GPU" in (x.device or "").upper():
        with tf.device("CPU:0"):
            return tf.identity(x)
    return x


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16) if a.dtype == _BFLOAT16 else a


def submit_eager(kind: int, names: list[str], groups: list[list[tf.Tensor]], *, op: int = 0,
                 prescale: float = 1.0, postscale: float = 1.0, root: int = 0) -> list[list[np.ndarray]]:
    """Submits one request per (name, tensors) group, then waits for all; returns NumPy outputs.

    All requests are in flight together, so ranks may submit them in any order.
    """
    size = _runtime.size()
    pending, error = [], None
    for name, tensors in zip(names, groups):
        ins, outs, codes = [], [], []
        for t in tensors:
            t = _cpu(t)
            nd = np_dtype(t.dtype)
            shape = tuple(t.shape)
            if kind == KIND_ALLGATHER:
                shape = (size,) if not shape else (size * shape[0], *shape[1:])
            out = np.empty(shape, nd)
            # A tf tensor exports DLPack (zero-copy); NumPy cannot export bfloat16: pass its bits.
            ins.append(t)
            outs.append(out)
            codes.append(_NP_DTYPE_CODES[nd])
        try:
            handle = ext.submit(kind, name, ins, [_bits(o) for o in outs], op, float(prescale),
                                float(postscale), int(root), codes,
                                refuse_if_in_flight=name not in _automatic)
        except BaseException as e:  # submit refused: still wait for what is already in flight
            error = e
            break
        pending.append((handle, ins, outs))
    results = []
    for i, (handle, ins, outs) in enumerate(pending):
        try:
            status, message = handle.wait()
        except BaseException:  # Ctrl-C: the runtime still uses the buffers of what is in flight
            for h, i_, o_ in pending[i:]:
                keep_until_done(h, (i_, o_))
            raise
        if status and error is None:
            try:
                raise_for_status(status, message)
            except Exception as e:  # noqa: BLE001 - raised after every handle is waited for
                error = e
        results.append(outs)
    if error is not None:
        raise error
    return results


def _to_tf(a: np.ndarray) -> tf.Tensor:
    return tf.convert_to_tensor(a)


def run(kind: int, names: list[str], groups: list[list[tf.Tensor]], **kw) -> list[list[tf.Tensor]]:
    """Eager or (inside tf.function) through one tf.py_function for all the requests."""
    flat = [t for g in groups for t in g]
    if tf.executing_eagerly():
        return [[_to_tf(o) for o in outs] for outs in submit_eager(kind, names, groups, **kw)]
    sizes = [len(g) for g in groups]
    size = _runtime.size()

    def body(*tensors):
        it = iter(tensors)
        regrouped = [[next(it) for _ in range(n)] for n in sizes]
        outs = submit_eager(kind, names, regrouped, **kw)
        return [_to_tf(o) for g in outs for o in g]

    out = tf.py_function(body, flat, Tout=[t.dtype for t in flat])
    if not isinstance(out, (list, tuple)):
        out = [out]
    for o, t in zip(out, flat):
        shape = t.shape
        if kind == KIND_ALLGATHER:
            shape = tf.TensorShape([size]) if shape.rank == 0 else \
                tf.TensorShape([None if shape[0] is None else size * shape[0]]).concatenate(shape[1:])
        o.set_shape(shape)
    it = iter(out)
    return [[next(it) for _ in range(n)] for n in sizes]


# ---------------------------------------------------------------------------------------------
# Public collectives

# AutoGraph must not rewrite the library's own Python (it is plain Python meant to run at
# trace time); the user's code around the calls is converted as usual.
_api = tf.autograph.experimental.do_not_convert



@_api
def allreduce(tensor, op: str = "average", name: str | None = None, prescale: float = 1.0,
              postscale: float = 1.0) -> tf.Tensor:
    """The reduction of `tensor` over all ranks ('average' default; 'sum', 'min', 'max', 'prod')."""
    _runtime.require_initialized("jaxcache.tensorflow.allreduce")
    op = validation.check_op(op, "tensorflow.allreduce")
    what = f"tensor {name!r}" if name else "tensor"
    t = as_tensor(tensor, "allreduce", what)
    check_reduction(t, op, prescale, postscale, "allreduce", what)
    name = auto_name("allreduce", name, "allreduce")
    code, pre, post = reduce_args(op, prescale, postscale)
    return run(KIND_ALLREDUCE, [name], [[t]], op=code, prescale=pre, postscale=post)[0][0]


@_api
def grouped_allreduce(tensors, op: str = "average", name: str | None = None, prescale: float = 1.0,
                      postscale: float = 1.0) -> list[tf.Tensor]:
    """Reduces a list of tensors as one atomic (fused) request."""
    _runtime.require_initialized("jaxcache.tensorflow.grouped_allreduce")
    op = validation.check_op(op, "tensorflow.grouped_allreduce")
    if not isinstance(tensors, (list, tuple)):
        raise TypeError("jaxcache.tensorflow.grouped_allreduce: tensors must be a list or tuple, got "
                        f"{type(tensors).__name__}")
    ts = []
    for i, x in enumerate(tensors):
        what = f"tensors[{i}]" + (f" of {name!r}" if name else "")
        t = as_tensor(x, "grouped_allreduce", what)
        check_reduction(t, op, prescale, postscale, "grouped_allreduce", what)
        ts.append(t)
    if not ts:
        return []
    name = auto_name("grouped_allreduce", name, "grouped_allreduce")
    code, pre, post = reduce_args(op, prescale, postscale)
    return run(KIND_ALLREDUCE, [name], [ts], op=code, prescale=pre, postscale=post)[0]


@_api
def broadcast(tensor, root_rank: int = 0, name: str | None = None) -> tf.Tensor:
    """`root_rank`'s value of `tensor` on every rank."""
    _runtime.require_initialized("jaxcache.tensorflow.broadcast")
    t = as_tensor(tensor, "broadcast", f"tensor {name!r}" if name else "tensor")
    root = validation.check_root(root_rank, _runtime.size(), "tensorflow.broadcast")
    name = auto_name("broadcast", name, "broadcast")
    return run(KIND_BROADCAST, [name], [[t]], root=root)[0][0]


@_api
def broadcast_variables(variables, root_rank: int = 0, name: str = "tf.broadcast_variables") -> None:
    """Assigns `root_rank`'s value to every variable (one request per variable, all in flight)."""
    _runtime.require_initialized("jaxcache.tensorflow.broadcast_variables")
    root = validation.check_root(root_rank, _runtime.size(), "tensorflow.broadcast_variables")
    if isinstance(variables, (tf.Variable, tf.Tensor)):
        raise TypeError("jaxcache.tensorflow.broadcast_variables: pass a list of variables, "
                        "e.g. model.variables")
    variables = list(variables)
    values = []
    for i, v in enumerate(variables):
        if not hasattr(v, "assign"):
            raise TypeError(f"jaxcache.tensorflow.broadcast_variables: variables[{i}] is a "
                            f"{type(v).__name__}, not a variable")
        values.append(as_tensor(v, "broadcast_variables", f"variable {getattr(v, 'name', i)!r}"))
    names = [f"{name}/{i}" for i in range(len(values))]
    outs = run(KIND_BROADCAST, names, [[t] for t in values], root=root)
    for v, (o,) in zip(variables, outs):
        v.assign(o)
