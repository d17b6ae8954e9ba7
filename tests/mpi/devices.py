"""Several devices per process (docs/devices.md), against NumPy on every rank and device,
bitwise identical across ranks.

    mpirun -np P python devices.py N [PROGRAMS]

N CPU devices per process (XLA's --xla_force_host_platform_device_count). Covers: every
collective inside shard_map (device positions pair up, whatever the mesh's device order);
every collective on sharded jax.Arrays (a sharded, a partly replicated and a replicated
spec), eager and under jit, shardings kept; `axis_name` (every op, pytrees of mixed dtypes,
values the same on every device, grad, vmap, scan, a replicated out_spec); PROGRAMS distinct
jitted shard_map programs (the report that started this: device i met device j); one-device
and sharded arrays in one program; two executions in flight and two threads; the counters
(one request per collective, not per device; a replicated array's bytes reduced once).
"""

import os
import sys

DEVICES = int(sys.argv[1])
PROGRAMS = int(sys.argv[2]) if len(sys.argv) > 2 else 40
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"

import json  # noqa: E402
import threading  # noqa: E402

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jaxcache as jc  # noqa: E402
from _util import done, raises, same_on_all_ranks  # noqa: E402

jc.init()
rank, size = jc.rank(), jc.size()
N = DEVICES
assert len(jax.local_devices()) == N
# Odd ranks list their devices backwards: positions, not device ids, must pair up.
ORDER = jax.local_devices()[::-1] if rank % 2 else jax.local_devices()
MESH = Mesh(np.array(ORDER), ("d",))


def data(r, position, shape, dtype=np.float32, salt=0):
    """Small integers (exact sums), distinct per rank, device position and salt."""
    rng = np.random.default_rng([r, position, salt])
    return rng.integers(-20, 20, size=shape).astype(dtype)


def stacked(r, shape, dtype=np.float32, salt=0):
    """Rank r's per-device values stacked along a new first axis (position order)."""
    return np.stack([data(r, i, shape, dtype, salt) for i in range(N)])


def check(got, want, what, same=True, rtol=0.0):
    """`got` equals `want` (exactly, or within `rtol`: an average rounds); with `same`,
    bitwise identical on every rank too (a result that is not rank-dependent)."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    if rtol:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5, err_msg=what)
    else:
        assert np.array_equal(got, want), f"{what}: got {got.ravel()[:8]} want {want.ravel()[:8]}"
    if same:
        same_on_all_ranks(got, what)


def per_device(fn, *args, out_specs=P("d")):
    """fn over each device's value (the leading axis split over MESH), jitted."""
    return jax.jit(jax.shard_map(fn, mesh=MESH, in_specs=P("d"), out_specs=out_specs))(*args)


def reduce_np(values, op):
    stack = np.stack(values)
    return {"sum": stack.sum(0), "min": stack.min(0), "max": stack.max(0), "prod": stack.prod(0),
            "average": stack.sum(0) / len(values)}[op].astype(values[0].dtype)


# --- inside shard_map: device position i meets position i of every rank -------------------

