"""jax/jaxlib versions: the extension is accepted by any jaxlib whose XLA FFI API is
compatible with the one it was built for, and refused with a message naming both otherwise.
(The suite itself runs on jax 0.10 here and on jax 0.12 in `make test-jax-latest`.)"""

import subprocess
import sys

import pytest

# Pretends the running jaxlib's FFI headers declare API `major.minor`, then imports jaxcache.
PROBE = r"""
import os, sys, tempfile
import jax
major, minor = sys.argv[1:3]
root = tempfile.mkdtemp()
os.makedirs(os.path.join(root, "xla", "ffi", "api"))
with open(os.path.join(root, "xla", "ffi", "api", "c_api.h"), "w") as f:
    f.write(f"#define XLA_FFI_API_MAJOR {major}\n#define XLA_FFI_API_MINOR {minor}\n")
jax.ffi.include_dir = lambda: root
try:
    import jaxcache._ext as e
except ImportError as err:
    print("refused:", err)
else:
    print("accepted: built", e.BUILT_FFI_API, "running", e.RUNNING_FFI_API)
"""


def probe(major: int, minor: int) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, str(major), str(minor)], capture_output=True,
                         text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


@pytest.fixture(scope="module")
def built() -> tuple[int, int]:
    text = probe(0, 1000)  # any newer minor is accepted
    assert text.startswith("accepted: built"), text
    major, minor = text.split("built (")[1].split(")")[0].split(", ")
    return int(major), int(minor)


def test_same_or_newer_minor_is_accepted(built):
    for minor in (built[1], built[1] + 1):
        assert probe(built[0], minor).startswith("accepted"), minor


def test_older_minor_or_other_major_is_refused_naming_both(built):
    cases = [(built[0] + 1, 0)] + ([(built[0], built[1] - 1)] if built[1] > 0 else [])
    for major, minor in cases:
        text = probe(major, minor)
        assert text.startswith("refused:"), text
        assert f"built for XLA FFI API {built[0]}.{built[1]}" in text, text
        assert f"provides {major}.{minor}" in text, text
