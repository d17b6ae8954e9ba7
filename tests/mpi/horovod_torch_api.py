"""`import jaxcache.torch as hvd` with Horovod 0.28.1's API: every name marked "same" in
docs/horovod.md, against NumPy on every rank; gradients checked by finite differences;
reducescatter, alltoall, uneven allgather and join with Horovod's signatures and return
conventions."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
import zlib

import numpy as np
import torch
from _util import COMM, done, raises, same_on_all_ranks

import jaxcache.torch as hvd

RANK, SIZE = COMM.rank, COMM.size
torch.set_num_threads(1)


# --- before init: Horovod's ValueError ------------------------------------------------------------
assert hvd.is_initialized() is False
for f in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_rank, hvd.cross_size):
    raises(ValueError, r"init\(\)", f)
assert hvd.mpi_enabled() is False and hvd.mpi_built() is True

hvd.init()
assert hvd.is_initialized() and (hvd.rank(), hvd.size()) == (RANK, SIZE)

# --- process queries, against mpi4py ----------------------------------------------------------------
from mpi4py import MPI  # noqa: E402

node = COMM.Split_type(MPI.COMM_TYPE_SHARED)
assert (hvd.local_rank(), hvd.local_size()) == (node.rank, node.size)
local_ranks = COMM.allgather(node.rank)
peers = [r for r in range(SIZE) if local_ranks[r] == node.rank]
assert (hvd.cross_rank(), hvd.cross_size()) == (peers.index(RANK), len(peers))
assert hvd.is_homogeneous() == (len(set(COMM.allgather(node.size))) == 1)
assert hvd.mpi_threads_supported() is True and hvd.mpi_enabled() is True
assert (hvd.gloo_enabled(), hvd.gloo_built(), hvd.nccl_built(), hvd.ddl_built(), hvd.ccl_built(),
        hvd.cuda_built(), hvd.rocm_built()) == (False, False, 0, False, False, False, False)
assert [int(c) for c in (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product)] == list(range(6))
assert hvd.global_process_set.process_set_id == 0 and hvd.global_process_set.ranks == list(range(SIZE))
assert hvd.global_process_set.size() == SIZE and hvd.global_process_set.rank() == RANK
assert hvd.global_process_set.included() is True and hvd.remove_process_set(hvd.global_process_set) is False
assert issubclass(hvd.MismatchError, hvd.HorovodInternalError)


def inputs(seed: int, shape, dtype=torch.float64) -> list[torch.Tensor]:
    """Every rank's input, generated identically everywhere (each rank computes the reference)."""
    out = []
    for r in range(SIZE):
        g = torch.Generator().manual_seed(1000 * seed + r)
        if dtype.is_floating_point:
            out.append((torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype))
        else:
            out.append(torch.randint(-5, 6, shape, generator=g).to(dtype))
    return out


def ref(xs, op: str, pre=1.0, post=1.0) -> np.ndarray:
    s = np.stack([x.double().numpy() if x.dtype.is_floating_point else x.numpy() for x in xs]) * pre
    out = {"sum": s.sum(0), "avg": s.sum(0) / SIZE, "min": s.min(0), "max": s.max(0), "prod": s.prod(0)}[op]
    return out * post


def check(t, expected, dtype, what, tol=1e-12, same=True):
    """`t` against NumPy; same=True: also bitwise identical on every rank (not for reducescatter)."""
    assert isinstance(t, torch.Tensor) and t.dtype == dtype, f"{what}: {type(t)} {getattr(t, 'dtype', '')}"
    assert tuple(t.shape) == tuple(np.shape(expected)), f"{what}: shape {tuple(t.shape)} != {np.shape(expected)}"
    if same:
        same_on_all_ranks(t.float().numpy() if dtype == torch.bfloat16 else t.numpy(), what)
    np.testing.assert_allclose(t.double().numpy(), expected, rtol=tol, atol=tol, err_msg=what)


