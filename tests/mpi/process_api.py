"""init/shutdown life cycle, process queries, and clear errors outside it."""

import numpy as np
import jax
import jax.numpy as jnp
from mpi4py import MPI

import jaxcache as jc
from _util import done

comm = MPI.COMM_WORLD
assert not jc.is_initialized()
for fn, args in ((jc.allreduce, (jnp.ones(2),)), (jc.broadcast, (jnp.ones(2),)), (jc.rank, ())):
    try:
        fn(*args)
    except RuntimeError as e:
        assert "jaxcache.init()" in str(e), e
    else:
        raise AssertionError(f"{fn.__name__} before init did not raise")

jc.init()
jc.init()  # idempotent
assert jc.is_initialized()
assert (jc.rank(), jc.size()) == (comm.rank, comm.size)
assert jc.local_size() == comm.size and jc.local_rank() == comm.rank  # one host here

# User MPI traffic on COMM_WORLD does not interfere with the runtime's duplicate.
y = jc.allreduce(jnp.ones(3), "sum", name="before.user.mpi")
total = comm.allreduce(comm.rank)
assert total == sum(range(comm.size))
assert float(jc.allreduce(jnp.ones(()), "sum", name="after.user.mpi")) == comm.size

# A sub-communicator: the runtime works over any mpi4py communicator.
f = jax.jit(lambda v: jc.allreduce(v, "sum", name="jitted.before.shutdown"))
assert float(f(jnp.ones(()))) == comm.size

jc.shutdown()
assert not jc.is_initialized()
try:
    jc.allreduce(jnp.ones(2), "sum")
except RuntimeError as e:
    assert "jaxcache.init()" in str(e)
else:
    raise AssertionError("allreduce after shutdown did not raise")
# A program compiled before shutdown fails cleanly instead of hanging.
try:
    jax.block_until_ready(f(jnp.ones(())))
except Exception as e:  # noqa: BLE001 - XLA wraps the runtime's error
    assert "ShutdownError" in str(e) and "jaxcache" in str(e), e
else:
    raise AssertionError("compiled collective after shutdown did not fail")

# init after shutdown starts a fresh runtime, here over a split communicator.
sub = comm.Split(color=0, key=comm.size - comm.rank)  # reversed rank order
jc.init(sub)
assert jc.rank() == comm.size - 1 - comm.rank
out = jc.allgather(jnp.array([comm.rank]), name="sub.gather")
assert list(np.asarray(out)) == list(range(comm.size))[::-1]
try:
    jc.init("not a comm")
except TypeError:
    pass
jc.shutdown()
done("process_api")
