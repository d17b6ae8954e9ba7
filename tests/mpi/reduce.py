"""reduce (to one root) against NumPy on every rank: every dtype and op, every root, eager and
jit; non-root ranks get their own input back bitwise; scales; vmap, jvp and grad; a process
set; a pytree program with reduces XLA may start in any order; mismatches and a bad root
(an error on every rank, the runtime usable afterwards)."""

import jax

jax.config.update("jax_enable_x64", True)

import zlib  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxcache as jc  # noqa: E402
from _reference import COMPLEX, FLOATS, INTS, local_input, ops_for, reference, tolerance  # noqa: E402
from _util import COMM, assert_close, done, raises  # noqa: E402

jc.init()
rank, size = jc.rank(), jc.size()
ALL_DTYPES = [np.bool_] + INTS + FLOATS + COMPLEX


def salt(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def check(got, inputs, op, dtype, root, what, scale=(1.0, 1.0)):
    got = np.asarray(got)
    if rank == root:
        pre, post = scale
        scaled = [x * pre for x in inputs] if pre != 1.0 else inputs
        expected = reference(scaled, op, dtype)
        if post != 1.0:
            expected = (expected * post).astype(dtype)
        rtol, atol = tolerance(dtype)
        assert_close(got, expected, what, rtol=rtol, atol=atol)
    else:  # the operand, untouched
        assert got.dtype == inputs[rank].dtype and got.tobytes() == inputs[rank].tobytes(), what


# Every dtype and op, each root, eager and jit.
checked = 0
jitted = {}
for dtype in ALL_DTYPES:
    for op in ops_for(dtype):
        for root in sorted({0, size - 1}):
            shape = (5, 3) if op != "prod" else (4,)
            inputs = [local_input(dtype, shape, op, r, salt(str(np.dtype(dtype)), op, root)) for r in range(size)]
            x = jnp.asarray(inputs[rank])
            for mode in ("eager", "jit"):
                name = f"red.{np.dtype(dtype)}.{op}.{root}.{mode}"
                if mode == "eager":
                    y = jc.reduce(x, op, root, name=name)
                else:
                    key = (op, root)
                    if key not in jitted:
                        jitted[key] = jax.jit(lambda v, op=op, root=root: jc.reduce(v, op, root, name=f"red.jit.{op}.{root}"))
                    y = jitted[key](x)
                check(y, inputs, op, dtype, root, f"reduce {np.dtype(dtype)} {op} root={root} {mode}")
                checked += 1
assert checked > 100, checked

# Scales, scalars and empty arrays.
inputs = [local_input(np.float64, (4, 2), "sum", r, 9) for r in range(size)]
for mode in ("eager", "jit"):
    f = lambda v: jc.reduce(v, "sum", size - 1, name=f"red.scaled.{mode}", prescale=3.0, postscale=0.5)
    y = f(jnp.asarray(inputs[rank])) if mode == "eager" else jax.jit(f)(jnp.asarray(inputs[rank]))
    check(y, inputs, "sum", np.float64, size - 1, f"scaled {mode}", scale=(3.0, 0.5))
avg = jc.reduce(jnp.asarray(inputs[rank]), "average", 0, name="red.average")
check(avg, inputs, "average", np.float64, 0, "average")
s = jc.reduce(jnp.float32(rank + 1), "sum", 0, name="red.scalar")
assert float(s) == (sum(range(1, size + 1)) if rank == 0 else rank + 1), s
e = jc.reduce(jnp.zeros((0, 3)), "sum", 0, name="red.empty")
assert e.shape == (0, 3)

# vmap: a batch axis is more elements.
batch = np.arange(4 * 3, dtype=np.float32).reshape(4, 3) * (rank + 1)
vm = jax.vmap(lambda v: jc.reduce(v, "sum", 0, name="red.vmap"))(jnp.asarray(batch))
tri = size * (size + 1) // 2
assert_close(np.asarray(vm), batch / (rank + 1) * tri if rank == 0 else batch, "vmap")

# jvp: the same reduce of the tangents.
primal, tangent = jax.jvp(lambda v: jc.reduce(v, "sum", 0, name="red.jvp"), (jnp.ones(3) * rank,),
                          (jnp.ones(3) * (rank + 1),))
assert_close(np.asarray(tangent), np.full(3, tri if rank == 0 else rank + 1, np.float64), "jvp")

# grad of sum(reduce(x) * w) with w = rank + 1: root's output depends on every x with weight
# w_root = root + 1 (times the scales); a non-root rank's output is its x with its own weight.
for root in sorted({0, size - 1}):
    def loss(v, root=root):
        return jnp.sum(jc.reduce(v, "sum", root, name=f"red.grad.{root}", prescale=2.0) * (rank + 1))
    g = jax.jit(jax.grad(loss))(jnp.ones(3))
    expected = 2.0 * (root + 1) + (0.0 if rank == root else rank + 1)
    assert_close(np.asarray(g), np.full(3, expected), f"grad root={root}")
# Eagerly, from a Python scalar (autodiff runs the rules on the cotangent 1.0 itself).
g = jax.grad(lambda v: jc.reduce(v, "sum", 0, name="red.scalar.grad") + jc.scan(v, "sum", name="scan.scalar.grad"))(0.0)
assert float(g) == 1 + (rank != 0) + (size - rank), g
raises(NotImplementedError, "only 'sum' and 'average'",
       lambda: jax.grad(lambda v: jnp.sum(jc.reduce(v, "max", 0, name="red.nograd")))(jnp.ones(2)))

# Several reduces in one program (XLA may start them in any order on each rank).
@jax.jit
def many(v):
    return [jc.reduce(v * (k + 1), "sum", k % size, name=f"red.many.{k}") for k in range(8)]


base = jnp.full((40,), float(rank + 1), jnp.float32)
for _ in range(3):
    outs = many(base)
    for k, out in enumerate(outs):
        want = (k + 1) * tri if rank == k % size else (k + 1) * (rank + 1)
        assert np.all(np.asarray(out) == want), (k, out)

# Buffers: XLA copies nothing. An argument that was not donated is reduced out of place
# (aliasing it would make XLA copy it first); a donated argument or a computed value is
# reduced in place. Either way root gets the sum and the others their operand, bitwise.
def copies(f, *args, **jit_kw) -> int:
    """Copy instructions of the compiled program (those fused into a computation are free)."""
    hlo = jax.jit(f, **jit_kw).lower(*args).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):]
    return entry[:entry.index("\n}")].count(" copy(")


