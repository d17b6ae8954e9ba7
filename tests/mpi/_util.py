"""Helpers for the rank-side test programs."""

from __future__ import annotations

import re

import numpy as np
from mpi4py import MPI

COMM = MPI.COMM_WORLD


def same_on_all_ranks(value, what: str = "result") -> None:
    """Asserts `value` is bitwise identical on every rank."""
    arr = np.ascontiguousarray(np.asarray(value))
    raw = arr.view(np.uint8).tobytes() + str((arr.dtype, arr.shape)).encode()
    all_raw = COMM.allgather(raw)
    for r, other in enumerate(all_raw):
        assert other == raw, f"{what} differs between rank {COMM.rank} and rank {r}"


def assert_close(actual, expected, what: str, rtol: float = 1e-6, atol: float = 0) -> None:
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype.kind in "fc" or str(actual.dtype) == "bfloat16":
        np.testing.assert_allclose(actual.astype(np.complex128 if actual.dtype.kind == "c" else np.float64),
                                   expected.astype(np.complex128 if expected.dtype.kind == "c" else np.float64),
                                   rtol=rtol, atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def done(name: str) -> None:
    COMM.Barrier()
    if COMM.rank == 0:
        print(f"{name}: OK on {COMM.size} ranks", flush=True)


def raises(exc, pattern: str, fn, *args, **kwargs):
    """Calls fn and asserts it raises `exc` with a message matching `pattern`; returns it."""
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert re.search(pattern, str(e)), f"{type(e).__name__}: {str(e)!r} lacks {pattern!r}"
        return e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected {exc.__name__} matching {pattern!r}, got {type(e).__name__}: {e}")
    raise AssertionError(f"expected {exc.__name__} matching {pattern!r}, nothing raised")
