"""A device that skips a collective its program's other devices run (a condition that differs
per device): the others' executions are reported after JAXCACHE_STALL_CHECK_TIME and fail
with a StallError naming the missing device position after JAXCACHE_STALL_SHUTDOWN_TIME, on
every rank, instead of waiting forever; the runtime works afterwards. Run with both set."""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

import jaxcache as jc  # noqa: E402
from _util import done, raises  # noqa: E402

assert float(os.environ["JAXCACHE_STALL_SHUTDOWN_TIME"]) > 0
jc.init()
mesh = Mesh(np.array(jax.local_devices()), ("d",))


def only_first_device(v):
    return lax.cond(lax.axis_index("d") == 0, lambda u: jc.allreduce(u, "sum", name="skip"), lambda u: u, v)


f = jax.jit(jax.shard_map(only_first_device, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
raises(Exception, r"StallError.*'skip' waits for device position 1 of 2", lambda: np.asarray(f(jnp.arange(2.0))))
assert np.array_equal(np.asarray(jc.allreduce(jnp.ones(2), "sum", name="skip.after")), np.full(2, jc.size(), np.float32))
done("a device skipping a collective")
