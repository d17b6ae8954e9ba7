"""reducescatter and alltoall of one float32 tensor, jaxcache against raw MPI and mpi4jax.

    mpirun -np 2 python benchmarks/collectives.py [--ops reducescatter,alltoall]
        [--sizes 1M,4M,16M,64M,100M] [--batches 15] [--json out.json]

For each op and tensor size (bytes of the input on each rank), in the same job:
  mpi4py      Reduce_scatter_block (sum) / Alltoall of the same bytes: the baseline
  mpi4py_xla  the same call reading the JAX input array's own buffer and writing into a
              reused XLA-allocated array: what any MPI binding gets from XLA's memory
              (4 KiB pages where NumPy's large arrays get huge pages)
  mpi4jax     mpi4jax.alltoall under jax.jit (mpi4jax has no reduce-scatter)  (if installed)
  jc_eager    jaxcache.reducescatter / alltoall on a concrete array
  jc_jit      the same inside jax.jit
  jax_call    a trivial jitted call (one element plus one): what JAX's dispatch of any
              jitted call costs, which mpi4py does not pay; the jc_jit/(mpi4py+jax_call)
              column is what jaxcache adds beyond MPI and that
Each method is checked once against NumPy, then timed in batches of back-to-back calls
(barrier before each batch, slowest rank counts), the methods' batches taken in turn, so
that a host that slows down mid-job slows all of them; the median batch is reported per call.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import common  # noqa: E402  (imports mpi4py.MPI first)
from allreduce import calls_per_batch, format_size, parse_size  # noqa: E402
from common import COMM, MPI  # noqa: E402

MIB = 1024 * 1024
DEFAULT_SIZES = [MIB, 4 * MIB, 16 * MIB, 64 * MIB, 100 * MIB]
OPS = ("reducescatter", "alltoall")


def expected(op: str, n: int) -> np.ndarray:
    """What this rank must receive from rank_tensor inputs of n values per rank."""
    size, rank = COMM.Get_size(), COMM.Get_rank()
    block = n // size
    if op == "reducescatter":
        return common.reference([(n,)], size, "sum")[0][rank * block:(rank + 1) * block]
    return np.concatenate([common.rank_tensor((n,), 0, q)[rank * block:(rank + 1) * block] for q in range(size)])


def xla_view(a: Any) -> np.ndarray:
    """A writable NumPy view of a CPU JAX array's buffer (no copy)."""
    pointer = a.unsafe_buffer_pointer()
    raw = (ctypes.c_byte * a.nbytes).from_address(pointer)
    return np.frombuffer(raw, a.dtype).reshape(a.shape)


