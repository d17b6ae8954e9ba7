"""reducescatter, alltoall, uneven allgather and the object collectives against NumPy on every
rank (every dtype and op allreduce supports; eager and jit), out of order from threads and
inside one jitted program, and their mismatches (MismatchError on every rank).

    vocabulary.py reducescatter|allgather|alltoall|objects|threads|errors|data-paths

data-paths runs each kind of data movement once more (even and uneven); the tests run it
with JAXCACHE_MAX_MPI_COUNT lowered (chunked fallbacks) and with
JAXCACHE_STALL_SHUTDOWN_TIME set (nonblocking, watched MPI calls).
"""

import jax

jax.config.update("jax_enable_x64", True)

import sys  # noqa: E402
import threading  # noqa: E402
import zlib  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import jaxcache as jc  # noqa: E402
from _reference import COMPLEX, FLOATS, INTS, local_input, ops_for, reference, tolerance  # noqa: E402
from _util import COMM, assert_close, done, same_on_all_ranks  # noqa: E402

jc.init()
rank, size = jc.rank(), jc.size()
scenario = sys.argv[1]
ALL_DTYPES = [np.bool_] + INTS + FLOATS + COMPLEX


def salt(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def rows_of(n: int, r: int) -> int:
    return n // size + (1 if r < n % size else 0)


def my_rows(full: np.ndarray, r: int = rank) -> np.ndarray:
    """Rank r's slice of the first dimension (the first n % size ranks get one more row)."""
    start = sum(rows_of(full.shape[0], q) for q in range(r))
    return full[start:start + rows_of(full.shape[0], r)]


def expect_error(fn, exc, *fragments, same_class=True) -> str:
    try:
        jax.block_until_ready(fn())
    except exc as e:
        msg = str(e)
        for f in fragments:
            assert f in msg, f"{f!r} not in error message: {msg}"
        if same_class:  # every rank raised the same class
            assert len(set(COMM.allgather(type(e).__name__))) == 1
        return msg
    raise AssertionError(f"expected {exc.__name__} containing {fragments}")


def healthy(tag: str) -> None:
    y = jc.allreduce(jnp.ones(3) * rank, "sum", name=f"healthy.{tag}")
    assert float(y[0]) == sum(range(size)), y


jitted = {}


def jit_once(key, fn):
    if key not in jitted:
        jitted[key] = jax.jit(fn)
    return jitted[key]


if scenario == "reducescatter":
    checked = 0
    for dtype in ALL_DTYPES:
        for op in ops_for(dtype):
            # Even split (eager and jit) and uneven splits (eager only).
            for rows, trailing, modes in ((2 * size, (3,), ("eager", "jit")),
                                          (2 * size + 1, (), ("eager",)),
                                          (size - 1, (2,), ("eager",))):
                shape = (rows, *trailing)
                s = salt(str(np.dtype(dtype)), op, shape)
                inputs = [local_input(dtype, shape, op, r, s) for r in range(size)]
                expected = my_rows(reference(inputs, op, dtype))
                rtol, atol = tolerance(dtype)
                for mode in modes:
                    name = f"rs.{np.dtype(dtype)}.{op}.{rows}.{mode}"
                    x = jnp.asarray(inputs[rank])
                    if mode == "eager":
                        y = jc.reducescatter(x, op, name=name)
                    else:
                        y = jit_once(name, lambda v, op=op, name=name: jc.reducescatter(v, op, name=name))(x)
                    what = f"reducescatter {np.dtype(dtype)} {op} {shape} {mode}"
                    assert_close(np.asarray(y), expected, what, rtol=rtol, atol=atol)
                    checked += 1
    # Results are identical across ranks where they overlap: gather them all.
    full = np.arange(4 * size * 3, dtype=np.float32).reshape(4 * size, 3) * (rank + 1)
    part = jc.reducescatter(jnp.asarray(full), "sum", name="rs.whole")
    whole = jc.allgather(part, name="rs.whole.gather")
    same_on_all_ranks(whole, "reducescatter gathered")
    assert_close(np.asarray(whole), full / (rank + 1) * size * (size + 1) / 2, "reducescatter whole")

    # Pre/postscale, eager and jit.
    inputs = [local_input(np.float64, (size * 2, 2), "sum", r, 5) for r in range(size)]
    expected = my_rows(reference([x * 3 for x in inputs], "sum", np.float64) * 0.5)
    for mode in ("eager", "jit"):
        f = lambda v: jc.reducescatter(v, "sum", name=f"rs.scaled.{mode}", prescale=3.0, postscale=0.5)
        y = f(jnp.asarray(inputs[rank])) if mode == "eager" else jax.jit(f)(jnp.asarray(inputs[rank]))
        assert_close(np.asarray(y), expected, f"scaled {mode}", rtol=1e-12)

    # grouped_reducescatter: pytrees, mixed dtypes, grouping options, uneven leaves eagerly.
    tree_shapes = {"a": (2 * size, 3), "b": [(size,), (size * 3 + 1, 2)], "c": None}
    def make_tree(r, s):
        return {"a": local_input(np.float32, (2 * size, 3), "sum", r, s),
                "b": [local_input(np.float64, (size,), "sum", r, s + 1),
                      local_input(np.float32, (size * 3 + 1, 2), "sum", r, s + 2)],
                "c": None}
    for g, grouping in enumerate(({}, {"num_groups": 2}, {"group_bytes": 64},
                                  {"groups": [["['a']", "['b'][1]"]]})):
        trees = [make_tree(r, 40 + g) for r in range(size)]
        out = jc.grouped_reducescatter(jax.tree.map(jnp.asarray, trees[rank]), "average",
                                       name=f"grs.{g}", **grouping)
        assert out["c"] is None
        for path in (("a",), ("b", 0), ("b", 1)):
            leaves = [t[path[0]] if len(path) == 1 else t[path[0]][path[1]] for t in trees]
            got = out[path[0]] if len(path) == 1 else out[path[0]][path[1]]
            assert_close(np.asarray(got), my_rows(reference(leaves, "average", leaves[0].dtype)),
                         f"grouped_reducescatter {grouping} {path}", rtol=1e-5, atol=1e-6)
    # Each group is one request: the names in the cache are the groups'.
    layout = jc.cache_layout()
    assert {"grs.1/0of2", "grs.1/1of2"} <= set(layout), sorted(layout)
    # Under jit, grouped and even.
    tree = {"w": jnp.ones((2 * size, 4)) * (rank + 1), "b": jnp.arange(size, dtype=jnp.float32)}
    out = jax.jit(lambda t: jc.grouped_reducescatter(t, "sum", name="grs.jit"))(tree)
    assert out["w"].shape == (2, 4) and out["b"].shape == (1,)
    assert_close(np.asarray(out["w"]), np.full((2, 4), size * (size + 1) / 2), "grouped jit w")
    assert_close(np.asarray(out["b"]), np.array([rank * size], np.float32), "grouped jit b")
    if rank == 0:
        print(f"checked {checked} reducescatter cases")

elif scenario == "allgather":
    for dtype in ALL_DTYPES:
        for trailing in ((), (2, 3)):
            s = salt(str(np.dtype(dtype)), trailing)
            # Rank r contributes r + 1 rows; the last rank none (3 ranks) or 2 (2 ranks).
            counts = [r + 1 for r in range(size)]
            counts[-1] = 0 if size > 2 else counts[-1]
            parts = [local_input(dtype, (counts[r], *trailing), "sum", r, s) for r in range(size)]
            out = jc.allgather({"x": jnp.asarray(parts[rank])}, name=f"ag.{np.dtype(dtype)}.{trailing}")
            assert_close(np.asarray(out["x"]), np.concatenate(parts), f"uneven allgather {dtype} {trailing}")
            same_on_all_ranks(out["x"], f"uneven allgather {dtype}")
    # Scalars gather into a vector; equal shapes under jit.
    out = jc.allgather(jnp.float32(rank), name="ag.scalar")
    assert_close(np.asarray(out), np.arange(size, dtype=np.float32), "scalar allgather")
    f = jax.jit(lambda t: jc.allgather(t, name="ag.jit"))
    out = f({"a": jnp.ones((2, 2)) * rank, "b": jnp.int32(rank)})
    assert_close(np.asarray(out["a"]), np.repeat(np.arange(size, dtype=np.float32), 2)[:, None] * np.ones((1, 2)), "jit allgather")
    assert_close(np.asarray(out["b"]), np.arange(size, dtype=np.int32), "jit allgather scalar")
    # A cached uneven allgather whose sizes change from call to call renegotiates.
    for step in range(4):
        n = (rank + step) % 3
        out = jc.allgather(jnp.full((n, 2), rank, jnp.int64), name="ag.changing")
        expect = np.concatenate([np.full(((r + step) % 3, 2), r, np.int64) for r in range(size)])
        assert_close(np.asarray(out), expect, f"changing sizes, step {step}")
    # grouped_allgather: one request per group; uneven leaves eagerly.
    tree = {"a": jnp.ones((rank + 1, 2)) * rank, "b": [jnp.arange(rank + 2, dtype=jnp.int32), jnp.float64(rank)]}
    for g, grouping in enumerate(({}, {"num_groups": 2}, {"groups": lambda path: len(path)})):
        out = jc.grouped_allgather(tree, name=f"gag.{g}", **grouping)
        assert_close(np.asarray(out["a"]), np.concatenate([np.ones((r + 1, 2)) * r for r in range(size)]), f"gag a {g}")
        assert_close(np.asarray(out["b"][0]), np.concatenate([np.arange(r + 2, dtype=np.int32) for r in range(size)]), f"gag b0 {g}")
        assert_close(np.asarray(out["b"][1]), np.arange(size, dtype=np.float64), f"gag b1 {g}")
    out = jax.jit(lambda t: jc.grouped_allgather(t, name="gag.jit", num_groups=2))(
        {"x": jnp.ones(3) * rank, "y": jnp.ones((1, 2)) * rank})
    assert out["x"].shape == (3 * size,) and out["y"].shape == (size, 2)
    assert_close(np.asarray(out["y"]), np.repeat(np.arange(size, dtype=np.float64), 2).reshape(size, 2), "gag jit")

elif scenario == "alltoall":
    for dtype in ALL_DTYPES:
        s = salt("a2a", str(np.dtype(dtype)))
        # Equal blocks, eager and jit: rank r receives block r of every rank.
        inputs = [local_input(dtype, (2 * size, 3), "sum", q, s) for q in range(size)]
        expected = np.concatenate([x[2 * rank:2 * rank + 2] for x in inputs])
        eager_out = jc.alltoall(jnp.asarray(inputs[rank]), name=f"a2a.{np.dtype(dtype)}")
        assert_close(np.asarray(eager_out), expected, f"alltoall {dtype} eager")
        jit_out = jit_once(f"a2a.jit.{np.dtype(dtype)}",
                           lambda v, d=dtype: jc.alltoall(v, name=f"a2a.jit.{np.dtype(d)}"))(jnp.asarray(inputs[rank]))
        assert_close(np.asarray(jit_out), expected, f"alltoall {dtype} jit")
        # Uneven splits that differ per rank (zeros included): rank q sends splits[q][d] rows to d.
        splits = [[(q + 2 * d) % 3 for d in range(size)] for q in range(size)]
        inputs = [local_input(dtype, (sum(splits[q]), 2), "sum", q, s + 1) for q in range(size)]
        blocks = lambda q: np.split(inputs[q], np.cumsum(splits[q])[:-1])
        expected = np.concatenate([blocks(q)[rank] for q in range(size)])
        out, received = jc.alltoall(jnp.asarray(inputs[rank]), splits=splits[rank], name=f"a2a.splits.{np.dtype(dtype)}")
        assert_close(np.asarray(out), expected, f"alltoall splits {dtype}")
        assert list(np.asarray(received)) == [splits[q][rank] for q in range(size)], received
    # splits as an array; a rank that sends everything to one rank.
    x = jnp.arange(4 * (rank + 1), dtype=jnp.float32) + 100 * rank
    splits = np.zeros(size, np.int64)
    splits[(rank + 1) % size] = 4 * (rank + 1)
    out, received = jc.alltoall(x, splits=splits, name="a2a.one")
    src = (rank - 1) % size
    assert_close(np.asarray(out), np.arange(4 * (src + 1), dtype=np.float32) + 100 * src, "alltoall to one rank")
    assert int(np.asarray(received).sum()) == 4 * (src + 1)
    # A cached alltoall whose splits change renegotiates.
    for step in range(3):
        sp = [(rank + d + step) % 2 for d in range(size)]
        out, received = jc.alltoall(jnp.ones((sum(sp), 2)) * rank, splits=sp, name="a2a.changing")
        expect_rows = [(q + rank + step) % 2 for q in range(size)]
        assert list(np.asarray(received)) == expect_rows, (received, expect_rows)
        assert_close(np.asarray(out), np.concatenate([np.full((n, 2), q, np.float64) for q, n in enumerate(expect_rows)]),
                     f"changing splits {step}")
    # Only rank 0 sends (one row to itself): every other rank sends and receives nothing, so
    # its own counts look like an equal split; all ranks must still make the same MPI call
    # (they hung in the next collective when such a rank chose MPI_Ialltoall).
    for step in range(3):
        sp = [1 if (rank == 0 and d == 0) else 0 for d in range(size)]
        out, received = jc.alltoall(jnp.full((sum(sp), 4), float(rank)), splits=sp, name="a2a.one.sender")
        assert list(np.asarray(received)) == ([1] + [0] * (size - 1) if rank == 0 else [0] * size), received
        assert_close(np.asarray(out), np.zeros((1 if rank == 0 else 0, 4)), f"one sender {step}")
        total = jc.allreduce(jnp.ones(2), op="sum", name="a2a.one.sender.after")
        assert_close(np.asarray(total), np.full(2, float(size)), f"allreduce after one sender {step}")

elif scenario == "objects":
    obj = {"rank": rank, "payload": list(range(rank * 100)), "name": "r" * rank}
    gathered = jc.allgather_object(obj)
    assert gathered == [{"rank": r, "payload": list(range(r * 100)), "name": "r" * r} for r in range(size)]
    for root in range(size):
        got = jc.broadcast_object({"root": root, "data": np.arange(root + 3)} if rank == root else None, root=root)
        assert got["root"] == root and np.array_equal(got["data"], np.arange(root + 3))
    assert jc.allgather_object(None, name="objs.none") == [None] * size
    big = jc.allgather_object(b"x" * (rank * 100_000), name="objs.big")
    assert [len(b) for b in big] == [r * 100_000 for r in range(size)]

elif scenario == "threads":
    # Several threads submit named eager reducescatters, alltoalls and allgathers in a
    # rank-dependent order; matching by name makes it safe.
    N = 12
    results, errors = {}, []

    def work(i):
        try:
            x = jnp.arange(2 * size * 2, dtype=jnp.float32).reshape(2 * size, 2) + i + rank
            kind = i % 3
            if kind == 0:
                results[i] = jc.reducescatter(x, "sum", name=f"th.rs.{i}")
            elif kind == 1:
                results[i] = jc.alltoall(x, name=f"th.a2a.{i}")
            else:
                results[i] = jc.allgather(x[: rank + 1], name=f"th.ag.{i}")
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    order = list(range(N)) if rank % 2 == 0 else list(reversed(range(N)))
    for rep in range(3):
        threads = [threading.Thread(target=work, args=(i,)) for i in order]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        base = np.arange(2 * size * 2, dtype=np.float32).reshape(2 * size, 2)
        for i in range(N):
            xs = [base + i + q for q in range(size)]
            if i % 3 == 0:
                expect = (sum(xs))[2 * rank:2 * rank + 2]
            elif i % 3 == 1:
                expect = np.concatenate([x[2 * rank:2 * rank + 2] for x in xs])
            else:
                expect = np.concatenate([xs[q][: q + 1] for q in range(size)])
            assert_close(np.asarray(results[i]), expect, f"thread {i} rep {rep}")

    # Inside one jitted program: independent reducescatters, alltoalls and allgathers of
    # 1 MB each, which XLA:CPU starts concurrently in its own order on each rank.
    @jax.jit
    def program(xs):
        outs = []
        for i, x in enumerate(xs):
            outs.append(jc.reducescatter(x * 2, "sum", name=f"prog.rs.{i}"))
            outs.append(jc.alltoall(x + 1, name=f"prog.a2a.{i}"))
            outs.append(jc.allgather(x[:size], name=f"prog.ag.{i}"))
        return outs

    n = (1 << 18) // size * size
    xs = [jnp.full((n,), float(rank + 1 + i), jnp.float32) for i in range(6)]
    for _ in range(5):
        outs = program(xs)
        for i in range(6):
            rs, a2a, ag = outs[3 * i:3 * i + 3]
            assert float(rs[0]) == 2 * sum(q + 1 + i for q in range(size)) and rs.shape == (n // size,)
            assert_close(np.asarray(a2a), np.repeat(np.arange(size, dtype=np.float32) + 2 + i, n // size), f"prog a2a {i}")
            assert_close(np.asarray(ag), np.repeat(np.arange(size, dtype=np.float32) + 1 + i, size), f"prog ag {i}")

elif scenario == "errors":
    last = size - 1
    # reducescatter shapes differ.
    msg = expect_error(lambda: jc.reducescatter(jnp.ones(4 if rank != last else 6), "sum", name="mm.rs"),
                       jc.MismatchError, "mm.rs", "shape", "(4,)", "(6,)", f"rank {last}")
    healthy("rs")
    # reducescatter op differs.
    expect_error(lambda: jc.reducescatter(jnp.ones(4), "sum" if rank else "max", name="mm.rs.op"),
                 jc.MismatchError, "reduce op", "mm.rs.op")
    healthy("rs.op")
    # Uneven allgather: trailing dimensions must agree.
    msg = expect_error(lambda: jc.allgather(jnp.ones((2, 3 if rank != last else 4)), name="mm.ag"),
                       jc.MismatchError, "mm.ag", "shape beyond the first dimension", "(2, 3)", "(2, 4)")
    healthy("ag")
    # Under jit, allgather needs equal shapes: the error names the ranks and shapes.
    f = jax.jit(lambda v: jc.allgather(v, name="mm.ag.jit"))
    msg = expect_error(lambda: f(jnp.ones((2 if rank != last else 3, 2))), Exception, "MismatchError",
                       "mm.ag.jit", "(2, 2)", "(3, 2)", f"rank {last}")
    healthy("ag.jit")
    # alltoall: different numbers of splits.
    sp = [1] * size if rank != last else [1] * (size + 1)
    msg = expect_error(lambda: jc.alltoall(jnp.ones(len(sp)), splits=sp, name="mm.a2a.count"),
                       jc.MismatchError, "mm.a2a.count", "number of splits", f"rank {last}")
    healthy("a2a.count")
    # alltoall: every rank passes size+1 splits.
    expect_error(lambda: jc.alltoall(jnp.ones(size + 1), splits=[1] * (size + 1), name="mm.a2a.size"),
                 jc.MismatchError, "mm.a2a.size", f"splits but there are {size} ranks")
    # alltoall: splits that do not sum to the first dimension (one rank): every rank fails.
    sp = [1] * size if rank != last else [2] * size
    expect_error(lambda: jc.alltoall(jnp.ones(size), splits=sp, name="mm.a2a.sum"),
                 jc.CollectiveError, "mm.a2a.sum", f"rank {last}'s splits", "sum to")
    # alltoall: equal blocks of an indivisible first dimension (eager).
    expect_error(lambda: jc.alltoall(jnp.ones(size + 1), name="mm.a2a.equal"),
                 jc.CollectiveError, "mm.a2a.equal", "equal blocks")
    # alltoall: trailing dimensions differ.
    expect_error(lambda: jc.alltoall(jnp.ones((size, 2 if rank != last else 3)), name="mm.a2a.shape"),
                 jc.MismatchError, "mm.a2a.shape", "(3, 2)" if size == 3 else "(2, 2)")
    # A jit rank receiving a different number of rows than its static result.
    g = jax.jit(lambda v: jc.alltoall(v, name="mm.a2a.jit"))
    if rank == last:
        run = lambda: jc.alltoall(jnp.ones(size * 2), splits=[2] * size, name="mm.a2a.jit")
        expect_error(run, jc.MismatchError, "would receive", same_class=False)
    else:
        expect_error(lambda: g(jnp.ones(size)), Exception, "MismatchError", "would receive",
                     same_class=False)
    healthy("a2a")
    # Trace-time errors (the same on every rank).
    expect_error(lambda: jax.jit(lambda v: jc.reducescatter(v, name="mm.rs.div"))(jnp.ones(size + 1)),
                 ValueError, "divisible", f"({size + 1},)")
    expect_error(lambda: jax.jit(lambda v: jc.alltoall(v, name="mm.a2a.div"))(jnp.ones(size + 1)),
                 ValueError, "equal", f"({size + 1},)")
    expect_error(lambda: jax.jit(lambda v: jc.alltoall(v, splits=[1] * size))(jnp.ones(size)),
                 ValueError, "splits must be None")
    expect_error(lambda: jc.reducescatter(jnp.float32(1)), ValueError, "scalar")
    expect_error(lambda: jc.alltoall(jnp.ones(size), splits=[-1] + [1] * size), ValueError, "negative")
    expect_error(lambda: jc.alltoall(jnp.ones(size), splits="ab"), TypeError, "splits")
    # Integers average as in Horovod: the sum times 1/size in double precision, truncated.
    odd = jnp.array([7, -7, 5, 101] * size, jnp.int32) + rank
    want = np.trunc(sum(np.array([7, -7, 5, 101] * size, np.float64) + r for r in range(size)) * (1.0 / size))
    got = jc.reducescatter(odd, "average")
    assert got.dtype == jnp.int32 and np.array_equal(np.asarray(got), want[rank * 4:(rank + 1) * 4]), got
    healthy("end")

elif scenario == "data-paths":
    n = 1000 * size + 3  # several chunks of JAXCACHE_MAX_MPI_COUNT=1000, uneven split
    for dtype in (np.float32, np.float16, np.int64):
        inputs = [local_input(dtype, (n, 3), "sum", r, 9) for r in range(size)]
        y = jc.reducescatter(jnp.asarray(inputs[rank]), "sum", name=f"dp.rs.{np.dtype(dtype)}")
        rtol, atol = tolerance(dtype)
        assert_close(np.asarray(y), my_rows(reference(inputs, "sum", dtype)), f"chunked rs {dtype}", rtol, atol)
        even = [x[: 1000 * size] for x in inputs]
        op = "average" if np.dtype(dtype).kind == "f" else "max"
        y = jit_once(f"dp.rs.jit.{np.dtype(dtype)}", lambda v, d=dtype, op=op: jc.reducescatter(
            v, op, name=f"dp.rs.jit.{np.dtype(d)}"))(jnp.asarray(even[rank]))
        assert_close(np.asarray(y), my_rows(reference(even, op, dtype)), f"chunked rs jit {dtype}", rtol, atol)
    # Several pieces of the pairwise exchange under JAXCACHE_CHUNK_BYTES=4000: uneven rows,
    # a prescale applied to every arriving piece, average and postscale after.
    m = 3000 * size + 5
    for dtype in (np.float32, np.float16):
        inputs = [local_input(dtype, (m, 7), "sum", r, 12) for r in range(size)]
        y = jc.reducescatter(jnp.asarray(inputs[rank]), "average", prescale=2.0, postscale=0.25,
                             name=f"dp.rs.big.{np.dtype(dtype)}")
        rtol, atol = tolerance(dtype)
        want = (my_rows(reference(inputs, "average", dtype)).astype(np.float64) * 0.5).astype(dtype)
        assert_close(np.asarray(y), want, f"large rs {dtype}", rtol, atol)
        same_rows = jc.allgather(y, name=f"dp.rs.big.ag.{np.dtype(dtype)}")
        same_on_all_ranks(np.asarray(same_rows), f"large rs {dtype} gathered")
    # Above 512 KiB: pairwise exchanges at any number of ranks (MPI's own call below that
    # from 5 ranks on), uneven rows, a non-sum op.
    big = [local_input(np.float32, (40000 * size + size - 1, 4), "max", r, 13) for r in range(size)]
    y = jc.reducescatter(jnp.asarray(big[rank]), "max", name="dp.rs.pairwise")
    assert_close(np.asarray(y), my_rows(reference(big, "max", np.float32)), "pairwise rs max", 0, 0)
    parts = [local_input(np.float32, (700 * (r + 1), 2), "sum", r, 10) for r in range(size)]
    out = jc.allgather(jnp.asarray(parts[rank]), name="dp.ag")
    assert_close(np.asarray(out), np.concatenate(parts), "chunked uneven allgather")
    out = jc.allgather(jnp.asarray(parts[0]), name="dp.ag.even")
    assert_close(np.asarray(out), np.concatenate([parts[0]] * size), "chunked allgather")
    splits = [[300 * ((q + d) % 3) + 1 for d in range(size)] for q in range(size)]
    inputs = [local_input(np.float64, (sum(splits[q]), 2), "sum", q, 11) for q in range(size)]
    blocks = lambda q: np.split(inputs[q], np.cumsum(splits[q])[:-1])
    out, received = jc.alltoall(jnp.asarray(inputs[rank]), splits=splits[rank], name="dp.a2a")
    assert_close(np.asarray(out), np.concatenate([blocks(q)[rank] for q in range(size)]), "chunked alltoall splits")
    x = local_input(np.float32, (600 * size, 2), "sum", rank, 12)
    y = jax.jit(lambda v: jc.alltoall(v, name="dp.a2a.jit"))(jnp.asarray(x))
    allx = [local_input(np.float32, (600 * size, 2), "sum", q, 12) for q in range(size)]
    assert_close(np.asarray(y), np.concatenate([a[600 * rank:600 * (rank + 1)] for a in allx]), "chunked alltoall")

else:
    raise SystemExit(f"unknown scenario {scenario}")

done(f"vocabulary {scenario}")
