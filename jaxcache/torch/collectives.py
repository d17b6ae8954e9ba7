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
them, and run in the forward's process set (sizes and ranks above are the set's). The
forward collective is submitted in the caller's frame (its automatic name comes from the
caller's line) and waited for inside the autograd Function.
"""

from __future__ import annotations

import torch

from ..compat import reduce_ops
from ..compat.process_sets import global_process_set
from . import compression as _compression
from . import checks, requests, submitters
from .compression import Compression


def _grad_name(name: str) -> str:
    return f"{name}/grad"


def _own_rows(grad: torch.Tensor, rows: list[int], scalar: bool, r: int) -> torch.Tensor:
    """Rank r's part of an allgather's gradient: rows are every rank's first dimension."""
    offset = sum(rows[:r])
    if scalar:
        return grad[offset]
    return grad.narrow(0, offset, rows[r])


def _rows_per_tensor(rows: list[int], n: int) -> list[list[int]]:
    size = len(rows) // n
    return [rows[i * size:(i + 1) * size] for i in range(n)]


def _scatter_grad_scale(op: str, pre: float, post: float, size: int) -> float:
    # Horovod's reducescatter gradient: times the set's size for Sum, times both scale factors.
    return (size if op == "sum" else 1.0) * pre * post


def _scaled(grads, factor: float) -> list:
    return list(grads) if factor == 1.0 else [g * factor for g in grads]


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, handle, spec, *tensors):
        ctx.spec = (handle.name, handle.process_set, *spec)
        out = requests.synchronize(handle)
        return tuple(out) if isinstance(out, list) else out

    @staticmethod
    def backward(ctx, *grads):
        name, ps, op, pre, post = ctx.spec
        single = len(grads) == 1
        out = requests.synchronize(submitters.allreduce_submit(list(grads), op, _grad_name(name), pre, post,
                                                   "allreduce (backward)", False, single, ps))
        return (None, None, *([out] if single else out))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, handle, *tensors):
        out = requests.synchronize(handle)
        ctx.spec = (handle.name, handle.process_set, _rows_per_tensor(handle.rows, len(tensors)),
                    [t.dim() == 0 for t in tensors])
        return tuple(out) if isinstance(out, list) else out

    @staticmethod
    def backward(ctx, *grads):
        name, ps, rows, scalars = ctx.spec
        single = len(grads) == 1
        reduced = requests.synchronize(submitters.allreduce_submit(list(grads), "average", _grad_name(name), 1.0,
                                                       1.0, "allgather (backward)", False, single, ps))
        reduced = [reduced] if single else reduced
        return (None, *[_own_rows(g, r, s, ps.rank) for g, r, s in zip(reduced, rows, scalars)])


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, handle, root, tensor):
        ctx.spec = (handle.name, handle.process_set, root)
        return requests.synchronize(handle)

    @staticmethod
    def backward(ctx, grad):
        name, ps, root = ctx.spec
        reduced = requests.synchronize(submitters.allreduce_submit([grad], "average", _grad_name(name), 1.0, 1.0,
                                                       "broadcast (backward)", False, True, ps))
        if ps.ranks[ps.rank] != root:  # root is a global rank
            reduced = reduced * 0
        return None, None, reduced


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, handle, factor, *tensors):
        ctx.spec = (handle.name, handle.process_set, factor)
        out = requests.synchronize(handle)
        return tuple(out) if isinstance(out, list) else out

    @staticmethod
    def backward(ctx, *grads):
        name, ps, factor = ctx.spec
        single = len(grads) == 1
        gathered = requests.synchronize(submitters.allgather_submit(_scaled(grads, factor), _grad_name(name),
                                                        "reducescatter (backward)", ps, single))
        return (None, None, *([gathered] if single else gathered))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, handle, tensor):
        out, received = requests.synchronize(handle)
        ctx.spec = (handle.name, handle.process_set, handle.rows)
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _received):
        name, ps, received = ctx.spec
        back, _ = requests.synchronize(submitters.alltoall_submit(grad, received, _grad_name(name),
                                                      "alltoall (backward)", ps))
        return None, back


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set, *,
              prescale=None, postscale=None) -> torch.Tensor:
    """The reduction of `tensor` over all ranks (of `process_set`), as a new tensor
    (differentiable).

    op: Average (default), Sum, Min, Max, Product (or jaxcache's 'average', 'sum', ...); an
    average divides by the set's size, also after join() (JAXCACHE_JOIN_AVERAGE_BY_SIZE=0:
    by the ranks of the set that have not joined).
    compression: Compression.none / fp16 / bf16, applied around the reduction.
    """
    op, pre, post = submitters.reduce_spec("allreduce", op, average, prescale_factor, postscale_factor,
                                    prescale, postscale)
    ps = checks.set_of(process_set, "allreduce")
    checks.check_tensor(tensor, "allreduce", f"tensor {name!r}" if name else "tensor")
    _compression.check(compression, "allreduce")
    compressed, cctx = compression.compress(tensor)
    handle = submitters.allreduce_submit([compressed], op, name, pre, post, "allreduce", False, True, ps)
    return compression.decompress(_Allreduce.apply(handle, (op, pre, post), compressed), cctx)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set, *,
                      prescale=None, postscale=None) -> list[torch.Tensor]:
    """Reduces a list of tensors as one atomic, fused request; returns new tensors (differentiable)."""
    tensors = submitters.as_list(tensors, "grouped_allreduce")
    op, pre, post = submitters.reduce_spec("grouped_allreduce", op, average, prescale_factor,
                                    postscale_factor, prescale, postscale)
    ps = checks.set_of(process_set, "grouped_allreduce")
    for i, t in enumerate(tensors):
        checks.check_tensor(t, "grouped_allreduce", submitters.what_of(name, False, i))
    _compression.check(compression, "grouped_allreduce")
    if not tensors:
        return []
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    handle = submitters.allreduce_submit(list(compressed), op, name, pre, post, "grouped_allreduce", False,
                                  False, ps)
    outs = _Allreduce.apply(handle, (op, pre, post), *compressed)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Every rank's `tensor` concatenated along dim 0 in rank order (of `process_set`; a scalar
    gives one value per rank). The first dimension may differ between ranks; the others must
    agree. Differentiable."""
    ps = checks.set_of(process_set, "allgather")
    return _Allgather.apply(submitters.allgather_submit([tensor], name, "allgather", ps), tensor)


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> list[torch.Tensor]:
    """allgather of every tensor of the list as one atomic request (differentiable)."""
    ps = checks.set_of(process_set, "grouped_allgather")
    tensors = submitters.as_list(tensors, "grouped_allgather")
    if not tensors:
        return []
    return list(_Allgather.apply(submitters.allgather_submit(tensors, name, "grouped_allgather", ps, False),
                                 *tensors))


def broadcast(tensor, root_rank=0, name=None, process_set=global_process_set) -> torch.Tensor:
    """`root_rank`'s value of `tensor`, as a new tensor on every rank (differentiable).
    `root_rank` is a global rank, also with a process set."""
    ps = checks.set_of(process_set, "broadcast")
    handle = submitters.broadcast_submit([tensor], root_rank, name, "broadcast", False, ps)
    return _Broadcast.apply(handle, int(root_rank), tensor)


def _reducescatter(tensors, name, compression, op, process_set, prescale_factor, postscale_factor,
                   prescale, postscale, fn: str, single: bool) -> list[torch.Tensor]:
    op, pre, post = submitters.reduce_spec(fn, op, None, prescale_factor, postscale_factor, prescale,
                                    postscale)
    ps = checks.set_of(process_set, fn)
    for i, t in enumerate(tensors):
        checks.check_tensor(t, fn, submitters.what_of(name, single, i))
    _compression.check(compression, fn)
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    handle = submitters.reducescatter_submit(list(compressed), op, name, pre, post, fn, single, ps)
    outs = _Reducescatter.apply(handle, _scatter_grad_scale(op, pre, post, ps.size), *compressed)
    outs = [outs] if single else outs
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def reducescatter(tensor, name=None, compression=Compression.none, op=reduce_ops.Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0, *,
                  prescale=None, postscale=None) -> torch.Tensor:
    """Reduces `tensor` over all ranks (of `process_set`) and returns this rank's rows of dim 0
    (differentiable).

    Rank r (of the set) gets `shape[0] // size` rows, one more when `r < shape[0] % size`
    (Horovod's split). op: Average (default), Sum, Min, Max, Product (or 'average', 'sum', ...); an
    average divides by the set's size, also after join() (JAXCACHE_JOIN_AVERAGE_BY_SIZE=0: by
    the ranks that have not joined).
    """
    return _reducescatter([tensor], name, compression, op, process_set, prescale_factor,
                          postscale_factor, prescale, postscale, "reducescatter", True)[0]


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=reduce_ops.Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0,
                          *, prescale=None, postscale=None) -> list[torch.Tensor]:
    """reducescatter of every tensor of the list as one atomic request (differentiable)."""
    tensors = submitters.as_list(tensors, "grouped_reducescatter")
    if not tensors:
        return []
    return _reducescatter(tensors, name, compression, op, process_set, prescale_factor,
                          postscale_factor, prescale, postscale, "grouped_reducescatter", False)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends `splits[j]` rows of dim 0 to rank j (of `process_set`; default: `size` equal
    blocks) and returns the rows received, concatenated in rank order (differentiable).

    With `splits` (a list or an integer tensor; may differ per rank) it returns
    `(tensor, received_splits)`, the rows that came from each rank, as Horovod does.
    """
    ps = checks.set_of(process_set, "alltoall")
    out, received = _Alltoall.apply(submitters.alltoall_submit(tensor, splits, name, "alltoall", ps), tensor)
    return out if splits is None else (out, received)
