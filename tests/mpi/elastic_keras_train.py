"""An elastic Keras training job for tests/test_elastic.py (Horovod's keras elastic API).

Linear regression with model.fit: SGD + momentum through jaxcache.tensorflow.keras's
DistributedOptimizer, the state a KerasState(model, epoch=0, batch=0) kept by Horovod's three
callbacks (UpdateEpochStateCallback, UpdateBatchStateCallback, CommitStateCallback: a commit
after every batch and epoch). Each rank reads its shard (rows rank::size) of a fixed dataset.
Rank 0 logs one JSON line per epoch (--logfile); every rank appends its final weights'
digest and its optimizer's step count to its own file (--logdir).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import jaxcache.tensorflow.keras as hvd  # noqa: E402

BATCH = 3  # rows a rank per step
FEATURES = 4


def make_model() -> keras.Model:
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")
    return model


def data(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    return x, (x @ np.arange(1, FEATURES + 1, dtype=np.float32) - 0.25).astype(np.float32)[:, None]


def digest(model: keras.Model) -> str:
    return hashlib.sha256(b"".join(np.asarray(v.numpy()).tobytes() for v in model.variables)).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--logfile", required=True)
    ap.add_argument("--logdir", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches-per-epoch", type=int, default=4)
    ap.add_argument("--exit-schedule", default="{}",
                    help='JSON {"epoch,batch": [ranks]}: those ranks fail there (first job only)')
    args = ap.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    hvd.init()
    generation = int(os.environ.get("JAXCACHE_ELASTIC_GENERATION", "0"))
    schedule = json.loads(args.exit_schedule)
    rank, size = hvd.rank(), hvd.size()
    model = make_model()
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    x, y = data(64)
    shard = tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size])).repeat().batch(BATCH)

    class FailAt(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if generation == 0 and rank in schedule.get(f"{state.epoch},{state.batch}", []):
                raise RuntimeError(f"scheduled failure at epoch {state.epoch} batch {state.batch} on rank {rank}")

    class LogEpoch(keras.callbacks.Callback):
        """First in the list: it sees the epoch's counters before the state callbacks move them."""

        def on_epoch_end(self, epoch, logs=None):
            if rank == 0:
                with open(args.logfile, "a") as f:
                    f.write(json.dumps({"epoch": state.epoch, "batches": state.batch, "size": size,
                                        "generation": generation}) + "\n")

    callbacks = [LogEpoch(), FailAt(),
                 hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state)]

    @hvd.elastic.run
    def train(state):
        state.model.fit(shard, steps_per_epoch=args.batches_per_epoch, epochs=args.epochs - state.epoch,
                        callbacks=callbacks, verbose=0)

    train(state)
    with open(Path(args.logdir) / f"rank{rank}-gen{generation}.jsonl", "a") as f:
        f.write(json.dumps({"digest": digest(model), "iterations": int(model.optimizer.iterations.numpy()),
                            "epoch": state.epoch, "size": size}) + "\n")
    if rank == 0:
        with open(args.logfile, "a") as f:
            f.write(json.dumps({"final": digest(model), "size": size, "generation": generation}) + "\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
