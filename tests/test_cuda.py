"""The CUDA path on a machine without a GPU (docs/gpu.md): lowering of every primitive for
CUDA, the device kind in the signature (2 and 3 ranks), import without a driver, and an
extension that needs no CUDA library. The GPU itself is exercised by tests/gpu/."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_mpi


def test_every_primitive_lowers_for_cuda(nranks):
    run_mpi("cuda_paths.py", nranks, "lowering", timeout=180)


def test_cpu_and_gpu_arrays_on_different_ranks_mismatch(nranks):
    run_mpi("cuda_paths.py", nranks, "device-mismatch", timeout=120)


def _driver_present() -> bool:
    return Path("/dev/nvidiactl").exists() or any(
        Path(d, "libcuda.so.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64"))


def test_import_works_without_a_driver():
    code = ("import jaxcache, jax; from jaxcache import devices; "
            "print(jaxcache.cuda_built(), jaxcache.cuda_available(), "
            "repr(devices.cuda_unavailable_reason()))")
    # Run outside the source tree, so that the installed package is imported.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd="/", env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert out.returncode == 0, out.stderr[-3000:]
    built, available, reason = out.stdout.split(maxsplit=2)
    # CI builds with JAXCACHE_CUDA=ON (.ci/run) or OFF; AUTO depends on the machine.
    requested = os.environ.get("JAXCACHE_CUDA", "AUTO").upper()
    if requested in ("ON", "OFF"):
        assert built == str(requested == "ON"), (requested, out.stdout)
    if not _driver_present():
        assert available == "False", out.stdout
        if built == "True":
            assert "cudaErrorInsufficientDriver" in reason or "cudaErrorNoDevice" in reason, reason
        else:
            assert "built without CUDA" in reason, reason


def test_extension_links_no_cuda_library():
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    # Located without loading it: loading would initialize MPI in the test runner itself.
    code = "import importlib.util; print(importlib.util.find_spec('jaxcache._jaxcache_ext').origin)"
    so = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                        cwd="/").stdout.strip()
    dynamic = subprocess.run([readelf, "-d", "-W", so], capture_output=True, text=True, check=True)
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", dynamic.stdout)
    assert needed and not [n for n in needed if "cuda" in n], needed
    # cudart is linked statically with its symbols kept private (no clash with another
    # cudart in the process, e.g. jax's or torch's).
    symbols = subprocess.run([readelf, "--dyn-syms", "-W", so], capture_output=True, text=True,
                             check=True).stdout
    exported = [line.split()[-1] for line in symbols.splitlines()
                if " GLOBAL " in line and " UND " not in line]
    assert exported and not [s for s in exported if s.startswith("cuda")], exported[:20]