# --- allreduce: Horovod's constants, the deprecated average=, scale factors ---------------------
seed = 0
for op, key in ((hvd.Average, "avg"), (hvd.Sum, "sum"), (hvd.Min, "min"), (hvd.Max, "max"),
                (hvd.Product, "prod")):
    for dtype in (torch.float32, torch.float64, torch.int32):
        if op == hvd.Average and not dtype.is_floating_point:
            continue
        seed += 1
        xs = inputs(seed, (3, 2), dtype)
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        check(hvd.allreduce(xs[RANK], op=op), ref(xs, key), dtype, f"allreduce {op.name} {dtype}", tol)
xs = inputs(50, (4,))
check(hvd.allreduce(xs[RANK]), ref(xs, "avg"), torch.float64, "default op is Average")
check(hvd.allreduce(xs[RANK], op="sum"), ref(xs, "sum"), torch.float64, "jaxcache op string")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    check(hvd.allreduce(xs[RANK], average=False), ref(xs, "sum"), torch.float64, "average=False")
    check(hvd.allreduce(xs[RANK], average=True), ref(xs, "avg"), torch.float64, "average=True")
assert any(issubclass(x.category, DeprecationWarning) for x in w), "average= must warn"
raises(ValueError, r"op parameter supersedes average", hvd.allreduce, xs[RANK], average=True, op=hvd.Sum)
for op in (hvd.Average, hvd.Sum):
    key = "avg" if op == hvd.Average else "sum"
    check(hvd.allreduce(xs[RANK], op=op, prescale_factor=0.5, postscale_factor=3.0),
          ref(xs, key, 0.5, 3.0), torch.float64, f"scaled {op.name}")
check(hvd.allreduce(xs[RANK], op=hvd.Sum, prescale=2.0, postscale=0.25), ref(xs, "sum", 2.0, 0.25),
      torch.float64, "jaxcache scale spelling")
raises(NotImplementedError, r"Adasum .*use op=Average", hvd.allreduce, xs[RANK], op=hvd.Adasum)
raises(NotImplementedError, r"Adasum", hvd.allreduce_async_, xs[RANK], op=hvd.Adasum)

# async, poll, synchronize; in-place variants keep the tensor's identity
h = hvd.allreduce_async(xs[RANK], op=hvd.Sum, name="hvd.async")
while not hvd.poll(h):
    pass
out = hvd.synchronize(h)
check(out, ref(xs, "sum"), torch.float64, "allreduce_async")
assert hvd.poll(h) and hvd.synchronize(h) is out
t = xs[RANK].clone()
assert hvd.allreduce_(t, op=hvd.Max) is t
check(t, ref(xs, "max"), torch.float64, "allreduce_")
t = xs[RANK].clone()
h = hvd.allreduce_async_(t, op=hvd.Average, postscale_factor=2.0)
assert hvd.synchronize(h) is t
check(t, ref(xs, "avg", 1.0, 2.0), torch.float64, "allreduce_async_")

# grouped
gs = [inputs(60 + i, (i + 1, 2)) for i in range(3)]
outs = hvd.grouped_allreduce([g[RANK] for g in gs], op=hvd.Sum)
assert len(outs) == 3
for i, o in enumerate(outs):
    check(o, ref(gs[i], "sum"), torch.float64, f"grouped_allreduce[{i}]")
outs = hvd.synchronize(hvd.grouped_allreduce_async([g[RANK] for g in gs], average=True))
for i, o in enumerate(outs):
    check(o, ref(gs[i], "avg"), torch.float64, f"grouped_allreduce_async[{i}]")
mine = [g[RANK].clone() for g in gs]
outs = hvd.grouped_allreduce_(mine, op=hvd.Min)
assert all(a is b for a, b in zip(outs, mine))
for i, o in enumerate(mine):
    check(o, ref(gs[i], "min"), torch.float64, f"grouped_allreduce_[{i}]")
mine = [g[RANK].clone() for g in gs]
hvd.synchronize(hvd.grouped_allreduce_async_(mine, op=hvd.Sum, prescale_factor=2.0))
for i, o in enumerate(mine):
    check(o, ref(gs[i], "sum", 2.0), torch.float64, f"grouped_allreduce_async_[{i}]")

# compression: the result keeps the input dtype; values within the wire format's precision
xs = inputs(70, (64,), torch.float32)
for comp, tol in ((hvd.Compression.none, 1e-6), (hvd.Compression.fp16, 3e-3), (hvd.Compression.bf16, 3e-2)):
    out = hvd.allreduce(xs[RANK], op=hvd.Sum, compression=comp)
    assert out.dtype == torch.float32
    same_on_all_ranks(out.numpy(), f"compression {comp.__name__}")
    np.testing.assert_allclose(out.numpy(), ref(xs, "sum"), rtol=tol, atol=tol * 10)
