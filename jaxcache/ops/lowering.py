"""Registers a primitive's lowering for the platforms that have jaxcache FFI targets.

The lowering is the same everywhere: `jax.ffi.ffi_lowering` names the target, and XLA picks
the handler registered for the platform it compiles for (xla_ext/ffi_handlers.cc on CPU,
xla_ext/cuda_handlers.cc on CUDA). It is registered once, as the primitive's rule for every
platform, rather than once per platform: a program lowered for several platforms at once
(`lowering_platforms=("cpu", "cuda")`, jax.export) then holds ONE custom call per collective,
not one per platform under a platform switch (which would also number the instances twice).
Other platforms are refused at lowering time with a clear message.
"""

from __future__ import annotations

from jax._src.lib.mlir import ir
from jax.interpreters import mlir

PLATFORMS = ("cpu", "cuda")


def register(primitive, rule, *, cacheable: bool = True) -> None:
    """Registers `rule` as the lowering of `primitive` on every platform in PLATFORMS."""

    def checked(ctx, *args, **params):
        platforms = ctx.platforms or ctx.module_context.platforms
        unsupported = [p for p in platforms if p not in PLATFORMS]
        if unsupported:
            raise NotImplementedError(
                f"jaxcache: {primitive.name} cannot be lowered for {', '.join(unsupported)}; "
                f"jaxcache's collectives exist for {', '.join(PLATFORMS)}"
            )
        return rule(ctx, *args, **params)

    mlir.register_lowering(primitive, checked, cacheable=cacheable)


def donated_argument(value) -> bool:
    """True for an argument of the program that the caller donated."""
    func = value.owner.owner
    if ("sym_name" not in func.attributes or "arg_attrs" not in func.attributes
            or ir.StringAttr(func.attributes["sym_name"]).value != "main"):
        return False  # an argument of a nested function: its origin is unknown here
    attrs = ir.DictAttr(ir.ArrayAttr(func.attributes["arg_attrs"])[value.arg_number])
    return "tf.aliasing_output" in attrs or "jax.buffer_donor" in attrs


def handed_over(value) -> bool:
    """Whether XLA can give this operand's buffer to the result without copying it: a value
    computed in the program (unless it is used again later), or a donated argument."""
    return not isinstance(value, ir.BlockArgument) or donated_argument(value)
