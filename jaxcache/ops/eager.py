"""Eager path: concrete arrays go straight to the runtime (no XLA program to compile)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

import jax
import jax.numpy as jnp

from .._ext import ext
from ..errors import raise_for_status

KIND_ALLREDUCE, KIND_BROADCAST, KIND_ALLGATHER = 0, 1, 2

# Codes of xla_ext/common.h DType.
DTYPE_CODES = {
    np.dtype(t): i
    for i, t in enumerate(
        (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
         np.uint64, np.float16, jnp.bfloat16, np.float32, np.float64, np.complex64, np.complex128)
    )
}


def _bits(x: np.ndarray) -> np.ndarray:
    """Same bytes in a dtype every DLPack consumer knows (bfloat16 -> uint16)."""
    return x.view(np.uint16) if x.dtype == jnp.bfloat16 else x


def run(kind: int, name: str, inputs: Sequence[jax.Array], out_shapes: Sequence[tuple],
        op: int = 0, prescale: float = 1.0, postscale: float = 1.0, root: int = 0) -> list[jax.Array]:
    """Submits one named request, waits for it, and returns new jax arrays."""
    # np.asarray of a CPU jax array is a read-only view of its buffer: no copy.
    ins = [np.ascontiguousarray(np.asarray(x)) for x in inputs]
    outs = [np.empty(shape, x.dtype) for shape, x in zip(out_shapes, ins)]
    codes = [DTYPE_CODES[x.dtype] for x in ins]
    handle = ext.submit(kind, name, [_bits(x) for x in ins], [_bits(o) for o in outs],
                        op, float(prescale), float(postscale), root, codes)
    status, message = handle.wait()
    raise_for_status(status, message)
    return [jnp.asarray(o) for o in outs]
