"""barrier: returns on no rank (of the process set) before every rank has reached it.

Eagerly it waits where it is called. Under `jit` it is a custom call with no operands and no
results that XLA keeps (a side effect) and that JAX keeps in the program (an unordered
effect, so `jax.effects_barrier()` waits for it): every run of the program is one barrier,
negotiated by name like any collective. Like every jaxcache collective it is not ordered
with the program's other operations; mpi4jax orders its barrier with its other operations
through its token.
"""

from __future__ import annotations

from jax._src import effects
from jax.extend.core import Primitive

from .._ext import ext
from ..errors import raise_for_status
from . import call, lowering


class Synchronization(effects.Effect):
    """A barrier: no value flows out, yet it must run."""

    def __repr__(self):
        return "Synchronization"


SYNCHRONIZATION = Synchronization()
# Allowed wherever a collective is (control flow, custom derivatives, remat: a barrier run
# again in a backward pass runs again on every rank).
for _kind in (effects.lowerable_effects, effects.control_flow_allowed_effects,
              effects.custom_derivatives_allowed_effects, effects.remat_allowed_effects):
    _kind.add_type(Synchronization)

barrier_p = Primitive("jaxcache_barrier")
barrier_p.multiple_results = True


def _abstract_eval(*, name, auto_name, world_size, process_set):
    return [], {SYNCHRONIZATION}


def _impl(*, name, auto_name, world_size, process_set):
    status, message = ext.barrier(name, process_set).wait()
    raise_for_status(status, message)
    return []


def _lowering(ctx, *, name, auto_name, world_size, process_set):
    return lowering.ffi_call(ctx, "jaxcache_barrier", [], name=name, auto_name=auto_name, world_size=world_size,
                             process_set=process_set, side_effect=True)


barrier_p.def_impl(_impl)
barrier_p.def_effectful_abstract_eval(_abstract_eval)
lowering.register(barrier_p, _lowering, cacheable=False)


NAME = "jaxcache.barrier"


def barrier(name: str = NAME, *, process_set=None, comm=None) -> None:
    """Returns once every rank (of `process_set`) has reached a barrier of this name (one
    name by default, so barriers at different lines of code meet); inside `jit`, each run
    of the program waits there."""
    ps = call.begin("barrier", name, process_set, comm)
    barrier_p.bind(name=name, auto_name=False, world_size=ps.size, process_set=ps.id)
