"""Data-parallel training equals single-process training on the full global batch.

Each rank trains on its shard of every global batch, with gradients averaged by
jaxcache inside the jitted step; then, in the same process and without
jaxcache, it trains the same model on the full global batches. The parameters
must match to float tolerance, and be bitwise identical across ranks.

Variants: optax chain (allreduce_gradients + SGD with momentum) in float32 with
the default grouping; grouped_allreduce called directly with num_groups=3 and
Adam in float64; both with a leaf above the 1 MiB direct-reduction threshold
next to small fused leaves.
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxcache  # noqa: E402
from jaxcache.optax import allreduce_gradients  # noqa: E402
from _util import COMM, assert_close, done, same_on_all_ranks  # noqa: E402

GLOBAL_BATCH = 24
STEPS = 8
N_IN, HIDDEN, N_OUT = 16, 640, 4  # the hidden layer's weights are > 1 MiB in float64


def init_params(key, dtype):
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "encoder": {"w": jax.random.normal(k1, (N_IN, HIDDEN), dtype) * 0.3,
                    "b": jnp.zeros((HIDDEN,), dtype)},
        "hidden": [jax.random.normal(k2, (HIDDEN, HIDDEN), dtype) / np.sqrt(HIDDEN),
                   jnp.full((HIDDEN,), 0.01, dtype)],
        "head": (jax.random.normal(k3, (HIDDEN, N_OUT), dtype) * 0.1, jnp.zeros((N_OUT,), dtype)),
        "scale": jnp.asarray(1.0, dtype),
    }


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["encoder"]["w"] + params["encoder"]["b"])
    w, b = params["hidden"]
    h = jnp.tanh(h @ w + b)
    wo, bo = params["head"]
    out = params["scale"] * (h @ wo + bo)
    return jnp.mean((out - y) ** 2)


def data(dtype):
    rng = np.random.default_rng(1234)  # same on every rank
    x = rng.normal(size=(STEPS, GLOBAL_BATCH, N_IN)).astype(dtype)
    y = rng.normal(size=(STEPS, GLOBAL_BATCH, N_OUT)).astype(dtype)
    return x, y


def train(tx, params, xs, ys, reduce_grads=None):
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x, y):
        grads = jax.grad(loss_fn)(params, x, y)
        if reduce_grads is not None:
            grads = reduce_grads(grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for x, y in zip(xs, ys):
        params, opt_state = step(params, opt_state, x, y)
    return params


def check_variant(label, dtype, make_tx, reduce_grads, rtol, atol):
    rank, size = jaxcache.rank(), jaxcache.size()
    per_rank = GLOBAL_BATCH // size
    xs, ys = data(dtype)
    # Different init per rank; broadcast makes rank 0's the starting point.
    params0 = init_params(jax.random.PRNGKey(rank), dtype)
    params0 = jaxcache.broadcast(params0, name=f"{label}/init")
    for leaf in jax.tree_util.tree_leaves(params0):
        same_on_all_ranks(leaf, f"{label}: broadcast initial params")

    shard = slice(rank * per_rank, (rank + 1) * per_rank)
    tx_dp, dp_reduce = make_tx(distributed=True), reduce_grads
    dp = train(tx_dp, params0, xs[:, shard], ys[:, shard], dp_reduce)
    ref = train(make_tx(distributed=False), params0, xs, ys)

    flat_dp, tree_dp = jax.tree_util.tree_flatten_with_path(dp)
    flat_ref = jax.tree_util.tree_leaves(ref)
    assert tree_dp == jax.tree_util.tree_structure(ref)
    for (path, a), b in zip(flat_dp, flat_ref):
        what = f"{label}: param {jax.tree_util.keystr(path)}"
        same_on_all_ranks(a, what)
        assert_close(a, b, what, rtol=rtol, atol=atol)
    # Training must have moved the parameters, or the check proves nothing.
    moved = max(float(jnp.max(jnp.abs(a - b)))
                for a, b in zip(jax.tree_util.tree_leaves(dp), jax.tree_util.tree_leaves(params0)))
    assert moved > 1e-3, f"{label}: parameters barely moved ({moved})"
    if rank == 0:
        worst = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(dp), flat_ref))
        print(f"{label}: max |dp - single| = {worst:.3g} after {STEPS} steps", flush=True)


def main():
    jaxcache.init()
    assert GLOBAL_BATCH % jaxcache.size() == 0, "run on a number of ranks that divides 24"

    def sgd(distributed):
        base = optax.sgd(0.05, momentum=0.9)
        return optax.chain(allreduce_gradients(), base) if distributed else base

    check_variant("optax_sgd_f32", np.float32, sgd, None, rtol=2e-5, atol=2e-6)

    def adam(distributed):
        return optax.adam(1e-2)

    def reduce_direct(grads):
        return jaxcache.grouped_allreduce(grads, op="average", num_groups=3, name="grads")

    check_variant("direct_adam_f64", np.float64, adam, reduce_direct, rtol=1e-9, atol=1e-11)

    s = jaxcache.stats()
    assert s["cache_hits"] > 0, f"steady-state steps should hit the response cache: {s}"
    # shutdown() stops the runtime on every rank: no rank may still need it.
    COMM.Barrier()
    jaxcache.shutdown()
    done("train_equivalence")


if __name__ == "__main__":
    main()
