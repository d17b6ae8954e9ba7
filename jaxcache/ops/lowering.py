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
