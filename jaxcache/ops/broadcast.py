"""broadcast: every rank receives root's value (a pytree is one request)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad

from .. import process_sets
from . import call, eager, lowering, naming, sharded, validation
from .allreduce import sum_values
from .rank import traced_rank
from ..protocol import Kind

broadcast_p = Primitive("jaxcache_broadcast")
broadcast_p.multiple_results = True


def _abstract_eval(*avals, **params):
    return [lowering.result_aval(a) for a in avals]


def _lowering(ctx, *args, name, auto_name, root, world_size, process_set):
    return lowering.ffi_call(ctx, "jaxcache_broadcast", args, name=name, auto_name=auto_name,
                             world_size=world_size, process_set=process_set,
                             aliases=lowering.free_aliases(args), root=root)


def _impl(*args, name, auto_name, root, world_size, process_set):
    return eager.run(Kind.BROADCAST, name, args, [a.shape for a in args], world_size,
                     root=root, process_set=process_set)


def _transpose(cts, *args, name, auto_name, root, world_size, process_set):
    # Every rank's cotangent flows back to root's input: a sum at root, zero elsewhere.
    # The rank is read at run time, so every rank runs the same program.
    cts = [ad.instantiate_zeros(c) for c in cts]
    summed = sum_values(cts, naming.derived(name, "T"), auto_name, world_size, process_set)
    at_root = traced_rank(process_set) == root
    return [jnp.where(at_root, s, jnp.zeros_like(s)) for s in summed]


def _batch(args, dims, **params):
    return broadcast_p.bind(*args, **params), list(dims)


lowering.define_collective(broadcast_p, impl=_impl, abstract_eval=_abstract_eval, lower=_lowering,
                           batch=_batch, transpose=_transpose)


def broadcast(tree, root: int = 0, *, name: str | None = None, process_set=None, comm=None):
    """Returns root's `tree` on every rank (arrays or a pytree of arrays; None leaves pass).

    With `process_set`, on the set's ranks only; `root` is still the root's global rank.
    """
    ps = call.begin("broadcast", name, process_set, comm)
    root = process_sets.set_root(root, ps, "broadcast")
    _, values, treedef = validation.array_leaves(tree, "broadcast")
    if not values:
        return tree
    name, auto = naming.collective_name("broadcast", name)
    params = dict(name=name, auto_name=auto, root=root, world_size=ps.size, process_set=ps.id)
    if sharded.direct(values):
        out = _impl(*values, **params)
    else:
        out = broadcast_p.bind(*values, **params)
    return jax.tree_util.tree_unflatten(treedef, out)
