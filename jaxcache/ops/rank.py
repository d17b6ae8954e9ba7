"""This process's rank as a value computed when the program runs.

Transposes that depend on the rank (broadcast, allgather) use it instead of a Python
constant, so every rank compiles the same program: XLA simplifies constants differently,
and differently scheduled programs can leave ranks waiting for different collectives.
"""

from __future__ import annotations

import numpy as np

import jax
from jax.extend.core import Primitive
from jax.interpreters import batching

from .. import runtime
from .._ext import ensure_registered, ext
from . import lowering

rank_p = Primitive("jaxcache_rank")


def _lowering(ctx, *, process_set):
    ensure_registered()
    return jax.ffi.ffi_lowering("jaxcache_rank")(ctx, process_set=np.int64(process_set))


def _impl(*, process_set):
    return np.int32(runtime.rank() if process_set == 0 else ext.set_rank(process_set))


def _abstract_eval(*, process_set):
    return jax.core.ShapedArray((), np.int32)


rank_p.def_impl(_impl)
rank_p.def_abstract_eval(_abstract_eval)
lowering.register(rank_p, _lowering)
batching.primitive_batchers[rank_p] = lambda args, dims, **params: (rank_p.bind(**params), None)


def traced_rank(process_set: int = 0):
    """int32 scalar: the rank, within `process_set`, of the process running the program."""
    return rank_p.bind(process_set=process_set)
