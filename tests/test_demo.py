"""The main job, run as a user runs it (a subprocess from the project root)."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


def _demo(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SQUAD_DIR")}
    return subprocess.run([sys.executable, "-m", "bert_jax.demo", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_demo_whole_pipeline(tmp_path, data_dir):
    """Vocabulary -> both phases' instances -> two-phase pre-training on 8 devices -> SQuAD from the
    final checkpoint in a fresh process -> summary, TensorBoard files and PNGs (shortened schedule)."""
    workdir = tmp_path / "demo"
    result = _demo("--workdir", str(workdir), "--total_steps", "100", "--dupe_factor", "2",
                   "--squad_dir", str(data_dir / "squad"), "--squad_train_examples", "300",
                   "--squad_eval_examples", "100")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "=== bert_jax demo summary ===" in result.stdout
    summary = json.loads((workdir / "summary.json").read_text())
    assert [p["max_seq_length"] for p in summary["phases"]] == [128, 512]
    for p in summary["phases"]:
        assert p["mlm_accuracy"] > 50 * summary["chance_mlm_accuracy"], p  # far above chance
    assert summary["checkpoints"][-1].endswith(os.path.join("checkpoints", "100"))
    assert "checkpoints/90" in " ".join(summary["checkpoints"])  # written at the phase switch
    assert list((workdir / "pretrain" / "tensorboard").glob("events.out.tfevents.*"))
    assert (workdir / "pretrain" / "training_curves.png").stat().st_size > 10_000
    squad = summary["squad"]  # the fresh process restored the final checkpoint, fine-tuned and evaluated
    assert squad["predict_examples"] == 100 and 0 <= squad["f1"] <= 100
    assert (workdir / "squad" / "predictions.json").is_file()
    assert re.search(r"SQuAD v1.1 \(100 dev questions, tiny model\): EM [\d.]+ F1 [\d.]+", result.stdout)


def test_demo_fails_clearly_on_bad_input(tmp_path):
    result = _demo("--corpus", str(tmp_path / "nope.txt"), "--workdir", str(tmp_path / "w"))
    assert result.returncode == 1 and "nope.txt: cannot read" in result.stderr
    assert "Traceback" not in result.stderr
    (tmp_path / "empty.txt").write_text("")
    result = _demo("--corpus", str(tmp_path / "empty.txt"), "--workdir", str(tmp_path / "w"))
    assert result.returncode == 1 and "fewer than 10" in result.stderr and "Traceback" not in result.stderr
    result = _demo("--squad_dir", str(tmp_path / "no_squad"), "--workdir", str(tmp_path / "w"))
    assert result.returncode == 1 and "no_squad' does not exist" in result.stderr
    assert "bert_jax.data.download squad" in result.stderr and "Traceback" not in result.stderr
