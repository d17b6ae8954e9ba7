"""grouped_allreduce: reduce a gradient pytree as a few atomic, fused requests."""

from __future__ import annotations

import jax

from .. import grouping, process_sets, runtime
from . import naming, validation
from .allreduce import reduce_values


def grouped_allreduce(tree, op: str = "average", *, name: str | None = None,
                      num_groups: int | None = None, group_bytes: int | None = None,
                      groups=None, prescale: float = 1.0, postscale: float = 1.0,
                      process_set=None, comm=None):
    """Reduces every array leaf of `tree`; returns a pytree of the same structure.

    Leaves are split into groups (default: reverse leaf order, at most
    JAXCACHE_FUSION_THRESHOLD bytes each; or `num_groups`, `group_bytes`, or an
    explicit `groups`). Each group is one request, negotiated and cached as a
    unit and reduced only when all its members are ready on every rank.
    None leaves pass through untouched. `process_set`: reduce across its ranks only.
    """
    runtime.require_initialized("jaxcache.grouped_allreduce")
    ps = process_sets.resolve(process_set, "grouped_allreduce", comm=comm)
    op = validation.check_op(op, "grouped_allreduce")
    validation.check_name(name, "grouped_allreduce")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    if not leaves:
        return tree
    paths = [p for p, _ in leaves]
    values = []
    for p, v in leaves:
        what = f"leaf {jax.tree_util.keystr(p) or 'x'}"
        v = validation.as_array(v, "grouped_allreduce", what)
        validation.check_reduction(v.dtype, op, prescale, postscale, "grouped_allreduce", what)
        values.append(v)
    sizes = [v.size * v.dtype.itemsize for v in values]
    plan = grouping.plan(paths, sizes, num_groups=num_groups, group_bytes=group_bytes,
                         groups=groups, default_bytes=runtime.settings().fusion_threshold)
    base, auto = naming.collective_name("grouped_allreduce", name)
    out = [None] * len(values)
    for g, members in enumerate(plan):
        reduced = reduce_values([values[i] for i in members], op, f"{base}/{g}of{len(plan)}",
                                float(prescale), float(postscale), auto, ps)
        for i, r in zip(members, reduced):
            out[i] = r
    return jax.tree_util.tree_unflatten(treedef, out)
