"""Rank-side job: one process set per host plus the global set (hierarchical reduction).

Each host's ranks form a set registered from `COMM_WORLD.Split(host)`; a jitted step
reduces a gradient pytree within the host's set (the same collective names on every
host), then across the job, and also allgathers within the set. Checked against NumPy;
prints JC-RANK lines like job_allreduce.py.
"""
import argparse
import json
import os
import socket
import sys

import mpi4py.MPI as MPI  # load libmpi (MPI_THREAD_MULTIPLE) before the extension

import jax
import jax.numpy as jnp
import numpy as np

import jaxcache


def emit(record):
    sys.stdout.write("\n" + record + "\n")
    sys.stdout.flush()


def tree(rank, step):
    return {"w": np.full((16, 8), float((rank + 1) * (step + 1)), np.float32),
            "b": (np.arange(8, dtype=np.float32) + rank + step)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    host = rank // a.ranks_per_host
    jaxcache.init()
    node = jaxcache.add_process_set(comm.Split(host, rank))
    peers = [r for r in range(size) if r // a.ranks_per_host == host]
    checks = {"set_ranks": node.ranks == peers and node.rank() == peers.index(rank)}

    @jax.jit
    def step(t):
        local = jaxcache.grouped_allreduce(t, "sum", name="node.grads", process_set=node)
        total = jaxcache.grouped_allreduce(local, "sum", name="global.grads")
        gathered = jaxcache.allgather(t["b"][:1], name="node.ids", process_set=node)
        return local, total, gathered

    ok = True
    for s in range(a.steps):
        local, total, gathered = step({k: jnp.asarray(v) for k, v in tree(rank, s).items()})
        want_local = {k: sum(tree(r, s)[k] for r in peers) for k in ("w", "b")}
        want_total = {k: sum(tree(r, s)[k] for r in range(size)) * a.ranks_per_host
                      for k in ("w", "b")}
        ok &= all(np.array_equal(np.asarray(local[k]), want_local[k]) for k in want_local)
        ok &= all(np.array_equal(np.asarray(total[k]), want_total[k]) for k in want_total)
        ok &= np.array_equal(np.asarray(gathered), np.asarray([tree(r, s)["b"][0] for r in peers]))
    checks["hierarchical_equal_numpy"] = bool(ok)
    counters = jaxcache.stats(process_set=node)
    checks["node_cache_warm"] = counters["coordinator_rounds"] <= 3 and counters["cache_hits"] > 0
    jaxcache.shutdown()
    info = {"rank": rank, "size": size, "ok": all(checks.values()), **checks,
            **{f"node_{k}": int(counters[k]) for k in ("cycles", "coordinator_rounds", "cache_hits")},
            "netns": os.readlink("/proc/self/ns/net"), "hostname": socket.gethostname()}
    emit("JC-RANK " + json.dumps(info))
    comm.Barrier()
    return 0 if info["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
