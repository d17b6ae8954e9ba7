"""Per-rank start of a `python -m jaxcache.run` job: horovodrun's worker variables, then exec.

    python .../jaxcache/_worker_env.py HOSTS (SCRIPT | -m MODULE) [ARGS...]

`jaxcache.run` passes the same launcher command to every rank, so variables that differ by
rank cannot travel as launcher options; each rank runs this file first (by path, so that
neither jaxcache nor jax is imported: standard library only), which sets

    HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE,
    HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE, HOROVOD_HOSTNAME

as horovodrun does, and replaces itself with `python SCRIPT ARGS...` (the same interpreter,
so the program runs exactly as it would without us). Rank, size and the local rank come
from the MPI launcher (Hydra: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS; Open MPI:
OMPI_COMM_WORLD_*). The host of a rank, hence the cross rank and size, comes from HOSTS,
`h1:2,h2:2` (`jaxcache.run`'s --hosts, or its --hostfile read by the launcher), empty for
one host (`localhost`, as horovodrun names it): both launchers fill each host's slots in order
and wrap around when there are more ranks than slots. Where that placement disagrees with
the launcher's own local rank (options that change placement, e.g. -ppn in --mpi-args),
the cross variables are left unset rather than guessed, and HOROVOD_HOSTNAME is this
machine's name.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Mapping, Sequence

LAUNCHER_VARIABLES = (  # (rank, size, local rank, local size) per launcher family
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
)
SINGLE_HOST = "localhost"


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """`h1:2,h2:2` -> [(h1, 2), (h2, 2)]; a host without a count has one slot."""
    hosts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, slots = item.partition(":")
        hosts.append((name, int(slots) if slots else 1))
    return hosts


def parse_hostfile(path: str) -> list[tuple[str, int]]:
    """Hydra's `host[:slots]` lines and Open MPI's `host slots=N` lines; # comments."""
    hosts = []
    with open(path) as f:
        for line in f:
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            name, _, slots = words[0].partition(":")
            count = int(slots) if slots else 1
            for w in words[1:]:
                key, _, value = w.partition("=")
                if key in ("slots", "max_slots", "max-slots") and value:
                    count = int(value)
                    break
            hosts.append((name, count))
    return hosts


def placement(hosts: Sequence[tuple[str, int]], size: int) -> list[int]:
    """Host index of every rank: each host's slots in order, wrapping around."""
    order = [i for i, (_, slots) in enumerate(hosts) for _ in range(max(slots, 0))]
    if not order:
        return [0] * size
    return [order[r % len(order)] for r in range(size)]


def launcher_ranks(environ: Mapping[str, str]) -> tuple[int, int, int, int] | None:
    """(rank, size, local rank, local size) from the MPI launcher's variables."""
    for names in LAUNCHER_VARIABLES:
        if all(n in environ for n in names):
            try:
                return tuple(int(environ[n]) for n in names)  # type: ignore[return-value]
            except ValueError:
                return None
    return None


def horovod_variables(environ: Mapping[str, str], hosts: Sequence[tuple[str, int]]) -> dict[str, str]:
    """horovodrun's per-worker variables for this rank ({} outside an MPI launch)."""
    ranks = launcher_ranks(environ)
    if ranks is None:
        return {}
    rank, size, local_rank, local_size = ranks
    env = {"HOROVOD_RANK": rank, "HOROVOD_SIZE": size, "HOROVOD_LOCAL_RANK": local_rank,
           "HOROVOD_LOCAL_SIZE": local_size}
    hosts = list(hosts) or [(SINGLE_HOST, size)]
    where = placement(hosts, size)
    local_ranks = [where[:r].count(where[r]) for r in range(size)]
    if 0 <= rank < size and local_ranks[rank] == local_rank and where.count(where[rank]) == local_size:
        # Horovod's cross communicator: the ranks with this local rank, one per host.
        peers = [r for r in range(size) if local_ranks[r] == local_rank]
        env["HOROVOD_CROSS_RANK"] = peers.index(rank)
        env["HOROVOD_CROSS_SIZE"] = len(peers)
        env["HOROVOD_HOSTNAME"] = hosts[where[rank]][0]
    else:
        env["HOROVOD_HOSTNAME"] = socket.gethostname()
    return {k: str(v) for k, v in env.items()}


def format_hosts(hosts: Sequence[tuple[str, int]]) -> str:
    return ",".join(f"{name}:{slots}" for name, slots in hosts)


def main(argv: Sequence[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: _worker_env.py HOSTS (SCRIPT | -m MODULE) [ARGS...]")
    try:
        hosts = parse_hosts(argv[0])
    except ValueError as e:
        print(f"jaxcache.run: cannot read the hosts {argv[0]!r} ({e}); "
              "HOROVOD_CROSS_* stay unset", file=sys.stderr)
        hosts = []
    os.environ.update(horovod_variables(os.environ, hosts))
    os.execv(sys.executable, [sys.executable, *argv[1:]])


if __name__ == "__main__":
    main(sys.argv[1:])
