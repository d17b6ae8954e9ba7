"""Run an MPI job across network-namespace "hosts" (see netns.py, README.md).

    with NetnsCluster(2) as cl:
        res = run_job(cl, "job_allreduce.py", ["--nbytes", "4194304"], ranks_per_host=2)
        res.rc, res.stdout, res.ranks (parsed JC-RANK lines), res.traffic (veth deltas)

mpiexec (MPICH hydra) runs inside the first host's namespace; every other host's
proxy is started through netns_exec.sh (our "ssh"), so proxies and ranks talk to
each other over the veth links only.  ``mpi_env()`` holds the variables that make
MPICH actually use TCP between the namespaces (without them the ch4:ucx netmod
happily uses shared memory between processes of one machine, namespaces or not).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

# hydra forwards rank output in chunks, not lines: records from different ranks can
# share a line, so jobs write "\nJC-... record\n" in one write and we match records.
RANK_RE = re.compile(r"JC-RANK (\{[^{}\n]*\})")
PROGRESS_RE = re.compile(r"JC-PROGRESS (\d+) ([0-9.]+)")

HERE = os.path.dirname(os.path.abspath(__file__))
NETNS_EXEC = os.path.join(HERE, "netns_exec.sh")


def mpi_bin(name="mpiexec"):
    """MPICH tool from the running venv (mpich wheel), $JC_MPI_BIN, or PATH."""
    for d in (os.environ.get("JC_MPI_BIN"), os.path.dirname(sys.executable)):
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    p = shutil.which(name)
    if not p:
        raise FileNotFoundError(f"{name} not found (pip install mpich, or set JC_MPI_BIN)")
    return p


def mpi_env(netmod="ofi", iface="jc0"):
    """Environment that forces MPICH (5.x, ch4) onto TCP over ``iface`` between hosts.

    netmod="ofi": ch4:ofi with libfabric's tcp provider (rxm on top).
    netmod="ucx": ch4:ucx restricted to its tcp transport.
    netmod=None:  nothing (the wheel's defaults: ch4:ucx with shared memory even
                  between namespaces; only for experiments, see README).
    Processes of one host still use MPICH's own POSIX shared memory between each
    other (as on a real cluster); set MPIR_CVAR_NOLOCAL=1 to send those over TCP too.
    """
    env = {}
    if netmod == "ofi":
        env.update({
            "MPIR_CVAR_CH4_NETMOD": "ofi",  # wheel default is ucx
            "FI_PROVIDER": "tcp",          # never libfabric's shm/sockets/verbs providers
            "FI_TCP_IFACE": iface,         # listen/connect on the veth, not lo
        })
    elif netmod == "ucx":
        env.update({
            "MPIR_CVAR_CH4_NETMOD": "ucx",
            "UCX_TLS": "tcp,self",         # default includes sm/cma: shared memory across netns
            "UCX_NET_DEVICES": iface,
        })
    elif netmod is not None:
        raise ValueError(netmod)
    return env


# Per-namespace TCP sysctls for the link-fault test (net.ipv4.* sysctls are per
# network namespace: NetnsCluster(tcp_sysctls=FAULT_SYSCTLS) changes nothing else).
# No MPICH/libfabric/UCX variable turns a dead TCP peer into an MPI error (see
# README), so ending the job is the job's watchdog's business (--op-timeout).
FAULT_SYSCTLS = {
    # Give up on unacknowledged data after ~3 s of RTO backoff instead of ~15 min.
    # Without it mpiexec still ends (it does not wait for a proxy it cannot reach),
    # but the cut-off host's proxy and ranks linger for many minutes.
    "net.ipv4.tcp_retries2": "3",
}


@dataclass
class JobResult:
    rc: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool
    cmd: list
    traffic: dict = field(default_factory=dict)  # host -> {tx_bytes: delta, ...}
    progress: list = field(default_factory=list)  # (iter, seconds) from JC-PROGRESS
    events: dict = field(default_factory=dict)    # name -> time.monotonic(): 'exit', link_down...
    leftover: dict = field(default_factory=dict)  # ns -> [cmdline] alive 2 s after mpiexec ended
    linger_s: float | None = None                 # further time they took to exit by themselves

    @property
    def ranks(self):
        out = []
        for line in self.stdout.splitlines():
            for m in RANK_RE.finditer(line):
                out.append(json.loads(m.group(1)))
        return sorted(out, key=lambda d: d["rank"])

    def describe(self):
        return (f"rc={self.rc} timed_out={self.timed_out} wall={self.wall_s:.1f}s\n"
                f"cmd: {' '.join(self.cmd)}\n--- stdout (tail)\n{self.stdout[-4000:]}\n"
                f"--- stderr (tail)\n{self.stderr[-4000:]}")


def build_cmd(cluster, script, args=(), ranks_per_host=2, hosts=None, python=None,
              use_addresses=False, extra_mpiexec_args=()):
    hosts = list(range(cluster.n)) if hosts is None else list(hosts)
    names = [cluster.addrs[h] if use_addresses else cluster.hosts[h] for h in hosts]
    script = script if os.path.isabs(script) else os.path.join(HERE, script)
    mpiexec = mpi_bin("mpiexec")
    return [
        mpiexec,
        "-launcher", "rsh", "-launcher-exec", NETNS_EXEC,
        # proxies connect back to this address (gethostname() is not namespaced)
        "-localhost", cluster.addrs[hosts[0]] if use_addresses else cluster.hosts[hosts[0]],
        "-hosts", ",".join(names),
        "-ppn", str(ranks_per_host),
        "-n", str(ranks_per_host * len(hosts)),
        *extra_mpiexec_args,
        python or sys.executable, "-u", script, *map(str, args),
    ]


def run_job(cluster, script, args=(), ranks_per_host=2, hosts=None, netmod="ofi", env=None,
            timeout=120.0, on_line=None, use_addresses=False, extra_mpiexec_args=(),
            linger=0.0, pythonpath=()):
    """Launch ``script`` with mpiexec inside host 0's namespace and wait (hard timeout).

    on_line(line, result) is called from a reader thread for every stdout line
    (used by the fault test to pull a link down once the loop is running).
    On timeout the whole process group is SIGKILLed, and in every case any process
    left in the cluster's namespaces (e.g. a remote proxy cut off by a dead link)
    is killed before returning.  With ``linger`` > 0, first wait up to that many
    seconds for those processes to exit on their own (res.linger_s says how long
    it took, None if they did not).
    """
    cmd = build_cmd(cluster, script, args, ranks_per_host, hosts,
                    use_addresses=use_addresses, extra_mpiexec_args=extra_mpiexec_args)
    full_env = dict(os.environ)
    full_env.update(mpi_env(netmod, cluster.iface))
    full_env.setdefault("JAX_PLATFORMS", "cpu")
    full_env["JC_NETNS_MAP"] = cluster.netns_map()
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if pythonpath:
        old = full_env.get("PYTHONPATH")
        full_env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *([old] if old else [])])
    full_env.update(env or {})
    host0 = cluster.hosts[(hosts or [0])[0]]
    argv = ["ip", "netns", "exec", host0, *cmd]

    before = {h: cluster.counters(h) for h in cluster.hosts}
    res = JobResult(None, "", "", 0.0, False, argv)
    out_lines, err_lines = [], []
    interrupted = False
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=HERE)

    def read_out():
        for line in proc.stdout:
            out_lines.append(line)
            for m in PROGRESS_RE.finditer(line):
                res.progress.append((int(m.group(1)), float(m.group(2))))
            if on_line is not None:
                try:
                    on_line(line, res)
                except Exception as e:  # never let a callback wedge the reader
                    err_lines.append(f"[harness] on_line callback failed: {e!r}\n")

    def read_err():
        for line in proc.stderr:
            err_lines.append(line)

    readers = [threading.Thread(target=read_out, daemon=True),
               threading.Thread(target=read_err, daemon=True)]
    for t in readers:
        t.start()
    try:
        res.rc = proc.wait(timeout=timeout)
        res.events["exit"] = time.monotonic()
    except subprocess.TimeoutExpired:
        res.timed_out = True
    except BaseException:  # KeyboardInterrupt, SystemExit (SIGTERM): no grace
        interrupted = True
        _kill_group(proc, only_group=True)
        raise
    finally:
        res.wall_s = time.monotonic() - t0
        if proc.poll() is None:
            _kill_group(proc)
        elif not interrupted:
            # mpiexec ended by itself: what is still running in our namespaces
            # (after a short grace for proxies that are just exiting)?
            t1 = time.monotonic()
            while time.monotonic() - t1 < 2.0 and any(cluster.pids().values()):
                time.sleep(0.05)
            res.leftover = _describe_pids(cluster.pids())
        _kill_group(proc, only_group=True)  # stragglers in mpiexec's process group
        if linger > 0 and res.leftover and not (res.timed_out or interrupted):
            t1 = time.monotonic()
            while time.monotonic() - t1 < linger and any(cluster.pids().values()):
                time.sleep(0.2)
            if not any(cluster.pids().values()):
                res.linger_s = time.monotonic() - t1
        try:
            cluster.kill_all()
        finally:
            for t in readers:
                t.join(timeout=5)
    if res.timed_out:
        res.rc = proc.returncode
    res.stdout = "".join(out_lines)
    res.stderr = "".join(err_lines)
    after = {h: cluster.counters(h) for h in cluster.hosts}
    res.traffic = {h: {k: after[h][k] - before[h][k] for k in after[h]} for h in cluster.hosts}
    return res


def _describe_pids(pids_by_ns):
    out = {}
    for ns, pids in pids_by_ns.items():
        cmds = []
        for p in pids:
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    cmds.append(f"{p} " + f.read().replace(b"\0", b" ").decode(errors="replace")[:160])
            except OSError:
                pass
        if cmds:
            out[ns] = cmds
    return out


def _kill_group(proc, only_group=False):
    try:
        pgid = os.getpgid(proc.pid) if proc.poll() is None else proc.pid
    except ProcessLookupError:
        pgid = proc.pid
    for sig in ((signal.SIGKILL,) if only_group else (signal.SIGTERM, signal.SIGKILL)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if sig == signal.SIGTERM:
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
