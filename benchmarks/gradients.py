"""Gradient-set allreduce: jaxcache against raw MPI and peer libraries.

    mpirun -np 2 python benchmarks/gradients.py [--steps 30] [--sets resnet50,small]
        [--methods mpi_fused,mpi_per_tensor,...] [--json out.json]

Each method reduces the same gradient set (a list of float32 arrays), is checked
once against a NumPy reference, then timed per step (barrier before each step,
slowest rank counts). The ratio column compares each median with the faster of
the two raw-MPI methods of the same set in the same job.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import common  # noqa: E402  (imports mpi4py.MPI first)
from common import COMM, MPI, Shape, Stats  # noqa: E402
from jaxcache.bench import ddp_allreduce  # noqa: E402  (DDP's bucketing, defined once)

BASELINES = ("mpi_fused", "mpi_per_tensor")
FLOOR_SCALE = 0.5
MIN_STEPS = 5


@dataclass
class Bench:
    """One prepared method: ``step`` runs one blocking step and returns its output."""

    step: Callable[[], Any]
    fetch: Callable[[Any], list[np.ndarray]]
    expect: str  # "sum", "average" or "scale"


@dataclass
class Context:
    """What a method builder gets: the set, this rank's data and the optional modules."""

    shapes: list[Shape]
    local: list[np.ndarray]
    mods: dict[str, Any]
    _jax_tree: list[Any] | None = None

    @property
    def size(self) -> int:
        return COMM.Get_size()

    def jax_tree(self) -> list[Any]:
        """This rank's data as JAX arrays (created once per set)."""
        if self._jax_tree is None:
            jnp = self.mods["jax"].numpy
            self._jax_tree = [jnp.asarray(a) for a in self.local]
        return self._jax_tree


def _split(flat: np.ndarray, shapes: Sequence[Shape]) -> list[np.ndarray]:
    out, offset = [], 0
    for s in shapes:
        n = int(np.prod(s))
        out.append(flat[offset : offset + n].reshape(s))
        offset += n
    return out


def _jax_fetch(out: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in out]


# --- raw MPI limits ---------------------------------------------------------


def build_mpi_fused(ctx: Context) -> Bench:
    send = np.concatenate([a.reshape(-1) for a in ctx.local])
    recv = np.empty_like(send)

    def step() -> np.ndarray:
        COMM.Allreduce(send, recv, op=MPI.SUM)
        return recv

    return Bench(step, lambda r: _split(r, ctx.shapes), "sum")


def build_mpi_per_tensor(ctx: Context) -> Bench:
    recvs = [np.empty_like(a) for a in ctx.local]

    def step() -> list[np.ndarray]:
        for a, r in zip(ctx.local, recvs, strict=True):
            COMM.Allreduce(a, r, op=MPI.SUM)
        return recvs

    return Bench(step, list, "sum")


# --- JAX peers --------------------------------------------------------------


def build_mpi4jax_leaf(ctx: Context) -> Bench:
    jax, m4j, size = ctx.mods["jax"], ctx.mods["mpi4jax"], ctx.size

    @jax.jit
    def reduce(tree: list[Any]) -> list[Any]:
        return [m4j.allreduce(x, op=MPI.SUM) / size for x in tree]

    tree = ctx.jax_tree()
    return Bench(lambda: jax.block_until_ready(reduce(tree)), _jax_fetch, "average")


def build_mpi4jax_ravel(ctx: Context) -> Bench:
    jax, m4j, size = ctx.mods["jax"], ctx.mods["mpi4jax"], ctx.size
    ravel_pytree = jax.flatten_util.ravel_pytree
    tree = ctx.jax_tree()
    _, unravel = ravel_pytree(tree)

    @jax.jit
    def reduce(tree: list[Any]) -> list[Any]:
        flat, _ = ravel_pytree(tree)
        return unravel(m4j.allreduce(flat, op=MPI.SUM) / size)

    return Bench(lambda: jax.block_until_ready(reduce(tree)), _jax_fetch, "average")


def build_jax_floor(ctx: Context) -> Bench:
    jax = ctx.mods["jax"]

    @jax.jit
    def reduce(tree: list[Any]) -> list[Any]:
        return [x * FLOOR_SCALE for x in tree]

    tree = ctx.jax_tree()
    return Bench(lambda: jax.block_until_ready(reduce(tree)), _jax_fetch, "scale")


def build_jaxcache(ctx: Context) -> Bench:
    jax, jc = ctx.mods["jax"], ctx.mods["jaxcache"]

    @jax.jit
    def reduce(tree: list[Any]) -> list[Any]:
        return jc.grouped_allreduce(tree, op="average")

    tree = ctx.jax_tree()
    return Bench(lambda: jax.block_until_ready(reduce(tree)), _jax_fetch, "average")


def build_jaxcache_eager(ctx: Context) -> Bench:
    jax, jc = ctx.mods["jax"], ctx.mods["jaxcache"]
    tree = ctx.jax_tree()
    step = lambda: jax.block_until_ready(jc.grouped_allreduce(tree, op="average"))  # noqa: E731
    return Bench(step, _jax_fetch, "average")


