"""Process sets (3 or 4 ranks). argv[1] is the scenario:

disjoint     two disjoint sets run a jitted grouped step with the SAME names, concurrently
             with global allreduces, 200 steps; per-set steady-state counters.
overlapping  sets {0,1,2} and {1,2,3} ({0,1} and {1,2} on 3 ranks) from several threads in
             rank-dependent orders, and one jitted program using both sets.
mismatch     a mismatch inside one set fails on its ranks only; the other set keeps going.
stall        a rank of one set never submits (JAXCACHE_STALL_SHUTDOWN_TIME=2): that set's
             ranks get StallError; the other set finishes meanwhile.
lifecycle    add/remove during a run, adding twice, ranks that disagree, removing with work in
             in flight, sets from communicators (Split), non-members, bad arguments.
"""

import sys
import threading
import time

import numpy as np

import jax
import jax.numpy as jnp
from mpi4py import MPI

import jaxcache as jc
from _util import COMM, assert_close, done

scenario = sys.argv[1]
jc.init()
rank, size = jc.rank(), jc.size()
assert size in (3, 4), "run on 3 or 4 ranks"


def same_within(value, ranks, what):
    """Bitwise identical on every rank of `ranks` (collective over the job)."""
    arr = np.ascontiguousarray(np.asarray(value))
    everyone = COMM.allgather(arr.tobytes() if rank in ranks else None)
    mine = everyone[rank]
    for r in ranks:
        assert everyone[r] == mine or rank not in ranks, f"{what}: rank {rank} and rank {r} differ"


def expect_error(call, kind, *fragments):
    try:
        jax.block_until_ready(call())
    except Exception as e:  # noqa: BLE001 - the type is checked below
        text = type(e).__name__ + ": " + str(e)
        assert kind in text, f"expected {kind}, got {text}"
        for f in fragments:
            assert f in str(e), f"{f!r} missing from: {e}"
        return e
    raise AssertionError(f"expected {kind}, but the call succeeded")


def halves():
    """{0, 1} and the rest: two disjoint sets ({0, 1} and {2} on 3 ranks)."""
    return [0, 1], list(range(2, size))


def grad_tree(r, step):
    """A small gradient pytree that differs per rank and step (exact in float32)."""
    return {"w": jnp.full((3, 4), float(r + 1 + step % 7), jnp.float32),
            "b": jnp.arange(5, dtype=jnp.float32) * (r + 1),
            "s": jnp.asarray(float(step % 5), jnp.float32)}


def expected_tree(ranks, step):
    return {"w": np.full((3, 4), sum(r + 1 + step % 7 for r in ranks), np.float32),
            "b": np.arange(5, dtype=np.float32) * sum(r + 1 for r in ranks),
            "s": np.float32(len(ranks) * (step % 5))}


