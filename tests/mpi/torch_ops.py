"""jaxcache.torch collectives against NumPy on every rank; zero-copy proof; copy fallback."""

from __future__ import annotations

import numpy as np
import torch
from _util import COMM, done, same_on_all_ranks

import jaxcache.torch as jct
from jaxcache._ext import ext
from jaxcache.torch import requests as tops

jct.init()
RANK, SIZE = jct.rank(), jct.size()
assert (RANK, SIZE) == (COMM.rank, COMM.size)

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int32, torch.int64, torch.uint8]


def np_of(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()


def inputs(seed: int, shape, dtype: torch.dtype) -> list[torch.Tensor]:
    """Every rank's input, generated identically on every rank (so each computes the reference)."""
    out = []
    for r in range(SIZE):
        g = torch.Generator().manual_seed(1000 * seed + r)
        if dtype == torch.bool:
            out.append(torch.rand(shape, generator=g) > 0.5)
        elif dtype.is_floating_point or dtype.is_complex:
            out.append((torch.randn(shape, generator=g, dtype=torch.float64) * 4).to(dtype)
                       if not dtype.is_complex else torch.randn(shape, generator=g, dtype=dtype))
        else:
            lo = 0 if dtype == torch.uint8 else -5
            out.append(torch.randint(lo, 6, shape, generator=g).to(dtype))
    return out


def reference(xs: list[torch.Tensor], op: str) -> np.ndarray:
    stack = np.stack([np_of(x).astype(np.complex128 if x.dtype.is_complex else
                                      (np.float64 if (x.dtype.is_floating_point) else np_of(x).dtype))
                      for x in xs])
    if op == "sum":
        return stack.sum(0)
    if op == "average":
        if not (xs[0].dtype.is_floating_point or xs[0].dtype.is_complex):
            # Horovod's integer average: the sum times 1/size in double precision, truncated.
            return np.trunc(stack.sum(0).astype(np.float64) * (1.0 / SIZE))
        return stack.sum(0) / SIZE
    if op == "min":
        return stack.min(0)
    if op == "max":
        return stack.max(0)
    return stack.prod(0)


def check(actual: torch.Tensor, expected: np.ndarray, dtype: torch.dtype, what: str) -> None:
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype} != {dtype}"
    same_on_all_ranks(np_of(actual) if dtype != torch.bfloat16 else actual.view(torch.int16).numpy(), what)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-6,
           torch.complex64: 1e-6}.get(dtype, 1e-12)
    got = np_of(actual)
    if dtype.is_floating_point or dtype.is_complex:
        np.testing.assert_allclose(got.astype(np.complex128 if dtype.is_complex else np.float64),
                                   expected, rtol=tol, atol=tol * 8, err_msg=what)
    else:
        np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=what)


seed = 0
# --- allreduce: every op x dtype, out of place and in place -------------------------------------
for dtype in FLOATS + INTS + [torch.complex64, torch.bool]:
    for op in ("sum", "average", "min", "max", "prod"):
        if dtype == torch.bool and op not in ("min", "max"):
            continue
        if dtype.is_complex and op in ("min", "max"):
            continue
        seed += 1
        xs = inputs(seed, (3, 5), dtype)
        x = xs[RANK].clone()
        expected = reference(xs, op)
        if dtype == torch.bool:
            expected = expected.astype(bool)
        what = f"allreduce {op} {dtype}"
        out = jct.allreduce(x, op=op, name=f"ar.{dtype}.{op}")
        check(out, expected, dtype, what)
        assert torch.equal(x, xs[RANK]), f"{what}: input modified"
        y = xs[RANK].clone()
        res = jct.allreduce_(y, op=op)  # automatic name, one call site for every dtype/op
        assert res is y
        check(y, expected, dtype, what + " in place")

# --- prescale / postscale -----------------------------------------------------------------------
xs = inputs(77, (4,), torch.float64)
out = jct.allreduce(xs[RANK], op="sum", prescale=0.5, postscale=3.0, name="scaled")
check(out, reference(xs, "sum") * 1.5, torch.float64, "pre/postscale")

