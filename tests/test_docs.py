"""The README's table of environment variables is the settings the runtime reads, no more, no less."""

import re
from pathlib import Path

from jaxcache import config

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_setting_is_documented_and_every_documented_one_exists():
    documented = set(re.findall(r"^\| `(JAXCACHE_[A-Z0-9_]+)` \|", README.read_text(), re.M))
    read = set(config.VARIABLES.values())
    assert read - documented == set(), f"settings missing from the README's table: {sorted(read - documented)}"
    assert documented - read == set(), f"README documents settings the runtime does not read: {sorted(documented - read)}"


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
