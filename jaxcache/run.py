"""Launcher: starts a jaxcache job with the mpirun that matches jaxcache's MPI.

    python -m jaxcache.run -np 4 [--hosts h1:2,h2:2 | --hostfile F]
        [--fusion-threshold-mb X] [--cycle-time-ms X] [--cache-capacity N]
        [--timeline PATH] [--stall-check-seconds S] [--no-malloc-tuning]
        [--dry-run] (train.py | -m MODULE) [ARGS...]

jaxcache runs on the MPI library that mpi4py loaded (MPICH from the `mpich`
wheel by default, or a system MPICH / Open MPI). A job must be started by that
library's own launcher: MPICH's Hydra cannot start Open MPI processes and vice
versa (the ranks would each come up as a job of size 1). The launcher looks,
in order, at `mpirun`/`mpiexec` next to the running Python (where the mpich
wheel puts Hydra), then on PATH, and takes the first whose `--version` names
the same family as `MPI.Get_library_version()`.

The runtime settings become JAXCACHE_* environment variables of every rank,
passed with `-genv` (Hydra) or `-x` (Open MPI) so that they also reach ranks on
other hosts; JAXCACHE_* variables already set in the environment are passed on
the same way (the runtime requires identical settings on every rank).

Every rank starts in jaxcache/_worker_env.py, which sets horovodrun's per-worker
variables (HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK, _CROSS_SIZE,
_HOSTNAME) from the launcher's own and the host list, then execs the script.

Every rank also gets five glibc malloc tunables in GLIBC_TUNABLES (added to what
the variable holds; a tunable the user set, there or through glibc's MALLOC_*
variable, keeps the user's value; --no-malloc-tuning leaves the variable alone):
glibc.malloc.hugetlb=1 (transparent huge pages for the heap, where XLA:CPU keeps
its arrays, as NumPy does for its own), glibc.malloc.arena_max=1 (one heap for
all threads: glibc does not ask for huge pages in the heaps of other threads,
where XLA's worker threads would otherwise allocate the results), and
glibc.malloc.mmap_max=0 (no buffer, however large, gets a mapping of its own,
which the kernel would zero and fault in anew on every call), with
glibc.malloc.mmap_threshold=32 MiB (the same below 32 MiB when the user allows
mappings) and glibc.malloc.trim_threshold=1 GiB, so that the result buffers a
jitted step frees are reused by the next step instead of being handed back to
the kernel and faulted in (zeroed) again. Measured on 2 ranks: a jitted grouped
allreduce of 10 x 1.6 MB 4.1-11 -> 2.6-2.9 ms, of 100 x 1 MB 31-44 -> 28 ms, a
jitted 100 MB alltoall 15-17 -> 5-6 ms; the quick sweep (python -m
jaxcache.bench) within 1.08x of JAX's floor + raw MPI in every cell in 4 runs of
5 (benchmarks/README.md). glibc older than 2.35 ignores hugetlb. The price: freed
memory stays with the process for reuse (up to 1 GiB of it at the top of the
heap), and threads that allocate at the same time share one lock (small blocks
come from per-thread caches without it).

Exit status: the job's, or 2 when no suitable launcher is found.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from . import _worker_env, allocator

MPICH, OPENMPI = "mpich", "openmpi"
FAMILY_NAMES = {MPICH: "MPICH (Hydra)", OPENMPI: "Open MPI"}
MIB = 1 << 20

WORKER_ENV = _worker_env.__file__  # run by path: no jaxcache import before the script's own

# Variables an Open MPI job needs on remote hosts (Hydra forwards the whole environment).
OPENMPI_FORWARD = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV")


class LauncherError(RuntimeError):
    """No launcher fits the MPI library (exit status 2)."""


@dataclasses.dataclass(frozen=True)
class Launcher:
    path: str
    family: str  # MPICH or OPENMPI


def library_family(version_text: str) -> str | None:
    """Family of an MPI library from MPI_Get_library_version()."""
    t = version_text.lower()
    if "open mpi" in t:
        return OPENMPI
    if "mpich" in t or "intel(r) mpi" in t or "mvapich" in t:
        return MPICH
    return None


def launcher_family(version_output: str) -> str | None:
    """Family of a launcher from its `--version` output."""
    t = version_output.lower()
    if "open mpi" in t or "openrte" in t or "open-rte" in t or "prrte" in t:
        return OPENMPI
    if "hydra" in t or "mpich" in t or "intel(r) mpi" in t:
        return MPICH
    return None


def mpi_library_version() -> str:
    """MPI_Get_library_version() of the MPI that mpi4py (and so jaxcache) uses."""
    try:
        import mpi4py

        if "mpi4py.MPI" not in sys.modules:
            mpi4py.rc.initialize = False  # the launcher itself needs no MPI_Init
            mpi4py.rc.finalize = False
        from mpi4py import MPI
    except ImportError as e:
        raise LauncherError(f"cannot load mpi4py to find the MPI library jaxcache uses ({e}); "
                            "pip install mpi4py mpich") from e
    return MPI.Get_library_version()


def candidate_paths() -> list[str]:
    """Launchers to consider, best first, without duplicates."""
    here = Path(sys.executable).parent
    found: list[str] = []
    for p in (here / "mpirun", here / "mpiexec", shutil.which("mpirun"), shutil.which("mpiexec")):
        if p is None:
            continue
        p = str(p)
        if os.path.isfile(p) and os.access(p, os.X_OK) and p not in found:
            found.append(p)
    return found


def version_output(path: str) -> str:
    try:
        proc = subprocess.run([path, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"<failed: {e}>"
    return proc.stdout


def find_launcher(
    library_version: str | None = None,
    candidates: Sequence[str] | None = None,
    probe: Callable[[str], str] | None = None,
) -> Launcher:
    """The first candidate whose family matches the MPI library; LauncherError otherwise."""
    if probe is None:
        probe = version_output
    if library_version is None:
        library_version = mpi_library_version()
    want = library_family(library_version)
    first_line = " ".join(library_version.strip().splitlines()[0].split()) if library_version.strip() else "?"
    if want is None:
        raise LauncherError(
            f"jaxcache.run: unknown MPI library '{first_line}'; jaxcache.run knows MPICH (Hydra) "
            "and Open MPI. Start the job with your MPI's own launcher instead.")
    if candidates is None:
        candidates = candidate_paths()
    tried = []
    for path in candidates:
        fam = launcher_family(probe(path))
        if fam == want:
            return Launcher(path, fam)
        tried.append(f"{path} ({FAMILY_NAMES.get(fam, 'unrecognised')})")
    raise LauncherError(
        f"jaxcache.run: no MPI launcher matches the MPI library jaxcache uses: {first_line} "
        f"({FAMILY_NAMES[want]}). "
        + (f"Tried: {', '.join(tried)}. " if tried else "No mpirun or mpiexec was found next to "
           f"{sys.executable} or on PATH. ")
        + ("Install the matching launcher (pip install mpich puts Hydra's mpirun next to python) "
           "or put it first on PATH, or pass --mpirun PATH." if want == MPICH else
           "Put Open MPI's mpirun first on PATH, or pass --mpirun PATH.")
    )


def check_launcher(path: str, library_version: str | None = None,
                   probe: Callable[[str], str] | None = None) -> Launcher:
    """An explicitly chosen launcher, still checked against the library."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise LauncherError(f"jaxcache.run: --mpirun {path}: no such executable")
    return find_launcher(library_version, [path], probe)


