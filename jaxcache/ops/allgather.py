"""allgather: concatenates every rank's array along axis 0 (a pytree is one request)."""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from .. import runtime
from .._ext import ensure_registered
from . import eager, lowering, naming, validation
from .allreduce import sum_values
from .rank import traced_rank

allgather_p = Primitive("jaxcache_allgather")
allgather_p.multiple_results = True


def _gathered_shape(shape: tuple, size: int) -> tuple:
    # A scalar gathers to a vector of one value per rank.
    return (size,) if not shape else (size * shape[0], *shape[1:])


def _abstract_eval(*avals, world_size, **params):
    return [jax.core.ShapedArray(_gathered_shape(a.shape, world_size), a.dtype) for a in avals]


def _lowering(ctx, *args, name, auto_name, world_size):
    ensure_registered()
    rule = jax.ffi.ffi_lowering("jaxcache_allgather")
    return rule(ctx, *args, **naming.lowered(ctx, name, auto_name), world_size=np.int64(world_size))


def _impl(*args, name, auto_name, world_size):
    return eager.run(eager.KIND_ALLGATHER, name, args,
                     [_gathered_shape(a.shape, world_size) for a in args], world_size)


def _jvp(primals, tangents, **params):
    out = allgather_p.bind(*primals, **params)
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return out, allgather_p.bind(*tangents, **dict(params, name=naming.derived(params["name"], "jvp")))


def _transpose(cts, *args, name, auto_name, world_size):
    # Each rank's slice of the output came from its input: sum the cotangents over
    # ranks and keep this rank's slice (the rank is read at run time, so every rank
    # runs the same program).
    cts = [ad.instantiate_zeros(c) for c in cts]
    summed = sum_values(cts, naming.derived(name, "T"), auto_name, world_size)
    rank = traced_rank()
    out = []
    for s, a in zip(summed, args):
        shape = a.aval.shape
        if not shape:
            out.append(jax.lax.dynamic_index_in_dim(s, rank, axis=0, keepdims=False))
        else:
            out.append(jax.lax.dynamic_slice_in_dim(s, rank * shape[0], shape[0], axis=0))
    return out


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


def allgather(tree, *, name: str | None = None):
    """Concatenates each rank's arrays along axis 0 (a scalar becomes a vector of `size`).

    Every rank must pass the same shapes. A pytree is gathered leaf by leaf as one request.
    """
    runtime.require_initialized("jaxcache.allgather")
    validation.check_name(name, "allgather")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    if not leaves:
        return tree
    values = [validation.as_array(v, "allgather", f"leaf {jax.tree_util.keystr(p) or 'x'}")
              for p, v in leaves]
    name, auto = naming.collective_name("allgather", name)
    params = dict(name=name, auto_name=auto, world_size=runtime.size())
    if any(isinstance(v, jax.core.Tracer) for v in values):
        out = allgather_p.bind(*values, **params)
    else:
        out = _impl(*values, **params)
    return jax.tree_util.tree_unflatten(treedef, out)
