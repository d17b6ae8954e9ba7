"""Point-to-point and rooted ops: jaxcache against mpi4jax and mpi4py, in one job.

    mpirun -np 2 python benchmarks/point_to_point.py [--parts pingpong,bulk,rooted]
        [--sizes 1,1024,65536] [--steps 1000] [--bulk-sizes 16M] [--rooted-sizes 1M]
        [--ops gather,scatter,reduce] [--methods jc_jit,jc_eager,mpi4jax,mpi4py]
        [--rounds 7] [--batch-ms 50] [--json out.json]

Parts (float32 data; rank r's neighbours in a ring are dest = r+1, source = r-1 mod size,
which at 2 ranks is the other rank for both):
  pingpong  one ``lax.scan`` of ``--steps`` steps inside ``jax.jit``; every step sends the
            previous step's result to dest and receives the next carry from source
            (``sendrecv``), so no two steps overlap. jc_jit: ``jaxcache.sendrecv``; mpi4jax:
            ``mpi4jax.sendrecv`` in the same scan (the baseline); mpi4py: the same chain as a
            Python loop of ``Sendrecv`` on NumPy arrays (for reference). ``--sizes`` are
            element counts. Reported: time per step.
  bulk      one ``sendrecv`` of ``--bulk-sizes`` bytes per rank: mpi4py ``Sendrecv`` on NumPy
            arrays (the baseline), ``jaxcache.sendrecv`` under ``jax.jit`` (jc_jit) and eager
            (jc_eager), ``mpi4jax.sendrecv`` under ``jax.jit``. Reported: time per call.
  rooted    gather / reduce (sum) of ``--rooted-sizes`` bytes per rank to root 0, and scatter
            from root 0 of one such block per rank (root's operand is size blocks):
            mpi4py ``Gather`` / ``Reduce`` / ``Scatter`` on NumPy arrays (the baseline),
            ``jaxcache.gather`` / ``reduce`` / ``scatter`` under ``jit`` and eager, and
            mpi4jax's under ``jit``. Reported: time per call.

Every method moves the same bytes with the same tags (sendtag = recvtag = 0) and computes
nothing else. Each is run once and its result checked against NumPy on every rank before
it is timed (a method that fails is left out and its note says why); the chain's step count
is rounded up to 1 modulo size so that its result is a neighbour's data, not the rank's own.
Methods are interleaved in ``--rounds`` rounds (the starting method rotating per round): a
pingpong round times one whole chain per method, a bulk or rooted round one batch of
back-to-back calls of about ``--batch-ms`` per method; every sample starts after a barrier
and the slowest rank's time counts. Reported per cell: the median over rounds, the ratio of
each method's median to the baseline's (``*/base``, the baseline named in ``base``), the
range of the per-round ratios of jc_jit, and the target of that ratio (pingpong 1.2, bulk
1.1, rooted 1.2). mpi4jax is optional: where it does not import its cells say so.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import common  # noqa: E402  (imports mpi4py.MPI first)
from allreduce import calls_per_batch, format_size, parse_size  # noqa: E402
from common import COMM, MPI  # noqa: E402

PARTS = ("pingpong", "bulk", "rooted")
OPS = ("gather", "scatter", "reduce")
METHODS = ("jc_jit", "jc_eager", "mpi4jax", "mpi4py")
APPLIES = {"pingpong": ("jc_jit", "mpi4jax", "mpi4py"), "bulk": METHODS, "rooted": METHODS}
BASELINE = {"pingpong": "mpi4jax", "bulk": "mpi4py", "rooted": "mpi4py"}
TARGET = {"pingpong": 1.2, "bulk": 1.1, "rooted": 1.2}
TAG = 0
ROOT = 0

Fn = Callable[[], Any]


def ring() -> tuple[int, int]:
    """(source, dest) of this rank in the ring."""
    size, rank = COMM.Get_size(), COMM.Get_rank()
    return (rank - 1) % size, (rank + 1) % size


def first(r: Any) -> Any:
    """mpi4jax < 0.8 returned (result, token)."""
    return r[0] if isinstance(r, tuple) else r


# ------------------------------------------------------------------------------------------
# Methods: each part builds {method: (blocking fn of no arguments, expected result)}.


def chain_steps(steps: int) -> int:
    """``steps`` rounded up to 1 modulo size: the chain ends on the source's data."""
    size = COMM.Get_size()
    return steps + (1 - steps) % size


