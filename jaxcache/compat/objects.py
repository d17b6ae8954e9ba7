"""broadcast_object / allgather_object for every bridge: pickled bytes through the runtime."""

from __future__ import annotations

import pickle

import numpy as np

from .. import runtime as _runtime
from ..ops import validation
from . import host

try:  # Horovod pickles with cloudpickle (lambdas, local classes); use it when present.
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle


def dumps(obj) -> bytes:
    return _pickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes):
    return pickle.loads(data)


def broadcast_object(obj, root_rank: int, name: str, fn: str):
    """root_rank's `obj` on every rank: its length, then its bytes (two broadcasts)."""
    _runtime.require_initialized(f"jaxcache.{fn}")
    root = validation.check_root(root_rank, _runtime.size(), fn)
    validation.check_name(name, fn)
    is_root = _runtime.rank() == root
    payload = dumps(obj) if is_root else b""
    length = host.broadcast_(f"{name}.len", np.array([len(payload)], np.int64), root)
    data = np.frombuffer(payload, np.uint8).copy() if is_root else np.empty(int(length[0]), np.uint8)
    if data.size:
        host.broadcast_(f"{name}.data", data, root)
    return obj if is_root else loads(data.tobytes())


def allgather_object(obj, name: str, fn: str) -> list:
    """Every rank's `obj`, in rank order: lengths, then bytes padded to the longest (two allgathers)."""
    _runtime.require_initialized(f"jaxcache.{fn}")
    validation.check_name(name, fn)
    payload = dumps(obj)
    lengths = host.allgather(f"{name}.len", np.array(len(payload), np.int64)).tolist()
    padded = np.zeros(max(lengths), np.uint8)
    padded[:len(payload)] = np.frombuffer(payload, np.uint8)
    rows = host.allgather(f"{name}.data", padded)
    return [loads(rows[r, :n].tobytes()) for r, n in enumerate(lengths)]
