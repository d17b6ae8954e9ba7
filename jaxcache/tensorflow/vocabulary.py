"""reducescatter, alltoall, allgather (a different first dimension per rank), join and the
object collectives on TensorFlow tensors.

Self-contained on purpose: jaxcache-style signatures (`op="average"`, `name=`) that an API
layer can wrap. Eager tensors go to the runtime through DLPack; inside tf.function each
call runs through one tf.py_function, in program order (see `jaxcache.tensorflow.ops`).
allgather and alltoall results are sized by the runtime from what the ranks agreed, so
inside tf.function their first dimension is unknown until they run.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

from .. import objects
from .. import runtime as _runtime
from .._ext import ext
from ..errors import raise_for_status
from ..ops import eager, validation
from ..ops.eager import DTYPE_CODES as _NP_DTYPE_CODES
from ..ops.reducescatter import scatter_rows
from . import ops

_api = tf.autograph.experimental.do_not_convert


def _refuse(name: str) -> bool:
    return name not in ops._automatic  # explicit names in flight are refused (Horovod)


def _wait(handle, keepalive) -> None:
    status, message = eager.wait(handle, keepalive)
    raise_for_status(status, message)


def _shaped_eager(kind: int, name: str, tensors: list, splits: list[int] | None):
    ins = [ops._cpu(t) for t in tensors]
    codes = [_NP_DTYPE_CODES[ops.np_dtype(t.dtype)] for t in ins]
    handle = ext.submit_allocated(kind, name, ins, splits or [], codes, refuse_if_in_flight=_refuse(name))
    _wait(handle, ins)
    outs = [tf.convert_to_tensor(raw.view(ops.np_dtype(t.dtype)).reshape(shape))
            for (raw, shape), t in zip(handle.results(), ins)]
    return outs, list(handle.rows())


def _reducescatter_eager(name: str, tensors: list, op: int, pre: float, post: float) -> list:
    size, rank = _runtime.size(), _runtime.rank()
    ins = [ops._cpu(t) for t in tensors]
    outs = [np.empty((scatter_rows(int(t.shape[0]), size, rank), *t.shape[1:]), ops.np_dtype(t.dtype))
            for t in ins]
    codes = [_NP_DTYPE_CODES[o.dtype] for o in outs]
    handle = ext.submit(eager.KIND_REDUCESCATTER, name, ins, [ops._bits(o) for o in outs], op, pre,
                        post, 0, codes, refuse_if_in_flight=_refuse(name))
    _wait(handle, (ins, outs))
    return [tf.convert_to_tensor(o) for o in outs]


def _run(body: Callable[[list], list], tensors: list, out_dtypes: list, out_shapes: list) -> list:
    """`body` eagerly, or inside tf.function through one tf.py_function."""
    if tf.executing_eagerly():
        return body(tensors)
    out = tf.py_function(lambda *ts: body(list(ts)), tensors, Tout=out_dtypes)
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    for o, shape in zip(out, out_shapes):
        o.set_shape(shape)
    return out


def _unknown_rows(t) -> tf.TensorShape:
    shape = t.shape
    return tf.TensorShape([None]) if shape.rank == 0 else tf.TensorShape([None]).concatenate(shape[1:])


def _tensors(tensors, fn: str, name) -> list:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"jaxcache.tensorflow.{fn}: tensors must be a list or tuple, got "
                        f"{type(tensors).__name__}")
    return [ops.as_tensor(x, fn, f"tensors[{i}]" + (f" of {name!r}" if name else ""))
            for i, x in enumerate(tensors)]


# --- allgather -------------------------------------------------------------------------------------


def _allgather(ts: list, name: str) -> list:
    return _run(lambda xs: _shaped_eager(eager.KIND_ALLGATHER, name, xs, None)[0], ts,
                [t.dtype for t in ts], [_unknown_rows(t) for t in ts])


@_api
def allgather(tensor, name: str | None = None) -> tf.Tensor:
    """Every rank's `tensor` concatenated along axis 0 in rank order (a scalar gives one value
    per rank). The first dimension may differ between ranks; the others must agree."""
    _runtime.require_initialized("jaxcache.tensorflow.allgather")
    t = ops.as_tensor(tensor, "allgather", f"tensor {name!r}" if name else "tensor")
    return _allgather([t], ops.auto_name("allgather", name, "allgather"))[0]


@_api
def grouped_allgather(tensors, name: str | None = None) -> list[tf.Tensor]:
    """allgather of every tensor of the list as one atomic request."""
    _runtime.require_initialized("jaxcache.tensorflow.grouped_allgather")
    ts = _tensors(tensors, "grouped_allgather", name)
    if not ts:
        return []
    return _allgather(ts, ops.auto_name("grouped_allgather", name, "grouped_allgather"))


# --- reducescatter ---------------------------------------------------------------------------------


def _reducescatter(ts: list, op: str, name: str, prescale, postscale) -> list:
    code, pre, post = ops.reduce_args(op, prescale, postscale)
    size, rank = _runtime.size(), _runtime.rank()
    shapes = []
    for t in ts:
        rows = t.shape[0]
        rows = None if rows is None else scatter_rows(int(rows), size, rank)
        shapes.append(tf.TensorShape([rows]).concatenate(t.shape[1:]))
    return _run(lambda xs: _reducescatter_eager(name, xs, code, pre, post), ts,
                [t.dtype for t in ts], shapes)


def _check_scatter(t, op, prescale, postscale, fn: str, what: str):
    ops.check_reduction(t, op, prescale, postscale, fn, what)
    if t.shape.rank == 0:
        raise ValueError(f"jaxcache.tensorflow.{fn}: {what} is a scalar; it needs a first "
                         "dimension to split")


@_api
def reducescatter(tensor, op: str = "average", name: str | None = None, prescale: float = 1.0,
                  postscale: float = 1.0) -> tf.Tensor:
    """Reduces `tensor` over all ranks and returns this rank's rows of axis 0: rank r gets
    `shape[0] // size` rows, one more when `r < shape[0] % size`. 'average' divides by the
    ranks that contribute (those that have not joined)."""
    _runtime.require_initialized("jaxcache.tensorflow.reducescatter")
    op = validation.check_op(op, "tensorflow.reducescatter")
    what = f"tensor {name!r}" if name else "tensor"
    t = ops.as_tensor(tensor, "reducescatter", what)
    _check_scatter(t, op, prescale, postscale, "reducescatter", what)
    return _reducescatter([t], op, ops.auto_name("reducescatter", name, "reducescatter"),
                          prescale, postscale)[0]


@_api
def grouped_reducescatter(tensors, op: str = "average", name: str | None = None,
                          prescale: float = 1.0, postscale: float = 1.0) -> list[tf.Tensor]:
    """reducescatter of every tensor of the list as one atomic request."""
    _runtime.require_initialized("jaxcache.tensorflow.grouped_reducescatter")
    op = validation.check_op(op, "tensorflow.grouped_reducescatter")
    ts = _tensors(tensors, "grouped_reducescatter", name)
    for i, t in enumerate(ts):
        _check_scatter(t, op, prescale, postscale, "grouped_reducescatter", f"tensors[{i}]")
    if not ts:
        return []
    return _reducescatter(ts, op, ops.auto_name("grouped_reducescatter", name, "grouped_reducescatter"),
                          prescale, postscale)


# --- alltoall --------------------------------------------------------------------------------------


@_api
def alltoall(tensor, splits=None, name: str | None = None):
    """Sends `splits[j]` rows of axis 0 to rank j (default: equal blocks) and returns the rows
    received, concatenated in rank order. With `splits`, returns `(tensor, received_splits)`."""
    _runtime.require_initialized("jaxcache.tensorflow.alltoall")
    t = ops.as_tensor(tensor, "alltoall", f"tensor {name!r}" if name else "tensor")
    if t.shape.rank == 0:
        raise ValueError("jaxcache.tensorflow.alltoall: tensor is a scalar; it needs a first "
                         "dimension to split")
    name = ops.auto_name("alltoall", name, "alltoall")
    if splits is None:
        return _run(lambda xs: _shaped_eager(eager.KIND_ALLTOALL, name, xs, None)[0], [t],
                    [t.dtype], [_unknown_rows(t)])[0]
    if isinstance(splits, (list, tuple, np.ndarray)):
        splits = tf.constant(validation.check_splits(splits, "tensorflow.alltoall"), tf.int64)
    splits = tf.cast(splits, tf.int64)

    def body(xs):
        counts = validation.check_splits(np.asarray(xs[1]).astype(np.int64), "tensorflow.alltoall")
        (out,), received = _shaped_eager(eager.KIND_ALLTOALL, name, [xs[0]], counts)
        return [out, tf.constant(received, tf.int32)]

    out, received = _run(body, [t, splits], [t.dtype, tf.int32],
                         [_unknown_rows(t), tf.TensorShape([_runtime.size()])])
    return out, received


# --- join and objects ------------------------------------------------------------------------------


def join() -> int:
    """This rank has no more data: it serves the others' collectives (zeros, no rows) until
    every rank has joined; returns the rank that joined last (eager only)."""
    return _runtime.join()


def broadcast_object(obj: Any = None, root_rank: int = 0, name: str | None = None) -> Any:
    """`root_rank`'s picklable `obj`, on every rank (eager only)."""
    return objects.broadcast(obj, root_rank, name, "tensorflow.broadcast_object")


def allgather_object(obj: Any, name: str | None = None) -> list:
    """Every rank's picklable `obj`, as a list in rank order (eager only)."""
    return objects.allgather(obj, name, "tensorflow.allgather_object")


__all__ = [
    "allgather", "grouped_allgather", "reducescatter", "grouped_reducescatter", "alltoall",
    "join", "broadcast_object", "allgather_object",
]
