"""mpi4jax 0.9's API on jaxcache: `import jaxcache.mpi4jax as mpi4jax` runs mpi4jax code.

Names, arguments and results are mpi4jax's (`op=` an mpi4py operator such as `MPI.SUM`,
`comm=` an mpi4py communicator, no tokens); underneath, every call is a jaxcache collective,
negotiated by name, so independent collectives may start in any order under `jit` without
the global ordering mpi4jax imposes. The runtime starts when this module is imported
(`jaxcache.init()`, collective: every rank imports it, as every rank imports mpi4py), so that
point-to-point between some of the ranks works from the first call; call `jaxcache.init()`
before the import to choose settings. docs/mpi4jax.md lists each name: same, differs (how),
or not supported (why).
"""

from __future__ import annotations

from mpi4py import MPI

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad

import jaxcache as _jc
from .ops import allreduce as _allreduce, call as _call, lowering as _lowering, naming as _naming
from .ops import validation as _validation

__all__ = ["allgather", "allreduce", "alltoall", "barrier", "bcast", "gather", "recv", "reduce",
           "scan", "scatter", "send", "sendrecv", "has_cuda_support", "has_sycl_support"]

_NOTSET = object()

# mpi4py's operators with a jaxcache reduce op. On bools MPI.LAND / MPI.LOR are min / max.
# (mpi4py's Op objects compare by value but are not hashable: a list of pairs.)
_OPS = [(MPI.SUM, "sum"), (MPI.PROD, "prod"), (MPI.MIN, "min"), (MPI.MAX, "max"), (MPI.LAND, "min"),
        (MPI.LOR, "max")]


def _begin(fn: str, token) -> None:
    """Starts the runtime on first use and refuses tokens (as mpi4jax >= 0.8 does). A `comm`
    is passed on as jaxcache's `comm=`: a communicator of every rank (mpi4jax's default is a
    clone of COMM_WORLD) or of a registered process set's ranks."""
    if token is not _NOTSET:
        raise RuntimeError(f"jaxcache.mpi4jax.{fn}: tokens are not supported (as in mpi4jax >= 0.8); "
                           "call it without token=")
    if not _jc.is_initialized():
        _jc.init()


def _op(op, fn: str) -> str:
    for mpi_op, name in _OPS:
        if op == mpi_op:
            return name
    raise NotImplementedError(f"jaxcache.mpi4jax.{fn}: op {op!r} is not supported; jaxcache reduces with "
                              "MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX (and MPI.LAND / MPI.LOR on bools)")


# mpi4jax's allreduce differentiates like MPI itself rather than like psum: its JVP is the
# allreduce of the tangents and its transpose is the identity (so grad(sum(allreduce(x)))
# is ones, not size * ones), whose own transpose is the allreduce again. One primitive with
# a `transposed` flag, run and lowered as jaxcache's allreduce (or as the identity).
allreduce_p = Primitive("jaxcache_mpi4jax_allreduce")
allreduce_p.multiple_results = True


def _allreduce_impl(*args, transposed, **params):
    return list(args) if transposed else _allreduce._impl(*args, **params)


def _allreduce_lowering(ctx, *args, transposed, **params):
    return list(args) if transposed else _allreduce._lowering(ctx, *args, **params)


def _allreduce_abstract_eval(*avals, **params):
    return _allreduce._abstract_eval(*avals)


def _allreduce_transpose(cts, *args, transposed, name, **params):
    cts = [ad.instantiate_zeros(c) for c in cts]
    return allreduce_p.bind(*cts, transposed=not transposed, name=_naming.derived(name, "T"), **params)


def _allreduce_batch(args, dims, **params):
    return allreduce_p.bind(*args, **params), list(dims)


_lowering.define_collective(allreduce_p, impl=_allreduce_impl, abstract_eval=_allreduce_abstract_eval,
                            lower=_allreduce_lowering, batch=_allreduce_batch, transpose=_allreduce_transpose,
                            differentiable_ops=("sum",))


def allreduce(x, op, *, comm=None, token=_NOTSET):
    """The reduction of `x` over the ranks, on every rank. Differentiable for MPI.SUM, with
    mpi4jax's convention (the transpose is the identity)."""
    _begin("allreduce", token)
    ps = _call.begin("allreduce", None, None, comm)
    op = _op(op, "allreduce")
    x = _validation.as_array(x, "allreduce", "x")
    _validation.check_reduction(x.dtype, op, 1.0, 1.0, "allreduce", "x")
    name, auto = _naming.collective_name("allreduce", None)
    params = dict(name=name, auto_name=auto, op=op, prescale=1.0, postscale=1.0,
                  world_size=ps.size, process_set=ps.id, transposed=False)
    return allreduce_p.bind(x, **params)[0]


