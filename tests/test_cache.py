"""Response cache and bitvector synchronization (2 and 3 ranks)."""

import pytest

from conftest import run_mpi


@pytest.mark.parametrize("mode,capacity", [("default", None), ("small", "4"), ("off", "0")])
def test_cache(nranks, mode, capacity):
    env = {"JAXCACHE_CACHE_CAPACITY": capacity} if capacity else {}
    result = run_mpi("cache.py", nranks, mode, timeout=180, env=env)
    if mode == "small":
        # The first eviction warns once, on rank 0, suggesting a larger capacity.
        assert result.stdout.count("response cache is full") == 1, result.stdout[-3000:]


def test_idle_process_uses_under_2_percent_cpu(nranks):
    out = run_mpi("idle_cpu.py", nranks, "10", timeout=120).stdout
    assert out.count("of a core") == nranks, out
