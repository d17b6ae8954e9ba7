"""The launcher: family detection, command lines for Hydra and Open MPI, env mapping, a real run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import re
import textwrap
from pathlib import Path

import pytest

from jaxcache import _worker_env, run


HYDRA_VERSION = """HYDRA build details:
    Version:                                 5.0.2
    Release Date:                            Fri Sep 25 20:45:26 UTC 2026
    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist
"""
OPENMPI4_VERSION = "mpirun (Open MPI) 4.1.2\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
OPENMPI5_VERSION = "mpirun (Open MPI) 5.0.3\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
INTEL_VERSION = "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619\n"
MPICH_LIB = "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 2026\nMPICH ABI: 18:2:6\n"
OPENMPI_LIB = "Open MPI v4.1.2, package: Debian OpenMPI, ident: 4.1.2, repo rev: v4.1.2, Nov 24, 2021"


def args_for(*argv: str):
    return run.parse_args(list(argv))


# --- detection ---------------------------------------------------------------


@pytest.mark.parametrize("text,family", [
    (MPICH_LIB, run.MPICH),
    (OPENMPI_LIB, run.OPENMPI),
    ("Intel(R) MPI Library 2021.10 for Linux* OS\n", run.MPICH),
    ("MVAPICH2 Version: 2.3.7\n", run.MPICH),
    ("Some other MPI 1.0", None),
])
def test_library_family(text, family):
    assert run.library_family(text) == family


@pytest.mark.parametrize("text,family", [
    (HYDRA_VERSION, run.MPICH),
    (OPENMPI4_VERSION, run.OPENMPI),
    (OPENMPI5_VERSION, run.OPENMPI),
    (INTEL_VERSION, run.MPICH),
    ("<failed: no such file>", None),
])
def test_launcher_family(text, family):
    assert run.launcher_family(text) == family


def fake_probe(outputs: dict[str, str]):
    return lambda path: outputs[path]


def test_find_launcher_takes_first_matching_family():
    probe = fake_probe({"/venv/bin/mpirun": OPENMPI4_VERSION, "/usr/bin/mpirun": HYDRA_VERSION})
    got = run.find_launcher(MPICH_LIB, ["/venv/bin/mpirun", "/usr/bin/mpirun"], probe)
    assert got == run.Launcher("/usr/bin/mpirun", run.MPICH)
    got = run.find_launcher(OPENMPI_LIB, ["/venv/bin/mpirun", "/usr/bin/mpirun"], probe)
    assert got == run.Launcher("/venv/bin/mpirun", run.OPENMPI)


def test_find_launcher_mismatch_names_what_was_tried():
    probe = fake_probe({"/usr/bin/mpirun": OPENMPI4_VERSION})
    with pytest.raises(run.LauncherError) as e:
        run.find_launcher(MPICH_LIB, ["/usr/bin/mpirun"], probe)
    msg = str(e.value)
    assert "MPICH Version: 5.0.2" in msg and "/usr/bin/mpirun (Open MPI)" in msg
    assert "pip install mpich" in msg


def test_find_launcher_none_found():
    with pytest.raises(run.LauncherError, match="No mpirun or mpiexec was found"):
        run.find_launcher(OPENMPI_LIB, [], fake_probe({}))


def test_unknown_library():
    with pytest.raises(run.LauncherError, match="unknown MPI library"):
        run.find_launcher("Weird MPI 0.1", ["/x"], fake_probe({"/x": HYDRA_VERSION}))


def test_main_exits_2_with_message_when_no_launcher_fits(monkeypatch, capsys):
    monkeypatch.setattr(run, "mpi_library_version", lambda: MPICH_LIB)
    monkeypatch.setattr(run, "candidate_paths", lambda: ["/opt/ompi/bin/mpirun"])
    monkeypatch.setattr(run, "version_output", lambda p: OPENMPI4_VERSION)
    assert run.main(["-np", "2", "--dry-run", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "no MPI launcher matches" in err and "/opt/ompi/bin/mpirun (Open MPI)" in err


def test_real_detection_on_this_machine():
    """jaxcache's own MPI and the launcher found for it are of the same family."""
    lib = run.mpi_library_version()
    launcher = run.find_launcher()
    assert launcher.family == run.library_family(lib)
    assert run.launcher_family(run.version_output(launcher.path)) == launcher.family


