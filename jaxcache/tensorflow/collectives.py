"""horovod.tensorflow's collectives on the jaxcache runtime, differentiable with Horovod's rules.

    allreduce, grouped_allreduce  gradient: the same allreduce of the gradient (op and scales)
    allgather, grouped_allgather  gradient: average-allreduce of the gradient, this rank's rows
                                  (at the offsets the ranks agreed on: first dimensions may differ)
    broadcast                     gradient: average-allreduce on root_rank, zeros elsewhere
    reducescatter, grouped_...    gradient: allgather of the gradient times prescale * postscale,
                                  and times size for Sum (Horovod's scaling)
    alltoall                      gradient: alltoall of the gradient, sending back the rows received

Backward collectives are named `<name>/grad` and run in the forward's process set (sizes and
ranks above are the set's; `root_rank` is a global rank). tf.IndexedSlices are reduced by an allgather of
their values and indices (sparse.py). device_dense / device_sparse / ignore_name_scope are
accepted for compatibility: tensors are staged through host memory and names never include
TensorFlow name scopes.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from .. import runtime as _runtime
from ..compat import reduce_ops
from ..compat.process_sets import Resolved, global_process_set
from . import ops, sparse
from . import compression as _compression
from .compression import Compression
from ..protocol import Kind

_api = ops._api


def _differentiable(tensors) -> bool:
    return all(t.dtype.is_floating or t.dtype.is_complex for t in tensors)


def reduce_tensors(tensors: list, name: str, op: str, pre: float, post: float, ps: Resolved) -> list:
    """One atomic allreduce request over validated dense tensors in set `ps`; differentiable."""
    code, pre_w, post_w = ops.reduce_args(op, pre, post)

    def run(xs, nm):
        return ops.run(Kind.ALLREDUCE, [nm], [list(xs)], op=code, prescale=pre_w,
                       postscale=post_w, process_set=ps)[0]

    if not _differentiable(tensors):
        return run(tensors, name)

    @tf.custom_gradient
    def f(*xs):
        def grad(*dys):
            dys = [tf.zeros_like(x) if d is None else tf.convert_to_tensor(d) for d, x in zip(dys, xs)]
            return run(dys, f"{name}/grad")
        return run(xs, name), grad

    out = f(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _zeros_for_none(dys, like) -> list:
    return [tf.zeros_like(y) if d is None else tf.convert_to_tensor(d) for d, y in zip(dys, like)]


def _gather(tensors: list, name: str, ps: Resolved) -> tuple[list, tf.Tensor]:
    """One atomic allgather request (not differentiable): results and every rank's rows."""
    (outs, rows, _), = ops.run_allocated(Kind.ALLGATHER, [name], [list(tensors)], process_set=ps)
    return outs, rows


def _own_rows(grad, x, rows, i: int, ps: Resolved):
    """This rank's part of the gradient of tensor i of an allgather whose rows the ranks agreed."""
    size, r = ps.size, ps.rank
    mine = rows[i * size:(i + 1) * size]
    offset = tf.reduce_sum(mine[:r])
    if x.shape.rank == 0:
        return grad[offset]
    return grad[offset:offset + mine[r]]


