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
from .._ext import ensure_registered
from . import lowering

rank_p = Primitive("jaxcache_rank")


def _abstract_eval():
    return jax.core.ShapedArray((), np.int32)


def _lowering(ctx):
    ensure_registered()
    return jax.ffi.ffi_lowering("jaxcache_rank")(ctx)


rank_p.def_impl(lambda: np.int32(runtime.rank()))
rank_p.def_abstract_eval(_abstract_eval)
lowering.register(rank_p, _lowering)
batching.primitive_batchers[rank_p] = lambda args, dims: (rank_p.bind(), None)


def traced_rank():
    """int32 scalar: the rank of the process running the program."""
    return rank_p.bind()
