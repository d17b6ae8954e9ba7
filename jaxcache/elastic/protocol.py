"""What the elastic driver (``python -m jaxcache.run`` with elastic flags) and its workers
share: the environment variables it gives them and the messages on their TCP link.

Standard library only: the launcher imports it without JAX.

A worker's link is one TCP connection to the driver, opened by ``elastic.run``; messages
are JSON objects, one per line. Worker -> driver: ``hello`` (rank, host, pid), ``query``
(rank 0, at each commit: has the host set changed?), then at most one of ``done`` (the
training function returned), ``reset`` (every rank leaves for a host update) or ``failed``
(the function raised). Driver -> worker: the answer to each ``query``. A link that closes
without one of the last three is a worker that died.
"""

from __future__ import annotations

import json
import socket

# Set by the driver on every worker (plus horovodrun's HOROVOD_* variables).
DRIVER = "JAXCACHE_ELASTIC_DRIVER"          # host:port of the driver's link server
GENERATION = "JAXCACHE_ELASTIC_GENERATION"  # 0 for the first job, +1 per reset
STATE_DIR = "JAXCACHE_ELASTIC_STATE_DIR"    # where each host keeps its last commit
HOROVOD_ELASTIC = "HOROVOD_ELASTIC"          # "1", as horovodrun sets it

HELLO, QUERY, DONE, RESET, FAILED = "hello", "query", "done", "reset", "failed"
ENDINGS = (DONE, RESET, FAILED)


def send(sock: socket.socket, **message) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


class LineReader:
    """Whole JSON lines from a socket (None once it is closed)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""

    def messages(self) -> list[dict] | None:
        """The messages that have arrived (reads once; blocking sockets block)."""
        data = self.sock.recv(65536)
        if not data:
            return None
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def next(self) -> dict | None:
        """The next message (blocking), None if the link closed."""
        while b"\n" not in self.buffer:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)
