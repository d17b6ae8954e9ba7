"""Checks of the CUDA path (tier A, docs/gpu.md) on a GPU, at 1 rank or several ranks.

    mpirun -np N python tests/gpu/gpu_checks.py checks     # correctness (prints one line per check)
    mpirun -np N python tests/gpu/gpu_checks.py bandwidth  # GB/s of the staged allreduce

Run by tests/gpu/test_gpu.py and tests/gpu/device_check.sh. Every result is checked against
NumPy on every rank and must be bitwise identical across ranks. JAXCACHE_CHECK_PLATFORM=cpu
runs the same program on CPU arrays (a dry run of the device check on a machine without a
GPU; the CPU-vs-GPU checks are then skipped, saying so).
"""

import os
import sys
import time
import zlib

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import ml_dtypes

import jaxcache as jc
from jaxcache.errors import MismatchError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi"))
from _util import COMM, assert_close, same_on_all_ranks  # noqa: E402

PLATFORM = os.environ.get("JAXCACHE_CHECK_PLATFORM", "gpu")
DEV = jax.devices(PLATFORM)[0]
CPU = jax.devices("cpu")[0]
ON_GPU = DEV.platform != "cpu"

jc.init()
rank, size = jc.rank(), jc.size()
T0 = time.perf_counter()


def say(text: str) -> None:
    COMM.Barrier()
    if rank == 0:
        print(f"[{time.perf_counter() - T0:6.1f}s] {text}", flush=True)


def put(x, device=None):
    return jax.device_put(np.asarray(x), device or DEV)


def on(device, *arrays) -> None:
    for a in arrays:
        assert a.devices() == {device}, f"result on {a.devices()}, expected {device}"


def local_input(dtype, shape, op, r, salt):
    rng = np.random.default_rng([r, salt])
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(-3 if op == "prod" else -50, 3 if op == "prod" else 50,
                            size=shape).astype(dtype)
    base = rng.uniform(0.5, 1.5, size=shape) if op == "prod" else rng.standard_normal(shape)
    return base.astype(dtype)


def reference(inputs, op, dtype):
    dtype = np.dtype(dtype)
    wide = None if dtype.kind in "iu" else np.float64
    stack = np.stack([x.astype(wide) if wide else x for x in inputs])
    if op in ("sum", "average"):
        out = stack.sum(axis=0, dtype=wide or dtype)
        out = out / size if op == "average" else out
    elif op == "prod":
        out = stack.prod(axis=0, dtype=wide or dtype)
    else:
        out = stack.min(axis=0) if op == "min" else stack.max(axis=0)
    return np.asarray(out).astype(dtype)


TOLERANCE = {np.dtype(np.float16): 3e-2, np.dtype(ml_dtypes.bfloat16): 3e-2,
             np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}


def check_allreduce():
    n = 0
    for dtype in (np.float32, ml_dtypes.bfloat16, np.float16, np.float64, np.int32):
        ops = ("sum", "min", "max", "prod") if np.dtype(dtype).kind == "i" else \
            ("sum", "average", "min", "max", "prod")
        for op in ops:
            salt = zlib.crc32(f"{np.dtype(dtype)}{op}".encode())
            inputs = [local_input(dtype, (257, 3), op, r, salt) for r in range(size)]
            want = reference(inputs, op, dtype)
            tol = TOLERANCE.get(np.dtype(dtype), 0)
            f = jax.jit(lambda v, op=op, dtype=dtype: jc.allreduce(
                v, op=op, name=f"ar.{np.dtype(dtype)}.{op}"))
            for mode in ("jit", "eager"):
                x = put(inputs[rank])
                y = f(x) if mode == "jit" else jc.allreduce(x, op=op, name=f"eager.{np.dtype(dtype)}.{op}")
                on(DEV, y)
                assert_close(np.asarray(y), want, f"allreduce {np.dtype(dtype)} {op} {mode}", rtol=tol, atol=tol)
                same_on_all_ranks(y, f"allreduce {np.dtype(dtype)} {op} {mode}")
                n += 1
    say(f"allreduce: {n} op x dtype x (jit, eager) combinations OK on {DEV.platform}")


