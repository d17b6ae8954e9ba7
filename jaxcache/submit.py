"""The one way Python hands arrays to the runtime: eager JAX, objects, PyTorch, TensorFlow.

Each framework turns its tensors into host arrays the runtime can read (NumPy views of
their memory, or tensors that export DLPack) and says their dtype codes; the rest is the
same for all and done here: bfloat16 goes as its bits, buffers stay referenced while the
runtime reads and writes them (also when Ctrl-C interrupts a wait), and a failure becomes
its jaxcache exception. The checks of a submission (membership, sizes, counts) are made
once, in C++ (xla_ext/submission.cc).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import ml_dtypes
import numpy as np

from ._ext import ext
from .errors import raise_for_status
from .protocol import NUMPY_DTYPES, Device

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def bits(a: np.ndarray) -> np.ndarray:
    """The same bytes in a dtype every DLPack consumer knows (bfloat16 -> uint16); the
    dtype itself travels as a code."""
    return a.view(np.uint16) if a.dtype == _BFLOAT16 else a  # (dtype.name costs ~5 us)


def codes_of(arrays: Sequence[np.ndarray]) -> list[int]:
    """The runtime's dtype codes of NumPy arrays (ml_dtypes' bfloat16 included)."""
    return [NUMPY_DTYPES[a.dtype] for a in arrays]


def _exported(x):
    return bits(x) if isinstance(x, np.ndarray) else x  # else a tensor that exports DLPack


class Pending:
    """A submitted request and what the runtime reads and writes until it completes."""

    __slots__ = ("native", "inputs", "outputs", "keepalive")

    def __init__(self, native, inputs: Sequence, outputs: Sequence, keepalive: Any = None):
        self.native = native
        self.inputs = inputs  # what the runtime reads and writes (as submitted)
        self.outputs = outputs
        self.keepalive = keepalive

    def poll(self) -> bool:
        return bool(self.native.poll())

    def outcome(self) -> tuple[int, str]:
        """Waits; (status, message). Ctrl-C interrupts the wait, and the buffers outlive
        the request."""
        try:
            return self.native.wait()
        except BaseException:
            keep_until_done(self)
            raise

    def wait(self) -> None:
        """Waits; raises the jaxcache error of a failed request."""
        raise_for_status(*self.outcome())

    # What a completed allgather or alltoall agreed on.
    def results(self) -> list[tuple[np.ndarray, tuple]]:
        """(raw bytes, shape) of each output the runtime allocated."""
        return self.native.results()

    def rows(self) -> list[int]:
        return [int(n) for n in self.native.rows()]

    def contributors(self) -> int:
        """Ranks whose rows an allgather holds (0: every member's)."""
        return int(self.native.contributors())


# Requests whose wait was interrupted: kept referenced here until they complete.
_abandoned: list[Pending] = []
_abandoned_lock = threading.Lock()


def keep_until_done(pending: Pending) -> None:
    """Keeps `pending` (and its buffers) referenced until its request completes."""
    with _abandoned_lock:
        _abandoned[:] = [p for p in _abandoned if not p.poll()]
        _abandoned.append(pending)


def submit(kind: int, name: str, inputs: Sequence, outputs: Sequence[np.ndarray],
           codes: Sequence[int], *, op: int = 0, prescale: float = 1.0, postscale: float = 1.0,
           root: int = 0, device: int = Device.CPU, process_set: int = 0, world_size: int = -1,
           refuse_duplicate: bool = False, keepalive: Any = None, drive: bool = True) -> Pending:
    """Submits a request whose outputs the caller provides (allreduce, broadcast,
    reducescatter).

    `drive`: the caller runs the cycles of a small request itself before returning (for a
    caller about to wait); False (an async call) returns at once, and the first wait drives.

    `refuse_duplicate`: a name still in flight fails at once (Horovod's rule for names
    the user gave) instead of queueing behind it. `world_size`: the set size the outputs
    were shaped for (-1: not checked). `keepalive`: more that must outlive the request.
    """
    inputs = [_exported(x) for x in inputs]
    outputs = [bits(o) for o in outputs]
    native = ext.submit(kind, name, inputs, outputs, op, float(prescale), float(postscale), int(root),
                        list(codes), refuse_if_in_flight=refuse_duplicate, device=device,
                        process_set=process_set, world_size=world_size, drive=drive)
    return Pending(native, inputs, outputs, keepalive)


def submit_allocated(kind: int, name: str, inputs: Sequence, codes: Sequence[int], *,
                     splits: Sequence[int] = (), device: int = Device.CPU, process_set: int = 0,
                     world_size: int = -1, refuse_duplicate: bool = False,
                     keepalive: Any = None, drive: bool = True) -> Pending:
    """Submits an allgather or alltoall, whose outputs the runtime sizes from what the
    ranks agreed (`splits`: an alltoall's rows for each rank; empty: equal blocks)."""
    inputs = [_exported(x) for x in inputs]
    native = ext.submit_allocated(kind, name, inputs, list(splits), list(codes),
                                  refuse_if_in_flight=refuse_duplicate, device=device,
                                  process_set=process_set, world_size=world_size, drive=drive)
    return Pending(native, inputs, (), keepalive)


def wait_all(pending: Sequence[Pending], error: BaseException | None = None) -> None:
    """Waits for every request (even after one failed, since the runtime still uses the
    buffers of the others); raises `error` or else the first failure."""
    for i, p in enumerate(pending):
        try:
            status, message = p.outcome()
        except BaseException:  # Ctrl-C: the rest stay referenced until they complete
            for rest in pending[i + 1:]:
                keep_until_done(rest)
            raise
        if status and error is None:
            try:
                raise_for_status(status, message)
            except Exception as e:  # noqa: BLE001 - raised once every request is waited for
                error = e
    if error is not None:
        raise error
