"""Stand-ins for Horovod names jaxcache does not support: using one raises and says why."""

from __future__ import annotations


class UnsupportedError(NotImplementedError):
    """A Horovod name that jaxcache deliberately does not provide."""


def function(qualname: str, why: str):
    """A function that raises UnsupportedError naming itself and the reason."""

    def stub(*args, **kwargs):
        raise UnsupportedError(f"{qualname} is not supported by jaxcache: {why}")

    stub.__name__ = qualname.rsplit(".", 1)[-1]
    stub.__qualname__ = stub.__name__
    stub.__doc__ = f"Not supported by jaxcache: {why}"
    return stub


def cls(qualname: str, why: str, base: type = object):
    """A class whose construction raises UnsupportedError (subclassing it is allowed)."""

    def __init__(self, *args, **kwargs):
        raise UnsupportedError(f"{qualname} is not supported by jaxcache: {why}")

    name = qualname.rsplit(".", 1)[-1]
    return type(name, (base,), {"__init__": __init__, "__doc__": f"Not supported by jaxcache: {why}",
                                "__module__": qualname.rsplit(".", 1)[0]})

