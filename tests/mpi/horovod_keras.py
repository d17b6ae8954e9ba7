"""`import jaxcache.tensorflow.keras as hvd`: the callbacks do what Horovod documents
(broadcast at the start, averaged metrics, warm-up and schedules), load_model wraps the
optimizer, the value helpers, and the pending/unsupported names raise."""

from __future__ import annotations

import os
import re
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _util import COMM, done, same_on_all_ranks  # noqa: E402

import jaxcache.tensorflow.keras as hvd  # noqa: E402
from jaxcache.tensorflow.keras.optimizer import _DistributedKeras  # noqa: E402

assert not hvd.is_initialized()
hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
import jaxcache.tensorflow as hvd_tf  # noqa: E402  (the Keras module re-exports the same functions)

for fname in ("size", "local_size", "cross_size", "rank", "local_rank", "cross_rank", "mpi_threads_supported",
              "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
              "cuda_built", "rocm_built", "is_initialized"):
    assert getattr(hvd, fname)() == getattr(hvd_tf, fname)(), fname
assert (hvd.rank(), hvd.size()) == (COMM.rank, COMM.size)
assert hvd.global_process_set is hvd_tf.global_process_set and hvd.remove_process_set(hvd.global_process_set) is False
assert hvd.Compression.fp16 is hvd_tf.Compression.fp16
PER, STEPS = 4, 5  # rows per rank per step, steps per epoch


def make_model(seed: int):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])


def data():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((PER * SIZE * STEPS, 6)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 1).astype(np.int32)


def mine(a):
    rows = np.concatenate([np.arange(s * PER * SIZE + RANK * PER, s * PER * SIZE + (RANK + 1) * PER)
                           for s in range(STEPS)])
    return a[rows]


def compile_(model, opt):
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs, self.lrs, self.momenta = [], [], []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))

    def on_train_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        self.lrs.append(float(keras.ops.convert_to_numpy(opt.learning_rate)))
        self.momenta.append(float(opt.momentum))


x, y = data()
# --- BroadcastGlobalVariablesCallback: every rank starts from rank 0's weights ---------------------
ref = make_model(0)
compile_(ref, keras.optimizers.SGD(0.1, momentum=0.9))
ref.fit(x, y, batch_size=PER * SIZE, epochs=2, shuffle=False, verbose=0)
model = make_model(100 + RANK)  # different initial weights on every rank
assert SIZE == 1 or not np.allclose(COMM.allgather(model.get_weights()[0])[0], COMM.allgather(model.get_weights()[0])[-1])
compile_(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)))
raw, averaged = Recorder(), Recorder()
history = model.fit(mine(x), mine(y), batch_size=PER, epochs=2, shuffle=False, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), raw,
                               hvd.callbacks.MetricAverageCallback(), averaged])
# rank 0's initial weights were used everywhere: equal to single-process training from them
ref0 = make_model(100)
compile_(ref0, keras.optimizers.SGD(0.1, momentum=0.9))
ref0.fit(x, y, batch_size=PER * SIZE, epochs=2, shuffle=False, verbose=0)
for i, (w, r) in enumerate(zip(model.get_weights(), ref0.get_weights())):
    same_on_all_ranks(w, f"broadcast weights {i}")
    np.testing.assert_allclose(w, r, rtol=2e-5, atol=2e-6, err_msg=f"weight {i}")
for name in ("loss", "accuracy"):
    for epoch in range(2):
        every = COMM.allgather(raw.epochs[epoch][name])
        np.testing.assert_allclose(averaged.epochs[epoch][name], np.mean(every), rtol=1e-12)
        np.testing.assert_allclose(history.history[name][epoch], np.mean(every), rtol=1e-12)
        same_on_all_ranks(np.float64(averaged.epochs[epoch][name]), f"averaged {name}")
if SIZE > 1:
    assert len({round(v["loss"], 12) for v in COMM.allgather(raw.epochs[0])}) > 1, "ranks' raw losses should differ"

# local_variables are left alone
m = make_model(200 + RANK)
cb = hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[m.layers[1].bias])
cb.set_model(m)
cb.on_train_begin()
same_on_all_ranks(m.layers[0].kernel.numpy(), "broadcast kernel")
assert SIZE == 1 or len({float(v[0]) for v in COMM.allgather(m.layers[1].bias.numpy() + RANK)}) == SIZE

# --- LearningRateWarmupCallback: lr/size -> lr over warmup_epochs, adjusted every batch ----------
initial_lr, warmup = 0.1, 2
model = make_model(0)
compile_(model, hvd.DistributedOptimizer(keras.optimizers.SGD(initial_lr, momentum=0.9)))
rec = Recorder()
model.fit(mine(x), mine(y), batch_size=PER, epochs=3, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.LearningRateWarmupCallback(initial_lr, warmup_epochs=warmup), rec])
expected = []
for epoch in range(3):
    for batch in range(STEPS):
        if epoch < warmup:
            e = epoch + batch / STEPS + 1 / STEPS
            expected.append(initial_lr / SIZE * (e * (SIZE - 1) / warmup + 1))
        else:
            expected.append(expected[-1])
