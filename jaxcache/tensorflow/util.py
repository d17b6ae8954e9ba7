"""Horovod's `horovod.tensorflow.util` helpers that user code and Horovod's tests import."""

from __future__ import annotations

import functools

import tensorflow as tf


def _executing_eagerly() -> bool:
    """True outside graphs (Horovod's name; tf.executing_eagerly())."""
    return tf.executing_eagerly()


def _make_subgraph(fn):
    """`fn` as one graph function (TensorFlow 2: tf.function)."""
    return tf.function(fn)


def _cache(fn):
    """Memoizes `fn` by its (hashable) arguments, separately per graph and for eager calls."""
    results: dict = {}

    @functools.wraps(fn)
    def cached(*args):
        key = (None if tf.executing_eagerly() else tf.compat.v1.get_default_graph(), args)
        if key not in results:
            results[key] = fn(*args)
        return results[key]

    return cached


def vars_to_refs(variables) -> list:
    """Hashable references of variables (tf.Variable.ref())."""
    return [v.ref() for v in variables]


def refs_to_vars(refs) -> list:
    """The variables behind references made by vars_to_refs."""
    return [r.deref() for r in refs]
