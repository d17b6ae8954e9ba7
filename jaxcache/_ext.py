"""Loads the C++ runtime, checks it against the running jaxlib, registers the FFI targets."""

from __future__ import annotations

import glob
import os
import re
import sys
import threading

from mpi4py import MPI  # noqa: F401  (loads libmpi before the extension needs it)

import jax
import jax.extend  # noqa: F401  (see below)
import jaxlib

from . import allocator

# Importing jax.extend defines JAX config options (jax >= 0.12: through its pallas modules).
# Options defined in the middle of a trace -- jaxcache's ops modules import jax.extend and
# load lazily, typically when a jitted function first calls a collective -- change JAX's
# tracing context, so every function traced before would be traced (and named) again on
# its next call. Importing it with the runtime keeps the context fixed from init() on.

# Oldest jax/jaxlib with everything the extension and the lowerings use. There is no upper
# bound: the extension is built against the FFI headers of the jax present at build time, and
# any jaxlib whose XLA FFI API is compatible with those works (checked below). Tested: 0.10.2
# (Python 3.11), 0.11.2 and 0.12.0.1 (Python 3.12).
MIN_JAX = (0, 10)


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(re.match(r"\d+", minor).group())


def _check_jax_version() -> None:
    lo = MIN_JAX
    for pkg, version in (("jax", jax.__version__), ("jaxlib", jaxlib.__version__)):
        if _version_tuple(version) < lo:
            raise ImportError(
                f"jaxcache needs {pkg} >={lo[0]}.{lo[1]} but {pkg} {version} is installed"
            )


def _running_ffi_api_version() -> tuple[int, int] | None:
    header = os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")
    try:
        text = open(header).read()
    except OSError:
        return None
    major = re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text)
    minor = re.search(r"#define XLA_FFI_API_MINOR (\d+)", text)
    if not (major and minor):
        return None
    return int(major.group(1)), int(minor.group(1))


def _installed_copy() -> str | None:
    """Another jaxcache on sys.path that has the built extension (the installed one)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(os.path.abspath(entry or "."), "jaxcache")
        if candidate != here and glob.glob(os.path.join(candidate, "_jaxcache_ext*")):
            return candidate
    return None


def _load_extension():
    try:
        from . import _jaxcache_ext
        return _jaxcache_ext
    except ImportError as e:
        error = e
    # Run from a source checkout (e.g. `python -m jaxcache.bench` in the repository root,
    # where the unbuilt tree shadows the installed package): use the installed extension.
    installed = _installed_copy()
    if installed is not None:
        sys.modules[__package__].__path__.append(installed)
        try:
            from . import _jaxcache_ext
        except ImportError:
            pass
        else:
            print(f"jaxcache: note: running the source tree {os.path.dirname(__file__)} with the "
                  f"extension built in {installed}", file=sys.stderr)
            return _jaxcache_ext
    raise ImportError(
        f"jaxcache's C++ extension failed to load ({error}). Install jaxcache (pip install "
        "'.[mpich]'), built against the same MPI that mpi4py uses."
    ) from error


_check_jax_version()
ext = _load_extension()
# Before jax creates its CPU backend (the buffers are carved from the advised heap).
allocator.advise_heap(ext)

BUILT_FFI_API = tuple(ext.ffi_api_version())
RUNNING_FFI_API = _running_ffi_api_version()


def ffi_api_compatible(built: tuple[int, int], running: tuple[int, int]) -> bool:
    """XLA accepts handlers built for its FFI API major version and any minor up to its own."""
    return running[0] == built[0] and running[1] >= built[1]


if RUNNING_FFI_API is not None and not ffi_api_compatible(BUILT_FFI_API, RUNNING_FFI_API):
    raise ImportError(
        f"jaxcache was built for XLA FFI API {BUILT_FFI_API[0]}.{BUILT_FFI_API[1]} but the "
        f"installed jaxlib {jaxlib.__version__} provides {RUNNING_FFI_API[0]}.{RUNNING_FFI_API[1]}; "
        "reinstall jaxcache so that it builds against this jaxlib "
        "(pip install --no-build-isolation --force-reinstall --no-deps jaxcache)"
    )

_registered = False
_register_lock = threading.Lock()


def ensure_registered() -> None:
    """Registers the FFI state type and targets with XLA, once (called by the lowerings).

    Registration waits until the backends exist: jaxlib replays registrations made before
    that in an order that puts the targets before the state type they need. jax.devices()
    creates every backend this process may use (CPU, and CUDA where its plugin loads).
    The CUDA targets are registered whenever the extension has them; on a jaxlib without a
    CUDA backend jaxlib merely queues them, which lets programs be lowered for CUDA there.
    """
    global _registered
    if _registered:
        return
    with _register_lock:
        if _registered:
            return
        jax.devices()
        types = ext.call_site_types()
        for platform, targets in ext.registrations().items():
            type_name, type_registration = types[platform]
            jax.ffi.register_ffi_type(type_name, type_registration, platform=platform)
            for name, stages in targets.items():
                jax.ffi.register_ffi_target(name, stages, platform=platform)
        _registered = True
