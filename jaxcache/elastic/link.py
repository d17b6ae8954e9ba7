"""A worker's link to the elastic driver (see protocol.py); absent outside the driver
(plain mpirun): then nothing is reported and the host set never changes."""

from __future__ import annotations

import os
import socket
import threading

from . import protocol


class DriverLink:
    def __init__(self, address: str, rank: int, host: str):
        addr, _, port = address.rpartition(":")
        self._sock = socket.create_connection((addr, int(port)), timeout=30)
        self._sock.settimeout(None)
        self._reader = protocol.LineReader(self._sock)
        self._lock = threading.Lock()
        self._ended = False
        protocol.send(self._sock, kind=protocol.HELLO, rank=rank, host=host, pid=os.getpid())

    def hosts_updated(self) -> bool:
        """Asks the driver whether the job's hosts should change (rank 0, at a commit)."""
        with self._lock:
            protocol.send(self._sock, kind=protocol.QUERY)
            answer = self._reader.next()
        if answer is None:
            raise ConnectionError("jaxcache.elastic: the driver closed the link")
        return bool(answer.get("updated"))

    def end(self, kind: str, **details) -> None:
        """Reports how this worker ends (done, reset or failed), once."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            try:
                protocol.send(self._sock, kind=kind, **details)
            except OSError:
                pass


_link: DriverLink | None = None
_link_made = False


def get(rank: int, host: str) -> DriverLink | None:
    """This process's link (made at the first call), or None outside the driver."""
    global _link, _link_made
    if not _link_made:
        _link_made = True
        address = os.environ.get(protocol.DRIVER)
        if address:
            _link = DriverLink(address, rank, host)
    return _link


def generation() -> int:
    return int(os.environ.get(protocol.GENERATION, "0") or 0)


def state_dir() -> str | None:
    return os.environ.get(protocol.STATE_DIR) or None