def shard_map_collectives():
    shape = (2 * size, 3)
    x = {r: stacked(r, shape, salt=1) for r in range(size)}
    for op in ("sum", "average", "min", "max", "prod"):
        vals = {r: (np.clip(x[r], 1, 3) if op == "prod" else x[r]) for r in range(size)}
        got = per_device(lambda v, op=op: jc.allreduce(v[0], op, name=f"sm.ar.{op}")[None], vals[rank])
        want = np.stack([reduce_np([vals[r][i] for r in range(size)], op) for i in range(N)])
        check(got, want, f"shard_map allreduce {op}", rtol=1e-6 if op == "average" else 0.0)
    ints = {r: stacked(r, (5,), np.int32, salt=2) for r in range(size)}
    got = per_device(lambda t: jax.tree.map(lambda v: v[None], jc.grouped_allreduce(
        {"f": t[0][0], "i": t[1][0]}, "sum", name="sm.grouped")), (x[rank], ints[rank]))
    check(got["f"], np.stack([sum(x[r][i] for r in range(size)) for i in range(N)]), "shard_map grouped f")
    check(got["i"], np.stack([sum(ints[r][i] for r in range(size)) for i in range(N)]), "shard_map grouped i")
    root = size - 1
    check(per_device(lambda v: jc.broadcast(v[0], root=root, name="sm.bcast")[None], x[rank]), x[root],
          "shard_map broadcast")
    check(per_device(lambda v: jc.allgather(v[0], name="sm.ag")[None], x[rank]),
          np.stack([np.concatenate([x[r][i] for r in range(size)]) for i in range(N)]), "shard_map allgather")
    sums = np.stack([sum(x[r][i] for r in range(size)) for i in range(N)])
    check(per_device(lambda v: jc.reducescatter(v[0], "sum", name="sm.rs")[None], x[rank]),
          sums[:, 2 * rank:2 * rank + 2], "shard_map reducescatter", same=False)
    check(per_device(lambda v: jc.alltoall(v[0], name="sm.a2a")[None], x[rank]),
          np.stack([np.concatenate([x[r][i][2 * rank:2 * rank + 2] for r in range(size)]) for i in range(N)]),
          "shard_map alltoall", same=False)
    check(per_device(lambda v: jc.reduce(v[0], "sum", root=0, name="sm.reduce")[None], x[rank]),
          sums if rank == 0 else x[rank], "shard_map reduce", same=False)
    check(per_device(lambda v: jc.scan(v[0], "sum", name="sm.scan")[None], x[rank]),
          np.stack([sum(x[r][i] for r in range(rank + 1)) for i in range(N)]), "shard_map scan", same=False)
    gathered = per_device(lambda v: jc.gather(v[0], root=0, name="sm.gather")[None], x[rank])
    if rank == 0:
        check(gathered, np.stack([np.stack([x[r][i] for r in range(size)]) for i in range(N)]), "shard_map gather", same=False)
    check(per_device(lambda v: (jc.barrier(name="sm.barrier"), v)[1], x[rank]), x[rank], "shard_map barrier",
          same=False)
    blocks = {r: stacked(r, (size, 4), salt=3) for r in range(size)}
    template = blocks[rank] if rank == root else blocks[rank][:, 0]  # elsewhere: the block's shape
    check(per_device(lambda v: jc.scatter(v[0], root=root, name="sm.scatter")[None], template),
          blocks[root][:, rank], "shard_map scatter", same=False)


