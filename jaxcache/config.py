"""Runtime settings from JAXCACHE_* environment variables, validated with clear errors."""

from __future__ import annotations

import dataclasses
import os

_MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Config:
    cache_capacity: int = 1024
    cycle_time_ms: float = 0.0
    fusion_threshold: int = 64 * _MIB
    direct_threshold: int = 1 * _MIB
    group_fusion: bool = True
    stall_check_s: float = 60.0
    stall_shutdown_s: float = 0.0
    heartbeat_ms: float = 100.0
    timeline_path: str = ""
    timeline_mark_cycles: bool = False
    max_mpi_count: int = 2**31 - 1

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _number(var: str, default, kind, minimum=0):
    raw = os.environ.get(var)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a valid {kind.__name__}") from None
    if value < minimum:
        raise ValueError(f"{var}={raw!r} must be >= {minimum}")
    return value


def _flag(var: str) -> bool:
    raw = os.environ.get(var, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{var}={raw!r}: expected 0/1, true/false, yes/no or on/off")


def from_env() -> Config:
    """Reads the environment. Every rank must see the same values (checked at init)."""
    d = Config()
    return Config(
        cache_capacity=_number("JAXCACHE_CACHE_CAPACITY", d.cache_capacity, int),
        cycle_time_ms=_number("JAXCACHE_CYCLE_TIME", d.cycle_time_ms, float),
        fusion_threshold=_number("JAXCACHE_FUSION_THRESHOLD", d.fusion_threshold, int, 1),
        direct_threshold=_number("JAXCACHE_DIRECT_THRESHOLD", d.direct_threshold, int, 1),
        group_fusion=not _flag("JAXCACHE_DISABLE_GROUP_FUSION"),
        stall_check_s=_number("JAXCACHE_STALL_CHECK_TIME", d.stall_check_s, float),
        stall_shutdown_s=_number("JAXCACHE_STALL_SHUTDOWN_TIME", d.stall_shutdown_s, float),
        heartbeat_ms=_number("JAXCACHE_HEARTBEAT_MS", d.heartbeat_ms, float, 1),
        timeline_path=os.environ.get("JAXCACHE_TIMELINE", ""),
        timeline_mark_cycles=_flag("JAXCACHE_TIMELINE_MARK_CYCLES"),
        max_mpi_count=_number("JAXCACHE_MAX_MPI_COUNT", d.max_mpi_count, int, 1),
    )
