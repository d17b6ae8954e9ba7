"""Helpers shared by the jaxcache benchmarks.

Every benchmark runs under ``mpirun``; timings are taken per step on every rank
and the slowest rank defines the step time. Ratios are always computed against
a baseline measured in the same job.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI  # must be imported before any MPI-using extension

Shape = tuple[int, ...]
COMM = MPI.COMM_WORLD
SHAPES_ENV = "JAXCACHE_RESNET50_SHAPES"
SHAPES_FILE = "resnet50_grad_shapes.json"


def repo_root() -> Path:
    """The repository root (the parent of ``benchmarks/``)."""
    return Path(__file__).resolve().parent.parent


def _shapes_path() -> Path:
    override = os.environ.get(SHAPES_ENV)
    if override:
        return Path(override)
    root = repo_root()
    for candidate in (root.parent / "shared" / SHAPES_FILE, root / "shared" / SHAPES_FILE):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{SHAPES_FILE} not found in {root.parent / 'shared'} or {root / 'shared'}; "
        f"set {SHAPES_ENV}"
    )


def resnet50_shapes() -> list[Shape]:
    """The 161 ResNet-50 parameter shapes (25,557,032 float32 values)."""
    entries = json.loads(_shapes_path().read_text())
    return [tuple(int(d) for d in e["shape"]) for e in entries]


def small_set(n: int = 1000, size: int = 1024) -> list[Shape]:
    """``n`` one-dimensional tensors of ``size`` values each."""
    return [(size,)] * n


GRADIENT_SETS: dict[str, Callable[[], list[Shape]]] = {
    "resnet50": resnet50_shapes,
    "small": small_set,
}


def num_values(shapes: Iterable[Shape]) -> int:
    return sum(math.prod(s) for s in shapes)


def rank_tensor(shape: Shape, index: int, rank: int) -> np.ndarray:
    """Deterministic float32 data; small integers keep every reduction exact."""
    n = math.prod(shape)
    base = (np.arange(n, dtype=np.int64) + 7 * index) % 13
    return (base + rank).astype(np.float32).reshape(shape)


def rank_tensors(shapes: Sequence[Shape], rank: int) -> list[np.ndarray]:
    return [rank_tensor(s, i, rank) for i, s in enumerate(shapes)]


def reference(shapes: Sequence[Shape], size: int, op: str) -> list[np.ndarray]:
    """NumPy reference of ``rank_tensors`` reduced over ``size`` ranks (sum or average)."""
    shift = size * (size - 1) / 2  # sum of the rank offsets
    out = []
    for i, s in enumerate(shapes):
        total = rank_tensor(s, i, 0).astype(np.float64) * size + shift
        out.append((total if op == "sum" else total / size).astype(np.float32))
    return out


def all_close(got: Sequence[Any], want: Sequence[np.ndarray]) -> bool:
    """True if every array of ``got`` matches ``want`` (shape and values)."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        g = np.asarray(g)
        if g.shape != w.shape or not np.allclose(g, w, rtol=1e-6, atol=1e-6):
            return False
    return True


def agree(flag: bool, comm: MPI.Comm = COMM) -> bool:
    """Logical AND of ``flag`` over all ranks."""
    return bool(comm.allreduce(bool(flag), op=MPI.LAND))


def optional_import(name: str, attrs: Sequence[str] = ()) -> tuple[Any, str | None]:
    """Import ``name`` on every rank; returns (module, None) or (None, reason).

    ``attrs`` must all exist on the module, otherwise it counts as unavailable.
    """
    try:
        module, reason = importlib.import_module(name), None
        missing = [a for a in attrs if not hasattr(module, a)]
        if missing:
            module, reason = None, f"{name} lacks {', '.join(missing)}"
    except Exception as exc:  # ImportError, OSError from a missing .so, ...
        module, reason = None, f"{type(exc).__name__}: {exc}"
    if not agree(module is not None):
        return None, reason or "unavailable on another rank"
    return module, None


def free_port(comm: MPI.Comm = COMM) -> int:
    """A free TCP port on rank 0, agreed by all ranks."""
    port = 0
    if comm.Get_rank() == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    return int(comm.bcast(port, root=0))


