"""Exactly-once guarantees (docs/reliability.md): names under transformations, repeated
names, one set of settings, validated world size, fault injection at every point, no spin
while waiting, collective shutdown and barrier, interruptible waits (2 and 3 ranks)."""

import pytest

from conftest import run_mpi


@pytest.mark.parametrize("scenario", ["transforms", "async", "queue", "resize"])
def test_exactly_once(nranks, scenario):
    run_mpi("exactly_once.py", nranks, scenario, timeout=240)


def test_bridges_refuse_explicit_duplicates():
    run_mpi("exactly_once.py", 2, "bridge-duplicates", timeout=180)


def test_rank0_settings_win(nranks):
    out = run_mpi("exactly_once.py", nranks, "settings", timeout=120).stdout
    assert "JAXCACHE_STALL_SHUTDOWN_TIME=7.0 differs from rank 0's 0.0" in out, out[-3000:]
    assert "JAXCACHE_MAX_MPI_COUNT=3 differs from rank 0's 2147483647" in out, out[-3000:]
    assert out.count("differs from rank 0's") == 2, out[-3000:]  # rank 1 only, once per variable


def test_a_bad_setting_on_one_rank_fails_init_on_every_rank(nranks):
    out = run_mpi("exactly_once.py", nranks, "bad-setting", timeout=120).stdout
    assert f"exactly_once bad-setting: OK on {nranks} ranks" in out, out[-3000:]


@pytest.mark.parametrize("point", ["coordinator", "decode", "data", "complete"])
def test_fault_injection(nranks, point):
    run_mpi("faults.py", nranks, point, timeout=240)


@pytest.mark.parametrize("scenario", ["early-shutdown", "barrier", "interrupt-jax"])
def test_lifecycle(nranks, scenario):
    run_mpi("lifecycle.py", nranks, scenario, timeout=120)


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_interrupt_bridges(framework):
    run_mpi("lifecycle.py", 2, f"interrupt-{framework}", timeout=180)


def test_no_spin_while_waiting_for_a_late_peer(nranks):
    out = run_mpi("lifecycle.py", nranks, "spin", timeout=180,
                  env={"JAXCACHE_HEARTBEAT_MS": "1000"}).stdout
    assert "% of a core" in out, out[-2000:]


def test_shutdown_after_a_dead_rank_ends_within_the_bound(nranks):
    result = run_mpi("lifecycle.py", nranks, "dead-rank", timeout=120, expect_fail=True,
                     env={"JAXCACHE_SHUTDOWN_TIMEOUT": "3"})
    out = result.stdout
    assert "hanging" in out, out[-3000:]
    for r in range(nranks - 1):
        assert f"rank {r}: shutdown() returned after" in out, out[-3000:]
