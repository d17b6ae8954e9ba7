"""Collectives in a jitted function of sharded arrays: each device works on its own shard.

Outside `shard_map`, XLA partitions a program over the devices its arrays are sharded on.
A custom call XLA knows nothing about would get its whole operand on every device (XLA
gathers it first) and a replicated result. jaxcache's collectives instead say how they
partition (jax's `custom_partitioning`): the operand keeps its sharding (beyond the first
dimension for the collectives that change it: allgather, reducescatter, alltoall, gather,
scatter), each device runs the collective on its own shard, and the runtime pairs the
shards by device position (placement.py, xla_ext/device_parts.h). The result has the
operand's sharding.

Where devices hold copies of one shard (a replicated array, or one sharded over some mesh
axes only), an elementwise collective (allreduce, broadcast, reduce, scan) splits the shard
among its copies: each copy's device sends and reduces 1/R of it across processes, then the
devices gather the pieces (XLA), so that no byte crosses processes twice. docs/devices.md.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import jax.numpy as jnp
from jax import lax
from jax.experimental.custom_partitioning import SdyShardingRule, custom_partitioning
from jax.interpreters import mlir
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from . import naming

# The one axis of the mesh the partitioned call runs over: the program's devices in order.
AXIS = "jaxcache_devices"

# Collectives whose result has the operand's shape, element by element.
ELEMENTWISE = frozenset({"jaxcache_allreduce", "jaxcache_broadcast", "jaxcache_reduce", "jaxcache_scan",
                         "jaxcache_mpi4jax_allreduce"})


def lower(primitive, ctx, args, params: dict):
    """Lowers `primitive` (bound with `params`) as a call XLA partitions shard by shard."""
    resolved = naming.lowered(ctx, params["name"], params["auto_name"])
    params = dict(params, name=resolved["name"], auto_name=False)
    devices = tuple(ctx.module_context.axis_context.device_assignment)
    call = _partitioned(primitive, params, devices)
    return mlir.lower_fun(call, multiple_results=True)(ctx, *args)


def _partitioned(primitive, params: dict, devices: tuple):
    elementwise = primitive.name in ELEMENTWISE
    mesh = Mesh(np.asarray(devices, dtype=object), (AXIS,))

    @custom_partitioning
    def call(*xs):
        return tuple(primitive.bind(*xs, **params))

    def partition(_mesh, arg_shapes, result_shapes):
        shardings = tuple(_sharding(a, mesh, elementwise) for a in arg_shapes)
        copies = [_copies(a, devices) if elementwise else None for a in arg_shapes]

        def lower_shard(*xs):
            pieces = [x if c is None else c.piece(x) for x, c in zip(xs, copies)]
            outs = primitive.bind(*pieces, **params)
            return tuple(o if c is None else c.whole(o, x) for o, x, c in zip(outs, xs, copies))

        return mesh, lower_shard, shardings, shardings

    def infer(_mesh, arg_shapes, result_shapes):
        return tuple(_sharding(a, mesh, elementwise) for a in arg_shapes)

    call.def_partition(partition=partition, infer_sharding_from_operands=infer,
                       sharding_rule=_rule(primitive, params, elementwise))
    return call


def _sharding(shape, mesh: Mesh, elementwise: bool):
    """The sharding an operand keeps (and its result gets): its own for an elementwise
    collective; otherwise its own with the first dimension whole (replicated when it cannot
    be expressed that way)."""
    sharding = shape.sharding
    if elementwise:
        return sharding
    if len(shape.shape) == 0 or sharding.shard_shape(shape.shape)[0] == shape.shape[0]:
        return sharding if len(shape.shape) else NamedSharding(mesh, PartitionSpec())
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec(None, *tuple(sharding.spec)[1:]))
    return NamedSharding(mesh, PartitionSpec())


def _rule(primitive, params: dict, elementwise: bool):
    """Shardy's rule: every dimension passes through, except the first dimension of a
    collective that changes it (allgather...), which must be whole."""

    def rule(_mesh, operand_types, result_types):
        from jax._src.lib.mlir import ir

        operands, results, whole = [], [], []
        for i, (o, r) in enumerate(zip(operand_types, result_types)):
            o_rank, r_rank = ir.RankedTensorType(o).rank, ir.RankedTensorType(r).rank
            dims = [f"t{i}d{d}" for d in range(max(o_rank, r_rank))]
            if elementwise:
                operands.append(tuple(dims[:o_rank]))
                results.append(tuple(dims[:r_rank]))
                continue
            first_in, first_out = f"t{i}in", f"t{i}out"
            operands.append(tuple([first_in, *dims[1:o_rank]][:o_rank]))
            results.append(tuple([first_out, *dims[1:r_rank]][:r_rank]))
            whole += [first_in] * (o_rank > 0) + [first_out] * (r_rank > 0)
        return SdyShardingRule(tuple(operands), tuple(results), need_replication_factors=tuple(whole))

    return rule


# Shards smaller than this are not split among their copies: the pieces' gather would cost
# more than the bytes it saves.
SPLIT_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class _Copies:
    """How the devices holding copies of one shard split it: device at position p holds
    copy `index[p]` of its shard; `group[p]` lists the positions of its shard's copies."""

    index: np.ndarray  # (devices,)
    group: np.ndarray  # (devices, copies)

    def piece(self, x):
        """This device's 1/copies of its shard (raveled, zero-padded to equal pieces)."""
        copies = self.group.shape[1]
        n = math.ceil(x.size / copies)
        flat = jnp.pad(jnp.ravel(x), (0, n * copies - x.size))
        k = jnp.asarray(self.index, np.int32)[lax.axis_index(AXIS)]
        return lax.dynamic_slice_in_dim(flat, k * n, n)

    def whole(self, piece, x):
        """The shard again, from the pieces of its copies' devices."""
        pieces = lax.all_gather(piece, AXIS, tiled=False)  # (devices, n): every device's
        mine = jnp.take(pieces, jnp.asarray(self.group, np.int32)[lax.axis_index(AXIS)], axis=0)
        return mine.reshape(-1)[:x.size].reshape(x.shape)


def _copies(shape, devices: tuple) -> _Copies | None:
    """The split of an operand whose shards have copies on several devices; None when each
    shard is on one device, the shard is small, or the copies are uneven."""
    shard = shape.sharding.shard_shape(tuple(shape.shape))
    if math.prod(shard) * np.dtype(shape.dtype).itemsize < SPLIT_BYTES:
        return None
    where = shape.sharding.devices_indices_map(tuple(shape.shape))
    groups: dict = {}
    for position, device in enumerate(devices):
        key = tuple((s.start, s.stop, s.step) for s in where[device])
        groups.setdefault(key, []).append(position)
    sizes = {len(g) for g in groups.values()}
    if len(sizes) != 1 or sizes == {1}:
        return None
    index, group = np.zeros(len(devices), np.int32), np.zeros((len(devices), sizes.pop()), np.int32)
    for members in groups.values():
        for k, position in enumerate(members):
            index[position], group[position] = k, members
    return _Copies(index, group)