def check_grouped_300():
    # 300 float32 leaves of ~1 MB each (sizes differ, so fusion and direct paths both run).
    counts = [250_000 + (i * 7919) % 40_000 for i in range(300)]
    total_mb = sum(counts) * 4 / 2**20
    tree = {f"p{i:03d}": put(np.full(c, (rank + 1) * (i % 7 + 1), np.float32))
            for i, c in enumerate(counts)}
    f = jax.jit(lambda t: jc.grouped_allreduce(t, op="average", name="big"))
    times, staging = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        out = jax.block_until_ready(f(tree))
        times.append(time.perf_counter() - t0)
        if ON_GPU:
            from jaxcache._ext import ext
            staging.append(ext.cuda_staging_bytes())
    mean = (size + 1) / 2
    for i, c in enumerate(counts):
        leaf = out[f"p{i:03d}"]
        on(DEV, leaf)
        assert_close(np.asarray(leaf), np.full(c, (i % 7 + 1) * mean, np.float32), f"leaf {i}",
                     rtol=1e-6)
    same_on_all_ranks(np.asarray(out["p299"]), "leaf 299")
    if ON_GPU:
        # One reusable pool: the steady state allocates nothing new.
        assert staging[1] == staging[2] and staging[2] > 0, staging
    say(f"grouped_allreduce: 300 leaves, {total_mb:.0f} MB, OK; steps {', '.join(f'{t:.3f}' for t in times)} s"
        + (f"; pinned staging held {staging[-1] / 2**20:.0f} MB, constant after step 1" if ON_GPU else ""))


def check_broadcast_allgather_grad():
    root = 1 if size > 1 else 0
    tree = {"w": put(np.arange(12, dtype=np.float32).reshape(3, 4) + 100 * rank),
            "b": put(np.full(5, rank, np.int32))}
    out = jax.jit(lambda t: jc.broadcast(t, root=root, name="bcast"))(tree)
    on(DEV, out["w"], out["b"])
    assert_close(np.asarray(out["w"]), np.arange(12, dtype=np.float32).reshape(3, 4) + 100 * root, "broadcast w")
    assert_close(np.asarray(out["b"]), np.full(5, root, np.int32), "broadcast b")
    same_on_all_ranks(out["w"])

    x = put(np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * rank)
    g = jax.jit(lambda v: jc.allgather(v, name="gather"))(x)
    on(DEV, g)
    want = np.concatenate([np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * r for r in range(size)])
    assert_close(np.asarray(g), want, "allgather")
    same_on_all_ranks(g)
    # Scalars and zero-size tensors, alone in a request (an empty staging region).
    edge = jax.jit(lambda t: jc.allgather(t, name="gather.edge"))(
        {"s": put(np.float32(rank)), "e": put(np.zeros((0, 3), np.float32))})
    assert_close(np.asarray(edge["s"]), np.arange(size, dtype=np.float32), "allgather scalar")
    assert edge["e"].shape == (0, 3), edge["e"].shape
    empty = jax.jit(lambda v: jc.allreduce(v, op="sum", name="empty"))(put(np.zeros((0,), np.float32)))
    assert empty.shape == (0,), empty.shape

    # grad of allreduce-sum: size * ones. grad through allgather reads the rank on the device
    # (the jaxcache_rank helper): each rank gets its own slice of the summed cotangent.
    v = put(np.linspace(-1, 1, 8, dtype=np.float32))
    d = jax.jit(jax.grad(lambda a: jc.allreduce(a, op="sum", name="gsum").sum()))(v)
    on(DEV, d)
    assert_close(np.asarray(d), np.full(8, size, np.float32), "grad allreduce")
    weights = np.arange(8 * size, dtype=np.float32)
    d = jax.jit(jax.grad(lambda a: (jc.allgather(a, name="ggather") * weights).sum()))(v)
    on(DEV, d)
    assert_close(np.asarray(d), size * weights[8 * rank:8 * (rank + 1)], "grad allgather")
    say(f"broadcast from rank {root}, allgather (also scalars, zero-size), grad of allreduce "
        "and of allgather: OK")


