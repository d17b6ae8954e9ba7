"""Exactly once, on every rank (argv[1] picks the scenario):

  transforms  - one helper used through vmap (twice), checkpoint, scan, cond, custom_vjp, a
                jitted function called twice inside another, and plainly, in ONE jitted step:
                50 steps, right results, distinct names, zero invalidations after step 1
  async       - 8 asynchronously dispatched executions of one jitted function (same names)
                in flight while another rank lags: all results right, in order
  queue       - one explicit name submitted again while in flight (threads): queued behind
                the first and matched by submission number on every rank
  bridge-duplicates - torch/TF: an explicitly named eager request whose name is still in
                flight on this rank raises ValueError at once, before anything is sent
  settings    - rank 1 has another JAXCACHE_STALL_SHUTDOWN_TIME / JAXCACHE_MAX_MPI_COUNT:
                rank 0's values are used everywhere and rank 1 warns
  resize      - shutdown(), init() on a split communicator: a jitted collective traced for
                the old size raises a clear error instead of writing out of bounds
"""

import os
import sys
import threading
import time

import numpy as np
import jax
import jax.numpy as jnp

import jaxcache as jc
from _util import COMM, assert_close, done, same_on_all_ranks

mode = sys.argv[1]
rank, size = COMM.rank, COMM.size
if mode == "settings" and rank == 1:
    os.environ["JAXCACHE_STALL_SHUTDOWN_TIME"] = "7"
    os.environ["JAXCACHE_MAX_MPI_COUNT"] = "3"
if mode == "bad-setting":
    # One rank's bad value fails init() on every rank, naming the rank; a corrected retry works.
    if rank == size - 1:
        os.environ["JAXCACHE_CHUNK_BYTES"] = "-1"
    try:
        jc.init()
    except ValueError as e:
        assert f"rank {size - 1}: JAXCACHE_CHUNK_BYTES='-1' must be >= 0" in str(e), e
    else:
        raise AssertionError("init() accepted a bad setting")
    assert not jc.is_initialized()
    os.environ.pop("JAXCACHE_CHUNK_BYTES", None)
jc.init()


def _catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    return None


def helper(v):
    return jc.allreduce(v, "sum")


@jax.custom_vjp
def scaled(v):
    return helper(v) * 2.0


scaled.defvjp(lambda v: (scaled(v), None), lambda _, g: (g,))


@jax.jit
def inner(v):
    return helper(v) + 1.0


def transformed_step(x, flag):
    a = jax.vmap(helper)(jnp.stack([x, 2 * x]))                # 2 rows, one collective
    b = jax.vmap(helper)(jnp.stack([3 * x, 4 * x, 5 * x]))     # the same site again
    c = jax.checkpoint(helper)(x)
    d = helper(x)
    e = jax.lax.scan(lambda carry, _: (helper(carry) / size, None), x, None, length=3)[0]
    f = jax.lax.cond(flag, helper, lambda v: helper(v * 3.0), x)
    g = scaled(x)
    h = inner(x) + inner(2 * x)                                 # one jitted function twice
    return a.sum(0) + b.sum(0) + c + d + e + f + g + h


def expected_step(xs):  # xs: every rank's x
    s = xs.sum(0)
    mean_fixed_point = s / size  # scan: mean of means stays the mean
    return 3 * s + 12 * s + s + s + mean_fixed_point + s + 2 * s + (s + 1) + (2 * s + 1)


if mode == "transforms":
    step = jax.jit(transformed_step)
    xs = np.stack([np.arange(4, dtype=np.float32) + r for r in range(size)])
    x = jnp.asarray(xs[rank])
    first = None
    for i in range(50):
        y = step(x, jnp.asarray(True))
        if i == 0:
            first = jc.stats()
            names = sorted(n for n in jc.cache_layout() if "helper" in n or "inner" in n)
        assert_close(y, expected_step(xs).astype(np.float32), f"step {i}", rtol=1e-5)
        same_on_all_ranks(y, f"step {i}")
    after = jc.stats()
    assert after["cache_invalidations"] == 0, after
    assert after["coordinator_rounds"] == first["coordinator_rounds"], (first, after)
    assert after["cache_hits"] > first["cache_hits"], (first, after)
    # vmap x2, checkpoint, plain, scan body, cond x2 branches, custom_vjp, inner twice.
    assert len(names) >= 9, names
    assert any(n.endswith("~1") for n in names), names  # the second call of `inner`
    same_on_all_ranks(np.frombuffer("\n".join(names).encode(), np.uint8), "names")
    # Gradient through the transformed step (jvp/transpose names stay unique too).
    grad = jax.jit(jax.grad(lambda v: transformed_step(v, jnp.asarray(False)).sum()))
    for _ in range(3):
        gv = grad(x)
    same_on_all_ranks(gv, "gradient")
    assert np.all(np.isfinite(np.asarray(gv)))
    done("exactly_once transforms")

