"""Every name of docs/horovod.md's horovod.torch and horovod.torch.elastic tables, called the
way a Horovod user calls it, with its effect checked against mpi4py and NumPy (2+ ranks).

After the checks of a name pass, `cov.covered(section, name)` records it; rank 0 prints the
record (`COVERED {json}`), which tests/test_horovod_names.py compares with the tables. The
checks look every name up on its module when they use it, so HOROVOD_NAMES_STUB (see
_names_coverage.py) can replace one by a stub to show that the checks then fail.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings

import numpy as np
import torch
from _names_coverage import COMM, Coverage, raises

import jaxcache
import jaxcache.torch as hvd

RANK, SIZE = COMM.rank, COMM.size
torch.set_num_threads(1)
warnings.filterwarnings("ignore", message="Sparse invariant checks")
T, E = "horovod.torch", "horovod.torch.elastic"
cov = Coverage({T: hvd, E: hvd.elastic})
covered = cov.covered


def close(actual, expected, what, tol=1e-12):
    assert isinstance(actual, torch.Tensor), f"{what}: {type(actual).__name__}, not a tensor"
    assert tuple(actual.shape) == np.shape(expected), f"{what}: shape {tuple(actual.shape)} != {np.shape(expected)}"
    np.testing.assert_allclose(actual.double().numpy(), expected, rtol=tol, atol=tol, err_msg=what)


def data(seed: int, shape, r: int = RANK) -> torch.Tensor:
    """Rank r's input: every rank can compute every other rank's."""
    g = torch.Generator().manual_seed(1000 * seed + r)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def every(seed: int, shape) -> np.ndarray:
    return np.stack([data(seed, shape, r).numpy() for r in range(SIZE)])




def elastic_checks() -> None:
    # ElasticSampler: a split of the dataset; after recorded batches, the rest split again
    data10 = torch.utils.data.TensorDataset(torch.arange(10.0))
    sampler = hvd.elastic.ElasticSampler(data10, shuffle=True, seed=4)
    parts = COMM.allgather(list(sampler))
    assert sorted(sum(parts, [])) == list(range(10)) and len(sampler) == len(parts[RANK]) == -(-10 // SIZE), parts
    sampler.record_batch(0, 2)
    assert sampler.state_dict() == {"epoch": 0, "processed_num": 2 * SIZE}
    done = {i for p in parts for i in p[:2]}
    sampler.load_state_dict(sampler.state_dict())
    rest = COMM.allgather(list(sampler))
    assert set(sum(rest, [])) == set(range(10)) - done, (rest, done)
    sampler.set_epoch(1)
    assert sorted(sum(COMM.allgather(list(sampler)), [])) == list(range(10)) and sampler.epoch == 1
    covered(E, "ElasticSampler")

    # TorchState + run: each rank starts different; run() gives every rank rank 0's state
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(float(RANK))
        model.bias.fill_(float(RANK))
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (RANK + 1), momentum=0.9)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=RANK, batch=0)
    calls = []

    @hvd.elastic.run
    def train(state, k):
        calls.append(k)
        return state.epoch

    assert train(state, 7) == 0 and calls == [7]
    assert float(model.weight.abs().sum()) == 0.0 and opt.param_groups[0]["lr"] == 0.1
    covered(E, "run")
    covered(T, "elastic")
    with torch.no_grad():
        model.weight.add_(1.0)
    state.epoch, state.batch = 5, 3
    state.restore()  # back to the synced (saved) state
    assert float(model.weight.abs().sum()) == 0.0 and (state.epoch, state.batch) == (0, 0)
    with torch.no_grad():
        model.weight.add_(2.0)
    state.batch = 1
    state.commit()
    with torch.no_grad():
        model.weight.add_(2.0)
    state.batch = 2
    state.restore()
    assert float(model.weight.sum()) == 4.0 and state.batch == 1
    covered(E, "TorchState")


def run() -> None:
    # --- before init() ---------------------------------------------------------------------
    ps_first = cov.check_process_api(T, hvd)

    # --- reduce ops: Horovod's values, and each one's effect -----------------------------------
    xs = every(1, (3, 2))
    for name, value, expect in (("Average", 0, xs.mean(0)), ("Sum", 1, xs.sum(0)), ("Min", 3, xs.min(0)),
                                ("Max", 4, xs.max(0)), ("Product", 5, xs.prod(0))):
        op = getattr(hvd, name)
        assert int(op) == value, f"{name} = {op!r}"
        close(hvd.allreduce(data(1, (3, 2)), op=op, name=f"op.{name}"), expect, f"allreduce op={name}")
        covered(T, name)
    assert int(hvd.Adasum) == 2
    raises(NotImplementedError, hvd.allreduce, data(1, (3, 2)), op=hvd.Adasum)
    covered(T, "Adasum")

    # --- allreduce and its variants ---------------------------------------------------------------
    x = data(2, (4,))
    xs = every(2, (4,))
    close(hvd.allreduce(x), xs.mean(0), "allreduce default Average")
    close(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0), xs.sum(0) * 1.5,
          "allreduce scaled")
    assert torch.equal(x, data(2, (4,))), "allreduce changed its input"
    covered(T, "allreduce")
    h = hvd.allreduce_async(x, op=hvd.Sum, name="ar.async")
    close(hvd.synchronize(h), xs.sum(0), "allreduce_async")
    covered(T, "allreduce_async")
    t = x.clone()
    assert hvd.allreduce_(t, op=hvd.Max) is t
    close(t, xs.max(0), "allreduce_")
    covered(T, "allreduce_")
    t = x.clone()
    assert hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Min)) is t
    close(t, xs.min(0), "allreduce_async_")
    covered(T, "allreduce_async_")

    # poll: False while a peer has not submitted, then True; synchronize: the result
    COMM.Barrier()
    if RANK == 0:
        time.sleep(0.5)
    h = hvd.allreduce_async(x, op=hvd.Sum, name="ar.poll")
    if RANK != 0:
        assert hvd.poll(h) is False, "poll() True before rank 0 submitted"
    deadline = time.monotonic() + 30
    while hvd.poll(h) is not True:
        assert time.monotonic() < deadline, "poll() never became True"
        time.sleep(0.01)
    out = hvd.synchronize(h)
    close(out, xs.sum(0), "synchronize")
    covered(T, "poll", "synchronize")

    gs = [data(3 + i, (i + 1, 2)) for i in range(3)]
    gref = [every(3 + i, (i + 1, 2)) for i in range(3)]
    outs = hvd.grouped_allreduce(gs, op=hvd.Sum)
    assert isinstance(outs, list) and len(outs) == 3
    for o, e in zip(outs, gref):
        close(o, e.sum(0), "grouped_allreduce")
    covered(T, "grouped_allreduce")
    for o, e in zip(hvd.synchronize(hvd.grouped_allreduce_async(gs)), gref):
        close(o, e.mean(0), "grouped_allreduce_async")
    covered(T, "grouped_allreduce_async")
    mine = [g.clone() for g in gs]
    outs = hvd.grouped_allreduce_(mine, op=hvd.Max)
    assert all(a is b for a, b in zip(outs, mine))
    for o, e in zip(mine, gref):
        close(o, e.max(0), "grouped_allreduce_")
    covered(T, "grouped_allreduce_")
    mine = [g.clone() for g in gs]
    hvd.synchronize(hvd.grouped_allreduce_async_(mine, op=hvd.Sum, postscale_factor=2.0))
    for o, e in zip(mine, gref):
        close(o, 2 * e.sum(0), "grouped_allreduce_async_")
    covered(T, "grouped_allreduce_async_")

    # sparse: every rank's entries (a different count per rank), summed
    idx = [torch.tensor([[(r + k) % 5 for k in range(r + 1)]]) for r in range(SIZE)]
    val = [torch.arange(r + 1, dtype=torch.float64) + 10 * r for r in range(SIZE)]
    dense = sum(torch.sparse_coo_tensor(i, v, (5,)).to_dense() for i, v in zip(idx, val))
    handle = hvd.sparse_allreduce_async(torch.sparse_coo_tensor(idx[RANK], val[RANK], (5,)), name="sparse",
                                        op=hvd.Sum)
    got = hvd.synchronize(handle)
    assert got.is_sparse
    close(got.to_dense(), dense.numpy(), "sparse_allreduce_async")
    covered(T, "sparse_allreduce_async")

    # --- Compression ------------------------------------------------------------------------------
    f = torch.full((8,), 1.0 + 2 ** -13, dtype=torch.float32) * (RANK + 1)  # not exact in fp16
    wire, ctx = hvd.Compression.fp16.compress(f)
    assert wire.dtype == torch.float16 and hvd.Compression.fp16.decompress(wire, ctx).dtype == torch.float32
    assert hvd.Compression.none.compress(f)[0] is f
    out = hvd.allreduce(f, op=hvd.Sum, compression=hvd.Compression.fp16)
    exact = float(sum(r + 1 for r in range(SIZE))) * (1.0 + 2 ** -13)
    assert out.dtype == torch.float32 and float(out[0]) != np.float32(exact), "fp16 did not round"
    close(out, np.full(8, exact), "allreduce fp16", tol=2e-3)
    covered(T, "Compression")

    # --- allgather, broadcast, alltoall, reducescatter --------------------------------------------
    parts = [data(10, (r + 1, 2), r) for r in range(SIZE)]
    full = torch.cat(parts).numpy()
    close(hvd.allgather(parts[RANK]), full, "allgather (uneven)")
    covered(T, "allgather")
    close(hvd.synchronize(hvd.allgather_async(parts[RANK])), full, "allgather_async")
    covered(T, "allgather_async")
    other = [torch.full((SIZE - r,), float(r)) for r in range(SIZE)]
    a, b = hvd.grouped_allgather([parts[RANK], other[RANK]])
    close(a, full, "grouped_allgather[0]")
    close(b, torch.cat(other).numpy(), "grouped_allgather[1]")
    covered(T, "grouped_allgather")
    a, b = hvd.synchronize(hvd.grouped_allgather_async([parts[RANK], other[RANK]]))
    close(a, full, "grouped_allgather_async[0]")
    close(b, torch.cat(other).numpy(), "grouped_allgather_async[1]")
    covered(T, "grouped_allgather_async")

    root = SIZE - 1
    x, xroot = data(11, (2, 3)), data(11, (2, 3), root).numpy()
    close(hvd.broadcast(x, root), xroot, "broadcast")
    assert torch.equal(x, data(11, (2, 3))), "broadcast changed its input"
    close(hvd.broadcast(x), data(11, (2, 3), 0).numpy(), "broadcast default root 0")
    covered(T, "broadcast")
    close(hvd.synchronize(hvd.broadcast_async(x, root_rank=root)), xroot, "broadcast_async")
    covered(T, "broadcast_async")
    t = x.clone()
    assert hvd.broadcast_(t, root) is t
    close(t, xroot, "broadcast_")
    covered(T, "broadcast_")
    t = x.clone()
    hvd.synchronize(hvd.broadcast_async_(t, root))
    close(t, xroot, "broadcast_async_")
    covered(T, "broadcast_async_")

    splits = [[(q + d) % 3 + 1 for d in range(SIZE)] for q in range(SIZE)]
    sent = [data(12, (sum(splits[q]), 2), q) for q in range(SIZE)]
    expect = torch.cat([torch.split(sent[q], splits[q])[RANK] for q in range(SIZE)]).numpy()
    out, received = hvd.alltoall(sent[RANK], splits=splits[RANK])
    close(out, expect, "alltoall")
    assert received.tolist() == [splits[q][RANK] for q in range(SIZE)], received
    even = [data(13, (2 * SIZE,), q) for q in range(SIZE)]
    close(hvd.alltoall(even[RANK]), torch.cat([e[2 * RANK:2 * RANK + 2] for e in even]).numpy(),
          "alltoall equal blocks")
    covered(T, "alltoall")
    out, received = hvd.synchronize(hvd.alltoall_async(sent[RANK], splits=splits[RANK]))
    close(out, expect, "alltoall_async")
    assert received.tolist() == [splits[q][RANK] for q in range(SIZE)]
    covered(T, "alltoall_async")

    rows = 2 * SIZE + 1
    lo = sum(rows // SIZE + (q < rows % SIZE) for q in range(RANK))
    mine_rows = slice(lo, lo + rows // SIZE + (RANK < rows % SIZE))
    xs = every(14, (rows, 2))
    close(hvd.reducescatter(data(14, (rows, 2))), xs.mean(0)[mine_rows], "reducescatter Average")
    close(hvd.reducescatter(data(14, (rows, 2)), op=hvd.Sum), xs.sum(0)[mine_rows], "reducescatter Sum")
    covered(T, "reducescatter")
    close(hvd.synchronize(hvd.reducescatter_async(data(14, (rows, 2)), op=hvd.Sum)), xs.sum(0)[mine_rows],
          "reducescatter_async")
    covered(T, "reducescatter_async")
    ys = every(15, (rows,))
    a, b = hvd.grouped_reducescatter([data(14, (rows, 2)), data(15, (rows,))], op=hvd.Sum)
    close(a, xs.sum(0)[mine_rows], "grouped_reducescatter[0]")
    close(b, ys.sum(0)[mine_rows], "grouped_reducescatter[1]")
    covered(T, "grouped_reducescatter")
    a, b = hvd.synchronize(hvd.grouped_reducescatter_async([data(14, (rows, 2)), data(15, (rows,))]))
    close(a, xs.mean(0)[mine_rows], "grouped_reducescatter_async[0]")
    close(b, ys.mean(0)[mine_rows], "grouped_reducescatter_async[1]")
    covered(T, "grouped_reducescatter_async")

    # --- barrier: returns on no rank before the last has called it ------------------------------
    COMM.Barrier()
    t0 = time.monotonic()
    if RANK == 0:
        time.sleep(0.5)
    hvd.barrier()
    waited = time.monotonic() - t0
    assert RANK == 0 or waited >= 0.45, f"barrier returned after {waited:.2f}s, before rank 0 called it"
    covered(T, "barrier")

    # --- objects ------------------------------------------------------------------------------------
    assert hvd.allgather_object({"r": RANK, "pad": "x" * RANK}) == [{"r": r, "pad": "x" * r} for r in range(SIZE)]
    covered(T, "allgather_object")
    assert hvd.broadcast_object(("cfg", RANK), root_rank=root) == ("cfg", root)
    assert hvd.broadcast_object({"k": [RANK]} if RANK == 0 else None) == {"k": [0]}
    covered(T, "broadcast_object")

    # --- errors -------------------------------------------------------------------------------------
    assert hvd.HorovodInternalError is jaxcache.JaxcacheError
    try:
        hvd.allgather(torch.ones(2, RANK + 1), name="mismatched")  # trailing shapes differ
    except hvd.HorovodInternalError as e:
        assert isinstance(e, jaxcache.MismatchError), e
    else:
        raise AssertionError("a mismatched allgather did not raise HorovodInternalError")
    covered(T, "HorovodInternalError")

    # --- process sets ---------------------------------------------------------------------------------
    g = hvd.global_process_set
    assert (g.process_set_id, g.ranks, g.size(), g.rank(), g.included()) == (0, list(range(SIZE)), SIZE, RANK, True)
    assert hvd.remove_process_set(g) is False
    covered(T, "global_process_set")
    assert hvd.ProcessSet is jaxcache.ProcessSet
    everyone = hvd.ProcessSet(range(SIZE))
    close(hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=everyone), np.full(2, float(SIZE)),
          "allreduce over ProcessSet(range(size))")
    covered(T, "ProcessSet")
    last = hvd.add_process_set(hvd.ProcessSet([SIZE - 1]))
    assert isinstance(last, jaxcache.ProcessSet) and last.process_set_id not in (None, 0)
    assert last.ranks == [SIZE - 1] and last.included() is (RANK == SIZE - 1)
    if RANK == SIZE - 1:
        close(hvd.allreduce(torch.full((2,), 3.0), op=hvd.Sum, process_set=last), np.full(2, 3.0),
              "allreduce over a 1-rank set")
    else:
        raises(ValueError, hvd.allreduce, torch.ones(2), process_set=last)
    raises(ValueError, hvd.add_process_set, [SIZE - 1])  # the same ranks again
    covered(T, "add_process_set")
    for ps in (last, ps_first):
        assert hvd.remove_process_set(ps) is True and ps.process_set_id is None
        raises(ValueError, hvd.allreduce, torch.ones(2), process_set=ps)
    covered(T, "remove_process_set")

    # --- timeline: rank 0 writes the collectives between start and stop -------------------------
    path = os.path.join(COMM.bcast(tempfile.mkdtemp(prefix="jc-names-") if RANK == 0 else None), "tl.json")
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(2), name="tl.in")
    hvd.stop_timeline()
    hvd.allreduce(torch.ones(2), name="tl.out")
    COMM.Barrier()
    if RANK == 0:
        with open(path) as fh:
            tracks = {e["args"]["name"] for e in json.load(fh) if e.get("name") == "process_name"}
        assert tracks == {"tl.in"}, tracks
        shutil.rmtree(os.path.dirname(path))
    covered(T, "start_timeline", "stop_timeline")

    # --- whole-model helpers ----------------------------------------------------------------------------
    torch.manual_seed(RANK)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    before = COMM.allgather({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})
    assert not np.array_equal(before[0]["0.weight"], before[-1]["0.weight"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[root][k], err_msg=f"broadcast_parameters {k}")
    covered(T, "broadcast_parameters")

    # DistributedOptimizer: one SGD step on the average of the ranks' gradients
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    batches = [(data(20, (5, 3), r), data(21, (5, 1), r)) for r in range(SIZE)]
    grads = []
    for xb, yb in batches:  # every rank's gradient, computed here for the reference
        ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
        ref.load_state_dict(model.state_dict())
        torch.nn.functional.mse_loss(ref(xb), yb).backward()
        grads.append({k: p.grad.clone() for k, p in ref.named_parameters()})
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(batches[RANK][0]), batches[RANK][1]).backward()
    opt.step()
    for k, p in model.named_parameters():
        mean = sum(g[k] for g in grads) / SIZE
        close(p.detach(), (w0[k] - 0.5 * mean).numpy(), f"DistributedOptimizer step {k}")
    covered(T, "DistributedOptimizer")

    # broadcast_optimizer_state: root's hyperparameters and momentum buffers everywhere
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    sgd = torch.optim.SGD([p], lr=0.1 * (RANK + 1), momentum=0.9)
    p.grad = torch.full((3,), float(RANK + 1), dtype=torch.float64)
    sgd.step()
    states = COMM.allgather(sgd.state_dict()["state"][0]["momentum_buffer"].numpy().copy())
    hvd.broadcast_optimizer_state(sgd, root_rank=root)
    assert sgd.param_groups[0]["lr"] == 0.1 * (root + 1), sgd.param_groups[0]["lr"]
    np.testing.assert_array_equal(sgd.state_dict()["state"][0]["momentum_buffer"].numpy(), states[root])
    covered(T, "broadcast_optimizer_state")

    # SyncBatchNorm: statistics of the global (uneven) batch
    counts = [r + 2 for r in range(SIZE)]
    xfull = torch.cat([data(30, (counts[r], 3), r) for r in range(SIZE)])
    lo = sum(counts[:RANK])
    sbn, bn = hvd.SyncBatchNorm(3).double(), torch.nn.BatchNorm1d(3).double()
    out = sbn(xfull[lo:lo + counts[RANK]])
    close(out.detach(), bn(xfull).detach()[lo:lo + counts[RANK]].numpy(), "SyncBatchNorm", tol=1e-10)
    close(sbn.running_mean, bn.running_mean.numpy(), "SyncBatchNorm running_mean", tol=1e-12)
    covered(T, "SyncBatchNorm")

    # --- elastic (plain mpirun: no driver, so run() syncs the state from rank 0 and calls) ------------
    elastic_checks()

    # --- join: rank r takes r + 1 steps; the others' sums go on without the joined ranks ------------
    for step in range(RANK + 1):
        got = hvd.allreduce(torch.tensor([float(RANK + 1)]), op=hvd.Sum, name="join.step")
        assert float(got) == sum(q + 1 for q in range(step, SIZE)), (step, got)
    last_joined = hvd.join()
    assert type(last_joined) is int and last_joined == SIZE - 1, last_joined
    covered(T, "join")

    # --- shutdown -----------------------------------------------------------------------------------
    hvd.shutdown()
    assert hvd.is_initialized() is False and hvd.mpi_enabled() is False
    raises(ValueError, hvd.rank)
    covered(T, "shutdown", "is_initialized")


cov.run(run)
