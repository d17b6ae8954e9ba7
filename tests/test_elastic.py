"""Elastic training (docs/elastic.md): Horovod's elastic scenarios against our launcher.

Each test starts ``python -m jaxcache.run`` with elastic flags on "hosts" that are two names
of this machine (``localhost`` and ``127.0.0.1``: Hydra runs them as two hosts, and each keeps
its own copy of the commits), runs tests/mpi/elastic_train.py and reads rank 0's log: one
line per epoch, then the final parameters, which must equal a serial run's (a batch lost or
applied twice would change them). Hard timeouts throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import MPI_DIR, run_job

SCRIPT = MPI_DIR / "elastic_train.py"
INTERVAL = "0.2"  # JAXCACHE_ELASTIC_DISCOVERY_INTERVAL for the tests (default 1 s)


def discovery_script(tmp_path: Path, logfile: Path, schedule: list[tuple[int | None, list[str]]]) -> Path:
    """A script printing the hosts of `schedule` for the epoch = lines in the log so far
    (Horovod's elastic tests do the same); a None epoch is every later one."""
    lines = [f"epoch=0; [ -f {logfile} ] && epoch=$(grep -c epoch {logfile})"]
    default = None
    for epoch, hosts in schedule:
        body = "".join(f"echo {h}; " for h in hosts)
        if epoch is None:
            default = body
        else:
            lines.append(f'if [ "$epoch" = "{epoch}" ]; then {body}exit 0; fi')
    if default:
        lines.append(default)
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/bash\n" + "\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def run_elastic(tmp_path: Path, flags: list[str], train_args: list[str] = (), timeout: float = 240,
                epochs: int = 3, batches: int = 4, script: Path = SCRIPT) -> tuple[int, str, list[dict]]:
    logfile = tmp_path / "log.jsonl"
    cmd = [sys.executable, "-m", "jaxcache.run", *flags, str(script), "--logfile", str(logfile),
           "--epochs", str(epochs), "--batches-per-epoch", str(batches), *train_args]
    rc, out = run_job(cmd, {"JAXCACHE_ELASTIC_DISCOVERY_INTERVAL": INTERVAL, "JAXCACHE_STALL_SHUTDOWN_TIME": "60"},
                      timeout, f"elastic job timed out after {timeout}s")
    records = [json.loads(line) for line in logfile.read_text().splitlines()] if logfile.exists() else []
    return rc, out, records


def serial_params(epochs: int = 3, batches: int = 4) -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), "--logfile", "-", "--print-serial", "--epochs", str(epochs),
                          "--batches-per-epoch", str(batches)], capture_output=True, text=True, check=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
    return json.loads(out.stdout)


def epochs_of(records: list[dict]) -> list[dict]:
    return [r for r in records if "epoch" in r]


def check_final(records: list[dict], epochs: int = 3, batches: int = 4) -> None:
    final = records[-1]["final"]
    want = serial_params(epochs, batches)
    for k in want:
        np.testing.assert_allclose(np.asarray(final[k]), np.asarray(want[k]), rtol=1e-5, atol=1e-6,
                                   err_msg=f"parameter {k} differs from the serial run (a batch lost or applied twice?)")
    assert records[-1]["size"] == epochs_of(records)[-1]["size"]


def test_hosts_added_and_removed(tmp_path):
    logfile = tmp_path / "log.jsonl"
    script = discovery_script(tmp_path, logfile, [(0, ["localhost:2"]), (1, ["localhost:2", "127.0.0.1:2"]),
                                                  (None, ["127.0.0.1:2"])])
    rc, out, records = run_elastic(tmp_path, ["-np", "2", "--min-np", "2", "--max-np", "4",
                                              "--host-discovery-script", str(script)], ["--epoch-wait", "1.5"])
    assert rc == 0, out[-6000:]
    ep = epochs_of(records)
    assert [r["epoch"] for r in ep] == [0, 1, 2], out[-4000:]
    assert [r["size"] for r in ep] == [2, 4, 2]
    assert [r["hostname"] for r in ep] == ["localhost", "localhost", "127.0.0.1"]
    assert [r["rendezvous"] for r in ep] == [1, 2, 3]
    assert [r["commits"] for r in ep] == [4, 8, 12]  # one per batch, carried through the resets
    assert ep[1]["resets_seen"] == [4] and ep[2]["resets_seen"] == [2]  # reset callbacks ran
    check_final(records)