c, ctx = hvd.Compression.fp16.compress(torch.arange(3))  # integers are not cast
assert c.dtype == torch.int64 and hvd.Compression.fp16.decompress(c, ctx).dtype == torch.int64

# --- allgather / broadcast ------------------------------------------------------------------------
for dtype in (torch.float32, torch.int64, torch.uint8):
    xs = inputs(80, (2, 3), dtype if dtype != torch.uint8 else torch.int16)
    xs = [x.to(dtype) for x in xs]
    out = hvd.allgather(xs[RANK])
    assert out.shape == (2 * SIZE, 3) and out.dtype == dtype
    assert torch.equal(out, torch.cat(xs)), "allgather"
    assert torch.equal(hvd.synchronize(hvd.allgather_async(xs[RANK])), torch.cat(xs))
assert hvd.allgather(torch.tensor(RANK)).tolist() == list(range(SIZE))
a, b = inputs(81, (1, 2)), inputs(82, (3,))
ga, gb = hvd.grouped_allgather([a[RANK], b[RANK]])
assert torch.equal(ga, torch.cat(a)) and torch.equal(gb, torch.cat(b))
ga, gb = hvd.synchronize(hvd.grouped_allgather_async([a[RANK], b[RANK]]))
assert torch.equal(ga, torch.cat(a)) and torch.equal(gb, torch.cat(b))
for root in range(SIZE):
    xs = inputs(90 + root, (2, 2))
    assert torch.equal(hvd.broadcast(xs[RANK], root), xs[root])
    assert torch.equal(hvd.synchronize(hvd.broadcast_async(xs[RANK], root_rank=root)), xs[root])
    t = xs[RANK].clone()
    assert hvd.broadcast_(t, root) is t and torch.equal(t, xs[root])
    t = xs[RANK].clone()
    hvd.synchronize(hvd.broadcast_async_(t, root))
    assert torch.equal(t, xs[root])
    assert torch.equal(xs[RANK], inputs(90 + root, (2, 2))[RANK]), "out-of-place broadcast changed its input"


# --- reducescatter, alltoall, uneven allgather (Horovod's signatures and return conventions) --------
def rows_of(n: int, r: int) -> int:
    return n // SIZE + (1 if r < n % SIZE else 0)


def my_rows(full: np.ndarray) -> np.ndarray:
    start = sum(rows_of(full.shape[0], q) for q in range(RANK))
    return full[start:start + rows_of(full.shape[0], RANK)]


seed = 100
for op, key in ((hvd.Average, "avg"), (hvd.Sum, "sum"), (hvd.Min, "min"), (hvd.Max, "max"),
                (hvd.Product, "prod")):
    for rows in (2 * SIZE, 2 * SIZE + 1, SIZE - 1):
        for dtype in (torch.float64, torch.int32):
            if op == hvd.Average and dtype == torch.int32:
                continue
            seed += 1
            xs = inputs(seed, (rows, 3), dtype)
            check(hvd.reducescatter(xs[RANK], op=op), my_rows(ref(xs, key)), dtype,
                  f"reducescatter {op.name} {dtype} rows {rows}", same=False)
xs = inputs(130, (2 * SIZE + 1, 2))
check(hvd.reducescatter(xs[RANK]), my_rows(ref(xs, "avg")), torch.float64, "reducescatter default Average", same=False)
check(hvd.reducescatter(xs[RANK], op="sum", prescale=2.0, postscale=0.5), my_rows(ref(xs, "sum", 2.0, 0.5)),
      torch.float64, "reducescatter jaxcache spellings", same=False)
h = hvd.reducescatter_async(xs[RANK], name="hvd.rs.async", op=hvd.Sum, prescale_factor=0.5,
                            postscale_factor=3.0)