# --- 0-d, empty, requires_grad --------------------------------------------------------------------
s = torch.tensor(float(RANK + 1))
check(jct.allreduce(s, op="sum"), np.array(float(sum(range(1, SIZE + 1)))), torch.float32, "0-d")
e = torch.empty(0, 3)
assert jct.allreduce(e).shape == (0, 3)
w = torch.ones(3, requires_grad=True)
out = jct.allreduce(w * (RANK + 1), op="sum")
assert out.requires_grad  # differentiable, as Horovod's (gradients: tests/mpi/horovod_torch_api.py)
check(out.detach(), np.full(3, float(sum(range(1, SIZE + 1)))), torch.float32, "requires_grad input")

# --- grouped allreduce: one atomic request, mixed dtypes ------------------------------------------
group_dtypes = [torch.float32, torch.float64, torch.bfloat16, torch.int32]
group_in = [inputs(200 + i, (2, 3 + i), d) for i, d in enumerate(group_dtypes)]
outs = jct.grouped_allreduce([g[RANK] for g in group_in], op="sum", name="grouped")
assert len(outs) == len(group_dtypes)
for i, (o, d) in enumerate(zip(outs, group_dtypes)):
    check(o, reference(group_in[i], "sum"), d, f"grouped[{i}]")
h = jct.grouped_allreduce_async([g[RANK] for g in group_in[:2]], op="max")
outs = jct.synchronize(h)
for i, o in enumerate(outs):
    check(o, reference(group_in[i], "max"), group_dtypes[i], f"grouped async[{i}]")

# --- async: several in flight from one call site, completed in reverse order -----------------------
xs = [inputs(300 + i, (6,), torch.float32) for i in range(4)]
handles = [jct.allreduce_async(x[RANK], op="average") for x in xs]
names = [h.name for h in handles]
assert len(set(names)) == 4, names
same_on_all_ranks(np.frombuffer("|".join(names).encode(), np.uint8), "automatic names")
for i in reversed(range(4)):
    check(jct.synchronize(handles[i]), reference(xs[i], "average"), torch.float32, f"async {i}")
    assert jct.poll(handles[i])
assert tops.outstanding() == 0, tops.outstanding()

# --- broadcast from every root --------------------------------------------------------------------
for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex128):
    for root in range(SIZE):
        xs = inputs(400 + root, (2, 2, 3), dtype)
        out = jct.broadcast(xs[RANK], root_rank=root, name=f"bc.{dtype}.{root}")
        assert out.dtype == dtype and torch.equal(out, xs[root]), f"broadcast {dtype} root {root}"
        assert torch.equal(xs[RANK], inputs(400 + root, (2, 2, 3), dtype)[RANK]), "input modified"
        y = xs[RANK].clone()
        jct.broadcast_(y, root_rank=root)
        assert torch.equal(y, xs[root]), f"in-place broadcast {dtype} root {root}"

# --- allgather ---------------------------------------------------------------------------------------
for dtype in (torch.float32, torch.float16, torch.int16, torch.bool):
    xs = inputs(500, (2, 3), dtype)
    out = jct.allgather(xs[RANK])
    assert out.shape == (2 * SIZE, 3)
    assert torch.equal(out, torch.cat(xs)), f"allgather {dtype}"
    same_on_all_ranks(out.view(torch.uint8).numpy() if dtype != torch.bool else out.numpy(), f"allgather {dtype}")
scalar = jct.allgather(torch.tensor(RANK, dtype=torch.int64), name="gather.scalar")
assert scalar.tolist() == list(range(SIZE)), scalar

# --- zero-copy proof --------------------------------------------------------------------------------
t = torch.arange(1000, dtype=torch.float32) + RANK
assert ext.data_pointer(t) == t.data_ptr(), "DLPack hand-over of a contiguous tensor copied it"
view = torch.zeros(10, 100)[3:5]  # contiguous view with a storage offset
assert ext.data_pointer(view) == view.data_ptr()
h = jct.allreduce_async_(t, op="sum", name="zero-copy")
# What the bridge handed the runtime is the tensor's own memory, input and output alike.
assert ext.data_pointer(h._pending.inputs[0]) == t.data_ptr() and ext.data_pointer(h._pending.outputs[0]) == t.data_ptr(), \
    "the bridge staged a contiguous tensor"
