"""grad (psum convention), vmap, scan and nested transformations of the collectives."""

import numpy as np
import jax
import jax.numpy as jnp

import jaxcache as jc
from _util import assert_close, done, same_on_all_ranks

jc.init()
rank, size = jc.rank(), jc.size()
x = jnp.arange(5, dtype=jnp.float32) + rank

# grad: the transpose of allreduce-sum is allreduce-sum (like lax.psum).
g = jax.grad(lambda v: jc.allreduce(v, "sum", name="g.sum").sum())(x)
assert_close(g, np.full(5, size, np.float32), "grad sum")
g = jax.jit(jax.grad(lambda v: jc.allreduce(v, "average", name="g.avg").sum()))(x)
assert_close(g, np.ones(5, np.float32), "grad average (jit)")
g = jax.grad(lambda v: (jc.allreduce(v * v, "sum", name="g.sq", prescale=2.0) ** 2).sum())(x)
# d/dx_r sum((2*sum_q x_q^2)^2) through the psum convention: every rank's
# cotangent 2*y is summed, then times d(2 x^2)/dx = 4x.
ys = 2 * sum((np.arange(5) + q) ** 2 for q in range(size)).astype(np.float32)
assert_close(g, (size * 2 * ys * 4 * np.asarray(x)).astype(np.float32), "grad chain", rtol=1e-5)

# Data-parallel gradient: each rank's loss on its shard, averaged gradients.
w = jnp.array([0.5, -1.0], jnp.float32)
data = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], jnp.float32)[: size]
loss = lambda w, d: jnp.sum((d @ w) ** 2)
local = jax.grad(loss)(w, data[rank % len(data)][None])
avg = jax.jit(lambda t: jc.grouped_allreduce(t, name="dp"))({"w": local})["w"]
expect = np.mean([np.asarray(jax.grad(loss)(w, data[q % len(data)][None])) for q in range(size)], axis=0)
assert_close(avg, expect.astype(np.float32), "data-parallel grad", rtol=1e-6)

# jvp (forward mode) of a linear collective.
y, t = jax.jvp(lambda v: jc.allreduce(v, "sum", name="jvp"), (x,), (jnp.ones_like(x),))
assert_close(t, np.full(5, size, np.float32), "jvp tangent")

# grad through broadcast and allgather.
g = jax.grad(lambda v: jc.broadcast(v, root=0, name="g.bc").sum())(x)
assert_close(g, np.full(5, size if rank == 0 else 0, np.float32), "grad broadcast")
g = jax.grad(lambda v: (jc.allgather(v, name="g.ag") * jnp.arange(5 * size)).sum())(x)
assert_close(g, (size * (np.arange(5) + 5 * rank)).astype(np.float32), "grad allgather")

# vmap of allreduce, broadcast and allgather (batch axis anywhere).
b = jnp.arange(12, dtype=jnp.float32).reshape(3, 4) * (rank + 1)
out = jax.vmap(lambda v: jc.allreduce(v, "sum", name="vm.ar"))(b)
assert_close(out, np.arange(12, dtype=np.float32).reshape(3, 4) * size * (size + 1) / 2, "vmap allreduce")
out = jax.vmap(lambda v: jc.allreduce(v, "sum", name="vm.ar1"), in_axes=1, out_axes=1)(b)
assert_close(out, np.arange(12, dtype=np.float32).reshape(3, 4) * size * (size + 1) / 2, "vmap axis 1")
out = jax.jit(jax.vmap(lambda v: jc.allgather(v, name="vm.ag")))(b)
expect = np.stack([np.concatenate([np.arange(4 * i, 4 * i + 4) * (q + 1) for q in range(size)]) for i in range(3)])
assert_close(out, expect.astype(np.float32), "vmap allgather")
out = jax.vmap(lambda v: jc.allgather(v, name="vm.ag0"))(jnp.arange(3.0) + rank)
assert_close(out, np.stack([np.arange(3.0) + q for q in range(size)], axis=1).astype(np.float32), "vmap allgather scalar")
out = jax.vmap(lambda v: jc.broadcast(v, root=size - 1, name="vm.bc"))(b)
assert_close(out, np.arange(12, dtype=np.float32).reshape(3, 4) * size, "vmap broadcast")
out = jax.vmap(jax.grad(lambda v: jc.allreduce(v, "sum", name="vm.grad").sum()))(b)
assert_close(out, np.full((3, 4), size, np.float32), "vmap of grad")

