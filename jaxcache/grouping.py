"""Splitting a gradient pytree's leaves into groups; each group is reduced as one request."""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import jax

from . import session

KeyPath = tuple


def _path_str(path: KeyPath) -> str:
    return jax.tree_util.keystr(path)


def by_bytes(sizes: Sequence[int], limit: int) -> list[list[int]]:
    """Leaves in reverse order (last layers' gradients are ready first in backward),
    packed into consecutive groups of at most `limit` bytes (a larger leaf stands alone)."""
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in reversed(range(len(sizes))):
        if current and used + sizes[i] > limit:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += sizes[i]
    if current:
        groups.append(current)
    return groups


def contiguous(n: int, count: int) -> list[list[int]]:
    """Indices 0..n-1 in `count` contiguous groups whose lengths differ by at most one."""
    count = min(count, n)
    base, extra = divmod(n, count) if count else (0, 0)
    out, start = [], 0
    for g in range(count):
        stop = start + base + (1 if g < extra else 0)
        out.append(list(range(start, stop)))
        start = stop
    return out


def by_count(sizes: Sequence[int], count: int) -> list[list[int]]:
    """`count` consecutive groups (reverse order) with balanced bytes."""
    if count < 1:
        raise ValueError(f"jaxcache.grouped_allreduce: num_groups must be >= 1, got {count}")
    order = list(reversed(range(len(sizes))))
    count = min(count, len(order))
    groups: list[list[int]] = []
    remaining = float(sum(sizes))
    start = 0
    for g in range(count):
        groups_left = count - g
        if groups_left == 1:
            groups.append(order[start:])
            break
        target = remaining / groups_left
        end, used = start, 0
        # Take leaves while that brings the group closer to its share, leaving
        # at least one leaf for each later group.
        while end < len(order) - (groups_left - 1):
            s = sizes[order[end]]
            if end > start and abs(used + s - target) > abs(used - target):
                break
            used += s
            end += 1
        groups.append(order[start:end])
        remaining -= used
        start = end
    return [g for g in groups if g]


def explicit(paths: Sequence[KeyPath], groups) -> list[list[int]]:
    """`groups` is a list of lists of key paths (tuples or their keystr strings), or a
    callable from key path to a group id (None = its own group). Unnamed leaves stand alone."""
    assigned: dict[Hashable, list[int]] = {}
    order: list[Hashable] = []
    singles: list[list[int]] = []
    if callable(groups):
        for i, p in enumerate(paths):
            gid = groups(p)
            if gid is None:
                singles.append([i])
                continue
            if gid not in assigned:
                assigned[gid] = []
                order.append(gid)
            assigned[gid].append(i)
        return [assigned[g] for g in order] + singles
    if not isinstance(groups, (list, tuple)):
        raise TypeError("jaxcache.grouped_allreduce: groups must be a list of lists of key paths or a callable")
    index = {}
    for i, p in enumerate(paths):
        index[p] = i
        index[_path_str(p)] = i
    seen: set[int] = set()
    out: list[list[int]] = []
    for g, members in enumerate(groups):
        group = []
        for m in members:
            if m not in index:
                raise ValueError(
                    f"jaxcache.grouped_allreduce: groups[{g}] names {m!r}, which is not a leaf of "
                    f"the tree (leaves: {', '.join(_path_str(p) for p in paths[:8])}"
                    f"{', ...' if len(paths) > 8 else ''})"
                )
            i = index[m]
            if i in seen:
                raise ValueError(f"jaxcache.grouped_allreduce: leaf {_path_str(paths[i])} is in two groups")
            seen.add(i)
            group.append(i)
        if group:
            out.append(group)
    out += [[i] for i in range(len(paths)) if i not in seen]
    return out


def plan(paths: Sequence[KeyPath], sizes: Sequence[int], *, num_groups: int | None,
         group_bytes: int | None, groups, default_bytes: int) -> list[list[int]]:
    chosen = [k for k, v in (("num_groups", num_groups), ("group_bytes", group_bytes),
                             ("groups", groups)) if v is not None]
    if len(chosen) > 1:
        raise ValueError(f"jaxcache.grouped_allreduce: pass at most one of {', '.join(chosen)}")
    if num_groups is not None:
        return by_count(sizes, int(num_groups))
    if group_bytes is not None:
        if group_bytes < 1:
            raise ValueError(f"jaxcache.grouped_allreduce: group_bytes must be >= 1, got {group_bytes}")
        return by_bytes(sizes, int(group_bytes))
    if groups is not None:
        return explicit(paths, groups)
    return by_bytes(sizes, default_bytes)


def run_groups(named: tuple[str, bool], paths: Sequence[KeyPath], values: Sequence, treedef,
               per_group: Callable[[list, str, bool], Sequence], *, num_groups: int | None,
               group_bytes: int | None, groups):
    """The grouped collectives' shared frame: plans the groups (by default at most
    JAXCACHE_FUSION_THRESHOLD bytes each), runs `per_group(values, name, automatic)` once
    per group (one request each, named `base/{g}of{n}` after `named` = (base, automatic)),
    and puts the results back in the tree's order (a tree without arrays comes back as is)."""
    if not values:
        return jax.tree_util.tree_unflatten(treedef, [])
    base, auto = named
    default_bytes = session.settings().fusion_threshold
    sizes = [v.size * v.dtype.itemsize for v in values]
    chosen = plan(paths, sizes, num_groups=num_groups, group_bytes=group_bytes, groups=groups,
                  default_bytes=default_bytes)
    out = [None] * len(values)
    for g, members in enumerate(chosen):
        results = per_group([values[i] for i in members], f"{base}/{g}of{len(chosen)}", auto)
        for i, r in zip(members, results):
            out[i] = r
    return jax.tree_util.tree_unflatten(treedef, out)
