"""Unreadable and unwritable checkpoints: a corrupt newest checkpoint is moved aside and the run resumes
bit-identically from the previous one; none readable is a one-line error; a full disk during an
asynchronous save is a one-line error that leaves the earlier checkpoints restorable."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from flax import traverse_util

from bert_jax import checkpointing, modeling, sharding, train
from bert_jax.tasks import finetune
from configs import glue as glue_config
from configs import pretrain
from conftest import ROOT


def _config(instances, total_steps=6):
    config = pretrain.get_config("tiny")
    config.phases = [pretrain.phase(64, 10, 1.0, str(instances / "p1"), 8)]
    config.total_steps, config.warmup_steps, config.checkpoint_every, config.log_every = total_steps, 2, 2, 2
    config.mesh.num_devices = 1
    return config


def _params(workdir, config, step):
    mesh = train.make_mesh(config)
    model = train.create_model(config)
    tx, _ = train.create_optimizer(config)
    abstract, shardings = train.state_shardings(model, tx, mesh)
    ckpt = checkpointing.Checkpointer(str(workdir / "checkpoints"), async_save=False)
    state, _ = ckpt.restore(step, checkpointing.abstract_like(abstract, shardings))
    ckpt.close()
    return traverse_util.flatten_dict(jax.device_get(state.params), sep="/")


def _truncate_largest_array_file(step_dir, every=False):
    """Halves the largest array data file of a checkpoint (every data file with `every`: a reader of
    only some arrays, such as fine-tuning's encoder restore, may not touch the largest)."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir / "state") for f in fs if "/d/" in os.path.join(d, f)]
    for path in files if every else [max(files, key=os.path.getsize)]:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)


@pytest.fixture(scope="module")
def uninterrupted(instances, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    config = _config(instances)
    train.train_and_evaluate(config, str(workdir))
    return _params(workdir, config, 6)


def test_truncated_newest_checkpoint_resumes_from_the_previous_bit_identically(instances, uninterrupted, tmp_path,
                                                                                capsys):
    config = _config(instances)
    train.train_and_evaluate(config, str(tmp_path), max_steps=4)  # checkpoints 2 and 4
    _truncate_largest_array_file(tmp_path / "checkpoints" / "4")
    capsys.readouterr()
    train.train_and_evaluate(config, str(tmp_path))  # 4 is unreadable: from 2 to 6
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "unreadable" in line]
    assert len(lines) == 1 and lines[0].startswith("checkpoint 4 in ") and "moved to" in lines[0], err
    assert "train: resumed from the checkpoint at step 2" in err
    assert (tmp_path / "checkpoints" / "4.unreadable" / "state").is_dir()  # kept, not deleted
    resumed = _params(tmp_path, config, 6)
    assert resumed.keys() == uninterrupted.keys()
    for k in resumed:
        np.testing.assert_array_equal(resumed[k], uninterrupted[k], err_msg=k)


@pytest.mark.parametrize("damage", ["missing_item", "metadata"])
def test_incomplete_newest_checkpoint_falls_back(damage, instances, tmp_path, capsys):
    config = _config(instances, total_steps=4)
    train.train_and_evaluate(config, str(tmp_path))
    step_dir = tmp_path / "checkpoints" / "4"
    if damage == "missing_item":
        shutil.rmtree(step_dir / "data")
    else:
        (step_dir / "_CHECKPOINT_METADATA").write_text("{not json")
    mesh = train.make_mesh(config)
    model = train.create_model(config)
    tx, _ = train.create_optimizer(config)
    abstract, shardings = train.state_shardings(model, tx, mesh)
    ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
    step, _, data = ckpt.restore_newest_readable(checkpointing.abstract_like(abstract, shardings))
    assert step == 2 and data["phase"] == 0 and ckpt.all_steps() == [2]
    ckpt.close()
    assert "checkpoint 4 in" in capsys.readouterr().err


def test_no_readable_checkpoint_is_one_line_from_the_cli(instances, tmp_path):
    config = _config(instances, total_steps=4)
    train.train_and_evaluate(config, str(tmp_path))
    for step in (2, 4):
        _truncate_largest_array_file(tmp_path / "checkpoints" / str(step))
    cmd = [sys.executable, "-m", "bert_jax.train", "--config", str(ROOT / "configs" / "pretrain.py:tiny"),
           f"--workdir={tmp_path}", f"--config.phases[0].data_dir={instances / 'p1'}", "--config.phases[1].data_dir="
           f"{instances / 'p2'}", "--config.mesh.num_devices=1"]
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("train: ")]
    assert errors == [f"train: {tmp_path / 'checkpoints'}: no readable checkpoint (steps [2, 4] are unreadable and "
                      "were moved aside as <step>.unreadable)"], result.stderr
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2.unreadable", "4.unreadable"]


