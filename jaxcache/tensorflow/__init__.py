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

from ..compat.basics import (
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
from ..runtime import barrier
from ..compat.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from ..compat.reduce_ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    check_num_rank_power_of_2,
    handle_average_backwards_compatibility,
)
from ..compat.unsupported import cls as _unsupported_cls
from ..errors import (  # noqa: F401  (re-exported)
    CollectiveError,
    DuplicateNameError,
    JaxcacheError,
    MismatchError,
    ShutdownError,
    StallError,
)
from . import elastic
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
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "rank_op", "local_rank_op", "size_op",
    "local_size_op", "process_set_included_op", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "start_timeline", "stop_timeline", "barrier",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "ReduceOp",
    "handle_average_backwards_compatibility", "check_num_rank_power_of_2",
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "broadcast_",
    "alltoall", "reducescatter", "grouped_reducescatter", "join",
    "Compression", "allgather_object", "broadcast_object", "broadcast_object_fn",
    "broadcast_variables", "broadcast_global_variables", "BroadcastGlobalVariablesHook",
    "DistributedOptimizer", "DistributedGradientTape", "PartialDistributedGradientTape",
    "SyncBatchNormalization", "LocalGradientAggregationHelper", "elastic",
    "HorovodInternalError", "JaxcacheError", "MismatchError", "StallError", "ShutdownError",
    "DuplicateNameError", "CollectiveError",
]
