"""Sparse (COO) gradients: an allgather of every rank's indices and values, as Horovod does.

Ranks may hold different numbers of non-zeros: indices and values travel as one atomic
allgather whose first dimension differs per rank.
"""

from __future__ import annotations

import torch

from ..compat import reduce_ops
from ..compat.process_sets import global_process_set
from .. import session
from . import checks, requests, submitters


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts the reduction of a sparse COO tensor; returns a callable that returns the result.

    The result is a sparse tensor holding every rank's entries (of `process_set`; uncoalesced),
    with values divided for op=Average by the set's size (after `join()` too, as Horovod;
    `JAXCACHE_JOIN_AVERAGE_BY_SIZE=0`: by the ranks that have not joined, as for dense
    tensors). Only Average and Sum apply.
    """
    ps = checks.set_of(process_set, "sparse_allreduce_async")
    op = reduce_ops.to_name(reduce_ops.Average if op is None else op, "torch.sparse_allreduce_async")
    if op not in ("average", "sum"):
        raise ValueError(f"jaxcache.torch.sparse_allreduce_async: sparse tensor {name!r} can only be "
                         f"reduced with Average or Sum, got {op!r}")
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        raise TypeError(f"jaxcache.torch.sparse_allreduce_async: {name!r} must be a sparse COO tensor, "
                        f"got {getattr(tensor, 'layout', type(tensor).__name__)}")
    checks.check_name(name, "sparse_allreduce_async")
    indices = tensor._indices().t().contiguous()  # [nnz, sparse_dims]
    values = tensor._values().contiguous()  # [nnz, *dense_dims]
    # One request under `name` itself: a rank that submits a dense allreduce of that name
    # instead (a gradient missing there) meets a MismatchError on every rank, not a hang.
    handle = submitters.allgather_submit([indices, values], name, "sparse_allreduce_async", ps, single=False)
    shape = tensor.shape

    def result() -> torch.Tensor:
        all_idx, all_val = requests.synchronize(handle)
        if op == "average":
            all_val = all_val / session.average_divisor(ps.size, handle.contributors or ps.size)
        # The indices are the ranks' own valid ones: no invariant check (and no warning).
        return torch.sparse_coo_tensor(all_idx.t(), all_val, shape, check_invariants=False)

    return result
