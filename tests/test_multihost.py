"""Multi-host on one machine: 2 processes x 2 CPU devices (gloo collectives) on one global mesh of 4, on the
sample text under the small vocabulary (`tests/conftest.py`).

Checkpoints move between one process with 4 devices and two hosts, which train alike; packed dynamic input
resumes on two hosts bit for bit and on another process count.
Every run has 6 steps (phase switch after step 5) and checkpoints at steps 2, 4, 5 and 6; a run "stopped at
step k and resumed" is a new workdir holding only checkpoint k of an uninterrupted run (`_copy_checkpoint`:
the same files a run stopped by --max_steps=k writes, the data position included), then resumed.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import traverse_util

from conftest import ROOT, SMALL_VOCAB_SIZE, xla_flags

# every test runs commands in subprocesses; one test at a time (two processes fill 2 cores): each uses a
# module-scoped fixture, so tests/conftest.py puts them in one xdist group.
pytestmark = pytest.mark.integration

DEVICES = 4  # global; two processes hold DEVICES // 2 each
STEPS = 6


def _args(instances, workdir, extra=()):
    return ["-m", "bert_jax.train", "--config", "pretrain:tiny", "--workdir", str(workdir),
            f"--config.phases[0].data_dir={instances / 'p1'}", f"--config.phases[1].data_dir={instances / 'p2'}",
            f"--config.total_steps={STEPS}", "--config.warmup_steps=2", "--config.checkpoint_every=2",
            "--config.keep_checkpoints=4", "--config.phases[0].batch_size=8", "--config.phases[1].batch_size=8",
            f"--config.model.vocab_size={SMALL_VOCAB_SIZE}", *extra]


def _single(instances, workdir, extra=(), log=None):
    """One process with DEVICES devices; returns its metrics line (parsed)."""
    env = dict(os.environ, XLA_FLAGS=xla_flags(DEVICES), JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, *_args(instances, workdir, extra)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    if log is not None:
        log.append(result.stderr)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _start_two(instances, workdir, extra=()) -> list[subprocess.Popen]:
    """Starts two processes with DEVICES // 2 devices each (gloo collectives, a free coordinator port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_FLAGS=xla_flags(DEVICES // 2), JAX_PLATFORMS="cpu",
               JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    return [subprocess.Popen([sys.executable, *_args(instances, workdir, extra),
                              f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)]


def _two_processes(instances, workdir, extra=(), log=None):
    """Two processes with DEVICES // 2 devices each; returns process 0's metrics line (parsed)."""
    procs = _start_two(instances, workdir, extra)
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    if log is not None:
        log.append(outs[0][1])
    return json.loads(outs[0][0].strip().splitlines()[-1])  # process 0 prints the metrics


def _copy_checkpoint(src, dst, step):
    """A workdir holding only checkpoint `step` of `src` (as if that run had stopped there)."""
    keep = str(step)
    shutil.copytree(src / "checkpoints", dst / "checkpoints",
                    ignore=lambda d, names: [n for n in names if d == str(src / "checkpoints") and n.isdigit()
                                             and n != keep])


@pytest.fixture(scope="module")
def params_of():
    """(workdir, step) -> the flat {path: array} parameters of that checkpoint, read onto one local device
    (whatever devices and processes wrote it)."""
    from bert_jax.checkpoints import checkpointing
    from bert_jax.training import pretraining, sharding, steps
    from bert_jax.configs import pretrain

    config = pretrain.get_config("tiny")
    config.model.vocab_size = SMALL_VOCAB_SIZE
    model, (tx, _) = pretraining.create_model(config), steps.create_optimizer(config)
    abstract, shardings = steps.state_shardings(pretraining.state_init(model, tx, 0),
                                                  sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    like = checkpointing.abstract_like(abstract, shardings).params

    def params(workdir, step):
        restored = checkpointing.restore_params(str(workdir / "checkpoints"), like, step=step)
        return traverse_util.flatten_dict(jax.device_get(restored), sep="/")

    return params


def _steps_of(workdir):
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def _assert_close(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-7, err_msg=k)


@pytest.mark.slow
def test_two_hosts_train_like_one_and_checkpoints_move_between_them(small_instances, params_of, tmp_path):
    """1 process -> 2 processes: the single-process run's step-2 checkpoint resumed on two hosts, which cross the
    phase switch (after step 5) and write the single-process run's checkpoints at steps 4 and 6; 2 processes ->
    1 process: the two hosts' step-4 checkpoint resumed in one process ends the same."""
    one = _single(small_instances, tmp_path / "one")
    assert one["step"] == STEPS
    reference = params_of(tmp_path / "one", STEPS)
    _copy_checkpoint(tmp_path / "one", tmp_path / "two", 2)
    two = _two_processes(small_instances, tmp_path / "two")
    assert two["step"] == STEPS and two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    _assert_close(params_of(tmp_path / "two", 4), params_of(tmp_path / "one", 4))
    _assert_close(params_of(tmp_path / "two", STEPS), reference)
    _copy_checkpoint(tmp_path / "two", tmp_path / "back", 4)
    assert _single(small_instances, tmp_path / "back")["loss"] == pytest.approx(one["loss"], rel=1e-5)
    _assert_close(params_of(tmp_path / "back", STEPS), reference)


PACKED = ("--config.phases[0].packing=True", "--config.phases[1].packing=True")


@pytest.fixture(scope="module")
def packed_two(small_instances, small_documents, tmp_path_factory):
    """(workdir, extra flags) of an uninterrupted two-process run on packed dynamic input (phase 0: rows packed
    from instances drawn from tokenized documents; phase 1: packed static instances)."""
    extra = (f"--config.phases[0].data_dir={small_documents}", *PACKED)
    workdir = tmp_path_factory.mktemp("packed") / "whole"
    assert _two_processes(small_instances, workdir, extra)["step"] == STEPS
    return workdir, extra


@pytest.mark.slow
def test_two_hosts_resume_packed_data_each_from_its_own_state(small_instances, packed_two, params_of, tmp_path):
    """Packed rows from dynamic instances differ per process, and so does each process's grain state: a
    two-process run stopped at step 4 and resumed (step 5 draws from the restored states) ends with the
    parameters of the uninterrupted run, bit for bit."""
    whole, extra = packed_two
    _copy_checkpoint(whole, tmp_path / "resumed", 4)
    _two_processes(small_instances, tmp_path / "resumed", extra)
    expected, resumed = params_of(whole, STEPS), params_of(tmp_path / "resumed", STEPS)
    assert expected.keys() == resumed.keys()
    for k in expected:
        np.testing.assert_array_equal(resumed[k], expected[k], err_msg=k)


@pytest.mark.slow
def test_packed_dynamic_input_resumes_on_another_process_count(small_instances, packed_two, tmp_path):
    """Packed rows of dynamic instances: the two-process run's step-2 checkpoint continues in one process,
    saying in one line that the input is re-split (the documents drawn across such a restart, either way:
    tests/test_stream.py); it checkpoints the new order and finishes."""
    whole, extra = packed_two
    log = []
    _copy_checkpoint(whole, tmp_path / "one", 2)
    final = _single(small_instances, tmp_path / "one", extra, log)
    notices = [line for line in log[0].splitlines() if "re-split" in line]
    assert len(notices) == 1, log[0][-2000:]
    assert notices[0].startswith("train: phase 0's input ran on 2 processes, this run has 1: it continues in epoch "), \
        notices[0]
    assert "not bit-identical" in notices[0]
    assert final["step"] == STEPS and np.isfinite(final["loss"])
    assert 4 in _steps_of(tmp_path / "one")  # the re-split order checkpointed


@pytest.mark.slow
def test_a_lost_process_stops_the_other_in_one_line_and_the_pair_resumes(small_instances, packed_two, params_of,
                                                                           tmp_path):
    """Process 1 SIGKILLed after the first checkpoint: process 0 exits with status 75 within --process_timeout (plus
    the watchdog's interval and start-up slack) with one line naming process 1 as its last, no fatal-error dump;
    the pair started again resumes from the newest checkpoint and ends with the uninterrupted run's parameters,
    bit for bit."""
    whole, extra = packed_two
    timeout = 8
    procs = _start_two(small_instances, tmp_path, (*extra, f"--process_timeout={timeout}"))
    deadline = time.time() + 300
    while not ((tmp_path / "checkpoints").is_dir() and _steps_of(tmp_path)) and time.time() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs]
        time.sleep(0.05)
    procs[1].kill()
    killed = time.time()
    _, err = procs[0].communicate(timeout=timeout * 3 + 60)
    elapsed = time.time() - killed
    procs[1].communicate()
    assert procs[0].returncode == 75, err[-3000:]
    assert elapsed < timeout + 10, elapsed
    last = err.strip().splitlines()[-1]
    assert last.startswith("train: lost process 1 of 2 (no heartbeat for ") and last.endswith(
        "more than --process_timeout=8): it crashed or its host is gone; stopping (status 75): restart the whole run "
        "to resume from the newest checkpoint"), last
    assert "Check failure" not in err and "Traceback" not in err and "Terminating process" not in err, err[-3000:]
    stopped_at = max(_steps_of(tmp_path))
    assert stopped_at < STEPS
    log = []
    _two_processes(small_instances, tmp_path, extra, log)
    assert f"train: resumed from the checkpoint at step {stopped_at}" in log[0], log[0][-2000:]
    expected, resumed = params_of(whole, STEPS), params_of(tmp_path, STEPS)
    for k in expected:
        np.testing.assert_array_equal(resumed[k], expected[k], err_msg=k)
