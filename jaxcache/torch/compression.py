"""Gradient compression (Horovod's Compression.none / fp16, plus bf16) for torch tensors
(the classes are made by jaxcache.compat.compression, shared with the other bridge)."""

from __future__ import annotations

import torch

from ..compat import compression as _shared
from ..compat.compression import Compressor, NoneCompressor  # noqa: F401  (Horovod's names)

FP16Compressor, BF16Compressor, Compression = _shared.cast_compressors(
    __name__, is_floating=lambda t: t.dtype.is_floating_point, cast=lambda t, dtype: t.to(dtype),
    float16=torch.float16, bfloat16=torch.bfloat16)


def check(compression, fn: str) -> None:
    _shared.check(compression, f"torch.{fn}")
