"""SyncBatchNorm: batch normalization whose batch statistics span every rank.

Forward: one allgather of each rank's (count, mean, M2) per channel, combined exactly
(Chan's parallel variance), so ranks may hold different batch sizes. Backward: one
allreduce of the per-channel sums of dy and dy * (x - mean). The weight and bias
gradients stay local: DistributedOptimizer averages them like any other gradient.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ..compat.process_sets import global_process_set
from . import checks, requests, submitters

_instances = itertools.count()


def _channel_view(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t.view(1, -1, *([1] * (dim - 2)))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, factor, name, ps):
        acc = torch.promote_types(x.dtype, torch.float32)
        dims = [0] + list(range(2, x.dim()))
        xa = x.to(acc)
        count = x.numel() // x.shape[1]
        mean = xa.mean(dims) if count else torch.zeros(x.shape[1], dtype=acc)
        m2 = ((xa - _channel_view(mean, x.dim())) ** 2).sum(dims)
        mine = torch.cat([torch.tensor([float(count)], dtype=acc), mean, m2])
        c = x.shape[1]
        # One row per rank that contributed (after join(), only those that have not joined).
        rows = requests.synchronize(submitters.allgather_submit([mine.unsqueeze(0)], f"{name}.stats",
                                                    "SyncBatchNorm", ps)).view(-1, 1 + 2 * c)
        counts, means, m2s = rows[:, :1], rows[:, 1:1 + c], rows[:, 1 + c:]
        total = counts.sum()
        if total == 0:
            raise ValueError(f"jaxcache.torch.SyncBatchNorm {name!r}: every rank's batch is empty")
        g_mean = (counts * means).sum(0) / total
        g_m2 = (m2s + counts * (means - g_mean) ** 2).sum(0)
        var = g_m2 / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - factor).add_(g_mean.to(running_mean.dtype), alpha=factor)
                unbiased = g_m2 / (total - 1) if total > 1 else var
                running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
        xhat = (xa - _channel_view(g_mean, x.dim())) * _channel_view(invstd, x.dim())
        y = xhat
        if weight is not None:
            y = y * _channel_view(weight.to(acc), x.dim()) + _channel_view(bias.to(acc), x.dim())
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.spec = (name, ps, total, x.dtype, weight is not None)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xhat, invstd, weight = ctx.saved_tensors
        name, ps, total, dtype, affine = ctx.spec
        nd = xhat.dim()
        dims = [0] + list(range(2, nd))
        dya = dy.to(xhat.dtype)
        local = torch.cat([dya.sum(dims), (dya * xhat).sum(dims)])
        grad_w = local[xhat.shape[1]:].to(weight.dtype) if affine and ctx.needs_input_grad[1] else None
        grad_b = local[:xhat.shape[1]].to(weight.dtype) if affine and ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            sums = requests.synchronize(submitters.allreduce_submit([local], "sum", f"{name}.grad_stats", 1.0, 1.0,
                                                        "SyncBatchNorm (backward)", False, True, ps))
            c = xhat.shape[1]
            mean_dy, mean_dy_xhat = sums[:c] / total, sums[c:] / total
            scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
            grad_x = (_channel_view(scale, nd) * (dya - _channel_view(mean_dy, nd)
                                                  - xhat * _channel_view(mean_dy_xhat, nd))).to(dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the whole global batch (statistics synchronized across ranks).

    Same arguments as torch.nn.BatchNorm*d; accepts inputs of shape (N, C, ...). Works on CPU
    and on accelerator tensors (staged through host memory). In eval mode with running
    statistics it is a plain batch norm. Every rank must call it (same modules, same order).
    `process_set` (jaxcache's addition, like torch.nn.SyncBatchNorm's process_group) limits
    the statistics to the ranks of a set, e.g. those of one node.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 *, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self._jc_name = f"torch.sync_batch_norm.{next(_instances)}"
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"jaxcache.torch.SyncBatchNorm: expected at least 2D input (N, C, ...), "
                             f"got {input.dim()}D input of shape {tuple(input.shape)}")

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        ps = checks.set_of(self.process_set, "SyncBatchNorm")
        if ps.size == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                True, factor, self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, self.running_mean,
                                            self.running_var, self.eps, factor, self._jc_name, ps)
