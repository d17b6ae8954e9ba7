"""Process sets in the PyTorch bridge (3 or 4 ranks): `import jaxcache.torch as hvd` with
Horovod's process-set API. Two disjoint sets A = {0, 1} and B = {2, ...} run the same
collectives under the SAME names, concurrently with global ones: allreduce (every op, async,
in place, grouped), allgather (uneven), broadcast (root given as a global rank), alltoall
(uneven splits), reducescatter, the object collectives, barrier, the gradients of the
differentiable collectives, broadcast_parameters / broadcast_optimizer_state,
DistributedOptimizer and SyncBatchNorm. Every result is checked against NumPy over the
set's ranks only and must be bitwise identical within the set. Non-members, unregistered
sets and roots outside the set raise ValueError on the calling rank without holding up the
others; the sets are the very objects of jaxcache's JAX API.
"""

from __future__ import annotations


import numpy as np
import torch
from mpi4py import MPI
from _util import COMM, done, raises

import jaxcache
import jaxcache.torch as hvd

RANK, SIZE = COMM.rank, COMM.size
assert SIZE in (3, 4), "run on 3 or 4 ranks"
torch.set_num_threads(1)

A = hvd.ProcessSet([0, 1])
B = hvd.ProcessSet(range(2, SIZE))
assert hvd.ProcessSet is jaxcache.ProcessSet and hvd.global_process_set is jaxcache.global_process_set
# Before registration: no id and no rank; the size is known from the ranks (Horovod: None).
assert A.process_set_id is None and A.rank() is None and A.size() == 2
hvd.init(process_sets=[A, B])
assert (A.process_set_id, B.process_set_id) == (1, 2), (A, B)
MINE, OTHER = (A, B) if RANK < 2 else (B, A)
MEMBERS = MINE.ranks  # global ranks of this rank's set, in set order
N, ME = MINE.size(), MINE.rank()
assert MEMBERS == ([0, 1] if RANK < 2 else list(range(2, SIZE))) and MEMBERS[ME] == RANK
assert MINE.included() is True and OTHER.included() is False
assert hvd.global_process_set.ranks == list(range(SIZE)) and hvd.global_process_set.size() == SIZE
SUB = COMM.Split(0 if RANK < 2 else 1, RANK)  # the same ranks, for checking results only


def data(seed: int, r: int, shape, dtype=torch.float64) -> torch.Tensor:
    """Global rank r's input (every rank can compute every rank's)."""
    g = torch.Generator().manual_seed(1000 * seed + r)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


def same_in_set(t, what: str) -> None:
    """Bitwise identical on every rank of this rank's set."""
    raw = np.ascontiguousarray(t.detach().numpy()).tobytes()
    for r, other in zip(MEMBERS, SUB.allgather(raw)):
        assert other == raw, f"{what}: rank {RANK} and rank {r} differ"


def check(t, expected, what: str, tol=1e-12, same=True) -> None:
    assert isinstance(t, torch.Tensor), f"{what}: {type(t)}"
    assert tuple(t.shape) == tuple(np.shape(expected)), f"{what}: shape {tuple(t.shape)} != {np.shape(expected)}"
    if same:
        same_in_set(t, what)
    np.testing.assert_allclose(t.detach().double().numpy(), expected, rtol=tol, atol=tol, err_msg=what)


def over_set(seed: int, shape, dtype=torch.float64) -> list[np.ndarray]:
    """Every member's input, in set order, as NumPy arrays."""
    return [data(seed, r, shape, dtype).numpy() for r in MEMBERS]


# --- allreduce: same names in both sets; every op; async, in place, grouped ------------------------
REF = {hvd.Average: lambda s: s.sum(0) / N, hvd.Sum: lambda s: s.sum(0), hvd.Min: lambda s: s.min(0),
       hvd.Max: lambda s: s.max(0), hvd.Product: lambda s: s.prod(0)}
