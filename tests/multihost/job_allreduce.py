"""Rank-side job: mpi4py Allreduce checked against NumPy on every rank.

Run under mpiexec (see harness.py).  Every rank builds a rank-dependent float32
array whose values are small integers (so the sum is exact in any order), runs
``--iters`` allreduces (or keeps going for ``--duration`` seconds), and checks
the result against the NumPy reference computed locally for all ranks.

Output (stdout, one line each, parsed by the tests):
  JC-RANK {"rank":..,"size":..,"netns":..,"ok":true,...}    every rank at the end
  JC-PROGRESS <iter> <seconds>                               rank 0, in --duration mode
  JC-STALL rank=<r> waited=<s>                               watchdog fired (then MPI_Abort)
Exit status is non-zero if any check fails.

To exercise jaxcache instead of mpi4py, see job_jaxcache.py (same contract).
"""
import argparse
import json
import os
import socket
import sys
import time

from mpi4py import MPI
import numpy as np


def emit(record):
    """One write, on a line of its own (hydra may glue other ranks' output to ours)."""
    sys.stdout.write("\n" + record + "\n")
    sys.stdout.flush()


def rank_array(rank, n):
    # small integers -> the float32 sum is exact whatever the reduction order
    return ((np.arange(n, dtype=np.int64) * 3 + 7 * rank) % 1024).astype(np.float32)


def allreduce_deadline(comm, x, y, timeout):
    """Iallreduce polled with backoff; MPI_Abort if it does not complete in ``timeout`` s.

    MPICH does not turn a dead TCP peer into an error (libfabric logs the socket's
    ETIMEDOUT, then the collective waits forever), so stall detection has to live
    above MPI: this is the watchdog the link-fault test relies on.
    """
    req = comm.Iallreduce(x, y, op=MPI.SUM)
    t0 = time.monotonic()
    spins = 0
    while not req.Test():
        waited = time.monotonic() - t0
        if waited > timeout:
            emit(f"JC-STALL rank={comm.Get_rank()} waited={waited:.1f}s: aborting")
            comm.Abort(3)
        spins += 1
        if spins > 200:  # poll with backoff: a stalled rank must not burn a core
            time.sleep(min(0.005, 1e-5 * (spins - 200)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nbytes", type=int, default=4 << 20, help="bytes per rank per allreduce")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--duration", type=float, default=0.0,
                    help="if > 0: loop for this many seconds instead of --iters")
    ap.add_argument("--progress-every", type=int, default=10)
    ap.add_argument("--op-timeout", type=float, default=0.0,
                    help="if > 0: watchdog each allreduce, MPI_Abort after this many seconds")
    a = ap.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n = max(1, a.nbytes // 4)
    x = rank_array(rank, n)
    expected = sum(rank_array(r, n) for r in range(size))
    y = np.empty_like(x)

    comm.Barrier()
    t0 = time.perf_counter()
    it = 0
    ok = True
    while True:
        if a.op_timeout > 0:
            allreduce_deadline(comm, x, y, a.op_timeout)
        else:
            comm.Allreduce(x, y, op=MPI.SUM)
        it += 1
        if it == 1 or it % 16 == 0:
            ok &= bool(np.array_equal(y, expected))
        now = time.perf_counter() - t0
        if a.duration > 0:
            if rank == 0 and it % a.progress_every == 0:
                emit(f"JC-PROGRESS {it} {now:.3f}")
            if now >= a.duration:
                break
        elif it >= a.iters:
            break
    elapsed = time.perf_counter() - t0
    ok &= bool(np.array_equal(y, expected))

    # results must be bitwise identical on every rank
    digest = np.frombuffer(y.tobytes()[:1 << 20], dtype=np.uint8).astype(np.uint64).sum()
    digests = comm.allgather(int(digest))
    same = len(set(digests)) == 1

    info = {
        "rank": rank, "size": size, "ok": ok and same, "equal_numpy": ok, "same_on_all_ranks": same,
        "iters": it, "nbytes": int(x.nbytes), "elapsed_s": round(elapsed, 4),
        "netns": os.readlink("/proc/self/ns/net"), "hostname": socket.gethostname(),
        "processor_name": MPI.Get_processor_name(),
    }
    emit("JC-RANK " + json.dumps(info))
    comm.Barrier()
    return 0 if info["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