if scenario == "disjoint":
    a_ranks, b_ranks = halves()
    a, b = jc.ProcessSet(a_ranks), jc.ProcessSet(b_ranks)
    jc.add_process_set(a)
    jc.add_process_set(b)
    assert a.process_set_id != b.process_set_id and 0 not in (a.process_set_id, b.process_set_id)
    mine, mine_ranks = (a, a_ranks) if rank in a_ranks else (b, b_ranks)
    other = b if mine is a else a
    assert mine.included() and not other.included()
    assert mine.size() == len(mine_ranks) and mine.rank() == mine_ranks.index(rank)
    assert jc.global_process_set.size() == size and jc.global_process_set.rank() == rank

    # The same function (same names) on both sets: each set negotiates its own.
    @jax.jit
    def step_fn(tree, x):
        reduced = jc.grouped_allreduce(tree, "sum", name="step", num_groups=2, process_set=mine)
        total = jc.allreduce(x, "sum", name="global.x")
        return reduced, total

    t0 = time.perf_counter()
    for step in range(200):
        reduced, total = step_fn(grad_tree(rank, step), jnp.asarray(float(rank + step)))
        if step % 20 == 0 or step == 199:
            want = expected_tree(mine_ranks, step)
            for k in want:
                assert_close(reduced[k], want[k], f"step {step} leaf {k}")
            assert float(total) == sum(r + step for r in range(size)), float(total)
        if step == 20:
            # Warm: from here on, each set's cycles are one bitvector allreduce on that set.
            jax.block_until_ready(reduced)
            jc.reset_stats(process_set=mine)
    jax.block_until_ready((reduced, total))
    same_within(reduced["w"], mine_ranks, "set result")
    counters = jc.stats(process_set=mine)
    layout = jc.cache_layout(process_set=mine)
    assert any(n.endswith("step/0of2") for n in layout) and any(n.endswith("step/1of2") for n in layout), layout
    same_within(np.frombuffer(repr(sorted(layout.items())).encode(), np.uint8), mine_ranks, "cache layout")
    assert counters["coordinator_rounds"] == 0 and counters["cache_misses"] == 0, counters
    assert counters["cache_hits"] >= 2 * 179, counters
    assert counters["bitvector_syncs"] == counters["cycles"], counters
    # Set-local names never reach the global cache.
    assert not any("step/" in n for n in jc.cache_layout()), jc.cache_layout()
    try:
        jc.stats(process_set=other)
    except ValueError as e:
        assert "not a member" in str(e), e
    else:
        raise AssertionError("stats of a foreign set")

    # A set costs nothing on the ranks outside it: only A runs for a while.
    COMM.Barrier()
    jc.reset_stats(process_set=b)  if rank in b_ranks else jc.reset_stats(process_set=a)
    quiet = a if rank in b_ranks else b
    COMM.Barrier()
    t1 = time.perf_counter()
    if rank in a_ranks:
        only_a = jax.jit(lambda t: jc.grouped_allreduce(t, "sum", name="only_a", process_set=a))
        jax.block_until_ready(only_a(grad_tree(rank, 0)))  # warm: negotiated and cached
        jc.reset_stats(process_set=a)
        for step in range(100):
            out = only_a(grad_tree(rank, step))
        jax.block_until_ready(out)
        busy = jc.stats(process_set=a)
        for k, v in expected_tree(a_ranks, 99).items():
            assert_close(out[k], v, f"only_a {k}")
    COMM.Barrier()
    elapsed = time.perf_counter() - t1
    if rank in b_ranks:
        idle = jc.stats(process_set=b)
        # Heartbeats only (every 100 ms), however busy set A was.
        assert idle["cycles"] <= elapsed / 0.1 + 3, (idle, elapsed)
        assert idle["mpi_calls"] == 0 and idle["coordinator_rounds"] == 0, idle
    if rank in a_ranks:
        print(f"rank {rank}: set A steady state over 100 steps: cycles={busy['cycles']} "
              f"bitvector_syncs={busy['bitvector_syncs']} coordinator_rounds={busy['coordinator_rounds']} "
              f"cache_hits={busy['cache_hits']} mpi_calls={busy['mpi_calls']}", flush=True)
    if rank in b_ranks:
        print(f"rank {rank}: idle set B meanwhile ({elapsed:.2f} s): cycles={idle['cycles']} "
              f"bitvector_syncs={idle['bitvector_syncs']} mpi_calls={idle['mpi_calls']}", flush=True)
    print(f"rank {rank}: 200 steps in {time.perf_counter() - t0:.2f} s", flush=True)
    done("process-sets-disjoint")

elif scenario == "overlapping":
    a_ranks = [0, 1, 2] if size == 4 else [0, 1]
    b_ranks = [1, 2, 3] if size == 4 else [1, 2]
    a = jc.add_process_set(a_ranks)
    b = jc.add_process_set(jc.ProcessSet(b_ranks))
    errors = []
    rounds = 30

    def worker(ps, ranks, label):
        try:
            for i in range(rounds):
                x = jnp.full((4,), float(rank * (i + 1)), jnp.float32)
                y = jc.allreduce(x, "sum", name=f"{label}.{i}", process_set=ps)
                assert_close(y, np.full((4,), sum(r * (i + 1) for r in ranks), np.float32), f"{label}.{i}")
                g = jc.allgather(jnp.asarray([rank], jnp.int32), name=f"{label}.g{i}", process_set=ps)
                assert list(np.asarray(g)) == list(ranks), (label, np.asarray(g))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"{label}: {type(e).__name__}: {e}")

    jobs = [(jc.global_process_set, list(range(size)), "g")]
    if rank in a_ranks:
        jobs.append((a, a_ranks, "a"))
    if rank in b_ranks:
        jobs.append((b, b_ranks, "b"))
    # Rank-dependent order of thread starts (and a stagger): every rank issues its sets'
    # collectives in another order.
    jobs = jobs[rank % len(jobs):] + jobs[:rank % len(jobs)]
    threads = [threading.Thread(target=worker, args=job) for job in jobs]
    for t in threads:
        t.start()
        time.sleep(0.01 * ((rank + 1) % 3))
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a worker hangs"
    assert not errors, errors

    # One jitted program with collectives on both sets (XLA may run them in any order).
    both = [r for r in a_ranks if r in b_ranks]
    if rank in both:
        @jax.jit
        def two_sets(x):
            ya = jc.allreduce(x, "sum", name="two.a", process_set=a)
            yb = jc.allreduce(x * 2, "sum", name="two.b", process_set=b)
            return ya, yb
    else:
        ps, label = (a, "two.a") if rank in a_ranks else (b, "two.b")
        mult = 1.0 if ps is a else 2.0

        @jax.jit
        def two_sets(x):
            return jc.allreduce(x * mult, "sum", name=label, process_set=ps), None
    for i in range(20):
        x = jnp.full((3,), float(rank + i), jnp.float32)
        ya, yb = two_sets(x)
        if rank in a_ranks:
            assert_close(ya, np.full((3,), sum(r + i for r in a_ranks), np.float32), "two.a")
        if rank in both:
            assert_close(yb, np.full((3,), 2 * sum(r + i for r in b_ranks), np.float32), "two.b")
        elif rank in b_ranks:
            assert_close(ya, np.full((3,), 2 * sum(r + i for r in b_ranks), np.float32), "two.b")
    done("process-sets-overlapping")

