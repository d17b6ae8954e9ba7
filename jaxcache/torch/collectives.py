"""Differentiable collectives on torch tensors, with Horovod's backward rules.

    allreduce          backward: allreduce of the gradient with the same op and scales
    grouped_allreduce  backward: grouped_allreduce of the gradients, same op and scales
    allgather          backward: average-allreduce of the gradient, then this rank's rows
                       (at the offsets the ranks agreed on: first dimensions may differ)
    grouped_allgather  backward: the same per tensor
    broadcast          backward: average-allreduce of the gradient on root_rank, zeros elsewhere
    reducescatter      backward: allgather of the gradient times prescale * postscale, and
                       times size for Sum (Horovod's scaling)
    alltoall           backward: alltoall of the gradient, sending back the rows received

Backward collectives are named after the forward one (`<name>/grad`), so every rank matches
them. The forward collective is submitted in the caller's frame (its automatic name comes
from the caller's line) and waited for inside the autograd Function.
"""

from __future__ import annotations

import torch

from .. import runtime as _runtime
from ..compat import process_sets, reduce_ops
from ..compat.process_sets import global_process_set
from . import compression as _compression
from . import ops
from .compression import Compression


def _grad_name(name: str) -> str:
    return f"{name}/grad"


def _own_rows(grad: torch.Tensor, rows: list[int], scalar: bool) -> torch.Tensor:
    """This rank's part of an allgather's gradient: rows are every rank's first dimension."""
    r = _runtime.rank()
    offset = sum(rows[:r])
    if scalar:
        return grad[offset]
    return grad.narrow(0, offset, rows[r])


def _rows_per_tensor(rows: list[int], n: int) -> list[list[int]]:
    size = len(rows) // n
    return [rows[i * size:(i + 1) * size] for i in range(n)]


def _scatter_grad_scale(op: str, pre: float, post: float) -> float:
    # Horovod's reducescatter gradient: times size for Sum, times both scale factors.
    return (_runtime.size() if op == "sum" else 1.0) * pre * post


def _scaled(grads, factor: float) -> list:
    return list(grads) if factor == 1.0 else [g * factor for g in grads]


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, handle, spec, *tensors):
        ctx.spec = (handle.name, *spec)
        out = ops.synchronize(handle)
        return tuple(out) if isinstance(out, list) else out

    @staticmethod
    def backward(ctx, *grads):
        name, op, pre, post = ctx.spec
        single = len(grads) == 1
        out = ops.synchronize(ops.allreduce_submit(list(grads), op, _grad_name(name), pre, post,
                                                   "allreduce (backward)", False, single))
        return (None, None, *([out] if single else out))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, handle, *tensors):
        out = ops.synchronize(handle)
        ctx.spec = (handle.name, _rows_per_tensor(handle.rows, len(tensors)),
                    [t.dim() == 0 for t in tensors])
        return tuple(out) if isinstance(out, list) else out

    @staticmethod
    def backward(ctx, *grads):
        name, rows, scalars = ctx.spec
        single = len(grads) == 1
        reduced = ops.synchronize(ops.allreduce_submit(list(grads), "average", _grad_name(name), 1.0,
                                                       1.0, "allgather (backward)", False, single))
        reduced = [reduced] if single else reduced
        return (None, *[_own_rows(g, r, s) for g, r, s in zip(reduced, rows, scalars)])


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, handle, root, tensor):
        ctx.spec = (handle.name, root)
        return ops.synchronize(handle)

    @staticmethod
    def backward(ctx, grad):
        name, root = ctx.spec
        reduced = ops.synchronize(ops.allreduce_submit([grad], "average", _grad_name(name), 1.0, 1.0,
                                                       "broadcast (backward)", False, True))
        if _runtime.rank() != root:
            reduced = reduced * 0
        return None, None, reduced


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, handle, factor, *tensors):
        ctx.spec = (handle.name, factor)
        out = ops.synchronize(handle)
        return tuple(out) if isinstance(out, list) else out

    @staticmethod
    def backward(ctx, *grads):
        name, factor = ctx.spec
        single = len(grads) == 1
        gathered = ops.synchronize(ops.allgather_submit(_scaled(grads, factor), _grad_name(name),
                                                        "reducescatter (backward)", single))
        return (None, None, *([gathered] if single else gathered))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, handle, tensor):
        out, received = ops.synchronize(handle)
        ctx.spec = (handle.name, handle.rows)
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _received):
        name, received = ctx.spec
        back, _ = ops.synchronize(ops.alltoall_submit(grad, received, _grad_name(name),
                                                      "alltoall (backward)"))
        return None, back


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set, *,
              prescale=None, postscale=None) -> torch.Tensor:
    """The reduction of `tensor` over all ranks, as a new tensor (differentiable).

    op: Average (default), Sum, Min, Max, Product (or jaxcache's 'average', 'sum', ...); an
    average divides by the ranks that contribute (those that have not joined).
    compression: Compression.none / fp16 / bf16, applied around the reduction.
    """
    op, pre, post = ops.reduce_spec("allreduce", op, average, prescale_factor, postscale_factor,
                                    prescale, postscale, process_set)
    ops.check_tensor(tensor, "allreduce", f"tensor {name!r}" if name else "tensor")
    _compression.check(compression, "allreduce")
    compressed, cctx = compression.compress(tensor)
    handle = ops.allreduce_submit([compressed], op, name, pre, post, "allreduce", False, True)
    return compression.decompress(_Allreduce.apply(handle, (op, pre, post), compressed), cctx)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set, *,
                      prescale=None, postscale=None) -> list[torch.Tensor]:
    """Reduces a list of tensors as one atomic, fused request; returns new tensors (differentiable)."""
    tensors = ops.as_list(tensors, "grouped_allreduce")
    op, pre, post = ops.reduce_spec("grouped_allreduce", op, average, prescale_factor,
                                    postscale_factor, prescale, postscale, process_set)
    for i, t in enumerate(tensors):
        ops.check_tensor(t, "grouped_allreduce", ops._what(name, False, i))
    _compression.check(compression, "grouped_allreduce")
    if not tensors:
        return []
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    handle = ops.allreduce_submit(list(compressed), op, name, pre, post, "grouped_allreduce", False,
                                  False)
    outs = _Allreduce.apply(handle, (op, pre, post), *compressed)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Every rank's `tensor` concatenated along dim 0 in rank order (a scalar gives one value
    per rank). The first dimension may differ between ranks; the others must agree.
    Differentiable."""
    process_sets.check(process_set, "torch.allgather")
    return _Allgather.apply(ops.allgather_submit([tensor], name, "allgather"), tensor)


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> list[torch.Tensor]:
    """allgather of every tensor of the list as one atomic request (differentiable)."""
    process_sets.check(process_set, "torch.grouped_allgather")
    tensors = ops.as_list(tensors, "grouped_allgather")
    if not tensors:
        return []
    return list(_Allgather.apply(ops.allgather_submit(tensors, name, "grouped_allgather", False),
                                 *tensors))


def broadcast(tensor, root_rank=0, name=None, process_set=global_process_set) -> torch.Tensor:
    """`root_rank`'s value of `tensor`, as a new tensor on every rank (differentiable)."""
    process_sets.check(process_set, "torch.broadcast")
    handle = ops.broadcast_submit([tensor], root_rank, name, "broadcast", False)
    return _Broadcast.apply(handle, int(root_rank), tensor)


