"""allreduce: a variadic JAX primitive lowered to the `jaxcache_allreduce` FFI target.

One primitive call is one named request (a group when it has several
operands), reduced atomically by the runtime. Scaling ("average" = a prescale
of 1/n, n the ranks that contribute -- every rank, or those that have not
joined; prescale; postscale) happens in the runtime while it copies the operand
into the result buffer (a streaming copy, as cheap as memcpy), which is then
reduced in place: averaging costs no extra pass.

Autodiff follows the psum convention: the transpose of an allreduce-sum is an
allreduce-sum, so grad(lambda x: allreduce(x, "sum").sum())(x) == size * ones.
"""

from __future__ import annotations

import numpy as np

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .. import runtime
from .._ext import ensure_registered
from . import eager, naming, validation

allreduce_p = Primitive("jaxcache_allreduce")
allreduce_p.multiple_results = True


def _abstract_eval(*avals, **params):
    return [jax.core.ShapedArray(a.shape, a.dtype) for a in avals]


def _lowering(ctx, *args, name, auto_name, op, prescale, postscale, world_size):
    # No operand/result aliasing: XLA would have to copy every operand it cannot
    # donate (jit inputs) and scaling would then need a pass of its own. Measured on
    # the ResNet-50 set (benchmarks/gradients.py): the separate-buffer form wins.
    ensure_registered()
    rule = jax.ffi.ffi_lowering("jaxcache_allreduce")
    return rule(ctx, *args, **naming.lowered(ctx, name, auto_name), world_size=np.int64(world_size),
                op=np.int64(validation.REDUCE_OPS[op]), prescale=np.float64(prescale),
                postscale=np.float64(postscale))


def _impl(*args, name, auto_name, op, prescale, postscale, world_size):
    return eager.run(eager.KIND_ALLREDUCE, name, args, [a.shape for a in args], world_size,
                     op=validation.REDUCE_OPS[op], prescale=prescale, postscale=postscale)


def _jvp(primals, tangents, **params):
    if params["op"] not in ("sum", "average"):
        raise NotImplementedError(
            f"jaxcache: cannot differentiate allreduce op={params['op']!r} ('{params['name']}'); "
            "only 'sum' and 'average' are differentiable"
        )
    out = allreduce_p.bind(*primals, **params)
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    out_t = allreduce_p.bind(*tangents, **dict(params, name=naming.derived(params["name"], "jvp")))
    return out, out_t


def _transpose(cts, *args, **params):
    # y = post * sum_r(pre * x_r) (/ n for an average) is linear and self-adjoint across ranks.
    cts = [ad.instantiate_zeros(c) for c in cts]
    return allreduce_p.bind(*cts, **dict(params, name=naming.derived(params["name"], "T")))


def _batch(args, dims, **params):
    # Elementwise across ranks: a batch axis is just more elements.
    return allreduce_p.bind(*args, **params), list(dims)


allreduce_p.def_impl(_impl)
allreduce_p.def_abstract_eval(_abstract_eval)
# Not cacheable: each equation is lowered on its own, so each gets its own name.
mlir.register_lowering(allreduce_p, _lowering, platform="cpu", cacheable=False)
ad.primitive_jvps[allreduce_p] = _jvp
ad.primitive_transposes[allreduce_p] = _transpose
batching.primitive_batchers[allreduce_p] = _batch


def sum_values(values: list, name: str, auto_name: bool = False, world_size: int | None = None) -> list:
    """An allreduce-sum of traced or concrete values (for other collectives' transposes)."""
    size = runtime.size() if world_size is None else world_size
    return list(allreduce_p.bind(*values, name=name, auto_name=auto_name, op="sum", prescale=1.0,
                                 postscale=1.0, world_size=size))


def reduce_values(values: list, op: str, name: str, prescale: float, postscale: float,
                  auto_name: bool = False) -> list:
    """Reduces already-validated arrays as ONE request; returns the reduced arrays."""
    # The runtime divides an average before the sum: free (it rides on the copy into the
    # result), keeps half-precision sums away from overflow, and counts joined ranks out.
    size = runtime.size()
    params = dict(name=name, auto_name=auto_name, op=op, prescale=prescale, postscale=postscale,
                  world_size=size)
    if not any(isinstance(v, jax.core.Tracer) for v in values):
        # Eager: straight to the runtime, skipping JAX's primitive dispatch.
        return _impl(*values, **params)
    return list(allreduce_p.bind(*values, **params))


def allreduce(x, op: str = "average", *, name: str | None = None, prescale: float = 1.0,
              postscale: float = 1.0):
    """Reduces `x` across all ranks: op is "sum", "average", "min", "max" or "prod".

    The result is `postscale * reduce(prescale * x)` ("average" divides by the number of
    ranks that contribute: `size`, or the ranks that have not called `join()`).
    Works eagerly and under jit/grad/vmap. `name` matches the call across ranks;
    by default it is derived from the call site.
    """
    runtime.require_initialized("jaxcache.allreduce")
    op = validation.check_op(op, "allreduce")
    validation.check_name(name, "allreduce")
    x = validation.as_array(x, "allreduce", "x")
    validation.check_reduction(x.dtype, op, prescale, postscale, "allreduce", "x")
    name, auto = naming.collective_name("allreduce", name)
    return reduce_values([x], op, name, float(prescale), float(postscale), auto)[0]
