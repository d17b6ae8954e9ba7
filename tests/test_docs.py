"""The docs against the code: the README's table of environment variables is the settings the runtime
reads, no more, no less, with their defaults; the timeline phases the runtime writes are all named."""

import re
from pathlib import Path

from jaxcache import config

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_setting_is_documented_and_every_documented_one_exists():
    documented = set(re.findall(r"^\| `(JAXCACHE_[A-Z0-9_]+)` \|", README.read_text(), re.M))
    read = set(config.VARIABLES.values())
    assert read - documented == set(), f"settings missing from the README's table: {sorted(read - documented)}"
    assert documented - read == set(), f"README documents settings the runtime does not read: {sorted(documented - read)}"


def _documented_default(cell: str, setting):
    """The value a README default cell stands for, in the setting's own terms: a number or
    flag in backticks, `off`/`on` for the variable's flag (an inverted flag's field is its
    opposite), `unset` for an empty string."""
    word = cell.split()[0]
    if word == "unset":
        return ""
    if word in ("off", "on"):
        value = word == "on"
        return (not value) if setting.type == config.SettingType.INVERTED_FLAG else value
    number = float(word.strip("`"))
    if setting.type in (config.SettingType.FLAG, config.SettingType.INVERTED_FLAG):
        return bool(number) != (setting.type == config.SettingType.INVERTED_FLAG)
    return number


def test_documented_defaults_are_the_runtimes():
    """The README's default for every setting is the one xla_ext/config.h defines."""
    rows = re.findall(r"^\| `(JAXCACHE_[A-Z0-9_]+)` \| ([^|]*) \|", README.read_text(), re.M)
    settings = {s.variable: s for s in config.SETTINGS}
    wrong = {var: (cell, settings[var].default) for var, cell in rows
             if _documented_default(cell, settings[var]) != settings[var].default}
    assert not wrong, f"README defaults differ from the runtime's (cell, default): {wrong}"


def test_horovod_variables_table_is_the_aliases_read():
    """docs/horovod.md pairs each HOROVOD_* variable read with the JAXCACHE_* one it stands for."""
    doc = (README.parent / "docs" / "horovod.md").read_text()
    pairs = set()
    for ours_cell, theirs_cell in re.findall(r"^ *\| ([^|]*HOROVOD_[^|]*) \| ([^|]*JAXCACHE_[^|]*) \|$", doc, re.M):
        horovod = re.findall(r"`(HOROVOD_[A-Z0-9_]+)`", ours_cell)
        jaxcache = re.findall(r"`(JAXCACHE_[A-Z0-9_]+)`", theirs_cell)
        pairs |= set(zip(horovod, jaxcache))
    read = {(alias, config.VARIABLES[field]) for field, alias in config.HOROVOD_ALIASES.items()}
    assert pairs == read, f"docs/horovod.md: {sorted(pairs ^ read)}"


def _timeline_phases() -> set[str]:
    """The phases the runtime writes: each collective's `mpi_phase` and the phases it opens."""
    phases = set()
    for source in (README.parent / "xla_ext").rglob("*.cc"):
        text = source.read_text()
        phases |= set(re.findall(r'mpi_phase = "([A-Z_]+)"', text))
        for call in re.findall(r"(?:Begin|PhaseAll)\([^;]*?\"([A-Z_]+)\"", text):
            phases.add(call)
    return phases


def test_timeline_phases_are_documented():
    """The README's timeline section and docs/design.md name every phase the runtime writes."""
    phases = _timeline_phases()
    assert {"NEGOTIATE", "MPI_ALLREDUCE", "LOCAL_REDUCE", "MPI_SCAN"} <= phases, phases  # the scan works
    readme = README.read_text()
    section = readme[readme.index("## Timeline"):]
    section = section[:section.index("\n## ", 1)]
    design = (README.parent / "docs" / "design.md").read_text()
    for where, text in (("README.md (Timeline)", section), ("docs/design.md", design)):
        missing = sorted(p for p in phases if f"`{p}`" not in text)
        assert not missing, f"{where} does not name the timeline phases {missing}"
