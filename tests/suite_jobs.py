"""One test of another project's suite in its own `mpirun -np N` job under a hard timeout
(tests/mpi4jax_suite.py, tests/horovod_suite.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def run_test_job(node: str, np: int, env: dict, timeout: float, cwd: Path,
                 extra: tuple[str, ...] = ()) -> tuple[bool, str]:
    """(every rank passed, output) of pytest running `node` under mpirun; a job past
    `timeout` seconds is killed with its whole process group."""
    cmd = [str(BIN / "mpirun"), "-np", str(np), sys.executable, "-m", "pytest", "-q", "-x",
           "-p", "no:cacheprovider", *extra, node]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=cwd)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return False, f"timed out after {timeout:.0f} s\n{out[-2000:]}"
    return proc.returncode == 0, out
