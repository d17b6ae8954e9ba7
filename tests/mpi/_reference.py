"""Inputs and NumPy references shared by the rank programs (every rank can build every
rank's input, so each computes the expected result itself)."""

import ml_dtypes
import numpy as np

from _util import COMM

size = COMM.size

FLOATS = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
COMPLEX = [np.complex64, np.complex128]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
SHAPES = [(), (0,), (7,), (3, 4)]


def ops_for(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return ["min", "max"]
    if dtype.kind == "c":
        return ["sum", "average", "prod"]
    if dtype.kind in "iu":
        return ["sum", "min", "max", "prod"]
    return ["sum", "average", "min", "max", "prod"]


def local_input(dtype, shape, op, r, salt):
    rng = np.random.default_rng([r, salt])
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.4
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -3
        hi = 3 if op == "prod" else 50
        return rng.integers(lo, hi, size=shape).astype(dtype)
    if op == "prod":
        base = rng.uniform(0.5, 1.5, size=shape)
    else:
        base = rng.standard_normal(shape)
    if dtype.kind == "c":
        base = base + 1j * (rng.uniform(0.5, 1.5, size=shape) if op == "prod" else rng.standard_normal(shape))
    return np.asarray(base).astype(dtype)


def reference(inputs, op, dtype, divisor=None):
    dtype = np.dtype(dtype)
    wide = np.complex128 if dtype.kind == "c" else (np.float64 if dtype.kind == "f" or dtype == ml_dtypes.bfloat16 else None)
    stack = np.stack([x.astype(wide) if wide else x for x in inputs])
    if op in ("sum", "average"):
        out = stack.sum(axis=0, dtype=wide or dtype)
        if op == "average":
            out = out / (size if divisor is None else divisor)
    elif op == "prod":
        out = stack.prod(axis=0, dtype=wide or dtype)
    elif op == "min":
        out = stack.min(axis=0)
    else:
        out = stack.max(axis=0)
    return np.asarray(out).astype(dtype)


def tolerance(dtype):
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        return 3e-2, 3e-2
    if dtype in (np.dtype(np.float32), np.dtype(np.complex64)):
        return 1e-5, 1e-5
    return 1e-12, 1e-12


