"""Process API: init, shutdown, rank and size, counters (barrier: ops/barrier.py)."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time

from mpi4py import MPI

from typing import Sequence

from . import allocator as _allocator
from . import config as _config
from . import process_sets as _process_sets
from . import session as _session
from ._ext import ext
from .errors import raise_for_status

# Process-wide, not per session: the exit handler is registered once, the allocator's
# report (what it did at import) logged once.
_atexit_registered = False
_allocator_logged = False


def init(comm: MPI.Comm | None = None, process_sets: Sequence | None = None) -> None:
    """Starts the background runtime over a duplicate of `comm` (default COMM_WORLD).

    Collective over `comm`: every rank must call it. Rank 0's JAXCACHE_* settings are used
    on every rank. `process_sets` (ProcessSets, rank lists or communicators) are then
    registered in order, as by `add_process_set` on every rank. Calling it again while the
    runtime is running does nothing; after `shutdown()` it starts a new runtime.
    """
    global _atexit_registered, _allocator_logged
    if ext.running():
        return
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"jaxcache.init: comm must be an mpi4py communicator, got {type(comm).__name__}")
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError(
            "jaxcache needs MPI initialized with MPI_THREAD_MULTIPLE (its background thread calls "
            "MPI); do not lower mpi4py.rc.thread_level before importing mpi4py.MPI"
        )
    cfg = _config.synchronize(comm, _settings_everywhere(comm))
    ext.init(MPI._addressof(comm), cfg.as_dict())
    horovod = _config.horovod_variables_used()
    if horovod and comm.rank == 0:  # rank 0's settings are the job's
        print("jaxcache: applying Horovod's settings where the JAXCACHE_* variable is unset: "
              + ", ".join(horovod), file=sys.stderr, flush=True)
    if not _allocator_logged:
        _allocator_logged = True
        logging.getLogger("jaxcache").info("malloc settings (jaxcache.allocator): %s",
                                           _allocator.report())
    stale = _session.peek()  # a runtime that stopped without shutdown() here
    if stale is not None:
        _process_sets.ended(stale)
    _process_sets.started(_session.begin(cfg, comm), ext.size())
    for ps in process_sets or ():
        _process_sets.add_process_set(ps)
    if not _atexit_registered:
        # Registered after mpi4py's own exit handler, so it runs before MPI is finalized.
        atexit.register(_shutdown_at_exit)
        _atexit_registered = True


def _settings_everywhere(comm: MPI.Comm) -> _config.Config:
    """This rank's settings; a bad JAXCACHE_* value on any rank raises on every rank (the
    others would otherwise wait for it in the collective start-up)."""
    try:
        mine, problem = _config.from_env(), None
    except ValueError as e:
        mine, problem = None, str(e)
    problems = comm.allgather(problem)
    bad = [f"rank {r}: {p}" for r, p in enumerate(problems) if p is not None]
    if bad:
        raise ValueError("jaxcache.init: invalid settings, nothing started: " + "; ".join(bad))
    return mine


def shutdown() -> None:
    """Stops the runtime once every rank has called shutdown(), like MPI_Finalize.

    Waits at most JAXCACHE_SHUTDOWN_TIMEOUT seconds (default 30) for the other ranks; then
    it stops anyway and says which ranks never came. Collectives still pending then fail
    with ShutdownError on every rank. Also runs at interpreter exit.
    """
    problem = ext.shutdown(_session.settings().shutdown_timeout_s)
    state = _session.peek()
    if state is not None:
        _process_sets.ended(state)
        _session.end()
    if problem:
        print(f"jaxcache: warning: rank {_rank_or_unknown()}: {problem}", file=sys.stderr, flush=True)


def _rank_or_unknown():
    try:
        return ext.rank()
    except RuntimeError:
        return "?"


def _shutdown_at_exit() -> None:
    if not MPI.Is_finalized():
        shutdown()
    # Threads still waiting on collectives were woken by the shutdown; let them leave the
    # extension before Python finalizes (a thread ended inside C++ aborts the process).
    deadline = time.monotonic() + 2.0
    while ext.waiters() > 0 and time.monotonic() < deadline:
        time.sleep(0.005)




def settings() -> _config.Config:
    """The settings the runtime runs with (rank 0's, agreed at init()); the defaults when
    it is not running."""
    return _session.settings()


JOIN_NAME = "jaxcache.join"


def join() -> int:
    """Declares that this rank has run out of data; returns once every rank has joined.

    Until then this rank keeps taking part in the other ranks' allreduce, grouped_allreduce,
    reducescatter and (eager) allgather: it contributes zeros to sums (the identity to min,
    max and prod) and no rows to an allgather; "average" still divides by the size (Horovod's
    and torch DDP's rule; `JAXCACHE_JOIN_AVERAGE_BY_SIZE=0`: by the ranks that have not
    joined). A broadcast from a joined root, an alltoall, and an allgather under jit fail
    on every rank while some rank is joined. Returns, on every rank, the rank that joined
    last. Call it after this rank's last collective has completed (e.g. after
    jax.block_until_ready on the last step's outputs); collectives submitted on this rank
    while it is joined fail.
    """
    require_initialized("jaxcache.join()")
    handle = ext.join(JOIN_NAME)
    status, message = handle.wait()
    raise_for_status(status, message)
    return int(handle.value())


def is_initialized() -> bool:
    return bool(ext.running())


def require_initialized(what: str = "this operation") -> None:
    _session.current(what)


def query_function(name: str, read, doc: str, require=None):
    """A function `name`() that returns read() once require(name) passed (default: the
    runtime runs, else RuntimeError); the bridges make Horovod's query functions with it."""
    def query():
        if require is None:
            _session.current(f"jaxcache.{name}()")
        else:
            require(name)
        return read()

    query.__name__ = query.__qualname__ = name
    query.__doc__ = doc
    return query


rank = query_function("rank", ext.rank, "This process's rank in the job (in init()'s communicator).")
size = query_function("size", ext.size, "The number of ranks in the job.")
local_rank = query_function("local_rank", ext.local_rank, "This process's rank among the job's ranks on its node.")
local_size = query_function("local_size", ext.local_size, "The number of the job's ranks on this node.")


def start_timeline(path: str | os.PathLike, mark_cycles: bool = False) -> None:
    """Starts (or restarts, into a new file) the Chrome-trace timeline while the runtime runs.

    Like JAXCACHE_TIMELINE, only the job's rank 0 writes the file (truncated first); on the
    other ranks this checks its arguments and does nothing. Every collective of every process
    set from now on is recorded; `mark_cycles` also marks each background cycle. Raises
    OSError on rank 0 when the file cannot be created.
    """
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise ValueError(f"jaxcache.start_timeline: path must be a non-empty str, got {path!r}")
    if not isinstance(mark_cycles, bool):
        raise TypeError(f"jaxcache.start_timeline: mark_cycles must be a bool, got {mark_cycles!r}")
    require_initialized("jaxcache.start_timeline()")
    problem = ext.start_timeline(path, mark_cycles)
    if problem:
        raise OSError(f"jaxcache.start_timeline: {problem}")


def stop_timeline() -> None:
    """Stops the timeline started by start_timeline() or JAXCACHE_TIMELINE; the file is a
    complete JSON array. Does nothing when no timeline is being written."""
    require_initialized("jaxcache.stop_timeline()")
    ext.stop_timeline()


def _last_runtime(call, what: str):
    # Counters stay readable after shutdown(), until the next init().
    try:
        return call()
    except RuntimeError:
        raise RuntimeError(f"jaxcache was never initialized: call jaxcache.init() before {what}") from None


def _set_id(process_set, fn: str) -> int:
    if process_set is None:
        return 0
    return _process_sets.resolve(process_set, fn).id


def stats(process_set=None) -> dict[str, int | float]:
    """Counters of this rank's runtime (of one process set; default the global one) since
    init or the last reset_stats()."""
    set_id = _set_id(process_set, "stats")
    return dict(_last_runtime(lambda: ext.stats(set_id), "jaxcache.stats()"))


def reset_stats(process_set=None) -> None:
    set_id = _set_id(process_set, "reset_stats")
    _last_runtime(lambda: ext.reset_stats(set_id), "jaxcache.reset_stats()")


def cache_layout(process_set=None) -> dict[str, int]:
    """The response cache's {name: bit} (of one process set); identical on its ranks."""
    set_id = _set_id(process_set, "cache_layout")
    return dict(_last_runtime(lambda: ext.cache_layout(set_id), "jaxcache.cache_layout()"))
