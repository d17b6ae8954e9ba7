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


class InvalidArgumentError(CollectiveError, ValueError):
    """The ranks' arguments together are invalid (splits that do not add up or do not
    divide the first dimension, a root that has joined, a scatter operand without a block
    per rank...): raised on every rank once rank 0 has seen them all.

    Also a ValueError, as Horovod raises for bad arguments.
    """


def _classes_by_kind() -> dict[int, type[JaxcacheError]]:
    """Each runtime error kind's class, as the runtime names it (xla_ext/common.h)."""
    from . import protocol

    classes = {cls.__name__: cls for cls in (MismatchError, StallError, ShutdownError,
                                             DuplicateNameError, CollectiveError, InvalidArgumentError)}
    by_kind = {}
    for kind in protocol.ErrorKind:
        if kind != protocol.ErrorKind.NONE:
            by_kind[int(kind)] = classes[protocol.error_class_name(kind)]
    return by_kind


_by_kind: dict[int, type[JaxcacheError]] | None = None


def error_class(kind: int) -> type[JaxcacheError]:
    """The exception class of a runtime error kind."""
    global _by_kind
    if _by_kind is None:
        _by_kind = _classes_by_kind()
    return _by_kind[kind]


def raise_for_status(kind: int, message: str) -> None:
    """Raises the exception class that matches a runtime status."""
    if kind:
        raise error_class(kind)(message)
