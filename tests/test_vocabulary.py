"""reducescatter, alltoall, uneven allgather, object collectives and join on 2 and 3 ranks."""

import pytest

from conftest import run_mpi


@pytest.mark.parametrize("scenario", ["reducescatter", "allgather", "alltoall", "objects", "threads",
                                      "errors"])
def test_vocabulary(nranks, scenario):
    out = run_mpi("vocabulary.py", nranks, scenario, timeout=300).stdout
    assert f"vocabulary {scenario}: OK on {nranks} ranks" in out


@pytest.mark.parametrize("env", [{}, {"JAXCACHE_MAX_MPI_COUNT": "1000"},
                                 {"JAXCACHE_CHUNK_BYTES": "4000"},
                                 {"JAXCACHE_STALL_SHUTDOWN_TIME": "60"}],
                         ids=["default", "chunked", "chunk-bytes", "watched"])
def test_data_paths(nranks, env):
    out = run_mpi("vocabulary.py", nranks, "data-paths", timeout=180, env=env).stdout
    assert f"vocabulary data-paths: OK on {nranks} ranks" in out


@pytest.mark.parametrize("scenario", ["reducescatter", "data-paths"])
def test_reducescatter_five_ranks(scenario):
    """From 5 ranks small reducescatters go to MPI's own call, large ones pairwise."""
    out = run_mpi("vocabulary.py", 5, scenario, timeout=300).stdout
    assert f"vocabulary {scenario}: OK on 5 ranks" in out


def test_transforms_grad_jvp_vmap(nranks):
    out = run_mpi("vocabulary_transforms.py", nranks, timeout=240).stdout
    assert f"vocabulary_transforms: OK on {nranks} ranks" in out


JOIN_SETTINGS = {"cache-on": {}, "cache-off": {"JAXCACHE_CACHE_CAPACITY": "0"},
                 "average-active": {"JAXCACHE_JOIN_AVERAGE_BY_SIZE": "0"}}


@pytest.mark.parametrize("setting", list(JOIN_SETTINGS))
def test_join_semantics(nranks, setting):
    out = run_mpi("join.py", nranks, "semantics", timeout=180, env=JOIN_SETTINGS[setting]).stdout
    assert f"join semantics : OK on {nranks} ranks" in out


@pytest.mark.parametrize("steps,setting", [("5,3", "cache-on"), ("3,5", "average-active"),
                                           ("3,5", "cache-off"), ("6,4,5", "cache-on"),
                                           ("3,6,4", "average-active"), ("3,6,4", "cache-off")])
def test_join_training_matches_single_process(steps, setting):
    """1 (2 ranks) and 2 (3 ranks) ranks run out of data at different steps of a jitted loop."""
    env = JOIN_SETTINGS[setting]
    n = len(steps.split(","))
    out = run_mpi("join.py", n, "train", steps, timeout=180, env=env).stdout
    assert f"join train {steps}: OK on {n} ranks" in out
