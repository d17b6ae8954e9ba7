"""Mismatches and bad input: clear errors on every rank, runtime keeps working.

(A repeated name in flight queues: see exactly_once.py queue / bridge-duplicates.)
"""

import numpy as np
import jax
import jax.numpy as jnp

import jaxcache as jc
from _util import COMM, done

jc.init()
rank, size = jc.rank(), jc.size()


def expect_error(fn, exc, *fragments):
    try:
        out = fn()
        jax.block_until_ready(out)
    except exc as e:
        msg = str(e)
        for f in fragments:
            assert f in msg, f"{f!r} not in error message: {msg}"
        return msg
    raise AssertionError(f"expected {exc.__name__} containing {fragments}")


def healthy(tag):
    y = jc.allreduce(jnp.ones(3) * rank, "sum", name=f"healthy.{tag}")
    assert float(y[0]) == sum(range(size)), y


# --- Mismatches, eager: every rank gets MismatchError naming tensor, field, values, ranks.
last = size - 1
cases = {
    "dtype": lambda: jc.allreduce(jnp.ones(4, jnp.float32 if rank != last else jnp.int32), "sum", name="mm.dtype"),
    "shape": lambda: jc.allreduce(jnp.ones(4 if rank != last else 5), "sum", name="mm.shape"),
    "reduce op": lambda: jc.allreduce(jnp.ones(4), "sum" if rank != last else "max", name="mm.op"),
    "prescale": lambda: jc.allreduce(jnp.ones(4), "sum", prescale=1.0 if rank != last else 2.0, name="mm.scale"),
    "root": lambda: jc.broadcast(jnp.ones(4), root=0 if rank != last else 1, name="mm.root"),
    "kind": lambda: (jc.allreduce(jnp.ones(4), "sum", name="mm.kind") if rank != last
                     else jc.allgather(jnp.ones(4), name="mm.kind")),
    "number of tensors": lambda: jc.broadcast([jnp.ones(2)] * (2 if rank != last else 3), name="mm.group"),
}
for field, fn in cases.items():
    msg = expect_error(fn, jc.MismatchError, field, "mm.", f"rank {last}")
    if field == "shape":
        assert "(4,)" in msg and "(5,)" in msg, msg
    healthy(field)

# --- Mismatch under jit: the XLA error carries the same message.
f = jax.jit(lambda v: jc.allreduce(v, "sum", name="mm.jit"))
msg = expect_error(lambda: f(jnp.ones(3 if rank != last else 2)), Exception, "MismatchError",
                   "mm.jit", "shape", "(3,)", "(2,)")
healthy("jit")

# --- A cached name whose shape changes on one rank only: invalidation, then mismatch.
g = lambda n: jc.allreduce(jnp.ones(n), "sum", name="mm.cached")
for _ in range(3):
    g(4)
expect_error(lambda: g(4 if rank != 0 else 6), jc.MismatchError, "mm.cached", "(4,)", "(6,)")
assert float(g(4)[0]) == size  # consistent again: renegotiates and works
healthy("cached")

# --- Bad input, identical on every rank: clear exceptions, raised before any communication.
bad = [
    (lambda: jc.allreduce("text"), TypeError, "must be an array"),
    (lambda: jc.allreduce(np.array(["a", "b"])), TypeError, "dtype <U1"),
    (lambda: jc.allreduce(np.array([object()])), TypeError, "dtype object"),
    (lambda: jc.allreduce(jnp.ones(2), op="mean"), ValueError, "'mean'"),
    (lambda: jc.allreduce(jnp.ones(2, bool), op="average"), TypeError, "average"),
    (lambda: jc.allreduce(jnp.ones(2, bool), op="sum"), TypeError, "bool"),
    (lambda: jc.allreduce(jnp.ones(2, jnp.complex64), op="max"), TypeError, "complex"),
    (lambda: jc.allreduce(jnp.ones(2, bool), op="max", prescale=2.0), TypeError, "prescale"),
    (lambda: jc.allreduce(jnp.ones(2), prescale=float("nan")), ValueError, "prescale"),
    (lambda: jc.broadcast(jnp.ones(2), root=size), ValueError, f"root={size}"),
    (lambda: jc.broadcast(jnp.ones(2), root=-1), ValueError, "root=-1"),
    (lambda: jc.broadcast(jnp.ones(2), root=1.5), TypeError, "root"),
    (lambda: jc.grouped_allreduce({"a": jnp.ones(2), "b": "oops"}), TypeError, "['b']"),
    (lambda: jc.grouped_allreduce({"a": jnp.ones(2), "i": jnp.ones(2, bool)}), TypeError, "['i']"),
    (lambda: jc.grouped_allreduce({"a": jnp.ones(2)}, num_groups=2, group_bytes=8), ValueError, "at most one"),
    (lambda: jc.grouped_allreduce({"a": jnp.ones(2)}, groups=[["['zz']"]]), ValueError, "zz"),
    (lambda: jc.allreduce(jnp.ones(2), name=""), TypeError, "name"),
]
for fn, exc, fragment in bad:
    expect_error(fn, exc, fragment)
healthy("bad-input")

# --- Mismatched group members across ranks (structure differs): mismatch on every rank.
tree = {"a": jnp.ones(2), "b": jnp.ones(3 if rank != last else 4)}
expect_error(lambda: jc.grouped_allreduce(tree, name="mm.members"), jc.MismatchError, "mm.members", "shape of tensor")
healthy("members")
done("errors")
