"""A plain install where no CUDA toolkit is found builds the CPU-only extension, from a clean
clone (JAXCACHE_CUDA=AUTO; CMake is told that CUDAToolkit cannot be found, which is what a
machine without CUDA looks like to the build), and that build works at 2 and 3 ranks.
The clone is of the last commit: uncommitted changes are not in it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_mpi

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cpu_only_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cpu_only")
    src, site = tmp / "src", tmp / "site"
    if shutil.which("git") and (REPO / ".git").exists():
        subprocess.run(["git", "clone", "-q", str(REPO), str(src)], check=True, timeout=120)
    else:  # not a git checkout: the source files without build products or environments
        shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
            ".git", ".venv*", "build", "dist", ".whl", "__pycache__", "*.so", "*.egg-info"))
    env = {k: v for k, v in os.environ.items() if k != "JAXCACHE_CUDA"}
    env["CMAKE_ARGS"] = "-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-v", "--no-deps", "--no-compile", "--target",
         str(site), str(src)], capture_output=True, text=True, timeout=900, env=env, cwd=tmp)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    assert "jaxcache: CUDA path OFF" in build.stdout + build.stderr, build.stdout[-4000:]
    return site


def test_plain_install_without_cuda_builds_cpu_only(cpu_only_site):
    code = ("import jaxcache, jaxcache._ext as e; print(jaxcache.__file__); "
            "print(jaxcache.cuda_built(), jaxcache.cuda_available(), hasattr(e.ext, 'cuda_device_count'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd="/", env=dict(os.environ, PYTHONPATH=str(cpu_only_site), JAX_PLATFORMS="cpu"))
    assert out.returncode == 0, out.stderr[-3000:]
    where, flags = out.stdout.strip().splitlines()
    assert where.startswith(str(cpu_only_site)), where
    assert flags == "False False False", flags


def test_cpu_only_build_runs(cpu_only_site, nranks):
    # Lowering for CUDA still works (it is Python); execution on CPU goes through the runtime.
    out = run_mpi("cuda_paths.py", nranks, "lowering", timeout=180,
                  env={"PYTHONPATH": str(cpu_only_site), "JAXCACHE_EXPECT_CUDA_BUILT": "0"}).stdout
    assert "lowering: OK" in out, out[-2000:]
