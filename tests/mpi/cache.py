"""Response cache behaviour. argv[1]: expected capacity mode: default | small | off."""

import sys
import time

import numpy as np
import jax
import jax.numpy as jnp
from mpi4py import MPI

import jaxcache as jc
from _util import COMM, assert_close, done, same_on_all_ranks

mode = sys.argv[1]
jc.init()
rank, size = jc.rank(), jc.size()
tri = size * (size + 1) // 2

# 1. A jitted step with 24 named collectives (mixed kinds), 50 times.
N = 24


@jax.jit
def step(x, k):
    outs = []
    for i in range(N):
        if i % 3 == 0:
            outs.append(jc.broadcast(x * k + i, root=i % size, name=f"c.bc{i}"))
        elif i % 3 == 1:
            outs.append(jc.allreduce(x * k + i, "sum", name=f"c.ar{i}"))
        else:
            outs.append(jc.allgather(x[:2] * k + i, name=f"c.ag{i}"))
    return outs


x = jnp.arange(8, dtype=jnp.float32) * 0 + (rank + 1)
def check(outs, k):
    for i, y in enumerate(outs):
        y = np.asarray(y)
        if i % 3 == 0:
            expect = np.full(8, ((i % size) + 1) * k + i, np.float32)
        elif i % 3 == 1:
            expect = np.full(8, tri * k + size * i, np.float32)
        else:
            expect = np.concatenate([np.full(2, (q + 1) * k + i, np.float32) for q in range(size)])
        assert_close(y, expect, f"step output {i} (k={k})")

jc.reset_stats()
check(step(x, 1.0), 1.0)
after_first = jc.stats()
for s in range(2, 51):
    check(step(x, float(s)), float(s))
final = jc.stats()
rounds = final["coordinator_rounds"] - after_first["coordinator_rounds"]
if mode == "default":
    assert after_first["coordinator_rounds"] >= 1
    assert rounds == 0, f"coordinator rounds kept growing after the first step: +{rounds}"
    assert final["cache_hits"] - after_first["cache_hits"] == N * 49, final
    layout = jc.cache_layout()
    assert all(f"c.ar{i}" in layout for i in range(1, N, 3)), layout
    assert COMM.allgather(sorted(layout.items())) == [sorted(layout.items())] * size
elif mode == "off":
    # Without the cache every step negotiates through rank 0.
    assert rounds >= 49, final
    assert final["cache_hits"] == 0 and jc.cache_layout() == {}
elif mode == "small":
    assert final["cache_evictions"] > 0, final
    layout = jc.cache_layout()
    assert len(layout) <= 4, layout
    assert COMM.allgather(sorted(layout.items())) == [sorted(layout.items())] * size, "layouts differ"

# 2. Capacity pressure with 20 eager names, cycled: still correct, identical layouts.
for it in range(3):
    for j in range(20):
        y = jc.allreduce(jnp.full((3,), j + rank, jnp.int32), "sum", name=f"cycle.{j}")
        np.testing.assert_array_equal(np.asarray(y), np.full(3, size * j + size * (size - 1) // 2))
layouts = COMM.allgather(sorted(jc.cache_layout().items()))
assert all(l == layouts[0] for l in layouts), "cache layouts differ across ranks"

# 3. Every rank changes a tensor's shape under the same name: invalidation, renegotiation.
before = jc.stats()["cache_invalidations"]
for shape in [(4,), (4,), (6,), (6,), (2, 3)]:
    y = jc.allreduce(jnp.ones(shape, jnp.float32) * rank, "sum", name="reshaped")
    assert_close(y, np.full(shape, sum(range(size)), np.float32), f"reshaped {shape}")
if mode != "off":
    assert jc.stats()["cache_invalidations"] - before >= 2, jc.stats()

# 4. A cached name submitted late by one rank: the others wait, result correct.
f = jax.jit(lambda v: jc.allreduce(v, "sum", name="late"))
f(jnp.ones(4)).block_until_ready()  # now cached
for late in range(size):
    COMM.Barrier()
    if rank == late:
        time.sleep(0.5)
    t0 = time.perf_counter()
    y = f(jnp.ones(4) * (rank + 1))
    assert_close(y, np.full(4, tri, np.float32), "late")
    waited = time.perf_counter() - t0
    if rank != late:
        assert waited > 0.3, f"rank {rank} did not wait for late rank {late}: {waited:.3f}s"
same_on_all_ranks(np.asarray(y))
done(f"cache[{mode}]")
