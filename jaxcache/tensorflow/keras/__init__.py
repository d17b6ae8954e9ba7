"""Keras bridge: jaxcache's runtime behind Horovod's horovod.tensorflow.keras API.

    import jaxcache.tensorflow.keras as hvd   # drop-in for `import horovod.tensorflow.keras as hvd`
    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size())), ...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

Keras 3 with the TensorFlow backend, or Keras 2 through tf_keras (TF_USE_LEGACY_KERAS=1, where
`tf.keras` is tf_keras). docs/horovod.md lists every Horovod name's status.
"""

from __future__ import annotations

import keras as _keras
import tensorflow as _tf

from ...compat import api as _api
from ...compat.api import *  # noqa: F403  (the names every bridge shares: _api.__all__)
from ...compat.reduce_ops import Average
from .. import collectives as _collectives
from .. import functions as _functions
from ..compression import Compression
from . import callbacks, elastic
from .optimizer import DistributedOptimizer, _DistributedKeras, _DistributedKeras2


def broadcast_global_variables(root_rank):
    """TensorFlow 1's global variables (graph mode only, as in Horovod); eagerly it raises."""
    return _functions.broadcast_global_variables(root_rank)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """The reduction of a tensor-compatible value over all ranks (name names the collective)."""
    return _collectives.allreduce(_tf.constant(value), average=average, compression=compression, op=op,
                                  prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                  name=name)


def allgather(value, name=None):
    """Every rank's value concatenated along the first dimension (which may differ per rank)."""
    return _collectives.allgather(_tf.constant(value), name=name)


def broadcast(value, root_rank, name=None):
    """root_rank's value on every rank."""
    return _collectives.broadcast(_tf.constant(value), root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    """The reduction of a tensor-compatible value over all ranks; this rank's rows of its first
    dimension (`shape[0] // size`, one more for the first `shape[0] % size` ranks)."""
    return _collectives.reducescatter(_tf.constant(value), op=op, name=name)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts=False):
    """load_model of the Keras in use (`tf.keras`: Keras 3, or tf_keras under
    TF_USE_LEGACY_KERAS=1) with the saved optimizer wrapped in DistributedOptimizer."""
    keras = _keras_in_use()
    legacy = keras is not _keras
    if legacy_opts and not legacy:
        raise NotImplementedError("jaxcache.tensorflow.keras.load_model: legacy_opts=True is not "
                                  "supported: Keras 3 has no keras.optimizers.legacy")

    def wrapping(cls):
        return type(cls.__name__, (), {"from_config": staticmethod(
            lambda config, custom_objects=None: DistributedOptimizer(cls.from_config(config),
                                                                     compression=compression))})

    root = keras.optimizers.legacy.Optimizer if legacy_opts else keras.optimizers.Optimizer
    classes = [c for c in _all_subclasses(root)
               if not c.__name__.startswith("_") and not issubclass(c, (_DistributedKeras, _DistributedKeras2))]
    objects = {}
    for c in classes:
        objects[c.__name__] = wrapping(c)
        if legacy:  # tf_keras looks its built-in optimizers up by lower-case name
            objects.setdefault(c.__name__.lower(), objects[c.__name__])
    for c in custom_optimizers or []:
        objects[c.__name__] = wrapping(c)
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects)


def _keras_in_use():
    """keras (Keras 3), or the tf_keras module when `tf.keras` is tf_keras (TF_USE_LEGACY_KERAS=1)."""
    tk = _tf.keras
    if getattr(tk, "__name__", "").startswith("tf_keras"):
        return tk
    return _keras


def _all_subclasses(cls) -> list:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


__all__ = [
    *_api.__all__,
    "Compression", "DistributedOptimizer", "broadcast_global_variables",
    "allreduce", "allgather", "broadcast", "reducescatter", "load_model", "callbacks", "elastic",
]
