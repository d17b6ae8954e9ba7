"""reducescatter: reduces across ranks and keeps this rank's slice of the first dimension.

One primitive call is one named request (a group when it has several operands). Rank r
receives rows [offset_r, offset_r + rows_r) of the reduction, where the first
`rows % size` ranks get one more row than the others (Horovod's uneven split). Under
`jit` every rank's result must have the same static shape, so the first dimension must
be divisible by the number of ranks; eager calls may split unevenly.

The reduction is `postscale * op(prescale * x)`. "average" divides the reduced slice by
the set's size (also after join(); JAXCACHE_JOIN_AVERAGE_BY_SIZE=0: the ranks that have
not joined); the input
is never copied unless a prescale asks for it.

Autodiff follows `lax.psum_scatter`: the transpose of a reducescatter-sum is an
allgather of the cotangent slices (and the transpose of allgather is a reducescatter-sum),
so grad(lambda x: reducescatter(x, "sum").sum())(x) == ones_like(x) on every rank.
"""

from __future__ import annotations

from . import call, hierarchical, naming, validation
from .gather_scatter import scatter_rows, scatter_values  # noqa: F401  (scatter_rows: the bridges')


def check_leaf(x, op: str, prescale, postscale, fn: str, what: str):
    x = validation.reduction_leaf(x, op, prescale, postscale, fn, what)
    validation.check_first_dim(x, fn, what)
    return x


def reducescatter(x, op: str = "average", *, name: str | None = None, prescale: float = 1.0,
                  postscale: float = 1.0, process_set=None, comm=None, axis_name=None):
    """Reduces `x` across ranks; returns this rank's slice of the first dimension.

    op is "sum", "average", "min", "max" or "prod"; the result is
    `postscale * reduce(prescale * x)[rows of this rank]`. Rank r gets
    `x.shape[0] // size` rows, one more when `r < x.shape[0] % size`; under jit the first
    dimension must be divisible by the number of ranks. Works eagerly and under
    jit/grad/vmap; the gradient of a sum is the allgather of the cotangents. With
    `process_set`, across its ranks, sliced in the set's rank order.

    `axis_name` (inside shard_map, vmap or pmap over local axes): reduces over every device
    of every rank, and device i of rank r gets block r * N + i of P x N equal blocks (rank-
    major, as `lax.psum_scatter(..., tiled=True)` over a global mesh); reduced over the
    devices first, then across ranks (docs/devices.md).
    """
    ps = call.begin("reducescatter", name, process_set, comm)
    op = validation.check_op(op, "reducescatter")
    x = check_leaf(x, op, prescale, postscale, "reducescatter", "x")
    name, auto = naming.collective_name("reducescatter", name)
    if axis_name is not None:
        axis_name = hierarchical.check_axis_name(axis_name, "reducescatter")

        def across(blocks, across_op, post):
            return scatter_values(blocks, across_op, name, float(prescale), float(postscale) * post, auto, ps)

        return hierarchical.reducescatter([x], op, axis_name, ps.size, across)[0]
    return scatter_values([x], op, name, float(prescale), float(postscale), auto, ps)[0]
