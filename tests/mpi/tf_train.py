"""DistributedGradientTape: 20 steps on rank-sharded data == one process on the whole batch.

The model has an embedding (IndexedSlices gradient, allgathered) and an unused variable (no
gradient). Eager and tf.function, per-tensor and grouped requests. Variables end bitwise
identical on every rank and equal, to float tolerance, to a single-process reference
computed in the same program.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _util import done, same_on_all_ranks  # noqa: E402

import jaxcache.tensorflow as jctf  # noqa: E402

jctf.init()
RANK, SIZE = jctf.rank(), jctf.size()
STEPS, BATCH, FEATURES, VOCAB = 20, 12, 5, 10


def make_vars(seed_offset: int = 0) -> list[tf.Variable]:
    rng = np.random.default_rng(7 + seed_offset)
    shapes = {"emb": (VOCAB, 4), "w1": (4 + FEATURES, 8), "b1": (8,), "w2": (8, 3), "b2": (3,), "unused": (2,)}
    return [tf.Variable(rng.standard_normal(s).astype(np.float32) * 0.5, name=n) for n, s in shapes.items()]


def batch(step: int):
    rng = np.random.default_rng(100 + step)
    x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
    ids = rng.integers(0, VOCAB, BATCH).astype(np.int32)
    y = rng.integers(0, 3, BATCH).astype(np.int32)
    return x, ids, y


def loss_fn(vs, x, ids, y):
    emb, w1, b1, w2, b2, _unused = vs
    h = tf.tanh(tf.concat([tf.gather(emb, ids), x], axis=1) @ w1 + b1)
    logits = h @ w2 + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def apply(vs, moms, grads, lr=0.3, momentum=0.9):
    for v, m, g in zip(vs, moms, grads):
        if g is None:
            continue
        m.assign(momentum * m + tf.convert_to_tensor(g))
        v.assign_sub(lr * m)


def reference():
    vs = make_vars()
    moms = [tf.Variable(tf.zeros_like(v)) for v in vs]
    for step in range(STEPS):
        with tf.GradientTape() as tape:
            loss = loss_fn(vs, *batch(step))
        grads = tape.gradient(loss, vs)
        assert isinstance(grads[0], tf.IndexedSlices) and grads[-1] is None
        apply(vs, moms, grads)
    return [v.numpy() for v in vs]


def distributed(groups=None, use_function=False):
    vs = make_vars(seed_offset=RANK)  # different on every rank...
    jctf.broadcast_variables(vs, root_rank=0)  # ...until rank 0's values are broadcast
    moms = [tf.Variable(tf.zeros_like(v)) for v in vs]
    if groups == "explicit":
        groups = [[vs[1], vs[2]], [vs[0], vs[4], vs[3]]]
    lo, hi = RANK * BATCH // SIZE, (RANK + 1) * BATCH // SIZE

    def train_step(x, ids, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(vs, x, ids, y)
        grads = jctf.DistributedGradientTape(tape, groups=groups).gradient(loss, vs)
        apply(vs, moms, grads)
        return loss

    step_fn = tf.function(train_step) if use_function else train_step
    for step in range(STEPS):
        x, ids, y = batch(step)
        step_fn(tf.constant(x[lo:hi]), tf.constant(ids[lo:hi]), tf.constant(y[lo:hi]))
    return [v.numpy() for v in vs]


ref = reference()
initial = [v.numpy() for v in make_vars()]
for label, kw in [("eager, per-tensor", {}), ("eager, groups=2", {"groups": 2}),
                  ("eager, explicit groups", {"groups": "explicit"}),
                  ("tf.function, per-tensor", {"use_function": True}),
                  ("tf.function, groups=3", {"use_function": True, "groups": 3})]:
    got = distributed(**kw)
    for i, (g, r, init) in enumerate(zip(got, ref, initial)):
        same_on_all_ranks(g, f"{label}: variable {i}")
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6, err_msg=f"{label}: variable {i}")
        if i < 5:
            assert not np.array_equal(g, init), f"{label}: variable {i} did not train"
        else:
            assert np.array_equal(g, init), f"{label}: the unused variable changed"
    if RANK == 0:
        print(f"{label}: OK", flush=True)

done("tf_train")
jctf.shutdown()
