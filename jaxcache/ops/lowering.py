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

from typing import Callable, Iterable

import numpy as np

import jax
import jax.numpy  # noqa: F401  (jax.numpy.asarray below)
from jax._src.lib.mlir import ir
from jax.interpreters import ad, batching, mlir

from .._ext import ensure_registered
from ..protocol import REDUCE_OPS
from . import naming, partitioned, placement, sharded

PLATFORMS = ("cpu", "cuda")


def register(primitive, rule, *, cacheable: bool = True, partitionable: bool = True) -> None:
    """Registers `rule` as the lowering of `primitive` on every platform in PLATFORMS.

    In a jitted function of arrays sharded over several devices, a `partitionable`
    collective is lowered as a call XLA partitions shard by shard (partitioned.py); any
    other runs on every device as it is (a barrier: no operands to shard)."""

    def checked(ctx, *args, **params):
        platforms = ctx.platforms or ctx.module_context.platforms
        unsupported = [p for p in platforms if p not in PLATFORMS]
        if unsupported:
            raise NotImplementedError(
                f"jaxcache: {primitive.name} cannot be lowered for {', '.join(unsupported)}; "
                f"jaxcache's collectives exist for {', '.join(PLATFORMS)}"
            )
        if partitionable and args and placement.auto_partitioned(ctx):
            return partitioned.lower(primitive, ctx, args, params)
        return rule(ctx, *args, **params)

    placement.require_devices_when_lowering(primitive)
    mlir.register_lowering(primitive, checked, cacheable=cacheable)


def ffi_call(ctx, target: str, args, *, name: str, auto_name: bool, world_size: int,
             process_set: int, aliases: dict[int, int] | None = None, op: str = "sum",
             prescale: float = 1.0, postscale: float = 1.0, root: int = 0, side_effect: bool = False,
             over_devices: int = 0):
    """The custom call of one collective instance: its target, its name (naming.lowered),
    the set it runs in and the size it was traced for. Every target takes the same
    attributes (xla_ext/ffi_handlers.h); a collective ignores those it has no use for
    (`op` and the scales outside reductions, `root` outside rooted collectives).
    `aliases`: operand -> result buffers XLA may share (in place); `side_effect`: XLA keeps
    the call although nothing uses its results (a barrier has none); `over_devices`: an
    allreduce that also reduces over the program's devices, which must be this many
    (xla_ext/device_reduction.h)."""
    ensure_registered()
    what = f"'{name}' ({target.removeprefix('jaxcache_')})"
    devices = placement.ordinals(ctx, what)
    if over_devices and max(1, len(devices)) != over_devices:
        raise NotImplementedError(
            f"jaxcache: {what} reduces over {over_devices} devices (its axis_name), but its program "
            f"runs on {max(1, len(devices))}; give axis_name every axis of the shard_map's mesh, "
            "or run shard_map over a mesh of those devices only")
    rule = jax.ffi.ffi_lowering(target, operand_output_aliases=aliases or None, has_side_effect=side_effect)
    return rule(ctx, *args, **naming.lowered(ctx, name, auto_name), world_size=np.int64(world_size),
                process_set=np.int64(process_set), op=np.int64(REDUCE_OPS[op]),
                prescale=np.float64(prescale), postscale=np.float64(postscale), root=np.int64(root),
                devices=devices, over_devices=np.int64(1 if over_devices else 0))


def result_aval(operand, shape: tuple | None = None):
    """The abstract value of a collective's result: `operand`'s dtype and `shape` (default
    its own). Inside shard_map it varies over the mesh axes its operand varies over: a
    collective pairs devices by position, so devices' results differ where their operands
    do (marked invariant, jax would fold a later psum of them into a multiplication)."""
    aval = jax.core.ShapedArray(operand.shape, operand.dtype) if not hasattr(operand, "update") else operand
    return aval.update(shape=tuple(operand.shape if shape is None else shape), weak_type=False)


def invariant_over(aval, axes: tuple):
    """`aval` typed as the same on every device of the mesh axes `axes` (shard_map's
    check_vma), as lax.psum's result over them is."""
    mat = getattr(aval, "manual_axis_type", None)
    if not axes or mat is None or not any(a in mat.varying for a in axes):
        return aval
    return aval.update(manual_axis_type=mat.update(varying=frozenset(a for a in mat.varying if a not in axes)))


def donated_argument(value) -> bool:
    """True for an argument of the program that the caller donated."""
    if not isinstance(value, ir.BlockArgument):
        return False  # a value computed in the program
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


def free_aliases(args) -> dict[int, int]:
    """operand -> result aliases for the operands whose buffer XLA hands over for free: for a
    collective that can also run out of place (the runtime copies, or sends from the operand
    while it copies), aliasing anything else would only make XLA copy first, on the
    critical path."""
    return {i: i for i, v in enumerate(args) if handed_over(v)}


def define_collective(primitive, *, impl: Callable, abstract_eval: Callable, lower: Callable,
                      batch: Callable, transpose: Callable | None = None,
                      differentiable_ops: Iterable[str] | None = None) -> None:
    """Every rule of a collective's primitive: run eagerly (`impl`), shapes, lowering (one
    instance, one name: not cacheable), batching, and autodiff. Collectives are linear in
    their inputs, so the JVP is the same collective of the tangents (named `name/jvp`);
    with `differentiable_ops`, only those ops (the `op` parameter) are differentiable.
    `transpose`: registered when given."""
    def concrete_impl(*args, **params):
        if placement.on_several_devices(args):
            return sharded.run(primitive, args, params)
        # Autodiff evaluates rules eagerly on Python scalars too (the cotangent 1.0 of grad).
        return impl(*(a if isinstance(a, jax.Array) else jax.numpy.asarray(a) for a in args), **params)

    primitive.def_impl(concrete_impl)
    primitive.def_abstract_eval(abstract_eval)
    register(primitive, lower, cacheable=False)
    ad.primitive_jvps[primitive] = _linear_jvp(primitive, differentiable_ops)
    if transpose is not None:
        ad.primitive_transposes[primitive] = transpose
    batching.primitive_batchers[primitive] = batch


def _linear_jvp(primitive, differentiable_ops: Iterable[str] | None) -> Callable:
    allowed = None if differentiable_ops is None else tuple(differentiable_ops)

    def jvp(primals, tangents, **params):
        if allowed is not None and params["op"] not in allowed:
            raise NotImplementedError(
                f"jaxcache: cannot differentiate {primitive.name.removeprefix('jaxcache_')} op={params['op']!r} "
                f"('{params['name']}'); only {' and '.join(repr(o) for o in allowed)} are differentiable")
        out = primitive.bind(*primals, **params)
        tangents = [ad.instantiate_zeros(t) for t in tangents]
        return out, primitive.bind(*tangents, **dict(params, name=naming.derived(params["name"], "jvp")))

    return jvp


def self_transpose(primitive) -> Callable:
    """The transpose of a collective that is its own adjoint across ranks (allreduce-sum,
    alltoall): the same collective of the cotangents, named `name/T`."""

    def transpose(cts, *args, **params):
        cts = [ad.instantiate_zeros(c) for c in cts]
        return primitive.bind(*cts, **dict(params, name=naming.derived(params["name"], "T")))

    return transpose
