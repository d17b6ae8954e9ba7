"""Tensors above the MPI count limit, or above JAXCACHE_CHUNK_BYTES, are moved in several
MPI calls. JAXCACHE_MAX_MPI_COUNT (2**31-1 by default) or JAXCACHE_CHUNK_BYTES (4 MiB by
default) is lowered by the test so that this runs on small tensors."""

import os

import numpy as np
import jax
import jax.numpy as jnp

import jaxcache as jc
from _util import assert_close, done, same_on_all_ranks

jc.init()
rank, size = jc.rank(), jc.size()
from jaxcache._ext import ext

if "JAXCACHE_MAX_MPI_COUNT" in os.environ:
    limit = int(os.environ["JAXCACHE_MAX_MPI_COUNT"])
    assert ext.max_mpi_count() == limit
else:  # float32 elements per chunk
    limit = int(os.environ["JAXCACHE_CHUNK_BYTES"]) // 4
    assert jc.runtime.settings().chunk_bytes == 4 * limit

n = 5 * limit + 3  # several chunks and a ragged tail
x = jnp.arange(n, dtype=jnp.float32) * (rank + 1)
tri = size * (size + 1) / 2
for mode in ("eager", "jit"):
    f = lambda v: jc.allreduce(v, "sum", name=f"big.{mode}")
    y = f(x) if mode == "eager" else jax.jit(f)(x)
    assert_close(y, (np.arange(n, dtype=np.float32) * tri).astype(np.float32), f"allreduce {mode}")
    same_on_all_ranks(y)
    # Scales are applied chunk by chunk: every chunk once, the ragged tail too.
    h = lambda v: jc.allreduce(v, "average", prescale=2.0, postscale=3.0, name=f"bigavg.{mode}")
    z = h(x) if mode == "eager" else jax.jit(h)(x)
    assert_close(z, np.arange(n, dtype=np.float32) * tri * 6 / size, f"average {mode}", rtol=1e-5)
    same_on_all_ranks(z)
    # Several members, small ones fused together and a large one reduced directly.
    tree = {"a": x, "b": jnp.ones(limit // 3) * rank, "c": jnp.ones(limit // 2, jnp.float64 if False else jnp.float32)}
    g = lambda t: jc.grouped_allreduce(t, "sum", name=f"bigg.{mode}")
    out = g(tree) if mode == "eager" else jax.jit(g)(tree)
    assert_close(out["a"], (np.arange(n, dtype=np.float32) * tri).astype(np.float32), "group a")
    assert_close(out["b"], np.full(limit // 3, sum(range(size)), np.float32), "group b")
    assert_close(out["c"], np.full(limit // 2, size, np.float32), "group c")
    b = jc.broadcast(jnp.arange(n, dtype=jnp.int8) + rank, root=size - 1, name=f"bigb.{mode}")
    assert_close(b, (np.arange(n) + size - 1).astype(np.int8), "broadcast")
    m = 2 * limit + 1  # bytes per rank above the limit
    ag = jc.allgather(jnp.full((m,), rank, jnp.uint8), name=f"bigag.{mode}")
    assert_close(ag, np.repeat(np.arange(size, dtype=np.uint8), m), "allgather")
done("large_counts")
