"""Shutdown, barrier, waiting and interrupts (argv[1] picks the scenario):

  early-shutdown  - rank 0 calls shutdown() first; the others keep using local calls for a
                    while: shutdown() waits for them (like MPI_Finalize) and breaks nothing
  barrier         - barrier() returns on no rank before every rank has called it, eagerly
                    and in every run of a jitted program (jaxcache's and mpi4jax's names)
  spin            - a rank with pending work that keeps receiving requests while a peer
                    arrives 10 s late stays under 10% of a core (JAXCACHE_HEARTBEAT_MS=1000)
  interrupt-jax   - SIGINT during an eager wait on a stalled collective raises
  interrupt-torch   KeyboardInterrupt within a second (JAX, torch synchronize(), TF);
  interrupt-tf      the request completes later, once the peer arrives
  dead-rank       - the last rank hangs for good; shutdown() on the others still ends
                    within the bound
"""

import os
import signal
import sys
import threading
import time

import numpy as np
import jax.numpy as jnp

import jaxcache as jc
from _util import COMM, assert_close, done

mode = sys.argv[1]
rank, size = COMM.rank, COMM.size
last = size - 1
jc.init()


def interrupt_after(seconds):
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


if mode == "early-shutdown":
    COMM.Barrier()
    if rank == 0:
        t0 = time.monotonic()
        jc.shutdown()
        waited = time.monotonic() - t0
        assert waited > 1.5, f"shutdown() returned after {waited:.2f}s, before the others called it"
        assert not jc.is_initialized()
        print(f"rank 0: shutdown() waited {waited:.2f}s for the others", flush=True)
    else:
        t_end = time.monotonic() + 2.0
        while time.monotonic() < t_end:  # local calls keep working meanwhile
            assert (jc.rank(), jc.size()) == (rank, size)
            assert jc.is_initialized()
            jc.stats()
            time.sleep(0.05)
        jc.shutdown()
    COMM.Barrier()
    done("lifecycle early-shutdown")
    sys.exit(0)

elif mode == "barrier":
    import jax
    import jaxcache.mpi4jax as mpi4jax

    for i in range(3):
        if rank == i % size:
            time.sleep(0.5)
        before = time.time()
        jc.barrier()
        entered = COMM.allgather(before)
        assert time.time() >= max(entered), "barrier returned before every rank entered it"

    # Inside jit every run of the program is a barrier: with a result (ready once the
    # program has run), without one (jax.effects_barrier() waits), from mpi4jax's name, in
    # a process set, and twice in one program (two barriers, in either order per rank).
    @jax.jit
    def step(x):
        jc.barrier()
        return x + 1

    @jax.jit
    def only_barrier():
        mpi4jax.barrier()

    @jax.jit
    def twice(x):
        jc.barrier(name="first")
        y = x * 2
        jc.barrier(name="second")
        return y

    ps = jc.ProcessSet([0, last]) if size > 2 else jc.global_process_set
    if size > 2:
        jc.add_process_set(ps)

    @jax.jit
    def in_set(x):
        jc.barrier(process_set=ps)
        return x - 1

    programs = [("step", lambda: step(jnp.ones(3)).block_until_ready()),
                ("only_barrier", lambda: (only_barrier(), jax.effects_barrier())),
                ("twice", lambda: twice(jnp.ones(3)).block_until_ready())]
    for what, run in programs:
        for i in range(3):
            if rank == i % size:
                time.sleep(0.3)
            before = time.time()
            run()
            entered = COMM.allgather(before)
            assert time.time() >= max(entered), f"jitted barrier ({what}, run {i}) returned before every rank entered it"
    for i in range(2):
        if rank in (0, last):
            if rank == (0, last)[i]:
                time.sleep(0.3)
            before = time.time()
            in_set(jnp.ones(2)).block_until_ready()
        else:
            before = 0.0
        entered = COMM.allgather(before)
        if rank in (0, last):
            assert time.time() >= max(entered), f"jitted barrier in a process set (run {i})"
    if size > 2:
        jc.remove_process_set(ps)
    done("lifecycle barrier")

