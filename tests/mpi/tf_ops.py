"""jaxcache.tensorflow collectives against NumPy (eager and tf.function); bad input on every rank."""

from __future__ import annotations

import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _util import COMM, done, same_on_all_ranks  # noqa: E402

import jaxcache  # noqa: E402
import jaxcache.tensorflow as jctf  # noqa: E402
from jaxcache._ext import ext  # noqa: E402

jctf.init()
RANK, SIZE = jctf.rank(), jctf.size()
BF16 = tf.bfloat16.as_numpy_dtype


def inputs(seed: int, shape, dtype) -> list[np.ndarray]:
    out = []
    for r in range(SIZE):
        rng = np.random.default_rng(1000 * seed + r)
        if dtype == np.bool_:
            out.append(rng.random(shape) > 0.5)
        elif np.dtype(dtype).kind == "f" or dtype == BF16:
            out.append((rng.standard_normal(shape) * 4).astype(dtype))
        elif np.dtype(dtype).kind == "c":
            out.append((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype))
        else:
            lo = 0 if np.dtype(dtype).kind == "u" else -5
            out.append(rng.integers(lo, 6, shape).astype(dtype))
    return out


def reference(xs, op: str) -> np.ndarray:
    wide = np.complex128 if xs[0].dtype.kind == "c" else (
        np.float64 if (xs[0].dtype.kind == "f" or xs[0].dtype == BF16) else xs[0].dtype)
    stack = np.stack([x.astype(wide) for x in xs])
    return {"sum": lambda: stack.sum(0), "average": lambda: stack.sum(0) / SIZE, "min": lambda: stack.min(0),
            "max": lambda: stack.max(0), "prod": lambda: stack.prod(0)}[op]()


def check(actual, expected, dtype, what: str) -> None:
    a = actual.numpy()
    assert a.dtype == np.dtype(dtype), f"{what}: dtype {a.dtype} != {np.dtype(dtype)}"
    same_on_all_ranks(a.view(np.uint16) if a.dtype == BF16 else a, what)
    tol = {np.dtype(np.float16): 2e-3, np.dtype(BF16): 1e-2, np.dtype(np.float32): 1e-6,
           np.dtype(np.complex64): 1e-6}.get(np.dtype(dtype), 1e-12)
    if a.dtype.kind in "fc" or a.dtype == BF16:
        wide = np.complex128 if a.dtype.kind == "c" else np.float64
        np.testing.assert_allclose(a.astype(wide), expected, rtol=tol, atol=8 * tol, err_msg=what)
    else:
        np.testing.assert_array_equal(a, expected.astype(a.dtype), err_msg=what)


@tf.function
def in_graph(a, b):
    # Two independent collectives and a gather: run through tf.py_function, in program order.
    s = jctf.allreduce(a, op="sum")
    m = jctf.allreduce(b, op="max")
    g = jctf.allgather(a)
    return s, m, g


seed = 0
for dtype in (np.float32, np.float64, np.float16, BF16, np.int32, np.int64, np.uint8, np.complex64, np.bool_):
    for op in ("sum", "average", "min", "max", "prod"):
        kind = np.dtype(dtype).kind
        if op == "average" and not (kind in "fc" or dtype == BF16):
            continue
        if dtype == np.bool_ and op not in ("min", "max"):
            continue
        if kind == "c" and op in ("min", "max"):
            continue
        seed += 1
        xs = inputs(seed, (3, 4), dtype)
        expected = reference(xs, op)
        if dtype == np.bool_:
            expected = expected.astype(bool)
        check(jctf.allreduce(tf.constant(xs[RANK]), op=op, name=f"tf.{np.dtype(dtype).name}.{op}"),
              expected, dtype, f"allreduce {op} {np.dtype(dtype).name}")

# Variables and NumPy arrays are accepted; prescale/postscale.
xs = inputs(90, (5,), np.float64)
v = tf.Variable(xs[RANK])
check(jctf.allreduce(v, op="sum", prescale=2.0, postscale=0.25), reference(xs, "sum") * 0.5, np.float64, "scaled")
check(jctf.allreduce(xs[RANK], op="max"), reference(xs, "max"), np.float64, "numpy input")
check(jctf.allreduce(tf.constant(float(RANK + 1)), op="sum"), np.array(float(sum(range(1, SIZE + 1)))),
      np.float32, "0-d")

