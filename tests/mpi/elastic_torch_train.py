"""An elastic PyTorch training job for tests/test_elastic.py (Horovod's torch elastic API).

Linear regression with SGD + momentum through jaxcache.torch.DistributedOptimizer, the data
served by an ElasticSampler (BATCH samples a rank per step) and everything kept in a
TorchState(model, optimizer, sampler=...), committed after every batch. Each rank appends
to its own file (--logdir) the dataset indices of every batch it trained on, before the
commit, and at the end its final weights; rank 0 logs one JSON line per epoch (--logfile).

Global batch j of a pass over the sampler at n ranks is samples [j*BATCH*n, (j+1)*BATCH*n)
of the epoch's remaining order, averaged: --print-serial replays that on one process for a
plan of global batch sizes, which the test derives from the reset it caused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
import torch

import jaxcache.torch as hvd

BATCH = 3   # samples a rank per step
GLOBAL_AT_4 = 4 * BATCH  # --batches-per-epoch counts global batches of 4 ranks
FEATURES = 4
LR = 0.05
SEED = 11


def dataset(samples: int) -> torch.utils.data.TensorDataset:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
    y = (x @ np.arange(1, FEATURES + 1, dtype=np.float32) - 0.25).astype(np.float32)
    return torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y), torch.arange(samples))


def make_model() -> torch.nn.Module:
    torch.manual_seed(5)
    return torch.nn.Linear(FEATURES, 1)


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((model(x).squeeze(1) - y) ** 2).mean()


def weights(model: torch.nn.Module) -> dict:
    return {k: v.detach().numpy().tolist() for k, v in sorted(model.state_dict().items())}


def digest(model: torch.nn.Module) -> str:
    raw = b"".join(v.detach().numpy().tobytes() for _, v in sorted(model.state_dict().items()))
    return hashlib.sha256(raw).hexdigest()


def serial(samples: int, plan: list[list[int]]) -> dict:
    """The weights after replaying `plan` (per epoch, the global batch sizes in order)."""
    x, y, _ = dataset(samples).tensors
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for epoch, sizes in enumerate(plan):
        order = list(range(samples))
        random.Random(SEED + epoch).shuffle(order)
        at = 0
        for n in sizes:
            rows = torch.tensor(order[at:at + n])
            at += n
            opt.zero_grad()
            loss_of(model, x[rows], y[rows]).backward()
            opt.step()
        assert at == samples, (epoch, at)
    return weights(model)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--logfile", required=True)
    ap.add_argument("--logdir", help="folder for each rank's indices and final weights")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches-per-epoch", type=int, default=4, help="global batches an epoch on 4 ranks")
    ap.add_argument("--exit-schedule", default="{}",
                    help='JSON {"epoch,batch": [ranks]}: those ranks fail there (first job only)')
    ap.add_argument("--print-serial", help="JSON plan: per epoch, the global batch sizes")
    args = ap.parse_args()
    samples = args.batches_per_epoch * GLOBAL_AT_4
    torch.set_num_threads(1)
    if args.print_serial:
        print(json.dumps(serial(samples, json.loads(args.print_serial))))
        return

    hvd.init()
    generation = int(os.environ.get("JAXCACHE_ELASTIC_GENERATION", "0"))
    schedule = json.loads(args.exit_schedule)
    mine = Path(args.logdir) / f"rank{hvd.rank()}-gen{generation}.jsonl"

    def log(path: Path, record: dict) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")

    data = dataset(samples)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=SEED)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, commits=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    def maybe_fail(epoch: int, batch: int) -> None:
        if generation == 0 and hvd.rank() in schedule.get(f"{epoch},{batch}", []):
            raise RuntimeError(f"scheduled failure at epoch {epoch} batch {batch} on rank {hvd.rank()}")

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            for i, (x, y, idx) in enumerate(loader):
                maybe_fail(state.epoch, state.batch)
                optimizer.zero_grad()
                loss_of(state.model, x, y).backward()
                optimizer.step()
                sampler.record_batch(i, BATCH)
                state.batch += 1
                state.commits += 1
                # Before the commit: a reset raised inside it (hosts changed) comes after the
                # commit is kept, so this batch is not trained again.
                log(mine, {"epoch": state.epoch, "indices": idx.tolist()})
                state.commit()
            if hvd.rank() == 0:
                log(Path(args.logfile), {"epoch": state.epoch, "size": hvd.size(), "generation": generation,
                                         "batches": state.batch, "commits": state.commits,
                                         "resets_seen": resets})
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    log(mine, {"final": weights(model), "digest": digest(model), "size": hvd.size()})
    if hvd.rank() == 0:
        log(Path(args.logfile), {"final": weights(model), "size": hvd.size(), "generation": generation})
    hvd.shutdown()


if __name__ == "__main__":
    main()
