"""Whole-model helpers: broadcast_parameters, broadcast_optimizer_state, broadcast_object."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

from .. import objects
from .. import runtime as _runtime
from ..compat.process_sets import global_process_set
from . import checks, requests, submitters
from ..protocol import Kind


def _digest(items: list[str]) -> int:
    h = hashlib.sha256("\n".join(items).encode()).digest()
    return int.from_bytes(h[:8], "little", signed=True)


def agree(tag: str, items: list[str], fn: str, what: str, process_set=global_process_set) -> None:
    """Checks that every rank (of `process_set`) holds the same `items` (in the same order);
    else ValueError on every rank of the set.

    One small allgather. On a mismatch every rank compares its items with the set's first
    rank's and names the differences, so the error is raised on every rank with a useful
    message (no rank goes on to submit collectives the others never match, which would hang).
    """
    ps = checks.set_of(process_set, fn)
    mine = torch.tensor([len(items), _digest(items)], dtype=torch.int64)
    gathered = requests.synchronize(submitters.allgather_submit([mine], f"torch.agree/{tag}", fn, ps)).view(-1, 2)
    rows = {tuple(r) for r in gathered.tolist()}
    if len(rows) == 1:
        return
    first, me = ps.ranks[0], _runtime.rank()  # global ranks
    reference = objects.broadcast(items if me == first else None, first, f"torch.agree/{tag}.items",
                                  f"torch.{fn}", process_set)
    missing = [x for x in reference if x not in set(items)]
    extra = [x for x in items if x not in set(reference)]
    differing = [ps.ranks[r] for r, row in enumerate(gathered.tolist())
                 if tuple(row) != tuple(gathered[0].tolist())]
    detail = ""
    if missing or extra:
        detail = (f"; this rank (rank {me}) lacks {missing[:5]} and has extra {extra[:5]} "
                  f"compared with rank {first}")
    elif items != reference:
        detail = f"; this rank (rank {me}) has them in a different order than rank {first}"
    raise ValueError(
        f"jaxcache.torch.{fn}: ranks disagree on {what} (ranks {differing} differ from rank {first}; "
        f"counts per rank {dict(zip(ps.ranks, (int(r[0]) for r in gathered.tolist())))}){detail}"
    )


def broadcast_object(obj=None, root_rank: int = 0, name: str | None = None,
                     process_set=global_process_set):
    """`root_rank`'s picklable `obj` on every rank of `process_set` (jaxcache.objects, shared by
    every bridge; `root_rank` is a global rank).

    The default name is fixed, so ranks may call it from different lines (the root in one
    branch, the others in another).
    """
    return objects.broadcast(obj, root_rank, name or "torch.broadcast_object", "torch.broadcast_object",
                             process_set)


def allgather_object(obj, name: str | None = None, process_set=global_process_set) -> list:
    """Every rank's picklable `obj`, as a list in rank order (of `process_set`; objects may
    differ in size). `process_set` is jaxcache's addition (Horovod's torch version lacks it)."""
    return objects.allgather(obj, name or "torch.allgather_object", "torch.allgather_object",
                             process_set)


def _signature(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)}:{str(t.dtype).replace('torch.', '')}"


def _named_items(params, fn: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, torch.nn.Module):
        params = params.state_dict()
    if isinstance(params, Mapping):
        items = list(params.items())
    else:
        try:
            items = list(params)
        except TypeError:
            raise TypeError(
                f"jaxcache.torch.{fn}: params must be a state_dict (mapping name -> tensor), a module "
                f"or an iterable of (name, tensor) pairs such as named_parameters(); got "
                f"{type(params).__name__}"
            ) from None
        if items and all(isinstance(item, torch.Tensor) for item in items):
            # model.parameters(): positional names, as Horovod accepts a list of parameters.
            items = [(f"param.{i:06d}", t) for i, t in enumerate(items)]
        for i, item in enumerate(items):
            if not (isinstance(item, tuple) and len(item) == 2):
                raise TypeError(
                    f"jaxcache.torch.{fn}: item {i} of params is a {type(item).__name__}, not a "
                    "(name, tensor) pair; pass named_parameters(), parameters() or a state_dict"
                )
    seen = set()
    for key, value in items:
        if not isinstance(key, str):
            raise TypeError(f"jaxcache.torch.{fn}: parameter names must be str, got {key!r}")
        if key in seen:
            raise ValueError(f"jaxcache.torch.{fn}: parameter name {key!r} appears twice")
        seen.add(key)
        checks.check_tensor(value, fn, f"parameter {key!r}")
    return sorted(items, key=lambda kv: kv[0])


def broadcast_parameters(params, root_rank: int = 0, *, process_set=global_process_set) -> None:
    """Overwrites, in place, every tensor of `params` with `root_rank`'s value.

    params: a state_dict (model.state_dict(): parameters and buffers), a module, an iterable
    of (name, tensor) pairs (model.named_parameters()) or of tensors (model.parameters()).
    Every rank must pass the same names, shapes and dtypes (checked; a mismatch raises
    ValueError on every rank). `process_set` (jaxcache's addition) limits it to a set;
    `root_rank` is a global rank.
    """
    fn = "broadcast_parameters"
    ps = checks.set_of(process_set, fn)
    root = checks.set_root(root_rank, ps, fn)
    items = _named_items(params, fn)
    agree(fn, [f"{k}:{_signature(v)}" for k, v in items], fn,
          "the parameters to broadcast (names, shapes, dtypes)", process_set)
    handles = [requests.submit(Kind.BROADCAST, f"torch.broadcast_parameters/{k}", [v], inplace=True,
                          root=root, process_set=ps) for k, v in items]
    _synchronize_all(handles)


def _synchronize_all(handles) -> list:
    """Waits for every handle (even after a failure) and raises the first error."""
    results, error = [], None
    for h in handles:
        try:
            results.append(requests.synchronize(h))
        except Exception as e:  # noqa: BLE001 - re-raised below
            results.append(None)
            if error is None:
                error = e
    if error is not None:
        raise error
    return results


class _TensorRef:
    __slots__ = ("index", "shape", "dtype")

    def __init__(self, index: int, shape: tuple, dtype: torch.dtype):
        self.index, self.shape, self.dtype = index, shape, dtype

    def __getstate__(self):
        return (self.index, self.shape, str(self.dtype).replace("torch.", ""))

    def __setstate__(self, state):
        self.index, self.shape, dtype = state
        self.dtype = getattr(torch, dtype)


def _map_nested(obj, is_leaf, fn):
    """`obj` (nested dicts, lists and tuples) with every leaf `is_leaf` picks replaced by fn(leaf)."""
    if is_leaf(obj):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_nested(v, is_leaf, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_map_nested(v, is_leaf, fn) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def _strip(obj, tensors: list):
    """Replaces every tensor of a nested state by a _TensorRef, collecting the tensors."""
    def ref(t):
        tensors.append(t.detach())
        return _TensorRef(len(tensors) - 1, tuple(t.shape), t.dtype)

    return _map_nested(obj, lambda o: isinstance(o, torch.Tensor), ref)


def _refs(obj, out: list) -> None:
    _map_nested(obj, lambda o: isinstance(o, _TensorRef), out.append)


def _fill(obj, tensors: list):
    return _map_nested(obj, lambda o: isinstance(o, _TensorRef), lambda r: tensors[r.index])


def broadcast_optimizer_state(optimizer, root_rank: int = 0, model=None, *,
                              process_set=global_process_set) -> None:
    """Gives every rank `root_rank`'s optimizer state and hyperparameters (load_state_dict).

    Works whether or not the optimizers have stepped yet (the state's structure comes from
    the root; no zero-gradient step is taken). Every rank's optimizer must hold the same
    parameters (checked). `model` (Horovod's hint for sparse parameters) is not needed.
    `process_set` (jaxcache's addition) limits it to a set; `root_rank` is a global rank.
    """
    fn = "broadcast_optimizer_state"
    _runtime.require_initialized(f"jaxcache.torch.{fn}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"jaxcache.torch.broadcast_optimizer_state: expected a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}"
        )
    ps = checks.set_of(process_set, fn)
    root = checks.set_root(root_rank, ps, fn)
    layout = [f"{g}.{i}:{_signature(p)}" for g, group in enumerate(optimizer.param_groups)
              for i, p in enumerate(group["params"])]
    agree(fn, layout, fn, "the optimizer's parameters (groups, shapes, dtypes)", process_set)
    is_root = ps.rank == root
    tensors: list[torch.Tensor] = []
    skeleton = _strip(optimizer.state_dict(), tensors) if is_root else None
    skeleton = broadcast_object(skeleton, root_rank, name="torch.broadcast_optimizer_state.skeleton",
                                process_set=process_set)
    refs: list[_TensorRef] = []
    _refs(skeleton, refs)
    refs.sort(key=lambda r: r.index)
    if is_root:
        buffers = [t.to(device="cpu", memory_format=torch.contiguous_format, copy=True) for t in tensors]
    else:
        buffers = [torch.empty(r.shape, dtype=r.dtype) for r in refs]
    for i, b in enumerate(buffers):
        checks.check_tensor(b, "broadcast_optimizer_state", f"optimizer state tensor {i}")
    handles = [requests.submit(Kind.BROADCAST, f"torch.broadcast_optimizer_state/{i}", [b],
                          inplace=True, root=root, process_set=ps) for i, b in enumerate(buffers)]
    _synchronize_all(handles)
    if not is_root:
        optimizer.load_state_dict(_fill(skeleton, buffers))


__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object"]
