"""broadcast_parameters / broadcast_optimizer_state / broadcast_object leave every rank with the root's state."""

from __future__ import annotations

import pickle

import torch
from _util import COMM, done, same_on_all_ranks

import jaxcache.torch as jct

jct.init()
RANK, SIZE = jct.rank(), jct.size()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3)
        self.bn = torch.nn.BatchNorm2d(3)  # buffers: running stats (float) + num_batches_tracked (int64)
        self.fc = torch.nn.Linear(12, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def make(seed: int):
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3 * (seed + 1), betas=(0.8, 0.9 + 0.01 * seed))
    return model, opt


def local_steps(model, opt, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(4, 2, 4, 4, generator=g)).pow(2).mean().backward()
        opt.step()


def assert_same_as_root(model, opt, root: int, what: str):
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    root_sd = COMM.bcast(sd if RANK == root else None, root=root)
    for k, v in sd.items():
        assert torch.equal(v, root_sd[k]) and v.dtype == root_sd[k].dtype, f"{what}: {k} differs from root {root}"
        same_on_all_ranks(v.numpy(), f"{what}: {k}")
    osd = opt.state_dict()
    root_osd = COMM.bcast(osd if RANK == root else None, root=root)
    assert osd["param_groups"] == root_osd["param_groups"], f"{what}: hyperparameters differ"
    assert osd["state"].keys() == root_osd["state"].keys(), f"{what}: state keys differ"
    for i, st in osd["state"].items():
        for k, v in st.items():
            assert torch.equal(v, root_osd["state"][i][k]), f"{what}: optimizer state {i}.{k} differs"


for root in sorted({0, SIZE - 1}):
    # Every rank starts different: own init, own hyperparameters; the root has stepped 3 times,
    # rank 1 once, the others never (empty optimizer state).
    model, opt = make(RANK)
    local_steps(model, opt, {root: 3, (root + 1) % SIZE: 1}.get(RANK, 0), seed=RANK)
    jct.broadcast_parameters(model.state_dict(), root_rank=root)
    jct.broadcast_optimizer_state(opt, root_rank=root)
    assert_same_as_root(model, opt, root, f"root {root}")
    # Training on from there stays identical everywhere.
    dist = jct.DistributedOptimizer(opt, named_parameters=model.named_parameters(), name_prefix=f"r{root}")
    model.train()
    local_steps(model, dist, 2, seed=99)  # same data on every rank
    dist.remove_hooks()
    assert_same_as_root(model, dist, root, f"root {root} after training")
    if RANK == 0:
        print(f"root {root}: OK", flush=True)

# named_parameters() form, and the parameters stay leaf tensors usable by autograd.
torch.manual_seed(RANK)
lin = torch.nn.Linear(5, 2)
jct.broadcast_parameters(lin.named_parameters(), root_rank=0)
root_w = COMM.bcast(lin.weight.detach().clone() if RANK == 0 else None, root=0)
assert torch.equal(lin.weight.detach(), root_w) and lin.weight.is_leaf and lin.weight.requires_grad
lin(torch.ones(1, 5)).sum().backward()
assert lin.weight.grad is not None

# A module works too; a non-contiguous parameter goes through the copy fallback.
class T(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((4, 3), float(RANK)).t())  # non-contiguous


t = T()
assert not t.w.is_contiguous()
jct.broadcast_parameters(t, root_rank=SIZE - 1)
assert torch.equal(t.w.detach(), torch.full((3, 4), float(SIZE - 1))), t.w

# broadcast_object
obj = {"epoch": 7, "rank": RANK, "name": "x" * (RANK + 1)}
got = jct.broadcast_object(obj if RANK == 1 % SIZE else None, root_rank=1 % SIZE)
assert got == {"epoch": 7, "rank": 1 % SIZE, "name": "x" * (1 % SIZE + 1)}, got
same_on_all_ranks(pickle.dumps(got), "broadcast_object")

done("torch_broadcast")
jct.shutdown()
