"""Collectives on torch tensors, served by the jaxcache runtime through DLPack.

A contiguous CPU tensor is handed to the runtime as is (zero-copy: the runtime reads and
writes the tensor's own memory). Anything else -- a non-contiguous view, a tensor with a
lazy conjugate/negative bit, a tensor on another device -- is staged through a contiguous
CPU copy, and in-place results are copied back into the original after completion. CUDA
tensors are staged through pinned memory on their current stream (staging.py) and count
as CUDA in the request's signature.

Every request is asynchronous in the runtime: the `*_async` functions return a `Handle`
at once; `synchronize(handle)` waits (without holding the GIL) and returns the result.
Every handle must be synchronized: the bridge keeps the tensors alive until then.

Allreduce, broadcast and reducescatter results go into tensors the bridge sizes; allgather
and alltoall results are sized by the runtime from what the ranks agreed (a different
first dimension per rank, per-rank splits) and become tensors over the runtime's buffers
(no copy). The differentiable forms of the collectives are in collectives.py.
"""

from __future__ import annotations

import atexit
import threading
from typing import Sequence

import numpy as np
import torch

from .. import session as _session
from .. import submit as _submit
from ..compat import process_sets
from ..compat.process_sets import Resolved
from ..errors import raise_for_status
from ..ops import naming
from ..ops.reducescatter import scatter_rows
from ..protocol import Device, ErrorKind, Kind
from . import staging
from .checks import DTYPE_CODES, numpy_dtype

# ---------------------------------------------------------------------------------------------
# Names


_lock = threading.Lock()
_outstanding: dict[int, "Handle"] = {}  # keeps tensors alive until synchronize()
# Automatic names of handles not yet synchronized (the session's naming.InFlight), per process
# set (names are matched within a set, so a call site in flight in one set does not rename
# its call in another). Identical across ranks running the same program: the suffix depends
# only on the order of submissions and synchronize() calls, never on timing; synchronous
# calls always get the bare name, so a loop re-uses one cached collective.


def auto_name(kind: str, set_id: int) -> naming.Automatic:
    """torch.kind@call-site; '#k' (smallest k free) while earlier requests of the site in
    the same process set are unsynchronized."""
    return _session.current("a torch collective").in_flight.take(set_id, f"torch.{kind}@{naming.call_site()}")


# ---------------------------------------------------------------------------------------------
# Requests


def _zero_copy_ok(t: torch.Tensor) -> bool:
    return t.is_cpu and t.is_contiguous() and not t.is_conj() and not t.is_neg()