# lax.scan: the same named collective once per iteration (sequential, so no duplicates).
def body(c, v):
    r = jc.allreduce(v + c, "sum", name="scan.ar")
    return c + 1, r
_, out = jax.jit(lambda v: jax.lax.scan(body, 0.0, v))(jnp.ones((4, 3)) * rank)
expect = np.stack([np.full(3, sum(range(size)) + size * i) for i in range(4)]).astype(np.float32)
assert_close(out, expect, "scan")
same_on_all_ranks(out)

# Mid-size tensors (48 KiB to a few MiB: reduced on their own, pairwise on up to 4
# ranks, in pieces) inside the transformations users wrap around a training step.
def mid(shape, seed):
    """Values that differ per rank and position; sums of them are exact in float32."""
    return (np.arange(np.prod(shape)).reshape(shape) % 97 + seed * 1000 + rank).astype(np.float32)

def mid_sum(shape, seed):
    return sum((np.arange(np.prod(shape)).reshape(shape) % 97 + seed * 1000 + q) for q in range(size)).astype(np.float32)

rows = mid((4, 16384), 1)  # vmap: four 64 KiB rows, one 256 KiB batched allreduce
out = jax.jit(jax.vmap(lambda v: jc.allreduce(v, "sum", name="mid.vmap")))(rows)
assert_close(out, mid_sum((4, 16384), 1), "vmap of a 64 KiB allreduce")
same_on_all_ranks(out, "vmap of a 64 KiB allreduce")

def mid_body(c, v):  # scan: a 400 KB carry averaged each iteration
    return jc.allreduce(c + v, "average", name="mid.scan"), c.sum()
xs = jnp.stack([jnp.asarray(mid((100000,), 2)) * (i + 1) for i in range(3)])
carry, sums = jax.jit(lambda c0, v: jax.lax.scan(mid_body, c0, v))(jnp.zeros(100000, jnp.float32), xs)
expect = np.zeros(100000, np.float64)
for i in range(3):
    expect = expect + mid_sum((100000,), 2).astype(np.float64) * (i + 1) / size
assert_close(carry, expect.astype(np.float32), "scan of a 400 KB average", rtol=1e-5)
same_on_all_ranks(carry, "scan of a 400 KB average")

def mid_loss(w):  # checkpoint: the allreduce is recomputed on the backward pass
    return (jax.checkpoint(lambda v: jc.allreduce(v * v, "sum", name="mid.ckpt"))(w) * w).sum()
w = jnp.asarray(mid((32768,), 3)) / 1000  # 128 KiB
g = jax.jit(jax.grad(mid_loss))(w)
# d/dw_r sum_i S_i * w_i with S = sum_q w_q^2: S_i + (psum of the cotangent w) * 2 w_i.
wq = [(np.arange(32768) % 97 + 3000 + q).astype(np.float32) / 1000 for q in range(size)]
s_all = sum(v.astype(np.float64) ** 2 for v in wq)
w_all = sum(v.astype(np.float64) for v in wq)
expect = s_all + w_all * 2 * np.asarray(w, np.float64)
assert_close(g, expect.astype(np.float32), "grad through checkpoint of a 128 KiB allreduce", rtol=1e-5)
same_on_all_ranks(jax.jit(jax.checkpoint(lambda v: jc.allreduce(v * v, "sum", name="mid.ckpt2")))(w))

pick = jax.jit(lambda p, v: jax.lax.cond(p, lambda u: jc.allreduce(u, "sum", name="mid.cond.a"),
                                         lambda u: jc.allreduce(u * 2, "sum", name="mid.cond.b"), v))
big = jnp.asarray(mid((600000,), 4))  # 2.4 MB: several pieces
for p, factor in ((True, 1), (False, 2)):
    out = pick(p, big)
    assert_close(out, mid_sum((600000,), 4) * factor, f"cond branch {p} of a 2.4 MB allreduce")
    same_on_all_ranks(out, "cond of a 2.4 MB allreduce")

# Unsupported differentiation is a clear error.
try:
    jax.grad(lambda v: jc.allreduce(v, "max", name="g.max").sum())(x)
except NotImplementedError as e:
    assert "max" in str(e) and "g.max" in str(e), e
else:
    raise AssertionError("grad of max did not raise")
done("transforms")