def allgather(x, *, comm=None, token=_NOTSET):
    """Every rank's `x`, stacked in rank order: shape `(size, *x.shape)`."""
    _begin("allgather", token)
    return _jc.allgather(jnp.asarray(x)[None], comm=comm)


def alltoall(x, *, comm=None, token=_NOTSET):
    """`x` has shape `(size, ...)`; rank r receives row r of every rank, in rank order."""
    _begin("alltoall", token)
    x = jnp.asarray(x)
    nproc = _jc.size() if comm is None else comm.Get_size()
    if x.ndim == 0 or x.shape[0] != nproc:
        raise ValueError(f"jaxcache.mpi4jax.alltoall: x must have shape (nproc, ...) = ({nproc}, ...); "
                         f"got {x.shape}")
    return _jc.alltoall(x, comm=comm)


def barrier(*, comm=None, token=_NOTSET):
    """Returns once every rank has called it; inside jit, every run of the program waits
    there (not ordered with the program's other operations: docs/mpi4jax.md)."""
    _begin("barrier", token)
    _jc.barrier(comm=comm)


def bcast(x, root, *, comm=None, token=_NOTSET):
    """Root's `x` on every rank."""
    _begin("bcast", token)
    return _jc.broadcast(jnp.asarray(x), root, comm=comm)


def gather(x, root, *, comm=None, token=_NOTSET):
    """Root gets `(size, *x.shape)`, every rank's `x` in rank order; the others their own `x`."""
    _begin("gather", token)
    return _jc.gather(x, root, comm=comm)


def scatter(x, root, *, comm=None, token=_NOTSET):
    """Rank r gets `x[r]` of root's `x` (shape `(size, ...)`); the others pass a block's shape."""
    # mpi4jax checks root's operand locally, before any communication (jaxcache.scatter
    # decides it in the negotiation: an error on every rank).
    world = comm or MPI.COMM_WORLD
    x = jnp.asarray(x)
    if world.Get_rank() == root and (x.ndim == 0 or x.shape[0] != world.Get_size()):
        raise ValueError(f"Scatter input must have shape (nproc, ...) = ({world.Get_size()}, ...); got {x.shape}")
    _begin("scatter", token)
    return _jc.scatter(x, root, comm=comm)


def reduce(x, op, root, *, comm=None, token=_NOTSET):
    """Root gets the reduction of every rank's `x`; the others their own `x`."""
    _begin("reduce", token)
    return _jc.reduce(x, _op(op, "reduce"), root, comm=comm)


def scan(x, op, *, comm=None, token=_NOTSET):
    """Rank r gets the reduction over ranks 0..r (MPI_Scan)."""
    _begin("scan", token)
    return _jc.scan(x, _op(op, "scan"), comm=comm)


def _peer(value, wildcard_mpi, wildcard_jc):
    """mpi4py's wildcard as jaxcache's (both are MPI's own number when they share an MPI)."""
    return wildcard_jc if value == wildcard_mpi else value


def send(x, dest, *, tag=0, comm=None, token=_NOTSET):
    """Sends `x` to `dest` (returns None, as mpi4jax >= 0.8)."""
    _begin("send", token)
    _jc.send(x, dest, tag=tag, comm=comm)


def recv(x, source=MPI.ANY_SOURCE, *, tag=MPI.ANY_TAG, comm=None, status=None, token=_NOTSET):
    """Receives an array shaped like `x` from `source` (MPI.ANY_SOURCE: any rank) with `tag`."""
    _begin("recv", token)
    return _jc.recv(x, _peer(source, MPI.ANY_SOURCE, _jc.ANY_SOURCE), tag=_peer(tag, MPI.ANY_TAG, _jc.ANY_TAG),
                    comm=comm, status=status)


def sendrecv(sendbuf, recvbuf, source, dest, *, sendtag=0, recvtag=MPI.ANY_TAG, comm=None, status=None,
             token=_NOTSET):
    """Sends `sendbuf` to `dest` while receiving an array shaped like `recvbuf` from `source`."""
    _begin("sendrecv", token)
    return _jc.sendrecv(sendbuf, recvbuf, _peer(source, MPI.ANY_SOURCE, _jc.ANY_SOURCE), dest,
                        sendtag=sendtag, recvtag=_peer(recvtag, MPI.ANY_TAG, _jc.ANY_TAG), comm=comm,
                        status=status)


def has_cuda_support() -> bool:
    """Whether jaxcache was built with its CUDA path (docs/gpu.md)."""
    return _jc.cuda_built()


def has_sycl_support() -> bool:
    """jaxcache has no SYCL path."""
    return False


# Started at import (collective), not at the first call: a program's first call may be a
# send between two of its ranks, which the others never make.
if not _jc.is_initialized():
    _jc.init()
