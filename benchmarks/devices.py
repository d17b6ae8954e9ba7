"""Data-parallel gradient averaging over P processes x N devices: jaxcache's hierarchical
allreduce side by side with its flat one, JAX's own gloo and MPI collectives, and mpi4jax.

    python benchmarks/devices.py --processes 2 --devices 2 [--sets resnet50,small]
        [--methods jaxcache_hier,jaxcache_flat,jax_gloo,jax_mpi,mpi4jax] [--rounds 3]
        [--steps 20] [--warmup 3] [--mpitrampoline-lib /path/to/libmpiwrapper.so]
        [--jax-mpi-init mpi4py|jaxlib] [--job-timeout 600] [--json out.json]
    # smoke run: --steps 3 --rounds 1

Run it WITHOUT mpirun: the driver starts one ``mpirun`` job per method and round
(``mpirun -np K python benchmarks/devices.py --worker METHOD ...``, each with a hard timeout
that kills its process group), alternating the methods round by round (round 1: m1, m2, ...;
round 2 starts with m2, ...). Every method averages the same gradients over all D = P*N
devices of the job; each device holds distinct data (``common.rank_tensor`` of its global
index g = process * N + local index: small integers, so every sum is exact):

- ``jaxcache_hier``: P processes x N devices (``XLA_FLAGS=--xla_force_host_platform_device_count=N``);
  a jitted ``shard_map`` over the local mesh axis "d" of
  ``jaxcache.grouped_allreduce(tree, op="average", axis_name="d")`` (XLA reduces across the
  local devices, jaxcache across the processes).
- ``jaxcache_flat``: P*N processes x 1 device; ``jax.jit(jaxcache.grouped_allreduce(t, op="average"))``.
- ``jax_gloo``: P processes x N devices; JAX's multi-process CPU collectives
  (``jax_cpu_collectives_implementation="gloo"``, ``jax.distributed.initialize``), a jitted
  ``shard_map`` of ``jax.lax.pmean(tree, "d")`` over the global mesh of P*N devices.
- ``jax_mpi``: P*N processes x 1 device (JAX's "mpi" collectives take one device per
  process); the same global-mesh ``pmean``. JAX loads MPI through MPItrampoline: it needs
  ``MPITRAMPOLINE_LIB`` (or ``--mpitrampoline-lib``) naming a ``libmpiwrapper.so`` built
  against the MPI that runs the job; without it the method is skipped. By default mpi4py
  initializes MPI first (MPI_THREAD_MULTIPLE, as for every other method; the wrapper must
  then accept jaxlib's second MPI_Init_thread); ``--jax-mpi-init jaxlib`` leaves it to
  jaxlib, which asks for MPI_THREAD_FUNNELED: with the MPICH wheel and more busy processes
  than cores, MPICH's allreduce then ran 10-100x slower here (it is the thread level, not
  who initializes: mpi4py asking for FUNNELED is as slow).
- ``mpi4jax``: P*N processes x 1 device; per-leaf ``mpi4jax.allreduce(x, op=MPI.SUM)`` under
  ``jit``, divided by the size (skipped when ``import mpi4jax`` fails).
- ``floor_hier`` (P x N) and ``floor_flat`` (P*N x 1): the jaxcache methods' programs with
  ``x * 2`` in place of the reduction: what JAX itself costs for the set's leaves on that
  layout (not checked); the targets also compare jaxcache above each floor.

Each worker builds its inputs once, checks one step against NumPy on every process (a
method that fails the check is reported, never timed), then times ``--steps`` steps after
``--warmup`` untimed ones (barrier before each step, the slowest process counts) and prints
one JSON line. The driver prints, per set and method, the median ms per step over all
rounds, the spread of the per-round medians, the ratios against jax_gloo and jax_mpi, and
whether jaxcache_hier meets its targets (<= 0.5x jax_gloo, <= jax_mpi, <= jaxcache_flat).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
METHODS = ("jaxcache_hier", "jaxcache_flat", "jax_gloo", "jax_mpi", "mpi4jax", "floor_hier", "floor_flat")
# The floors: the same jitted program with `x * 2` in place of the reduction (JAX's own cost of
# dispatching the set's leaves on that layout), not checked against the average.
FLOORS = {"floor_hier", "floor_flat"}
# Methods with N devices in each of P processes; the others run P*N processes of 1 device.
MULTI_DEVICE = {"jaxcache_hier", "jax_gloo", "floor_hier"}
RESULT = "DEVICES_RESULT "  # prefix of the worker's JSON line on stdout
TRAMPOLINE_ENV = "MPITRAMPOLINE_LIB"
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
SETS = ("resnet50", "small")
THREAD_LEVELS = {0: "single", 1: "funneled", 2: "serialized", 3: "multiple"}  # MPICH's values


def load_common(init_mpi: bool) -> ModuleType:
    """benchmarks/common.py; ``init_mpi=False`` loads mpi4py without starting MPI (the driver
    never uses MPI, and in the jax_mpi worker jaxlib starts it)."""
    import mpi4py

    mpi4py.rc.initialize = init_mpi
    if not init_mpi:
        mpi4py.rc.finalize = False
    sys.path.insert(0, str(HERE))
    import common

    return common


def gradient_set(common: ModuleType, name: str) -> list[tuple[int, ...]]:
    """The shapes of a set: the 161 ResNet-50 tensors, or 1000 leaves of 16 float32."""
    return common.resnet50_shapes() if name == "resnet50" else common.small_set(1000, 16)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=2, help="P: processes of the multi-device methods")
    p.add_argument("--devices", type=int, default=2, help="N: devices per process (P*N devices in all)")
    p.add_argument("--sets", default=",".join(SETS), help="comma list of: " + ",".join(SETS))
    p.add_argument("--methods", default=",".join(METHODS), help="comma list of: " + ",".join(METHODS))
    p.add_argument("--rounds", type=int, default=3, help="jobs per method, methods alternating")
    p.add_argument("--steps", type=int, default=20, help="timed steps per set, method and round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps after the check")
    p.add_argument("--mpitrampoline-lib", default=os.environ.get(TRAMPOLINE_ENV),
                   help=f"libmpiwrapper.so for jax_mpi (default: ${TRAMPOLINE_ENV})")
    p.add_argument("--jax-mpi-init", choices=["mpi4py", "jaxlib"], default="mpi4py",
                   help="jax_mpi: who initializes MPI (mpi4py: THREAD_MULTIPLE; jaxlib: FUNNELED)")
    p.add_argument("--job-timeout", type=float, default=600.0, help="seconds before a job is killed")
    p.add_argument("--json", default=None, help="write the rows and every round's times here")
    p.add_argument("--worker", choices=METHODS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--dump-after", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sets = [s for s in args.sets.split(",") if s]
    args.methods = [m for m in args.methods.split(",") if m]
    for s in args.sets:
        if s not in SETS:
            p.error(f"unknown set {s!r}")
    for m in args.methods:
        if m not in METHODS:
            p.error(f"unknown method {m!r}")
    if args.processes < 1 or args.devices < 1:
        p.error("--processes and --devices must be >= 1")
    return args


# --------------------------------------------------------------------------- worker (under mpirun)


@dataclass(frozen=True)
class Layout:
    """Where this process sits: ``processes`` x ``local`` devices, this one is ``index``."""

    processes: int
    local: int
    index: int

    @property
    def devices(self) -> int:
        return self.processes * self.local


class Skip(Exception):
    """The method cannot run here (a missing package or library); reported, not failed."""


def env_rank() -> tuple[int, int]:
    """(rank, size) from the launcher's environment, before MPI is initialized."""
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    raise RuntimeError("no PMI_RANK/PMI_SIZE (or Open MPI's) in the environment: run under mpirun")


