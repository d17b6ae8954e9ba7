"""Every op x dtype x {eager, jit} against NumPy on every rank; bitwise identical across ranks."""

import jax

jax.config.update("jax_enable_x64", True)

import zlib

import numpy as np
import jax.numpy as jnp
import ml_dtypes

import jaxcache as jc
from _reference import COMPLEX, FLOATS, INTS, SHAPES, local_input, ops_for, reference, tolerance
from _util import COMM, assert_close, done, same_on_all_ranks

jc.init()
rank, size = jc.rank(), jc.size()
assert (rank, size) == (COMM.rank, COMM.size)

jit_cache = {}


def jitted(op, name):
    key = (op, name)
    if key not in jit_cache:
        jit_cache[key] = jax.jit(lambda x: jc.allreduce(x, op, name=name))
    return jit_cache[key]


checked = 0
for dtype in [np.bool_] + INTS + FLOATS + COMPLEX:
    for op in ops_for(dtype):
        for si, shape in enumerate(SHAPES):
            for mode in ("eager", "jit"):
                salt = zlib.crc32(f"{np.dtype(dtype)}{op}{si}{mode}".encode())
                inputs = [local_input(dtype, shape, op, r, salt) for r in range(size)]
                x = jnp.asarray(inputs[rank])
                name = f"ar.{np.dtype(dtype)}.{op}.{si}.{mode}"
                y = jc.allreduce(x, op, name=name) if mode == "eager" else jitted(op, name)(x)
                what = f"allreduce {np.dtype(dtype)} {op} {shape} {mode}"
                rtol, atol = tolerance(dtype)
                assert_close(np.asarray(y), reference(inputs, op, dtype), what, rtol=rtol, atol=atol)
                same_on_all_ranks(y, what)
                checked += 1

# Pre/post scaling, eager and jit.
for dtype in [np.float32, np.float64, np.complex64]:
    x_all = [local_input(dtype, (5,), "sum", r, 7) for r in range(size)]
    expected = (reference([x * 2 for x in x_all], "sum", dtype) * 0.25).astype(dtype)
    for mode in ("eager", "jit"):
        f = lambda v: jc.allreduce(v, "sum", name=f"scaled.{np.dtype(dtype)}.{mode}", prescale=2.0, postscale=0.25)
        y = f(jnp.asarray(x_all[rank])) if mode == "eager" else jax.jit(f)(jnp.asarray(x_all[rank]))
        assert_close(np.asarray(y), expected, f"scaled {dtype} {mode}", rtol=1e-5, atol=1e-6)
        same_on_all_ranks(y)

