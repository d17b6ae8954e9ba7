"""The public names of Horovod 0.28.1's horovod.torch, horovod.tensorflow and
horovod.tensorflow.keras (and their callbacks / elastic submodules), as a Horovod user sees
them. docs/horovod.md gives each a status; tests/test_horovod_names.py checks that the tables
list exactly these names and that every one of them, called in a 2-rank job, does what it
should (tests/mpi/horovod_names_torch.py, horovod_names_tf.py)."""

TORCH = [
    "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size",
    "cross_size", "rank", "local_rank", "cross_rank", "is_homogeneous", "mpi_threads_supported",
    "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "Average", "Sum", "Adasum", "Min", "Max", "Product", "HorovodInternalError",
    "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_",
    "sparse_allreduce_async", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_async", "broadcast_", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "join", "barrier", "poll", "synchronize", "Compression",
    "allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
    "DistributedOptimizer", "SyncBatchNorm", "elastic",
]
TORCH_ELASTIC = ["run", "TorchState", "ElasticSampler"]

TENSORFLOW = [
    "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size",
    "cross_size", "rank", "local_rank", "cross_rank", "is_homogeneous", "rank_op", "local_rank_op",
    "size_op", "local_size_op", "process_set_included_op", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "handle_average_backwards_compatibility",
    "check_num_rank_power_of_2", "allreduce", "grouped_allreduce", "allgather", "grouped_allgather",
    "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter", "join",
    "Compression", "allgather_object", "broadcast_object", "broadcast_object_fn",
    "broadcast_variables", "broadcast_global_variables", "BroadcastGlobalVariablesHook",
    "DistributedOptimizer", "DistributedGradientTape", "PartialDistributedGradientTape",
    "SyncBatchNormalization", "LocalGradientAggregationHelper", "elastic",
]
TENSORFLOW_ELASTIC = ["run", "TensorFlowKerasState", "TensorFlowState", "ObjectState"]

KERAS = [
    "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size",
    "cross_size", "rank", "local_rank", "cross_rank", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "Average", "Sum", "Compression", "DistributedOptimizer", "broadcast_global_variables",
    "allreduce", "allgather", "broadcast", "reducescatter", "load_model", "callbacks", "elastic",
]
KERAS_CALLBACKS = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
                   "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint"]
KERAS_ELASTIC = ["run", "KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
                 "UpdateEpochStateCallback"]

# (section heading in docs/horovod.md, importable module, names)
MODULES = [
    ("horovod.torch", "jaxcache.torch", TORCH),
    ("horovod.torch.elastic", "jaxcache.torch.elastic", TORCH_ELASTIC),
    ("horovod.tensorflow", "jaxcache.tensorflow", TENSORFLOW),
    ("horovod.tensorflow.elastic", "jaxcache.tensorflow.elastic", TENSORFLOW_ELASTIC),
    ("horovod.tensorflow.keras", "jaxcache.tensorflow.keras", KERAS),
    ("horovod.tensorflow.keras.callbacks", "jaxcache.tensorflow.keras.callbacks", KERAS_CALLBACKS),
    ("horovod.tensorflow.keras.elastic", "jaxcache.tensorflow.keras.elastic", KERAS_ELASTIC),
]