def start_jax_distributed(jax: ModuleType, kind: str, port: int, rank: int, size: int) -> None:
    """JAX's own multi-process runtime with ``kind`` ("gloo" or "mpi") CPU collectives."""
    jax.config.update("jax_cpu_collectives_implementation", kind)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=size, process_id=rank)


def global_mesh_step(jax: ModuleType) -> tuple[Any, Callable[[Any], Any]]:
    """The global mesh over every device of the job and a jitted ``pmean`` over it."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("d",))

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=P("d"), out_specs=P("d"))
    def step(tree: Any) -> Any:
        return jax.lax.pmean(tree, "d")

    return mesh, step


def first_mpi_collective(jax: ModuleType) -> None:
    """JAX's "mpi" communicator must be created on the thread that initialized MPI (the
    main thread, MPI_THREAD_FUNNELED): run a 1-element pmean here, before any other program."""
    mesh, step = global_mesh_step(jax)
    out = step(sharded_leaf(jax, mesh, lambda g: np.ones((1, 1), np.float32)))
    jax.block_until_ready(out)


def sharded_leaf(jax: ModuleType, mesh: Any, shard: Callable[[int], np.ndarray]) -> Any:
    """A global array over ``mesh`` axis "d" whose shard at mesh position g is ``shard(g)``
    (shape (1, *s)); only this process's devices are filled."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = list(mesh.devices.flat)
    local = [(g, d) for g, d in enumerate(devices) if d.process_index == jax.process_index()]
    parts = [jax.device_put(shard(g), d) for g, d in local]
    shape = (len(devices), *parts[0].shape[1:])
    return jax.make_array_from_single_device_arrays(shape, NamedSharding(mesh, P("d")), parts)


