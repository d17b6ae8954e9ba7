"""Bookkeeping for horovod_names_*.py: which documented Horovod names had their behaviour
checked, stubs for showing that the checks fail without the real names, and the report."""

from __future__ import annotations

import json
import os
import sys
import traceback

from mpi4py import MPI

COMM = MPI.COMM_WORLD


class Coverage:
    def __init__(self, sections: dict):
        """sections: docs/horovod.md section heading -> the jaxcache module standing for it."""
        self.sections = sections
        self.names: dict[str, list[str]] = {s: [] for s in sections}
        # HOROVOD_NAMES_STUB=section:name[,section:name...] replaces those names by a stub
        # that returns None (the checks look every name up on its module when they use it).
        for entry in filter(None, os.environ.get("HOROVOD_NAMES_STUB", "").split(",")):
            section, name = entry.split(":")
            assert hasattr(sections[section], name), f"{section} has no {name} to stub"
            setattr(sections[section], name, lambda *a, **k: None)
            print(f"rank {COMM.rank}: {section}.{name} replaced by a stub", flush=True)

    def covered(self, section: str, *names: str) -> None:
        """Records that `names` of `section` passed their checks (called after the checks)."""
        for name in names:
            assert name not in self.names[section], f"{section}.{name} covered twice"
            self.names[section].append(name)

    def run(self, checks) -> None:
        """Runs checks(); a failure on any rank prints the traceback and ends the job. Then rank 0
        prints `COVERED {json}` once every rank has covered the same names."""
        try:
            checks()
        except BaseException:
            print(f"rank {COMM.rank}: FAILED\n{traceback.format_exc()}", flush=True)
            sys.stderr.flush()
            COMM.Abort(1)  # MPICH's returns once it has asked mpirun to end the job
            os._exit(1)
        assert COMM.allgather(self.names) == [self.names] * COMM.size, "the ranks covered different names"
        if COMM.rank == 0:
            print("COVERED " + json.dumps(self.names), flush=True)


def raises(exc, fn, *args, **kwargs):
    """Calls fn, asserts that it raises `exc`, returns the exception."""
    try:
        fn(*args, **kwargs)
    except exc as e:
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc.__name__}")
