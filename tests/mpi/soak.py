"""Soak: 10,000 steps of a jitted grouped step; results stay correct and RSS grows < 5%."""

import sys

import numpy as np
import psutil
import jax
import jax.numpy as jnp

import jaxcache as jc
from _util import COMM, done

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
jc.init()
rank, size = jc.rank(), jc.size()

# Rank-dependent values enter as arguments: the compiled program must be the same on
# every rank (see docs/reliability.md, "identical programs").
@jax.jit
def step(tree, k):
    grads = jax.tree_util.tree_map(lambda p: p * 0 + k, tree)
    red = jc.grouped_allreduce(grads, "sum", num_groups=3, name="soak")
    return red

tree = {"w1": jnp.ones((64, 32)), "b1": jnp.ones(32), "w2": jnp.ones((32, 10)), "b2": jnp.ones(10),
        "emb": jnp.ones((100, 8), jnp.float16)}
tri = size * (size + 1) / 2
proc = psutil.Process()
rss_warm = None
for s in range(steps):
    k = float(s % 5)
    out = step(tree, k * (rank + 1))
    if s % 500 == 0 or s == steps - 1:
        for leaf in jax.tree_util.tree_leaves(out):
            np.testing.assert_array_equal(np.asarray(leaf, np.float32), np.float32(k * tri))
    if s == 1000:
        rss_warm = proc.memory_info().rss
jax.block_until_ready(out)
rss_end = proc.memory_info().rss
growth = (rss_end - rss_warm) / rss_warm
print(f"rank {rank}: RSS {rss_warm / 2**20:.1f} MiB -> {rss_end / 2**20:.1f} MiB ({growth:+.2%}) over {steps} steps",
      flush=True)
assert growth < 0.05, f"RSS grew {growth:.1%}"
stats = jc.stats()
assert stats["cache_hits"] >= 3 * (steps - 1), stats
done("soak")
