"""DistributedOptimizer for Keras optimizers.

Keras 3: gradients are reduced across ranks in apply(). Keras 2 (tf_keras, what `tf.keras` is
under TF_USE_LEGACY_KERAS=1; both its optimizers and its legacy OptimizerV2s): the gradient
computation (`compute_gradients` / `_compute_gradients`, what `minimize` and `model.fit` call,
and `get_gradients`) returns reduced gradients, and `apply_gradients` reduces the gradients it
did not get from there, so each gradient is reduced exactly once.
"""

from __future__ import annotations

import sys

import tensorflow as tf

from ... import runtime as _runtime
from ...compat import reduce_ops
from ...compat.process_sets import global_process_set
from ..compression import Compression
from ..gradients import GradientReducer, var_key


def _accumulate_and_apply(grads, variables, accumulator_of, counter, k: int, average: bool,
                          sparse_as_dense: bool, reduce, apply, iterations):
    """backward_passes_per_step = k (Horovod's rule): the gradients are added to their
    accumulators; every k-th call the sums (divided by k with `average`) are reduced and
    applied through `apply(reduced)`, and the other calls only advance `iterations`."""
    present = []
    for g, v in zip(grads, variables):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if not sparse_as_dense:
                raise ValueError("jaxcache.tensorflow.keras.DistributedOptimizer: IndexedSlices "
                                 "gradients need sparse_as_dense=True when backward_passes_per_step "
                                 "> 1 (as in Horovod)")
            g = tf.convert_to_tensor(g)
        accumulator_of(v).assign_add(g)
        present.append(v)
    count = counter.assign_add(1)
    accumulated = {id(v) for v in present}

    def update():
        summed = [tf.convert_to_tensor(accumulator_of(v)) if id(v) in accumulated else None
                  for v in variables]
        if average:
            summed = [None if s is None else s / k for s in summed]
        applied = apply(reduce(summed, variables))
        with tf.control_dependencies([] if applied is None or tf.executing_eagerly() else [applied]):
            for v in present:
                accumulator_of(v).assign(tf.zeros_like(accumulator_of(v)))
            counter.assign(0)
        return tf.constant(True)

    def accumulate_only():
        iterations.assign_add(1)
        return tf.constant(False)

    if tf.executing_eagerly():
        return update() if int(count) >= k else accumulate_only()
    return tf.cond(tf.greater_equal(count, k), update, accumulate_only)


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

        def apply(reduced):
            super(_DistributedKeras, self).apply(reduced, variables)

        return _accumulate_and_apply(grads, variables, lambda v: accumulators[id(v)], self._hvd_count,
                                     self._hvd_k, self._hvd_average_aggregated, self._hvd_sparse_as_dense,
                                     self._hvd_reducer.reduce, apply, self.iterations)


class _Keras2Aggregation:
    """Per-optimizer state of the Keras 2 path, kept off the optimizer's tracked attributes (so
    checkpoints and `optimizer.variables` stay those of the wrapped class). `counter` counts
    the backward passes since the last update (as Horovod's `_agg_helper.counter`)."""

    def __init__(self, k: int):
        self.k = k
        self.reduced: list = []          # the gradients the last gradient computation reduced
        self.accumulators: dict = {}     # var_key -> tf.Variable (backward_passes_per_step > 1)
        self.counter = None
        if k > 1:
            with tf.init_scope():
                self.counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="hvd_backward_passes")


