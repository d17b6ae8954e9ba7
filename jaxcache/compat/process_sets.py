"""Horovod's ProcessSet API. Only the global set works until process sets land (issue 14)."""

from __future__ import annotations

from .. import runtime as _runtime
from . import pending


class ProcessSet:
    """A set of ranks a collective runs on (Horovod's hvd.ProcessSet).

    ProcessSet(ranks) or ProcessSet(mpi4py_comm). Until process sets land (issue 14) only
    `global_process_set` can be passed to collectives; registering others raises
    NotImplementedError.
    """

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        if _is_comm(ranks_or_comm):
            self.mpi_comm = ranks_or_comm
            return
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            ranks = None
        if ranks is None or any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
            raise ValueError("jaxcache.ProcessSet: pass a list of int ranks or an mpi4py "
                             f"communicator, got {ranks_or_comm!r}")
        self.ranks = ranks

    def _is_global(self) -> bool:
        return self.process_set_id == 0

    def size(self) -> int | None:
        if self.process_set_id is None:
            return None
        if self._is_global():
            return _runtime.size()
        pending.process_sets("ProcessSet.size")

    def rank(self) -> int | None:
        if self.process_set_id is None:
            return None
        if self._is_global():
            return _runtime.rank()
        pending.process_sets("ProcessSet.rank")

    def included(self) -> bool | None:
        if self._is_global():
            return _runtime.is_initialized()
        if self.ranks is None:
            return None
        return _runtime.rank() in self.ranks

    def __str__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__


def _is_comm(x) -> bool:
    try:
        from mpi4py import MPI
    except ImportError:  # pragma: no cover - mpi4py is a dependency
        return False
    return isinstance(x, MPI.Comm)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def set_global_ranks(size: int) -> None:
    global_process_set.ranks = list(range(size))


def check(process_set, fn: str) -> None:
    """Accepts the global set; other sets are pending (issue 14)."""
    if process_set is global_process_set or (isinstance(process_set, ProcessSet)
                                             and process_set.process_set_id == 0):
        return
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"jaxcache.{fn}: process_set must be a ProcessSet (e.g. global_process_set), "
                        f"got {type(process_set).__name__}")
    pending.process_sets(fn)


def add_process_set(process_set) -> ProcessSet:
    """Registers a process set on every rank (pending: issue 14)."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    pending.process_sets("add_process_set")


def remove_process_set(process_set: ProcessSet) -> bool:
    """Horovod's rule: False for an unregistered set or the global set; others pending."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"jaxcache.remove_process_set: expected a ProcessSet, got "
                        f"{type(process_set).__name__}")
    if process_set.process_set_id in (None, 0):
        return False
    pending.process_sets("remove_process_set")