def mesh_tree(jax: ModuleType, common: ModuleType, mesh: Any, shapes: Sequence[tuple[int, ...]],
              offset: int) -> list[Any]:
    """The gradient set on every device of ``mesh``: leaf i of the device at mesh position g
    holds ``rank_tensor(shape_i, i, offset + g)``."""
    return [sharded_leaf(jax, mesh, lambda g, s=s, i=i: common.rank_tensor(s, i, offset + g)[None])
            for i, s in enumerate(shapes)]


def shards(tree: Sequence[Any], shapes: Sequence[tuple[int, ...]]) -> list[list[np.ndarray]]:
    """Every leaf's addressable shards as NumPy arrays of the leaf's per-device shape."""
    return [[np.asarray(sh.data).reshape(s) for sh in leaf.addressable_shards]
            for leaf, s in zip(tree, shapes, strict=True)]


@dataclass
class Runtime:
    """A started method: ``build(shapes)`` makes this process's inputs (once) and returns
    the step, which blocks until its outputs are ready."""

    layout: Layout
    build: Callable[[Sequence[tuple[int, ...]]], Callable[[], Any]]
    close: Callable[[], None]
    floor: bool = False  # no reduction: nothing to check


def setup_jaxcache_hier(args: argparse.Namespace, common: ModuleType) -> Runtime:
    import jax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import jaxcache

    jaxcache.init()
    layout = Layout(common.COMM.Get_size(), jax.local_device_count(), common.COMM.Get_rank())
    mesh = Mesh(np.array(jax.local_devices()), ("d",))

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=P("d"), out_specs=P("d"))
    def step(tree: Any) -> Any:
        return jaxcache.grouped_allreduce(tree, op="average", axis_name="d")

    def build(shapes: Sequence[tuple[int, ...]]) -> Callable[[], Any]:
        tree = mesh_tree(jax, common, mesh, shapes, layout.index * layout.local)
        return lambda: jax.block_until_ready(step(tree))

    return Runtime(layout, build, jaxcache.shutdown)


def setup_jaxcache_flat(args: argparse.Namespace, common: ModuleType) -> Runtime:
    import jax
    import jax.numpy as jnp

    import jaxcache

    jaxcache.init()
    layout = Layout(common.COMM.Get_size(), 1, common.COMM.Get_rank())
    step = jax.jit(lambda t: jaxcache.grouped_allreduce(t, op="average"))

    def build(shapes: Sequence[tuple[int, ...]]) -> Callable[[], Any]:
        tree = [jnp.asarray(a) for a in common.rank_tensors(shapes, layout.index)]
        return lambda: jax.block_until_ready(step(tree))

    return Runtime(layout, build, jaxcache.shutdown)