# IndexedSlices are allgathered and stay IndexedSlices (as in Horovod); densified they equal the sum.
slices = tf.IndexedSlices(values=tf.ones([2, 3]) * (RANK + 1), indices=tf.constant([0, 2]),
                          dense_shape=tf.constant([4, 3]))
dense = np.zeros((4, 3))
dense[[0, 2]] = sum(range(1, SIZE + 1))
check(tf.convert_to_tensor(jctf.allreduce(slices, op="sum")), dense, np.float32, "IndexedSlices")

# grouped
group_dtypes = (np.float32, BF16, np.int64)
group_in = [inputs(100 + i, (2, i + 1), d) for i, d in enumerate(group_dtypes)]
outs = jctf.grouped_allreduce([tf.constant(g[RANK]) for g in group_in], op="sum", name="tf.grouped")
for i, (o, d) in enumerate(zip(outs, group_dtypes)):
    check(o, reference(group_in[i], "sum"), d, f"grouped[{i}]")

# broadcast from every root, allgather
for root in range(SIZE):
    for dtype in (np.float32, BF16, np.int16, np.bool_):
        xs = inputs(200 + root, (2, 3), dtype)
        out = jctf.broadcast(tf.constant(xs[RANK]), root_rank=root)
        assert np.array_equal(out.numpy(), xs[root]), f"broadcast root {root}"
for dtype in (np.float32, np.uint8):
    xs = inputs(300, (2, 2), dtype)
    out = jctf.allgather(tf.constant(xs[RANK]))
    assert out.shape == (2 * SIZE, 2) and np.array_equal(out.numpy(), np.concatenate(xs)), "allgather"
assert jctf.allgather(tf.constant(RANK)).numpy().tolist() == list(range(SIZE))

# tf.function (tf.py_function path), twice (second call reuses the trace and the cached names).
for rep in range(2):
    xa, xb = inputs(400 + rep, (3,), np.float32), inputs(500 + rep, (3,), np.float32)
    s, m, g = in_graph(tf.constant(xa[RANK]), tf.constant(xb[RANK]))
    check(s, reference(xa, "sum"), np.float32, "tf.function sum")
    check(m, reference(xb, "max"), np.float32, "tf.function max")
    assert g.shape == (3 * SIZE,) and np.array_equal(g.numpy(), np.concatenate(xa))

# broadcast_variables
vs = [tf.Variable(np.full((2, 2), RANK, np.float32)), tf.Variable(np.arange(3) + RANK)]
jctf.broadcast_variables(vs, root_rank=SIZE - 1)
assert np.array_equal(vs[0].numpy(), np.full((2, 2), SIZE - 1, np.float32))
assert np.array_equal(vs[1].numpy(), np.arange(3) + SIZE - 1)

# The runtime reads the tensor's own memory: the DLPack export and NumPy's view of it agree.
t = tf.constant(np.arange(64, dtype=np.float32))
assert ext.data_pointer(t) == np.from_dlpack(t).__array_interface__["data"][0]


