"""optax integration: reduce gradients across ranks as one step of an optimizer chain.

    import optax
    import jaxcache
    from jaxcache.optax import allreduce_gradients

    tx = optax.chain(allreduce_gradients(), optax.adam(1e-3))

`allreduce_gradients` comes first in the chain so that every later
transformation (clipping, Adam's moments, weight decay) sees the same,
averaged gradient on every rank. It works eagerly and inside `jax.jit`.
"""

from __future__ import annotations

try:
    import optax as _optax
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "jaxcache.optax needs optax, which is not installed: pip install optax "
        "(or pip install 'jaxcache[optax]')"
    ) from e

from .ops.grouped_allreduce import grouped_allreduce
from .ops.validation import check_op

__all__ = ["allreduce_gradients"]

_GROUPING_KEYS = ("name", "num_groups", "group_bytes", "groups", "prescale", "postscale", "axis_name")


def allreduce_gradients(op: str = "average", **grouping) -> _optax.GradientTransformation:
    """An optax transformation that reduces the update pytree across all ranks.

    The updates are reduced with `jaxcache.grouped_allreduce(updates, op, **grouping)`:
    `grouping` takes its keyword arguments `name`, `num_groups`, `group_bytes`,
    `groups`, `prescale`, `postscale` and `axis_name` (default: groups of at most
    JAXCACHE_FUSION_THRESHOLD bytes, names derived from the call site). With
    `axis_name` (a step inside shard_map over local devices), the average is over
    every rank's devices. The transformation keeps no state (`optax.EmptyState`).
    """
    op = check_op(op, "optax.allreduce_gradients")
    unknown = sorted(set(grouping) - set(_GROUPING_KEYS))
    if unknown:
        raise TypeError(
            f"jaxcache.optax.allreduce_gradients: unexpected keyword argument(s) "
            f"{', '.join(unknown)}; accepted: op, {', '.join(_GROUPING_KEYS)}"
        )

    def init_fn(params):
        del params
        return _optax.EmptyState()

    def update_fn(updates, state, params=None):
        del params
        return grouped_allreduce(updates, op, **grouping), state

    return _optax.GradientTransformation(init_fn, update_fn)