np.testing.assert_allclose(rec.lrs, expected, rtol=1e-6)
np.testing.assert_allclose(expected[warmup * STEPS - 1], initial_lr, rtol=1e-12)
np.testing.assert_allclose([e["lr"] for e in rec.epochs], [expected[(k + 1) * STEPS - 1] for k in range(3)], rtol=1e-6)
if SIZE > 1:  # momentum correction: scaled by new/old lr during the adjusted batch, restored after
    np.testing.assert_allclose(rec.momenta[0], 0.9 * expected[0] / initial_lr, rtol=1e-6)
assert float(model.optimizer.momentum) == 0.9

# --- LearningRateScheduleCallback: staircase constant multiplier, and a function -----------------
model = make_model(0)
compile_(model, keras.optimizers.SGD(0.2))
rec = Recorder()
model.fit(mine(x), mine(y), batch_size=PER, epochs=4, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.LearningRateScheduleCallback(0.2, 0.5, start_epoch=1, end_epoch=3), rec])
per_epoch = [rec.lrs[e * STEPS] for e in range(4)]
np.testing.assert_allclose(per_epoch, [0.2, 0.2, 0.1, 0.1], rtol=1e-6)
model = make_model(0)
compile_(model, keras.optimizers.SGD(0.2))
rec = Recorder()
model.fit(mine(x), mine(y), batch_size=PER, epochs=1, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.LearningRateScheduleCallback(0.2, lambda e: 1 + e, staircase=False), rec])
np.testing.assert_allclose(rec.lrs, [0.2 * (1 + b / STEPS) for b in range(STEPS)], rtol=1e-6)

# --- load_model wraps the saved optimizer; plain Keras loads the same file -----------------------
model = make_model(0)
compile_(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5)))
model.fit(mine(x), mine(y), batch_size=PER, epochs=1, shuffle=False, verbose=0)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, f"model{RANK}.keras")
    model.save(path)
    loaded = hvd.load_model(path)
    assert isinstance(loaded.optimizer, _DistributedKeras) and type(loaded.optimizer).__name__ == "SGD"
    assert abs(float(loaded.optimizer.momentum) - 0.5) < 1e-9
    plain = keras.models.load_model(path)
    assert not isinstance(plain.optimizer, _DistributedKeras)
for w, v in zip(loaded.get_weights(), model.get_weights()):
    np.testing.assert_array_equal(w, v)
loaded.fit(mine(x), mine(y), batch_size=PER, epochs=1, shuffle=False, verbose=0)
same_on_all_ranks(loaded.get_weights()[0], "loaded model trains in step")

# --- value helpers --------------------------------------------------------------------------------
np.testing.assert_allclose(hvd.allreduce(float(RANK), op=hvd.Sum).numpy(), sum(range(SIZE)))
np.testing.assert_allclose(hvd.allreduce([1.0, RANK]).numpy(), [1.0, (SIZE - 1) / 2])
assert hvd.allgather([RANK]).numpy().tolist() == list(range(SIZE))
assert hvd.allgather([RANK] * (RANK + 1)).numpy().tolist() == [r for r in range(SIZE) for _ in range(r + 1)]
rows = [float(r) for r in range(2 * SIZE + 1)]  # reducescatter: rank r keeps its rows of the average
lo = sum(2 + (1 if q < 1 else 0) for q in range(RANK))
np.testing.assert_allclose(hvd.reducescatter([v + RANK for v in rows]).numpy(),
                           [v + (SIZE - 1) / 2 for v in rows][lo:lo + 2 + (1 if RANK < 1 else 0)])
np.testing.assert_allclose(hvd.reducescatter([v + RANK for v in rows], op=hvd.Sum, name="keras.rs").numpy(),
                           [SIZE * v + sum(range(SIZE)) for v in rows][lo:lo + 2 + (1 if RANK < 1 else 0)])
assert hvd.broadcast([RANK, 7], root_rank=SIZE - 1).numpy().tolist() == [SIZE - 1, 7]
assert (hvd.Average, hvd.Sum) == (0, 1)


def raises(exc, pattern, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert re.search(pattern, str(e)), str(e)
    else:
        raise AssertionError(f"expected {exc.__name__} ({pattern})")


raises(NotImplementedError, r"legacy_opts", hvd.load_model, "x.keras", legacy_opts=True)
raises(RuntimeError, r"eager", hvd.broadcast_global_variables, 0)
raises(NotImplementedError, r"BestModelCheckpoint is not supported", hvd.callbacks.BestModelCheckpoint)
solo = hvd.add_process_set([0])  # the same process sets as jaxcache.tensorflow's
assert solo.ranks == [0] and hvd.remove_process_set(solo) is True

done("horovod_keras")
hvd.shutdown()
