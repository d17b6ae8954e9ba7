"""Deterministic collective names.

Names are the keys that match collectives across ranks, so automatic names are
derived only from what every rank shares: the user's call site, the pytree
path, and the order of calls within one trace -- never addresses or timing.
"""

from __future__ import annotations

import collections
import os
import sys
import weakref

import jax

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_per_trace: "weakref.WeakKeyDictionary[object, collections.Counter]" = weakref.WeakKeyDictionary()


def call_site() -> str:
    """file:line:function of the first caller outside the jaxcache package."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame = frame.f_back
    if frame is None:
        return "unknown"
    code = frame.f_code
    filename = os.path.basename(code.co_filename)
    if filename.startswith("__autograph_generated_file"):
        # tf.function's AutoGraph rewrote the caller into a module with a random file name;
        # its content (hence the line) is the same on every rank running the same source.
        filename = "autograph"
    return f"{filename}:{frame.f_lineno}:{code.co_name}"


def collective_name(kind: str, name: str | None, sample) -> str:
    """User name if given; else kind@call-site, plus #k under a trace (k-th call of the site)."""
    if name is not None:
        return name
    base = f"{kind}@{call_site()}"
    if not isinstance(sample, jax.core.Tracer):
        # Eager calls complete before they return, so one name per call site suffices
        # (and stays in the response cache across loop iterations).
        return base
    counter = _per_trace.setdefault(sample._trace, collections.Counter())
    index = counter[base]
    counter[base] += 1
    return f"{base}#{index}"


def derived(name: str, suffix: str) -> str:
    """Name of a collective derived from another (autodiff tangents and transposes)."""
    return f"{name}/{suffix}"
