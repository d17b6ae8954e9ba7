"""Fault injection (JAXCACHE_FAULT_INJECT): every fault point, on rank 0 and on the last
rank. For each, every rank's pending requests complete with an error within seconds
(none is lost, none hangs), the same submissions fail on every rank, and the runtime
keeps working afterwards; the job then shuts down cleanly.

Each scenario re-initializes the runtime with the spec in the environment (rank 0's
value is the one every rank uses). argv[1]: the fault point to test.
"""

import os
import sys
import threading
import time

import numpy as np
import jax
import jax.numpy as jnp

import jaxcache as jc
from _util import COMM, assert_close, done

point = sys.argv[1]
rank, size = COMM.rank, COMM.size
BOUND_S = 10.0  # "within seconds": generous for an oversubscribed CI machine


def healthy(tag):
    y = jc.allreduce(jnp.ones(3) * rank, "sum", name=f"healthy.{tag}")
    assert_close(y, np.full(3, sum(range(size)), np.float32), f"healthy after {tag}")


def outcome(fn):
    """('ok', value) or ('error', message), and how long it took."""
    t0 = time.monotonic()
    try:
        value = jax.block_until_ready(fn())
        return ("ok", value), time.monotonic() - t0
    except Exception as e:  # noqa: BLE001 - eager raises jaxcache errors, jit raises XLA's
        return ("error", str(e)), time.monotonic() - t0


def run_concurrently(fns):
    results = [None] * len(fns)

    def work(i):
        results[i] = outcome(fns[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a request never completed"
    return results


def victim_call(kind, name):
    """The collective the data fault hits: a small tensor, a large one (pairwise exchanges
    in pieces, up to 4 ranks), or a group of small ones (one fusion buffer)."""
    if kind == "large":
        x = jnp.arange(1 << 19, dtype=jnp.float32) * (rank + 1)  # 2 MiB
        want = np.arange(1 << 19, dtype=np.float32) * sum(range(1, size + 1))
        return lambda: jc.allreduce(x, "sum", name=name), [want]
    if kind == "fused":
        xs = [jnp.full(1000 * (k + 1), rank + k, jnp.float32) for k in range(3)]
        want = [np.full(1000 * (k + 1), sum(range(size)) + size * k, np.float32) for k in range(3)]
        return lambda: jc.grouped_allreduce(xs, "sum", name=name), want
    return lambda: jc.allreduce(jnp.ones(4), "sum", name=name), [np.full(4, size, np.float32)]


def scenario(spec, tag, victim_kind="small"):
    os.environ["JAXCACHE_FAULT_INJECT"] = spec
    jc.init()
    target = int(spec.split("@")[1].split(":")[0])
    if point in ("coordinator", "decode"):
        # Several new names in flight at once: the round that carries them fails on the
        # target rank; every rank's requests of that round fail with the same error.
        fns = [lambda k=k: jc.allreduce(jnp.ones(4) * k, "sum", name=f"{tag}.{k}") for k in range(3)]
        fns.append(lambda: jax.jit(lambda v: jc.allreduce(v, "sum", name=f"{tag}.jit"))(jnp.ones(2)))
        results = run_concurrently(fns)
        errors = [r for (r, _) in results if r[0] == "error"]
        assert errors, f"rank {rank}: the injected {point} fault failed nothing: {results}"
        for (kind, value), took in results:
            assert took < BOUND_S, f"rank {rank}: a request took {took:.1f}s"
            if kind == "error":
                assert "cancelled every pending collective" in value and f"rank {target}" in value, value
        # The same submissions failed on every rank.
        failed = sorted(i for i, ((kind, _), _) in enumerate(results) if kind == "error")
        assert COMM.allgather(failed) == [failed] * size, COMM.allgather(failed)
    else:
        # `victim` fails where the fault is injected (it completed elsewhere); `bystander`,
        # pending on every rank but the lagging one when the cancel round runs, fails on
        # every rank -- the lagging rank's late submission is refused by its number.
        victim = f"{tag}.victim"
        call, want = victim_call(victim_kind, victim)
        (got, value), took = outcome(call)
        assert took < BOUND_S
        if rank == target:
            assert got == "error" and victim in value and "injected fault" in value, (got, value)
        else:
            assert got == "ok", (got, value)
            for y, w in zip(value if isinstance(value, list) else [value], want):
                assert_close(np.asarray(y), w, f"{victim_kind} victim on rank {rank}")
        if rank == (target + 1) % size:
            time.sleep(1.0)
        (kind, value), took = outcome(lambda: jc.allreduce(jnp.ones(4), "sum", name=f"{tag}.bystander"))
        assert took < BOUND_S, took
        assert kind == "error" and "cancelled" in value, (rank, kind, value)
    healthy(tag)
    jc.barrier()
    jc.shutdown()
    del os.environ["JAXCACHE_FAULT_INJECT"]


last = size - 1
name_part = {"data": ":{tag}.victim", "complete": ":{tag}.victim"}.get(point, "")
for target in (0, last):
    tag = f"{point}{target}"
    scenario(f"{point}@{target}" + name_part.format(tag=tag), tag)
if point == "data":
    # The same after the allreduce's other data paths, on the last rank.
    for kind in ("large", "fused"):
        tag = f"data{last}{kind}"
        suffix = "/0of1" if kind == "fused" else ""  # grouped_allreduce's request name
        scenario(f"data@{last}:{tag}.victim{suffix}", tag, kind)
jc.init()
done(f"faults {point}")
jc.shutdown()
