"""glibc malloc settings for XLA:CPU's buffers, in every jaxcache process, however started.

XLA:CPU allocates every result with malloc. With glibc's defaults a buffer above the
(dynamic) mmap threshold gets a mapping of its own, which the kernel zeroes and faults in
anew on every call; freed memory at the top of the heap goes back to the kernel; and the
arrays that XLA's worker threads allocate sit in per-thread heaps on 4 KiB pages, which
make copies and MPI's shared-memory transfers 2-3x slower than on transparent huge pages
(benchmarks/README.md). Five tunables fix that (``TUNABLES``); their price: freed memory
stays with the process for reuse (up to 1 GiB at the top of the heap), and threads that
allocate at the same time share one heap lock (small blocks come from per-thread caches).

Who applies them:

- the launcher (``python -m jaxcache.run``) puts them in every rank's ``GLIBC_TUNABLES``,
  which glibc reads when the process starts;
- a process started otherwise (plain ``mpirun``, Slurm, a scheduler) gets them from
  ``import jaxcache``: ``mallopt`` for the four that have one, before MPI starts its
  progress thread and jax its worker threads; and, when the runtime loads (``init()``),
  for ``glibc.malloc.hugetlb`` what glibc itself would do -- the main heap grows by
  ``HEAP_RESERVE`` bytes of address space (untouched, so it costs no memory) advised for
  transparent huge pages (``madvise(MADV_HUGEPAGE)``), from which later buffers are
  carved. A thread that allocated before the import keeps a heap of its own, which
  later threads then share in turn with the main heap (MPI's progress thread, when
  ``mpi4py.MPI`` was imported first): import jaxcache first, or use the launcher.

A tunable the user set (in ``GLIBC_TUNABLES`` or through glibc's ``MALLOC_*`` variable)
keeps the user's value; ``JAXCACHE_MALLOC_TUNING=0`` (the launcher's
``--no-malloc-tuning``) leaves the allocator alone. What was done is logged once by
``init()`` on the ``jaxcache`` logger at level INFO, and returned by ``report()``.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

VARIABLE = "JAXCACHE_MALLOC_TUNING"

# tunable -> value
TUNABLES = {
    "glibc.malloc.hugetlb": 1,
    "glibc.malloc.arena_max": 1,
    "glibc.malloc.mmap_max": 0,
    "glibc.malloc.mmap_threshold": 32 << 20,
    "glibc.malloc.trim_threshold": 1 << 30,
}

# glibc's older environment variables for the same tunables.
ENV_ALIASES = {
    "glibc.malloc.arena_max": "MALLOC_ARENA_MAX",
    "glibc.malloc.mmap_max": "MALLOC_MMAP_MAX_",
    "glibc.malloc.mmap_threshold": "MALLOC_MMAP_THRESHOLD_",
    "glibc.malloc.trim_threshold": "MALLOC_TRIM_THRESHOLD_",
}

# Address space the in-process stand-in for hugetlb adds to the heap (below the trim
# threshold, so that it stays).
HEAP_RESERVE = 768 << 20

# glibc's mallopt parameter numbers (<malloc.h>: M_ARENA_MAX, M_MMAP_MAX, M_MMAP_THRESHOLD,
# M_TRIM_THRESHOLD) for the tunables that have one.
_MALLOPT_PARAMS = {
    "glibc.malloc.arena_max": -8,
    "glibc.malloc.mmap_max": -4,
    "glibc.malloc.mmap_threshold": -3,
    "glibc.malloc.trim_threshold": -1,
}

# What tune_process() and advise_heap() did, for report() and init()'s log line.
_done: list[str] = []
_refused: list[str] = []
_kept: list[str] = []
_off = ""  # why nothing was done, when nothing was


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when ``JAXCACHE_MALLOC_TUNING`` turns the settings off (0, false, no, off)."""
    environ = os.environ if environ is None else environ
    return environ.get(VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


def user_settings(environ: Mapping[str, str]) -> set[str]:
    """The tunables the environment sets already (GLIBC_TUNABLES or a MALLOC_* variable)."""
    names = {item.split("=", 1)[0] for item in environ.get("GLIBC_TUNABLES", "").split(":") if item}
    return names | {name for name, alias in ENV_ALIASES.items() if alias in environ}


def launcher_env(environ: Mapping[str, str] | None = None, enabled: bool = True) -> dict[str, str]:
    """GLIBC_TUNABLES for every rank: the user's tunables, plus ours the user did not set
    (nothing when `enabled` is False or off Linux)."""
    environ = os.environ if environ is None else environ
    if not enabled or not sys.platform.startswith("linux"):
        return {}
    current = [item for item in environ.get("GLIBC_TUNABLES", "").split(":") if item]
    taken = user_settings(environ)
    added = [f"{k}={v}" for k, v in TUNABLES.items() if k not in taken]
    return {"GLIBC_TUNABLES": ":".join(current + added)}


def tune_process(environ: Mapping[str, str] | None = None) -> None:
    """Applies, by ``mallopt``, the four tunables that have one and the environment did not
    set. Runs at ``import jaxcache``: before mpi4py starts MPI, whose progress thread would
    otherwise get a heap of its own that later threads share in turn with the main one."""
    global _done, _refused, _kept, _off
    environ = os.environ if environ is None else environ
    if not sys.platform.startswith("linux"):
        _off = "not on Linux: allocator untouched"
        return
    if not enabled(environ):
        _off = f"{VARIABLE}=0: allocator untouched"
        return
    taken = user_settings(environ)
    _kept = sorted(taken & set(TUNABLES))
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except AttributeError:  # not glibc
        mallopt = None
    for name, param in _MALLOPT_PARAMS.items():
        if name in taken:
            continue
        applied = mallopt is not None and mallopt(param, TUNABLES[name]) == 1
        (_done if applied else _refused).append(f"{name}={TUNABLES[name]}")


def advise_heap(ext, environ: Mapping[str, str] | None = None) -> None:
    """glibc.malloc.hugetlb's stand-in (when the extension loads, after `tune_process`, whose
    mmap_max and trim_threshold keep the reservation in the heap)."""
    environ = os.environ if environ is None else environ
    if _off or "glibc.malloc.hugetlb" in user_settings(environ):
        return
    advised = ext.advise_heap_huge_pages(HEAP_RESERVE)
    (_done if advised else _refused).append(
        f"glibc.malloc.hugetlb=1 (heap: {advised >> 20} MiB advised for huge pages)")


def report() -> str:
    """What jaxcache did to this process's allocator (see the module docstring)."""
    if _off:
        return _off
    parts = []
    if _done:
        parts.append("applied in this process: " + ", ".join(_done))
    if _refused:
        parts.append("could not apply: " + ", ".join(_refused))
    if _kept:
        parts.append("set at startup (GLIBC_TUNABLES / MALLOC_*): " + ", ".join(_kept))
    return "; ".join(parts)
