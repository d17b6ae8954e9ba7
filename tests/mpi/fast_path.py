"""The small-collective fast path (argv[1] picks the scenario):

  in-cycle  - small cached allreduces ride in the cycle's own allreduce: every dtype and op
              against NumPy, under jit (a dependent lax.scan chain) and eagerly, groups of
              mixed dtypes, next to large requests in the same cycle; no data-phase MPI call
  evict     - with a tiny cache (JAXCACHE_CACHE_CAPACITY=4) slots follow evictions: results
              stay right and layouts identical on every rank
  threads   - several threads submitting (and driving cycles inline) at once
  order     - in-cycle results that depend on the combination order (float sums across
              magnitudes, min/max with NaNs), eager and jitted: the same bits on every rank
  per-leaf  - one jitted step of many small named allreduces (one per gradient leaf), more
              than any fixed region would hold: in steady state, by counters, with the cache
              no coordinator round and no data MPI call, every one reduced in the cycle, and
              no more cycles than with the cache off (the runtime restarted with capacity 0),
              which needs a coordinator round per cycle, and most calls completed by XLA's
              own thread (inline driving), none held for a burst; with 1 KB leaves (run
              concurrently by XLA) a few wake-ups of the completion thread a step, not one
              per completion, and where ranks outnumber cores a few cycles a step (each held
              until the burst pauses); also a burst of eager requests submitted together
              (larger than one cycle message carries), none completed inline with
              JAXCACHE_INLINE_SPIN_US=0
  oversubscribed - where this host runs more ranks than it has cores, the background thread
              sleeps through a long transfer (a large allreduce) with more requests waiting
              behind it instead of yield-polling it (`transfer_sleeps`), and only there: with
              a core per rank it never sleeps
"""

import os
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

    # The largest entry, a 16 KiB leaf (4096 float32), rides in the cycle too.
    leaf = jnp.full(4096, float(rank + 1), jnp.float32)
    jc.allreduce(leaf, "sum", name="fast.16k")  # negotiated, then cached
    before = jc.stats()
    for k in range(5):
        y = jc.allreduce(leaf, "sum", name="fast.16k")
    after = jc.stats()
    assert_close(y, np.full(4096, size * (size + 1) / 2, np.float32), "16 KiB leaf")
    same_on_all_ranks(y, "16 KiB leaf")
    assert after["in_cycle_reductions"] - before["in_cycle_reductions"] == 5, (before, after)
    assert after["mpi_calls"] == before["mpi_calls"], "a cached 16 KiB allreduce made a data call"

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

