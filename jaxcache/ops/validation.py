"""Input checks shared by the collectives; each error names the tensor and the value."""

from __future__ import annotations

import math

import numpy as np

import jax
import jax.numpy as jnp

from ..protocol import NUMPY_DTYPES, REDUCE_OPS  # noqa: F401  (REDUCE_OPS: the ops modules read it here)

# The runtime divides an "average" by the set's size (after join() too, unless
# JAXCACHE_JOIN_AVERAGE_BY_SIZE=0: then by the ranks that have not joined).
USER_OPS = tuple(REDUCE_OPS)
SUPPORTED_DTYPES = frozenset(NUMPY_DTYPES)


def check_op(op: str, fn: str) -> str:
    if not isinstance(op, str) or op.lower() not in USER_OPS:
        raise ValueError(f"jaxcache.{fn}: op must be one of {', '.join(USER_OPS)}; got {op!r}")
    return op.lower()


def array_leaves(tree, fn: str, check=None) -> tuple[list, list, object]:
    """(paths, arrays, treedef) of a pytree's leaves (None leaves are not leaves); each leaf
    goes through `check(leaf, what)` (default: as_array), `what` naming it in errors."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    check = check or (lambda v, what: as_array(v, fn, what))
    values = [check(v, f"leaf {jax.tree_util.keystr(p) or 'x'}") for p, v in leaves]
    return [p for p, _ in leaves], values, treedef


def reduction_leaf(x, op: str, prescale, postscale, fn: str, what: str):
    """A leaf of a reduction: an array whose dtype supports `op` and the scales."""
    x = as_array(x, fn, what)
    check_reduction(x.dtype, op, prescale, postscale, fn, what)
    return x


def as_array(x, fn: str, what: str):
    """Arrays, tracers and Python/NumPy scalars become jax values; anything else is refused."""
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        value = x
    elif isinstance(x, (np.ndarray, np.generic)):
        if np.dtype(x.dtype) not in SUPPORTED_DTYPES:
            raise TypeError(
                f"jaxcache.{fn}: {what} must be an array of numbers or bools, got dtype {x.dtype}"
            )
        value = jnp.asarray(x)
    elif isinstance(x, (bool, int, float, complex)):
        value = jnp.asarray(x)
    else:
        raise TypeError(
            f"jaxcache.{fn}: {what} must be an array or a number, got {type(x).__name__}"
        )
    if np.dtype(value.dtype) not in SUPPORTED_DTYPES:
        raise TypeError(
            f"jaxcache.{fn}: {what} has unsupported dtype {value.dtype}; supported: bool, "
            "(u)int8-64, float16, bfloat16, float32, float64, complex64, complex128"
        )
    return value


def check_reduction(dtype, op: str, prescale: float, postscale: float, fn: str, what: str) -> None:
    """Integers may be averaged and scaled: in double precision, truncated toward zero
    (Horovod's rule; the runtime divides an integer average after the sum, so an average
    of equal integers is exact)."""
    # Runs on every eager call: plain comparisons, no jnp dtype machinery.
    dtype = np.dtype(dtype)
    is_bool = dtype.kind == "b"
    if is_bool and op not in ("min", "max"):
        raise TypeError(
            f"jaxcache.{fn}: {what} is bool; only op='min' (logical and) or 'max' (logical or) "
            f"apply to bool, not {op!r}"
        )
    if dtype.kind == "c" and op in ("min", "max"):
        raise TypeError(f"jaxcache.{fn}: op={op!r} is undefined for complex {what} ({dtype})")
    for label, value in (("prescale", prescale), ("postscale", postscale)):
        if not isinstance(value, (int, float, np.floating, np.integer)) or not math.isfinite(value):
            raise ValueError(f"jaxcache.{fn}: {label} must be a finite number, got {value!r}")
        if value != 1.0 and is_bool:
            raise TypeError(f"jaxcache.{fn}: {label}={value} cannot scale bool {what}")


def check_root(root, size: int, fn: str) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise TypeError(f"jaxcache.{fn}: root must be an int, got {type(root).__name__}")
    if not 0 <= int(root) < size:
        raise ValueError(f"jaxcache.{fn}: root={root} is outside [0, {size}) (world size {size})")
    return int(root)


def check_first_dim(x, fn: str, what: str) -> None:
    """Collectives that split the first dimension refuse scalars."""
    if not np.ndim(x):
        raise ValueError(f"jaxcache.{fn}: {what} is a scalar; it needs a first dimension to split")


def check_splits(splits, fn: str) -> list[int]:
    """A 1-D sequence of non-negative ints. Its length and sum are checked by rank 0, so that
    a mismatch between ranks fails on every rank (MismatchError) instead of on one."""
    if isinstance(splits, (jax.Array, np.ndarray)) and not isinstance(splits, jax.core.Tracer):
        if splits.ndim != 1 or not jnp.issubdtype(splits.dtype, jnp.integer):
            raise TypeError(f"jaxcache.{fn}: splits must be a 1-D integer array, got "
                            f"{splits.dtype}{list(splits.shape)}")
        values = [int(v) for v in np.asarray(splits)]
    elif isinstance(splits, (list, tuple)):
        values = list(splits)
        for v in values:
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"jaxcache.{fn}: splits must be ints, got {splits!r}")
    else:
        raise TypeError(f"jaxcache.{fn}: splits must be a list, tuple or 1-D integer array of "
                        f"rows per destination rank, got {type(splits).__name__}")
    if any(v < 0 for v in values):
        raise ValueError(f"jaxcache.{fn}: splits must not be negative, got {[int(v) for v in values]}")
    return [int(v) for v in values]


def check_name(name, fn: str) -> None:
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"jaxcache.{fn}: name must be a non-empty str, got {name!r}")
