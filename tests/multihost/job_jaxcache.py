"""Rank-side job: jaxcache collectives across hosts, checked against NumPy.

Same contract as job_allreduce.py (JC-RANK lines, non-zero exit on failure):
  1. eager  jaxcache.allreduce(x, op="sum") of a rank-dependent array, --iters times
     (its bytes are what the veth counters are checked against), or for
     --duration seconds with JC-PROGRESS records (link-fault test);
  2. a jitted step doing jaxcache.grouped_allreduce(tree, op="sum") of a small dict
     pytree, run for a few steps with step-dependent values;
  3. jaxcache.shutdown().
Values are small integers in float32, so every reduction order gives the exact
NumPy result, and results must be bitwise identical on every rank.
"""
import argparse
import json
import os
import socket
import sys
import time

import mpi4py.MPI as MPI  # load libmpi (MPI_THREAD_MULTIPLE) before the extension

import jaxcache
import jax
import jax.numpy as jnp
import numpy as np


def emit(record):
    """One write, on a line of its own (hydra may glue other ranks' output to ours)."""
    sys.stdout.write("\n" + record + "\n")
    sys.stdout.flush()


def rank_array(rank, n, salt=0):
    return ((np.arange(n, dtype=np.int64) * 3 + 7 * rank + 11 * salt) % 1024).astype(np.float32)


TREE_SHAPES = {"dense": {"w": (64, 32), "b": (32,)}, "conv": {"k": (3, 3, 4, 8)}, "scale": (1,)}


def make_tree(rank, step):
    leaves, treedef = jax.tree_util.tree_flatten(TREE_SHAPES, is_leaf=lambda s: isinstance(s, tuple))
    arrs = [rank_array(rank, int(np.prod(s)), salt=step * 31 + i).reshape(s) for i, s in enumerate(leaves)]
    return jax.tree_util.tree_unflatten(treedef, arrs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nbytes", type=int, default=4 << 20)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="jitted grouped_allreduce steps")
    ap.add_argument("--duration", type=float, default=0.0,
                    help="if > 0: loop the eager allreduce for this many seconds (fault test)")
    ap.add_argument("--progress-every", type=int, default=10)
    a = ap.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    jaxcache.init()
    checks = {}

    # 1. eager allreduce, sum
    n = max(1, a.nbytes // 4)
    x = jnp.asarray(rank_array(rank, n))
    expected = sum(rank_array(r, n) for r in range(size))
    t0 = time.perf_counter()
    ok = True
    it = 0
    while True:
        y = jaxcache.allreduce(x, op="sum", name="mh.allreduce")
        ok &= bool(np.array_equal(np.asarray(y), expected))
        it += 1
        if a.duration > 0:
            now = time.perf_counter() - t0
            if rank == 0 and it % a.progress_every == 0:
                emit(f"JC-PROGRESS {it} {now:.3f}")
            if now >= a.duration:
                break
        elif it >= a.iters:
            break
    eager_s = time.perf_counter() - t0
    checks["allreduce_equal_numpy"] = ok
    digest = [float(np.asarray(y, dtype=np.float64).sum())]

    # 2. jitted grouped_allreduce of a dict pytree
    @jax.jit
    def step(tree):
        return jaxcache.grouped_allreduce(tree, op="sum", name="mh.grads")

    ok = True
    for s in range(a.steps):
        out = step(make_tree(rank, s))
        ref = jax.tree_util.tree_map(lambda *xs: sum(np.asarray(v) for v in xs),
                                     *[make_tree(r, s) for r in range(size)])
        same_struct = jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(ref)
        eq = jax.tree_util.tree_map(lambda o, r: bool(np.array_equal(np.asarray(o), r)), out, ref)
        ok &= same_struct and all(jax.tree_util.tree_leaves(eq))
        digest += [float(np.asarray(v, dtype=np.float64).sum()) for v in jax.tree_util.tree_leaves(out)]
    checks["grouped_allreduce_jit_equal_numpy"] = ok

    jaxcache.shutdown()

    digests = comm.allgather(digest)
    checks["same_on_all_ranks"] = all(d == digests[0] for d in digests)
    info = {
        "rank": rank, "size": size, "ok": all(checks.values()), **checks,
        "iters": it, "nbytes": int(n * 4), "elapsed_s": round(eager_s, 4),
        "netns": os.readlink("/proc/self/ns/net"), "hostname": socket.gethostname(),
    }
    emit("JC-RANK " + json.dumps(info))
    comm.Barrier()
    return 0 if info["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
