"""Processes with different numbers of devices run one program over all their devices: a
MismatchError naming the ranks and their device counts on every rank, for every device,
and the runtime works afterwards.

    mpirun -np 1 python devices_mismatch.py 4 : -np 1 python devices_mismatch.py 2
"""

import os
import sys

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(sys.argv[1])}"

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jaxcache as jc  # noqa: E402
from _util import COMM, done, raises  # noqa: E402

jc.init()
rank, size = jc.rank(), jc.size()
N = len(jax.local_devices())
counts = COMM.allgather(N)
assert len(set(counts)) > 1, f"the launch must give the ranks different device counts: {counts}"
# Ranks with the same count are listed together: "(rank 0: 2; ranks 1, 2: 4)".
pattern = (f"MismatchError.*'{{}}'.*devices per process differs across ranks \\(rank 0: {counts[0]};"
           f".*{counts[-1]}\\)")
mesh = Mesh(np.array(jax.local_devices()), ("d",))

f = jax.jit(jax.shard_map(lambda v: jc.allreduce(v, "sum", name="mm.shard_map"), mesh=mesh,
                          in_specs=P("d"), out_specs=P("d")))
raises(Exception, pattern.format("mm.shard_map"), lambda: np.asarray(f(jnp.arange(4.0 * N))))

x = jax.device_put(np.ones((4 * N, 2), np.float32), NamedSharding(mesh, P("d")))
raises(Exception, pattern.format("mm.sharded"), lambda: np.asarray(jc.allreduce(x, "sum", name="mm.sharded")))

# The runtime keeps working: on one device, and on the devices every rank has.
assert np.array_equal(np.asarray(jc.allreduce(jnp.ones(3), "sum", name="mm.after")), np.full(3, size, np.float32))
common = Mesh(np.array(jax.local_devices()[:min(counts)]), ("d",))
g = jax.jit(jax.shard_map(lambda v: jc.allreduce(v, "sum", name="mm.common"), mesh=common,
                          in_specs=P("d"), out_specs=P("d")))
assert np.array_equal(np.asarray(g(jnp.arange(float(min(counts))))), np.arange(float(min(counts))) * size)
done(f"device count mismatch {counts}")