# --- command lines -------------------------------------------------------------

HYDRA = run.Launcher("/venv/bin/mpirun", run.MPICH)
OMPI = run.Launcher("/usr/bin/mpirun", run.OPENMPI)


def test_env_mapping():
    args = args_for("-np", "2", "--fusion-threshold-mb", "8", "--cycle-time-ms", "2.5",
                    "--cache-capacity", "64", "--timeline", "tl.json", "--timeline-mark-cycles",
                    "--stall-check-seconds", "30", "--stall-shutdown-seconds", "120",
                    "--disable-group-fusion", "train.py")
    env = run.env_from_args(args, environ={"JAXCACHE_CACHE_CAPACITY": "5", "JAXCACHE_HEARTBEAT_MS": "50",
                                           "HOME": "/root"})
    assert env == {
        "JAXCACHE_FUSION_THRESHOLD": str(8 * 1024 * 1024),
        "JAXCACHE_CYCLE_TIME": "2.5",
        "JAXCACHE_CACHE_CAPACITY": "64",  # the flag wins over the environment
        "JAXCACHE_TIMELINE": os.path.abspath("tl.json"),
        "JAXCACHE_TIMELINE_MARK_CYCLES": "1",
        "JAXCACHE_STALL_CHECK_TIME": "30",
        "JAXCACHE_STALL_SHUTDOWN_TIME": "120",
        "JAXCACHE_DISABLE_GROUP_FUSION": "1",
        "JAXCACHE_HEARTBEAT_MS": "50",  # already set: passed on to every rank
    }


def test_env_values_parse_with_jaxcache_config(monkeypatch):
    """What the launcher writes is what jaxcache.config reads."""
    from jaxcache import config

    args = args_for("-np", "2", "--fusion-threshold-mb", "0.5", "--cycle-time-ms", "3",
                    "--cache-capacity", "0", "--stall-check-seconds", "0", "x.py")
    for k, v in run.env_from_args(args, environ={}).items():
        monkeypatch.setenv(k, v)
    cfg = config.from_env()
    assert cfg.fusion_threshold == 512 * 1024
    assert cfg.cycle_time_ms == 3.0
    assert cfg.cache_capacity == 0
    assert cfg.stall_check_s == 0.0


def test_horovod_variables_apply_where_ours_are_unset(monkeypatch):
    """A job tuned for horovodrun keeps its tuning: HOROVOD_* is read when JAXCACHE_* is unset."""
    from jaxcache import config

    for s in config.SETTINGS:
        monkeypatch.delenv(s.variable, raising=False)
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
    monkeypatch.setenv("HOROVOD_DISABLE_GROUP_FUSION", "1")
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "1048576")
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "7")
    monkeypatch.setenv("JAXCACHE_CACHE_CAPACITY", "64")  # ours wins
    cfg = config.from_env()
    assert (cfg.cycle_time_ms, cfg.group_fusion, cfg.fusion_threshold, cfg.cache_capacity) == \
        (5.0, False, 1048576, 64)
    assert sorted(config.horovod_variables_used()) == [
        "HOROVOD_CYCLE_TIME=5 (as JAXCACHE_CYCLE_TIME)",
        "HOROVOD_DISABLE_GROUP_FUSION=1 (as JAXCACHE_DISABLE_GROUP_FUSION)",
        "HOROVOD_FUSION_THRESHOLD=1048576 (as JAXCACHE_FUSION_THRESHOLD)"]
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "soon")
    with pytest.raises(ValueError, match="HOROVOD_STALL_CHECK_TIME_SECONDS='soon'"):
        config.from_env()


def test_no_flags_no_env():
    assert run.env_from_args(args_for("-np", "2", "x.py"), environ={"PATH": "/bin"}) == {}


OURS = ("glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0"
        ":glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824")


