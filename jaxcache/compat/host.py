"""Blocking collectives on NumPy arrays, straight to the runtime (no framework tensors)."""

from __future__ import annotations

import numpy as np

from .._ext import ext
from ..errors import raise_for_status
from ..ops.eager import DTYPE_CODES, KIND_ALLGATHER, KIND_BROADCAST, wait


def allgather(name: str, a: np.ndarray) -> np.ndarray:
    """Every rank's `a` (same shape everywhere) stacked along a new first axis."""
    from .. import runtime
    a = np.asarray(a)
    if not a.flags.c_contiguous:
        a = a.copy()
    out = np.empty((runtime.size(),) + a.shape, a.dtype)
    handle = ext.submit(KIND_ALLGATHER, name, [a.reshape(-1) if a.ndim else a.reshape(1)],
                        [out.reshape(-1)], 0, 1.0, 1.0, 0, [DTYPE_CODES[a.dtype]])
    raise_for_status(*wait(handle, (a, out)))
    return out


def broadcast_(name: str, a: np.ndarray, root: int) -> np.ndarray:
    """Overwrites the contiguous array `a` with root's value, in place."""
    handle = ext.submit(KIND_BROADCAST, name, [a], [a], 0, 1.0, 1.0, root, [DTYPE_CODES[a.dtype]])
    raise_for_status(*wait(handle, a))
    return a
