"""An automatic name left in flight by one session does not rename the next session's calls:
rank 0 never synchronizes an async allreduce before shutdown(); after init() again the same
call site must get the same name on every rank (else the ranks would wait for each other's
names until the stall check ends the job)."""

from __future__ import annotations

import torch
from _util import done

import jaxcache.torch as hvd


def step(t):
    return hvd.allreduce_async(t, op=hvd.Sum)  # one call site, an automatic name


hvd.init()
rank, size = hvd.rank(), hvd.size()
left = step(torch.ones(3))
if rank != 0:
    hvd.synchronize(left)  # completes: every rank submitted it; rank 0 just never asks
hvd.shutdown()

hvd.init()
for _ in range(3):
    out = hvd.synchronize(step(torch.full((3,), float(rank + 1))))
    assert torch.equal(out, torch.full((3,), float(size * (size + 1) // 2))), out
hvd.shutdown()
done("torch_sessions")
