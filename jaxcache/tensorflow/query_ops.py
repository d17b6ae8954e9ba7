"""Horovod's *_op functions: TensorFlow ops whose value is read when the graph runs."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ..compat import basics
from ..compat.process_sets import registered

# Horovod's values for "not initialized" and "no such process set" (HOROVOD_PROCESS_SET_ERROR_*).
NOT_INITIALIZED, UNKNOWN_SET = -1, -3


def _op(read, name):
    with tf.name_scope(name or "jaxcache_query"):
        out = tf.py_function(lambda: np.int32(read()), [], Tout=tf.int32)
    out.set_shape([])
    return out


def _check_id(process_set_id, fn: str) -> int:
    if isinstance(process_set_id, bool) or not isinstance(process_set_id, (int, np.integer)):
        raise TypeError(f"jaxcache.tensorflow.{fn}: process_set_id must be an int, got "
                        f"{type(process_set_id).__name__}")
    return int(process_set_id)


def _set_ranks(process_set_id: int) -> list | None:
    """The global ranks of a registered set, read when the op runs (None if unknown)."""
    for ps in registered():
        if ps.process_set_id == process_set_id:
            return ps.ranks
    return None


def size_op(process_set_id=0, name=None):
    """The number of ranks (of the process set with that id; Horovod's -3 for an unknown id),
    as an int32 tensor evaluated when the graph runs."""
    set_id = _check_id(process_set_id, "size_op")
    if set_id == 0:
        return _op(basics.size, name)

    def read():
        basics.size()  # raises before init(), like the other queries
        ranks = _set_ranks(set_id)
        return UNKNOWN_SET if ranks is None else len(ranks)
    return _op(read, name)


def local_size_op(name=None):
    return _op(basics.local_size, name)


def rank_op(name=None):
    return _op(basics.rank, name)


def local_rank_op(name=None):
    return _op(basics.local_rank, name)


def process_set_included_op(process_set_id=0, name=None):
    """1 when this rank belongs to the process set with that id (always, for the global set),
    0 when not; Horovod's -1 before init() and -3 for an unknown id. Evaluated when the graph
    runs."""
    set_id = _check_id(process_set_id, "process_set_included_op")

    def read():
        if not basics.is_initialized():
            return NOT_INITIALIZED
        ranks = _set_ranks(set_id)
        return UNKNOWN_SET if ranks is None else int(basics.rank() in ranks)
    return _op(read, name)
