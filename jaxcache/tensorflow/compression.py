"""Gradient compression (Horovod's Compression.none / fp16, plus bf16) for TensorFlow tensors.

A compressor is a class with static compress(tensor) -> (tensor, ctx) and
decompress(tensor, ctx) -> tensor; only floating tensors are cast.
"""

from __future__ import annotations

import tensorflow as tf


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
    wire: tf.DType

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating and tensor.dtype != cls.wire:
            return tf.cast(tensor, cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Floating tensors travel as float16 (half the bytes; ~3 significant digits)."""

    wire = tf.float16


class BF16Compressor(_CastCompressor):
    """Floating tensors travel as bfloat16 (jaxcache's addition: float32's range, ~2-3 digits)."""

    wire = tf.bfloat16


class Compression:
    """Compression algorithms for allreduce, DistributedGradientTape and DistributedOptimizer."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def check(compression, fn: str) -> None:
    """A compressor is anything with compress() and decompress() (Horovod's interface)."""
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"jaxcache.tensorflow.{fn}: compression must be a compressor such as "
                        f"Compression.none, Compression.fp16 or Compression.bf16, got {compression!r}")
