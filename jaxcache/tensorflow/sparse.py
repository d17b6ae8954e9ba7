"""tf.IndexedSlices: an allgather of every rank's values and indices, as Horovod does.

Ranks may hold different numbers of slices: the counts are gathered first, then values and
indices padded to the largest count travel as one atomic allgather per slices tensor.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from .. import runtime as _runtime
from . import ops


def _gather_eager(names: list[str], values: list, indices: list) -> list:
    counts = ops.submit_eager(ops.KIND_ALLGATHER, list(names),
                              [[tf.constant([int(v.shape[0])], tf.int64)] for v in values])
    padded, lengths = [], []
    for v, i, c in zip(values, indices, counts):
        per_rank = c[0].tolist()
        most = max(per_rank)
        v, i = v.numpy(), i.numpy()
        pv = np.zeros((most, *v.shape[1:]), v.dtype)
        pi = np.zeros((most,), i.dtype)
        pv[:len(v)], pi[:len(i)] = v, i
        padded.append([tf.constant(pv), tf.constant(pi)])
        lengths.append((per_rank, most))
    gathered = ops.submit_eager(ops.KIND_ALLGATHER, [f"{n}.entries" for n in names], padded)
    out_values, out_indices = [], []
    for (gv, gi), (per_rank, most) in zip(gathered, lengths):
        keep = np.concatenate([np.arange(r * most, r * most + n) for r, n in enumerate(per_rank)])
        out_values.append(tf.constant(gv[keep]))
        out_indices.append(tf.constant(gi[keep]))
    return out_values + out_indices


def reduce_slices(slices: list, names: list[str], op: str, fn: str) -> list:
    """Every rank's slices, concatenated in rank order (values / size for op 'average')."""
    if op not in ("average", "sum"):
        raise NotImplementedError(f"jaxcache.tensorflow.{fn}: only Sum and Average apply to "
                                  f"tf.IndexedSlices, got op={op!r} (as in Horovod); densify first "
                                  "(sparse_as_dense=True) for other ops")
    values = [ops.as_tensor(s.values, fn, f"values of IndexedSlices {n!r}") for s, n in zip(slices, names)]
    indices = [tf.convert_to_tensor(s.indices) for s in slices]
    n = len(slices)
    if tf.executing_eagerly():
        flat = _gather_eager(names, values, indices)
    else:
        flat = tf.py_function(lambda *ts: _gather_eager(names, list(ts[:n]), list(ts[n:])),
                              values + indices, Tout=[v.dtype for v in values] + [i.dtype for i in indices])
        for t, v in zip(flat[:n], values):
            t.set_shape(tf.TensorShape([None]).concatenate(v.shape[1:]))
        for t in flat[n:]:
            t.set_shape([None])
    size = _runtime.size()
    out = []
    for s, v, i in zip(slices, flat[:n], flat[n:]):
        if op == "average":
            v = v / tf.cast(size, v.dtype)
        out.append(tf.IndexedSlices(v, i, dense_shape=s.dense_shape))
    return out
