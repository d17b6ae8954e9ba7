"""Data-parallel training of a small MLP on scikit-learn's digits with jaxcache.

    mpirun -np 2 python examples/train_digits.py [--epochs 25] [--batch-size 120]
    python -m jaxcache.run -np 2 examples/train_digits.py

Every rank takes its shard of each global batch (the same global batch is
split across ranks), computes gradients on it, and the gradients are averaged
across ranks with `jaxcache.grouped_allreduce` inside the jitted step (through
`jaxcache.optax.allreduce_gradients()`). Parameters start from rank 0's values
(`jaxcache.broadcast`). Rank 0 shows a progress bar and prints the test
accuracy. The data set ships with scikit-learn: nothing is downloaded.

--check-single retrains the same model in this process, without jaxcache, on
the full global batches and checks that the parameters match the data-parallel
ones (what data-parallel training promises).

--local-devices N gives every rank N CPU devices (XLA's
--xla_force_host_platform_device_count, the stand-in for a node's GPUs): the step
is a `shard_map` over them, each device takes its part of the rank's shard, and
the gradients are averaged over every device of every rank with
`allreduce_gradients(axis_name=...)` (hierarchically: across the rank's devices
by XLA, across ranks by jaxcache; docs/devices.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # jaxcache's collectives are CPU custom calls


def _local_devices(argv) -> int:
    """--local-devices N, read before jax starts (its CPU device count is fixed then)."""
    for i, a in enumerate(argv):
        if a == "--local-devices" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--local-devices="):
            return int(a.split("=", 1)[1])
    return 1


if _local_devices(sys.argv[1:]) > 1:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count="
                               f"{_local_devices(sys.argv[1:])}").strip()

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import jaxcache  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402
from jaxcache.optax import allreduce_gradients  # noqa: E402

HIDDEN = (128, 64)
CLASSES = 10
DEVICES = "devices"  # the local mesh axis (--local-devices)


def load_data(seed: int):
    """Digits (8x8 images, 10 classes) scaled to [0, 1], split 80/20; identical on every rank."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


def init_params(key, n_in: int):
    sizes = (n_in, *HIDDEN, CLASSES)
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, sub = jax.random.split(key)
        params[f"layer{i}"] = {
            "w": jax.random.normal(sub, (a, b), jnp.float32) * jnp.sqrt(2.0 / a),
            "b": jnp.zeros((b,), jnp.float32),
        }
    return params


def forward(params, x):
    n = len(params)
    for i in range(n):
        layer = params[f"layer{i}"]
        x = x @ layer["w"] + layer["b"]
        if i < n - 1:
            x = jax.nn.relu(x)
    return x


def loss_fn(params, x, y):
    logits = forward(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def make_step(tx, distributed: bool):
    """The jitted training step. With `distributed`, `tx` reduces the gradients
    across ranks and the returned loss is the average over ranks."""

    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if distributed:
            loss = jaxcache.allreduce(loss, op="average", name="train_loss")
        return params, opt_state, loss

    return step


def make_device_step(tx, mesh):
    """The jitted step over this rank's devices: each device takes its part of the rank's
    shard; the loss is the mean over the rank's devices (lax.pmean, so jax's backward pass
    sums the gradients of the replicated parameters over them), and `tx` (allreduce_gradients
    with axis_name=DEVICES) averages over every device of every rank."""

    def device_loss(params, x, y):
        return jax.lax.pmean(loss_fn(params, x, y), DEVICES)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(device_loss)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        loss = jaxcache.allreduce(loss, op="average", name="train_loss", axis_name=DEVICES)
        return params, opt_state, loss

    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P(), P(DEVICES), P(DEVICES)),
                                 out_specs=(P(), P(), P())))


def batches(n_train: int, batch: int, epoch: int, seed: int):
    """Index arrays of each global batch of an epoch (same order on every rank)."""
    order = np.random.default_rng([seed, epoch]).permutation(n_train)
    for start in range(0, n_train - batch + 1, batch):
        yield order[start:start + batch]


def train_single(params, x_train, y_train, args, global_batch: int, steps: int):
    """Reference: the same schedule in this process alone, on the full global batches."""
    tx = optax.adam(args.lr)
    opt_state = tx.init(params)
    step = make_step(tx, distributed=False)
    done = 0
    for epoch in range(args.epochs):
        for idx in batches(len(x_train), global_batch, epoch, args.seed):
            if done == steps:
                return params
            params, opt_state, _ = step(params, opt_state, x_train[idx], y_train[idx])
            done += 1
    return params


def max_abs_difference(a, b) -> float:
    """The largest |a - b| over the leaves of two parameter pytrees."""
    diffs = jax.tree_util.tree_map(lambda u, v: float(jnp.max(jnp.abs(u - v))), a, b)
    return max(jax.tree_util.tree_leaves(diffs))


