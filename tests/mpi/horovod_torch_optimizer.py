"""hvd.DistributedOptimizer with Horovod's full signature == single-process training on the
whole batch: backward_passes_per_step=2, gradient_predivide_factor=2, num_groups=3, fp16
compression, sparse gradients (allgather of indices and values, uneven per rank) and
sparse_as_dense; synchronize()/skip_synchronize() with clipping; the step-protocol checks."""

from __future__ import annotations

import re
import warnings

import numpy as np
import torch
from _util import done, same_on_all_ranks

import jaxcache.torch as hvd

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)
STEPS, BATCH, VOCAB = 6, 12, 40
SHARDS = {1: [12], 2: [5, 7], 3: [3, 4, 5]}[SIZE]  # uneven: different sparse nnz per rank
LO = sum(SHARDS[:RANK])
HI = LO + SHARDS[RANK]


class Net(torch.nn.Module):
    def __init__(self, sparse: bool):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 4, sparse=sparse)
        self.fc1 = torch.nn.Linear(3 * 4 + 6, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, tokens, x):
        h = torch.cat([self.emb(tokens).flatten(1), x], 1)
        return self.fc2(torch.tanh(self.fc1(h)))


def batch(step: int):
    g = torch.Generator().manual_seed(step)
    return (torch.randint(0, VOCAB, (BATCH, 3), generator=g), torch.randn(BATCH, 6, generator=g),
            torch.randint(0, 3, (BATCH,), generator=g))


def make_model(sparse: bool) -> Net:
    torch.manual_seed(7)
    return Net(sparse)


def loss_sum(model, tokens, x, y):
    return torch.nn.functional.cross_entropy(model(tokens, x), y, reduction="sum")


def train_reference(make_opt, sparse, clip=None) -> dict:
    model = make_model(sparse)
    opt = make_opt(model)
    for step in range(STEPS):
        opt.zero_grad()
        tokens, x, y = batch(step)
        (loss_sum(model, tokens, x, y) / BATCH).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_distributed(make_opt, sparse, clip=None, **kw) -> dict:
    model = make_model(sparse)
    opt = hvd.DistributedOptimizer(make_opt(model), named_parameters=model.named_parameters(), **kw)
    k = kw.get("backward_passes_per_step", 1)
    for step in range(STEPS):
        opt.zero_grad()
        tokens, x, y = (t[LO:HI] for t in batch(step))
        for tm, xm, ym in zip(tokens.chunk(k), x.chunk(k), y.chunk(k)):
            # Average of the ranks' gradients == gradient of the global mean: scale by size/BATCH.
            (loss_sum(model, tm, xm, ym) * (SIZE / BATCH)).backward()
        if clip:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if step % 2:
                with opt.skip_synchronize():
                    opt.step()
            else:  # works too, and warns as Horovod does (it would reduce again; we do not)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    opt.step()
                assert [str(w.message) for w in caught if "skip_synchronize()" in str(w.message)], caught
        else:
            opt.step()
        if sparse:  # the embedding's gradient stays sparse, as Horovod leaves it
            assert model.emb.weight.grad.is_sparse
    opt.remove_hooks()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def sgd_momentum(model):
    return torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.5)


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=0.02)


configs = [
    ("backward_passes_per_step=2", sgd_momentum, False, None, (2e-5, 2e-6), {"backward_passes_per_step": 2}),
    ("gradient_predivide_factor=2", adam, False, None, (2e-5, 2e-6), {"gradient_predivide_factor": 2.0}),
    ("num_groups=3", sgd_momentum, False, None, (2e-5, 2e-6), {"num_groups": 3}),
    ("op=Sum with size-scaled loss", sgd, False, None, (2e-5, 2e-6), {"op": hvd.Sum}),
    ("fp16 compression", sgd_momentum, False, None, (1e-2, 2e-3), {"compression": hvd.Compression.fp16}),
    ("bf16 compression", sgd, False, None, (5e-2, 1e-2), {"compression": hvd.Compression.bf16}),
    ("sparse gradients (allgather)", sgd, True, None, (2e-5, 2e-6), {}),
    ("sparse_as_dense=True", sgd, True, None, (2e-5, 2e-6), {"sparse_as_dense": True}),
    ("synchronize + clip + skip_synchronize", sgd_momentum, False, 0.5, (2e-5, 2e-6), {}),
    ("all together", sgd, True, None, (1e-2, 2e-3),
     {"backward_passes_per_step": 2, "gradient_predivide_factor": 2.0, "num_groups": 3,
      "compression": hvd.Compression.fp16}),
]
for label, make_opt, sparse, clip, (rtol, atol), kw in configs:
    ref = train_reference(make_opt, sparse, clip)
    if kw.get("op") == hvd.Sum:
        # op=Sum sums the ranks' gradients (size x their mean): a learning rate / size matches.
        make_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.5 / SIZE)  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = train_distributed(make_opt, sparse, clip, **kw)
    if "num_groups" in kw:
        assert any(issubclass(w.category, DeprecationWarning) and "num_groups" in str(w.message)
                   for w in caught), f"{label}: num_groups must warn"
    for name, value in got.items():
        same_on_all_ranks(value.numpy(), f"{label}: {name}")
        np.testing.assert_allclose(value.numpy(), ref[name].numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"{label}: {name} differs from the single-process reference")
    initial = make_model(sparse).state_dict()
    assert all(not torch.equal(got[n], initial[n]) for n in got), f"{label}: some parameters did not train"
    if RANK == 0:
        print(f"{label}: OK", flush=True)


