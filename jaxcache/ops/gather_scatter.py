"""The allgather / reducescatter primitive pair. Each is the other's transpose
(`lax.psum_scatter`'s convention: the transpose of a reducescatter-sum is an allgather of
the cotangent slices, and the reverse), so both primitives and their rules live in this one
module, which the two op modules (allgather.py, reducescatter.py: validation and the public
functions) import.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad

from .. import process_sets, runtime
from .._ext import ext
from . import eager, lowering, naming, sharded, validation
from ..protocol import Kind

allgather_p = Primitive("jaxcache_allgather")
allgather_p.multiple_results = True


def _gathered_shape(shape: tuple, size: int) -> tuple:
    # A scalar gathers to a vector of one value per rank.
    return (size,) if not shape else (size * shape[0], *shape[1:])


def _gather_abstract_eval(*avals, world_size, **params):
    return [lowering.result_aval(a, _gathered_shape(a.shape, world_size)) for a in avals]


def _gather_lowering(ctx, *args, **params):
    return lowering.ffi_call(ctx, "jaxcache_allgather", args, **params)


def _gather_impl(*args, name, auto_name, world_size, process_set):
    # Equal shapes, like under jit (autodiff traces these shapes).
    return eager.run(Kind.ALLGATHER, name, args,
                     [_gathered_shape(a.shape, world_size) for a in args], world_size,
                     process_set=process_set)


def _gather_batch(args, dims, **params):
    # Gather along the first unbatched axis: move the batch axis behind it.
    moved = []
    for a, d in zip(args, dims):
        if d is None:
            moved.append(a)
            continue
        a = jnp.moveaxis(a, d, 0)
        if a.ndim == 1:  # batched scalars
            a = a[None, :]
        else:
            a = jnp.moveaxis(a, 0, 1)
        moved.append(a)
    out = allgather_p.bind(*moved, **params)
    out_dims = [None if d is None else 1 for d in dims]
    return out, out_dims




def gather_values(values: list, name: str, auto_name: bool, ps: process_sets.Resolved) -> list:
    """Gathers already-validated arrays as ONE request (eagerly: first dimensions may differ)."""
    if not sharded.direct(values):
        return list(allgather_p.bind(*values, name=name, auto_name=auto_name, world_size=ps.size,
                                     process_set=ps.id))
    outs, _ = eager.run_allocated(Kind.ALLGATHER, name, values, ps.size, process_set=ps.id)
    return [eager.adopt(o) for o in outs]  # aliases the runtime's buffer, no copy


reducescatter_p = Primitive("jaxcache_reducescatter")
reducescatter_p.multiple_results = True


def scatter_rows(rows: int, size: int, rank: int) -> int:
    """Rows of a first dimension of `rows` that rank `rank` receives."""
    return rows // size + (1 if rank < rows % size else 0)


def _static_rows(shape: tuple, world_size: int, name: str) -> int:
    if not shape:
        raise ValueError(f"jaxcache.reducescatter: '{name}' is a scalar; it needs a first "
                         "dimension to split")
    if shape[0] % world_size:
        raise ValueError(
            f"jaxcache.reducescatter: under jit (and for arrays on several devices) the first "
            f"dimension must be divisible by the "
            f"number of ranks so that every rank's result has the same shape; '{name}' has shape "
            f"{tuple(shape)} on {world_size} ranks (reduce eagerly for an uneven split, or pad)"
        )
    return shape[0] // world_size


def _scatter_abstract_eval(*avals, name, world_size, **params):
    return [lowering.result_aval(a, (_static_rows(a.shape, world_size, name), *a.shape[1:]))
            for a in avals]


def _scatter_lowering(ctx, *args, name, auto_name, op, prescale, postscale, world_size, process_set):
    return lowering.ffi_call(ctx, "jaxcache_reducescatter", args, name=name, auto_name=auto_name,
                             world_size=world_size, process_set=process_set,
                             op=op, prescale=prescale, postscale=postscale)


def _scatter_run(args, name, op, prescale, postscale, world_size, process_set, rank):
    shapes = [(scatter_rows(a.shape[0], world_size, rank), *a.shape[1:]) for a in args]
    return eager.run(Kind.REDUCESCATTER, name, args, shapes, world_size,
                     op=validation.REDUCE_OPS[op], prescale=prescale, postscale=postscale,
                     process_set=process_set)


def _scatter_impl(*args, name, auto_name, op, prescale, postscale, world_size, process_set):
    for a in args:  # the same static shapes as under jit (autodiff traces them)
        _static_rows(a.shape, world_size, name)
    rank = runtime.rank() if process_set == 0 else ext.set_rank(process_set)
    return _scatter_run(args, name, op, prescale, postscale, world_size, process_set, rank)


def _scatter_batch(args, dims, **params):
    # Split along the first unbatched axis: move the batch axis behind it.
    moved = [a if d is None else jnp.moveaxis(a, d, 1) for a, d in zip(args, dims)]
    out = reducescatter_p.bind(*moved, **params)
    return out, [None if d is None else 1 for d in dims]




def scatter_values(values: list, op: str, name: str, prescale: float, postscale: float,
                   auto_name: bool, ps: process_sets.Resolved) -> list:
    """Reduce-scatters already-validated arrays as ONE request."""
    params = dict(name=name, auto_name=auto_name, op=op, prescale=prescale, postscale=postscale,
                  world_size=ps.size, process_set=ps.id)
    if sharded.direct(values):
        # Eager: straight to the runtime; the first dimension may split unevenly.
        return _scatter_run(values, name, op, prescale, postscale, ps.size, ps.id, ps.rank)
    return list(reducescatter_p.bind(*values, **params))


def _allgather_transpose(cts, *args, name, auto_name, world_size, process_set):
    # Each rank's slice of the output came from its input: the cotangent is the
    # reducescatter-sum of the output cotangents (lax.all_gather's convention).
    cts = [ad.instantiate_zeros(c) for c in cts]
    scattered = reducescatter_p.bind(*cts, name=naming.derived(name, "T"), auto_name=auto_name,
                                     op="sum", prescale=1.0, postscale=1.0, world_size=world_size,
                                     process_set=process_set)
    return [s.reshape(a.aval.shape) for s, a in zip(scattered, args)]


def _reducescatter_transpose(cts, *args, name, auto_name, op, prescale, postscale, world_size, process_set):
    # y_r = post * sum_q (pre * x_q)[slice r] (/ size for an average): x_q's cotangent is
    # the concatenation of every rank's cotangent slice, scaled.
    cts = [ad.instantiate_zeros(c) for c in cts]
    gathered = allgather_p.bind(*cts, name=naming.derived(name, "T"), auto_name=auto_name,
                                world_size=world_size, process_set=process_set)
    factor = prescale * postscale / (world_size if op == "average" else 1)
    return [g if factor == 1.0 else g * jnp.asarray(factor, g.dtype) for g in gathered]


lowering.define_collective(allgather_p, impl=_gather_impl, abstract_eval=_gather_abstract_eval,
                           lower=_gather_lowering, batch=_gather_batch,
                           transpose=_allgather_transpose)
lowering.define_collective(reducescatter_p, impl=_scatter_impl,
                           abstract_eval=_scatter_abstract_eval, lower=_scatter_lowering,
                           batch=_scatter_batch, transpose=_reducescatter_transpose,
                           differentiable_ops=("sum", "average"))
