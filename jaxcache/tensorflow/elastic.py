"""horovod.tensorflow.elastic on jaxcache's elastic core (jaxcache.elastic; docs/elastic.md).

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...; state.commit()

TensorFlow 2, eagerly. A reset restarts the job's processes; ``run`` loads the newest commit
into the new processes' variables. The variables' values are kept as NumPy arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..elastic import run
from ..elastic.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from ..elastic.state import ObjectState, State
from .functions import _no_session, broadcast_variables


def _values(variables) -> list[np.ndarray]:
    # A copy: a NumPy view of a variable could follow its later in-place updates.
    return [np.array(v.numpy(), copy=True) for v in variables]


def _assign(variables, values, what: str) -> None:
    if len(variables) != len(values):
        raise ValueError(f"jaxcache.tensorflow.elastic: the saved state has {len(values)} {what}, "
                         f"this process has {len(variables)}; build the same model (and optimizer) "
                         "on every restart")
    for var, value in zip(variables, values):
        var.assign(value)


def _variables_of(obj) -> list:
    """`obj.variables`: a property in Keras 3 and tf_keras optimizers, a method in legacy ones."""
    if obj is None:
        return []
    v = obj.variables
    return list(v() if callable(v) else v)


class TensorFlowState(ObjectState):
    """Horovod's TensorFlowState: a list of variables plus keyword values (ObjectState).
    Eager only: pass the variables (TensorFlow 2 has no global-variables collection), and no
    session."""

    def __init__(self, variables=None, session=None, **kwargs):
        _no_session(session, "elastic.TensorFlowState")
        if variables is None:
            raise ValueError("jaxcache.tensorflow.elastic.TensorFlowState: pass the variables to keep, "
                             "e.g. model.variables (eager TensorFlow has no global variables)")
        self.variables = list(variables)
        self.session = None
        self._saved_values = _values(self.variables)
        super().__init__(**kwargs)

    def save(self) -> None:
        self._saved_values = _values(self.variables)
        super().save()

    def restore(self) -> None:
        _assign(self.variables, self._saved_values, "variables")
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self.variables, root_rank=0, name="tf.elastic.sync")
        self._saved_values = _values(self.variables)
        super().sync()

    def _snapshot(self) -> Any:
        return {"variables": self._saved_values, "values": super()._snapshot()}

    def _load_snapshot(self, snapshot: Any) -> None:
        self._saved_values = snapshot["variables"]
        _assign(self.variables, self._saved_values, "variables")
        super()._load_snapshot(snapshot["values"])


def _build_optimizer(optimizer, model) -> None:
    """Creates the optimizer's variables (slots) now: a restarted process loads a commit
    taken after training steps before its optimizer has taken any."""
    if optimizer is None:
        return
    if hasattr(optimizer, "_create_all_weights"):  # tf_keras's legacy OptimizerV2 (idempotent)
        optimizer._create_all_weights(model.trainable_variables)
    elif not getattr(optimizer, "built", getattr(optimizer, "_built", False)):  # Keras 3 / tf_keras
        optimizer.build(model.trainable_variables)


class TensorFlowKerasState(ObjectState):
    """Horovod's TensorFlowKerasState: a built Keras model's variables and its optimizer's
    (`optimizer`, else the model's compiled one), plus keyword values (ObjectState).
    The optimizer's variables are created at construction (an unbuilt optimizer is built for
    the model's trainable variables) so that a commit can be loaded before the first step."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if not getattr(model, "built", True):
            raise ValueError("jaxcache.tensorflow.elastic: the model must be built first "
                             "(model.build(input_shape) or call it once)")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self.backend = backend
        _build_optimizer(self.optimizer, model)
        self._save_model()
        super().__init__(**kwargs)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._load_model()
        super().restore()

    def sync(self) -> None:
        broadcast_variables(_variables_of(self.model), root_rank=0, name="tf.elastic.sync.model")
        broadcast_variables(_variables_of(self.optimizer), root_rank=0, name="tf.elastic.sync.optimizer")
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._saved_model = _values(_variables_of(self.model))
        self._saved_optimizer = _values(_variables_of(self.optimizer))

    def _load_model(self) -> None:
        _assign(_variables_of(self.model), self._saved_model, "model variables")
        _assign(_variables_of(self.optimizer), self._saved_optimizer, "optimizer variables")

    def _snapshot(self) -> Any:
        return {"model": self._saved_model, "optimizer": self._saved_optimizer,
                "values": super()._snapshot()}

    def _load_snapshot(self, snapshot: Any) -> None:
        self._saved_model, self._saved_optimizer = snapshot["model"], snapshot["optimizer"]
        self._load_model()
        super()._load_snapshot(snapshot["values"])


__all__ = ["run", "TensorFlowKerasState", "TensorFlowState", "ObjectState", "State",
           "HorovodInternalError", "HostsUpdatedInterrupt"]