# --- settings -> environment ------------------------------------------------


def _nonneg_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number >= 0")
    return v


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def env_from_args(args: argparse.Namespace, environ: dict | None = None) -> dict[str, str]:
    """JAXCACHE_* variables for every rank: those already set, then the flags."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k.startswith("JAXCACHE_")}
    if args.fusion_threshold_mb is not None:
        b = int(round(args.fusion_threshold_mb * MIB))
        if b < 1:
            raise LauncherError("jaxcache.run: --fusion-threshold-mb must be > 0")
        env["JAXCACHE_FUSION_THRESHOLD"] = str(b)
    if args.cycle_time_ms is not None:
        env["JAXCACHE_CYCLE_TIME"] = _fmt(args.cycle_time_ms)
    if args.cache_capacity is not None:
        env["JAXCACHE_CACHE_CAPACITY"] = str(args.cache_capacity)
    if args.timeline is not None:
        env["JAXCACHE_TIMELINE"] = os.path.abspath(args.timeline)
    if args.timeline_mark_cycles:
        env["JAXCACHE_TIMELINE_MARK_CYCLES"] = "1"
    if args.stall_check_seconds is not None:
        env["JAXCACHE_STALL_CHECK_TIME"] = _fmt(args.stall_check_seconds)
    if args.stall_shutdown_seconds is not None:
        env["JAXCACHE_STALL_SHUTDOWN_TIME"] = _fmt(args.stall_shutdown_seconds)
    if args.disable_group_fusion:
        env["JAXCACHE_DISABLE_GROUP_FUSION"] = "1"
    return env


# The tunables and which of them the user set: one place, jaxcache/allocator.py.
allocator_env = allocator.launcher_env


def worker_hosts(args: argparse.Namespace) -> str:
    """The job's hosts as `h1:2,h2:2` for the ranks' HOROVOD_CROSS_* ('' for one host)."""
    if args.hostfile:
        try:
            return _worker_env.format_hosts(_worker_env.parse_hostfile(args.hostfile))
        except (OSError, ValueError) as e:
            raise LauncherError(f"jaxcache.run: cannot read --hostfile {args.hostfile}: {e}") from e
    return args.hosts or ""


def build_command(args: argparse.Namespace, launcher: Launcher, env: dict[str, str],
                  python: str | None = None, environ: dict | None = None) -> list[str]:
    """The mpirun command line for `launcher`'s family. Every rank starts in
    `_worker_env.py`, which sets horovodrun's per-rank variables and execs the script."""
    environ = os.environ if environ is None else environ
    cmd = [launcher.path, "-np", str(args.np)]
    if launcher.family == MPICH:
        if args.hosts:
            cmd += ["-hosts", args.hosts]
        if args.hostfile:
            cmd += ["-f", args.hostfile]
        for k, v in sorted(env.items()):
            cmd += ["-genv", k, v]
    else:
        if args.hosts:
            cmd += ["--host", args.hosts]
        if args.hostfile:
            cmd += ["--hostfile", args.hostfile]
        for k in OPENMPI_FORWARD:
            if k in environ and k not in env:
                cmd += ["-x", k]
        for k, v in sorted(env.items()):
            cmd += ["-x", f"{k}={v}"]
    cmd += list(args.mpi_args)
    cmd += [python or sys.executable, WORKER_ENV, worker_hosts(args), args.script, *args.script_args]
    return cmd


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jaxcache.run",
        description="Start a jaxcache job with the mpirun that matches jaxcache's MPI library.",
        epilog="Everything after the script (or -m MODULE) is passed to it.", allow_abbrev=False)
    p.add_argument("-np", "-n", "--num-proc", dest="np", type=int, required=True,
                   help="number of processes (ranks)")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("--hosts", "-H", help="hosts with slots, e.g. h1:2,h2:2")
    hosts.add_argument("--hostfile", help="host file in the launcher's format")
    p.add_argument("--fusion-threshold-mb", type=_nonneg_float, metavar="X",
                   help="JAXCACHE_FUSION_THRESHOLD in MiB (default 64)")
    p.add_argument("--cycle-time-ms", type=_nonneg_float, metavar="X",
                   help="JAXCACHE_CYCLE_TIME: minimum ms between busy cycles (default 0)")
    p.add_argument("--cache-capacity", type=_nonneg_int, metavar="N",
                   help="JAXCACHE_CACHE_CAPACITY: response cache entries (default 1024, 0 = off)")
    p.add_argument("--timeline", metavar="PATH", help="JAXCACHE_TIMELINE: Chrome-trace file (rank 0)")
    p.add_argument("--timeline-mark-cycles", action="store_true",
                   help="JAXCACHE_TIMELINE_MARK_CYCLES=1: mark each cycle in the timeline")
    p.add_argument("--stall-check-seconds", type=_nonneg_float, metavar="S",
                   help="JAXCACHE_STALL_CHECK_TIME: warn about stalled collectives (default 60, 0 = off)")
    p.add_argument("--stall-shutdown-seconds", type=_nonneg_float, metavar="S",
                   help="JAXCACHE_STALL_SHUTDOWN_TIME: fail stalled collectives (default 0 = never)")
    p.add_argument("--disable-group-fusion", action="store_true",
                   help="JAXCACHE_DISABLE_GROUP_FUSION=1")
    p.add_argument("--no-malloc-tuning", action="store_true",
                   help="do not add jaxcache's malloc settings to the ranks' GLIBC_TUNABLES")
    p.add_argument("--mpirun", metavar="PATH", help="use this launcher (still checked against the MPI library)")
    p.add_argument("--mpi-args", default="", metavar="'ARGS'",
                   help="extra launcher arguments, one shell-quoted string")
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    elastic = p.add_argument_group(
        "elastic training (any of these runs the job elastically: restarted from its last commit "
        "when a worker fails or the hosts change; docs/elastic.md)")
    elastic.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, metavar="N",
                         help="fewest ranks the job runs with (default: -np)")
    elastic.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, metavar="N",
                         help="most ranks the job grows to (default: every usable slot)")
    elastic.add_argument("--host-discovery-script", metavar="PATH",
                         help="executable printing the available hosts, one 'host[:slots]' a line (polled)")
    elastic.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int, default=1, metavar="N",
                         help="slots of a discovered host printed without ':slots' (default 1)")
    elastic.add_argument("--reset-limit", type=_nonneg_int, metavar="N",
                         help="fail once the job needs more than N resets (default: no limit)")
    elastic.add_argument("--blacklist-cooldown-range", type=_nonneg_float, nargs=2, metavar=("MIN", "MAX"),
                         help="a host with a failed worker comes back after MIN..MAX s, doubling per "
                              "failure (default: blacklisted for good)")
    elastic.add_argument("--elastic-timeout", type=_nonneg_float, metavar="S",
                         help="how long to wait for --min-np slots (default HOROVOD_ELASTIC_TIMEOUT or 600)")
    p.add_argument("script", help="Python script to run on every rank, or -m MODULE to run a module")
    return p


