"""The Chrome-trace timeline written by rank 0 (JAXCACHE_TIMELINE).

tests/mpi/timeline_job.py runs a known sequence; these tests parse the file and
check, per collective: its negotiation (a tick for each rank's readiness on the
coordinator path, the cached path marked), the fusion-buffer copies and the MPI
call; that cycles are marked on request; and that a job killed with SIGKILL
leaves a file that still parses.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict

import pytest

from conftest import MPI_DIR, mpirun_path, run_mpi

ROUNDS = 3
OPS = {  # track -> phases of one execution, in order
    "a": ["QUEUE", "MPI_ALLREDUCE"],  # 64 bytes alone in its cycle: reduced in place
    "b": ["QUEUE", "MPI_ALLREDUCE"],  # > 1 MiB: reduced in place
    "grads/0of1": ["QUEUE", "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"],
    "params": ["QUEUE", "MPI_BCAST"],
    "gather": ["QUEUE", "MPI_ALLGATHER"],
}
# Small allreduces, once cached, are reduced inside the cycle's own allreduce: their
# negotiation (path "in-cycle") is the whole execution.
IN_CYCLE = {"a", "grads/0of1"}
JIT_TRACKS = [f"J/{g}of12" for g in range(12)]


class Trace:
    def __init__(self, events: list[dict]):
        self.events = events
        self.names = {e["pid"]: e["args"]["name"] for e in events
                      if e.get("ph") == "M" and e.get("name") == "process_name"}
        self.by_track: dict[str, list[dict]] = defaultdict(list)
        for e in events:
            if e.get("ph") != "M" and e["pid"] in self.names:
                self.by_track[self.names[e["pid"]]].append(e)
        self.cycles = [e for e in events if e.get("name", "").startswith("CYCLE ")]

    def negotiations(self, track: str) -> list[dict]:
        """One dict per NEGOTIATE slice: path, ready ticks since the track's previous
        execution, begin/end timestamps and the phases that follow up to the next slice."""
        out: list[dict] = []
        ticks: list[dict] = []
        current = None
        for e in self.by_track[track]:
            if e["name"] == "NEGOTIATE" and e["ph"] == "B":
                current = {"path": e.get("args", {}).get("path"), "begin": e["ts"], "ticks": ticks,
                           "end": None, "after": []}
                ticks = []
                out.append(current)
            elif e["name"] == "NEGOTIATE" and e["ph"] == "E":
                current["end"] = e["ts"]
            elif e["ph"] == "i":
                if current is not None and current["end"] is None:
                    current["ticks"].append(e)
                else:
                    ticks.append(e)  # heard of before rank 0's own request
            elif e["ph"] == "B" and current is not None:
                current["after"].append(e["name"])
        return out


@pytest.fixture(scope="module", params=[2, 3], ids=["np2", "np3"])
def trace(request, tmp_path_factory) -> tuple[Trace, int]:
    n = request.param
    path = tmp_path_factory.mktemp(f"timeline{n}") / "timeline.json"
    run_mpi("timeline_job.py", n, "--rounds", str(ROUNDS), timeout=180,
            env={"JAXCACHE_TIMELINE": str(path), "JAXCACHE_TIMELINE_MARK_CYCLES": "1"})
    with open(path) as f:
        return Trace(json.load(f)), n


def test_well_formed(trace):
    t, _ = trace
    assert isinstance(t.events, list) and t.events
    for e in t.events:
        assert {"name", "ph", "pid"} <= set(e), e
        assert e["ph"] in ("M", "B", "E", "i"), e
        if e["ph"] != "M":
            assert isinstance(e["ts"], int) and e["ts"] >= 0, e
    # One named track per collective, with a sort index.
    assert len(set(t.names.values())) == len(t.names)
    sort_pids = {e["pid"] for e in t.events if e.get("name") == "process_sort_index"}
    assert sort_pids == set(t.names)
    # Events are stamped in writing order.
    stamps = [e["ts"] for e in t.events if e["ph"] != "M"]
    assert stamps == sorted(stamps)
    # Begin/end pairs nest properly on every track.
    for track, events in t.by_track.items():
        stack = []
        for e in events:
            if e["ph"] == "B":
                stack.append(e["name"])
            elif e["ph"] == "E":
                assert stack and stack[-1] == e["name"], f"{track}: unmatched end {e}"
                stack.pop()
        assert not stack, f"{track}: unfinished phases {stack}"


def test_every_collective_has_its_phases(trace):
    t, n = trace
    for track, ops in OPS.items():
        negs = t.negotiations(track)
        assert len(negs) == ROUNDS, f"{track}: {len(negs)} negotiations"
        for k, neg in enumerate(negs):
            assert neg["end"] is not None and neg["end"] >= neg["begin"], (track, neg)
            want = [] if k > 0 and track in IN_CYCLE else ops
            assert neg["after"] == want, f"{track} round {k}: phases {neg['after']} != {want}"


def test_coordinator_path_ticks_each_rank(trace):
    t, n = trace
    for track in [*OPS, "late"]:
        first = t.negotiations(track)[0]
        assert first["path"] == "coordinator", (track, first)
        ready = sorted(e["name"] for e in first["ticks"])
        assert ready == sorted(f"rank {r} ready" for r in range(n)), (track, ready)


def test_cached_path_marked(trace):
    t, _ = trace
    for track in OPS:
        for k, neg in enumerate(t.negotiations(track)[1:], start=2):
            assert neg["path"] == ("in-cycle" if track in IN_CYCLE else "cached"), (track, k, neg)
            assert neg["ticks"] == [], f"{track} round {k}: a cached negotiation has no ready ticks"


def test_cycles_marked(trace):
    t, _ = trace
    numbers = [int(e["name"].split()[1]) for e in t.cycles]
    assert len(numbers) >= ROUNDS * len(OPS)
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    assert all(e["ph"] == "i" and e.get("s") == "g" for e in t.cycles)


def test_fused_jit_requests_are_recorded(trace):
    """The jitted phase: every group request is negotiated (then cached) and reduced."""
    t, _ = trace
    for track in JIT_TRACKS:
        negs = t.negotiations(track)
        assert len(negs) == 5, (track, len(negs))
        assert [x["path"] for x in negs] == ["coordinator"] + ["cached"] * 4, track
    # Each group (two 10 KB tensors) goes through the fusion buffer; groups that
    # share one buffer show the copies and the MPI call on each of their tracks.
    executions = [neg["after"] for track in JIT_TRACKS for neg in t.negotiations(track)]
    assert all(a == OPS["grads/0of1"] for a in executions), executions


# --- fused requests, queueing, and ticks of ranks ready before rank 0 -----


def test_every_fused_request_shows_copies_and_mpi_call(trace):
    t, _ = trace
    missing = [(track, k) for track in JIT_TRACKS
               for k, neg in enumerate(t.negotiations(track)) if "MPI_ALLREDUCE" not in neg["after"]]
    assert not missing, f"requests without an MPI call on their track: {missing[:6]}"


def test_queue_phase(trace):
    t, _ = trace
    for track in OPS:
        phases = {e["name"] for e in t.by_track[track]}
        assert "QUEUE" in phases, f"{track}: phases {sorted(phases)}"


def test_ready_ticks_inside_negotiation(trace):
    t, _ = trace
    first = t.negotiations("late")[0]
    outside = [e["name"] for e in first["ticks"] if not first["begin"] <= e["ts"] <= first["end"]]
    assert not outside, f"'late': ticks before NEGOTIATE began: {outside}"


# --- a killed job ---------------------------------------------------------------


def _lines(stream, q: queue.Queue) -> None:
    for line in stream:
        q.put(line)
    q.put(None)


def test_sigkill_leaves_valid_json(tmp_path):
    path = tmp_path / "killed.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1",
           "JAXCACHE_TIMELINE": str(path)}
    env.pop("JAXCACHE_TIMELINE_MARK_CYCLES", None)
    proc = subprocess.Popen([mpirun_path(), "-np", "2", sys.executable, str(MPI_DIR / "timeline_job.py"),
                             "--forever"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    seen = []
    try:
        deadline = time.monotonic() + 120
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                pytest.fail("the job ended before it was killed:\n" + "".join(seen)[-4000:])
            seen.append(line)
            if line.startswith("RUNNING"):
                break
        time.sleep(0.7)  # the job keeps writing events
    except queue.Empty:
        pytest.fail("the job did not start within 120 s:\n" + "".join(seen)[-4000:])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    with open(path) as f:
        events = json.load(f)  # must parse: the closing bracket is rewritten with every event
    t = Trace(events)
    assert len(t.negotiations("a")) >= 3
    assert not t.cycles  # JAXCACHE_TIMELINE_MARK_CYCLES unset: no cycle marks


# --- started and stopped while the job runs ---------------------------------------


def test_start_and_stop_at_run_time(nranks, tmp_path):
    env = {k: "" for k in ("JAXCACHE_TIMELINE", "JAXCACHE_TIMELINE_MARK_CYCLES")}
    out = run_mpi("timeline_runtime.py", nranks, str(tmp_path), timeout=180, env=env).stdout
    assert f"timeline_runtime: OK on {nranks} ranks" in out, out[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.json", "three.json", "two.json"]
