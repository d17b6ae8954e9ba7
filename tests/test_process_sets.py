"""Process sets (docs/control_plane.md, "Process sets"): collectives on subsets of ranks,
each set negotiated and cached on its own, on 3 and 4 ranks (4 oversubscribe the CI's
2 cores). The multi-host variant is tests/multihost (one set per host + the global set)."""

import re

import pytest

from conftest import run_mpi


@pytest.fixture(params=[3, 4], ids=["np3", "np4"])
def set_ranks(request) -> int:
    return request.param


@pytest.mark.parametrize("scenario", ["disjoint", "overlapping", "mismatch", "lifecycle"])
def test_process_sets(set_ranks, scenario):
    out = run_mpi("process_sets.py", set_ranks, scenario, timeout=240).stdout
    assert f"process-sets-{scenario}: OK on {set_ranks} ranks" in out, out[-3000:]


def test_steady_state_costs_one_bitvector_allreduce_per_cycle_on_the_set(set_ranks):
    out = run_mpi("process_sets.py", set_ranks, "disjoint", timeout=240).stdout
    # Printed by set A's ranks over 100 warm steps, and by the ranks outside it meanwhile.
    rows = re.findall(r"set A steady state over 100 steps: cycles=(\d+) bitvector_syncs=(\d+) "
                      r"coordinator_rounds=(\d+) cache_hits=(\d+) mpi_calls=(\d+)", out)
    assert len(rows) == 2, out[-3000:]
    for cycles, syncs, rounds, hits, mpi_calls in (map(int, r) for r in rows):
        assert cycles >= 100 and syncs == cycles and rounds == 0 and hits == 100, rows
        assert mpi_calls == 0, rows  # small tensors ride in the cycle's allreduce itself
    assert "idle set B meanwhile" in out, out[-3000:]


def test_a_stall_in_one_set_does_not_hold_up_another(set_ranks):
    out = run_mpi("process_sets.py", set_ranks, "stall", timeout=240,
                  env={"JAXCACHE_STALL_SHUTDOWN_TIME": "2"}).stdout
    assert "set B finished 100 allreduces" in out, out[-3000:]
    assert "process-sets-stall: OK" in out, out[-3000:]
