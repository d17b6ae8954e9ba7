"""What every collective checks first, before its operands (the same on every rank)."""

from __future__ import annotations

from .. import process_sets, session
from . import validation


def begin(fn: str, name: str | None, process_set, comm) -> process_sets.Resolved:
    """The runtime runs, the process set the call names (`process_set=` or `comm=`) is
    registered and holds this rank, and `name` is None or a string: the resolved set."""
    session.current(f"jaxcache.{fn}")
    ps = process_sets.resolve(process_set, fn, comm=comm)
    validation.check_name(name, fn)
    return ps
