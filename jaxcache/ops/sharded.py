"""Eager collectives of arrays placed on several devices of this process.

An eager call on a jax.Array sharded over local devices runs as the jitted program of that
one collective (compiled once per name, shapes and shardings), so that each device's shard
travels from its own buffer and the result keeps the operand's sharding (partitioned.py),
exactly as under jit. Its semantics are jit's: shapes must be equal on every rank.
"""

from __future__ import annotations

import functools

import jax

from . import placement


def direct(values) -> bool:
    """Whether an eager call may hand `values` straight to the runtime: every one concrete
    and on one device (else it is traced, or run as a program over its devices)."""
    return not any(isinstance(v, jax.core.Tracer) for v in values) and not placement.on_several_devices(values)


@functools.lru_cache(maxsize=256)
def _program(primitive, params: tuple):
    kwargs = dict(params)
    return jax.jit(lambda *xs: primitive.bind(*xs, **kwargs))


def run(primitive, args, params: dict) -> list:
    """`primitive` of `args` (some on several devices) as a jitted program."""
    return list(_program(primitive, tuple(sorted(params.items())))(*args))