elif mode == "spin":
    import resource

    COMM.Barrier()
    if rank == 0:
        stop = threading.Event()
        count = [0]

        def more_requests():  # a trickle of new requests while the peers are away
            while not stop.is_set():
                threading.Thread(target=jc.allreduce, args=(jnp.ones(2),),
                                 kwargs={"op": "sum", "name": f"spin.more.{count[0]}"},
                                 daemon=True).start()
                count[0] += 1
                time.sleep(0.25)

        feeder = threading.Thread(target=more_requests)
        wall0, cpu0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
        feeder.start()
        y = jc.allreduce(jnp.ones(4), "sum", name="spin.first")  # waits ~10 s for the peers
        stop.set()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.monotonic() - wall0
        cpu = (usage.ru_utime - cpu0.ru_utime) + (usage.ru_stime - cpu0.ru_stime)
        feeder.join()
        print(f"rank 0: {100 * cpu / wall:.2f}% of a core over {wall:.1f}s of waiting", flush=True)
        assert wall > 8, wall
        # A loop that polled without backing off would keep a core busy. What waiting
        # legitimately costs: the trickle's own requests (a thread, a JAX array and an
        # eager call each, 4 a second) and the short polling ramp each new request starts.
        # That was 1-2% on a fast host and 3.2-6.5% on a 4-5x slower 2-core VM under load.
        assert cpu / wall < 0.10, f"rank 0 used {100 * cpu / wall:.1f}% of a core while waiting"
        COMM.bcast(count[0], root=0)
    else:
        time.sleep(10)
        y = jc.allreduce(jnp.ones(4), "sum", name="spin.first")
        for k in range(COMM.bcast(None, root=0)):
            jc.allreduce(jnp.ones(2), "sum", name=f"spin.more.{k}")
    assert_close(y, np.full(4, size, np.float32), "spin.first")
    jc.barrier()
    done("lifecycle spin")

elif mode.startswith("interrupt-"):
    framework = mode.split("-", 1)[1]
    if framework == "torch":
        import torch
        import jaxcache.torch as jct

        def blocked():
            return jct.synchronize(jct.allreduce_async(torch.ones(3), op="sum", name="stalled"))
    elif framework == "tf":
        import tensorflow as tf
        import jaxcache.tensorflow as jctf

        def blocked():
            return jctf.allreduce(tf.ones(3), op="sum", name="stalled")
    else:
        def blocked():
            return jc.allreduce(jnp.ones(3), "sum", name="stalled")

    if rank == 0:
        timer = interrupt_after(1.0)
        t0 = time.monotonic()
        try:
            blocked()
        except KeyboardInterrupt:
            took = time.monotonic() - t0
            print(f"rank 0: KeyboardInterrupt after {took:.2f}s", flush=True)
            assert took < 2.5, took
        else:
            raise AssertionError("the stalled wait was not interrupted")
        timer.join()
        COMM.Barrier()  # the peers now submit "stalled": the abandoned request completes
        COMM.Barrier()
    else:
        COMM.Barrier()
        y = blocked()
        assert_close(np.asarray(y), np.full(3, size, np.float32), "stalled")
        COMM.Barrier()
    # The runtime works as before, and the interrupted request's buffers were kept alive.
    y = jc.allreduce(jnp.ones(3), "sum", name="after.interrupt")
    assert_close(y, np.full(3, size, np.float32), "after interrupt")
    done(f"lifecycle {mode}")

elif mode == "dead-rank":
    # The last rank stops answering for good (SIGSTOP: a hung process, which MPI cannot
    # tell from a slow one); the others' shutdown() must still end within the bound.
    pids = COMM.allgather(os.getpid())
    COMM.Barrier()
    if rank == last:
        print(f"rank {rank}: hanging", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(0.5)
    t0 = time.monotonic()
    jc.shutdown()
    took = time.monotonic() - t0
    print(f"rank {rank}: shutdown() returned after {took:.1f}s", flush=True)
    limit = float(os.environ["JAXCACHE_SHUTDOWN_TIMEOUT"]) + 8
    assert took < limit, took
    assert not jc.is_initialized()
    if rank == 0:
        os.kill(pids[last], signal.SIGKILL)  # end the job: the hung rank cannot
    sys.stdout.flush()
    os._exit(0)  # MPI_Finalize with a dead peer is the MPI library's business, not ours

else:
    raise SystemExit(f"unknown mode {mode}")
jc.shutdown()
