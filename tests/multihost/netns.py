"""Fake "hosts" on one machine: Linux network namespaces joined by veth links.

    with NetnsCluster(2) as cl:           # jc-h0-<id>, jc-h1-<id>
        cl.hosts        # ['jc-h0-<id>', 'jc-h1-<id>']   (host name == namespace name)
        cl.addrs        # ['10.77.0.1', '10.77.0.2']
        cl.exec(0, ['ip', 'addr'])
        cl.tx_bytes(1)  # counter of h1's veth (read inside its namespace)
        cl.link_down(1)

Topology:
  * 2 hosts (default): one direct veth pair  h0:jc0 <-> h1:jc0.
  * N hosts (or bridge=True): every host has jc0, whose peer ``p<i>`` lives in a
    separate bridge namespace ``jc-br-<id>`` enslaved to bridge ``br0``.
  Every interface is created directly inside one of *our* namespaces, so the root
  namespace never sees an interface, an address or a route.

Name resolution: /etc/netns/<ns>/hosts is written for every namespace
(``ip netns exec`` bind-mounts it over /etc/hosts), mapping every host name, and
the machine's own hostname (``gethostname()`` is not namespaced by ``ip netns``),
to that host's address.  It is removed on teardown.

Teardown (``close()``, run by ``__exit__``, atexit and on SIGTERM while the
context is active) kills every process still inside our namespaces, deletes the
namespaces (which deletes their veths) and the /etc/netns files.  Namespaces
left by a SIGKILLed run carry the creator pid in their name;
``python netns.py --cleanup-stale`` deletes those whose creator is dead.
"""
from __future__ import annotations

import atexit
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time

IFACE = "jc0"
NETNS_ETC = "/etc/netns"
_NAME_RE = re.compile(r"^jc-(?:h\d+|br)-(\d+)x[0-9a-f]+$")


class NetnsPermissionError(RuntimeError):
    """Creating a network namespace is not allowed here (not root / no CAP_SYS_ADMIN)."""


def _ip(*args, check=True, timeout=20):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def _netns_pids(ns):
    r = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split() if p.strip().isdigit()]


def _kill_ns_procs(ns, grace=2.0):
    """SIGTERM, then SIGKILL, every process whose network namespace is ``ns``."""
    pids = _netns_pids(ns)
    if not pids:
        return
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _netns_pids(ns):
        time.sleep(0.05)
    for p in _netns_pids(ns):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _netns_pids(ns):
        time.sleep(0.05)


def _delete_ns(ns):
    _kill_ns_procs(ns)
    _ip("netns", "del", ns, check=False)
    d = os.path.join(NETNS_ETC, ns)
    if os.path.isdir(d):
        shutil.rmtree(d, ignore_errors=True)
        return True  # had a hosts dir
    return False


def _rmdir_netns_etc():
    try:
        os.rmdir(NETNS_ETC)  # only succeeds when empty, i.e. nobody else uses it
    except OSError:
        pass


def list_namespaces():
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def cleanup_stale(verbose=True):
    """Delete jc-* namespaces whose creator process no longer exists."""
    removed = []
    etc_touched = False
    for ns in list_namespaces():
        m = _NAME_RE.match(ns)
        if not m:
            continue
        pid = int(m.group(1))
        try:
            os.kill(pid, 0)
            continue  # creator alive: not stale
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        if _delete_ns(ns):
            etc_touched = True
        removed.append(ns)
        if verbose:
            print("removed stale namespace", ns)
    if etc_touched:
        _rmdir_netns_etc()
    return removed


