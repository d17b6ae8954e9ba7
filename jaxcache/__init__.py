"""jaxcache: collective communication for data-parallel JAX training.

Collectives are asynchronous XLA FFI calls served by a C++ runtime that
negotiates them by name across ranks, caches the agreement, and fuses small
tensors. Start jobs with `mpirun -np N python train.py`.
"""

from __future__ import annotations

import importlib

from . import allocator as _allocator

# Before anything starts a thread that allocates (MPI's progress thread, jax's workers).
_allocator.tune_process()

# Public names and the modules that define them. They load on first use, so that
# `python -m jaxcache.run` (the launcher) starts without MPI, jax or the extension.
_EXPORTS = {
    "init": "runtime", "shutdown": "runtime", "is_initialized": "runtime", "rank": "runtime",
    "size": "runtime", "local_rank": "runtime", "local_size": "runtime", "stats": "runtime",
    "reset_stats": "runtime", "cache_layout": "runtime", "barrier": "ops.barrier", "join": "runtime",
    "start_timeline": "runtime", "stop_timeline": "runtime",
    "allreduce": "ops.allreduce", "grouped_allreduce": "ops.grouped_allreduce",
    "broadcast": "ops.broadcast", "allgather": "ops.allgather",
    "grouped_allgather": "ops.allgather", "reducescatter": "ops.reducescatter",
    "grouped_reducescatter": "ops.grouped_reducescatter", "alltoall": "ops.alltoall",
    "reduce": "ops.reduce", "scan": "ops.scan", "gather": "ops.rooted", "scatter": "ops.rooted",
    "send": "ops.point_to_point", "recv": "ops.point_to_point", "sendrecv": "ops.point_to_point",
    "ANY_SOURCE": "ops.point_to_point", "ANY_TAG": "ops.point_to_point",
    "broadcast_object": "objects", "allgather_object": "objects",
    "JaxcacheError": "errors", "MismatchError": "errors", "StallError": "errors",
    "ShutdownError": "errors", "DuplicateNameError": "errors", "CollectiveError": "errors",
    "InvalidArgumentError": "errors",
    "cuda_built": "devices", "cuda_available": "devices",
    "ProcessSet": "process_sets", "global_process_set": "process_sets",
    "add_process_set": "process_sets", "remove_process_set": "process_sets",
}

__version__ = "0.1.0"
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxcache' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
