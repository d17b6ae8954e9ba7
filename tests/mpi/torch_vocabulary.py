"""jaxcache.torch: reducescatter, alltoall, uneven allgather, object collectives and join.

Against NumPy on every rank (every dtype and op the bridge's allreduce supports), async
handles, threads submitting in rank-dependent orders, mismatches (MismatchError on every
rank), and a DistributedOptimizer loop where ranks run out of data at different steps.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import torch
from _util import COMM, done, same_on_all_ranks

import jaxcache.torch as jct
from jaxcache.torch import requests as tops

jct.init()
RANK, SIZE = jct.rank(), jct.size()
torch.set_num_threads(1)
scenario = sys.argv[1]

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int32,
          torch.int64, torch.uint8, torch.complex64, torch.bool]


def ops_for(dtype):
    if dtype == torch.bool:
        return ["min", "max"]
    if dtype.is_complex:
        return ["sum", "average", "prod"]
    if not dtype.is_floating_point:
        return ["sum", "min", "max", "prod"]
    return ["sum", "average", "min", "max", "prod"]


def inputs(seed: int, shape, dtype, op="sum") -> list[torch.Tensor]:
    out = []
    for r in range(SIZE):
        g = torch.Generator().manual_seed(1000 * seed + r)
        if dtype == torch.bool:
            out.append(torch.rand(shape, generator=g) > 0.5)
        elif dtype.is_complex:
            out.append(torch.randn(shape, generator=g, dtype=dtype))
        elif dtype.is_floating_point:
            base = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5 if op == "prod" else \
                torch.randn(shape, generator=g, dtype=torch.float64) * 4
            out.append(base.to(dtype))
        else:
            hi = 3 if op == "prod" else 6
            out.append(torch.randint(0 if dtype == torch.uint8 else -3, hi, shape, generator=g).to(dtype))
    return out


def np_of(t):
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def reference(xs, op, divisor=None):
    wide = [np_of(x).astype(np.complex128 if x.dtype.is_complex else
                            (np.float64 if x.dtype.is_floating_point else np_of(x).dtype)) for x in xs]
    stack = np.stack(wide)
    return {"sum": lambda: stack.sum(0), "average": lambda: stack.sum(0) / (divisor or SIZE),
            "min": lambda: stack.min(0), "max": lambda: stack.max(0), "prod": lambda: stack.prod(0)}[op]()


def check(actual, expected, dtype, what):
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype} != {dtype}"
    tol = {torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float32: 1e-6, torch.complex64: 1e-6}.get(dtype, 1e-12)
    got = np_of(actual)
    assert got.shape == np.shape(expected), f"{what}: shape {got.shape} != {np.shape(expected)}"
    if dtype.is_floating_point or dtype.is_complex:
        np.testing.assert_allclose(got.astype(np.complex128 if dtype.is_complex else np.float64), expected,
                                   rtol=tol, atol=tol * 8, err_msg=what)
    else:
        np.testing.assert_array_equal(got, np.asarray(expected).astype(got.dtype), err_msg=what)


def rows_of(n, r):
    return n // SIZE + (1 if r < n % SIZE else 0)


def my_rows(full, r=RANK):
    start = sum(rows_of(full.shape[0], q) for q in range(r))
    return full[start:start + rows_of(full.shape[0], r)]


def raises(exc, fragments, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        for f in fragments:
            assert f in str(e), f"{f!r} not in {e}"
        assert len(set(COMM.allgather(type(e).__name__))) == 1
        return
    raise AssertionError(f"expected {exc.__name__} {fragments}")


if scenario == "ops":
    seed = 0
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for rows in (2 * SIZE, 2 * SIZE + 1, SIZE - 1):
                seed += 1
                xs = inputs(seed, (rows, 3), dtype, op)
                expected = my_rows(reference(xs, op))
                if dtype == torch.bool:
                    expected = expected.astype(bool)
                out = jct.reducescatter(xs[RANK], op=op, name=f"rs.{dtype}.{op}.{rows}")
                check(out, expected, dtype, f"reducescatter {dtype} {op} rows {rows}")
    # async, grouped, scaled, non-contiguous input (staged copy)
    xs = inputs(500, (3 * SIZE, 2), torch.float64)
    h = jct.reducescatter_async(xs[RANK].t().contiguous().t(), op="sum", prescale=2.0, postscale=0.5)
    check(jct.synchronize(h), my_rows(reference(xs, "sum")), torch.float64, "reducescatter async scaled")
    check(jct.reducescatter(xs[RANK][:, ::2].t().t(), op="sum"), my_rows(reference([x[:, ::2] for x in xs], "sum")),
          torch.float64, "reducescatter non-contiguous")
    group = [inputs(600 + i, (2 * SIZE + i, 2), d) for i, d in enumerate((torch.float32, torch.int32, torch.bfloat16))]
    outs = jct.grouped_reducescatter([g[RANK] for g in group], op="sum", name="grs")
    for i, (o, g) in enumerate(zip(outs, group)):
        check(o, my_rows(reference(g, "sum")), g[0].dtype, f"grouped reducescatter {i}")
    # allgather with a different first dimension per rank
    for dtype in DTYPES:
        parts = [inputs(700, (r + (1 if SIZE == 2 else 0), 2), dtype)[r] for r in range(SIZE)]
        out = jct.allgather(parts[RANK], name=f"ag.{dtype}")
        assert torch.equal(out, torch.cat(parts)), f"uneven allgather {dtype}"
        same_on_all_ranks(out.view(torch.uint8).numpy() if dtype not in (torch.bool,) else out.numpy(), f"ag {dtype}")
    assert jct.allgather(torch.tensor(RANK), name="ag.scalar").tolist() == list(range(SIZE))
    outs = jct.synchronize(jct.grouped_allgather_async([torch.ones(RANK + 1), torch.full((1, 2), RANK)]))
    assert outs[0].shape == (SIZE * (SIZE + 1) // 2,) and outs[1].tolist() == [[r, r] for r in range(SIZE)]
    # alltoall: equal blocks, splits that differ per rank, received splits
    for dtype in DTYPES:
        xs = inputs(800, (2 * SIZE, 3), dtype)
        out = jct.alltoall(xs[RANK], name=f"a2a.{dtype}")
        assert torch.equal(out, torch.cat([x[2 * RANK:2 * RANK + 2] for x in xs])), f"alltoall {dtype}"
        splits = [[(q + 2 * d) % 3 for d in range(SIZE)] for q in range(SIZE)]
        xs = [inputs(900, (sum(splits[q]), 2), dtype)[q] for q in range(SIZE)]
        out, received = jct.alltoall(xs[RANK], splits=splits[RANK], name=f"a2a.splits.{dtype}")
        expect = torch.cat([torch.split(xs[q], splits[q])[RANK] for q in range(SIZE)])
        assert torch.equal(out, expect), f"alltoall splits {dtype}"
        assert received.tolist() == [splits[q][RANK] for q in range(SIZE)], received
    h = jct.alltoall_async(torch.arange(SIZE) + 10 * RANK, splits=torch.ones(SIZE, dtype=torch.int64))
    out, received = jct.synchronize(h)
    assert out.tolist() == [RANK + 10 * q for q in range(SIZE)] and received.tolist() == [1] * SIZE
    # objects (one implementation shared with jaxcache and jaxcache.tensorflow)
    assert jct.allgather_object({"r": RANK, "p": "x" * RANK}) == [{"r": r, "p": "x" * r} for r in range(SIZE)]
    assert jct.broadcast_object(("cfg", RANK) if RANK == SIZE - 1 else None, root_rank=SIZE - 1) == ("cfg", SIZE - 1)
    assert tops.outstanding() == 0, tops.outstanding()

elif scenario == "threads":
    results, errors = {}, []

    def work(i):
        try:
            x = torch.arange(2 * SIZE * 2, dtype=torch.float32).reshape(2 * SIZE, 2) + i + RANK
            if i % 3 == 0:
                results[i] = jct.reducescatter(x, op="sum", name=f"th.rs.{i}")
            elif i % 3 == 1:
                results[i] = jct.alltoall(x, name=f"th.a2a.{i}")
            else:
                results[i] = jct.allgather(x[: RANK + 1], name=f"th.ag.{i}")
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    order = list(range(12)) if RANK % 2 == 0 else list(reversed(range(12)))
    for rep in range(3):
        threads = [threading.Thread(target=work, args=(i,)) for i in order]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        base = torch.arange(2 * SIZE * 2, dtype=torch.float32).reshape(2 * SIZE, 2)
        for i in range(12):
            xs = [base + i + q for q in range(SIZE)]
            if i % 3 == 0:
                expect = sum(xs)[2 * RANK:2 * RANK + 2]
            elif i % 3 == 1:
                expect = torch.cat([x[2 * RANK:2 * RANK + 2] for x in xs])
            else:
                expect = torch.cat([xs[q][: q + 1] for q in range(SIZE)])
            assert torch.equal(results[i], expect), (i, rep)

elif scenario == "errors":
    last = SIZE - 1
    raises(jct.MismatchError, ["mm.rs", "shape", f"rank {last}"], jct.reducescatter,
           torch.ones(4 if RANK != last else 6), op="sum", name="mm.rs")
    raises(jct.MismatchError, ["mm.ag", "shape beyond the first dimension"], jct.allgather,
           torch.ones(2, 3 if RANK != last else 4), name="mm.ag")
    sp = [1] * SIZE if RANK != last else [1] * (SIZE + 1)
    raises(jct.MismatchError, ["mm.a2a", "number of splits", f"rank {last}"], jct.alltoall,
           torch.ones(len(sp)), splits=sp, name="mm.a2a")
    sp = [1] * SIZE if RANK != last else [2] * SIZE
    raises(jct.InvalidArgumentError, ["mm.a2a.sum", "sum to"], jct.alltoall, torch.ones(SIZE), splits=sp,
           name="mm.a2a.sum")
    raises(ValueError, ["scalar"], jct.reducescatter, torch.tensor(1.0))
    # An integer average truncates toward zero (Horovod's rule): 3 * size / size is exact.
    assert jct.reducescatter(torch.full((SIZE,), 3, dtype=torch.int32)).tolist() == [3]
    raises(ValueError, ["negative"], jct.alltoall, torch.ones(SIZE), splits=[-1] + [1] * SIZE)
    assert jct.allreduce(torch.ones(2), op="sum", name="healthy").tolist() == [SIZE, SIZE]

elif scenario == "join":
    # A DistributedOptimizer loop; rank r has steps[r] batches and then joins.
    steps = [3, 5] if SIZE == 2 else [3, 6, 5]  # rank 0 (the coordinator) runs out first

    def batch(r, t):
        g = torch.Generator().manual_seed(100 * r + t)
        return torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)

    def make():
        torch.manual_seed(5)
        return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()

    model = make()
    opt = jct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                   named_parameters=model.named_parameters(), op="average")
    bn = jct.SyncBatchNorm(3).double()  # its statistics span the ranks that have not joined
    ref = make()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    for t in range(max(steps)):
        active = [r for r in range(SIZE) if steps[r] > t]
        # Single process: the active ranks' gradients summed and divided by the size
        # (Horovod's rule after join(): joined ranks count as zeros).
        grads = []
        for r in active:
            ref.zero_grad()
            x, y = batch(r, t)
            torch.nn.functional.cross_entropy(ref(x.double()), y).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        for p, *gs in zip(ref.parameters(), *grads):
            p.grad = sum(gs) / SIZE
        ref_opt.step()
        if RANK in active:
            opt.zero_grad()
            x, y = batch(RANK, t)
            torch.nn.functional.cross_entropy(model(x.double()), y).backward()
            opt.step()
            metric = jct.allgather(torch.tensor([float(t)]), name="metric")
            assert metric.tolist() == [float(t)] * len(active), metric
            np.testing.assert_allclose(
                jct.reducescatter(torch.full((SIZE,), 2.0 * RANK), op="average", name="rs").numpy(),
                [2.0 * sum(active) / SIZE], rtol=1e-6)
            # A sparse gradient: divided by the size, like dense ones.
            def sparse_of(r):
                return torch.sparse_coo_tensor(torch.tensor([[r % 4, (r + t) % 4]]),
                                               torch.tensor([1.0 + r, 2.0 * t + r]), (4,),
                                               check_invariants=True)
            got = jct.synchronize(jct.sparse_allreduce_async(sparse_of(RANK), "sparse", jct.Average))
            want = sum(sparse_of(r).to_dense() for r in active) / SIZE
            torch.testing.assert_close(got.to_dense(), want, rtol=1e-6, atol=0)
            # SyncBatchNorm: normalized with the active ranks' batches (sizes differ per rank),
            # and its input gradient matches single-process batch norm over them.
            feats = [torch.randn(2 + r, 3, generator=torch.Generator().manual_seed(7 * r + t)).double()
                     for r in range(SIZE)]
            mine = feats[RANK].clone().requires_grad_()
            out = bn(mine)
            weights = torch.arange(1.0, 4.0).double()
            (out * weights).sum().backward()
            ref_in = torch.cat([feats[r] for r in active]).requires_grad_()
            ref_out = torch.nn.functional.batch_norm(ref_in, None, None, training=True, eps=bn.eps)
            (ref_out * weights).sum().backward()
            start = sum(feats[r].shape[0] for r in active if r < RANK)
            rows = slice(start, start + feats[RANK].shape[0])
            torch.testing.assert_close(out, ref_out[rows], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(mine.grad, ref_in.grad[rows], rtol=1e-10, atol=1e-12)
        if t + 1 == steps[RANK]:
            last = jct.join()
            assert last == int(np.argmax(steps)), (last, steps)
            for (k, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=f"{k} after {steps[RANK]} steps")
            break

else:
    raise SystemExit(f"unknown scenario {scenario}")

done(f"torch_vocabulary {scenario}")
