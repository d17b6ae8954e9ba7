"""Elastic data-parallel training of the digits MLP (examples/train_digits.py) with
jaxcache.elastic: the job survives a lost worker and grows when a host is added.

    python -m jaxcache.run -np 2 --min-np 1 --max-np 4 \\
        --host-discovery-script ./discover.sh examples/elastic_digits.py [--epochs 25]

The state (parameters, Adam's state, epoch, batch) is committed after every step; when
the driver restarts the job (a worker died, hosts came or went) training resumes from the
last commit on the new ranks. The global batch stays the same whatever the number of
ranks (each rank takes its share), so the training is the one of train_digits.py, and
--check-single retrains it in one process and compares (parameters and test accuracy).

--kill-at EPOCH,STEP,RANK kills that rank (SIGKILL) there in the first job, to try it out;
--log FILE gets a JSON line per epoch from rank 0 (epoch, ranks, host, job generation).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # jaxcache's collectives are CPU custom calls

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import jaxcache  # noqa: E402
import jaxcache.elastic as elastic  # noqa: E402
from jaxcache.optax import allreduce_gradients  # noqa: E402

from train_digits import (batches, forward, init_params, load_data, make_step, max_abs_difference,  # noqa: E402
                          train_single)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=25)
    p.add_argument("--batch-size", type=int, default=120,
                   help="global batch size; must divide by every number of ranks the job runs with")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit-every", type=int, default=1, help="steps between commits")
    p.add_argument("--kill-at", default=None, metavar="EPOCH,STEP,RANK",
                   help="kill that rank there, in the first job only")
    p.add_argument("--log", default=None, help="rank 0 appends a JSON line per epoch")
    p.add_argument("--epoch-wait", type=float, default=0.0, help="seconds rank 0 pauses after each epoch")
    p.add_argument("--check-single", action="store_true",
                   help="retrain in one process without jaxcache and compare")
    return p.parse_args(argv)


def test_accuracy(params, x, y) -> float:
    logits = jax.jit(forward)(params, x)
    return float(jnp.mean(jnp.argmax(logits, axis=-1) == y))


def main(argv=None) -> int:
    args = parse_args(argv)
    jaxcache.init()
    generation = int(os.environ.get("JAXCACHE_ELASTIC_GENERATION", "0"))
    host = os.environ.get("HOROVOD_HOSTNAME", "?")
    x_train, x_test, y_train, y_test = load_data(args.seed)
    steps_per_epoch = len(x_train) // args.batch_size
    kill = tuple(int(v) for v in args.kill_at.split(",")) if args.kill_at else None

    initial = init_params(jax.random.PRNGKey(args.seed), x_train.shape[1])  # the same on every rank
    tx = optax.chain(allreduce_gradients(), optax.adam(args.lr))
    step = make_step(tx, distributed=True)
    state = elastic.State(params=initial, opt_state=tx.init(initial), epoch=0, batch=0)

    @elastic.run
    def train(state):
        rank, size = jaxcache.rank(), jaxcache.size()
        if args.batch_size % size:
            raise SystemExit(f"--batch-size {args.batch_size} does not divide by {size} ranks")
        per_rank = args.batch_size // size
        while state.epoch < args.epochs:
            order = list(batches(len(x_train), args.batch_size, state.epoch, args.seed))
            while state.batch < steps_per_epoch:
                if kill == (state.epoch, state.batch, rank) and generation == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                shard = order[state.batch][rank * per_rank:(rank + 1) * per_rank]
                state.params, state.opt_state, _ = step(state.params, state.opt_state,
                                                        x_train[shard], y_train[shard])
                state.batch += 1
                if state.batch % args.commit_every == 0 and state.batch < steps_per_epoch:
                    state.commit()
            if rank == 0:
                acc = test_accuracy(state.params, x_test, y_test)
                print(f"epoch {state.epoch + 1}/{args.epochs}: {size} rank(s), test accuracy {acc:.4f}", flush=True)
                if args.log:
                    with open(args.log, "a") as f:
                        f.write(json.dumps({"epoch": state.epoch, "size": size, "hostname": host,
                                            "generation": generation, "accuracy": acc}) + "\n")
                if args.epoch_wait:
                    time.sleep(args.epoch_wait)
            state.epoch, state.batch = state.epoch + 1, 0
            state.commit()
        return state.params

    t0 = time.perf_counter()
    params = train(state)
    acc = test_accuracy(params, x_test, y_test)
    status = 0
    if jaxcache.rank() == 0:
        print(f"job {generation}: finished on {jaxcache.size()} rank(s) in {time.perf_counter() - t0:.1f} s; "
              f"test accuracy {acc:.4f}; last commit {state.last_commit_seconds * 1e3:.2f} ms", flush=True)
        if args.check_single:
            reference = train_single(initial, x_train, y_train, args, args.batch_size,
                                     steps_per_epoch * args.epochs)
            worst = max_abs_difference(params, reference)
            ref_acc = test_accuracy(reference, x_test, y_test)
            ok = worst <= 1e-3 and abs(acc - ref_acc) <= 0.01
            print(f"check-single: accuracy {acc:.4f} vs {ref_acc:.4f} in one process; max |parameter "
                  f"difference| {worst:.3g}: {'OK' if ok else 'MISMATCH'}", flush=True)
            status = 0 if ok else 1
    jaxcache.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main())
