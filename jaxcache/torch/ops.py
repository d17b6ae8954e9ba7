"""Public non-differentiable torch collectives: the asynchronous and in-place forms.

The request machinery (staging, handles, synchronize) is in requests.py, the validation
in checks.py and submitters.py; the differentiable collectives in collectives.py.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import runtime as _runtime
from ..compat import reduce_ops
from ..compat.process_sets import global_process_set
from ..ops.barrier import barrier as _barrier
from .checks import set_of
from .requests import Handle, synchronize
from .submitters import (allgather_submit, allreduce_submit, alltoall_submit, as_list,
                         broadcast_submit, reduce_spec, reducescatter_submit)

# ---------------------------------------------------------------------------------------------
# Public non-differentiable collectives: asynchronous and in-place forms (Horovod's signatures;
# jaxcache's op strings and prescale/postscale spellings remain valid). `process_set` limits a
# collective to a registered set (sizes, rank order and averages are the set's; `root_rank`
# stays a global rank). An 'average' divides by the set's size (after join() too, unless
# JAXCACHE_JOIN_AVERAGE_BY_SIZE=0).


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set, *, prescale=None,
                    postscale=None) -> Handle:
    """Starts an allreduce of `tensor` into a new tensor; `synchronize(handle)` returns it.

    op: Average (default), Sum, Min, Max, Product, or 'average', 'sum', 'min', 'max', 'prod'.
    prescale_factor multiplies the input before the reduction, postscale_factor the result
    (`prescale=`/`postscale=` are accepted too). Every rank must use the same name (default:
    derived from the call site) for the same collective.
    """
    fn = "allreduce_async"
    op, pre, post = reduce_spec(fn, op, average, prescale_factor, postscale_factor, prescale, postscale)
    return allreduce_submit([tensor], op, name, pre, post, fn, False, True, set_of(process_set, fn))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set, *, prescale=None,
                     postscale=None) -> Handle:
    """In-place allreduce_async: the result is written into `tensor`."""
    fn = "allreduce_async_"
    op, pre, post = reduce_spec(fn, op, average, prescale_factor, postscale_factor, prescale, postscale)
    return allreduce_submit([tensor], op, name, pre, post, fn, True, True, set_of(process_set, fn))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, *, prescale=None,
               postscale=None) -> torch.Tensor:
    """In-place allreduce: reduces `tensor` over the ranks (of `process_set`) into itself and
    returns it."""
    fn = "allreduce_"
    op, pre, post = reduce_spec(fn, op, average, prescale_factor, postscale_factor, prescale, postscale)
    return synchronize(allreduce_submit([tensor], op, name, pre, post, fn, True, True,
                                        set_of(process_set, fn)))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set, *, prescale=None,
                            postscale=None) -> Handle:
    """One atomic request reducing every tensor of the list; synchronize() returns a list."""
    fn = "grouped_allreduce_async"
    tensors = as_list(tensors, fn)
    op, pre, post = reduce_spec(fn, op, average, prescale_factor, postscale_factor, prescale, postscale)
    return allreduce_submit(tensors, op, name, pre, post, fn, False, False, set_of(process_set, fn))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set, *,
                             prescale=None, postscale=None) -> Handle:
    """In-place grouped_allreduce_async."""
    fn = "grouped_allreduce_async_"
    tensors = as_list(tensors, fn)
    op, pre, post = reduce_spec(fn, op, average, prescale_factor, postscale_factor, prescale, postscale)
    return allreduce_submit(tensors, op, name, pre, post, fn, True, False, set_of(process_set, fn))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, *, prescale=None,
                       postscale=None) -> list[torch.Tensor]:
    """In-place grouped_allreduce: reduces each tensor into itself; returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set, prescale=prescale,
                                                postscale=postscale))