def setup_jax_collectives(kind: str, args: argparse.Namespace, common: ModuleType) -> Runtime:
    """jax_gloo / jax_mpi: JAX's multi-process runtime, a pmean over the global mesh."""
    if common.MPI.Is_initialized():
        rank, size = common.COMM.Get_rank(), common.COMM.Get_size()
        port = common.free_port()
    else:  # jax_mpi with --jax-mpi-init jaxlib: MPI is not up yet, the driver chose the port
        rank, size = env_rank()
        port = args.port
    import jax

    start_jax_distributed(jax, kind, port, rank, size)
    if kind == "mpi":
        first_mpi_collective(jax)  # jaxlib has initialized MPI by now (if mpi4py had not)
    layout = Layout(size, jax.local_device_count(), rank)
    mesh, step = global_mesh_step(jax)

    def build(shapes: Sequence[tuple[int, ...]]) -> Callable[[], Any]:
        tree = mesh_tree(jax, common, mesh, shapes, 0)
        return lambda: jax.block_until_ready(step(tree))

    return Runtime(layout, build, jax.distributed.shutdown)


def setup_jax_gloo(args: argparse.Namespace, common: ModuleType) -> Runtime:
    return setup_jax_collectives("gloo", args, common)


def setup_jax_mpi(args: argparse.Namespace, common: ModuleType) -> Runtime:
    lib = os.environ.get(TRAMPOLINE_ENV)
    if not lib or not Path(lib).is_file():
        raise Skip(f"{TRAMPOLINE_ENV} is not a file: {lib!r}")
    return setup_jax_collectives("mpi", args, common)


def setup_mpi4jax(args: argparse.Namespace, common: ModuleType) -> Runtime:
    import jax
    import jax.numpy as jnp

    m4j, reason = common.optional_import("mpi4jax")
    if m4j is None:
        raise Skip(f"mpi4jax: {reason}")
    comm, size = common.COMM, common.COMM.Get_size()
    layout = Layout(size, 1, comm.Get_rank())

    @jax.jit
    def step(tree: list[Any]) -> list[Any]:
        return [m4j.allreduce(x, op=common.MPI.SUM, comm=comm) / size for x in tree]

    def build(shapes: Sequence[tuple[int, ...]]) -> Callable[[], Any]:
        tree = [jnp.asarray(a) for a in common.rank_tensors(shapes, layout.index)]
        return lambda: jax.block_until_ready(step(tree))

    return Runtime(layout, build, lambda: None)


def setup_floor_hier(args: argparse.Namespace, common: ModuleType) -> Runtime:
    import jax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    layout = Layout(common.COMM.Get_size(), jax.local_device_count(), common.COMM.Get_rank())
    mesh = Mesh(np.array(jax.local_devices()), ("d",))
    step = jax.jit(jax.shard_map(lambda t: [x * 2 for x in t], mesh=mesh, in_specs=P("d"), out_specs=P("d")))

    def build(shapes: Sequence[tuple[int, ...]]) -> Callable[[], Any]:
        tree = mesh_tree(jax, common, mesh, shapes, layout.index * layout.local)
        return lambda: jax.block_until_ready(step(tree))

    return Runtime(layout, build, lambda: None, floor=True)


def setup_floor_flat(args: argparse.Namespace, common: ModuleType) -> Runtime:
    import jax
    import jax.numpy as jnp

    layout = Layout(common.COMM.Get_size(), 1, common.COMM.Get_rank())
    step = jax.jit(lambda t: [x * 2 for x in t])

    def build(shapes: Sequence[tuple[int, ...]]) -> Callable[[], Any]:
        tree = [jnp.asarray(a) for a in common.rank_tensors(shapes, layout.index)]
        return lambda: jax.block_until_ready(step(tree))

    return Runtime(layout, build, lambda: None, floor=True)