def _staged(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy with conjugate/negative bits materialized."""
    if t.is_cuda:
        return staging.to_host(t)
    return t.resolve_conj().resolve_neg().to(device="cpu", memory_format=torch.contiguous_format,
                                             copy=True)


def _result_buffer(shape, src: torch.Tensor) -> torch.Tensor:
    """Where the runtime writes a new result (pinned when it is headed to a CUDA device)."""
    return staging.host_buffer(shape, src.dtype) if src.is_cuda else torch.empty(shape, dtype=src.dtype)


_SAME_WIDTH_INT = {2: torch.int16}


def _export(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a contiguous CPU tensor's own memory (no copy).

    Handing the runtime a NumPy view instead of the tensor costs ~0.5 us instead of torch's
    ~2 us Python-level __dlpack__; the runtime reads and writes the same bytes either way.
    bfloat16, which NumPy lacks, goes as its int16 bits (its dtype travels as a code).
    """
    try:
        a = t.numpy()
    except TypeError:
        a = t.view(_SAME_WIDTH_INT[t.element_size()]).numpy()
    if not a.flags.c_contiguous:  # pragma: no cover - torch and NumPy agree on contiguity
        raise AssertionError("jaxcache.torch: internal error: exported view is not C-contiguous")
    return a


def _bump_version(t: torch.Tensor) -> None:
    # The runtime wrote through a raw pointer: tell autograd the tensor changed.
    try:
        torch.autograd.graph.increment_version(t)
    except Exception:  # pragma: no cover - older torch
        pass


class Handle:
    """An in-flight request; pass it to `synchronize()` (or `poll()`).

    After an allgather or alltoall has been synchronized, `rows` holds the first dimensions
    the ranks agreed on (allgather: `rows[t * size + r]` for tensor t of rank r; alltoall:
    the rows received from each rank); after an allgather, `contributors` is the number of
    ranks whose rows it holds (those that had not joined).
    """

    __slots__ = ("name", "kind", "process_set", "rows", "contributors", "_pending", "_results",
                 "_targets", "_copy_back", "_auto", "_names", "_single", "_bump", "_done", "_result",
                 "__weakref__")

    def __init__(self, name: str, pending: _submit.Pending, results: list, targets,
                 copy_back, auto: bool, single: bool, bump: bool, kind: int = Kind.ALLREDUCE,
                 process_set: Resolved | None = None):
        self.name = name
        self.kind = kind
        self.process_set = process_set  # the set it runs in (its backward runs there too)
        self.rows: list[int] | None = None
        self.contributors: int | None = None
        self._pending = pending  # referenced until completion: the runtime uses its buffers
        self._results = results  # what synchronize() returns (CPU tensors)
        self._targets = targets  # the caller's tensors (for device moves and version bumps)
        self._copy_back = copy_back  # [(original, staging buffer)] for in-place fallbacks
        self._auto = auto
        # The session's names in flight, which hold this one until synchronize().
        self._names = _session.current("a torch collective").in_flight
        self._single = single
        self._bump = bump
        self._done = False
        self._result = None

    def poll(self) -> bool:
        """True once the collective has completed (synchronize() then returns at once)."""
        return self._done or self._pending.poll()

    def wait(self):
        return synchronize(self)

    def _finish(self, pending: _submit.Pending):
        if self._copy_back:
            for dst, buf in self._copy_back:
                if dst.is_cuda:
                    staging.copy_back(dst, buf)
                else:
                    dst.copy_(buf)
        out = self._results
        if self._bump or self._copy_back is not None:
            out = [r if r is t else _to_device_of(r, t) for r, t in zip(self._results, self._targets)]
            if self._bump:
                for r, t in zip(self._results, self._targets):
                    if r is t:
                        _bump_version(t.detach())
        return out[0] if self._single else out

    def __repr__(self) -> str:
        state = "synchronized" if self._done else ("complete" if self._pending.poll() else "in flight")
        return f"<jaxcache.torch.Handle {self.name!r} {state}>"


def _to_device_of(r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Result `r` (host memory) on the device of the caller's tensor `t`."""
    if t.is_cuda:
        return staging.to_device(r, t.device)
    return r if t.is_cpu else r.to(t.device)


def _over_runtime_buffer(raw: np.ndarray, shape, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over bytes the runtime allocated (no copy; the tensor keeps them alive)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(raw.view(np.int16).reshape(shape)).view(torch.bfloat16)
    return torch.from_numpy(raw.view(numpy_dtype(dtype)).reshape(shape))


class _AllocatedHandle(Handle):
    """An allgather or alltoall: its results live in buffers the runtime sized."""

    __slots__ = ("_splits_dtype",)

    def _finish(self, pending: _submit.Pending):
        self.rows = pending.rows()
        self.contributors = pending.contributors() or None
        results = [_to_device_of(_over_runtime_buffer(raw, shape, t.dtype), t)
                   for (raw, shape), t in zip(pending.results(), self._targets)]
        if self.kind == Kind.ALLTOALL:  # Horovod: synchronize() returns (tensor, received splits)
            return results[0], torch.tensor(self.rows, dtype=self._splits_dtype)
        return results[0] if self._single else results


def _release(handle: Handle) -> None:
    with _lock:
        _outstanding.pop(id(handle), None)
    if handle._names is not None:  # the session that named it, even if another runs now
        handle._names.release(handle.process_set.id, handle.name)


def _started(handle: Handle) -> Handle:
    """Registers a submitted handle; raises at once if the runtime refused a duplicate name."""
    pending = handle._pending
    if not handle._auto and pending.poll():
        status, message = pending.outcome()
        if status == ErrorKind.DUPLICATE:
            _release(handle)
            raise_for_status(status, message)
    with _lock:
        _outstanding[id(handle)] = handle
    return handle


def _discard_name(name: str, set_id: int) -> None:
    """Frees the name of a submission that failed before it had a handle."""
    session = _session.peek()
    if session is not None:
        session.in_flight.release(set_id, name)


def _device_kind(tensors) -> int:
    return Device.CUDA if any(t.is_cuda for t in tensors) else Device.CPU


def _global_set() -> Resolved:
    return process_sets.resolve(None, "torch")


def submit(kind: int, name: str, tensors: Sequence[torch.Tensor], *, inplace: bool, op: int = 0,
           prescale: float = 1.0, postscale: float = 1.0, root: int = 0, auto_name: bool = False,
           single: bool = True, bump: bool = True, process_set: Resolved | None = None,
           drive: bool = False) -> Handle:
    """Submits one atomic allreduce, broadcast or reducescatter over already validated tensors.

    inplace: results land in the given tensors (allreduce/broadcast); otherwise new tensors
    (a reducescatter's hold this rank's rows: `shape[0] // size`, one more for the first
    `shape[0] % size` ranks, size and rank being the process set's).
    root: a broadcast's root as a rank within the process set.
    single: synchronize() returns the one result instead of a list.
    bump: after an in-place result, bump the tensors' autograd version counters.
    process_set: the resolved set (default: the global one).
    drive: run the request's cycles here first. Without (the public calls), it returns at
    once, so an async handle is not done before the ranks had time to meet (Horovod's
    poll()); the first synchronize() drives it. The optimizer's gradient hooks drive: one
    hook's allreduce then usually completes on its own thread while the peers are there
    (2 ranks, 1000 cached 16-float parameters: 108-113 ms a step driven, 158 not).
    """
    ps = process_set or _global_set()
    inputs, outputs, codes, results = [], [], [], []
    copy_back = None  # None: every tensor is a contiguous CPU tensor used as is
    try:
        if kind == Kind.REDUCESCATTER:
            size, rank = ps.size, ps.rank
        for t in tensors:
            src = t.detach() if t.requires_grad else t
            codes.append(DTYPE_CODES[src.dtype])
            direct = _zero_copy_ok(src)
            if not direct and copy_back is None:
                copy_back = []
            if inplace:
                if direct:
                    inp = out = _export(src)
                else:
                    buf = _staged(src)
                    inp = out = _export(buf)
                    copy_back.append((src, buf))
                r = t
            else:
                inp = _export(src if direct else _staged(src))
                shape = src.shape
                if kind == Kind.REDUCESCATTER:
                    shape = (scatter_rows(src.shape[0], size, rank), *src.shape[1:])
                r = _result_buffer(shape, src)
                out = _export(r)
            inputs.append(inp)
            outputs.append(out)
            results.append(r)
        pending = _submit.submit(kind, name, inputs, outputs, codes, op=op, prescale=prescale,
                                postscale=postscale, root=root, device=_device_kind(tensors),
                                process_set=ps.id, refuse_duplicate=not auto_name, drive=drive)
    except BaseException:
        _discard_name(name, ps.id)
        raise
    return _started(Handle(name, pending, results, tensors, copy_back, auto_name,
                           single, bump and inplace, kind, ps))


def submit_allocated(kind: int, name: str, tensors: Sequence[torch.Tensor], *, splits=None,
                     splits_dtype: torch.dtype = torch.int32, auto_name: bool = False,
                     single: bool = True, process_set: Resolved | None = None) -> Handle:
    """Submits one atomic allgather or alltoall whose results the runtime sizes.

    splits (alltoall): rows sent to each rank of the process set, or None for equal blocks.
    """
    ps = process_set or _global_set()
    try:
        inputs, codes = [], []
        for t in tensors:
            src = t.detach() if t.requires_grad else t
            inputs.append(_export(src if _zero_copy_ok(src) else _staged(src)))
            codes.append(DTYPE_CODES[src.dtype])
        pending = _submit.submit_allocated(kind, name, inputs, codes, splits=splits or (),
                                          device=_device_kind(tensors), process_set=ps.id,
                                          refuse_duplicate=not auto_name, drive=False)
    except BaseException:
        _discard_name(name, ps.id)
        raise
    handle = _AllocatedHandle(name, pending, [], tensors, None, auto_name, single, False, kind, ps)
    handle._splits_dtype = splits_dtype
    return _started(handle)


def synchronize(handle):
    """Waits for `handle` and returns its result; raises the mapped jaxcache error on failure.

    Also accepts the callable handles of sparse_allreduce_async (Horovod's convention).
    """
    if not isinstance(handle, Handle):
        if callable(handle):
            return handle()
        raise TypeError(f"jaxcache.torch.synchronize: expected a Handle, got {type(handle).__name__}")
    if handle._done:
        return handle._result
    pending = handle._pending
    status, message = pending.native.wait()  # Ctrl-C: the handle stays outstanding
    handle._done = True
    handle._pending = None
    _release(handle)
    try:
        raise_for_status(status, message)
        handle._result = handle._finish(pending)
    finally:
        handle._copy_back = handle._targets = handle._results = None
    return handle._result


def poll(handle) -> bool:
    """True once the collective of `handle` has completed (synchronize() then returns at once)."""
    if callable(handle) and not isinstance(handle, Handle):
        return True  # sparse_allreduce_async's callable: its collectives run when it is called
    if not isinstance(handle, Handle):
        raise TypeError(f"jaxcache.torch.poll: expected a Handle, got {type(handle).__name__}")
    return handle.poll()


def _drop_completed_at_exit() -> None:
    # Runs after jaxcache's own atexit shutdown (registered later, so run earlier): requests
    # a program never synchronized have completed (with ShutdownError) by now; dropping them
    # lets the runtime's handle objects be freed before the extension module is torn down.
    with _lock:
        for key, h in list(_outstanding.items()):
            if h._pending is None or h._pending.poll():
                del _outstanding[key]
                h._pending = h._targets = h._results = None


atexit.register(_drop_completed_at_exit)


def outstanding() -> int:
    """Number of submitted handles not yet synchronized (for tests and leak checks)."""
    with _lock:
        return len(_outstanding)
