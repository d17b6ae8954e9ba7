"""Device kinds: where a collective's tensors live, and whether the CUDA path is usable.

The device kind is part of every request's signature, so a CPU array on one rank against a
GPU array on another fails with MismatchError instead of mixing silently. The CUDA path
(tier A, docs/gpu.md) stages GPU buffers through pinned host memory and serves them with the
same runtime as CPU arrays.
"""

from __future__ import annotations

import functools

from ._ext import ext
from .protocol import Device


def code(platform: str) -> Device:
    """The device kind of a jax platform, torch device type or TensorFlow device name."""
    p = platform.lower()
    if p in ("cuda", "gpu") or "gpu" in p:
        return Device.CUDA
    return Device.CPU


def cuda_built() -> bool:
    """True when the extension was built with the CUDA handlers (JAXCACHE_CUDA=ON or AUTO)."""
    return bool(ext.cuda_built())


@functools.lru_cache(maxsize=1)
def _cuda_probe() -> tuple[int, str]:
    if not cuda_built():
        return 0, "jaxcache was built without CUDA (JAXCACHE_CUDA=OFF, or AUTO found no toolkit)"
    count, error = ext.cuda_device_count()
    return count, error


def cuda_available() -> bool:
    """True when the CUDA handlers are built and a CUDA device can be used by this process.

    The first call starts the CUDA runtime (it is never started at import, so importing
    jaxcache works on machines without a driver).
    """
    count, _ = _cuda_probe()
    return count > 0


def cuda_unavailable_reason() -> str:
    """Why cuda_available() is False ('' when it is True)."""
    count, error = _cuda_probe()
    if count > 0:
        return ""
    return error or "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)"
