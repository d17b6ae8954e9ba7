"""The small-collective fast path: data in the cycle's allreduce, submitters driving
cycles inline, sleeping through long transfers where ranks outnumber cores (2 and 3 ranks)."""

import pytest

from conftest import run_mpi


@pytest.mark.parametrize("scenario", ["in-cycle", "threads", "order", "per-leaf", "oversubscribed"])
def test_fast_path(nranks, scenario):
    run_mpi("fast_path.py", nranks, scenario, timeout=240)


def test_slots_follow_evictions(nranks):
    run_mpi("fast_path.py", nranks, "evict", timeout=240, env={"JAXCACHE_CACHE_CAPACITY": "4"})


def test_fast_path_without_inline_driving(nranks):
    run_mpi("fast_path.py", nranks, "threads", timeout=240, env={"JAXCACHE_INLINE_SPIN_US": "0"})


@pytest.mark.parametrize("n", [4, 5, 6])
def test_cycle_on_more_ranks(n):
    """The cycle's allreduce is recursive doubling over messages: 4 ranks take two rounds,
    5 and 6 first fold ranks into neighbours. Results against NumPy, the same bits on every rank."""
    for scenario in ("order", "in-cycle"):
        out = run_mpi("fast_path.py", n, scenario, timeout=300).stdout
        assert f"fast_path {scenario}: OK on {n} ranks" in out
