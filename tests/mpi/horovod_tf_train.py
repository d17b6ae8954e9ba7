"""hvd.DistributedGradientTape and the Keras hvd.DistributedOptimizer (model.fit) with
Horovod's options == single-process training on the whole batch: backward_passes_per_step=2,
gradient_predivide_factor=2, num_groups=3, fp16 compression, sparse (IndexedSlices) gradients
allgathered with different counts per rank, sparse_as_dense, op=Sum; local sources."""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _util import done, same_on_all_ranks  # noqa: E402

import jaxcache.tensorflow as hvd  # noqa: E402
import jaxcache.tensorflow.keras as hvdk  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
STEPS, BATCH, FEATURES, VOCAB = 8, 12, 5, 10
SHARDS = {1: [12], 2: [5, 7], 3: [3, 4, 5]}[SIZE]  # uneven: different IndexedSlices counts per rank
LO = sum(SHARDS[:RANK])
HI = LO + SHARDS[RANK]


def make_vars():
    rng = np.random.default_rng(7)
    shapes = {"emb": (VOCAB, 4), "w1": (4 + FEATURES, 8), "b1": (8,), "w2": (8, 3), "b2": (3,)}
    return [tf.Variable(rng.standard_normal(s).astype(np.float32) * 0.5, name=n) for n, s in shapes.items()]


def batch(step: int):
    rng = np.random.default_rng(100 + step)
    return (rng.standard_normal((BATCH, FEATURES)).astype(np.float32), rng.integers(0, VOCAB, BATCH).astype(np.int32),
            rng.integers(0, 3, BATCH).astype(np.int32))


def loss_sum(vs, x, ids, y):
    emb, w1, b1, w2, b2 = vs
    h = tf.tanh(tf.concat([tf.gather(emb, ids), x], axis=1) @ w1 + b1)
    return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h @ w2 + b2))


def sgd(vs, moms, grads, lr):
    for v, m, g in zip(vs, moms, grads):
        m.assign(0.9 * m + tf.convert_to_tensor(g))
        v.assign_sub(lr * m)


def reference(lr=0.3):
    vs = make_vars()
    moms = [tf.Variable(tf.zeros_like(v)) for v in vs]
    for step in range(STEPS):
        with tf.GradientTape() as tape:
            loss = loss_sum(vs, *batch(step)) / BATCH
        sgd(vs, moms, tape.gradient(loss, vs), lr)
    return [v.numpy() for v in vs]


def distributed(use_function=False, lr=0.3, expect_slices=False, **kw):
    vs = make_vars()
    moms = [tf.Variable(tf.zeros_like(v)) for v in vs]

    def step_fn(x, ids, y):
        with tf.GradientTape() as tape:
            loss = loss_sum(vs, x, ids, y) * (SIZE / BATCH)  # the ranks' average == the global mean
        grads = hvd.DistributedGradientTape(tape, **kw).gradient(loss, vs)
        assert isinstance(grads[0], tf.IndexedSlices) == expect_slices
        sgd(vs, moms, grads, lr)

    fn = tf.function(step_fn) if use_function else step_fn
    for step in range(STEPS):
        fn(*(tf.constant(a[LO:HI]) for a in batch(step)))
    return [v.numpy() for v in vs]


ref = reference()
initial = [v.numpy() for v in make_vars()]
fp16 = hvd.Compression.fp16
tape_configs = [
    ("tape: IndexedSlices allgathered (uneven counts)", {"expect_slices": True}, (2e-5, 2e-6)),
    ("tape: sparse_as_dense", {"sparse_as_dense": True}, (2e-5, 2e-6)),
    ("tape: gradient_predivide_factor=2", {"gradient_predivide_factor": 2.0, "expect_slices": True}, (2e-5, 2e-6)),
    ("tape: num_groups=3", {"num_groups": 3, "expect_slices": True}, (2e-5, 2e-6)),
    ("tape: fp16 compression", {"compression": fp16, "sparse_as_dense": True}, (1e-2, 2e-3)),
    ("tape: op=Sum", {"op": hvd.Sum, "lr": 0.3 / SIZE, "expect_slices": True}, (2e-5, 2e-6)),
    ("tape: all together, tf.function",
     {"gradient_predivide_factor": 2.0, "num_groups": 3, "compression": fp16, "use_function": True,
      "expect_slices": True}, (1e-2, 2e-3)),
]
for label, kw, (rtol, atol) in tape_configs:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        got = distributed(**kw)
    for i, (g, r, init) in enumerate(zip(got, ref, initial)):
        same_on_all_ranks(g, f"{label}: variable {i}")
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, err_msg=f"{label}: variable {i}")
        assert not np.array_equal(g, init), f"{label}: variable {i} did not train"
    if RANK == 0:
        print(f"{label}: OK", flush=True)

# PartialDistributedGradientTape: a local layer's gradient is not reduced, only divided by size.
layer, shared = keras.layers.Dense(2), keras.layers.Dense(2)
x = tf.constant(np.random.default_rng(RANK).standard_normal((4, 3)).astype(np.float32))
layer.build((None, 3))
shared.build((None, 3))
with tf.GradientTape(persistent=True) as tape:
    loss = tf.reduce_sum(layer(x) ** 2) + tf.reduce_sum(shared(x) ** 2)
