"""reduce: root receives the reduction of every rank's array; every other rank gets its own
array back unchanged (mpi4jax's convention, which keeps the result's shape static).

Autodiff (op "sum" or "average"): root's result is linear in every rank's operand and the
others' result is their operand, so the transpose sends root's cotangent (scaled) to every
rank -- a broadcast -- and adds each non-root rank's own cotangent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad

from .. import process_sets
from . import call, eager, lowering, naming, sharded, validation
from .broadcast import broadcast_p
from .rank import traced_rank
from ..protocol import Kind

reduce_p = Primitive("jaxcache_reduce")
reduce_p.multiple_results = True


def _abstract_eval(*avals, **params):
    return [lowering.result_aval(a) for a in avals]


def _lowering(ctx, *args, name, auto_name, op, prescale, postscale, root, world_size, process_set):
    return lowering.ffi_call(ctx, "jaxcache_reduce", args, name=name, auto_name=auto_name,
                             world_size=world_size, process_set=process_set,
                             aliases=lowering.free_aliases(args), op=op, prescale=prescale,
                             postscale=postscale, root=root)


def _impl(*args, name, auto_name, op, prescale, postscale, root, world_size, process_set):
    return eager.run(Kind.REDUCE, name, args, [a.shape for a in args], world_size,
                     op=validation.REDUCE_OPS[op], prescale=prescale, postscale=postscale,
                     root=root, process_set=process_set)


def _transpose(cts, *args, name, auto_name, op, prescale, postscale, root, world_size, process_set):
    cts = [ad.instantiate_zeros(c) for c in cts]
    scale = prescale * postscale / (world_size if op == "average" else 1)
    from_root = broadcast_p.bind(*cts, name=naming.derived(name, "T"), auto_name=auto_name, root=root,
                                 world_size=world_size, process_set=process_set)
    at_root = traced_rank(process_set) == root
    return [scale * b + jnp.where(at_root, jnp.zeros_like(c), c) for b, c in zip(from_root, cts)]


def _batch(args, dims, **params):
    # Elementwise across ranks: a batch axis is just more elements.
    return reduce_p.bind(*args, **params), list(dims)


lowering.define_collective(reduce_p, impl=_impl, abstract_eval=_abstract_eval, lower=_lowering,
                           batch=_batch, transpose=_transpose, differentiable_ops=("sum", "average"))


def reduce(x, op: str = "sum", root: int = 0, *, name: str | None = None, prescale: float = 1.0,
           postscale: float = 1.0, process_set=None, comm=None):
    """Reduces `x` across the ranks (of `process_set`) onto `root` (a global rank): root gets
    `postscale * reduce(prescale * x)` (op "sum", "average", "min", "max" or "prod"); every
    other rank gets its own `x` back. Works eagerly and under jit/grad/vmap.
    """
    ps = call.begin("reduce", name, process_set, comm)
    op = validation.check_op(op, "reduce")
    root = process_sets.set_root(root, ps, "reduce")
    x = validation.as_array(x, "reduce", "x")
    validation.check_reduction(x.dtype, op, prescale, postscale, "reduce", "x")
    name, auto = naming.collective_name("reduce", name)
    params = dict(name=name, auto_name=auto, op=op, prescale=float(prescale), postscale=float(postscale),
                  root=root, world_size=ps.size, process_set=ps.id)
    if not sharded.direct([x]):
        return reduce_p.bind(x, **params)[0]
    return _impl(x, **params)[0]
