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
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import weakref

from jax._src.lib.mlir import ir

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Per lowered module: (process-local program number, program name, instances per name).
_programs: "weakref.WeakKeyDictionary[ir.Module, tuple[int, str, collections.Counter]]" = (
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


def _program(module: ir.Module) -> tuple[int, str, collections.Counter]:
    entry = _programs.get(module)
    if entry is None:
        symbol = module.operation.attributes["sym_name"] if "sym_name" in module.operation.attributes else None
        program_name = ir.StringAttr(symbol).value if symbol is not None else "program"
        entry = _programs[module] = (next(_program_numbers), program_name, collections.Counter())
    return entry


def lowered(ctx, name: str, auto_name: bool) -> dict:
    """The `name` and `program` attributes of one lowered instance (see the module doc)."""
    number, program_name, counts = _program(ctx.module_context.module)
    if auto_name:
        name = f"{program_name}:{name}"
    k = counts[name]
    counts[name] += 1
    return {"name": name if k == 0 else f"{name}#{k}", "program": number}
