"""Stall inspector. argv[1] = "warn" (JAXCACHE_STALL_CHECK_TIME=1) or "shutdown"
(also JAXCACHE_STALL_SHUTDOWN_TIME=2)."""

import sys
import time

import jax
import jax.numpy as jnp

import jaxcache as jc
from _util import COMM, done

mode = sys.argv[1]
jc.init()
rank, size = jc.rank(), jc.size()
last = size - 1
cached = jax.jit(lambda v: jc.allreduce(v, "sum", name="stall.cached"))
assert float(cached(jnp.ones(()))) == size  # now in the response cache

if mode == "warn":
    # The last rank is late by 2.5 s: rank 0 warns, then everything completes.
    if rank == last:
        time.sleep(2.5)
    y = jc.allreduce(jnp.ones(2), "sum", name="stall.slow")
    assert float(y[0]) == size
    COMM.Barrier()
    if rank == last:
        time.sleep(2.5)
    assert float(cached(jnp.ones(()))) == size
    done("stall-warn")
else:
    # The last rank never submits: every pending op fails with StallError, no hang.
    for label, call in (("uncached", lambda: jc.allreduce(jnp.ones(2), "sum", name="stall.never")),
                        ("cached", lambda: cached(jnp.ones(())))):
        if rank != last:
            t0 = time.perf_counter()
            try:
                jax.block_until_ready(call())
            except Exception as e:  # noqa: BLE001 - eager: StallError; jit: XLA's error
                assert "StallError" in type(e).__name__ + str(e), e
                assert f"missing on rank {last}" in str(e), e
                waited = time.perf_counter() - t0
                assert 1.5 < waited < 20, f"{label}: failed after {waited:.1f}s"
            else:
                raise AssertionError(f"{label}: a stalled collective completed")
        COMM.Barrier()
    # The runtime keeps working afterwards.
    assert float(jc.allreduce(jnp.ones(()), "sum", name="after.stall")) == size
    done("stall-shutdown")
