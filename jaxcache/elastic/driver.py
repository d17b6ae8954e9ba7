"""The elastic driver: ``python -m jaxcache.run`` with elastic flags.

MPI cannot shrink or grow a running world portably, so a reset restarts the job (as
``torchrun`` does): the driver ends every worker and starts a new MPI job on the new host
list; ``elastic.run`` resumes it from the newest commit a host holds. The driver

- finds hosts with ``--host-discovery-script`` (``host:slots`` lines, polled) or ``-H``;
- starts each job on up to ``--max-np`` slots of the hosts that are not blacklisted, hosts
  of the previous job first (so rank 0 stays on a host that has the last commit), once at
  least ``--min-np`` slots are there (else it waits up to ``--elastic-timeout`` and fails);
- while a job runs, tells rank 0 at its next commit when the hosts should change (a host of
  the job disappeared, or more slots became usable); every rank then leaves and the job is
  restarted on the new hosts from that commit;
- when a worker raises or dies, blacklists its host and those of the other workers that
  reported an exception before the job ended (for good, or for a cooldown of
  ``--blacklist-cooldown-range`` seconds, doubling with each failure of the host) and
  restarts the job from the last commit;
- fails with a clear message after more than ``--reset-limit`` resets, when every host is
  blacklisted for good, or when a job fails before any worker reached ``elastic.run``.

Which worker failed: each worker holds a TCP link to the driver (protocol.py); the first
link to report a failure, or to close without saying how it ends, names the host.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import math
import os
import random
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

from . import protocol

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
# After a worker failed, how long the launcher gets to end the job itself.
KILL_GRACE = 2.0


def log(message: str) -> None:
    print(f"jaxcache.run: elastic: {message}", file=sys.stderr, flush=True)


class ElasticError(RuntimeError):
    """The elastic job cannot go on (exit status 1, the message on stderr)."""


# --- hosts ----------------------------------------------------------------------


def parse_host_lines(text: str, default_slots: int) -> dict[str, int]:
    """``host[:slots]`` lines (blank lines and # comments skipped), in order."""
    hosts: dict[str, int] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, slots = line.rpartition(":") if ":" in line else (line, "", "")
        if not sep:
            name, count = line, default_slots
        else:
            try:
                count = int(slots)
            except ValueError:
                raise ValueError(f"bad host line {raw!r}: expected host or host:slots") from None
        if not name or count < 0:
            raise ValueError(f"bad host line {raw!r}: expected host or host:slots")
        hosts[name] = hosts.get(name, 0) + count
    return hosts


class Discovery:
    """The hosts now available: a fixed list, or what the discovery script prints."""

    def __init__(self, script: str | None, fixed: dict[str, int], default_slots: int):
        self.script = script
        self.fixed = fixed
        self.default_slots = default_slots
        self.last: dict[str, int] = dict(fixed)
        self._warned = False

    def hosts(self) -> dict[str, int]:
        if self.script is None:
            return dict(self.fixed)
        try:
            proc = subprocess.run([self.script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, timeout=30, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                raise RuntimeError(f"exit status {proc.returncode}: {proc.stderr.strip()[-500:]}")
            self.last = parse_host_lines(proc.stdout, self.default_slots)
            self._warned = False
        except (OSError, subprocess.TimeoutExpired, RuntimeError, ValueError) as e:
            if not self._warned:
                self._warned = True
                log(f"host discovery script {self.script} failed ({e}); keeping the last host list")
        return dict(self.last)


class Blacklist:
    """Hosts with a failed worker: for good, or for a cooldown that doubles per failure."""

    def __init__(self, cooldown: tuple[float, float] | None, clock: Callable[[], float] = time.monotonic):
        self.cooldown = cooldown
        self.clock = clock
        self.failures: dict[str, int] = {}
        self.until: dict[str, float] = {}

    def add(self, host: str) -> float:
        """Blacklists `host`; returns for how long (inf: for good)."""
        n = self.failures[host] = self.failures.get(host, 0) + 1
        if self.cooldown is None:
            delay = math.inf
        else:
            low, high = self.cooldown
            delay = min(high, low * 2 ** (n - 1)) * random.uniform(1.0, 1.1)
        self.until[host] = self.clock() + delay
        return delay

    def blocked(self, host: str) -> bool:
        return self.until.get(host, -math.inf) > self.clock()

    def usable(self, hosts: dict[str, int]) -> dict[str, int]:
        return {h: s for h, s in hosts.items() if s > 0 and not self.blocked(h)}

    def blocked_for_good(self, hosts: dict[str, int]) -> bool:
        return bool(hosts) and all(self.until.get(h, -math.inf) == math.inf for h in hosts)


def assign(usable: dict[str, int], previous: Sequence[str], max_np: int | None) -> list[tuple[str, int]]:
    """Slots for the next job: hosts of the previous job first, then the others in order,
    each host filled before the next, up to max_np slots."""
    order = [h for h in previous if h in usable] + [h for h in usable if h not in previous]
    out, left = [], math.inf if max_np is None else max_np
    for host in order:
        take = int(min(usable[host], left))
        if take > 0:
            out.append((host, take))
            left -= take
    return out


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def driver_address(hosts: Sequence[str]) -> str:
    """The address workers reach the driver at."""
    chosen = os.environ.get("JAXCACHE_ELASTIC_DRIVER_ADDR")
    if chosen:
        return chosen
    if all(is_loopback(h) for h in hosts):
        return "127.0.0.1"
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


# --- the workers' links --------------------------------------------------------


@dataclasses.dataclass
class Worker:
    rank: int = -1
    host: str = "?"
    pid: int = 0
    ending: str | None = None  # protocol.DONE / RESET / FAILED, or None
    error: str = ""


class LinkServer:
    """Accepts the workers' links; answers rank 0's queries; notes how each worker ends."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.hosts_updated = False
        self.workers: list[Worker] = []
        self.first_failure: Worker | None = None
        self.all_connected_at: float | None = None
        self.expected = 0
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.sock, selectors.EVENT_READ, None)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="jaxcache-elastic-links", daemon=True)
        self._thread.start()

    def new_job(self, expected: int) -> None:
        with self.lock:
            self.hosts_updated = False
            self.workers = []
            self.first_failure = None
            self.all_connected_at = None
            self.expected = expected

    def failed_hosts(self) -> list[str]:
        """Hosts of the workers that failed: the first failure's, then every other worker's
        that reported an exception before the job ended (a killed peer is not one)."""
        with self.lock:
            hosts = [self.first_failure.host] if self.first_failure is not None else []
            for w in self.workers:
                if w.ending == protocol.FAILED and w.host not in hosts:
                    hosts.append(w.host)
            return hosts

    def reset_requested(self) -> bool:
        with self.lock:
            return any(w.ending == protocol.RESET for w in self.workers)

    def connected(self) -> int:
        with self.lock:
            return len(self.workers)

    def _loop(self) -> None:
        while not self._stop:
            for key, _ in self._selector.select(timeout=0.5):
                if key.data is None:
                    conn, _ = self.sock.accept()
                    conn.setblocking(True)
                    self._selector.register(conn, selectors.EVENT_READ, (protocol.LineReader(conn), Worker()))
                    continue
                reader, worker = key.data
                try:
                    messages = reader.messages()
                except (OSError, ValueError):
                    messages = None
                if messages is None:
                    self._selector.unregister(reader.sock)
                    reader.sock.close()
                    with self.lock:
                        if worker.ending is None and worker in self.workers and self.first_failure is None:
                            worker.error = "the process died"
                            self.first_failure = worker
                    continue
                for m in messages:
                    self._handle(reader, worker, m)

    def _handle(self, reader: protocol.LineReader, worker: Worker, m: dict) -> None:
        kind = m.get("kind")
        with self.lock:
            if kind == protocol.HELLO:
                worker.rank, worker.host, worker.pid = int(m["rank"]), str(m["host"]), int(m["pid"])
                self.workers.append(worker)
                if len(self.workers) == self.expected:
                    self.all_connected_at = time.monotonic()
            elif kind == protocol.QUERY:
                updated = self.hosts_updated
            elif kind in protocol.ENDINGS:
                worker.ending = kind
                worker.error = str(m.get("error", ""))
                if kind == protocol.FAILED and self.first_failure is None:
                    self.first_failure = worker
        if kind == protocol.QUERY:
            try:
                protocol.send(reader.sock, updated=updated)
            except OSError:
                pass

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        self.sock.close()


# --- the driver ----------------------------------------------------------------


@dataclasses.dataclass
class Settings:
    np: int
    min_np: int
    max_np: int | None
    discovery_script: str | None
    fixed_hosts: dict[str, int]
    slots_per_host: int
    reset_limit: int | None
    cooldown: tuple[float, float] | None
    elastic_timeout: float
    discovery_interval: float


def settings_from_args(args: argparse.Namespace) -> Settings:
    fixed: dict[str, int] = {}
    if args.hosts:
        fixed = parse_host_lines(args.hosts.replace(",", "\n"), args.slots_per_host)
    elif args.hostfile:
        from .. import _worker_env

        fixed = dict(_worker_env.parse_hostfile(args.hostfile))
    elif not args.host_discovery_script:
        fixed = {"localhost": args.np if args.max_np is None else max(args.np, args.max_np)}
    min_np = args.min_np if args.min_np is not None else args.np
    if args.max_np is not None and args.max_np < min_np:
        raise ElasticError(f"--max-np {args.max_np} is below --min-np {min_np}")
    timeout = args.elastic_timeout
    if timeout is None:
        timeout = float(os.environ.get("HOROVOD_ELASTIC_TIMEOUT", "600"))
    interval = float(os.environ.get("JAXCACHE_ELASTIC_DISCOVERY_INTERVAL", "1.0"))
    cooldown = tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None
    return Settings(np=args.np, min_np=min_np, max_np=args.max_np,
                    discovery_script=args.host_discovery_script, fixed_hosts=fixed,
                    slots_per_host=args.slots_per_host, reset_limit=args.reset_limit,
                    cooldown=cooldown, elastic_timeout=timeout, discovery_interval=interval)


class Driver:
    def __init__(self, settings: Settings, launch: Callable[[list[tuple[str, int]], dict[str, str]], subprocess.Popen]):
        self.s = settings
        self.launch = launch
        self.discovery = Discovery(settings.discovery_script, settings.fixed_hosts, settings.slots_per_host)
        self.blacklist = Blacklist(settings.cooldown)
        self.resets = 0
        self.restart_seconds: list[float] = []
        self.proc: subprocess.Popen | None = None

    def _wait_for_slots(self, previous: Sequence[str]) -> list[tuple[str, int]]:
        deadline = time.monotonic() + self.s.elastic_timeout
        said = False
        while True:
            found = self.discovery.hosts()
            if self.blacklist.blocked_for_good(found):
                raise ElasticError(f"every host has had a failed worker and is blacklisted "
                                   f"({', '.join(found)}); no host is left to run on")
            slots = assign(self.blacklist.usable(found), previous, self.s.max_np)
            total = sum(n for _, n in slots)
            if total >= self.s.min_np:
                return slots
            if time.monotonic() > deadline:
                raise ElasticError(f"timed out after {self.s.elastic_timeout:g} s waiting for "
                                   f"--min-np {self.s.min_np} slots (usable now: {total}; hosts found: "
                                   f"{found or 'none'}; blacklisted: "
                                   f"{[h for h in found if self.blacklist.blocked(h)] or 'none'})")
            if not said:
                said = True
                log(f"waiting for --min-np {self.s.min_np} slots (usable now: {total})")
            time.sleep(self.s.discovery_interval)

    def _needs_update(self, job: list[tuple[str, int]]) -> bool:
        found = self.discovery.hosts()
        job_hosts = [h for h, _ in job]
        if any(h not in found or found[h] <= 0 for h in job_hosts):
            return True  # a host of the job went away
        usable = self.blacklist.usable(found)
        grow = assign(usable, job_hosts, self.s.max_np)
        return sum(n for _, n in grow) > sum(n for _, n in job)

    def run(self, server: LinkServer, state_dir: str) -> int:
        previous: list[str] = []
        generation = 0
        ended_at: float | None = None
        while True:
            job = self._wait_for_slots(previous)
            np_ = sum(n for _, n in job)
            server.new_job(np_)
            hosts_text = ",".join(f"{h}:{n}" for h, n in job)
            log(f"job {generation}: {np_} ranks on {hosts_text}")
            env = {protocol.GENERATION: str(generation), protocol.STATE_DIR: state_dir,
                   protocol.HOROVOD_ELASTIC: "1"}
            self.proc = self.launch(job, env)
            update_sent = False
            next_check = time.monotonic() + self.s.discovery_interval
            failure_seen: float | None = None
            while self.proc.poll() is None:
                time.sleep(0.05)
                if server.first_failure is not None:
                    # A worker is gone: its peers would wait for it in their next
                    # collective. The launcher usually ends them; make sure.
                    failure_seen = failure_seen or time.monotonic()
                    if time.monotonic() - failure_seen > KILL_GRACE:
                        stop_job(self.proc)
                    continue
                if ended_at is not None and server.all_connected_at is not None:
                    self.restart_seconds.append(server.all_connected_at - ended_at)
                    ended_at = None
                if not update_sent and time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.s.discovery_interval
                    if self._needs_update(job):
                        with server.lock:
                            server.hosts_updated = True
                        update_sent = True
                        log("hosts changed: the job moves at its next commit")
            rc = self.proc.returncode
            ended_at = time.monotonic()
            time.sleep(0.2)  # the links of the last workers to exit
            failed = server.first_failure
            if rc == 0 and failed is None:
                if not server.reset_requested():
                    return 0
                reason = "hosts updated"
            elif failed is not None:
                listed = []
                for host in server.failed_hosts():
                    delay = self.blacklist.add(host)
                    listed.append(f"{host} blacklisted " + ("for good" if delay == math.inf else f"for {delay:.1f} s"))
                reason = f"rank {failed.rank} on {failed.host} failed ({failed.error}); {', '.join(listed)}"
            else:
                if server.connected() == 0:
                    raise ElasticError(f"the job failed (exit status {rc}) before any worker reached "
                                       "elastic.run; not restarting")
                reason = f"the job failed (exit status {rc}) without a worker reporting why"
            self.resets += 1
            log(f"reset {self.resets}: {reason}")
            if self.s.reset_limit is not None and self.resets > self.s.reset_limit:
                raise ElasticError(f"the job needed reset {self.resets}, more than --reset-limit "
                                   f"{self.s.reset_limit}; stopping")
            previous = [h for h, _ in job]
            generation += 1

    def interrupt(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)


def stop_job(proc: subprocess.Popen) -> None:
    """Ends the MPI job (its launcher runs in a session of its own): SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def state_root() -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="jaxcache-elastic-", dir=base)


def main(args: argparse.Namespace, make_command: Callable[[argparse.Namespace, dict[str, str]], list[str]],
         base_env: dict[str, str]) -> int:
    """Runs the elastic job; `make_command(job_args, env)` gives the MPI command line."""
    try:
        settings = settings_from_args(args)
    except (ElasticError, ValueError, OSError) as e:
        print(f"jaxcache.run: {e}", file=sys.stderr)
        return 2
    server = LinkServer()
    state_dir = state_root()

    def launch(job: list[tuple[str, int]], extra: dict[str, str]) -> subprocess.Popen:
        names = [h for h, _ in job]
        env = dict(base_env)
        env.update(extra)
        env[protocol.DRIVER] = f"{driver_address(names)}:{server.port}"
        job_args = argparse.Namespace(**vars(args))
        job_args.np = sum(n for _, n in job)
        job_args.hosts = ",".join(f"{h}:{n}" for h, n in job)
        job_args.hostfile = None
        child_env = dict(os.environ)
        child_env.update(env)
        return subprocess.Popen(make_command(job_args, env), env=child_env, start_new_session=True)

    driver = Driver(settings, launch)
    try:
        rc = driver.run(server, state_dir)
        if driver.restart_seconds:
            log(f"{driver.resets} reset(s); restart (last job ended -> every worker of the next "
                f"connected): {', '.join(f'{t:.1f}' for t in driver.restart_seconds)} s")
        return rc
    except ElasticError as e:
        log(str(e))
        return 1
    except KeyboardInterrupt:
        driver.interrupt()
        if driver.proc is not None:
            try:
                driver.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                driver.proc.kill()
        return 130
    finally:
        server.close()
        shutil.rmtree(state_dir, ignore_errors=True)