# --- explicit groups (lists of parameters) --------------------------------------------------------
def train_grouped() -> dict:
    model = make_model(False)
    groups = [[model.fc1.weight, model.fc2.bias], [model.emb.weight, model.fc1.bias]]
    opt = hvd.DistributedOptimizer(sgd_momentum(model), named_parameters=model.named_parameters(),
                                   groups=groups)
    for step in range(STEPS):
        opt.zero_grad()
        tokens, x, y = (t[LO:HI] for t in batch(step))
        (loss_sum(model, tokens, x, y) * (SIZE / BATCH)).backward()
        opt.step()
    opt.remove_hooks()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


ref = train_reference(sgd_momentum, False)
for name, value in train_grouped().items():
    same_on_all_ranks(value.numpy(), f"explicit groups: {name}")
    np.testing.assert_allclose(value.numpy(), ref[name].numpy(), rtol=2e-5, atol=2e-6)


# --- the step protocol (Horovod raises AssertionError; jaxcache's errors are RuntimeErrors too) ---
def expect(exc, pattern, fn, *args):
    try:
        fn(*args)
    except exc as e:
        assert re.search(pattern, str(e)), str(e)
        assert isinstance(e, AssertionError) and isinstance(e, RuntimeError)
        return
    raise AssertionError(f"expected {exc.__name__} ({pattern})")


model = make_model(False)
opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
tokens, x, y = (t[LO:HI] for t in batch(0))
loss_sum(model, tokens, x, y).backward()
expect(AssertionError, r"zero_grad\(\) was called while gradient reductions are in flight", opt.zero_grad)
opt.synchronize()
opt.zero_grad()
loss_sum(model, tokens, x, y).backward()
try:
    loss_sum(model, tokens, x, y).backward()
except AssertionError as e:
    assert "backward_passes_per_step=1" in str(e), str(e)
else:
    raise AssertionError("a second backward before step() must raise")
opt.synchronize()
opt.set_backward_passes_per_step(2)
assert opt.backward_passes_per_step == 2
opt.zero_grad()
loss_sum(model, tokens, x, y).backward()
loss_sum(model, tokens, x, y).backward()  # fine now: two passes per step
opt.step()
opt.load_state_dict(opt.state_dict())
for bad, pattern in (({"gradient_predivide_factor": 2.0, "op": hvd.Sum}, r"needs op=Average"),
                     ({"backward_passes_per_step": 0}, r"backward_passes_per_step must be an int >= 1")):
    try:
        hvd.DistributedOptimizer(sgd(make_model(False)), **bad)
    except ValueError as e:
        assert re.search(pattern, str(e)), str(e)
    else:
        raise AssertionError(f"expected ValueError for {bad}")
try:
    hvd.DistributedOptimizer(sgd(make_model(False)), op=hvd.Adasum)
except NotImplementedError as e:
    assert "Adasum" in str(e) and "op=Average" in str(e)
else:
    raise AssertionError("Adasum must raise NotImplementedError")

# A sparse gradient on some ranks and none (zeros, dense) on another: MismatchError everywhere.
if SIZE > 1:
    model = make_model(True)
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    tokens, x, y = (t[LO:HI] for t in batch(0))
    if RANK == 0:
        (model.fc2(torch.tanh(model.fc1(torch.cat([torch.zeros(len(x), 12), x], 1)))).sum()).backward()
    else:
        loss_sum(model, tokens, x, y).backward()
    try:
        opt.synchronize()
    except hvd.MismatchError as e:
        assert "torch.grad/emb.weight" in str(e) and "kind differs" in str(e), str(e)
    else:
        raise AssertionError("a rank without the sparse gradient must raise MismatchError")
    opt.zero_grad()
    opt.remove_hooks()
try:
    hvd.DistributedOptimizer(sgd(make_model(False)), compression="fp16")
except TypeError as e:
    assert "compression must be a compressor" in str(e)
else:
    raise AssertionError("a bad compression must raise TypeError")

done("horovod_torch_optimizer")
hvd.shutdown()
