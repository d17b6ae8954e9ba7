"""Horovod's TensorFlow 2 Keras MNIST example, running on jaxcache.

A rewrite of horovod/examples/tensorflow2/tensorflow2_keras_mnist.py (Horovod 0.28.1). Two
things are jaxcache-specific and marked `# jaxcache:`: the import, and the data --
scikit-learn's bundled 8x8 digits (scaled to [0, 1] like MNIST's pixels; the convolutional
model takes them as they are), so that nothing is downloaded. Everything else is written
against Horovod's API; the epochs and steps are arguments so that a test can run it briefly.

    mpirun -np 2 python examples/horovod_keras_mnist.py [--epochs 24] [--steps-per-epoch 500]
    python examples/horovod_keras_mnist.py          # one process
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import jaxcache.tensorflow.keras as hvd  # noqa: E402  jaxcache: instead of horovod.tensorflow.keras


def digits(train: bool):
    """jaxcache: scikit-learn's digits (no download) as (images[..., 1] in [0, 1], labels)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.images))
    cut = len(order) * 4 // 5
    rows = order[:cut] if train else order[cut:]
    return (data.images[rows, :, :, np.newaxis] / 16.0).astype(np.float32), data.target[rows].astype(np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description="Keras MNIST example (Horovod API on jaxcache)")
    parser.add_argument("--epochs", type=int, default=24)
    parser.add_argument("--steps-per-epoch", type=int, default=500, help="global steps per epoch")
    parser.add_argument("--checkpoint-dir", default=None, help="rank 0 saves a checkpoint per epoch here")
    args = parser.parse_args()

    hvd.init()

    # One GPU per process, when there are GPUs.
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    images, labels = digits(train=True)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    dataset = dataset.repeat().shuffle(10000).batch(128)

    model = tf.keras.Sequential([
        tf.keras.Input(images.shape[1:]),
        tf.keras.layers.Conv2D(32, [3, 3], activation="relu"),
        tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])

    # Every rank processes a batch per step: scale the learning rate with the number of ranks.
    scaled_lr = 0.001 * hvd.size()
    opt = tf.keras.optimizers.Adam(scaled_lr)
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt,
                  metrics=["accuracy"])

    callbacks = [
        # Start every rank from rank 0's initial weights (or the checkpoint it restored).
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Average the metrics over the ranks at the end of every epoch; keep it before any
        # callback that reads metrics (ReduceLROnPlateau, TensorBoard, ...).
        hvd.callbacks.MetricAverageCallback(),
        # Starting at lr * size hurts the final accuracy: ramp lr -> lr * size over the first
        # three epochs (Goyal et al., https://arxiv.org/abs/1706.02677).
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
    ]
    # Only rank 0 writes checkpoints, so that ranks do not overwrite each other's files.
    if hvd.rank() == 0 and args.checkpoint_dir:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(
            os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")))

    verbose = 2 if hvd.rank() == 0 else 0  # only rank 0 prints progress
    # The steps per epoch are shared between the ranks.
    model.fit(dataset, steps_per_epoch=args.steps_per_epoch // hvd.size(), callbacks=callbacks,
              epochs=args.epochs, verbose=verbose)

    test_images, test_labels = digits(train=False)
    loss, accuracy = model.evaluate(test_images, test_labels, verbose=0)
    accuracy = float(hvd.allreduce(accuracy, name="test_accuracy"))  # identical weights: same everywhere
    if hvd.rank() == 0:
        print(f"test accuracy: {accuracy:.4f} on {hvd.size()} rank(s)", flush=True)


if __name__ == "__main__":
    main()
