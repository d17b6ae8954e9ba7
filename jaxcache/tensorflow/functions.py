"""Whole-model helpers: broadcast_variables, object collectives, TF1 global variables."""

from __future__ import annotations

import tensorflow as tf

from .. import objects
from ..compat import unsupported
from ..compat.process_sets import global_process_set
from . import ops
from ..protocol import Kind


@ops._api
def broadcast_variables(variables, root_rank=0, process_set=global_process_set, inplace=False, *,
                        name: str = "tf.broadcast_variables"):
    """Assigns `root_rank`'s value to every variable (one request per variable, all in flight),
    on the ranks of `process_set` (`root_rank` is a global rank).

    `inplace` is accepted for Horovod compatibility (values are assigned either way).
    """
    ps = ops.set_of(process_set, "broadcast_variables")
    root = ops.set_root(root_rank, ps, "broadcast_variables")
    if isinstance(variables, (tf.Variable, tf.Tensor)):
        raise TypeError("jaxcache.tensorflow.broadcast_variables: pass a list of variables, "
                        "e.g. model.variables")
    variables = list(variables)
    values = []
    for i, v in enumerate(variables):
        if not hasattr(v, "assign"):
            raise TypeError(f"jaxcache.tensorflow.broadcast_variables: variables[{i}] is a "
                            f"{type(v).__name__}, not a variable")
        values.append(ops.as_tensor(v, "broadcast_variables", f"variable {getattr(v, 'name', i)!r}"))
    if not values:
        return None
    names = [f"{name}/{i}" for i in range(len(values))]
    outs = ops.run(Kind.BROADCAST, names, [[t] for t in values], root=root, process_set=ps)
    assigns = [v.assign(o) for v, (o,) in zip(variables, outs)]
    return None if tf.executing_eagerly() else tf.group(*assigns)


def _no_session(session, fn: str) -> None:
    if session is not None:
        raise NotImplementedError(f"jaxcache.tensorflow.{fn}: session= (TensorFlow 1 sessions) is not "
                                  "supported; call it eagerly")


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """`root_rank`'s picklable `obj` on every rank of `process_set` (jaxcache.objects, shared by
    every bridge; `root_rank` is a global rank)."""
    _no_session(session, "broadcast_object")
    return objects.broadcast(obj, root_rank, name or "tf.broadcast_object", "tensorflow.broadcast_object",
                             process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function obj -> root_rank's obj (Horovod builds its graph once; here it is a closure)."""
    _no_session(session, "broadcast_object_fn")
    ops.set_root(root_rank, ops.set_of(process_set, "broadcast_object_fn"), "broadcast_object_fn")
    base = name or "tf.broadcast_object_fn"

    def _bcast(obj):
        return objects.broadcast(obj, root_rank, base, "tensorflow.broadcast_object_fn", process_set)

    return _bcast


def allgather_object(obj, session=None, name=None, process_set=global_process_set) -> list:
    """Every rank's picklable `obj`, as a list in rank order (of `process_set`; objects may
    differ in size)."""
    _no_session(session, "allgather_object")
    return objects.allgather(obj, name or "tf.allgather_object", "tensorflow.allgather_object",
                             process_set)


def broadcast_global_variables(root_rank):
    """TensorFlow 1's global variables from root_rank (graph mode only, as in Horovod)."""
    if tf.executing_eagerly():
        raise RuntimeError("jaxcache.tensorflow.broadcast_global_variables() does not support eager "
                           "execution (as in Horovod); use broadcast_variables(model.variables, "
                           "root_rank) instead")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


BroadcastGlobalVariablesHook = unsupported.cls(
    "jaxcache.tensorflow.BroadcastGlobalVariablesHook",
    "TensorFlow 1 session hooks (tf.estimator) were removed from TensorFlow 2.16; use "
    "broadcast_variables(model.variables, root_rank=0) after building the model, or "
    "jaxcache.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback")
