"""join(): ranks that run out of data keep serving the others until every rank has joined.

    join.py train N0,N1[,N2]   a jitted data-parallel training loop; rank r has N_r batches
    join.py semantics          what each collective does while ranks are joined

Checked on every rank against NumPy / single-process references: the average divides by
the size (Horovod's rule) or, with JAXCACHE_JOIN_AVERAGE_BY_SIZE=0, by the ranks that have
not joined; joined ranks contribute zeros (the identity of min, max,
prod) and no allgather rows, join() returns the rank that joined last, and the names used
while ranks were joined line up again afterwards.
"""

import jax

jax.config.update("jax_enable_x64", True)

import sys  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxcache as jc  # noqa: E402
from jaxcache import session  # noqa: E402
from _util import COMM, assert_close, done, same_on_all_ranks  # noqa: E402

jc.init()
rank, size = jc.rank(), jc.size()
scenario = sys.argv[1]
BY_SIZE = session.settings().join_average_by_size


def divisor(active) -> int:
    """What an average divides by while only `active` ranks have data."""
    return size if BY_SIZE else len(active)


def expect_error(fn, exc, *fragments):
    try:
        jax.block_until_ready(fn())
    except exc as e:
        for f in fragments:
            assert f in str(e), f"{f!r} not in error message: {e}"
        return
    raise AssertionError(f"expected {exc.__name__} containing {fragments}")


if scenario == "train":
    steps = [int(s) for s in sys.argv[2].split(",")]
    assert len(steps) == size, (steps, size)
    D, B = 5, 8
    w_true = np.arange(1.0, D + 1)

    def batch(r, t, epoch=0):
        rng = np.random.default_rng([r, t, epoch])
        x = rng.standard_normal((B, D))
        return x, x @ w_true + 0.1 * rng.standard_normal(B)

    def loss(p, x, y):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    @jax.jit
    def step(p, x, y):
        value, grads = jax.value_and_grad(loss)(p, x, y)
        grads = jc.grouped_allreduce(grads, "average", name="grads", num_groups=2)
        mean_loss = jc.reducescatter(jnp.full((size,), value), "average", name="mean_loss")
        total = jc.allreduce(value, "sum", name="loss_sum")
        return jax.tree.map(lambda a, g: a - 0.05 * g, p, grads), mean_loss, total

    params = {"w": jnp.zeros(D), "b": jnp.zeros(())}
    # Single-process reference on every rank: at step t the ranks with data contribute.
    ref = {"w": np.zeros(D), "b": np.zeros(())}
    grad_fn = jax.jit(jax.value_and_grad(loss))
    ref_after = {}
    for t in range(max(steps)):
        active = [r for r in range(size) if steps[r] > t]
        vals, grads = zip(*[grad_fn(ref, *batch(r, t)) for r in active])
        if rank in active:
            params, mean_loss, total = step(params, *batch(rank, t))
            assert_close(np.asarray(mean_loss), np.full(1, np.sum(vals) / divisor(active)),
                         f"mean loss step {t}", rtol=1e-12)
            assert_close(np.asarray(total), np.asarray(sum(vals)), f"loss sum step {t}", rtol=1e-12)
            # Eager allgather: the joined ranks contribute no rows.
            seen = jc.allgather(jnp.array([rank, t]), name="seen")
            assert_close(np.asarray(seen), np.array([[r, t] for r in active]).reshape(-1), f"seen step {t}")
        ref = jax.tree.map(lambda a, *g: a - 0.05 * np.sum(g, axis=0) / divisor(active), ref, *grads)
        ref_after[t + 1] = ref
        if t + 1 == steps[rank]:
            jax.block_until_ready(params)
            last = jc.join()
            expected_last = int(np.argmax(steps))
            assert last == expected_last, (last, expected_last, steps)
            break
    # This rank's parameters are single-process training on the data the ranks saw.
    for k in ("w", "b"):
        assert_close(np.asarray(params[k]), np.asarray(ref_after[steps[rank]][k]), f"params {k}",
                     rtol=1e-12, atol=1e-14)
    # A second epoch on every rank: names served by stand-ins line up again.
    params = jc.broadcast(params, root=int(np.argmax(steps)), name="sync")
    for t in range(2):
        params, mean_loss, total = step(params, *batch(rank, t, epoch=1))
        jc.allgather(jnp.array([rank, t]), name="seen")
    same_on_all_ranks(np.asarray(params["w"]), "params after the second epoch")
    last = jc.join()
    assert 0 <= last < size and len(set(COMM.allgather(last))) == 1