elif mode == "per-leaf":
    from jaxcache._ext import ext
    from jaxcache.protocol import NUMPY_DTYPES, Kind
    from jaxcache.errors import raise_for_status

    N, E = 500, 16  # 64-byte leaves: XLA:CPU runs the calls one after another, a cycle each
    leaves = [jnp.asarray((np.arange(E) % 7 + rank * 3 + i % 11).astype(np.float32)) for i in range(N)]
    want = [(np.arange(E) % 7 * size + 3 * size * (size - 1) // 2 + size * (i % 11)).astype(np.float32)
            for i in range(N)]
    step = jax.jit(lambda xs: [jc.allreduce(x, "sum", name=f"leaf.{i}") for i, x in enumerate(xs)])

    def measure():
        for _ in range(2):  # the first step negotiates every name
            jax.block_until_ready(step(leaves))
        before = jc.stats()
        steps = 3
        for _ in range(steps):
            got = jax.block_until_ready(step(leaves))
        after = jc.stats()
        for i in (0, 1, N // 2, N - 1):
            assert_close(got[i], want[i], f"leaf {i}")
            same_on_all_ranks(got[i], f"leaf {i}")
        return {k: (after[k] - before[k]) / steps for k in
                ("cycles", "coordinator_rounds", "mpi_calls", "in_cycle_reductions", "cache_hits",
                 "completed_inline", "burst_holds")}

    cached = measure()
    # Inline driving: XLA's thread runs the cycle of its own small call and completes it
    # itself, without a hand-over to the background and completion threads (91-99% of the
    # calls at 2 and 3 ranks on 2 cores; a peer descheduled for longer than
    # JAXCACHE_INLINE_SPIN_US takes the rest through the background thread).
    assert cached["completed_inline"] >= N // 4, cached
    assert cached["coordinator_rounds"] == 0, cached
    assert cached["mpi_calls"] == 0, f"cached small leaves made data MPI calls: {cached}"
    assert cached["in_cycle_reductions"] == N, cached
    assert cached["cycles"] <= N, cached
    # One call at a time (a cycle each) is never held for a burst.
    assert cached["burst_holds"] == 0, cached

    # Leaves of 1 KB: XLA:CPU runs these calls concurrently, so most complete on the
    # background thread and reach XLA through the completion thread. A cycle hands over
    # what it completed in one wake-up of that thread, not one each (a wake-up per
    # completion cost ~11 us apiece at 3 ranks on 2 cores: most of such a step).
    wide = [jnp.asarray(np.full(256, rank + i % 7, np.float32)) for i in range(N)]
    wide_step = jax.jit(lambda xs: [jc.allreduce(x, "sum", name=f"wide.{i}") for i, x in enumerate(xs)])
    for _ in range(2):
        jax.block_until_ready(wide_step(wide))
    before = jc.stats()
    step_cycles = []
    for _ in range(5):
        c0 = jc.stats()["cycles"]
        got = jax.block_until_ready(wide_step(wide))
        step_cycles.append(jc.stats()["cycles"] - c0)
    after = jc.stats()
    for i in (0, 1, N - 1):
        assert_close(got[i], np.full(256, sum(r + i % 7 for r in range(size)), np.float32), f"wide {i}")
        same_on_all_ranks(got[i], f"wide {i}")
    handed = N - (after["completed_inline"] - before["completed_inline"]) / 5
    wakeups = (after["completion_wakeups"] - before["completion_wakeups"]) / 5
    wide_cycles = (after["cycles"] - before["cycles"]) / 5
    # How many are handed over varies with how XLA's threads are scheduled (300 of 500 ran
    # inline once on a loaded host); a wake-up per completion would be ~one per leaf.
    assert handed >= N // 10, f"the 1 KB leaves were completed inline ({handed} of {N} handed over)"
    assert wakeups <= wide_cycles + N // 10, (
        f"{wakeups} wake-ups of the completion thread per step for {handed} completions in "
        f"{wide_cycles} cycles")
    # Where ranks outnumber cores, a cycle waits for the burst of requests XLA is still
    # starting to pause, so a step takes a few cycles, not one per handful of leaves. Steps
    # vary widely either way (3 to 500 cycles seen without the hold, 2 to 118 with it; the
    # median of five: 4-59 without, 9 of 12 runs above 12; 2-6 with, 4-9 beside a CPU hog),
    # so the median is bounded, and the holds counted.
    # Summed over ranks: a rank whose requests queue behind a peer's held cycle holds none.
    holds = COMM.allreduce(after["burst_holds"] - before["burst_holds"]) / 5
    if ext.local_size() > len(os.sched_getaffinity(0)):
        assert holds > 0 and sorted(step_cycles)[2] <= N // 40, (
            f"{size} ranks on {len(os.sched_getaffinity(0))} cores: cycles per step {step_cycles}, "
            f"{holds} burst holds per step of {N} concurrent 1 KB allreduces")
    else:
        assert holds == 0, f"a core per rank, yet {holds} cycles held for a burst"

    # Eager per-leaf calls (a Python loop, as a user's): cached, in the cycle message, and
    # no jax.device_put per result (its Python cost ~100 us, more than the collective's).
    def eager_step():
        return [jc.allreduce(x, "sum", name=f"eager.{i}") for i, x in enumerate(leaves[:100])]

    eager_step()
    puts = []
    device_put = jax.device_put
    jax.device_put = lambda *a, **k: (puts.append(a), device_put(*a, **k))[1]
    try:
        before = jc.stats()
        got = eager_step()
        after = jc.stats()
    finally:
        jax.device_put = device_put
    assert not puts, f"the eager path called jax.device_put {len(puts)} times for 100 calls"
    assert after["coordinator_rounds"] == before["coordinator_rounds"], (before, after)
    assert after["mpi_calls"] == before["mpi_calls"], (before, after)
    assert after["in_cycle_reductions"] - before["in_cycle_reductions"] == 100, (before, after)
    for i in (0, 57, 99):
        assert isinstance(got[i], jax.Array)
        assert_close(got[i], want[i], f"eager leaf {i}")
        same_on_all_ranks(got[i], f"eager leaf {i}")

    # A burst: every request submitted before any is waited for (as Horovod's hooks do),
    # with inline driving off so that they are all pending together; 400 x 256 B is more
    # than one cycle message carries, so some take the data phase.
    jc.shutdown()
    os.environ["JAXCACHE_INLINE_SPIN_US"] = "0"
    jc.init()
    code = [NUMPY_DTYPES[np.dtype(np.float32)]]
    ins = [np.full(64, float(rank + i % 5), np.float32) for i in range(400)]
    outs = [np.empty_like(x) for x in ins]

    def burst():
        handles = [ext.submit(Kind.ALLREDUCE, f"burst.{i}", [ins[i]], [outs[i]], 0, 1.0, 1.0, 0, code)
                   for i in range(len(ins))]
        for h in handles:
            raise_for_status(*h.wait())

    burst()
    before = jc.stats()
    burst()
    after = jc.stats()
    for i in (0, 199, 399):
        assert_close(outs[i], np.full(64, sum(r + i % 5 for r in range(size)), np.float32), f"burst {i}")
    assert after["coordinator_rounds"] == before["coordinator_rounds"], (before, after)
    assert after["in_cycle_reductions"] > before["in_cycle_reductions"], (before, after)
    burst_cycles = after["cycles"] - before["cycles"]
    assert burst_cycles < len(ins) // 4, (before, after)
    assert after["completed_inline"] == before["completed_inline"], "inline driving is off"

    jc.shutdown()
    del os.environ["JAXCACHE_INLINE_SPIN_US"]
    os.environ["JAXCACHE_CACHE_CAPACITY"] = "0"
    jc.init()
    uncached = measure()
    assert uncached["coordinator_rounds"] >= 1 and uncached["cycles"] >= 1, uncached
    assert cached["cycles"] <= uncached["cycles"], (cached, uncached)
    if rank == 0:
        print(f"per-leaf counters per step: cached {cached}; uncached {uncached}; 1 KB leaves: "
              f"{wakeups} completion wake-ups for {handed} handed over, {wide_cycles} cycles, "
              f"cycles per step {step_cycles}, {holds} burst holds; eager burst {burst_cycles} cycles", flush=True)
    done("fast_path per-leaf")

