"""reducescatter, alltoall, allgather (a different first dimension per rank), join and the
object collectives on torch tensors.

Self-contained on purpose: jaxcache-style signatures (`op="average"`, `name=`) that an API
layer can wrap. Requests go to the same runtime as `jaxcache.torch.ops` and return the same
`Handle`, so `synchronize()` and `poll()` work on them. Inputs are handed over zero-copy
when they are contiguous CPU tensors; allgather and alltoall results live in buffers the
runtime sized from what the ranks agreed (shared with the returned tensors, no copy).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from .. import objects
from .. import runtime as _runtime
from .._ext import ext
from ..errors import raise_for_status
from ..ops import eager, validation
from ..ops.reducescatter import scatter_rows
from . import ops

_SAME_WIDTH_INT = {2: torch.int16}


def _to_torch(raw: np.ndarray, shape, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over the runtime's bytes (no copy)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(raw.view(np.int16).reshape(shape)).view(torch.bfloat16)
    return torch.from_numpy(raw.view(ops.numpy_dtype(dtype)).reshape(shape))


class _ShapedHandle(ops.Handle):
    """A Handle whose results are sized by the runtime (allgather, alltoall)."""

    __slots__ = ("_dtypes", "_devices", "_with_splits", "_received")

    def _finish(self):
        native, self._received = self._received, None  # the results now own the buffers
        results = [_to_torch(raw, shape, d) for (raw, shape), d in zip(native.results(), self._dtypes)]
        results = [r if dev.type == "cpu" else r.to(dev) for r, dev in zip(results, self._devices)]
        if self._with_splits:
            return results[0], torch.tensor(native.rows(), dtype=torch.int32)
        return results[0] if self._single else results


def _inputs(tensors: Sequence[torch.Tensor]) -> tuple[list, list[int]]:
    ins, codes = [], []
    for t in tensors:
        src = t.detach() if t.requires_grad else t
        ins.append(ops._export(src if ops._zero_copy_ok(src) else ops._staged(src)))
        codes.append(ops.dtype_code(src.dtype))
    return ins, codes


def _track(handle: ops.Handle, name: str, auto: bool, native) -> ops.Handle:
    if not auto and native.poll():
        # A refused duplicate completed at once: raise before anything else happens.
        status, message = native.wait()
        if status == ops._DUPLICATE:
            ops._release(handle)
            raise_for_status(status, message)
    with ops._lock:
        ops._outstanding[id(handle)] = handle
    return handle


def _submit_shaped(kind: int, name: str, auto: bool, tensors: list, splits: list[int] | None,
                   single: bool) -> ops.Handle:
    try:
        ins, codes = _inputs(tensors)
        native = ext.submit_allocated(kind, name, ins, splits or [], codes, refuse_if_in_flight=not auto)
    except BaseException:
        if auto:
            with ops._lock:
                ops._auto_in_flight.discard(name)
        raise
    handle = _ShapedHandle(name, native, ins, [], [], tensors, None, auto, single, False)
    handle._dtypes = [t.dtype for t in tensors]
    handle._devices = [t.device for t in tensors]
    handle._with_splits = splits is not None
    handle._received = native
    return _track(handle, name, auto, native)


def _submit_reducescatter(name: str, auto: bool, tensors: list, op: int, prescale: float,
                          postscale: float, single: bool) -> ops.Handle:
    size, rank = _runtime.size(), _runtime.rank()
    try:
        ins, codes = _inputs(tensors)
        results = [torch.empty((scatter_rows(t.shape[0], size, rank), *t.shape[1:]), dtype=t.dtype)
                   for t in tensors]
        outs = [ops._export(r) for r in results]
        native = ext.submit(eager.KIND_REDUCESCATTER, name, ins, outs, op, prescale, postscale, 0,
                            codes, refuse_if_in_flight=not auto)
    except BaseException:
        if auto:
            with ops._lock:
                ops._auto_in_flight.discard(name)
        raise
    copy_back = None if all(t.is_cpu for t in tensors) else []  # results move to the inputs' device
    handle = ops.Handle(name, native, ins, outs, results, tensors, copy_back, auto, single, False)
    return _track(handle, name, auto, native)


def _name(name, kind: str, fn: str) -> tuple[str, bool]:
    return ops._name_or_auto(name, kind, fn)


def _tensor_list(tensors, fn: str) -> list:
    tensors = ops._as_list(tensors, fn)
    for i, t in enumerate(tensors):
        ops.check_tensor(t, fn, f"tensors[{i}]")
    return tensors


# --- allgather -------------------------------------------------------------------------------------


def allgather_async(tensor, name: str | None = None) -> ops.Handle:
    _runtime.require_initialized("jaxcache.torch.allgather_async")
    ops.check_tensor(tensor, "allgather_async", f"tensor {name!r}" if name else "tensor")
    name, auto = _name(name, "allgather", "allgather_async")
    return _submit_shaped(eager.KIND_ALLGATHER, name, auto, [tensor], None, True)


def allgather(tensor, name: str | None = None) -> torch.Tensor:
    """Every rank's `tensor` concatenated along dim 0 in rank order (a scalar gives one value
    per rank). The first dimension may differ between ranks; the others must agree."""
    return ops.synchronize(allgather_async(tensor, name))


def grouped_allgather_async(tensors, name: str | None = None) -> ops.Handle:
    _runtime.require_initialized("jaxcache.torch.grouped_allgather_async")
    tensors = _tensor_list(tensors, "grouped_allgather_async")
    name, auto = _name(name, "grouped_allgather", "grouped_allgather_async")
    return _submit_shaped(eager.KIND_ALLGATHER, name, auto, tensors, None, False)


def grouped_allgather(tensors, name: str | None = None) -> list[torch.Tensor]:
    """allgather of every tensor of the list as one atomic request."""
    return ops.synchronize(grouped_allgather_async(tensors, name))


# --- reducescatter ---------------------------------------------------------------------------------


def _reducescatter_submit(tensors, op, name, prescale, postscale, fn, single):
    _runtime.require_initialized(f"jaxcache.torch.{fn}")
    op = ops.check_op(op, fn)
    for i, t in enumerate(tensors):
        what = (f"tensors[{i}]" if not single else "tensor") + (f" of {name!r}" if name else "")
        ops.check_tensor(t, fn, what)
        ops.check_reduction(t, op, prescale, postscale, fn, what)
        validation.check_first_dim(t, f"torch.{fn}", what)
    code, pre, post = ops.reduce_args(op, prescale, postscale)
    name, auto = _name(name, "grouped_reducescatter" if not single else "reducescatter", fn)
    return _submit_reducescatter(name, auto, tensors, code, pre, post, single)


def reducescatter_async(tensor, op: str = "average", name: str | None = None,
                        prescale: float = 1.0, postscale: float = 1.0) -> ops.Handle:
    return _reducescatter_submit([tensor], op, name, prescale, postscale, "reducescatter_async", True)


def reducescatter(tensor, op: str = "average", name: str | None = None, prescale: float = 1.0,
                  postscale: float = 1.0) -> torch.Tensor:
    """Reduces `tensor` over all ranks and returns this rank's rows of dim 0: rank r gets
    `shape[0] // size` rows, one more when `r < shape[0] % size`. 'average' divides by the
    ranks that contribute (those that have not joined)."""
    return ops.synchronize(reducescatter_async(tensor, op, name, prescale, postscale))


def grouped_reducescatter_async(tensors, op: str = "average", name: str | None = None,
                                prescale: float = 1.0, postscale: float = 1.0) -> ops.Handle:
    tensors = ops._as_list(tensors, "grouped_reducescatter_async")
    return _reducescatter_submit(tensors, op, name, prescale, postscale,
                                 "grouped_reducescatter_async", False)


def grouped_reducescatter(tensors, op: str = "average", name: str | None = None,
                          prescale: float = 1.0, postscale: float = 1.0) -> list[torch.Tensor]:
    """reducescatter of every tensor of the list as one atomic request."""
    tensors = ops._as_list(tensors, "grouped_reducescatter")
    return ops.synchronize(_reducescatter_submit(tensors, op, name, prescale, postscale,
                                                 "grouped_reducescatter", False))


# --- alltoall --------------------------------------------------------------------------------------


def alltoall_async(tensor, splits=None, name: str | None = None) -> ops.Handle:
    _runtime.require_initialized("jaxcache.torch.alltoall_async")
    ops.check_tensor(tensor, "alltoall_async", f"tensor {name!r}" if name else "tensor")
    validation.check_first_dim(tensor, "torch.alltoall_async", "tensor")
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    counts = None if splits is None else validation.check_splits(splits, "torch.alltoall")
    name, auto = _name(name, "alltoall", "alltoall_async")
    return _submit_shaped(eager.KIND_ALLTOALL, name, auto, [tensor], counts, True)


def alltoall(tensor, splits=None, name: str | None = None):
    """Sends `splits[j]` rows of dim 0 to rank j (default: equal blocks) and returns the rows
    received, concatenated in rank order. With `splits`, returns `(tensor, received_splits)`."""
    return ops.synchronize(alltoall_async(tensor, splits, name))


# --- join and objects ------------------------------------------------------------------------------


def join() -> int:
    """This rank has no more data: it serves the others' collectives (zeros, no rows) until
    every rank has joined; returns the rank that joined last. Synchronize every handle first."""
    return _runtime.join()


def broadcast_object(obj: Any = None, root_rank: int = 0, name: str | None = None) -> Any:
    """`root_rank`'s picklable `obj`, on every rank."""
    return objects.broadcast(obj, root_rank, name, "torch.broadcast_object")


def allgather_object(obj: Any, name: str | None = None) -> list:
    """Every rank's picklable `obj`, as a list in rank order."""
    return objects.allgather(obj, name, "torch.allgather_object")


__all__ = [
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "alltoall", "alltoall_async", "join", "broadcast_object", "allgather_object",
]
