"""allreduce: a variadic JAX primitive lowered to the `jaxcache_allreduce` FFI target.

One primitive call is one named request (a group when it has several
operands), reduced atomically by the runtime. Scaling ("average" = a prescale
of 1/n, n the set's size -- after join() too, Horovod's rule, or with
JAXCACHE_JOIN_AVERAGE_BY_SIZE=0 the ranks that have not joined; prescale; postscale) happens in the runtime while it copies the operand
into the result buffer (a streaming copy, as cheap as memcpy), which is then
reduced in place: averaging costs no extra pass.

An operand of at least 64 KiB whose buffer XLA can hand over without a copy -- a value computed in the program, or an argument the caller
donated (jax.jit(..., donate_argnums=...)) -- is instead aliased with its result and
reduced in its own buffer: no copy and no fresh buffer (see docs/design.md).

Autodiff follows the psum convention: the transpose of an allreduce-sum is an
allreduce-sum, so grad(lambda x: allreduce(x, "sum").sum())(x) == size * ones.
"""

from __future__ import annotations


import jax
from jax.extend.core import Primitive

from .. import process_sets
from . import call, eager, lowering, naming, validation
from ..protocol import Kind

allreduce_p = Primitive("jaxcache_allreduce")
allreduce_p.multiple_results = True


def _abstract_eval(*avals, **params):
    return [jax.core.ShapedArray(a.shape, a.dtype) for a in avals]


IN_PLACE_BYTES = 64 * 1024


def _in_place(value, aval, scaled: bool) -> bool:
    """Whether to reduce this operand in its own buffer (aliased with the result).

    Only larger operands gain (the copy it saves is what matters; small ones ride in the
    cycle message or the fusion buffer). When XLA cannot give the buffer up (a value used
    again later, a program argument that was not donated) it copies the operand first: no
    worse than the separate-buffer form's own copy, unless the runtime also has to scale
    -- the separate-buffer form scales while it copies, an aliased operand then needs a
    pass of its own. So with a prescale, only operands XLA is known to hand over for free
    are aliased: values computed in this function, and donated program arguments.
    """
    if aval.size * aval.dtype.itemsize < IN_PLACE_BYTES:
        return False
    return not scaled or lowering.handed_over(value)


def _lowering(ctx, *args, name, auto_name, op, prescale, postscale, world_size, process_set):
    scaled = prescale != 1.0 or op == "average"
    aliases = {i: i for i, (v, aval) in enumerate(zip(args, ctx.avals_in))
               if _in_place(v, aval, scaled)}
    return lowering.ffi_call(ctx, "jaxcache_allreduce", args, name=name, auto_name=auto_name,
                             world_size=world_size, process_set=process_set, aliases=aliases,
                             op=op, prescale=prescale, postscale=postscale)


def _impl(*args, name, auto_name, op, prescale, postscale, world_size, process_set):
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
    if not any(isinstance(v, jax.core.Tracer) for v in values):
        # Eager: straight to the runtime, skipping JAX's primitive dispatch.
        return _impl(*values, **params)
    return list(allreduce_p.bind(*values, **params))


def allreduce(x, op: str = "average", *, name: str | None = None, prescale: float = 1.0,
              postscale: float = 1.0, process_set=None, comm=None):
    """Reduces `x` across all ranks (of `process_set`): op is "sum", "average", "min",
    "max" or "prod".

    The result is `postscale * reduce(prescale * x)` ("average" divides by the set's size,
    also while ranks have called `join()`, as Horovod; `JAXCACHE_JOIN_AVERAGE_BY_SIZE=0`:
    by the ranks that have not).
    Works eagerly and under jit/grad/vmap. `name` matches the call across ranks;
    by default it is derived from the call site.
    """
    ps = call.begin("allreduce", name, process_set, comm)
    op = validation.check_op(op, "allreduce")
    x = validation.as_array(x, "allreduce", "x")
    validation.check_reduction(x.dtype, op, prescale, postscale, "allreduce", "x")
    name, auto = naming.collective_name("allreduce", name)
    return reduce_values([x], op, name, float(prescale), float(postscale), auto, ps)[0]
