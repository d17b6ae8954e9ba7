"""MPI's rooted collectives against the linear point-to-point forms the runtime uses for them.

    mpirun -np 2 python benchmarks/rooted_algorithms.py [--sizes 16K,64K,256K,1M,4M] [--rounds 9]

Pure mpi4py on NumPy arrays, no JAX: what each algorithm costs by itself, which is what
xla_ext/collectives/{reduce,gather,scatter}.cc choose between (the thresholds there quote this
benchmark). Per size (bytes per rank's tensor or block), float32, root 0:

- `Reduce` (sum) against a linear reduce: root receives every other rank's tensor in 1 MiB
  pieces, rank by rank, and adds each piece into its result (its own operand copied there
  first); the others send theirs and copy their operand into their result meanwhile.
- `Scatter` against root sending each rank its block (`Isend`), copying its own meanwhile.
- `Gather` against root receiving each rank's block (`Irecv`), copying its own meanwhile.

Waits poll `Test` and yield the core between polls (as the runtime does), so that ranks that
outnumber the cores still progress. jaxcache is imported first, for its malloc settings (huge
pages for large arrays, as in a jaxcache job; on 4 KiB pages MPICH's transfers run 2-3x
slower). Methods are interleaved over `--rounds` barrier-started batches of about 20 ms; the
slowest rank's median counts.
"""

from __future__ import annotations

import jaxcache  # noqa: F401,I001  (first: its malloc settings)

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from allreduce import parse_size  # noqa: E402
from common import COMM, MPI  # noqa: E402

PIECE = (1 << 20) // 4  # float32 elements per piece of the linear reduce
ROOT = 0


def wait(req: MPI.Request) -> None:
    while not req.Test():
        os.sched_yield()


def methods(n: int) -> dict[str, Callable[[], None]]:
    """The six methods on tensors / blocks of ``n`` float32 values."""
    rank, size = COMM.Get_rank(), COMM.Get_size()
    x = np.full(n, rank + 1, np.float32)
    out = np.empty(n, np.float32)
    piece = np.empty(min(n, PIECE), np.float32)
    blocks = np.ones((size, n), np.float32)
    stacked = np.empty((size, n), np.float32)

    def linear_reduce() -> None:
        for off in range(0, n, PIECE):
            m = min(PIECE, n - off)
            if rank != ROOT:
                req = COMM.Isend(x[off:off + m], ROOT, 9)
                out[off:off + m] = x[off:off + m]
                wait(req)
                continue
            out[off:off + m] = x[off:off + m]
            for q in range(size):
                if q != ROOT:
                    wait(COMM.Irecv(piece[:m], q, 9))
                    out[off:off + m] += piece[:m]

    def root_links(post: Callable[[int], MPI.Request], copy_own: Callable[[], None]) -> None:
        # Root's message to or from each other rank in turn; its own block copied meanwhile.
        copy = copy_own
        for q in range(size):
            if q != ROOT:
                req = post(q)
                copy()
                copy = lambda: None  # noqa: E731
                wait(req)

    def linear_scatter() -> None:
        if rank != ROOT:
            wait(COMM.Irecv(out, ROOT, 7))
            return
        root_links(lambda q: COMM.Isend(blocks[q], q, 7), lambda: out.__setitem__(slice(None), blocks[ROOT]))

    def linear_gather() -> None:
        if rank != ROOT:
            req = COMM.Isend(x, ROOT, 8)
            out[:] = x
            wait(req)
            return
        root_links(lambda q: COMM.Irecv(stacked[q], q, 8), lambda: stacked.__setitem__(ROOT, x))

    is_root = rank == ROOT
    return {
        "Reduce": lambda: COMM.Reduce(x, out if is_root else None, op=MPI.SUM, root=ROOT),
        "linear_reduce": linear_reduce,
        "Scatter": lambda: COMM.Scatter(blocks if is_root else None, out, root=ROOT),
        "linear_scatter": linear_scatter,
        "Gather": lambda: COMM.Gather(x, stacked if is_root else None, root=ROOT),
        "linear_gather": linear_gather,
    }


def time_cell(fns: dict[str, Callable[[], None]], n: int, rounds: int) -> dict[str, float]:
    """Slowest rank's median seconds per call of each method."""
    calls = max(3, int(20e-3 / max(n * 4 / 4e9, 5e-6)))  # ~20 ms at ~4 GB/s
    for fn in fns.values():
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for k in range(rounds):
        for name in names[k % len(names):] + names[:k % len(names)]:
            COMM.Barrier()
            t = time.perf_counter()
            for _ in range(calls):
                fns[name]()
            times[name].append((time.perf_counter() - t) / calls)
    return {name: max(COMM.allgather(common.median(t))) for name, t in times.items()}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16K,64K,256K,1M,4M", help="bytes per tensor or block (K/M suffixes)")
    p.add_argument("--rounds", type=int, default=9)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    size = COMM.Get_size()
    common.say(f"P={size}; us per call (slowest rank's median of {args.rounds} interleaved batches); "
               "linear / MPI's collective")
    for text in args.sizes.split(","):
        nbytes = parse_size(text)
        t = time_cell(methods(nbytes // 4), nbytes // 4, args.rounds)
        common.say(f"P={size} {text:>5}: " + " | ".join(
            f"{op} {t[op] * 1e6:8.1f} / {t['linear_' + op.lower()] * 1e6:8.1f} us = "
            f"{t['linear_' + op.lower()] / t[op]:.2f}" for op in ("Reduce", "Scatter", "Gather")))


if __name__ == "__main__":
    main()
