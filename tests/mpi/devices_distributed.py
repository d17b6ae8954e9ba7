"""jaxcache beside jax.distributed (docs/devices.md): global devices across processes, JAX's
own collectives over a global mesh, jaxcache's on process-local arrays in the same job; a
jaxcache collective in a program over another process's devices is a clear error."""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jaxcache as jc  # noqa: E402
from _util import COMM, done, raises, same_on_all_ranks  # noqa: E402

rank, size = COMM.rank, COMM.size
port = None
if rank == 0:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
port = COMM.bcast(port, root=0)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=size, process_id=rank)
jc.init()
N = len(jax.local_devices())
assert len(jax.devices()) == size * N and jax.process_index() == rank

# JAX's own collective over the global mesh.
global_mesh = Mesh(np.array(jax.devices()), ("g",))
x = jax.make_array_from_single_device_arrays(
    (size * N,), NamedSharding(global_mesh, P("g")),
    [jax.device_put(jnp.full(1, float(rank * N + i)), d) for i, d in enumerate(jax.local_devices())])
total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "g"), mesh=global_mesh, in_specs=P("g"), out_specs=P()))(x)
assert float(total.addressable_data(0)[0]) == sum(range(size * N))

# jaxcache on this process's devices: a local mesh, eager arrays.
local_mesh = Mesh(np.array(jax.local_devices()), ("d",))
f = jax.jit(jax.shard_map(lambda v: jc.allreduce(v, "sum", name="dist.local"), mesh=local_mesh,
                          in_specs=P("d"), out_specs=P("d")))
got = np.asarray(f(np.arange(N, dtype=np.float32) + 10 * rank))
assert np.array_equal(got, np.arange(N, dtype=np.float32) * size + 10 * sum(range(size))), got
same_on_all_ranks(got, "local mesh")
got = np.asarray(jc.allreduce(jnp.ones(3) * (rank + 1), "sum", name="dist.eager"))
assert np.array_equal(got, np.full(3, sum(range(1, size + 1)), np.float32)), got
# jaxcache on the addressable data of a global array.
part = jc.allreduce(x.addressable_data(0), "sum", name="dist.shard")
assert float(part[0]) == sum(r * N for r in range(size)), part

# A jaxcache collective in a program over the global mesh: refused, on every rank.
g = jax.jit(jax.shard_map(lambda v: jc.allreduce(v, "sum", name="dist.global"), mesh=global_mesh,
                          in_specs=P("g"), out_specs=P("g")))
raises(NotImplementedError, r"devices of this process only", g, x)
done("jaxcache beside jax.distributed")
