"""`import jaxcache.tensorflow.keras as hvd` with Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1):
DistributedOptimizer under model.fit with the broadcast and metric-average callbacks leaves
bitwise-identical weights on every rank; one step's reduced gradient is the NumPy average of
the ranks' gradients (and is reduced once, not twice); backward_passes_per_step=2 updates every
second step with the accumulated gradients; save / load_model round trip."""

from __future__ import annotations

import os
import tempfile

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported: tf.keras is tf_keras
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _util import COMM, assert_close, done, same_on_all_ranks  # noqa: E402

import jaxcache.tensorflow.keras as hvd  # noqa: E402
from jaxcache.tensorflow.keras.optimizer import _DistributedKeras2  # noqa: E402

keras = tf.keras
assert keras.__name__.startswith("tf_keras"), f"tf.keras is {keras.__name__}, not tf_keras"
hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
assert (RANK, SIZE) == (COMM.rank, COMM.size)
N_IN, N_OUT, ROWS = 5, 3, 8


def data(rank: int, step: int = 0):
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.standard_normal((ROWS, N_IN)).astype(np.float32)
    y = rng.standard_normal((ROWS, N_OUT)).astype(np.float32)
    return x, y


def numpy_grads(w, b, x, y):
    """Gradients of mean((x @ w + b - y) ** 2) in float64."""
    w, b, x, y = (np.asarray(a, np.float64) for a in (w, b, x, y))
    err = x @ w + b - y
    scale = 2.0 / err.size
    return scale * x.T @ err, scale * err.sum(axis=0)


def linear(seed: int):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.layers.Dense(N_OUT, input_shape=(N_IN,))])
    return model


def loss_of(model, x, y):
    return lambda: tf.reduce_mean(tf.square(model(x) - y))


# -- 1. the optimizer wraps tf_keras optimizers (new and legacy), keeping the class name ------
for make in (lambda: keras.optimizers.SGD(0.1), lambda: keras.optimizers.legacy.SGD(0.1),
             lambda: keras.optimizers.Adam(0.01), lambda: keras.optimizers.legacy.Adam(0.01)):
    base = make()
    opt = hvd.DistributedOptimizer(base)
    assert isinstance(opt, _DistributedKeras2) and isinstance(opt, type(base)), type(opt).__mro__
    assert type(opt).__name__ == type(base).__name__
    copy = type(opt).from_config(opt.get_config())
    assert isinstance(copy, _DistributedKeras2) and copy.get_config() == opt.get_config()
print(f"rank {RANK}: wrapping: OK", flush=True)

# -- 2. one step against NumPy, Average and Sum, compute_gradients and apply_gradients paths ---
for op, legacy in ((hvd.Average, False), (hvd.Sum, False), (hvd.Average, True), (hvd.Sum, True)):
    model = linear(7)  # same initial weights on every rank
    w0, b0 = (v.numpy() for v in model.trainable_variables)
    per_rank = [numpy_grads(w0, b0, *data(r)) for r in range(SIZE)]
    combine = (lambda a: np.mean(a, axis=0)) if op is hvd.Average else (lambda a: np.sum(a, axis=0))
    expect_w = combine([g[0] for g in per_rank])
    expect_b = combine([g[1] for g in per_rank])
    lr = 0.5
    sgd = keras.optimizers.legacy.SGD(lr) if legacy else keras.optimizers.SGD(lr)
    opt = hvd.DistributedOptimizer(sgd, op=op)
    x, y = data(RANK)
    # (a) the gradient computation returns reduced gradients
    pairs = opt.compute_gradients(loss_of(model, x, y), model.trainable_variables)
    assert_close(pairs[0][0].numpy().astype(np.float64), expect_w, f"reduced dW ({op}, legacy={legacy})",
                 rtol=1e-5, atol=1e-6)
    assert_close(pairs[1][0].numpy().astype(np.float64), expect_b, f"reduced db ({op}, legacy={legacy})",
                 rtol=1e-5, atol=1e-6)
    # (b) minimize (compute + apply) reduces once: with Sum, twice would multiply by SIZE
    opt.minimize(loss_of(model, x, y), model.trainable_variables)
    w1, b1 = (v.numpy() for v in model.trainable_variables)
    assert_close(w1.astype(np.float64), w0 - lr * expect_w, f"minimize W ({op}, legacy={legacy})",
                 rtol=1e-5, atol=1e-5)
    assert_close(b1.astype(np.float64), b0 - lr * expect_b, f"minimize b ({op}, legacy={legacy})",
                 rtol=1e-5, atol=1e-5)
    # (c) apply_gradients with a tape's (local) gradients reduces them, inside a tf.function too
    model2 = linear(7)
    opt2 = hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(lr) if legacy else keras.optimizers.SGD(lr),
                                    op=op)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model2(x) - y))
        grads = tape.gradient(loss, model2.trainable_variables)
        opt2.apply_gradients(zip(grads, model2.trainable_variables))

    step()
    w2, b2 = (v.numpy() for v in model2.trainable_variables)
    assert_close(w2.astype(np.float64), w0 - lr * expect_w, f"apply_gradients W ({op}, legacy={legacy})",
                 rtol=1e-5, atol=1e-5)
    assert_close(b2.astype(np.float64), b0 - lr * expect_b, f"apply_gradients b ({op}, legacy={legacy})",
                 rtol=1e-5, atol=1e-5)
    same_on_all_ranks(w1, "W after minimize")
    same_on_all_ranks(w2, "W after apply_gradients")
