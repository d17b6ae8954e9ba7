"""send, recv, sendrecv against NumPy on every rank: every dtype and shape around a ring, eager
and jit; ANY_SOURCE with an mpi4py Status; messages paired in program order whatever order
XLA could start them in (same tag twice, receive-then-send against send-then-receive, with
independent collectives in between), 200 iterations; large messages (payload on the data
channel) against small ones (inline: one message each, by counter); vmap, grad and jvp;
a process set; mismatched dtype/shape raising MismatchError on the receiver, bad arguments
raising locally, the runtime usable afterwards."""

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from mpi4py import MPI  # noqa: E402

import jaxcache as jc  # noqa: E402
from _reference import COMPLEX, FLOATS, INTS, SHAPES  # noqa: E402
from _util import COMM, done, raises, same_on_all_ranks  # noqa: E402

jc.init()
rank, size = jc.rank(), jc.size()
right, left = (rank + 1) % size, (rank - 1) % size


def value(r, dtype, shape, salt=0):
    """Rank r's message: every rank can build every rank's."""
    rng = np.random.default_rng([r, salt, len(shape)])
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 100, size=shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def same_bits(got, expected, what):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape, f"{what}: {got.dtype}{got.shape}"
    assert got.tobytes() == expected.tobytes(), f"{what}: wrong data"


# 1. A ring of sendrecv, every dtype and shape, eager and jit: bitwise the left neighbour's.
ring = jax.jit(lambda x: jc.sendrecv(x, x, source=left, dest=right))
for dtype in [np.bool_] + INTS + FLOATS + COMPLEX:
    for shape in SHAPES + [(5000,)]:  # 5000 x 8 bytes: beyond the inline payload
        mine = value(rank, dtype, shape)
        expected = value(left, dtype, shape)
        same_bits(jc.sendrecv(mine, mine, source=left, dest=right), expected, f"eager {np.dtype(dtype)}{shape}")
        same_bits(ring(jnp.asarray(mine)), expected, f"jit {np.dtype(dtype)}{shape}")

# 2. Everyone sends rank 0 a message tagged with its rank; rank 0 takes them from ANY_SOURCE
#    in arrival order and learns who sent which from the Status.
if rank == 0:
    seen = set()
    for _ in range(size - 1):
        status = MPI.Status()
        got = np.asarray(jc.recv(np.zeros(6, np.int32), status=status))
        src = status.Get_source()
        assert status.Get_tag() == src and status.Get_count(MPI.INT) == 6, (src, status.Get_tag())
        same_bits(got, np.full(6, src, np.int32), f"recv from {src}")
        seen.add(src)
    assert seen == set(range(1, size)), seen
else:
    jc.send(np.full(6, rank, np.int32), 0, tag=rank)

# 3. Program order, 200 iterations. Rank 0 sends a then b on the same tag to rank 1, which
#    receives two messages on that tag: the first is a. In between, each rank's program has an
#    allreduce independent of them (XLA may start it in any order with the messages).
#    Arrays above 512 bytes: XLA runs independent calls concurrently.
n = 300
a0, b0 = jnp.arange(n, dtype=jnp.float32), -jnp.arange(n, dtype=jnp.float32)


@jax.jit
def pair_step(a, b):
    total = jc.allreduce(a[:4] + 1.0, op="sum", name="p2p.between")
    if rank == 0:
        jc.send(a, 1, tag=9)
        jc.send(b, 1, tag=9)
        return a + 1, b - 1, total
    if rank == 1:
        first = jc.recv(a, 0, tag=9)
        second = jc.recv(b, 0, tag=9)
        return first + 1, second - 1, total
    return a + 1, b - 1, total


@jax.jit
def crossed_step(x):
    # mpi4jax's deadlock test: rank 0 sends then receives, rank 1 receives then sends.
    if rank == 0:
        jc.send(x, 1)
        return jc.recv(x, 1) + 1
    if rank == 1:
        got = jc.recv(x, 0)
        jc.send(x, 0)
        return got + 1
    return x + 1


a, b, x = a0, b0, jnp.full((n,), float(rank))
for i in range(200):
    a, b, total = pair_step(a, b)
    x = crossed_step(x)
a, b, x = np.asarray(a), np.asarray(b), np.asarray(x)
same_bits(a, np.asarray(a0) + 200, "first message of the pair")
same_bits(b, np.asarray(b0) - 200, "second message of the pair")
if rank in (0, 1):
    # x alternates between the ranks: after an even number of swaps it is this rank's again.
    same_bits(x, np.full(n, float(rank) + 200, np.float64).astype(x.dtype), "crossed exchange")
same_on_all_ranks(np.asarray(total), "allreduce between the messages")

