"""Horovod's horovod.tensorflow and horovod.tensorflow.keras APIs on jaxcache.tensorflow:
multi-rank programs at 2 and 3 ranks."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")

from conftest import run_mpi  # noqa: E402

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


def test_api_against_numpy_gradients_sync_batch_norm_pending_names(nranks):
    out = run_mpi("horovod_tf_api.py", nranks, timeout=300, env=TF_ENV).stdout
    assert f"horovod_tf_api: OK on {nranks} ranks" in out


def test_tape_and_keras_optimizer_match_single_process(nranks):
    out = run_mpi("horovod_tf_train.py", nranks, timeout=300, env=TF_ENV).stdout
    assert f"horovod_tf_train: OK on {nranks} ranks" in out
    assert out.count(": OK\n") >= 12, out[-3000:]


def test_keras_callbacks_load_model_and_helpers(nranks):
    out = run_mpi("horovod_keras.py", nranks, timeout=300, env=TF_ENV).stdout
    assert f"horovod_keras: OK on {nranks} ranks" in out
