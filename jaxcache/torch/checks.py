"""Validation of torch arguments: tensors, dtypes, reductions, roots, names, process sets."""

from __future__ import annotations

import numpy as np
import torch

from .. import runtime as _runtime
from ..compat import process_sets
from ..compat.process_sets import Resolved
from ..ops import validation
from ..protocol import DTYPE_NAMES, NUMPY_BY_DTYPE, DType

# The runtime's dtypes by torch dtype (torch has NumPy's names; uint16/32/64 since 2.3).
DTYPE_CODES: dict[torch.dtype, DType] = {
    getattr(torch, name): code for code, name in DTYPE_NAMES.items() if hasattr(torch, name)}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The NumPy (ml_dtypes for bfloat16) equivalent of a supported torch dtype."""
    return NUMPY_BY_DTYPE[DTYPE_CODES[dtype]]


# ---------------------------------------------------------------------------------------------
# Validation


def check_tensor(t, fn: str, what: str) -> torch.Tensor:
    """Refuses non-tensors, sparse tensors and unsupported dtypes, naming the tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"jaxcache.torch.{fn}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(
            f"jaxcache.torch.{fn}: {what} has layout {t.layout}; only dense (strided) tensors are "
            "supported (call .to_dense() first)"
        )
    if t.dtype not in DTYPE_CODES:
        raise TypeError(
            f"jaxcache.torch.{fn}: {what} has unsupported dtype {t.dtype}; supported: bool, "
            "(u)int8-64, float16, bfloat16, float32, float64, complex64, complex128"
        )
    return t


def check_reduction(t: torch.Tensor, op: str, prescale: float, postscale: float, fn: str,
                    what: str) -> None:
    validation.check_reduction(numpy_dtype(t.dtype), op, prescale, postscale, f"torch.{fn}", what)


def check_root(root_rank, fn: str) -> int:
    return validation.check_root(root_rank, _runtime.size(), f"torch.{fn}")


def set_of(process_set, fn: str) -> Resolved:
    """The registered process set a call names; ValueError on a rank that is not a member."""
    return process_sets.resolve(process_set, f"torch.{fn}")


def set_root(root_rank, ps: Resolved, fn: str) -> int:
    """A global root rank as the root's rank within `ps` (ValueError if it is not a member)."""
    return process_sets.set_root(root_rank, ps, f"torch.{fn}")


def check_name(name, fn: str) -> None:
    validation.check_name(name, f"torch.{fn}")


def reduce_args(op: str, prescale: float, postscale: float) -> tuple[int, float, float]:
    """Wire op code and scales. The runtime divides an 'average' (by the set's size, or
    with JAXCACHE_JOIN_AVERAGE_BY_SIZE=0 by the ranks that have not joined)."""
    return validation.REDUCE_OPS[op], float(prescale), float(postscale)
