"""`import jaxcache.tensorflow as hvd` with Horovod 0.28.1's API: every name marked "same" in
docs/horovod.md against NumPy on every rank, eagerly and in tf.function; gradients by finite
differences; reducescatter, alltoall, uneven allgather and join with Horovod's signatures and
return conventions; SyncBatchNormalization against BatchNormalization on the global batch."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _util import COMM, done, raises, same_on_all_ranks  # noqa: E402

import jaxcache  # noqa: E402
import jaxcache.tensorflow as hvd  # noqa: E402

RANK, SIZE = COMM.rank, COMM.size


raises(ValueError, r"init\(\)", hvd.rank)
hvd.init()
assert (hvd.rank(), hvd.size()) == (RANK, SIZE) and hvd.is_initialized()
from mpi4py import MPI  # noqa: E402

node = COMM.Split_type(MPI.COMM_TYPE_SHARED)
local_ranks = COMM.allgather(node.rank)
peers = [r for r in range(SIZE) if local_ranks[r] == node.rank]
assert (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) == \
    (node.rank, node.size, peers.index(RANK), len(peers))
assert hvd.is_homogeneous() == (len(set(COMM.allgather(node.size))) == 1)
assert hvd.mpi_threads_supported() and hvd.mpi_enabled() and hvd.mpi_built()
assert (hvd.gloo_enabled(), hvd.gloo_built(), hvd.nccl_built(), hvd.ddl_built(), hvd.ccl_built(),
        hvd.cuda_built(), hvd.rocm_built()) == (False, False, 0, False, False, False, False)
assert hvd.global_process_set.size() == SIZE and hvd.global_process_set.included()
assert hvd.remove_process_set(hvd.global_process_set) is False
assert [int(c) for c in (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product)] == list(range(6))
assert issubclass(jaxcache.MismatchError, hvd.HorovodInternalError)


@tf.function
def queried():
    return hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(), hvd.local_size_op(), hvd.process_set_included_op()


assert [int(t) for t in queried()] == [RANK, SIZE, node.rank, node.size, 1]
assert hvd.handle_average_backwards_compatibility(None, None) == hvd.Average
assert hvd.handle_average_backwards_compatibility(hvd.Max, None) == hvd.Max
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    assert hvd.handle_average_backwards_compatibility(None, False) == hvd.Sum
assert hvd.check_num_rank_power_of_2(4) and not hvd.check_num_rank_power_of_2(3)


def inputs(seed: int, shape, dtype=np.float64) -> list[np.ndarray]:
    out = []
    for r in range(SIZE):
        rng = np.random.default_rng(1000 * seed + r)
        x = rng.standard_normal(shape) * 3
        out.append(x.astype(dtype) if np.dtype(dtype).kind == "f" else np.round(x).astype(dtype))
    return out


def ref(xs, op: str, pre=1.0, post=1.0):
    s = np.stack(xs).astype(np.float64 if xs[0].dtype.kind == "f" else xs[0].dtype) * pre
    return {"sum": s.sum(0), "avg": s.sum(0) / SIZE, "min": s.min(0), "max": s.max(0), "prod": s.prod(0)}[op] * post


def check(t, expected, dtype, what, tol=1e-12, same=True):
    """`t` against NumPy; same=True: also bitwise identical on every rank (not for reducescatter)."""
    a = t.numpy()
    assert a.dtype == np.dtype(dtype), f"{what}: dtype {a.dtype}"
    assert a.shape == np.shape(expected), f"{what}: shape {a.shape} != {np.shape(expected)}"
    if same:
        same_on_all_ranks(a, what)
    np.testing.assert_allclose(a.astype(np.float64), expected, rtol=tol, atol=tol, err_msg=what)


seed = 0
for op, key in ((hvd.Average, "avg"), (hvd.Sum, "sum"), (hvd.Min, "min"), (hvd.Max, "max"), (hvd.Product, "prod")):
    for dtype in (np.float32, np.float64, np.int32):
        if op == hvd.Average and dtype == np.int32:
            continue
        seed += 1
        xs = inputs(seed, (2, 3), dtype)
        check(hvd.allreduce(tf.constant(xs[RANK]), op=op), ref(xs, key), dtype, f"allreduce {op.name} {dtype}",
              1e-5 if dtype == np.float32 else 1e-12)
xs = inputs(40, (5,))
check(hvd.allreduce(tf.constant(xs[RANK])), ref(xs, "avg"), np.float64, "default op")
check(hvd.allreduce(tf.Variable(xs[RANK]), op="sum"), ref(xs, "sum"), np.float64, "variable, op string")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    check(hvd.allreduce(tf.constant(xs[RANK]), average=False), ref(xs, "sum"), np.float64, "average=False")
raises(ValueError, r"supersedes average", hvd.allreduce, tf.constant(xs[RANK]), average=True, op=hvd.Sum)
check(hvd.allreduce(tf.constant(xs[RANK]), op=hvd.Average, prescale_factor=0.5, postscale_factor=4.0),
      ref(xs, "avg", 0.5, 4.0), np.float64, "scaled")
raises(NotImplementedError, r"Adasum.*op=Average", hvd.allreduce, tf.constant(xs[RANK]), op=hvd.Adasum)
xs32 = inputs(41, (64,), np.float32)
for comp, tol in ((hvd.Compression.fp16, 3e-3), (hvd.Compression.bf16, 3e-2)):
    out = hvd.allreduce(tf.constant(xs32[RANK]), op=hvd.Sum, compression=comp)
    assert out.dtype == tf.float32
    same_on_all_ranks(out.numpy(), comp.__name__)
    np.testing.assert_allclose(out.numpy(), ref(xs32, "sum"), rtol=tol, atol=10 * tol)

# IndexedSlices: allgathered values and indices (different counts per rank), still IndexedSlices
def slices_of(r):
    rng = np.random.default_rng(500 + r)
    idx = rng.integers(0, 6, r + 1).astype(np.int32)
    return tf.IndexedSlices(tf.constant(rng.standard_normal((r + 1, 3))), tf.constant(idx), tf.constant([6, 3]))


all_slices = [slices_of(r) for r in range(SIZE)]
for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / SIZE)):
    got = hvd.allreduce(all_slices[RANK], op=op)
    assert isinstance(got, tf.IndexedSlices)
    assert np.array_equal(got.indices.numpy(), np.concatenate([s.indices.numpy() for s in all_slices]))
    np.testing.assert_allclose(got.values.numpy(), np.concatenate([s.values.numpy() for s in all_slices]) * scale)
    dense = tf.convert_to_tensor(got).numpy()
    np.testing.assert_allclose(dense, sum(tf.convert_to_tensor(s).numpy() for s in all_slices) * scale)
raises(NotImplementedError, r"only Sum and Average apply to tf.IndexedSlices", hvd.allreduce,
       all_slices[RANK], op=hvd.Max)

# grouped, with an IndexedSlices member
gs = [inputs(60 + i, (i + 1, 2)) for i in range(2)]
outs = hvd.grouped_allreduce([tf.constant(gs[0][RANK]), all_slices[RANK], tf.constant(gs[1][RANK])], op=hvd.Sum)
check(outs[0], ref(gs[0], "sum"), np.float64, "grouped[0]")
check(outs[2], ref(gs[1], "sum"), np.float64, "grouped[2]")
assert isinstance(outs[1], tf.IndexedSlices)
assert hvd.grouped_allreduce([]) == []

# allgather, grouped_allgather, broadcast, broadcast_, broadcast_variables
for dtype in (np.float32, np.int64):
    xs = inputs(70, (2, 3), dtype)
    out = hvd.allgather(tf.constant(xs[RANK]))
    assert out.dtype == tf.as_dtype(dtype) and np.array_equal(out.numpy(), np.concatenate(xs))
a, b = inputs(71, (1, 2)), inputs(72, (3,))
ga, gb = hvd.grouped_allgather([tf.constant(a[RANK]), tf.constant(b[RANK])])
assert np.array_equal(ga.numpy(), np.concatenate(a)) and np.array_equal(gb.numpy(), np.concatenate(b))
for root in range(SIZE):
    xs = inputs(80 + root, (2, 2))
    assert np.array_equal(hvd.broadcast(tf.constant(xs[RANK]), root).numpy(), xs[root])
    vs = [tf.Variable(xs[RANK]), tf.Variable(np.arange(3) + RANK)]
    new = hvd.broadcast_(vs, root)
    assert np.array_equal(vs[0].numpy(), xs[root]) and np.array_equal(vs[1].numpy(), np.arange(3) + root)
    assert np.array_equal(new[0].numpy(), xs[root])
    vs = [tf.Variable(xs[RANK])]
    hvd.broadcast_variables(vs, root_rank=root)
    assert np.array_equal(vs[0].numpy(), xs[root])


@tf.function
def in_graph(x, v):
    return (hvd.allreduce(x, op=hvd.Sum), hvd.allgather(x), hvd.broadcast(x, SIZE - 1),
            hvd.grouped_allreduce([x, 2 * x], op=hvd.Max), hvd.allreduce(v, op=hvd.Sum))


for rep in range(2):
    xs = inputs(90 + rep, (3,), np.float32)
    s, g, bc, (m1, m2), sl = in_graph(tf.constant(xs[RANK]), all_slices[RANK])
    check(s, ref(xs, "sum"), np.float32, "tf.function allreduce", 1e-5)
    assert np.array_equal(g.numpy(), np.concatenate(xs)) and np.array_equal(bc.numpy(), xs[SIZE - 1])
    check(m2, ref(xs, "max") * 2, np.float32, "tf.function grouped", 1e-6)
    assert isinstance(sl, tf.IndexedSlices) and sl.values.shape[0] == sum(range(1, SIZE + 1))


# --- reducescatter, alltoall, uneven allgather (Horovod's signatures and return conventions) --------
def rows_of(n: int, r: int) -> int:
    return n // SIZE + (1 if r < n % SIZE else 0)


def my_rows(full: np.ndarray) -> np.ndarray:
    start = sum(rows_of(full.shape[0], q) for q in range(RANK))
    return full[start:start + rows_of(full.shape[0], RANK)]


seed = 100
for op, key in ((hvd.Average, "avg"), (hvd.Sum, "sum"), (hvd.Min, "min"), (hvd.Max, "max"), (hvd.Product, "prod")):
    for rows in (2 * SIZE, 2 * SIZE + 1, SIZE - 1):
        for dtype in (np.float64, np.int32):
            if op == hvd.Average and dtype == np.int32:
                continue
            seed += 1
            xs = inputs(seed, (rows, 3), dtype)
            check(hvd.reducescatter(tf.constant(xs[RANK]), op=op), my_rows(ref(xs, key)), dtype,
                  f"reducescatter {op.name} {np.dtype(dtype).name} rows {rows}", same=False)
xs = inputs(130, (2 * SIZE + 1, 2))
check(hvd.reducescatter(tf.Variable(xs[RANK])), my_rows(ref(xs, "avg")), np.float64, "reducescatter default",
      same=False)
check(hvd.reducescatter(tf.constant(xs[RANK]), op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
      my_rows(ref(xs, "sum", 0.5, 3.0)), np.float64, "reducescatter scaled", same=False)
check(hvd.reducescatter(tf.constant(xs[RANK]), op="sum", prescale=2.0), my_rows(ref(xs, "sum", 2.0)),
      np.float64, "reducescatter jaxcache spellings", same=False)
gs = [inputs(131 + i, (SIZE + i, 2), d) for i, d in enumerate((np.float64, np.float32))]
outs = hvd.grouped_reducescatter([tf.constant(g[RANK]) for g in gs], op=hvd.Sum)
for i, o in enumerate(outs):
    check(o, my_rows(ref(gs[i], "sum")), gs[i][0].dtype, f"grouped_reducescatter[{i}]", 1e-5, False)
outs = hvd.grouped_reducescatter([tf.constant(g[RANK]) for g in gs], postscale_factor=2.0, name="hvd.grs")
for i, o in enumerate(outs):
    check(o, my_rows(ref(gs[i], "avg", 1.0, 2.0)), gs[i][0].dtype, f"grouped_reducescatter avg[{i}]", 1e-5, False)
xs32 = inputs(133, (4 * SIZE, 8), np.float32)
out = hvd.reducescatter(tf.constant(xs32[RANK]), op=hvd.Sum, compression=hvd.Compression.fp16)
assert out.dtype == tf.float32
np.testing.assert_allclose(out.numpy(), my_rows(ref(xs32, "sum")), rtol=3e-3, atol=3e-2)

# alltoall: without splits only the tensor; with splits also the received splits (int32)
xs = inputs(140, (2 * SIZE, 3))
out = hvd.alltoall(tf.constant(xs[RANK]))
assert isinstance(out, tf.Tensor)
assert np.array_equal(out.numpy(), np.concatenate([x[2 * RANK:2 * RANK + 2] for x in xs])), "alltoall"
splits = [[(q + 2 * d) % 3 for d in range(SIZE)] for q in range(SIZE)]
xs = [inputs(141, (sum(splits[q]), 2))[q] for q in range(SIZE)]
expect = np.concatenate([np.split(xs[q], np.cumsum(splits[q])[:-1])[RANK] for q in range(SIZE)])
for sp in (splits[RANK], np.array(splits[RANK]), tf.constant(splits[RANK], tf.int32)):
    out, received = hvd.alltoall(tf.constant(xs[RANK]), splits=sp)
    assert np.array_equal(out.numpy(), expect) and received.dtype == tf.int32
    assert received.numpy().tolist() == [splits[q][RANK] for q in range(SIZE)]

# allgather with a different first dimension per rank
parts = [inputs(150, (r + 1, 2))[r] for r in range(SIZE)]
assert np.array_equal(hvd.allgather(tf.constant(parts[RANK])).numpy(), np.concatenate(parts))
other = [np.full((SIZE - r, 3), r, np.int64) for r in range(SIZE)]
ga, gb = hvd.grouped_allgather([tf.constant(parts[RANK]), tf.constant(other[RANK])])
assert np.array_equal(ga.numpy(), np.concatenate(parts)) and np.array_equal(gb.numpy(), np.concatenate(other))


@tf.function
def vocab_in_graph(x, y, sp):
    out, received = hvd.alltoall(y, splits=sp)
    return hvd.reducescatter(x, op=hvd.Sum), hvd.allgather(y), hvd.alltoall(x), out, received


for rep in range(2):
    xs = inputs(160 + rep, (2 * SIZE, 2))
    ys = [np.arange(r + 1, dtype=np.float32) + 10 * r for r in range(SIZE)]
    sp = [RANK + 1 if d == SIZE - 1 else 0 for d in range(SIZE)]
    rs, ag, a2a, a2a_s, received = vocab_in_graph(tf.constant(xs[RANK]), tf.constant(ys[RANK]), tf.constant(sp))
    check(rs, my_rows(ref(xs, "sum")), np.float64, "tf.function reducescatter", same=False)
    assert np.array_equal(ag.numpy(), np.concatenate(ys)), "tf.function uneven allgather"
    assert np.array_equal(a2a.numpy(), np.concatenate([x[2 * RANK:2 * RANK + 2] for x in xs]))
    mine = np.concatenate(ys) if RANK == SIZE - 1 else np.zeros(0, np.float32)
    assert np.array_equal(a2a_s.numpy(), mine) and received.dtype == tf.int32
    assert received.numpy().tolist() == ([r + 1 for r in range(SIZE)] if RANK == SIZE - 1 else [0] * SIZE)

# objects
assert hvd.allgather_object({"r": RANK, "pad": "x" * RANK}) == [{"r": r, "pad": "x" * r} for r in range(SIZE)]
for root in range(SIZE):
    assert hvd.broadcast_object(("cfg", RANK), root_rank=root) == ("cfg", root)
assert hvd.broadcast_object_fn(root_rank=SIZE - 1)([RANK]) == [SIZE - 1]
raises(NotImplementedError, r"session=", hvd.broadcast_object, 1, session=object())
raises(RuntimeError, r"does not support eager execution", hvd.broadcast_global_variables, 0)
graph = tf.Graph()  # TensorFlow 1 style: graph mode and a session
with graph.as_default():
    gv = tf.compat.v1.Variable(np.full(3, float(RANK)), use_resource=True)
    bcast = hvd.broadcast_global_variables(SIZE - 1)
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(bcast)
        assert session.run(gv).tolist() == [float(SIZE - 1)] * 3


# --- gradients: finite differences of the global objective (every rank perturbs in lockstep) -----
def objective(ys, weights):
    return sum(tf.reduce_sum(tf.sin(y) * tf.reshape(w[: int(np.prod(y.shape))], y.shape)) for y, w in zip(ys, weights))


def gradcheck(label, fn, shape, scale):
    """The tape's gradient against central differences of the sum of the ranks' losses, where
    every rank perturbs in lockstep; `scale` is Horovod's convention for the op (1: the sum of
    the losses, 1/size: their mean, size: size times their sum). `shape` may depend on the rank."""
    shape_of = shape if callable(shape) else (lambda r: shape)
    x0 = inputs(zlib.crc32(label.encode()) % 1000, shape_of(RANK))[RANK]
    weights = [tf.constant(np.linspace(-1, 1, 64) * (RANK + 1) + k) for k in range(3)]
    x = tf.Variable(x0)
    with tf.GradientTape() as tape:
        y = fn(x)
        loss = objective(y if isinstance(y, list) else [y], weights)
    analytic = COMM.allgather(tape.gradient(loss, x).numpy().ravel())
    eps = 1e-6
    for q in range(SIZE):
        numeric = np.zeros(int(np.prod(shape_of(q))))
        for i in range(numeric.size):
            vals = []
            for sign in (1, -1):
                xp = x0.copy().ravel()
                if RANK == q:
                    xp[i] += sign * eps
                y = fn(tf.constant(xp.reshape(x0.shape)))
                vals.append(COMM.allreduce(float(objective(y if isinstance(y, list) else [y], weights))))
            numeric[i] = scale * (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(analytic[q], numeric, rtol=1e-6, atol=1e-7,
                                   err_msg=f"gradient of {label} on rank {q}")


gradcheck("allreduce Average", lambda x: hvd.allreduce(x, name="g.avg"), (3,), 1.0)
gradcheck("allreduce Sum scaled", lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                                                          postscale_factor=3.0, name="g.sum"), (2, 2), 1.0)
gradcheck("grouped_allreduce", lambda x: hvd.grouped_allreduce([x, x * x], op=hvd.Sum, name="g.gar"), (3,), 1.0)
# allgather and broadcast: Horovod averages the gradients (the gradient of the mean of the losses)
gradcheck("allgather", lambda x: hvd.allgather(x, name="g.ag"), (2, 2), 1.0 / SIZE)
gradcheck("allgather uneven", lambda x: hvd.allgather(x, name="g.agu"), lambda r: (r + 1, 2), 1.0 / SIZE)
gradcheck("grouped_allgather", lambda x: hvd.grouped_allgather([x, 2 * x], name="g.gag"), (2,), 1.0 / SIZE)
gradcheck("grouped_allgather uneven", lambda x: hvd.grouped_allgather([x, x[:1] * 3], name="g.gagu"),
          lambda r: (r + 1,), 1.0 / SIZE)
for root in range(SIZE):
    gradcheck(f"broadcast {root}", lambda x: hvd.broadcast(x, root, name=f"g.bc{root}"), (3,), 1.0 / SIZE)
# reducescatter: Horovod's gradient is size times that of the sum of the losses, for every op
gradcheck("reducescatter Sum", lambda x: hvd.reducescatter(x, op=hvd.Sum, name="g.rs"), (2 * SIZE, 2), SIZE)
gradcheck("reducescatter Average uneven scaled",
          lambda x: hvd.reducescatter(x, name="g.rsa", prescale_factor=0.5, postscale_factor=3.0),
          (2 * SIZE + 1,), SIZE)
gradcheck("grouped_reducescatter",
          lambda x: hvd.grouped_reducescatter([x, x * x], op=hvd.Sum, name="g.grs"), (SIZE + 1,), SIZE)
# alltoall: the gradient goes back where the rows came from (the sum of the losses)
gradcheck("alltoall", lambda x: hvd.alltoall(x, name="g.a2a"), (SIZE, 2), 1.0)
split_table = [[(q + d) % 3 for d in range(SIZE)] for q in range(SIZE)]
gradcheck("alltoall splits", lambda x: hvd.alltoall(x, splits=split_table[RANK], name="g.a2as")[0],
          lambda r: (sum(split_table[r]), 2), 1.0)
# inside tf.function (the tape outside it)
gradcheck("allreduce in tf.function", tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum, name="g.fn")),
          (3,), 1.0)
gradcheck("allgather uneven in tf.function", tf.function(lambda x: hvd.allgather(x, name="g.fn.ag")),
          lambda r: (SIZE - r, 2), 1.0 / SIZE)
gradcheck("reducescatter in tf.function",
          tf.function(lambda x: hvd.reducescatter(x, op=hvd.Sum, name="g.fn.rs")), (SIZE + 1,), SIZE)
gradcheck("alltoall splits in tf.function",
          tf.function(lambda x: hvd.alltoall(x, splits=split_table[RANK], name="g.fn.a2a")[0]),
          lambda r: (sum(split_table[r]),), 1.0)

# --- SyncBatchNormalization against BatchNormalization on the whole batch (equal shards) ---------
rng = np.random.default_rng(0)
per = 4
full = rng.standard_normal((per * SIZE, 5)).astype(np.float32) * 2 + 1
dy = rng.standard_normal(full.shape).astype(np.float32)
mine = full[RANK * per:(RANK + 1) * per]
sbn, bn = hvd.SyncBatchNormalization(momentum=0.5), keras.layers.BatchNormalization(momentum=0.5)
for layer in (sbn, bn):
    layer.build((None, 5))
    layer.gamma.assign(np.linspace(0.5, 2, 5))
    layer.beta.assign(np.linspace(-1, 1, 5))
xv, xf = tf.Variable(mine), tf.Variable(full)
with tf.GradientTape() as tape:
    out = sbn(xv, training=True)
    loss = tf.reduce_sum(out * dy[RANK * per:(RANK + 1) * per])
gx = tape.gradient(loss, xv)
with tf.GradientTape() as tape:
    ref_out = bn(xf, training=True)
    ref_loss = tf.reduce_sum(ref_out * dy)
gref = tape.gradient(ref_loss, xf)
np.testing.assert_allclose(out.numpy(), ref_out.numpy()[RANK * per:(RANK + 1) * per], rtol=1e-4, atol=1e-5)
np.testing.assert_allclose(gx.numpy(), gref.numpy()[RANK * per:(RANK + 1) * per], rtol=1e-3, atol=1e-4)
np.testing.assert_allclose(sbn.moving_mean.numpy(), bn.moving_mean.numpy(), rtol=1e-5)
np.testing.assert_allclose(sbn.moving_variance.numpy(), bn.moving_variance.numpy(), rtol=1e-4)
raises(ValueError, r"fused=True", hvd.SyncBatchNormalization, fused=True)

# --- process sets (tests/mpi/tf_process_sets.py covers them at 3 and 4 ranks) ---------------------
x = tf.ones([2 * SIZE])
solo = hvd.add_process_set([0])
assert solo.ranks == [0] and int(hvd.size_op(process_set_id=solo.process_set_id)) == 1
assert int(hvd.process_set_included_op(solo.process_set_id)) == int(RANK == 0)
if RANK == 0:
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, process_set=solo).numpy(), x.numpy())
else:
    raises(ValueError, rf"rank {RANK} is not a member of process set {solo.process_set_id}", hvd.allreduce, x,
           process_set=solo)
solo_id = solo.process_set_id
assert hvd.remove_process_set(solo) is True and int(hvd.size_op(process_set_id=solo_id)) == -3

# --- the timeline, started and stopped at run time (rank 0 writes) --------------------------------
_tl = os.path.join(hvd.broadcast_object(tempfile.mkdtemp(prefix="jc-tl-") if RANK == 0 else None,
                                        name="tl.dir"), "timeline.json")
hvd.start_timeline(_tl, mark_cycles=True)
hvd.allreduce(tf.ones(2), op=hvd.Sum, name="tl.recorded")
hvd.stop_timeline()
hvd.allreduce(tf.ones(2), op=hvd.Sum, name="tl.not_recorded")
hvd.barrier()
if RANK == 0:
    with open(_tl) as f:
        _tracks = {e["args"]["name"] for e in json.load(f) if e.get("name") == "process_name"}
    assert _tracks == {"tl.recorded"}, _tracks

# --- unsupported names raise and say so -------------------------------------------------
for fn, args, kw, pattern in [
    (hvd.BroadcastGlobalVariablesHook, (0,), {}, r"not supported by jaxcache: TensorFlow 1 session hooks"),
    (hvd.LocalGradientAggregationHelper, (), {}, r"not supported"),
    (hvd.reducescatter, (x,), {"op": hvd.Adasum}, r"Adasum"),
]:
    raises(NotImplementedError, pattern, fn, *args, **kw)
raises(jaxcache.MismatchError, r"shape", hvd.allgather, tf.ones([2, RANK + 1]), name="tf.trailing")
raises(ValueError, r"scalar", hvd.reducescatter, tf.constant(1.0))
raises(TypeError, r"splits must be integers", hvd.alltoall, x, splits=tf.ones([SIZE]))
check(hvd.allreduce(tf.ones(2), op=hvd.Sum, name="tf.after"), np.full(2, float(SIZE)), np.float32, "after")

# --- join: rank r runs r + 1 steps; an Average divides by the size (Horovod's rule) --------------
for step in range(RANK + 1):
    got = hvd.allreduce(tf.constant([float(RANK + 1)]), name="tf.join.avg")
    np.testing.assert_allclose(got.numpy()[0], np.sum(np.arange(step + 1, SIZE + 1)) / SIZE, rtol=1e-6)
    assert hvd.allgather(tf.constant([RANK]), name="tf.join.ag").numpy().tolist() == list(range(step, SIZE))
    if step:  # rank 0 has joined: reducescatter keeps working, alltoall and its broadcasts fail
        check(hvd.reducescatter(tf.fill([SIZE], float(RANK)), op=hvd.Sum, name="tf.join.rs"),
              np.array([float(sum(range(step, SIZE)))]), np.float32, "reducescatter while joined", same=False)
        bc = hvd.broadcast(tf.range(3) + RANK, root_rank=SIZE - 1, name="tf.join.bc")
        assert bc.numpy().tolist() == [SIZE - 1, SIZE, SIZE + 1]
        raises(jaxcache.CollectiveError, r"tf.join.bc0.*root, rank 0, has joined", hvd.broadcast, tf.ones(2), 0,
               name="tf.join.bc0")
        raises(jaxcache.CollectiveError, r"tf.join.a2a.*joined", hvd.alltoall, tf.ones(SIZE), name="tf.join.a2a")
last = hvd.join()
assert isinstance(last, tf.Tensor) and last.dtype == tf.int32 and int(last) == SIZE - 1, last
check(hvd.allreduce(tf.ones(2), op=hvd.Sum, name="tf.after.join"), np.full(2, float(SIZE)), np.float32,
      "every rank takes part again after join")

done("horovod_tf_api")
hvd.shutdown()