def reducescatter_async(tensor, name=None, op=reduce_ops.Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0, *, prescale=None,
                        postscale=None) -> Handle:
    """Starts a reducescatter: the reduction over the ranks (of `process_set`), of which this
    rank keeps its rows of dim 0 (`shape[0] // size`, one more for the first `shape[0] % size`
    ranks, in the set's rank order)."""
    fn = "reducescatter_async"
    op, pre, post = reduce_spec(fn, op, None, prescale_factor, postscale_factor, prescale, postscale)
    return reducescatter_submit([tensor], op, name, pre, post, fn, True, set_of(process_set, fn))


def grouped_reducescatter_async(tensors, name=None, op=reduce_ops.Average,
                                process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0, *, prescale=None, postscale=None) -> Handle:
    """One atomic reducescatter of every tensor of the list; synchronize() returns a list."""
    fn = "grouped_reducescatter_async"
    tensors = as_list(tensors, fn)
    op, pre, post = reduce_spec(fn, op, None, prescale_factor, postscale_factor, prescale, postscale)
    return reducescatter_submit(tensors, op, name, pre, post, fn, False, set_of(process_set, fn))


def broadcast_async(tensor, root_rank=0, name=None, process_set=global_process_set) -> Handle:
    """Starts a broadcast of root_rank's `tensor` into a new tensor (root_rank is a global rank,
    also with a process set)."""
    fn = "broadcast_async"
    return broadcast_submit([tensor], root_rank, name, fn, False, set_of(process_set, fn))


def broadcast_async_(tensor, root_rank=0, name=None, process_set=global_process_set) -> Handle:
    """In-place broadcast_async: `tensor` is overwritten with root_rank's value."""
    fn = "broadcast_async_"
    return broadcast_submit([tensor], root_rank, name, fn, True, set_of(process_set, fn))


def broadcast_(tensor, root_rank=0, name=None, process_set=global_process_set) -> torch.Tensor:
    """In-place broadcast: overwrites `tensor` with `root_rank`'s value and returns it."""
    fn = "broadcast_"
    return synchronize(broadcast_submit([tensor], root_rank, name, fn, True, set_of(process_set, fn)))


def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Starts an allgather: every rank's `tensor` concatenated along dim 0, in rank order (the
    set's). The first dimension may differ between ranks; the others must agree."""
    fn = "allgather_async"
    return allgather_submit([tensor], name, fn, set_of(process_set, fn))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    """One atomic allgather of every tensor of the list; synchronize() returns a list."""
    fn = "grouped_allgather_async"
    tensors = as_list(tensors, fn)
    return allgather_submit(tensors, name, fn, set_of(process_set, fn), single=False)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Starts an alltoall: `splits[j]` rows of dim 0 go to rank j of the set (default: equal
    blocks).

    synchronize() returns `(tensor, received_splits)` (Horovod's convention): the rows
    received, concatenated in rank order, and how many came from each rank (int32, or the
    dtype of a `splits` tensor).
    """
    fn = "alltoall_async"
    return alltoall_submit(tensor, splits, name, fn, set_of(process_set, fn))


def join(device=-1) -> int:
    """This rank has no more data: it serves the other ranks' collectives until every rank has
    joined, and returns the rank that joined last (on every rank).

    Meanwhile it contributes zeros to sums (the identity to min/max/prod) and no rows to
    allgathers; an 'average' still divides by the size (Horovod's rule;
    JAXCACHE_JOIN_AVERAGE_BY_SIZE=0: by the ranks that have not joined). Synchronize this
    rank's handles first. `device` (Horovod's device for its zero tensors) is accepted and
    not needed: the runtime contributes on the host.
    """
    if isinstance(device, bool) or not isinstance(device, (int, np.integer, torch.device)):
        raise TypeError(f"jaxcache.torch.join: device must be an int (Horovod's device id, -1 for "
                        f"CPU), got {device!r}")
    _runtime.require_initialized("jaxcache.torch.join")
    return _runtime.join()


def barrier(process_set=global_process_set) -> None:
    """Blocks until every rank of `process_set` reaches it."""
    set_of(process_set, "barrier")  # this rank must be a member
    _barrier("torch.barrier", process_set=process_set)
