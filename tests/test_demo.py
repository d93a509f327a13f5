"""The main job: its errors, run as a user runs it (a subprocess from the project root); its summary; the whole
pipeline as the README's first quick path in tests/test_docs.py (`assert_whole_pipeline`)."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT



def _demo(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SQUAD_DIR", "GLUE_DIR")}
    return subprocess.run([sys.executable, "-m", "bert_jax.demo", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


def small_task_folders(data_dir, out):
    """A SQuAD folder (the first 3 training articles, the first dev article) and a GLUE folder (SST-2's
    first 2000 training and 200 dev sentences) in `out`, in the layouts the demo reads: the corpus it
    builds from their training text stays small."""
    (out / "squad").mkdir(parents=True)
    for name, source, articles in (("train-v1.1.json", "train-v1.1-subset-44articles.json", 3),
                                   ("dev-v1.1.json", "dev-v1.1.json", 1)):
        squad = json.loads((data_dir / "squad" / source).read_text(encoding="utf-8"))
        (out / "squad" / name).write_text(json.dumps(dict(squad, data=squad["data"][:articles])), encoding="utf-8")
    (out / "glue" / "SST-2").mkdir(parents=True)
    for name, lines in (("train.tsv", 2001), ("dev.tsv", 201)):  # the header and the first sentences
        head = (data_dir / "glue" / "SST-2" / name).read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
        (out / "glue" / "SST-2" / name).write_text("".join(head), encoding="utf-8")
    return out / "squad", out / "glue"


# The demo's steps where it runs whole (tests/test_docs.py: the README's first quick path).
DEMO_TOTAL_STEPS = 12


def assert_whole_pipeline(workdir, stdout):
    """The demo's whole pipeline ran in `workdir` (its stdout `stdout`), with DEMO_TOTAL_STEPS steps and the
    fine-tuning stages at 64 training examples (SQuAD: 16 dev questions), from small task folders
    (`small_task_folders`): corpus (pydoc + the tasks' training text) -> vocabulary -> tokenized documents ->
    two-phase packed pre-training on 8 devices -> SST-2 and SQuAD, each from the final checkpoint in a fresh
    process -> summary with the scores per stage, TensorBoard files and PNGs; run with --norandom_baseline
    (the comparison with random init: `test_summary_compares_each_task_with_its_random_init_run`).
    tests/test_docs.py runs it as the README's first quick path."""
    assert "=== bert_jax demo summary ===" in stdout
    summary = json.loads((workdir / "summary.json").read_text())
    assert [p["max_seq_length"] for p in summary["phases"]] == [128, 256]
    for p in summary["phases"]:
        assert p["mlm_accuracy"] > 50 * summary["chance_mlm_accuracy"], p  # far above chance
    assert summary["checkpoints"][-1].endswith(os.path.join("checkpoints", str(DEMO_TOTAL_STEPS)))
    switch = round(0.9 * DEMO_TOTAL_STEPS)
    assert f"checkpoints/{switch}" in " ".join(summary["checkpoints"])  # written at the phase switch
    assert list((workdir / "pretrain" / "tensorboard").glob("events.out.tfevents.*"))
    assert (workdir / "pretrain" / "training_curves.png").stat().st_size > 10_000
    corpus = (workdir / "corpus.txt").read_text()
    assert "Architecturally, the school has a Catholic character." in corpus  # SQuAD train context
    assert "quirkily appealing" in corpus  # an SST-2 training sentence
    for probe, metric_file in [("sst2_2k", "dev_predictions.tsv"), ("squad_demo", "predictions.json")]:
        stage = summary["finetune"][probe]  # a fresh process restored the checkpoint
        assert 0 <= stage["pretrained"] <= 100 and "random" not in stage  # run with --norandom_baseline
        assert (workdir / "finetune" / f"{probe}-pretrained" / metric_file).is_file()
    sst2 = summary["finetune"]["sst2_2k"]
    assert f"SST-2 (64 training sentences, dev accuracy): pre-trained {sst2['pretrained']:.1f}\n" in stdout
    assert re.search(r"SQuAD v1.1 \(16 dev questions, F1\): pre-trained [\d.]+\n", stdout)


def test_summary_compares_each_task_with_its_random_init_run(capsys):
    """The summary's lines per stage: both scores and the gain (hand-computed), the note when pre-training does
    not beat random init, a skipped stage's reason."""
    # imported here, not at collection: the demo's absl flags (e.g. --dupe_factor) would clash with those of
    # create_pretraining_data in a test process that imported both
    from bert_jax import demo

    summary = {"phases": [{"phase": 0, "max_seq_length": 128, "steps": "0-36", "mlm_accuracy": 0.047,
                           "mlm_loss": 6.799, "nsp_accuracy": 0.61}],
               "chance_mlm_accuracy": 0.00025, "pretrain_seconds": 12.3, "checkpoints": ["c/36"], "tensorboard": "tb",
               "curves_png": "c.png", "seconds": 99.0,
               "finetune": {"sst2_2k": {"title": "SST-2 (2000 training sentences, dev accuracy)", "pretrained": 71.4,
                                        "random": 70.1},
                            "squad_demo": "skipped: no SQuAD files"}}
    demo._print_summary(summary)
    out = capsys.readouterr().out
    assert "SST-2 (2000 training sentences, dev accuracy): pre-trained 71.4, random init 70.1 (same recipe): " \
           "+1.3 from pre-training\n" in out
    assert "squad_demo: skipped: no SQuAD files\n" in out and "does not beat random init" not in out
    summary["finetune"]["sst2_2k"]["random"] = 72.0
    demo._print_summary(summary)
    out = capsys.readouterr().out
    assert "random init 72.0 (same recipe): -0.6 from pre-training" in out and "does not beat random init yet" in out


@pytest.mark.integration
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
    result = _demo("--glue_dir", str(tmp_path), "--workdir", str(tmp_path / "w"))
    assert result.returncode == 1 and "lacks SST-2/train.tsv" in result.stderr and "Traceback" not in result.stderr
