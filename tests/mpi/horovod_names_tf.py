"""Every name of docs/horovod.md's horovod.tensorflow, horovod.tensorflow.keras (and their
callbacks / elastic) tables, called the way a Horovod user calls it, with its effect checked
against mpi4py and NumPy (2+ ranks). One process for both modules (TensorFlow's import is the
slow part): jaxcache.tensorflow is initialized, checked and shut down, then
jaxcache.tensorflow.keras. See horovod_names_torch.py for the bookkeeping (_names_coverage.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _names_coverage import COMM, NODE, Coverage, raises  # noqa: E402

import jaxcache  # noqa: E402
import jaxcache.tensorflow as tfh  # noqa: E402
import jaxcache.tensorflow.keras as kh  # noqa: E402

RANK, SIZE = COMM.rank, COMM.size
TF, TFE = "horovod.tensorflow", "horovod.tensorflow.elastic"
K, KC, KE = "horovod.tensorflow.keras", "horovod.tensorflow.keras.callbacks", "horovod.tensorflow.keras.elastic"
cov = Coverage({TF: tfh, TFE: tfh.elastic, K: kh, KC: kh.callbacks, KE: kh.elastic})
covered = cov.covered
node = NODE
ROOT = SIZE - 1


def data(seed: int, shape, r: int = RANK, dtype=np.float64) -> np.ndarray:
    """Rank r's input: every rank can compute every other rank's."""
    return (np.random.default_rng(1000 * seed + r).standard_normal(shape) * 2).astype(dtype)


def every(seed: int, shape, dtype=np.float64) -> np.ndarray:
    return np.stack([data(seed, shape, r, dtype) for r in range(SIZE)])


def close(actual, expected, what, tol=1e-12):
    a = np.asarray(actual.numpy() if hasattr(actual, "numpy") else actual)
    assert a.shape == np.shape(expected), f"{what}: shape {a.shape} != {np.shape(expected)}"
    np.testing.assert_allclose(a.astype(np.float64), expected, rtol=tol, atol=tol, err_msg=what)


def my_rows(n: int) -> slice:
    """This rank's rows of an n-row reducescatter (Horovod's split)."""
    lo = sum(n // SIZE + (q < n % SIZE) for q in range(RANK))
    return slice(lo, lo + n // SIZE + (RANK < n % SIZE))


def process_sets(S: str, hvd, first) -> None:
    g = hvd.global_process_set
    assert (g.process_set_id, g.ranks, g.size(), g.rank(), g.included()) == (0, list(range(SIZE)), SIZE, RANK, True)
    assert hvd.remove_process_set(g) is False
    covered(S, "global_process_set")
    assert hvd.ProcessSet is jaxcache.ProcessSet
    everyone = hvd.ProcessSet(range(SIZE))
    close(tfh.allreduce(tf.ones(2), op=tfh.Sum, process_set=everyone), np.full(2, float(SIZE)),
          "allreduce over ProcessSet(range(size))")
    covered(S, "ProcessSet")
    last = hvd.add_process_set(hvd.ProcessSet([SIZE - 1]))
    assert isinstance(last, jaxcache.ProcessSet) and last.process_set_id not in (None, 0)
    assert last.ranks == [SIZE - 1] and last.included() is (RANK == SIZE - 1)
    if RANK == SIZE - 1:
        close(tfh.allreduce(tf.fill([2], 3.0), op=tfh.Sum, process_set=last), np.full(2, 3.0), "1-rank set")
    else:
        raises(ValueError, tfh.allreduce, tf.ones(2), process_set=last)
    raises(ValueError, hvd.add_process_set, [SIZE - 1])  # the same ranks again
    covered(S, "add_process_set")
    for ps in (last, first):
        assert hvd.remove_process_set(ps) is True and ps.process_set_id is None
        raises(ValueError, tfh.allreduce, tf.ones(2), process_set=ps)
    covered(S, "remove_process_set")


def timeline(S: str, hvd) -> None:
    path = os.path.join(COMM.bcast(tempfile.mkdtemp(prefix="jc-names-") if RANK == 0 else None), "tl.json")
    hvd.start_timeline(path)
    tfh.allreduce(tf.ones(2), name=f"{S}.tl.in")
    hvd.stop_timeline()
    tfh.allreduce(tf.ones(2), name=f"{S}.tl.out")
    COMM.Barrier()
    if RANK == 0:
        with open(path) as fh:
            tracks = {e["args"]["name"] for e in json.load(fh) if e.get("name") == "process_name"}
        assert tracks == {f"{S}.tl.in"}, tracks
        shutil.rmtree(os.path.dirname(path))
    covered(S, "start_timeline", "stop_timeline")


def fp16_allreduce(S: str, hvd, allreduce) -> None:
    f = tf.fill([8], np.float32(1.0 + 2 ** -13) * (RANK + 1))  # not exact in fp16
    wire, ctx = hvd.Compression.fp16.compress(f)
    assert wire.dtype == tf.float16 and hvd.Compression.fp16.decompress(wire, ctx).dtype == tf.float32
    assert hvd.Compression.none.compress(f)[0] is f
    out = allreduce(f, op=hvd.Sum, compression=hvd.Compression.fp16)
    exact = float(sum(r + 1 for r in range(SIZE))) * (1.0 + 2 ** -13)
    assert out.dtype == tf.float32 and float(out[0]) != np.float32(exact), "fp16 did not round"
    close(out, np.full(8, exact), f"{S} allreduce fp16", tol=2e-3)
    covered(S, "Compression")


def graph_broadcast_global_variables(S: str, hvd) -> None:
    """Eagerly a RuntimeError (as Horovod); in a TensorFlow 1 graph, root's values."""
    raises(RuntimeError, hvd.broadcast_global_variables, 0)
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.Variable(np.full(3, float(RANK)), use_resource=True)
        op = hvd.broadcast_global_variables(ROOT)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(op)
            assert session.run(v).tolist() == [float(ROOT)] * 3
    covered(S, "broadcast_global_variables")