def expect_mismatch(fn, what, fragment):
    try:
        jax.block_until_ready(fn())
    except Exception as e:  # noqa: BLE001 - eager: MismatchError; jit: XLA's JaxRuntimeError
        text = str(e)
        assert isinstance(e, MismatchError) or "jaxcache.MismatchError" in text, (what, text)
        assert fragment in text, (what, text)
        return text
    raise AssertionError(f"rank {rank}: {what}: no MismatchError")


def check_mismatch():
    if size < 2:
        say("mismatch: skipped (needs 2 ranks)")
        return
    # A dtype mismatch under jit on the GPU: every rank fails, naming both sides.
    dtype = np.float32 if rank == 0 else np.float16
    msg = expect_mismatch(lambda: jax.jit(lambda v: jc.allreduce(v, name="mm.dtype"))(put(np.ones(4, dtype))),
                          "dtype", "dtype differs across ranks")
    assert "rank 0: float32" in msg and "float16" in msg, msg
    # The runtime keeps working.
    y = jax.jit(lambda v: jc.allreduce(v, op="sum", name="mm.after"))(put(np.ones(4, np.float32)))
    assert_close(np.asarray(y), np.full(4, size, np.float32), "after the mismatch")
    if ON_GPU:
        # A CPU array on rank 0 against GPU arrays elsewhere: the device kind is in the signature.
        device = CPU if rank == 0 else DEV
        msg = expect_mismatch(lambda: jax.jit(lambda v: jc.allreduce(v, name="mm.device"))(put(np.ones(4, np.float32), device)),
                              "device", "device differs across ranks")
        assert "rank 0: cpu" in msg and "cuda" in msg, msg
        say("mismatch: dtype and CPU-vs-GPU arrays each give MismatchError on every rank; runtime still works")
    else:
        say("mismatch: dtype gives MismatchError on every rank; runtime still works "
            "(CPU-vs-GPU arrays: skipped, no GPU)")


def train(device, steps=20):
    """A data-parallel MLP regression, `steps` jitted SGD steps on `device`; returns params."""
    rng = np.random.default_rng(1234)
    w_true = rng.standard_normal((16, 1)).astype(np.float32)
    local = np.random.default_rng(rank)
    xs = local.standard_normal((steps, 64, 16)).astype(np.float32)
    ys = np.tanh(xs @ w_true) + 0.01 * local.standard_normal((steps, 64, 1)).astype(np.float32)
    init = np.random.default_rng(0)
    params = {"w1": init.standard_normal((16, 32)).astype(np.float32) * 0.3,
              "b1": np.zeros(32, np.float32),
              "w2": init.standard_normal((32, 1)).astype(np.float32) * 0.3,
              "b2": np.zeros(1, np.float32)}
    params = jax.tree_util.tree_map(lambda a: put(a, device), params)
    params = jc.broadcast(params, root=0, name="train.init")

    def loss(p, x, y):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    @jax.jit
    def step(p, x, y):
        value, grads = jax.value_and_grad(loss)(p, x, y)
        grads = jc.grouped_allreduce(grads, op="average", name="train.grads")
        value = jc.allreduce(value, op="average", name="train.loss")
        return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grads), value

    losses = []
    for i in range(steps):
        params, value = step(params, put(xs[i], device), put(ys[i], device))
        losses.append(float(value))
    on(device, *jax.tree_util.tree_leaves(params))
    return params, losses


def check_training():
    with jax.default_matmul_precision("highest"):
        p_dev, l_dev = train(DEV)
        p_cpu, l_cpu = train(CPU)
    worst = 0.0
    for k in p_dev:
        a, b = np.asarray(p_dev[k]), np.asarray(p_cpu[k])
        same_on_all_ranks(a, f"trained {k}")
        assert_close(a, b, f"{DEV.platform} vs cpu {k}", rtol=1e-4, atol=1e-5)
        worst = max(worst, float(np.max(np.abs(a - b))))
    assert l_dev[-1] < l_dev[0], l_dev
    say(f"training: 20 jitted steps on {DEV.platform} equal the CPU run (max |diff| {worst:.2e}); "
        f"loss {l_dev[0]:.4f} -> {l_dev[-1]:.4f}")


