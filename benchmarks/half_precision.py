"""Half-precision reductions at memory speed: the same bytes as float32, float16, bfloat16.

    mpirun -np 2 python benchmarks/half_precision.py [--mib 64] [--repeats 7] [--json out.json]

Each dtype allreduces (sum) a vector of ``--mib`` MiB through jaxcache, eagerly; the
dtypes are interleaved over ``--repeats`` rounds and the table shows the median time of
the slowest rank and the ratio to float32 of the same bytes. MPI has no half types, so
float16 and bfloat16 go through jaxcache's own operators (F16C when the CPU has it,
chosen at run time; bfloat16 by shifts). Results are checked against NumPy first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

COMM = MPI.COMM_WORLD


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json")
    args = p.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import jaxcache

    jaxcache.init()
    size, nbytes = jaxcache.size(), args.mib << 20
    dtypes = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}
    inputs, checked = {}, {}
    for name, dt in dtypes.items():
        n = nbytes // np.dtype(dt).itemsize
        local = (np.arange(n) % 7 + COMM.rank).astype(dt)  # small integers: exact in every dtype
        inputs[name] = jnp.asarray(local)
        want = sum((np.arange(n) % 7 + r) for r in range(size)).astype(dt)
        got = np.asarray(jaxcache.allreduce(inputs[name], "sum", name=f"half.{name}"))
        checked[name] = bool(np.array_equal(got.astype(np.float64), want.astype(np.float64)))
    assert all(COMM.allgather(all(checked.values()))), checked
    times = {name: [] for name in dtypes}
    for _ in range(args.repeats):
        for name in dtypes:
            COMM.Barrier()
            t = time.perf_counter()
            jax.block_until_ready(jaxcache.allreduce(inputs[name], "sum", name=f"half.{name}"))
            times[name].append(COMM.allreduce(time.perf_counter() - t, op=MPI.MAX))
    med = {name: statistics.median(t) for name, t in times.items()}
    if COMM.rank == 0:
        print(f"P={size}, {args.mib} MiB per allreduce, median of {args.repeats} interleaved rounds")
        print("| dtype | ms | GB/s | vs float32 |\n|---|---|---|---|")
        for name, s in med.items():
            print(f"| {name} | {s * 1e3:.1f} | {nbytes / s / 1e9:.2f} | {s / med['float32']:.2f}x |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"P": size, "mib": args.mib, "seconds": times}, f, indent=1)
    jaxcache.shutdown()


if __name__ == "__main__":
    main()
