"""horovod.tensorflow.DistributedOptimizer: Keras optimizers, and TensorFlow 1's
tf.compat.v1.train.Optimizer (compute_gradients returns reduced gradients)."""

from __future__ import annotations

import tensorflow as tf

from ..compat import reduce_ops
from ..compat.process_sets import global_process_set
from .compression import Compression
from .gradients import GradientReducer

_Legacy = tf.compat.v1.train.Optimizer


class _LegacyDistributedOptimizer(_Legacy):
    """Wraps a tf.compat.v1.train.Optimizer; compute_gradients() reduces across ranks."""

    def __init__(self, optimizer, reducer: GradientReducer, name=None, use_locking=False):
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = reducer

    def register_local_var(self, var) -> None:
        self._reducer.register_local(var)

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = zip(*pairs) if pairs else ((), ())
        return list(zip(self._reducer.reduce(list(grads), list(variables)), variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=reduce_ops.Average,
                         gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set,
                         scale_local_gradients=True):
    """Reduces gradients across ranks before the wrapped optimizer applies them.

    A Keras optimizer goes to jaxcache.tensorflow.keras.DistributedOptimizer (op Average or
    Sum). A tf.compat.v1.train.Optimizer is wrapped so that compute_gradients() (and so
    minimize()) returns reduced gradients; backward_passes_per_step > 1 is not supported there.
    """
    if isinstance(optimizer, _Legacy):
        if backward_passes_per_step != 1:
            raise NotImplementedError("jaxcache.tensorflow.DistributedOptimizer: backward_passes_per_step "
                                      "> 1 is not supported for tf.compat.v1.train optimizers; use a "
                                      "Keras optimizer (jaxcache.tensorflow.keras.DistributedOptimizer)")
        reducer = GradientReducer("DistributedOptimizer", compression, sparse_as_dense, op,
                                  gradient_predivide_factor, num_groups, groups, process_set,
                                  scale_local_gradients, "v1.grad")
        return _LegacyDistributedOptimizer(optimizer, reducer, name, use_locking)
    from .keras.optimizer import DistributedOptimizer as keras_distributed
    if reduce_ops.to_name(op, "tensorflow.DistributedOptimizer") not in ("average", "sum"):
        raise ValueError("jaxcache.tensorflow.DistributedOptimizer: Keras optimizers take op=Average or "
                         f"op=Sum (as in Horovod), got {op!r}")
    return keras_distributed(optimizer, name=name, device_dense=device_dense,
                             device_sparse=device_sparse, compression=compression,
                             sparse_as_dense=sparse_as_dense,
                             gradient_predivide_factor=gradient_predivide_factor, op=op,
                             backward_passes_per_step=backward_passes_per_step,
                             average_aggregated_gradients=average_aggregated_gradients,
                             num_groups=num_groups, groups=groups, process_set=process_set,
                             scale_local_gradients=scale_local_gradients)
