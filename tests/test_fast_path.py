"""The small-collective fast path: data in the cycle's allreduce, submitters driving
cycles inline (2 and 3 ranks)."""

import pytest

from conftest import run_mpi


@pytest.mark.parametrize("scenario", ["in-cycle", "threads"])
def test_fast_path(nranks, scenario):
    run_mpi("fast_path.py", nranks, scenario, timeout=240)


def test_slots_follow_evictions(nranks):
    run_mpi("fast_path.py", nranks, "evict", timeout=240, env={"JAXCACHE_CACHE_CAPACITY": "4"})


def test_fast_path_without_inline_driving(nranks):
    run_mpi("fast_path.py", nranks, "threads", timeout=240, env={"JAXCACHE_INLINE_SPIN_US": "0"})
