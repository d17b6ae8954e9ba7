"""Gradient compression (Horovod's Compression.none / fp16, plus bf16) for TensorFlow tensors.

The interface and the cast logic are shared with the other bridge (jaxcache.compat.compression).
"""

from __future__ import annotations

import tensorflow as tf

from ..compat import compression as _shared
from ..compat.compression import Compressor, NoneCompressor  # noqa: F401  (Horovod's names)


class _TfCast(_shared.CastCompressor):
    @staticmethod
    def is_floating(tensor) -> bool:
        return tensor.dtype.is_floating

    @staticmethod
    def cast(tensor, dtype):
        return tf.cast(tensor, dtype)


class FP16Compressor(_TfCast):
    """Floating tensors travel as float16 (half the bytes; ~3 significant digits)."""

    wire = tf.float16


class BF16Compressor(_TfCast):
    """Floating tensors travel as bfloat16 (jaxcache's addition: float32's range, ~2-3 digits)."""

    wire = tf.bfloat16


class Compression:
    """Compression algorithms for allreduce, DistributedGradientTape and DistributedOptimizer."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def check(compression, fn: str) -> None:
    _shared.check(compression, f"tensorflow.{fn}")