def test_shape_mismatch_is_a_config_error_not_corruption(instances, tmp_path):
    config = _config(instances, total_steps=2)
    train.train_and_evaluate(config, str(tmp_path))
    config.model.hidden_size, config.model.intermediate_size = 64, 256
    with pytest.raises(checkpointing.CheckpointMismatch, match="has shape"):
        train.train_and_evaluate(config, str(tmp_path))
    assert (tmp_path / "checkpoints" / "2").is_dir()  # left in place


def test_finetuning_restore_falls_back_to_the_previous_checkpoint(instances, tmp_path, capsys):
    config = _config(instances, total_steps=4)
    train.train_and_evaluate(config, str(tmp_path))
    expected = _params(tmp_path, config, 2)
    _truncate_largest_array_file(tmp_path / "checkpoints" / "4", every=True)
    capsys.readouterr()
    ft = glue_config.get_config("sst2")
    ft.init_checkpoint = str(tmp_path)
    init = finetune.resolve_init(ft)
    model = modeling.BertForSequenceClassification(init.config, num_labels=2)
    tx, _ = finetune.create_optimizer(ft, 10)
    state, _ = finetune.create_state(model, tx, sharding.make_mesh(1, 1, 1, jax.devices()[:1]), init, seed=0)
    encoder = traverse_util.flatten_dict(jax.device_get(state.params["bert"]), sep="/")
    for k, v in encoder.items():
        np.testing.assert_array_equal(v, expected[f"bert/{k}"], err_msg=k)
    assert "checkpoint 4 in" in capsys.readouterr().err
    assert (tmp_path / "checkpoints" / "4.unreadable").is_dir()


_DISK_FULL = textwrap.dedent("""
    import json, os, sys
    from bert_jax import checkpointing, train
    from configs import pretrain
    workdir, data = sys.argv[1], sys.argv[2]
    config = pretrain.get_config("tiny")
    config.phases = [pretrain.phase(64, 10, 1.0, data, 8)]
    config.total_steps, config.warmup_steps, config.checkpoint_every, config.log_every = 6, 2, 2, 2
    config.mesh.num_devices = 1
    error = None
    try:
        train.train_and_evaluate(config, workdir)
    except checkpointing.CheckpointSaveError as e:
        error = str(e)
    ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
    steps = ckpt.all_steps()
    mesh = train.make_mesh(config)
    model = train.create_model(config)
    tx, _ = train.create_optimizer(config)
    abstract, shardings = train.state_shardings(model, tx, mesh)
    state, data_state = ckpt.restore(steps[-1], checkpointing.abstract_like(abstract, shardings))
    print(json.dumps({"error": error, "steps": steps, "restored_step": int(state.step),
                      "listing": sorted(os.listdir(os.path.join(workdir, "checkpoints")))}))
""")


def test_disk_full_during_an_asynchronous_save(instances, tmp_path):
    """A 70 MB tmpfs holds one tiny checkpoint (about 52 MB: parameters and both Adam moments over the
    30522-token vocabulary) and not two: the second, asynchronous save runs out of space. The tmpfs is
    mounted in a private user and mount namespace (`unshare`), so no privilege is needed."""
    script = tmp_path / "disk_full.py"
    script.write_text(_DISK_FULL)
    mount = tmp_path / "small"
    mount.mkdir()
    inner = (f"mount -t tmpfs -o size=70m tmpfs {mount} && cd {ROOT} && "
             f"{sys.executable} {script} {mount / 'run'} {instances / 'p1'}")
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    result = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", inner], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["error"] == (f"writing checkpoints (or the one before it) to {mount / 'run' / 'checkpoints'} failed: "
                            "no space left on device; the earlier checkpoints are intact") or \
        (out["error"] or "").endswith("failed: no space left on device; the earlier checkpoints are intact"), out
    assert str(mount / "run" / "checkpoints") in out["error"]
    assert out["steps"] == [2] and out["restored_step"] == 2, out  # the half-written save is not a step
    assert not [n for n in out["listing"] if n.isdigit() and n != "2"], out
