"""THE hooks for Horovod names whose runtime support has not landed yet.

Every pending name in jaxcache.torch / jaxcache.tensorflow calls exactly one function
here, after validating its arguments. When the runtime feature lands, replace the body
of that function (and move the name from "pending" to "same" in docs/horovod.md).

    timeline         no issue yet (start/stop the timeline while the runtime runs)
"""

from __future__ import annotations


class PendingFeatureError(NotImplementedError):
    """A Horovod name whose jaxcache runtime support has not landed yet."""


def _pending(what: str, issue: str) -> PendingFeatureError:
    return PendingFeatureError(f"jaxcache: {what} arrives with {issue}")


def timeline(fn: str):
    raise _pending(f"{fn} (starting or stopping the timeline while the runtime runs)",
                   "a runtime change not scheduled yet; until then set JAXCACHE_TIMELINE=path "
                   "(and JAXCACHE_TIMELINE_MARK_CYCLES=1) before init(), or use "
                   "`python -m jaxcache.run --timeline path`")
