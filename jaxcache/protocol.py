"""The runtime's protocol as Python sees it: every code is the C++ runtime's own.

The enums, the exception class of each error kind, the dtype codes and the settings table
are defined once in xla_ext/ (common.h, config.h) and exported by the extension; this
module only derives the lookup tables the Python layer needs from them.
"""

from __future__ import annotations

import numpy as np

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)

from ._ext import ext

DType = ext.DType
ReduceOp = ext.ReduceOp
Kind = ext.Kind
Device = ext.Device
ErrorKind = ext.ErrorKind
SettingType = ext.SettingType
SettingScope = ext.SettingScope

# The runtime's dtype names are NumPy's (ml_dtypes' for bfloat16), which torch and
# TensorFlow use too.
DTYPE_NAMES: dict[DType, str] = {d: d.name.lower() for d in DType}
NUMPY_DTYPES: dict[np.dtype, DType] = {np.dtype(name): d for d, name in DTYPE_NAMES.items()}
NUMPY_BY_DTYPE: dict[DType, np.dtype] = {d: dt for dt, d in NUMPY_DTYPES.items()}

REDUCE_OPS: dict[str, ReduceOp] = {op.name.lower(): op for op in ReduceOp}


def error_class_name(kind: ErrorKind) -> str:
    """The name of the jaxcache.errors class a request failing with `kind` raises."""
    return ext.error_class_name(kind)


def settings_table() -> list[tuple]:
    """(field, SettingType, default, variable, minimum, SettingScope) for every setting."""
    return [tuple(row) for row in ext.settings_table()]


def horovod_aliases() -> dict[str, str]:
    """{field: HOROVOD_* variable} read when the setting's JAXCACHE_* variable is unset."""
    return dict(ext.horovod_aliases())