for i, (op, ref) in enumerate(REF.items()):
    x = data(i, RANK, (3, 5))
    check(hvd.allreduce(x, op=op, name=f"ps.allreduce.{op.name}", process_set=MINE),
          ref(np.stack(over_set(i, (3, 5)))), f"allreduce {op.name}")
x = data(10, RANK, (7,))
check(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, process_set=MINE),
      np.stack(over_set(10, (7,))).sum(0) * 1.5, "allreduce scaled (automatic name)")
xi = data(11, RANK, (4,), torch.int32)
check(hvd.allreduce(xi, op=hvd.Sum, name="ps.int", process_set=MINE),
      np.stack(over_set(11, (4,), torch.int32)).sum(0), "allreduce int32")
t = x.clone()
assert hvd.allreduce_(t, op=hvd.Max, name="ps.inplace", process_set=MINE) is t
check(t, np.stack(over_set(10, (7,))).max(0), "allreduce_")
# A set's collective and a global one in flight together, under the same name.
h_set = hvd.allreduce_async(x, op=hvd.Sum, name="ps.both", process_set=MINE)
h_all = hvd.allreduce_async(x, op=hvd.Sum, name="ps.both")
check(hvd.synchronize(h_all), np.stack([data(10, r, (7,)).numpy() for r in range(SIZE)]).sum(0),
      "global allreduce next to the set's", same=False)
check(hvd.synchronize(h_set), np.stack(over_set(10, (7,))).sum(0), "allreduce_async in the set")
gs = [data(20 + k, RANK, (k + 1, 2)) for k in range(3)]
outs = hvd.grouped_allreduce(gs, op=hvd.Average, name="ps.grouped", process_set=MINE)
for k, o in enumerate(outs):
    check(o, np.stack(over_set(20 + k, (k + 1, 2))).mean(0), f"grouped_allreduce[{k}]")
outs = hvd.synchronize(hvd.grouped_allreduce_async_([g.clone() for g in gs], op=hvd.Sum,
                                                    process_set=MINE))
for k, o in enumerate(outs):
    check(o, np.stack(over_set(20 + k, (k + 1, 2))).sum(0), f"grouped_allreduce_async_[{k}]")

# --- allgather: the first dimension differs per rank; the set's rank order -----------------------
def rows_of(r: int) -> int:
    return 1 + (r * 7) % 3


mine_rows = data(30, RANK, (rows_of(RANK), 3))
check(hvd.allgather(mine_rows, name="ps.allgather", process_set=MINE),
      np.concatenate([data(30, r, (rows_of(r), 3)).numpy() for r in MEMBERS]), "allgather")
outs = hvd.grouped_allgather([mine_rows, data(31, RANK, (2,))], name="ps.grouped_allgather",
                             process_set=MINE)
check(outs[0], np.concatenate([data(30, r, (rows_of(r), 3)).numpy() for r in MEMBERS]), "grouped_allgather[0]")
check(outs[1], np.concatenate(over_set(31, (2,))), "grouped_allgather[1]")
h = hvd.allgather_async(torch.tensor(float(RANK)), name="ps.allgather_scalar", process_set=MINE)
check(hvd.synchronize(h), np.array(MEMBERS, float), "allgather_async of scalars")
assert h.rows == [1] * N, h.rows

# --- broadcast: root_rank is a GLOBAL rank ------------------------------------------------------
root = MEMBERS[-1]
check(hvd.broadcast(data(40, RANK, (2, 3)), root_rank=root, name="ps.broadcast", process_set=MINE),
      data(40, root, (2, 3)).numpy(), f"broadcast from global rank {root}")
t = data(41, RANK, (5,))
assert hvd.broadcast_(t, root_rank=MEMBERS[0], name="ps.broadcast_", process_set=MINE) is t
check(t, data(41, MEMBERS[0], (5,)).numpy(), "broadcast_")
raises(ValueError, rf"root={OTHER.ranks[0]} is not a member of process set {MINE.process_set_id}",
       hvd.broadcast, t, root_rank=OTHER.ranks[0], process_set=MINE)