@pytest.mark.parametrize("mode", ["exception", "kill"])
def test_single_rank_failure(tmp_path, mode):
    logfile = tmp_path / "log.jsonl"
    script = discovery_script(tmp_path, logfile, [(None, ["localhost:2", "127.0.0.1:2"])])
    rc, out, records = run_elastic(tmp_path, ["-np", "2", "--min-np", "2", "--max-np", "4",
                                              "--host-discovery-script", str(script)],
                                   ["--exit-schedule", json.dumps({"1,1": [0]}), "--exit-mode", mode])
    assert rc == 0, out[-6000:]
    ep = epochs_of(records)
    assert [r["size"] for r in ep] == [4, 2, 2], out[-4000:]
    assert [r["hostname"] for r in ep] == ["localhost", "127.0.0.1", "127.0.0.1"]
    assert [r["rendezvous"] for r in ep] == [1, 2, 2]
    assert "rank 0 on localhost failed" in out and "localhost blacklisted" in out
    check_final(records)


@pytest.mark.parametrize("hosts,start", [("localhost:2,127.0.0.1:2", 4), ("localhost:2,127.0.0.1:1", 3)],
                         ids=["np4", "np3"])
def test_fault_tolerance_without_scaling(tmp_path, hosts, start):
    rc, out, records = run_elastic(tmp_path, ["-np", str(start), "--min-np", "2", "-H", hosts],
                                   ["--exit-schedule", json.dumps({"1,0": [2]})])
    assert rc == 0, out[-6000:]
    ep = epochs_of(records)
    assert [r["size"] for r in ep] == [start, 2, 2], out[-4000:]
    assert [r["hostname"] for r in ep] == ["localhost", "localhost", "localhost"]
    assert "rank 2 on 127.0.0.1 failed" in out
    check_final(records)


@pytest.mark.parametrize("failing", [[0, 1, 2, 3], [0, 2]], ids=["all_ranks", "one_per_host"])
def test_all_hosts_blacklisted(tmp_path, failing):
    # Failing ranks in every job: each job blacklists the host of its first failure, until
    # no host is left (Horovod's test_all_ranks_failure and test_all_hosts_blacklisted).
    rc, out, records = run_elastic(tmp_path, ["-np", "4", "--min-np", "2", "-H", "localhost:2,127.0.0.1:2"],
                                   ["--exit-schedule", json.dumps({"1,0": failing}), "--exit-every-job"],
                                   timeout=180)
    assert rc == 1, out[-6000:]
    assert "every host has had a failed worker and is blacklisted" in out


def test_blacklisted_host_comes_back_after_cooldown(tmp_path):
    # 127.0.0.1 is blacklisted for 6-6.6 s; the job on localhost alone lasts longer than that
    # (start-up, then 7 epochs of at least 1 s), so it grows back to 4 ranks before the end.
    rc, out, records = run_elastic(tmp_path, ["-np", "4", "--min-np", "2", "--blacklist-cooldown-range", "6", "12",
                                              "-H", "localhost:2,127.0.0.1:2"],
                                   ["--exit-schedule", json.dumps({"1,0": [3]}), "--epoch-wait", "1.0"], epochs=8)
    assert rc == 0, out[-6000:]
    assert "127.0.0.1 blacklisted for 6." in out, out[-4000:]
    assert "job 1: 2 ranks on localhost:2" in out and "reset 2: hosts updated" in out
    assert "job 2: 4 ranks on localhost:2,127.0.0.1:2" in out
    assert epochs_of(records)[0]["size"] == 4 and records[-1]["size"] == 4
    check_final(records, epochs=8)


