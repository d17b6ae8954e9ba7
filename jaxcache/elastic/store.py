"""Each host's copy of the last commit: a pickle in the driver's state directory, under a
folder per host name (so two names of one machine, as in tests, keep two copies). Written
by the host's local rank 0, atomically (a temporary file renamed over the old one)."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^commit-(\d{12})\.pkl$")


def host_dir(root: str, host: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host) or "host"
    return Path(root) / safe


def latest(folder: Path) -> tuple[int, Path] | None:
    """(sequence number, path) of the newest commit in `folder`, or None."""
    best = None
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    for name in names:
        m = _NAME.match(name)
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), folder / name)
    return best


def write(folder: Path, seq: int, payload: Any) -> int:
    """Writes commit `seq`, removes older ones; returns the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"commit-{seq:012d}.pkl"
    tmp = folder / f".commit-{seq:012d}.{os.getpid()}.tmp"
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, final)
    for name in os.listdir(folder):
        m = _NAME.match(name)
        if m and int(m.group(1)) < seq:
            try:
                os.unlink(folder / name)
            except OSError:
                pass
    return len(data)


def read(path: Path) -> Any:
    with open(path, "rb") as f:
        return pickle.load(f)