check(hvd.synchronize(h), my_rows(ref(xs, "sum", 0.5, 3.0)), torch.float64, "reducescatter_async scaled", same=False)
gs = [inputs(131 + i, (SIZE + i, 2), d) for i, d in enumerate((torch.float64, torch.float32))]
outs = hvd.grouped_reducescatter([g[RANK] for g in gs], op=hvd.Sum)
assert isinstance(outs, list) and len(outs) == 2
for i, o in enumerate(outs):
    check(o, my_rows(ref(gs[i], "sum")), gs[i][0].dtype, f"grouped_reducescatter[{i}]", 1e-5, False)
outs = hvd.synchronize(hvd.grouped_reducescatter_async([g[RANK] for g in gs], postscale_factor=2.0))
for i, o in enumerate(outs):
    check(o, my_rows(ref(gs[i], "avg", 1.0, 2.0)), gs[i][0].dtype, f"grouped_reducescatter_async[{i}]", 1e-5, False)
xs32 = inputs(133, (4 * SIZE, 8), torch.float32)
out = hvd.reducescatter(xs32[RANK], op=hvd.Sum, compression=hvd.Compression.fp16)
assert out.dtype == torch.float32
np.testing.assert_allclose(out.numpy(), my_rows(ref(xs32, "sum")), rtol=3e-3, atol=3e-2)

# alltoall: without splits only the tensor; with splits (list or tensor) also the received splits;
# synchronize() of alltoall_async returns both (Horovod's convention)
xs = inputs(140, (2 * SIZE, 3))
out = hvd.alltoall(xs[RANK])
assert isinstance(out, torch.Tensor)
assert torch.equal(out, torch.cat([x[2 * RANK:2 * RANK + 2] for x in xs])), "alltoall equal blocks"
splits = [[(q + 2 * d) % 3 for d in range(SIZE)] for q in range(SIZE)]
xs = [inputs(141, (sum(splits[q]), 2))[q] for q in range(SIZE)]
expect = torch.cat([torch.split(xs[q], splits[q])[RANK] for q in range(SIZE)])
out, received = hvd.alltoall(xs[RANK], splits=splits[RANK])
assert torch.equal(out, expect) and received.dtype == torch.int32
assert received.tolist() == [splits[q][RANK] for q in range(SIZE)], received
out, received = hvd.alltoall(xs[RANK], torch.tensor(splits[RANK], dtype=torch.int64), name="hvd.a2a.t")
assert torch.equal(out, expect) and received.dtype == torch.int64
out, received = hvd.synchronize(hvd.alltoall_async(xs[RANK], splits=splits[RANK]))
assert torch.equal(out, expect) and received.tolist() == [splits[q][RANK] for q in range(SIZE)]
out, received = hvd.synchronize(hvd.alltoall_async(torch.arange(SIZE) + 10 * RANK))
assert out.tolist() == [RANK + 10 * q for q in range(SIZE)] and received.tolist() == [1] * SIZE

# allgather with a different first dimension per rank (sync, async, grouped)
parts = [inputs(150, (r + 1, 2))[r] for r in range(SIZE)]
assert torch.equal(hvd.allgather(parts[RANK]), torch.cat(parts)), "uneven allgather"
assert torch.equal(hvd.synchronize(hvd.allgather_async(parts[RANK])), torch.cat(parts))
other = [torch.full((SIZE - r, 3), r, dtype=torch.int64) for r in range(SIZE)]
ga, gb = hvd.grouped_allgather([parts[RANK], other[RANK]])
assert torch.equal(ga, torch.cat(parts)) and torch.equal(gb, torch.cat(other))
ga, gb = hvd.synchronize(hvd.grouped_allgather_async([parts[RANK], other[RANK]]))
assert torch.equal(ga, torch.cat(parts)) and torch.equal(gb, torch.cat(other))

# --- objects --------------------------------------------------------------------------------------
objs = hvd.allgather_object({"rank": RANK, "payload": "x" * (10 * RANK)})
assert objs == [{"rank": r, "payload": "x" * (10 * r)} for r in range(SIZE)]
for root in range(SIZE):
    got = hvd.broadcast_object({"from": RANK, "list": list(range(RANK + 3))} if RANK == root else None, root)
    assert got == {"from": root, "list": list(range(root + 3))}
assert hvd.broadcast_object(lambda v: v + RANK, root_rank=0)(1) == 1  # cloudpickle, as Horovod

