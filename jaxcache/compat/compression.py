"""Horovod's compressor interface, shared by the torch and TensorFlow bridges.

A compressor is a class with static compress(tensor) -> (tensor, ctx) and
decompress(tensor, ctx) -> tensor. The cast compressors send floating tensors as a
narrower `wire` dtype; each bridge supplies how to test and cast its tensors.
"""

from __future__ import annotations

from typing import Any, Callable


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


class CastCompressor(Compressor):
    """Floating tensors travel as `wire` and come back in their own dtype; others as they are."""

    wire: Any

    @staticmethod
    def is_floating(tensor) -> bool:
        raise NotImplementedError

    @staticmethod
    def cast(tensor, dtype):
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        if cls.is_floating(tensor) and tensor.dtype != cls.wire:
            return cls.cast(tensor, cls.wire), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cls.cast(tensor, ctx)


def cast_compressors(module: str, is_floating: Callable[[Any], bool], cast: Callable[[Any, Any], Any],
                     float16: Any, bfloat16: Any) -> tuple[type, type, type]:
    """A bridge's FP16Compressor, BF16Compressor and Compression namespace (Horovod's
    names), given how its tensors are tested and cast; `module` is where they live."""
    def compressor(name: str, wire: Any, doc: str) -> type:
        return type(name, (CastCompressor,), {
            "__module__": module, "__doc__": doc, "wire": wire,
            "is_floating": staticmethod(is_floating), "cast": staticmethod(cast)})

    fp16 = compressor("FP16Compressor", float16,
                      "Floating tensors travel as float16 (half the bytes; ~3 significant digits).")
    bf16 = compressor("BF16Compressor", bfloat16,
                      "Floating tensors travel as bfloat16 (jaxcache's addition: float32's range, "
                      "~2-3 digits).")
    namespace = type("Compression", (), {
        "__module__": module, "__doc__": "Compression algorithms for the collectives and optimizers.",
        "none": NoneCompressor, "fp16": fp16, "bf16": bf16})
    return fp16, bf16, namespace


def check(compression, fn: str) -> None:
    """A compressor is anything with compress() and decompress() (Horovod's interface);
    `fn` (e.g. 'torch.allreduce') names the call in the error."""
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"jaxcache.{fn}: compression must be a compressor such as "
                        f"Compression.none, Compression.fp16 or Compression.bf16, got {compression!r}")
