"""An elastic JAX training job for tests/test_elastic.py (Horovod's elastic scenarios).

Linear regression on a fixed dataset; every step takes the next global batch of GLOBAL
samples, split evenly over the ranks (each rank sums its gradients, allreduce, / GLOBAL), so
the update does not depend on how many ranks there are: the final parameters must equal a
serial run's whatever the resets (a batch lost or applied twice would show). Rank 0 logs one
JSON line per epoch (epoch, commits, rendezvous, size, hostname, generation, params).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxcache
import jaxcache.elastic as elastic

GLOBAL = 12  # divisible by 1, 2, 3 and 4 ranks
FEATURES = 4
LR = 0.05


def dataset(batches: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((batches * GLOBAL, FEATURES)).astype(np.float32)
    y = (x @ np.arange(1, FEATURES + 1, dtype=np.float32) + 0.5).astype(np.float32)
    return x, y


def grad_sum(params, x, y):
    def loss(p):
        return 0.5 * jnp.sum((x @ p["w"] + p["b"] - y) ** 2)

    return jax.grad(loss)(params)


def serial(epochs: int, batches: int) -> dict:
    x, y = dataset(batches)
    params = {"w": jnp.zeros(FEATURES, jnp.float32), "b": jnp.zeros((), jnp.float32)}
    velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
    for _ in range(epochs):
        for b in range(batches):
            sl = slice(b * GLOBAL, (b + 1) * GLOBAL)
            g = jax.tree_util.tree_map(lambda v: v / GLOBAL, grad_sum(params, x[sl], y[sl]))
            velocity = jax.tree_util.tree_map(lambda v, gi: 0.9 * v + gi, velocity, g)
            params = jax.tree_util.tree_map(lambda p, v: p - LR * v, params, velocity)
    return {k: np.asarray(v).tolist() for k, v in params.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--logfile", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches-per-epoch", type=int, default=4)
    ap.add_argument("--epoch-wait", type=float, default=0.0,
                    help="seconds rank 0 waits before an epoch's last commit when the hosts change next")
    ap.add_argument("--exit-schedule", default="{}",
                    help='JSON {"epoch,batch": [ranks]}: those ranks fail there (first job only)')
    ap.add_argument("--exit-mode", default="exception", choices=["exception", "kill"])
    ap.add_argument("--exit-every-job", action="store_true", help="fail in every job, not just the first")
    ap.add_argument("--print-serial", action="store_true")
    args = ap.parse_args()
    if args.print_serial:
        print(json.dumps(serial(args.epochs, args.batches_per_epoch)))
        return

    jaxcache.init()
    generation = int(os.environ.get("JAXCACHE_ELASTIC_GENERATION", "0"))
    host = os.environ.get("HOROVOD_HOSTNAME", "?")
    schedule = json.loads(args.exit_schedule)
    x, y = dataset(args.batches_per_epoch)
    params = {"w": jnp.zeros(FEATURES, jnp.float32), "b": jnp.zeros((), jnp.float32)}
    state = elastic.State(params=params, velocity=jax.tree_util.tree_map(jnp.zeros_like, params),
                          epoch=0, batch=0, commits=0, rendezvous=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(jaxcache.size())])

    def maybe_fail(epoch: int, batch: int) -> None:
        ranks = schedule.get(f"{epoch},{batch}", [])
        if jaxcache.rank() in ranks and (generation == 0 or args.exit_every_job):
            if args.exit_mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"scheduled failure at epoch {epoch} batch {batch} on rank {jaxcache.rank()}")

    @elastic.run
    def train(state):
        state.rendezvous += 1
        size, rank = jaxcache.size(), jaxcache.rank()
        per = GLOBAL // size
        while state.epoch < args.epochs:
            while state.batch < args.batches_per_epoch:
                maybe_fail(state.epoch, state.batch)
                start = state.batch * GLOBAL + rank * per
                g = grad_sum(state.params, x[start:start + per], y[start:start + per])
                g = {k: jaxcache.allreduce(v, op="sum", name=f"grad.{k}") / GLOBAL for k, v in g.items()}
                state.velocity = jax.tree_util.tree_map(lambda v, gi: 0.9 * v + gi, state.velocity, g)
                state.params = jax.tree_util.tree_map(lambda p, v: p - LR * v, state.params, state.velocity)
                state.batch += 1
                state.commits += 1
                if state.batch < args.batches_per_epoch:
                    state.commit()
            if rank == 0:
                with open(args.logfile, "a") as f:
                    f.write(json.dumps({
                        "epoch": state.epoch, "commits": state.commits, "rendezvous": state.rendezvous,
                        "size": size, "hostname": host, "generation": generation, "resets_seen": resets,
                        "params": {k: np.asarray(v).tolist() for k, v in state.params.items()},
                    }) + "\n")
                if args.epoch_wait:
                    time.sleep(args.epoch_wait)
            state.epoch += 1
            state.batch = 0
            state.commit()
        return state.params

    final = train(state)
    if jaxcache.rank() == 0:
        with open(args.logfile, "a") as f:
            f.write(json.dumps({"final": {k: np.asarray(v).tolist() for k, v in final.items()},
                                "size": jaxcache.size(), "generation": generation,
                                "commit_seconds": state.last_commit_seconds}) + "\n")
    jaxcache.shutdown()


if __name__ == "__main__":
    main()