ptr_before = t.data_ptr()
jct.synchronize(h)
assert t.data_ptr() == ptr_before
assert torch.equal(t, torch.arange(1000, dtype=torch.float32) * SIZE + sum(range(SIZE)))
# Out of place: the input is read in place, the output is a fresh tensor.
h = jct.allreduce_async(t, op="max", name="zero-copy-oop")
assert ext.data_pointer(h._pending.inputs[0]) == t.data_ptr()
out = jct.synchronize(h)
assert ext.data_pointer(h_out := out) == h_out.data_ptr()
bf = torch.ones(8, dtype=torch.bfloat16) * (RANK + 1)  # bfloat16 travels as its int16 bits, in place
h = jct.allreduce_async_(bf, op="sum", name="zero-copy-bf16")
assert ext.data_pointer(h._pending.inputs[0]) == bf.data_ptr()
jct.synchronize(h)
assert torch.equal(bf, torch.full((8,), float(sum(range(1, SIZE + 1))), dtype=torch.bfloat16))

# --- non-contiguous fallback (copy in, copy back) -------------------------------------------------------
base = (torch.arange(24, dtype=torch.float32).reshape(4, 6) + 100 * RANK)
nc = base.t()  # transposed view
assert not nc.is_contiguous()
assert ext.data_pointer(nc) != nc.data_ptr(), "expected nanobind to copy a non-contiguous tensor"
expected = sum((torch.arange(24, dtype=torch.float32).reshape(4, 6) + 100 * r) for r in range(SIZE)).t()
out = jct.allreduce(nc, op="sum", name="nc.oop")
assert out.is_contiguous() and torch.equal(out, expected)
jct.allreduce_(nc, op="sum", name="nc.inplace")
assert torch.equal(nc, expected) and torch.equal(base, expected.t()), "copy-back into the view failed"
strided = torch.arange(20, dtype=torch.float64)[::2] * (RANK + 1)  # strided slice
jct.allreduce_(strided, op="sum", name="strided")
assert torch.equal(strided, torch.arange(20, dtype=torch.float64)[::2] * sum(range(1, SIZE + 1)))
cl = (torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5) * (RANK + 1)).to(
    memory_format=torch.channels_last)
jct.allreduce_(cl, op="sum", name="channels_last")
assert torch.equal(cl, torch.arange(120, dtype=torch.float32).reshape(2, 3, 4, 5) * sum(range(1, SIZE + 1)))
assert cl.is_contiguous(memory_format=torch.channels_last)
cz = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj()  # lazy conjugate bit
out = jct.allreduce(cz, op="sum", name="conj")
assert torch.equal(out, torch.tensor([1 - 2j, 3 + 1j], dtype=torch.complex64) * SIZE), out
src = (torch.arange(24, dtype=torch.float32).reshape(4, 6) + 100 * RANK).t()[:, :2]
gathered = jct.allgather(src, name="nc.gather")
assert torch.equal(gathered, torch.cat([(torch.arange(24, dtype=torch.float32).reshape(4, 6) + 100 * r)
                                        .t()[:, :2] for r in range(SIZE)]))

# --- bfloat16 / float16 training through DistributedOptimizer ------------------------------------------
for dtype in (torch.bfloat16, torch.float16):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(dtype)
    opt = jct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), name_prefix=f"g{dtype}")
    for step in range(3):
        opt.zero_grad()
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(10 * RANK + step)).to(dtype)
        model(x).float().pow(2).mean().backward()
        opt.step()
    for n, p in model.named_parameters():
        same_on_all_ranks(p.detach().view(torch.int16).numpy(), f"{dtype} {n}")
    opt.remove_hooks()

assert tops.outstanding() == 0
done("torch_ops")
jct.shutdown()
