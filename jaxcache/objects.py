"""Collectives of picklable Python objects, shared by jaxcache, jaxcache.torch and
jaxcache.tensorflow: configurations, checkpoint paths, metrics.

broadcast_object: two small broadcasts (the pickle's length, then its bytes).
allgather_object: one allgather of every rank's pickle; the ranks' byte counts travel
in the negotiation, so differently sized objects need no extra round.

Objects are pickled with cloudpickle when it is installed (lambdas, local classes; Horovod
does the same), else with pickle; either way plain pickle loads them.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from . import process_sets
from . import runtime as _runtime
from . import submit
from .ops import eager, naming, validation
from .protocol import Kind

try:
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle


def _dumps(obj: Any) -> bytes:
    return _pickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _name(name: str | None, kind: str, api: str) -> str:
    validation.check_name(name, api)
    return naming.collective_name(kind, name)[0]


def _broadcast_bytes(name: str, buf: np.ndarray, root: int, process_set: int) -> None:
    submit.submit(Kind.BROADCAST, name, [buf], [buf], submit.codes_of([buf]), root=root,
                  process_set=process_set).wait()


def broadcast(obj: Any, root: int, name: str | None, api: str, process_set=None) -> Any:
    """broadcast_object for the API `api` (its name appears in error messages). `root` is
    a global rank, also with a process set."""
    _runtime.require_initialized(f"jaxcache.{api}")
    ps = process_sets.resolve(process_set, api)
    set_root = process_sets.set_root(root, ps, api)
    base = _name(name, "broadcast_object", api)
    is_root = ps.rank == set_root
    payload = _dumps(obj) if is_root else b""
    length = np.array([len(payload)], np.int64)
    _broadcast_bytes(f"{base}.len", length, set_root, ps.id)
    buf = np.frombuffer(bytearray(payload), np.uint8) if is_root else np.empty(int(length[0]), np.uint8)
    _broadcast_bytes(f"{base}.data", buf, set_root, ps.id)
    return obj if is_root else pickle.loads(buf.tobytes())


def allgather(obj: Any, name: str | None, api: str, process_set=None) -> list:
    """allgather_object for the API `api` (a list in the set's rank order)."""
    _runtime.require_initialized(f"jaxcache.{api}")
    ps = process_sets.resolve(process_set, api)
    base = _name(name, "allgather_object", api)
    payload = np.frombuffer(_dumps(obj), np.uint8)
    (data,), rows = eager.run_allocated(Kind.ALLGATHER, base, [payload], ps.size,
                                        process_set=ps.id)
    out, offset = [], 0
    for n in rows:
        out.append(pickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return out


def broadcast_object(obj: Any = None, root: int = 0, *, name: str | None = None,
                     process_set=None, comm=None) -> Any:
    """`root`'s picklable `obj`, on every rank (of `process_set`; `root` is a global rank;
    other ranks' `obj` is ignored)."""
    return broadcast(obj, root, name, "broadcast_object", process_sets.pick(process_set, comm, "broadcast_object"))


def allgather_object(obj: Any, *, name: str | None = None, process_set=None, comm=None) -> list:
    """Every rank's picklable `obj`, as a list in rank order (of `process_set`), on every rank."""
    return allgather(obj, name, "allgather_object", process_sets.pick(process_set, comm, "allgather_object"))
