"""DistributedOptimizer: 20 steps on rank-sharded data == one process on the whole batch.

Gradient hooks fire in a rank-dependent order (the model's two branches are built in a
rank-dependent order, so backward reaches them in a different order; named_parameters is
shuffled per rank too); the parameters end bitwise identical on every rank and equal, to
float tolerance, to a single-process reference computed in the same program.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from _util import COMM, done, same_on_all_ranks

import jaxcache.torch as jct
from jaxcache._ext import ext

jct.init()
RANK, SIZE = jct.rank(), jct.size()
torch.set_num_threads(1)

STEPS, BATCH, FEATURES = 20, 12, 6  # 12 rows split evenly over 2 or 3 ranks


class Net(torch.nn.Module):
    def __init__(self, order: list[str]):
        super().__init__()
        self.inp = torch.nn.Linear(FEATURES, 8)
        self.branch_a = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        self.branch_b = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
        self.unused = torch.nn.Linear(3, 3)  # never gets a gradient
        self.order = order

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        # a + b == b + a exactly, but autograd visits the branch computed last first.
        branches = {"a": self.branch_a, "b": self.branch_b}
        outs = {name: branches[name](h) for name in self.order}
        return outs["a"] + outs["b"]


def batch(step: int):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    y = torch.randint(0, 3, (BATCH,), generator=g)
    return x, y


def make_model(order) -> Net:
    torch.manual_seed(1234)  # identical initial parameters everywhere
    return Net(order)


def train_reference(make_opt, steps=STEPS) -> dict:
    model = make_model(["a", "b"])
    opt = make_opt(model.parameters())
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_distributed(make_opt, steps=STEPS, **kw) -> tuple[dict, list[list[str]]]:
    order = ["a", "b"] if RANK % 2 == 0 else ["b", "a"]
    model = make_model(order)
    named = list(model.named_parameters())
    random.Random(RANK).shuffle(named)  # rank-dependent registration order
    if callable(kw.get("groups")):
        kw = dict(kw, groups=kw["groups"](dict(model.named_parameters())))
    opt = jct.DistributedOptimizer(make_opt(model.parameters()), named_parameters=named, **kw)
    fired: list[list[str]] = []
    names = {id(p): n for n, p in model.named_parameters()}
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: fired[-1].append(names[id(p)]))
    k = kw.get("backward_passes_per_step", 1)
    lo, hi = RANK * BATCH // SIZE, (RANK + 1) * BATCH // SIZE
    for step in range(steps):
        opt.zero_grad()
        fired.append([])
        x, y = batch(step)
        xs, ys = x[lo:hi], y[lo:hi]
        for xm, ym in zip(xs.chunk(k), ys.chunk(k)):  # local accumulation, mean over the shard
            (torch.nn.functional.cross_entropy(model(xm), ym) * (len(ym) / len(ys))).backward()
        if step == 0:
            ptrs = {n: p.grad.data_ptr() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        if step == 0:  # gradients were reduced in their own memory (zero-copy, in place)
            for n, p in model.named_parameters():
                if n in ptrs:
                    assert p.grad.data_ptr() == ptrs[n], f"{n}: gradient buffer replaced"
                    assert ext.data_pointer(p.grad) == ptrs[n]
            assert model.unused.weight.grad is not None and not model.unused.weight.grad.any()
    opt.remove_hooks()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, fired


def sgd(params):
    return torch.optim.SGD(params, lr=0.2, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


def explicit_groups(params: dict) -> list:
    return [[params["branch_a.0.weight"], params["branch_a.0.bias"], params["branch_b.2.weight"]],
            [params["inp.weight"], params["inp.bias"]]]


configs = [
    ("per-parameter, SGD momentum", sgd, {}),
    ("groups=2, Adam", adam, {"groups": 2}),
    ("explicit groups, SGD", sgd, {"groups": explicit_groups}),
    ("backward_passes_per_step=2, SGD", sgd, {"backward_passes_per_step": 2}),
]
initial = make_model(["a", "b"]).state_dict()
for label, make_opt, kw in configs:
    ref = train_reference(make_opt)
    got, fired = train_distributed(make_opt, **kw)
    for name, value in got.items():
        same_on_all_ranks(value.numpy(), f"{label}: {name}")
        np.testing.assert_allclose(value.numpy(), ref[name].numpy(), rtol=2e-5, atol=2e-6,
                                   err_msg=f"{label}: {name} differs from the single-process reference")
    assert all(not torch.equal(got[n], initial[n]) for n in got if not n.startswith("unused")), \
        f"{label}: some parameters did not train"
    assert all(torch.equal(got[n], initial[n]) for n in got if n.startswith("unused"))
    # The hooks really fired in a rank-dependent order.
    orders = COMM.allgather(fired[0])
    if SIZE > 1:
        assert orders[0] != orders[1], f"{label}: hook order did not depend on rank: {orders[0]}"
    if RANK == 0:
        print(f"{label}: OK (first hooks: rank 0 {orders[0][:2]}, rank 1 {orders[1][:2]})", flush=True)

done("torch_train")
jct.shutdown()