# sparse_allreduce_async: every rank's entries (different counts per rank), as a callable handle
entries = [(torch.tensor([[(r + k) % 4 for k in range(2 * (r + 1))]]), torch.arange(2.0 * (r + 1)) + r)
           for r in range(SIZE)]
mine = torch.sparse_coo_tensor(entries[RANK][0], entries[RANK][1], (4,))
for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / SIZE)):
    handle = hvd.sparse_allreduce_async(mine, name=f"sparse.{op.name}", op=op)
    assert hvd.poll(handle)
    out = hvd.synchronize(handle)
    assert out.is_sparse and out._nnz() == sum(2 * (r + 1) for r in range(SIZE))
    expected = sum(torch.sparse_coo_tensor(i, v, (4,)).to_dense() for i, v in entries) * scale
    assert torch.allclose(out.to_dense(), expected), (out.to_dense(), expected)

# broadcast_parameters accepts model.parameters() (a list of tensors), as Horovod does
torch.manual_seed(RANK)
lin = torch.nn.Linear(3, 2)
hvd.broadcast_parameters(list(lin.parameters()), root_rank=0)
same_on_all_ranks(lin.weight.detach().numpy(), "broadcast_parameters(list)")


# --- gradients: finite differences of the global objective on every rank -------------------------
def global_objective(fn, x_mine: torch.Tensor, weights: torch.Tensor) -> float:
    y = fn(x_mine)
    ys = y if isinstance(y, (list, tuple)) else [y]
    local = sum((torch.sin(t) * w[: t.numel()].view_as(t)).sum() for t, w in zip(ys, weights)).item()
    return COMM.allreduce(local)


def gradcheck(label: str, fn, shape, scale: float) -> None:
    """autograd gradient against central differences of the sum of the ranks' losses, where
    every rank perturbs in lockstep; `scale` is Horovod's convention for the op (1: the sum of
    the losses, 1/size: their mean, size: size times their sum). `shape` may depend on the rank."""
    shape_of = shape if callable(shape) else (lambda r: shape)
    seed = zlib.crc32(label.encode()) % 1000
    x0 = inputs(seed, shape_of(RANK))[RANK]
    weights = [torch.linspace(-1, 1, 64, dtype=torch.float64) * (RANK + 1) + k for k in range(3)]
    x = x0.clone().requires_grad_(True)
    y = fn(x)
    ys = y if isinstance(y, (list, tuple)) else [y]
    loss = sum((torch.sin(t) * w[: t.numel()].view_as(t)).sum() for t, w in zip(ys, weights))
    loss.backward()
    analytic = COMM.allgather(x.grad.numpy().ravel())
    eps = 1e-6
    for q in range(SIZE):
        numeric = np.zeros(int(np.prod(shape_of(q))))
        for i in range(numeric.size):
            vals = []
            for sign in (1, -1):
                xp = x0.clone().view(-1)
                if RANK == q:
                    xp[i] += sign * eps
                with torch.no_grad():
                    vals.append(global_objective(fn, xp.view(x0.shape), weights))
            numeric[i] = scale * (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(analytic[q], numeric, rtol=1e-6, atol=1e-7,
                                   err_msg=f"gradient of {label} on rank {q}")


gradcheck("allreduce Average", lambda x: hvd.allreduce(x, op=hvd.Average, name="g.ar"), (3,), 1.0)
gradcheck("allreduce Sum scaled", lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                                                          postscale_factor=3.0, name="g.sum"), (2, 2), 1.0)
gradcheck("grouped_allreduce", lambda x: hvd.grouped_allreduce([x, x * x], op=hvd.Sum, name="g.gar"),
          (3,), 1.0)
# allgather and broadcast: Horovod averages the gradients (the gradient of the mean of the losses)
gradcheck("allgather", lambda x: hvd.allgather(x, name="g.ag"), (2, 2), 1.0 / SIZE)
gradcheck("allgather uneven", lambda x: hvd.allgather(x, name="g.agu"), lambda r: (r + 1, 2), 1.0 / SIZE)
gradcheck("allgather unnamed", lambda x: hvd.allgather(x * 2), lambda r: (SIZE - r,), 1.0 / SIZE)
gradcheck("grouped_allgather", lambda x: hvd.grouped_allgather([x, 2 * x], name="g.gag"), (2,), 1.0 / SIZE)
gradcheck("grouped_allgather uneven", lambda x: hvd.grouped_allgather([x, x[:1] * 3], name="g.gagu"),
          lambda r: (r + 1,), 1.0 / SIZE)