# 4. Inline payloads: a small message is ONE MPI message (its header carries it), a large one
#    two (header + data): counted by the runtime, so the mechanism cannot silently stop paying.
small, large = np.ones(16, np.float32), np.ones(1 << 16, np.float32)  # 64 B, 256 KiB
for what, arr, per_send in (("small", small, 1), ("large", large, 2)):
    COMM.Barrier()
    jc.reset_stats()
    for _ in range(10):
        jc.sendrecv(arr, arr, source=left, dest=right)
    sent = jc.stats()["p2p_messages"]
    assert sent == 10 * per_send, f"{what} sendrecv: {sent} MPI messages for 10 sends (expected {10 * per_send})"

# 5. vmap, grad, jvp. Loss_r = (r + 1) * sum(received): x_r's gradient is (right + 1), sent back
#    by the rank that received it.
xs = jnp.stack([jnp.arange(4.0) + 10 * rank, jnp.arange(4.0) - rank])
got = jax.vmap(lambda v: jc.sendrecv(v, v, source=left, dest=right))(xs)
same_bits(got, np.stack([np.arange(4.0) + 10 * left, np.arange(4.0) - left]), "vmap")
g = jax.grad(lambda v: (rank + 1) * jnp.sum(jc.sendrecv(v, v, source=left, dest=right)))(jnp.ones(5))
same_bits(g, np.full(5, float(right + 1)), "grad")
g = jax.jit(jax.grad(lambda v: jnp.sum(jc.sendrecv(v * v, v, source=left, dest=right) * (rank + 1))))(
    jnp.full(3, float(rank + 1)))
same_bits(g, np.full(3, 2.0 * (rank + 1) * (right + 1)), "jit grad of sendrecv(x*x)")
# vmap of send and recv: the batched array travels as one message.
batch = jnp.stack([jnp.arange(5.0) + k for k in range(3)])
if rank == 0:
    jax.vmap(lambda v: jc.send(v, 1, tag=6))(batch)
elif rank == 1:
    same_bits(jax.vmap(lambda v: jc.recv(v, 0, tag=6))(jnp.zeros((3, 5))), np.asarray(batch), "vmap send/recv")
_, tangent = jax.jvp(lambda v: jc.sendrecv(v, v, source=left, dest=right), (jnp.ones(3),),
                     (jnp.full(3, float(rank)),))
same_bits(tangent, np.full(3, float(left)), "jvp")

# 6. A process set: the ranks numbered within it.
if size >= 3:
    members = [0, size - 1]
    ps = jc.add_process_set(members)
    if rank in members:
        peer = 1 - ps.rank()
        got = jc.sendrecv(np.full(3, rank, np.int64), np.zeros(3, np.int64), source=peer, dest=peer,
                          process_set=ps)
        same_bits(got, np.full(3, members[peer], np.int64), "process set")
    jc.remove_process_set(ps)

# 7. Errors. A send and its receive disagreeing: MismatchError on the receiver (the message is
#    drained, the sender completes), both small and large; the same pair then works.
for n_elems in (3, 1 << 14):
    if rank == 0:
        jc.send(np.zeros(n_elems, np.float32), 1, tag=4)
        jc.send(np.zeros(n_elems, np.float32), 1, tag=4)
    elif rank == 1:
        raises(jc.MismatchError, r"expects float32\[%d\], but rank 0 sent float32\[%d\]" % (n_elems + 1, n_elems),
               jc.recv, np.zeros(n_elems + 1, np.float32), 0, tag=4)
        raises(jc.MismatchError, r"expects int32\[%d\], but rank 0 sent float32" % n_elems,
               jc.recv, np.zeros(n_elems, np.int32), 0, tag=4)
COMM.Barrier()
same_bits(jc.sendrecv(np.full(2, rank), np.zeros(2, np.int64), source=left, dest=right),
          np.full(2, left), "after the mismatches")
# Under jit the failure comes out of XLA, naming the class.
if rank == 0:
    jc.send(np.zeros(2, np.float32), 1, tag=5)
elif rank == 1:
    raises(jax.errors.JaxRuntimeError, "jaxcache.MismatchError",
           lambda: jax.jit(lambda t: jc.recv(t, 0, tag=5))(jnp.zeros(3, jnp.float32)).block_until_ready())
# Bad arguments: a clear local error, before anything is sent.
raises(ValueError, r"dest=%d is not a rank" % size, jc.send, np.ones(2), size)
raises(ValueError, "source=-5 is not a rank", jc.recv, np.ones(2), -5)
raises(ValueError, "tags are non-negative", jc.send, np.ones(2), right, tag=-3)
raises(TypeError, "dest must be an int", jc.send, np.ones(2), 1.5)
raises(TypeError, "status must be an mpi4py.MPI.Status", jc.recv, np.ones(2), left, status=object())
COMM.Barrier()
same_bits(jc.sendrecv(np.full(2, rank), np.zeros(2, np.int64), source=left, dest=right),
          np.full(2, left), "after the errors")
done("point_to_point")
jc.shutdown()