def test_allocator_env_adds_malloc_tunables():
    assert run.allocator_env(environ={}) == {"GLIBC_TUNABLES": OURS}
    # the user's tunables are kept, and a tunable they set keeps their value
    assert run.allocator_env(environ={"GLIBC_TUNABLES": "glibc.malloc.tcache_count=16"}) == {
        "GLIBC_TUNABLES": "glibc.malloc.tcache_count=16:" + OURS}
    assert run.allocator_env(environ={"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) == {
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0"
                          ":glibc.malloc.mmap_threshold=33554432"
                          ":glibc.malloc.trim_threshold=1073741824"}
    # so does one set through glibc's older MALLOC_* variable
    assert run.allocator_env(environ={"MALLOC_ARENA_MAX": "4", "MALLOC_TRIM_THRESHOLD_": "0"}) == {
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.mmap_threshold=33554432"}
    assert run.allocator_env(environ={"GLIBC_TUNABLES": "x=1"}, enabled=False) == {}


def test_hydra_command():
    args = args_for("-np", "4", "--hosts", "h1:2,h2:2", "--fusion-threshold-mb", "16",
                    "--cycle-time-ms", "1", "train.py", "--epochs", "3", "-np", "9")
    env = run.env_from_args(args, environ={})
    cmd = run.build_command(args, HYDRA, env, python="/venv/bin/python", environ={})
    assert cmd == ["/venv/bin/mpirun", "-np", "4", "-hosts", "h1:2,h2:2",
                   "-genv", "JAXCACHE_CYCLE_TIME", "1",
                   "-genv", "JAXCACHE_FUSION_THRESHOLD", str(16 << 20),
                   "/venv/bin/python", run.WORKER_ENV, "h1:2,h2:2", "train.py", "--epochs", "3", "-np", "9"]


def test_openmpi_command():
    args = args_for("-np", "4", "--hosts", "h1:2,h2:2", "--cache-capacity", "128",
                    "--mpi-args", "--bind-to none", "train.py", "--lr", "0.1")
    env = run.env_from_args(args, environ={})
    cmd = run.build_command(args, OMPI, env, python="/py",
                            environ={"PATH": "/bin", "PYTHONPATH": "/src"})
    assert cmd == ["/usr/bin/mpirun", "-np", "4", "--host", "h1:2,h2:2",
                   "-x", "PATH", "-x", "PYTHONPATH", "-x", "JAXCACHE_CACHE_CAPACITY=128",
                   "--bind-to", "none", "/py", run.WORKER_ENV, "h1:2,h2:2", "train.py", "--lr", "0.1"]


def test_hostfile_both_families(tmp_path):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("# two nodes\nn1:4\nn2 slots=2 max_slots=8\n\nn3\n")
    args = args_for("-np", "8", "--hostfile", str(hostfile), "t.py")
    for launcher, flag in ((HYDRA, "-f"), (OMPI, "--hostfile")):
        cmd = run.build_command(args, launcher, {}, python="p", environ={})
        assert cmd[3:5] == [flag, str(hostfile)]
        assert cmd[-4:] == ["p", run.WORKER_ENV, "n1:4,n2:2,n3:1", "t.py"]
    args = args_for("-np", "8", "--hostfile", str(tmp_path / "missing"), "t.py")
    with pytest.raises(run.LauncherError, match="cannot read --hostfile"):
        run.build_command(args, HYDRA, {}, python="p", environ={})


def test_worker_placement_follows_the_launchers():
    """Slots filled host by host, wrapping around: horovodrun's rank -> host assignment."""
    hosts = _worker_env.parse_hosts("a:2,b:2")
    assert _worker_env.placement(hosts, 4) == [0, 0, 1, 1]
    assert _worker_env.placement(_worker_env.parse_hosts("a,b"), 5) == [0, 1, 0, 1, 0]
    hydra = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert _worker_env.horovod_variables(hydra, hosts) == {
        "HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_HOSTNAME": "b"}
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    # uneven: local rank 1 exists on host a only, local rank 0 on both
    assert _worker_env.horovod_variables(ompi, _worker_env.parse_hosts("a:2,b:1")) == {
        "HOROVOD_RANK": "2", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_HOSTNAME": "b"}
    # one host: horovodrun's "localhost"
    one = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert _worker_env.horovod_variables(one, [])["HOROVOD_HOSTNAME"] == "localhost"
    # placement changed behind our back (-ppn in --mpi-args): no guessed cross variables
    moved = {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    got = _worker_env.horovod_variables(moved, hosts)
    assert "HOROVOD_CROSS_RANK" not in got and got["HOROVOD_RANK"] == "1"
    assert _worker_env.horovod_variables({}, hosts) == {}


def test_hosts_and_hostfile_exclusive(capsys):
    with pytest.raises(SystemExit):
        args_for("-np", "2", "--hosts", "a:1", "--hostfile", "f", "t.py")


def test_module_instead_of_script(capsys):
    args = args_for("-np", "2", "--cycle-time-ms", "1", "-m", "jaxcache.bench", "--tensors", "10", "-np", "3")
    assert args.script == "-m" and args.script_args == ["jaxcache.bench", "--tensors", "10", "-np", "3"]
    assert args.np == 2 and args.cycle_time_ms == 1.0
    cmd = run.build_command(args, HYDRA, {}, python="/py", environ={})
    assert cmd[cmd.index("/py"):] == ["/py", run.WORKER_ENV, "", "-m", "jaxcache.bench", "--tensors", "10", "-np", "3"]
    with pytest.raises(SystemExit):
        args_for("-np", "2", "-m")
    assert "-m needs a module name" in capsys.readouterr().err


def test_script_words_after_script_are_not_ours():
    args = args_for("-np", "2", "--dry-run", "t.py", "--dry-run", "--timeline", "x")
    assert args.script == "t.py" and args.script_args == ["--dry-run", "--timeline", "x"]
    assert args.timeline is None
    args = args_for("-np", "2", "--", "t.py", "--c")
    assert args.script == "t.py" and args.script_args == ["--c"]


def test_bad_values_are_refused():
    for bad in (["-np", "0", "t.py"], ["-np", "2", "--cycle-time-ms", "-1", "t.py"],
                ["-np", "2", "--cache-capacity", "x", "t.py"], ["-np", "2"]):
        with pytest.raises(SystemExit):
            args_for(*bad)


def test_dry_run_for_mocked_families(monkeypatch, capsys):
    for launcher, flag in ((HYDRA, "-genv JAXCACHE_FUSION_THRESHOLD 1048576"),
                           (OMPI, "-x JAXCACHE_FUSION_THRESHOLD=1048576")):
        monkeypatch.setattr(run, "find_launcher", lambda launcher=launcher: launcher)
        assert run.main(["-np", "3", "--dry-run", "--fusion-threshold-mb", "1", "t.py", "a b"]) == 0
        out = capsys.readouterr().out.strip()
        assert out.startswith(f"{launcher.path} -np 3 ")
        assert flag in out
        assert out.endswith(f"{sys.executable} {run.WORKER_ENV} '' t.py 'a b'")


def test_dry_run_malloc_tuning_flag(monkeypatch, capsys):
    monkeypatch.setattr(run, "find_launcher", lambda: HYDRA)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert run.main(["-np", "2", "--dry-run", "t.py"]) == 0
    assert f"-genv GLIBC_TUNABLES {OURS}" in capsys.readouterr().out
    assert run.main(["-np", "2", "--dry-run", "--no-malloc-tuning", "t.py"]) == 0
    assert "GLIBC_TUNABLES" not in capsys.readouterr().out


def test_dry_run_cli(tmp_path):
    """`python -m jaxcache.run --dry-run` end to end with the real detection."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxcache.run", "-np", "2", "--dry-run", "--timeline", "t.json",
         "train.py", "--epochs", "1"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert " -np 2 " in line and line.endswith("train.py --epochs 1")
    assert ("-genv JAXCACHE_TIMELINE" in line) or ("-x JAXCACHE_TIMELINE=" in line)


# --- a real job --------------------------------------------------------------

TINY = textwrap.dedent("""
    import ctypes
    import os
    import threading
    import jax
    import jax.numpy as jnp
    import jaxcache
    import jaxcache.allocator

    class MallInfo2(ctypes.Structure):
        _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                   "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    def mapped_chunks_with_64mb_allocated():  # the tunables took: no mapping of its own
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.mallinfo2.restype = ctypes.c_void_p, MallInfo2
        before = libc.mallinfo2().hblks  # (chunks mapped before the tunables took effect stay)
        block = libc.malloc(64 << 20)
        chunks = libc.mallinfo2().hblks - before
        libc.free(ctypes.c_void_p(block))
        return chunks

    def threads_allocate_from_the_main_heap():  # glibc took arena_max=1
        # Four threads alive at once: with a second heap in the process (one that a thread
        # got before arena_max took), glibc hands them the heaps in turn.
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        got, all_in = [], threading.Barrier(4)
        def allocate():
            got.append(libc.malloc(1 << 20))
            all_in.wait()
        workers = [threading.Thread(target=allocate) for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        heap = [line.split()[0].split("-") for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]")]
        inside = all(any(int(lo, 16) <= p < int(hi, 16) for lo, hi in heap) for p in got)
        for p in got:
            libc.free(ctypes.c_void_p(p))
        return inside

    def heap_on_huge_pages():  # glibc took hugetlb (or jaxcache advised the heap)
        big = jax.jit(lambda x: x * 2)(jnp.ones(16 << 20, jnp.float32)).block_until_ready()
        lines = open("/proc/self/smaps").read().splitlines()
        huge = 0
        for i, line in enumerate(lines):
            if line.rstrip().endswith("[heap]"):
                for entry in lines[i + 1:i + 30]:
                    if entry.startswith("AnonHugePages:"):
                        huge += int(entry.split()[1])
                        break
        del big
        return huge > 0

    jaxcache.init()
    r, n = jaxcache.rank(), jaxcache.size()
    total = jaxcache.allreduce(jnp.asarray(float(r + 1)), op="sum", name="tiny")
    print(f"rank {r}/{n} sum={float(total):g} fusion={os.environ.get('JAXCACHE_FUSION_THRESHOLD')} "
          f"args={os.sys.argv[1:]} tunables={os.environ.get('GLIBC_TUNABLES')} "
          f"mapped={mapped_chunks_with_64mb_allocated()} main_heap={threads_allocate_from_the_main_heap()} "
          f"huge={heap_on_huge_pages()} allocator={jaxcache.allocator.report()!r}",
          flush=True)
    jaxcache.shutdown()
""")


def run_launcher(argv: list[str], cwd) -> tuple[int, str]:
    """(exit status, output) of `python -m jaxcache.run ARGV`; the whole job is killed on timeout."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    return run_job([sys.executable, "-m", "jaxcache.run", *argv], env, cwd)


def run_job(cmd: list[str], env: dict, cwd=None) -> tuple[int, str]:
    """(exit status, output) of a job; the whole job is killed past 120 s."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True, cwd=cwd)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"job {cmd[:3]} timed out:\n{out[-4000:]}")
    return proc.returncode, out


def glibc_version() -> tuple[int, ...]:
    name = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else ""
    return tuple(int(v) for v in name.split()[-1].split(".")[:2]) if name.startswith("glibc") else (0,)


# The ranks check that glibc took the tunables (mallinfo2 and hugetlb need glibc >= 2.35).
needs_tunable_glibc = pytest.mark.skipif(glibc_version() < (2, 35), reason="needs glibc >= 2.35")


@needs_tunable_glibc
def test_real_two_rank_run(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    rc, out = run_launcher(["-np", "2", "--fusion-threshold-mb", "2", "--timeline", str(tmp_path / "tl.json"),
                            str(script), "x", "--y"], tmp_path)
    assert rc == 0, out
    for r in range(2):
        assert (f"rank {r}/2 sum=3 fusion={2 << 20} args=['x', '--y'] "
                f"tunables={OURS} mapped=0 main_heap=True") in out, out
    # --timeline reached the ranks: rank 0 traced the collective.
    events = json.loads((tmp_path / "tl.json").read_text())
    assert {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "tiny"}} in events


@needs_tunable_glibc
def test_real_two_rank_run_of_a_module(tmp_path):
    (tmp_path / "tiny_module.py").write_text(TINY)
    rc, out = run_launcher(["-np", "2", "-m", "tiny_module", "--z"], tmp_path)
    assert rc == 0, out
    for r in range(2):
        assert f"rank {r}/2 sum=3 fusion=None args=['--z'] tunables={OURS} mapped=0 main_heap=True" in out, out


def thp_available() -> bool:
    try:
        return "[never]" not in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False


def run_plain_mpirun(script, env: dict) -> str:
    """A job started without the launcher (no GLIBC_TUNABLES), as Slurm or a scheduler would."""
    mpirun = Path(sys.executable).parent / "mpirun"
    full = {k: v for k, v in os.environ.items()
            if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_") and not k.startswith("JAXCACHE_")}
    full.update({"JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", **env})
    rc, out = run_job([str(mpirun if mpirun.exists() else "mpirun"), "-np", "2", sys.executable,
                       str(script)], full)
    assert rc == 0, out
    return out


@needs_tunable_glibc
def test_plain_mpirun_job_gets_the_malloc_settings_from_jaxcache(tmp_path):
    """Started without the launcher, each rank tunes its own allocator when the runtime loads:
    no mapping of its own for a 64 MB buffer, one heap for every thread, the heap on huge pages."""
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    out = run_plain_mpirun(script, {})
    for r in range(2):
        assert f"rank {r}/2 sum=3 fusion=None args=[] tunables=None mapped=0 main_heap=True " in out, out
    if thp_available():
        assert out.count("huge=True") == 2, out
    assert out.count("applied in this process: glibc.malloc.arena_max=1") == 2, out


@needs_tunable_glibc
def test_malloc_tuning_opt_out(tmp_path):
    """JAXCACHE_MALLOC_TUNING=0 (and the launcher's --no-malloc-tuning, which sets it) leaves
    glibc's defaults: the 64 MB buffer gets a mapping of its own."""
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    out = run_plain_mpirun(script, {"JAXCACHE_MALLOC_TUNING": "0"})
    assert len(re.findall(r"mapped=[1-9]\d* main_heap=False", out)) == 2, out
    assert out.count("JAXCACHE_MALLOC_TUNING=0: allocator untouched") == 2, out
    rc, out = run_launcher(["-np", "2", "--no-malloc-tuning", str(script)], tmp_path)
    assert rc == 0, out
    assert len(re.findall(r"mapped=[1-9]\d* main_heap=False", out)) == 2, out
    assert out.count("JAXCACHE_MALLOC_TUNING=0: allocator untouched") == 2, out


def test_exit_status_is_the_jobs(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit(3)\n")
    rc, out = run_launcher(["-np", "2", str(script)], tmp_path)
    assert rc == 3, out


HOROVOD_ENV = textwrap.dedent("""
    import os, sys
    import jaxcache
    jaxcache.init()
    names = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")
    got = " ".join(f"{n}=" + os.environ.get("HOROVOD_" + n, "-") for n in names)
    print(f"rank {jaxcache.rank()}/{jaxcache.size()} argv={sys.argv[1:]} {got}", flush=True)
""")


def test_real_run_sets_horovodruns_worker_variables(tmp_path):
    """Each rank sees horovodrun's HOROVOD_* variables; Hydra runs 'localhost' and '127.0.0.1'
    as two hosts on this machine, so the cross rank and size are real."""
    script = tmp_path / "hvd_env.py"
    script.write_text(HOROVOD_ENV)
    rc, out = run_launcher(["-np", "3", "--hosts", "localhost:2,127.0.0.1:1", str(script), "-x"], tmp_path)
    assert rc == 0, out
    expected = {0: "RANK=0 SIZE=3 LOCAL_RANK=0 LOCAL_SIZE=2 CROSS_RANK=0 CROSS_SIZE=2 HOSTNAME=localhost",
                1: "RANK=1 SIZE=3 LOCAL_RANK=1 LOCAL_SIZE=2 CROSS_RANK=0 CROSS_SIZE=1 HOSTNAME=localhost",
                2: "RANK=2 SIZE=3 LOCAL_RANK=0 LOCAL_SIZE=1 CROSS_RANK=1 CROSS_SIZE=2 HOSTNAME=127.0.0.1"}
    for r, line in expected.items():
        assert f"rank {r}/3 argv=['-x'] {line}" in out, out

