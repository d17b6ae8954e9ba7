"""TensorFlow bridge (jaxcache.tensorflow): multi-rank programs under mpirun with 2 and 3 ranks."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")

from conftest import run_mpi  # noqa: E402

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


def test_ops_against_numpy_eager_and_tf_function_and_bad_input(nranks):
    out = run_mpi("tf_ops.py", nranks, timeout=300, env=TF_ENV).stdout
    assert f"tf_ops: OK on {nranks} ranks" in out


def test_distributed_gradient_tape_matches_single_process(nranks):
    out = run_mpi("tf_train.py", nranks, timeout=300, env=TF_ENV).stdout
    assert f"tf_train: OK on {nranks} ranks" in out
    assert out.count(": OK\n") >= 5


@pytest.mark.parametrize("scenario", ["ops", "threads", "errors", "join"])
def test_reducescatter_alltoall_allgather_join(nranks, scenario):
    out = run_mpi("tf_vocabulary.py", nranks, scenario, timeout=300, env=TF_ENV).stdout
    assert f"tf_vocabulary {scenario}: OK on {nranks} ranks" in out


def _tf_keras_importable() -> bool:
    import importlib.util
    return importlib.util.find_spec("tf_keras") is not None


@pytest.mark.skipif(not _tf_keras_importable(),
                    reason="tf_keras is not installed (pip install tf-keras, the `tensorflow` extra): "
                           "Keras 2 under TF_USE_LEGACY_KERAS=1 needs it")
def test_keras2_tf_keras_distributed_optimizer_and_callbacks(nranks):
    out = run_mpi("keras2_train.py", nranks, timeout=400,
                  env={**TF_ENV, "TF_USE_LEGACY_KERAS": "1"}).stdout
    assert f"keras2_train: OK on {nranks} ranks" in out
    for part in ("wrapping", "one step against NumPy", "backward_passes_per_step=2",
                 "model.fit with callbacks", "save/load_model"):
        assert f"rank 0: {part}: OK" in out, part
