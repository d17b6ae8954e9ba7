"""Eager path: concrete arrays go straight to the runtime (no XLA program to compile)."""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

import jax
import jax.numpy as jnp

from .. import devices
from .._ext import ext
from ..errors import CollectiveError, raise_for_status

# Codes of xla_ext/common.h Kind.
KIND_ALLREDUCE, KIND_BROADCAST, KIND_ALLGATHER, KIND_BARRIER, KIND_REDUCESCATTER, KIND_ALLTOALL = range(6)

# Codes of xla_ext/common.h DType.
DTYPE_CODES = {
    np.dtype(t): i
    for i, t in enumerate(
        (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
         np.uint64, np.float16, jnp.bfloat16, np.float32, np.float64, np.complex64, np.complex128)
    )
}

# Requests whose wait was interrupted (Ctrl-C): the runtime still reads and writes their
# buffers, so they are kept alive here until the request completes.
_abandoned: list = []
_abandoned_lock = threading.Lock()


def _bits(x: np.ndarray) -> np.ndarray:
    """Same bytes in a dtype every DLPack consumer knows (bfloat16 -> uint16)."""
    return x.view(np.uint16) if x.dtype == jnp.bfloat16 else x


def aligned_empty(shape: tuple, dtype) -> np.ndarray:
    """np.empty whose data is 64-byte aligned: XLA then adopts it without a copy
    (np.empty's large buffers sit 16 bytes past a page boundary)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    offset = -raw.ctypes.data % 64
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def _device_of(inputs: Sequence) -> tuple:
    """(the jax device of the first operand or None, its kind code for the signature)."""
    device = getattr(inputs[0], "device", None) if inputs else None
    if not hasattr(device, "platform"):  # NumPy arrays (their .device is the string "cpu")
        return None, devices.CPU
    return device, devices.code(device.platform)


def keep_until_done(handle, keepalive) -> None:
    """Keeps `keepalive` (the request's buffers) referenced until `handle` completes."""
    with _abandoned_lock:
        _abandoned[:] = [(h, k) for h, k in _abandoned if not h.poll()]
        _abandoned.append((handle, keepalive))


def wait(handle, keepalive) -> tuple[int, str]:
    """Waits for `handle`; Ctrl-C interrupts the wait, and `keepalive` outlives the request."""
    try:
        return handle.wait()
    except BaseException:
        keep_until_done(handle, keepalive)
        raise


def check_world(name: str, world_size: int, process_set: int) -> None:
    """Refuses a request prepared for another size of its set (a runtime started since with
    another communicator, a set registered again with other ranks)."""
    size = ext.size() if process_set == 0 else ext.set_size(process_set)
    if world_size != size:
        where = "the runtime" if process_set == 0 else f"process set {process_set}"
        raise CollectiveError(
            f"jaxcache: collective '{name}' was prepared for {world_size} ranks but {where} "
            f"now has {size}; trace the function again, e.g. after jax.clear_caches()"
        )


def run(kind: int, name: str, inputs: Sequence[jax.Array], out_shapes: Sequence[tuple],
        world_size: int, op: int = 0, prescale: float = 1.0, postscale: float = 1.0,
        root: int = 0, process_set: int = 0) -> list[jax.Array]:
    """Submits one named request, waits for it, and returns new jax arrays.

    `world_size` is the size of the process set the request was prepared for (output
    shapes, the 1/size of "average"); a request prepared for another size is refused.
    """
    check_world(name, world_size, process_set)
    # Results go back to the device of the first operand; its kind joins the signature.
    device, kind_code = _device_of(inputs)
    # np.asarray of a CPU jax array is a read-only view of its buffer: no copy (a GPU array
    # is copied to the host: eager calls on GPU arrays are staged by JAX itself).
    ins = [np.ascontiguousarray(np.asarray(x)) for x in inputs]
    outs = [aligned_empty(shape, x.dtype) for shape, x in zip(out_shapes, ins)]
    codes = [DTYPE_CODES[x.dtype] for x in ins]
    handle = ext.submit(kind, name, [_bits(x) for x in ins], [_bits(o) for o in outs],
                        op, float(prescale), float(postscale), root, codes, device=kind_code,
                        process_set=process_set)
    status, message = wait(handle, (ins, outs))
    raise_for_status(status, message)
    if device is None or (kind_code == devices.CPU and jax.default_backend() == "cpu"):
        # device_put aliases the (aligned) NumPy buffer instead of copying it.
        return [jax.device_put(o) for o in outs]
    return [jax.device_put(o, device) for o in outs]


def run_allocated(kind: int, name: str, inputs: Sequence, world_size: int,
                  splits: Sequence[int] = (), refuse_if_in_flight: bool = False,
                  process_set: int = 0) -> tuple[list[np.ndarray], list[int]]:
    """An allgather or alltoall whose outputs the runtime sizes from what the ranks agreed.

    Returns the outputs as NumPy arrays (views of the runtime's buffers, no copy) and the
    agreed rows: per tensor and rank for an allgather (`rows[t * size + r]`), received from
    each rank for an alltoall.
    """
    check_world(name, world_size, process_set)
    _, kind_code = _device_of(inputs)
    ins = [np.ascontiguousarray(np.asarray(x)) for x in inputs]
    codes = [DTYPE_CODES[x.dtype] for x in ins]
    handle = ext.submit_allocated(kind, name, [_bits(x) for x in ins], list(splits), codes,
                                  refuse_if_in_flight, device=kind_code, process_set=process_set)
    status, message = wait(handle, ins)
    raise_for_status(status, message)
    outs = [raw.view(x.dtype).reshape(shape) for (raw, shape), x in zip(handle.results(), ins)]
    return outs, list(handle.rows())
