"""Multi-host on one machine: 2 processes x 4 CPU devices (gloo collectives) on one global mesh of 8.

The same training as one process with 8 devices, and checkpoints that move between the two set-ups.
"""

import os
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util

from conftest import ROOT

# every test runs commands in subprocesses; one at a time (two processes of 4 devices each fill 2 cores)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("multihost")]


def _args(instances, workdir, max_steps, extra=()):
    return ["-m", "bert_jax.train", "--config", "pretrain:tiny", "--workdir", str(workdir),
            f"--config.phases[0].data_dir={instances / 'p1'}", f"--config.phases[1].data_dir={instances / 'p2'}",
            "--config.total_steps=6", "--config.warmup_steps=2", "--config.checkpoint_every=3",
            f"--max_steps={max_steps}", *extra]


def _single(instances, workdir, max_steps, extra=(), log=None):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, *_args(instances, workdir, max_steps, extra)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    if log is not None:
        log.append(result.stderr)
    return result.stdout.strip().splitlines()[-1]


def _two_processes(instances, workdir, max_steps, extra=(), log=None):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    procs = [subprocess.Popen([sys.executable, *_args(instances, workdir, max_steps, extra),
                               f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    if log is not None:
        log.append(outs[0][1])
    return outs[0][0].strip().splitlines()[-1]  # process 0 prints the metrics


def _state(workdir, step, like=None):
    """The TrainState tree of a checkpoint, on one local device. `like`: a state tree whose shapes
    give the target (needed when the writer's devices, e.g. two processes', are not this process's)."""
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(str(workdir / "checkpoints"), item_names=("state", "data", "config"),
                               options=ocp.CheckpointManagerOptions(read_only=True)) as m:
        target = None
        if like is not None:
            device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            target = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), like)
        restored = m.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
    return restored["state"]


def _params(state):
    return traverse_util.flatten_dict(jax.device_get(state["params"]), sep="/")


def _copy_checkpoint(src, dst, step):
    """A workdir holding only checkpoint `step` of `src` (as if that run had stopped there)."""
    keep = str(step)
    shutil.copytree(src / "checkpoints", dst / "checkpoints",
                    ignore=lambda d, names: [n for n in names if d == str(src / "checkpoints") and n.isdigit()
                                             and n != keep])


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-7, err_msg=k)


@pytest.mark.slow
def test_two_hosts_train_like_one_and_checkpoints_move_between_them(instances, tmp_path):
    one = _single(instances, tmp_path / "one", 6)
    two = _two_processes(instances, tmp_path / "two", 6)
    import json

    m1, m2 = json.loads(one), json.loads(two)
    assert m1["step"] == m2["step"] == 6
    assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5)
    reference = _state(tmp_path / "one", 6)
    _assert_same(_params(_state(tmp_path / "two", 6, like=reference)), _params(reference))
    # 1 process -> 2 processes: resume the single-process run's step-3 checkpoint on two hosts (the resumed
    # run crosses the phase switch at step 5).
    _copy_checkpoint(tmp_path / "one", tmp_path / "handoff", 3)
    _two_processes(instances, tmp_path / "handoff", 6)
    _assert_same(_params(_state(tmp_path / "handoff", 6, like=reference)), _params(reference))
    # 2 processes -> 1 process: resume the two-host step-3 checkpoint in one process.
    _copy_checkpoint(tmp_path / "two", tmp_path / "back", 3)
    _single(instances, tmp_path / "back", 6)
    _assert_same(_params(_state(tmp_path / "back", 6, like=reference)), _params(reference))


@pytest.mark.slow
def test_two_hosts_resume_packed_data_each_from_its_own_state(instances, documents, tmp_path):
    """Packed rows from dynamic instances differ per process, and so does each process's grain state: a
    two-process run stopped at step 3 and resumed ends with the parameters of the uninterrupted run."""
    extra = (f"--config.phases[0].data_dir={documents}", "--config.phases[0].packing=True",
             "--config.phases[1].packing=True")
    _two_processes(instances, tmp_path / "whole", 6, extra)
    _two_processes(instances, tmp_path / "resumed", 3, extra)
    _two_processes(instances, tmp_path / "resumed", 6, extra)
    from bert_jax import checkpointing, engine, sharding, train
    from bert_jax.configs import pretrain

    config = pretrain.get_config("tiny")
    model, (tx, _) = train.create_model(config), engine.create_optimizer(config)
    abstract, shardings = engine.state_shardings(train.state_init(model, tx, 0),
                                                  sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    like = checkpointing.abstract_like(abstract, shardings).params

    def params(run):
        restored = checkpointing.restore_params(str(tmp_path / run / "checkpoints"), like, step=6)
        return traverse_util.flatten_dict(jax.device_get(restored), sep="/")

    whole, resumed = params("whole"), params("resumed")
    for k in whole:
        np.testing.assert_array_equal(resumed[k], whole[k], err_msg=k)


@pytest.mark.slow
def test_packed_dynamic_input_resumes_on_another_process_count(instances, documents, tmp_path):
    """Packed rows of dynamic instances: a two-process checkpoint at step 3 continues in one process, and a
    one-process checkpoint on two, each saying in one line that the input is re-split (the documents drawn
    across such a restart: tests/test_stream.py); the run then checkpoints the new order and finishes."""
    import json

    extra = (f"--config.phases[0].data_dir={documents}", "--config.phases[0].packing=True",
             "--config.phases[1].packing=True")
    log = []
    _two_processes(instances, tmp_path / "two", 3, extra)
    final = json.loads(_single(instances, tmp_path / "two", 6, extra, log))
    _single(instances, tmp_path / "one", 3, extra)
    final_two = json.loads(_two_processes(instances, tmp_path / "one", 6, extra, log))
    for text, (old, new) in zip(log, ((2, 1), (1, 2))):
        notices = [line for line in text.splitlines() if "re-split" in line]
        assert len(notices) == 1, text[-2000:]
        assert notices[0].startswith(f"train: phase 0's input ran on {old} processes, this run has {new}: "
                                     f"it continues in epoch "), notices[0]
        assert "not bit-identical" in notices[0]
    assert final["step"] == 6 and final_two["step"] == 6
    assert np.isfinite(final["loss"]) and np.isfinite(final_two["loss"])
