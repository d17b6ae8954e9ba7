"""Reliability: errors on every rank, stalls, shutdown, dead ranks, bad input, chunking,
property-based sequences and a soak (2 and 3 ranks, all bounded by timeouts)."""

import time

import pytest

from conftest import run_mpi


def test_mismatch_duplicates_bad_input(nranks):
    run_mpi("errors.py", nranks, timeout=180)


def test_stall_warning_names_tensor_and_missing_rank(nranks):
    out = run_mpi("stall.py", nranks, "warn", timeout=120,
                  env={"JAXCACHE_STALL_CHECK_TIME": "1"}).stdout
    assert "'stall.slow'" in out and f"missing on rank {nranks - 1}" in out, out[-3000:]
    assert "'stall.cached'" in out, out[-3000:]


def test_stall_shutdown_fails_pending_ops(nranks):
    run_mpi("stall.py", nranks, "shutdown", timeout=120,
            env={"JAXCACHE_STALL_CHECK_TIME": "1", "JAXCACHE_STALL_SHUTDOWN_TIME": "2"})


def test_shutdown_on_one_rank(nranks):
    out = run_mpi("shutdown.py", nranks, "one-rank", timeout=90,
                  env={"JAXCACHE_SHUTDOWN_TIMEOUT": "2"}).stdout
    assert out.count("ShutdownError as expected") == nranks - 1, out
    missing = "rank 1" if nranks == 2 else "ranks 1, 2"
    assert f"{missing} never called shutdown()" in out, out


def test_exit_with_collectives_in_flight(nranks):
    run_mpi("shutdown.py", nranks, "exit", timeout=90)


def test_killed_rank_ends_job(nranks):
    t0 = time.monotonic()
    result = run_mpi("shutdown.py", nranks, "kill", timeout=120, expect_fail=True)
    assert result.returncode != 0, result.stdout[-3000:]
    assert "killing myself" in result.stdout
    # The job must end within 30 s of the kill (start-up included here, so be generous).
    assert time.monotonic() - t0 < 90


@pytest.mark.parametrize("env", [{"JAXCACHE_MAX_MPI_COUNT": "1000"}, {"JAXCACHE_CHUNK_BYTES": "4000"}],
                         ids=["max-count", "chunk-bytes"])
def test_large_counts_are_chunked(nranks, env):
    run_mpi("large_counts.py", nranks, timeout=120, env=env)


def test_property_based_sequences():
    run_mpi("property_based.py", 3, "200", timeout=900)


def test_soak_10000_steps(nranks):
    run_mpi("soak.py", nranks, "10000", timeout=600)