def shard_map_2d_mesh():
    """A 2-D mesh: positions are the flattened mesh order."""
    if N < 4:
        return
    mesh = Mesh(np.array(ORDER).reshape(2, N // 2), ("a", "b"))
    x = {r: stacked(r, (3,), salt=4).reshape(2, N // 2, 3) for r in range(size)}
    f = jax.jit(jax.shard_map(lambda v: jc.allreduce(v, "sum", name="sm2d"), mesh=mesh,
                              in_specs=P("a", "b"), out_specs=P("a", "b")))
    check(f(x[rank]), sum(x[r] for r in range(size)), "shard_map 2-D mesh allreduce")


# --- sharded jax.Arrays, eager and under jit ---------------------------------------------

SPECS = {"sharded": P("d"), "replicated": P(), "columns": P(None, "d")}


def logical(r, rows, cols=2 * N, dtype=np.float32, salt=5):
    return data(r, 99, (rows, cols), dtype, salt)


def sharded_collectives(mode):
    rows = 4 * size * N
    for spec_name, spec in SPECS.items():
        sharding = NamedSharding(MESH, spec)
        x = {r: logical(r, rows) for r in range(size)}
        arr = jax.device_put(x[rank], sharding)

        def run(fn, name):
            f = (lambda v: fn(v, name)) if mode == "eager" else jax.jit(lambda v: fn(v, name))
            out = f(arr)
            what = f"{mode} {name} {spec_name}"
            assert len(out.sharding.device_set) == N, f"{what}: result on {out.sharding.device_set}"
            return out, what

        total = sum(x[r] for r in range(size))
        out, what = run(lambda v, n: jc.allreduce(v, "sum", name=n), f"sh.ar.{mode}.{spec_name}")
        check(out, total, what)
        assert out.sharding.is_equivalent_to(sharding, 2), f"{what}: sharding {out.sharding}"
        out, what = run(lambda v, n: jc.allreduce(v, "max", name=n), f"sh.max.{mode}.{spec_name}")
        check(out, np.max(np.stack([x[r] for r in range(size)]), 0), what)
        out, what = run(lambda v, n: jc.broadcast(v, root=size - 1, name=n), f"sh.bc.{mode}.{spec_name}")
        check(out, x[size - 1], what)
        out, what = run(lambda v, n: jc.allgather(v, name=n), f"sh.ag.{mode}.{spec_name}")
        check(out, np.concatenate([x[r] for r in range(size)]), what)
        out, what = run(lambda v, n: jc.reducescatter(v, "sum", name=n), f"sh.rs.{mode}.{spec_name}")
        per = rows // size
        check(out, total[rank * per:(rank + 1) * per], what, same=False)
        out, what = run(lambda v, n: jc.alltoall(v, name=n), f"sh.a2a.{mode}.{spec_name}")
        check(out, np.concatenate([x[r][rank * per:(rank + 1) * per] for r in range(size)]), what, same=False)
        out, what = run(lambda v, n: jc.reduce(v, "sum", root=0, name=n), f"sh.red.{mode}.{spec_name}")
        check(out, total if rank == 0 else x[rank], what, same=False)
        out, what = run(lambda v, n: jc.scan(v, "sum", name=n), f"sh.scan.{mode}.{spec_name}")
        check(out, sum(x[r] for r in range(rank + 1)), what, same=False)
        tree = {"a": arr, "b": jax.device_put(logical(rank, rows, salt=6), sharding)}
        f = (lambda t: jc.grouped_allreduce(t, "sum", name=f"sh.grp.{mode}.{spec_name}"))
        out = f(tree) if mode == "eager" else jax.jit(f)(tree)
        check(out["a"], total, f"{mode} grouped {spec_name} a")
        check(out["b"], sum(logical(r, rows, salt=6) for r in range(size)), f"{mode} grouped {spec_name} b")


def replicated_bytes_once():
    """A replicated array's bytes cross processes once, split among the devices holding its
    copies (each reduces 1/N): bytes_reduced counts the array once, not N times."""
    x = {r: logical(r, 8192, 16, salt=7) for r in range(size)}  # 512 KiB
    arr = jax.device_put(x[rank], NamedSharding(MESH, P()))
    f = jax.jit(lambda v: jc.allreduce(v, "sum", name="sh.split"))
    f(arr).block_until_ready()
    before = jc.stats()["bytes_reduced"]
    out = f(arr)
    check(out, sum(x[r] for r in range(size)), "replicated split")
    counted = jc.stats()["bytes_reduced"] - before
    assert counted == x[rank].nbytes, f"bytes_reduced {counted} for a {x[rank].nbytes}-byte replicated array"


# --- axis_name: over the local devices and every rank -------------------------------------

def everyone(shape, dtype=np.float32, salt=0):
    """Every device of every rank, in global order (rank-major)."""
    return [data(r, i, shape, dtype, salt) for r in range(size) for i in range(N)]


def axis_collectives():
    g = everyone((5, 3), salt=10)
    mine = np.stack(g[rank * N:(rank + 1) * N])
    for op in ("sum", "average", "min", "max", "prod"):
        vals = [np.clip(v, 1, 2) for v in g] if op == "prod" else g
        m = np.stack(vals[rank * N:(rank + 1) * N])
        got = per_device(lambda v, op=op: jc.allreduce(v[0], op, axis_name="d", name=f"ax.{op}")[None], m)
        check(got, np.stack([reduce_np(vals, op)] * N), f"axis allreduce {op}", rtol=1e-6 if op == "average" else 0.0)
    # A pytree of mixed dtypes: small leaves packed per dtype, a large leaf alone, an int average.
    shapes = {"w": (300, 64), "b": (7,), "i": (3, 5), "s": ()}
    dtypes = {"w": np.float32, "b": np.float32, "i": np.int32, "s": np.float32}
    trees = [{k: data(r, i, s, dtypes[k], salt=11) for k, s in shapes.items()} for r in range(size) for i in range(N)]
    local = {k: np.stack([t[k] for t in trees[rank * N:(rank + 1) * N]]) for k in shapes}
    got = per_device(lambda t: jax.tree.map(lambda v: v[None], jc.grouped_allreduce(
        jax.tree.map(lambda v: v[0], t), "average", axis_name="d", name="ax.tree")), local)
    for k in shapes:
        vals = [t[k] for t in trees]
        want = (np.sum(np.stack(vals).astype(np.int64), 0) // len(vals)).astype(np.int32) if k == "i" else \
            (np.sum(np.stack(vals), 0) / len(vals)).astype(np.float32)
        if k == "i":  # truncation toward zero
            s = np.sum(np.stack(vals).astype(np.int64), 0)
            want = (np.sign(s) * (np.abs(s) // len(vals))).astype(np.int32)
        np.testing.assert_allclose(np.asarray(got[k]), np.stack([want] * N), rtol=1e-6, atol=1e-5, err_msg=f"axis tree {k}")
        same_on_all_ranks(got[k], f"axis tree {k}")
    # reducescatter: device (r, i) gets block r * N + i; allgather: every device, rank-major.
    rows = 2 * size * N
    v = everyone((rows, 2), salt=12)
    total = np.sum(np.stack(v), 0)
    got = per_device(lambda a: jc.reducescatter(a[0], "sum", axis_name="d", name="ax.rs")[None],
                     np.stack(v[rank * N:(rank + 1) * N]))
    check(got, np.stack([total[2 * (rank * N + i):2 * (rank * N + i) + 2] for i in range(N)]), "axis reducescatter", same=False)
    got = per_device(lambda a: jc.allgather(a[0], axis_name="d", name="ax.ag")[None], mine)
    check(got, np.stack([np.concatenate(g)] * N), "axis allgather")


def axis_bytes_once():
    """Hierarchically, each device sends 1/N of the value across processes: the rank's
    bytes reduced are the value's size once, not N times (per position it would be N x)."""
    x = np.stack([data(rank, i, (256, 512), salt=18) for i in range(N)])  # 512 KiB per device
    f = jax.jit(jax.shard_map(lambda v: jc.allreduce(v[0], "sum", axis_name="d", name="ax.bytes")[None],
                              mesh=MESH, in_specs=P("d"), out_specs=P("d")))
    f(x).block_until_ready()
    before = jc.stats()["bytes_reduced"]
    check(f(x), np.stack([sum(data(r, i, (256, 512), salt=18) for r in range(size) for i in range(N))] * N),
          "axis bytes")
    counted = jc.stats()["bytes_reduced"] - before
    assert counted == x[0].nbytes, f"bytes_reduced {counted} for a {x[0].nbytes}-byte value on {N} devices"


def axis_invariant_and_replicated_out():
    """A value the same on every device (check_vma types it so) reduces as lax.psum would
    (N equal copies); the result may leave shard_map replicated."""
    x = {r: data(r, 0, (6,), salt=13) for r in range(size)}
    f = jax.jit(jax.shard_map(lambda v: jc.allreduce(v, "sum", axis_name="d", name="ax.inv"),
                              mesh=MESH, in_specs=P(), out_specs=P()))
    check(f(x[rank]), N * sum(x[r] for r in range(size)), "axis invariant sum")
    f = jax.jit(jax.shard_map(lambda v: jc.allreduce(v[0], "average", axis_name="d", name="ax.rep"),
                              mesh=MESH, in_specs=P("d"), out_specs=P()))
    g = everyone((6,), salt=14)
    np.testing.assert_allclose(np.asarray(f(np.stack(g[rank * N:(rank + 1) * N]))), np.mean(np.stack(g), 0), rtol=1e-6, atol=1e-5)


def axis_transforms():
    """grad (lax.psum's convention over the global mesh), vmap, and lax.scan."""
    x = np.stack([data(rank, i, (4,), salt=15) for i in range(N)])

    def loss(v):
        return jnp.sum(jc.allreduce(v * v, "sum", axis_name="d", name="ax.grad") * 3.0)

    check(per_device(lambda v: jax.grad(loss)(v[0])[None], x), 6.0 * x, "axis grad", same=False)
    batch = np.stack([data(rank, 50 + b, (3,), salt=16) for b in range(3)])
    got = jax.jit(jax.vmap(lambda v: jc.allreduce(v, "sum", axis_name="b", name="ax.vmap"), axis_name="b"))(batch)
    want = sum(np.stack([data(r, 50 + b, (3,), salt=16) for b in range(3)]).sum(0) for r in range(size))
    check(got, np.stack([want] * 3), "axis vmap")

    def steps(v):
        # The carry is the same on every device (as after lax.pmean); each step averages it
        # again over every device of every rank.
        def body(c, _):
            return jc.allreduce(c, "average", axis_name="d", name="ax.scan") + 1.0, None
        first = jc.allreduce(v[0], "average", axis_name="d", name="ax.scan0")
        return lax.scan(body, first, None, length=3)[0][None]

    y = np.stack([data(rank, i, (4,), salt=17) for i in range(N)])
    want = np.mean(np.stack([data(r, i, (4,), salt=17) for r in range(size) for i in range(N)]), 0)
    for _ in range(3):
        want = want + 1.0
    np.testing.assert_allclose(np.asarray(per_device(steps, y)), np.stack([want] * N), rtol=1e-6, atol=1e-5)
    same_on_all_ranks(per_device(steps, y), "axis scan")


def axis_levels():
    """Which levels run where: over every axis of the mesh the runtime reduces over the
    devices itself (one custom call over the devices, no XLA collective in the program:
    XLA's local reduce-scatter and all-gather cost more than the whole reduction on CPU);
    over some of a 2-D mesh's axes XLA reduces over those, per position of the others."""
    x = np.stack([data(rank, i, (40, 3), salt=19) for i in range(N)])
    f = jax.jit(jax.shard_map(lambda v: jc.allreduce(v[0], "sum", axis_name="d", name="ax.levels")[None],
                              mesh=MESH, in_specs=P("d"), out_specs=P("d")))
    text = f.lower(x).as_text()
    assert "over_devices = 1" in text, "axis_name over the whole mesh: not reduced by the runtime"
    for xla_collective in ("reduce_scatter", "all_gather", "all_reduce"):
        assert xla_collective not in text, f"axis_name over the whole mesh still runs XLA's {xla_collective}"
    trace = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"jaxcache-levels-{os.getppid()}.json")
    jc.start_timeline(trace)
    check(f(x), np.stack([sum(data(r, i, (40, 3), salt=19) for r in range(size) for i in range(N))] * N),
          "axis over the whole mesh")
    jc.stop_timeline()
    if rank == 0:  # the runtime's local levels, on the collective's track
        with open(trace) as fh:
            phases = [e["name"] for e in json.load(fh) if e.get("ph") == "B"]
        os.unlink(trace)
        assert "LOCAL_REDUCE" in phases and "LOCAL_GATHER" in phases, phases
    # 2-D: rows "a" x columns "b"; axis_name="a" reduces each column over its rows and the ranks.
    rows, cols = (2, N // 2)
    mesh = Mesh(np.array(ORDER).reshape(rows, cols), ("a", "b"))
    y = {r: np.stack([data(r, i, (5,), salt=20) for i in range(N)]).reshape(rows, cols, 5) for r in range(size)}
    for axes, want in ((("a",), sum(y[r].sum(0, keepdims=True) for r in range(size)).repeat(rows, 0)),
                       (("a", "b"), np.broadcast_to(sum(y[r].sum((0, 1)) for r in range(size)), (rows, cols, 5)))):
        g = jax.jit(jax.shard_map(lambda v, axes=axes: jc.allreduce(v, "sum", axis_name=axes, name=f"ax.2d{len(axes)}"),
                                  mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", "b")))
        text = g.lower(y[rank]).as_text()
        assert ("over_devices = 1" in text) == (len(axes) == 2), f"axis_name={axes} on a 2-D mesh: {text[:2000]}"
        check(g(y[rank]), want.astype(np.float32), f"axis_name={axes} on a 2-D mesh")


def axis_errors():
    raises(NameError, "axis_name 'nope' is not an axis", lambda: per_device(
        lambda v: jc.allreduce(v, "sum", axis_name="nope", name="ax.bad"), np.zeros((N, 2), np.float32)))
    raises(ValueError, "must divide into", lambda: per_device(
        lambda v: jc.reducescatter(v[0], "sum", axis_name="d", name="ax.badrs")[None], np.zeros((N, 3), np.float32)))


# --- programs, mixing, concurrency, counters ----------------------------------------------

def many_programs():
    """Distinct jitted shard_map programs of one named allreduce (device i met device j)."""
    for k in range(PROGRAMS):
        f = per_device_program(k)
        x = np.arange(N, dtype=np.float32) * 10 + 1000 * rank + k
        want = np.arange(N, dtype=np.float32) * 10 * size + 1000 * sum(range(size)) + k * size
        check(f(x), want, f"program {k}")


def per_device_program(k):
    return jax.jit(jax.shard_map(lambda a: jc.allreduce(a, op="sum", name=f"prog{k}"), mesh=MESH,
                                 in_specs=P("d"), out_specs=P("d")))


def one_device_and_sharded_in_one_program():
    a = jnp.asarray(data(rank, 0, (5,), salt=20))  # one device (uncommitted)
    b = jax.device_put(logical(rank, 2 * N, salt=21), NamedSharding(MESH, P("d")))
    f = jax.jit(lambda u, v: jc.grouped_allreduce({"u": u, "v": v}, "sum", name="mixed"))
    out = f(a, b)
    check(out["u"], sum(data(r, 0, (5,), salt=20) for r in range(size)), "mixed one-device")
    check(out["v"], sum(logical(r, 2 * N, salt=21) for r in range(size)), "mixed sharded")


def in_flight_and_threads():
    f = per_device_program("flight")
    xs = [np.arange(N, dtype=np.float32) + 100 * rank + 7 * j for j in range(3)]
    outs = [f(x) for x in xs]  # dispatched before any result is read
    for j, out in enumerate(outs):
        check(out, np.arange(N, dtype=np.float32) * size + 100 * sum(range(size)) + 7 * j * size, f"in flight {j}")
    # XLA launches programs over several devices one at a time, in the order they are called
    # (as for its own collectives), so those keep one order on every rank; one-device
    # collectives from another thread meanwhile go in any order.
    errors = []

    def several_devices():
        g = per_device_program("thread.devices")
        for j in range(10):
            x = np.full(N, 1000.0 + j + rank, np.float32)
            want = np.full(N, (1000.0 + j) * size + sum(range(size)), np.float32)
            assert np.array_equal(np.asarray(g(x)), want), f"devices thread step {j}"

    def one_device():
        g = jax.jit(lambda v: jc.allreduce(v, "sum", name="thread.one"))
        for j in range(20):
            assert np.array_equal(np.asarray(g(jnp.full(3, j + rank, jnp.float32))),
                                  np.full(3, j * size + sum(range(size)), np.float32)), f"one-device thread {j}"

    def guarded(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in (several_devices, one_device)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def one_request_per_collective():
    """The N devices' executions of a collective are one request: one negotiation or cache
    hit per collective, whatever N."""
    f = per_device_program("count")
    x = np.ones(N, np.float32)
    f(x).block_until_ready()  # negotiated, cached
    s0 = jc.stats()
    for _ in range(5):
        f(x).block_until_ready()
    s1 = jc.stats()
    assert s1["device_requests"] - s0["device_requests"] == 5, (s0, s1)
    assert s1["device_parts"] - s0["device_parts"] == 5 * N, (s0, s1)
    assert s1["cache_hits"] - s0["cache_hits"] == 5, (s0["cache_hits"], s1["cache_hits"])


def point_to_point_refused():
    # jax refuses the ordered effect on several devices first (jaxcache's lowering would too).
    raises(ValueError, "ordered effects are not supported for more than 1 device", lambda: per_device(
        lambda v: jc.sendrecv(v, v, source=(rank + 1) % size, dest=(rank - 1) % size), np.zeros((N, 2), np.float32)))


def lowered_positions():
    """The custom call lists the program's devices in position order (the mesh's, reversed
    on odd ranks), lowered for the CPU and for CUDA alike (docs/gpu.md)."""
    import re
    f = jax.jit(jax.shard_map(lambda v: jc.allreduce(v, "sum", name="low"), mesh=MESH, in_specs=P("d"),
                              out_specs=P("d")))
    for platform in ("cpu", "cuda"):
        text = f.trace(np.zeros(N, np.float32)).lower(lowering_platforms=(platform,)).as_text()
        found = re.findall(r"devices = dense<\[?([0-9, ]*)\]?>", text)
        assert found, f"no devices attribute lowered for {platform}"
        assert [int(v) for v in found[0].split(",")] == [d.id for d in ORDER], (platform, found)


lowered_positions()
shard_map_collectives()
shard_map_2d_mesh()
sharded_collectives("eager")
sharded_collectives("jit")
replicated_bytes_once()
axis_collectives()
axis_bytes_once()
axis_invariant_and_replicated_out()
axis_transforms()
axis_levels()
axis_errors()
many_programs()
one_device_and_sharded_in_one_program()
in_flight_and_threads()
one_request_per_collective()
point_to_point_refused()
# The runtime still works on one device.
check(jc.allreduce(jnp.ones(3), "sum", name="after"), np.full(3, size, np.float32), "after")
done(f"devices (N={N}, {PROGRAMS} programs)")
