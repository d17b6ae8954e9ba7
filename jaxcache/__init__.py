"""jaxcache: collective communication for data-parallel JAX training.

Collectives are asynchronous XLA FFI calls served by a C++ runtime that
negotiates them by name across ranks, caches the agreement, and fuses small
tensors. Start jobs with `mpirun -np N python train.py`.
"""

from __future__ import annotations

from ._ext import ext as _ext  # noqa: F401  (loads and registers the C++ runtime)
from .errors import (
    CollectiveError,
    DuplicateNameError,
    JaxcacheError,
    MismatchError,
    ShutdownError,
    StallError,
)
from .ops.allgather import allgather
from .ops.allreduce import allreduce
from .ops.broadcast import broadcast
from .ops.grouped_allreduce import grouped_allreduce
from .runtime import (
    cache_layout,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    reset_stats,
    shutdown,
    size,
    stats,
)

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "allreduce", "grouped_allreduce", "broadcast", "allgather",
    "stats", "reset_stats", "cache_layout",
    "JaxcacheError", "MismatchError", "StallError", "ShutdownError", "DuplicateNameError",
    "CollectiveError",
]
