"""THE hooks for Horovod names whose runtime support has not landed yet.

Every pending name in jaxcache.torch / jaxcache.tensorflow calls exactly one function
here, after validating its arguments. When the runtime feature lands, replace the body
of that function (and move the name from "pending" to "same" in docs/horovod.md).

    join             issue 13 (collective vocabulary)
    reducescatter    issue 13
    alltoall         issue 13
    uneven_allgather issue 13 (allgather with a different first dimension per rank)
    process_sets     issue 14
    timeline         no issue yet (start/stop the timeline while the runtime runs)
"""

from __future__ import annotations

import re

import jaxcache


class PendingFeatureError(NotImplementedError):
    """A Horovod name whose jaxcache runtime support has not landed yet."""


def _pending(what: str, issue: str) -> PendingFeatureError:
    return PendingFeatureError(f"jaxcache: {what} arrives with {issue}")


def join(fn: str) -> int:
    """Marks this rank as out of data; returns the rank that joined last."""
    raise _pending(f"{fn} (ranks running out of data while others continue)",
                   "issue 13 (collective vocabulary); until then give every rank the same number "
                   "of batches (drop or pad the last one)")


def reducescatter(fn: str):
    raise _pending(f"{fn}", "issue 13 (collective vocabulary); until then allreduce and slice "
                   "this rank's rows")


def alltoall(fn: str):
    raise _pending(f"{fn}", "issue 13 (collective vocabulary)")


def is_uneven_first_dim(message: str) -> bool:
    """True when a mismatch message's shapes differ in their first dimension only."""
    shapes = re.findall(r"ranks? [\d, ]+: \(([\d, ]*)\)", message)
    if "shape" not in message or len(shapes) < 2:
        return False
    dims = [tuple(int(d) for d in s.replace(" ", "").split(",") if d) for s in shapes]
    return len({len(d) for d in dims}) == 1 and len({d[1:] for d in dims}) == 1 and all(dims)


def uneven_allgather(fn: str, error: BaseException):
    """Called when the runtime refused an allgather whose first dimensions differ across ranks."""
    raise _pending(f"{fn} with a different first dimension per rank ({error})",
                   "issue 13 (collective vocabulary); until then pad to a common size "
                   "(allgather_object handles Python objects of any size)") from error


def process_sets(fn: str):
    raise _pending(f"{fn} (process sets other than global_process_set)", "issue 14 (process sets)")


def timeline(fn: str):
    raise _pending(f"{fn} (starting or stopping the timeline while the runtime runs)",
                   "a runtime change not scheduled yet; until then set JAXCACHE_TIMELINE=path "
                   "(and JAXCACHE_TIMELINE_MARK_CYCLES=1) before init(), or use "
                   "`python -m jaxcache.run --timeline path`")
