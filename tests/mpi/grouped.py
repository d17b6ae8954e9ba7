"""grouped_allreduce: pytrees of every kind, every grouping mode, mixed dtypes, None leaves,
eager and jit; atomic groups; grad/vmap/scan. argv[1] = "main" or "fusion"."""

import collections
import dataclasses
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp
import ml_dtypes

import jaxcache as jc
from jaxcache._ext import ext
from jaxcache.protocol import Kind
from _util import COMM, assert_close, done, same_on_all_ranks

mode = sys.argv[1] if len(sys.argv) > 1 else "main"
jc.init()
rank, size = jc.rank(), jc.size()

Point = collections.namedtuple("Point", ["x", "y"])


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    w: jax.Array
    b: jax.Array
    extra: object = None


def make_tree(r):
    rng = np.random.default_rng([7, r])
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
    return {
        "dense": Layer(w=jnp.asarray(f32(16, 8)), b=jnp.asarray(f32(8)), extra=None),
        "stack": [jnp.asarray(f32(3, 3)), (jnp.asarray(f32(5).astype(np.float16)), None)],
        "pt": Point(x=jnp.asarray(f32(4).astype(ml_dtypes.bfloat16)), y=jnp.asarray(f32())),
        "big": jnp.asarray(f32(300, 1000)),  # > 1 MiB: reduced in place
        "empty": jnp.zeros((0, 4), jnp.float32),
    }


def reference(op):
    trees = [make_tree(r) for r in range(size)]
    def red(*leaves):
        stack = np.stack([np.asarray(l, np.float64) for l in leaves])
        out = {"sum": stack.sum(0), "average": stack.mean(0), "max": stack.max(0)}[op]
        return out.astype(np.asarray(leaves[0]).dtype)
    return jax.tree_util.tree_map(red, *trees)


def check(out, op, what):
    ref = reference(op)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(ref), what
    assert out["dense"].extra is None and out["stack"][1][1] is None, what
    for (path, got), exp in zip(jax.tree_util.tree_leaves_with_path(out), jax.tree_util.tree_leaves(ref)):
        tol = 2e-2 if np.asarray(exp).dtype in (np.float16, ml_dtypes.bfloat16) else 1e-5
        assert_close(np.asarray(got), np.asarray(exp), f"{what} {jax.tree_util.keystr(path)}", rtol=tol, atol=tol)
        same_on_all_ranks(got, f"{what} {jax.tree_util.keystr(path)}")


