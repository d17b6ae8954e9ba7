"""Horovod's elastic exceptions (horovod.common.exceptions), shared by every bridge."""

from __future__ import annotations

from ..errors import JaxcacheError


# Horovod's HorovodInternalError is one class everywhere; jaxcache's bridges already name
# JaxcacheError so (compat/basics.py). Under jaxcache's elastic driver a lost worker restarts
# the whole job from the last commit (docs/elastic.md), so training code rarely sees it.
HorovodInternalError = JaxcacheError


class HostsUpdatedInterrupt(RuntimeError):
    """The driver found hosts added or removed: raised on every rank at the same commit (or
    ``check_host_updates()``); ``elastic.run`` then restarts the job on the new hosts from
    that commit. ``skip_sync`` is Horovod's field (True when hosts were only added)."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("the job's hosts were updated; restarting on the new hosts from the last commit")
        self.skip_sync = skip_sync
