"""Submitting collectives on TensorFlow tensors to the jaxcache runtime (validation, names, run).

Eager tensors are handed to the runtime through DLPack (zero-copy for CPU tensors); the
results are written into NumPy buffers that become tensors with tf.convert_to_tensor. GPU
tensors are staged: TensorFlow copies them to the host (after the work that produced them),
their request counts as CUDA in the signature, and their results go back to their device.
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

from .. import devices as _devices
from .. import runtime as _runtime
from .._ext import ext
from ..compat import pending
from ..errors import MismatchError, raise_for_status
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


def _on_gpu(x: tf.Tensor) -> bool:
    return "GPU" in (x.device or "").upper()


def _cpu(x: tf.Tensor) -> tf.Tensor:
    if _on_gpu(x):
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
    in_flight, error = [], None
    for name, tensors in zip(names, groups):
        ins, outs, codes = [], [], []
        device = _devices.CUDA if any(_on_gpu(t) for t in tensors) else _devices.CPU
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
                                refuse_if_in_flight=name not in _automatic, device=device)
        except BaseException as e:  # submit refused: still wait for what is already in flight
            error = e
            break
        in_flight.append((handle, ins, outs))
    results = []
    for i, (handle, ins, outs) in enumerate(in_flight):
        try:
            status, message = handle.wait()
        except BaseException:  # Ctrl-C: the runtime still uses the buffers of what is in flight
            for h, i_, o_ in in_flight[i:]:
                keep_until_done(h, (i_, o_))
            raise
        if status and error is None:
            try:
                raise_for_status(status, message)
            except Exception as e:  # noqa: BLE001 - raised after every handle is waited for
                error = e
        results.append(outs)
    if error is not None:
        if kind == KIND_ALLGATHER and isinstance(error, MismatchError) and \
                pending.is_uneven_first_dim(str(error)):
            pending.uneven_allgather("jaxcache.tensorflow.allgather", error)
        raise error
    return results


def _to_tf(a: np.ndarray, like: tf.Tensor | None = None) -> tf.Tensor:
    """A tensor of `a`, on the GPU of `like` when `like` lives on one."""
    if like is not None and _on_gpu(like):
        with tf.device(like.device):
            return tf.identity(tf.convert_to_tensor(a))
    return tf.convert_to_tensor(a)


def run(kind: int, names: list[str], groups: list[list[tf.Tensor]], **kw) -> list[list[tf.Tensor]]:
    """Eager or (inside tf.function) through one tf.py_function for all the requests.

    Inside tf.function the device kind in the signature is that of the tensors TensorFlow
    hands to the py_function (it decides where that op runs).
    """
    flat = [t for g in groups for t in g]
    if tf.executing_eagerly():
        return [[_to_tf(o, t) for o, t in zip(outs, g)]
                for outs, g in zip(submit_eager(kind, names, groups, **kw), groups)]
    sizes = [len(g) for g in groups]
    size = _runtime.size()

    def body(*tensors):
        it = iter(tensors)
        regrouped = [[next(it) for _ in range(n)] for n in sizes]
        outs = submit_eager(kind, names, regrouped, **kw)
        return [_to_tf(o, t) for g_out, g_in in zip(outs, regrouped) for o, t in zip(g_out, g_in)]

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
# The public collectives (Horovod's API) are in collectives.py, built on run() above.

# AutoGraph must not rewrite the library's own Python (it is plain Python meant to run at
# trace time); the user's code around the calls is converted as usual.
_api = tf.autograph.experimental.do_not_convert
