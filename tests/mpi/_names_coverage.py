"""Bookkeeping for horovod_names_*.py: which documented Horovod names had their behaviour
checked, stubs for showing that the checks fail without the real names, and the report."""

from __future__ import annotations

import json
import os
import sys
import traceback

from mpi4py import MPI

COMM = MPI.COMM_WORLD
NODE = COMM.Split_type(MPI.COMM_TYPE_SHARED)  # this node's ranks


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

    def check_process_api(self, S: str, hvd, homogeneous: bool = True):
        """init, the queries and the build flags of module `hvd`; returns the set given to init."""
        assert hvd.is_initialized() is False
        raises(ValueError, hvd.size)
        assert hvd.mpi_enabled() is False
        first = hvd.ProcessSet([0])
        hvd.init(process_sets=[first])
        assert hvd.is_initialized() is True
        assert first.process_set_id not in (None, 0) and first.ranks == [0], "init(process_sets=)"
        self.covered(S, "init")
        assert type(hvd.size()) is int and hvd.size() == COMM.size
        assert type(hvd.rank()) is int and hvd.rank() == COMM.rank
        assert (hvd.local_rank(), hvd.local_size()) == (NODE.rank, NODE.size)
        local_ranks = COMM.allgather(NODE.rank)
        peers = [r for r in range(COMM.size) if local_ranks[r] == NODE.rank]
        assert (hvd.cross_rank(), hvd.cross_size()) == (peers.index(COMM.rank), len(peers))
        self.covered(S, "size", "rank", "local_rank", "local_size", "cross_rank", "cross_size")
        if homogeneous:
            assert hvd.is_homogeneous() is (len(set(COMM.allgather(NODE.size))) == 1)
            self.covered(S, "is_homogeneous")
        assert hvd.mpi_threads_supported() is True and hvd.mpi_enabled() is True and hvd.mpi_built() is True
        assert hvd.gloo_enabled() is False and hvd.gloo_built() is False
        assert type(hvd.nccl_built()) is int and hvd.nccl_built() == 0
        assert hvd.ddl_built() is False and hvd.ccl_built() is False
        assert hvd.cuda_built() is False and hvd.rocm_built() is False
        self.covered(S, "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
                "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built")
        return first

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