elif scenario == "mismatch":
    a_ranks, b_ranks = halves()
    a = jc.add_process_set(a_ranks)
    b = jc.add_process_set(b_ranks)
    if rank in a_ranks:
        shape = (2,) if rank == a_ranks[0] else (3,)
        e = expect_error(lambda: jc.allreduce(jnp.ones(shape), "sum", name="bad", process_set=a),
                         "MismatchError", "'bad'", f"process set {a.process_set_id}")
        if len(a_ranks) > 1:
            assert "shape" in str(e), e
        # The set keeps working afterwards.
        y = jc.allreduce(jnp.ones(2), "sum", name="after", process_set=a)
        assert_close(y, np.full(2, len(a_ranks), np.float32), "after mismatch")
    else:
        for i in range(50):
            y = jc.allreduce(jnp.full(2, float(i)), "sum", name="b.ok", process_set=b)
            assert_close(y, np.full(2, i * len(b_ranks), np.float32), "b.ok")
    done("process-sets-mismatch")

elif scenario == "stall":
    a_ranks, b_ranks = halves()
    a = jc.add_process_set(a_ranks)
    b = jc.add_process_set(b_ranks)
    laggard = a_ranks[-1]
    COMM.Barrier()
    t0 = time.perf_counter()
    if rank in a_ranks and rank != laggard:
        e = expect_error(lambda: jc.allreduce(jnp.ones(2), "sum", name="a.never", process_set=a),
                         "StallError", "a.never")
        waited = time.perf_counter() - t0
        assert 1.5 < waited < 20, waited
    elif rank in b_ranks:
        for i in range(100):
            y = jc.allreduce(jnp.full(3, float(i)), "sum", name="b.work", process_set=b)
            assert_close(y, np.full(3, i * len(b_ranks), np.float32), "b.work")
        finished = time.perf_counter() - t0
        print(f"rank {rank}: set B finished 100 allreduces in {finished:.2f} s while set A stalls",
              flush=True)
        assert finished < 1.5, f"set B was held up by set A's stall: {finished:.2f} s"
    COMM.Barrier()
    # Both sets (and the job) keep working.
    if rank in a_ranks:
        assert_close(jc.allreduce(jnp.ones(()), "sum", name="a.after", process_set=a),
                     np.float32(len(a_ranks)), "a.after")
    assert_close(jc.allreduce(jnp.ones(()), "sum", name="g.after"), np.float32(size), "g.after")
    done("process-sets-stall")