def test_min_hosts_timeout(tmp_path):
    rc, out, records = run_elastic(tmp_path, ["-np", "4", "--min-np", "4", "--elastic-timeout", "2",
                                              "-H", "localhost:2,127.0.0.1:2"],
                                   ["--exit-schedule", json.dumps({"1,0": [0]})], timeout=180)
    assert rc == 1, out[-6000:]
    assert "timed out after 2 s waiting for --min-np 4 slots (usable now: 2" in out


def test_reset_limit(tmp_path):
    logfile = tmp_path / "log.jsonl"
    schedule = [(0, ["localhost:2"]), (1, ["localhost:2", "127.0.0.1:2"]), (None, ["127.0.0.1:2"])]
    flags = ["-np", "2", "--min-np", "2", "--max-np", "4",
             "--host-discovery-script", str(discovery_script(tmp_path, logfile, schedule))]
    rc, out, _ = run_elastic(tmp_path, [*flags, "--reset-limit", "1"], ["--epoch-wait", "1.5"])
    assert rc == 1, out[-6000:]
    assert "more than --reset-limit 1" in out
    logfile.unlink()
    rc, out, records = run_elastic(tmp_path, [*flags, "--reset-limit", "2"], ["--epoch-wait", "1.5"])
    assert rc == 0, out[-6000:]
    assert len(epochs_of(records)) == 3
    check_final(records)


def test_driver_units():
    from jaxcache.elastic import driver

    assert driver.parse_host_lines("a:2\n# x\nb\n\nc:0\n", 3) == {"a": 2, "b": 3, "c": 0}
    assert driver.assign({"a": 2, "b": 2, "c": 1}, ["b"], 3) == [("b", 2), ("a", 1)]
    assert driver.assign({"a": 2, "b": 2}, [], None) == [("a", 2), ("b", 2)]
    now = [100.0]
    bl = driver.Blacklist((1.0, 4.0), clock=lambda: now[0])
    assert 1.0 <= bl.add("a") <= 1.1 and bl.blocked("a")
    now[0] += 1.2
    assert not bl.blocked("a")
    assert 2.0 <= bl.add("a") <= 2.2  # doubles per failure, capped at the range's top
    assert not driver.Blacklist(None).blocked_for_good({})
    forever = driver.Blacklist(None)
    forever.add("a")
    assert forever.blocked_for_good({"a": 2}) and not forever.blocked_for_good({"a": 2, "b": 1})


# --- Horovod's torch and Keras elastic APIs (jaxcache.torch.elastic, jaxcache.tensorflow.keras.elastic) ---

TORCH_SCRIPT = MPI_DIR / "elastic_torch_train.py"
KERAS_SCRIPT = MPI_DIR / "elastic_keras_train.py"
FOUR_RANKS_TWO_HOSTS = ["-np", "4", "--min-np", "2", "-H", "localhost:2,127.0.0.1:2"]
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


def needs(module: str):
    import importlib.util

    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


def rank_logs(logdir: Path) -> dict[str, list[dict]]:
    """Each rank's file ('rank{r}-gen{g}') as its records."""
    return {p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in sorted(logdir.glob("*.jsonl"))}


def final_of(logs: dict[str, list[dict]], generation: int) -> list[dict]:
    return [recs[-1] for name, recs in logs.items() if name.endswith(f"-gen{generation}")]


def run_bridge_through_a_failure(tmp_path: Path, script: Path, timeout: float):
    """Runs a bridge's training script on 4 ranks of 2 hosts, rank 2 failing before epoch 1's
    third batch; checks the job went on at 2 ranks. Returns (records, epoch records, logdir)."""
    logdir = tmp_path / "ranks"
    logdir.mkdir()
    rc, out, records = run_elastic(tmp_path, FOUR_RANKS_TWO_HOSTS,
                                   ["--logdir", str(logdir), "--exit-schedule", json.dumps({"1,2": [2]})],
                                   timeout=timeout, script=script)
    assert rc == 0, out[-6000:]
    assert "rank 2 on 127.0.0.1 failed" in out
    ep = epochs_of(records)
    assert [r["epoch"] for r in ep] == [0, 1, 2], out[-4000:]
    assert [r["size"] for r in ep] == [4, 2, 2]
    assert [r["generation"] for r in ep] == [0, 1, 1]
    return records, ep, logdir


