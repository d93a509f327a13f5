"""Unreadable and unwritable checkpoints: a corrupt newest checkpoint is moved aside and the run resumes
bit-identically from the previous one; none readable is a one-line error; a full disk during an
asynchronous save is a one-line error that leaves the earlier checkpoints restorable.

One 6-step run (checkpoints 2, 4, 6) is the truth; each test damages a copy of its checkpoints."""

import contextlib
import logging
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util

from bert_jax.checkpoints import checkpointing, sources
from bert_jax.training import pretraining, sharding, steps
from bert_jax.model import heads
from bert_jax.tasks import finetune
from bert_jax.configs import glue as glue_config
from bert_jax.configs import pretrain
from conftest import ROOT, SMALL_VOCAB_SIZE


def _config(instances, total_steps=6):
    """The tiny config, 1 device, on `instances` (the small vocabulary's, `tests/conftest.py`)."""
    config = pretrain.get_config("tiny")
    config.model.vocab_size = SMALL_VOCAB_SIZE
    config.phases = [pretrain.phase(64, 10, 1.0, str(instances / "p1"), 8)]
    config.total_steps, config.warmup_steps, config.checkpoint_every, config.log_every = total_steps, 2, 2, 2
    config.mesh.num_devices = 1
    return config


def _abstract_state(config):
    mesh = steps.make_mesh(config.mesh)
    abstract, shardings = steps.state_shardings(
        pretraining.state_init(pretraining.create_model(config), steps.create_optimizer(config)[0], 0), mesh)
    return checkpointing.abstract_like(abstract, shardings)


def _params(workdir, config, step):
    ckpt = checkpointing.Checkpointer(str(workdir / "checkpoints"), async_save=False)
    state, _ = ckpt.restore(step, _abstract_state(config))
    ckpt.close()
    return traverse_util.flatten_dict(jax.device_get(state.params), sep="/")


def _assert_equal(actual, expected):
    assert actual.keys() == expected.keys()
    for k in actual:
        np.testing.assert_array_equal(actual[k], expected[k], err_msg=k)


def _array_files(step_dir):
    """The array data files of a checkpoint's state (Orbax's OCDBT `d/` files), largest first."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir / "state") for f in fs if "/d/" in os.path.join(d, f)]
    return sorted(files, key=os.path.getsize, reverse=True)


def _truncate(step_dir, every=False):
    """Halves the largest array data file of a checkpoint (every data file with `every`: a reader of
    only some arrays, such as fine-tuning's encoder restore, may not touch the largest)."""
    files = _array_files(step_dir)
    for path in files if every else files[:1]:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)


def _cli_config(instances, tmp_path):
    """A config file for the CLI giving `_config(instances)`: the CLI's checkpoints are the fixture's."""
    path = tmp_path / "config.py"
    path.write_text(f"import pathlib\nimport test_checkpointing\n\n\ndef get_config():\n"
                    f"    return test_checkpointing._config(pathlib.Path({str(instances)!r}))\n")
    return path


def _cli_env():
    """The tests' own environment (the same XLA:CPU devices, so the same numbers) with the config importable."""
    return dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")


def _error_lines(stderr):
    """stderr without the progress bar (tqdm's carriage-return updates) and blank lines."""
    return [line for line in stderr.replace("\r", "\n").splitlines() if line.strip() and "pre-training" not in line]


@pytest.fixture(scope="module")
def run(small_instances, tmp_path_factory):
    """The uninterrupted 6-step run: its workdir (checkpoints 2, 4, 6) and final params."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    config = _config(small_instances)
    pretraining.train_and_evaluate(config, str(workdir))
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4", "6"]
    return workdir, _params(workdir, config, 6)


def _copy(run, dst, steps=(2, 4)):
    """`dst`/checkpoints holding a copy of the run's checkpoints `steps` (as a run stopped at max(steps))."""
    for step in steps:
        shutil.copytree(run[0] / "checkpoints" / str(step), dst / "checkpoints" / str(step))
    return dst / "checkpoints"


def test_truncated_newest_checkpoint_resumes_from_the_previous_bit_identically(small_instances, run, tmp_path, capsys,
                                                                              console_installed):
    _truncate(_copy(run, tmp_path) / "4")
    capsys.readouterr()
    config = _config(small_instances)
    pretraining.train_and_evaluate(config, str(tmp_path))  # 4 is unreadable: from 2 to 6
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "unreadable" in line]
    assert len(lines) == 1 and lines[0].startswith(f"checkpoint 4 in {tmp_path / 'checkpoints'} is unreadable (") \
        and lines[0].endswith(f"moved to {tmp_path / 'checkpoints' / '4.unreadable'}; trying the previous one"), err
    assert "Traceback" not in err and "train: resumed from the checkpoint at step 2" in err
    assert (tmp_path / "checkpoints" / "4.unreadable" / "state").is_dir()  # kept, not deleted
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4", "4.unreadable", "6"]
    _assert_equal(_params(tmp_path, config, 6), run[1])


