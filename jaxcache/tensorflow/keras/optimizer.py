"""DistributedOptimizer for Keras 3 optimizers: gradients are reduced across ranks in apply()."""

from __future__ import annotations

import tensorflow as tf

from ... import runtime as _runtime
from ...compat import reduce_ops
from ...compat.process_sets import global_process_set
from ..compression import Compression
from ..gradients import GradientReducer


class _DistributedKeras:
    """Mixed in front of the wrapped optimizer's class (see DistributedOptimizer)."""

    def register_local_var(self, var) -> None:
        """This variable's gradient stays local (not reduced)."""
        self._hvd_reducer.register_local(var)

    def build(self, variables):
        super().build(variables)
        if self._hvd_k > 1:
            self._hvd_accumulators = [self.add_variable_from_reference(v, name="hvd_accumulator")
                                      for v in variables]
            self._hvd_count = self.add_variable(shape=(), initializer="zeros", dtype="int64",
                                                name="hvd_backward_passes")

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if not grads:
            return None
        variables = list(self._trainable_variables if trainable_variables is None else trainable_variables)
        if self._hvd_k == 1:
            return super().apply(self._hvd_reducer.reduce(grads, variables), variables)
        if not self.built:
            self.build(variables)
            self.built = True
        accumulators = {id(v): a for v, a in zip(self._trainable_variables, self._hvd_accumulators)}
        present = []
        for g, v in zip(grads, variables):
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices):
                if not self._hvd_sparse_as_dense:
                    raise ValueError("jaxcache.tensorflow.keras.DistributedOptimizer: IndexedSlices "
                                     "gradients need sparse_as_dense=True when backward_passes_per_step "
                                     "> 1 (as in Horovod)")
                g = tf.convert_to_tensor(g)
            accumulators[id(v)].assign_add(g)
            present.append(id(v))
        count = self._hvd_count.assign_add(1)
        k, average = self._hvd_k, self._hvd_average_aggregated

        def update():
            summed = [accumulators[id(v)].value if id(v) in present else None for v in variables]
            if average:
                summed = [None if s is None else s / k for s in summed]
            super(_DistributedKeras, self).apply(self._hvd_reducer.reduce(summed, variables), variables)
            for key in present:
                accumulators[key].assign(tf.zeros_like(accumulators[key]))
            self._hvd_count.assign(0)
            return tf.constant(True)

        def accumulate_only():
            self.iterations.assign_add(1)
            return tf.constant(False)

        if tf.executing_eagerly():
            return update() if int(count) >= k else accumulate_only()
        return tf.cond(tf.greater_equal(count, k), update, accumulate_only)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=reduce_ops.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A Keras optimizer whose apply()/apply_gradients() first reduces the gradients across ranks.

    Returns a new optimizer of a subclass of `optimizer`'s class (same class name, so saved
    models load without jaxcache) built from its config. op: Average or Sum. With
    backward_passes_per_step=k, gradients accumulate locally and are reduced and applied every
    k-th call (summed, or averaged with average_aggregated_gradients); the other calls only
    advance `iterations`. Other arguments as in jaxcache.tensorflow.DistributedGradientTape.
    """
    import keras
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("jaxcache.tensorflow.keras.DistributedOptimizer: expected a keras optimizer, got "
                        f"{type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedKeras):
        raise ValueError("jaxcache.tensorflow.keras.DistributedOptimizer: this optimizer is already distributed")
    _runtime.require_initialized("jaxcache.tensorflow.keras.DistributedOptimizer")
    op_name = reduce_ops.to_name(op, "tensorflow.keras.DistributedOptimizer")
    if op_name not in ("average", "sum"):
        raise ValueError("jaxcache.tensorflow.keras.DistributedOptimizer: op must be Average or Sum (as "
                         f"in Horovod), got {op!r}")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step < 1:
        raise ValueError("jaxcache.tensorflow.keras.DistributedOptimizer: backward_passes_per_step must "
                         f"be an int >= 1, got {backward_passes_per_step!r}")
    reducer = GradientReducer("keras.DistributedOptimizer", compression, sparse_as_dense, op,
                              gradient_predivide_factor, num_groups, groups, process_set,
                              scale_local_gradients, "keras.grad")
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedKeras, base), {"__module__": base.__module__})
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    wrapped = cls.from_config(config)
    wrapped._hvd_reducer = reducer
    wrapped._hvd_k = backward_passes_per_step
    wrapped._hvd_average_aggregated = bool(average_aggregated_gradients)
    wrapped._hvd_sparse_as_dense = bool(sparse_as_dense)
    wrapped.process_set = process_set
    return wrapped
