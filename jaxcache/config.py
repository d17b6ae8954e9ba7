"""Runtime settings from JAXCACHE_* environment variables, validated with clear errors.

Rank 0's settings are authoritative: `synchronize()` broadcasts them at init() and every
rank runs with them (a rank whose environment differs prints one warning per variable).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from . import allocator

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
    chunk_bytes: int = 4 * _MIB
    shutdown_timeout_s: float = 30.0
    inline_spin_us: float = 50.0
    fault_inject: str = ""
    malloc_tuning: bool = True  # per process, applied at import (jaxcache/allocator.py)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# The variable behind each setting (for messages).
VARIABLES = {
    "cache_capacity": "JAXCACHE_CACHE_CAPACITY",
    "cycle_time_ms": "JAXCACHE_CYCLE_TIME",
    "fusion_threshold": "JAXCACHE_FUSION_THRESHOLD",
    "direct_threshold": "JAXCACHE_DIRECT_THRESHOLD",
    "group_fusion": "JAXCACHE_DISABLE_GROUP_FUSION",
    "stall_check_s": "JAXCACHE_STALL_CHECK_TIME",
    "stall_shutdown_s": "JAXCACHE_STALL_SHUTDOWN_TIME",
    "heartbeat_ms": "JAXCACHE_HEARTBEAT_MS",
    "timeline_path": "JAXCACHE_TIMELINE",
    "timeline_mark_cycles": "JAXCACHE_TIMELINE_MARK_CYCLES",
    "max_mpi_count": "JAXCACHE_MAX_MPI_COUNT",
    "chunk_bytes": "JAXCACHE_CHUNK_BYTES",
    "shutdown_timeout_s": "JAXCACHE_SHUTDOWN_TIMEOUT",
    "inline_spin_us": "JAXCACHE_INLINE_SPIN_US",
    "fault_inject": "JAXCACHE_FAULT_INJECT",
    "malloc_tuning": "JAXCACHE_MALLOC_TUNING",
}
# Settings each rank keeps for itself: only rank 0 writes the timeline; the allocator is
# the process's own (and was set up at import, before init()).
_LOCAL = frozenset({"timeline_path", "timeline_mark_cycles", "malloc_tuning"})


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
    """Reads this process's environment (init() then uses rank 0's values everywhere)."""
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
        chunk_bytes=_number("JAXCACHE_CHUNK_BYTES", d.chunk_bytes, int),
        shutdown_timeout_s=_number("JAXCACHE_SHUTDOWN_TIMEOUT", d.shutdown_timeout_s, float),
        inline_spin_us=_number("JAXCACHE_INLINE_SPIN_US", d.inline_spin_us, float),
        fault_inject=os.environ.get("JAXCACHE_FAULT_INJECT", "").strip(),
        malloc_tuning=allocator.enabled(),
    )


def _shown(field: str, value) -> str:
    if field == "group_fusion":  # the variable says the opposite of the field
        return "1" if not value else "0"
    return repr(value) if isinstance(value, str) else str(value)


def synchronize(comm, mine: Config) -> Config:
    """Rank 0's settings for every rank (collective over `comm`); warns where this rank's differ.

    Settings that shape the cycle bitvector, the cycle timing or the sequence of MPI calls
    must be identical everywhere, or ranks would issue mismatched MPI calls and hang.
    """
    theirs = comm.bcast(mine if comm.rank == 0 else None, root=0)
    agreed = {}
    for field in dataclasses.fields(Config):
        mine_value, root_value = getattr(mine, field.name), getattr(theirs, field.name)
        if field.name in _LOCAL:
            agreed[field.name] = mine_value
            continue
        agreed[field.name] = root_value
        if mine_value != root_value:
            print(f"jaxcache: warning: rank {comm.rank}: {VARIABLES[field.name]}="
                  f"{_shown(field.name, mine_value)} differs from rank 0's "
                  f"{_shown(field.name, root_value)}; using rank 0's value", file=sys.stderr,
                  flush=True)
    return Config(**agreed)