@needs("torch")
def test_torch_sampler_state_through_a_failure(tmp_path):
    """Rank 2 fails before epoch 1's third batch: the job goes on at 2 ranks from the commit
    after its second. The ElasticSampler in the TorchState gives the new ranks only the samples
    not yet trained on, so every sample of every epoch is trained on exactly once; the model and
    the optimizer's momentum come back from the commit, so the weights are a serial replay's."""
    records, ep, logdir = run_bridge_through_a_failure(tmp_path, TORCH_SCRIPT, timeout=240)
    assert [r["batches"] for r in ep] == [4, 6, 8]  # epoch 1: 2 batches at 4 ranks, 4 at 2 ranks
    assert [r["commits"] for r in ep] == [4, 10, 18]  # carried through the reset
    assert ep[1]["resets_seen"] == [2]
    logs = rank_logs(logdir)
    assert sorted(logs) == ["rank0-gen0", "rank0-gen1", "rank1-gen0", "rank1-gen1", "rank2-gen0", "rank3-gen0"]
    samples = 4 * 12
    for epoch in range(3):
        seen = [i for recs in logs.values() for r in recs if r.get("epoch") == epoch for i in r["indices"]]
        counts = np.bincount(seen, minlength=samples)
        assert counts.tolist() == [1] * samples, f"epoch {epoch}: samples trained on {counts.tolist()} times"
    finals = final_of(logs, 1)
    assert len(finals) == 2 and all("digest" in f for f in finals)
    assert len({f["digest"] for f in finals}) == 1, "the ranks' final weights differ"
    plan = json.dumps([[12] * 4, [12, 12] + [6] * 4, [6] * 8])
    want = json.loads(subprocess.run([sys.executable, str(TORCH_SCRIPT), "--logfile", "-", "--print-serial", plan],
                                     capture_output=True, text=True, check=True, timeout=120).stdout)
    for k in want:
        np.testing.assert_allclose(np.asarray(records[-1]["final"][k]), np.asarray(want[k]), rtol=1e-5, atol=1e-6,
                                   err_msg=f"{k} differs from the serial replay (a batch or the momentum lost?)")


@needs("tensorflow")
def test_keras_fit_through_a_failure(tmp_path):
    """model.fit with KerasState and Horovod's three callbacks; rank 2 fails before epoch 1's
    third batch. The job finishes at 2 ranks from the commit after the second batch: the
    counters (epoch, batch), the weights and the optimizer (its step count) come back."""
    records, ep, logdir = run_bridge_through_a_failure(tmp_path, KERAS_SCRIPT, timeout=300)
    # Epoch 1: 2 batches before the reset, then a whole fit epoch (Keras does not shorten it).
    assert [r["batches"] for r in ep] == [4, 6, 4]
    finals = final_of(rank_logs(logdir), 1)
    assert len(finals) == 2
    assert len({f["digest"] for f in finals}) == 1, "the ranks' final weights differ"
    assert [f["iterations"] for f in finals] == [14, 14]  # 4 + (2 + 4) + 4 optimizer steps
    assert [f["epoch"] for f in finals] == [3, 3]


