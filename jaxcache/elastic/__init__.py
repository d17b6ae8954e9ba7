"""Elastic training: jobs that survive lost workers and grow or shrink with their hosts
(Horovod's ``hvd.elastic`` API; docs/elastic.md).

    import jaxcache, jaxcache.elastic as elastic
    jaxcache.init()
    state = elastic.State(params=params, opt_state=opt_state, epoch=0, batch=0)

    @elastic.run
    def train(state):
        while state.epoch < epochs:
            ...
            state.commit()

    train(state)

Started by ``python -m jaxcache.run`` with elastic flags (``--min-np``, ``--max-np``,
``--host-discovery-script``, ...), the job is restarted from the last commit on the hosts
that are left (a worker raised or died) or that are now available (hosts added or removed).
"""

from __future__ import annotations

from .exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .runner import run
from .state import ObjectState
from .state import State as BaseState

# jaxcache's own State: keyword values, Python objects and pytrees of JAX arrays.
State = ObjectState

__all__ = ["run", "State", "ObjectState", "BaseState", "HorovodInternalError", "HostsUpdatedInterrupt"]
