"""reducescatter: reduces across ranks and keeps this rank's slice of the first dimension.

One primitive call is one named request (a group when it has several operands). Rank r
receives rows [offset_r, offset_r + rows_r) of the reduction, where the first
`rows % size` ranks get one more row than the others (Horovod's uneven split). Under
`jit` every rank's result must have the same static shape, so the first dimension must
be divisible by the number of ranks; eager calls may split unevenly.

The reduction is `postscale * op(prescale * x)`. "average" divides the reduced slice by
the number of contributing ranks (every rank, or those that have not joined); the input
is never copied unless a prescale asks for it.

Autodiff follows `lax.psum_scatter`: the transpose of a reducescatter-sum is an
allgather of the cotangent slices (and the transpose of allgather is a reducescatter-sum),
so grad(lambda x: reducescatter(x, "sum").sum())(x) == ones_like(x) on every rank.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from .. import process_sets, runtime
from .._ext import ensure_registered, ext
from . import eager, lowering, naming, validation
from ..protocol import Kind

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
            f"jaxcache.reducescatter: under jit the first dimension must be divisible by the "
            f"number of ranks so that every rank's result has the same shape; '{name}' has shape "
            f"{tuple(shape)} on {world_size} ranks (reduce eagerly for an uneven split, or pad)"
        )
    return shape[0] // world_size


def _abstract_eval(*avals, name, world_size, **params):
    return [jax.core.ShapedArray((_static_rows(a.shape, world_size, name), *a.shape[1:]), a.dtype)
            for a in avals]


def _lowering(ctx, *args, name, auto_name, op, prescale, postscale, world_size, process_set):
    ensure_registered()
    rule = jax.ffi.ffi_lowering("jaxcache_reducescatter")
    return rule(ctx, *args, **naming.lowered(ctx, name, auto_name), world_size=np.int64(world_size),
                process_set=np.int64(process_set), op=np.int64(validation.REDUCE_OPS[op]),
                prescale=np.float64(prescale), postscale=np.float64(postscale))


def _run(args, name, op, prescale, postscale, world_size, process_set, rank):
    shapes = [(scatter_rows(a.shape[0], world_size, rank), *a.shape[1:]) for a in args]
    return eager.run(Kind.REDUCESCATTER, name, args, shapes, world_size,
                     op=validation.REDUCE_OPS[op], prescale=prescale, postscale=postscale,
                     process_set=process_set)


def _impl(*args, name, auto_name, op, prescale, postscale, world_size, process_set):
    for a in args:  # the same static shapes as under jit (autodiff traces them)
        _static_rows(a.shape, world_size, name)
    rank = runtime.rank() if process_set == 0 else ext.set_rank(process_set)
    return _run(args, name, op, prescale, postscale, world_size, process_set, rank)


def _jvp(primals, tangents, **params):
    if params["op"] not in ("sum", "average"):
        raise NotImplementedError(
            f"jaxcache: cannot differentiate reducescatter op={params['op']!r} ('{params['name']}'); "
            "only 'sum' and 'average' are differentiable"
        )
    out = reducescatter_p.bind(*primals, **params)
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return out, reducescatter_p.bind(*tangents, **dict(params, name=naming.derived(params["name"], "jvp")))


def _transpose(cts, *args, name, auto_name, op, prescale, postscale, world_size, process_set):
    # y_r = post * sum_q (pre * x_q)[slice r] (/ size for an average): x_q's cotangent is
    # the concatenation of every rank's cotangent slice, scaled.
    from .allgather import allgather_p  # the two transposes refer to each other

    cts = [ad.instantiate_zeros(c) for c in cts]
    gathered = allgather_p.bind(*cts, name=naming.derived(name, "T"), auto_name=auto_name,
                                world_size=world_size, process_set=process_set)
    factor = prescale * postscale / (world_size if op == "average" else 1)
    return [g if factor == 1.0 else g * jnp.asarray(factor, g.dtype) for g in gathered]


def _batch(args, dims, **params):
    # Split along the first unbatched axis: move the batch axis behind it.
    moved = [a if d is None else jnp.moveaxis(a, d, 1) for a, d in zip(args, dims)]
    out = reducescatter_p.bind(*moved, **params)
    return out, [None if d is None else 1 for d in dims]


reducescatter_p.def_impl(_impl)
reducescatter_p.def_abstract_eval(_abstract_eval)
lowering.register(reducescatter_p, _lowering, cacheable=False)
ad.primitive_jvps[reducescatter_p] = _jvp
ad.primitive_transposes[reducescatter_p] = _transpose
batching.primitive_batchers[reducescatter_p] = _batch


def scatter_values(values: list, op: str, name: str, prescale: float, postscale: float,
                   auto_name: bool, ps: process_sets.Resolved) -> list:
    """Reduce-scatters already-validated arrays as ONE request."""
    params = dict(name=name, auto_name=auto_name, op=op, prescale=prescale, postscale=postscale,
                  world_size=ps.size, process_set=ps.id)
    if not any(isinstance(v, jax.core.Tracer) for v in values):
        # Eager: straight to the runtime; the first dimension may split unevenly.
        return _run(values, name, op, prescale, postscale, ps.size, ps.id, ps.rank)
    return list(reducescatter_p.bind(*values, **params))


def check_leaf(x, op: str, prescale, postscale, fn: str, what: str):
    x = validation.as_array(x, fn, what)
    validation.check_reduction(x.dtype, op, prescale, postscale, fn, what)
    validation.check_first_dim(x, fn, what)
    return x


def reducescatter(x, op: str = "average", *, name: str | None = None, prescale: float = 1.0,
                  postscale: float = 1.0, process_set=None, comm=None):
    """Reduces `x` across ranks; returns this rank's slice of the first dimension.

    op is "sum", "average", "min", "max" or "prod"; the result is
    `postscale * reduce(prescale * x)[rows of this rank]`. Rank r gets
    `x.shape[0] // size` rows, one more when `r < x.shape[0] % size`; under jit the first
    dimension must be divisible by the number of ranks. Works eagerly and under
    jit/grad/vmap; the gradient of a sum is the allgather of the cotangents. With
    `process_set`, across its ranks, sliced in the set's rank order.
    """
    runtime.require_initialized("jaxcache.reducescatter")
    ps = process_sets.resolve(process_set, "reducescatter", comm=comm)
    op = validation.check_op(op, "reducescatter")
    validation.check_name(name, "reducescatter")
    x = check_leaf(x, op, prescale, postscale, "reducescatter", "x")
    name, auto = naming.collective_name("reducescatter", name)
    return scatter_values([x], op, name, float(prescale), float(postscale), auto, ps)[0]