# --- alltoall: rank i of the set sends i + j + 1 rows to rank j of the set -----------------------
def sent(src: int, dst_set_rank: int) -> np.ndarray:
    """The rows global rank src sends to rank dst_set_rank of its set (values name both)."""
    k = MEMBERS.index(src) + dst_set_rank + 1
    return np.array([[src * 100 + dst_set_rank * 10 + j] for j in range(k)], np.float64)


send = torch.from_numpy(np.concatenate([sent(RANK, j) for j in range(N)]))
splits = [ME + j + 1 for j in range(N)]
out, received = hvd.alltoall(send, splits=splits, name="ps.alltoall", process_set=MINE)
check(out, np.concatenate([sent(src, ME) for src in MEMBERS]), "alltoall", same=False)
assert received.tolist() == [i + ME + 1 for i in range(N)], received
even = torch.arange(2.0 * N).reshape(N, 2) + 100 * RANK
check(hvd.alltoall(even, name="ps.alltoall_even", process_set=MINE),
      np.stack([np.arange(2.0 * N).reshape(N, 2)[ME] + 100 * src for src in MEMBERS]),
      "alltoall, equal blocks", same=False)

# --- reducescatter: this rank keeps its rows in the set's order ---------------------------------
shape = (2 * N + 1, 3)
for op, ref in ((hvd.Sum, lambda s: s.sum(0)), (hvd.Average, lambda s: s.mean(0))):
    reduced = ref(np.stack(over_set(50, shape)))
    counts = [shape[0] // N + (1 if r < shape[0] % N else 0) for r in range(N)]
    lo = sum(counts[:ME])
    check(hvd.reducescatter(data(50, RANK, shape), op=op, name=f"ps.reducescatter.{op.name}",
                            process_set=MINE), reduced[lo:lo + counts[ME]], f"reducescatter {op.name}",
          same=False)
outs = hvd.grouped_reducescatter([data(51, RANK, (N, 2)), data(52, RANK, (2 * N,))], op=hvd.Sum,
                                 process_set=MINE)
check(outs[0], np.stack(over_set(51, (N, 2))).sum(0)[ME:ME + 1], "grouped_reducescatter[0]", same=False)
check(outs[1], np.stack(over_set(52, (2 * N,))).sum(0)[2 * ME:2 * ME + 2], "grouped_reducescatter[1]",
      same=False)

# --- gradients: the backward collectives run in the forward's set -------------------------------
x = data(60, RANK, (4,)).requires_grad_(True)
w = data(61, RANK, (4,))
(hvd.allreduce(x, op=hvd.Sum, name="ps.grad.allreduce", process_set=MINE) * w).sum().backward()
check(x.grad, np.stack(over_set(61, (4,))).sum(0), "allreduce gradient (sum of the set's w)")
x = data(62, RANK, (rows_of(RANK), 2)).requires_grad_(True)
y = hvd.allgather(x, name="ps.grad.allgather", process_set=MINE)
offsets = np.cumsum([0] + [rows_of(r) for r in MEMBERS])
(y * data(63, RANK, tuple(y.shape))).sum().backward()
c = np.stack([data(63, r, tuple(y.shape)).numpy() for r in MEMBERS]).mean(0)
check(x.grad, c[offsets[ME]:offsets[ME + 1]], "allgather gradient (average over the set, own rows)", same=False)
x = data(64, RANK, (3,)).requires_grad_(True)
(hvd.broadcast(x, root_rank=MEMBERS[-1], name="ps.grad.broadcast", process_set=MINE)
 * data(65, RANK, (3,))).sum().backward()
expected = np.stack(over_set(65, (3,))).mean(0) * (1.0 if RANK == MEMBERS[-1] else 0.0)
check(x.grad, expected, "broadcast gradient (average on the root, zeros elsewhere)", same=False)
x = data(66, RANK, (2 * N, 2)).requires_grad_(True)
(hvd.reducescatter(x, op=hvd.Sum, name="ps.grad.reducescatter", process_set=MINE)
 * data(67, RANK, (2, 2))).sum().backward()
check(x.grad, np.concatenate(over_set(67, (2, 2))) * N, "reducescatter gradient (allgather times set size)")

# --- objects, barrier ---------------------------------------------------------------------------
got = hvd.broadcast_object({"from": RANK, "set": MINE.process_set_id}, root_rank=MEMBERS[-1],
                           process_set=MINE)
assert got == {"from": MEMBERS[-1], "set": MINE.process_set_id}, got
assert hvd.allgather_object(("rank", RANK), process_set=MINE) == [("rank", r) for r in MEMBERS]
assert hvd.allgather_object(RANK) == list(range(SIZE))  # the global set by default
hvd.barrier(process_set=MINE)
hvd.barrier()

# --- broadcast_parameters / broadcast_optimizer_state within a set ------------------------------
torch.manual_seed(RANK)  # every rank starts different
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).double()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
torch.manual_seed(MEMBERS[-1])
root_model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).double()
hvd.broadcast_parameters(model.state_dict(), root_rank=MEMBERS[-1], process_set=MINE)
for (k, p), q in zip(model.state_dict().items(), root_model.state_dict().values()):
    assert torch.equal(p, q), f"broadcast_parameters: {k} is not the root's"