def timeit_steps(fn: Callable[[], Any], warmup: int, steps: int) -> list[float]:
    """Per-step seconds of ``fn`` (which must block until done), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def synced_steps(
    fn: Callable[[], Any], warmup: int, steps: int, comm: MPI.Comm = COMM
) -> list[float]:
    """Per-step seconds, each step started after a barrier; the slowest rank counts."""
    return synced_batches(fn, warmup, steps, 1, comm)


def synced_batches(
    fn: Callable[[], Any], warmup: int, batches: int, iters: int, comm: MPI.Comm = COMM
) -> list[float]:
    """Per-call seconds averaged over ``iters`` back-to-back calls, one value per batch.

    For latencies too small to time one call at a time; the slowest rank counts.
    """
    for _ in range(warmup):
        fn()
    local = np.empty(batches)
    for b in range(batches):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        local[b] = (time.perf_counter() - t0) / iters
    slowest = np.empty_like(local)
    comm.Allreduce(local, slowest, op=MPI.MAX)
    return slowest.tolist()


def median(xs: Sequence[float]) -> float:
    return float(np.median(xs))


def percentile(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(xs, q))


@dataclass(frozen=True)
class Stats:
    """Summary of per-step seconds."""

    median: float
    p10: float
    p90: float
    n: int

    @classmethod
    def of(cls, xs: Sequence[float]) -> Stats:
        return cls(median(xs), percentile(xs, 10), percentile(xs, 90), len(xs))


def ratio(value: float | None, baseline: float | None) -> float | None:
    if value is None or not baseline:
        return None
    return value / baseline


def is_root(comm: MPI.Comm = COMM) -> bool:
    return comm.Get_rank() == 0


def say(*args: Any, comm: MPI.Comm = COMM, **kwargs: Any) -> None:
    """Print on rank 0 only (``kwargs`` go to ``print``)."""
    if is_root(comm):
        print(*args, flush=True, **kwargs)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0 or abs(v) >= 100:
            return f"{v:.1f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], comm: MPI.Comm = COMM) -> None:
    """Print ``rows`` as a markdown table on rank 0; missing cells print as ``-``."""
    if not is_root(comm):
        return
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    print("\n".join(lines), flush=True)


def load_average() -> float | None:
    """The 1-minute load average (Linux), to flag runs disturbed by other work."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def say_load(when: str, comm: MPI.Comm = COMM) -> float | None:
    """Report the load average on rank 0 relative to the core count."""
    load = load_average()
    if load is not None:
        say(f"# load average {when}: {load:.2f} on {os.cpu_count()} cores", comm=comm, file=sys.stderr)
    return load


def _busy_cpu_seconds() -> float | None:
    """CPU seconds all cores of this host spent busy since boot (Linux), or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """Cores' worth of CPU that processes outside this job used during a measured span.

    Host busy time minus the CPU time of this job's ranks on the same host; near 0 on an
    idle machine. Collective: every rank must call ``start`` and ``stop``.
    """

    def __init__(self, comm: MPI.Comm = COMM) -> None:
        self._comm = comm
        self._node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self._start: tuple[float | None, float, float] = (None, 0.0, 0.0)

    def start(self) -> None:
        self._start = (_busy_cpu_seconds(), time.process_time(), time.perf_counter())

    def stop(self) -> float | None:
        """The largest value over hosts, in cores (e.g. 1.0 = one core fully used by others)."""
        busy0, own0, wall0 = self._start
        busy1, own1, wall1 = _busy_cpu_seconds(), time.process_time(), time.perf_counter()
        own = self._node.allreduce(own1 - own0, op=MPI.SUM)
        local = -1.0 if busy0 is None or busy1 is None else max(0.0, busy1 - busy0 - own) / (wall1 - wall0)
        worst = self._comm.allreduce(local, op=MPI.MAX)
        return None if worst < 0 else worst

    def free(self) -> None:
        self._node.Free()


def finish_row(row: dict[str, Any], meter: "OtherLoad", notes: Sequence[str]) -> dict[str, Any]:
    """A table row's last cells: the load other processes put on the host while it was
    measured (`meter`, started before), and the notes."""
    row["other_load"] = meter.stop()
    meter.free()
    row["note"] = "; ".join(notes)
    return row


def report(rows: Sequence[dict[str, Any]], columns: Sequence[str], benchmark: str, json_path: str | None,
           load_before: float | None, **settings: Any) -> None:
    """The end of every benchmark: its table, the load after, and the JSON record
    (`settings`: the run's parameters, e.g. batches=...)."""
    print_table(rows, columns)
    load_after = say_load("after")
    dump_json(json_path, {"load_before": load_before, "load_after": load_after, "benchmark": benchmark,
                          "P": COMM.Get_size(), **settings, "rows": rows})


def dump_json(path: str | None, payload: dict[str, Any], comm: MPI.Comm = COMM) -> None:
    """Write ``payload`` as JSON from rank 0 if ``path`` is given."""
    if path and is_root(comm):
        Path(path).write_text(json.dumps(payload, indent=2) + "\n")
