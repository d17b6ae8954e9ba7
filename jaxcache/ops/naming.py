"""Deterministic collective names.

Names are the keys that match collectives across ranks, so they are derived only from
what every rank running the same code shares -- never from addresses or timing:

1. At trace time, a collective is named by the user (`name=`) or automatically after its
   call site: `allreduce@train.py:42:step`.
2. At lowering time, the k-th instance of a name in one program becomes `name#k` (k >= 1),
   in lowering order. This separates the copies that transformations make of one call
   (vmap, remat, cond branches, scan unrolling, several calls of a helper), whatever the
   trace they came from. Automatic names are also prefixed with the program's name
   (`jit_step:allreduce@...`), so two programs never share cache entries.
3. When JAX lowers a function once and calls it from several places (a jitted function
   called twice inside another), XLA instantiates each call's custom call separately; the
   runtime appends `~d` to the d-th instance (xla_ext/ffi_handlers.h).

A program thus has unique, stable names from step to step (the cache hits), identical on
every rank. Eager calls complete before they return, so one name per call site suffices.

The bridges follow the same rule -- an automatic name is `kind@call-site`, and the k-th
instance of it alive at once gets `#k` -- where "alive at once" means: in one tf.function
graph (TensorFlow, as in one lowered program here), or submitted and not yet synchronized
(PyTorch's asynchronous handles: the smallest k free). Their names carry the framework
(`torch.allreduce@...`, `tf.allreduce@...`). An automatic name is an `Automatic` string:
submitted again while in flight it queues, where a name the user repeats is refused
(Horovod's rule).
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import threading
import weakref

from jax._src.lib.mlir import ir

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



class Automatic(str):
    """A name jaxcache derived from a call site (not given by the user)."""


class Instances:
    """The k-th instance of a name in one program or graph: `name`, then `name#1`, ..."""

    def __init__(self):
        self._counts = collections.Counter()

    def next(self, name: str) -> str:
        k = self._counts[name]
        self._counts[name] += 1
        return name if k == 0 else f"{name}#{k}"


class InFlight:
    """Names alive at once in one scope (a process set): `name#k`, k the smallest free."""

    def __init__(self):
        self._lock = threading.Lock()
        self._taken: set[tuple[object, str]] = set()

    def take(self, scope: object, base: str) -> Automatic:
        with self._lock:
            name, k = base, 0
            while (scope, name) in self._taken:
                k += 1
                name = f"{base}#{k}"
            self._taken.add((scope, name))
        return Automatic(name)

    def hold(self, scope: object, name: str) -> bool:
        """Takes `name` as it is; False when it is taken already."""
        with self._lock:
            if (scope, name) in self._taken:
                return False
            self._taken.add((scope, name))
            return True

    def release(self, scope: object, name: str) -> None:
        with self._lock:
            self._taken.discard((scope, name))


# Per lowered module: (process-local program number, program name, instances of names).
_programs: "weakref.WeakKeyDictionary[ir.Module, tuple[int, str, Instances]]" = (
    weakref.WeakKeyDictionary()
)
_program_numbers = itertools.count(1)


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


def collective_name(kind: str, name: str | None) -> tuple[str, bool]:
    """(name, automatic): the user's name, else kind@call-site."""
    if name is not None:
        return name, False
    return f"{kind}@{call_site()}", True


def derived(name: str, suffix: str) -> str:
    """Name of a collective derived from another (autodiff tangents and transposes)."""
    return f"{name}/{suffix}"


def _program(module: ir.Module) -> tuple[int, str, Instances]:
    entry = _programs.get(module)
    if entry is None:
        symbol = module.operation.attributes["sym_name"] if "sym_name" in module.operation.attributes else None
        program_name = ir.StringAttr(symbol).value if symbol is not None else "program"
        entry = _programs[module] = (next(_program_numbers), program_name, Instances())
    return entry


def lowered(ctx, name: str, auto_name: bool) -> dict:
    """The `name` and `program` attributes of one lowered instance (see the module doc)."""
    number, program_name, instances = _program(ctx.module_context.module)
    if auto_name:
        name = f"{program_name}:{name}"
    return {"name": instances.next(name), "program": number}
