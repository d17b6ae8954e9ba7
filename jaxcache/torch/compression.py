"""Gradient compression (Horovod's Compression.none / fp16, plus bf16) for torch tensors.

A compressor is a class with static compress(tensor) -> (tensor, ctx) and
decompress(tensor, ctx) -> tensor; only floating tensors are cast.
"""

from __future__ import annotations

import torch


class Compressor:
    """Interface: compress(tensor) -> (compressed, ctx); decompress(compressed, ctx) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression (the default)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    wire: torch.dtype

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Floating tensors travel as float16 (half the bytes; ~3 significant digits)."""

    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating tensors travel as bfloat16 (jaxcache's addition: float32's range, ~2-3 digits)."""

    wire = torch.bfloat16


class Compression:
    """Compression algorithms for allreduce and DistributedOptimizer."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def check(compression, fn: str) -> None:
    """A compressor is anything with compress() and decompress() (Horovod's interface)."""
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"jaxcache.torch.{fn}: compression must be a compressor such as "
                        f"Compression.none, Compression.fp16 or Compression.bf16, got {compression!r}")
