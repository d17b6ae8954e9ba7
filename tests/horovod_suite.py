"""Runs Horovod's own test suites against jaxcache's bridges (`make test-horovod`).

Horovod's tests are read from a Horovod source checkout (--horovod DIR, e.g. a clone of
https://github.com/horovod/horovod at v0.28.1; its PyPI sdist has no tests) and never
copied into this repository. A shim package named `horovod` on PYTHONPATH makes
`horovod.torch`, `horovod.tensorflow` and `horovod.tensorflow.keras` the jaxcache modules
themselves (one line each), plus the one helper Horovod's test utilities import
(`horovod.runner.util.threads.in_thread`). Each test runs in its own `mpirun -np N` job
under a hard timeout; a test passes when every rank passes it (a skip counts apart).
Prints each failure with the last lines of its output, then the counts per suite.

    python tests/horovod_suite.py --horovod DIR [--suite torch] [--np 2] [-k EXPR] [--timeout 120]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from suite_jobs import run_test_job

SUITES = {  # suite -> (Horovod's test file, extra environment)
    "torch": ("test/parallel/test_torch.py", {}),
    "tensorflow": ("test/parallel/test_tensorflow.py", {}),
    "keras": ("test/parallel/test_tensorflow2_keras.py", {}),
    "keras2": ("test/parallel/test_tensorflow2_keras.py", {"TF_USE_LEGACY_KERAS": "1"}),
}
SHIMS = {
    "horovod/__init__.py": "",
    "horovod/torch/__init__.py": "import sys, jaxcache.torch; sys.modules[__name__] = jaxcache.torch\n",
    "horovod/tensorflow/__init__.py":
        "import sys, jaxcache.tensorflow; sys.modules[__name__] = jaxcache.tensorflow\n",
    "horovod/tensorflow/keras/__init__.py":
        "import sys, jaxcache.tensorflow.keras as m; sys.modules[__name__] = m\n",
    # What Horovod's test_tensorflow2_keras.py imports besides the bridges.
    "horovod/common/__init__.py": "",
    "horovod/common/util.py":
        "from packaging import version\n\n\ndef is_version_greater_equal_than(ver, target):\n"
        "    return version.parse(ver) >= version.parse(target)\n",
    # (registered under both names: `import horovod.tensorflow.keras` after `horovod.tensorflow`
    # is jaxcache.tensorflow would otherwise load a second copy of jaxcache's keras package)
    "horovod/keras/__init__.py":
        "import sys, horovod.tensorflow, jaxcache.tensorflow.keras as m\n"
        "sys.modules['horovod.tensorflow.keras'] = sys.modules[__name__] = m\n",
    "horovod/runner/__init__.py": "",
    "horovod/runner/util/__init__.py": "",
    # What Horovod's test/utils/common.py imports: run a function on a daemon thread.
    "horovod/runner/util/threads.py":
        "import threading\n\n\ndef in_thread(target, args=(), name=None, daemon=True, silent=False):\n"
        "    t = threading.Thread(target=target, args=args, name=name, daemon=daemon)\n"
        "    t.start()\n    return t\n",
}


def write_shim(root: Path) -> None:
    for rel, text in SHIMS.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def collect(test_file: Path, env: dict, expr: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(test_file)]
    if expr:
        cmd += ["-k", expr]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=test_file.parent)
    nodes = [line.strip() for line in proc.stdout.splitlines() if ".py::" in line]
    if not nodes:
        print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
    return nodes


def run_one(node: str, np: int, env: dict, timeout: float, cwd: Path) -> tuple[str, str]:
    """('pass' | 'skip' | 'fail', output) of one test in its own mpirun job."""
    ok, out = run_test_job(node, np, env, timeout, cwd, extra=("-rs",))
    if not ok:
        return "fail", out
    return ("skip" if " skipped" in out and " passed" not in out else "pass"), out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--horovod", type=Path, required=True, help="a Horovod source checkout")
    p.add_argument("--suite", action="append", choices=sorted(SUITES), help="default: torch")
    p.add_argument("--np", type=int, action="append", help="rank counts (default: 2)")
    p.add_argument("-k", dest="expr", help="only the tests pytest -k selects")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per test job")
    args = p.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="horovod-suite-") as tmp:
        shim = Path(tmp)
        write_shim(shim)
        utils = args.horovod / "test" / "utils"
        for suite in args.suite or ["torch"]:
            rel, extra = SUITES[suite]
            test_file = (args.horovod / rel).resolve()
            env = dict(os.environ, JAX_PLATFORMS="cpu", **extra,
                       PYTHONPATH=os.pathsep.join([str(shim), str(utils), os.environ.get("PYTHONPATH", "")]))
            nodes = collect(test_file, env, args.expr)
            if not nodes:
                print(f"no tests collected in {test_file}", file=sys.stderr)
                return 2
            counts = {"pass": 0, "skip": 0, "fail": 0}
            failed = []
            for np in args.np or [2]:
                for node in nodes:
                    outcome, out = run_one(node, np, env, args.timeout, test_file.parent)
                    name = f"{node.rsplit('::', 1)[-1]} [np={np}]"
                    print(f"{outcome.upper():4} {suite} {name}", flush=True)
                    counts[outcome] += 1
                    if outcome == "fail":
                        failed.append((name, out))
            for name, out in failed:
                print(f"\n--- {suite} {name}\n" + "\n".join(out.strip().splitlines()[-15:]))
            print(f"\nHorovod's {suite} suite on jaxcache: {counts['pass']} passed, {counts['skip']} skipped, "
                  f"{counts['fail']} failed of {sum(counts.values())}", flush=True)
            failures += counts["fail"]
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
