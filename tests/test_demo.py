"""The main job: its errors, run as a user runs it (a subprocess from the project root); its summary; the whole
pipeline as the README's first quick path in tests/test_docs.py (`assert_whole_pipeline`)."""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT



def _demo(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SQUAD_DIR", "GLUE_DIR")}
    return subprocess.run([sys.executable, "-m", "bert_jax.demo", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


def small_task_folders(data_dir, out):
    """A SQuAD folder (the first 3 training articles, the first dev article) and a GLUE folder (SST-2's
    first 2000 training sentences and all 872 dev sentences) in `out`, in the layouts the demo reads: the
    corpus it builds from their training text stays small, the dev accuracy's standard error about 1.7 points."""
    (out / "squad").mkdir(parents=True)
    for name, source, articles in (("train-v1.1.json", "train-v1.1-subset-44articles.json", 3),
                                   ("dev-v1.1.json", "dev-v1.1.json", 1)):
        squad = json.loads((data_dir / "squad" / source).read_text(encoding="utf-8"))
        (out / "squad" / name).write_text(json.dumps(dict(squad, data=squad["data"][:articles])), encoding="utf-8")
    (out / "glue" / "SST-2").mkdir(parents=True)
    for name, lines in (("train.tsv", 2001), ("dev.tsv", None)):  # the header and the first sentences
        head = (data_dir / "glue" / "SST-2" / name).read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
        (out / "glue" / "SST-2" / name).write_text("".join(head), encoding="utf-8")
    return out / "squad", out / "glue"


# The demo's steps where it runs whole (tests/test_docs.py: the README's first quick path), and its SST-2 training
# sentences there: fewer than 1000 (e.g. 500) leave the tiny model at the majority label after its 5 epochs.
DEMO_TOTAL_STEPS = 12
DEMO_SST2_SENTENCES = 1000

# The pre-training's figures against what does not learn (the summary's baselines, on the same targets) carry no
# margin: the bounds are the context-blind optimum itself, which a model that does not learn cannot reach. The
# untrained demo model predicts from its MLM bias (the unigram) plus the noise of its random output layer, so it
# scores exactly the most frequent token's accuracy and about 0.03 nats *over* the unigram's loss. 12 steps are too
# few for a margin: they end about 0.02 nats under the unigram in phase 1 (0.06 in phase 2), and 0.02 over the
# most frequent token's accuracy.


def assert_whole_pipeline(workdir, stdout):
    """The demo's whole pipeline ran in `workdir` (its stdout `stdout`), with DEMO_TOTAL_STEPS steps, SST-2 at
    DEMO_SST2_SENTENCES training sentences and SQuAD at 64 training questions (16 dev questions), from small task
    folders (`small_task_folders`): corpus (pydoc + the tasks' training text) -> vocabulary -> tokenized documents
    -> two-phase packed pre-training on 8 devices -> SST-2 and SQuAD, each from the final checkpoint and from
    random init with the same recipe, in fresh processes -> summary with both scores per stage, TensorBoard files
    and PNGs. tests/test_docs.py runs it as the README's first quick path, random-init stage included.

    Learning, against what does not learn on the same targets (the summary's baselines):
    - pre-training: each phase's MLM loss under the unigram's and its accuracy over the most frequent token's;
    - SST-2, from either start: dev accuracy over the majority label's by 3 standard errors of a dev accuracy
      at the majority rate (sqrt(p (1 - p) / n) over the 872 dev sentences: about 1.7 points, so about 5), and
      the final training loss under the training labels' prior entropy by 0.05 nats (a window of about 1,600
      examples: its standard error is about 0.01 nats).
    Not claimed at this size (the summary shows them): NSP past its label prior (at it after 12 steps); that
    pre-training beats random init (12 steps do not); SQuAD past a baseline (88 features, 5 steps; its F1 and
    losses are only checked to be reported)."""
    assert "=== bert_jax demo summary ===" in stdout
    summary = json.loads((workdir / "summary.json").read_text())
    vocab_size = len((workdir / "vocab.txt").read_text(encoding="utf-8").splitlines())
    assert [p["max_seq_length"] for p in summary["phases"]] == [128, 256]
    for p in summary["phases"]:
        # the baselines carry the data's word frequencies (far under a uniform guess) ...
        assert p["unigram_mlm_loss"] < math.log(vocab_size) - 1 and 0 < p["most_frequent_mlm_accuracy"] < 0.2, p
        assert 0.5 <= p["majority_nsp_accuracy"] <= 1 and 0 < p["nsp_prior_loss"] <= math.log(2) + 1e-9, p
        # ... and the pre-training beats them, the context-blind optimum (see above)
        assert p["mlm_loss"] < p["unigram_mlm_loss"], p
        assert p["mlm_accuracy"] > p["most_frequent_mlm_accuracy"], p
    assert summary["checkpoints"][-1].endswith(os.path.join("checkpoints", str(DEMO_TOTAL_STEPS)))
    switch = round(0.9 * DEMO_TOTAL_STEPS)
    assert f"checkpoints/{switch}" in " ".join(summary["checkpoints"])  # written at the phase switch
    assert list((workdir / "pretrain" / "tensorboard").glob("events.out.tfevents.*"))
    assert (workdir / "pretrain" / "training_curves.png").stat().st_size > 10_000
    corpus = (workdir / "corpus.txt").read_text()
    assert "Architecturally, the school has a Catholic character." in corpus  # SQuAD train context
    assert "quirkily appealing" in corpus  # an SST-2 training sentence
    for probe, metric_file in [("sst2_2k", "dev_predictions.tsv"), ("squad_demo", "predictions.json")]:
        stage = summary["finetune"][probe]  # fresh processes: one restored the checkpoint, one started at random
        for init in ("pretrained", "random"):
            assert 0 <= stage[init] <= 100, stage
            assert (workdir / "finetune" / f"{probe}-{init}" / metric_file).is_file()
    sst2 = summary["finetune"]["sst2_2k"]
    assert 0 < sst2["train_prior_loss"] <= math.log(2) + 1e-9 and 50 <= sst2["majority"] <= 100, sst2
    dev = json.loads((workdir / "finetune" / "sst2_2k-pretrained" / "metrics.json").read_text())["eval_examples"]
    p = sst2["majority"] / 100
    bound = sst2["majority"] + 3 * 100 * math.sqrt(p * (1 - p) / dev)
    for init in ("pretrained", "random"):
        assert sst2[init] > bound, (init, sst2, dev, bound)
        assert sst2[f"{init}_train_loss"] < sst2["train_prior_loss"] - 0.05, (init, sst2)
    gain = sst2["pretrained"] - sst2["random"]
    assert (f"SST-2 ({DEMO_SST2_SENTENCES} training sentences, dev accuracy): pre-trained {sst2['pretrained']:.1f}, "
            f"random init {sst2['random']:.1f} (same recipe): {gain:+.1f} from pre-training\n") in stdout
    assert f"  the majority label scores {sst2['majority']:.1f}; final training loss " in stdout
    assert re.search(r"SQuAD v1.1 \(16 dev questions, F1\): pre-trained [\d.]+, random init [\d.]+ ", stdout)


def test_summary_compares_each_task_with_its_random_init_run(capsys):
    """The summary's lines: per phase each figure beside its no-learning baseline; per stage both scores and the
    gain (hand-computed), the majority label and the training losses against the labels' prior, the note when
    pre-training does not beat random init, a skipped stage's reason."""
    # imported here, not at collection: the demo's absl flags (e.g. --dupe_factor) would clash with those of
    # create_pretraining_data in a test process that imported both
    from bert_jax.experiments import demo

    summary = {"phases": [{"phase": 0, "max_seq_length": 128, "steps": "0-36", "mlm_accuracy": 0.047,
                           "mlm_loss": 6.799, "nsp_accuracy": 0.61, "nsp_loss": 0.672, "unigram_mlm_loss": 6.851,
                           "most_frequent_mlm_accuracy": 0.031, "majority_nsp_accuracy": 0.6,
                           "nsp_prior_loss": 0.673}],
               "pretrain_seconds": 12.3, "checkpoints": ["c/36"], "tensorboard": "tb", "curves_png": "c.png",
               "seconds": 99.0,
               "finetune": {"sst2_2k": {"title": "SST-2 (2000 training sentences, dev accuracy)", "pretrained": 71.4,
                                        "random": 70.1, "majority": 50.9, "pretrained_train_loss": 0.41,
                                        "random_train_loss": 0.452, "train_prior_loss": 0.6891},
                            "squad_demo": "skipped: no SQuAD files"}}
    demo._print_summary(summary)
    out = capsys.readouterr().out
    assert "pre-training phase 1 (length 128, steps 0-36): MLM accuracy 0.047 (most frequent token 0.031), loss " \
           "6.799 (unigram 6.851); NSP accuracy 0.610 (majority label 0.600), loss 0.672 (label prior 0.673)\n" in out
    assert "SST-2 (2000 training sentences, dev accuracy): pre-trained 71.4, random init 70.1 (same recipe): " \
           "+1.3 from pre-training\n  the majority label scores 50.9; final training loss 0.410 (pre-trained), " \
           "0.452 (random init) against 0.689 for the training labels' prior\n" in out
    assert "squad_demo: skipped: no SQuAD files\n" in out and "does not beat random init" not in out
    summary["finetune"]["sst2_2k"]["random"] = 72.0
    demo._print_summary(summary)
    out = capsys.readouterr().out
    assert "random init 72.0 (same recipe): -0.6 from pre-training" in out and "does not beat random init yet" in out


def test_no_learning_baselines_are_those_of_the_logged_steps_batches(small_instances):
    """`demo.no_learning_baselines` on a phase of static instances: each figure hand-computed on the batches of the
    logged steps (drawn again in training order), the target frequencies counted here from the phase's instances.
    (Unpacked: a packed stream takes seconds to start on this small text; the demo's packed phases run in
    tests/test_docs.py's README run, checked by `assert_whole_pipeline`.)"""
    from bert_jax.experiments import demo
    from bert_jax.training import pretraining
    from bert_jax.configs import pretrain
    from bert_jax.data.pretraining import procedure

    from conftest import SMALL_VOCAB_SIZE

    config = pretrain.get_config("demo")
    config.model.vocab_size = SMALL_VOCAB_SIZE
    config.phases = [config.phases[0]]
    config.phases[0].update(data_dir=str(small_instances / "p1"), max_seq_length=64, max_predictions_per_seq=10,
                            packing=False, batch_size=8, fraction=1.0)
    config.total_steps = 5
    phases = pretraining.resolve_phases(config)
    entry = {"phase": 0, "logged_steps": [1, 3]}
    demo.no_learning_baselines(config, phases, [entry])
    counts = np.ones(SMALL_VOCAB_SIZE)
    for instance in procedure.iterate_instances(str(small_instances / "p1")):
        np.add.at(counts, instance["masked_lm_ids"], instance["masked_lm_weights"])
    log_q = np.log(counts / counts.sum())
    it = pretraining.iterator(phases[0], config, None)
    batches = [next(it) for _ in range(3)]
    it.close()
    want = {k: [] for k in ("unigram_mlm_loss", "most_frequent_mlm_accuracy", "nsp_prior_loss",
                            "majority_nsp_accuracy")}
    for b in (batches[0], batches[2]):  # steps 1 and 3
        w, ids = b["masked_lm_weights"], b["masked_lm_ids"]
        want["unigram_mlm_loss"].append(-(w * log_q[ids]).sum() / w.sum())
        want["most_frequent_mlm_accuracy"].append((w * (ids == counts.argmax())).sum() / w.sum())
        p = b["next_sentence_labels"].mean()
        want["nsp_prior_loss"].append(-(p * np.log(p) + (1 - p) * np.log(1 - p)))
        want["majority_nsp_accuracy"].append(max(p, 1 - p))
    for k, v in want.items():
        assert entry[k] == pytest.approx(np.mean(v), rel=1e-6), k


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
