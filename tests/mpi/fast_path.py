"""The small-collective fast path (argv[1] picks the scenario):

  in-cycle  - small cached allreduces ride in the cycle's own allreduce: every dtype and op
              against NumPy, under jit (a dependent lax.scan chain) and eagerly, groups of
              mixed dtypes, next to large requests in the same cycle; no data-phase MPI call
  evict     - with a tiny cache (JAXCACHE_CACHE_CAPACITY=4) slots follow evictions: results
              stay right and layouts identical on every rank
  threads   - several threads submitting (and driving cycles inline) at once
  order     - in-cycle results that depend on the combination order (float sums across
              magnitudes, min/max with NaNs), eager and jitted: the same bits on every rank
"""

import sys
import threading

import numpy as np
import jax
import jax.numpy as jnp

import jaxcache as jc
from _util import COMM, assert_close, done, same_on_all_ranks

jax.config.update("jax_enable_x64", True)  # float64 / int64 cases
mode = sys.argv[1]
jc.init()
rank, size = jc.rank(), jc.size()

CASES = [  # dtype, op
    (jnp.float32, "sum"), (jnp.float32, "max"), (jnp.float64, "min"), (jnp.float16, "sum"),
    (jnp.bfloat16, "sum"), (jnp.int32, "prod"), (jnp.int64, "sum"), (jnp.uint8, "max"),
    (jnp.complex64, "sum"), (jnp.bool_, "min"), (jnp.float32, "average"),
]


def local_value(dtype, k):
    if dtype == jnp.bool_:
        return np.array([(rank + k) % 3 != 0] * 5)
    return (np.arange(5) % 3 + rank + k + 1).astype(dtype)


def reference(dtype, op, k):
    vals = []
    for r in range(size):
        if dtype == jnp.bool_:
            vals.append(np.array([(r + k) % 3 != 0] * 5))
        else:
            vals.append((np.arange(5) % 3 + r + k + 1).astype(np.float64 if dtype != jnp.complex64 else np.complex128))
    stack = np.stack(vals)
    out = {"sum": stack.sum(0), "max": stack.max(0), "min": stack.min(0), "prod": stack.prod(0),
           "average": stack.mean(0)}[op]
    return out.astype(dtype)