# --- PyTorch peer -----------------------------------------------------------


def build_torch_gloo(ctx: Context) -> Bench:
    torch = ctx.mods["torch"]
    step = ddp_allreduce(torch, [torch.from_numpy(a) for a in ctx.local], ctx.size)
    return Bench(step, lambda out: [t.numpy() for t in out], "average")


def init_torch_gloo(torch: Any) -> None:
    """Join a gloo process group whose rendezvous is agreed through MPI."""
    torch.set_num_threads(1)  # the ranks share the cores; idle OpenMP workers spin
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(common.free_port())
    os.environ["RANK"] = str(COMM.Get_rank())
    os.environ["WORLD_SIZE"] = str(COMM.Get_size())
    torch.distributed.init_process_group("gloo", init_method="env://")


# --- registry and driver ----------------------------------------------------

METHODS: dict[str, tuple[Callable[[Context], Bench], tuple[str, ...]]] = {
    "mpi_fused": (build_mpi_fused, ()),
    "mpi_per_tensor": (build_mpi_per_tensor, ()),
    "mpi4jax_leaf": (build_mpi4jax_leaf, ("jax", "mpi4jax")),
    "mpi4jax_ravel": (build_mpi4jax_ravel, ("jax", "mpi4jax")),
    "torch_gloo": (build_torch_gloo, ("torch",)),
    "jax_floor": (build_jax_floor, ("jax",)),
    "jaxcache": (build_jaxcache, ("jax", "jaxcache")),
    "jaxcache_eager": (build_jaxcache_eager, ("jax", "jaxcache")),
}
# A bare source directory would import as an empty namespace package: require the API.
REQUIRED_ATTRS = {"jaxcache": ("init", "grouped_allreduce", "shutdown")}
# Import order matters: mpi4py.MPI (via common) first, then jax, then MPI users.
MODULE_ORDER = ("jax", "jax.flatten_util", "mpi4jax", "jaxcache", "torch")


