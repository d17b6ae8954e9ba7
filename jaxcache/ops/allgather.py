"""allgather: concatenates every rank's array along axis 0 (a pytree is one request).

Eagerly, each rank's first dimension may differ: the ranks exchange their shapes in the
negotiation and the runtime sizes the result. Under jit shapes are static, so every rank
must pass the same shape; a difference fails on every rank with a MismatchError that
names the ranks and their shapes.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from .. import grouping, process_sets, runtime
from .._ext import ensure_registered
from . import eager, lowering, naming, validation
from ..protocol import Kind

allgather_p = Primitive("jaxcache_allgather")
allgather_p.multiple_results = True


def _gathered_shape(shape: tuple, size: int) -> tuple:
    # A scalar gathers to a vector of one value per rank.
    return (size,) if not shape else (size * shape[0], *shape[1:])


def _abstract_eval(*avals, world_size, **params):
    return [jax.core.ShapedArray(_gathered_shape(a.shape, world_size), a.dtype) for a in avals]


def _lowering(ctx, *args, name, auto_name, world_size, process_set):
    ensure_registered()
    rule = jax.ffi.ffi_lowering("jaxcache_allgather")
    return rule(ctx, *args, **naming.lowered(ctx, name, auto_name), world_size=np.int64(world_size),
                process_set=np.int64(process_set))


def _impl(*args, name, auto_name, world_size, process_set):
    # Equal shapes, like under jit (autodiff traces these shapes).
    return eager.run(Kind.ALLGATHER, name, args,
                     [_gathered_shape(a.shape, world_size) for a in args], world_size,
                     process_set=process_set)


def _jvp(primals, tangents, **params):
    out = allgather_p.bind(*primals, **params)
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return out, allgather_p.bind(*tangents, **dict(params, name=naming.derived(params["name"], "jvp")))


def _transpose(cts, *args, name, auto_name, world_size, process_set):
    # Each rank's slice of the output came from its input: the cotangent is the
    # reducescatter-sum of the output cotangents (lax.all_gather's convention).
    from .reducescatter import reducescatter_p  # the two transposes refer to each other

    cts = [ad.instantiate_zeros(c) for c in cts]
    scattered = reducescatter_p.bind(*cts, name=naming.derived(name, "T"), auto_name=auto_name,
                                     op="sum", prescale=1.0, postscale=1.0, world_size=world_size,
                                     process_set=process_set)
    return [s.reshape(a.aval.shape) for s, a in zip(scattered, args)]


def _batch(args, dims, **params):
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


allgather_p.def_impl(_impl)
allgather_p.def_abstract_eval(_abstract_eval)
lowering.register(allgather_p, _lowering, cacheable=False)
ad.primitive_jvps[allgather_p] = _jvp
ad.primitive_transposes[allgather_p] = _transpose
batching.primitive_batchers[allgather_p] = _batch


def gather_values(values: list, name: str, auto_name: bool, ps: process_sets.Resolved) -> list:
    """Gathers already-validated arrays as ONE request (eagerly: first dimensions may differ)."""
    if any(isinstance(v, jax.core.Tracer) for v in values):
        return list(allgather_p.bind(*values, name=name, auto_name=auto_name, world_size=ps.size,
                                     process_set=ps.id))
    outs, _ = eager.run_allocated(Kind.ALLGATHER, name, values, ps.size, process_set=ps.id)
    return [jax.device_put(o) for o in outs]  # aliases the runtime's buffer, no copy


def _leaves(tree, fn: str):
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    values = [validation.as_array(v, fn, f"leaf {jax.tree_util.keystr(p) or 'x'}") for p, v in leaves]
    return [p for p, _ in leaves], values, treedef


def allgather(tree, *, name: str | None = None, process_set=None, comm=None):
    """Concatenates each rank's arrays along axis 0 in rank order (a scalar becomes a
    vector of one value per rank). A pytree is gathered leaf by leaf as one request.

    Eagerly the first dimension may differ between ranks (every other dimension must
    agree); under jit every rank must pass the same shapes. With `process_set`, gathers
    the set's ranks in the set's rank order.
    """
    runtime.require_initialized("jaxcache.allgather")
    ps = process_sets.resolve(process_set, "allgather", comm=comm)
    validation.check_name(name, "allgather")
    _, values, treedef = _leaves(tree, "allgather")
    if not values:
        return tree
    name, auto = naming.collective_name("allgather", name)
    return jax.tree_util.tree_unflatten(treedef, gather_values(values, name, auto, ps))


def grouped_allgather(tree, *, name: str | None = None, num_groups: int | None = None,
                      group_bytes: int | None = None, groups=None, process_set=None, comm=None):
    """allgather of every array leaf of `tree`, split into groups like grouped_allreduce.

    Each group is one request, negotiated and cached as a unit (default: reverse leaf
    order, at most JAXCACHE_FUSION_THRESHOLD bytes per group; or `num_groups`,
    `group_bytes`, or an explicit `groups`). First dimensions may differ between ranks
    eagerly, not under jit.
    """
    runtime.require_initialized("jaxcache.grouped_allgather")
    ps = process_sets.resolve(process_set, "grouped_allgather", comm=comm)
    validation.check_name(name, "grouped_allgather")
    paths, values, treedef = _leaves(tree, "grouped_allgather")
    if not values:
        return tree
    sizes = [v.size * v.dtype.itemsize for v in values]
    plan = grouping.plan(paths, sizes, num_groups=num_groups, group_bytes=group_bytes,
                         groups=groups, default_bytes=runtime.settings().fusion_threshold)
    base, auto = naming.collective_name("grouped_allgather", name)
    out = [None] * len(values)
    for g, members in enumerate(plan):
        gathered = gather_values([values[i] for i in members], f"{base}/{g}of{len(plan)}", auto, ps)
        for i, r in zip(members, gathered):
            out[i] = r
    return jax.tree_util.tree_unflatten(treedef, out)