elif scenario == "lifecycle":
    # Registered at init, on every rank.
    jc.shutdown()
    first = jc.ProcessSet([0, size - 1])
    jc.init(process_sets=[first])
    assert first.process_set_id == 1, first
    # Adding the same ranks again fails on every rank, alike.
    expect_error(lambda: jc.add_process_set([size - 1, 0]), "ValueError", "already")
    # Ranks that disagree fail on every rank (nothing hangs).
    expect_error(lambda: jc.add_process_set([0, 1] if rank == 0 else [0, 2]), "ValueError",
                 "disagree", "rank 0: [0, 1]")
    # A non-member cannot use it.
    if not first.included():
        expect_error(lambda: jc.allreduce(jnp.ones(2), process_set=first), "ValueError",
                     f"rank {rank} is not a member of process set 1")
    else:
        y = jc.allreduce(jnp.full(2, float(rank)), "sum", process_set=first)
        assert_close(y, np.full(2, size - 1, np.float32), "first")
    # Broadcast roots are global ranks.
    if first.included():
        v = jc.broadcast(jnp.asarray(float(rank)), root=size - 1, process_set=first)
        assert float(v) == size - 1, float(v)
        expect_error(lambda: jc.broadcast(jnp.ones(()), root=1, process_set=first), "ValueError",
                     "root=1 is not a member")
    # Bad arguments.
    expect_error(lambda: jc.allreduce(jnp.ones(2), process_set=3), "TypeError", "process_set must be")
    expect_error(lambda: jc.ProcessSet([0, 0]), "ValueError", "duplicates")
    expect_error(lambda: jc.ProcessSet("01"), "TypeError", "list of ranks")

    # Added during a run, used under jit, then removed with work in flight.
    mid = jc.add_process_set([1, 2])
    if mid.included():
        f = jax.jit(lambda x: jc.allreduce(x, "sum", name="mid.x", process_set=mid))
        assert_close(f(jnp.ones(4)), np.full(4, 2, np.float32), "mid")
        assert mid.rank() == rank - 1
    outcome = []
    if rank == 1:
        # In flight on rank 1 only (from another thread); its peer never submits it:
        # removal fails it, clearly.
        def in_flight():
            try:
                jax.block_until_ready(jax.jit(
                    lambda x: jc.allreduce(x, "sum", name="mid.pending", process_set=mid))(jnp.ones(2)))
                outcome.append("completed")
            except Exception as e:  # noqa: BLE001 - checked below
                outcome.append(e)
        pending = threading.Thread(target=in_flight)
        pending.start()
        time.sleep(0.5)
    assert jc.remove_process_set(mid) is True
    if rank == 1:
        pending.join(timeout=30)
        assert not pending.is_alive() and len(outcome) == 1, outcome
        assert "ShutdownError" in str(outcome[0]) and "removed" in str(outcome[0]), outcome
    assert mid.process_set_id is None
    expect_error(lambda: jc.allreduce(jnp.ones(2), process_set=mid), "ValueError", "not registered")
    assert jc.remove_process_set(mid) is False
    assert jc.remove_process_set(jc.global_process_set) is False
    # The same ranks can be added again (a fresh id), and the old set keeps working.
    again = jc.add_process_set([1, 2])
    assert again.process_set_id not in (None, 1, mid.process_set_id), again
    if again.included():
        assert_close(jc.allreduce(jnp.ones(1), "sum", name="again", process_set=again),
                     np.full(1, 2, np.float32), "again")

    # Communicators: a Split registers one set per color in one call; comm= then names it.
    color = 0 if rank < 2 else 1
    split = COMM.Split(color, rank)
    node = jc.add_process_set(split)
    members = [r for r in range(size) if (0 if r < 2 else 1) == color]
    assert node.ranks == members and node.size() == len(members), node
    y = jc.allreduce(jnp.full(2, float(rank)), "sum", name="split", process_set=split)
    assert_close(y, np.full(2, sum(members), np.float32), "split")
    g = jc.allgather(jnp.asarray([rank]), process_set=node)
    assert list(np.asarray(g)) == members
    jc.barrier(process_set=split)
    # mpi4jax's spelling: comm= is the same as process_set=, under jit too.
    z = jax.jit(lambda v: jc.allreduce(v, "sum", name="split.comm", comm=split))(jnp.full(2, float(rank)))
    assert_close(z, np.full(2, sum(members), np.float32), "split comm= jit")
    assert jc.allgather_object(rank, comm=split) == members
    jc.barrier(comm=split)
    expect_error(lambda: jc.allreduce(jnp.ones(1), comm=split, process_set=node), "TypeError", "not both")
    expect_error(lambda: jc.allreduce(jnp.ones(1), comm=node), "TypeError", "mpi4py communicator")
    # The job's communicator names the global set.
    assert_close(jc.allreduce(jnp.ones(1), "sum", process_set=COMM), np.full(1, size, np.float32), "world")
    # A communicator that is not registered (here: every rank, in reverse order) is refused.
    reverse = COMM.Split(0, -rank)
    expect_error(lambda: jc.allreduce(jnp.ones(1), process_set=reverse), "ValueError",
                 "add_process_set(comm)")
    assert jc.remove_process_set(node) is True
    done("process-sets-lifecycle")

else:
    raise SystemExit(f"unknown scenario {scenario}")
