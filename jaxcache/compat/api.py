"""The names every bridge re-exports (jaxcache.torch, jaxcache.tensorflow and its keras):
Horovod's process API, process sets, reduce ops and the errors collectives raise.

A bridge takes them with ``from ..compat.api import *`` and lists ``api.__all__`` first in
its own ``__all__``.
"""

from __future__ import annotations

from ..errors import (
    CollectiveError,
    InvalidArgumentError,
    DuplicateNameError,
    JaxcacheError,
    MismatchError,
    ShutdownError,
    StallError,
)
from .basics import (
    HorovodInternalError,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .reduce_ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum

__all__ = [
    # process
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "start_timeline", "stop_timeline",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    # reduce ops
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "ReduceOp",
    # errors
    "HorovodInternalError", "JaxcacheError", "MismatchError", "StallError", "ShutdownError",
    "DuplicateNameError", "CollectiveError", "InvalidArgumentError",
]
