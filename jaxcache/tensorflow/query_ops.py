"""Horovod's *_op functions: TensorFlow ops whose value is read when the graph runs."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ..compat import basics, pending


def _op(read, name):
    with tf.name_scope(name or "jaxcache_query"):
        out = tf.py_function(lambda: np.int32(read()), [], Tout=tf.int32)
    out.set_shape([])
    return out


def _global_only(process_set_id, fn: str) -> None:
    if process_set_id != 0:
        pending.process_sets(f"jaxcache.tensorflow.{fn}(process_set_id={process_set_id})")


def size_op(process_set_id=0, name=None):
    """The number of ranks, as an int32 tensor evaluated when the graph runs."""
    _global_only(process_set_id, "size_op")
    return _op(basics.size, name)


def local_size_op(name=None):
    return _op(basics.local_size, name)


def rank_op(name=None):
    return _op(basics.rank, name)


def local_rank_op(name=None):
    return _op(basics.local_rank, name)


def process_set_included_op(process_set_id=0, name=None):
    """1 when this rank belongs to the process set (always, for the global set)."""
    _global_only(process_set_id, "process_set_included_op")
    return _op(lambda: int(basics.is_initialized()), name)
