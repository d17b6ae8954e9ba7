"""Quick benchmark: reducing a gradient set with jaxcache vs raw MPI and peers.

    mpirun -np 2 python -m jaxcache.bench [--out DIR] [--tensors 10,100,1000]
        [--sizes 1MB,16MB,100MB] [--methods ...] [--budget 1.0]

For every (number of tensors, total bytes) of the sweep, each method reduces
the same list of float32 arrays (equal sizes) and is timed per step (a barrier
before each step; the slowest rank counts; median over steps):

  jaxcache        jaxcache.grouped_allreduce(tree, "average") inside jax.jit
  mpi_fused       mpi4py Allreduce of one pre-packed buffer of the same bytes:
                  the practical limit for the set (no packing cost at all)
  mpi_per_tensor  mpi4py Allreduce of each array
  mpi4jax         mpi4jax.allreduce per leaf inside jax.jit      (if installed)
  torch_gloo      torch.distributed gloo, 25 MB buckets like DDP  (if installed)
  jax_floor       the same jitted call without communication: every leaf times 1/size
                  into a fresh output (what JAX itself costs to hand back new arrays)

The table's vs_floor_mpi column is the median divided by (jax_floor + the faster of
mpi_fused and mpi_per_tensor): 1.0 means jaxcache adds nothing to JAX's own cost plus the
best raw MPI strategy. With donated inputs (jax.jit(..., donate_argnums=0)), "jaxcache
(donated)" reduces large leaves in place with no copy and no fresh buffer; its limit is the
raw MPI strategy itself (vs_mpi_best).

Each method is checked once against NumPy before it is timed. Rank 0 writes
DIR/bench.md (a markdown table), DIR/bench.json and DIR/bench.png (step time
vs number of tensors, one panel per total size; needs matplotlib).

A second table (--collectives, default reducescatter,alltoall) times one float32
tensor of each total size per rank: jaxcache.reducescatter (sum) / alltoall inside
jax.jit against mpi4py Reduce_scatter_block / Alltoall of the same bytes (the
baseline), and mpi4jax.alltoall under jax.jit when installed (mpi4jax has no
reduce-scatter).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from mpi4py import MPI  # first: loads the MPI library the other modules use

import numpy as np

COMM = MPI.COMM_WORLD
MB = 1_000_000
DDP_BUCKET_BYTES = 25 * 1024 * 1024
ALL_METHODS = ("jaxcache", "jaxcache_donated", "mpi_fused", "mpi_per_tensor", "jax_floor",
               "mpi4jax", "torch_gloo")
BASELINE = "mpi_fused"
# Always measured: the columns that compare against the limits need them.
REFERENCE_METHODS = ("mpi_fused", "mpi_per_tensor", "jax_floor")
COLLECTIVES = ("reducescatter", "alltoall")


def say(*args: Any, **kwargs: Any) -> None:
    if COMM.rank == 0:
        print(*args, flush=True, **kwargs)


def agree(flag: bool) -> bool:
    return bool(COMM.allreduce(bool(flag), op=MPI.LAND))


def parse_bytes(text: str) -> int:
    t = text.strip().upper().removesuffix("B")
    scale = {"K": 1000, "M": MB, "G": 1000 * MB}.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in "KMG" else t
    return int(float(digits) * scale)


def fmt_bytes(n: int) -> str:
    return f"{n / MB:g} MB" if n >= MB else f"{n / 1000:g} KB"


# --- data ---------------------------------------------------------------------


def make_set(n: int, total: int, rank: int) -> list[np.ndarray]:
    """`n` float32 arrays of (about) total/n bytes; small integers keep sums exact."""
    each = max(1, total // (4 * n))
    return [((np.arange(each, dtype=np.int64) + 7 * i) % 13 + rank).astype(np.float32) for i in range(n)]


def reference(n: int, total: int, size: int, op: str) -> list[np.ndarray]:
    if op == "floor":  # no communication: this rank's arrays scaled by 1/size
        return [(a / size).astype(np.float32) for a in make_set(n, total, COMM.rank)]
    base = make_set(n, total, 0)
    shift = size * (size - 1) / 2
    return [((a.astype(np.float64) * size + shift) / (size if op == "average" else 1)).astype(np.float32)
            for a in base]


@dataclass
class Method:
    step: Callable[[], Any]           # one blocking step
    fetch: Callable[[Any], list]      # its output as NumPy arrays
    op: str                           # "sum", "average" or "floor"
    prepare: Callable[[], None] | None = None  # untimed, before each step


# --- methods ------------------------------------------------------------------


def build_mpi_fused(local: list[np.ndarray], mods: dict) -> Method:
    send = np.concatenate(local)
    recv = np.empty_like(send)
    splits = np.cumsum([a.size for a in local])[:-1]

    def step():
        COMM.Allreduce(send, recv, op=MPI.SUM)
        return recv

    return Method(step, lambda r: np.split(r, splits), "sum")


def build_mpi_per_tensor(local: list[np.ndarray], mods: dict) -> Method:
    recvs = [np.empty_like(a) for a in local]

    def step():
        for a, r in zip(local, recvs):
            COMM.Allreduce(a, r, op=MPI.SUM)
        return recvs

    return Method(step, list, "sum")


def build_jaxcache(local: list[np.ndarray], mods: dict) -> Method:
    jax, jc = mods["jax"], mods["jaxcache"]
    tree = [jax.numpy.asarray(a) for a in local]
    reduce = jax.jit(lambda t: jc.grouped_allreduce(t, op="average", name="bench"))
    return Method(lambda: jax.block_until_ready(reduce(tree)), lambda out: [np.asarray(x) for x in out],
                  "average")


def build_jaxcache_donated(local: list[np.ndarray], mods: dict) -> Method:
    """The gradients are donated: large leaves are reduced in their own buffers."""
    jax, jc = mods["jax"], mods["jaxcache"]
    reduce = jax.jit(lambda t: jc.grouped_allreduce(t, op="average", name="bench.donated"),
                     donate_argnums=0)
    state: dict[str, list] = {}

    def prepare():  # a fresh tree to donate, made before the timed step
        state["tree"] = jax.block_until_ready([jax.numpy.array(a) for a in local])

    def step():
        if "tree" not in state:
            prepare()
        return jax.block_until_ready(reduce(state.pop("tree")))

    return Method(step, lambda out: [np.asarray(x) for x in out], "average", prepare)


def build_jax_floor(local: list[np.ndarray], mods: dict) -> Method:
    jax = mods["jax"]
    tree = [jax.numpy.asarray(a) for a in local]
    scale = np.float32(1.0 / COMM.size)
    reduce = jax.jit(lambda t: [x * scale for x in t])
    return Method(lambda: jax.block_until_ready(reduce(tree)), lambda out: [np.asarray(x) for x in out],
                  "floor")


def build_mpi4jax(local: list[np.ndarray], mods: dict) -> Method:
    jax, m4j = mods["jax"], mods["mpi4jax"]
    tree = [jax.numpy.asarray(a) for a in local]
    size = COMM.size

    def one(x):
        r = m4j.allreduce(x, op=MPI.SUM)
        return (r[0] if isinstance(r, tuple) else r) / size  # older mpi4jax returns (x, token)

    reduce = jax.jit(lambda t: [one(x) for x in t])
    return Method(lambda: jax.block_until_ready(reduce(tree)), lambda out: [np.asarray(x) for x in out],
                  "average")


def ddp_buckets(nbytes: Sequence[int], cap: int = DDP_BUCKET_BYTES) -> list[list[int]]:
    """Reverse order; a bucket closes once it holds `cap` bytes (like DDP)."""
    buckets: list[list[int]] = [[]]
    filled = 0
    for i in reversed(range(len(nbytes))):
        buckets[-1].append(i)
        filled += nbytes[i]
        if filled >= cap:
            buckets.append([])
            filled = 0
    return [b for b in buckets if b]


def ddp_allreduce(torch: Any, grads: list, size: int) -> Callable[[], list]:
    """A step that averages `grads` as PyTorch DDP does over torch.distributed: buckets in
    reverse order, each flattened into one asynchronous all_reduce; returns the results."""
    dist = torch.distributed
    outs = [torch.empty_like(g) for g in grads]
    buckets = ddp_buckets([g.numel() * g.element_size() for g in grads])

    def step():
        pending = []
        for bucket in buckets:
            flat = torch.cat([grads[i].reshape(-1) for i in bucket])
            pending.append((bucket, flat, dist.all_reduce(flat, async_op=True)))
        for bucket, flat, work in pending:
            work.wait()
            flat.div_(size)
            for i, chunk in zip(bucket, flat.split([grads[i].numel() for i in bucket])):
                outs[i].copy_(chunk.view_as(outs[i]))
        return outs

    return step


def build_torch_gloo(local: list[np.ndarray], mods: dict) -> Method:
    torch = mods["torch"]
    step = ddp_allreduce(torch, [torch.from_numpy(a) for a in local], COMM.size)
    return Method(step, lambda out: [t.numpy() for t in out], "average")


def collective_input(total: int, rank: int) -> np.ndarray:
    """`total` bytes of float32 per rank (a multiple of the number of ranks)."""
    n = max(COMM.size, total // 4 // COMM.size * COMM.size)
    return ((np.arange(n, dtype=np.int64) % 13) + rank).astype(np.float32)


def collective_reference(kind: str, total: int) -> np.ndarray:
    size, rank = COMM.size, COMM.rank
    block = collective_input(total, 0).size // size
    mine = slice(rank * block, (rank + 1) * block)
    if kind == "reducescatter":
        return (collective_input(total, 0)[mine].astype(np.float64) * size + size * (size - 1) / 2).astype(np.float32)
    return np.concatenate([collective_input(total, q)[mine] for q in range(size)])


def build_collective(kind: str, method: str, total: int, mods: dict) -> Method:
    """One reducescatter (sum) or alltoall of `total` bytes per rank by `method`."""
    x = collective_input(total, COMM.rank)
    if method == "mpi4py":
        if kind == "reducescatter":
            recv = np.empty(x.size // COMM.size, x.dtype)
            step = lambda: (COMM.Reduce_scatter_block(x, recv, op=MPI.SUM), recv)[1]  # noqa: E731
        else:
            recv = np.empty_like(x)
            step = lambda: (COMM.Alltoall(x, recv), recv)[1]  # noqa: E731
        return Method(step, lambda r: [r], "sum")
    jax = mods["jax"]
    if method == "mpi4jax":
        m4j = mods["mpi4jax"]
        rows = jax.numpy.asarray(x.reshape(COMM.size, -1))  # mpi4jax: one row per rank

        def one(v):
            r = m4j.alltoall(v, comm=COMM)
            return (r[0] if isinstance(r, tuple) else r).reshape(-1)

        fn = jax.jit(one)
        return Method(lambda: jax.block_until_ready(fn(rows)), lambda out: [np.asarray(out)], "sum")
    jc = mods["jaxcache"]
    if kind == "reducescatter":
        fn = jax.jit(lambda v: jc.reducescatter(v, "sum", name="bench.reducescatter"))
    else:
        fn = jax.jit(lambda v: jc.alltoall(v, name="bench.alltoall"))
    xj = jax.numpy.asarray(x)
    return Method(lambda: jax.block_until_ready(fn(xj)), lambda out: [np.asarray(out)], "sum")


def collective_methods(kind: str, methods: Sequence[str]) -> list[str]:
    out = ["mpi4py"]
    if "jaxcache" in methods:
        out.append("jaxcache")
    if "mpi4jax" in methods and kind == "alltoall":
        out.append("mpi4jax")
    return out


BUILDERS: dict[str, tuple[Callable[[list, dict], Method], tuple[str, ...]]] = {
    "jaxcache": (build_jaxcache, ("jax", "jaxcache")),
    "jaxcache_donated": (build_jaxcache_donated, ("jax", "jaxcache")),
    "jax_floor": (build_jax_floor, ("jax",)),
    "mpi_fused": (build_mpi_fused, ()),
    "mpi_per_tensor": (build_mpi_per_tensor, ()),
    "mpi4jax": (build_mpi4jax, ("jax", "mpi4jax")),
    "torch_gloo": (build_torch_gloo, ("torch",)),
}


# --- modules ------------------------------------------------------------------


def optional_import(name: str) -> tuple[Any, str | None]:
    """Imports `name` on every rank; (module, None) or (None, why) everywhere."""
    import importlib

    try:
        module, why = importlib.import_module(name), None
    except Exception as e:  # ImportError, or OSError from a shared library
        module, why = None, f"{type(e).__name__}: {e}"
    if not agree(module is not None):
        return None, why or "unavailable on another rank"
    return module, None


def load_modules(methods: Sequence[str]) -> tuple[dict, dict]:
    wanted = {d for m in methods for d in BUILDERS[m][1]}
    mods: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name in ("jax", "mpi4jax", "jaxcache", "torch"):  # jax before its MPI users
        if name in wanted:
            module, why = optional_import(name)
            if module is None:
                failed[name] = why
            else:
                mods[name] = module
    if "jaxcache" in mods:
        mods["jaxcache"].init()
    if "torch" in mods and "torch_gloo" in methods:
        # One intra-op thread per rank: the ranks already share the cores, and torch's
        # OpenMP workers spin after each op, stealing the core from the next method timed
        # (measured: jaxcache's 100 x 1 MB step went from 22 to 49 ms behind torch_gloo).
        mods["torch"].set_num_threads(1)
        try:
            port = 0
            if COMM.rank == 0:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(COMM.bcast(port)),
                              RANK=str(COMM.rank), WORLD_SIZE=str(COMM.size))
            mods["torch"].distributed.init_process_group("gloo", init_method="env://")
        except Exception as e:
            failed["torch"] = f"gloo init failed: {e}"
            del mods["torch"]
    return mods, failed


def stop_modules(mods: dict) -> None:
    if "jaxcache" in mods:
        COMM.Barrier()
        mods["jaxcache"].shutdown()
    if "torch" in mods and mods["torch"].distributed.is_initialized():
        mods["torch"].distributed.destroy_process_group()


# --- timing -------------------------------------------------------------------


def steps_for(method: Method, budget_s: float, min_steps: int, max_steps: int) -> int:
    """How many steps fit `budget_s` (agreed by every rank; includes a warm-up step)."""
    if method.prepare:
        method.prepare()
    t0 = time.perf_counter()
    method.step()
    first = COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    return int(max(min_steps, min(max_steps, budget_s / max(first, 1e-6))))


def timed_steps(method: Method, n: int) -> list[float]:
    """`n` barrier-synced steps; the slowest rank's time of each."""
    local = np.empty(n)
    for i in range(n):
        if method.prepare:
            method.prepare()
        COMM.Barrier()
        t = time.perf_counter()
        method.step()
        local[i] = time.perf_counter() - t
    slowest = np.empty_like(local)
    COMM.Allreduce(local, slowest, op=MPI.MAX)
    return slowest.tolist()


