"""jvp, grad (checked numerically), vmap and scan of reducescatter, alltoall and allgather.

Forward mode is checked with jax.test_util.check_grads (every rank perturbs its own input
in lockstep, which is what the tangent collectives compute). Reverse mode follows the
psum convention: the gradient on rank r is d(sum over ranks q of f_q)/d x_r, checked by
central differences of that global sum, perturbing one rank's input at a time.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import jaxcache as jc  # noqa: E402
from _util import COMM, assert_close, done  # noqa: E402

jc.init()
rank, size = jc.rank(), jc.size()
rng = np.random.default_rng(7)  # the same on every rank: weights per rank are built alike
W = {r: rng.standard_normal((4 * size, 3)) for r in range(size)}


def global_fd_grad(f, x, h=1e-5):
    """d(sum_q f_q)/d x_rank by central differences (one rank perturbed at a time)."""
    f = jax.jit(f)
    x = np.asarray(x)
    grad = np.zeros_like(x)
    for q in range(size):
        for i in range(x.size):
            vals = []
            for sign in (1.0, -1.0):
                xp = x.copy()
                if q == rank:
                    xp.reshape(-1)[i] += sign * h
                vals.append(COMM.allreduce(float(f(jnp.asarray(xp)))))
            if q == rank:
                grad.reshape(-1)[i] = (vals[0] - vals[1]) / (2 * h)
    return grad


def check_reverse(f, x, what):
    got = np.asarray(jax.jit(jax.grad(f))(x))
    expect = global_fd_grad(f, x)
    np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-7, err_msg=what)


x = jnp.asarray(np.random.default_rng(rank).standard_normal((2 * size, 3)))
w = jnp.asarray(W[rank])

# --- reducescatter: psum_scatter convention, numerical checks ---------------------------------
g = jax.grad(lambda v: jc.reducescatter(v, "sum", name="t.rs.ones").sum())(x)
assert_close(np.asarray(g), np.ones(x.shape), "grad of sum(reducescatter) is ones")
f_rs = lambda v: jnp.sum(w[: 2] * jc.reducescatter(jnp.sin(v) * v, "sum", name="t.rs") ** 2)
check_reverse(f_rs, x, "reducescatter sum")
f_rs_avg = lambda v: jnp.sum(w[: 2] * jc.reducescatter(v ** 3, "average", name="t.rs.avg",
                                                       prescale=0.7, postscale=1.3))
check_reverse(f_rs_avg, x, "reducescatter average with scales")
check_grads(lambda v: jc.reducescatter(jnp.cos(v), "sum", name="t.rs.fwd"), (x,), order=1, modes=("fwd",))
check_grads(lambda v: jc.reducescatter(v * v, "average", name="t.rs.fwd2"), (x,), order=1, modes=("fwd",))

# --- allgather: its transpose is a reducescatter-sum ---------------------------------------------
f_ag = lambda v: jnp.sum(jnp.concatenate([w, w])[: 2 * size * size] * jc.allgather(jnp.tanh(v), name="t.ag") ** 2)
check_reverse(f_ag, x, "allgather")
f_ag0 = lambda v: jnp.sum(jnp.arange(1.0, size + 1) * jc.allgather(jnp.sum(v ** 2), name="t.ag.scalar"))
check_reverse(f_ag0, x, "allgather of a scalar")
check_grads(lambda v: jc.allgather(jnp.exp(v / 4), name="t.ag.fwd"), (x,), order=1, modes=("fwd",))

# --- alltoall: its own transpose -----------------------------------------------------------------
f_a2a = lambda v: jnp.sum(w[: 2 * size] * jc.alltoall(v ** 2 + v, name="t.a2a") ** 2)
check_reverse(f_a2a, x, "alltoall")
check_grads(lambda v: jc.alltoall(jnp.sin(v), name="t.a2a.fwd"), (x,), order=1, modes=("fwd",))
# The transpose sends every cotangent block back where it came from.
ct = jnp.arange(2 * size * 3, dtype=jnp.float64).reshape(2 * size, 3) + 100 * rank
_, vjp = jax.vjp(lambda v: jc.alltoall(v, name="t.a2a.vjp"), x)
(back,) = vjp(ct)
expect = np.concatenate([(np.arange(2 * size * 3).reshape(2 * size, 3) + 100 * q)[2 * rank:2 * rank + 2]
                         for q in range(size)])
assert_close(np.asarray(back), expect.astype(np.float64), "alltoall transpose")

# --- vmap: the batch axis anywhere -----------------------------------------------------------------
b = jnp.arange(3 * 2 * size * 2, dtype=jnp.float32).reshape(3, 2 * size, 2) * (rank + 1)
tri = size * (size + 1) / 2
full = np.arange(3 * 2 * size * 2, dtype=np.float32).reshape(3, 2 * size, 2)
out = jax.vmap(lambda v: jc.reducescatter(v, "sum", name="vm.rs"))(b)
assert_close(np.asarray(out), full[:, 2 * rank:2 * rank + 2] * tri, "vmap reducescatter")
out = jax.jit(jax.vmap(lambda v: jc.reducescatter(v, "sum", name="vm.rs1"), in_axes=2, out_axes=2))(
    jnp.moveaxis(b, 0, 2))
assert_close(np.asarray(out), np.moveaxis(full[:, 2 * rank:2 * rank + 2] * tri, 0, 2), "vmap reducescatter axis 2")
out = jax.vmap(lambda v: jc.alltoall(v, name="vm.a2a"))(b)
expect = np.concatenate([full[:, 2 * rank:2 * rank + 2] * (q + 1) for q in range(size)], axis=1)
assert_close(np.asarray(out), expect, "vmap alltoall")
out = jax.jit(jax.vmap(lambda v: jc.alltoall(v, name="vm.a2a1"), in_axes=1, out_axes=1))(jnp.moveaxis(b, 0, 1))
assert_close(np.asarray(out), np.moveaxis(expect, 0, 1), "vmap alltoall axis 1")
out = jax.vmap(jax.grad(lambda v: jc.reducescatter(v, "sum", name="vm.grad").sum()))(b)
assert_close(np.asarray(out), np.ones(b.shape, np.float32), "vmap of grad")

# --- scan: one named reducescatter per iteration ----------------------------------------------------
def body(c, v):
    return c + 1, jc.reducescatter(v + c, "sum", name="scan.rs")


_, out = jax.jit(lambda v: jax.lax.scan(body, 0.0, v))(jnp.ones((4, size)) * rank)
expect = np.stack([np.full(1, sum(range(size)) + size * i, np.float64) for i in range(4)])
assert_close(np.asarray(out), expect, "scan reducescatter")

# --- min/max are not differentiable ------------------------------------------------------------------
try:
    jax.grad(lambda v: jc.reducescatter(v, "max", name="t.rs.max").sum())(x)
except NotImplementedError as e:
    assert "max" in str(e) and "t.rs.max" in str(e), e
else:
    raise AssertionError("grad of reducescatter max did not raise")
done("vocabulary_transforms")