SETUPS: dict[str, Callable[[argparse.Namespace, ModuleType], Runtime]] = {
    "jaxcache_hier": setup_jaxcache_hier,
    "jaxcache_flat": setup_jaxcache_flat,
    "jax_gloo": setup_jax_gloo,
    "jax_mpi": setup_jax_mpi,
    "mpi4jax": setup_mpi4jax,
    "floor_hier": setup_floor_hier,
    "floor_flat": setup_floor_flat,
}


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def run_set(rt: Runtime, common: ModuleType, set_name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build, check once against NumPy on every process, then time one set."""
    shapes = gradient_set(common, set_name)
    want = common.reference(shapes, rt.layout.devices, "average")
    step, note = None, ""
    try:
        step = rt.build(shapes)
        got = shards(step(), shapes)
        ok = rt.floor or all(common.all_close(per_leaf, [w] * len(per_leaf)) and len(per_leaf) == rt.layout.local
                             for per_leaf, w in zip(got, want, strict=True))
        note = "floor: x * 2, no reduction" if rt.floor else ("" if ok else "WRONG RESULT")
    except Exception as exc:
        traceback.print_exc()
        ok, note = False, f"error: {error_text(exc)}"
    if not common.agree(ok):
        return {"ok": False, "note": note or "failed on another process"}
    meter = common.OtherLoad()
    meter.start()
    times = common.synced_steps(step, args.warmup, args.steps)
    other = meter.stop()
    meter.free()
    return {"ok": True, "times_ms": [t * 1e3 for t in times], "other_load": other, "note": note}


def emit(record: dict[str, Any]) -> None:
    print(RESULT + json.dumps(record), flush=True)


def worker(args: argparse.Namespace) -> int:
    method = args.worker
    if args.dump_after > 0:  # a hung job shows where it hangs before the driver kills it
        faulthandler.dump_traceback_later(args.dump_after, exit=False)
    common = load_common(init_mpi=not (method == "jax_mpi" and args.jax_mpi_init == "jaxlib"))
    base: dict[str, Any] = {"method": method, "sets": {}}
    try:
        rt = SETUPS[method](args, common)
    except Skip as exc:
        rank = common.COMM.Get_rank() if common.MPI.Is_initialized() else env_rank()[0]
        if rank == 0:
            emit({**base, "skipped": str(exc)})
        return 0
    # An exception in setup propagates: the job fails and the driver reports its output.
    if (rt.layout.processes, rt.layout.local) != layout(method, args):
        raise RuntimeError(f"{method}: {rt.layout.processes} processes x {rt.layout.local} devices, "
                           f"expected {layout(method, args)} (XLA_FLAGS={os.environ.get('XLA_FLAGS')!r})")
    for set_name in args.sets:
        common.say(f"# {method} {rt.layout.processes}x{rt.layout.local} set {set_name}", file=sys.stderr)
        base["sets"][set_name] = run_set(rt, common, set_name, args)
    base.update(processes=rt.layout.processes, local_devices=rt.layout.local,
                mpi_thread_level=THREAD_LEVELS.get(common.MPI.Query_thread()), load=common.load_average())
    if common.COMM.Get_rank() == 0:
        emit(base)
    common.COMM.Barrier()
    rt.close()
    return 0


# --------------------------------------------------------------------------- driver


class Solo:
    """Stands in for a communicator of one (the driver prints with common's helpers)."""

    def Get_rank(self) -> int:  # noqa: N802 (mpi4py's name)
        return 0


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(method: str, args: argparse.Namespace) -> tuple[dict[str, str], dict[str, str]]:
    """The job's environment, and the variables it sets (for the printed command)."""
    _, local = layout(method, args)
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)]
    extra = {"XLA_FLAGS": " ".join([*flags, f"{DEVICE_COUNT_FLAG}={local}"]), "JAX_PLATFORMS": "cpu"}
    if method == "jax_mpi":
        extra[TRAMPOLINE_ENV] = str(Path(args.mpitrampoline_lib).resolve())
    return {**os.environ, **extra}, extra