def split_script(p: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(launcher options, [script, *script args]): the script is the first word that is
    neither an option nor an option's value (or -m, as for python), and nothing after it is ours."""
    values = {opt: (a.nargs if isinstance(a.nargs, int) else 1) for a in p._actions if a.option_strings
              for opt in a.option_strings}  # how many words follow each option
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return list(argv[:i]), list(argv[i + 1:])
        if not word.startswith("-") or word in ("-", "-m"):
            break
        i += 1 + values.get(word, 0)
    return list(argv[:i]), list(argv[i:])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, rest = split_script(p, argv)
    args = p.parse_args(ours + ["--"] + rest[:1] if rest else ours)
    args.script_args = rest[1:]
    if args.script == "-m" and not args.script_args:
        p.error("-m needs a module name, as in python -m MODULE")
    if args.np < 1:
        p.error(f"-np must be >= 1, got {args.np}")
    args.mpi_args = shlex.split(args.mpi_args)
    for flag, value in (("--min-np", args.min_np), ("--max-np", args.max_np), ("--slots-per-host", args.slots_per_host)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    if args.blacklist_cooldown_range and args.blacklist_cooldown_range[0] > args.blacklist_cooldown_range[1]:
        p.error("--blacklist-cooldown-range MIN MAX needs MIN <= MAX")
    return args


def is_elastic(args: argparse.Namespace) -> bool:
    """Any elastic flag makes the job elastic (as horovodrun)."""
    return any(v is not None for v in (args.min_np, args.max_np, args.host_discovery_script, args.reset_limit,
                                        args.blacklist_cooldown_range, args.elastic_timeout))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        launcher = check_launcher(args.mpirun) if args.mpirun else find_launcher()
        env = env_from_args(args)
        env.update(allocator_env(enabled=not args.no_malloc_tuning))
        if args.no_malloc_tuning:  # nor may the ranks tune it themselves at import
            env[allocator.VARIABLE] = "0"
    except LauncherError as e:
        print(str(e), file=sys.stderr)
        return 2
    try:
        cmd = build_command(args, launcher, env)
    except LauncherError as e:
        print(str(e), file=sys.stderr)
        return 2
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    if is_elastic(args):
        from .elastic import driver

        return driver.main(args, lambda job_args, job_env: build_command(job_args, launcher, job_env), env)
    # The environment as this interpreter saw it at startup plus our settings
    # (not what a loaded MPI library may have added to the C environment since).
    child_env = dict(os.environ)
    child_env.update(env)
    try:
        proc = subprocess.Popen(cmd, env=child_env)
    except OSError as e:
        print(f"jaxcache.run: cannot start {launcher.path}: {e}", file=sys.stderr)
        return 2
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)  # mpirun forwards it to the ranks
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
