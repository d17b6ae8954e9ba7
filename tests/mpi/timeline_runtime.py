"""The timeline started and stopped while the job runs (jaxcache.start_timeline /
stop_timeline), into files of a directory given by the test.

    timeline_runtime.py DIR

Collectives before start_timeline, between a stop and the next start, and after the
last stop must not appear; the ones in between must, with their process-set scope;
restarting into a new file while one is open completes the old one; only rank 0 writes.
Rank 0 checks the files right here (each stays valid JSON after every event).
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxcache
from _util import COMM, assert_close, done, same_on_all_ranks


def tracks(path: str) -> tuple[set[str], list[dict]]:
    with open(path) as f:
        events = json.load(f)
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    return names, events


def reduce(name: str, process_set=None) -> None:
    n = jaxcache.size() if process_set is None else process_set.size()
    x = jaxcache.allreduce(jnp.ones((8,), jnp.float32), op="sum", name=name,
                           process_set=process_set or jaxcache.global_process_set)
    assert_close(x, np.full((8,), n, np.float32), name)
    if process_set is None:
        same_on_all_ranks(x, name)


def main() -> None:
    out = sys.argv[1]
    one, two, three = (os.path.join(out, f"{k}.json") for k in ("one", "two", "three"))
    jaxcache.init()
    r = jaxcache.rank()
    jaxcache.stop_timeline()  # nothing running: does nothing
    reduce("before")

    # Bad input: a clear error on the rank that writes, nothing written anywhere.
    for bad, exc in (("", ValueError), (7, ValueError)):
        try:
            jaxcache.start_timeline(bad)
        except exc as e:
            assert "path" in str(e), e
        else:
            raise AssertionError(f"start_timeline({bad!r}) did not raise")
    missing = os.path.join(out, "no", "such", "dir.json")
    try:
        jaxcache.start_timeline(missing)
        assert r != 0, "rank 0 created a timeline in a missing directory"
    except OSError as e:
        assert r == 0 and "cannot create timeline file" in str(e) and missing in str(e), e
    reduce("still.fine")

    # Recording: eager, jitted and process-set collectives.
    jaxcache.start_timeline(one)
    pair = jaxcache.add_process_set(list(range(jaxcache.size() - 1)))
    for _ in range(3):
        reduce("t.eager")
    step = jax.jit(lambda t: jaxcache.grouped_allreduce(t, op="sum", name="t.jit"))
    tree = {"w": jnp.ones((4,)), "b": jnp.ones((2,))}
    for _ in range(2):
        got = jax.block_until_ready(step(tree))
    assert_close(got["w"], np.full((4,), jaxcache.size(), np.float32), "t.jit")
    if pair.included():
        reduce("t.pair", pair)
    COMM.Barrier()
    # Restart into a new file while recording: the first file is complete.
    jaxcache.start_timeline(two, mark_cycles=True)
    reduce("t.second")
    jaxcache.stop_timeline()
    reduce("after.stop")
    COMM.Barrier()
    if r == 0:
        size_two = os.path.getsize(two)

    jaxcache.start_timeline(three)
    reduce("t.third")
    jaxcache.stop_timeline()
    jaxcache.stop_timeline()  # twice: still nothing
    reduce("after.last")
    jaxcache.remove_process_set(pair)
    COMM.Barrier()

    if r == 0:
        names, events = tracks(one)
        assert {"t.eager", "t.jit/0of1", "set 1: t.pair"} <= names, names
        assert not names & {"before", "still.fine", "t.second", "after.stop"}, names
        assert sum(e["name"] == "NEGOTIATE" and e["ph"] == "B" for e in events
                   if e.get("pid") in _pids(events, "t.eager")) == 3, "t.eager negotiated 3 times"
        assert not any(e["name"].startswith("CYCLE ") for e in events), "cycles marked without mark_cycles"
        names, events = tracks(two)
        assert names == {"t.second"}, names
        assert any(e["name"].startswith("CYCLE ") for e in events), "mark_cycles=True marks no cycle"
        assert os.path.getsize(two) == size_two, "the file grew after stop_timeline()"
        names, _ = tracks(three)
        assert names == {"t.third"}, names
    else:
        assert not os.path.exists(os.path.join(out, "no")), "a rank other than 0 touched the directory"
    jaxcache.shutdown()
    done("timeline_runtime")


def _pids(events: list[dict], track: str) -> set[int]:
    return {e["pid"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"
            and e["args"]["name"] == track}


if __name__ == "__main__":
    sys.exit(main())
