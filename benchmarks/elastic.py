"""What elastic training costs: a commit of S MB of state, and a reset.

    python -m jaxcache.run -np 2 --min-np 2 benchmarks/elastic.py [--sizes 1,10,100] [--repeats 10]
        [--fail]

Run under the elastic launcher (any elastic flag), so that commits are written to the hosts'
state directory as in training. Per size S (MB of float32 parameters, in a pytree of 10
arrays, as JAX arrays) it times on every rank: ``save`` (the in-memory copy; JAX arrays are
shared, not copied), ``commit`` (save + the host copy written by local rank 0 + the host-update
check, a broadcast), median over --repeats; the slowest rank's median is printed, with the
bytes written. --fail kills rank 1 after the measurements in the first job, so that the
driver's last line gives the restart time (job end -> every worker of the next job connected,
which includes Python, JAX and jaxcache start-up) and the resumed job reloads the largest state.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time

import jax.numpy as jnp
import numpy as np

import jaxcache
import jaxcache.elastic as elastic


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,10,100")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--fail", action="store_true")
    args = ap.parse_args()
    jaxcache.init()
    rank = jaxcache.rank()
    generation = int(os.environ.get("JAXCACHE_ELASTIC_GENERATION", "0"))
    sizes = [float(s) for s in args.sizes.split(",")]
    big = max(sizes)
    params = {f"p{i}": jnp.full(int(big * 2**20 / 4 / 10), float(i), jnp.float32) for i in range(10)}
    state = elastic.State(params=params, step=0)

    @elastic.run
    def measure(state):
        if generation > 0:
            ok = all(float(state.params[f"p{i}"][0]) == i for i in range(10))
            if rank == 0:
                print(f"resumed job {generation}: state of {big:g} MB back at step {state.step} "
                      f"({'intact' if ok else 'CORRUPT'})", flush=True)
            return
        for size in sizes:
            n = int(size * 2**20 / 4 / 10)
            state.params = {k: v[:n] + 0 for k, v in params.items()}
            saves, commits = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                state.save()
                saves.append(time.perf_counter() - t0)
                state.step += 1
                state.commit()
                commits.append(state.last_commit_seconds)
            slowest = jaxcache.allgather_object((statistics.median(saves), statistics.median(commits),
                                                 state.last_commit_bytes))
            if rank == 0:
                save_s = max(s for s, _, _ in slowest)
                commit_s = max(c for _, c, _ in slowest)
                written = max(b for _, _, b in slowest)
                print(f"state {size:g} MB: save {save_s * 1e3:.3f} ms, commit {commit_s * 1e3:.2f} ms "
                      f"({written / 2**20:.1f} MiB written per host, {written / 2**20 / max(commit_s, 1e-9):.0f} "
                      f"MiB/s)", flush=True)
        state.params = params
        state.commit()
        if args.fail and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    measure(state)
    jaxcache.shutdown()


if __name__ == "__main__":
    np.random.seed(0)
    main()
