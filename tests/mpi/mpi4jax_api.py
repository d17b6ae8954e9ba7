"""jaxcache.mpi4jax as an mpi4jax program uses it (no jaxcache.init(), mpi4py operators and
communicators): every supported name against NumPy on every rank, eager and jit, vmap, and
mpi4jax's autodiff convention for allreduce (transpose = identity); point-to-point with
MPI's wildcards and an mpi4py Status; the unsupported ones raise clearly."""

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

import jaxcache.mpi4jax as mpi4jax
from _util import assert_close, done, raises

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
x = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3) + 10 * rank
xs = [np.arange(6.0, dtype=np.float32).reshape(2, 3) + 10 * r for r in range(size)]

for mode in ("eager", "jit"):
    run = (lambda f, *a: f(*a)) if mode == "eager" else (lambda f, *a: jax.jit(f)(*a))
    assert_close(run(lambda v: mpi4jax.allreduce(v, op=MPI.SUM), x), sum(xs), f"allreduce {mode}")
    assert_close(run(lambda v: mpi4jax.allreduce(v, op=MPI.MAX, comm=comm), x), xs[-1], f"allreduce max {mode}")
    assert_close(run(lambda v: mpi4jax.allgather(v), x), np.stack(xs), f"allgather {mode}")
    a2a = jnp.arange(size * 2.0).reshape(size, 2) + 100 * rank
    want = np.stack([np.arange(size * 2.0, dtype=np.float32).reshape(size, 2)[rank] + 100 * r for r in range(size)])
    assert_close(run(lambda v: mpi4jax.alltoall(v), a2a), want, f"alltoall {mode}")
    assert_close(run(lambda v: mpi4jax.bcast(v, 0), x), xs[0], f"bcast {mode}")
    g = run(lambda v: mpi4jax.gather(v, size - 1), x)
    assert_close(g, np.stack(xs) if rank == size - 1 else xs[rank], f"gather {mode}")
    s = run(lambda v: mpi4jax.scatter(v, 0), jnp.asarray(np.stack(xs)) if rank == 0 else x)
    assert_close(s, xs[rank], f"scatter {mode}")
    r = run(lambda v: mpi4jax.reduce(v, MPI.SUM, 0), x)
    assert_close(r, sum(xs) if rank == 0 else xs[rank], f"reduce {mode}")
    assert_close(run(lambda v: mpi4jax.scan(v, MPI.SUM), x), sum(xs[:rank + 1]), f"scan {mode}")

b = jnp.asarray(rank % 2 == 0)
assert bool(mpi4jax.allreduce(b, op=MPI.LAND)) == (size == 1)
assert bool(mpi4jax.allreduce(b, op=MPI.LOR))

# mpi4jax's convention: the transpose of an allreduce-sum is the identity.
res, grad = jax.value_and_grad(lambda v: mpi4jax.allreduce(v, op=MPI.SUM).sum())(x)
assert_close(grad, np.ones((2, 3), np.float32), "grad (identity transpose)")
(t,) = jax.linear_transpose(lambda v: mpi4jax.allreduce(v, op=MPI.SUM), x)(x)
assert_close(t, xs[rank], "linear_transpose")
_, tangent = jax.jvp(lambda v: mpi4jax.allreduce(v, op=MPI.SUM), (x,), (x,))
assert_close(tangent, sum(xs), "jvp")
vm = jax.vmap(lambda v: mpi4jax.allreduce(v, op=MPI.SUM))(x)
assert_close(vm, sum(xs), "vmap")

mpi4jax.barrier()
# Point-to-point: a ring by sendrecv (eager and jit), then everyone sends rank 0 with tag = rank,
# received from MPI.ANY_SOURCE with MPI.ANY_TAG, the Status saying from whom.
left, right = (rank - 1) % size, (rank + 1) % size
assert_close(mpi4jax.sendrecv(x, x, left, right), xs[left], "sendrecv")
assert_close(jax.jit(lambda v: mpi4jax.sendrecv(v, v, source=left, dest=right, sendtag=2, recvtag=2))(x),
             xs[left], "sendrecv jit")
if rank == 0:
    for _ in range(size - 1):
        status = MPI.Status()
        got = mpi4jax.recv(x, MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
        assert_close(got, xs[status.Get_source()], "recv ANY_SOURCE")
        assert status.Get_tag() == status.Get_source()
else:
    assert mpi4jax.send(x, 0, tag=rank) is None
raises(NotImplementedError, "op .* is not supported", lambda: mpi4jax.allreduce(x, op=MPI.BXOR))
raises(RuntimeError, "tokens are not supported", lambda: mpi4jax.allreduce(x, op=MPI.SUM, token=1))
assert mpi4jax.has_sycl_support() is False and isinstance(mpi4jax.has_cuda_support(), bool)
done("mpi4jax_api")
