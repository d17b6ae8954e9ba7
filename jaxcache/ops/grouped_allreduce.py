"""grouped_allreduce: reduce a gradient pytree as a few atomic, fused requests."""

from __future__ import annotations


from .. import grouping
from . import call, naming, validation
from .allreduce import reduce_over_devices, reduce_values


def grouped_allreduce(tree, op: str = "average", *, name: str | None = None,
                      num_groups: int | None = None, group_bytes: int | None = None,
                      groups=None, prescale: float = 1.0, postscale: float = 1.0,
                      process_set=None, comm=None, axis_name=None):
    """Reduces every array leaf of `tree`; returns a pytree of the same structure.

    Leaves are split into groups (default: reverse leaf order, at most
    JAXCACHE_FUSION_THRESHOLD bytes each; or `num_groups`, `group_bytes`, or an
    explicit `groups`). Each group is one request, negotiated and cached as a
    unit and reduced only when all its members are ready on every rank.
    None leaves pass through untouched. `process_set`: reduce across its ranks only.
    `axis_name`: also over those local axes (inside shard_map/vmap/pmap), hierarchically,
    as jaxcache.allreduce.
    """
    ps = call.begin("grouped_allreduce", name, process_set, comm)
    op = validation.check_op(op, "grouped_allreduce")
    paths, values, treedef = validation.array_leaves(
        tree, "grouped_allreduce",
        lambda v, what: validation.reduction_leaf(v, op, prescale, postscale, "grouped_allreduce", what))
    def reduce_group(vs, nm, auto):
        if axis_name is not None:
            return reduce_over_devices(vs, op, axis_name, nm, float(prescale), float(postscale), auto, ps,
                                       "grouped_allreduce")
        return reduce_values(vs, op, nm, float(prescale), float(postscale), auto, ps)

    return grouping.run_groups(
        naming.collective_name("grouped_allreduce", name), paths, values, treedef, reduce_group,
        num_groups=num_groups, group_bytes=group_bytes, groups=groups)
