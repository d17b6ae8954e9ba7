"""How the bytes per MPI_Allreduce call change the time to reduce a large buffer (mpi4py only).

    mpirun -np 2 python benchmarks/chunk_size.py [--total-mb 64] [--chunks-kib 256,1024,...] [--reps 15]

Reduces one float32 buffer of --total-mb in place, in calls of each chunk size and in one
call; prints the median over --reps barrier-synced repeats (slowest rank) per chunk size,
interleaving the sizes every repeat so that host noise spreads evenly. This is what chose
the runtime's JAXCACHE_CHUNK_BYTES default (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

COMM = MPI.COMM_WORLD


def reduce_in_chunks(buf: np.ndarray, chunk_elems: int) -> None:
    for off in range(0, buf.size, chunk_elems):
        COMM.Allreduce(MPI.IN_PLACE, buf[off:off + chunk_elems], op=MPI.SUM)


def timed(fn) -> float:
    COMM.Barrier()
    t0 = time.perf_counter()
    fn()
    return COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-mb", type=float, default=64.0)
    ap.add_argument("--chunks-kib", default="256,1024,2048,4096,8192,16384")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    buf = np.ones(int(args.total_mb * 2**20) // 4, np.float32)
    sizes = [int(k) * 1024 for k in args.chunks_kib.split(",")] + [buf.nbytes]
    times: dict[int, list[float]] = {s: [] for s in sizes}
    for _ in range(args.reps):
        for s in sizes:
            times[s].append(timed(lambda: reduce_in_chunks(buf, max(1, s // 4))))
    if COMM.rank == 0:
        print(f"P={COMM.size}, {args.total_mb:g} MiB float32 reduced in place, median of {args.reps}")
        print("| bytes per call | ms | vs one call |")
        print("|---|---|---|")
        one = float(np.median(times[buf.nbytes]))
        for s in sizes:
            med = float(np.median(times[s]))
            label = "one call" if s == buf.nbytes else f"{s // 1024} KiB"
            print(f"| {label} | {med * 1e3:.1f} | {med / one:.2f} |")


if __name__ == "__main__":
    main()
