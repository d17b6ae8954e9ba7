"""Where a collective runs: the devices of this process that a lowered program spans.

A program over N devices of this process (a `shard_map` over a local mesh, a jitted function
of sharded arrays, `pmap`) runs each collective once per device. The runtime makes one
request of those N executions (xla_ext/device_parts.h): it needs the program's devices in
position order, which the lowering hands it as the `devices` attribute, as XLA's ordinals of
this process's devices. Position p is the device's index in the program's device assignment
(for `shard_map`, its index in the mesh's flattened devices): position p of one process meets
position p of every other process. docs/devices.md.
"""

from __future__ import annotations

import numpy as np

import jax
from jax._src import dispatch
from jax._src import sharding_impls


def _program_devices(axis_context) -> tuple | None:
    """The devices of the program being lowered, in position order; None when unknown."""
    if isinstance(axis_context, sharding_impls.SPMDAxisContext):
        devices = getattr(axis_context.mesh, "devices", None)
        return None if devices is None else tuple(np.asarray(devices).flat)
    if isinstance(axis_context, sharding_impls.ShardingContext):
        return axis_context.device_assignment
    return None


def device_count(ctx) -> int:
    """How many devices the program being lowered runs on (1: one device)."""
    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, sharding_impls.SPMDAxisContext):
        return int(axis_context.mesh.size)
    return int(getattr(axis_context, "num_devices", 1) or 1)


def auto_partitioned(ctx) -> bool:
    """Whether XLA, not the program, partitions this collective over several devices: a
    jitted function of sharded arrays (outside `shard_map`)."""
    axis_context = ctx.module_context.axis_context
    return isinstance(axis_context, sharding_impls.ShardingContext) and device_count(ctx) > 1


def ordinals(ctx, what: str) -> np.ndarray:
    """The `devices` attribute of a collective's custom call: XLA's ordinals of the
    program's devices in position order; empty for a program on one device."""
    if device_count(ctx) <= 1:
        return np.zeros(0, np.int64)
    devices = _program_devices(ctx.module_context.axis_context)
    if devices is None or any(not hasattr(d, "process_index") for d in devices):
        raise NotImplementedError(
            f"jaxcache: {what} runs on {device_count(ctx)} devices whose identity is not known "
            "while it is lowered (a shard_map over an abstract mesh?); give shard_map a concrete "
            "jax.sharding.Mesh of this process's devices")
    me = jax.process_index()
    foreign = sorted({d.process_index for d in devices if d.process_index != me})
    if foreign:
        raise NotImplementedError(
            f"jaxcache: {what} is in a program over {len(devices)} devices, some of them of "
            f"process(es) {foreign} (a global mesh of jax.distributed): jaxcache collectives "
            "run across MPI ranks, on devices of this process only. Use them on process-local "
            "arrays (x.addressable_data(i), a mesh of jax.local_devices()), or JAX's own "
            "collectives (lax.psum) over a global mesh (docs/devices.md)")
    return np.asarray([_ordinal(d) for d in devices], np.int64)


def _ordinal(device) -> int:
    """What XLA's FFI reports as the device ordinal of a device of this process: on CPU its
    id (global under jax.distributed: 2048 upward on process 1), on GPUs the local index of
    the device. A device the runtime does not find in the list fails its collective with a
    clear error, never pairs wrongly (xla_ext/ffi_handlers.cc)."""
    ordinal = getattr(device, "local_hardware_id", None)
    if device.platform == "cpu" or ordinal is None:
        return int(device.id)
    return int(ordinal)


def on_several_devices(values) -> bool:
    """Whether any of `values` is a jax.Array placed on more than one device."""
    for v in values:
        sharding = getattr(v, "sharding", None)
        if sharding is not None and len(sharding.device_set) > 1:
            return True
    return False


def require_devices_when_lowering(*primitives) -> None:
    """Asks jax to give these primitives' lowerings the program's device assignment
    (ordinals() needs it for jitted functions of sharded arrays)."""
    for p in primitives:
        dispatch.prim_requires_devices_during_lowering.add(p)
