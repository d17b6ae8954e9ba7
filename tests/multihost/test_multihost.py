"""MPI across "hosts" that are network namespaces joined by veth links.

2 hosts x 2 ranks; mpiexec runs in host 0's namespace, host 1's proxy is started
through netns_exec.sh (in place of ssh), MPICH is forced onto TCP over the veth
(harness.mpi_env).  The veth byte counters prove that the data crossed the link.

Needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN) for `ip netns`; the module skips only
if creating a namespace is refused.  Every job runs under a hard timeout that
SIGKILLs its process group, and every process left in our namespaces is killed
before the namespaces are deleted.

Adding a job: put a rank-side script next to this file that prints JC-RANK lines
(see job_allreduce.py) and add one entry to JOBS.
"""
from __future__ import annotations

import os
import site
import subprocess
import time

import pytest

from harness import FAULT_SYSCTLS, run_job
from netns import NETNS_ETC, NetnsCluster, NetnsPermissionError, cleanup_stale, list_namespaces

HOSTS = 2
RANKS_PER_HOST = 2
NBYTES = 4 << 20          # bytes per rank per allreduce
ITERS = 5
JOB_TIMEOUT = 180.0       # hard limit per mpiexec run (s)
FAULT_BOUND_S = 60.0      # the job must end this soon after the link goes down
OP_TIMEOUT_S = 10.0       # the job's watchdog: abort when one allreduce takes longer

# name -> (rank-side script, python module the job needs or None, MPICH netmod recipe)
JOBS = {
    "mpi4py": ("job_allreduce.py", None, "ofi"),
    "mpi4py-ucx": ("job_allreduce.py", None, "ucx"),
    "jaxcache": ("job_jaxcache.py", "jaxcache", "ofi"),
}


def _probe_netns():
    """Skip the module (only) when namespaces cannot be created for lack of privilege."""
    try:
        cleanup_stale(verbose=False)  # namespaces of SIGKILLed earlier runs (creator dead)
        with NetnsCluster(1):
            pass
    except NetnsPermissionError as e:
        pytest.skip(f"multi-host tests need root to create network namespaces: {e}",
                    allow_module_level=True)


_probe_netns()


def _job_pythonpath(module):
    """Import the job's module here (skipping if absent) and let the ranks find it too."""
    if module is None:
        return []
    mod = pytest.importorskip(module)
    root = os.path.dirname(os.path.dirname(os.path.abspath(mod.__file__)))
    if root in {os.path.abspath(p) for p in site.getsitepackages()}:
        return []
    return [root]


def _ns_inode(cluster, host):
    return cluster.exec(host, ["readlink", "/proc/self/ns/net"], check=True).stdout.strip()


@pytest.fixture(scope="module")
def cluster():
    with NetnsCluster(HOSTS) as cl:
        yield cl
    leaked = [ns for ns in list_namespaces() if cl.id in ns]
    assert not leaked, f"namespaces left behind: {leaked}"


@pytest.fixture(scope="module", params=list(JOBS), ids=list(JOBS))
def job_run(request, cluster):
    script, module, netmod = JOBS[request.param]
    pythonpath = _job_pythonpath(module)
    res = run_job(cluster, script, ["--nbytes", NBYTES, "--iters", ITERS],
                  ranks_per_host=RANKS_PER_HOST, netmod=netmod, timeout=JOB_TIMEOUT,
                  pythonpath=pythonpath)
    return request.param, res


def test_job_succeeds_on_every_rank(job_run, cluster):
    name, res = job_run
    assert not res.timed_out, f"{name} job hung\n{res.describe()}"
    assert res.rc == 0, f"{name} job failed\n{res.describe()}"
    ranks = res.ranks
    assert [r["rank"] for r in ranks] == list(range(HOSTS * RANKS_PER_HOST)), res.describe()
    bad = [r for r in ranks if not r["ok"]]
    assert not bad, f"results differ from NumPy / across ranks: {bad}"
    assert not res.leftover, f"processes outlived mpiexec: {res.leftover}"


