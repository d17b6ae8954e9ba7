"""The C++ unit tests of the runtime's pure-logic classes (xla_ext/tests: RequestTable,
ResponseCache, MessageTable, CycleMessage, JoinState, the wire format).

The standalone CMake project there is configured and built into a temporary directory once
per session; every TEST case of its sources is then run by name, so a failure names the case.
Skipped only where no CMake or no C/C++ compiler is found.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UNIT_DIR = REPO / "xla_ext" / "tests"
VENV_BIN = Path(sys.executable).parent  # the venv's cmake, ninja and mpicc live here
# Seconds. An idle 2-core machine configures and builds in well under a minute; the limits
# leave room for a loaded one and stay inside pytest-timeout's 600 s for the first test.
CONFIGURE_TIMEOUT, BUILD_TIMEOUT, RUN_TIMEOUT = 120, 420, 60
TEST_DECL = re.compile(r"^TEST\((\w+),\s*(\w+)\)", re.MULTILINE)


def declared_cases() -> list[str]:
    """'Suite.Name' of every TEST in the unit-test sources, in file order."""
    return [f"{suite}.{name}" for src in sorted(UNIT_DIR.glob("test_*.cc"))
            for suite, name in TEST_DECL.findall(src.read_text())]


def find_tool(name: str) -> str | None:
    """`name` from the venv's bin directory first, else from PATH."""
    return shutil.which(name, path=os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]))


def configure_command(src: Path, build: Path, cmake: str) -> list[str]:
    cmd = [cmake, "-S", str(src), "-B", str(build)]
    ninja = find_tool("ninja")
    if ninja:
        cmd += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    # The MPI whose mpi.h reduce_ops.h includes: JAXCACHE_MPICC (read by the project), else
    # the venv's mpicc (the mpich wheel), else whatever CMake's FindMPI finds.
    mpicc = find_tool("mpicc")
    if mpicc and "JAXCACHE_MPICC" not in os.environ:
        cmd.append(f"-DMPI_C_COMPILER={mpicc}")
    return cmd


class BuildError(Exception):
    pass


def partial_output(e: subprocess.TimeoutExpired) -> str:
    # TimeoutExpired carries bytes even when the run asked for text.
    out = e.stdout or b""
    return out.decode(errors="replace") if isinstance(out, bytes) else out


def run_step(cmd: list[str], what: str, timeout: float) -> None:
    env = dict(os.environ, PATH=os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]))
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout,
                              env=env)
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"{what} timed out after {timeout}s\n{partial_output(e)[-6000:]}") from None
    if proc.returncode != 0:
        raise BuildError(f"{what} failed (rc={proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")


@pytest.fixture(scope="session")
def unit_build(tmp_path_factory) -> Path | BuildError:
    """The built test binary, or why it could not be built."""
    cmake = find_tool("cmake")
    if not cmake:
        pytest.skip("no cmake found (neither next to the interpreter nor on PATH)")
    for compiler in (os.environ.get("CXX", "c++"), os.environ.get("CC", "cc")):
        if not find_tool(compiler):
            pytest.skip(f"no C/C++ compiler found ({compiler!r} is not on PATH)")
    build = tmp_path_factory.mktemp("cpp_units")
    try:
        run_step(configure_command(UNIT_DIR, build, cmake), "configuring xla_ext/tests",
                 CONFIGURE_TIMEOUT)
        run_step([cmake, "--build", str(build), "--parallel", str(os.cpu_count() or 2)],
                 "building xla_ext/tests", BUILD_TIMEOUT)
    except BuildError as e:
        return e
    return build / "jaxcache_unit_tests"


_reported: list[bool] = []  # a build failure's log is shown once, not once per case


@pytest.fixture
def binary(unit_build) -> Path:
    if isinstance(unit_build, BuildError):
        first = not _reported
        _reported.append(True)
        pytest.fail(str(unit_build) if first else "the unit tests did not build (see the first failure)",
                    pytrace=False)
    return unit_build


def run_binary(binary: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([str(binary), *args], check=False, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{binary.name} {' '.join(args)} timed out after {RUN_TIMEOUT}s "
                    f"(a deadlock?)\n{partial_output(e)[-8000:]}")


def test_every_declared_case_is_registered_once(binary):
    listed = run_binary(binary, "--list").stdout.split()
    declared = declared_cases()
    assert len(declared) == len(set(declared)), "two TEST cases share a name"
    assert sorted(listed) == sorted(declared)


def test_all_cases_in_one_process(binary):
    # One process catches what separate runs miss: state or heap damage left by a case.
    proc = run_binary(binary)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-8000:]}{proc.stderr[-4000:]}"
    assert f"0 of {len(declared_cases())} cases failed" in proc.stdout, proc.stdout[-4000:]


@pytest.mark.parametrize("case", declared_cases())
def test_case(binary, case):
    proc = run_binary(binary, case)
    assert proc.returncode == 0, f"{case} failed (rc={proc.returncode}):\n{proc.stdout}{proc.stderr}"
    assert f"[  OK  ] {case}" in proc.stdout, proc.stdout
