"""The state of one runtime session: what init() creates and shutdown() drops.

Everything the Python layer keeps about a running runtime -- the agreed settings, the job
communicator, the registered process sets, the node layout, the automatic names in flight --
lives in one `Session`; `current()` is the
only way to reach it, so nothing survives from one init() to the next by accident.
"""

from __future__ import annotations

import dataclasses
from mpi4py import MPI

from . import config
from ._ext import ext
from .ops.naming import InFlight


@dataclasses.dataclass
class Session:
    settings: config.Config
    job_comm: MPI.Comm
    # The registered jaxcache.ProcessSet objects by id (process_sets.py keeps them here).
    process_sets: dict[int, object] = dataclasses.field(default_factory=dict)
    next_set_id: int = 1
    # (cross_rank, cross_size, is_homogeneous): learned collectively by the bridges' init().
    topology: tuple[int, int, bool] | None = None
    # Names of the torch bridge's handles not yet synchronized (naming.InFlight): automatic
    # ones, and explicit ones, which stay taken until then (Horovod's rule, also when the
    # request completed inside the submitting call). A new session starts with none,
    # whatever handles an earlier one left unsynchronized.
    in_flight: InFlight = dataclasses.field(default_factory=InFlight)


_current: Session | None = None


def begin(settings: config.Config, job_comm: MPI.Comm) -> Session:
    """A new session (init()): it replaces the previous one."""
    global _current
    _current = Session(settings, job_comm)
    return _current


def end() -> None:
    """Drops the session (shutdown())."""
    global _current
    _current = None


def peek() -> Session | None:
    """The session, or None before init() and after shutdown()."""
    return _current


def current(what: str = "this operation") -> Session:
    """The running session; RuntimeError naming `what` when the runtime is not running."""
    if _current is None or not ext.running():
        raise RuntimeError(
            f"jaxcache is not initialized (or has been shut down): call jaxcache.init() before {what}"
        )
    return _current


def settings() -> config.Config:
    """The settings of the running session; the defaults when none runs."""
    return _current.settings if _current is not None else config.Config()


def average_divisor(size: int, contributors):
    """What an average divides by when `contributors` of a set of `size` ranks have not
    joined: the size (Horovod's rule), or with JAXCACHE_JOIN_AVERAGE_BY_SIZE=0 the
    contributors (a number or a tensor). The runtime applies the same rule to dense
    tensors (Operations::AverageDivisor)."""
    return size if settings().join_average_by_size else contributors
