"""Gradient compression (Horovod's Compression.none / fp16, plus bf16) for TensorFlow tensors
(the classes are made by jaxcache.compat.compression, shared with the other bridge)."""

from __future__ import annotations

import tensorflow as tf

from ..compat import compression as _shared
from ..compat.compression import Compressor, NoneCompressor  # noqa: F401  (Horovod's names)

FP16Compressor, BF16Compressor, Compression = _shared.cast_compressors(
    __name__, is_floating=lambda t: t.dtype.is_floating, cast=tf.cast,
    float16=tf.float16, bfloat16=tf.bfloat16)


def check(compression, fn: str) -> None:
    _shared.check(compression, f"tensorflow.{fn}")
