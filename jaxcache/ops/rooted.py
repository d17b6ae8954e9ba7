"""gather (every rank's array to root, stacked) and scatter (root's blocks to every rank),
mpi4jax's conventions: root's gather result is `(size, *x.shape)` and every other rank gets
its own `x` back; root's scatter operand is `(size, *block)` and every other rank passes an
array of the block's shape (not read). Results therefore differ in shape between root and
the others; each rank knows which it is when it traces (`rank` below).

Each is the other's transpose (root's gathered cotangent is scattered back to the ranks it
came from, and a scattered cotangent is gathered back to root), so both primitives live in
this one module.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad

from .. import process_sets
from . import call, eager, lowering, naming, sharded, validation
from .rank import traced_rank
from ..protocol import Kind

gather_p = Primitive("jaxcache_gather")
gather_p.multiple_results = True
scatter_p = Primitive("jaxcache_scatter")
scatter_p.multiple_results = True


def _gathered_shape(shape: tuple, root: int, rank: int, world_size: int) -> tuple:
    return (world_size, *shape) if rank == root else tuple(shape)


def _scattered_shape(shape: tuple, root: int, rank: int, name: str) -> tuple:
    if rank != root:
        return tuple(shape)
    if not shape:
        raise ValueError(f"jaxcache.scatter: root's operand of '{name}' is a scalar; it needs a first "
                         "dimension of one block per rank")
    return tuple(shape[1:])


def _gather_abstract_eval(*avals, name, root, rank, world_size, **params):
    return [lowering.result_aval(a, _gathered_shape(a.shape, root, rank, world_size)) for a in avals]


def _scatter_abstract_eval(*avals, name, root, rank, world_size, **params):
    return [lowering.result_aval(a, _scattered_shape(a.shape, root, rank, name)) for a in avals]


def _lower(target: str):
    def rule(ctx, *args, name, auto_name, root, rank, world_size, process_set):
        return lowering.ffi_call(ctx, target, args, name=name, auto_name=auto_name, world_size=world_size,
                                 process_set=process_set, root=root)
    return rule


def _gather_impl(*args, name, auto_name, root, rank, world_size, process_set):
    return eager.run(Kind.GATHER, name, args, [_gathered_shape(a.shape, root, rank, world_size) for a in args],
                     world_size, root=root, process_set=process_set)


def _scatter_impl(*args, name, auto_name, root, rank, world_size, process_set):
    return eager.run(Kind.SCATTER, name, args, [_scattered_shape(a.shape, root, rank, name) for a in args],
                     world_size, root=root, process_set=process_set)


def _gather_batch(args, dims, *, root, rank, **params):
    # The batch axis first; root's result then has it second, behind the ranks' axis.
    moved = [jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    out = gather_p.bind(*moved, root=root, rank=rank, **params)
    return out, [1 if rank == root else 0] * len(out)


def _scatter_batch(args, dims, *, root, rank, **params):
    # Root's operand keeps the ranks' axis first, the batch axis behind it.
    moved = [jnp.moveaxis(a, d, 1 if rank == root else 0) for a, d in zip(args, dims)]
    out = scatter_p.bind(*moved, root=root, rank=rank, **params)
    return out, [0] * len(out)


def _gather_transpose(cts, *args, name, auto_name, root, rank, world_size, process_set):
    # Root's block q came from rank q's operand (scattered back); every other rank's
    # result was its operand.
    cts = [ad.instantiate_zeros(c) for c in cts]
    at_root = rank == root
    send = cts if at_root else [jnp.zeros(a.aval.shape, a.aval.dtype) for a in args]
    back = scatter_p.bind(*send, name=naming.derived(name, "T"), auto_name=auto_name, root=root, rank=rank,
                          world_size=world_size, process_set=process_set)
    return list(back) if at_root else [b + c for b, c in zip(back, cts)]


def _scatter_transpose(cts, *args, name, auto_name, root, rank, world_size, process_set):
    # Root's operand reached every rank block by block: gather the cotangents back to root;
    # the other ranks' operands were not read.
    cts = [ad.instantiate_zeros(c) for c in cts]
    back = gather_p.bind(*cts, name=naming.derived(name, "T"), auto_name=auto_name, root=root, rank=rank,
                         world_size=world_size, process_set=process_set)
    if rank == root:
        return list(back)
    # Zeros that depend on the gather (the rank read at run time), so that the program
    # keeps the collective: a dead one would be dropped here while root waits for it.
    not_root = traced_rank(process_set) != root
    return [jnp.where(not_root, jnp.zeros_like(b), b) for b in back]


lowering.define_collective(gather_p, impl=_gather_impl, abstract_eval=_gather_abstract_eval,
                           lower=_lower("jaxcache_gather"), batch=_gather_batch, transpose=_gather_transpose)
lowering.define_collective(scatter_p, impl=_scatter_impl, abstract_eval=_scatter_abstract_eval,
                           lower=_lower("jaxcache_scatter"), batch=_scatter_batch, transpose=_scatter_transpose)


def _rooted(primitive, fn: str, x, root: int, name, process_set, comm):
    ps = call.begin(fn, name, process_set, comm)
    root = process_sets.set_root(root, ps, fn)
    x = validation.as_array(x, fn, "x")
    name, auto = naming.collective_name(fn, name)
    params = dict(name=name, auto_name=auto, root=root, rank=ps.rank, world_size=ps.size, process_set=ps.id)
    if not sharded.direct([x]):
        return primitive.bind(x, **params)[0]
    return primitive.impl(x, **params)[0]


def gather(x, root: int = 0, *, name: str | None = None, process_set=None, comm=None):
    """Root (a global rank) gets every rank's `x` stacked in rank order, shape
    `(size, *x.shape)`; every other rank gets its own `x` back. `x` must have the same shape
    and dtype on every rank. Eager and under jit/grad/vmap."""
    return _rooted(gather_p, "gather", x, root, name, process_set, comm)


def scatter(x, root: int = 0, *, name: str | None = None, process_set=None, comm=None):
    """Rank r gets block r of root's `x` (shape `(size, *block)`; root is a global rank).
    On the other ranks `x` only gives the block's shape and dtype (its values are not read).
    Eager and under jit/grad/vmap."""
    return _rooted(scatter_p, "scatter", x, root, name, process_set, comm)