STATE_ROUND_TRIPS = {
    "torch": """
        import pickle, torch
        import jaxcache.torch as hvd
        hvd.init()
        E = hvd.elastic
        data = torch.utils.data.TensorDataset(torch.arange(10.0))

        def make(prefix):
            torch.manual_seed(0)
            m = torch.nn.Linear(3, 1)
            opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                           named_parameters=m.named_parameters(), name_prefix=prefix)
            s = E.ElasticSampler(data, seed=3)
            return m, opt, s, E.TorchState(m, opt, sampler=s, epoch=0, batch=0, extra=[1])

        def step(m, opt):
            opt.zero_grad(); m(torch.ones(2, 3)).sum().backward(); opt.step()

        m, opt, s, st = make("a")
        order = list(s)  # one rank: the whole shuffled epoch
        assert sorted(order) == list(range(10)) and len(s) == 10
        step(m, opt)
        s.record_batch(0, 4)
        st.batch, st.extra = 1, [1, 2]
        st.commit()
        w, buf = m.weight.detach().clone(), opt.state_dict()["state"][0]["momentum_buffer"].clone()
        step(m, opt); step(m, opt)
        s.record_batch(1, 4)
        st.batch = 2
        st.extra.append(3)
        st.restore()
        assert torch.equal(m.weight, w) and st.batch == 1 and st.extra == [1, 2]
        assert s.state_dict() == {"epoch": 0, "processed_num": 4}
        step(m, opt)  # the restored momentum is not the saved one: the next restore still is
        st.restore()
        assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], buf)
        snap = pickle.loads(pickle.dumps(st._snapshot()))
        m2, opt2, s2, st2 = make("b")
        st2._load_snapshot(snap)
        assert torch.equal(m2.weight, w) and st2.batch == 1 and st2.extra == [1, 2]
        assert torch.equal(opt2.state_dict()["state"][0]["momentum_buffer"], buf)
        assert s2.state_dict() == {"epoch": 0, "processed_num": 4} and len(s2) == 6
        assert list(s2) == order[4:]  # the rest of the epoch's order, nothing done twice
        st2.sync()  # one rank: broadcasts to itself
        assert torch.equal(m2.weight, w)
        s2.set_epoch(1)
        assert len(s2) == 10 and sorted(s2) == list(range(10)) and list(s2) != order  # epoch 1's own order
        hvd.shutdown()
    """,
    "tensorflow": """
        import pickle, keras, numpy as np, tensorflow as tf
        import jaxcache.tensorflow as htf
        import jaxcache.tensorflow.keras as hvd
        hvd.init()

        def make():
            keras.utils.set_random_seed(1)
            m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss="mse")
            return m, hvd.elastic.KerasState(m, epoch=0, batch=0)

        x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
        m, st = make()
        assert len(st._saved_optimizer) == len(m.optimizer.variables) > 2  # built: slots included
        m.fit(x, y, epochs=1, verbose=0)
        st.epoch = 1
        st.commit()
        weights = [v.numpy().copy() for v in m.variables]
        slots = [v.numpy().copy() for v in m.optimizer.variables]
        m.fit(x, y, epochs=1, verbose=0)
        st.epoch = 2
        st.restore()
        assert st.epoch == 1 and all(np.array_equal(a, v.numpy()) for a, v in zip(weights, m.variables))
        assert all(np.array_equal(a, v.numpy()) for a, v in zip(slots, m.optimizer.variables))
        m2, st2 = make()
        st2._load_snapshot(pickle.loads(pickle.dumps(st._snapshot())))
        assert st2.epoch == 1 and all(np.array_equal(a, v.numpy()) for a, v in zip(weights, m2.variables))
        assert all(np.array_equal(a, v.numpy()) for a, v in zip(slots, m2.optimizer.variables))
        st2.sync()
        cbs = [hvd.elastic.UpdateEpochStateCallback(st2), hvd.elastic.UpdateBatchStateCallback(st2),
               hvd.elastic.CommitStateCallback(st2, batches_per_commit=2)]
        m2.fit(x, y, epochs=2, batch_size=1, verbose=0, callbacks=cbs)
        assert (st2.epoch, st2.batch) == (3, 0)

        v = tf.Variable([1.0, 2.0])
        ts = htf.elastic.TensorFlowState([v], step=3)
        v.assign([5.0, 6.0]); ts.step = 4
        ts.restore()
        assert v.numpy().tolist() == [1.0, 2.0] and ts.step == 3
        v.assign([7.0, 8.0]); ts.step = 5
        ts.save()
        snap = pickle.loads(pickle.dumps(ts._snapshot()))
        w = tf.Variable([0.0, 0.0])
        ts2 = htf.elastic.TensorFlowState([w], step=0)
        ts2._load_snapshot(snap)
        assert w.numpy().tolist() == [7.0, 8.0] and ts2.step == 5
        ts2.sync()
        hvd.shutdown()
    """,
}