if mode == "main":
    tree = make_tree(rank)
    groupings = {
        "default": {},
        "num_groups": {"num_groups": 3},
        "group_bytes": {"group_bytes": 100},
        "explicit": {"groups": [["['dense'].w", "['dense'].b"], ["['pt'].x", "['pt'].y", "['big']"]]},
        "callable": {"groups": lambda path: "pt" if "pt" in jax.tree_util.keystr(path) else None},
    }
    for gname, kwargs in groupings.items():
        for op in ("sum", "average", "max"):
            for how in ("eager", "jit"):
                f = lambda t: jc.grouped_allreduce(t, op, name=f"grp.{gname}.{op}.{how}", **kwargs)
                out = f(tree) if how == "eager" else jax.jit(f)(tree)
                check(out, op, f"{gname} {op} {how}")

    # Mixed integer and float leaves, op="sum" (each dtype fused separately).
    mixed = {"i": jnp.arange(6, dtype=jnp.int32) * (rank + 1), "f": jnp.ones(3) * rank, "u": jnp.full(2, rank, jnp.uint8)}
    out = jax.jit(lambda t: jc.grouped_allreduce(t, "sum", name="mixed", num_groups=1))(mixed)
    assert_close(out["i"], (np.arange(6) * size * (size + 1) // 2).astype(np.int32), "mixed int")
    assert_close(out["u"], np.full(2, sum(range(size)), np.uint8), "mixed uint8")

    # A group is atomic: one member is produced late on rank 0 (a long loop whose length
    # is an argument, so the program is identical on every rank); nobody is reduced early.
    @jax.jit
    def late_step(t, iters):
        slow = jax.lax.fori_loop(0, iters, lambda i, v: jnp.sin(v) * 0.5 + v * 0.5, t["slow"])
        return jc.grouped_allreduce({"fast": t["fast"], "slow": slow * 0 + t["slow"]}, "sum",
                                    name="atomic", num_groups=1)
    t = {"fast": jnp.ones(4) * (rank + 1), "slow": jnp.ones(256) * (rank + 1)}
    jax.block_until_ready(late_step(t, 0))
    COMM.Barrier()
    t0 = time.perf_counter()
    out = late_step(t, 3_000_000 if rank == 0 else 0)
    assert_close(out["fast"], np.full(4, size * (size + 1) / 2, np.float32), "atomic fast")
    assert_close(out["slow"], np.full(256, size * (size + 1) / 2, np.float32), "atomic slow")
    waited = COMM.allgather(time.perf_counter() - t0)
    assert min(waited) > 0.2, f"the fast member was reduced before the slow one existed: {waited}"

    # grad, vmap and scan through grouped_allreduce.
    g = jax.grad(lambda t: sum(jnp.sum(v) for v in jax.tree_util.tree_leaves(
        jc.grouped_allreduce(t, "sum", name="grad.grp", num_groups=2))))({"a": jnp.ones(3), "b": jnp.ones((2, 2))})
    assert_close(g["a"], np.full(3, size, np.float32), "grad a")
    assert_close(g["b"], np.full((2, 2), size, np.float32), "grad b")
    v = jax.vmap(lambda t: jc.grouped_allreduce(t, "sum", name="vmap.grp"))({"a": jnp.ones((4, 3)) * rank})
    assert_close(v["a"], np.full((4, 3), sum(range(size)), np.float32), "vmap grouped")
    def body(c, x):
        return c + 1, jc.grouped_allreduce({"x": x}, "average", name="scan.grp")["x"]
    _, s = jax.jit(lambda xs: jax.lax.scan(body, 0, xs))(jnp.ones((3, 2)) * rank)
    assert_close(s, np.full((3, 2), (size - 1) / 2, np.float32), "scan grouped")
    done("grouped")
elif mode == "donated":
    # Donated gradients (jax.jit(..., donate_argnums=0)): leaves of at least 64 KiB are
    # aliased with their results and reduced in their own buffers -- from 512 KiB directly
    # (in 4 KiB chunks here: JAXCACHE_CHUNK_BYTES), smaller ones through the fusion buffer.
    # Ten steps feed each step's output back in; every size class against NumPy.
    sizes = {"small": 1000, "aliased_fused": 40_000, "aliased_direct": 200_000, "large": 600_000}
    step = jax.jit(lambda t: jc.grouped_allreduce(t, "average", prescale=2.0, postscale=0.5,
                                                  name="donated"), donate_argnums=0)
    tree = {k: jnp.arange(n, dtype=jnp.float32) * (rank + 1) for k, n in sizes.items()}
    before = jc.stats()
    for i in range(10):
        tree = step(tree)
    mean = (size + 1) / 2  # every step keeps the average of the ranks' values
    for k, n in sizes.items():
        assert_close(tree[k], np.arange(n, dtype=np.float32) * mean, f"donated {k}", rtol=1e-5)
        same_on_all_ranks(tree[k], f"donated {k}")
    after = jc.stats()
    assert after["bytes_reduced"] - before["bytes_reduced"] == 10 * 4 * sum(sizes.values())
    done("donated")
else:
    # Groups ready in the same cycle share fusion buffers (JAXCACHE_CYCLE_TIME batches
    # the burst). With JAXCACHE_DISABLE_GROUP_FUSION=1 they never do. (The groups are
    # larger than a cycle-message slot, 16 KiB, so their data takes the data phase.) Each burst
    # comes after an idle spell longer than the cycle time: its first request still
    # waits for the rest.
    disabled = mode == "fusion-disabled"
    groups = [[np.full(4000, rank + g, np.float32), np.full(1000, rank * g, np.float32)] for g in range(3)]
    for round_ in range(3):
        time.sleep(0.3)
        before = jc.stats()
        outs, handles = [], []
        for g, members in enumerate(groups):
            res = [np.empty_like(m) for m in members]
            handles.append(ext.submit(Kind.ALLREDUCE, f"fuse.g{g}", members, res, 0))
            outs.append(res)
        for h in handles:
            status, msg = h.wait()
            assert status == 0, msg
        after = jc.stats()
        for g, res in enumerate(outs):
            assert_close(res[0], np.full(4000, sum(range(size)) + size * g, np.float32), f"g{g} a")
            assert_close(res[1], np.full(1000, sum(range(size)) * g, np.float32), f"g{g} b")
        fused = after["fused_responses"] - before["fused_responses"]
        calls = after["mpi_calls"] - before["mpi_calls"]
        if disabled:
            assert fused == 0 and calls == 3, (round_, fused, calls)
        else:
            assert fused == 3 and calls == 1, (round_, fused, calls)
    # On up to 4 ranks a tensor of 48 KiB or more (JAXCACHE_DIRECT_THRESHOLD's default) is
    # reduced on its own, pairwise from its operand: one MPI call of its own. One element
    # less and it shares the fusion buffer with the small ones.
    assert size <= 4
    for big, direct in ((12288, True), (12287, False)):
        time.sleep(0.3)
        members = [[np.full(big, rank + g, np.float32), np.full(1000, rank * g, np.float32)] for g in range(3)]
        before = jc.stats()
        outs = [[np.empty_like(m) for m in ms] for ms in members]
        handles = [ext.submit(Kind.ALLREDUCE, f"direct.{big}.g{g}", ms, res, 0)
                   for g, (ms, res) in enumerate(zip(members, outs))]
        for h in handles:
            status, msg = h.wait()
            assert status == 0, msg
        after = jc.stats()
        for g, res in enumerate(outs):
            assert_close(res[0], np.full(big, sum(range(size)) + size * g, np.float32), f"{big} g{g} a")
            assert_close(res[1], np.full(1000, sum(range(size)) * g, np.float32), f"{big} g{g} b")
            same_on_all_ranks(res[0], f"{big} g{g} a")
        calls = after["mpi_calls"] - before["mpi_calls"]
        # Fused: one call for the cycle's small tensors, or one per group without group fusion.
        want = (3 if direct else 0) + (3 if disabled else 1)
        assert calls == want, (big, calls, want)
    done(mode)