def check_torch():
    try:
        import torch
    except ImportError:
        say("torch: not installed, skipped")
        return
    if not (ON_GPU and torch.cuda.is_available()):
        say("torch: no CUDA device for torch, skipped")
        return
    import jaxcache.torch as jct

    dev = torch.device("cuda", 0)
    t = torch.full((1000,), float(rank + 1), device=dev)
    jct.allreduce_(t, op="sum", name="torch.ar_")
    assert t.device == dev and torch.equal(t.cpu(), torch.full((1000,), float(sum(range(1, size + 1)))))
    # Produced and consumed on a side stream: staging follows the current stream.
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        x = torch.arange(4096, device=dev, dtype=torch.float32) * (rank + 1)
        y = jct.allreduce(x, op="average", name="torch.avg")
        z = y * 2
    side.synchronize()
    want = np.arange(4096, dtype=np.float32) * (size + 1) / 2
    assert y.device == dev
    assert_close(z.cpu().numpy(), 2 * want, "torch side stream", rtol=1e-6)
    b = jct.broadcast(torch.full((3,), float(rank), device=dev), root_rank=size - 1, name="torch.bc")
    assert b.device == dev and torch.equal(b.cpu(), torch.full((3,), float(size - 1)))
    g = jct.allgather(torch.arange(3, device=dev) + 10 * rank, name="torch.ag")
    assert g.device == dev and g.cpu().tolist() == [k + 10 * r for r in range(size) for k in range(3)]
    if size > 1:
        mixed = torch.ones(4) if rank == 0 else torch.ones(4, device=dev)
        try:
            jct.allreduce(mixed, name="torch.mixed")
        except MismatchError as e:
            assert "device differs across ranks" in str(e), e
        else:
            raise AssertionError("torch: a CPU/CUDA mix was accepted")
    say("torch: CUDA tensors (in place, side stream, broadcast, allgather"
        + (", CPU-vs-CUDA mismatch" if size > 1 else "") + "): OK")


def bandwidth():
    from statistics import median

    parts = []
    for mb in (1, 16, 256):
        n = mb * 2**20 // 4
        result = {}
        for label, device in (("staged", DEV), ("host", CPU)):
            x = put(np.full(n, rank + 1, np.float32), device)
            f = jax.jit(lambda v, mb=mb, label=label: jc.allreduce(v, op="sum", name=f"bw.{mb}.{label}"))
            y = jax.block_until_ready(f(x))
            assert float(y[0]) == size * (size + 1) / 2
            reps = 20 if mb < 256 else 6
            times = []
            for _ in range(reps):
                COMM.Barrier()
                t0 = time.perf_counter()
                jax.block_until_ready(f(x))
                times.append(time.perf_counter() - t0)
            result[label] = mb * 2**20 / median(times) / 1e9
        parts.append(f"{mb} MB: {result['staged']:.2f} GB/s (CPU arrays {result['host']:.2f})")
    say(f"bandwidth: allreduce-sum of float32 {DEV.platform} arrays under jit, {size} ranks, "
        f"tensor bytes / median time: " + "; ".join(parts))


if sys.argv[1] == "checks":
    say(f"{size} rank(s), jax {jax.__version__}, device {DEV.device_kind} ({DEV.platform}), "
        f"cuda_built={jc.cuda_built()}, cuda_available={jc.cuda_available()}")
    check_allreduce()
    check_grouped_300()
    check_broadcast_allgather_grad()
    check_mismatch()
    check_training()
    check_torch()
    say(f"gpu checks: all OK on {size} rank(s)")
elif sys.argv[1] == "bandwidth":
    bandwidth()
else:
    raise SystemExit(f"unknown mode {sys.argv[1]}")
jc.shutdown()