elif scenario == "semantics":
    last = size - 1
    if rank == last:
        assert jc.join() == 0
    else:
        x = jnp.arange(4.0) + rank
        active = list(range(size - 1))
        # average divides by the size (or the ranks that have not joined); sums see zeros
        # from joined ranks.
        avg = jc.allreduce(x, "average", name="j.avg")
        assert_close(np.asarray(avg), np.sum([np.arange(4.0) + r for r in active], axis=0) / divisor(active),
                     "average")
        avg_jit = jax.jit(lambda v: jc.allreduce(v, "average", name="j.avg.jit"))(x)
        assert_close(np.asarray(avg_jit), np.asarray(avg), "average under jit")
        grouped = jc.grouped_allreduce({"a": x, "b": x * 2}, "average", name="j.grouped")
        assert_close(np.asarray(grouped["b"]), 2 * np.asarray(avg), "grouped average")
        for dtype in (np.int32, np.float32, np.uint8):
            v = jnp.asarray((np.arange(3) + 2 + rank).astype(dtype))
            vals = [(np.arange(3) + 2 + r).astype(dtype) for r in active]
            assert_close(np.asarray(jc.allreduce(v, "sum", name=f"j.sum.{dtype.__name__}")), np.sum(vals, axis=0, dtype=dtype), "sum")
            assert_close(np.asarray(jc.allreduce(v, "min", name=f"j.min.{dtype.__name__}")), np.min(vals, axis=0), "min identity")
            assert_close(np.asarray(jc.allreduce(v, "max", name=f"j.max.{dtype.__name__}")), np.max(vals, axis=0), "max identity")
            assert_close(np.asarray(jc.allreduce(v, "prod", name=f"j.prod.{dtype.__name__}")), np.prod(vals, axis=0, dtype=dtype), "prod identity")
        flags = jnp.asarray(np.array([True, rank == 0, False]))
        assert np.array_equal(np.asarray(jc.allreduce(flags, "min", name="j.and")), [True, len(active) == 1, False])
        assert np.array_equal(np.asarray(jc.allreduce(flags, "max", name="j.or")), [True, True, False])
        # reducescatter: zeros from the joined rank, averaged as allreduce; slices as usual.
        full = [np.arange(2.0 * size) * (r + 1) for r in active]
        rs = jc.reducescatter(jnp.asarray(full[rank]), "average", name="j.rs")
        assert_close(np.asarray(rs), (np.sum(full, axis=0) / divisor(active))[2 * rank:2 * rank + 2],
                     "reducescatter average")
        rs = jax.jit(lambda v: jc.reducescatter(v, "sum", name="j.rs.jit"))(jnp.asarray(full[rank]))
        assert_close(np.asarray(rs), np.sum(full, axis=0)[2 * rank:2 * rank + 2], "reducescatter sum jit")
        # allgather (eager): no rows from the joined rank.
        ag = jc.allgather(jnp.full((rank + 1, 2), rank), name="j.ag")
        assert_close(np.asarray(ag), np.concatenate([np.full((r + 1, 2), r) for r in active]), "allgather")
        # broadcast from a rank that has not joined works; from the joined root it fails.
        bc = jc.broadcast(x, root=0, name="j.bc")
        assert_close(np.asarray(bc), np.arange(4.0), "broadcast")
        expect_error(lambda: jc.broadcast(x, root=last, name="j.bc.joined"), jc.CollectiveError,
                     "j.bc.joined", f"root, rank {last}, has joined")
        expect_error(lambda: jc.alltoall(jnp.ones(size), name="j.a2a"), jc.CollectiveError,
                     "j.a2a", "joined")
        expect_error(lambda: jax.jit(lambda v: jc.allgather(v, name="j.ag.jit"))(x), Exception,
                     "j.ag.jit", "joined", "gather eagerly")
        jc.barrier()
        if size > 2 and rank == 1:
            assert jc.join() == 0
        elif size > 2:
            # Two ranks joined: rank 0 alone.
            avg = jc.allreduce(x, "average", name="j.avg")
            assert_close(np.asarray(avg), np.asarray(x) / divisor([0]), "average with two ranks joined")
            assert jc.allgather(jnp.ones(1), name="j.ag").shape == (1,)
            assert jc.join() == 0
        else:
            assert jc.join() == 0
    # Every rank again: the names used while some had joined line up on every rank.
    x = jnp.arange(4.0) + rank
    assert_close(np.asarray(jc.allreduce(x, "average", name="j.avg")), np.arange(4.0) + (size - 1) / 2, "after")
    ag = jc.allgather(jnp.full((rank + 1, 2), rank), name="j.ag")
    assert ag.shape == (size * (size + 1) // 2, 2)
    bc = jc.broadcast(x, root=last, name="j.bc.joined")
    assert_close(np.asarray(bc), np.arange(4.0) + last, "broadcast after")

else:
    raise SystemExit(f"unknown scenario {scenario}")

done(f"join {scenario} {' '.join(sys.argv[2:])}")
