"""allreduce: a variadic JAX primitive lowered to the `jaxcache_allreduce` FFI target.

One primitive call is one named request (a group when it has several
operands), reduced atomically by the runtime. Scaling ("average"
= a prescale of 1/size, prescale, postscale) happens in the runtime while it
copies the operand into the result buffer (a streaming copy, as cheap as
memcpy), which is then reduced in place: averaging costs no extra pass.

Autodiff follows the psum convention: the transpose of an allreduce-sum is an
allreduce-sum, so grad(lambda x: allreduce(x, "sum").sum())(x) == size * ones.
"""

from __future__ import annotations

import numpy as np

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .. import runtime
from . import eager, naming, validation

allreduce_p = Primitive("jaxcache_allreduce")
allreduce_p.multiple_results = True


def _abstract_eval(*avals, name, op, prescale=1.0, postscale=1.0):
    return [jax.core.ShapedArray(a.shape, a.dtype) for a in avals]


def _lowering(ctx, *args, name, op, prescale=1.0, postscale=1.0):
    # No operand/result aliasing: XLA would have to copy every operand it cannot
    # donate (jit inputs) and scaling would then need a pass of its own. Measured on
    # the ResNet-50 set (benchmarks/gradients.py): the separate-buffer form wins.
    rule = jax.ffi.ffi_lowering("jaxcache_allreduce")
    return rule(ctx, *args, name=name, op=np.int64(validation.REDUCE_OPS[op]),
                prescale=np.float64(prescale), postscale=np.float64(postscale))


def _impl(*args, name, op, prescale=1.0, postscale=1.0):
    return eager.run(eager.KIND_ALLREDUCE, name, args, [a.shape for a in args],
                     op=validation.REDUCE_OPS[op], prescale=prescale, postscale=postscale)


def _jvp(primals, tangents, *, name, op, prescale=1.0, postscale=1.0):
    if op != "sum":
        raise NotImplementedError(
            f"jaxcache: cannot differentiate allreduce op={op!r} ('{name}'); only 'sum' and "
            "'average' are differentiable"
        )
    out = allreduce_p.bind(*primals, name=name, op=op, prescale=prescale, postscale=postscale)
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    out_t = allreduce_p.bind(*tangents, name=naming.derived(name, "jvp"), op=op,
                             prescale=prescale, postscale=postscale)
    return out, out_t


def _transpose(cts, *args, name, op, prescale=1.0, postscale=1.0):
    # y = post * sum_r(pre * x_r) is linear and self-adjoint across ranks.
    cts = [ad.instantiate_zeros(c) for c in cts]
    return allreduce_p.bind(*cts, name=naming.derived(name, "T"), op=op,
                            prescale=prescale, postscale=postscale)


def _batch(args, dims, **params):
    # Elementwise across ranks: a batch axis is just more elements.
    return allreduce_p.bind(*args, **params), list(dims)


allreduce_p.def_impl(_impl)
allreduce_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(allreduce_p, _lowering, platform="cpu")
ad.primitive_jvps[allreduce_p] = _jvp
ad.primitive_transposes[allreduce_p] = _transpose
batching.primitive_batchers[allreduce_p] = _batch


def reduce_values(values: list, op: str, name: str, prescale: float, postscale: float) -> list:
    """Reduces already-validated arrays as ONE request; returns the reduced arrays."""
    if op == "average":
        # Dividing before the sum is free (it rides on the copy into the result)
        # and keeps half-precision sums away from overflow.
        prescale = prescale / runtime.size()
        op = "sum"
    if not any(isinstance(v, jax.core.Tracer) for v in values):
        # Eager: straight to the runtime, skipping JAX's primitive dispatch.
        return _impl(*values, name=name, op=op, prescale=prescale, postscale=postscale)
    return list(allreduce_p.bind(*values, name=name, op=op, prescale=prescale, postscale=postscale))


def allreduce(x, op: str = "average", *, name: str | None = None, prescale: float = 1.0,
              postscale: float = 1.0):
    """Reduces `x` across all ranks: op is "sum", "average", "min", "max" or "prod".

    The result is `postscale * reduce(prescale * x)` ("average" divides by size).
    Works eagerly and under jit/grad/vmap. `name` matches the call across ranks;
    by default it is derived from the call site.
    """
    runtime.require_initialized("jaxcache.allreduce")
    op = validation.check_op(op, "allreduce")
    validation.check_name(name, "allreduce")
    x = validation.as_array(x, "allreduce", "x")
    validation.check_reduction(x.dtype, op, prescale, postscale, "allreduce", "x")
    name = naming.collective_name("allreduce", name, x)
    return reduce_values([x], op, name, float(prescale), float(postscale))[0]