def build_checked(name: str, n: int, total: int, mods: dict, kind: str | None = None
                  ) -> tuple[Method | None, str]:
    """Builds a method (a gradient set of `n` tensors, or one `kind` collective) and checks
    its result once against NumPy (this also compiles jitted ones)."""
    try:
        if kind is None:
            method = BUILDERS[name][0](make_set(n, total, COMM.rank), mods)
            want = reference(n, total, COMM.size, method.op)
        else:
            method = build_collective(kind, name, total, mods)
            want = [collective_reference(kind, total)]
        got = method.fetch(method.step())
        ok = len(got) == len(want) and all(
            np.asarray(g).shape == w.shape and np.allclose(g, w, rtol=1e-6) for g, w in zip(got, want))
        note = "" if ok else "WRONG RESULT"
    except Exception as e:
        traceback.print_exc()
        ok, note, method = False, f"error: {type(e).__name__}: {e}", None
    if not agree(ok):
        return None, note or "failed on another rank"
    return method, note


def run_point(names: Sequence[str], n: int, total: int, mods: dict, args,
              kind: str | None = None) -> list[dict]:
    """Every method at one point, timed in interleaved rounds (noise hits them alike)."""
    built = {m: build_checked(m, n, total, mods, kind) for m in names}
    methods = {m: meth for m, (meth, _) in built.items() if meth is not None}
    per_round = {m: max(1, steps_for(meth, args.budget, args.min_steps, args.max_steps) // args.rounds)
                 for m, meth in methods.items()}
    times: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(args.rounds):
        for m, meth in methods.items():
            times[m] += timed_steps(meth, per_round[m])
    rows = []
    for m in names:
        row = {"tensors": n, "bytes": total, "size": fmt_bytes(total), "method": m, "note": built[m][1]}
        if m in times:
            t = times[m]
            row.update(median_ms=float(np.median(t)) * 1e3, p10_ms=float(np.percentile(t, 10)) * 1e3,
                       p90_ms=float(np.percentile(t, 90)) * 1e3, steps=len(t))
        rows.append(row)
    return rows


# --- output -------------------------------------------------------------------


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def table(rows: list[dict], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def plot(rows: list[dict], methods: Sequence[str], counts: Sequence[int], sizes: Sequence[int],
         path: Path) -> str | None:
    """Writes the PNG (top: time vs number of tensors per total size; bottom: time vs
    total size per number of tensors); returns why not when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except ImportError:
        return ("matplotlib is not installed, so no plot was written: pip install matplotlib "
                "(or pip install 'jaxcache[examples]')")
    cols = max(len(sizes), len(counts))
    fig, axes = plt.subplots(2, cols, figsize=(4.2 * cols, 7.2), squeeze=False)
    panels = [(axes[0][i], "bytes", total, "tensors", f"{fmt_bytes(total)} in total", "number of tensors")
              for i, total in enumerate(sizes)]
    panels += [(axes[1][i], "tensors", n, "bytes", f"{n} tensors", "total bytes (MB)")
               for i, n in enumerate(counts)]
    used = set()
    for ax, fixed_key, fixed, x_key, title, xlabel in panels:
        used.add(id(ax))
        xs = set()
        for m in methods:
            pts = sorted((r[x_key] / (MB if x_key == "bytes" else 1), r["median_ms"]) for r in rows
                         if r["method"] == m and r[fixed_key] == fixed and r.get("median_ms") is not None)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=m)
                xs.update(x for x, _ in pts)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(ticker.NullFormatter())
        if xs:
            ax.set_xticks(sorted(xs))
        ax.set_title(f"{title}, P={COMM.size}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("step time (ms, median)")
        ax.grid(True, which="both", alpha=0.3)
    for row in axes:
        for ax in row:
            if id(ax) not in used:
                ax.axis("off")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jaxcache.bench", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_results", help="output directory (rank 0 writes it)")
    p.add_argument("--tensors", default="10,100,1000", help="comma list of tensor counts")
    p.add_argument("--sizes", default="1MB,16MB,100MB", help="comma list of total bytes (KB/MB/GB = 10^3/10^6/10^9)")
    p.add_argument("--methods", default=",".join(ALL_METHODS), help="comma list of: " + ",".join(ALL_METHODS))
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help="comma list of single-tensor collectives to time as well ('' for none): "
                        + ",".join(COLLECTIVES))
    p.add_argument("--budget", type=float, default=0.6, help="seconds of timed steps per method and point")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per point")
    p.add_argument("--min-steps", type=int, default=6)
    p.add_argument("--max-steps", type=int, default=50)
    args = p.parse_args(argv)
    args.tensors = [int(x) for x in args.tensors.split(",") if x]
    args.sizes = [parse_bytes(x) for x in args.sizes.split(",") if x]
    args.methods = [m for m in args.methods.split(",") if m]
    args.collectives = [c for c in args.collectives.split(",") if c]
    for c in args.collectives:
        if c not in COLLECTIVES:
            p.error(f"unknown collective {c!r}; choose from {', '.join(COLLECTIVES)}")
    for m in args.methods:
        if m not in BUILDERS:
            p.error(f"unknown method {m!r}; choose from {', '.join(ALL_METHODS)}")
    for ref in reversed(REFERENCE_METHODS):  # ratios need the limits from the same job
        if ref not in args.methods:
            args.methods.insert(0, ref)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    mods, failed = load_modules(args.methods)
    skipped = {m: "; ".join(f"{d}: {failed[d]}" for d in BUILDERS[m][1] if d in failed)
               for m in args.methods if any(d in failed for d in BUILDERS[m][1])}
    for m, why in skipped.items():
        say(f"# {m}: skipped ({why})", file=sys.stderr)
    methods = [m for m in args.methods if m not in skipped]
    try:
        rows, collective_rows = measure(methods, mods, args)
    finally:
        stop_modules(mods)
    add_ratios(rows, collective_rows)
    if COMM.rank == 0:
        write_report(args, methods, rows, collective_rows, skipped, time.perf_counter() - t_start)
    return 0


def measure(methods: list[str], mods: dict, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Every point of the sweep: (grouped allreduce rows, one-tensor collective rows)."""
    rows: list[dict] = []
    collective_rows: list[dict] = []
    for total in args.sizes:
        for n in args.tensors:
            say(f"# {n} tensors, {fmt_bytes(total)}", file=sys.stderr)
            rows += run_point(methods, n, total, mods, args)
            gc.collect()
    for kind in args.collectives:
        for total in args.sizes:
            say(f"# {kind}, {fmt_bytes(total)} per rank", file=sys.stderr)
            for r in run_point(collective_methods(kind, methods), 1, total, mods, args, kind=kind):
                del r["tensors"]
                collective_rows.append({"collective": kind, **r})
            gc.collect()
    return rows, collective_rows


def add_ratios(rows: list[dict], collective_rows: list[dict]) -> None:
    """vs_mpi_best and vs_floor_mpi per row; vs_mpi4py per collective row."""
    for r in rows:
        same = {b["method"]: b.get("median_ms") for b in rows
                if b["tensors"] == r["tensors"] and b["bytes"] == r["bytes"]}
        mpi = [v for k, v in same.items() if k in ("mpi_fused", "mpi_per_tensor") and v]
        best = min(mpi) if mpi else None
        floor = same.get("jax_floor")
        med = r.get("median_ms")
        r["vs_mpi_best"] = med / best if best and med else None
        r["vs_floor_mpi"] = med / (floor + best) if best and floor and med else None
    for r in collective_rows:
        base = next((b.get("median_ms") for b in collective_rows if b["method"] == "mpi4py"
                     and b["collective"] == r["collective"] and b["bytes"] == r["bytes"]), None)
        r["vs_mpi4py"] = r["median_ms"] / base if base and r.get("median_ms") else None


def write_report(args: argparse.Namespace, methods: list[str], rows: list[dict], collective_rows: list[dict],
                 skipped: dict, elapsed: float) -> None:
    """Rank 0: bench.md, bench.json and bench.png under --out, and the table on stdout."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    columns = ["tensors", "size", "method", "median_ms", "p10_ms", "p90_ms", "vs_mpi_best",
               "vs_floor_mpi", "steps", "note"]
    header = (f"# jaxcache quick benchmark\n\nP={COMM.size} ranks, {platform.node()}, "
              f"{MPI.Get_library_version().splitlines()[0].strip()}; float32 arrays of equal size; "
              f"median step time over barrier-synced steps, slowest rank. vs_mpi_best = median / "
              f"the faster raw MPI strategy (mpi_fused: one pre-packed buffer; mpi_per_tensor); "
              f"vs_floor_mpi = median / (jax_floor + that strategy): what jaxcache adds to JAX's "
              f"own cost of returning new arrays plus the best raw MPI.\n")
    if skipped:
        header += "\nNot measured: " + "; ".join(f"{m} ({why})" for m, why in skipped.items()) + "\n"
    md = header + "\n" + table(rows, columns) + "\n"
    if collective_rows:
        md += ("\nOne float32 tensor of `size` bytes per rank; jaxcache and mpi4jax under jax.jit; "
               "vs_mpi4py = median / mpi4py Reduce_scatter_block (sum) or Alltoall of the same "
               "bytes.\n\n" + table(collective_rows, ["collective", "size", "method", "median_ms", "p10_ms",
                                                      "p90_ms", "vs_mpi4py", "steps", "note"]) + "\n")
    (out / "bench.md").write_text(md)
    (out / "bench.json").write_text(json.dumps({"P": COMM.size, "rows": rows,
                                                "collective_rows": collective_rows, "skipped": skipped,
                                                "seconds": elapsed}, indent=2) + "\n")
    print(md, flush=True)
    why = plot(rows, methods, args.tensors, args.sizes, out / "bench.png")
    if why:
        print(f"note: {why}", flush=True)
    print(f"wrote {out / 'bench.md'}, {out / 'bench.json'}" + ("" if why else f", {out / 'bench.png'}")
          + f" in {elapsed:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
