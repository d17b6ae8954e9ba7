"""The docs against the code: docs/settings.md's table of environment variables is the settings the
runtime reads, no more, no less, with their defaults; the timeline phases the runtime writes are all
named; every file the README and docs/ link or name exists; the README stays a front page."""

import re
from pathlib import Path

from jaxcache import config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SETTINGS = ROOT / "docs" / "settings.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]


def test_every_setting_is_documented_and_every_documented_one_exists():
    documented = set(re.findall(r"^\| `(JAXCACHE_[A-Z0-9_]+)` \|", SETTINGS.read_text(), re.M))
    read = set(config.VARIABLES.values())
    assert read - documented == set(), f"settings missing from docs/settings.md's table: {sorted(read - documented)}"
    assert documented - read == set(), f"docs/settings.md documents settings the runtime does not read: {sorted(documented - read)}"


def _documented_default(cell: str, setting):
    """The value a docs/settings.md default cell stands for, in the setting's own terms: a number or
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
    """docs/settings.md's default for every setting is the one xla_ext/config.h defines."""
    rows = re.findall(r"^\| `(JAXCACHE_[A-Z0-9_]+)` \| ([^|]*) \|", SETTINGS.read_text(), re.M)
    settings = {s.variable: s for s in config.SETTINGS}
    wrong = {var: (cell, settings[var].default) for var, cell in rows
             if _documented_default(cell, settings[var]) != settings[var].default}
    assert not wrong, f"docs/settings.md defaults differ from the runtime's (cell, default): {wrong}"


def test_horovod_variables_table_is_the_aliases_read():
    """docs/horovod.md pairs each HOROVOD_* variable read with the JAXCACHE_* one it stands for."""
    doc = (ROOT / "docs" / "horovod.md").read_text()
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
    for source in (ROOT / "xla_ext").rglob("*.cc"):
        text = source.read_text()
        phases |= set(re.findall(r'mpi_phase = "([A-Z_]+)"', text))
        for call in re.findall(r"(?:Begin|PhaseAll)\([^;]*?\"([A-Z_]+)\"", text):
            phases.add(call)
    return phases


def test_timeline_phases_are_documented():
    """docs/timeline.md and docs/design.md name every phase the runtime writes."""
    phases = _timeline_phases()
    assert {"NEGOTIATE", "MPI_ALLREDUCE", "LOCAL_REDUCE", "MPI_SCAN"} <= phases, phases  # the scan works
    for doc in ("timeline.md", "design.md"):
        text = (ROOT / "docs" / doc).read_text()
        missing = sorted(p for p in phases if f"`{p}`" not in text)
        assert not missing, f"docs/{doc} does not name the timeline phases {missing}"


# A path in backticks that starts at one of the repository's top-level folders.
_NAMED_PATH = re.compile(r"`((?:docs|examples|benchmarks|jaxcache|xla_ext|tests)/[\w./-]*\w)`")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _named_files(doc: Path) -> list[tuple[str, Path]]:
    """(as written, resolved path) of every relative link and backticked repository path."""
    text = doc.read_text()
    links = [(m, doc.parent / m) for m in _LINK.findall(text) if "://" not in m]
    paths = [(m, ROOT / m) for m in _NAMED_PATH.findall(text)]
    return links + paths


def test_every_file_a_doc_names_exists():
    missing = [f"{doc.relative_to(ROOT)}: {name}" for doc in DOCS for name, path in _named_files(doc)
               if not path.exists()]
    assert not missing, f"docs name files that do not exist: {missing}"


def test_readme_is_a_front_page():
    """The two commands first, then about 200 lines; the reference lives in docs/."""
    lines = README.read_text().splitlines()
    assert lines[:4] == ["```sh", "make demo", "make test", "```"], lines[:4]
    assert len(lines) <= 260, f"README.md has {len(lines)} lines; move reference material to docs/"
