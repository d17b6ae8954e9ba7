"""Validated submission of each kind, shared by the public functions in ops.py and the
differentiable ones in collectives.py (which submit here, in the caller's frame, and wait
inside autograd)."""

from __future__ import annotations

import torch

from .. import runtime as _runtime
from .. import session as _session
from ..compat import reduce_ops
from ..compat.process_sets import Resolved
from ..errors import DuplicateNameError
from ..ops import validation
from ..protocol import Kind
from .checks import check_name, check_reduction, check_tensor, reduce_args, set_root
from .requests import Handle, auto_name, submit, submit_allocated

# ---------------------------------------------------------------------------------------------
# Validated submission, shared by the public functions below and the differentiable ones in
# collectives.py (which submit here, in the caller's frame, and wait inside autograd).


def _name_or_auto(name, kind: str, fn: str, ps: Resolved) -> tuple[str, bool]:
    """(collective name, automatic) for the user's `name` (None: derived from the call site)."""
    check_name(name, fn)
    if name is None:
        return auto_name(kind, ps.id), True
    if not _session.current("a torch collective").in_flight.hold(ps.id, name):
        raise DuplicateNameError(
            f"jaxcache.torch.{fn}: a collective named {name!r} is already in flight on this rank; an "
            "explicitly named request must be synchronized before the name is used again")
    return name, False


def what_of(name, single: bool, i: int) -> str:
    if single:
        return f"tensor {name!r}" if name else "tensor"
    return f"tensors[{i}]" + (f" of {name!r}" if name else "")


def reduce_spec(fn: str, op, average, prescale_factor, postscale_factor, prescale,
                postscale) -> tuple[str, float, float]:
    """(op string, prescale, postscale) from Horovod's and jaxcache's argument spellings."""
    op = reduce_ops.resolve(op, average, f"torch.{fn}")
    pre, post = reduce_ops.scales(prescale_factor, postscale_factor, prescale, postscale, f"torch.{fn}")
    return op, pre, post


# The *_submit functions take the process set resolved by the caller (set_of): `ps`.


def allreduce_submit(tensors, op: str, name, prescale, postscale, fn: str, inplace: bool,
                     single: bool, ps: Resolved) -> Handle:
    """Validates and submits one allreduce request (op is a jaxcache op string)."""
    _runtime.require_initialized(f"jaxcache.torch.{fn}")
    for i, t in enumerate(tensors):
        what = what_of(name, single, i)
        check_tensor(t, fn, what)
        check_reduction(t, op, prescale, postscale, fn, what)
    code, pre, post = reduce_args(op, prescale, postscale)
    name, auto = _name_or_auto(name, "allreduce" if single else "grouped_allreduce", fn, ps)
    return submit(Kind.ALLREDUCE, name, tensors, inplace=inplace, op=code, prescale=pre,
                  postscale=post, auto_name=auto, single=single, process_set=ps)


def reducescatter_submit(tensors, op: str, name, prescale, postscale, fn: str, single: bool,
                         ps: Resolved) -> Handle:
    """Validates and submits one reducescatter request (op is a jaxcache op string)."""
    _runtime.require_initialized(f"jaxcache.torch.{fn}")
    for i, t in enumerate(tensors):
        what = what_of(name, single, i)
        check_tensor(t, fn, what)
        check_reduction(t, op, prescale, postscale, fn, what)
        validation.check_first_dim(t, f"torch.{fn}", what)
    code, pre, post = reduce_args(op, prescale, postscale)
    name, auto = _name_or_auto(name, "reducescatter" if single else "grouped_reducescatter", fn, ps)
    return submit(Kind.REDUCESCATTER, name, tensors, inplace=False, op=code, prescale=pre,
                  postscale=post, auto_name=auto, single=single, process_set=ps)


def broadcast_submit(tensors, root_rank, name, fn: str, inplace: bool, ps: Resolved,
                     single: bool = True) -> Handle:
    """Validates and submits one broadcast from `root_rank` (a global rank, member of `ps`)."""
    _runtime.require_initialized(f"jaxcache.torch.{fn}")
    for i, t in enumerate(tensors):
        check_tensor(t, fn, what_of(name, single, i))
    root = set_root(root_rank, ps, fn)
    name, auto = _name_or_auto(name, "broadcast", fn, ps)
    return submit(Kind.BROADCAST, name, tensors, inplace=inplace, root=root, auto_name=auto,
                  single=single, process_set=ps)


def allgather_submit(tensors, name, fn: str, ps: Resolved, single: bool = True) -> Handle:
    """Validates and submits one allgather request (first dimensions may differ per rank)."""
    _runtime.require_initialized(f"jaxcache.torch.{fn}")
    for i, t in enumerate(tensors):
        check_tensor(t, fn, what_of(name, single, i))
    name, auto = _name_or_auto(name, "allgather" if single else "grouped_allgather", fn, ps)
    return submit_allocated(Kind.ALLGATHER, name, tensors, auto_name=auto, single=single,
                            process_set=ps)


def alltoall_submit(tensor, splits, name, fn: str, ps: Resolved) -> Handle:
    """Validates and submits one alltoall; synchronize() returns (tensor, received splits)."""
    _runtime.require_initialized(f"jaxcache.torch.{fn}")
    what = what_of(name, True, 0)
    check_tensor(tensor, fn, what)
    validation.check_first_dim(tensor, f"torch.{fn}", what)
    splits_dtype = torch.int32
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1 or splits.dtype.is_floating_point or splits.dtype.is_complex \
                or splits.dtype == torch.bool:
            # A ValueError, as Horovod raises for splits of another dtype.
            raise ValueError(f"jaxcache.torch.{fn}: splits must be a 1-D integer tensor, got "
                             f"{splits.dtype}{list(splits.shape)}")
        splits_dtype = splits.dtype  # Horovod: the received splits have the splits' dtype
        splits = splits.tolist()
    counts = None if splits is None else validation.check_splits(splits, f"torch.{fn}")
    name, auto = _name_or_auto(name, "alltoall", fn, ps)
    return submit_allocated(Kind.ALLTOALL, name, [tensor], splits=counts, splits_dtype=splits_dtype,
                            auto_name=auto, process_set=ps)


def as_list(tensors, fn: str) -> list:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"jaxcache.torch.{fn}: tensors must be a list or tuple of tensors, got "
                        f"{type(tensors).__name__}")
    return list(tensors)
