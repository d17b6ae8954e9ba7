"""Loads the C++ runtime, checks it against the running jaxlib, registers the FFI targets."""

from __future__ import annotations

import glob
import os
import re
import sys
import threading

from mpi4py import MPI  # noqa: F401  (loads libmpi before the extension needs it)

import jax
import jaxlib

SUPPORTED_JAX = ((0, 10), (0, 11))  # [min, max) of jax/jaxlib major.minor


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(re.match(r"\d+", minor).group())


def _check_jax_version() -> None:
    lo, hi = SUPPORTED_JAX
    for pkg, version in (("jax", jax.__version__), ("jaxlib", jaxlib.__version__)):
        if not lo <= _version_tuple(version) < hi:
            raise ImportError(
                f"jaxcache supports {pkg} >={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]} but {pkg} "
                f"{version} is installed; install a supported version or rebuild jaxcache "
                f"against this one (pip install --no-cache-dir --force-reinstall jaxcache)"
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

BUILT_FFI_API = tuple(ext.ffi_api_version())
RUNNING_FFI_API = _running_ffi_api_version()
if RUNNING_FFI_API is not None and (
    RUNNING_FFI_API[0] != BUILT_FFI_API[0] or RUNNING_FFI_API[1] < BUILT_FFI_API[1]
):
    raise ImportError(
        f"jaxcache was built for XLA FFI API {BUILT_FFI_API[0]}.{BUILT_FFI_API[1]} but the "
        f"installed jaxlib {jaxlib.__version__} provides {RUNNING_FFI_API[0]}.{RUNNING_FFI_API[1]}; "
        "reinstall jaxcache so it builds against this jaxlib"
    )

_registered = False
_register_lock = threading.Lock()


def ensure_registered() -> None:
    """Registers the FFI state type and targets with XLA, once (called by the lowerings).

    Registration waits until the CPU backend exists: jaxlib replays registrations made
    before that in an order that puts the targets before the state type they need.
    """
    global _registered
    if _registered:
        return
    with _register_lock:
        if _registered:
            return
        jax.devices("cpu")  # creates the backend if it does not exist yet
        jax.ffi.register_ffi_type("jaxcache_call_site", ext.call_site_type(), platform="cpu")
        for name, stages in ext.registrations().items():
            jax.ffi.register_ffi_target(name, stages, platform="cpu")
        _registered = True
