"""PyTorch bridge: the jaxcache runtime's collectives on torch tensors (through DLPack).

    import jaxcache.torch as jct
    jct.init()
    jct.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = jct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss.backward(); opt.step()

Run with `mpirun -np N python train.py`. Contiguous CPU tensors are reduced in place in
their own memory (zero-copy); other tensors go through a contiguous CPU copy.
"""

from __future__ import annotations

from ..errors import (  # noqa: F401  (re-exported: what synchronize() raises)
    CollectiveError,
    DuplicateNameError,
    JaxcacheError,
    MismatchError,
    ShutdownError,
    StallError,
)
from ..runtime import barrier, init, is_initialized, local_rank, local_size, rank, shutdown, size
from .collectives import (
    allgather,
    allgather_async,
    allgather_object,
    alltoall,
    alltoall_async,
    grouped_allgather,
    grouped_allgather_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    reducescatter,
    reducescatter_async,
)
from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .ops import (
    Handle,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    poll,
    synchronize,
)
from .optimizer import DistributedOptimizer

__all__ = [
    "barrier", "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "alltoall", "alltoall_async", "join", "poll", "synchronize", "Handle",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "DistributedOptimizer",
    "JaxcacheError", "MismatchError", "StallError", "ShutdownError", "DuplicateNameError",
    "CollectiveError",
]
