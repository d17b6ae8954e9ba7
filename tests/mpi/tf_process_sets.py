"""Process sets in the TensorFlow bridge (3 or 4 ranks): `import jaxcache.tensorflow as hvd`
and `jaxcache.tensorflow.keras` with Horovod's process-set API. Two disjoint sets A = {0, 1}
and B = {2, ...} registered with add_process_set after init(process_sets="dynamic") run the
same collectives under the SAME names, eagerly and inside tf.function: allreduce (dense and
IndexedSlices), grouped_allreduce, allgather (uneven), broadcast / broadcast_ /
broadcast_variables (root given as a global rank), alltoall, reducescatter, the object
collectives, the gradients of the differentiable collectives, size_op /
process_set_included_op, DistributedGradientTape, the Keras DistributedOptimizer (model.fit
against single-process training on the set's batch) and SyncBatchNormalization. Results are
checked against NumPy over the set's ranks only and must be bitwise identical within the
set; non-members and unregistered sets raise ValueError without holding up the others.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _util import COMM, done, raises  # noqa: E402

import jaxcache  # noqa: E402
import jaxcache.tensorflow as hvd  # noqa: E402
import jaxcache.tensorflow.keras as hvdk  # noqa: E402

RANK, SIZE = COMM.rank, COMM.size
assert SIZE in (3, 4), "run on 3 or 4 ranks"

hvd.init(process_sets="dynamic")  # Horovod's switch for adding sets later (always allowed here)
A = hvd.add_process_set([0, 1])
B = hvd.add_process_set(hvd.ProcessSet(range(2, SIZE)))
assert isinstance(A, jaxcache.ProcessSet) and hvdk.ProcessSet is hvd.ProcessSet is jaxcache.ProcessSet
assert (A.process_set_id, B.process_set_id) == (1, 2), (A, B)
MINE, OTHER = (A, B) if RANK < 2 else (B, A)
MEMBERS, N, ME = MINE.ranks, MINE.size(), MINE.rank()
assert MEMBERS[ME] == RANK and MINE.included() and not OTHER.included()
SUB = COMM.Split(0 if RANK < 2 else 1, RANK)  # the same ranks, for checking results only


def data(seed: int, r: int, shape, dtype=np.float64) -> np.ndarray:
    """Global rank r's input (every rank can compute every rank's)."""
    rng = np.random.default_rng(1000 * seed + r)
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(shape) * 3).astype(dtype)
    return rng.integers(-5, 6, shape).astype(dtype)


def over_set(seed: int, shape, dtype=np.float64) -> np.ndarray:
    return np.stack([data(seed, r, shape, dtype) for r in MEMBERS])


def same_in_set(value, what: str) -> None:
    raw = np.ascontiguousarray(np.asarray(value)).tobytes()
    for r, other in zip(MEMBERS, SUB.allgather(raw)):
        assert other == raw, f"{what}: rank {RANK} and rank {r} differ"


def check(t, expected, what: str, tol=1e-12, same=True) -> None:
    got = t.numpy() if hasattr(t, "numpy") else np.asarray(t)
    assert got.shape == np.shape(expected), f"{what}: shape {got.shape} != {np.shape(expected)}"
    if same:
        same_in_set(got, what)
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tol, atol=tol, err_msg=what)


# --- queries -----------------------------------------------------------------------------------
@tf.function
def queried():
    return (hvd.size_op(process_set_id=MINE.process_set_id), hvd.process_set_included_op(MINE.process_set_id),
            hvd.process_set_included_op(OTHER.process_set_id), hvd.size_op(process_set_id=99),
            hvd.process_set_included_op(99))


assert [int(v) for v in queried()] == [N, 1, 0, -3, -3], queried()

# --- allreduce, eagerly and inside tf.function; same names in both sets -------------------------
REF = {hvd.Average: lambda s: s.mean(0), hvd.Sum: lambda s: s.sum(0), hvd.Min: lambda s: s.min(0),
       hvd.Max: lambda s: s.max(0), hvd.Product: lambda s: s.prod(0)}
for i, (op, ref) in enumerate(REF.items()):
    check(hvd.allreduce(tf.constant(data(i, RANK, (3, 4))), op=op, name=f"ps.allreduce.{op.name}",
                        process_set=MINE), ref(over_set(i, (3, 4))), f"allreduce {op.name}")


@tf.function
def reduce_in_graph(x, y):
    return (hvd.allreduce(x, op=hvd.Sum, process_set=MINE),
            hvd.grouped_allreduce([x, y], op=hvd.Average, prescale_factor=2.0, process_set=MINE),
            hvd.allreduce(x, op=hvd.Sum))  # a global one in the same program


s, (g0, g1), everyone = reduce_in_graph(tf.constant(data(10, RANK, (5,))), tf.constant(data(11, RANK, (2, 2))))
check(s, over_set(10, (5,)).sum(0), "allreduce in tf.function")
check(g0, over_set(10, (5,)).mean(0) * 2, "grouped_allreduce[0] in tf.function")
check(g1, over_set(11, (2, 2)).mean(0) * 2, "grouped_allreduce[1] in tf.function")
check(everyone, np.stack([data(10, r, (5,)) for r in range(SIZE)]).sum(0), "global allreduce next to it",
      same=False)
slices = tf.IndexedSlices(tf.constant(data(12, RANK, (RANK % 2 + 1, 3))),
                          tf.constant(np.arange(RANK % 2 + 1) + RANK, np.int64), tf.constant([8, 3], np.int64))
dense = hvd.allreduce(slices, op=hvd.Average, name="ps.slices", process_set=MINE)
assert isinstance(dense, tf.IndexedSlices)
expected = np.zeros((8, 3))
for r in MEMBERS:
    np.add.at(expected, np.arange(r % 2 + 1) + r, data(12, r, (r % 2 + 1, 3)) / N)
check(tf.convert_to_tensor(dense), expected, "allreduce of IndexedSlices (gathered in the set)")

# --- allgather (uneven), broadcast (global root), alltoall, reducescatter -----------------------
def rows_of(r: int) -> int:
    return 1 + (r * 7) % 3


gathered = np.concatenate([data(20, r, (rows_of(r), 2)) for r in MEMBERS])
check(hvd.allgather(tf.constant(data(20, RANK, (rows_of(RANK), 2))), name="ps.allgather", process_set=MINE),
      gathered, "allgather")


@tf.function
def gather_in_graph(x, y):
    return hvd.grouped_allgather([x, y], process_set=MINE)


g0, g1 = gather_in_graph(tf.constant(data(20, RANK, (rows_of(RANK), 2))), tf.constant(data(21, RANK, (2,))))
check(g0, gathered, "grouped_allgather[0] in tf.function")
check(g1, np.concatenate([data(21, r, (2,)) for r in MEMBERS]), "grouped_allgather[1] in tf.function")

root = MEMBERS[-1]
check(hvd.broadcast(tf.constant(data(30, RANK, (4,))), root_rank=root, name="ps.broadcast", process_set=MINE),
      data(30, root, (4,)), f"broadcast from global rank {root}")
v = [tf.Variable(data(31, RANK, (3,))), tf.Variable(data(32, RANK, (2, 2)))]
hvd.broadcast_variables(v, root_rank=MEMBERS[0], process_set=MINE)
check(v[0], data(31, MEMBERS[0], (3,)), "broadcast_variables[0]")
check(v[1], data(32, MEMBERS[0], (2, 2)), "broadcast_variables[1]")
w = [tf.Variable(data(33, RANK, (3,)))]
hvd.broadcast_(w, root_rank=root, name="ps.broadcast_", process_set=MINE)
check(w[0], data(33, root, (3,)), "broadcast_")
raises(ValueError, rf"root={OTHER.ranks[0]} is not a member of process set {MINE.process_set_id}",
       hvd.broadcast, tf.ones(2), root_rank=OTHER.ranks[0], process_set=MINE)


def sent(src: int, dst_set_rank: int) -> np.ndarray:
    """The rows global rank src sends to rank dst_set_rank of its set (values name both)."""
    k = MEMBERS.index(src) + dst_set_rank + 1
    return np.array([[src * 100 + dst_set_rank * 10 + j] for j in range(k)], np.float64)


send = tf.constant(np.concatenate([sent(RANK, j) for j in range(N)]))
splits = [ME + j + 1 for j in range(N)]
out, received = hvd.alltoall(send, splits=splits, name="ps.alltoall", process_set=MINE)
check(out, np.concatenate([sent(src, ME) for src in MEMBERS]), "alltoall", same=False)
assert received.numpy().tolist() == [i + ME + 1 for i in range(N)], received


@tf.function
def exchange_in_graph(x):
    return hvd.alltoall(x, process_set=MINE)


even = np.arange(2.0 * N).reshape(N, 2)
check(exchange_in_graph(tf.constant(even + 100 * RANK)), np.stack([even[ME] + 100 * src for src in MEMBERS]),
      "alltoall (equal blocks) in tf.function", same=False)

shape = (2 * N + 1, 3)
counts = [shape[0] // N + (1 if r < shape[0] % N else 0) for r in range(N)]
lo = sum(counts[:ME])
for op, ref in ((hvd.Sum, lambda s: s.sum(0)), (hvd.Average, lambda s: s.mean(0))):
    check(hvd.reducescatter(tf.constant(data(40, RANK, shape)), op=op, name=f"ps.rs.{op.name}", process_set=MINE),
          ref(over_set(40, shape))[lo:lo + counts[ME]], f"reducescatter {op.name}", same=False)
r0, r1 = hvd.grouped_reducescatter([tf.constant(data(41, RANK, (N, 2))), tf.constant(data(42, RANK, (2 * N,)))],
                                   op=hvd.Sum, process_set=MINE)
check(r0, over_set(41, (N, 2)).sum(0)[ME:ME + 1], "grouped_reducescatter[0]", same=False)
check(r1, over_set(42, (2 * N,)).sum(0)[2 * ME:2 * ME + 2], "grouped_reducescatter[1]", same=False)

# --- gradients run in the forward's set ---------------------------------------------------------
x = tf.Variable(data(50, RANK, (4,)))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum, name="ps.grad.ar", process_set=MINE) * data(51, RANK, (4,)))
check(tape.gradient(loss, x), over_set(51, (4,)).sum(0), "allreduce gradient")
x = tf.Variable(data(52, RANK, (rows_of(RANK), 2)))
total = sum(rows_of(r) for r in MEMBERS)
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hvd.allgather(x, name="ps.grad.ag", process_set=MINE) * data(53, RANK, (total, 2)))
offsets = np.cumsum([0] + [rows_of(r) for r in MEMBERS])
check(tape.gradient(loss, x), over_set(53, (total, 2)).mean(0)[offsets[ME]:offsets[ME + 1]],
      "allgather gradient", same=False)
x = tf.Variable(data(54, RANK, (2 * N, 2)))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hvd.reducescatter(x, op=hvd.Sum, name="ps.grad.rs", process_set=MINE)
                         * data(55, RANK, (2, 2)))
check(tape.gradient(loss, x), np.concatenate([data(55, r, (2, 2)) for r in MEMBERS]) * N,
      "reducescatter gradient (allgather times the set's size)")

# --- objects, barrier ---------------------------------------------------------------------------
assert hvd.broadcast_object({"from": RANK}, root_rank=root, process_set=MINE) == {"from": root}
assert hvd.broadcast_object_fn(root_rank=MEMBERS[0], process_set=MINE)(RANK) == MEMBERS[0]
assert hvd.allgather_object(RANK * 10, process_set=MINE) == [r * 10 for r in MEMBERS]
hvd.barrier(process_set=MINE)

# --- DistributedGradientTape on a set (tf.function): the mean over the set's ranks only ----------
W0 = data(60, 0, (4, 2))  # the same start on every rank


def loss_of(w, r, step):
    xb, yb = tf.constant(data(61 + step, r, (5, 4))), tf.constant(data(71 + step, r, (5, 2)))
    return tf.reduce_mean(tf.square(tf.tanh(xb @ w) - yb))


def local_grad(w_value, r, step) -> np.ndarray:
    w = tf.Variable(w_value)
    with tf.GradientTape() as tape:
        loss = loss_of(w, r, step)
    return tape.gradient(loss, w).numpy()


w = tf.Variable(W0)


@tf.function
def tape_step(step):
    with tf.GradientTape() as tape:
        loss = loss_of(w, RANK, step)
    grad, = hvd.DistributedGradientTape(tape, process_set=MINE).gradient(loss, [w])
    w.assign_sub(0.1 * grad)
    return grad


reference = W0.copy()
for step in range(3):
    expected = np.mean([local_grad(reference, r, step) for r in MEMBERS], 0)
    check(tape_step(step), expected, f"DistributedGradientTape step {step}", tol=1e-12)
    reference -= 0.1 * expected
    check(w, reference, f"weights after tape step {step}", tol=1e-12)
# Horovod's rule: outside the tape's set the gradient stays local.
w_a = tf.Variable(W0)
with tf.GradientTape() as tape:
    loss = loss_of(w_a, RANK, 0)
grad, = hvd.DistributedGradientTape(tape, process_set=A).gradient(loss, [w_a])
check(grad, np.mean([local_grad(W0, r, 0) for r in (A.ranks if A.included() else [RANK])], 0),
      "tape on set A (local outside it)", same=False)

# --- Keras DistributedOptimizer on a set: model.fit == single-process fit on the set's batch -----
PER, STEPS = 4, 3


def make_model():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(6, activation="tanh")(inputs)))


def batches(ranks):
    """The set's batches: step s holds every member's PER rows, in set order."""
    xs = [np.concatenate([data(80 + s, r, (PER, 4), np.float32) for r in ranks]) for s in range(STEPS)]
    ys = [np.concatenate([data(90 + s, r, (PER, 2), np.float32) for r in ranks]) for s in range(STEPS)]
    return np.concatenate(xs), np.concatenate(ys)


def fit(model, optimizer, x, y, batch_size):
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


reference = fit(make_model(), keras.optimizers.SGD(0.1, momentum=0.9), *batches(MEMBERS), PER * N)
mine = fit(make_model(), hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), process_set=MINE),
           *batches([RANK]), PER)
for k, (a, b) in enumerate(zip(mine, reference)):
    check(a, b.astype(np.float64), f"keras fit on the set: weight {k}", tol=2e-6)

# --- SyncBatchNormalization over a set equals BatchNormalization over the set's batch -----------
sbn = hvd.SyncBatchNormalization(process_set=MINE)
bn = keras.layers.BatchNormalization()
xs = [data(95, r, (3, 2), np.float32) for r in MEMBERS]
out = sbn(tf.constant(xs[ME]), training=True)
check(out, bn(tf.constant(np.concatenate(xs)), training=True).numpy()[3 * ME:3 * ME + 3].astype(np.float64),
      "SyncBatchNormalization over the set", tol=1e-5, same=False)

# --- non-members, unregistered sets: ValueError on the calling rank, nothing hangs ---------------
if RANK == SIZE - 1:  # B's last rank calls A's collectives while A's ranks go on
    refused = rf"rank {RANK} is not a member of process set {A.process_set_id} \(global ranks \[0, 1\]\)"
    x = tf.ones(2)
    for fn, args in [(hvd.allreduce, (x,)), (hvd.grouped_allreduce, ([x],)), (hvd.allgather, (x,)),
                     (hvd.broadcast, (x, 0)), (hvd.broadcast_variables, ([tf.Variable(x)], 0)),
                     (hvd.alltoall, (x,)), (hvd.reducescatter, (x,)), (hvd.broadcast_object, (1, 0)),
                     (hvd.allgather_object, (1,)), (hvd.barrier, ())]:
        raises(ValueError, refused, fn, *args, process_set=A)
    raises(ValueError, refused, tf.function(lambda t: hvd.allreduce(t, process_set=A)), x)  # at trace time
elif RANK in A.ranks:
    check(hvd.allreduce(tf.ones(2), op=hvd.Sum, name="ps.meanwhile", process_set=A), np.full(2, 2.0),
          "A keeps working while a non-member is refused")
raises(ValueError, r"is not registered", hvd.allreduce, tf.ones(2), process_set=hvd.ProcessSet([0, 2]))
check(hvd.allreduce(tf.ones(2), op=hvd.Sum, name="ps.after"), np.full(2, float(SIZE)),
      "the runtime keeps working after the refusals", same=False)
assert hvd.remove_process_set(B) is True and B.process_set_id is None
assert int(hvd.process_set_included_op(2)) == -3 and hvd.remove_process_set(B) is False
done("tf_process_sets")
hvd.shutdown()
