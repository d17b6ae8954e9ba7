"""Reducing a list of gradients across ranks, as DistributedGradientTape and the Keras
DistributedOptimizer do (Horovod's rules): None stays None, tf.IndexedSlices are allgathered
unless sparse_as_dense, floating gradients may travel compressed, gradient_predivide_factor
splits the average around the sum, registered local sources are not reduced (their gradient
is divided by the number of ranks when scale_local_gradients). With a process set, gradients
are reduced over its ranks; on a rank outside it they stay local, as in Horovod."""

from __future__ import annotations

import tensorflow as tf

from .. import grouping
from .. import runtime as _runtime
from ..compat import reduce_ops
from . import compression as _compression
from . import ops, sparse
from ..protocol import Kind


def var_key(v):
    """A hashable identity for tf.Variables (ref()) and Keras 3 variables (no ref())."""
    return v.ref() if hasattr(v, "ref") else id(v)


class GradientReducer:
    def __init__(self, fn: str, compression, sparse_as_dense: bool, op, gradient_predivide_factor,
                 num_groups, groups, process_set, scale_local_gradients: bool, prefix: str):
        self.fn = fn
        self.ps = ops.set_of(process_set, fn, member=False)
        self.op = reduce_ops.to_name(op, f"tensorflow.{fn}")
        self.pre, self.post = reduce_ops.predivide(self.op, gradient_predivide_factor, f"tensorflow.{fn}")
        _compression.check(compression, fn)
        if num_groups:
            import warnings
            warnings.warn(f"jaxcache.tensorflow.{fn}: num_groups is deprecated (as in Horovod); use "
                          "groups=", DeprecationWarning, stacklevel=4)
            if groups is None:
                groups = num_groups
        if groups is not None and not (isinstance(groups, (list, tuple)) or (
                isinstance(groups, int) and not isinstance(groups, bool) and groups >= 1)):
            raise ValueError(f"jaxcache.tensorflow.{fn}: groups must be None, an int >= 1 or a list of "
                             f"lists of variables; got {groups!r}")
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"jaxcache.tensorflow.{fn}: name_prefix must be a non-empty str")
        self.compression = compression
        self.sparse_as_dense = bool(sparse_as_dense)
        self.groups = groups
        self.scale_local = bool(scale_local_gradients)
        self.prefix = f"tf.{prefix}"
        self.local: set = set()

    def register_local(self, var) -> None:
        self.local.add(var_key(var))

    def _partition(self, sources: list, present: list[int]) -> list[list[int]]:
        groups = self.groups
        if groups is None:
            return [[i] for i in present]
        if isinstance(groups, int):
            return [[present[j] for j in g] for g in grouping.contiguous(len(present), groups)]
        index = {var_key(s): i for i, s in enumerate(sources)}
        live = set(present)
        out, seen = [], set()
        for gi, group in enumerate(groups):
            members = []
            for v in group:
                ref = var_key(v)
                if ref not in index:
                    raise ValueError(f"jaxcache.tensorflow.{self.fn}: groups[{gi}] holds "
                                     f"{getattr(v, 'name', type(v).__name__)!r}, which is not among "
                                     "the sources whose gradients are reduced")
                if ref in seen:
                    raise ValueError(f"jaxcache.tensorflow.{self.fn}: {getattr(v, 'name', '?')!r} is "
                                     "in two groups")
                seen.add(ref)
                if index[ref] in live:
                    members.append(index[ref])
            if members:
                out.append(sorted(members))
        out.extend([i] for i in present if var_key(sources[i]) not in seen)
        return out

    def reduce(self, grads: list, sources: list) -> list:
        """The reduced gradients, aligned with `sources` (every rank must pass the same sources)."""
        _runtime.require_initialized(f"jaxcache.tensorflow.{self.fn}")
        grads = list(grads)
        out = list(grads)
        dense, slices = [], []
        for i, (g, s) in enumerate(zip(grads, sources)):
            if g is None or var_key(s) in self.local or self.ps.rank < 0:
                continue
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    slices.append(i)
                    continue
                g = tf.convert_to_tensor(g)
            what = f"gradient {i} ({getattr(s, 'name', 'source')})"
            g = ops.as_tensor(g, self.fn, what)
            ops.check_reduction(g, self.op, self.pre, self.post, self.fn, what)
            grads[i] = g
            dense.append(i)
        if slices:
            for i, r in zip(slices, sparse.reduce_slices([grads[i] for i in slices],
                                                         [f"{self.prefix}/{i}" for i in slices],
                                                         self.op, self.fn, self.ps)):
                out[i] = r
        if dense:
            parts = self._partition(sources, dense)
            names = [f"{self.prefix}/{m[0]}" if len(m) == 1 else
                     f"{self.prefix}/group{m[0]}-{m[-1]}x{len(m)}" for m in parts]
            compressed = {i: self.compression.compress(grads[i]) for i in dense}
            code, pre, post = ops.reduce_args(self.op, self.pre, self.post)
            outs = ops.run(Kind.ALLREDUCE, names, [[compressed[i][0] for i in m] for m in parts],
                           op=code, prescale=pre, postscale=post, process_set=self.ps)
            for members, reduced in zip(parts, outs):
                for i, r in zip(members, reduced):
                    out[i] = self.compression.decompress(r, compressed[i][1])
        if self.scale_local and self.local:
            size = self.ps.size
            for i, (g, s) in enumerate(zip(grads, sources)):
                if g is not None and var_key(s) in self.local:
                    if isinstance(g, tf.IndexedSlices):
                        out[i] = tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
                    else:
                        out[i] = g / tf.cast(size, g.dtype)
        return out