def job_command(method: str, args: argparse.Namespace) -> list[str]:
    procs, _ = layout(method, args)
    bindir = Path(sys.executable).parent
    mpirun = str(bindir / "mpirun") if (bindir / "mpirun").exists() else "mpirun"
    cmd = [mpirun, "-np", str(procs), "-bind-to", "none", sys.executable, str(Path(__file__).resolve()),
           "--worker", method, "--processes", str(args.processes), "--devices", str(args.devices),
           "--sets", ",".join(args.sets), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--dump-after", str(max(1.0, args.job_timeout - 20))]
    if method == "jax_mpi":
        cmd += ["--jax-mpi-init", args.jax_mpi_init, "--port", str(free_port())]
    return cmd


def failure_lines(lines: Sequence[str]) -> list[str]:
    """What to show of a failed job: the innermost frames of the first stack the worker
    dumped before its timeout (faulthandler), else the last lines of its output."""
    for i, line in enumerate(lines):
        if line.startswith("Timeout ("):
            return lines[i:i + 8]
    return [ln for ln in lines if ln.strip() and not ln.startswith(RESULT)][-8:]


def run_job(method: str, args: argparse.Namespace) -> dict[str, Any]:
    """One mpirun job; its record, or {"error": ...} when it failed or timed out."""
    cmd = job_command(method, args)
    env, extra = job_env(method, args)
    shown = " ".join(f"{k}={v!r}" if " " in v else f"{k}={v}" for k, v in extra.items())
    print(f"$ {shown} {' '.join(cmd[:3])} ... --worker {method}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    timed_out = False
    try:
        text, _ = proc.communicate(timeout=args.job_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpirun and the processes it forked (one session)
        text, _ = proc.communicate()
        timed_out = True
    lines = text.splitlines()
    records = [json.loads(line[len(RESULT):]) for line in lines if line.startswith(RESULT)]
    record: dict[str, Any] = records[-1] if records else {}
    if timed_out:
        record["error"] = f"timed out after {args.job_timeout:.0f} s"
    elif proc.returncode != 0:
        record["error"] = f"exit {proc.returncode}"
    if "error" in record or any(not r.get("ok") for r in record.get("sets", {}).values()):
        print("\n".join(f"#   | {ln}" for ln in failure_lines(lines)), flush=True)
    if not records and not timed_out and "error" in record:
        record["error"] += ": " + next((ln for ln in reversed(lines) if "Error" in ln), "no result line")[:200]
    print(f"#   {method}: {time.perf_counter() - t0:.1f} s" + (f", {record['error']}" if "error" in record else ""),
          flush=True)
    return record


def ms(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def rotated(methods: Sequence[str], r: int) -> list[str]:
    k = r % len(methods)
    return [*methods[k:], *methods[:k]]


def layout(method: str, args: argparse.Namespace) -> tuple[int, int]:
    """(processes, devices per process) of a method's jobs."""
    if method in MULTI_DEVICE:
        return args.processes, args.devices
    return args.processes * args.devices, 1


def summary_row(common: ModuleType, args: argparse.Namespace, set_name: str, method: str,
                jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """One (set, method): median over every timed step of every round, the spread of the
    per-round medians, and why rounds failed."""
    procs, local = layout(method, args)
    row: dict[str, Any] = {"set": set_name, "method": method, "layout": f"{procs}x{local}"}
    times, per_round, failures, other = [], [], [], []
    for job in jobs:
        res = job.get("sets", {}).get(set_name)
        if res and res.get("ok"):
            times += res["times_ms"]
            per_round.append(common.median(res["times_ms"]))
            if res.get("other_load") is not None:
                other.append(res["other_load"])
        else:
            failures.append((res or {}).get("note") or job.get("error") or "no result")
    notes = []
    if times:
        row.update(median_ms=common.median(times), rounds=len(per_round),
                   spread_ms=f"{ms(min(per_round))}-{ms(max(per_round))}",
                   other_load=max(other) if other else None)
    if method == "jax_mpi":
        levels = sorted({str(job.get("mpi_thread_level")) for job in jobs if "mpi_thread_level" in job})
        notes.append(f"MPI initialized by {args.jax_mpi_init}" + (f" ({'/'.join(levels)})" if levels else ""))
    if failures:
        notes.append(f"failed in {len(failures)} of {len(jobs)} rounds: " + "; ".join(sorted(set(failures))))
    row["note"] = "; ".join(notes)
    return row


def summarize(common: ModuleType, args: argparse.Namespace,
              jobs: dict[str, list[dict[str, Any]]], skipped: dict[str, str]) -> list[dict[str, Any]]:
    """The table's rows, per set and method, with the ratios against the JAX baselines."""
    rows = []
    for set_name in args.sets:
        block = []
        for method in args.methods:
            if method in skipped:
                procs, local = layout(method, args)
                block.append({"set": set_name, "method": method, "layout": f"{procs}x{local}",
                              "note": f"skipped ({skipped[method]})"})
            else:
                block.append(summary_row(common, args, set_name, method, jobs.get(method, [])))
        base = {r["method"]: r.get("median_ms") for r in block}
        for r in block:
            r["vs_gloo"] = common.ratio(r.get("median_ms"), base.get("jax_gloo"))
            r["vs_mpi"] = common.ratio(r.get("median_ms"), base.get("jax_mpi"))
        rows += block
    return rows


TARGETS = (("<= 0.5x jax_gloo", "jax_gloo", 0.5), ("<= jax_mpi", "jax_mpi", 1.0),
           ("<= jaxcache_flat", "jaxcache_flat", 1.0))


def targets(rows: Sequence[dict[str, Any]], sets: Sequence[str]) -> list[dict[str, Any]]:
    """Whether jaxcache_hier meets each target in each set (n/a when a side has no time)."""
    out = []
    for set_name in sets:
        med = {r["method"]: r.get("median_ms") for r in rows if r["set"] == set_name}
        hier = med.get("jaxcache_hier")
        for label, other, factor in TARGETS:
            base = med.get(other)
            ok = None if hier is None or base is None else hier <= factor * base
            out.append({"set": set_name, "target": f"jaxcache_hier {label}",
                        "ratio": None if ok is None else hier / base,
                        "holds": {None: "n/a", True: "yes", False: "NO"}[ok]})
        # The same comparison above each layout's floor (what the collectives add to it).
        parts = [med.get(m) for m in ("jaxcache_hier", "floor_hier", "jaxcache_flat", "floor_flat")]
        if all(v is not None for v in parts):
            above_hier, above_flat = parts[0] - parts[1], parts[2] - parts[3]
            out.append({"set": set_name, "target": "jaxcache_hier - floor_hier <= jaxcache_flat - floor_flat",
                        "ratio": above_hier / above_flat if above_flat > 0 else None,
                        "holds": "yes" if above_hier <= above_flat else "NO"})
    return out


def driver(args: argparse.Namespace) -> int:
    common = load_common(init_mpi=False)
    solo = Solo()
    load_before = common.load_average()
    print(f"# devices: P={args.processes} N={args.devices} (D={args.processes * args.devices} devices) "
          f"sets={','.join(args.sets)} methods={','.join(args.methods)} rounds={args.rounds} "
          f"steps={args.steps} warmup={args.warmup} cores={os.cpu_count()} load={load_before}", flush=True)
    skipped: dict[str, str] = {}
    if "jax_mpi" in args.methods:
        lib = args.mpitrampoline_lib
        if not lib:
            skipped["jax_mpi"] = f"no --mpitrampoline-lib or ${TRAMPOLINE_ENV}"
        elif not Path(lib).is_file():
            skipped["jax_mpi"] = f"{lib} is not a file"
    jobs: dict[str, list[dict[str, Any]]] = {}
    t0 = time.time()
    for r in range(args.rounds):
        print(f"# round {r + 1} of {args.rounds}", flush=True)
        for method in rotated(args.methods, r):
            if method in skipped:
                continue
            record = run_job(method, args)
            if "skipped" in record:
                skipped[method] = record["skipped"]
                continue
            jobs.setdefault(method, []).append(record)
    rows = summarize(common, args, jobs, skipped)
    print(f"\n## gradient averaging over {args.processes} processes x {args.devices} devices: "
          f"ms per step, medians ({time.time() - t0:.0f} s)\n", flush=True)
    common.print_table(rows, ["set", "method", "layout", "median_ms", "spread_ms", "rounds", "vs_gloo", "vs_mpi",
                              "other_load", "note"], comm=solo)
    print("\nlayout: processes x devices per process; spread: min-max of the per-round medians; "
          "other_load: the most cores other processes used while a round was timed\n", flush=True)
    checks = targets(rows, args.sets)
    common.print_table(checks, ["set", "target", "ratio", "holds"], comm=solo)
    load_after = common.load_average()
    print(f"# load average before {load_before}, after {load_after} on {os.cpu_count()} cores", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"benchmark": "devices", "P": args.processes, "N": args.devices, "rounds": args.rounds,
             "steps": args.steps, "warmup": args.warmup, "load_before": load_before, "load_after": load_after,
             "rows": rows, "targets": checks, "jobs": jobs, "skipped": skipped}, indent=2) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
