"""grouped_reducescatter: reduce-scatter a pytree as a few atomic requests (sharded optimizers)."""

from __future__ import annotations

import jax

from .. import grouping, process_sets, runtime
from . import naming, validation
from .reducescatter import check_leaf, scatter_values


def grouped_reducescatter(tree, op: str = "average", *, name: str | None = None,
                          num_groups: int | None = None, group_bytes: int | None = None,
                          groups=None, prescale: float = 1.0, postscale: float = 1.0,
                          process_set=None, comm=None):
    """reducescatter of every array leaf of `tree`; returns this rank's slices, same structure.

    Leaves are grouped like grouped_allreduce (default: reverse leaf order, at most
    JAXCACHE_FUSION_THRESHOLD bytes per group; or `num_groups`, `group_bytes`, or an
    explicit `groups`); each group is one request, negotiated and cached as a unit.
    """
    runtime.require_initialized("jaxcache.grouped_reducescatter")
    ps = process_sets.resolve(process_set, "grouped_reducescatter", comm=comm)
    op = validation.check_op(op, "grouped_reducescatter")
    validation.check_name(name, "grouped_reducescatter")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    if not leaves:
        return tree
    paths = [p for p, _ in leaves]
    values = [check_leaf(v, op, prescale, postscale, "grouped_reducescatter",
                         f"leaf {jax.tree_util.keystr(p) or 'x'}") for p, v in leaves]
    sizes = [v.size * v.dtype.itemsize for v in values]
    plan = grouping.plan(paths, sizes, num_groups=num_groups, group_bytes=group_bytes,
                         groups=groups, default_bytes=runtime.settings().fusion_threshold)
    base, auto = naming.collective_name("grouped_reducescatter", name)
    out = [None] * len(values)
    for g, members in enumerate(plan):
        scattered = scatter_values([values[i] for i in members], op, f"{base}/{g}of{len(plan)}",
                                   float(prescale), float(postscale), auto, ps)
        for i, r in zip(members, scattered):
            out[i] = r
    return jax.tree_util.tree_unflatten(treedef, out)
