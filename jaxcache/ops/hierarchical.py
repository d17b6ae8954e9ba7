"""`axis_name=`: the data-parallel collective over P processes x N local devices.

Inside `shard_map` (or `vmap`, `pmap`) over local axes, a collective with `axis_name` acts
over the named axes AND over every process, as `lax.psum` over a global mesh of all P x N
devices would (device (p, i) at global position p * N + i: process-major).

It runs hierarchically (Horovod's hierarchical allreduce): the value is reduce-scattered
across the named local devices, each device's 1/N is reduced across processes (the N
devices' pieces in one request, xla_ext/device_parts.h), and the pieces are all-gathered
across the devices. Each device's bytes that cross processes are 1/N of the value.

An allreduce over every axis of a CPU mesh leaves both local levels to the runtime, which
reduces the devices' host buffers itself (_in_runtime; xla_ext/device_reduction.h).
Otherwise XLA runs them (_allreduce): leaves of one dtype travel as one flat vector, so a
pytree costs one local reduce-scatter, one request and one local all-gather per dtype.
docs/devices.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import config as jax_config

def axis_size(axis_name) -> int:
    """The number of devices along the named axes (a name or a tuple of names)."""
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    size = 1
    for n in names:
        size *= lax.axis_size(n)
    return size


def check_axis_name(axis_name, fn: str):
    """`axis_name` as lax takes it: a name, or a tuple of names (a list becomes a tuple)."""
    if isinstance(axis_name, list):
        axis_name = tuple(axis_name)
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    for n in names:
        try:
            lax.axis_size(n)
        except (NameError, KeyError, ValueError) as e:
            raise NameError(
                f"jaxcache.{fn}: axis_name {n!r} is not an axis in scope; call it inside "
                "shard_map (or vmap/pmap) over that axis, or leave axis_name out for a "
                "collective over processes only") from e
    return axis_name


# A leaf at least this large is reduce-scattered on its own (a reshape, no copy); smaller
# ones are packed into one vector per dtype (one local collective for them all).
ALONE_BYTES = 64 * 1024


def _pieces(values: Sequence) -> list[list[int]]:
    """Which values travel together: each large one alone, the small ones one vector per
    dtype (in first-seen order)."""
    alone, packed = [], {}
    for i, v in enumerate(values):
        if v.size * jnp.dtype(v.dtype).itemsize >= ALONE_BYTES:
            alone.append([i])
        else:
            packed.setdefault(jnp.dtype(v.dtype), []).append(i)
    return alone + list(packed.values())


def _packed(values: Sequence, indices: list[int], multiple: int):
    """The values at `indices` raveled end to end, zero-padded to a multiple of `multiple`."""
    flat = jnp.concatenate([jnp.ravel(values[i]) for i in indices]) if len(indices) > 1 else jnp.ravel(values[indices[0]])
    pad = -flat.shape[0] % multiple
    return jnp.pad(flat, (0, pad)) if pad else flat


def _unpacked(flat, values: Sequence, indices: list[int], out: list) -> None:
    offset = 0
    for i in indices:
        n = values[i].size
        out[i] = flat[offset:offset + n].reshape(values[i].shape)
        offset += n


def _local_piece(flat, op: str, axis_name, n: int, invariant: bool = False):
    """This device's 1/n of the reduction of `flat` over the named devices. Of a value
    the same on every device, its 1/n of the value itself (the sum's factor n is applied
    after the reduction across processes)."""
    chunk = flat.shape[0] // n
    if invariant:
        return lax.dynamic_slice_in_dim(flat, lax.axis_index(axis_name) * chunk, chunk)
    if op in ("sum", "average"):
        return lax.psum_scatter(flat, axis_name, scatter_dimension=0, tiled=True)
    if op in ("min", "max"):
        reduced = lax.pmin(flat, axis_name) if op == "min" else lax.pmax(flat, axis_name)
    else:  # prod: lax has no product collective
        reduced = jnp.prod(lax.all_gather(flat, axis_name), axis=0).astype(flat.dtype)
    return lax.dynamic_slice_in_dim(reduced, lax.axis_index(axis_name) * chunk, chunk)


def _across_op(op: str, dtypes) -> str:
    """The op across processes: an average of integers is summed there and divided once,
    exactly, after (two truncating divisions could round twice)."""
    if op == "average" and any(not jnp.issubdtype(d, jnp.inexact) for d in dtypes):
        return "sum"
    return op


def _divided(piece, count: int):
    """An average from a sum: integers truncated toward zero, floats divided."""
    if jnp.issubdtype(piece.dtype, jnp.inexact):
        return piece / jnp.asarray(count, piece.dtype)
    return lax.div(piece, jnp.asarray(count, piece.dtype))


def _typed() -> bool:
    """Whether values carry the mesh axes they vary over (shard_map's check_vma)."""
    state = getattr(jax_config, "_check_vma", None)
    return state is not None and bool(state.value)


# What lax raises for an axis that is not one of shard_map's (a vmap axis inside it).
_NOT_A_MESH_AXIS = (ValueError, NotImplementedError, TypeError, AssertionError)


def _names(axis_name) -> tuple:
    return axis_name if isinstance(axis_name, tuple) else (axis_name,)


def _invariant(v, axis_name) -> bool:
    """Whether `v` is typed as the same on every device of the named axes (shard_map's
    check_vma: e.g. the gradient of a replicated parameter, which jax has already summed
    over the devices). Untyped values count as varying."""
    if not _typed():
        return False
    aval = jax.typeof(v)
    varying = getattr(aval, "vma", None)
    if varying is None:
        varying = getattr(getattr(aval, "manual_axis_type", None), "varying", frozenset())
    return not any(n in varying for n in _names(axis_name))


def _gathered(piece, axis_name, axis: int = 0, tiled: bool = True):
    """The devices' pieces gathered on every device. Inside shard_map the result is typed
    the same on every device of the named axes (as lax.psum's is), so that it may leave
    shard_map with a replicated out_spec; elsewhere (vmap) a plain gather."""
    if _typed():
        try:
            return lax.all_gather(piece, axis_name, axis=axis, tiled=tiled, to="invarying")
        except _NOT_A_MESH_AXIS:
            pass
    return lax.all_gather(piece, axis_name, axis=axis, tiled=tiled)


def _varying(ct, axis_name):
    """A cotangent typed as varying over the named axes, as its primal is (shard_map)."""
    if _typed():
        try:
            return lax.pcast(ct, axis_name, to="varying")
        except _NOT_A_MESH_AXIS:
            pass  # already varying
    return ct


def _cotangent(ct, primal, factor: float, axis_name):
    if not jnp.issubdtype(primal.dtype, jnp.inexact):
        return np.zeros(primal.shape, jax.dtypes.float0)
    return _varying(ct * jnp.asarray(factor, ct.dtype) if factor != 1.0 else ct, axis_name)


def _allreduce(values: Sequence, op: str, axis_name, processes: int, reduce_across: Callable) -> list:
    n = axis_size(axis_name)
    if op == "prod":  # n copies of a value the same everywhere multiply: reduce them as they are
        values = [_varying(v, axis_name) for v in values]
    groups = _pieces(values)
    same = [all(_invariant(values[i], axis_name) for i in indices) for indices in groups]
    pieces = [_local_piece(_packed(values, indices, n), op, axis_name, n, inv) for indices, inv in zip(groups, same)]
    across = _across_op(op, [p.dtype for p in pieces])
    # An average over P x N devices: the runtime divides by P, the postscale by N; of a
    # value the same on every device, N copies were not summed, so only by P.
    posts = [1.0 / n if across == "average" and not inv else 1.0 for inv in same]
    uniform = len(set(posts)) == 1  # else the runtime scales none, XLA each piece
    reduced = reduce_across(pieces, across, posts[0] if uniform else 1.0)
    out: list = [None] * len(values)
    for piece, indices, inv, post in zip(reduced, groups, same, posts):
        if not uniform and post != 1.0:
            piece = piece * jnp.asarray(post, piece.dtype)
        if op == "average" and across == "sum":
            piece = _divided(piece, (1 if inv else n) * processes)
        elif op == "sum" and inv:
            piece = piece * jnp.asarray(n, piece.dtype)  # the n equal copies' sum
        _unpacked(_gathered(piece, axis_name), values, indices, out)
    return out


def _in_runtime(values: Sequence, op: str, axis_name, processes: int, reduce_in_runtime: Callable) -> list:
    """The runtime reduces over the devices and the processes at once: each device's 1/N
    block over the N devices in host memory, across processes, then copied to the other
    devices (xla_ext/device_reduction.h). Every leaf is its own tensor of one request: no
    packing, no XLA collective."""
    n = axis_size(axis_name)
    across = _across_op(op, [v.dtype for v in values])
    # An average over P x N devices: the runtime divides by P, the postscale by N.
    out = reduce_in_runtime(list(values), across, 1.0 / n if across == "average" else 1.0, _names(axis_name), n)
    if op == "average" and across == "sum":
        out = [_divided(o, n * processes) for o in out]
    return out


def _whole_cpu_mesh(axis_name) -> bool:
    """Whether the named axes are every axis of the enclosing shard_map's mesh, all of them
    manual, on CPU: then the collective's program runs on exactly the devices it reduces
    over, whose buffers are in host memory. (With GPUs, XLA's local collectives over their
    links beat a trip through host memory; a subset of the axes needs XLA's groups.)"""
    if jax.default_backend() != "cpu":
        return False
    mesh = jax.sharding.get_abstract_mesh()
    names = set(_names(axis_name))
    axes = set(getattr(mesh, "axis_names", ()))
    return bool(axes) and names == axes == set(getattr(mesh, "manual_axes", ()))


def allreduce(values: Sequence, op: str, axis_name, processes: int, reduce_across: Callable,
              scale: float = 1.0, reduce_in_runtime: Callable | None = None) -> list:
    """`values` reduced over the named devices and every process. `reduce_across(pieces,
    op, postscale)` reduces a list of per-device pieces across the processes as one request,
    multiplying the result by `postscale` (an average over P x N divides by P there and by
    N through the postscale); `scale` is what it multiplies by besides (prescale x postscale).
    `reduce_in_runtime(values, op, postscale, axes, n)`: one request that the runtime reduces
    over the n devices of `axes` too, used where they are the whole CPU mesh (_in_runtime).

    Differentiates as lax.psum over a global mesh of the P x N devices: each device's
    cotangent is the result's (times the scaling, / P x N for an average).
    """
    values = list(values)
    runtime = reduce_in_runtime is not None and _whole_cpu_mesh(axis_name)

    def forward(vs):
        if runtime:
            return _in_runtime(vs, op, axis_name, processes, reduce_in_runtime)
        return _allreduce(vs, op, axis_name, processes, reduce_across)

    if op not in ("sum", "average"):
        return forward(values)
    factor = scale / (processes * axis_size(axis_name) if op == "average" else 1)
    reduce = jax.custom_vjp(forward)
    reduce.defvjp(lambda vs: (forward(vs), vs),
                  lambda vs, cts: ([_cotangent(c, v, factor, axis_name) for c, v in zip(cts, vs)],))
    return reduce(values)


def allgather(values: Sequence, axis_name, gather_across: Callable, position) -> list:
    """Every device's value concatenated along axis 0 in global device order (process-major):
    each device's value crosses processes once, then the devices gather locally.
    `position()`: this device's global position (rank x N + index), for the gradient.

    Differentiates as lax.all_gather (tiled) over a global mesh: a device's cotangent is its
    own block of the result's."""
    values = list(values)

    def forward(vs):
        gathered = gather_across(vs)  # (P * rows, ...): position i of every process
        out = []
        for v, g in zip(vs, gathered):
            rows = v.shape[0] if v.ndim else 1
            per_process = g.reshape(-1, rows, *v.shape[1:])
            local = _gathered(per_process, axis_name, axis=1, tiled=False)  # (P, N, rows, ...)
            out.append(local.reshape(-1, *v.shape[1:]))
        return out

    def backward(vs, cts):
        index = position()
        out = []
        for v, c in zip(vs, cts):
            rows = v.shape[0] if v.ndim else 1
            block = lax.dynamic_slice_in_dim(c, index * rows, rows).reshape(v.shape)
            out.append(_cotangent(block, v, 1.0, axis_name))
        return (out,)

    gather = jax.custom_vjp(forward)
    gather.defvjp(lambda vs: (forward(vs), vs), backward)
    return gather(values)


def reducescatter(values: Sequence, op: str, axis_name, processes: int, scatter_across: Callable) -> list:
    """Device (p, i)'s block p * N + i of the first dimension of the reduction over every
    device: reduced over the named devices block-row by block-row, then across processes
    (`scatter_across(blocks, op, postscale)`, one request)."""
    n = axis_size(axis_name)
    blocks = []
    for v in values:
        if v.ndim == 0 or v.shape[0] % (n * processes):
            raise ValueError(
                f"jaxcache.reducescatter: with axis_name the first dimension must divide into "
                f"{processes} processes x {n} devices = {n * processes} blocks; got shape {tuple(v.shape)}")
        per = v.shape[0] // (n * processes)
        grid = v.reshape(processes, n, per, *v.shape[1:])
        blocks.append(_local_block(grid, op, axis_name).reshape(processes * per, *v.shape[1:]))
    across = _across_op(op, [b.dtype for b in blocks])
    out = scatter_across(blocks, across, 1.0 / n if across == "average" else 1.0)
    if op == "average" and across == "sum":
        out = [_divided(o, n * processes) for o in out]
    return out


def _local_block(grid, op: str, axis_name):
    """(P, per, ...): for every process p, block (p, i) of the reduction over the named devices."""
    if op in ("sum", "average"):
        return lax.psum_scatter(grid, axis_name, scatter_dimension=1, tiled=False)
    i = lax.axis_index(axis_name)
    if op in ("min", "max"):
        reduced = lax.pmin(grid, axis_name) if op == "min" else lax.pmax(grid, axis_name)
    else:
        reduced = jnp.prod(lax.all_gather(grid, axis_name), axis=0).astype(grid.dtype)
    return lax.dynamic_index_in_dim(reduced, i, axis=1, keepdims=False)
