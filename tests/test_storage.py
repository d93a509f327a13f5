"""Workdirs and data paths as local paths or object-store URIs (`bert_jax.storage`), tested on local paths
only: the object-store branch (whole-object writes, metrics.jsonl rewritten instead of appended) is
forced onto a temporary directory, so nothing reaches the network."""

import json

import numpy as np
import pytest

from bert_jax import storage, summaries, train
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
    train.train_and_evaluate(config, str(workdir))
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
