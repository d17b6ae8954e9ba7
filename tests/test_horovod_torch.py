"""Horovod's horovod.torch API on jaxcache.torch: multi-rank programs at 2 and 3 ranks."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from conftest import run_mpi  # noqa: E402


def test_api_against_numpy_gradients_sync_batch_norm_pending_names(nranks):
    out = run_mpi("horovod_torch_api.py", nranks, timeout=300).stdout
    assert f"horovod_torch_api: OK on {nranks} ranks" in out


def test_distributed_optimizer_matches_single_process(nranks):
    out = run_mpi("horovod_torch_optimizer.py", nranks, timeout=300).stdout
    assert f"horovod_torch_optimizer: OK on {nranks} ranks" in out
    assert out.count(": OK\n") >= 10, out[-3000:]
