"""allreduce: a variadic JAX primitive lowered to the `jaxcache_allreduce` FFI target.

One primitive call is one named request (a group when it has several
operands), reduced atomically by the runtime. Scaling ("average" = a prescale
of 1/n, n the set's size -- after join() too, Horovod's rule, or with
JAXCACHE_JOIN_AVERAGE_BY_SIZE=0 the ranks that have not joined; prescale;
postscale) happens in the runtime while the data is in cache: averaging costs
no extra pass. A large tensor on up to 4 ranks is reduced by pairwise exchanges
that read the operand where it is (each rank reduces its block into the result,
then the blocks are exchanged); otherwise the operand is copied into the result
chunk by chunk and reduced there by MPI.

An argument the caller donated (jax.jit(..., donate_argnums=...)), or a value
of at least 64 KiB computed in the program -- a buffer XLA can hand over
without a copy -- is instead aliased with its result and reduced in its own
buffer: no fresh buffer, and no copy into the donated one (see docs/design.md).

Autodiff follows the psum convention: the transpose of an allreduce-sum is an
allreduce-sum, so grad(lambda x: allreduce(x, "sum").sum())(x) == size * ones.
"""

from __future__ import annotations


import jax
from jax.extend.core import Primitive

from .. import process_sets
from . import call, eager, hierarchical, lowering, naming, sharded, validation
from ..protocol import Kind

allreduce_p = Primitive("jaxcache_allreduce")
allreduce_p.multiple_results = True


def _abstract_eval(*avals, over_axes=(), **params):
    # Reduced over the named axes' devices too, the result is the same on each (as lax.psum's).
    return [lowering.invariant_over(lowering.result_aval(a), over_axes) for a in avals]


IN_PLACE_BYTES = 64 * 1024


def _in_place(value, aval) -> bool:
    """Whether to reduce this operand in its own buffer (aliased with the result).

    A donated program argument always: its buffer must become the result, so a separate
    result would cost XLA a copy into it after the call (1000 donated 16 KB tensors at 2
    ranks: 7.4 ms a step against 5.9 not donated). A value computed in this function when it
    is large enough to gain (small ones ride in the cycle message or the fusion buffer). Any
    other operand XLA would copy first, on the critical path, while the runtime reads a
    separate operand without copying it (pairwise exchanges, up to 4 ranks) or copies it
    chunk by chunk while it is in cache, scaling as it goes.
    """
    if lowering.donated_argument(value):
        return True
    return aval.size * aval.dtype.itemsize >= IN_PLACE_BYTES and lowering.handed_over(value)


def _lowering(ctx, *args, name, auto_name, op, prescale, postscale, world_size, process_set,
              over_axes=(), over_count=0):
    aliases = {i: i for i, (v, aval) in enumerate(zip(args, ctx.avals_in)) if _in_place(v, aval)}
    return lowering.ffi_call(ctx, "jaxcache_allreduce", args, name=name, auto_name=auto_name,
                             world_size=world_size, process_set=process_set, aliases=aliases,
                             op=op, prescale=prescale, postscale=postscale, over_devices=over_count)


def _impl(*args, name, auto_name, op, prescale, postscale, world_size, process_set,
          over_axes=(), over_count=0):
    if over_axes:  # only traced inside shard_map (hierarchical.py)
        raise NotImplementedError(f"jaxcache: '{name}' reduces over axes {over_axes}, which exist "
                                  "only inside shard_map")
    return eager.run(Kind.ALLREDUCE, name, args, [a.shape for a in args], world_size,
                     op=validation.REDUCE_OPS[op], prescale=prescale, postscale=postscale,
                     process_set=process_set)


def _batch(args, dims, **params):
    # Elementwise across ranks: a batch axis is just more elements.
    return allreduce_p.bind(*args, **params), list(dims)


# y = post * sum_r(pre * x_r) (/ n for an average) is linear and self-adjoint across ranks.
lowering.define_collective(allreduce_p, impl=_impl, abstract_eval=_abstract_eval, lower=_lowering,
                           batch=_batch, transpose=lowering.self_transpose(allreduce_p),
                           differentiable_ops=("sum", "average"))


def sum_values(values: list, name: str, auto_name: bool, world_size: int, process_set: int) -> list:
    """An allreduce-sum of traced or concrete values (for other collectives' transposes)."""
    return list(allreduce_p.bind(*values, name=name, auto_name=auto_name, op="sum", prescale=1.0,
                                 postscale=1.0, world_size=world_size, process_set=process_set))


def reduce_values(values: list, op: str, name: str, prescale: float, postscale: float,
                  auto_name: bool, ps: process_sets.Resolved) -> list:
    """Reduces already-validated arrays as ONE request; returns the reduced arrays."""
    # The runtime divides an average before the sum: free (it rides on the copy into the
    # result), keeps half-precision sums away from overflow, and counts joined ranks out.
    params = dict(name=name, auto_name=auto_name, op=op, prescale=prescale, postscale=postscale,
                  world_size=ps.size, process_set=ps.id)
    if sharded.direct(values):
        # Eager: straight to the runtime, skipping JAX's primitive dispatch.
        return _impl(*values, **params)
    return list(allreduce_p.bind(*values, **params))


def reduce_over_devices(values: list, op: str, axis_name, name: str, prescale: float, postscale: float,
                        auto_name: bool, ps: process_sets.Resolved, fn: str) -> list:
    """Reduces traced values over the named local axes and every process (hierarchical.py)."""
    axis_name = hierarchical.check_axis_name(axis_name, fn)

    def across(pieces, across_op, post):
        return reduce_values(pieces, across_op, name, prescale, postscale * post, auto_name, ps)

    def runtime(vs, runtime_op, post, axes, count):
        return list(allreduce_p.bind(*vs, name=name, auto_name=auto_name, op=runtime_op, prescale=prescale,
                                     postscale=postscale * post, world_size=ps.size, process_set=ps.id,
                                     over_axes=axes, over_count=count))

    return hierarchical.allreduce(values, op, axis_name, ps.size, across, scale=prescale * postscale,
                                  reduce_in_runtime=runtime)


def allreduce(x, op: str = "average", *, name: str | None = None, prescale: float = 1.0,
              postscale: float = 1.0, process_set=None, comm=None, axis_name=None):
    """Reduces `x` across all ranks (of `process_set`): op is "sum", "average", "min",
    "max" or "prod".

    The result is `postscale * reduce(prescale * x)` ("average" divides by the set's size,
    also while ranks have called `join()`, as Horovod; `JAXCACHE_JOIN_AVERAGE_BY_SIZE=0`:
    by the ranks that have not).
    Works eagerly and under jit/grad/vmap. `name` matches the call across ranks;
    by default it is derived from the call site.

    `axis_name` (inside shard_map, vmap or pmap over local axes; a name or a tuple, as for
    `lax.psum`): reduces over those axes AND over every rank, hierarchically: "average" is
    then the mean over all ranks x devices (docs/devices.md).
    """
    ps = call.begin("allreduce", name, process_set, comm)
    op = validation.check_op(op, "allreduce")
    x = validation.as_array(x, "allreduce", "x")
    validation.check_reduction(x.dtype, op, prescale, postscale, "allreduce", "x")
    name, auto = naming.collective_name("allreduce", name)
    if axis_name is not None:
        return reduce_over_devices([x], op, axis_name, name, float(prescale), float(postscale), auto, ps,
                                   "allreduce")[0]
    return reduce_values([x], op, name, float(prescale), float(postscale), auto, ps)[0]
