"""allgather: concatenates every rank's array along axis 0 (a pytree is one request).

Eagerly, each rank's first dimension may differ: the ranks exchange their shapes in the
negotiation and the runtime sizes the result. Under jit shapes are static, so every rank
must pass the same shape; a difference fails on every rank with a MismatchError that
names the ranks and their shapes.
"""

from __future__ import annotations

import jax

from .. import grouping
from . import call, hierarchical, naming, validation
from .gather_scatter import gather_values
from .rank import traced_rank

def allgather(tree, *, name: str | None = None, process_set=None, comm=None, axis_name=None):
    """Concatenates each rank's arrays along axis 0 in rank order (a scalar becomes a
    vector of one value per rank). A pytree is gathered leaf by leaf as one request.

    Eagerly the first dimension may differ between ranks (every other dimension must
    agree); under jit every rank must pass the same shapes. With `process_set`, gathers
    the set's ranks in the set's rank order.

    `axis_name` (inside shard_map, vmap or pmap over local axes): gathers every device of
    every rank, in rank-major order (rank r's device i at position r * N + i), as
    `lax.all_gather(..., tiled=True)` over a global mesh would; each device's value crosses
    ranks once, then the devices gather locally (docs/devices.md).
    """
    ps = call.begin("allgather", name, process_set, comm)
    _, values, treedef = validation.array_leaves(tree, "allgather")
    if not values:
        return tree
    name, auto = naming.collective_name("allgather", name)
    if axis_name is not None:
        axis_name = hierarchical.check_axis_name(axis_name, "allgather")
        out = hierarchical.allgather(
            values, axis_name, lambda vs: gather_values(vs, name, auto, ps),
            lambda: traced_rank(ps.id) * hierarchical.axis_size(axis_name) + jax.lax.axis_index(axis_name))
        return jax.tree_util.tree_unflatten(treedef, out)
    return jax.tree_util.tree_unflatten(treedef, gather_values(values, name, auto, ps))


def grouped_allgather(tree, *, name: str | None = None, num_groups: int | None = None,
                      group_bytes: int | None = None, groups=None, process_set=None, comm=None):
    """allgather of every array leaf of `tree`, split into groups like grouped_allreduce.

    Each group is one request, negotiated and cached as a unit (default: reverse leaf
    order, at most JAXCACHE_FUSION_THRESHOLD bytes per group; or `num_groups`,
    `group_bytes`, or an explicit `groups`). First dimensions may differ between ranks
    eagerly, not under jit.
    """
    ps = call.begin("grouped_allgather", name, process_set, comm)
    paths, values, treedef = validation.array_leaves(tree, "grouped_allgather")
    return grouping.run_groups(
        naming.collective_name("grouped_allgather", name), paths, values, treedef,
        lambda vs, nm, auto: gather_values(vs, nm, auto, ps),
        num_groups=num_groups, group_bytes=group_bytes, groups=groups)
