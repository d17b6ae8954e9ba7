"""Runs mpi4jax's own test suite against jaxcache.mpi4jax (`make test-mpi4jax`).

mpi4jax's tests come from its source distribution on PyPI (never copied into this
repository) or from --tests DIR. A one-line shim package named `mpi4jax` on PYTHONPATH
re-exports jaxcache.mpi4jax, so `from mpi4jax import allreduce` in their tests gets ours.
Each test runs in its own `mpirun -np N` job under a hard timeout, as mpi4jax's CI runs
them; a test passes when every rank passes it. Prints each failure with the last lines of
its output, then "N passed, M failed". With --peer the same jobs run against the installed
mpi4jax itself (no shim): the reference figure that the 95% target is measured against.

    python tests/mpi4jax_suite.py [--np 2] [--np 3] [--tests DIR] [-k EXPR] [--timeout 120] [--peer]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from suite_jobs import run_test_job

MPI4JAX_VERSION = "0.9.1"  # the mpi4jax whose API jaxcache.mpi4jax follows
SHIM = "from jaxcache.mpi4jax import *  # noqa: F401,F403\nfrom jaxcache.mpi4jax import __all__  # noqa: F401\n" \
       f"__version__ = {MPI4JAX_VERSION!r}\n"


# jaxcache.mpi4jax starts the runtime when imported (collective); mpi4jax's tests import
# mpi4jax inside each test, so tests that run on ranks 0 and 1 only would leave rank 2
# outside. pytest imports it on every rank at startup, as a program imports it at its top.
IMPORT_AT_START = ("-p", "mpi4jax")


def download_tests(workdir: Path) -> Path:
    """mpi4jax's tests/ and the examples/ its test_examples.py runs, from its sdist on PyPI."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    "--no-build-isolation", f"mpi4jax=={MPI4JAX_VERSION}", "-d", str(workdir)], check=True)
    sdist = next(workdir.glob("mpi4jax-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and ("/tests/" in m.name or "/examples/" in m.name)]
        tar.extractall(workdir, members=members, filter="data")
    return next(workdir.glob("mpi4jax-*/tests"))


def collect(tests: Path, env: dict, expr: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(tests)]
    if expr:
        cmd += ["-k", expr]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tests.parent).stdout
    return [line.strip() for line in out.splitlines() if "::" in line]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, action="append", help="rank counts (default: 2)")
    p.add_argument("--tests", type=Path, help="mpi4jax's tests/ directory (default: from its PyPI sdist)")
    p.add_argument("-k", dest="expr", help="only the tests pytest -k selects")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per test job")
    p.add_argument("--peer", action="store_true", help="run against the installed mpi4jax (no shim)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="mpi4jax-suite-") as tmp:
        work = Path(tmp)
        tests = args.tests or download_tests(work)
        # PYTHONSAFEPATH: `python -m pytest` would put the working directory first on
        # sys.path, and a source tree given by --tests has mpi4jax's own package there.
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONSAFEPATH="1")
        if not args.peer:
            shim = work / "shim" / "mpi4jax"
            shim.mkdir(parents=True)
            (shim / "__init__.py").write_text(SHIM)
            env["PYTHONPATH"] = os.pathsep.join([str(shim.parent), os.environ.get("PYTHONPATH", "")])
        nodes = collect(tests, env, args.expr)
        if not nodes:
            print(f"no tests collected in {tests}", file=sys.stderr)
            return 2
        passed, failed = 0, []
        for np in args.np or [2]:
            for node in nodes:
                ok, out = run_test_job(node, np, env, args.timeout, tests.parent, extra=IMPORT_AT_START)
                name = f"{node.split('tests/', 1)[-1]} [np={np}]"
                print(("PASS " if ok else "FAIL ") + name, flush=True)
                if ok:
                    passed += 1
                else:
                    failed.append((name, out))
        for name, out in failed:
            print(f"\n--- {name}\n" + "\n".join(out.strip().splitlines()[-12:]))
        against = "mpi4jax itself (--peer)" if args.peer else "jaxcache.mpi4jax"
        print(f"\nmpi4jax's suite against {against}: {passed} passed, {len(failed)} failed")
        return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
