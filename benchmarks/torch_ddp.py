"""Gradient communication of one PyTorch step: jaxcache.torch.DistributedOptimizer vs DDP (gloo).

    mpirun -np 2 python benchmarks/torch_ddp.py [--steps 20] [--warmup 3] [--sets resnet50,small]

The model holds parameters of the gradient set's shapes (ResNet-50: the 161 float32 tensors
of ../shared/resnet50_grad_shapes.json, 25,557,032 values) and a trivial forward: each
parameter passes through an autograd function whose backward returns a fixed, rank-dependent
gradient. Backward therefore costs only gradient accumulation, and

    communication = median(backward + reduction) - median(backward alone, same model, no hooks)

for both libraries (DDP reduces during backward and waits at its end; jaxcache submits from
its gradient hooks during backward and waits in optimizer.synchronize()). The table also shows
jaxcache's submit path on preset gradients (synchronize() without a backward) and one
mpi4py Allreduce per tensor as the floor. Steps start after a barrier; the slowest rank counts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import common  # noqa: E402  (imports mpi4py.MPI first)
from common import COMM, MPI  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import jaxcache.torch as jct  # noqa: E402


class _FixedGrad(torch.autograd.Function):
    """Identity-like op whose backward yields a stored gradient (no computation)."""

    @staticmethod
    def forward(ctx, param, grad):
        ctx.grad = grad
        return param.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        return ctx.grad, None


class GradModel(torch.nn.Module):
    def __init__(self, shapes, grads):
        super().__init__()
        self.params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])
        self.grads = grads

    def forward(self):
        loss = torch.zeros(())
        for p, g in zip(self.params, self.grads):
            loss = loss + _FixedGrad.apply(p, g)
        return loss


def init_gloo() -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(common.free_port())
    os.environ["RANK"] = str(COMM.rank)
    os.environ["WORLD_SIZE"] = str(COMM.size)
    dist.init_process_group("gloo", init_method="env://")


def check(params, want, what: str) -> None:
    got = [p.grad.numpy() for p in params]
    ok = common.agree(common.all_close(got, want))
    if not ok:
        raise SystemExit(f"{what}: wrong gradients")


def interleaved_medians(methods: dict, warmup: int, steps: int) -> dict[str, float]:
    """Median ms per method; each round runs every method once (after a barrier each), so a
    change of background load hits all methods alike. The slowest rank counts per step."""
    for fn in methods.values():
        for _ in range(warmup):
            fn()
    local = {name: np.empty(steps) for name in methods}
    for i in range(steps):
        for name, fn in methods.items():
            COMM.Barrier()
            t0 = time.perf_counter()
            fn()
            local[name][i] = time.perf_counter() - t0
    out = {}
    for name, times in local.items():
        slowest = np.empty_like(times)
        COMM.Allreduce(times, slowest, op=MPI.MAX)
        out[name] = 1e3 * float(np.median(slowest))
    return out


def run_set(label: str, shapes, steps: int, warmup: int) -> list[dict]:
    size, rank = COMM.size, COMM.rank
    local = common.rank_tensors(shapes, rank)
    grads = [torch.from_numpy(a) for a in local]
    want = common.reference(shapes, size, "average")

    # Backward alone (no hooks, no communication).
    plain = GradModel(shapes, grads)

    def backward_plain():
        for p in plain.params:
            p.grad = None
        plain().backward()

    # DistributedDataParallel, gloo, default 25 MB buckets.
    ddp_model = GradModel(shapes, grads)
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)

    def ddp_step():
        for p in ddp_model.params:
            p.grad = None
        ddp().backward()

    ddp_step()
    check(ddp_model.params, want, "DDP")

    # jaxcache.torch.DistributedOptimizer: hooks submit during backward, synchronize() waits.
    jc_model = GradModel(shapes, grads)
    opt = jct.DistributedOptimizer(torch.optim.SGD(jc_model.parameters(), lr=0.0),
                                   named_parameters=jc_model.named_parameters(), name_prefix=label)

    def jc_step():
        opt.zero_grad()
        jc_model().backward()
        opt.synchronize()

    jc_step()
    check(jc_model.params, want, "jaxcache")

    # The same with DDP-sized groups: ceil(bytes / 25 MB) groups of consecutive parameters,
    # each one atomic request submitted when its last gradient is ready.
    n_groups = max(1, -(-sum(a.nbytes for a in local) // (25 << 20)))
    grouped_model = GradModel(shapes, grads)
    grouped = jct.DistributedOptimizer(torch.optim.SGD(grouped_model.parameters(), lr=0.0),
                                       named_parameters=grouped_model.named_parameters(),
                                       groups=n_groups, name_prefix=f"{label}.groups")

    def jc_grouped_step():
        grouped.zero_grad()
        grouped_model().backward()
        grouped.synchronize()

    jc_grouped_step()
    check(grouped_model.params, want, "jaxcache groups")

    # jaxcache's submit path on preset gradients (no backward, no hooks): set .grad, then
    # synchronize() submits every gradient itself and waits. (Values are re-averaged each
    # step, which changes nothing that matters for timing.)
    direct_model = GradModel(shapes, grads)
    direct = jct.DistributedOptimizer(torch.optim.SGD(direct_model.parameters(), lr=0.0),
                                      named_parameters=direct_model.named_parameters(),
                                      name_prefix=label)  # same names: one cache entry each
    direct.remove_hooks()
    preset = [g.clone() for g in grads]

    def jc_direct():
        for p, g in zip(direct_model.params, preset):
            p.grad = g
        direct.synchronize()

    # mpi4py: one in-place Allreduce per tensor (the floor; no backward, no averaging).
    bufs = [a.copy() for a in local]

    def mpi_step():
        for b in bufs:
            COMM.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)

    t = interleaved_medians({"backward": backward_plain, "ddp": ddp_step, "jc": jc_step,
                             "jc_groups": jc_grouped_step, "direct": jc_direct, "mpi": mpi_step},
                            warmup, steps)
    opt.remove_hooks()
    grouped.remove_hooks()

    comm_ddp, comm_jc = t["ddp"] - t["backward"], t["jc"] - t["backward"]
    common.say(f"{label}: {len(shapes)} tensors, {common.num_values(shapes):,} float32 values, {size} "
               f"ranks, {steps} interleaved steps after {warmup} warm-up, medians of the slowest rank")
    return [
        {"set": label, "method": "backward only (no communication)", "step ms": t["backward"]},
        {"set": label, "method": "DDP gloo (25 MB buckets): backward + allreduce", "step ms": t["ddp"],
         "communication ms": comm_ddp, "vs DDP": 1.0},
        {"set": label, "method": "jaxcache.torch DistributedOptimizer: backward + synchronize()",
         "step ms": t["jc"], "communication ms": comm_jc, "vs DDP": comm_jc / comm_ddp},
        {"set": label, "method": f"jaxcache.torch DistributedOptimizer(groups={n_groups}): backward + synchronize()",
         "step ms": t["jc_groups"], "communication ms": t["jc_groups"] - t["backward"],
         "vs DDP": (t["jc_groups"] - t["backward"]) / comm_ddp},
        {"set": label, "method": "jaxcache.torch synchronize() of preset grads (no backward)",
         "step ms": t["direct"], "communication ms": t["direct"], "vs DDP": t["direct"] / comm_ddp},
        {"set": label, "method": "mpi4py Allreduce per tensor, in place (floor)", "step ms": t["mpi"],
         "communication ms": t["mpi"], "vs DDP": t["mpi"] / comm_ddp},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--sets", default="resnet50", help="comma list of: resnet50, small")
    args = parser.parse_args()
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    torch.set_num_threads(1)
    # Both sets' names stay cached side by side (the small set alone has 1000 names).
    os.environ.setdefault("JAXCACHE_CACHE_CAPACITY", "8192")
    init_gloo()
    jct.init()
    rows = []
    for label in args.sets.split(","):
        shapes = common.GRADIENT_SETS[label]()
        rows += run_set(label, shapes, args.steps, args.warmup)
    common.print_table(rows, ["set", "method", "step ms", "communication ms", "vs DDP"])
    jct.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