big = np.arange(1 << 18, dtype=np.float32) * (rank + 1)
for how, f, kw, factor in (
        ("argument", lambda v: jc.reduce(v, "sum", size - 1, name="red.buf.arg"), {}, 1),
        ("donated", lambda v: jc.reduce(v, "sum", size - 1, name="red.buf.don"), {"donate_argnums": 0}, 1),
        ("computed", lambda v: jc.reduce(v * 2, "sum", size - 1, name="red.buf.comp"), {}, 2)):
    assert copies(f, jnp.asarray(big), **kw) == 0, how
    for _ in range(2):
        y = np.asarray(jax.jit(f, **kw)(jnp.asarray(big)))
        want = factor * (big / (rank + 1) * tri if rank == size - 1 else big)
        assert y.tobytes() == want.astype(np.float32).tobytes(), how

# Large tensors, several 1 MiB pieces (root reduces each rank's piece as it arrives at 2 and
# 3 ranks, xla_ext/collectives/reduce.cc): every op with scales, an argument and a donated
# operand, float16 (reduced by the runtime's own kernels). Values and scales exact in any order
# (average divides each operand by the ranks first: 3.0 / 2 and 3.0 / 3 are exact).
n_big = 3 * (1 << 18) + 7
base = (np.arange(n_big) % 13).astype(np.float32)
for op, pre, post, dtype in (("sum", 1.0, 1.0, np.float32), ("average", 3.0, 0.5, np.float32),
                             ("max", 1.0, 1.0, np.float32), ("sum", 1.0, 1.0, np.float16)):
    inputs = [(base + r).astype(dtype) for r in range(size)]
    for donate in (False, True):
        root = size - 1 if donate else 0
        name = f"red.large.{op}.{np.dtype(dtype)}.{donate}"
        f = jax.jit(lambda v, op=op, root=root, name=name, pre=pre, post=post:
                    jc.reduce(v, op, root, name=name, prescale=pre, postscale=post),
                    donate_argnums=(0,) if donate else ())
        for _ in range(2):
            y = np.asarray(f(jnp.asarray(inputs[rank])))
            if rank == root:
                total = reference([x.astype(np.float64) * pre for x in inputs], op, np.float64) * post
                assert y.tobytes() == total.astype(dtype).tobytes(), (op, dtype, donate)
            else:
                assert y.tobytes() == inputs[rank].tobytes(), (op, dtype, donate)

# A process set of the last two ranks; root is a global rank.
members = [size - 2, size - 1] if size > 2 else [1]
ps = jc.ProcessSet(members)
jc.add_process_set(ps)
if rank in members:
    y = jc.reduce(jnp.full(3, rank + 1.0), "sum", members[-1], name="red.set", process_set=ps)
    want = sum(r + 1.0 for r in members) if rank == members[-1] else rank + 1.0
    assert np.all(np.asarray(y) == want), y
    if size > 2:
        raises(ValueError, "not a member", lambda: jc.reduce(jnp.ones(2), "sum", 0, name="red.set.bad",
                                                              process_set=ps))
jc.remove_process_set(ps)

# Errors on every rank: a bad root locally (ValueError), roots or shapes that differ across
# ranks (MismatchError on every rank); then the runtime still works.
raises(ValueError, "root", lambda: jc.reduce(jnp.ones(2), "sum", size, name="red.badroot"))
raises(jc.MismatchError, "root differs across ranks",
       lambda: jc.reduce(jnp.ones(2), "sum", rank % 2, name="red.roots").block_until_ready())
raises(jc.MismatchError, "shape differs across ranks",
       lambda: jc.reduce(jnp.ones(2 + rank), "sum", 0, name="red.shapes").block_until_ready())
raises(jc.MismatchError, "reduce op differs across ranks",
       lambda: jc.reduce(jnp.ones(2), ("sum", "max")[rank % 2], 0, name="red.ops").block_until_ready())
y = jc.reduce(jnp.ones(2), "sum", 0, name="red.after")
assert np.all(np.asarray(y) == (size if rank == 0 else 1)), y
COMM.Barrier()
done("reduce")