def pingpong_methods(n: int, steps: int, mods: dict[str, Any],
                     methods: Sequence[str]) -> dict[str, tuple[Fn, np.ndarray]]:
    size, rank = COMM.Get_size(), COMM.Get_rank()
    source, dest = ring()
    x0 = common.rank_tensor((n,), 0, rank)
    want = common.rank_tensor((n,), 0, (rank - steps) % size)
    out: dict[str, tuple[Fn, np.ndarray]] = {}
    if "mpi4py" in methods:
        a, b = np.empty_like(x0), np.empty_like(x0)

        def loop() -> np.ndarray:
            s, r = a, b
            s[...] = x0
            for _ in range(steps):
                COMM.Sendrecv(s, dest, TAG, r, source, TAG)
                s, r = r, s
            return s

        out["mpi4py"] = (loop, want)
    jax = mods.get("jax")
    if jax is None:
        return out
    xj = jax.numpy.asarray(x0)

    def chain(exchange: Callable[[Any], Any]) -> Fn:
        def body(c, _):
            return exchange(c), None

        f = jax.jit(lambda x: jax.lax.scan(body, x, None, length=steps)[0])
        return lambda: jax.block_until_ready(f(xj))

    jc, m4j = mods.get("jc"), mods.get("m4j")
    if jc is not None and "jc_jit" in methods:
        out["jc_jit"] = (chain(lambda c: jc.sendrecv(c, c, source, dest, sendtag=TAG, recvtag=TAG,
                                                     name="bench.p2p.pingpong")), want)
    if m4j is not None and "mpi4jax" in methods:
        out["mpi4jax"] = (chain(lambda c: first(m4j.sendrecv(c, c, source, dest, sendtag=TAG, recvtag=TAG,
                                                             comm=COMM))), want)
    return out


def bulk_methods(n: int, mods: dict[str, Any], methods: Sequence[str]) -> dict[str, tuple[Fn, np.ndarray]]:
    source, dest = ring()
    x = common.rank_tensor((n,), 0, COMM.Get_rank())
    want = common.rank_tensor((n,), 0, source)
    recv = np.empty_like(x)
    out: dict[str, tuple[Fn, np.ndarray]] = {}
    if "mpi4py" in methods:
        out["mpi4py"] = (lambda: (COMM.Sendrecv(x, dest, TAG, recv, source, TAG), recv)[1], want)
    jax, jc, m4j = mods.get("jax"), mods.get("jc"), mods.get("m4j")
    if jax is None:
        return out
    xj = jax.numpy.asarray(x)
    if jc is not None:
        def exchange(v):
            return jc.sendrecv(v, v, source, dest, sendtag=TAG, recvtag=TAG, name="bench.p2p.bulk")

        jitted = jax.jit(exchange)
        if "jc_jit" in methods:
            out["jc_jit"] = (lambda: jax.block_until_ready(jitted(xj)), want)
        if "jc_eager" in methods:
            out["jc_eager"] = (lambda: jax.block_until_ready(exchange(xj)), want)
    if m4j is not None and "mpi4jax" in methods:
        m4j_jit = jax.jit(lambda v: first(m4j.sendrecv(v, v, source, dest, sendtag=TAG, recvtag=TAG, comm=COMM)))
        out["mpi4jax"] = (lambda: jax.block_until_ready(m4j_jit(xj)), want)
    return out


