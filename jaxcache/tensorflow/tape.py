"""DistributedGradientTape: tape.gradient() returns gradients reduced over all ranks."""

from __future__ import annotations

import tensorflow as tf

from .. import grouping
from .. import runtime as _runtime
from ..ops import validation
from . import ops


class DistributedGradientTape:
    """Wraps a tf.GradientTape; gradient() reduces the gradients across ranks.

        with tf.GradientTape() as tape:
            loss = ...
        tape = DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    op: 'average' (default) or 'sum' (also 'min', 'max', 'prod').
    groups: None (one request per gradient, all in flight together; the runtime fuses the
        small ones), an int n (n contiguous groups in source order), or a list of lists of
        sources (variables); a group is one atomic request.
    IndexedSlices gradients (embeddings) are densified. A source with no gradient (None)
    contributes zeros, so the collectives match across ranks; it gets the reduced gradient.
    Gradient names come from the sources' positions: every rank must pass the same sources
    in the same order. Works eagerly and inside tf.function (through tf.py_function).
    """

    def __init__(self, tape, op: str = "average", groups=None, name_prefix: str = "grad"):
        if isinstance(tape, DistributedGradientTape):
            tape = tape._tape
        if not isinstance(tape, tf.GradientTape):
            raise TypeError("jaxcache.tensorflow.DistributedGradientTape: expected a tf.GradientTape, "
                            f"got {type(tape).__name__}")
        _runtime.require_initialized("jaxcache.tensorflow.DistributedGradientTape")
        self._tape = tape
        self._op = validation.check_op(op, "tensorflow.DistributedGradientTape")
        if groups is not None and not (isinstance(groups, (list, tuple)) or
                                       (isinstance(groups, int) and not isinstance(groups, bool) and groups >= 1)):
            raise ValueError("jaxcache.tensorflow.DistributedGradientTape: groups must be None, an int "
                             f">= 1 or a list of lists of variables; got {groups!r}")
        self._groups = groups
        if not isinstance(name_prefix, str) or not name_prefix:
            raise TypeError("jaxcache.tensorflow.DistributedGradientTape: name_prefix must be a non-empty str")
        self._prefix = f"tf.{name_prefix}"

    def __getattr__(self, item):
        return getattr(self._tape, item)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def _partition(self, sources: list) -> list[list[int]]:
        n = len(sources)
        groups = self._groups
        if groups is None:
            return [[i] for i in range(n)]
        if isinstance(groups, int):
            if groups < 1:
                raise ValueError(f"jaxcache.tensorflow.DistributedGradientTape: groups must be >= 1, got {groups}")
            return grouping.contiguous(n, groups)
        index = {id(s): i for i, s in enumerate(sources)}
        out, seen = [], set()
        for gi, group in enumerate(groups):
            members = []
            for v in group:
                if id(v) not in index:
                    raise ValueError(f"jaxcache.tensorflow.DistributedGradientTape: groups[{gi}] holds "
                                     f"{getattr(v, 'name', type(v).__name__)!r}, which is not among "
                                     "the sources passed to gradient()")
                if id(v) in seen:
                    raise ValueError(f"jaxcache.tensorflow.DistributedGradientTape: "
                                     f"{getattr(v, 'name', '?')!r} is in two groups")
                seen.add(id(v))
                members.append(index[id(v)])
            if members:
                out.append(members)
        out.extend([i] for i in range(n) if id(sources[i]) not in seen)
        return out

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(grads, expand_composites=False)
        if len(flat) != len(flat_sources):  # pragma: no cover - defensive
            raise RuntimeError("jaxcache.tensorflow.DistributedGradientTape: gradient structure "
                               "does not match sources")
        dense = []
        for i, (g, s) in enumerate(zip(flat, flat_sources)):
            what = f"gradient {i} ({getattr(s, 'name', 'source')})"
            if g is None:
                g = tf.zeros(s.shape, dtype=s.dtype)
            g = ops.as_tensor(g, "DistributedGradientTape", what)
            ops.check_reduction(g, self._op, 1.0, 1.0, "DistributedGradientTape", what)
            dense.append(g)
        if not dense:
            return grads
        parts = self._partition(flat_sources)
        names = []
        for members in parts:
            names.append(f"{self._prefix}/{members[0]}" if len(members) == 1
                         else f"{self._prefix}/group{members[0]}-{members[-1]}x{len(members)}")
        code, pre, post = ops.reduce_args(self._op, 1.0, 1.0)
        outs = ops.run(ops.KIND_ALLREDUCE, names, [[dense[i] for i in m] for m in parts], op=code,
                       prescale=pre, postscale=post)
        reduced = [None] * len(dense)
        for members, out in zip(parts, outs):
            for i, o in zip(members, out):
                reduced[i] = o
        return tf.nest.pack_sequence_as(sources, reduced)