@pytest.mark.parametrize("framework", [pytest.param("torch", marks=needs("torch")),
                                       pytest.param("tensorflow", marks=needs("tensorflow"))])
def test_bridge_state_round_trips(framework):
    """One process, no driver: save/restore, and a snapshot loaded into fresh objects (what a
    restarted job does) give back the weights, the optimizer's state and the counters."""
    code = textwrap.dedent(STATE_ROUND_TRIPS[framework]) + "\nprint('round trips ok')\n"
    rc, out = run_job([sys.executable, "-c", code], TF_ENV, 180, f"{framework} state round trips timed out")
    assert rc == 0 and "round trips ok" in out, out[-6000:]


def test_elastic_digits_example(tmp_path):
    """examples/elastic_digits.py: a worker killed mid-epoch, later a host added; the
    training must end as the single-process one does (parameters and test accuracy)."""
    import socket

    log = tmp_path / "epochs.jsonl"
    third = socket.gethostname()  # a third name of this machine: the host that is added
    try:
        socket.gethostbyname(third)
    except OSError:
        pytest.skip(f"this machine's name {third!r} does not resolve (the launcher could not start on it)")
    script = tmp_path / "discover.sh"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        echo localhost:1; echo 127.0.0.1:1
        [ -f {log} ] && [ "$(grep -c epoch {log})" -ge 3 ] && echo {third}:1
        exit 0
        """))
    script.chmod(0o755)
    example = Path(__file__).parent.parent / "examples" / "elastic_digits.py"
    cmd = [sys.executable, "-m", "jaxcache.run", "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(script), str(example), "--epochs", "6", "--kill-at", "1,3,1",
           "--log", str(log), "--epoch-wait", "0.5", "--check-single"]
    rc, out = run_job(cmd, {"JAXCACHE_ELASTIC_DISCOVERY_INTERVAL": INTERVAL}, 300, "elastic_digits timed out")
    assert rc == 0, out[-6000:]
    epochs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == list(range(6)), out[-4000:]
    sizes = [e["size"] for e in epochs]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2, sizes  # lost a worker, then grew back
    assert epochs[-1]["generation"] == 2
    assert "rank 1 on 127.0.0.1 failed (the process died)" in out
    assert "check-single: accuracy" in out and ": OK" in out, out[-3000:]


def test_ctrl_c_ends_the_elastic_job(tmp_path):
    """Ctrl-C on the launcher ends the running job and every worker, and is not a reset."""
    import signal
    import time

    logfile = tmp_path / "log.jsonl"
    cmd = [sys.executable, "-m", "jaxcache.run", "-np", "2", "--min-np", "2", "-H", "localhost:1,127.0.0.1:1",
           str(SCRIPT), "--logfile", str(logfile), "--epochs", "50", "--epoch-wait", "1.0"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    # A terminal's Ctrl-C finds Python's own handler in place; a suite started in the background
    # of a non-interactive shell would hand the launcher SIGINT ignored instead.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not (logfile.exists() and logfile.read_text().count("epoch") >= 1):
            assert proc.poll() is None and time.monotonic() < deadline, "the job did not start"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out[-4000:]
    assert "reset" not in out and "job 1:" not in out, out[-4000:]
    left = subprocess.run(["pgrep", "-f", str(logfile)], capture_output=True, text=True).stdout.split()
    assert not left, f"workers still running after Ctrl-C: {left}"
