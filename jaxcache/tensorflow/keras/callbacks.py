"""Horovod's Keras callbacks: broadcast at the start, averaged metrics, learning-rate schedules."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from ... import runtime as _runtime
from ...compat import unsupported
from .. import functions, ops
from ..gradients import var_key
from ...protocol import Kind


# The Keras in use: `tf.keras` is Keras 3 (keras.callbacks.Callback itself), or tf_keras under
# TF_USE_LEGACY_KERAS=1, whose model.fit accepts only its own callbacks.
_Callback = tf.keras.callbacks.Callback


def _variables(obj) -> list:
    v = getattr(obj, "variables", [])
    return list(v() if callable(v) else v)


class BroadcastGlobalVariablesCallback(_Callback):
    """Gives every rank root_rank's model (and optimizer) variables.

    The model's variables are broadcast when training begins (so the first step already
    starts from identical weights) and, as Horovod does, the model's and the optimizer's
    after the first batch (once the optimizer has created its state).
    """

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._local: set = set()
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        for var in local_variables:
            if not hasattr(var, "assign"):
                raise ValueError("jaxcache BroadcastGlobalVariablesCallback: local_variables must be "
                                 f"variables, got {type(var).__name__}")
            self.register_local_var(var)

    def register_local_var(self, var) -> None:
        """This variable is not broadcast."""
        self._local.add(var_key(var))

    def _broadcast(self, name: str, variables) -> None:
        variables = [v for v in variables if var_key(v) not in self._local]
        if variables:
            functions.broadcast_variables(variables, root_rank=self.root_rank, name=name)

    def on_train_begin(self, logs=None):
        self._broadcast("keras.broadcast/begin/model", _variables(self.model))

    def on_train_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        self._broadcast("keras.broadcast/model", _variables(self.model))
        if getattr(self.model, "optimizer", None) is not None:
            self._broadcast("keras.broadcast/optimizer", _variables(self.model.optimizer))
        self.broadcast_done = True


class MetricAverageCallback(_Callback):
    """Averages the epoch's metrics (logs) over all ranks at the end of every epoch.

    Put it before callbacks that read the metrics (ReduceLROnPlateau, TensorBoard, ...).
    """

    def __init__(self, device=""):
        super().__init__()
        self.device = device

    def _average_in_place(self, logs) -> None:
        if logs is None:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.isreal(v))
        if not keys:
            return
        values = np.array([float(logs[k]) for k in keys], np.float64)
        averaged = ops.submit_eager(Kind.ALLREDUCE, ["keras.metric_average/" + ",".join(keys)],
                                    [[_tensor(values)]], op=0, postscale=1.0 / _runtime.size())[0][0]
        for k, v in zip(keys, averaged.tolist()):
            logs[k] = v

    def on_epoch_end(self, epoch, logs=None):
        self._average_in_place(logs)


def _tensor(values: np.ndarray):
    import tensorflow as tf
    return tf.constant(values)


def _to_float(value) -> float:
    if hasattr(value, "numpy"):  # a tf.Variable / tensor (tf_keras) or a Keras 3 variable
        return float(value.numpy())
    return float(keras.ops.convert_to_numpy(value))


def _get_lr(optimizer) -> float:
    return _to_float(optimizer.learning_rate)


def _set(optimizer, attr: str, value: float) -> None:
    current = getattr(optimizer, attr)
    if hasattr(current, "assign"):
        current.assign(value)
    else:
        setattr(optimizer, attr, value)


class LearningRateScheduleCallback(_Callback):
    """Sets the learning rate to initial_lr * multiplier between start_epoch and end_epoch.

    multiplier: a constant (applied as multiplier ** (epoch - start_epoch)) or a function of
    the epoch. staircase=True adjusts at the start of each epoch (integer epoch); False at the
    start of each batch (epoch + batch / steps_per_epoch). momentum_correction scales the
    optimizer's momentum by new_lr / old_lr for the adjusted batch (only where the optimizer
    reads its momentum when the step runs: a variable, or a Python float under run_eagerly).
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("jaxcache LearningRateScheduleCallback: parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.restore_momentum = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self) -> int:
        if self.params.get("steps"):
            return self.params["steps"]
        if self.params.get("samples") and self.params.get("batch_size"):
            return self.params["samples"] // self.params["batch_size"]
        raise ValueError(f"jaxcache {type(self).__name__}: could not detect the number of steps per "
                         "epoch; pass steps_per_epoch=")

    def _adjust_learning_rate(self, epoch) -> None:
        opt = self.model.optimizer
        old_lr = _get_lr(opt)
        new_lr = self.initial_lr * self.multiplier(epoch)
        _set(opt, "learning_rate", new_lr)
        momentum = getattr(opt, "momentum", None)
        if self.momentum_correction and momentum is not None and old_lr:
            self.restore_momentum = _to_float(momentum)
            _set(opt, "momentum", self.restore_momentum * new_lr / old_lr)

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum is not None:
            _set(self.model.optimizer, "momentum", self.restore_momentum)
            self.restore_momentum = None

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warm-up: lr = initial_lr / size at the start, initial_lr after warmup_epochs.

    lr(epoch) = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1), adjusted every
    batch (Goyal et al., "Accurate, Large Minibatch SGD", 2017).
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None,
                 verbose=0):
        def multiplier(epoch):
            # Shifted by one batch so that the last batch of the warm-up reaches initial_lr.
            epoch += 1.0 / self.steps_per_epoch
            size = _runtime.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and _runtime.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_get_lr(self.model.optimizer):g}.")


BestModelCheckpoint = unsupported.cls(
    "jaxcache.tensorflow.keras.callbacks.BestModelCheckpoint",
    "Keras 3's ModelCheckpoint needs its file path at construction (Horovod's Spark estimator "
    "filled it in later); use keras.callbacks.ModelCheckpoint(path, save_best_only=True) on rank 0",
    base=tf.keras.callbacks.ModelCheckpoint)