def load_modules(methods: Sequence[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Import the optional modules the chosen methods need; returns (modules, failures)."""
    wanted = {m for name in methods for m in METHODS[name][1]}
    if "jax" in wanted:
        wanted.add("jax.flatten_util")
    mods: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name in MODULE_ORDER:
        if name not in wanted:
            continue
        module, reason = common.optional_import(name, REQUIRED_ATTRS.get(name, ()))
        if module is None:
            failed[name] = reason or "unavailable"
        else:
            mods[name] = module
    return mods, failed


def start_runtimes(mods: dict[str, Any], methods: Sequence[str], failed: dict[str, str]) -> None:
    """Initialise jaxcache and the gloo group when their methods will run."""
    if "jaxcache" in mods:
        try:
            mods["jaxcache"].init()
        except Exception as exc:
            failed["jaxcache"] = f"init failed: {exc}"
            del mods["jaxcache"]
    if "torch" in mods and "torch_gloo" in methods:
        try:
            init_torch_gloo(mods["torch"])
        except Exception as exc:
            failed["torch"] = f"gloo init failed: {exc}"
            del mods["torch"]


def stop_runtimes(mods: dict[str, Any]) -> None:
    if "jaxcache" in mods:
        mods["jaxcache"].shutdown()
    if "torch" in mods and mods["torch"].distributed.is_initialized():
        mods["torch"].distributed.destroy_process_group()


def expected(ctx: Context, kind: str) -> list[np.ndarray]:
    if kind == "scale":
        return [a * np.float32(FLOOR_SCALE) for a in ctx.local]
    return common.reference(ctx.shapes, ctx.size, kind)


@dataclass(frozen=True)
class Timing:
    """How each method is timed."""

    warmup: int
    steps: int
    budget_s: float  # a slow method runs fewer steps (at least MIN_STEPS) to fit this
    retries: int  # re-time a method this often while other processes load the host
    busy: float  # other_load (cores) above which a timing counts as disturbed


def capped_steps(step: Callable[[], Any], timing: Timing) -> int:
    """Timed steps that fit the budget (at least ``MIN_STEPS``), agreed by all ranks."""
    per_step = COMM.allreduce(max(common.timeit_steps(step, 0, 1)), op=MPI.MAX)
    fit = int(timing.budget_s / max(per_step, 1e-9)) - timing.warmup
    return max(min(timing.steps, MIN_STEPS), min(timing.steps, fit))


def time_quietest(
    step: Callable[[], Any], warmup: int, n: int, timing: Timing, meter: common.OtherLoad
) -> tuple[list[float], float | None, int]:
    """Time ``n`` steps, again while other processes loaded the host; keeps the quietest try."""
    tried: list[tuple[float, list[float]]] = []
    for _ in range(timing.retries + 1):
        meter.start()
        times = common.synced_steps(step, warmup, n)
        other = meter.stop()
        if other is None:  # no /proc/stat: nothing to judge by
            return times, None, len(tried) + 1
        tried.append((other, times))
        if other <= timing.busy:
            break
    other, times = min(tried, key=lambda t: t[0])
    return times, other, len(tried)


def run_method(
    name: str, ctx: Context, timing: Timing, meter: common.OtherLoad
) -> tuple[Stats | None, str, float | None]:
    """Build, verify once, then time one method; returns (stats or None, note, other load)."""
    bench, note = None, ""
    try:
        bench = METHODS[name][0](ctx)
        ok = common.all_close(bench.fetch(bench.step()), expected(ctx, bench.expect))
        note = "" if ok else "WRONG RESULT"
    except Exception as exc:
        traceback.print_exc()
        ok, note = False, f"error: {type(exc).__name__}: {exc}"
    if not common.agree(ok):
        return None, note or "failed on another rank", None
    notes = [note] if note else []
    n, warmup = capped_steps(bench.step, timing), timing.warmup
    if n < timing.steps:
        notes.append(f"only {n} steps (--method-budget)")
        warmup = min(warmup, 1)
    times, other, tries = time_quietest(bench.step, warmup, n, timing, meter)
    if tries > 1:
        notes.append(f"timed {tries}x (host busy), quietest kept")
    return Stats.of(times), "; ".join(notes), other


def run_set(
    set_name: str, methods: Sequence[str], mods: dict[str, Any], skipped: dict[str, str], timing: Timing
) -> list[dict[str, Any]]:
    """All methods on one gradient set; rows carry medians and ratios vs raw MPI."""
    shapes = common.GRADIENT_SETS[set_name]()
    ctx = Context(shapes, common.rank_tensors(shapes, COMM.Get_rank()), mods)
    size_mb = sum(a.nbytes for a in ctx.local) / 1e6
    common.say(f"# set {set_name}: {len(shapes)} tensors, {size_mb:.1f} MB", file=sys.stderr)
    rows = []
    meter = common.OtherLoad()
    for name in methods:
        row: dict[str, Any] = {"method": name, "set": set_name, "P": ctx.size}
        if name in skipped:
            row["note"] = f"skipped ({skipped[name]})"
        else:
            common.say(f"#   {name}", file=sys.stderr)
            stats, note, other = run_method(name, ctx, timing, meter)
            row.update(note=note, other_load=other)
            if stats is not None:
                row.update(median_ms=stats.median * 1e3, p10_ms=stats.p10 * 1e3,
                           p90_ms=stats.p90 * 1e3, steps=stats.n)
        rows.append(row)
        gc.collect()
    meter.free()
    medians = [r["median_ms"] for r in rows if r["method"] in BASELINES and "median_ms" in r]
    best = min(medians) if medians else None
    for r in rows:
        r["ratio_vs_mpi"] = common.ratio(r.get("median_ms"), best)
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30, help="timed steps per method (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps after the check")
    p.add_argument("--sets", default="resnet50,small",
                   help="comma list of: " + ",".join(common.GRADIENT_SETS))
    p.add_argument("--methods", default=",".join(METHODS), help="comma list of: " + ",".join(METHODS))
    p.add_argument("--method-budget", type=float, default=8.0,
                   help="seconds one method may spend timing; slow methods run fewer steps")
    p.add_argument("--retries", type=int, default=1,
                   help="re-time a method up to this often while other processes load the host")
    p.add_argument("--busy", type=float, default=0.25,
                   help="other_load (cores used by other processes) that counts as disturbed")
    p.add_argument("--json", default=None, help="write results to this JSON file (rank 0)")
    args = p.parse_args(argv)
    args.sets = [s for s in args.sets.split(",") if s]
    args.methods = [m for m in args.methods.split(",") if m]
    for s in args.sets:
        if s not in common.GRADIENT_SETS:
            p.error(f"unknown set {s!r}")
    for m in args.methods:
        if m not in METHODS:
            p.error(f"unknown method {m!r}")
    return args


def with_baselines(methods: Sequence[str]) -> list[str]:
    """Ratios need a raw-MPI baseline from the same job: add both if none was asked for."""
    if any(m in BASELINES for m in methods):
        return list(methods)
    common.say("# no raw-MPI method chosen: adding mpi_fused,mpi_per_tensor as baselines", file=sys.stderr)
    return [*BASELINES, *methods]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    load_before = common.say_load("before")
    methods = with_baselines(args.methods)
    mods, failed = load_modules(methods)
    start_runtimes(mods, methods, failed)
    if "jaxcache" in failed:
        common.say("jaxcache not available:", failed["jaxcache"])
    skipped = {m: "; ".join(f"{d}: {failed[d]}" for d in deps if d in failed)
               for m, (_, deps) in METHODS.items()
               if any(d in failed for d in deps)}
    timing = Timing(args.warmup, args.steps, args.method_budget, args.retries, args.busy)
    rows: list[dict[str, Any]] = []
    try:
        for set_name in args.sets:
            rows += run_set(set_name, methods, mods, skipped, timing)
    finally:
        stop_runtimes(mods)
    columns = ["method", "set", "P", "median_ms", "p10_ms", "p90_ms", "ratio_vs_mpi", "other_load", "note"]
    common.say("other_load: cores used by processes outside this job while timing (~0 = idle host)")
    common.report(rows, columns, "gradients", args.json, load_before, steps=args.steps, warmup=args.warmup)


if __name__ == "__main__":
    main()
