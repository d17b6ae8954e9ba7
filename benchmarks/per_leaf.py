"""Per-leaf allreduces: one named allreduce per small tensor, the way Horovod's hooks and
mpi4jax users call them; response cache on vs off, against mpi4py and mpi4jax.

One command runs the whole sweep (it launches the mpirun jobs itself):

    python benchmarks/per_leaf.py [--procs 2,3,4] [--n 10,100,1000] [--elems 16,256,4096]
        [--paths jit,eager,torch] [--repeats 2] [--steps 10] [--launcher mpirun|jaxcache]
        [--json out.json]

A cell is (path, ranks P, N tensors, E float32 elements each); per step every rank
allreduces (sum) its N tensors:

- ``jit``: ONE jitted step ``[jaxcache.allreduce(x_i, "sum", name=f"s{i}") ...]`` (below
  513 bytes per buffer XLA:CPU runs the calls one after another: N cycles per step);
  ``mpi4jax``: the same step with ``mpi4jax.allreduce``; ``floor``: the same jitted step
  with ``x_i * 2`` instead of the allreduce (JAX's own cost of N leaves).
- ``eager``: a Python loop of N ``jaxcache.allreduce`` calls on concrete arrays (each
  returns its result); ``floor``: the same loop of ``x_i * 2``.
- ``torch``: ``jaxcache.torch.DistributedOptimizer`` over N parameters of E elements: one
  backward (one gradient hook, hence one ``allreduce_async`` per parameter), then
  ``step()``; ``floor``: the same step with the plain optimizer.
- ``mpi4py``: a Python loop of N ``Allreduce`` calls on NumPy arrays (every path).

Each job is one (P, cache setting): ``JAXCACHE_CACHE_CAPACITY=0`` ("off", every cycle
negotiates through rank 0) or 8192 ("on", holding every name of the sweep). Jobs alternate off/on, ``--repeats`` times;
inside a job, the methods of a cell are interleaved over 3 rounds. A step starts with a
barrier; its time is the slowest rank's; a cell reports the median over its steps and
rounds, and medians over the repeats. Counters (cycles, coordinator rounds, data MPI calls,
in-cycle reductions per step) come from ``jaxcache.stats()``. "CPU ms" is the CPU time of all
ranks together in one step (every thread; median over steps): where it approaches the step
time times the cores, the step is bound by CPU, not by waiting. Results are checked against
NumPy on every rank before timing. ``--launcher jaxcache`` starts the jobs with
``python -m jaxcache.run`` instead of plain ``mpirun``. With more ranks than cores
(P > 2 on the 2-core machines) every figure is oversubscribed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = {"off": 0, "on": 8192}  # "on" holds every name of the sweep
ROUNDS = 3


def int_list(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int_list, default=[2, 3, 4])
    p.add_argument("--n", type=int_list, default=[10, 100, 1000])
    p.add_argument("--elems", type=int_list, default=[16, 256, 4096])
    p.add_argument("--paths", default="jit,eager,torch")
    p.add_argument("--repeats", type=int, default=2, help="off/on job pairs per rank count")
    p.add_argument("--steps", type=int, default=10, help="timed steps per method, cell and round")
    p.add_argument("--launcher", choices=["mpirun", "jaxcache"], default="mpirun")
    p.add_argument("--job-timeout", type=float, default=600.0)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --------------------------------------------------------------------------- worker (under mpirun)


def worker(args: argparse.Namespace) -> None:
    import numpy as np
    from mpi4py import MPI

    import jax
    import jax.numpy as jnp
    import jaxcache as jc

    comm = MPI.COMM_WORLD
    jc.init()
    rank, size = comm.rank, comm.size
    paths = args.paths.split(",")
    try:
        import mpi4jax
    except ImportError:
        mpi4jax = None
    if "torch" in paths:
        import torch
        import jaxcache.torch as hvd
        hvd.init()
        torch.set_num_threads(1)

    def timed(fn) -> tuple[float, float]:
        """(step ms of the slowest rank, CPU ms of all ranks together per step), medians."""
        fn()
        ts, cpu = [], []
        for _ in range(args.steps):
            comm.Barrier()
            c, t = time.process_time(), time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)  # every thread of this rank
        slowest, total = np.empty(len(ts)), np.empty(len(cpu))
        comm.Allreduce(np.array(ts), slowest, op=MPI.MAX)
        comm.Allreduce(np.array(cpu), total, op=MPI.SUM)
        return float(np.median(slowest)) * 1e3, float(np.median(total)) * 1e3

    def check(got, want) -> None:
        ok = all(np.array_equal(np.asarray(g), w) for g, w in zip(got, want, strict=True))
        if not comm.allreduce(ok, op=MPI.LAND):
            raise SystemExit(f"per_leaf: wrong result on some rank (N={n} E={e})")

    rows = []
    for path in paths:
        for n in args.n:
            for e in args.elems:
                data = [np.full((e,), float(rank + 1 + i % 5), np.float32) for i in range(n)]
                want = [np.full((e,), float(sum(r + 1 + i % 5 for r in range(size))), np.float32)
                        for i in range(n)]
                outs = [np.empty_like(x) for x in data]

                def mpi4py_loop():
                    for i in range(n):
                        comm.Allreduce(data[i], outs[i])

                methods = {"mpi4py": mpi4py_loop}
                if path == "jit":
                    xs = [jnp.asarray(x) for x in data]
                    step = jax.jit(lambda xs: [jc.allreduce(x, "sum", name=f"s{i}") for i, x in enumerate(xs)])
                    floor = jax.jit(lambda xs: [x * 2 for x in xs])
                    methods["jaxcache"] = lambda: jax.block_until_ready(step(xs))
                    methods["floor"] = lambda: jax.block_until_ready(floor(xs))
                    check(step(xs), want)
                    if mpi4jax is not None:
                        m4j = jax.jit(lambda xs: [mpi4jax.allreduce(x, op=MPI.SUM, comm=comm) for x in xs])
                        methods["mpi4jax"] = lambda: jax.block_until_ready(m4j(xs))
                        check(m4j(xs), want)
                elif path == "eager":
                    xs = [jnp.asarray(x) for x in data]
                    names = [f"e{i}" for i in range(n)]

                    def eager():
                        return [jc.allreduce(x, "sum", name=names[i]) for i, x in enumerate(xs)]

                    methods["jaxcache"] = lambda: jax.block_until_ready(eager())
                    methods["floor"] = lambda: jax.block_until_ready([x * 2 for x in xs])
                    check(eager(), want)
                else:
                    params = [torch.nn.Parameter(torch.zeros(e)) for _ in range(n)]
                    local = [torch.nn.Parameter(torch.zeros(e)) for _ in range(n)]  # floor: no hooks
                    grads = [torch.from_numpy(x) for x in data]
                    plain = torch.optim.SGD(local, lr=0.0)
                    dist = hvd.DistributedOptimizer(
                        torch.optim.SGD(params, lr=0.0), op=hvd.Sum,
                        named_parameters=[(f"p{i}", p) for i, p in enumerate(params)])

                    def torch_step(opt, ps):
                        opt.zero_grad()
                        sum((p * g).sum() for p, g in zip(ps, grads)).backward()
                        opt.step()

                    methods["jaxcache"] = lambda: torch_step(dist, params)
                    methods["floor"] = lambda: torch_step(plain, local)
                    torch_step(dist, params)
                    check([p.grad.numpy() for p in params], want)
                times = {m: [] for m in methods}
                cpu = {m: [] for m in methods}
                before = jc.stats()
                for _ in range(ROUNDS):
                    for m, fn in methods.items():
                        step_ms, cpu_ms = timed(fn)
                        times[m].append(step_ms)
                        cpu[m].append(cpu_ms)
                after = jc.stats()
                calls = ROUNDS * (args.steps + 1)
                counters = {k: (after[k] - before[k]) / calls for k in
                            ("cycles", "coordinator_rounds", "mpi_calls", "in_cycle_reductions")}
                rows.append({"path": path, "P": size, "N": n, "E": e,
                             "ms": {m: statistics.median(v) for m, v in times.items()},
                             "cpu_ms": {m: statistics.median(v) for m, v in cpu.items()}, **counters})
                if rank == 0:
                    print(f"# P={size} {path} N={n} E={e}: " +
                          " ".join(f"{m}={v:.2f}" for m, v in rows[-1]["ms"].items()), flush=True)
                del methods
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps(rows))
    jc.shutdown()


# --------------------------------------------------------------------------- driver


def run_job(args, procs: int, cache: str, out: Path) -> list[dict]:
    bindir = Path(sys.executable).parent
    mpirun = str(bindir / "mpirun") if (bindir / "mpirun").exists() else "mpirun"
    launch = ([sys.executable, "-m", "jaxcache.run", "-np", str(procs)] if args.launcher == "jaxcache"
              else [mpirun, "-np", str(procs), "-bind-to", "none"])
    cmd = launch + [sys.executable, str(Path(__file__).resolve()), "--worker", "--out", str(out),
                    "--n", ",".join(map(str, args.n)), "--elems", ",".join(map(str, args.elems)),
                    "--paths", args.paths, "--steps", str(args.steps)]
    env = dict(os.environ, JAXCACHE_CACHE_CAPACITY=str(CACHE[cache]))
    print(f"$ JAXCACHE_CACHE_CAPACITY={CACHE[cache]} {' '.join(launch)} per_leaf.py --worker ...", flush=True)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=args.job_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        print(f"# job timed out after {args.job_timeout:.0f} s", flush=True)
    for line in text.splitlines():
        if line.startswith("# ") or "Error" in line or "error" in line:
            print(line, flush=True)
    if proc.returncode != 0 or not out.exists():
        print(f"# job failed (exit {proc.returncode})", flush=True)
        return []
    return json.loads(out.read_text())


def fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def summarize(results: dict) -> str:
    """results[(P, cache)] = list of jobs' rows -> one markdown table."""
    cells = {}
    for (procs, cache), jobs in results.items():
        for rows in jobs:
            for r in rows:
                key = (r["path"], r["P"], r["N"], r["E"])
                cells.setdefault(key, {}).setdefault(cache, []).append(r)
    head = ("| path | P | N | E | mpi4py ms | mpi4jax ms | floor ms | off ms | on ms | on/off | "
            "on/mpi4py | on/mpi4jax | cycles off/on | coord. rounds off/on | data MPI calls on | in-cycle on | "
            "CPU ms off/on/floor |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for key in sorted(cells):
        c = cells[key]

        def med(cache: str, method: str) -> float | None:
            vals = [r["ms"][method] for r in c.get(cache, []) if method in r["ms"]]
            return statistics.median(vals) if vals else None

        def cpu(cache: str, method: str) -> float | None:
            vals = [r["cpu_ms"][method] for r in c.get(cache, []) if method in r.get("cpu_ms", {})]
            return statistics.median(vals) if vals else None

        def counter(cache: str, name: str) -> float | None:
            vals = [r[name] for r in c.get(cache, [])]
            return statistics.median(vals) if vals else None

        base = [r["ms"]["mpi4py"] for cache in c for r in c[cache]]
        m4j = [r["ms"]["mpi4jax"] for cache in c for r in c[cache] if "mpi4jax" in r["ms"]]
        floor = [r["ms"]["floor"] for cache in c for r in c[cache]]
        mpi4py = statistics.median(base)
        mpi4jax = statistics.median(m4j) if m4j else None
        off, on = med("off", "jaxcache"), med("on", "jaxcache")
        # on / mpi4py per job (same job, same host state), median over the "on" jobs
        on_py = [r["ms"]["jaxcache"] / r["ms"]["mpi4py"] for r in c.get("on", [])]
        on_m4j = [r["ms"]["jaxcache"] / r["ms"]["mpi4jax"] for r in c.get("on", []) if "mpi4jax" in r["ms"]]
        ratio = lambda a, b: None if a is None or b is None else a / b  # noqa: E731
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {fmt(mpi4py)} | {fmt(mpi4jax)} | "
            f"{fmt(statistics.median(floor))} | {fmt(off)} | {fmt(on)} | {fmt(ratio(on, off))} | "
            f"{fmt(statistics.median(on_py) if on_py else None)} | "
            f"{fmt(statistics.median(on_m4j) if on_m4j else None)} | "
            f"{fmt(counter('off', 'cycles'), 0)}/{fmt(counter('on', 'cycles'), 0)} | "
            f"{fmt(counter('off', 'coordinator_rounds'), 0)}/{fmt(counter('on', 'coordinator_rounds'), 0)} | "
            f"{fmt(counter('on', 'mpi_calls'), 0)} | {fmt(counter('on', 'in_cycle_reductions'), 0)} | "
            f"{fmt(cpu('off', 'jaxcache'), 1)}/{fmt(cpu('on', 'jaxcache'), 1)}/{fmt(cpu('on', 'floor'), 1)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    print(f"# per_leaf: procs={args.procs} N={args.n} E={args.elems} paths={args.paths} "
          f"repeats={args.repeats} steps={args.steps} launcher={args.launcher} cores={os.cpu_count()}",
          flush=True)
    results: dict = {}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for procs in args.procs:
                for cache in ("off", "on") if rep % 2 == 0 else ("on", "off"):
                    out = Path(tmp) / f"{procs}-{cache}-{rep}.json"
                    results.setdefault((procs, cache), []).append(run_job(args, procs, cache, out))
    table = summarize(results)
    print(f"\n## per-leaf allreduces, medians ({time.time() - t0:.0f} s)\n\n{table}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({f"{p}-{c}": v for (p, c), v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
