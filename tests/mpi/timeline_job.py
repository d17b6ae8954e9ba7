"""A known sequence of collectives for the timeline tests (JAXCACHE_TIMELINE set by the test).

    timeline_job.py [--rounds N]     N rounds of the sequence, then a clean shutdown
    timeline_job.py --forever        repeat until killed (the SIGKILL test)

One round, every collective eager (each completes before the next starts):
  allreduce 'a' (16 floats), allreduce 'b' (1 MiB + 4 bytes: reduced in place),
  grouped_allreduce 'grads' of 4 small tensors (one request: fused through the
  fusion buffer), broadcast 'params', allgather 'gather'.
Round 1 negotiates every name through rank 0; later rounds hit the response cache.

Before the rounds, 'late' is an allreduce that rank 0 submits 0.5 s after the
others, so the coordinator hears of it from other ranks before its own request.
After the rounds (not with --forever), a jitted step reduces 24 tensors of 10 KB
as 12 groups 'J/<g>of12' five times (20 KB a group: more than the cycle message
carries, 16 KiB, so the data phase serves them): XLA starts the independent custom calls
concurrently, so several requests are ready in one cycle and share one fusion
buffer.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax

import jax.numpy as jnp
import numpy as np

import jaxcache
from _util import COMM, assert_close, done

NAMES = ("late", "a", "b", "grads/0of1", "params", "gather")
JIT_GROUPS = 12
JIT_STEPS = 5


def late_rank0() -> None:
    if jaxcache.rank() == 0:
        time.sleep(0.5)
    x = jaxcache.allreduce(jnp.ones((3,), jnp.float32), op="sum", name="late")
    assert_close(x, np.full((3,), jaxcache.size(), np.float32), "late")


def jit_fused_steps() -> None:
    tree = {f"t{k:02d}": jnp.full((2560,), float(k), jnp.float32) for k in range(2 * JIT_GROUPS)}
    step = jax.jit(lambda t: jaxcache.grouped_allreduce(t, op="average", num_groups=JIT_GROUPS, name="J"))
    for _ in range(JIT_STEPS):
        out = jax.block_until_ready(step(tree))
    for k in range(2 * JIT_GROUPS):
        assert_close(out[f"t{k:02d}"], np.full((2560,), float(k), np.float32), f"J t{k}")


def one_round(i: int) -> None:
    r, n = jaxcache.rank(), jaxcache.size()
    a = jaxcache.allreduce(jnp.full((16,), float(r + i), jnp.float32), op="sum", name="a")
    assert_close(a, np.full((16,), sum(range(n)) + n * i, np.float32), "a")
    big = jaxcache.allreduce(jnp.ones((262145,), jnp.float32), op="sum", name="b")
    assert float(big[0]) == n
    grads = {f"g{k}": jnp.full((8 + k,), float(r), jnp.float32) for k in range(4)}
    out = jaxcache.grouped_allreduce(grads, op="average", name="grads")
    for k in range(4):
        assert_close(out[f"g{k}"], np.full((8 + k,), (n - 1) / 2, np.float32), f"grads g{k}", rtol=1e-6)
    p = jaxcache.broadcast(jnp.full((4,), float(r), jnp.float32), root=0, name="params")
    assert_close(p, np.zeros(4, np.float32), "params")
    g = jaxcache.allgather(jnp.full((2,), float(r), jnp.float32), name="gather")
    assert_close(g, np.repeat(np.arange(n, dtype=np.float32), 2), "gather")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--forever", action="store_true")
    args = ap.parse_args()
    jaxcache.init()
    late_rank0()
    i = 0
    while args.forever or i < args.rounds:
        one_round(i)
        i += 1
        if args.forever and i == 3 and jaxcache.rank() == 0:
            print("RUNNING", flush=True)
    jit_fused_steps()
    if jaxcache.rank() == 0:
        print("stats:", jaxcache.stats(), flush=True)
    layout = jaxcache.cache_layout()
    assert set(NAMES) <= set(layout), layout
    COMM.Barrier()
    jaxcache.shutdown()
    done("timeline_job")


if __name__ == "__main__":
    sys.exit(main())
