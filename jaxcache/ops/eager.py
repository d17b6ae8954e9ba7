"""Eager path: concrete arrays go straight to the runtime (no XLA program to compile)."""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

import jax
from jax._src import core as jax_core, dtypes as jax_dtypes
from jax._src.lib import xla_client

from .. import devices, submit
from ..protocol import Device


# Below this, a result is a plain np.empty: if XLA copies it rather than adopting it, the
# copy costs less than aligning it would.
SMALL_BYTES = 4096


def aligned_empty(shape: tuple, dtype) -> np.ndarray:
    """np.empty whose data is 64-byte aligned when large: XLA then adopts it without a
    copy (np.empty's large buffers sit 16 bytes past a page boundary)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes <= SMALL_BYTES:
        return np.empty(shape, dtype)
    raw = np.empty(nbytes + 64, np.uint8)
    offset = -raw.ctypes.data % 64
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


@functools.lru_cache(maxsize=None)
def _placement(device) -> tuple:
    """(sharding, devices, committed) of a result adopted onto `device` (None: the default
    device, uncommitted, as jax.device_put(x) places it: this process's first, also under
    jax.distributed, where jax.devices()[0] is process 0's)."""
    target = device if device is not None else jax.local_devices()[0]
    return jax.sharding.SingleDeviceSharding(target), [target], device is not None


def adopt(a: np.ndarray, device=None) -> jax.Array:
    """A jax array over `a` on a CPU device: XLA aliases an aligned buffer instead of
    copying it. jax.device_put does the same through ~100 us of Python per call (the
    eager path's largest cost); this calls the one C++ step it ends in, and falls back to
    device_put where that differs (dtypes JAX canonicalizes, other devices, other jax)."""
    if device is None or getattr(device, "platform", None) == "cpu":
        try:
            if jax_dtypes.canonicalize_dtype(a.dtype) == a.dtype:
                sharding, devs, committed = _placement(device)
                return xla_client.batched_device_put(jax_core.ShapedArray(a.shape, a.dtype),
                                                     sharding, [a], devs, committed)
        except (AttributeError, TypeError):  # another jax's internals: the public way
            pass
    return jax.device_put(a) if device is None else jax.device_put(a, device)


def _device_of(inputs: Sequence) -> tuple:
    """(the jax device of the first operand or None, its kind code for the signature)."""
    device = getattr(inputs[0], "device", None) if inputs else None
    if not hasattr(device, "platform"):  # NumPy arrays (their .device is the string "cpu")
        return None, Device.CPU
    return device, devices.code(device.platform)


def run(kind: int, name: str, inputs: Sequence[jax.Array], out_shapes: Sequence[tuple],
        world_size: int, op: int = 0, prescale: float = 1.0, postscale: float = 1.0,
        root: int = 0, process_set: int = 0) -> list[jax.Array]:
    """Submits one named request, waits for it, and returns new jax arrays.

    `world_size` is the size of the process set the request was prepared for (output
    shapes, the 1/size of "average"); a request prepared for another size is refused.
    """
    # Results go back to the device of the first operand; its kind joins the signature.
    device, kind_code = _device_of(inputs)
    # np.asarray of a CPU jax array is a read-only view of its buffer: no copy (a GPU array
    # is copied to the host: eager calls on GPU arrays are staged by JAX itself).
    ins = [np.ascontiguousarray(np.asarray(x)) for x in inputs]
    outs = [aligned_empty(shape, x.dtype) for shape, x in zip(out_shapes, ins)]
    submit.submit(kind, name, ins, outs, submit.codes_of(ins), op=op, prescale=prescale,
                  postscale=postscale, root=root, device=kind_code, process_set=process_set,
                  world_size=world_size).wait()
    if device is None or (kind_code == Device.CPU and jax.default_backend() == "cpu"):
        return [adopt(o) for o in outs]  # aliases the (aligned) NumPy buffer, no copy
    return [adopt(o, device) for o in outs]


def run_allocated(kind: int, name: str, inputs: Sequence, world_size: int,
                  splits: Sequence[int] = (), refuse_if_in_flight: bool = False,
                  process_set: int = 0) -> tuple[list[np.ndarray], list[int]]:
    """An allgather or alltoall whose outputs the runtime sizes from what the ranks agreed.

    Returns the outputs as NumPy arrays (views of the runtime's buffers, no copy) and the
    agreed rows: per tensor and rank for an allgather (`rows[t * size + r]`), received from
    each rank for an alltoall.
    """
    _, kind_code = _device_of(inputs)
    ins = [np.ascontiguousarray(np.asarray(x)) for x in inputs]
    pending = submit.submit_allocated(kind, name, ins, submit.codes_of(ins), splits=splits,
                                      device=kind_code, process_set=process_set,
                                      world_size=world_size, refuse_duplicate=refuse_if_in_flight)
    pending.wait()
    outs = [raw.view(x.dtype).reshape(shape) for (raw, shape), x in zip(pending.results(), ins)]
    return outs, pending.rows()
