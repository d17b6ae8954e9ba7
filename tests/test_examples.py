"""The digits example trains to >= 95% test accuracy, and data-parallel training
equals single-process training on the full global batch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import mpirun_path, run_mpi

pytest.importorskip("optax")
pytest.importorskip("sklearn")
pytest.importorskip("tqdm")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train_digits.py"


def accuracy_of(output: str) -> float:
    m = re.search(r"test accuracy: ([0-9.]+)\s*$", output, re.M)  # tqdm may share the line
    assert m, f"no 'test accuracy:' line in the output:\n{output[-4000:]}"
    return float(m.group(1))


def test_digits_reaches_95_percent_on_2_ranks():
    out = run_mpi(str(EXAMPLE), 2, timeout=240).stdout
    assert accuracy_of(out) >= 0.95, out[-3000:]
    assert "on 2 rank(s)" in out


def test_digits_check_single_on_3_ranks():
    """The example's own check: data-parallel params == single-process params."""
    out = run_mpi(str(EXAMPLE), 3, "--epochs", "2", "--check-single", timeout=240).stdout
    assert re.search(r"check-single: .*: OK\s*$", out, re.M), out[-3000:]
    assert "global batch 120" not in out  # 120 splits evenly over 3 ranks


@pytest.mark.parametrize("np_", [2, 3], ids=["np2", "np3"])
def test_digits_on_two_devices_per_rank(np_):
    """--local-devices 2: data-parallel over every device of every rank (axis_name), equal to
    single-process training on the full global batches."""
    out = run_mpi(str(EXAMPLE), np_, "--epochs", "2", "--local-devices", "2", "--check-single", timeout=240).stdout
    assert f"on {np_} rank(s) x 2 devices" in out, out[-3000:]
    assert re.search(r"check-single: .*: OK\s*$", out, re.M), out[-3000:]


def test_digits_without_mpirun():
    """A plain `python train.py` is a job of one rank."""
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--epochs", "1", "--max-steps", "5"],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "trained 5 steps of 120 samples on 1 rank(s)" in proc.stdout
    accuracy_of(proc.stdout)


def test_train_equivalence(nranks):
    """tests/mpi/train_equivalence.py: float32 optax chain and float64 direct grouping."""
    out = run_mpi("train_equivalence.py", nranks, timeout=240).stdout
    assert f"train_equivalence: OK on {nranks} ranks" in out


def test_bench_smoke(tmp_path):
    """`python -m jaxcache.bench` on a tiny sweep, run from the repository root as a user would
    (the unbuilt source tree shadows the installed package there), writes its table."""
    out_dir = tmp_path / "bench"
    cmd = [mpirun_path(), "-np", "2", sys.executable, "-m", "jaxcache.bench", "--out", str(out_dir),
           "--tensors", "2,20", "--sizes", "8KB,80KB", "--methods", "jaxcache,mpi_per_tensor",
           "--budget", "0.05", "--min-steps", "2", "--max-steps", "3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"}, start_new_session=True,
                            cwd=REPO)
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"bench timed out:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-4000:]
    rows = json.loads((out_dir / "bench.json").read_text())["rows"]
    methods = ("mpi_fused", "mpi_per_tensor", "jax_floor", "jaxcache")
    assert {(r["tensors"], r["bytes"], r["method"]) for r in rows} == {
        (n, b, m) for n in (2, 20) for b in (8000, 80000) for m in methods}
    assert all(r.get("median_ms", 0) > 0 and not r["note"] for r in rows), rows
    assert all(r["vs_floor_mpi"] > 0 for r in rows if r["method"] == "jaxcache"), rows
    table = (out_dir / "bench.md").read_text()
    assert "| tensors | size | method |" in table and "vs_floor_mpi" in table
    assert (out_dir / "bench.png").exists() or "matplotlib is not installed" in out


def _run_single(example: Path, *args: str, env: dict | None = None) -> str:
    proc = subprocess.run([sys.executable, str(example), *args], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


HOROVOD_TORCH = REPO / "examples" / "horovod_torch_mnist.py"
HOROVOD_KERAS = REPO / "examples" / "horovod_keras_mnist.py"


def test_horovod_torch_mnist_matches_single_process_accuracy():
    """Horovod's PyTorch MNIST example (jaxcache import, local digits) at 2 ranks reaches the
    accuracy it reaches in one process."""
    pytest.importorskip("torch")
    args = ("--epochs", "10", "--batch-size", "32", "--lr", "0.03", "--log-interval", "1000")

    def accuracy(out: str) -> float:
        found = re.findall(r"Test set: Average loss: [0-9.]+, Accuracy: ([0-9.]+)%", out)
        assert len(found) == 10, out[-3000:]
        return float(found[-1])

    single = accuracy(_run_single(HOROVOD_TORCH, *args))
    ranks2 = accuracy(run_mpi(str(HOROVOD_TORCH), 2, *args, timeout=240).stdout)
    assert single >= 93.0, single
    assert ranks2 >= single - 2.0, (ranks2, single)


def test_horovod_keras_mnist_matches_single_process_accuracy():
    """Horovod's TF2 Keras MNIST example (jaxcache import, local digits) at 2 ranks reaches the
    accuracy it reaches in one process."""
    pytest.importorskip("tensorflow")
    args = ("--epochs", "5", "--steps-per-epoch", "40")
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}

    def accuracy(out: str, ranks: int) -> float:
        m = re.search(rf"test accuracy: ([0-9.]+) on {ranks} rank\(s\)", out)
        assert m, out[-3000:]
        assert "finished gradual learning rate warmup" in out
        return float(m.group(1))

    single = accuracy(_run_single(HOROVOD_KERAS, *args, env=env), 1)
    ranks2 = accuracy(run_mpi(str(HOROVOD_KERAS), 2, *args, timeout=240, env=env).stdout, 2)
    # Unseeded shuffling and dropout, as in Horovod's example: runs vary by about 1 point.
    assert single >= 0.95, single
    assert ranks2 >= max(0.95, single - 0.03), (ranks2, single)


HEAT_HALO = REPO / "examples" / "heat_halo.py"


def test_heat_halo_matches_serial(nranks):
    """The heat-equation example (halo exchange by sendrecv in a jitted fori_loop, uneven
    row split at 3 ranks) gives the field of the same solver run in one process."""
    out = run_mpi(str(HEAT_HALO), nranks, "--check", timeout=120).stdout
    assert out.count(f"heat_halo: OK on {nranks} ranks") == nranks, out[-3000:]
    assert "step   400: total heat" in out, out[-3000:]
