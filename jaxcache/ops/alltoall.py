"""alltoall: rank r sends block j of its first dimension to rank j and concatenates, in
rank order, the blocks it receives.

Under jit the blocks are equal (static shapes: the first dimension divides into `size`
blocks and the result has the input's shape). Eagerly, `splits` gives the rows sent to
each rank and may differ from rank to rank; the ranks exchange them in the negotiation,
the runtime sizes the result, and the call also returns the rows received from each rank.

alltoall is linear and its own transpose (the block rank r sends rank j comes back from
rank j to rank r), so its gradient is the alltoall of the cotangent.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive

from . import call, eager, lowering, naming, sharded, validation
from ..protocol import Kind

alltoall_p = Primitive("jaxcache_alltoall")
alltoall_p.multiple_results = True


def _check_static(shape: tuple, world_size: int, name: str) -> None:
    if not shape:
        raise ValueError(f"jaxcache.alltoall: '{name}' is a scalar; it needs a first dimension to split")
    if shape[0] % world_size:
        raise ValueError(
            f"jaxcache.alltoall: under jit the first dimension splits into {world_size} equal "
            f"blocks, but '{name}' has shape {tuple(shape)}; call alltoall eagerly with splits "
            "for uneven blocks, or pad"
        )


def _abstract_eval(*avals, name, world_size, **params):
    for a in avals:
        _check_static(a.shape, world_size, name)
    return [lowering.result_aval(a) for a in avals]


def _lowering(ctx, *args, **params):
    return lowering.ffi_call(ctx, "jaxcache_alltoall", args, **params)


def _impl(*args, name, auto_name, world_size, process_set):
    for a in args:  # equal blocks, like under jit (autodiff traces these shapes)
        _check_static(a.shape, world_size, name)
    return eager.run(Kind.ALLTOALL, name, args, [a.shape for a in args], world_size,
                     process_set=process_set)


def _batch(args, dims, **params):
    # Blocks along the first unbatched axis: move the batch axis behind it.
    (a,), (d,) = args, dims
    out = alltoall_p.bind(jnp.moveaxis(a, d, 1), **params)
    return out, [1]


# A permutation of blocks across ranks: its own adjoint.
lowering.define_collective(alltoall_p, impl=_impl, abstract_eval=_abstract_eval, lower=_lowering,
                           batch=_batch, transpose=lowering.self_transpose(alltoall_p))


def alltoall(x, *, name: str | None = None, splits=None, process_set=None, comm=None):
    """Sends block j of `x`'s first dimension to rank j; returns the received blocks
    concatenated in rank order.

    splits=None: `size` equal blocks (the first dimension must divide evenly); the result
    has `x`'s shape when every rank does the same. Eagerly, `splits` (rows per destination
    rank, summing to `x.shape[0]`) may differ between ranks; the call then returns
    `(result, received_splits)`, the rows received from each rank. Under jit `splits` must
    be None. Works under jit/grad/vmap (equal blocks). With `process_set`, among its
    ranks: block j goes to the set's rank j.
    """
    ps = call.begin("alltoall", name, process_set, comm)
    x = validation.as_array(x, "alltoall", "x")
    validation.check_first_dim(x, "alltoall", "x")
    size = ps.size
    name, auto = naming.collective_name("alltoall", name)
    if not sharded.direct([x]):
        if splits is not None:
            raise ValueError("jaxcache.alltoall: under jit (or grad/vmap), and for arrays on "
                             "several devices, blocks are equal and static; splits must be None "
                             "(call alltoall eagerly on a one-device array for uneven splits)")
        return alltoall_p.bind(x, name=name, auto_name=auto, world_size=size, process_set=ps.id)[0]
    counts = [] if splits is None else validation.check_splits(splits, "alltoall")
    (out,), received = eager.run_allocated(Kind.ALLTOALL, name, [x], size, counts,
                                           process_set=ps.id)
    out = eager.adopt(out)  # aliases the runtime's buffer, no copy
    if splits is None:
        return out
    return out, jnp.asarray(np.asarray(received, np.int32))
