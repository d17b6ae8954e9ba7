"""Exceptions raised by jaxcache collectives (all are RuntimeErrors)."""

from __future__ import annotations


class JaxcacheError(RuntimeError):
    """Base class of jaxcache's runtime errors."""


class MismatchError(JaxcacheError):
    """Ranks submitted the same name with a different kind, dtype, shape, op, scale, root or
    device kind (CPU vs GPU)."""


class StallError(JaxcacheError):
    """A collective waited longer than JAXCACHE_STALL_SHUTDOWN_TIME for other ranks."""


class ShutdownError(JaxcacheError):
    """The runtime was shut down (on this or another rank) before the collective completed."""


class DuplicateNameError(JaxcacheError, ValueError):
    """An explicitly named torch/TensorFlow request reused a name still in flight on this rank.

    Also a ValueError, as Horovod raises. (JAX collectives queue a repeated name instead.)
    """


class CollectiveError(JaxcacheError):
    """Any other failure of a collective (invalid argument, MPI error)."""


# Order matches xla_ext/common.h ErrorKind.
_BY_KIND: dict[int, type[JaxcacheError]] = {
    1: MismatchError,
    2: StallError,
    3: ShutdownError,
    4: DuplicateNameError,
    5: CollectiveError,
    6: CollectiveError,
}


def raise_for_status(kind: int, message: str) -> None:
    """Raises the exception class that matches a runtime status."""
    if kind:
        raise _BY_KIND.get(kind, CollectiveError)(message)