def gather_tensors(tensors: list, name: str, ps: Resolved) -> list:
    """One atomic allgather request (first dimensions may differ); differentiable (Horovod's rule)."""
    if not _differentiable(tensors):
        return _gather(tensors, name, ps)[0]

    @tf.custom_gradient
    def f(*xs):
        ys, rows = _gather(xs, name, ps)

        def grad(*dys):
            reduced = reduce_tensors(_zeros_for_none(dys, ys), f"{name}/grad", "average", 1.0, 1.0, ps)
            return [_own_rows(g, x, rows, i, ps) for i, (g, x) in enumerate(zip(reduced, xs))]
        return ys, grad

    out = f(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def scatter_tensors(tensors: list, name: str, op: str, pre: float, post: float, ps: Resolved) -> list:
    """One atomic reducescatter request over validated tensors; differentiable (Horovod's rule)."""
    code, pre_w, post_w = ops.reduce_args(op, pre, post)

    def run(xs):
        return ops.run(Kind.REDUCESCATTER, [name], [list(xs)], op=code, prescale=pre_w,
                       postscale=post_w, process_set=ps)[0]

    if not _differentiable(tensors):
        return run(tensors)
    factor = (ps.size if op == "sum" else 1.0) * pre * post

    @tf.custom_gradient
    def f(*xs):
        ys = run(xs)

        def grad(*dys):
            dys = _zeros_for_none(dys, ys)
            if factor != 1.0:
                dys = [d * tf.cast(factor, d.dtype) for d in dys]
            return _gather(dys, f"{name}/grad", ps)[0]
        return ys, grad

    out = f(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def exchange(tensor, splits, name: str, ps: Resolved) -> tuple:
    """One alltoall request: (rows received in rank order, rows received from each rank as
    int32); differentiable (the gradient goes back with the received splits)."""
    def run(x, s, nm):
        (outs, received, _), = ops.run_allocated(Kind.ALLTOALL, [nm], [[x]], [s], process_set=ps)
        return outs[0], received

    if not _differentiable([tensor]):
        return run(tensor, splits, name)
    received_splits = []

    @tf.custom_gradient
    def f(x):
        y, received = run(x, splits, name)
        received_splits.append(received)

        def grad(dy):
            return run(_zeros_for_none([dy], [y])[0], received, f"{name}/grad")[0]
        return y, grad

    return f(tensor), received_splits[0]


def _check_first_dim(t, fn: str, what: str) -> None:
    if t.shape.rank == 0:
        raise ValueError(f"jaxcache.tensorflow.{fn}: {what} is a scalar; it needs a first dimension "
                         "to split")


def _tensor(x, fn: str, name):
    return ops.as_tensor(x, fn, f"tensor {name!r}" if name else "tensor")


@_api
def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none,
              op=None, prescale_factor=1.0, postscale_factor=1.0, name=None,
              process_set=global_process_set, ignore_name_scope=False, *, prescale=None,
              postscale=None):
    """The reduction of `tensor` (tf.Tensor, tf.Variable or tf.IndexedSlices) over all ranks
    (of `process_set`).

    op: Average (default), Sum, Min, Max, Product (or 'average', 'sum', ...). IndexedSlices
    are allgathered (values and indices) and stay IndexedSlices (Sum or Average only).
    """
    fn = "allreduce"
    op = reduce_ops.resolve(op, average, f"tensorflow.{fn}")
    pre, post = reduce_ops.scales(prescale_factor, postscale_factor, prescale, postscale,
                                  f"tensorflow.{fn}")
    ps = ops.set_of(process_set, fn)
    if isinstance(tensor, tf.IndexedSlices):
        if pre != 1.0 or post != 1.0:
            raise NotImplementedError("jaxcache.tensorflow.allreduce: prescale/postscale factors do "
                                      "not apply to tf.IndexedSlices (as in Horovod)")
        return sparse.reduce_slices([tensor], [ops.auto_name("allreduce", name, fn)], op, fn, ps)[0]
    t = _tensor(tensor, fn, name)
    ops.check_reduction(t, op, pre, post, fn, f"tensor {name!r}" if name else "tensor")
    _compression.check(compression, fn)
    name = ops.auto_name("allreduce", name, fn)
    c, ctx = compression.compress(t)
    return compression.decompress(reduce_tensors([c], name, op, pre, post, ps)[0], ctx)


@_api
def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, ignore_name_scope=False,
                      name=None, *, prescale=None, postscale=None):
    """Reduces a list of tensors as one atomic (fused) request; IndexedSlices are allgathered."""
    fn = "grouped_allreduce"
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"jaxcache.tensorflow.{fn}: tensors must be a list or tuple, got "
                        f"{type(tensors).__name__}")
    if not tensors:
        return tensors
    op = reduce_ops.resolve(op, average, f"tensorflow.{fn}")
    pre, post = reduce_ops.scales(prescale_factor, postscale_factor, prescale, postscale,
                                  f"tensorflow.{fn}")
    ps = ops.set_of(process_set, fn)
    out: list = [None] * len(tensors)
    dense, slices = [], []
    for i, x in enumerate(tensors):
        if isinstance(x, tf.IndexedSlices):
            slices.append(i)
            continue
        what = f"tensors[{i}]" + (f" of {name!r}" if name else "")
        t = ops.as_tensor(x, fn, what)
        ops.check_reduction(t, op, pre, post, fn, what)
        dense.append((i, t))
    name = ops.auto_name("grouped_allreduce", name, fn)
    if slices:
        if pre != 1.0 or post != 1.0:
            raise NotImplementedError(f"jaxcache.tensorflow.{fn}: prescale/postscale factors do not "
                                      "apply to tf.IndexedSlices (as in Horovod)")
        reduced = sparse.reduce_slices([tensors[i] for i in slices],
                                       [f"{name}/slices{i}" for i in slices], op, fn, ps)
        for i, r in zip(slices, reduced):
            out[i] = r
    if dense:
        _compression.check(compression, fn)
        compressed = [compression.compress(t) for _, t in dense]
        reduced = reduce_tensors([c for c, _ in compressed], name, op, pre, post, ps)
        for (i, _), (_, ctx), r in zip(dense, compressed, reduced):
            out[i] = compression.decompress(r, ctx)
    return out


