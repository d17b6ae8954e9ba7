"""``elastic.run``: the training function's wrapper on every worker.

On entry it resumes from the newest commit any host holds (or syncs the initial state from
rank 0 on a first start) and, after a reset, runs the state's reset callbacks. While the
function runs, a ``HostsUpdatedInterrupt`` (raised on every rank at the same commit) ends
this job cleanly so that the driver restarts it on the new hosts; any other exception is
reported to the driver, which blacklists this worker's host and restarts the job from the
last commit. Outside the driver (plain mpirun) the function just runs.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from typing import Any, Callable

from . import link, protocol
from .exceptions import HostsUpdatedInterrupt
from .state import State, _rank, host_name


def _start(state: State) -> None:
    if not state._resume():
        state.sync()
    else:
        state.save()
    if link.generation() > 0:
        state.on_reset()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates ``func(state, *args, **kwargs)``, Horovod's ``hvd.elastic.run``."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        driver = link.get(_rank(), host_name())
        _start(state)
        try:
            result = func(state, *args, **kwargs)
        except HostsUpdatedInterrupt:
            if driver is None:
                raise
            driver.end(protocol.RESET)
            _flush()
            raise SystemExit(0) from None  # every rank leaves here; the driver restarts the job
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            if driver is None:
                raise
            if isinstance(e, SystemExit) and not e.code:
                driver.end(protocol.DONE)
                raise
            driver.end(protocol.FAILED, error=f"{type(e).__name__}: {e}")
            traceback.print_exc()
            _flush()
            _abort_job()
        if driver is not None:
            driver.end(protocol.DONE)
        return result

    return wrapper


def _abort_job() -> None:
    """Ends this worker and, through MPI_Abort, the whole job at once: an orderly exit
    would wait for its peers in the runtime's shutdown, and Hydra lets the others run
    on (blocked in their next collective) after a rank merely exits with an error."""
    try:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.COMM_WORLD.Abort(1)
    finally:
        os._exit(1)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - best effort before leaving
            pass
