"""grouped_reducescatter: reduce-scatter a pytree as a few atomic requests (sharded optimizers)."""

from __future__ import annotations


from .. import grouping
from . import call, naming, validation
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
    ps = call.begin("grouped_reducescatter", name, process_set, comm)
    op = validation.check_op(op, "grouped_reducescatter")
    paths, values, treedef = validation.array_leaves(
        tree, "grouped_reducescatter",
        lambda v, what: check_leaf(v, op, prescale, postscale, "grouped_reducescatter", what))
    return grouping.run_groups(
        naming.collective_name("grouped_reducescatter", name), paths, values, treedef,
        lambda vs, nm, auto: scatter_values(vs, op, nm, float(prescale), float(postscale), auto, ps),
        num_groups=num_groups, group_bytes=group_bytes, groups=groups)
