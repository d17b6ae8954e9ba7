"""TensorFlow bridge: jaxcache's runtime behind Horovod's horovod.tensorflow API.

    import jaxcache.tensorflow as hvd     # drop-in for `import horovod.tensorflow as hvd`
    hvd.init()
    hvd.broadcast_variables(model.variables, root_rank=0)
    with tf.GradientTape() as tape:
        loss = ...
    grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)

Runs eagerly (tensors go to the runtime through DLPack) and inside tf.function (through
tf.py_function). Start with `mpirun -np N python train.py`. Every Horovod 0.28.1 name is
here; docs/horovod.md lists which are the same, which differ and which are pending or
unsupported (those raise and say so). Keras: jaxcache.tensorflow.keras.
"""

from __future__ import annotations

from ..compat import api as _api
from ..compat.api import *  # noqa: F403  (the names every bridge shares: _api.__all__)
from ..compat.reduce_ops import check_num_rank_power_of_2, handle_average_backwards_compatibility
from ..ops.barrier import barrier
from ..compat.unsupported import cls as _unsupported_cls
from . import elastic, util
from .util import _executing_eagerly  # Horovod exposes it here too; user code calls it
from .collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    reducescatter,
)
from .compression import Compression
from .functions import (
    BroadcastGlobalVariablesHook,
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from .optimizer import DistributedOptimizer
from .query_ops import local_rank_op, local_size_op, process_set_included_op, rank_op, size_op
from .sync_batch_norm import SyncBatchNormalization
from .tape import DistributedGradientTape, PartialDistributedGradientTape

LocalGradientAggregationHelper = _unsupported_cls(
    "jaxcache.tensorflow.LocalGradientAggregationHelper",
    "it is Horovod's internal helper; pass backward_passes_per_step= to "
    "jaxcache.tensorflow.keras.DistributedOptimizer instead")

__all__ = [
    *_api.__all__,
    "rank_op", "local_rank_op", "size_op", "local_size_op", "process_set_included_op", "barrier",
    "handle_average_backwards_compatibility", "check_num_rank_power_of_2",
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "broadcast_",
    "alltoall", "reducescatter", "grouped_reducescatter", "join",
    "Compression", "allgather_object", "broadcast_object", "broadcast_object_fn",
    "broadcast_variables", "broadcast_global_variables", "BroadcastGlobalVariablesHook",
    "DistributedOptimizer", "DistributedGradientTape", "PartialDistributedGradientTape",
    "SyncBatchNormalization", "LocalGradientAggregationHelper", "elastic",
]