if RANK == MEMBERS[-1]:
    opt.param_groups[0]["lr"] = 0.05
hvd.broadcast_optimizer_state(opt, root_rank=MEMBERS[-1], process_set=MINE)
assert opt.param_groups[0]["lr"] == 0.05, opt.param_groups[0]["lr"]

# --- DistributedOptimizer on a set: the gradients are the mean over the set's ranks only ---------
def batch(r: int, step: int):
    return data(100 + step, r, (5, 4)), data(200 + step, r, (5, 2))


def local_grads(net, r: int, step: int) -> list[np.ndarray]:
    """Rank r's local gradient of the step's loss at the current parameters."""
    net.zero_grad()
    xb, yb = batch(r, step)
    torch.nn.functional.mse_loss(net(xb), yb).backward()
    return [p.grad.clone().numpy() for p in net.parameters()]


reference = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).double()
reference.load_state_dict(model.state_dict())
dopt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                named_parameters=model.named_parameters(), process_set=MINE)
for step in range(4):
    expected = [np.mean(g, 0) for g in zip(*[local_grads(reference, r, step) for r in MEMBERS])]
    dopt.zero_grad()
    xb, yb = batch(RANK, step)
    torch.nn.functional.mse_loss(model(xb), yb).backward()
    dopt.synchronize()
    for (name, p), e in zip(model.named_parameters(), expected):
        check(p.grad, e, f"DistributedOptimizer step {step}: {name}'s gradient is the set's mean", tol=1e-12)
    with dopt.skip_synchronize():
        dopt.step()
    with torch.no_grad():
        for p, e in zip(reference.parameters(), expected):
            p -= 0.1 * torch.from_numpy(e)
    for p, q in zip(model.parameters(), reference.parameters()):
        check(p, q.detach().numpy(), f"parameters after step {step}", tol=1e-12)
# Horovod's rule: on a rank outside the optimizer's set the gradients stay local.
lin = torch.nn.Linear(3, 1).double()
with torch.no_grad():
    lin.weight.fill_(0.5)
    lin.bias.fill_(0.0)
a_opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                 named_parameters=lin.named_parameters(), process_set=A)
a_opt.zero_grad()
lin(data(300, RANK, (2, 3))).sum().backward()
a_opt.step()
grads = np.stack([data(300, r, (2, 3)).sum(0).numpy() for r in (A.ranks if A.included() else [RANK])]).mean(0)
np.testing.assert_allclose(lin.weight.detach().numpy()[0], 0.5 - 0.1 * grads, rtol=1e-12,
                           err_msg="optimizer on set A (local outside it)")

