"""PyTorch bridge (jaxcache.torch): multi-rank programs under mpirun with 2 and 3 ranks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from conftest import run_mpi  # noqa: E402


def test_ops_against_numpy_zero_copy_and_fallback(nranks):
    out = run_mpi("torch_ops.py", nranks, timeout=240).stdout
    assert f"torch_ops: OK on {nranks} ranks" in out


def test_distributed_optimizer_matches_single_process(nranks):
    out = run_mpi("torch_train.py", nranks, timeout=240).stdout
    assert f"torch_train: OK on {nranks} ranks" in out
    assert out.count(": OK (first hooks:") == 4


def test_broadcast_parameters_and_optimizer_state(nranks):
    out = run_mpi("torch_broadcast.py", nranks, timeout=240).stdout
    assert f"torch_broadcast: OK on {nranks} ranks" in out


def test_bad_input_raises_on_every_rank(nranks):
    out = run_mpi("torch_errors.py", nranks, timeout=240).stdout
    assert f"torch_errors: OK on {nranks} ranks" in out


def test_digits_example_reaches_95_percent():
    pytest.importorskip("sklearn")
    example = Path(__file__).resolve().parents[1] / "examples" / "torch_digits.py"
    out = run_mpi(str(example), 2, timeout=300).stdout
    acc = float(re.search(r"test accuracy ([0-9.]+)%", out).group(1))
    assert acc >= 95.0, out[-3000:]
    assert "parameters identical on all 2 ranks" in out


@pytest.mark.parametrize("scenario", ["ops", "threads", "errors", "join"])
def test_reducescatter_alltoall_allgather_join(nranks, scenario):
    out = run_mpi("torch_vocabulary.py", nranks, scenario, timeout=300).stdout
    assert f"torch_vocabulary {scenario}: OK on {nranks} ranks" in out


def test_names_left_in_flight_do_not_outlive_their_session(nranks):
    out = run_mpi("torch_sessions.py", nranks, timeout=120, env={"JAXCACHE_STALL_SHUTDOWN_TIME": "20"}).stdout
    assert f"torch_sessions: OK on {nranks} ranks" in out
