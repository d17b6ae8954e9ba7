"""Horovod's reduce-op constants and its op/average/scale argument conventions."""

from __future__ import annotations

import enum
import warnings

import numpy as np

from ..ops import validation


class ReduceOp(enum.IntEnum):
    """Horovod's reduce operations (same integer values as Horovod's constants)."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Adasum, Min, Max, Product = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum,
                                           ReduceOp.Min, ReduceOp.Max, ReduceOp.Product)

_BY_CONSTANT = {Average: "average", Sum: "sum", Min: "min", Max: "max", Product: "prod"}

ADASUM_MESSAGE = ("op=Adasum is not supported by jaxcache (the runtime has no adaptive summation); "
                  "use op=Average (with LearningRateWarmupCallback or a scaled learning rate) or op=Sum")


def to_name(op, fn: str) -> str:
    """jaxcache's op string for a Horovod constant, an int code or a jaxcache op string."""
    if isinstance(op, str):
        return validation.check_op(op, fn)
    if isinstance(op, bool) or not isinstance(op, (int, np.integer)):
        raise ValueError(f"jaxcache.{fn}: op must be one of Average, Sum, Min, Max, Product (or "
                         f"'average', 'sum', 'min', 'max', 'prod'); got {op!r}")
    try:
        code = ReduceOp(int(op))
    except ValueError:
        raise ValueError(f"jaxcache.{fn}: op={op!r} is not a reduce op; use Average, Sum, Min, Max "
                         "or Product") from None
    if code is Adasum:
        raise NotImplementedError(f"jaxcache.{fn}: {ADASUM_MESSAGE}")
    return _BY_CONSTANT[code]


def resolve(op, average, fn: str) -> str:
    """Horovod's rule: `op` wins, the deprecated `average` maps to Average/Sum, default Average."""
    if op is not None and average is not None:
        raise ValueError(f"jaxcache.{fn}: the op parameter supersedes average; pass only one of them")
    if average is not None:
        if not isinstance(average, (bool, np.bool_)):
            raise TypeError(f"jaxcache.{fn}: average must be a bool (deprecated; use op=Average or "
                            f"op=Sum), got {average!r}; pass a reduce op by keyword: op=...")
        warnings.warn(f"jaxcache.{fn}: parameter `average` is deprecated (as in Horovod); use "
                      "op=Average or op=Sum", DeprecationWarning, stacklevel=4)
        return "average" if average else "sum"
    if op is None:
        return "average"
    return to_name(op, fn)


def scales(prescale_factor, postscale_factor, prescale, postscale, fn: str) -> tuple:
    """Horovod's prescale_factor/postscale_factor, or jaxcache's prescale/postscale spellings."""
    if prescale is not None:
        if prescale_factor != 1.0:
            raise ValueError(f"jaxcache.{fn}: pass prescale_factor or prescale, not both")
        prescale_factor = prescale
    if postscale is not None:
        if postscale_factor != 1.0:
            raise ValueError(f"jaxcache.{fn}: pass postscale_factor or postscale, not both")
        postscale_factor = postscale
    return prescale_factor, postscale_factor


def predivide(op: str, factor, fn: str) -> tuple[float, float]:
    """(prescale, postscale) of Horovod's gradient_predivide_factor (op must be Average)."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float, np.floating, np.integer)) \
            or not np.isfinite(factor) or factor <= 0:
        raise ValueError(f"jaxcache.{fn}: gradient_predivide_factor must be a finite number > 0, "
                         f"got {factor!r}")
    if factor != 1.0 and op != "average":
        raise ValueError(f"jaxcache.{fn}: gradient_predivide_factor={factor} needs op=Average (got "
                         f"op={op!r}), as in Horovod")
    return 1.0 / float(factor), float(factor)


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """True when num_rank is a power of two (Horovod's Adasum precondition)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def handle_average_backwards_compatibility(op, average):
    """Horovod's helper: the op that `op`/`average` select (constants stay constants)."""
    if op is not None:
        if average is not None:
            raise ValueError("the op parameter supersedes average; pass only one of them")
        return op
    if average is not None:
        warnings.warn("parameter `average` is deprecated (as in Horovod); use op=Average or op=Sum",
                      DeprecationWarning, stacklevel=2)
        return Average if average else Sum
    return Average