class _DistributedKeras2:
    """Mixed in front of a tf_keras optimizer's class (see DistributedOptimizer)."""

    _hvd_settings: dict = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        s = self._hvd_settings
        self._hvd_reducer = GradientReducer("keras.DistributedOptimizer", s["compression"],
                                            s["sparse_as_dense"], s["op"],
                                            s["gradient_predivide_factor"], s["num_groups"],
                                            s["groups"], s["process_set"],
                                            s["scale_local_gradients"], "keras.grad")
        self._hvd = _Keras2Aggregation(s["k"])
        self._agg_helper = self._hvd if s["k"] > 1 else None
        self.process_set = s["process_set"]
        self.scale_local_gradients = s["scale_local_gradients"]

    def register_local_var(self, var) -> None:
        """This variable's gradient stays local (not reduced)."""
        self._hvd_reducer.register_local(var)

    # -- gradient computation: reduced here (once) when backward_passes_per_step == 1 ----------

    def _hvd_reduced(self, grads, variables):
        grads, variables = list(grads), list(variables)
        if self._hvd.k > 1:
            # Accumulated locally and reduced every k-th apply_gradients().
            return grads
        reduced = self._hvd_reducer.reduce(grads, variables)
        self._hvd.reduced = [g for g in reduced if g is not None]
        return reduced

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        base = super()
        if hasattr(base, "_compute_gradients"):  # OptimizerV2
            pairs = base._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)
        else:
            if grad_loss is not None:
                raise ValueError("jaxcache.tensorflow.keras.DistributedOptimizer: grad_loss is "
                                 f"not supported by {type(self).__name__}")
            pairs = base.compute_gradients(loss, var_list, tape=tape)
        pairs = list(pairs)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs)
        return list(zip(self._hvd_reduced(grads, variables), variables))

    def compute_gradients(self, loss, var_list, tape=None):
        return self._compute_gradients(loss, var_list, tape=tape)

    def get_gradients(self, loss, params):
        grads = super().get_gradients(loss, params)
        return self._hvd_reduced(grads, params)

    # -- apply_gradients: reduces what the gradient computation did not ------------------------

    def _hvd_prebuild(self, variables) -> None:
        """Creates the optimizer's (and the accumulators') variables outside any tf.cond."""
        with tf.init_scope():
            _ = self.iterations  # (OptimizerV2 creates it on first access)
            if hasattr(self, "_create_all_weights"):  # OptimizerV2
                self._create_all_weights(variables)
            else:
                self.build(variables)
            for v in variables:
                if var_key(v) not in self._hvd.accumulators:
                    self._hvd.accumulators[var_key(v)] = tf.Variable(
                        tf.zeros(v.shape, v.dtype), trainable=False, name="hvd_accumulator")

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        base = super(_DistributedKeras2, self)
        if self._hvd.k == 1:
            done = self._hvd.reduced  # (kept alive here, so their ids are not reused)
            self._hvd.reduced = []
            done_ids = {id(r) for r in done}
            present = [g for g in grads if g is not None]
            if not (present and all(id(g) in done_ids for g in present)):
                grads = self._hvd_reducer.reduce(grads, variables)
            return base.apply_gradients(list(zip(grads, variables)), *args, **kwargs)
        if not pairs:
            return base.apply_gradients(pairs, *args, **kwargs)
        self._hvd_prebuild(variables)
        acc = self._hvd.accumulators

        def apply(reduced):
            with tf.control_dependencies([g for g in reduced if g is not None]):
                return base.apply_gradients(list(zip(reduced, variables)), *args, **kwargs)

        return _accumulate_and_apply(grads, variables, lambda v: acc[var_key(v)], self._hvd.counter,
                                     self._hvd.k, self._hvd_settings["average_aggregated_gradients"],
                                     self._hvd_reducer.sparse_as_dense, self._hvd_reducer.reduce, apply,
                                     self.iterations)


def _keras2_optimizer_classes() -> tuple:
    """tf_keras's optimizer base classes, if tf_keras is loaded (an optimizer of it implies so)."""
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is None:
        return ()
    try:
        return (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)
    except AttributeError:
        return ()


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=reduce_ops.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A Keras optimizer whose gradients are reduced across ranks before they are applied.

    Returns a new optimizer of a subclass of `optimizer`'s class (same class name, so saved
    models load without jaxcache) built from its config. op: Average or Sum. With
    backward_passes_per_step=k, gradients accumulate locally and are reduced and applied every
    k-th call (summed, or averaged with average_aggregated_gradients); the other calls only
    advance `iterations`. Other arguments as in jaxcache.tensorflow.DistributedGradientTape.
    Keras 2 (a tf_keras optimizer, TF_USE_LEGACY_KERAS=1): see the module's docstring; with
    backward_passes_per_step > 1 the accumulation and reduction happen in apply_gradients().
    """
    import keras
    keras2 = isinstance(optimizer, _keras2_optimizer_classes())
    if not keras2 and not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("jaxcache.tensorflow.keras.DistributedOptimizer: expected a keras optimizer "
                        "(Keras 3, or tf_keras's under TF_USE_LEGACY_KERAS=1), got "
                        f"{type(optimizer).__name__}")
    if isinstance(optimizer, (_DistributedKeras, _DistributedKeras2)):
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
    if keras2:
        # The settings live on the class so that from_config() (and load_model) rebuild a
        # distributed optimizer, as Horovod's.
        settings = dict(compression=compression, sparse_as_dense=bool(sparse_as_dense), op=op,
                        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
                        groups=groups, process_set=process_set,
                        scale_local_gradients=bool(scale_local_gradients),
                        k=backward_passes_per_step,
                        average_aggregated_gradients=bool(average_aggregated_gradients))
        cls = type(base.__name__, (_DistributedKeras2, base),
                   {"__module__": base.__module__, "_hvd_settings": settings})
        config = optimizer.get_config()
        if name is not None:
            config["name"] = name
        return cls.from_config(config)
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
