"""Every public Horovod 0.28.1 name exists in jaxcache and has a status in docs/horovod.md."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from horovod_names import MODULES

DOC = Path(__file__).resolve().parents[1] / "docs" / "horovod.md"
STATUSES = ("same", "differs: ", "not supported")


def documented() -> dict[str, dict[str, str]]:
    tables: dict[str, dict[str, str]] = {}
    section = None
    for line in DOC.read_text().splitlines():
        m = re.match(r"^### (horovod[\w.]*)\s*$", line)
        if m:
            section = m.group(1)
            tables[section] = {}
            continue
        m = re.match(r"^\| `([\w.]+)` \| ([^|]+) \|", line)
        if section and m:
            assert m.group(1) not in tables[section], f"{section}: {m.group(1)} listed twice"
            tables[section][m.group(1)] = m.group(2).strip()
    return tables


@pytest.mark.parametrize("section,module,names", MODULES, ids=[m[0] for m in MODULES])
def test_every_name_is_documented_and_exists(section, module, names):
    pytest.importorskip("torch" if "torch" in module else "tensorflow")
    table = documented().get(section)
    assert table is not None, f"docs/horovod.md has no '### {section}' table"
    assert set(table) == set(names), (f"{section}: undocumented {sorted(set(names) - set(table))}, "
                                      f"not Horovod names {sorted(set(table) - set(names))}")
    for name, status in table.items():
        assert status.startswith(STATUSES), f"{section}.{name}: unknown status {status!r}"
    mod = importlib.import_module(module)
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{module} lacks {missing}"