for root in range(SIZE):
    gradcheck(f"broadcast root {root}", lambda x: hvd.broadcast(x, root, name=f"g.bc{root}"), (3,), 1.0 / SIZE)
# reducescatter: Horovod's gradient is size times that of the sum of the losses, for every op
gradcheck("reducescatter Sum", lambda x: hvd.reducescatter(x, op=hvd.Sum, name="g.rs"), (2 * SIZE, 2), SIZE)
gradcheck("reducescatter Average uneven scaled",
          lambda x: hvd.reducescatter(x, name="g.rsa", prescale_factor=0.5, postscale_factor=3.0),
          (2 * SIZE + 1,), SIZE)
gradcheck("reducescatter unnamed", lambda x: hvd.reducescatter(x, op=hvd.Sum), (SIZE + 1, 2), SIZE)
gradcheck("grouped_reducescatter", lambda x: hvd.grouped_reducescatter([x, x * x], op=hvd.Sum, name="g.grs"),
          (SIZE + 1,), SIZE)
# alltoall: the gradient goes back where the rows came from (the sum of the losses)
gradcheck("alltoall", lambda x: hvd.alltoall(x, name="g.a2a"), (SIZE, 2), 1.0)
split_table = [[(q + d) % 3 for d in range(SIZE)] for q in range(SIZE)]
gradcheck("alltoall splits", lambda x: hvd.alltoall(x, splits=split_table[RANK], name="g.a2as")[0],
          lambda r: (sum(split_table[r]), 2), 1.0)

# --- SyncBatchNorm against BatchNorm on the whole (uneven) global batch ---------------------------
torch.manual_seed(0)
counts = [r + 2 for r in range(SIZE)]
full = torch.randn(sum(counts), 3, 5, dtype=torch.float64)
dy_full = torch.randn_like(full)
lo = sum(counts[:RANK])
mine = full[lo: lo + counts[RANK]].clone().requires_grad_(True)
sbn = hvd.SyncBatchNorm(3).double()
bn = torch.nn.BatchNorm1d(3).double()
with torch.no_grad():
    for m in (sbn, bn):
        m.weight.copy_(torch.tensor([1.0, 2.0, -0.5]))
        m.bias.copy_(torch.tensor([0.1, 0.0, 0.3]))
ref_in = full.clone().requires_grad_(True)
ref_out = bn(ref_in)
(ref_out * dy_full).sum().backward()
out = sbn(mine)
(out * dy_full[lo: lo + counts[RANK]]).sum().backward()
np.testing.assert_allclose(out.detach().numpy(), ref_out.detach()[lo: lo + counts[RANK]].numpy(), rtol=1e-10)
np.testing.assert_allclose(mine.grad.numpy(), ref_in.grad[lo: lo + counts[RANK]].numpy(), rtol=1e-9, atol=1e-12)
for a, b, what in ((sbn.running_mean, bn.running_mean, "running_mean"), (sbn.running_var, bn.running_var, "var")):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, err_msg=what)
gw = hvd.allreduce(sbn.weight.grad, op=hvd.Sum, name="sbn.gw")
np.testing.assert_allclose(gw.numpy(), bn.weight.grad.numpy(), rtol=1e-10)
sbn.eval()
np.testing.assert_allclose(sbn(mine).detach().numpy(), bn.eval()(mine).detach().numpy(), rtol=1e-12)
raises(ValueError, r"expected at least 2D input", sbn, torch.ones(3))

# --- process sets (tests/mpi/torch_process_sets.py covers them at 3 and 4 ranks) ------------------
x = torch.ones(2 * SIZE)
solo = hvd.add_process_set([0])  # Horovod's dynamic add: collective, returns the registered set
assert solo.process_set_id is not None and solo.ranks == [0] and solo.included() == (RANK == 0)
if RANK == 0:
    check(hvd.allreduce(x, op=hvd.Sum, process_set=solo), np.ones(2 * SIZE), torch.float32, "1-rank set", same=False)
