"""Long runs that survive their own failures: a loss spike or a non-finite step rolled back (bert_jax.training.guards.rollback),
one run per workdir (bert_jax.training.guards.lease), and a lost host."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from bert_jax.data.pretraining import procedure
from bert_jax.training import pretraining
from bert_jax.training.guards import rollback
from conftest import ROOT, SMALL_VOCAB_SIZE
from test_train import _cmd, _config, _env, _final_params, _steps

SPIKE_BATCH, NAN_BATCH = 9, 15  # the batches (0-based, in the order the run draws them) planted in the data
GUTENBERG_LINES = 3000


def _fingerprint(input_ids) -> bytes:
    ids = np.asarray(input_ids, np.int32)
    return ids[: int(np.count_nonzero(ids))].tobytes()


@pytest.fixture(scope="module")
def poisoned(data_dir, small_vocab, small_instances, tmp_path_factory):
    """Phase 1: static instances (64 / 10) from the first GUTENBERG_LINES lines of Gutenberg under the training tests'
    vocabulary, an epoch of more batches than the runs here draw, so that each planted instance is met once; phase 2:
    the training tests' own. Two batches of phase 1 planted, found by drawing the batches as a run draws them: every
    instance of batch SPIKE_BATCH predicts a rare token at each masked position (a batch of extreme loss), and one
    instance of batch NAN_BATCH holds a token id past the vocabulary (its embedding row, and so the loss, is NaN:
    `jnp.take`'s fill mode)."""
    from bert_jax.data import corpus, tokenization

    out = tmp_path_factory.mktemp("poisoned")
    shutil.copytree(small_instances / "p2", out / "p2")
    lines = (data_dir / "corpus" / "gutenberg-sentences.txt").read_text(encoding="utf-8").splitlines()[:GUTENBERG_LINES]
    (out / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    procedure.create_pretraining_data(
        corpus.read_sentence_documents([str(out / "text.txt")], corpus.ReadStats()),
        tokenization.Tokenizer(str(small_vocab)), str(out / "p1"), dupe_factor=1, num_shards=2, random_seed=5,
        options=procedure.InstanceOptions(max_seq_length=64, max_predictions_per_seq=10))
    config = _config(out)
    phase = pretraining.resolve_phases(config)[0]
    it = pretraining.iterator(phase, config, None)
    batches = [next(it) for _ in range(NAN_BATCH + 1)]
    it.close()
    spike = {_fingerprint(row) for row in batches[SPIKE_BATCH]["input_ids"]}
    nan = {_fingerprint(batches[NAN_BATCH]["input_ids"][0])}
    shards = {shard: _read_all(shard) for shard in sorted((out / "p1").glob("*.array_record"))}
    labels = [procedure.decode_instance(r, 64, 10) for records in shards.values() for r in records]
    counts = np.bincount(np.concatenate([x["masked_lm_ids"][x["masked_lm_weights"] > 0] for x in labels]),
                         minlength=SMALL_VOCAB_SIZE)
    # the tokens masked positions of phase 1 predict least often (special tokens aside), one per planted target: with
    # the MLM bias at the targets' log prior, each costs nats more than a common one
    rare = iter((5 + np.argsort(counts[5:], kind="stable")).tolist())
    planted = {"spike": 0, "nan": 0}
    for shard, records in shards.items():
        writer = ArrayRecordWriter(str(shard), "group_size:1")
        for record in records:
            values = np.frombuffer(record, "<i4").copy()
            n, k = int(values[0]), int(values[1])
            key = values[4: 4 + n].tobytes()
            if key in spike:
                values[4 + n + k:] = [next(rare) for _ in range(k)]  # every masked position's label: a rare token
                planted["spike"] += 1
            elif key in nan:
                values[4 + n - 2] = SMALL_VOCAB_SIZE + 7  # an id past the vocabulary: a NaN embedding row
                planted["nan"] += 1
            writer.write(values.tobytes())
        writer.close()
    assert planted["spike"] >= 8 and planted["nan"] >= 1, planted
    return out


def _read_all(shard) -> list[bytes]:
    reader = ArrayRecordReader(str(shard))
    try:
        return reader.read_all()
    finally:
        reader.close()


def _rollback_config(data, **overrides):
    """The training tests' tiny config on one device, checkpoints every 4 steps, the MLM bias started at the masked
    targets' log prior (from step 0 a rare target costs nats more than a common one: the planted batch is a spike)."""
    config = _config(data, checkpoint_every=4, log_every=1, total_steps=24, warmup_steps=4, mlm_bias_init="log_prior")
    config.mesh.num_devices = 1
    config.rollback.update(warmup_steps=5, spike_sigmas=6.0, max_rollbacks=3, window_steps=50)
    config.rollback.update(overrides)
    return config


def _records(workdir, prefix):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["prefix"] == prefix]


@pytest.mark.slow
def test_a_spike_and_a_non_finite_step_are_rolled_back_and_skipped(poisoned, tmp_path, capfd):
    """The planted spike and NaN batches: each restores the newest checkpoint, skips the batches drawn since it (the
    bad one included) and goes on; the run ends at its last step with finite parameters; each rollback is one console
    line and a metrics.jsonl record. Every step is logged (so checked before the next is dispatched): the spike is
    the run's step SPIKE_BATCH, the NaN batch the step NAN_BATCH less the batches the first rollback skipped."""
    metrics = pretraining.train_and_evaluate(_rollback_config(poisoned), str(tmp_path))
    assert metrics["step"] == 24 and np.isfinite(metrics["loss"])
    lines = [line for line in capfd.readouterr().err.splitlines() if "rolled back" in line]
    spike, nan = _records(tmp_path, "rollback")
    assert spike["step"] == SPIKE_BATCH and spike["to_step"] == 8 and spike["skipped_batches"] == SPIKE_BATCH + 1 - 8
    assert spike["loss"] > 1.5 * _records(tmp_path, "train")[SPIKE_BATCH - 1]["loss"]  # the one logged before
    assert nan["step"] == NAN_BATCH - spike["skipped_batches"] and "loss" not in nan
    assert lines == [
        f"train: loss spike {spike['loss']:.4g} (running mean {lines[0].split('running mean ')[1].split(',')[0]}, std "
        f"{lines[0].split('std ')[1].split(')')[0]}) at step {SPIKE_BATCH}: rolled back to the checkpoint at step 8, "
        f"skipping the {spike['skipped_batches']:.0f} batches drawn since it",
        f"train: non-finite loss nan (gradient norm nan) at step {nan['step']}: rolled back to the checkpoint at step "
        f"{nan['to_step']:.0f}, skipping the {nan['skipped_batches']:.0f} batches drawn since it"]
    final = _final_params(tmp_path, 24)
    assert all(np.isfinite(v).all() for v in final.values())


@pytest.mark.slow
def test_without_rollback_the_bad_step_stops_the_run(poisoned, tmp_path):
    """config.rollback.enabled=False: the spike goes unnoticed, the NaN batch stops the run in one line as before."""
    config = _rollback_config(poisoned, enabled=False)
    with pytest.raises(FloatingPointError, match=r"^non-finite loss nan \(gradient norm nan\) at step "
                                                 rf"{NAN_BATCH}; the last checkpoint is kept$"):
        pretraining.train_and_evaluate(config, str(tmp_path))


@pytest.mark.slow
def test_a_diverging_learning_rate_stops_after_max_rollbacks(small_instances, tmp_path):
    """A learning-rate spike that lasts (resumed at 1e12): each rollback diverges again; the third within the window
    is the last, then the run stops in one line naming the limit."""
    config = _rollback_config(small_instances, max_rollbacks=2)
    pretraining.train_and_evaluate(config, str(tmp_path), max_steps=4)
    config.learning_rate = 1e12
    with pytest.raises(FloatingPointError, match=r"at step \d+, after 2 rollbacks within 50 steps "
                                                 r"\(config.rollback.max_rollbacks, window_steps\); the last "
                                                 r"checkpoint is kept$"):
        pretraining.train_and_evaluate(config, str(tmp_path))
    assert len(_records(tmp_path, "rollback")) == 2 and _steps(tmp_path)[-1] == 4


def test_guard_statistics_hand_computed():
    """The running mean and variance (West's exponentially weighted form) on a hand-computed series, the spike test's
    threshold, the warm-up, the window of max_rollbacks, and the state round trip."""
    settings = rollback.Settings(enabled=True, spike_sigmas=2.0, warmup_steps=3, ema_decay=0.5, max_rollbacks=2,
                                 window_steps=10)
    guard = rollback.Guard(settings)
    for step, loss in enumerate([4.0, 2.0, 3.0]):
        assert guard.verdict(step, loss, 1.0) is None
    # mean: 4 -> 3 -> 3; var: 0 -> 0.5 * (0 + 0.5 * 4) = 1 -> 0.5 * (1 + 0) = 0.5
    assert (guard.mean, guard.var, guard.count) == (3.0, 0.5, 3)
    assert guard.verdict(3, 3.0 + 2 * 0.5 ** 0.5 - 1e-9, 1.0) is None  # under mean + 2 std
    mean, std = guard.mean, guard.var ** 0.5
    assert guard.verdict(4, mean + 2 * std + 1e-6, 1.0).startswith("loss spike ")
    assert guard.verdict(5, float("inf"), 1.0) == "non-finite loss inf (gradient norm 1.0)"
    assert guard.allow(10) and guard.allow(15) and not guard.allow(19) and guard.allow(25)
    copy = rollback.Guard(settings)
    copy.load(json.loads(json.dumps(guard.state())))
    assert copy.state() == guard.state()
    guard.restart()
    assert guard.count == 0 and guard.verdict(6, 100.0, 1.0) is None  # warming up again
    with pytest.raises(ValueError, match=r"^config.rollback.ema_decay=1.0 must be in \(0, 1\)$"):
        rollback.Settings.from_config(dict(settings.__dict__, ema_decay=1.0))


def _lease(workdir):
    path = workdir / "lease.json"
    return json.loads(path.read_text()) if path.is_file() and path.read_text() else None


@pytest.mark.slow
@pytest.mark.integration
def test_one_run_per_workdir(small_instances, tmp_path):
    """Two `python -m bert_jax.train` on one workdir, started seconds apart: the second exits non-zero with one line
    naming the first (host, process) and writes nothing; the first goes on. SIGKILLed, the first leaves its lease,
    which the next run takes over at once (its process is gone) with one line, then finishes and gives it back."""
    first = subprocess.Popen(_cmd(small_instances, tmp_path, total_steps=10_000, extra=["--config.checkpoint_every=1000"]),
                             cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    # Until the first run has logged a step: then every name it makes in its first 1,000 steps is there.
    while time.time() < deadline and not ((tmp_path / "tensorboard").is_dir() and (tmp_path / "metrics.jsonl").exists()):
        assert first.poll() is None, first.communicate()[1][-3000:]
        time.sleep(0.1)
    holder = _lease(tmp_path)
    assert holder["pid"] == first.pid and holder["job"] == "train"
    run_files = ("bert_config.json", "vocab.txt", "tokenizer_config.json")  # what a run writes first, once
    before = sorted(p.name for p in tmp_path.iterdir()), {name: (tmp_path / name).stat() for name in run_files}
    second = subprocess.run(_cmd(small_instances, tmp_path, total_steps=10_000), cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 1 and "Traceback" not in second.stderr
    (line,) = second.stderr.strip().splitlines()
    assert line.startswith(f"train: --workdir {tmp_path} is in use by train on host {holder['host']} (process "
                           f"{first.pid}), started ") and "(config.lease_timeout_s)" in line, line
    after = sorted(p.name for p in tmp_path.iterdir()), {name: (tmp_path / name).stat() for name in run_files}
    assert after[0] == before[0]  # no new file or folder
    for name in run_files:  # not rewritten (a rewrite replaces the file: another inode, another mtime)
        assert (after[1][name].st_ino, after[1][name].st_mtime_ns) == (before[1][name].st_ino, before[1][name].st_mtime_ns)
    assert first.poll() is None and _lease(tmp_path)["run"] == holder["run"]
    first.kill()
    first.communicate()
    third = subprocess.run(_cmd(small_instances, tmp_path, total_steps=4), cwd=ROOT, env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    taken = [line for line in third.stderr.splitlines() if "took over the lease" in line]
    assert len(taken) == 1 and taken[0].startswith(f"train: took over the lease of --workdir {tmp_path} from train on "
                                                   f"host {holder['host']} (process {first.pid})") and \
        taken[0].endswith("(its process is gone)"), taken
    assert _lease(tmp_path) is None


def test_a_stale_lease_elsewhere_is_taken_over_and_a_lost_lease_stops_the_holder(tmp_path):
    """Leases of another host: fresh, a second taker is refused; with a heartbeat older than the timeout, it is taken
    over. A holder whose lease was taken over meanwhile stops at its next check, in one line; its release then leaves
    the new holder's lease alone."""
    from bert_jax.training.guards import lease

    other = {"run": "r0", "job": "train", "host": "another-host", "pid": 1, "started": time.time() - 50}
    (tmp_path / "lease.json").write_text(json.dumps(dict(other, heartbeat=time.time() - 5)))
    with pytest.raises(lease.WorkdirInUse, match=r"is in use by train on host another-host \(process 1\), started .*, "
                                                 r"last heartbeat 5 s ago: one run"):
        lease.acquire(str(tmp_path), "squad", timeout_s=30, heartbeat_s=10)
    (tmp_path / "lease.json").write_text(json.dumps(dict(other, heartbeat=time.time() - 31)))
    held = lease.acquire(str(tmp_path), "squad", timeout_s=30, heartbeat_s=0.2)
    assert _lease(tmp_path)["job"] == "squad"
    held.check()
    (tmp_path / "lease.json").write_text(json.dumps(dict(other, run="r1", heartbeat=time.time())))  # taken over
    deadline = time.time() + 10
    while held.lost is None and time.time() < deadline:
        time.sleep(0.05)
    with pytest.raises(lease.WorkdirInUse, match=r"this run's lease was taken over by train on host another-host"):
        held.check()
    held.release()
    assert _lease(tmp_path)["run"] == "r1"


ROLLBACK_FLAGS = ("--config.mlm_bias_init=log_prior", "--config.rollback.warmup_steps=5", "--config.log_every=1")


@pytest.mark.slow
@pytest.mark.integration
def test_a_run_with_a_rollback_killed_and_resumed_ends_bit_identical(poisoned, tmp_path):
    """The planted spike rolled back in a run (checkpoints every 3 steps), SIGKILLed as soon as it says so: the run
    started again resumes from its newest checkpoint, meets the same batches and decisions, and ends with the
    parameters of the same run uninterrupted, bit for bit (the guard's statistics and rollback record come back with
    the checkpoint)."""
    whole = subprocess.run(_cmd(poisoned, tmp_path / "whole", total_steps=24, extra=ROLLBACK_FLAGS), cwd=ROOT,
                           env=_env(), capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert sum("rolled back" in line for line in whole.stderr.splitlines()) == 1, whole.stderr[-3000:]
    run = subprocess.Popen(_cmd(poisoned, tmp_path / "run", total_steps=24, extra=ROLLBACK_FLAGS), cwd=ROOT,
                           env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in run.stderr:
        if "rolled back" in line:
            run.kill()
            break
    run.communicate()
    assert run.returncode == -signal.SIGKILL, "the run ended before its rollback"
    killed_at = max(_steps(tmp_path / "run"))
    assert killed_at < 24
    resumed = subprocess.run(_cmd(poisoned, tmp_path / "run", total_steps=24, extra=ROLLBACK_FLAGS), cwd=ROOT,
                             env=_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"train: resumed from the checkpoint at step {killed_at}" in resumed.stderr
    expected, got = _final_params(tmp_path / "whole", 24), _final_params(tmp_path / "run", 24)
    for k in expected:
        np.testing.assert_array_equal(got[k], expected[k], err_msg=k)


@pytest.mark.integration
def test_a_finetuning_job_on_a_held_workdir_stops_in_one_line(tmp_path):
    """The fine-tuning jobs hold the same lease: a GLUE job on a workdir whose lease a live process of this host
    holds stops before anything else with one line naming it, leaving the lease as it was."""
    import socket

    holder = {"run": "r", "job": "train", "host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
              "heartbeat": time.time()}
    (tmp_path / "lease.json").write_text(json.dumps(holder))
    result = subprocess.run([sys.executable, "-m", "bert_jax.tasks.glue", "--config", "glue:mrpc", "--workdir",
                             str(tmp_path)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"glue: --workdir {tmp_path} is in use by train on host {holder['host']} (process "
                           f"{os.getpid()})"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lease.json"] and _lease(tmp_path) == holder
