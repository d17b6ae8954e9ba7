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


def run_mpi(script: str, np: int, *args: str, timeout: float = 120, env: dict | None = None,
            expect_fail: bool = False) -> subprocess.CompletedProcess:
    """Runs tests/mpi/<script> on `np` ranks; kills the whole job past `timeout` seconds."""
    full_env = dict(os.environ)
    full_env.update({"JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"})
    full_env.update(env or {})
    cmd = [mpirun_path(), "-np", str(np), sys.executable, str(MPI_DIR / script), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{script} on {np} ranks timed out after {timeout}s (deadlock?)\n{out[-6000:]}")
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, "")
    if not expect_fail and proc.returncode != 0:
        pytest.fail(f"{script} on {np} ranks failed (rc={proc.returncode}):\n{out[-8000:]}")
    return result


@pytest.fixture(params=[2, 3], ids=["np2", "np3"])
def nranks(request) -> int:
    return request.param
