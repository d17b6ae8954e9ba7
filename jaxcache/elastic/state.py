"""Elastic state: what training keeps through a reset.

``commit()`` saves the state in memory (``restore()`` goes back to it), keeps a copy on
every host of the job (the host's local rank 0 writes it; see store.py), then asks whether
the hosts changed (``check_host_updates()``). When the driver restarts the job (a worker
lost, hosts added or removed), ``elastic.run`` loads the newest copy any host holds and
broadcasts it, so every worker resumes from the same commit.

A state class says how to save, restore and sync itself (Horovod's ``State``), and, to
survive a restart, how to turn its saved state into a picklable snapshot and back
(``_snapshot`` / ``_load_snapshot``). ``ObjectState`` (and the JAX ``State`` of
``jaxcache.elastic``) keeps keyword values: Python objects and pytrees of JAX arrays.
"""

from __future__ import annotations

import copy
import os
import socket
import sys
import time
import warnings
from typing import Any, Callable, Iterable

from . import link, store
from .exceptions import HostsUpdatedInterrupt


def host_name() -> str:
    return os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()


def _rank() -> int:
    import jaxcache

    return jaxcache.rank()


def _host_local_rank() -> int:
    """The rank among this launcher host's workers (HOROVOD_LOCAL_RANK where the launcher
    set it: two names of one machine are two hosts), else the node-local rank."""
    value = os.environ.get("HOROVOD_LOCAL_RANK")
    if value is not None:
        return int(value)
    import jaxcache

    return jaxcache.local_rank()


def _broadcast(obj: Any, root: int, name: str) -> Any:
    from .. import objects

    return objects.broadcast(obj, root, name, "elastic")


def _allgather(obj: Any, name: str) -> list:
    from .. import objects

    return objects.allgather(obj, name, "elastic")


def hosts_updated_everywhere() -> bool:
    """Whether the driver wants the hosts changed, agreed by every rank (rank 0 asks it).
    Outside the driver, False on every rank without a collective."""
    if not os.environ.get(link.protocol.DRIVER):
        return False
    rank = _rank()
    updated = None
    if rank == 0:
        drv = link.get(rank, host_name())
        updated = drv.hosts_updated() if drv is not None else False
    return bool(_broadcast(updated, 0, "jaxcache.elastic.hosts_updated"))


class State:
    """Horovod's elastic ``State``: subclasses define ``save``, ``restore`` and ``sync``."""

    def __init__(self, bcast_object: Callable | None = None, get_rank: Callable | None = None):
        self._bcast_object = bcast_object or (lambda obj, root_rank=0: _broadcast(obj, root_rank, "jaxcache.elastic.sync"))
        self._get_rank = get_rank or _rank
        self._reset_callbacks: list[Callable[[], Any]] = []
        self._commits = 0  # the sequence number of the last persisted commit
        self._warned_unpersisted = False
        self.last_commit_seconds = 0.0   # what the last commit() cost on this rank
        self.last_commit_bytes = 0       # bytes this rank wrote (0 unless it keeps its host's copy)

    # --- Horovod's API -------------------------------------------------------
    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], Any]]) -> None:
        """Functions called (in order) after every reset, e.g. to scale a learning rate."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float = 0.0, update_res: Any = None) -> None:
        """Horovod's notification hook; jaxcache asks the driver at each commit instead."""

    def commit(self) -> None:
        """Saves the state (in memory and on every host), then checks for host updates:
        raises HostsUpdatedInterrupt on every rank when the job is to move."""
        start = time.perf_counter()
        self.save()
        self._persist()
        self.last_commit_seconds = time.perf_counter() - start
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raises HostsUpdatedInterrupt on every rank when the driver has found hosts added
        or removed (a collective: every rank calls it at the same point)."""
        if hosts_updated_everywhere():
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Horovod's hook before the state is re-synchronised after a reset."""

    # --- surviving a restart ----------------------------------------------------
    def _snapshot(self) -> Any:
        """The saved state as a picklable object; None if this class cannot persist."""
        return None

    def _load_snapshot(self, snapshot: Any) -> None:
        raise NotImplementedError

    def _persist(self) -> None:
        root = link.state_dir()
        if root is None:
            return
        self._commits += 1
        if _host_local_rank() != 0:
            return
        snapshot = self._snapshot()
        if snapshot is None:
            if not self._warned_unpersisted:
                self._warned_unpersisted = True
                warnings.warn(f"jaxcache.elastic: {type(self).__name__} defines no _snapshot(): its "
                              "commits are kept in memory only and a restarted job starts from the "
                              "initial state", stacklevel=3)
            return
        self.last_commit_bytes = store.write(store.host_dir(root, host_name()), self._commits,
                                             {"commits": self._commits, "state": snapshot})

    def _resume(self) -> bool:
        """At the start of a job: every rank takes the newest commit any host holds
        (broadcast from the lowest rank that has it). False when there is none."""
        root_dir = link.state_dir()
        if root_dir is None:
            return False
        mine = -1
        found = None
        if _host_local_rank() == 0:
            found = store.latest(store.host_dir(root_dir, host_name()))
            if found is not None:
                mine = found[0]
        seqs = _allgather(mine, "jaxcache.elastic.resume.seq")
        best = max(seqs)
        if best < 0:
            return False
        source = seqs.index(best)
        payload = store.read(found[1]) if self._get_rank() == source else None
        payload = _broadcast(payload, source, "jaxcache.elastic.resume.state")
        self._load_snapshot(payload["state"])
        self._commits = payload["commits"]
        return True


# --- values: Python objects and pytrees of JAX arrays ---------------------------


class _JaxLeaf:
    """A JAX array in a snapshot (as NumPy; loaded back as a JAX array)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __reduce__(self):
        return (_JaxLeaf, (self.value,))


def _is_jax_array(x) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Array)


def _tree_map(fn, value, is_leaf=None):
    import jax  # jaxcache's collectives load it anyway

    return jax.tree_util.tree_map(fn, value, is_leaf=is_leaf)


def _copy(value: Any) -> Any:
    """A copy that later in-place changes cannot reach; JAX arrays (immutable) are shared."""
    return _tree_map(lambda x: x if _is_jax_array(x) else copy.deepcopy(x), value)


def _to_host(value: Any) -> Any:
    import numpy as np

    return _tree_map(lambda x: _JaxLeaf(np.asarray(x)) if _is_jax_array(x) else x, value)


def _from_host(value: Any) -> Any:
    import jax.numpy as jnp

    return _tree_map(lambda x: jnp.asarray(x.value) if isinstance(x, _JaxLeaf) else x, value,
                     is_leaf=lambda x: isinstance(x, _JaxLeaf))


class ObjectState(State):
    """State of keyword values: ``ObjectState(epoch=0, batch=0, params=...)``; each is an
    attribute. Values are Python objects or pytrees of arrays (JAX arrays are kept by
    reference in memory, since they are immutable, and as NumPy in the snapshot)."""

    def __init__(self, bcast_object: Callable | None = None, get_rank: Callable | None = None, **kwargs):
        super().__init__(bcast_object, get_rank)
        self._saved_state = kwargs
        self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, _copy(value))

    def save(self) -> None:
        self._saved_state = {name: _copy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            synced = self._bcast_object(_to_host(self._saved_state))
            self._saved_state = _from_host(synced)
            self._set_attrs()

    def _snapshot(self) -> Any:
        return _to_host(self._saved_state)

    def _load_snapshot(self, snapshot: Any) -> None:
        self._saved_state = _from_host(snapshot)
        self._set_attrs()