# --- SyncBatchNorm over a set equals BatchNorm over the set's concatenated batch -----------------
sbn = hvd.SyncBatchNorm(3, process_set=MINE).double()
bn = torch.nn.BatchNorm1d(3).double()
full = torch.cat([data(400, r, (2 + r % 2, 3)) for r in MEMBERS]).requires_grad_(True)
lo = sum(2 + r % 2 for r in MEMBERS[:ME])
mine_x = full.detach()[lo:lo + 2 + RANK % 2].clone().requires_grad_(True)
dy = torch.cat([data(401, r, (2 + r % 2, 3)) for r in MEMBERS])
(bn(full) * dy).sum().backward()
(sbn(mine_x) * dy[lo:lo + 2 + RANK % 2]).sum().backward()
np.testing.assert_allclose(mine_x.grad.numpy(), full.grad[lo:lo + 2 + RANK % 2].numpy(), rtol=1e-9,
                           atol=1e-12, err_msg="SyncBatchNorm input gradient over the set")
np.testing.assert_allclose(sbn.running_mean.numpy(), bn.running_mean.numpy(), rtol=1e-10,
                           err_msg="SyncBatchNorm running mean over the set")

# --- non-members, unregistered sets: ValueError on the calling rank, nothing hangs ---------------
if RANK == SIZE - 1:  # B's last rank calls A's collectives while A's ranks go on
    refused = rf"rank {RANK} is not a member of process set {A.process_set_id} \(global ranks \[0, 1\]\)"
    for fn, args in [(hvd.allreduce, (torch.ones(2),)), (hvd.allgather_async, (torch.ones(2),)),
                     (hvd.broadcast_, (torch.ones(2), 0)), (hvd.alltoall, (torch.ones(2),)),
                     (hvd.reducescatter, (torch.ones(2),)), (hvd.grouped_allreduce, ([torch.ones(2)],)),
                     (hvd.barrier, ()), (hvd.broadcast_object, (1, 0)), (hvd.allgather_object, (1,)),
                     (hvd.broadcast_parameters, (lin.state_dict(), 0))]:
        raises(ValueError, refused, fn, *args, process_set=A)
    raises(ValueError, refused, hvd.SyncBatchNorm(3, process_set=A), torch.ones(2, 3))
elif RANK in A.ranks:
    check(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="ps.meanwhile", process_set=A), np.full(2, 2.0),
          "A keeps working while a non-member is refused")
raises(ValueError, r"is not registered", hvd.allreduce, torch.ones(2), process_set=hvd.ProcessSet([0, 2]))
raises(TypeError, r"process_set must be a jaxcache.ProcessSet", hvd.allreduce, torch.ones(2), process_set=1)
check(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="ps.after"), np.full(2, float(SIZE)),
      "the runtime keeps working after the refusals", same=False)

# --- registering from either API: communicators, duplicates, removal ----------------------------
raises(ValueError, r"already", hvd.add_process_set, [0, 1])
parity = COMM.Split(RANK % 2, RANK)
P = jaxcache.add_process_set(parity)  # one set per color, registered through the JAX API
assert isinstance(P, hvd.ProcessSet) and P.ranks == list(range(RANK % 2, SIZE, 2)), P
x = data(500, RANK, (3,))
check(hvd.allreduce(x, op=hvd.Sum, name="ps.parity", process_set=parity),  # the communicator itself
      np.stack([data(500, r, (3,)).numpy() for r in P.ranks]).sum(0), "allreduce over a communicator's set",
      same=False)
assert hvd.remove_process_set(P) is True and P.process_set_id is None
raises(ValueError, r"not a registered process set", hvd.allreduce, x, process_set=parity)
assert hvd.remove_process_set(hvd.global_process_set) is False and hvd.remove_process_set(P) is False
D = hvd.add_process_set(hvd.ProcessSet([0, SIZE - 1]))  # Horovod's dynamic add, by ranks
if D.included():
    check(hvd.allreduce(x, op=hvd.Average, name="ps.dynamic", process_set=D),
          np.stack([data(500, r, (3,)).numpy() for r in D.ranks]).mean(0), "allreduce on an added set",
          same=False)
assert hvd.remove_process_set(D) is True
done("torch_process_sets")
hvd.shutdown()