def weights_of(variables) -> list[np.ndarray]:
    return [np.array(v.numpy(), copy=True) for v in variables]


def same_everywhere(arrays: list[np.ndarray]) -> bool:
    mine = b"".join(a.tobytes() for a in arrays)
    return COMM.allgather(mine) == [mine] * SIZE


def rank_model(lr: float):
    """A model (and compiled optimizer) that differs per rank."""
    keras.utils.set_random_seed(RANK)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(optimizer=kh.DistributedOptimizer(keras.optimizers.SGD(lr * (RANK + 1), momentum=0.9)), loss="mse")
    return m


def tensorflow_elastic_checks() -> None:
    """Plain mpirun (no driver): run() syncs the state from rank 0, then calls the function."""
    hvd = tfh
    calls = []

    @hvd.elastic.run
    def train(state, k):
        calls.append(k)
        return state

    obj = train(hvd.elastic.ObjectState(epoch=RANK, items=[RANK]), 1)
    assert (obj.epoch, obj.items) == (0, [0])
    obj.epoch = 4
    obj.commit()
    obj.epoch = 5
    obj.restore()
    assert obj.epoch == 4
    covered(TFE, "ObjectState")

    var = tf.Variable(np.full(3, float(RANK)))
    tstate = train(hvd.elastic.TensorFlowState([var], step=RANK), 2)
    assert var.numpy().tolist() == [0.0] * 3 and tstate.step == 0
    var.assign([1.0, 2.0, 3.0])
    tstate.commit()
    var.assign([9.0, 9.0, 9.0])
    tstate.restore()
    assert var.numpy().tolist() == [1.0, 2.0, 3.0]
    covered(TFE, "TensorFlowState")

    model = rank_model(0.1)
    kstate = train(hvd.elastic.TensorFlowKerasState(model, batch=RANK), 3)
    assert kstate.batch == 0 and same_everywhere(weights_of(model.variables))
    assert same_everywhere(weights_of(model.optimizer.variables))
    assert abs(float(model.optimizer.learning_rate.numpy()) - 0.1) < 1e-7  # rank 0's
    saved = weights_of(model.variables)
    model.variables[0].assign(model.variables[0] + 1.0)
    kstate.restore()
    assert all(np.array_equal(a, b) for a, b in zip(saved, weights_of(model.variables)))
    assert calls == [1, 2, 3]
    covered(TFE, "TensorFlowKerasState", "run")
    covered(TF, "elastic")