class NetnsCluster:
    """N network namespaces connected by veth (direct pair for 2, bridge otherwise)."""

    def __init__(self, n_hosts=2, subnet="10.77.0", bridge=None, mtu=1500,
                 tcp_sysctls=None, write_hosts=True, disable_ipv6=True):
        if n_hosts < 1:
            raise ValueError("n_hosts >= 1")
        self.n = n_hosts
        self.subnet = subnet
        self.bridge = (n_hosts > 2) if bridge is None else bool(bridge)
        self.mtu = mtu
        self.write_hosts = write_hosts
        self.disable_ipv6 = disable_ipv6
        # Per-namespace TCP sysctls (net.ipv4.* are per network namespace, so
        # this changes nothing outside our namespaces).
        self.tcp_sysctls = dict(tcp_sysctls or {})
        self.id = f"{os.getpid()}x{secrets.token_hex(3)}"
        self.hosts = [f"jc-h{i}-{self.id}" for i in range(n_hosts)]
        self.addrs = [f"{subnet}.{i + 1}" for i in range(n_hosts)]
        self.bridge_ns = f"jc-br-{self.id}" if self.bridge else None
        self.iface = IFACE
        self._created = []
        self._closed = False
        self._lock = threading.Lock()
        self._old_sigterm = None
        self._made_netns_etc = False

    # ------------------------------------------------------------------ setup
    def _add_ns(self, ns):
        r = _ip("netns", "add", ns, check=False)
        if r.returncode != 0:
            err = r.stderr.strip()
            if "Operation not permitted" in err or "Permission denied" in err:
                raise NetnsPermissionError(f"ip netns add {ns}: {err}")
            raise RuntimeError(f"ip netns add {ns}: {err}")
        self._created.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        # No IPv6 on our links: keeps router/neighbour chatter out of the byte counters.
        for k in (("all", "default") if self.disable_ipv6 else ()):
            self.exec(ns, ["sysctl", "-q", "-w", f"net.ipv6.conf.{k}.disable_ipv6=1"], check=False)

    def start(self):
        try:
            for ns in self.hosts:
                self._add_ns(ns)
            if self.bridge:
                self._add_ns(self.bridge_ns)
                b = self.bridge_ns
                _ip("-n", b, "link", "add", "br0", "type", "bridge")
                _ip("-n", b, "link", "set", "br0", "up")
                for i, ns in enumerate(self.hosts):
                    _ip("-n", ns, "link", "add", IFACE, "mtu", str(self.mtu), "type", "veth",
                        "peer", "name", f"p{i}", "netns", b)
                    _ip("-n", b, "link", "set", f"p{i}", "mtu", str(self.mtu), "master", "br0")
                    _ip("-n", b, "link", "set", f"p{i}", "up")
            elif self.n == 2:
                _ip("-n", self.hosts[0], "link", "add", IFACE, "mtu", str(self.mtu), "type", "veth",
                    "peer", "name", IFACE, "netns", self.hosts[1])
            for ns, a in zip(self.hosts, self.addrs):
                if self.n > 1:
                    _ip("-n", ns, "addr", "add", f"{a}/24", "dev", IFACE)
                    _ip("-n", ns, "link", "set", IFACE, "up")
                for k, v in self.tcp_sysctls.items():
                    self.exec(ns, ["sysctl", "-q", "-w", f"{k}={v}"], check=True)
            if self.write_hosts:
                self._write_hosts_files()
            if self.n > 1:
                self._wait_link()
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            try:
                if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                    self._old_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
            except (ValueError, TypeError):
                pass
        return self

    def _on_sigterm(self, signum, frame):
        raise SystemExit(128 + signum)  # unwinds through __exit__ -> close()

    def _write_hosts_files(self):
        me = socket.gethostname()
        if not os.path.isdir(NETNS_ETC):
            os.makedirs(NETNS_ETC)
            self._made_netns_etc = True
        for i, ns in enumerate(self.hosts):
            d = os.path.join(NETNS_ETC, ns)
            os.makedirs(d, exist_ok=True)
            lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
            lines += [f"{a}\t{h} h{j}" for j, (h, a) in enumerate(zip(self.hosts, self.addrs))]
            # gethostname() is the same in every namespace: resolve it to *this* host.
            lines.append(f"{self.addrs[i]}\t{me}")
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write("\n".join(lines) + "\n")

    def _wait_link(self, timeout=10):
        """Wait until every jc0 is operationally up and h0 reaches every other host
        (a TCP RST from a closed port counts as reached)."""
        import sys
        probe = ("import socket,sys\n"
                 "for a in sys.argv[1:]:\n"
                 "    s=socket.socket(); s.settimeout(0.5)\n"
                 "    try: s.connect((a, 9))\n"
                 "    except ConnectionRefusedError: pass\n"
                 "    finally: s.close()\n")
        deadline = time.monotonic() + timeout
        while True:
            # operstate lags the carrier by up to ~1 s (linkwatch); libfabric's tcp
            # provider skips interfaces that are not RUNNING, so wait for it too.
            states = [self.exec(h, ["cat", f"/sys/class/net/{IFACE}/operstate"]).stdout.strip()
                      for h in self.hosts]
            r = self.exec(0, [sys.executable, "-c", probe, *self.addrs[1:]], check=False)
            if r.returncode == 0 and all(s == "up" for s in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"link between namespaces not up: operstate={states} "
                                   f"{r.stderr.strip()[-500:]}")
            time.sleep(0.1)

    # ---------------------------------------------------------------- helpers
    def ns(self, host):
        """Namespace of a host given as index, host name, 'h<i>' alias or address."""
        if isinstance(host, int):
            return self.hosts[host]
        if host in self.hosts or host == self.bridge_ns:
            return host
        if host in self.addrs:
            return self.hosts[self.addrs.index(host)]
        m = re.fullmatch(r"h(\d+)", host)
        if m:
            return self.hosts[int(m.group(1))]
        raise KeyError(host)

    def exec_argv(self, host, argv):
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def exec(self, host, argv, check=False, timeout=30, **kw):
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.exec_argv(host, argv), check=check, timeout=timeout, **kw)

    def counters(self, host, iface=IFACE):
        """{'tx_bytes','rx_bytes','tx_packets','rx_packets'} of ``iface`` inside the host's ns."""
        names = ["tx_bytes", "rx_bytes", "tx_packets", "rx_packets"]
        paths = [f"/sys/class/net/{iface}/statistics/{n}" for n in names]
        r = self.exec(host, ["cat", *paths], check=True)
        return dict(zip(names, (int(v) for v in r.stdout.split())))

    def tx_bytes(self, host, iface=IFACE):
        return self.counters(host, iface)["tx_bytes"]

    def rx_bytes(self, host, iface=IFACE):
        return self.counters(host, iface)["rx_bytes"]

    def link_down(self, host):
        _ip("-n", self.ns(host), "link", "set", IFACE, "down")

    def link_up(self, host):
        _ip("-n", self.ns(host), "link", "set", IFACE, "up")

    def netns_map(self):
        """'name=ns,addr=ns,...' for netns_exec.sh (JC_NETNS_MAP)."""
        items = []
        for i, (h, a) in enumerate(zip(self.hosts, self.addrs)):
            items += [f"{h}={h}", f"{a}={h}", f"h{i}={h}"]
        return ",".join(items)

    def kill_all(self, grace=2.0):
        """Kill every process still running inside our namespaces (leftover ranks/proxies)."""
        for ns in list(self._created):
            _kill_ns_procs(ns, grace=grace)

    def pids(self):
        return {ns: _netns_pids(ns) for ns in self._created}

    # --------------------------------------------------------------- teardown
    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
        errors = []
        for ns in reversed(self._created):
            try:
                _delete_ns(ns)
            except BaseException as e:  # keep going: tear down the rest
                errors.append(f"{ns}: {e!r}")
        self._created = []
        if self._made_netns_etc:
            _rmdir_netns_etc()
        try:
            atexit.unregister(self.close)
        except Exception:
            pass
        if self._old_sigterm is not None:
            try:
                signal.signal(signal.SIGTERM, self._old_sigterm)
            except (ValueError, TypeError):
                pass
            self._old_sigterm = None
        if errors:
            raise RuntimeError("netns teardown errors: " + "; ".join(errors))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cleanup-stale", action="store_true", help="delete jc-* namespaces of dead creators")
    ap.add_argument("--demo", type=int, metavar="N", help="create N hosts, ping, print counters, tear down")
    a = ap.parse_args()
    if a.cleanup_stale:
        cleanup_stale()
    if a.demo:
        with NetnsCluster(a.demo) as cl:
            print(cl.hosts, cl.addrs)
            print(cl.exec(0, ["getent", "hosts", cl.hosts[-1]]).stdout.strip())
            for h in range(cl.n):
                print(cl.hosts[h], cl.counters(h))