@_api
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Every rank's `tensor` concatenated along axis 0 in rank order (of `process_set`; a scalar
    gives a vector).

    The first dimension may differ between ranks; the others must agree. Differentiable.
    Inside tf.function the result's first dimension is unknown until it runs.
    """
    ps = ops.set_of(process_set, "allgather")
    t = _tensor(tensor, "allgather", name)
    return gather_tensors([t], ops.auto_name("allgather", name, "allgather"), ps)[0]


@_api
def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """allgather of every tensor of the list as one atomic request (differentiable)."""
    ps = ops.set_of(process_set, "grouped_allgather")
    if not isinstance(tensors, (list, tuple)):
        raise TypeError("jaxcache.tensorflow.grouped_allgather: tensors must be a list or tuple, got "
                        f"{type(tensors).__name__}")
    if not tensors:
        return []
    ts = [ops.as_tensor(x, "grouped_allgather", f"tensors[{i}]") for i, x in enumerate(tensors)]
    return gather_tensors(ts, ops.auto_name("grouped_allgather", name, "grouped_allgather"), ps)


@_api
def broadcast(tensor, root_rank=0, name=None, ignore_name_scope=False, process_set=global_process_set):
    """`root_rank`'s value of `tensor` on every rank (of `process_set`; `root_rank` is a global
    rank); differentiable."""
    ps = ops.set_of(process_set, "broadcast")
    t = _tensor(tensor, "broadcast", name)
    root = ops.set_root(root_rank, ps, "broadcast")
    name = ops.auto_name("broadcast", name, "broadcast")

    def run(x, nm):
        return ops.run(Kind.BROADCAST, [nm], [[x]], root=root, process_set=ps)[0][0]

    if not _differentiable([t]):
        return run(t, name)

    @tf.custom_gradient
    def f(x):
        def grad(dy):
            reduced = reduce_tensors([tf.convert_to_tensor(dy)], f"{name}/grad", "average", 1.0, 1.0,
                                     ps)[0]
            return reduced if ps.rank == root else reduced * 0
        return run(x, name), grad

    return f(t)


@_api
def broadcast_(variables, root_rank=0, name=None, process_set=global_process_set):
    """In-place broadcast: assigns root_rank's values to `variables`; returns their new values."""
    ps = ops.set_of(process_set, "broadcast_")
    root = ops.set_root(root_rank, ps, "broadcast_")
    if isinstance(variables, (tf.Variable, tf.Tensor)) or not hasattr(variables, "__iter__"):
        raise TypeError("jaxcache.tensorflow.broadcast_: pass a list of variables")
    variables = list(variables)
    values = []
    for i, v in enumerate(variables):
        if not hasattr(v, "assign"):
            raise TypeError(f"jaxcache.tensorflow.broadcast_: variables[{i}] is a {type(v).__name__}, "
                            "not a variable")
        values.append(ops.as_tensor(v, "broadcast_", f"variable {getattr(v, 'name', i)!r}"))
    base = ops.auto_name("broadcast_", name, "broadcast_")
    outs = ops.run(Kind.BROADCAST, [f"{base}/{i}" for i in range(len(values))],
                   [[t] for t in values], root=root, process_set=ps)
    return [v.assign(o) for v, (o,) in zip(variables, outs)]


