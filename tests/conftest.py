"""Runs multi-rank test programs under mpirun with a hard timeout."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

MPI_DIR = Path(__file__).parent / "mpi"


def mpirun_path() -> str:
    """The mpirun next to this interpreter (the mpich wheel's), else the first on PATH."""
    local = Path(sys.executable).parent / "mpirun"
    if local.exists():
        return str(local)
    found = shutil.which("mpirun")
    if not found:
        pytest.skip("no mpirun found")
    return found


def run_job(cmd: list, env: dict | None, timeout: float, on_timeout: str) -> tuple[int, str]:
    """(exit status, output) of the job `cmd`, its whole process group killed past `timeout`
    seconds (then the test fails with `on_timeout` and the output's tail)."""
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{on_timeout}\n{out[-6000:]}")
    return proc.returncode, out


def run_mpi(script: str, np: int, *args: str, timeout: float = 120, env: dict | None = None,
            expect_fail: bool = False) -> subprocess.CompletedProcess:
    """Runs tests/mpi/<script> on `np` ranks; kills the whole job past `timeout` seconds."""
    cmd = [mpirun_path(), "-np", str(np), sys.executable, str(MPI_DIR / script), *args]
    rc, out = run_job(cmd, env, timeout, f"{script} on {np} ranks timed out after {timeout}s (deadlock?)")
    result = subprocess.CompletedProcess(cmd, rc, out, "")
    if not expect_fail and rc != 0:
        pytest.fail(f"{script} on {np} ranks failed (rc={rc}):\n{out[-8000:]}")
    return result


@pytest.fixture(params=[2, 3], ids=["np2", "np3"])
def nranks(request) -> int:
    return request.param
