"""mpi4jax's collectives to and from one root and its prefix reduction -- reduce, gather,
scatter, scan -- on 2 and 3 ranks (each added through one file in xla_ext/collectives/ and
one op module: docs/design.md, "Adding a collective")."""

import pytest

from conftest import run_mpi


@pytest.mark.parametrize("program", ["reduce", "scan_gather_scatter"])
def test_rooted_and_prefix_collectives(nranks, program):
    out = run_mpi(f"{program}.py", nranks, timeout=300).stdout
    assert f"{program}: OK on {nranks} ranks" in out


def test_gather_scatter_above_the_mpi_count_limit(nranks):
    """Blocks larger than JAXCACHE_MAX_MPI_COUNT bytes go point to point, piece by piece."""
    out = run_mpi("scan_gather_scatter.py", nranks, timeout=300, env={"JAXCACHE_MAX_MPI_COUNT": "5"}).stdout
    assert f"scan_gather_scatter: OK on {nranks} ranks" in out


def test_mpi4jax_module(nranks):
    """`import jaxcache.mpi4jax as mpi4jax`: mpi4jax's names, operators and conventions."""
    out = run_mpi("mpi4jax_api.py", nranks, timeout=300).stdout
    assert f"mpi4jax_api: OK on {nranks} ranks" in out


def test_reduce_through_mpi_beyond_three_ranks():
    """Up to 3 ranks root reduces the others' tensors itself; from 4 on, MPI's reduce does
    (xla_ext/collectives/reduce.cc): the same program at 4 ranks takes that path."""
    out = run_mpi("reduce.py", 4, timeout=300).stdout
    assert "reduce: OK on 4 ranks" in out
