"""Shutdown semantics. argv[1]:
  one-rank  - rank 0 shuts down while the others wait for a collective it never submits:
              after JAXCACHE_SHUTDOWN_TIMEOUT it stops anyway and they fail with ShutdownError
  exit      - every rank exits with async-dispatched collectives in flight
  kill      - the last rank SIGKILLs itself in the middle of a training loop, after printing
              the wall-clock time of the kill (the driver measures from it)
  kill-transfer - the same, from a thread, 3 ms after a 64 MB allreduce's data call started
              on this rank (its pieces are moving between the ranks, pairwise on up to 4
              ranks), so the others are left in the data phase, not in the negotiation
"""

import os
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp

import jaxcache as jc
from _util import COMM

mode = sys.argv[1]
jc.init()
rank, size = jc.rank(), jc.size()

if mode == "one-rank":
    if rank == 0:
        time.sleep(0.5)
        jc.shutdown()
        print("rank 0 shut down", flush=True)
    else:
        try:
            jc.allreduce(jnp.ones(2), "sum", name="never.completes")
        except jc.ShutdownError as e:
            assert "shut down" in str(e), e
        else:
            raise AssertionError("pending op survived a remote shutdown")
        try:
            jc.allreduce(jnp.ones(2), "sum", name="later")
        except RuntimeError as e:
            assert "shut down" in str(e) or "init()" in str(e), e
        else:
            raise AssertionError("op after remote shutdown did not fail")
        print(f"rank {rank}: ShutdownError as expected", flush=True)
elif mode == "exit":
    f = jax.jit(lambda v: [jc.allreduce(v * i, "sum", name=f"exit.{i}") for i in range(8)])
    outs = [f(jnp.ones(1 << 16) * s) for s in range(4)]  # not awaited
    print(f"rank {rank}: exiting with collectives in flight", flush=True)
    # Fall off the end: atexit shuts the runtime down.
elif mode == "kill":
    # The driver turns Hydra's teardown off (-disable-auto-cleanup, each rank under sh); Hydra
    # then sends the survivors SIGUSR1 (MPICH's failure notification) when a rank dies. Ignored,
    # so that the job can only end because the runtime itself notices the dead rank.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    step = jax.jit(lambda t: jc.grouped_allreduce(t, name="train"))
    tree = {"w": jnp.ones((256, 256)), "b": jnp.ones(256)}
    for i in range(100000):
        tree = step(tree)
        if i == 20 and rank == size - 1:
            # Between steps: step 20 done here, so the others wait for step 21's cycle.
            jax.block_until_ready(tree)
            print(f"rank {rank}: killing myself at {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("training loop survived a dead rank")
elif mode == "kill-transfer":
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    step = jax.jit(lambda t: jc.allreduce(t, "average", name="big"))
    x = jnp.ones(1 << 24)  # 64 MB: 16 pieces of 4 MiB, 10-40 ms a step here
    for _ in range(3):
        x = jax.block_until_ready(step(x))

    def die_mid_transfer(calls_before: int) -> None:
        # The data call is counted as it starts: 3 ms later its pieces are moving.
        while jc.stats()["mpi_calls"] == calls_before:
            time.sleep(0.0002)
        time.sleep(0.003)
        print(f"rank {rank}: killing myself at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    if rank == size - 1:
        threading.Thread(target=die_mid_transfer, args=(jc.stats()["mpi_calls"],), daemon=True).start()
    for _ in range(100000):
        x = jax.block_until_ready(step(x))
    raise AssertionError("training loop survived a dead rank")
