"""jaxcache.tensorflow: reducescatter, alltoall, uneven allgather, object collectives and join.

Against NumPy on every rank (every dtype and op the bridge's allreduce supports), eagerly and
inside tf.function, mismatches (MismatchError on every rank), and a DistributedGradientTape
loop inside tf.function where ranks run out of data at different steps.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _util import COMM, done, same_on_all_ranks  # noqa: E402

import jaxcache.tensorflow as jctf  # noqa: E402

jctf.init()
RANK, SIZE = jctf.rank(), jctf.size()
BF16 = tf.bfloat16.as_numpy_dtype
scenario = sys.argv[1]
DTYPES = (np.float32, np.float64, np.float16, BF16, np.int32, np.int64, np.uint8, np.complex64, np.bool_)


def ops_for(dtype):
    kind = np.dtype(dtype).kind
    if dtype == np.bool_:
        return ["min", "max"]
    if kind == "c":
        return ["sum", "average", "prod"]
    if kind in "iu":
        return ["sum", "min", "max", "prod"]
    return ["sum", "average", "min", "max", "prod"]


def inputs(seed, shape, dtype, op="sum"):
    out = []
    for r in range(SIZE):
        rng = np.random.default_rng(1000 * seed + r)
        kind = np.dtype(dtype).kind
        if dtype == np.bool_:
            out.append(rng.random(shape) > 0.5)
        elif kind == "f" or dtype == BF16:
            base = rng.uniform(0.5, 1.5, shape) if op == "prod" else rng.standard_normal(shape) * 4
            out.append(base.astype(dtype))
        elif kind == "c":
            out.append((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype))
        else:
            out.append(rng.integers(0 if kind == "u" else -3, 3 if op == "prod" else 6, shape).astype(dtype))
    return out


def reference(xs, op):
    wide = np.complex128 if xs[0].dtype.kind == "c" else (
        np.float64 if (xs[0].dtype.kind == "f" or xs[0].dtype == BF16) else xs[0].dtype)
    stack = np.stack([x.astype(wide) for x in xs])
    return {"sum": lambda: stack.sum(0), "average": lambda: stack.sum(0) / SIZE, "min": lambda: stack.min(0),
            "max": lambda: stack.max(0), "prod": lambda: stack.prod(0)}[op]()


def check(actual, expected, dtype, what):
    a = actual.numpy() if hasattr(actual, "numpy") else np.asarray(actual)
    assert a.dtype == np.dtype(dtype), f"{what}: dtype {a.dtype} != {np.dtype(dtype)}"
    assert a.shape == np.shape(expected), f"{what}: shape {a.shape} != {np.shape(expected)}"
    tol = {np.dtype(np.float16): 3e-3, np.dtype(BF16): 2e-2, np.dtype(np.float32): 1e-6,
           np.dtype(np.complex64): 1e-6}.get(np.dtype(dtype), 1e-12)
    if a.dtype.kind in "fc" or a.dtype == BF16:
        wide = np.complex128 if a.dtype.kind == "c" else np.float64
        np.testing.assert_allclose(a.astype(wide), expected, rtol=tol, atol=8 * tol, err_msg=what)
    else:
        np.testing.assert_array_equal(a, np.asarray(expected).astype(a.dtype), err_msg=what)


def rows_of(n, r):
    return n // SIZE + (1 if r < n % SIZE else 0)


def my_rows(full, r=RANK):
    start = sum(rows_of(full.shape[0], q) for q in range(r))
    return full[start:start + rows_of(full.shape[0], r)]


def raises(exc, fragments, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        for f in fragments:
            assert f in str(e), f"{f!r} not in {e}"
        assert len(set(COMM.allgather(type(e).__name__))) == 1
        return
    raise AssertionError(f"expected {exc.__name__} {fragments}")


if scenario == "ops":
    seed = 0
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for rows in (2 * SIZE, 2 * SIZE + 1):
                seed += 1
                xs = inputs(seed, (rows, 2), dtype, op)
                expected = my_rows(reference(xs, op))
                check(jctf.reducescatter(tf.constant(xs[RANK]), op=op, name=f"tf.rs.{seed}"), expected,
                      dtype, f"reducescatter {np.dtype(dtype).name} {op} {rows}")
        # allgather with a different first dimension per rank; alltoall with uneven splits
        parts = [inputs(200, (r + 1, 3), dtype)[r] for r in range(SIZE)]
        out = jctf.allgather(tf.constant(parts[RANK]), name=f"tf.ag.{np.dtype(dtype).name}")
        check(out, np.concatenate(parts), dtype, f"uneven allgather {np.dtype(dtype).name}")
        same_on_all_ranks(out.numpy().view(np.uint8), "uneven allgather")
        splits = [[(q + 2 * d) % 3 for d in range(SIZE)] for q in range(SIZE)]
        xs = [inputs(300, (sum(splits[q]), 2), dtype)[q] for q in range(SIZE)]
        out, received = jctf.alltoall(tf.constant(xs[RANK]), splits=splits[RANK], name=f"tf.a2a.{np.dtype(dtype).name}")
        expect = np.concatenate([np.split(xs[q], np.cumsum(splits[q])[:-1])[RANK] for q in range(SIZE)])
        check(out, expect, dtype, f"alltoall splits {np.dtype(dtype).name}")
        assert received.numpy().tolist() == [splits[q][RANK] for q in range(SIZE)]
    group = [inputs(400 + i, (2 * SIZE + 1, 2), d) for i, d in enumerate((np.float32, np.int64))]
    outs = jctf.grouped_reducescatter([tf.constant(g[RANK]) for g in group], op="sum", name="tf.grs")
    for i, (o, g) in enumerate(zip(outs, group)):
        check(o, my_rows(reference(g, "sum")), g[0].dtype, f"grouped reducescatter {i}")
    outs = jctf.grouped_allgather([tf.ones(RANK + 1), tf.fill([1, 2], RANK)], name="tf.gag")
    assert outs[0].shape == (SIZE * (SIZE + 1) // 2,) and outs[1].numpy().tolist() == [[r, r] for r in range(SIZE)]

    # Inside tf.function (twice: the second call reuses the trace and the cached names).
    @tf.function
    def in_graph(x, y):
        rs = jctf.reducescatter(x, op="average")
        ag = jctf.allgather(y)
        a2a = jctf.alltoall(x)
        a2a_s, received = jctf.alltoall(y, splits=[len_y if d == 0 else 0 for d in range(SIZE)])
        return rs, ag, a2a, a2a_s, received

    for rep in range(2):
        xs = inputs(500 + rep, (2 * SIZE, 3), np.float64)
        len_y = RANK + 1
        ys = [np.arange(r + 1, dtype=np.float32) + 10 * r for r in range(SIZE)]
        rs, ag, a2a, a2a_s, received = in_graph(tf.constant(xs[RANK]), tf.constant(ys[RANK]))
        check(rs, my_rows(reference(xs, "average")), np.float64, "tf.function reducescatter")
        check(ag, np.concatenate(ys), np.float32, "tf.function uneven allgather")
        check(a2a, np.concatenate([x[2 * RANK:2 * RANK + 2] for x in xs]), np.float64, "tf.function alltoall")
        check(a2a_s, np.concatenate(ys) if RANK == 0 else np.zeros(0, np.float32), np.float32,
              "tf.function alltoall splits")
        assert received.numpy().tolist() == ([r + 1 for r in range(SIZE)] if RANK == 0 else [0] * SIZE)
    # objects
    assert jctf.allgather_object([RANK] * RANK) == [[r] * r for r in range(SIZE)]
    assert jctf.broadcast_object({"lr": 0.1} if RANK == 1 else None, root_rank=1) == {"lr": 0.1}

elif scenario == "threads":
    # Threads submit named eager collectives in a rank-dependent order.
    import threading

    results, errors = {}, []

    def work(i):
        try:
            x = tf.reshape(tf.range(2 * SIZE * 2, dtype=tf.float32), (2 * SIZE, 2)) + i + RANK
            if i % 3 == 0:
                results[i] = jctf.reducescatter(x, op="sum", name=f"th.rs.{i}")
            elif i % 3 == 1:
                results[i] = jctf.alltoall(x, name=f"th.a2a.{i}")
            else:
                results[i] = jctf.allgather(x[: RANK + 1], name=f"th.ag.{i}")
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    order = list(range(9)) if RANK % 2 == 0 else list(reversed(range(9)))
    for rep in range(2):
        threads = [threading.Thread(target=work, args=(i,)) for i in order]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        base = np.arange(2 * SIZE * 2, dtype=np.float32).reshape(2 * SIZE, 2)
        for i in range(9):
            xs = [base + i + q for q in range(SIZE)]
            if i % 3 == 0:
                expect = sum(xs)[2 * RANK:2 * RANK + 2]
            elif i % 3 == 1:
                expect = np.concatenate([x[2 * RANK:2 * RANK + 2] for x in xs])
            else:
                expect = np.concatenate([xs[q][: q + 1] for q in range(SIZE)])
            check(results[i], expect, np.float32, f"thread {i} rep {rep}")

elif scenario == "errors":
    last = SIZE - 1
    raises(jctf.MismatchError, ["mm.rs", "shape", f"rank {last}"], jctf.reducescatter,
           tf.ones(4 if RANK != last else 6), op="sum", name="mm.rs")
    raises(jctf.MismatchError, ["mm.ag", "shape beyond the first dimension"], jctf.allgather,
           tf.ones((2, 3 if RANK != last else 4)), name="mm.ag")
    sp = [1] * SIZE if RANK != last else [1] * (SIZE + 1)
    raises(jctf.MismatchError, ["mm.a2a", "number of splits", f"rank {last}"], jctf.alltoall,
           tf.ones(len(sp)), splits=sp, name="mm.a2a")
    raises(ValueError, ["scalar"], jctf.reducescatter, tf.constant(1.0))
    # An integer average truncates toward zero (Horovod's rule): 3 * size / size is exact.
    assert jctf.reducescatter(tf.fill([SIZE], 3)).numpy().tolist() == [3]
    assert jctf.allreduce(tf.ones(2), op="sum", name="healthy").numpy().tolist() == [SIZE, SIZE]

elif scenario == "join":
    # DistributedGradientTape inside tf.function; rank r has steps[r] batches, then joins.
    steps = [3, 5] if SIZE == 2 else [5, 3, 6]

    def batch(r, t):
        rng = np.random.default_rng([r, t])
        x = rng.standard_normal((6, 4))
        return x, x @ np.arange(1.0, 5.0) + 0.1 * rng.standard_normal(6)

    def loss_fn(vs, x, y):
        return tf.reduce_mean((tf.linalg.matvec(x, vs[0]) + vs[1] - y) ** 2)

    vs = [tf.Variable(tf.zeros(4, tf.float64)), tf.Variable(tf.zeros((), tf.float64))]

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(vs, x, y)
        grads = jctf.DistributedGradientTape(tape).gradient(loss, vs)
        for v, g in zip(vs, grads):
            v.assign_sub(0.05 * g)
        return jctf.reducescatter(tf.fill([SIZE], loss), op="average", name="tf.mean_loss")

    ref = [np.zeros(4), np.zeros(())]
    for t in range(max(steps)):
        active = [r for r in range(SIZE) if steps[r] > t]
        losses, grads = [], []
        for r in active:
            x, y = batch(r, t)
            rv = [tf.Variable(v) for v in ref]
            with tf.GradientTape() as tape:
                loss = loss_fn(rv, tf.constant(x), tf.constant(y))
            losses.append(float(loss))
            grads.append([g.numpy() for g in tape.gradient(loss, rv)])
        # An average divides by the size after join() too (Horovod's rule).
        ref = [v - 0.05 * np.sum([g[i] for g in grads], axis=0) / SIZE for i, v in enumerate(ref)]
        if RANK in active:
            mean_loss = train_step(*[tf.constant(a) for a in batch(RANK, t)])
            np.testing.assert_allclose(mean_loss.numpy(), [np.sum(losses) / SIZE], rtol=1e-12)
            seen = jctf.allgather(tf.constant([t]), name="tf.seen")
            assert seen.numpy().tolist() == [t] * len(active)
            # IndexedSlices: divided by the size, like dense gradients, eagerly and inside
            # tf.function.
            def slices_of(r):
                return tf.IndexedSlices(tf.constant([[1.0 + r, t * 1.0]]), tf.constant([(r + t) % 3]),
                                        tf.constant([3, 2]))
            want = sum(tf.convert_to_tensor(slices_of(r)).numpy() for r in active) / SIZE
            for mean_slices in (jctf.allreduce(slices_of(RANK), op=jctf.Average, name="tf.slices"),
                                tf.function(lambda: jctf.allreduce(slices_of(RANK), op=jctf.Average,
                                                                   name="tf.slices.fn"))()):
                assert isinstance(mean_slices, tf.IndexedSlices)
                np.testing.assert_allclose(tf.convert_to_tensor(mean_slices).numpy(), want, rtol=1e-6)
        if t + 1 == steps[RANK]:
            # Horovod's join: an int32 scalar tensor, eagerly or inside tf.function.
            last = tf.function(jctf.join)() if RANK % 2 else jctf.join()
            assert last.dtype == tf.int32 and int(last) == int(np.argmax(steps)), last
            for v, r in zip(vs, ref):
                np.testing.assert_allclose(v.numpy(), r, rtol=1e-12, atol=1e-13)
            break

else:
    raise SystemExit(f"unknown scenario {scenario}")

done(f"tf_vocabulary {scenario}")