def keras_elastic_checks() -> None:
    hvd = kh
    model = rank_model(0.05)
    state = hvd.elastic.KerasState(model, epoch=RANK, batch=0)

    @hvd.elastic.run
    def train(state):
        return state.epoch

    assert train(state) == 0 and same_everywhere(weights_of(model.variables))
    covered(KE, "run")
    covered(K, "elastic")
    saved = weights_of(model.variables)
    model.variables[0].assign(model.variables[0] * 2.0)
    state.restore()
    assert all(np.array_equal(a, b) for a, b in zip(saved, weights_of(model.variables)))
    covered(KE, "KerasState")

    commits, batches = [], []
    commit = state.commit
    state.commit = lambda: (commits.append((state.epoch, state.batch)), commit())

    class Seen(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batches.append(state.batch)

    state.epoch = 2
    x, y = data(40, (8, 3), dtype=np.float32), data(41, (8, 2), dtype=np.float32)
    model.fit(x, y, batch_size=2, epochs=2, verbose=0,
              callbacks=[hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.CommitStateCallback(state, batches_per_commit=3), Seen()])
    assert batches == [1, 2, 3, 4] * 2, batches
    covered(KE, "UpdateBatchStateCallback")
    assert state.epoch == 4
    covered(KE, "UpdateEpochStateCallback")
    # every 3rd batch (counted across epochs, as Horovod) and at each epoch's end
    assert commits == [(2, 3), (3, 0), (3, 2), (4, 0)], commits
    fitted = weights_of(model.variables)
    model.variables[0].assign(model.variables[0] + 1.0)
    state.restore()
    assert all(np.array_equal(a, b) for a, b in zip(fitted, weights_of(model.variables)))
    covered(KE, "CommitStateCallback")


def check_tensorflow() -> None:
    hvd = tfh
    # --- before init: Horovod's -1 for "not initialized" ---------------------------------------
    assert int(hvd.process_set_included_op()) == -1
    first = cov.check_process_api(TF, hvd)

    @tf.function
    def queried():
        return (hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(), hvd.local_size_op(),
                hvd.process_set_included_op(), hvd.size_op(process_set_id=first.process_set_id),
                hvd.process_set_included_op(first.process_set_id), hvd.size_op(process_set_id=99),
                hvd.process_set_included_op(99))

    got = [int(t) for t in queried()]
    assert got == [RANK, SIZE, node.rank, node.size, 1, 1, int(RANK == 0), -3, -3], got
    covered(TF, "rank_op", "size_op", "local_rank_op", "local_size_op", "process_set_included_op")
    process_sets(TF, hvd, first)
    timeline(TF, hvd)

    # --- reduce ops and Horovod's helpers -----------------------------------------------------------
    xs = every(1, (3, 2))
    for name, value, expect in (("Average", 0, xs.mean(0)), ("Sum", 1, xs.sum(0)), ("Min", 3, xs.min(0)),
                                ("Max", 4, xs.max(0)), ("Product", 5, xs.prod(0))):
        op = getattr(hvd, name)
        assert int(op) == value, f"{name} = {op!r}"
        close(hvd.allreduce(tf.constant(data(1, (3, 2))), op=op, name=f"op.{name}"), expect, f"op={name}")
        covered(TF, name)
    assert int(hvd.Adasum) == 2
    raises(NotImplementedError, hvd.allreduce, tf.ones(2), op=hvd.Adasum)
    covered(TF, "Adasum")
    assert hvd.handle_average_backwards_compatibility(None, None) == hvd.Average
    assert hvd.handle_average_backwards_compatibility(hvd.Max, None) == hvd.Max
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert hvd.handle_average_backwards_compatibility(None, False) == hvd.Sum
        assert hvd.handle_average_backwards_compatibility(None, True) == hvd.Average
    assert any(issubclass(x.category, DeprecationWarning) for x in w), "average= must warn"
    raises(ValueError, hvd.handle_average_backwards_compatibility, hvd.Sum, True)
    covered(TF, "handle_average_backwards_compatibility")
    assert [hvd.check_num_rank_power_of_2(n) for n in (1, 2, 3, 4, 6, 8)] == [True, True, False, True, False, True]
    covered(TF, "check_num_rank_power_of_2")

    # --- collectives ------------------------------------------------------------------------------------
    x = tf.constant(data(2, (4,)))
    xs = every(2, (4,))
    close(hvd.allreduce(x), xs.mean(0), "allreduce default Average")
    close(hvd.allreduce(tf.Variable(x), op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0), xs.sum(0) * 1.5,
          "allreduce of a variable, scaled")
    idx = [np.array([(r + k) % 5 for k in range(r + 1)], np.int64) for r in range(SIZE)]
    val = [data(3, (r + 1, 2), r) for r in range(SIZE)]
    mine = tf.IndexedSlices(tf.constant(val[RANK]), tf.constant(idx[RANK]), tf.constant([5, 2], tf.int64))
    got = hvd.allreduce(mine, op=hvd.Sum)
    assert isinstance(got, tf.IndexedSlices), type(got)
    dense = np.zeros((5, 2))
    for i, v in zip(idx, val):
        np.add.at(dense, i, v)
    close(tf.convert_to_tensor(got), dense, "allreduce of IndexedSlices")
    covered(TF, "allreduce")
    gs = [data(4 + i, (i + 1, 2)) for i in range(2)]
    outs = hvd.grouped_allreduce([tf.constant(g) for g in gs], op=hvd.Max)
    assert isinstance(outs, list) and len(outs) == 2
    for i, o in enumerate(outs):
        close(o, every(4 + i, (i + 1, 2)).max(0), f"grouped_allreduce[{i}]")
    covered(TF, "grouped_allreduce")

    parts = [data(10, (r + 1, 2), r) for r in range(SIZE)]
    close(hvd.allgather(tf.constant(parts[RANK])), np.concatenate(parts), "allgather (uneven)")
    covered(TF, "allgather")
    other = [np.full((SIZE - r,), float(r)) for r in range(SIZE)]
    a, b = hvd.grouped_allgather([tf.constant(parts[RANK]), tf.constant(other[RANK])])
    close(a, np.concatenate(parts), "grouped_allgather[0]")
    close(b, np.concatenate(other), "grouped_allgather[1]")
    covered(TF, "grouped_allgather")
    close(hvd.broadcast(tf.constant(data(11, (2, 3))), ROOT), data(11, (2, 3), ROOT), "broadcast")
    close(hvd.broadcast(tf.constant(data(11, (2, 3)))), data(11, (2, 3), 0), "broadcast default root 0")
    covered(TF, "broadcast")
    vs = [tf.Variable(data(12, (2,))), tf.Variable(np.arange(3) + RANK)]
    new = hvd.broadcast_(vs, ROOT)
    close(vs[0], data(12, (2,), ROOT), "broadcast_ assigned")
    close(vs[1], np.arange(3) + ROOT, "broadcast_ assigned (int)")
    close(new[0], data(12, (2,), ROOT), "broadcast_ returned")
    covered(TF, "broadcast_")
    vs = [tf.Variable(data(13, (3,))), tf.Variable(data(14, (1, 2)))]
    hvd.broadcast_variables(vs, root_rank=ROOT)
    close(vs[0], data(13, (3,), ROOT), "broadcast_variables[0]")
    close(vs[1], data(14, (1, 2), ROOT), "broadcast_variables[1]")
    covered(TF, "broadcast_variables")

    splits = [[(q + d) % 3 + 1 for d in range(SIZE)] for q in range(SIZE)]
    sent = [data(15, (sum(splits[q]), 2), q) for q in range(SIZE)]
    expect = np.concatenate([np.split(sent[q], np.cumsum(splits[q])[:-1])[RANK] for q in range(SIZE)])
    out, received = hvd.alltoall(tf.constant(sent[RANK]), splits=splits[RANK])
    close(out, expect, "alltoall")
    assert received.dtype == tf.int32 and received.numpy().tolist() == [splits[q][RANK] for q in range(SIZE)]
    even = [data(16, (2 * SIZE,), q) for q in range(SIZE)]
    close(hvd.alltoall(tf.constant(even[RANK])), np.concatenate([e[2 * RANK:2 * RANK + 2] for e in even]),
          "alltoall equal blocks")
    covered(TF, "alltoall")
    rows = 2 * SIZE + 1
    xs = every(17, (rows, 2))
    close(hvd.reducescatter(tf.constant(data(17, (rows, 2)))), xs.mean(0)[my_rows(rows)], "reducescatter Average")
    close(hvd.reducescatter(tf.constant(data(17, (rows, 2))), op=hvd.Sum), xs.sum(0)[my_rows(rows)],
          "reducescatter Sum")
    covered(TF, "reducescatter")
    a, b = hvd.grouped_reducescatter([tf.constant(data(17, (rows, 2))), tf.constant(data(18, (rows,)))],
                                     op=hvd.Sum)
    close(a, xs.sum(0)[my_rows(rows)], "grouped_reducescatter[0]")
    close(b, every(18, (rows,)).sum(0)[my_rows(rows)], "grouped_reducescatter[1]")
    covered(TF, "grouped_reducescatter")
    fp16_allreduce(TF, hvd, hvd.allreduce)

    # --- objects ------------------------------------------------------------------------------------------
    assert hvd.allgather_object({"r": RANK, "pad": "x" * RANK}) == [{"r": r, "pad": "x" * r} for r in range(SIZE)]
    covered(TF, "allgather_object")
    assert hvd.broadcast_object(("cfg", RANK), root_rank=ROOT) == ("cfg", ROOT)
    covered(TF, "broadcast_object")
    fn = hvd.broadcast_object_fn(root_rank=ROOT)
    assert fn([RANK]) == [ROOT] and fn({"again": RANK}) == {"again": ROOT}
    covered(TF, "broadcast_object_fn")
    graph_broadcast_global_variables(TF, hvd)

    # --- gradients --------------------------------------------------------------------------------------------
    coef = every(20, (3,))  # rank r's loss: sum(coef[r] * v**2) / 2, so its gradient is coef[r] * v
    v0 = np.array([1.0, -2.0, 0.5])
    v = tf.Variable(v0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.constant(coef[RANK]) * v * v) / 2
    close(hvd.DistributedGradientTape(tape).gradient(loss, v), coef.mean(0) * v0, "DistributedGradientTape")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.constant(coef[RANK]) * v * v) / 2
    close(hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(loss, [v])[0], coef.sum(0) * v0,
          "DistributedGradientTape op=Sum")
    covered(TF, "DistributedGradientTape")

    shared, local = keras.layers.Dense(1, use_bias=False), keras.layers.Dense(1, use_bias=False)
    for layer in (shared, local):
        layer.build((None, 2))
        layer.kernel.assign(np.ones((2, 1), np.float32))
    xb = [data(21, (3, 2), r, np.float32) for r in range(SIZE)]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared(xb[RANK])) + tf.reduce_sum(local(xb[RANK]))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
    g_shared, g_local = tape.gradient(loss, [shared.kernel, local.kernel])
    colsum = np.stack([x.sum(0) for x in xb])[:, :, None]
    close(g_shared, colsum.mean(0), "PartialDistributedGradientTape: averaged", tol=1e-5)
    close(g_local, colsum[RANK] / SIZE, "PartialDistributedGradientTape: local (scaled by 1/size)", tol=1e-5)
    covered(TF, "PartialDistributedGradientTape")

    v = tf.Variable(v0)
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
    opt.minimize(lambda: tf.reduce_sum(tf.constant(coef[RANK]) * v * v) / 2, var_list=[v])
    close(v, v0 - 0.5 * coef.mean(0) * v0, "DistributedOptimizer (tf.compat.v1.train)")
    w = keras.Variable(v0)
    kopt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.5))
    assert isinstance(kopt, keras.optimizers.SGD)
    kopt.apply_gradients([(tf.constant(coef[RANK] * v0), w)])
    close(w, v0 - 0.5 * coef.mean(0) * v0, "DistributedOptimizer (Keras)")
    covered(TF, "DistributedOptimizer")

    per = 4
    full = np.concatenate([data(22, (per, 5), r, np.float32) for r in range(SIZE)])
    sbn, bn = hvd.SyncBatchNormalization(momentum=0.5), keras.layers.BatchNormalization(momentum=0.5)
    for layer in (sbn, bn):
        layer.build((None, 5))
    out = sbn(tf.constant(full[RANK * per:(RANK + 1) * per]), training=True)
    ref = bn(tf.constant(full), training=True)
    close(out, ref.numpy()[RANK * per:(RANK + 1) * per], "SyncBatchNormalization", tol=1e-4)
    close(sbn.moving_mean, bn.moving_mean.numpy(), "SyncBatchNormalization moving_mean", tol=1e-5)
    covered(TF, "SyncBatchNormalization")

    # --- elastic (plain mpirun: no driver, so run() syncs the state from rank 0 and calls) --------------------
    tensorflow_elastic_checks()

    # --- join: rank r takes r + 1 steps; the others' sums go on without the joined ranks -------------------
    for step in range(RANK + 1):
        got = hvd.allreduce(tf.constant([float(RANK + 1)]), op=hvd.Sum, name="join.step")
        assert float(got[0]) == sum(q + 1 for q in range(step, SIZE)), (step, got)
    last = hvd.join()
    assert isinstance(last, tf.Tensor) and last.dtype == tf.int32 and int(last) == SIZE - 1, last
    covered(TF, "join")

    # --- not supported ---------------------------------------------------------------------------------------
    raises(NotImplementedError, hvd.BroadcastGlobalVariablesHook, 0)
    covered(TF, "BroadcastGlobalVariablesHook")
    raises(NotImplementedError, hvd.LocalGradientAggregationHelper)
    covered(TF, "LocalGradientAggregationHelper")

    hvd.shutdown()
    assert hvd.is_initialized() is False and hvd.mpi_enabled() is False
    raises(ValueError, hvd.rank)
    covered(TF, "shutdown", "is_initialized")


