"""Horovod's PyTorch MNIST example, running on jaxcache.

A rewrite of horovod/examples/pytorch/pytorch_mnist.py (Horovod 0.28.1). Two things are
jaxcache-specific and marked `# jaxcache:`: the import, and the data -- scikit-learn's bundled
8x8 digits, enlarged to MNIST's 28x28 and normalized like MNIST, so that nothing is
downloaded. Everything else is written against Horovod's API.

    mpirun -np 2 python examples/horovod_torch_mnist.py [--epochs 10] [--fp16-allreduce]
    python examples/horovod_torch_mnist.py          # one process
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import jaxcache.torch as hvd  # jaxcache: instead of `import horovod.torch as hvd`


def digits_as_mnist(train: bool) -> torch.utils.data.Dataset:
    """jaxcache: scikit-learn's digits (no download), shaped and scaled like torchvision's MNIST."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images / 16.0, np.ones((3, 3)))  # 8x8 -> 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))  # -> 28x28, like MNIST's margin
    images = (images - 0.1307) / 0.3081
    order = np.random.default_rng(0).permutation(len(images))
    cut = len(images) * 4 // 5
    rows = order[:cut] if train else order[cut:]
    return torch.utils.data.TensorDataset(torch.tensor(images[rows, None], dtype=torch.float32),
                                          torch.tensor(digits.target[rows], dtype=torch.int64))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def metric_average(value: float, name: str) -> float:
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTorch MNIST example (Horovod API on jaxcache)")
    parser.add_argument("--batch-size", type=int, default=64, help="input batch size per rank")
    parser.add_argument("--test-batch-size", type=int, default=1000, help="test batch size")
    parser.add_argument("--epochs", type=int, default=10, help="number of epochs to train")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate (scaled by the ranks)")
    parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum")
    parser.add_argument("--no-cuda", action="store_true", default=False, help="disable CUDA")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument("--log-interval", type=int, default=10, help="batches between logs")
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="compress gradients to float16 for the allreduce")
    parser.add_argument("--use-adasum", action="store_true", default=False, help="use the Adasum op")
    parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                        help="divide gradients by this before the sum and the rest after it")
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    hvd.init()
    torch.manual_seed(args.seed)
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())  # one GPU per process
        torch.cuda.manual_seed(args.seed)
    else:
        torch.set_num_threads(1)  # keep ranks sharing a machine from oversubscribing its cores

    train_dataset = digits_as_mnist(train=True)
    test_dataset = digits_as_mnist(train=False)
    # Each rank reads its own part of the data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler)

    model = Net()
    # The global batch grows with the ranks: grow the learning rate with it (not with Adasum).
    lr_scaler = 1 if args.use_adasum else hvd.size()
    if args.cuda:
        model.cuda()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    # Every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    def train(epoch: int) -> None:
        model.train()
        train_sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        for batch_idx, (data, target) in enumerate(train_loader):
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                seen = batch_idx * len(data)
                print(f"Train Epoch: {epoch} [{seen}/{len(train_sampler)} "
                      f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}",
                      flush=True)

    def test() -> None:
        model.eval()
        test_loss, test_accuracy = 0.0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                if args.cuda:
                    data, target = data.cuda(), target.cuda()
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                pred = output.argmax(dim=1)
                test_accuracy += pred.eq(target).float().sum().item()
        # Each rank saw its share of the test set: average the ranks' numbers.
        test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
        test_accuracy = metric_average(test_accuracy / len(test_sampler), "avg_accuracy")
        if hvd.rank() == 0:
            print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * test_accuracy:.2f}%\n",
                  flush=True)

    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test()


if __name__ == "__main__":
    main()
