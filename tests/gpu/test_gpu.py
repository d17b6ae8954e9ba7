"""The CUDA path on a real GPU (docs/gpu.md): skipped on machines without one.

tests/gpu/device_check.sh runs these on the GPU check machine (1 rank, then 2 ranks sharing
GPU 0). JAXCACHE_CHECK_PLATFORM=cpu runs them on CPU arrays instead (a dry run);
JAXCACHE_REQUIRE_GPU=1 turns the skip into a failure (the device check sets it).
"""

import os
import subprocess
import sys

import pytest

from conftest import run_mpi

DRY_RUN = os.environ.get("JAXCACHE_CHECK_PLATFORM") == "cpu"
# Two ranks share GPU 0: each JAX process may take 30% of its memory, not the default 75%.
ENV = {"JAX_PLATFORMS": "cpu" if DRY_RUN else "cuda,cpu", "CUDA_VISIBLE_DEVICES": "0",
       "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3"}


def _gpu_ready() -> tuple[bool, str]:
    # In a subprocess: loading the extension initializes MPI and CUDA.
    code = ("import jax, jaxcache; from jaxcache import devices; "
            "gpus = [d for d in jax.devices() if d.platform == 'gpu']; "
            "print(bool(gpus) and jaxcache.cuda_available(), '|', "
            "devices.cuda_unavailable_reason() or ('jax sees no GPU' if not gpus else ''))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                         env=dict(os.environ, **ENV), timeout=300)
    if out.returncode != 0:
        return False, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "probe failed"
    ready, reason = out.stdout.strip().split("|", 1)
    return ready.strip() == "True", reason.strip()


@pytest.fixture(scope="module")
def gpu():
    if DRY_RUN:
        return
    ready, reason = _gpu_ready()
    if not ready:
        if os.environ.get("JAXCACHE_REQUIRE_GPU") == "1":
            pytest.fail(f"JAXCACHE_REQUIRE_GPU=1 but there is no usable GPU: {reason}")
        pytest.skip(f"no usable GPU: {reason}")


@pytest.mark.parametrize("nranks", [1, 2], ids=["np1", "np2"])
def test_gpu_checks(gpu, nranks):
    out = run_mpi("../gpu/gpu_checks.py", nranks, "checks", env=ENV, timeout=400).stdout
    print(out)
    assert f"gpu checks: all OK on {nranks} rank(s)" in out, out[-3000:]


def test_gpu_bandwidth(gpu):
    out = run_mpi("../gpu/gpu_checks.py", 2, "bandwidth", env=ENV, timeout=300).stdout
    print(out)
    assert "bandwidth:" in out, out[-3000:]
