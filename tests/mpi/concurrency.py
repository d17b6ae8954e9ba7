"""Out-of-order collectives: concurrent thunks under jit, and eager calls from threads in
rank-dependent orders. Matching by name must make both safe."""

import sys
import threading

import numpy as np
import jax
import jax.numpy as jnp

import jaxcache as jc
from _util import COMM, assert_close, done, same_on_all_ranks

jc.init()
rank, size = jc.rank(), jc.size()
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50

# 1. A jitted step with 16 independent 1 MB allreduces: XLA:CPU starts them
#    concurrently, in whatever order its thread pool picks on each rank.
N, ELEMS = 16, (1 << 20) // 4


@jax.jit
def step(xs, k):
    outs = []
    for i, x in enumerate(xs):
        y = jc.allreduce(x * k + i, "sum", name=f"concurrent.{i}")
        outs.append(y)
    return outs


base = [jnp.full((ELEMS,), float(rank + 1), jnp.float32) * (i + 1) for i in range(N)]
sum_ranks = size * (size + 1) / 2
for s in range(steps):
    k = jnp.float32(s % 7 + 1)
    outs = step(base, k)
    for i, y in enumerate(outs):
        expect = (sum_ranks * (i + 1)) * float(k) + size * i
        got = np.asarray(y)
        assert got[0] == expect and got[-1] == expect, (s, i, got[0], expect)
        if s == steps - 1:
            same_on_all_ranks(got, f"concurrent.{i}")

# The same with automatic names (derived from the call site and the trace order).
@jax.jit
def auto_step(xs):
    return [jc.allreduce(x, "max") for x in xs]


for _ in range(5):
    outs = auto_step(base)
    for i, y in enumerate(outs):
        assert float(y[0]) == size * (i + 1)

# 2. Eager calls from several threads. Each rank deals the names to its threads
#    differently (a rank-dependent shuffle), so the ranks submit them in different
#    orders from different threads. Each thread goes through its names in ascending
#    order, which keeps the program itself free of cyclic waits: the lowest pending
#    name is always submitted everywhere.
THREADS, NAMES = 4, 48
errors = []
dealt = np.array_split(np.random.default_rng(rank).permutation(NAMES), THREADS)


def worker(t):
    try:
        rng = np.random.default_rng([rank, t])
        for j in sorted(dealt[t]):
            if rng.random() < 0.2:
                threading.Event().wait(rng.random() * 0.005)
            name = f"threaded.op{j}"
            x = jnp.arange(10, dtype=jnp.int32) * (rank + 1) + j
            y = jc.allreduce(x, "sum", name=name)
            expect = np.arange(10, dtype=np.int32) * int(sum_ranks) + size * j
            np.testing.assert_array_equal(np.asarray(y), expect)
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(f"thread {t}: {e!r}")


threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
for th in (threads if rank % 2 == 0 else threads[::-1]):
    th.start()
for th in threads:
    th.join(timeout=60)
assert not any(th.is_alive() for th in threads), "eager threads did not finish"
assert not errors, errors
done("concurrency")
