"""Benchmark (not a test): allreduce of the ResNet-50 gradient set across 2 netns hosts.

    sudo /path/to/venv/bin/python tests/multihost/bench_multihost.py [--steps 10]
        [--hosts 2] [--ranks-per-host 2] [--netmod ofi|ucx] [--set resnet50|small]
        [--json out.json]

Creates the namespaces (netns.py), then runs this same file under mpiexec
(harness.py) in worker mode.  Methods, each timed per step (slowest rank), median
over --steps after --warmup steps:
  mpi4py per tensor   one MPI Allreduce per tensor (161 calls for ResNet-50)
  mpi4py fused        one Allreduce of a pre-packed contiguous buffer (the bound)
  jaxcache grouped    jax.jit(jaxcache.grouped_allreduce) of the {name: array} dict,
                      only when jaxcache imports (donated inputs, output fed back)
plus per-tensor medians of the per-tensor method (--json) and the veth bytes per step.
Shapes: $JAXCACHE_RESNET50_SHAPES or <repo>/../shared/resnet50_grad_shapes.json.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SHAPES_ENV = "JAXCACHE_RESNET50_SHAPES"


def shapes_path():
    p = os.environ.get(SHAPES_ENV)
    if p:
        return p
    for c in (os.path.join(REPO, "..", "shared", "resnet50_grad_shapes.json"),
              os.path.join(REPO, "shared", "resnet50_grad_shapes.json")):
        if os.path.isfile(c):
            return os.path.abspath(c)
    raise FileNotFoundError(f"resnet50_grad_shapes.json not found; set {SHAPES_ENV}")


def gradient_set(name):
    if name == "resnet50":
        with open(shapes_path()) as f:
            return [(e["name"], tuple(e["shape"])) for e in json.load(f)]
    if name == "small":
        return [(f"t{i:04d}", (1024,)) for i in range(1000)]
    raise ValueError(name)


# ------------------------------------------------------------------ worker side
def worker(a):
    from mpi4py import MPI
    import numpy as np

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    tensors = gradient_set(a.set)
    rng = np.random.default_rng(rank)
    xs = [rng.standard_normal(math.prod(s), dtype=np.float32).reshape(s) * 1e-3 for _, s in tensors]
    ys = [np.empty_like(x) for x in xs]
    total = sum(x.nbytes for x in xs)
    results = {"set": a.set, "tensors": len(xs), "bytes": total, "size": size, "methods": {}}

    def timed_steps(fn, per_tensor=None):
        times = []
        for s in range(a.warmup + a.steps):
            comm.Barrier()
            t0 = time.perf_counter()
            fn(s >= a.warmup)
            dt = time.perf_counter() - t0
            if s >= a.warmup:
                times.append(dt)
        step_max = np.max(np.array(comm.allgather(times)), axis=0)  # slowest rank per step
        return step_max

    # mpi4py, one Allreduce per tensor (also per-tensor timings)
    per = np.zeros((a.steps, len(xs)))
    k = {"step": 0}

    def per_tensor(record):
        for i, (x, y) in enumerate(zip(xs, ys)):
            t = time.perf_counter()
            comm.Allreduce(x, y, op=MPI.SUM)
            if record:
                per[k["step"], i] = time.perf_counter() - t
        if record:
            k["step"] += 1

    st = timed_steps(per_tensor)
    results["methods"]["mpi4py per tensor"] = st.tolist()
    per_all = np.max(np.array(comm.allgather(per)), axis=0)
    results["per_tensor_median_s"] = {
        name: float(v) for (name, _), v in zip(tensors, np.median(per_all, axis=0))}

    # mpi4py, one pre-fused contiguous buffer (packing not timed: the practical bound)
    fused = {"in": np.concatenate([x.ravel() for x in xs])}
    fused["out"] = np.empty_like(fused["in"])
    st = timed_steps(lambda rec: comm.Allreduce(fused["in"], fused["out"], op=MPI.SUM))
    results["methods"]["mpi4py fused (1 buffer)"] = st.tolist()
    fused.clear()  # free 2 x 102 MB before the jaxcache column

    # jaxcache grouped_allreduce under jit
    if a.jaxcache:
        try:
            import jax
            import jaxcache
        except Exception as e:  # noqa: BLE001
            results["jaxcache_error"] = repr(e)
        else:
            jaxcache.init()
            step = jax.jit(lambda t: jaxcache.grouped_allreduce(t, op="sum", name="bench.grads"),
                           donate_argnums=0)
            tree = {name: jax.numpy.asarray(x) for (name, _), x in zip(tensors, xs)}
            box = {"t": tree}

            def jc_step(rec):
                box["t"] = step(box["t"])
                jax.block_until_ready(box["t"])

            st = timed_steps(jc_step)
            results["methods"]["jaxcache grouped (jit)"] = st.tolist()
            jaxcache.shutdown()

    if rank == 0:
        sys.stdout.write("\nJC-BENCH " + json.dumps(results) + "\n")
        sys.stdout.flush()


# ------------------------------------------------------------------ driver side
def driver(a):
    import re
    import statistics

    sys.path.insert(0, HERE)
    from harness import run_job
    from netns import NetnsCluster

    pythonpath = []
    spec = None
    if not a.no_jaxcache:
        spec = importlib.util.find_spec("jaxcache")
        if spec is None and os.path.isfile(os.path.join(REPO, "jaxcache", "__init__.py")):
            sys.path.insert(0, REPO)  # source checkout (extension built in place)
            spec = importlib.util.find_spec("jaxcache")
    use_jc = spec is not None
    if use_jc:
        pythonpath = [os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))]
    args = ["--worker", "--set", a.set, "--steps", a.steps, "--warmup", a.warmup]
    if use_jc:
        args.append("--jaxcache")
    with NetnsCluster(a.hosts) as cl:
        res = run_job(cl, os.path.abspath(__file__), args, ranks_per_host=a.ranks_per_host,
                      netmod=a.netmod, timeout=a.timeout, pythonpath=pythonpath)
    m = re.search(r"JC-BENCH (\{.*\})", res.stdout)
    if res.rc != 0 or not m:
        print(res.describe())
        return 1
    r = json.loads(m.group(1))
    steps_total = a.steps + a.warmup
    n_methods = len(r["methods"])
    print(f"{a.set}: {r['tensors']} float32 tensors, {r['bytes'] / 1e6:.1f} MB per rank; "
          f"{a.hosts} hosts x {a.ranks_per_host} ranks (netns, veth, MPICH ch4:{a.netmod} over TCP); "
          f"median of {a.steps} steps, slowest rank")
    print(f"{'method':<28}{'median ms':>10}{'min ms':>9}{'max ms':>9}")
    for name, ts in r["methods"].items():
        ms = [t * 1e3 for t in ts]
        print(f"{name:<28}{statistics.median(ms):>10.1f}{min(ms):>9.1f}{max(ms):>9.1f}")
    if "jaxcache_error" in r:
        print("jaxcache column skipped:", r["jaxcache_error"])
    elif not use_jc:
        print("jaxcache column skipped: jaxcache not importable")
    tx = {h: t["tx_bytes"] for h, t in res.traffic.items()}
    print(f"veth tx bytes per step (all methods, incl. warmup): "
          f"{ {h: round(v / (steps_total * n_methods) / 1e6, 1) for h, v in tx.items()} } MB")
    per = r["per_tensor_median_s"]
    top = sorted(per.items(), key=lambda kv: -kv[1])[:5]
    print("slowest tensors (per-tensor median ms): "
          + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in top))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "result": r, "traffic": res.traffic}, f, indent=1)
        print("wrote", a.json)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--jaxcache", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-jaxcache", action="store_true", help="skip the jaxcache column")
    ap.add_argument("--set", default="resnet50", choices=["resnet50", "small"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--netmod", default="ofi", choices=["ofi", "ucx"])
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", help="write all timings (incl. per tensor) here")
    a = ap.parse_args()
    return worker(a) if a.worker else driver(a)


if __name__ == "__main__":
    sys.exit(main() or 0)