class Logs(keras.callbacks.Callback):
    """Records the epoch's logs as the callbacks before it left them."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))


def check_keras() -> None:
    hvd = kh
    first = cov.check_process_api(K, hvd, homogeneous=False)
    process_sets(K, hvd, first)
    timeline(K, hvd)

    # --- value helpers ---------------------------------------------------------------------------------------
    assert (int(hvd.Average), int(hvd.Sum)) == (0, 1)
    close(hvd.allreduce([1.0, float(RANK)]), [1.0, (SIZE - 1) / 2], "keras allreduce default Average")
    close(hvd.allreduce([1.0, float(RANK)], op=hvd.Average), [1.0, (SIZE - 1) / 2], "keras allreduce Average")
    covered(K, "Average")
    close(hvd.allreduce(float(RANK), op=hvd.Sum), sum(range(SIZE)), "keras allreduce Sum")
    covered(K, "Sum")
    close(hvd.allreduce(data(30, (2,)), name="keras.ar", prescale_factor=2.0), 2 * every(30, (2,)).mean(0),
          "keras allreduce scaled")
    covered(K, "allreduce")
    assert hvd.allgather([RANK] * (RANK + 1)).numpy().tolist() == [r for r in range(SIZE) for _ in range(r + 1)]
    covered(K, "allgather")
    assert hvd.broadcast([RANK, 7], root_rank=ROOT).numpy().tolist() == [ROOT, 7]
    covered(K, "broadcast")
    rows = 2 * SIZE + 1
    close(hvd.reducescatter(data(31, (rows,))), every(31, (rows,)).mean(0)[my_rows(rows)], "keras reducescatter")
    close(hvd.reducescatter(data(31, (rows,)), op=hvd.Sum), every(31, (rows,)).sum(0)[my_rows(rows)],
          "keras reducescatter Sum")
    covered(K, "reducescatter")
    fp16_allreduce(K, hvd, lambda t, **kw: hvd.allreduce(t, **kw))
    graph_broadcast_global_variables(K, hvd)

    # --- DistributedOptimizer, alone and in model.fit with the broadcast and metric callbacks -----------
    coef = every(32, (3,))
    v0 = np.array([1.0, -2.0, 0.5], np.float32)
    w = keras.Variable(v0)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.5))
    assert isinstance(opt, keras.optimizers.SGD) and type(opt).__name__ == "SGD"
    opt.apply_gradients([(tf.constant((coef[RANK] * v0).astype(np.float32)), w)])
    close(w, v0 - 0.5 * coef.mean(0) * v0, "keras DistributedOptimizer", tol=1e-6)

    keras.utils.set_random_seed(100 + RANK)  # different initial weights on every rank
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="tanh"), keras.layers.Dense(1)])
    assert not np.array_equal(COMM.allgather(model.get_weights()[0])[0], COMM.allgather(model.get_weights()[0])[-1])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x, y = data(33, (8, 3), dtype=np.float32), data(34, (8, 1), dtype=np.float32)  # different on every rank
    raw, averaged = Logs(), Logs()
    history = model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), raw,
                                   hvd.callbacks.MetricAverageCallback(), averaged])
    for i, wt in enumerate(model.get_weights()):  # rank 0's start, the same averaged steps everywhere
        assert all(np.array_equal(wt, o) for o in COMM.allgather(wt)), f"weights {i} differ between ranks"
    covered(K, "DistributedOptimizer")
    cb = hvd.callbacks.BroadcastGlobalVariablesCallback(ROOT)
    keras.utils.set_random_seed(200 + RANK)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    before = COMM.allgather(m.get_weights())
    cb.set_model(m)
    cb.on_train_begin()
    for wt, r in zip(m.get_weights(), before[ROOT]):
        np.testing.assert_array_equal(wt, r)
    covered(KC, "BroadcastGlobalVariablesCallback")
    losses = COMM.allgather(raw.epochs[0]["loss"])
    assert SIZE == 1 or len(set(losses)) > 1, "the ranks' raw losses should differ"
    np.testing.assert_allclose(averaged.epochs[0]["loss"], np.mean(losses), rtol=1e-12)
    np.testing.assert_allclose(history.history["loss"][0], np.mean(losses), rtol=1e-12)
    logs = {"loss": float(RANK + 1), "acc": 0.5 * RANK}
    hvd.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    np.testing.assert_allclose([logs["loss"], logs["acc"]], [(SIZE + 1) / 2, 0.25 * (SIZE - 1)], rtol=1e-12)
    covered(KC, "MetricAverageCallback")

    # --- learning-rate callbacks, driven the way model.fit drives them ---------------------------------
    def lrs(cb, model, epochs, steps):
        cb.set_model(model)
        cb.on_train_begin()
        seen = []
        for epoch in range(epochs):
            cb.on_epoch_begin(epoch)
            for batch in range(steps):
                cb.on_train_batch_begin(batch)
                seen.append((float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
                             float(model.optimizer.momentum)))
                cb.on_train_batch_end(batch)
            logs = {}
            cb.on_epoch_end(epoch, logs)
            seen.append(logs.get("lr"))
        return seen

    m.compile(optimizer=keras.optimizers.SGD(0.3, momentum=0.9), loss="mse")
    seen = lrs(hvd.callbacks.LearningRateScheduleCallback(0.2, 0.5, start_epoch=1, end_epoch=3), m, 4, 1)
    lr_at = [s[0] for s in seen[0::2]]
    np.testing.assert_allclose(lr_at, [0.3, 0.2, 0.1, 0.1], rtol=1e-6)
    np.testing.assert_allclose(seen[2][1], 0.9 * 0.2 / 0.3, rtol=1e-6)  # momentum correction in the batch
    assert float(m.optimizer.momentum) == 0.9  # restored after it
    covered(KC, "LearningRateScheduleCallback")
    m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    seen = lrs(hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2, steps_per_epoch=4), m, 2, 4)
    expected = [0.1 / SIZE * ((e + (b + 1) / 4) * (SIZE - 1) / 2 + 1) for e in range(2) for b in range(4)]
    np.testing.assert_allclose([s[0] for s in seen if isinstance(s, tuple)], expected, rtol=1e-6)
    np.testing.assert_allclose(expected[-1], 0.1, rtol=1e-12)
    np.testing.assert_allclose([s for s in seen if not isinstance(s, tuple)], [expected[3], expected[7]], rtol=1e-6)
    covered(KC, "LearningRateWarmupCallback")
    raises(NotImplementedError, hvd.callbacks.BestModelCheckpoint)
    covered(KC, "BestModelCheckpoint")
    covered(K, "callbacks")

    # --- load_model: the saved optimizer comes back distributed ------------------------------------------
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False)])
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5)), loss="mse")
    m.optimizer.build(m.trainable_variables)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        m.save(path)
        loaded = hvd.load_model(path)
    assert type(loaded.optimizer).__name__ == "SGD" and abs(float(loaded.optimizer.momentum) - 0.5) < 1e-9
    k0 = loaded.trainable_variables[0].numpy()
    loaded.optimizer.apply_gradients([(tf.constant(np.full((3, 1), RANK + 1.0, np.float32)),
                                       loaded.trainable_variables[0])])
    close(loaded.trainable_variables[0], k0 - 0.05 * (SIZE + 1) / 2, "load_model's optimizer averages", tol=1e-6)
    covered(K, "load_model")
    raises(NotImplementedError, hvd.load_model, "x.keras", legacy_opts=True)

    keras_elastic_checks()

    hvd.shutdown()
    assert hvd.is_initialized() is False and hvd.mpi_enabled() is False
    raises(ValueError, hvd.rank)
    covered(K, "shutdown", "is_initialized")


def checks() -> None:
    check_tensorflow()
    COMM.Barrier()
    check_keras()


cov.run(checks)
