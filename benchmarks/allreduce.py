"""Single-tensor allreduce: latency (4 B .. 64 KB) and bandwidth (1 MB .. 64 MB).

    mpirun -np 2 python benchmarks/allreduce.py [--sizes 4,1K,1M] [--batches 15] [--json out.json]

For each float32 tensor size: mpi4py ``Allreduce`` of the same bytes (the
baseline, same job), ``jaxcache.allreduce`` eager and under ``jax.jit``. Each
method is checked once against NumPy, then timed in batches of back-to-back
calls (barrier before each batch, slowest rank counts); the median batch is
reported per call.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import common  # noqa: E402  (imports mpi4py.MPI first)
from common import COMM, MPI  # noqa: E402

KIB, MIB = 1024, 1024 * 1024
DEFAULT_SIZES = [4, 16, 64, 256, KIB, 4 * KIB, 16 * KIB, 64 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
UNITS = {"": 1, "B": 1, "K": KIB, "KB": KIB, "M": MIB, "MB": MIB}
MAX_ITERS = 1000


def parse_size(text: str) -> int:
    """'64', '4K', '16MB' -> bytes (binary units), a multiple of 4."""
    t = text.strip().upper()
    digits = t.rstrip("KMB")
    n = int(digits) * UNITS[t[len(digits):]]
    if n < 4 or n % 4:
        raise argparse.ArgumentTypeError(f"size {text!r} is not a positive multiple of 4 bytes")
    return n


def format_size(n: int) -> str:
    for unit, scale in (("MB", MIB), ("KB", KIB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def calls_per_batch(fn: Callable[[], Any], target_s: float) -> int:
    """Back-to-back calls that fill about ``target_s``, agreed by all ranks."""
    per_call = max(common.timeit_steps(fn, 1, 3))
    per_call = COMM.allreduce(per_call, op=MPI.MAX)
    return int(min(MAX_ITERS, max(1, round(target_s / max(per_call, 1e-9)))))


def measure(
    fn: Callable[[], Any], check: Callable[[Any], bool], batches: int, target_s: float
) -> tuple[float | None, str]:
    """Check ``fn`` once, then time it; returns (median seconds per call or None, note)."""
    note = ""
    try:
        ok = check(fn())
        note = "" if ok else "WRONG RESULT"
    except Exception as exc:
        traceback.print_exc()
        ok, note = False, f"error: {type(exc).__name__}: {exc}"
    if not common.agree(ok):
        return None, note or "failed on another rank"
    iters = calls_per_batch(fn, target_s)
    return common.median(common.synced_batches(fn, 1, batches, iters)), note


def methods_for(x: np.ndarray, jax: Any, jc: Any) -> dict[str, tuple[Callable[[], Any], str]]:
    """Blocking single-call functions per method and the reduction each one computes."""
    recv = np.empty_like(x)

    def mpi() -> np.ndarray:
        COMM.Allreduce(x, recv, op=MPI.SUM)
        return recv

    out: dict[str, tuple[Callable[[], Any], str]] = {"mpi4py": (mpi, "sum")}
    if jc is not None:
        xj = jax.numpy.asarray(x)
        jitted = jax.jit(lambda v: jc.allreduce(v, op="average"))
        out["jc_eager"] = (lambda: jax.block_until_ready(jc.allreduce(xj, op="average")), "average")
        out["jc_jit"] = (lambda: jax.block_until_ready(jitted(xj)), "average")
    return out


def run_size(nbytes: int, jax: Any, jc: Any, batches: int, target_s: float) -> dict[str, Any]:
    """One table row: per-call microseconds, ratios vs mpi4py and GB/s."""
    shape = (nbytes // 4,)
    x = common.rank_tensor(shape, 0, COMM.Get_rank())
    row: dict[str, Any] = {"size": format_size(nbytes), "bytes": nbytes}
    notes = []
    meter = common.OtherLoad()
    meter.start()
    for name, (fn, op) in methods_for(x, jax, jc).items():
        want = common.reference([shape], COMM.Get_size(), op)
        check = lambda out, want=want: common.all_close([out], want)  # noqa: E731
        seconds, note = measure(fn, check, batches, target_s)
        if note:
            notes.append(f"{name}: {note}")
        if seconds is not None:
            row[f"{name}_us"] = seconds * 1e6
            row[f"{name}_GBps"] = nbytes / seconds / 1e9
    for name in ("jc_eager", "jc_jit"):
        row[f"{name}/mpi"] = common.ratio(row.get(f"{name}_us"), row.get("mpi4py_us"))
    return common.finish_row(row, meter, notes)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default=None, help="comma list of byte sizes, e.g. 4,1K,64M")
    p.add_argument("--batches", type=int, default=15, help="timed batches per size and method")
    p.add_argument("--batch-ms", type=float, default=20.0, help="target duration of one batch")
    p.add_argument("--json", default=None, help="write results to this JSON file (rank 0)")
    args = p.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    load_before = common.say_load("before")
    jax, _ = common.optional_import("jax")
    jc, reason = common.optional_import("jaxcache", ("init", "allreduce", "shutdown"))
    if jc is not None and jax is not None:
        jc.init()
    else:
        common.say("jaxcache not available:", reason or "jax missing")
        jc = None
    rows = []
    try:
        for nbytes in args.sizes:
            common.say(f"# {format_size(nbytes)}", file=sys.stderr)
            rows.append(run_size(nbytes, jax, jc, args.batches, args.batch_ms / 1e3))
    finally:
        if jc is not None:
            jc.shutdown()
    columns = ["size", "mpi4py_us", "jc_eager_us", "jc_jit_us", "jc_eager/mpi", "jc_jit/mpi",
               "mpi4py_GBps", "jc_eager_GBps", "jc_jit_GBps", "other_load", "note"]
    common.say(f"P={COMM.Get_size()}; GB/s = bytes / time per call (algorithm bandwidth); other_load = "
               "cores used by processes outside this job while measuring (~0 = idle host)")
    common.report(rows, columns, "allreduce", args.json, load_before, batches=args.batches)


if __name__ == "__main__":
    main()
