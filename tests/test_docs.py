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
