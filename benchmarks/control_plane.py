"""Control-plane cost: N tiny named allreduces per step, response cache on vs off.

One job measures one (P, cache setting); ``--sweep`` launches the jobs itself:

    mpirun -np 2 python benchmarks/control_plane.py [--n 10,100,1000,5000] [--path eager|jit]
        [--steps 10] [--warmup 3] [--elems 4] [--json out.json]
    python benchmarks/control_plane.py --sweep [--quick] [--procs 2,4,8] [--paths eager,jit]

The cache setting comes from the environment: ``JAXCACHE_CACHE_CAPACITY=8192`` ("on": holds
every name of the sweep) or ``0`` ("off": every cycle negotiates through rank 0). ``--sweep``
sets it per job, runs ``mpirun`` from the directory of ``sys.executable`` with a hard timeout
per job, and prints the combined tables and the off/on ratios.

Per step, every rank has N requests ``t0 .. t{N-1}`` (``--elems`` float32 values each) in
flight together:

- ``--path eager`` (default): the C++ submit path (``jaxcache._ext.ext.submit``, as
  ``jaxcache/ops/eager.py`` uses it) submits all N requests back to back, then waits for every
  handle. No compilation, so N = 5000 is cheap.
- ``--path jit``: ONE jitted step ``[jaxcache.allreduce(x_i, "sum", name=f"t{i}") ...]``.
  XLA:CPU's thunk executor runs a program *sequentially* when every buffer is <= 512 bytes
  (``ThunkExecutor::Options::execute_sequential_buffer_threshold``, hard-coded, no flag): each
  FFI call then waits for the previous one, so only ONE request is in flight and every
  collective costs its own cycle. The jit path therefore defaults to 256 floats (1 KB) per
  tensor; ``--elems 4`` shows the sequential behaviour (cycles/step == N).

Timing: a barrier starts each step; step time is the slowest rank's. ``stats()`` is read on
every rank right before and right after its step; negotiation per step is the slowest rank's
delta (negotiation_seconds includes waiting for peers). Medians over the timed steps are
reported (negotiation per cycle: median over steps of the step's negotiation / its cycles); cycles
and coordinator rounds per step are means (they are collective, hence equal on all ranks). The
"least-waiting rank" columns take the rank with the least negotiation time instead of the
slowest: it waited least for its peers, so it is the closest to the control plane's own cost.
Results are checked once against NumPy before timing. On the 2-core dev machine every P > 2 is oversubscribed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CACHE_ON = 8192
FULL = {"n": [10, 100, 1000, 5000], "procs": [2, 4, 8], "paths": ["eager", "jit"], "jit_n": [10, 100, 1000, 5000]}
QUICK = {"n": [10, 1000], "procs": [2, 4], "paths": ["eager"], "jit_n": [10, 1000]}
COLUMNS = ["path", "N", "P", "cache", "step ms", "negotiation ms/step", "negotiation us/cycle",
           "cycles/step", "coordinator rounds/step", "execution ms/step",
           "least-waiting rank: negotiation ms/step", "least-waiting rank: negotiation us/cycle", "check"]


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def int_list(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int_list, default=None, help="requests per step (default 10,100,1000,5000)")
    p.add_argument("--path", choices=["eager", "jit"], default="eager")
    p.add_argument("--elems", type=int, default=None,
                   help="float32 values per tensor (default: 4 eager, 256 jit; see the docstring)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per N (>= 10 recommended)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per N (the first one fills the cache)")
    p.add_argument("--json", default=None, help="write the rows as JSON (rank 0)")
    g = p.add_argument_group("driver (--sweep)")
    g.add_argument("--sweep", action="store_true", help="launch the mpirun jobs (P x cache x path) itself")
    g.add_argument("--quick", action="store_true", help="sweep subset: N 10,1000; P 2,4; eager path")
    g.add_argument("--procs", type=int_list, default=None, help="ranks per job (default 2,4,8)")
    g.add_argument("--paths", default=None, help="paths to sweep (default eager,jit)")
    g.add_argument("--jit-n", type=int_list, default=None,
                   help="N for the jit path (default: all of --n; N=5000 compiles for ~5-15 s per rank)")
    g.add_argument("--job-timeout", type=float, default=150.0, help="hard timeout per mpirun job, s")
    g.add_argument("--total-budget", type=float, default=600.0,
                   help="skip remaining jobs once the sweep has run this long, s")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- worker (under mpirun)


def worker(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(REPO))
    import common  # imports mpi4py.MPI first
    from common import COMM, MPI

    import jaxcache as jc
    from jaxcache import config as jc_config

    ns = args.n or FULL["n"]
    elems = args.elems or (4 if args.path == "eager" else 256)
    jc.init()
    rank, size = jc.rank(), jc.size()
    capacity = jc_config.from_env().cache_capacity
    cache = f"on({capacity})" if capacity else "off"
    cores = os.cpu_count() or 1
    common.say(f"# control_plane: path={args.path} P={size} cache={cache} elems={elems} "
               f"({4 * elems} B/tensor) steps={args.steps} warmup={args.warmup} cores={cores} "
               f"load={loadavg()}"
               + (f"  [OVERSUBSCRIBED: {size} ranks on {cores} cores]" if size > cores else ""))
    if capacity and capacity < max(ns):
        common.say(f"# warning: cache capacity {capacity} < N={max(ns)}: the cache evicts every step")

    rows = []
    for n in ns:
        shapes = [(elems,)] * n
        local = common.rank_tensors(shapes, rank)
        want = common.reference(shapes, size, "sum")
        t0 = time.perf_counter()
        run, fetch = (build_eager if args.path == "eager" else build_jit)(local, n)
        build_s = COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        try:
            for _ in range(max(1, args.warmup)):
                run()
            ok = common.agree(common.all_close(fetch(), want))
            times, neg, exe, cyc, rounds, hits, misses = ([] for _ in range(7))
            for _ in range(args.steps):
                COMM.Barrier()
                s0 = jc.stats()
                t = time.perf_counter()
                run()
                dt = time.perf_counter() - t
                s1 = jc.stats()
                times.append(dt)
                neg.append(s1["negotiation_seconds"] - s0["negotiation_seconds"])
                exe.append(s1["execution_seconds"] - s0["execution_seconds"])
                cyc.append(s1["cycles"] - s0["cycles"])
                rounds.append(s1["coordinator_rounds"] - s0["coordinator_rounds"])
                hits.append(s1["cache_hits"] - s0["cache_hits"])
                misses.append(s1["cache_misses"] - s0["cache_misses"])
            error = None
        except Exception as exc:  # noqa: BLE001 - report and go on with the next N
            error = f"{type(exc).__name__}: {exc}"
            ok = False
            times = neg = exe = cyc = rounds = hits = misses = [float("nan")] * args.steps
        per_rank = COMM.gather({"times": times, "neg": neg, "exe": exe, "cyc": cyc, "rounds": rounds,
                                "hits": hits, "misses": misses, "error": error}, root=0)
        if rank == 0:
            rows.append(summarize(per_rank, args.path, n, size, cache, ok, build_s))
            r = rows[-1]
            if len(rows) == 1:
                print(table([], COLUMNS), flush=True)
            print(table([r], COLUMNS).splitlines()[-1], flush=True)
            if r.get("error"):
                print(f"# N={n}: {r['error']}", flush=True)
        del run, fetch

    jc.shutdown()
    if rank == 0:
        payload = {"path": args.path, "P": size, "cache": cache, "capacity": capacity, "elems": elems,
                   "cores": cores, "steps": args.steps, "rows": rows}
        common.dump_json(args.json, payload)
    return 0


def summarize(per_rank: list[dict], path: str, n: int, size: int, cache: str, ok: bool,
              build_s: float) -> dict[str, Any]:
    import numpy as np

    err = next((r["error"] for r in per_rank if r["error"]), None)
    t = np.array([r["times"] for r in per_rank])   # ranks x steps
    neg = np.array([r["neg"] for r in per_rank])
    exe = np.array([r["exe"] for r in per_rank])
    steps = t.shape[1]
    cycles = float(np.sum(per_rank[0]["cyc"]))
    rounds = float(np.sum(per_rank[0]["rounds"]))
    cyc = np.array(per_rank[0]["cyc"], dtype=float)  # collective: the same on every rank
    # per rank: median over steps of (negotiation in the step / cycles in the step)
    per_cycle = ([float(np.median(neg[i][cyc > 0] / cyc[cyc > 0])) for i in range(len(per_rank))]
                 if np.any(cyc > 0) else None)
    return {
        "path": path, "N": n, "P": size, "cache": cache,
        "step ms": 1e3 * float(np.median(t.max(axis=0))),
        "step p90 ms": 1e3 * float(np.percentile(t.max(axis=0), 90)),
        "negotiation ms/step": 1e3 * float(np.median(neg.max(axis=0))),
        "negotiation mean ms/step": 1e3 * float(np.mean(neg.max(axis=0))),
        "negotiation us/cycle": None if per_cycle is None else 1e6 * max(per_cycle),
        "least-waiting rank: negotiation ms/step": 1e3 * float(np.median(neg.min(axis=0))),
        "least-waiting rank: negotiation us/cycle": None if per_cycle is None else 1e6 * min(per_cycle),
        "cycles/step": cycles / steps,
        "coordinator rounds/step": rounds / steps,
        "execution ms/step": 1e3 * float(np.median(exe.max(axis=0))),
        "cache hits/step": float(np.sum(per_rank[0]["hits"])) / steps,
        "cache misses/step": float(np.sum(per_rank[0]["misses"])) / steps,
        "build s": build_s,
        "check": "ok" if ok else "FAIL",
        "error": err,
    }


def build_eager(local, n: int):
    """N requests through the C++ submit path, all submitted before any is waited for."""
    import numpy as np

    from jaxcache._ext import ext
    from jaxcache.errors import raise_for_status
    from jaxcache.protocol import NUMPY_DTYPES, Kind

    code = [NUMPY_DTYPES[np.dtype(np.float32)]]
    ins = [np.ascontiguousarray(x) for x in local]
    outs = [np.empty_like(x) for x in ins]
    names = [f"t{i}" for i in range(n)]
    submit = ext.submit

    def run() -> None:
        handles = [submit(Kind.ALLREDUCE, names[i], [ins[i]], [outs[i]], 0, 1.0, 1.0, 0, code)
                   for i in range(n)]
        for h in handles:
            raise_for_status(*h.wait())

    return run, lambda: outs


def build_jit(local, n: int):
    """ONE jitted step of N named allreduces (compiled here, outside the timed steps)."""
    import jax
    import jax.numpy as jnp

    import jaxcache as jc

    xs = [jnp.asarray(x) for x in local]

    def step(xs):
        return [jc.allreduce(x, "sum", name=f"t{i}") for i, x in enumerate(xs)]

    compiled = jax.jit(step).lower(xs).compile()
    last: list[Any] = []

    def run() -> None:
        last[:] = jax.block_until_ready(compiled(xs))

    return run, lambda: last


# --------------------------------------------------------------------------- driver (--sweep)


def run_job(mpirun: Path, procs: int, capacity: int, path: str, ns: list[int], args, out: Path,
            timeout: float) -> tuple[dict | None, str]:
    cmd = [str(mpirun), "-np", str(procs), "-bind-to", "none", sys.executable, str(Path(__file__).resolve()),
           "--path", path, "--n", ",".join(map(str, ns)), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--json", str(out)]
    if args.elems:
        cmd += ["--elems", str(args.elems)]
    env = dict(os.environ, JAXCACHE_CACHE_CAPACITY=str(capacity),
               PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    print(f"$ JAXCACHE_CACHE_CAPACITY={capacity} {' '.join(cmd[:4])} ... {' '.join(cmd[4:])}", flush=True)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpirun and the ranks it forked (one session)
        text, _ = proc.communicate()
        print(text, flush=True)
        return None, f"timed out after {timeout:.0f} s"
    print(text, end="", flush=True)
    if proc.returncode != 0 or not out.is_file():
        return None, f"exit status {proc.returncode}"
    return json.loads(out.read_text()), ""


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v == 0 or abs(v) >= 100:
            return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.1f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def sweep(args: argparse.Namespace) -> int:
    preset = QUICK if args.quick else FULL
    ns = args.n or preset["n"]
    procs = args.procs or preset["procs"]
    paths = args.paths.split(",") if args.paths else preset["paths"]
    jit_n = args.jit_n or preset["jit_n"]
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        print(f"no mpirun next to {sys.executable}", file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    print(f"# control-plane sweep: paths={paths} N={ns} (jit N={jit_n}) P={procs} cache on={CACHE_ON} / off=0; "
          f"{cores} cores: P > {cores} is OVERSUBSCRIBED (ranks time-share the cores)", flush=True)
    print(f"# load average before: {loadavg()} (other jobs on these cores distort every number)", flush=True)
    start = time.monotonic()
    rows: list[dict] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="jaxcache_cp_") as tmp:
        for path in paths:
            for p in procs:
                for capacity in (CACHE_ON, 0):
                    label = f"path={path} P={p} cache={'on' if capacity else 'off'}"
                    left = args.total_budget - (time.monotonic() - start)
                    if left < 20:
                        failures.append(f"{label}: skipped (sweep budget of {args.total_budget:.0f} s spent)")
                        continue
                    out = Path(tmp) / f"{path}_{p}_{capacity}.json"
                    job_ns = [n for n in ns if path != "jit" or n in jit_n] or ns
                    t0 = time.monotonic()
                    res, why = run_job(mpirun, p, capacity, path, job_ns, args, out, min(args.job_timeout, left))
                    print(f"# {label}: {time.monotonic() - t0:.0f} s" + (f" FAILED: {why}" if why else ""), flush=True)
                    if res is None:
                        failures.append(f"{label}: {why}")
                        continue
                    for r in res["rows"]:
                        r["elems"] = res["elems"]
                        rows.append(r)
    report(rows, failures, cores, time.monotonic() - start)
    return 1 if failures else 0


MAXR, MINR = "negotiation", "least-waiting rank: negotiation"


def report(rows: list[dict], failures: list[str], cores: int, wall: float) -> None:
    key = lambda r: (r["path"], r["N"], r["P"], r["cache"] == "off")  # noqa: E731
    rows = sorted(rows, key=key)
    print(f"\n## Control plane: N tiny named allreduces per step, all in flight together\n\n"
          f"Medians over the timed steps (per cycle: median over steps of the step's negotiation / its "
          f"cycles). 'step' and 'negotiation' = slowest rank (negotiation includes "
          f"waiting for peers, e.g. for a peer still submitting); 'least-waiting rank' = the rank with the "
          f"least negotiation time, closest to the control plane's own cost. P > {cores} is "
          f"OVERSUBSCRIBED on this {cores}-core machine: those rows measure OS scheduling as much as "
          f"jaxcache.\n")
    print(table(rows, COLUMNS))
    ratios = []
    by = {(r["path"], r["N"], r["P"], r["cache"] == "off"): r for r in rows}
    div = lambda a, b: (a / b) if (a is not None and b) else None  # noqa: E731
    for (path, n, p, off), r in sorted(by.items()):
        if off or (path, n, p, True) not in by:
            continue
        o = by[(path, n, p, True)]
        ratios.append({"path": path, "N": n, "P": p,
                       "negotiation/step off/on": div(o[f"{MAXR} ms/step"], r[f"{MAXR} ms/step"]),
                       "negotiation/cycle off/on": div(o[f"{MAXR} us/cycle"], r[f"{MAXR} us/cycle"]),
                       "least-waiting negotiation/step off/on": div(o[f"{MINR} ms/step"], r[f"{MINR} ms/step"]),
                       "least-waiting negotiation/cycle off/on": div(o[f"{MINR} us/cycle"], r[f"{MINR} us/cycle"]),
                       "step off/on": div(o["step ms"], r["step ms"]),
                       "coordinator rounds/step on": r["coordinator rounds/step"],
                       "coordinator rounds/step off": o["coordinator rounds/step"]})
    if ratios:
        print("\n## Off/on ratios (> 1: the cache helps)\n")
        print(table(ratios, list(ratios[0])))
    print("\n## Expectations (evaluated on both negotiation metrics)")
    for path in sorted({r["path"] for r in rows}):
        for p in sorted({r["P"] for r in rows if r["path"] == path}):
            on = sorted((r for r in rows if r["path"] == path and r["P"] == p and r["cache"] != "off"
                         and r[f"{MAXR} us/cycle"]), key=lambda r: r["N"])
            if len(on) < 2:
                continue
            lo, hi = on[0], on[-1]
            for label, col in (("slowest rank", f"{MAXR} us/cycle"), ("least-waiting rank", f"{MINR} us/cycle")):
                if not lo[col] or not hi[col]:
                    continue
                f = hi[col] / lo[col]
                print(f"- {path} P={p} cache on, {label}: negotiation/cycle N={lo['N']} -> N={hi['N']}: "
                      f"{fmt(lo[col])} -> {fmt(hi[col])} us (x{f:.2f}; target within 2x: "
                      f"{'met' if 0.5 <= f <= 2 else 'NOT met'})")
    for r in ratios:
        if r["N"] == 1000 and r["P"] == 4:
            a, b, s = r["negotiation/step off/on"], r["least-waiting negotiation/step off/on"], r["step off/on"]
            print(f"- {r['path']} N=1000 P=4: negotiation/step off/on = {fmt(a)} slowest rank, {fmt(b)} "
                  f"least-waiting rank (target >= 10: {'met' if a and a >= 10 else 'NOT met'} / "
                  f"{'met' if b and b >= 10 else 'NOT met'}); step off/on = {fmt(s)} (cache on not slower: "
                  f"{'met' if s and s >= 1 else 'NOT met'})")
    bad = [r for r in rows if r["check"] != "ok"]
    failed = ", ".join(f"{r['path']} N={r['N']} P={r['P']} {r['cache']}" for r in bad)
    print(f"- NumPy check: {failed or ('all ok' if rows else 'no results')}")
    for f in failures:
        print(f"- job {f}")
    print(f"- sweep wall time {wall:.0f} s; load average after: {loadavg()}")


def main() -> int:
    args = parse_args()
    return sweep(args) if args.sweep else worker(args)


if __name__ == "__main__":
    sys.exit(main())
