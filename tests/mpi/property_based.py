"""Property-based test (hypothesis): random sequences of named collectives with random shapes,
dtypes and ops, issued in rank-dependent orders from several threads, with random cache
capacities, all match NumPy and agree bitwise across ranks.

Every rank runs the same derandomized hypothesis search, so all ranks see the same examples.
"""

import os
import sys
import threading

import numpy as np
import jax
import jax.numpy as jnp
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import jaxcache as jc
from _util import COMM, done

EXAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else 200
size = COMM.size
DTYPES = ["float32", "int32", "float16", "uint8", "int64", "float64"]


def op_strategy():
    return st.fixed_dictionaries({
        "kind": st.sampled_from(["allreduce", "allreduce", "broadcast", "allgather", "grouped"]),
        "dtype": st.sampled_from(DTYPES),
        "shape": st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple),
        "op": st.sampled_from(["sum", "min", "max"]),
        "root": st.integers(0, size - 1),
        "seed": st.integers(0, 2**16),
        "jit": st.booleans(),
    })


def local_value(spec, rank, member=0):
    rng = np.random.default_rng([spec["seed"], rank, member])
    dtype = np.dtype(spec["dtype"])
    if dtype.kind in "iu":
        return rng.integers(0, 20, size=spec["shape"]).astype(dtype)
    return rng.integers(-8, 8, size=spec["shape"]).astype(dtype)  # exact in every float type


def expected(spec, rank):
    vals = [local_value(spec, r) for r in range(size)]
    if spec["kind"] in ("allreduce", "grouped"):
        out = {"sum": np.sum, "min": np.min, "max": np.max}[spec["op"]](np.stack(vals), axis=0).astype(vals[0].dtype)
        if spec["kind"] == "grouped":
            second = [local_value(spec, r, 1) for r in range(size)]
            out2 = {"sum": np.sum, "min": np.min, "max": np.max}[spec["op"]](np.stack(second), axis=0)
            return [out, out2.astype(second[0].dtype)]
        return [out]
    if spec["kind"] == "broadcast":
        return [vals[spec["root"]]]
    return [np.stack(vals) if vals[0].ndim == 0 else np.concatenate(vals, axis=0)]


def run_one(spec, name, rank):
    x = jnp.asarray(local_value(spec, rank))
    kind = spec["kind"]
    if kind == "allreduce":
        fn = lambda v: [jc.allreduce(v, spec["op"], name=name)]
    elif kind == "broadcast":
        fn = lambda v: [jc.broadcast(v, root=spec["root"], name=name)]
    elif kind == "allgather":
        fn = lambda v: [jc.allgather(v, name=name)]
    else:
        y = jnp.asarray(local_value(spec, rank, 1))
        fn = lambda v: jc.grouped_allreduce([v, y], spec["op"], name=name, num_groups=1)
    return jax.jit(fn)(x) if spec["jit"] else fn(x)


counter = [0]


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(specs=st.lists(op_strategy(), min_size=1, max_size=8),
       capacity=st.sampled_from([0, 1, 2, 3, 1024]),
       threads=st.integers(1, 3))
def test_random_sequences(specs, capacity, threads):
    counter[0] += 1
    os.environ["JAXCACHE_CACHE_CAPACITY"] = str(capacity)
    jc.init()
    rank = jc.rank()
    # Deal the ops to threads in a rank-dependent way; within a thread, ascending order.
    order = np.random.default_rng([counter[0], rank]).permutation(len(specs))
    dealt = [sorted(part) for part in np.array_split(order, threads)]
    results, errors = {}, []

    def worker(indices):
        try:
            for i in indices:
                spec = specs[i]
                results[i] = run_one(spec, f"p{counter[0] % 3}.{i}", rank)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(d,)) for d in dealt]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    for i, spec in enumerate(specs):
        got = [np.asarray(v) for v in results[i]]
        for g, e in zip(got, expected(spec, rank)):
            np.testing.assert_array_equal(g, e, err_msg=f"{spec}")
        raw = b"".join(g.tobytes() for g in got)
        assert COMM.allgather(raw) == [raw] * size, f"ranks disagree on {spec}"
    jc.shutdown()


test_random_sequences()
done(f"property_based ({counter[0]} examples)")