@pytest.mark.parametrize("damage", ["missing_array_file", "missing_item", "metadata"])
def test_damaged_newest_checkpoint_falls_back(damage, small_instances, run, tmp_path, capsys):
    step_dir = _copy(run, tmp_path) / "4"
    if damage == "missing_array_file":
        os.remove(_array_files(step_dir)[0])
    elif damage == "missing_item":
        shutil.rmtree(step_dir / "data")
    else:
        (step_dir / "_CHECKPOINT_METADATA").write_text("{not json")
    ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
    step, state, data = ckpt.restore_newest_readable(_abstract_state(_config(small_instances)))
    assert step == 2 and int(state.step) == 2 and data["phase"] == 0
    assert ckpt.all_steps() == [2] and ckpt.latest_step() == 2  # Orbax no longer lists the step moved aside
    ckpt.close()
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "unreadable" in line][0].startswith(
        f"checkpoint 4 in {tmp_path / 'checkpoints'} is unreadable (")


@pytest.mark.integration
def test_no_readable_checkpoint_is_one_line_from_the_cli_and_stays_so(small_instances, run, tmp_path):
    checkpoints = _copy(run, tmp_path)
    for step in (2, 4):
        _truncate(checkpoints / str(step))
    cmd = [sys.executable, "-m", "bert_jax.train", "--config", str(_cli_config(small_instances, tmp_path)),
           f"--workdir={tmp_path}"]
    result = subprocess.run(cmd, cwd=ROOT, env=_cli_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = _error_lines(result.stderr)
    assert [line.split(" is unreadable")[0] for line in lines[:2]] == [
        f"checkpoint 4 in {checkpoints}", f"checkpoint 2 in {checkpoints}"], result.stderr
    assert lines[2:] == [f"train: {checkpoints}: no readable checkpoint (steps [2, 4] are unreadable and were moved "
                         "aside as <step>.unreadable)"], result.stderr
    assert sorted(os.listdir(checkpoints)) == ["2.unreadable", "4.unreadable"]
    # A second attempt does not start over from scratch in a directory of unreadable checkpoints.
    ckpt = checkpointing.Checkpointer(str(checkpoints), async_save=False)
    with pytest.raises(checkpointing.NoReadableCheckpoint, match=r"steps \[2, 4\] are unreadable"):
        ckpt.restore_newest_readable(_abstract_state(_config(small_instances)))
    ckpt.close()


def test_shape_mismatch_is_a_config_error_not_corruption(small_instances, run, tmp_path):
    _copy(run, tmp_path, steps=(2,))
    config = _config(small_instances)
    config.model.hidden_size, config.model.intermediate_size = 64, 256
    with pytest.raises(checkpointing.CheckpointMismatch, match="has shape"):
        pretraining.train_and_evaluate(config, str(tmp_path))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]  # left in place


def test_finetuning_restore_falls_back_to_the_previous_checkpoint(small_instances, run, tmp_path, capsys,
                                                                   console_installed):
    checkpoints = _copy(run, tmp_path)
    _truncate(checkpoints / "4", every=True)
    expected = _params(run[0], _config(small_instances), 2)  # the uninterrupted run's own checkpoint 2
    ft = glue_config.get_config("sst2")
    ft.init_checkpoint = str(tmp_path)
    init = sources.resolve(ft.init_checkpoint, ft.model)
    model = heads.BertForSequenceClassification(init.config, num_labels=2)
    tx, _ = finetune.create_optimizer(ft, 10)
    mesh = sharding.make_mesh(1, 1, 1, jax.devices()[:1])
    # The one checkpoint asked for is unreadable: a one-line error, nothing moved.
    with pytest.raises(checkpointing.NoReadableCheckpoint, match=r"^checkpoint 4 in .* is unreadable \(") as e:
        finetune.create_state(model, tx, mesh, sources.Initialisation("orbax", str(checkpoints), init.config,
                                                                         step=4), seed=0)
    assert "\n" not in str(e.value) and (checkpoints / "4").is_dir()
    capsys.readouterr()
    state, _ = finetune.create_state(model, tx, mesh, init, seed=0)  # the newest readable: 2
    encoder = traverse_util.flatten_dict(jax.device_get(state.params["bert"]), sep="/")
    _assert_equal({f"bert/{k}": v for k, v in encoder.items()}, {k: v for k, v in expected.items()
                                                                  if k.startswith("bert/")})
    lines = [line for line in capsys.readouterr().err.splitlines() if "unreadable" in line]
    assert len(lines) == 1 and lines[0].startswith(f"checkpoint 4 in {checkpoints} is unreadable ("), lines
    assert (checkpoints / "4.unreadable").is_dir()


