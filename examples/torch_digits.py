"""Data-parallel PyTorch training with jaxcache.torch on scikit-learn's bundled digits.

    mpirun -np 2 python examples/torch_digits.py [--epochs 30]

Every rank starts from its own random initialization; broadcast_parameters gives all of
them rank 0's. Each global batch is split across ranks; DistributedOptimizer averages the
gradients (reduced during backward, in place, zero-copy) so every rank applies the same
update. Rank 0 prints the loss per epoch and the final test accuracy.
"""

from __future__ import annotations

import argparse
import time

import torch
from sklearn.datasets import load_digits

import jaxcache.torch as jct


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=60, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    jct.init()
    rank, size = jct.rank(), jct.size()
    torch.set_num_threads(1)

    digits = load_digits()  # 1797 8x8 images shipped with scikit-learn: no download
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    n_test = len(x) // 5
    x_test, y_test = x[perm[:n_test]], y[perm[:n_test]]
    x_train, y_train = x[perm[n_test:]], y[perm[n_test:]]

    torch.manual_seed(1000 + rank)  # deliberately different on every rank...
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    jct.broadcast_parameters(model.state_dict(), root_rank=0)  # ...until rank 0's are broadcast
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    optimizer = jct.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    jct.broadcast_optimizer_state(optimizer, root_rank=0)

    per_rank = args.batch // size
    steps_per_epoch = len(x_train) // (per_rank * size)
    if rank == 0:
        print(f"{size} rank(s), global batch {per_rank * size}, {steps_per_epoch} steps per epoch", flush=True)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        total = torch.zeros(())
        for step in range(steps_per_epoch):
            batch = order[step * per_rank * size:(step + 1) * per_rank * size]
            mine = batch[rank * per_rank:(rank + 1) * per_rank]  # this rank's shard
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[mine]), y_train[mine])
            loss.backward()
            optimizer.step()
            total += loss.detach()
        mean_loss = jct.allreduce(total / steps_per_epoch, op="average", name="epoch_loss")
        if rank == 0:
            print(f"epoch {epoch + 1:3d}: loss {mean_loss.item():.4f}", flush=True)

    with torch.no_grad():
        correct = (model(x_test).argmax(1) == y_test).sum()
    # Every rank holds the same parameters; check, and agree on the accuracy.
    correct = jct.allreduce(correct, op="max", name="correct")
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = jct.allgather(params, name="params_check").view(size, -1)
    assert bool((gathered == gathered[0]).all()), "ranks hold different parameters"
    if rank == 0:
        print(f"trained {args.epochs} epochs in {time.perf_counter() - start:.1f} s; parameters identical "
              f"on all {size} ranks", flush=True)
        print(f"test accuracy {100.0 * correct.item() / n_test:.2f}% ({correct.item()}/{n_test})", flush=True)
    jct.shutdown()


if __name__ == "__main__":
    main()