def methods_for(op: str, x: np.ndarray, jax: Any, jc: Any, m4j: Any) -> dict[str, Callable[[], Any]]:
    """Blocking single-call functions per method, all computing the same result."""
    size = COMM.Get_size()
    if op == "reducescatter":
        recv = np.empty(x.size // size, x.dtype)
        out: dict[str, Callable[[], Any]] = {"mpi4py": lambda: (COMM.Reduce_scatter_block(x, recv, op=MPI.SUM), recv)[1]}
    else:
        recv = np.empty_like(x)
        out = {"mpi4py": lambda: (COMM.Alltoall(x, recv), recv)[1]}
    if jax is not None:
        xj, oj = jax.numpy.asarray(x), jax.numpy.zeros_like(recv) + 1  # XLA's own buffers
        xv, ov = xla_view(xj), xla_view(oj)

        def on_xla_buffers(keep=(xj, oj)):  # `keep`: the views do not own their memory
            if op == "reducescatter":
                COMM.Reduce_scatter_block(xv, ov, op=MPI.SUM)
            else:
                COMM.Alltoall(xv, ov)
            return ov

        out["mpi4py_xla"] = on_xla_buffers
    if m4j is not None and op == "alltoall":
        xb = jax.numpy.asarray(x.reshape(size, -1))  # mpi4jax wants one row per rank

        def one(v):
            r = m4j.alltoall(v, comm=COMM)
            return (r[0] if isinstance(r, tuple) else r).reshape(-1)  # older mpi4jax: (x, token)

        m4j_jit = jax.jit(one)
        out["mpi4jax"] = lambda: jax.block_until_ready(m4j_jit(xb))
    if jc is not None:
        xj = jax.numpy.asarray(x)
        fn = (lambda v: jc.reducescatter(v, "sum", name=f"bench.{op}")) if op == "reducescatter" else \
             (lambda v: jc.alltoall(v, name=f"bench.{op}"))
        jitted = jax.jit(fn)
        out["jc_eager"] = lambda: jax.block_until_ready(fn(xj))
        out["jc_jit"] = lambda: jax.block_until_ready(jitted(xj))
    if jax is not None:
        one = jax.numpy.ones(1, x.dtype)
        trivial = jax.jit(lambda v: v + 1)
        out["jax_call"] = lambda: jax.block_until_ready(trivial(one))
    return out


def check(fn, want) -> str:
    """'' when ``fn`` gives ``want`` on every rank, else why not."""
    note = ""
    try:
        got = np.asarray(fn())
        ok = got.shape == want.shape and np.allclose(got, want, rtol=1e-6)
        note = "" if ok else "WRONG RESULT"
    except Exception as exc:  # noqa: BLE001
        ok, note = False, f"error: {type(exc).__name__}: {exc}"
    if not common.agree(ok):
        return note or "failed on another rank"
    return ""


def interleaved(fns: dict[str, Callable[[], Any]], batches: int, target_s: float) -> dict[str, float]:
    """Median seconds per call of each method, its batches taken in turn with the others'
    (a host that slows down mid-job slows every method alike)."""
    iters = {name: calls_per_batch(fn, target_s) for name, fn in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(batches):
        for name, fn in fns.items():
            times[name] += common.synced_batches(fn, 0, 1, iters[name])
    return {name: common.median(t) for name, t in times.items()}


def run_size(op: str, nbytes: int, mods: dict, batches: int, target_s: float) -> dict[str, Any]:
    size = COMM.Get_size()
    n = nbytes // 4 // size * size
    x = common.rank_tensor((n,), 0, COMM.Get_rank())
    row: dict[str, Any] = {"op": op, "size": format_size(nbytes), "bytes": nbytes}
    notes = []
    meter = common.OtherLoad()
    meter.start()
    good = {}
    for name, fn in methods_for(op, x, mods.get("jax"), mods.get("jc"), mods.get("m4j")).items():
        if name == "jax_call":  # computes nothing to compare
            good[name] = fn
            continue
        note = check(fn, expected(op, n))
        if note:
            notes.append(f"{name}: {note}")
        else:
            good[name] = fn
    for name, seconds in interleaved(good, batches, target_s).items():
        row[f"{name}_us"] = seconds * 1e6
    for name in ("mpi4py_xla", "mpi4jax", "jc_eager", "jc_jit"):
        row[f"{name}/mpi"] = common.ratio(row.get(f"{name}_us"), row.get("mpi4py_us"))
    row["jc_jit/mpi4py_xla"] = common.ratio(row.get("jc_jit_us"), row.get("mpi4py_xla_us"))
    if row.get("mpi4py_us") and row.get("jax_call_us"):
        row["jc_jit/(mpi+call)"] = common.ratio(row.get("jc_jit_us"), row["mpi4py_us"] + row["jax_call_us"])
    return common.finish_row(row, meter, notes)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", default=",".join(OPS), help="comma list of: " + ",".join(OPS))
    p.add_argument("--sizes", default=None, help="comma list of byte sizes per rank, e.g. 1M,64M")
    p.add_argument("--batches", type=int, default=15, help="timed batches per size and method")
    p.add_argument("--batch-ms", type=float, default=50.0, help="target duration of one batch")
    p.add_argument("--json", default=None, help="write results to this JSON file (rank 0)")
    args = p.parse_args(argv)
    args.ops = [o for o in args.ops.split(",") if o]
    for o in args.ops:
        if o not in OPS:
            p.error(f"unknown op {o!r}")
    args.sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    load_before = common.say_load("before")
    mods: dict[str, Any] = {}
    jax, _ = common.optional_import("jax")
    m4j, why_m4j = common.optional_import("mpi4jax", ("alltoall",)) if jax is not None else (None, "no jax")
    jc, why_jc = common.optional_import("jaxcache", ("init", "reducescatter", "alltoall"))
    if jax is not None:
        mods["jax"] = jax
    if m4j is not None:
        mods["m4j"] = m4j
    else:
        common.say("mpi4jax not measured:", why_m4j)
    if jc is not None and jax is not None:
        jc.init()
        mods["jc"] = jc
    else:
        common.say("jaxcache not available:", why_jc or "jax missing")
    rows = []
    try:
        for op in args.ops:
            for nbytes in args.sizes:
                common.say(f"# {op} {format_size(nbytes)}", file=sys.stderr)
                rows.append(run_size(op, nbytes, mods, args.batches, args.batch_ms / 1e3))
    finally:
        if "jc" in mods:
            jc.shutdown()
    columns = ["op", "size", "mpi4py_us", "mpi4py_xla_us", "mpi4jax_us", "jc_eager_us", "jc_jit_us",
               "jax_call_us", "mpi4py_xla/mpi", "mpi4jax/mpi", "jc_eager/mpi", "jc_jit/mpi",
               "jc_jit/mpi4py_xla", "jc_jit/(mpi+call)", "other_load", "note"]
    common.say(f"P={COMM.Get_size()}; size = bytes of each rank's input; mpi4py = Reduce_scatter_block "
               "(sum) / Alltoall; jax_call = a trivial jitted call (JAX's dispatch); "
               "other_load = cores used by processes outside this job (~0 = idle host)")
    common.report(rows, columns, "collectives", args.json, load_before, batches=args.batches)


if __name__ == "__main__":
    main()