@_api
def reducescatter(tensor, device_dense="", compression=Compression.none, op=reduce_ops.Average,
                  name=None, process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0, *, prescale=None, postscale=None):
    """Reduces `tensor` over all ranks (of `process_set`) and returns this rank's rows of axis 0
    (differentiable).

    Rank r (of the set) gets `shape[0] // size` rows, one more when `r < shape[0] % size` (Horovod's
    split). op: Average (default), Sum, Min, Max, Product (or 'average', 'sum', ...); an
    average divides by the set's size, also after join() (JAXCACHE_JOIN_AVERAGE_BY_SIZE=0:
    by the ranks that have not joined).
    """
    return _reducescatter([tensor], name, compression, op, process_set, prescale_factor,
                          postscale_factor, prescale, postscale, "reducescatter", True)[0]


@_api
def grouped_reducescatter(tensors, device_dense="", compression=Compression.none,
                          op=reduce_ops.Average, process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, *, name=None, prescale=None, postscale=None):
    """reducescatter of every tensor of the list as one atomic request (differentiable)."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError("jaxcache.tensorflow.grouped_reducescatter: tensors must be a list or tuple, "
                        f"got {type(tensors).__name__}")
    if not tensors:
        return tensors
    return _reducescatter(list(tensors), name, compression, op, process_set, prescale_factor,
                          postscale_factor, prescale, postscale, "grouped_reducescatter", False)


def _reducescatter(tensors, name, compression, op, process_set, prescale_factor, postscale_factor,
                   prescale, postscale, fn: str, single: bool) -> list:
    op = reduce_ops.resolve(op, None, f"tensorflow.{fn}")
    pre, post = reduce_ops.scales(prescale_factor, postscale_factor, prescale, postscale,
                                  f"tensorflow.{fn}")
    ps = ops.set_of(process_set, fn)
    _compression.check(compression, fn)
    ts = []
    for i, x in enumerate(tensors):
        what = (f"tensor {name!r}" if name else "tensor") if single else \
            f"tensors[{i}]" + (f" of {name!r}" if name else "")
        t = ops.as_tensor(x, fn, what)
        ops.check_reduction(t, op, pre, post, fn, what)
        _check_first_dim(t, fn, what)
        ts.append(t)
    name = ops.auto_name(fn, name, fn)
    compressed = [compression.compress(t) for t in ts]
    outs = scatter_tensors([c for c, _ in compressed], name, op, pre, post, ps)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, compressed)]


@_api
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Sends `splits[j]` rows of axis 0 to rank j (of `process_set`; default: `size` equal
    blocks) and returns the rows received, concatenated in rank order (differentiable).

    With `splits` (a list, array or integer tensor; may differ per rank) it returns
    `(tensor, received_splits)`, the rows that came from each rank (int32), as Horovod does.
    """
    ps = ops.set_of(process_set, "alltoall")
    what = f"tensor {name!r}" if name else "tensor"
    t = _tensor(tensor, "alltoall", name)
    _check_first_dim(t, "alltoall", what)
    counts = splits
    if splits is not None:
        if isinstance(splits, (list, tuple, np.ndarray)):
            counts = tf.constant(ops.validation.check_splits(
                np.asarray(splits) if isinstance(splits, np.ndarray) else splits,
                "tensorflow.alltoall"), tf.int64)
        else:
            counts = tf.convert_to_tensor(splits)
            if not counts.dtype.is_integer:
                raise TypeError("jaxcache.tensorflow.alltoall: splits must be integers, got "
                                f"{counts.dtype.name}")
    out, received = exchange(t, counts, ops.auto_name("alltoall", name, "alltoall"), ps)
    return out if splits is None else (out, received)


@_api
def join():
    """This rank has no more data: it serves the other ranks' collectives until every rank has
    joined. Returns the rank that joined last, as an int32 scalar tensor (on every rank).

    Meanwhile it contributes zeros to sums (the identity to min/max/prod) and no rows to
    allgathers; an 'average' still divides by the size (Horovod's rule;
    JAXCACHE_JOIN_AVERAGE_BY_SIZE=0: by the ranks that have not joined).
    """
    _runtime.require_initialized("jaxcache.tensorflow.join")
    if tf.executing_eagerly():
        return tf.constant(_runtime.join(), tf.int32)
    last = ops.graph_collective(lambda: [tf.constant(_runtime.join(), tf.int32)], [], [tf.int32])[0]
    last.set_shape([])
    return last
