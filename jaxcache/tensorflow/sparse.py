"""tf.IndexedSlices: an allgather of every rank's values and indices, as Horovod does.

Ranks may hold different numbers of slices: values and indices travel as one atomic
allgather per slices tensor, whose first dimension differs per rank.
"""

from __future__ import annotations

import tensorflow as tf

from ..compat.process_sets import Resolved
from .. import session
from . import ops
from ..protocol import Kind


def reduce_slices(slices: list, names: list[str], op: str, fn: str, ps: Resolved) -> list:
    """Every rank's slices (of set `ps`), concatenated in rank order; for op 'average' the
    values are divided by the set's size (after join() too, as Horovod and dense tensors;
    JAXCACHE_JOIN_AVERAGE_BY_SIZE=0: by the ranks that have not joined)."""
    if op not in ("average", "sum"):
        raise NotImplementedError(f"jaxcache.tensorflow.{fn}: only Sum and Average apply to "
                                  f"tf.IndexedSlices, got op={op!r} (as in Horovod); densify first "
                                  "(sparse_as_dense=True) for other ops")
    values = [ops.as_tensor(s.values, fn, f"values of IndexedSlices {n!r}") for s, n in zip(slices, names)]
    indices = [tf.convert_to_tensor(s.indices) for s in slices]
    gathered = ops.run_allocated(Kind.ALLGATHER, list(names), [[v, i] for v, i in zip(values, indices)],
                                 process_set=ps)
    out = []
    for s, ((v, i), _, contributors) in zip(slices, gathered):
        if op == "average":  # (contributors: a tensor in graph mode)
            v = v / tf.cast(session.average_divisor(ps.size, contributors), v.dtype)
        out.append(tf.IndexedSlices(v, i, dense_shape=s.dense_shape))
    return out
