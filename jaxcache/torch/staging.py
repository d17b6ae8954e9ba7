"""CUDA tensors in the torch bridge: staged through pinned host memory (tier A, docs/gpu.md).

The runtime works on host memory. A CUDA tensor's bytes are copied into a pinned host buffer
on the tensor's current stream (so the copy follows whatever produced the tensor there), and
the bridge waits for that copy with a blocking event (the thread sleeps; it does not spin).
Results are copied back on the current stream of the caller of synchronize(), without
waiting: torch's pinned-memory allocator keeps each buffer out of reuse until the copy that
reads it has run, so the buffers come from a reusable pool and stay valid long enough.
"""

from __future__ import annotations

import torch


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A contiguous pinned copy of CUDA tensor `t`, complete when this returns."""
    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    buf.copy_(t.resolve_conj().resolve_neg(), non_blocking=True)
    copied = torch.cuda.Event(blocking=True)
    copied.record(torch.cuda.current_stream(t.device))
    copied.synchronize()
    return buf


def host_buffer(shape, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized pinned buffer for a result headed to a CUDA device."""
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` copied to `device`, enqueued on that device's current stream."""
    return host.to(device, non_blocking=True)


def copy_back(dst: torch.Tensor, host: torch.Tensor) -> None:
    """Writes `host` into CUDA tensor `dst`, enqueued on the current stream."""
    dst.copy_(host, non_blocking=True)
