"""Several devices per process (docs/devices.md): every collective in shard_map and on
sharded arrays, axis_name, distinct programs, concurrency and counters on 2 and 3 ranks x 2
and 4 devices; different device counts across ranks; jaxcache beside jax.distributed."""

import sys

import pytest

from conftest import MPI_DIR, mpirun_path, run_job, run_mpi


@pytest.mark.parametrize("devices", [2, 4], ids=["d2", "d4"])
def test_devices(nranks, devices):
    # The report that started this, 200 distinct programs, in one configuration; 40 elsewhere.
    programs = 200 if (nranks, devices) == (2, 4) else 40
    out = run_mpi("devices.py", nranks, str(devices), str(programs), timeout=300).stdout
    assert f"devices (N={devices}, {programs} programs): OK on {nranks} ranks" in out


def test_devices_beyond_pairwise_ranks():
    # From 5 ranks the runtime reduces the devices' blocks across ranks with MPI in place
    # instead of pairwise exchanges (Operations::BlockAllreduce).
    out = run_mpi("devices.py", 5, "2", "4", timeout=300).stdout
    assert "devices (N=2, 4 programs): OK on 5 ranks" in out


@pytest.mark.parametrize("counts", [(4, 2), (2, 4, 4)], ids=["np2", "np3"])
def test_device_count_mismatch_fails_on_every_rank(counts):
    cmd = [mpirun_path()]
    for i, n in enumerate(counts):
        cmd += ([":"] if i else []) + ["-np", "1", sys.executable, str(MPI_DIR / "devices_mismatch.py"), str(n)]
    rc, out = run_job(cmd, None, 180, f"device count mismatch {counts} timed out (a device waiting forever?)")
    assert rc == 0, out[-6000:]
    assert f"device count mismatch {list(counts)}: OK on {len(counts)} ranks" in out


def test_beside_jax_distributed(nranks):
    out = run_mpi("devices_distributed.py", nranks, timeout=180).stdout
    assert f"jaxcache beside jax.distributed: OK on {nranks} ranks" in out


def test_device_skipping_a_collective_fails_instead_of_hanging(nranks):
    out = run_mpi("devices_skip.py", nranks, timeout=120,
                  env={"JAXCACHE_STALL_CHECK_TIME": "2", "JAXCACHE_STALL_SHUTDOWN_TIME": "4"}).stdout
    assert "'skip' waits for device position 1 of 2" in out  # the warning, before the error
    assert f"a device skipping a collective: OK on {nranks} ranks" in out
