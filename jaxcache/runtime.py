"""Process API: init, shutdown, rank and size, counters."""

from __future__ import annotations

import atexit

from mpi4py import MPI

from . import config as _config
from ._ext import ext

_atexit_registered = False


def init(comm: MPI.Comm | None = None) -> None:
    """Starts the background runtime over a duplicate of `comm` (default COMM_WORLD).

    Collective over `comm`: every rank must call it. Calling it again while the
    runtime is running does nothing; after `shutdown()` it starts a new runtime.
    """
    global _atexit_registered
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
    cfg = _config.from_env()
    ext.set_max_mpi_count(cfg.max_mpi_count)
    ext.init(MPI._addressof(comm), cfg.as_dict())
    if not _atexit_registered:
        atexit.register(_shutdown_at_exit)
        _atexit_registered = True


def shutdown() -> None:
    """Stops the runtime. Pending and later collectives on every rank fail with ShutdownError."""
    ext.shutdown(30.0)


def _shutdown_at_exit() -> None:
    if not MPI.Is_finalized():
        ext.shutdown(10.0)


def is_initialized() -> bool:
    return bool(ext.running())


def require_initialized(what: str = "this operation") -> None:
    if not ext.running():
        raise RuntimeError(
            f"jaxcache is not initialized (or has been shut down): call jaxcache.init() before {what}"
        )


def rank() -> int:
    require_initialized("jaxcache.rank()")
    return ext.rank()


def size() -> int:
    require_initialized("jaxcache.size()")
    return ext.size()


def local_rank() -> int:
    require_initialized("jaxcache.local_rank()")
    return ext.local_rank()


def local_size() -> int:
    require_initialized("jaxcache.local_size()")
    return ext.local_size()


_INT_STATS = {"negotiation_seconds", "execution_seconds"}


def _last_runtime(call, what: str):
    # Counters stay readable after shutdown(), until the next init().
    try:
        return call()
    except RuntimeError:
        raise RuntimeError(f"jaxcache was never initialized: call jaxcache.init() before {what}") from None


def stats() -> dict:
    """Counters of this rank's runtime since init or the last reset_stats()."""
    raw = _last_runtime(ext.stats, "jaxcache.stats()")
    return {k: (v if k in _INT_STATS else int(v)) for k, v in raw.items()}


def reset_stats() -> None:
    _last_runtime(ext.reset_stats, "jaxcache.reset_stats()")


def cache_layout() -> dict[str, int]:
    """The response cache's {name: bit}; identical on every rank."""
    return dict(_last_runtime(ext.cache_layout, "jaxcache.cache_layout()"))
