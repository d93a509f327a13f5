"""Workdirs and data paths as local paths or object-store URIs (`bert_jax.storage`), tested on local paths
only: the object-store branch (whole-object writes, metrics.jsonl rewritten instead of appended) is
forced onto a temporary directory, so nothing reaches the network."""

import json
import os
import pathlib

import numpy as np
import pytest

from bert_jax import storage
from bert_jax.training import pretraining, summaries
from bert_jax.configs import pretrain


def test_uri_joins_and_detection():
    assert storage.is_remote("gs://bucket/run") and not storage.is_remote("/tmp/run")
    assert storage.join("gs://bucket/run", "checkpoints", "12") == "gs://bucket/run/checkpoints/12"
    assert storage.join("gs://bucket/run/", "metrics.jsonl") == "gs://bucket/run/metrics.jsonl"
    assert storage.join("run", "a") == "run/a"


@pytest.mark.parametrize("remote", [False, True])
def test_whole_writes_leave_nothing_half_written(tmp_path, monkeypatch, remote):
    monkeypatch.setattr(storage, "is_remote", lambda path: remote)
    target = tmp_path / "metrics.json"
    storage.write_json(target, {"f1": 62.5, "name": "é"})
    assert json.loads(target.read_text(encoding="utf-8")) == {"f1": 62.5, "name": "é"}
    assert storage.read_json(target) == {"f1": 62.5, "name": "é"}
    with pytest.raises(TypeError):  # not serialisable: fails before anything is written
        storage.write_json(target, {"bad": object()})
    assert storage.read_json(target) == {"f1": 62.5, "name": "é"}  # the old content is intact
    assert storage.list_names(tmp_path) == ["metrics.json"]  # and no temporary file is left
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        storage.read_json(tmp_path / "broken.json")
    with pytest.raises(FileNotFoundError):
        storage.read_json(tmp_path / "missing.json")
    assert storage.list_names(tmp_path / "missing") == []


def test_pretraining_writes_a_workdir_through_the_object_store_branch(instances, tmp_path, monkeypatch):
    """A tiny run with every path treated as a URI: data metadata read, checkpoints, TensorBoard and
    metrics.jsonl written whole; a second writer on the same workdir (a resumed run) continues the
    record instead of replacing it, and the curves PNG is written."""
    calls = []

    def remote(path):
        calls.append(str(path))
        return True

    monkeypatch.setattr(storage, "is_remote", remote)
    config = pretrain.get_config("tiny")
    config.phases = [pretrain.phase(64, 10, 1.0, str(instances / "p1"), 8)]
    config.total_steps, config.warmup_steps, config.checkpoint_every, config.log_every = 4, 1, 4, 2
    config.mesh.num_devices = 1
    workdir = tmp_path / "run"
    pretraining.train_and_evaluate(config, str(workdir))
    assert any(c.endswith("/run") for c in calls)  # the workdir went through the URI branch
    records = summaries.read_metrics(str(workdir))
    assert [r["step"] for r in records] == [2, 4] and all(np.isfinite(r["loss"]) for r in records)
    assert sorted(storage.list_names(workdir / "checkpoints")) == ["4"]

    writer = summaries.open_writer(str(workdir))
    summaries.write_scalars(writer, 6, {"loss": 1.5}, "train")
    writer.close()
    assert [r["step"] for r in summaries.read_metrics(str(workdir))] == [2, 4, 6]
    png = workdir / "curves.png"
    summaries.plot_curves(summaries.read_metrics(str(workdir)), ["loss"], str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [n for n in storage.list_names(workdir) if ".tmp" in n]


def _refuse(monkeypatch, function, error):
    def fail(*args, **kwargs):
        raise error(13, "Permission denied", kwargs.get("dir", args[0] if args else "?") + "/.bert_jax-x")
    monkeypatch.setattr(function[0], function[1], fail)


def test_an_unwritable_output_directory_is_named_as_given_never_by_a_staging_path(tmp_path, monkeypatch):
    """Where the OS refuses a write that os.access allowed (root, a read-only file system, ACLs): the trial
    write of `check_output_dir`, the staging directory and `publish` each raise one line naming the output
    directory as the caller wrote it (relative here), not the hidden directory made beside or inside it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    with monkeypatch.context() as m:
        _refuse(m, (storage.tempfile, "mkdtemp"), PermissionError)
        for given, where in (("out", "cannot write in it"), ("out/new", f"cannot create it in {tmp_path / 'out'}")):
            with pytest.raises(PermissionError) as raised:
                storage.check_output_dir(given, "--output_dir")
            assert str(raised.value) == f"--output_dir={given!r}: {where} (Permission denied)"
        m.setattr(storage, "check_output_dir", lambda path, name: None)  # as if the trial write had passed
        with pytest.raises(PermissionError) as raised:
            storage.staging_dir("out")
        assert str(raised.value) == "output directory 'out': cannot write in it (Permission denied)"
    work = storage.staging_dir("out/new")
    assert work.startswith(str(tmp_path / "out" / ".bert_jax-staging-"))
    (tmp_path / "out" / "new").mkdir()
    (tmp_path / "out" / "new" / "shard").mkdir()  # a directory where the file goes: os.replace fails
    (pathlib.Path(work) / "shard").write_text("x")
    with pytest.raises(OSError) as raised:
        storage.publish(work, "out/new", ["shard"])
    assert str(raised.value).startswith("output directory 'out/new': cannot write shard in it (")
    assert ".bert_jax" not in str(raised.value)
    assert storage.check_output_dir("out/new", "--output_dir") is None  # and a writable one passes
    assert sorted(os.listdir(tmp_path / "out")) == [os.path.basename(work), "new"]  # no trial directory left
