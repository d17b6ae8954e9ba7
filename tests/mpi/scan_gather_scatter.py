"""scan (inclusive prefix reduction), gather and scatter (to and from a root) against NumPy on
every rank: dtypes and ops, every root, eager and jit, vmap, jvp and grad, a process set,
several in one program, and errors on every rank (the runtime usable afterwards)."""

import jax

jax.config.update("jax_enable_x64", True)

import os  # noqa: E402
import zlib  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxcache as jc  # noqa: E402
from _reference import COMPLEX, FLOATS, INTS, local_input, ops_for, reference, tolerance  # noqa: E402
from _util import COMM, assert_close, done, raises  # noqa: E402

jc.init()
rank, size = jc.rank(), jc.size()
ALL_DTYPES = [np.bool_] + INTS + FLOATS + COMPLEX
ROOTS = sorted({0, size - 1})


def salt(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def bitwise(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype)
    assert got.tobytes() == want.tobytes(), what


# --- scan: every dtype and op but average, eager and jit ---
checked = 0
for dtype in ALL_DTYPES:
    for op in ops_for(dtype):
        if op == "average":
            continue
        inputs = [local_input(dtype, (3, 2), op, r, salt("scan", str(np.dtype(dtype)), op)) for r in range(size)]
        expected = reference(inputs[:rank + 1], op, dtype)
        rtol, atol = tolerance(dtype)
        for mode in ("eager", "jit"):
            name = f"scan.{np.dtype(dtype)}.{op}.{mode}"
            f = lambda v, op=op, name=name: jc.scan(v, op, name=name)
            y = f(jnp.asarray(inputs[rank])) if mode == "eager" else jax.jit(f)(jnp.asarray(inputs[rank]))
            assert_close(np.asarray(y), expected, f"scan {np.dtype(dtype)} {op} {mode}", rtol=rtol, atol=atol)
            checked += 1
assert checked > 40, checked
x = jnp.full((4,), float(rank + 1))
y = jc.scan(x, "sum", name="scan.scaled", prescale=2.0, postscale=0.25)
assert_close(np.asarray(y), np.full(4, 0.5 * sum(range(1, rank + 2))), "scan scaled")
vm = jax.vmap(lambda v: jc.scan(v, "max", name="scan.vmap"))(jnp.arange(6.0).reshape(3, 2) * (rank + 1))
assert_close(np.asarray(vm), np.arange(6.0).reshape(3, 2) * (rank + 1), "scan vmap (max of increasing)")
_, t = jax.jvp(lambda v: jc.scan(v, "sum", name="scan.jvp"), (x,), (jnp.ones(4),))
assert_close(np.asarray(t), np.full(4, rank + 1.0), "scan jvp")
# grad of sum_r w_r * scan(x)_r with w_r = r + 1: x_q's gradient is 3 * sum_{r >= q} (r + 1).
g = jax.jit(jax.grad(lambda v: jnp.sum(jc.scan(v, "sum", name="scan.grad", prescale=3.0) * (rank + 1))))(x)
assert_close(np.asarray(g), np.full(4, 3.0 * sum(r + 1 for r in range(rank, size))), "scan grad")
raises(ValueError, "op must be one of sum, min, max, prod", lambda: jc.scan(x, "average"))

# --- gather and scatter: dtypes, roots, eager and jit; bitwise ---
for dtype in ALL_DTYPES:
    for root in ROOTS:
        inputs = [local_input(dtype, (2, 3), "sum", r, salt("g", str(np.dtype(dtype)), root)) for r in range(size)]
        for mode in ("eager", "jit"):
            name = f"gather.{np.dtype(dtype)}.{root}.{mode}"
            f = lambda v, root=root, name=name: jc.gather(v, root, name=name)
            y = f(jnp.asarray(inputs[rank])) if mode == "eager" else jax.jit(f)(jnp.asarray(inputs[rank]))
            bitwise(y, np.stack(inputs) if rank == root else inputs[rank], f"gather {dtype} {root} {mode}")
            # scatter root's stack back: every rank gets its own block.
            name = f"scatter.{np.dtype(dtype)}.{root}.{mode}"
            src = np.stack(inputs) if rank == root else np.zeros_like(inputs[rank])
            f = lambda v, root=root, name=name: jc.scatter(v, root, name=name)
            z = f(jnp.asarray(src)) if mode == "eager" else jax.jit(f)(jnp.asarray(src))
            bitwise(z, inputs[rank], f"scatter {dtype} {root} {mode}")
s = jc.gather(jnp.float32(rank), 0, name="gather.scalar")
bitwise(s, np.arange(size, dtype=np.float32) if rank == 0 else np.float32(rank), "gather scalar")
e = jc.scatter(jnp.zeros((size, 0)) if rank == 0 else jnp.zeros((0,)), 0, name="scatter.empty")
assert e.shape == (0,)

# Blocks of 256 KiB and more (root sends each rank its scatter block itself,
# xla_ext/collectives/scatter.cc): an argument and a donated operand, each root.
# (Not under a tiny JAXCACHE_MAX_MPI_COUNT: the blocks above take that path already, and
# 256 KiB in 5-byte pieces takes minutes.)
n_blk = (1 << 16) + 3
for root in ROOTS if "JAXCACHE_MAX_MPI_COUNT" not in os.environ else ():
    blocks = [np.arange(n_blk, dtype=np.float32) * (r + 1) + root for r in range(size)]
    for donate in (False, True):
        kw = {"donate_argnums": (0,)} if donate else {}
        g = jax.jit(lambda v, root=root, d=donate: jc.gather(v, root, name=f"gather.large.{root}.{d}"), **kw)
        bitwise(g(jnp.asarray(blocks[rank])), np.stack(blocks) if rank == root else blocks[rank],
                f"gather large {root} {donate}")
        sc = jax.jit(lambda v, root=root, d=donate: jc.scatter(v, root, name=f"scatter.large.{root}.{d}"), **kw)
        src = np.stack(blocks) if rank == root else np.zeros(n_blk, np.float32)
        bitwise(sc(jnp.asarray(src)), blocks[rank], f"scatter large {root} {donate}")

# vmap over a batch axis.
root = size - 1
xb = jnp.arange(4 * 3, dtype=jnp.float32).reshape(4, 3) + 100 * rank
gb = jax.vmap(lambda v: jc.gather(v, root, name="gather.vmap"))(xb)
want = np.stack([np.arange(12, dtype=np.float32).reshape(4, 3) + 100 * r for r in range(size)], 1)
bitwise(gb, want if rank == root else np.asarray(xb), "gather vmap")
sb_in = jnp.asarray(want) if rank == root else jnp.zeros((4, 3), jnp.float32)  # (B, size, 3) at root
sb = jax.vmap(lambda v: jc.scatter(v, root, name="scatter.vmap"))(sb_in)
bitwise(sb, np.asarray(xb), "scatter vmap")

# jvp, and grads through gather and scatter (each the other's transpose).
_, t = jax.jvp(lambda v: jc.gather(v, 0, name="gather.jvp"), (jnp.ones(2),), (jnp.full(2, rank + 1.0),))
bitwise(t, np.stack([np.full(2, r + 1.0) for r in range(size)]) if rank == 0 else np.full(2, rank + 1.0), "gather jvp")
weights = jnp.arange(1.0, size + 1.0)[:, None] * jnp.ones((size, 2))  # root weighs block q by q + 1


def gather_loss(v):
    out = jc.gather(v, 0, name="gather.grad")
    return jnp.sum(out * weights) if rank == 0 else jnp.sum(out) * 10.0


g = jax.jit(jax.grad(gather_loss))(jnp.ones(2))
assert_close(np.asarray(g), np.full(2, (rank + 1.0) + (0.0 if rank == 0 else 10.0)), "gather grad")


def scatter_loss(v):
    return jnp.sum(jc.scatter(v, 0, name="scatter.grad")) * (rank + 1)


g = jax.jit(jax.grad(scatter_loss))(jnp.ones((size, 2)) if rank == 0 else jnp.ones(2))
assert_close(np.asarray(g), weights if rank == 0 else np.zeros(2), "scatter grad")

# Several in one program, roots spread over the ranks (XLA may start them in any order).
@jax.jit
def many(v):
    gs = [jc.gather(v + k, k % size, name=f"many.g{k}") for k in range(4)]
    ss = [jc.scan(v * k, "sum", name=f"many.s{k}") for k in range(4)]
    return gs, ss


for _ in range(3):
    gs, ss = many(jnp.full(3, float(rank)))
    for k in range(4):
        want = np.stack([np.full(3, r + k, np.float64) for r in range(size)]) if rank == k % size else np.full(3, rank + k, np.float64)
        bitwise(gs[k], want, f"many gather {k}")
        assert_close(np.asarray(ss[k]), np.full(3, k * sum(range(rank + 1)), np.float64), f"many scan {k}")

# A process set of two ranks; roots are global ranks.
members = [size - 2, size - 1] if size > 2 else [1]
ps = jc.ProcessSet(members)
jc.add_process_set(ps)
if rank in members:
    got = jc.gather(jnp.full(2, rank * 1.0), members[-1], name="set.gather", process_set=ps)
    want = np.stack([np.full(2, r * 1.0) for r in members]) if rank == members[-1] else np.full(2, rank * 1.0)
    bitwise(got, want, "gather in a set")
    sc = jc.scan(jnp.full(2, rank + 1.0), "sum", name="set.scan", process_set=ps)
    assert_close(np.asarray(sc), np.full(2, sum(r + 1.0 for r in members[:members.index(rank) + 1])), "scan in a set")
jc.remove_process_set(ps)

# Errors on every rank, then the runtime still works.
raises(jc.MismatchError, "root differs across ranks",
       lambda: jc.gather(jnp.ones(2), rank % 2, name="err.roots").block_until_ready())
raises(jc.MismatchError, "shape differs across ranks",
       lambda: jc.gather(jnp.ones(2 + rank), 0, name="err.gshape").block_until_ready())
bad_root_operand = jnp.ones((size + 1, 2)) if rank == 0 else jnp.ones(2)
raises(jc.CollectiveError, "first dimension must be the number of ranks",
       lambda: jc.scatter(bad_root_operand, 0, name="err.sroot").block_until_ready())
raises(jc.MismatchError, "block shape of tensor 0",
       lambda: jc.scatter(jnp.ones((size, 2)) if rank == 0 else jnp.ones(3), 0, name="err.sblock").block_until_ready())
raises(jc.MismatchError, "reduce op differs",
       lambda: jc.scan(jnp.ones(2), ("sum", "max")[rank % 2], name="err.scanop").block_until_ready())
y = jc.scan(jnp.ones(2), "sum", name="after")
assert_close(np.asarray(y), np.full(2, rank + 1.0), "after errors")
COMM.Barrier()
done("scan_gather_scatter")