elif mode == "oversubscribed":
    import time
    from jaxcache._ext import ext
    from jaxcache.protocol import NUMPY_DTYPES, Kind
    from jaxcache.errors import raise_for_status

    oversubscribed = ext.local_size() > len(os.sched_getaffinity(0))
    # Large allreduces submitted one after another (as a backward pass's hooks do): each is
    # milliseconds of 4 MiB MPI calls on the background thread, and the next waits behind it.
    n, count = 4 << 20, 8  # 16 MiB of float32 each
    code = [NUMPY_DTYPES[np.dtype(np.float32)]]
    ins = [np.arange(n, dtype=np.float32) % 1024 + rank + k for k in range(count)]
    outs = [np.empty_like(x) for x in ins]
    def stream():
        handles = []
        for k in range(count):
            handles.append(ext.submit(Kind.ALLREDUCE, f"oversubscribed.{k}", [ins[k]], [outs[k]], 0, 1.0, 1.0, 0,
                                      code))
            time.sleep(0.001)
        for h in handles:
            raise_for_status(*h.wait())

    stream()  # negotiates the names
    before = jc.stats()
    stream()
    slept = jc.stats()["transfer_sleeps"] - before["transfer_sleeps"]
    for k in range(count):
        want = np.arange(n, dtype=np.float32) % 1024 * size + size * (size - 1) // 2 + size * k
        assert_close(outs[k], want.astype(np.float32), f"16 MiB allreduce {k}")
        same_on_all_ranks(outs[k], f"16 MiB allreduce {k}")
    cores = len(os.sched_getaffinity(0))
    if oversubscribed:
        assert slept > 0, f"{ext.local_size()} ranks on {cores} cores: no transfer was slept through"
    else:
        assert slept == 0, f"a core per rank ({cores} cores), yet {slept} transfer polls slept"
    if rank == 0:
        print(f"oversubscribed={oversubscribed}: {slept} transfer sleeps", flush=True)
    done("fast_path oversubscribed")

else:
    raise SystemExit(f"unknown mode {mode}")
jc.shutdown()