# --- bad input raises on every rank -------------------------------------------------------------------
def raises(exc, pattern, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert re.search(pattern, str(e)), f"{str(e)!r} lacks {pattern!r}"
        outcome = type(e).__name__
    else:
        raise AssertionError(f"expected {exc.__name__} ({pattern})")
    assert len(set(COMM.allgather(outcome))) == 1


raises(TypeError, r"tensor must be a tf.Tensor, tf.Variable, tf.IndexedSlices or np.ndarray, got list",
       jctf.allreduce, [1.0, 2.0])
raises(TypeError, r"tensor 'w' has unsupported dtype string", jctf.allreduce, tf.constant(["a"]), name="w")
# Integers average as Horovod does: sum, then times 1/size in double precision, truncated.
every = np.stack([np.array([7, -7, 5, 101], np.int32) + 3 * r for r in range(SIZE)]).astype(np.float64)
got = jctf.allreduce(tf.constant(every[RANK].astype(np.int32)), name="n").numpy()
assert got.dtype == np.int32 and np.array_equal(got, np.trunc(every.sum(0) * (1.0 / SIZE)).astype(np.int32)), got
raises(ValueError, r"op must be one of", jctf.allreduce, tf.ones(2), op="avg")
raises(ValueError, r"root=%d is outside \[0, %d\)" % (SIZE, SIZE), jctf.broadcast, tf.ones(2), root_rank=SIZE)
raises(ValueError, r"root=%d is outside" % SIZE, jctf.broadcast_variables, vs, root_rank=SIZE)
raises(TypeError, r"variables\[0\] is a EagerTensor, not a variable", jctf.broadcast_variables, [tf.ones(1)])
raises(TypeError, r"tensors must be a list or tuple", jctf.grouped_allreduce, tf.ones(2))
raises(TypeError, r"expected a tf.GradientTape", jctf.DistributedGradientTape, object())
if SIZE > 1:
    raises(jaxcache.MismatchError, r"'tf.mismatch'.*shape", jctf.allreduce, tf.ones([2 + RANK]),
           name="tf.mismatch")
    # Horovod's TensorFlow classes as well (its tests catch them), eagerly and in a graph;
    # still jaxcache's own class.
    raises(tf.errors.FailedPreconditionError, r"'tf.mismatch.eager'.*shape", jctf.allreduce,
           tf.ones([2 + RANK]), name="tf.mismatch.eager")
    raises(jaxcache.MismatchError, r"'tf.mismatch.both'", jctf.allreduce, tf.ones([2 + RANK]),
           name="tf.mismatch.both")
    in_graph = tf.function(lambda x: jctf.allreduce(x, name="tf.mismatch.graph"))
    raises(tf.errors.FailedPreconditionError, r"jaxcache.MismatchError", in_graph, tf.ones([2 + RANK]))
    raises(tf.errors.InvalidArgumentError, r"tf.a2a.uneven", jctf.alltoall, tf.ones([SIZE + 1]),
           name="tf.a2a.uneven")
    raises(tf.errors.InvalidArgumentError, r"tf.a2a.uneven.graph",
           tf.function(lambda x: jctf.alltoall(x, name="tf.a2a.uneven.graph")), tf.ones([SIZE + 1]))
check(jctf.allreduce(tf.ones(2), op="sum", name="tf.after"), np.full(2, float(SIZE)), np.float32, "after errors")

def check_array(a: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Small integers in float32: exact on every rank."""
    assert a.dtype == expected.dtype, f"{what}: dtype {a.dtype} != {expected.dtype}"
    same_on_all_ranks(a, what)
    np.testing.assert_array_equal(a, expected, err_msg=what)


# A TF1 graph run by a Session: independent collectives, which the Session may start in any
# order on each rank, on a pool of two inter-op threads that each block in a collective; and
# a mismatch there is a FailedPreconditionError too.
with tf.Graph().as_default():
    xs = [tf.constant(np.arange(4, dtype=np.float32) * (k + 1) + RANK) for k in range(24)]
    sums = [jctf.allreduce(x, op="sum", name=f"tf.session.{k}") for k, x in enumerate(xs)]
    gathered = [jctf.allgather(x, name=f"tf.session.ag.{k}") for k, x in enumerate(xs[:6])]
    bad = jctf.allreduce(tf.ones([2 + RANK]), name="tf.session.mismatch") if SIZE > 1 else None
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
    with tf.compat.v1.Session(config=config) as session:
        for step in range(3):
            got_sums, got_gathered = session.run([sums, gathered])
            for k, got in enumerate(got_sums):
                want = sum(np.arange(4, dtype=np.float32) * (k + 1) + r for r in range(SIZE))
                check_array(got, want, f"session allreduce {k}")
            for k, got in enumerate(got_gathered):
                want = np.concatenate([np.arange(4, dtype=np.float32) * (k + 1) + r for r in range(SIZE)])
                check_array(got, want, f"session allgather {k}")
        if bad is not None:
            raises(tf.errors.FailedPreconditionError, r"jaxcache.MismatchError", session.run, bad)
            check_array(session.run(sums[0]), sum(np.arange(4, dtype=np.float32) + r for r in range(SIZE)),
                        "session after the mismatch")

done("tf_ops")
jctf.shutdown()