if mode == "in-cycle":
    # Eager: the first call negotiates, later calls are cached and reduced in the cycle.
    for i, (dtype, op) in enumerate(CASES):
        for k in range(3):
            y = jc.allreduce(local_value(dtype, k), op, name=f"fast.{i}")
            tol = 1e-2 if dtype in (jnp.float16, jnp.bfloat16) else 1e-6
            assert_close(y, reference(dtype, op, k), f"{dtype.__name__} {op} call {k}", rtol=tol)
            same_on_all_ranks(y, f"{dtype.__name__} {op}")
    before = jc.stats()
    for k in range(5):
        jc.allreduce(local_value(jnp.float32, k), "sum", name="fast.0")
    after = jc.stats()
    assert after["in_cycle_reductions"] - before["in_cycle_reductions"] == 5, (before, after)
    assert after["mpi_calls"] == before["mpi_calls"], "a cached small allreduce made a data call"

    # A dependent jitted chain: every step after the first is in-cycle.
    step = jax.jit(lambda x: jax.lax.scan(
        lambda c, _: (jc.allreduce(c, "sum", name="fast.chain") / size, None), x, None, length=200)[0])
    x = jnp.full(64, float(rank + 1), jnp.float32)
    jax.block_until_ready(step(x))
    before = jc.stats()
    y = jax.block_until_ready(step(x))
    after = jc.stats()
    assert_close(y, np.full(64, (size + 1) / 2, np.float32), "chain")
    assert after["in_cycle_reductions"] - before["in_cycle_reductions"] == 200, (before, after)
    assert after["mpi_calls"] == before["mpi_calls"]

    # A group of mixed dtypes is one slot; a large tensor in the same step takes the data phase.
    tree = {"h": jnp.ones(7, jnp.float16) * rank, "d": jnp.arange(3.0, dtype=jnp.float64) + rank,
            "i": jnp.arange(4, dtype=jnp.int32) * (rank + 1)}
    big = jnp.ones(300_000, jnp.float32) * rank
    f = jax.jit(lambda t, b: (jc.grouped_allreduce(t, "sum", name="fast.group"),
                              jc.allreduce(b, "sum", name="fast.big")))
    for _ in range(4):
        got, gb = f(tree, big)
    tri = size * (size - 1) / 2
    assert_close(got["h"], np.full(7, tri, np.float16), "group f16")
    assert_close(got["d"], np.arange(3.0) * size + tri, "group f64")
    assert_close(got["i"], np.arange(4, dtype=np.int32) * (size * (size + 1) // 2), "group i32")
    assert_close(gb, np.full(300_000, tri, np.float32), "big")
    done("fast_path in-cycle")

elif mode == "evict":
    layouts = []
    for step in range(4):
        for k in range(10):  # more small names than the cache holds
            y = jc.allreduce(jnp.full(3 + k, float(rank + k), jnp.float32), "sum", name=f"evict.{k}")
            assert_close(y, np.full(3 + k, sum(r + k for r in range(size)), np.float32), f"evict {k}")
        layouts.append(sorted(jc.cache_layout().items()))
    same_on_all_ranks(np.frombuffer(repr(layouts).encode(), np.uint8), "layouts")
    assert jc.stats()["cache_evictions"] > 0
    done("fast_path evict")

elif mode == "threads":
    errors = []

    def worker(t):
        try:
            for k in range(50):
                v = np.full(8, float(rank * 100 + t * 10 + k % 10), np.float32)
                y = jc.allreduce(v, "sum", name=f"thread.{t}")
                want = sum(r * 100 + t * 10 + k % 10 for r in range(size))
                assert_close(y, np.full(8, want, np.float32), f"thread {t} call {k}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    assert not errors, errors
    done("fast_path threads")

elif mode == "order":
    rng = np.random.default_rng(1234 + rank)
    f = jax.jit(lambda v: jc.allreduce(v, "sum", name="order.jit"))
    for k in range(20):
        # Magnitudes from 1e-8 to 1e8: a float32 sum's bits depend on the order of additions.
        v = (rng.standard_normal(64) * 10.0 ** rng.integers(-8, 9, 64)).astype(np.float32)
        stack = np.stack(COMM.allgather(v)).astype(np.float64)
        bound = 4 * size * np.finfo(np.float32).eps * np.abs(stack).sum(0)
        for how, y in (("eager", jc.allreduce(v, "sum", name="order.eager")), ("jit", f(v))):
            y = np.asarray(y)
            err = np.abs(y.astype(np.float64) - stack.sum(0))
            assert (err <= bound).all(), f"{how} sum {k}: off by {err.max()} (bound {bound.max()})"
            same_on_all_ranks(y, f"{how} sum {k}")
    # min/max are IEEE minimum/maximum: a NaN on any rank gives NaN (as np.min), and -0 < +0.
    # MPI's MIN/MAX left both to the combination order (ranks disagreed). In the cycle
    # (cached, 16 values) and in the data phase (first call; 100,000 values), eager and jit.
    for op, npop in (("min", np.min), ("max", np.max)):
        for n in (16, 100_000):
            g = jax.jit(lambda v, op=op, n=n: jc.allreduce(v, op, name=f"order.{op}.{n}.jit"))
            for k in range(5):
                v = ((np.arange(n) % 16 - 8) * (rank + 1 + k)).astype(np.float32)
                v[(rank + k) % 16] = np.nan
                v[(rank + k + 5) % 16] = np.nan if rank % 2 else -np.nan  # two NaN payloads
                v[13] = 0.0 if (rank + k) % 2 else -0.0  # signed zeros meet
                v[14] = -0.0 if (rank + k) % 2 else 0.0
                v[15] = 0.0
                stack = np.stack(COMM.allgather(v))
                for how, y in (("eager", jc.allreduce(v, op, name=f"order.{op}.{n}")), ("jit", g(v))):
                    y = np.asarray(y)
                    what = f"{op} of {n} {how}, call {k}"
                    same_on_all_ranks(y, what)
                    assert_close(y, npop(stack, 0), what)  # NaN where any rank has one
                    zero_sign = np.signbit(y[13:15])
                    want_sign = [op == "min" and size > 1] * 2
                    assert list(zero_sign) == want_sign, (what, y[13:15])
                    assert not np.signbit(y[15]), what
    assert jc.stats()["in_cycle_reductions"] > 0
    done("fast_path order")

else:
    raise SystemExit(f"unknown mode {mode}")
jc.shutdown()