elif mode == "async":
    @jax.jit
    def evaluate(v):
        return [jc.allreduce(v * k, "sum", name=f"eval.{k}") for k in range(3)]

    xs = [jnp.full(1000, float(i + rank)) for i in range(8)]
    jax.block_until_ready(evaluate(xs[0]))
    COMM.Barrier()
    if rank == size - 1:
        time.sleep(0.5)  # the other ranks queue all 8 executions meanwhile
    outs = [evaluate(v) for v in xs]  # dispatched asynchronously, not awaited
    for i, out in enumerate(outs):
        want = sum(float(i + r) for r in range(size))
        for k, o in enumerate(out):
            assert_close(o, np.full(1000, want * k, np.float32), f"execution {i} output {k}")
            same_on_all_ranks(o)
    done("exactly_once async")

elif mode == "queue":
    # Rank 0 submits "q" from 4 threads one after another without waiting; the others
    # submit the same 4 from one thread, late. Submission k pairs with submission k.
    results = [None] * 4
    started = [threading.Event() for _ in range(4)]
    inputs = [jnp.full(3, float(10 * k + rank)) for k in range(4)]
    jc.allreduce(inputs[0], "sum", name="q.warmup")  # first-call costs out of the way

    def submit(k):
        started[k].set()
        results[k] = jc.allreduce(inputs[k], "sum", name="q")

    if rank == 0:
        threads = []
        for k in range(4):
            t = threading.Thread(target=submit, args=(k,))
            t.start()
            started[k].wait()
            time.sleep(0.3)  # submission k is in the runtime before k+1
            threads.append(t)
        COMM.Barrier()
        for t in threads:
            t.join(60)
            assert not t.is_alive()
    else:
        COMM.Barrier()
        for k in range(4):
            submit(k)
    for k in range(4):
        want = sum(10.0 * k + r for r in range(size))
        assert_close(results[k], np.full(3, want, np.float32), f"submission {k}")
    done("exactly_once queue")

elif mode == "bridge-duplicates":
    import tensorflow as tf
    import torch
    import jaxcache.tensorflow as jctf
    import jaxcache.torch as jct

    if rank == 0:
        first = jct.allreduce_async(torch.ones(3), op="sum", name="dup")  # waits for the others
        try:
            jct.allreduce_async(torch.ones(3), op="sum", name="dup")
        except ValueError as e:
            assert "'dup'" in str(e) and "already in flight" in str(e), e
        else:
            raise AssertionError("an explicit duplicate name was accepted")
        # TF from another thread while "dup" is in flight: refused the same way.
        errors = []
        t = threading.Thread(target=lambda: errors.append(_catch(lambda: jctf.allreduce(tf.ones(3), op="sum", name="dup"))))
        t.start()
        t.join(30)
        assert errors and isinstance(errors[0], ValueError), errors
        COMM.Barrier()
        y = jct.synchronize(first)
    else:
        COMM.Barrier()
        y = jct.allreduce(torch.ones(3), op="sum", name="dup")
    assert_close(y.numpy(), np.full(3, size, np.float32), "dup")
    # Automatic names are never refused: a second in-flight submission of a site gets its own.
    hs = [jct.allreduce_async(torch.full((2,), float(k)), op="sum") for k in range(2)]
    for k, h in enumerate(hs):
        assert_close(jct.synchronize(h).numpy(), np.full(2, k * size, np.float32), f"auto {k}")
    done("exactly_once bridge-duplicates")

elif mode == "settings":
    from jaxcache._ext import ext

    assert ext.max_mpi_count() == 2**31 - 1, ext.max_mpi_count()
    # Chunking would differ per rank (and hang) if rank 1 used its own count.
    y = jax.jit(lambda v: jc.allreduce(v, "sum", name="settings.big"))(jnp.ones(1000))
    assert_close(y, np.full(1000, size, np.float32), "allreduce")
    done("exactly_once settings")

elif mode == "bad-setting":
    assert_close(jc.allreduce(jnp.ones(3), "sum", name="after.bad"), np.full(3, size, np.float32), "after")
    done("exactly_once bad-setting")

elif mode == "resize":
    gather = jax.jit(lambda v: jc.allgather(v, name="resize.gather"))
    average = jax.jit(lambda v: jc.allreduce(v, name="resize.avg"))
    x = jnp.arange(3.0) + rank
    assert gather(x).shape == (3 * size,)
    assert_close(average(x), np.arange(3.0, dtype=np.float32) + (size - 1) / 2, "average")
    jc.shutdown()
    sub = COMM.Split(color=rank % 2, key=rank)  # a communicator of another size
    jc.init(sub)
    assert jc.size() == sub.size != size
    for fn, what in ((gather, "resize.gather"), (average, "resize.avg")):
        try:
            jax.block_until_ready(fn(x))
        except Exception as e:  # noqa: BLE001 - XLA wraps it
            msg = str(e)
            assert what in msg and f"traced for {size} ranks" in msg, msg
        else:
            raise AssertionError(f"{what}: a program traced for {size} ranks ran on {sub.size}")
    # Traced again for the new size, it works.
    jax.clear_caches()
    y = jax.jit(lambda v: jc.allgather(v, name="resize.gather2"))(x)
    assert y.shape == (3 * sub.size,), y.shape
    jc.shutdown()
    sub.Free()
    jc.init()
    done("exactly_once resize")

else:
    raise SystemExit(f"unknown mode {mode}")
jc.shutdown()