def accuracy(params, x, y) -> float:
    """Each rank scores its share of the test set; the counts are summed across ranks."""
    share = np.array_split(np.arange(len(x)), jaxcache.size())[jaxcache.rank()]
    logits = jax.jit(forward)(params, x[share])
    correct = jnp.sum(jnp.argmax(logits, axis=-1) == y[share]).astype(jnp.int32)
    total = jaxcache.allreduce(correct, op="sum", name="eval_correct")
    return int(total) / len(x)


def batch_split(batch_size: int, size: int, devices: int, is_root: bool) -> tuple[int, int]:
    """(samples per rank, global batch): the global batch rounded down to a multiple of the
    ranks x devices, so that every device gets as many samples."""
    if len(jax.local_devices()) < devices:
        raise SystemExit(f"--local-devices {devices}: this process has {len(jax.local_devices())} devices")
    per_rank = batch_size // (size * devices) * devices
    if per_rank < 1:
        raise SystemExit(f"--batch-size {batch_size} is smaller than the number of devices "
                         f"({size} ranks x {devices})")
    global_batch = per_rank * size
    if is_root and global_batch != batch_size:
        note = f"{size} ranks" + (f" x {devices} devices" if devices > 1 else "")
        print(f"note: global batch {batch_size} -> {global_batch} (a multiple of {note})", flush=True)
    return per_rank, global_batch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=25)
    p.add_argument("--batch-size", type=int, default=120,
                   help="global batch size, split evenly across ranks (rounded down to a multiple "
                        "of the number of ranks)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-single", action="store_true",
                   help="also train without jaxcache on the full global batches and check the "
                        "parameters match")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--local-devices", type=int, default=1,
                   help="CPU devices per rank; the step is data-parallel over all of them")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    jaxcache.init()
    rank, size = jaxcache.rank(), jaxcache.size()
    is_root = rank == 0

    x_train, x_test, y_train, y_test = load_data(args.seed)
    devices = max(args.local_devices, 1)
    per_rank, global_batch = batch_split(args.batch_size, size, devices, is_root)

    # Ranks would start from different random weights: rank 0's win.
    params = init_params(jax.random.PRNGKey(args.seed + rank), x_train.shape[1])
    params = jaxcache.broadcast(params, root=0, name="initial_params")
    initial = params

    if devices > 1:
        mesh = Mesh(np.array(jax.local_devices()[:devices]), (DEVICES,))
        tx = optax.chain(allreduce_gradients(axis_name=DEVICES), optax.adam(args.lr))
        step = make_device_step(tx, mesh)
    else:
        tx = optax.chain(allreduce_gradients(), optax.adam(args.lr))
        step = make_step(tx, distributed=True)
    opt_state = tx.init(params)

    steps_per_epoch = len(x_train) // global_batch
    total_steps = steps_per_epoch * args.epochs
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)

    from tqdm import tqdm

    bar = tqdm(total=total_steps, disable=not is_root, unit="step", mininterval=0.5,
               file=sys.stderr, dynamic_ncols=True)
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    done = 0
    t_start = time.perf_counter()
    t_mark, done_mark = t_start, 0
    loss = None
    for epoch in range(args.epochs):
        for idx in batches(len(x_train), global_batch, epoch, args.seed):
            if done == total_steps:
                break
            shard = idx[lo:hi]  # this rank's part of the global batch
            params, opt_state, loss = step(params, opt_state, x_train[shard], y_train[shard])
            done += 1
            if is_root and (done % 10 == 0 or done == total_steps):
                loss_value = float(loss)  # waits for the step
                now = time.perf_counter()
                rate = (done - done_mark) * global_batch / max(now - t_mark, 1e-9)
                t_mark, done_mark = now, done
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss_value:.4f}",
                                samples_s=f"{rate:,.0f}", refresh=False)
                bar.update(10 if done % 10 == 0 else done % 10)
    jax.block_until_ready(params)
    elapsed = time.perf_counter() - t_start
    bar.close()

    acc = accuracy(params, x_test, y_test)
    if is_root:
        where = f"{size} rank(s)" + (f" x {devices} devices" if devices > 1 else "")
        print(f"trained {done} steps of {global_batch} samples on {where} in {elapsed:.1f} s "
              f"({done * global_batch / elapsed:,.0f} samples/s); final loss {float(loss):.4f}",
              flush=True)
        print(f"test accuracy: {acc:.4f}", flush=True)

    status = 0
    if args.check_single:
        reference = train_single(initial, x_train, y_train, args, global_batch, done)
        worst = max_abs_difference(params, reference)
        scale = max(float(jnp.max(jnp.abs(a))) for a in jax.tree_util.tree_leaves(reference))
        ok = worst <= 1e-4 * max(scale, 1.0)
        # Every rank must agree before anyone reports.
        all_ok = int(jaxcache.allreduce(jnp.int32(ok), op="min", name="check_single_ok"))
        if is_root:
            print(f"check-single: max |data-parallel - single-process| = {worst:.3g} "
                  f"(largest parameter {scale:.3g}): {'OK' if all_ok else 'MISMATCH'}", flush=True)
        status = 0 if all_ok else 1
    jaxcache.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main())
