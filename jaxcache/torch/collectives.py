"""Differentiable collectives on torch tensors, with Horovod's backward rules.

    allreduce          backward: allreduce of the gradient with the same op and scales
    grouped_allreduce  backward: grouped_allreduce of the gradients, same op and scales
    allgather          backward: average-allreduce of the gradient, then this rank's rows
    grouped_allgather  backward: the same per tensor
    broadcast          backward: average-allreduce of the gradient on root_rank, zeros elsewhere

The backward collectives are named after the forward one (`<name>/grad`), so every rank
matches them. alltoall and reducescatter keep Horovod's signatures; they arrive with issue 13.
"""

from __future__ import annotations

import torch

from .. import runtime as _runtime
from ..compat import pending, process_sets, reduce_ops
from ..compat.process_sets import global_process_set
from . import ops
from . import compression as _compression
from .compression import Compression


def _grad_name(name: str) -> str:
    return f"{name}/grad"


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, pre, post, fn):
        handle = ops.allreduce_submit([tensor], op, name, pre, post, fn, False, True)
        ctx.spec = (handle.name, op, pre, post)
        return ops.synchronize(handle)

    @staticmethod
    def backward(ctx, grad):
        name, op, pre, post = ctx.spec
        out = ops.synchronize(ops.allreduce_submit([grad], op, _grad_name(name), pre, post,
                                                   "allreduce (backward)", False, True))
        return out, None, None, None, None, None


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, pre, post, fn, *tensors):
        handle = ops.allreduce_submit(list(tensors), op, name, pre, post, fn, False, False)
        ctx.spec = (handle.name, op, pre, post)
        return tuple(ops.synchronize(handle))

    @staticmethod
    def backward(ctx, *grads):
        name, op, pre, post = ctx.spec
        outs = ops.synchronize(ops.allreduce_submit(list(grads), op, _grad_name(name), pre, post,
                                                    "grouped_allreduce (backward)", False, False))
        return (None, None, None, None, None, *outs)


def _own_rows(grad: torch.Tensor, rows: int, scalar: bool) -> torch.Tensor:
    # Every rank contributed the same number of rows (the runtime enforces equal shapes until
    # uneven allgather lands with issue 13), so this rank's rows start at rank * rows.
    r = _runtime.rank()
    if scalar:
        return grad[r]
    return grad.narrow(0, r * rows, rows)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, fn):
        handle = ops.allgather_submit([tensor], name, fn)
        ctx.spec = (handle.name, tensor.dim() == 0, tensor.shape[0] if tensor.dim() else 1)
        return ops.synchronize(handle)

    @staticmethod
    def backward(ctx, grad):
        name, scalar, rows = ctx.spec
        reduced = ops.synchronize(ops.allreduce_submit([grad], "average", _grad_name(name), 1.0, 1.0,
                                                       "allgather (backward)", False, True))
        return _own_rows(reduced, rows, scalar), None, None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, fn, *tensors):
        handle = ops.allgather_submit(list(tensors), name, fn, single=False)
        ctx.spec = (handle.name, [(t.dim() == 0, t.shape[0] if t.dim() else 1) for t in tensors])
        return tuple(ops.synchronize(handle))

    @staticmethod
    def backward(ctx, *grads):
        name, shapes = ctx.spec
        reduced = ops.synchronize(ops.allreduce_submit(list(grads), "average", _grad_name(name), 1.0,
                                                       1.0, "grouped_allgather (backward)", False, False))
        return (None, None, *[_own_rows(g, rows, scalar) for g, (scalar, rows) in zip(reduced, shapes)])


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, fn):
        handle = ops.broadcast_submit([tensor], root_rank, name, fn, False)
        ctx.spec = (handle.name, root_rank)
        return ops.synchronize(handle)

    @staticmethod
    def backward(ctx, grad):
        name, root = ctx.spec
        reduced = ops.synchronize(ops.allreduce_submit([grad], "average", _grad_name(name), 1.0, 1.0,
                                                       "broadcast (backward)", False, True))
        if _runtime.rank() != root:
            reduced = reduced * 0
        return reduced, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set, *,
              prescale=None, postscale=None) -> torch.Tensor:
    """The reduction of `tensor` over all ranks, as a new tensor (differentiable).

    op: Average (default), Sum, Min, Max, Product (or jaxcache's 'average', 'sum', ...).
    compression: Compression.none / fp16 / bf16, applied around the reduction.
    """
    op, pre, post = ops.reduce_spec("allreduce", op, average, prescale_factor, postscale_factor,
                                    prescale, postscale, process_set)
    ops.check_tensor(tensor, "allreduce", f"tensor {name!r}" if name else "tensor")
    _compression.check(compression, "allreduce")
    compressed, cctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, name, op, pre, post, "allreduce")
    return compression.decompress(out, cctx)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set, *,
                      prescale=None, postscale=None) -> list[torch.Tensor]:
    """Reduces a list of tensors as one atomic, fused request; returns new tensors (differentiable)."""
    tensors = ops.as_list(tensors, "grouped_allreduce")
    op, pre, post = ops.reduce_spec("grouped_allreduce", op, average, prescale_factor,
                                    postscale_factor, prescale, postscale, process_set)
    for i, t in enumerate(tensors):
        ops.check_tensor(t, "grouped_allreduce", f"tensors[{i}]" + (f" of {name!r}" if name else ""))
    _compression.check(compression, "grouped_allreduce")
    if not tensors:
        return []
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    outs = _GroupedAllreduce.apply(name, op, pre, post, "grouped_allreduce", *compressed)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Every rank's `tensor` concatenated along dim 0 in rank order (a scalar gives a vector).

    Differentiable. All ranks must pass the same shape (a different first dimension per rank
    arrives with issue 13).
    """
    process_sets.check(process_set, "torch.allgather")
    return _Allgather.apply(tensor, name, "allgather")


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> list[torch.Tensor]:
    """allgather of every tensor of the list as one atomic request (differentiable)."""
    process_sets.check(process_set, "torch.grouped_allgather")
    tensors = ops.as_list(tensors, "grouped_allgather")
    if not tensors:
        return []
    return list(_GroupedAllgather.apply(name, "grouped_allgather", *tensors))


def broadcast(tensor, root_rank=0, name=None, process_set=global_process_set) -> torch.Tensor:
    """`root_rank`'s value of `tensor`, as a new tensor on every rank (differentiable)."""
    process_sets.check(process_set, "torch.broadcast")
    return _Broadcast.apply(tensor, root_rank, name, "broadcast")


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Horovod's alltoall (pending: issue 13)."""
    process_sets.check(process_set, "torch.alltoall")
    ops.check_tensor(tensor, "alltoall", "tensor")
    pending.alltoall("jaxcache.torch.alltoall")


def reducescatter(tensor, name=None, compression=Compression.none, op=reduce_ops.Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Horovod's reducescatter (pending: issue 13)."""
    return ops.reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=reduce_ops.Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Horovod's grouped_reducescatter (pending: issue 13)."""
    return ops.grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                           postscale_factor)
