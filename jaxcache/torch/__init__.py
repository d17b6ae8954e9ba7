"""PyTorch bridge: jaxcache's runtime behind Horovod's horovod.torch API.

    import jaxcache.torch as hvd          # drop-in for `import horovod.torch as hvd`
    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss.backward(); opt.step()

Run with `mpirun -np N python train.py`. Contiguous CPU tensors are reduced in place in
their own memory (zero-copy); other tensors go through a contiguous CPU copy. Every Horovod
0.28.1 name is here; docs/horovod.md lists which are the same, which differ and which are
pending or unsupported (those raise and say so).
"""

from __future__ import annotations

from ..compat import api as _api
from ..compat.api import *  # noqa: F403  (the names every bridge shares: _api.__all__)
from . import elastic
from .collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from .compression import Compression
from .functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .ops import (
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    barrier,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    join,
    reducescatter_async,
)
from .requests import Handle, poll, synchronize
from .optimizer import DistributedOptimizer
from .sparse import sparse_allreduce_async
from .sync_batch_norm import SyncBatchNorm

__all__ = [
    *_api.__all__,
    # collectives
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "sparse_allreduce_async", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "join", "barrier", "poll", "synchronize", "Handle",
    # whole-model helpers
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "DistributedOptimizer", "SyncBatchNorm", "Compression", "elastic",
]
