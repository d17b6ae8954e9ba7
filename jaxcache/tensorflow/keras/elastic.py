"""horovod.tensorflow.keras.elastic on jaxcache's elastic core (jaxcache.elastic).

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state)]   # last: it commits the updated counters

    @hvd.elastic.run
    def train(state):
        state.model.fit(data, steps_per_epoch=steps, epochs=epochs - state.epoch, callbacks=callbacks)

A reset restarts the job's processes; ``run`` loads the newest commit (weights, optimizer,
counters) into the new processes before ``train`` runs again.
"""

from __future__ import annotations

import tensorflow as tf

from ..elastic import HorovodInternalError, HostsUpdatedInterrupt, ObjectState, State, TensorFlowKerasState, run
from .callbacks import _Callback


class KerasState(TensorFlowKerasState):
    """Horovod's KerasState: TensorFlowKerasState with `tf.keras`'s backend."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)


class CommitStateCallback(_Callback):
    """Commits `state` after every `batches_per_commit` batches and at the end of each epoch."""

    def __init__(self, state: State, batches_per_commit: int = 1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        # Counted from each (re)start of training, the same on every rank.
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining <= 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(_Callback):
    """Keeps `state.batch` = the batches finished in the current epoch (0 at its end),
    counting those finished before a reset in the same epoch."""

    def __init__(self, state: State):
        super().__init__()
        self.state = state
        self._done_before = 0

    def on_epoch_begin(self, epoch, logs=None):
        # Non-zero only in the first epoch after a reset inside an epoch.
        self._done_before = self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = self._done_before + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0
        self._done_before = 0


class UpdateEpochStateCallback(_Callback):
    """Keeps `state.epoch` = the epochs finished, across resets (Keras counts each fit's
    epochs from 0)."""

    def __init__(self, state: State):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["run", "KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "State", "ObjectState", "HorovodInternalError",
           "HostsUpdatedInterrupt"]