# Large allreduces (pairwise exchanges on up to 4 ranks): element counts that do not split
# evenly, blocks of several 4 MiB pieces at 2 ranks; every op; scaling; an argument (read
# where it is: XLA copies nothing), a donated argument and a computed value (both reduced
# in their own buffer); eager and jit.
for dtype, count in ((np.float32, (9 << 20) // 4 + 3), (np.int32, (1 << 20) // 4 + 5),
                     (np.float16, (1 << 20) // 2 + 1), (np.complex64, (1 << 20) // 8 + 2)):
    for op in ops_for(dtype):
        salt = zlib.crc32(f"large{np.dtype(dtype)}{op}".encode())
        inputs = [local_input(dtype, (count,), op, r, salt) for r in range(size)]
        expected = reference(inputs, op, dtype)
        rtol, atol = tolerance(dtype)
        for how, f, kw in (("argument", lambda v: jc.allreduce(v, op, name=f"large.{op}.arg"), {}),
                           ("donated", lambda v: jc.allreduce(v, op, name=f"large.{op}.don"), {"donate_argnums": 0}),
                           ("computed", lambda v: jc.allreduce(v + v, op, name=f"large.{op}.comp"), {}),
                           ("eager", None, None)):
            if how == "eager":
                y = jc.allreduce(jnp.asarray(inputs[rank]), op, name=f"large.{np.dtype(dtype)}.{op}.eager")
                want = expected
            else:
                y = jax.jit(f, **kw)(jnp.asarray(inputs[rank]))
                want = reference([x + x for x in inputs], op, dtype) if how == "computed" else expected
            what = f"large allreduce {np.dtype(dtype)} {op} x {count} ({how})"
            assert_close(np.asarray(y), want, what, rtol=rtol, atol=atol)
            same_on_all_ranks(y, what)
for what, scales in (("prescale", {"prescale": 0.5}), ("postscale", {"postscale": 0.25}),
                     ("both", {"prescale": 2.0, "postscale": 0.125})):
    x_all = [local_input(np.float32, ((5 << 20) // 4 + 1,), "sum", r, 31) for r in range(size)]
    want = (reference([x * scales.get("prescale", 1.0) for x in x_all], "sum", np.float32)
            * scales.get("postscale", 1.0)).astype(np.float32)
    for mode in ("eager", "jit"):
        f = lambda v: jc.allreduce(v, "sum", name=f"large.scaled.{what}.{mode}", **scales)
        y = f(jnp.asarray(x_all[rank])) if mode == "eager" else jax.jit(f)(jnp.asarray(x_all[rank]))
        assert_close(np.asarray(y), want, f"large allreduce {what} {mode}", rtol=1e-5, atol=1e-5)
        same_on_all_ranks(y, f"large allreduce {what} {mode}")
arg = jnp.asarray(local_input(np.float32, (1 << 18,), "sum", rank, 41))
for op in ("sum", "average"):
    hlo = jax.jit(lambda v: jc.allreduce(v, op, name=f"large.hlo.{op}")).lower(arg).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):]
    assert entry[:entry.index("\n}")].count(" copy(") == 0, f"XLA copies a {op} allreduce's argument"
# Donated small tensors are reduced in their own buffers too: with separate results XLA
# would copy each result into its donated buffer after the call.
small = [jnp.asarray(local_input(np.float32, (1000,), "sum", rank, 43 + i)) for i in range(3)]
want_small = [reference([local_input(np.float32, (1000,), "sum", r, 43 + i) for r in range(size)], "sum", np.float32)
              for i in range(3)]
reduce_donated = jax.jit(lambda t: jc.grouped_allreduce(t, "sum", name="small.donated"), donate_argnums=0)
hlo = reduce_donated.lower(small).compile().as_text()
entry = hlo[hlo.index("\nENTRY"):]
assert entry[:entry.index("\n}")].count(" copy(") == 0, "XLA copies the results of a donated small allreduce"
for y, want in zip(reduce_donated(small), want_small):
    assert_close(np.asarray(y), want, "donated small allreduce", rtol=1e-5, atol=1e-5)
    same_on_all_ranks(y, "donated small allreduce")

# Broadcast: every dtype, every root, pytrees, eager and jit.
for dtype in [np.bool_, np.int8, np.uint64, np.float16, ml_dtypes.bfloat16, np.float32, np.complex128]:
    for root in range(size):
        tree = {"a": jnp.asarray(local_input(dtype, (3, 2), "sum", rank, 11)),
                "b": [jnp.asarray(local_input(dtype, (), "sum", rank, 12)), None]}
        expect = {"a": local_input(dtype, (3, 2), "sum", root, 11), "b": [local_input(dtype, (), "sum", root, 12), None]}
        for mode in ("eager", "jit"):
            name = f"bc.{np.dtype(dtype)}.{root}.{mode}"
            f = lambda t: jc.broadcast(t, root=root, name=name)
            out = f(tree) if mode == "eager" else jax.jit(f)(tree)
            assert out["b"][1] is None
            assert_close(np.asarray(out["a"]), expect["a"], f"broadcast a {dtype} root {root} {mode}")
            assert_close(np.asarray(out["b"][0]), expect["b"][0], f"broadcast b {dtype} root {root} {mode}")
            same_on_all_ranks(out["a"])

# Broadcast's buffers: XLA copies nothing. An argument that was not donated is broadcast
# out of place (root copies it into its result; the others receive into theirs), a donated
# argument or a computed value in place.
big = np.arange(1 << 18, dtype=np.float32) * (rank + 1)
for how, f, kw, factor in (
        ("argument", lambda v: jc.broadcast(v, root=size - 1, name="bc.buf.arg"), {}, 1),
        ("donated", lambda v: jc.broadcast(v, root=size - 1, name="bc.buf.don"), {"donate_argnums": 0}, 1),
        ("computed", lambda v: jc.broadcast(v * 2, root=size - 1, name="bc.buf.comp"), {}, 2)):
    hlo = jax.jit(f, **kw).lower(jnp.asarray(big)).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):]  # copies fused into a computation are free
    assert entry[:entry.index("\n}")].count(" copy(") == 0, how
    for _ in range(2):
        y = np.asarray(jax.jit(f, **kw)(jnp.asarray(big)))
        assert y.tobytes() == (factor * big / (rank + 1) * size).astype(np.float32).tobytes(), how

# Allgather: every dtype; scalars, zero-size, pytrees.
for dtype in [np.bool_, np.int16, np.uint32, np.float16, ml_dtypes.bfloat16, np.float64, np.complex64]:
    for shape in [(), (0, 3), (2,), (2, 3)]:
        parts = [local_input(dtype, shape, "sum", r, 21) for r in range(size)]
        expected = np.stack(parts) if shape == () else np.concatenate(parts, axis=0)
        for mode in ("eager", "jit"):
            name = f"ag.{np.dtype(dtype)}.{shape}.{mode}"
            f = lambda t: jc.allgather(t, name=name)
            out = f({"x": jnp.asarray(parts[rank])}) if mode == "eager" else jax.jit(f)({"x": jnp.asarray(parts[rank])})
            assert_close(np.asarray(out["x"]), expected, f"allgather {dtype} {shape} {mode}")
            same_on_all_ranks(out["x"])

# Python and NumPy scalars are accepted.
assert float(jc.allreduce(1.5, "sum", name="py.scalar")) == 1.5 * size
assert int(jc.allreduce(np.int32(rank), "max", name="np.scalar")) == size - 1

if rank == 0:
    print(f"checked {checked} allreduce cases")
done("core_ops")