def _reducescatter(tensors, name, compression, op, process_set, prescale_factor, postscale_factor,
                   prescale, postscale, fn: str, single: bool) -> list[torch.Tensor]:
    op, pre, post = ops.reduce_spec(fn, op, None, prescale_factor, postscale_factor, prescale,
                                    postscale, process_set)
    for i, t in enumerate(tensors):
        ops.check_tensor(t, fn, ops._what(name, single, i))
    _compression.check(compression, fn)
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    handle = ops.reducescatter_submit(list(compressed), op, name, pre, post, fn, single)
    outs = _Reducescatter.apply(handle, _scatter_grad_scale(op, pre, post), *compressed)
    outs = [outs] if single else outs
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def reducescatter(tensor, name=None, compression=Compression.none, op=reduce_ops.Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0, *,
                  prescale=None, postscale=None) -> torch.Tensor:
    """Reduces `tensor` over all ranks and returns this rank's rows of dim 0 (differentiable).

    Rank r gets `shape[0] // size` rows, one more when `r < shape[0] % size` (Horovod's
    split). op: Average (default), Sum, Min, Max, Product (or 'average', 'sum', ...); an
    average divides by the ranks that contribute (those that have not joined).
    """
    return _reducescatter([tensor], name, compression, op, process_set, prescale_factor,
                          postscale_factor, prescale, postscale, "reducescatter", True)[0]


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=reduce_ops.Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0,
                          *, prescale=None, postscale=None) -> list[torch.Tensor]:
    """reducescatter of every tensor of the list as one atomic request (differentiable)."""
    tensors = ops.as_list(tensors, "grouped_reducescatter")
    if not tensors:
        return []
    return _reducescatter(tensors, name, compression, op, process_set, prescale_factor,
                          postscale_factor, prescale, postscale, "grouped_reducescatter", False)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends `splits[j]` rows of dim 0 to rank j (default: `size` equal blocks) and returns the
    rows received, concatenated in rank order (differentiable).

    With `splits` (a list or an integer tensor; may differ per rank) it returns
    `(tensor, received_splits)`, the rows that came from each rank, as Horovod does.
    """
    process_sets.check(process_set, "torch.alltoall")
    out, received = _Alltoall.apply(ops.alltoall_submit(tensor, splits, name, "alltoall"), tensor)
    return out if splits is None else (out, received)