print(f"rank {RANK}: one step against NumPy: OK", flush=True)

# -- 3. backward_passes_per_step=2 (eager and tf.function; averaged and summed) --------------
for average, in_function in ((True, False), (False, True)):
    model = linear(11)
    w0, b0 = (v.numpy() for v in model.trainable_variables)
    lr = 0.25
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr), backward_passes_per_step=2,
                                   average_aggregated_gradients=average)
    assert opt._agg_helper is not None

    def one(step_no):
        x, y = data(RANK, step_no)
        opt.minimize(loss_of(model, x, y), model.trainable_variables)

    run = tf.function(one) if in_function else one
    run(0)
    w, b = (v.numpy() for v in model.trainable_variables)
    assert np.array_equal(w, w0) and np.array_equal(b, b0), "weights changed after the first of 2 passes"
    assert int(opt.iterations.numpy()) == 1 and int(opt._agg_helper.counter.numpy()) == 1
    run(1)
    # the weights did not move between the 2 passes, so both gradients are at w0
    gs = [[numpy_grads(w0, b0, *data(r, s)) for s in (0, 1)] for r in range(SIZE)]
    acc_w = [gs[r][0][0] + gs[r][1][0] for r in range(SIZE)]
    acc_b = [gs[r][0][1] + gs[r][1][1] for r in range(SIZE)]
    div = 2.0 if average else 1.0
    expect_w, expect_b = np.mean(acc_w, axis=0) / div, np.mean(acc_b, axis=0) / div
    w, b = (v.numpy() for v in model.trainable_variables)
    what = f"backward_passes_per_step=2 (average={average}, tf.function={in_function})"
    assert_close(w.astype(np.float64), w0 - lr * expect_w, f"W, {what}", rtol=1e-5, atol=1e-5)
    assert_close(b.astype(np.float64), b0 - lr * expect_b, f"b, {what}", rtol=1e-5, atol=1e-5)
    assert int(opt.iterations.numpy()) == 2 and int(opt._agg_helper.counter.numpy()) == 0
    run(2)
    assert int(opt.iterations.numpy()) == 3 and int(opt._agg_helper.counter.numpy()) == 1
    same_on_all_ranks(model.trainable_variables[0].numpy(), f"W, {what}")
print(f"rank {RANK}: backward_passes_per_step=2: OK", flush=True)


# -- 4. model.fit with the callbacks: identical weights, averaged metrics ---------------------
def classifier(seed: int):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.layers.Dense(8, activation="tanh", input_shape=(6,)),
                             keras.layers.Dense(3)])


def fit_data():
    rng = np.random.default_rng(50 + RANK)  # every rank its own rows
    x = rng.standard_normal((32, 6)).astype(np.float32)
    return x, ((x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 1).astype(np.int32))


def compile_(model, opt):
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


x, y = fit_data()
for make, k in ((lambda: keras.optimizers.SGD(0.05, momentum=0.9), 1),
                (lambda: keras.optimizers.legacy.Adam(0.01), 1),
                (lambda: keras.optimizers.Adam(0.01), 2)):
    model = classifier(100 + RANK)  # different initial weights per rank: the callback broadcasts
    opt = hvd.DistributedOptimizer(make(), backward_passes_per_step=k)
    compile_(model, opt)
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    for i, w in enumerate(model.get_weights()):
        same_on_all_ranks(w, f"weight {i} after fit ({type(opt).__name__}, k={k})")
    for key in ("loss", "accuracy"):
        same_on_all_ranks(np.asarray(history.history[key]), f"averaged {key}")
    assert np.all(np.isfinite(history.history["loss"]))
    if k == 2:
        assert int(opt.iterations.numpy()) == 8 and int(opt._agg_helper.counter.numpy()) == 0
print(f"rank {RANK}: model.fit with callbacks: OK", flush=True)

# -- 5. save / load_model round trip (.keras and .h5) ---------------------------------------
with tempfile.TemporaryDirectory() as tmp:
    for suffix in (".keras", ".h5"):
        path = os.path.join(tmp, f"model{suffix}")
        model.save(path)
        loaded = hvd.load_model(path)
        assert isinstance(loaded.optimizer, _DistributedKeras2), type(loaded.optimizer).__mro__
        assert type(loaded.optimizer).__name__ == "Adam"
        for a, b in zip(model.get_weights(), loaded.get_weights()):
            assert np.array_equal(a, b)
        plain = keras.models.load_model(path)  # loads without jaxcache too (same class name)
        assert not isinstance(plain.optimizer, _DistributedKeras2)
        loaded.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                   callbacks=[hvd.callbacks.MetricAverageCallback()])
        for i, w in enumerate(loaded.get_weights()):
            same_on_all_ranks(w, f"weight {i} after fit of the loaded model ({suffix})")
print(f"rank {RANK}: save/load_model: OK", flush=True)

done("keras2_train")
