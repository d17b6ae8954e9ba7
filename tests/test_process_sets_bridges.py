"""Process sets in the PyTorch and TensorFlow bridges (Horovod's process-set API), on 3 and 4
ranks (4 oversubscribe the CI's 2 cores): two disjoint sets running the same collectives
under the same names, DistributedOptimizer / DistributedGradientTape / the Keras optimizer
on a set, non-members refused without a hang."""

import pytest

from conftest import run_mpi


@pytest.fixture(params=[3, 4], ids=["np3", "np4"])
def set_ranks(request) -> int:
    return request.param


def test_torch_process_sets(set_ranks):
    pytest.importorskip("torch")
    out = run_mpi("torch_process_sets.py", set_ranks, timeout=240).stdout
    assert f"torch_process_sets: OK on {set_ranks} ranks" in out, out[-3000:]


def test_tensorflow_process_sets(set_ranks):
    pytest.importorskip("tensorflow")
    out = run_mpi("tf_process_sets.py", set_ranks, timeout=300).stdout
    assert f"tf_process_sets: OK on {set_ranks} ranks" in out, out[-3000:]
