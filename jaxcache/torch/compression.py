"""Gradient compression (Horovod's Compression.none / fp16, plus bf16) for torch tensors.

The interface and the cast logic are shared with the other bridge (jaxcache.compat.compression).
"""

from __future__ import annotations

import torch

from ..compat import compression as _shared
from ..compat.compression import Compressor, NoneCompressor  # noqa: F401  (Horovod's names)


class _TorchCast(_shared.CastCompressor):
    @staticmethod
    def is_floating(tensor) -> bool:
        return tensor.dtype.is_floating_point

    @staticmethod
    def cast(tensor, dtype):
        return tensor.to(dtype)


class FP16Compressor(_TorchCast):
    """Floating tensors travel as float16 (half the bytes; ~3 significant digits)."""

    wire = torch.float16


class BF16Compressor(_TorchCast):
    """Floating tensors travel as bfloat16 (jaxcache's addition: float32's range, ~2-3 digits)."""

    wire = torch.bfloat16


class Compression:
    """Compression algorithms for allreduce and DistributedOptimizer."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def check(compression, fn: str) -> None:
    _shared.check(compression, f"torch.{fn}")
