"""Horovod's process-set API for the bridges: the very objects of jaxcache.process_sets.

`hvd.ProcessSet`, `hvd.global_process_set`, `hvd.add_process_set` and
`hvd.remove_process_set` ARE jaxcache's, so a set registered through any API (JAX, torch,
TensorFlow) works in all of them. `resolve` is what every bridge collective calls on its
`process_set=` argument.
"""

from __future__ import annotations

from .. import runtime as _runtime
from ..process_sets import (  # noqa: F401  (re-exported under Horovod's names)
    ProcessSet,
    Resolved,
    add_process_set,
    global_process_set,
    registered,
    remove_process_set,
    set_root,
)
from ..process_sets import resolve as _resolve


def resolve(process_set, fn: str, member: bool = True) -> Resolved:
    """The registered set a bridge call names (`fn`, e.g. 'torch.allreduce', appears in errors).

    With `member`, a rank outside the set gets a ValueError naming the set and its ranks.
    """
    _runtime.require_initialized(f"jaxcache.{fn}")
    return _resolve(process_set, fn, member)
