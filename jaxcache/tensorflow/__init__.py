"""TensorFlow bridge: the jaxcache runtime's collectives on tf tensors.

    import jaxcache.tensorflow as jctf
    jctf.init()
    jctf.broadcast_variables(model.variables, root_rank=0)
    with tf.GradientTape() as tape:
        loss = ...
    grads = jctf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)

Runs eagerly (tensors go to the runtime through DLPack) and inside tf.function (through
tf.py_function). Start with `mpirun -np N python train.py`.
"""

from __future__ import annotations

from ..errors import (  # noqa: F401  (re-exported)
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
    allgather_object,
    alltoall,
    broadcast_object,
    grouped_allgather,
    grouped_reducescatter,
    join,
    reducescatter,
)
from .ops import allreduce, broadcast, broadcast_variables, grouped_allreduce
from .tape import DistributedGradientTape

__all__ = [
    "barrier", "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "allreduce", "grouped_allreduce", "broadcast", "allgather", "grouped_allgather",
    "reducescatter", "grouped_reducescatter", "alltoall", "join", "broadcast_variables",
    "broadcast_object", "allgather_object",
    "DistributedGradientTape",
    "JaxcacheError", "MismatchError", "StallError", "ShutdownError", "DuplicateNameError",
    "CollectiveError",
]
