"""Runtime settings from JAXCACHE_* environment variables, validated with clear errors.

The settings -- fields, types, defaults, variables, smallest values and whether rank 0's
value is authoritative -- are defined once, in xla_ext/config.h, and read here from the
extension. Rank 0's settings are authoritative: `synchronize()` broadcasts them at init()
and every rank runs with them (a rank whose environment differs prints one warning per
variable); the local ones (the timeline, the allocator) each rank keeps for itself.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import NamedTuple

from . import protocol
from .protocol import SettingScope, SettingType


class Setting(NamedTuple):
    field: str
    type: SettingType
    default: object
    variable: str
    minimum: float
    scope: SettingScope


SETTINGS: tuple[Setting, ...] = tuple(Setting(*row) for row in protocol.settings_table())
_PY_TYPES = {SettingType.INT: int, SettingType.FLOAT: float, SettingType.FLAG: bool,
             SettingType.INVERTED_FLAG: bool, SettingType.STRING: str}

Config = dataclasses.make_dataclass(
    "Config",
    [(s.field, _PY_TYPES[s.type], dataclasses.field(default=s.default)) for s in SETTINGS],
    frozen=True,
    namespace={"as_dict": lambda self: dataclasses.asdict(self),
               "__doc__": "The runtime's settings (xla_ext/config.h); from_env() reads them.",
               "__module__": __name__},  # pickled by synchronize()
)

# The variable behind each setting (for messages).
VARIABLES = {s.field: s.variable for s in SETTINGS}
# Horovod's variable for a setting, read when the JAXCACHE_* one is unset (horovodrun jobs).
HOROVOD_ALIASES = protocol.horovod_aliases()
_LOCAL = frozenset(s.field for s in SETTINGS if s.scope == SettingScope.LOCAL)


def _number(var: str, default, kind, minimum=0):
    raw = os.environ.get(var)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a valid {kind.__name__}") from None
    if value < minimum:
        raise ValueError(f"{var}={raw!r} must be >= {minimum:g}")
    return value


def _flag(var: str, default: bool) -> bool:
    raw = os.environ.get(var, "").strip().lower()
    if raw == "":
        return default
    if raw in ("0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{var}={raw!r}: expected 0/1, true/false, yes/no or on/off")


def _source(s: Setting) -> str:
    """The variable a setting is read from: its own, or Horovod's when only that is set."""
    alias = HOROVOD_ALIASES.get(s.field)
    if alias and os.environ.get(s.variable, "").strip() == "" and os.environ.get(alias, "").strip():
        return alias
    return s.variable


def horovod_variables_used() -> list[str]:
    """'HOROVOD_X=value (as JAXCACHE_Y)' for every Horovod variable this environment applies."""
    return [f"{_source(s)}={os.environ[_source(s)].strip()} (as {s.variable})"
            for s in SETTINGS if _source(s) != s.variable]


def _read(s: Setting):
    s = s._replace(variable=_source(s))
    if s.type == SettingType.INT:
        return _number(s.variable, s.default, int, int(s.minimum))
    if s.type == SettingType.FLOAT:
        return _number(s.variable, s.default, float, s.minimum)
    if s.type == SettingType.FLAG:
        return _flag(s.variable, s.default)
    if s.type == SettingType.INVERTED_FLAG:
        return not _flag(s.variable, not s.default)
    if s.type == SettingType.STRING:
        return os.environ.get(s.variable, s.default).strip()
    raise AssertionError(f"unknown setting type {s.type!r}")


def from_env() -> Config:
    """Reads this process's environment (init() then uses rank 0's values everywhere)."""
    return Config(**{s.field: _read(s) for s in SETTINGS})


def _shown(field: str, value) -> str:
    setting = next(s for s in SETTINGS if s.field == field)
    if setting.type == SettingType.INVERTED_FLAG:  # the variable says the opposite of the field
        return "1" if not value else "0"
    return repr(value) if isinstance(value, str) else str(value)


def synchronize(comm, mine: Config) -> Config:
    """Rank 0's settings for every rank (collective over `comm`); warns where this rank's differ.

    Settings that shape the cycle bitvector, the cycle timing or the sequence of MPI calls
    must be identical everywhere, or ranks would issue mismatched MPI calls and hang.
    """
    theirs = comm.bcast(mine if comm.rank == 0 else None, root=0)
    agreed = {}
    for field in dataclasses.fields(Config):
        mine_value, root_value = getattr(mine, field.name), getattr(theirs, field.name)
        if field.name in _LOCAL:
            agreed[field.name] = mine_value
            continue
        agreed[field.name] = root_value
        if mine_value != root_value:
            print(f"jaxcache: warning: rank {comm.rank}: {VARIABLES[field.name]}="
                  f"{_shown(field.name, mine_value)} differs from rank 0's "
                  f"{_shown(field.name, root_value)}; using rank 0's value", file=sys.stderr,
                  flush=True)
    return Config(**agreed)