@pytest.mark.slow
@pytest.mark.integration
def test_disk_full_during_an_asynchronous_save(small_instances, run, tmp_path):
    """A real full disk: a tmpfs of 1.5 times the size of one checkpoint (the uninterrupted run's step 2) holds
    one and not two, so the asynchronous save of step 4 runs out of space while training goes on; the error
    surfaces when the save of step 6 waits for it. The tmpfs is mounted in a private user and mount namespace
    (`unshare`: no privilege needed where unprivileged user namespaces are allowed); what the run left is
    copied out before the namespace ends."""
    one = sum(f.stat().st_size for f in (run[0] / "checkpoints" / "2").rglob("*") if f.is_file())
    mount, kept = tmp_path / "small", tmp_path / "kept"
    mount.mkdir()
    kept.mkdir()
    checkpoints = mount / "run" / "checkpoints"
    inner = (f"mount -t tmpfs -o size={3 * one // 2048}k tmpfs {mount} && cd {ROOT} && "
             f"{sys.executable} -m bert_jax.train --config {_cli_config(small_instances, tmp_path)} --workdir {mount / 'run'}"
             f"; status=$?; cp -r {checkpoints} {kept}; exit $status")
    result = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", inner], env=_cli_env(),
                            capture_output=True, text=True, timeout=300)
    assert (kept / "checkpoints").is_dir(), ("no checkpoints came back: is mounting a tmpfs in an unprivileged user "
                                             f"namespace (unshare) allowed here? {result.stderr[-3000:]}")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert _error_lines(result.stderr) == [
        f"train: saving checkpoint 4 to {checkpoints} failed: no space left on device (the earlier checkpoints are "
        "intact; its partial write was removed)"], result.stderr[-3000:]
    assert sorted(os.listdir(kept / "checkpoints")) == ["2"]  # no step or temporary directory of the failed save
    _assert_equal(_params(kept, _config(small_instances), 2), _params(run[0], _config(small_instances), 2))


@contextlib.contextmanager
def _asyncio_reports():
    """The messages asyncio's logger emits (after its filters) within the block, as a list."""
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("asyncio").addHandler(handler)
    try:
        yield seen
    finally:
        logging.getLogger("asyncio").removeHandler(handler)


def test_late_reports_of_a_failed_restores_reads_are_dropped_and_no_others(tmp_path, console_installed):
    """asyncio reports a read abandoned by a failed restore when its future is collected, possibly long
    after the restore (CI saw it at exit): with the command line's console, after the failure, such reports
    naming the step are dropped; one naming another step, or any other error, is still printed."""
    import asyncio
    import gc

    step_dir = tmp_path / "checkpoints" / "2"  # Orbax's completeness markers, so that the restore is tried
    for name, text in (("_CHECKPOINT_METADATA", "{}"), ("state/_METADATA", "{}"), ("data/metadata", "{}")):
        (step_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (step_dir / name).write_text(text)
    step_dir = str(step_dir)

    def failing_restore(_):
        raise ValueError("OUT_OF_RANGE: Error reading")

    result, reason = checkpointing._try(str(tmp_path / "checkpoints"), 2, failing_restore)
    assert result is None and reason == "ValueError: OUT_OF_RANGE: Error reading"

    with _asyncio_reports() as seen:
        def abandon(path):
            loop = asyncio.new_event_loop()
            future = loop.create_future()
            future.set_exception(ValueError(f'OUT_OF_RANGE: Error reading "x/0" in OCDBT database at local '
                                            f'file "{path}/state/": Requested byte range [1, 2) is not valid'))
            del future
            gc.collect()
            loop.close()

        abandon(step_dir)
        assert seen == []
        abandon(str(tmp_path / "checkpoints" / "20"))
        abandon(str(tmp_path / "elsewhere"))
        assert len(seen) == 2 and all("never retrieved" in m for m in seen)


def test_late_reports_of_a_failed_saves_writes_are_dropped_and_no_others(console_installed):
    """asyncio reports an out-of-space write task of a failed save when it is collected (seen at exit):
    dropped by the command line's console; another task's error is still printed."""
    import asyncio
    import errno as errno_module
    import gc

    with _asyncio_reports() as seen:
        def abandon(error):
            loop = asyncio.new_event_loop()

            async def write():
                raise error

            task = loop.create_task(write())
            loop.run_until_complete(asyncio.sleep(0))
            del task
            gc.collect()
            loop.close()

        abandon(OSError(errno_module.ENOSPC, "No space left on device"))
        abandon(ValueError("RESOURCE_EXHAUSTED: writing: No space left on device"))
        assert seen == []
        abandon(ValueError("some other failure"))
        assert len(seen) == 1 and "never retrieved" in seen[0]
