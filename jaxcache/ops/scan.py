"""scan: rank r receives the reduction of ranks 0..r's arrays (an inclusive prefix reduction,
MPI_Scan; mpi4jax's scan).

Autodiff (op "sum"): y_r = post * pre * sum_{q <= r} x_q, so x_q's cotangent is the scaled sum
of the cotangents of ranks q.. size-1: the total (an allreduce) minus the prefix before q (a
scan, less q's own).
"""

from __future__ import annotations

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad

from . import call, eager, lowering, naming, sharded, validation
from .allreduce import sum_values
from ..protocol import Kind

scan_p = Primitive("jaxcache_scan")
scan_p.multiple_results = True

OPS = ("sum", "min", "max", "prod")  # a prefix has no one size to average over


def _abstract_eval(*avals, **params):
    return [lowering.result_aval(a) for a in avals]


def _lowering(ctx, *args, name, auto_name, op, prescale, postscale, world_size, process_set):
    return lowering.ffi_call(ctx, "jaxcache_scan", args, name=name, auto_name=auto_name,
                             world_size=world_size, process_set=process_set,
                             aliases={i: i for i in range(len(args))}, op=op, prescale=prescale,
                             postscale=postscale)


def _impl(*args, name, auto_name, op, prescale, postscale, world_size, process_set):
    return eager.run(Kind.SCAN, name, args, [a.shape for a in args], world_size,
                     op=validation.REDUCE_OPS[op], prescale=prescale, postscale=postscale,
                     process_set=process_set)


def _transpose(cts, *args, name, auto_name, op, prescale, postscale, world_size, process_set):
    cts = [ad.instantiate_zeros(c) for c in cts]
    total = sum_values(cts, naming.derived(name, "T"), auto_name, world_size, process_set)
    prefix = scan_p.bind(*cts, name=naming.derived(name, "T/scan"), auto_name=auto_name, op="sum",
                         prescale=1.0, postscale=1.0, world_size=world_size, process_set=process_set)
    scale = prescale * postscale
    return [scale * (t - p + c) for t, p, c in zip(total, prefix, cts)]


def _batch(args, dims, **params):
    # Elementwise across ranks: a batch axis is just more elements.
    return scan_p.bind(*args, **params), list(dims)


lowering.define_collective(scan_p, impl=_impl, abstract_eval=_abstract_eval, lower=_lowering,
                           batch=_batch, transpose=_transpose, differentiable_ops=("sum",))


def scan(x, op: str = "sum", *, name: str | None = None, prescale: float = 1.0,
         postscale: float = 1.0, process_set=None, comm=None):
    """Inclusive prefix reduction over the ranks (of `process_set`): rank r gets
    `postscale * reduce(prescale * x)` over ranks 0..r (op "sum", "min", "max" or "prod").
    Works eagerly and under jit/grad/vmap."""
    ps = call.begin("scan", name, process_set, comm)
    op = validation.check_op(op, "scan")
    if op not in OPS:
        raise ValueError(f"jaxcache.scan: op must be one of {', '.join(OPS)}; got {op!r}")
    x = validation.as_array(x, "scan", "x")
    validation.check_reduction(x.dtype, op, prescale, postscale, "scan", "x")
    name, auto = naming.collective_name("scan", name)
    params = dict(name=name, auto_name=auto, op=op, prescale=float(prescale), postscale=float(postscale),
                  world_size=ps.size, process_set=ps.id)
    if not sharded.direct([x]):
        return scan_p.bind(x, **params)[0]
    return _impl(x, **params)[0]
