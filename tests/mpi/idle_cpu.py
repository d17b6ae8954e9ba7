"""An idle process must not burn CPU: under 2% of a core over 10 idle seconds after a
training loop and a halo-exchange loop (the background thread only answers heartbeat
cycles; the point-to-point progress thread sleeps once its last send has been received)."""

import sys
import time

import psutil
import jax
import jax.numpy as jnp

import jaxcache as jc
from _util import COMM, done

idle_s = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
jc.init()
step = jax.jit(lambda t: jc.grouped_allreduce(t, name="idle.train"))
tree = {"w": jnp.ones((128, 128)), "b": jnp.ones(128)}
for _ in range(200):
    tree = step(tree)
jax.block_until_ready(tree)
left, right = (jc.rank() - 1) % jc.size(), (jc.rank() + 1) % jc.size()
halo = jax.jit(lambda t: jax.lax.fori_loop(0, 100, lambda _, u: jc.sendrecv(u, u, left, right) + 1, t))
jax.block_until_ready(halo(jnp.ones(64)))
COMM.Barrier()

proc = psutil.Process()
before = proc.cpu_times()
cycles_before = jc.stats()["cycles"]
time.sleep(idle_s)
after = proc.cpu_times()
used = (after.user - before.user) + (after.system - before.system)
share = used / idle_s
cycles = jc.stats()["cycles"] - cycles_before
print(f"rank {jc.rank()}: {used * 1e3:.1f} ms CPU in {idle_s:.0f} idle s = {share:.2%} of a core; "
      f"{cycles} heartbeat cycles", flush=True)
assert share < 0.02, f"idle process used {share:.2%} of a core"
assert cycles > 0, "no heartbeat cycles while idle: stalls and shutdowns could not be detected"
done("idle_cpu")