def rooted_data(op: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(this rank's input, what this rank must get back) for ``n`` values per block."""
    size, rank = COMM.Get_size(), COMM.Get_rank()
    mine = common.rank_tensor((n,), 0, rank)
    is_root = rank == ROOT
    if op == "gather":
        want = np.stack([common.rank_tensor((n,), 0, q) for q in range(size)]) if is_root else mine
        return mine, want
    if op == "reduce":
        return mine, common.reference([(n,)], size, "sum")[0] if is_root else mine
    blocks = common.rank_tensor((size, n), 1, ROOT)  # scatter: root's size blocks
    return (blocks if is_root else np.zeros(n, np.float32)), blocks[rank]


def rooted_methods(op: str, n: int, mods: dict[str, Any],
                   methods: Sequence[str]) -> dict[str, tuple[Fn, np.ndarray]]:
    x, want = rooted_data(op, n)
    is_root = COMM.Get_rank() == ROOT
    out: dict[str, tuple[Fn, np.ndarray]] = {}
    if "mpi4py" in methods:
        if op == "gather":
            recv = np.empty((COMM.Get_size(), n), np.float32) if is_root else None
            fn = lambda: (COMM.Gather(x, recv, root=ROOT), recv if is_root else x)[1]  # noqa: E731
        elif op == "reduce":
            recv = np.empty_like(x) if is_root else None
            fn = lambda: (COMM.Reduce(x, recv, op=MPI.SUM, root=ROOT), recv if is_root else x)[1]  # noqa: E731
        else:
            recv = np.empty(n, np.float32)
            fn = lambda: (COMM.Scatter(x if is_root else None, recv, root=ROOT), recv)[1]  # noqa: E731
        out["mpi4py"] = (fn, want)
    jax, jc, m4j = mods.get("jax"), mods.get("jc"), mods.get("m4j")
    if jax is None:
        return out
    xj = jax.numpy.asarray(x)
    if jc is not None:
        name = f"bench.p2p.{op}"
        if op == "reduce":
            call = lambda v: jc.reduce(v, op="sum", root=ROOT, name=name)  # noqa: E731
        else:
            call = lambda v, f=getattr(jc, op): f(v, root=ROOT, name=name)  # noqa: E731
        jitted = jax.jit(call)
        if "jc_jit" in methods:
            out["jc_jit"] = (lambda: jax.block_until_ready(jitted(xj)), want)
        if "jc_eager" in methods:
            out["jc_eager"] = (lambda: jax.block_until_ready(call(xj)), want)
    if m4j is not None and "mpi4jax" in methods:
        if op == "reduce":
            m4j_call = lambda v: first(m4j.reduce(v, op=MPI.SUM, root=ROOT, comm=COMM))  # noqa: E731
        else:
            m4j_call = lambda v, f=getattr(m4j, op): first(f(v, root=ROOT, comm=COMM))  # noqa: E731
        m4j_jit = jax.jit(m4j_call)
        out["mpi4jax"] = (lambda: jax.block_until_ready(m4j_jit(xj)), want)
    return out


# ------------------------------------------------------------------------------------------
# Checking and timing.


def check(fn: Fn, want: np.ndarray) -> str:
    """'' when ``fn`` gives ``want`` on every rank, else why not (collective)."""
    note = ""
    try:
        got = np.asarray(fn())
        ok = common.all_close([got], [want])
        if not ok:
            note = f"WRONG RESULT (shape {got.shape}, first {got.ravel()[:3]}; want {want.ravel()[:3]})"
    except Exception as exc:  # noqa: BLE001 - reported in the row, the job goes on
        ok, note = False, f"error: {type(exc).__name__}: {exc}"
    if not common.agree(ok):
        return note or "failed on another rank"
    return ""


def rounds_of(fns: dict[str, Fn], rounds: int, sample: Callable[[str, Fn], float]) -> dict[str, list[float]]:
    """``rounds`` samples per method, methods interleaved, the first one rotating per round."""
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for k in range(rounds):
        for name in names[k % len(names):] + names[:k % len(names)]:
            times[name].append(sample(name, fns[name]))
    return times


def summarise(row: dict[str, Any], part: str, times: dict[str, list[float]]) -> None:
    """Medians (us), ratios to the baseline and the per-round range of jc_jit's ratio."""
    base = BASELINE[part]
    row["base"] = base
    row["target"] = TARGET[part]
    for name, t in times.items():
        row[f"{name}_us"] = common.median(t) * 1e6
    medians = {name: common.median(t) for name, t in times.items()}
    for name in METHODS:
        row[f"{name}/base"] = common.ratio(medians.get(name), medians.get(base))
    if "jc_jit" in times and base in times:
        per_round = [a / b for a, b in zip(times["jc_jit"], times[base], strict=True)]
        row["jc_jit/base range"] = f"{min(per_round):.2f}-{max(per_round):.2f}"
    r = row.get("jc_jit/base")
    row["met"] = None if r is None else ("yes" if r <= TARGET[part] else "NO")


def run_cell(row: dict[str, Any], part: str, built: dict[str, tuple[Fn, np.ndarray]], args: argparse.Namespace,
             per: int, unavailable: dict[str, str]) -> dict[str, Any]:
    """Check, then time the methods of one cell; ``per`` = steps per pingpong sample (else 1)."""
    notes = [f"{m}: {why}" for m, why in unavailable.items() if m in APPLIES[part] and m in args.methods]
    for m in unavailable:
        if m in APPLIES[part] and m in args.methods:
            row[f"{m}_us"] = "unavailable"
    meter = common.OtherLoad()
    meter.start()
    good: dict[str, Fn] = {}
    for name, (fn, want) in built.items():
        note = check(fn, want)
        if note:
            notes.append(f"{name}: {note}")
            row[f"{name}_us"] = "failed"
        else:
            good[name] = fn
    if part == "pingpong":
        def sample(name: str, fn: Fn) -> float:
            return common.synced_batches(fn, 0, 1, 1, COMM)[0] / per
    else:
        target_s = args.batch_ms / 1e3
        iters = {name: calls_per_batch(fn, target_s) for name, fn in good.items()}

        def sample(name: str, fn: Fn) -> float:
            return common.synced_batches(fn, 0, 1, iters[name], COMM)[0]
    times = rounds_of(good, args.rounds, sample) if good else {}
    summarise(row, part, times)
    say_cell(row)
    return common.finish_row(row, meter, notes)


def say_cell(row: dict[str, Any]) -> None:
    parts = []
    for m in METHODS:
        us = row.get(f"{m}_us")
        if us is None:
            continue
        if isinstance(us, str):
            parts.append(f"{m} {us}")
            continue
        r = row.get(f"{m}/base")
        parts.append(f"{m} {us:9.2f} us" + (f" ({r:.2f}x)" if r is not None else ""))
    where = f"{row['part']} {row['op']} {row['size']}"
    common.say(f"P={COMM.Get_size()} {where}: " + " | ".join(parts) + f"  [base {row['base']}, target "
               f"<= {row['target']}]", file=sys.stderr)


# ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help="comma list of: " + ",".join(PARTS))
    p.add_argument("--sizes", default="1,1024,65536", help="pingpong: float32 elements per message")
    p.add_argument("--steps", type=int, default=1000, help="pingpong: steps of the scan (rounded up to 1 mod size)")
    p.add_argument("--bulk-sizes", default="16M", help="bulk: bytes per message, e.g. 16M")
    p.add_argument("--rooted-sizes", default="1M", help="rooted: bytes per rank (per block for scatter)")
    p.add_argument("--ops", default=",".join(OPS), help="rooted: comma list of: " + ",".join(OPS))
    p.add_argument("--methods", default=",".join(METHODS), help="comma list of: " + ",".join(METHODS))
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (samples per method and cell)")
    p.add_argument("--batch-ms", type=float, default=50.0, help="bulk/rooted: target duration of one batch")
    p.add_argument("--json", default=None, help="write results to this JSON file (rank 0)")
    args = p.parse_args(argv)
    for what, allowed in (("parts", PARTS), ("ops", OPS), ("methods", METHODS)):
        chosen = [v for v in getattr(args, what).split(",") if v]
        for v in chosen:
            if v not in allowed:
                p.error(f"unknown {what[:-1]} {v!r} (one of {', '.join(allowed)})")
        setattr(args, what, chosen)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.bulk_sizes = [parse_size(s) for s in args.bulk_sizes.split(",") if s]
    args.rooted_sizes = [parse_size(s) for s in args.rooted_sizes.split(",") if s]
    if args.steps < 1 or args.rounds < 1 or any(n < 1 for n in args.sizes):
        p.error("--steps, --rounds and --sizes must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if COMM.Get_size() < 2:
        common.say("point_to_point.py needs at least 2 ranks (mpirun -np 2 ...)")
        sys.exit(2)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    load_before = common.say_load("before")
    mods: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    jax, why_jax = common.optional_import("jax")
    if jax is not None:
        mods["jax"] = jax
    if "mpi4jax" in args.methods:
        m4j, why = common.optional_import("mpi4jax", ("sendrecv", "gather", "scatter", "reduce")) \
            if jax is not None else (None, f"no jax ({why_jax})")
        if m4j is not None:
            mods["m4j"] = m4j
        else:
            unavailable["mpi4jax"] = f"not importable ({why})"
            common.say("mpi4jax not measured:", why)
    if {"jc_jit", "jc_eager"} & set(args.methods):
        jc, why = common.optional_import("jaxcache", ("init", "sendrecv", "gather", "scatter", "reduce", "shutdown")) \
            if jax is not None else (None, f"no jax ({why_jax})")
        if jc is not None:
            jc.init()
            mods["jc"] = jc
        else:
            for m in ("jc_jit", "jc_eager"):
                unavailable[m] = f"not importable ({why})"
            common.say("jaxcache not measured:", why)
    steps = chain_steps(args.steps)
    if steps != args.steps and "pingpong" in args.parts:
        common.say(f"# pingpong: {steps} steps (--steps {args.steps} rounded up to 1 mod {COMM.Get_size()})",
                   file=sys.stderr)
    rows = []
    try:
        if "pingpong" in args.parts:
            for n in args.sizes:
                row = {"part": "pingpong", "op": "sendrecv scan", "size": format_size(4 * n), "elements": n}
                rows.append(run_cell(row, "pingpong", pingpong_methods(n, steps, mods, args.methods), args, steps,
                                     unavailable))
        if "bulk" in args.parts:
            for nbytes in args.bulk_sizes:
                n = nbytes // 4
                row = {"part": "bulk", "op": "sendrecv", "size": format_size(nbytes), "elements": n}
                rows.append(run_cell(row, "bulk", bulk_methods(n, mods, args.methods), args, 1, unavailable))
        if "rooted" in args.parts:
            for op in args.ops:
                for nbytes in args.rooted_sizes:
                    n = nbytes // 4
                    row = {"part": "rooted", "op": op, "size": format_size(nbytes), "elements": n}
                    rows.append(run_cell(row, "rooted", rooted_methods(op, n, mods, args.methods), args, 1,
                                         unavailable))
    finally:
        if "jc" in mods:
            mods["jc"].shutdown()
    columns = ["part", "op", "size", "mpi4py_us", "mpi4jax_us", "jc_eager_us", "jc_jit_us", "base",
               "jc_jit/base", "jc_jit/base range", "jc_eager/base", "mpi4jax/base", "mpi4py/base", "target", "met",
               "other_load", "note"]
    common.say(f"P={COMM.Get_size()}; us = median over {args.rounds} interleaved rounds, slowest rank; pingpong: "
               f"per step of a {steps}-step jitted scan (mpi4py: a Python loop); bulk/rooted: per call; size = "
               "bytes per message (rooted: per rank, scatter: per block); */base = method / the baseline named "
               "in `base`; `met` = jc_jit/base <= target; other_load = cores used by processes outside this job "
               "(~0 = idle host)")
    common.report(rows, columns, "point_to_point", args.json, load_before, rounds=args.rounds, steps=steps,
                  batch_ms=args.batch_ms)


if __name__ == "__main__":
    main()
