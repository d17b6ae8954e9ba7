"""Latency of small, dependent allreduces: jaxcache vs mpi4jax vs mpi4py, in one job.

    mpirun -np 2 python benchmarks/latency.py [--sizes 1,16,1024,65536] [--steps 1000]
    python benchmarks/latency.py --launch 2,3 [--json out.json]     # one job per rank count

For each float32 vector size and each library, per step:
  jit chain: one ``lax.scan`` of ``--steps`` steps inside ``jax.jit``; each step allreduces
             (sum) the previous step's result and scales it by 1/size, so no overlap is
             possible (mpi4py: the same chain as a Python loop of ``Allreduce`` on NumPy);
  eager:     a Python loop of single calls on concrete arrays, same dependence. mpi4jax
             has two forms: its eager call (``mpi4jax``, which traces and compiles anew on
             every call) and one jitted call per step (``mpi4jax_jit1``, the fast way to call
             it from a Python loop); ratios use the faster of the two.
jaxcache also runs with its response cache off (``JAXCACHE_CACHE_CAPACITY=0``, the runtime
restarted in the same job). Methods are interleaved over ``--repeats`` rounds; the table
shows the median per-step time of the slowest rank and its ratio to mpi4jax's (faster) form
in the same mode.
Each method checks its result against NumPy first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

COMM = MPI.COMM_WORLD
SIZES = (1, 16, 1024, 65536)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="float32 elements per vector")
    p.add_argument("--steps", type=int, default=1000, help="chain length (jit) / loop length (eager)")
    p.add_argument("--eager-steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--modes", default="jit,eager")
    p.add_argument("--methods", default="jaxcache,jaxcache_nocache,mpi4jax,mpi4jax_jit1,mpi4py")
    p.add_argument("--json", help="write the results here (rank 0)")
    p.add_argument("--launch", help="run one mpirun job per rank count, e.g. 2,3")
    p.add_argument("--timeout", type=float, default=900)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------
# Methods: each returns (run(x) -> result, expected(x0) -> NumPy result) for one mode.


def chain_reference(x0: np.ndarray, size: int, steps: int) -> np.ndarray:
    """Every step: sum over ranks (every rank holds x), times 1/size: a fixed point."""
    ref = x0.astype(np.float32)
    for _ in range(min(steps, 3)):
        ref = (ref * size).astype(np.float32) * np.float32(1.0 / size)
    return ref


def jaxcache_method(mode: str, n: int, steps: int):
    import jax
    import jax.numpy as jnp
    import jaxcache

    size, scale = jaxcache.size(), np.float32(1.0 / jaxcache.size())
    if mode == "jit":
        def body(c, _):
            return jaxcache.allreduce(c, "sum", name="latency.chain") * scale, None

        f = jax.jit(lambda x: jax.lax.scan(body, x, None, length=steps)[0])
        return lambda x: jax.block_until_ready(f(x))

    def loop(x):
        for _ in range(steps):
            x = jaxcache.allreduce(x, "sum", name="latency.eager") * scale
        return jax.block_until_ready(x)

    return loop


def mpi4jax_method(mode: str, n: int, steps: int):
    import jax
    import mpi4jax

    scale = np.float32(1.0 / COMM.size)
    if mode == "jit":
        def body(c, _):
            return mpi4jax.allreduce(c, op=MPI.SUM, comm=COMM) * scale, None

        f = jax.jit(lambda x: jax.lax.scan(body, x, None, length=steps)[0])
        return lambda x: jax.block_until_ready(f(x))

    def loop(x):
        for _ in range(steps):
            x = mpi4jax.allreduce(x, op=MPI.SUM, comm=COMM) * scale
        return jax.block_until_ready(x)

    return loop


def mpi4jax_jit1_method(mode: str, n: int, steps: int):
    import jax
    import mpi4jax

    scale = np.float32(1.0 / COMM.size)
    one = jax.jit(lambda c: mpi4jax.allreduce(c, op=MPI.SUM, comm=COMM) * scale)

    def loop(x):
        for _ in range(steps):
            x = one(x)
        return jax.block_until_ready(x)

    return loop


def mpi4py_method(mode: str, n: int, steps: int):
    scale = np.float32(1.0 / COMM.size)

    def loop(x):
        x = np.array(x, dtype=np.float32)
        out = np.empty_like(x)
        for _ in range(steps):
            COMM.Allreduce(x, out, op=MPI.SUM)
            np.multiply(out, scale, out=x)
        return x

    return loop


BUILDERS = {"jaxcache": jaxcache_method, "jaxcache_nocache": jaxcache_method,
            "mpi4jax": mpi4jax_method, "mpi4jax_jit1": mpi4jax_jit1_method, "mpi4py": mpi4py_method}
EAGER_ONLY = {"mpi4jax_jit1"}


def available(method: str) -> bool:
    try:
        __import__({"mpi4py": "mpi4py", "mpi4jax": "mpi4jax", "mpi4jax_jit1": "mpi4jax"}.get(method, "jaxcache"))
        return True
    except Exception:  # noqa: BLE001 - a missing peer is reported as skipped
        return False


def time_once(run, x) -> float:
    COMM.Barrier()
    t0 = time.perf_counter()
    run(x)
    return COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def restart_jaxcache(cache_off: bool) -> None:
    import jaxcache

    if jaxcache.is_initialized():
        jaxcache.shutdown()
    if cache_off:
        os.environ["JAXCACHE_CACHE_CAPACITY"] = "0"
    else:
        os.environ.pop("JAXCACHE_CACHE_CAPACITY", None)
    jaxcache.init()


def run_job(args) -> dict:
    import jax.numpy as jnp

    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    methods = [m for m in args.methods.split(",") if available(m)]
    skipped = [m for m in args.methods.split(",") if m not in methods]
    results = {"ranks": COMM.size, "steps": args.steps, "eager_steps": args.eager_steps,
               "skipped": skipped, "cells": []}
    for n in sizes:
        for mode in modes:
            steps = args.steps if mode == "jit" else args.eager_steps
            active = [m for m in methods if mode == "eager" or m not in EAGER_ONLY]
            x0 = np.full(n, COMM.rank + 1.0, np.float32)
            want = chain_reference(np.full(n, (COMM.size + 1) / 2, np.float32), COMM.size, steps)
            times = {m: [] for m in active}
            runs = {}
            # Build and check every method once (this also compiles).
            for m in active:
                if m == "mpi4jax" and mode == "eager":
                    steps_m = max(3, steps // 30)  # it recompiles every call: keep it short
                else:
                    steps_m = steps
                if m.startswith("jaxcache"):
                    restart_jaxcache(m == "jaxcache_nocache")
                run = BUILDERS[m](mode, n, steps_m)
                run.steps = steps_m
                got = np.asarray(run(jnp.asarray(x0) if m != "mpi4py" else x0))
                if not np.allclose(got, want, rtol=1e-5):
                    raise AssertionError(f"{m} {mode} n={n}: wrong result {got[:3]} vs {want[:3]}")
                runs[m] = run
            for _ in range(args.repeats):  # interleaved
                for m in active:
                    if m.startswith("jaxcache"):
                        restart_jaxcache(m == "jaxcache_nocache")
                        runs[m](jnp.asarray(x0))  # warm the new runtime's cache
                    arg = jnp.asarray(x0) if m != "mpi4py" else x0
                    times[m].append(time_once(runs[m], arg) / runs[m].steps)
            cell = {"elements": n, "mode": mode,
                    "us_per_step": {m: 1e6 * statistics.median(t) for m, t in times.items()},
                    "spread": {m: (1e6 * min(t), 1e6 * max(t)) for m, t in times.items()}}
            base = min((v for k, v in cell["us_per_step"].items() if k.startswith("mpi4jax")),
                       default=None)
            cell["ratio_to_mpi4jax"] = {m: (v / base if base else None)
                                        for m, v in cell["us_per_step"].items()}
            results["cells"].append(cell)
            if COMM.rank == 0:
                print_cell(cell, COMM.size)
    return results


def print_cell(cell, ranks) -> None:
    parts = []
    for m, us in cell["us_per_step"].items():
        r = cell["ratio_to_mpi4jax"][m]
        parts.append(f"{m} {us:8.2f} us" + (f" ({r:4.2f}x)" if r else ""))
    print(f"P={ranks} {cell['mode']:5s} n={cell['elements']:6d}: " + " | ".join(parts), flush=True)


def print_table(all_results: list[dict]) -> None:
    for res in all_results:
        methods = []
        for cell in res["cells"]:
            methods += [m for m in cell["us_per_step"] if m not in methods]
        print(f"\n### {res['ranks']} ranks (us per step, median of repeats, slowest rank; "
              f"ratio to mpi4jax in the same mode)\n")
        print("| mode | elements | " + " | ".join(methods) + " |")
        print("|---|---|" + "---|" * len(methods))
        for cell in res["cells"]:
            row = []
            for m in methods:
                if m not in cell["us_per_step"]:
                    row.append("-")
                    continue
                us, r = cell["us_per_step"][m], cell["ratio_to_mpi4jax"][m]
                row.append(f"{us:.1f}" + (f" ({r:.2f}x)" if r is not None else ""))
            print(f"| {cell['mode']} | {cell['elements']} | " + " | ".join(row) + " |")
        if res["skipped"]:
            print(f"\nskipped (not importable): {', '.join(res['skipped'])}")


def launch(args) -> None:
    import tempfile

    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if not os.path.exists(mpirun):
        mpirun = "mpirun"
    collected = []
    for np_ in [int(p) for p in args.launch.split(",")]:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [mpirun, "-np", str(np_), sys.executable, os.path.abspath(__file__),
                   "--sizes", args.sizes, "--steps", str(args.steps), "--eager-steps",
                   str(args.eager_steps), "--repeats", str(args.repeats), "--modes", args.modes,
                   "--methods", args.methods, "--json", out.name]
            print(f"$ {' '.join(cmd)}", flush=True)
            subprocess.run(cmd, check=True, timeout=args.timeout)
            collected.append(json.load(open(out.name)))
    print_table(collected)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(collected, f, indent=1)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.launch:
        return launch(args)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jaxcache

    jaxcache.init()
    res = run_job(args)
    if COMM.rank == 0:
        print_table([res])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
    jaxcache.shutdown()


if __name__ == "__main__":
    main()