else:
    raises(ValueError, rf"rank {RANK} is not a member of process set {solo.process_set_id}", hvd.allreduce, x,
           process_set=solo)
assert hvd.remove_process_set(solo) is True and solo.process_set_id is None
raises(ValueError, r"is not registered", hvd.reducescatter, x, process_set=solo)
# A ProcessSet naming the job's ranks is the global set.
check(hvd.allreduce(x, op=hvd.Sum, name="ps.everyone", process_set=hvd.ProcessSet(range(SIZE))),
      np.full(2 * SIZE, float(SIZE)), torch.float32, "an unregistered ProcessSet of every rank")

# --- the timeline, started and stopped at run time (rank 0 writes) --------------------------------
_tl = os.path.join(hvd.broadcast_object(tempfile.mkdtemp(prefix="jc-tl-") if RANK == 0 else None,
                                        name="tl.dir"), "timeline.json")
hvd.start_timeline(_tl, mark_cycles=True)
hvd.allreduce(torch.ones(2), op=hvd.Sum, name="tl.recorded")
hvd.stop_timeline()
hvd.allreduce(torch.ones(2), op=hvd.Sum, name="tl.not_recorded")
hvd.barrier()
if RANK == 0:
    with open(_tl) as f:
        _tracks = {e["args"]["name"] for e in json.load(f) if e.get("name") == "process_name"}
    assert _tracks == {"tl.recorded"}, _tracks

# --- unsupported names raise and say so, on every rank --------------------------------
for fn, args, kw, pattern in [
    (hvd.reducescatter, (x,), {"op": hvd.Adasum}, r"Adasum"),
]:
    raises(NotImplementedError, pattern, fn, *args, **kw)
hvd.barrier()
raises(hvd.MismatchError, r"shape", hvd.allgather, torch.ones(2, RANK + 1), name="trailing")
raises(ValueError, r"scalar", hvd.reducescatter, torch.tensor(1.0))
raises(ValueError, r"1-D integer tensor", hvd.alltoall, x, splits=torch.ones(SIZE))
check(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after"), np.full(2, float(SIZE)), torch.float32,
      "runtime usable after the refusals")

# --- join: rank r runs r + 1 steps; an Average divides by the size (Horovod's rule) --------------
for step in range(RANK + 1):
    got = hvd.allreduce(torch.tensor([float(RANK + 1)]), name="join.avg")
    np.testing.assert_allclose(got.item(), np.sum(np.arange(step + 1, SIZE + 1)) / SIZE, rtol=1e-6)
    assert hvd.allgather(torch.tensor([RANK]), name="join.ag").tolist() == list(range(step, SIZE))
    if step:  # rank 0 has joined: reducescatter keeps working, alltoall and its broadcasts fail
        check(hvd.reducescatter(torch.full((SIZE,), float(RANK)), op=hvd.Sum, name="join.rs"),
              np.array([float(sum(range(step, SIZE)))]), torch.float32, "reducescatter while joined", same=False)
        assert torch.equal(hvd.broadcast(torch.arange(3) + RANK, root_rank=SIZE - 1, name="join.bc"),
                           torch.arange(3) + SIZE - 1)
        raises(hvd.CollectiveError, r"join.bc0.*root, rank 0, has joined", hvd.broadcast, torch.ones(2), 0,
               name="join.bc0")
        raises(hvd.CollectiveError, r"join.a2a.*joined", hvd.alltoall, torch.ones(SIZE), name="join.a2a")
last = hvd.join(device=-1)
assert isinstance(last, int) and last == SIZE - 1, last  # the rank with the most steps
check(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.join"), np.full(2, float(SIZE)), torch.float32,
      "every rank takes part again after join")

done("horovod_torch_api")
hvd.shutdown()
assert not hvd.is_initialized()
# init(comm=[ranks of MPI.COMM_WORLD]) starts the runtime again over those ranks
COMM.Barrier()
hvd.init(comm=list(range(SIZE)))
assert (hvd.rank(), hvd.size(), hvd.cross_size()) == (RANK, SIZE, len(peers))
check(hvd.allreduce(torch.ones(3), op=hvd.Sum, name="reinit"), np.full(3, float(SIZE)), torch.float32, "re-init")
COMM.Barrier()
hvd.shutdown()