plain = tape.gradient(loss, layer.trainable_weights + shared.trainable_weights)
dtape = hvd.PartialDistributedGradientTape(tape, local_layers=layer)
local, global_ = dtape.get_local_and_global_gradients(loss, layer.trainable_weights + shared.trainable_weights)
for (_, g), p in zip(local, plain[:2]):
    np.testing.assert_allclose(g.numpy(), p.numpy() / SIZE, rtol=1e-6)
for (_, g), p in zip(global_, plain[2:]):
    same_on_all_ranks(g.numpy(), "reduced global gradient")
    np.testing.assert_allclose(g.numpy(), hvd.allreduce(p, name="partial.check").numpy(), rtol=1e-6)
del tape


# --- Keras: model.fit with hvd.DistributedOptimizer == single-process fit on the whole batch -----
def make_model():
    keras.utils.set_random_seed(3)
    ids = keras.Input((2,), dtype="int32")
    feats = keras.Input((FEATURES,))
    emb = keras.layers.Flatten()(keras.layers.Embedding(VOCAB, 4)(ids))
    h = keras.layers.Dense(8, activation="tanh")(keras.layers.Concatenate()([emb, feats]))
    return keras.Model([ids, feats], keras.layers.Dense(3)(h))


def data():
    rng = np.random.default_rng(11)
    n = BATCH * STEPS
    return (rng.integers(0, VOCAB, (n, 2)).astype(np.int32), rng.standard_normal((n, FEATURES)).astype(np.float32),
            rng.integers(0, 3, n).astype(np.int32))


def fit(model, optimizer, arrays, batch_size, epochs=2):
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids, feats, y = arrays
    model.fit([ids, feats], y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return [w for w in model.get_weights()]


def my_rows(arrays):
    per = BATCH // SIZE  # equal shards: Keras averages the loss over each rank's batch
    rows = np.concatenate([np.arange(s * BATCH + RANK * per, s * BATCH + (RANK + 1) * per) for s in range(STEPS)])
    return tuple(a[rows] for a in arrays)


arrays = data()
keras_ref = fit(make_model(), keras.optimizers.SGD(0.2, momentum=0.9), arrays, BATCH)
keras_initial = make_model().get_weights()
keras_configs = [
    ("keras: backward_passes_per_step=2 (averaged), sparse_as_dense",
     {"backward_passes_per_step": 2, "average_aggregated_gradients": True, "sparse_as_dense": True}, 2, (2e-5, 2e-6)),
    ("keras: IndexedSlices allgathered", {}, 1, (2e-5, 2e-6)),
    ("keras: gradient_predivide_factor=2, num_groups=3", {"gradient_predivide_factor": 2.0, "num_groups": 3}, 1,
     (2e-5, 2e-6)),
    ("keras: fp16 compression", {"compression": fp16}, 1, (1e-2, 2e-3)),
    ("keras: all together",
     {"backward_passes_per_step": 2, "average_aggregated_gradients": True, "sparse_as_dense": True,
      "gradient_predivide_factor": 2.0, "num_groups": 3, "compression": fp16}, 2, (1e-2, 2e-3)),
]
for label, kw, micro, (rtol, atol) in keras_configs:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.2, momentum=0.9), **kw)
    assert type(opt).__name__ == "SGD" and isinstance(opt, keras.optimizers.SGD)
    got = fit(make_model(), opt, my_rows(arrays), BATCH // SIZE // micro)
    for i, (g, r, init) in enumerate(zip(got, keras_ref, keras_initial)):
        same_on_all_ranks(g, f"{label}: weight {i}")
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, err_msg=f"{label}: weight {i}")
        assert not np.array_equal(g, init), f"{label}: weight {i} did not train"
    if micro > 1:  # every call advanced iterations, as in Horovod
        assert int(opt.iterations.numpy()) == 2 * STEPS * micro, int(opt.iterations.numpy())
    if RANK == 0:
        print(f"{label}: OK", flush=True)

# hvd.DistributedOptimizer (horovod.tensorflow's) sends Keras optimizers to the Keras wrapper.
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.2, momentum=0.9))
got = fit(make_model(), opt, my_rows(arrays), BATCH // SIZE)
for g, r in zip(got, keras_ref):
    np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)
for bad, exc in (({"op": hvd.Min}, ValueError), ({"op": hvd.Adasum}, NotImplementedError)):
    try:
        hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), **bad)
    except exc:
        pass
    else:
        raise AssertionError(f"expected {exc.__name__} for {bad}")

# TensorFlow 1 optimizers: compute_gradients() returns reduced gradients.
vs = make_vars()
v1 = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
x, ids, y = (tf.constant(a[LO:HI]) for a in batch(0))
pairs = v1.compute_gradients(lambda: loss_sum(vs, x, ids, y) * (SIZE / BATCH), var_list=vs)
with tf.GradientTape() as tape:
    full = loss_sum(vs, *batch(0)) / BATCH
expected = tape.gradient(full, vs)
for (g, v), e in zip(pairs, expected):
    np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(e).numpy(), rtol=1e-5, atol=1e-6)
v1.apply_gradients(pairs)

done("horovod_tf_train")
hvd.shutdown()
