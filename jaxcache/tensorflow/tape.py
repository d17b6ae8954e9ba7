"""DistributedGradientTape: tape.gradient() returns gradients reduced over all ranks."""

from __future__ import annotations

import tensorflow as tf

from .. import runtime as _runtime
from ..compat import reduce_ops
from ..compat.process_sets import global_process_set
from .compression import Compression
from .gradients import GradientReducer, var_key


class DistributedGradientTape:
    """Wraps a tf.GradientTape; gradient() reduces the gradients across ranks (Horovod's API).

        with tf.GradientTape() as tape:
            loss = ...
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    op: Average (default) or Sum (also Min, Max, Product; jaxcache's op strings work too).
    compression: Compression.none / fp16 / bf16. sparse_as_dense: densify IndexedSlices
    gradients (else their values and indices are allgathered and stay IndexedSlices).
    gradient_predivide_factor: with Average, scale by 1/f before the sum and f/size after.
    groups: None (one request per gradient, all in flight together; the runtime fuses the small
    ones), an int n (n contiguous groups) or a list of lists of variables (one atomic request
    each); num_groups is its deprecated spelling. A gradient that is None stays None (every
    rank must then have None there). Sources registered with register_local_source are not
    reduced (divided by the number of ranks when scale_local_gradients). Every rank must pass
    the same sources in the same order. Works eagerly and inside tf.function.
    """

    def __init__(self, gradtape, device_dense="", device_sparse="", compression=Compression.none,
                 sparse_as_dense=False, op=reduce_ops.Average, gradient_predivide_factor=1.0,
                 num_groups=0, groups=None, process_set=global_process_set,
                 scale_local_gradients=True, *, name_prefix: str = "grad"):
        if isinstance(gradtape, DistributedGradientTape):
            gradtape = gradtape._tape
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError("jaxcache.tensorflow.DistributedGradientTape: expected a tf.GradientTape, "
                            f"got {type(gradtape).__name__}")
        _runtime.require_initialized("jaxcache.tensorflow.DistributedGradientTape")
        self._tape = gradtape
        self._reducer = GradientReducer("DistributedGradientTape", compression, sparse_as_dense, op,
                                        gradient_predivide_factor, num_groups, groups, process_set,
                                        scale_local_gradients, name_prefix)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients

    def __getattr__(self, item):
        return getattr(self._tape, item)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def register_local_source(self, source) -> None:
        """This source's gradient stays local (not reduced)."""
        self._reducer.register_local(source)

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None, use_generic_names=False, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(grads, expand_composites=False)
        if len(flat) != len(flat_sources):  # pragma: no cover - defensive
            raise RuntimeError("jaxcache.tensorflow.DistributedGradientTape: gradient structure "
                               "does not match sources")
        reduced = self._reducer.reduce(flat, flat_sources)
        return tf.nest.pack_sequence_as(sources, reduced)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        """([(local source, gradient)], [(global source, reduced gradient)])."""
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        local, global_ = [], []
        for s, g in zip(tf.nest.flatten(sources), tf.nest.flatten(grads)):
            (local if var_key(s) in self._reducer.local else global_).append((s, g))
        return local, global_


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=reduce_ops.Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """A DistributedGradientTape that keeps the gradients of `local_layers` local."""
    import keras
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("jaxcache.tensorflow.PartialDistributedGradientTape: every local layer must "
                         "be a keras.layers.Layer")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense,
                                   op, gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
