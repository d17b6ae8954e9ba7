"""SyncBatchNormalization: a Keras BatchNormalization whose batch statistics span every rank."""

from __future__ import annotations

import keras
import tensorflow as tf

from ..compat.process_sets import global_process_set
from . import collectives, ops


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization with mean and variance averaged over all ranks while training.

    As in Horovod, every rank's statistics weigh the same (equal per-rank batch sizes give the
    statistics of the global batch): one allreduce of (mean, mean of squares) per call,
    differentiable. `fused` must stay False (Horovod refuses fused batch norm too).
    `process_set` (jaxcache's addition; not part of the layer's config) limits the statistics
    to the ranks of a set.
    """

    def __init__(self, fused=False, *, process_set=global_process_set, **kwargs):
        if fused in (True, None):
            raise ValueError("jaxcache.tensorflow.SyncBatchNormalization does not support fused=True")
        super().__init__(**kwargs)
        self._jc_process_set = process_set

    def _moments(self, inputs, mask):
        mean, variance = super()._moments(inputs, mask)
        ps = ops.set_of(self._jc_process_set, "SyncBatchNormalization")
        if ps.size == 1:
            return mean, variance
        # Var[x] = E[x^2] - E[x]^2, both averaged over the ranks.
        stacked = tf.stack([mean, variance + tf.square(mean)])
        avg = collectives.reduce_tensors([stacked], f"tf.sync_batch_norm/{self.name}", "average", 1.0, 1.0,
                                         ps)[0]
        group_mean, group_sq = tf.unstack(avg)
        return group_mean, group_sq - tf.square(group_mean)

