"""Every public Horovod 0.28.1 name has a status in docs/horovod.md, and every one of them
(same, differs or not supported) is called in a 2-rank job and does what the table says: the
"same" and "differs" names checked against mpi4py, NumPy or their documented effect (values,
files, timing), the "not supported" ones by raising NotImplementedError. One job per
framework (tests/mpi/horovod_names_torch.py; horovod_names_tf.py covers jaxcache.tensorflow
and its keras) reports the names whose checks passed; they must be exactly the documented ones.

A stub cannot pass: with HOROVOD_NAMES_STUB=section:name in the environment (e.g.
`HOROVOD_NAMES_STUB=horovod.torch:size pytest tests/test_horovod_names.py`), the job replaces
that name by `lambda *a, **k: None` and fails.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from horovod_names import MODULES

from conftest import run_mpi

DOC = Path(__file__).resolve().parents[1] / "docs" / "horovod.md"
STATUSES = ("same", "differs: ", "not supported")
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


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
def test_every_name_is_documented(section, module, names):
    table = documented().get(section)
    assert table is not None, f"docs/horovod.md has no '### {section}' table"
    assert set(table) == set(names), (f"{section}: undocumented {sorted(set(names) - set(table))}, "
                                      f"not Horovod names {sorted(set(table) - set(names))}")
    for name, status in table.items():
        assert status.startswith(STATUSES), f"{section}.{name}: unknown status {status!r}"


def check_every_name_behaves(script: str, sections: list[str], env: dict | None = None) -> None:
    """Runs the job on 2 ranks (it fails if a check fails) and compares its report with the docs."""
    out = run_mpi(script, 2, timeout=180, env=env).stdout
    lines = [line for line in out.splitlines() if line.startswith("COVERED ")]
    assert lines, f"{script} printed no COVERED line:\n{out[-6000:]}"
    report = json.loads(lines[-1][len("COVERED "):])
    assert sorted(report) == sorted(sections), sorted(report)
    tables = documented()
    for section in sections:
        checked, listed = set(report[section]), set(tables[section])
        assert listed <= checked, f"{section}: no behaviour checked for {sorted(listed - checked)}"
        assert checked <= listed, f"{section}: {sorted(checked - listed)} checked but not in docs/horovod.md"


def needs(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


TORCH_SECTIONS = ["horovod.torch", "horovod.torch.elastic"]
TF_SECTIONS = ["horovod.tensorflow", "horovod.tensorflow.elastic", "horovod.tensorflow.keras",
               "horovod.tensorflow.keras.callbacks", "horovod.tensorflow.keras.elastic"]


@needs("torch")
def test_torch_names_behave():
    check_every_name_behaves("horovod_names_torch.py", TORCH_SECTIONS)


@needs("tensorflow")
def test_tensorflow_and_keras_names_behave():
    check_every_name_behaves("horovod_names_tf.py", TF_SECTIONS, TF_ENV)