def test_ranks_run_in_their_hosts_namespaces(job_run, cluster):
    name, res = job_run
    assert res.rc == 0, res.describe()
    inode = [_ns_inode(cluster, h) for h in range(HOSTS)]
    got = [r["netns"] for r in res.ranks]
    want = [inode[r // RANKS_PER_HOST] for r in range(HOSTS * RANKS_PER_HOST)]
    assert got == want, f"rank -> netns {got}, expected {want} (hosts {cluster.hosts})"


def test_allreduce_bytes_cross_the_veth(job_run, cluster):
    """Each host holds data the other needs in full: >= B bytes per allreduce each way."""
    name, res = job_run
    assert res.rc == 0, res.describe()
    volume = NBYTES * ITERS
    summary = {h: (t["tx_bytes"], t["rx_bytes"]) for h, t in res.traffic.items()}
    print(f"\n[{name}] allreduce {ITERS} x {NBYTES} B = {volume} B; veth (tx, rx) per host: "
          f"{summary}; tx/volume = {[round(t[0] / volume, 3) for t in summary.values()]}")
    for h, t in res.traffic.items():
        assert t["tx_bytes"] >= volume, (
            f"{h}: only {t['tx_bytes']} B left over its veth for {volume} B of allreduce: "
            f"the ranks talked through shared memory, not TCP (check harness.mpi_env)\n{res.traffic}")
        assert t["rx_bytes"] >= volume, res.traffic


def test_process_set_per_host_and_global(cluster):
    """One process set per host (from COMM_WORLD.Split) and the global set, in one jitted step."""
    pythonpath = _job_pythonpath("jaxcache")
    res = run_job(cluster, "job_process_sets.py", ["--ranks-per-host", RANKS_PER_HOST],
                  ranks_per_host=RANKS_PER_HOST, timeout=JOB_TIMEOUT, pythonpath=pythonpath)
    assert not res.timed_out, f"process-set job hung\n{res.describe()}"
    assert res.rc == 0, res.describe()
    assert [r["rank"] for r in res.ranks] == list(range(HOSTS * RANKS_PER_HOST)), res.describe()
    assert all(r["ok"] for r in res.ranks), res.describe()
    print("\n[process sets] per-host set counters (cycles, coordinator rounds, cache hits):",
          [(r["node_cycles"], r["node_coordinator_rounds"], r["node_cache_hits"]) for r in res.ranks])


def test_hosts_given_as_addresses(cluster):
    """mpiexec -hosts 10.77.0.1,10.77.0.2 works as well as host names."""
    res = run_job(cluster, "job_allreduce.py", ["--nbytes", 1 << 16, "--iters", 2],
                  ranks_per_host=1, timeout=JOB_TIMEOUT, use_addresses=True)
    assert res.rc == 0, res.describe()
    assert [r["ok"] for r in res.ranks] == [True, True], res.describe()


# name -> (script, module or None, extra args, extra env) for the link-fault test.
# The job must end by itself once a link dies; its stall detection is what is tested.
FAULT_JOBS = {
    # watchdog: Iallreduce polled with a deadline, then MPI_Abort
    "mpi4py": ("job_allreduce.py", None, ["--op-timeout", OP_TIMEOUT_S], {}),
    # jaxcache: a peer silent past the stall shutdown bound aborts the job
    "jaxcache": ("job_jaxcache.py", "jaxcache", ["--steps", 0],
                 {"JAXCACHE_STALL_CHECK_TIME": "5", "JAXCACHE_STALL_SHUTDOWN_TIME": str(OP_TIMEOUT_S)}),
}
FAULT_OPT_IN: dict[str, str] = {}


@pytest.mark.parametrize("job", list(FAULT_JOBS))
def test_link_fault_ends_the_job(job):
    """Pull host 1's link down mid-loop: the job must exit non-zero within the bound.

    MPICH itself never notices (a dead TCP peer is not an MPI error), so the job
    has to: job_allreduce.py's watchdog calls MPI_Abort, mpiexec then ends without
    waiting for the unreachable proxy, and tcp_retries2=3 in the namespaces makes
    the cut-off host's proxy and ranks give up by themselves shortly after.
    """
    script, module, extra_args, extra_env = FAULT_JOBS[job]
    opt_in = FAULT_OPT_IN.get(job)
    if opt_in and not os.environ.get(opt_in):
        pytest.skip(f"opt-in ({opt_in}=1): with JAXCACHE_STALL_SHUTDOWN_TIME={OP_TIMEOUT_S:g} the "
                    f"jaxcache job was still running 120 s after the link went down when this was written")
    pythonpath = _job_pythonpath(module)
    with NetnsCluster(HOSTS, tcp_sysctls=FAULT_SYSCTLS) as cl:
        def on_line(line, res):
            if "link_down" not in res.events and res.progress and res.progress[-1][0] >= 20:
                cl.link_down(1)
                res.events["link_down"] = time.monotonic()

        res = run_job(cl, script,
                      ["--nbytes", 1 << 20, "--duration", 600, "--progress-every", 10, *extra_args],
                      ranks_per_host=RANKS_PER_HOST, timeout=FAULT_BOUND_S + 60, env=extra_env,
                      on_line=on_line, linger=30.0, pythonpath=pythonpath)
        assert "link_down" in res.events, f"loop never got going\n{res.describe()}"
        assert not res.timed_out, f"job hung after the link went down\n{res.describe()}"
        took = res.events["exit"] - res.events["link_down"]
        print(f"\n[{job}] link down -> mpiexec exit: {took:.1f} s (rc={res.rc}); leftovers on "
              f"the cut-off host: {bool(res.leftover)}, gone by themselves after 2 s + {res.linger_s} s")
        assert res.rc != 0, f"job 'succeeded' with a dead link\n{res.describe()}"
        assert took <= FAULT_BOUND_S, f"job took {took:.1f}s to end\n{res.describe()}"
        if job == "mpi4py":
            # The watchdog fired: its MPI_Abort(3) is the exit status. Its JC-STALL line is
            # only seen when a rank on the connected host fired first (a rank on the cut-off
            # host prints into the dead link).
            assert res.rc == 3 or "JC-STALL" in res.stdout, res.describe()
        # the cut-off host cleans up by itself too (tcp_retries2), not only by our kill
        assert not res.leftover or res.linger_s is not None, (
            f"processes on the cut-off host did not exit by themselves: {res.leftover}")


def test_three_hosts_over_a_bridge():
    """3 hosts x 1 rank through a bridge namespace (odd size, N > 2 topology)."""
    nbytes, iters = 1 << 20, 3
    with NetnsCluster(3) as cl:
        assert cl.bridge
        res = run_job(cl, "job_allreduce.py", ["--nbytes", nbytes, "--iters", iters],
                      ranks_per_host=1, timeout=JOB_TIMEOUT)
    assert res.rc == 0, res.describe()
    assert [r["ok"] for r in res.ranks] == [True] * 3, res.describe()
    assert len({r["netns"] for r in res.ranks}) == 3
    for h, t in res.traffic.items():  # every host needs B bytes in and must send B out
        assert t["tx_bytes"] >= nbytes * iters and t["rx_bytes"] >= nbytes * iters, res.traffic


def test_teardown_on_exception_leaves_nothing():
    made = []
    sleeper = None
    with pytest.raises(KeyboardInterrupt):
        with NetnsCluster(3) as cl:  # 3 hosts: the bridge namespace too
            made = [*cl.hosts, cl.bridge_ns]
            sleeper = subprocess.Popen(cl.exec_argv(1, ["sleep", "300"]))
            raise KeyboardInterrupt
    assert sleeper.wait(timeout=10) != 0  # killed by the teardown
    left = set(list_namespaces()) & set(made)
    assert not left, f"namespaces left: {left}"
    assert not any(os.path.exists(os.path.join(NETNS_ETC, ns)) for ns in made)
