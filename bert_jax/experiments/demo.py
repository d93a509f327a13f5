"""The main job (`make demo`): the whole bert_jax pipeline on a laptop CPU, offline, in minutes, and
whether its pre-training transfers.

  python -m bert_jax.demo [--corpus FILE] [--workdir DIR] [--squad_dir DIR] [--glue_dir DIR]
      [--total_steps N] [--norandom_baseline] [--nodynamic [--dupe_factor N]]

Stages (each the library call or command a user would make, with progress bars):
  1. corpus: CPython's bundled documentation text (`pydoc_data.topics`, on every Python
     installation), plus the unlabelled text of the fine-tuning tasks' *training* files found (SQuAD
     contexts, SST-2 sentences: in-domain text; never dev text); or --corpus FILE in the original
     BERT format (one sentence per line, blank lines between documents);
  2. a WordPiece vocabulary trained with sentencepiece (`bert_jax.data.vocab.train_vocab`);
  3. the corpus tokenized once (`bert_jax.data.pretraining.document_shards`), from which both phases draw their
     instances and masks while training, packed several per row (`bert_jax.data.pretraining.dynamic`, `packing`);
     --nodynamic: static instances for each phase (`bert_jax.data.pretraining.procedure.create_pretraining_data`);
  4. pre-training of the tiny BERT (`bert_jax/configs/pretrain.py:demo`) through both phases in one run on 8
     simulated CPU devices (mesh data 4 x tensor 2), with Orbax checkpoints;
  5. fine-tuning, each in a fresh process as a user's job, from the final checkpoint and, beside it,
     from random initialisation with the same recipe (`bert_jax.experiments.transfer.PROBES`): SST-2 on 2000
     training sentences when --glue_dir (else $GLUE_DIR) holds SST-2/, and SQuAD v1.1 when
     --squad_dir (else $SQUAD_DIR) holds its files; without them the demo says how to get them;
  6. a summary: MLM / NSP accuracy and loss per phase, each beside what a model that does not learn from the
     text scores on the same steps' targets (`no_learning_baselines`: the unigram, the most frequent token,
     the label prior), checkpoint paths, and per fine-tuning stage the pre-trained score beside the random-init
     one and the majority label's, the final training loss beside the training labels' prior; PNGs of the
     training curves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

# 8 simulated devices, set before jax is imported: the pre-training stage runs on a real mesh.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags, logging  # noqa: E402
from bert_jax import errors  # noqa: E402  (imports no jax)

_CORPUS = flags.DEFINE_string("corpus", None, "Corpus in the original BERT format (default: pydoc_data.topics and "
                              "the training text of the tasks found).")
_WORKDIR = flags.DEFINE_string("workdir", "demo_run", "Output directory (replaced if it holds an earlier demo).")
_SQUAD_DIR = flags.DEFINE_string("squad_dir", None, "Folder with train-v1.1*.json and dev-v1.1.json "
                                 "(default: $SQUAD_DIR; none: the SQuAD stage is skipped with a message).")
_GLUE_DIR = flags.DEFINE_string("glue_dir", None, "GLUE folder with SST-2/train.tsv and SST-2/dev.tsv "
                                "(default: $GLUE_DIR; none: the SST-2 stage is skipped with a message).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 4000, "WordPiece vocabulary size trained on the corpus.")
_TOTAL_STEPS = flags.DEFINE_integer("total_steps", None, "Pre-training steps over both phases (default: the "
                                    "demo config's).")
_DYNAMIC = flags.DEFINE_bool("dynamic", True, "Tokenize the corpus once, draw instances and masks while training "
                             "and pack them several per row (the default); false: static instances "
                             "(--dupe_factor copies), one per row.")
_DUPE_FACTOR = flags.DEFINE_integer("dupe_factor", 3, "Passes over the corpus when generating static instances "
                                    "(--dynamic=false).")
_SST2_TRAIN_EXAMPLES = flags.DEFINE_integer("sst2_train_examples", 2000, "SST-2 training sentences used (the "
                                            "first ones; all 872 dev sentences are evaluated).")
_SQUAD_TRAIN_EXAMPLES = flags.DEFINE_integer("squad_train_examples", 2000, "SQuAD training questions used.")
_SQUAD_EVAL_EXAMPLES = flags.DEFINE_integer("squad_eval_examples", 500, "SQuAD dev questions evaluated.")
_RANDOM_BASELINE = flags.DEFINE_bool("random_baseline", True, "Also fine-tune each task from random "
                                     "initialisation with the same recipe, to show what pre-training adds.")

# The commands that fetch the task files (`make demo` runs them, with a network, into .data).
SQUAD_DOWNLOAD = "python -m bert_jax.data.download squad --output_dir .data/squad"
GLUE_DOWNLOAD = "python -m bert_jax.data.download glue --tasks sst2 --output_dir .data/glue"
BENCHMARK = "benchmarks/transfer.py (docs/transfer-findings.md)"


class DemoError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


def check_corpus(path: str) -> None:
    """Raises DemoError unless `path` is a readable UTF-8 text file with at least 10 lines of text."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for line in f if line.strip())
    except (OSError, UnicodeDecodeError) as e:
        raise DemoError(f"--corpus {path}: cannot read ({e})") from None
    if lines < 10:
        raise DemoError(f"--corpus {path}: has {lines} non-empty lines, fewer than 10")


def find_squad(squad_dir: str | None) -> tuple[str, str] | None:
    """(train file, dev file) in squad_dir, None when no folder is named: train-v1.1.json where it is there, else
    another train-v1.1*.json (e.g. the download's train-v1.1-subset-44articles.json).

    Raises:
      DemoError: the named folder does not exist or lacks the files.
    """
    if not squad_dir:
        return None
    if not os.path.isdir(squad_dir):
        raise DemoError(f"SQuAD folder {squad_dir!r} does not exist; get the files with: {SQUAD_DOWNLOAD}")
    names = sorted(os.listdir(squad_dir))
    # The official training file where it is there, else another train-v1.1*.json (the download's 44-article subset)
    train = "train-v1.1.json" if "train-v1.1.json" in names else next(
        (n for n in names if n.startswith("train-v1.1") and n.endswith(".json")), None)
    if train is None or "dev-v1.1.json" not in names:
        raise DemoError(f"SQuAD folder {squad_dir!r} lacks train-v1.1*.json or dev-v1.1.json; get them with: "
                        f"{SQUAD_DOWNLOAD}")
    return os.path.join(squad_dir, train), os.path.join(squad_dir, "dev-v1.1.json")


def find_sst2(glue_dir: str | None) -> str | None:
    """The SST-2 folder (train.tsv, dev.tsv) of glue_dir, None when no folder is named.

    Raises:
      DemoError: the named folder lacks SST-2/train.tsv or SST-2/dev.tsv.
    """
    if not glue_dir:
        return None
    sst2 = os.path.join(glue_dir, "SST-2")
    if not all(os.path.isfile(os.path.join(sst2, f)) for f in ("train.tsv", "dev.tsv")):
        raise DemoError(f"GLUE folder {glue_dir!r} lacks SST-2/train.tsv or SST-2/dev.tsv; get them: {GLUE_DOWNLOAD}")
    return sst2


def pretrain_config(workdir: str, vocab_size: int, total_steps: int | None, dynamic: bool = True):
    """bert_jax/configs/pretrain.py:demo with this demo's vocabulary, data folders and mesh (data 4 x tensor 2);
    dynamic: both phases draw from one tokenized-documents folder, packed."""
    from bert_jax.configs import pretrain

    config = pretrain.get_config("demo")
    config.model.vocab_size = vocab_size
    if total_steps:
        config.warmup_steps = round(config.warmup_steps * total_steps / config.total_steps)
        config.total_steps = total_steps
    for p in config.phases:
        p.data_dir = os.path.join(workdir, "data", "documents" if dynamic else f"length{p.max_seq_length}")
        p.packing = dynamic
    config.mesh.data, config.mesh.tensor = 4, 2
    # About 50 logs a run, at most every 10 steps: the summary's figures (the last 3 logs of each phase) then come
    # from the end of each phase also in a short run
    config.log_every = max(1, min(10, config.total_steps // 50))
    config.checkpoint_every = config.total_steps
    return config


SUMMARY_LOGS = 3  # the summary's figures per phase: the mean over its last SUMMARY_LOGS logs


def phase_summary(records: list[dict], phases) -> list[dict]:
    """Mean metrics over the last SUMMARY_LOGS logs of each phase, and those logs' steps."""
    out = []
    for p in phases:
        logs = [r for r in records if p.start < r["step"] <= p.end][-SUMMARY_LOGS:]
        if logs:
            out.append({"phase": p.index, "max_seq_length": p.max_seq_length, "steps": f"{p.start}-{p.end}",
                        "logged_steps": [r["step"] for r in logs],
                        **{k: sum(r[k] for r in logs) / len(logs)
                           for k in ("mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy")}})
    return out


def no_learning_baselines(config, phases, summary_phases: list[dict]) -> None:
    """Adds to each entry of `phase_summary` what a model that does not learn from the text scores on exactly the
    targets of its logged steps (the batches those steps trained on, drawn again from the phase's data in the
    same order; each step's figure, then their mean as the summary's):
      unigram_mlm_loss            the cross-entropy of the phase data's token frequencies (add-one smoothed, as
                                  `procedure.masked_token_log_prior`): what a model blind to the context reaches
                                  (the demo's MLM bias starts there);
      most_frequent_mlm_accuracy  the accuracy of always naming the data's most frequent token;
      nsp_prior_loss              the entropy of the step's NotNext rate (a label-blind model that knew it);
      majority_nsp_accuracy       the accuracy of always naming the step's more frequent label."""
    import numpy as np

    from bert_jax.training import pretraining
    from bert_jax.data.pretraining import procedure

    by_index = {p.index: p for p in phases}
    for entry in summary_phases:
        phase = by_index[entry["phase"]]
        log_q = procedure.masked_token_log_prior(phase.data_dir, config.model.vocab_size).astype(np.float64)
        log_q -= np.log(np.exp(log_q).sum())
        most_frequent = int(np.argmax(log_q))
        steps, figures = set(entry["logged_steps"]), []
        it = pretraining.iterator(phase, config, None)
        try:
            for step in range(phase.start + 1, max(steps) + 1):
                batch = next(it)
                if step not in steps:
                    continue
                ids, w = batch["masked_lm_ids"], batch["masked_lm_weights"]
                labels = batch["next_sentence_labels"]
                label_w = batch.get("next_sentence_weights", np.ones(labels.shape, np.float32))
                not_next = float((label_w * labels).sum() / label_w.sum())
                prior = -sum(q * np.log(q) for q in (not_next, 1.0 - not_next) if q > 0)
                figures.append({"unigram_mlm_loss": float(-(w * log_q[ids]).sum() / w.sum()),
                                "most_frequent_mlm_accuracy": float((w * (ids == most_frequent)).sum() / w.sum()),
                                "nsp_prior_loss": float(prior), "majority_nsp_accuracy": max(not_next, 1 - not_next)})
        finally:
            it.close()
        entry.update({k: sum(f[k] for f in figures) / len(figures) for k in figures[0]})


def label_prior_loss(labels) -> float:
    """The entropy (nats) of the labels' frequencies: the loss of a label-blind classifier that knew them."""
    import numpy as np

    counts = np.bincount(np.asarray(labels, np.int64))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def run(corpus: str | None, workdir: str, squad_dir: str | None, glue_dir: str | None, vocab_size: int,
        total_steps: int | None, dupe_factor: int, squad_train_examples: int, squad_eval_examples: int,
        random_baseline: bool = True, dynamic: bool = True, sst2_train_examples: int = 2000) -> dict:
    """The whole pipeline (module docstring) -> the summary dict (also written to workdir/summary.json)."""
    start = time.perf_counter()
    workdir = os.path.abspath(workdir)
    squad_files = find_squad(squad_dir)  # a wrong path fails before any work
    sst2_dir = find_sst2(glue_dir)
    if corpus is not None:
        check_corpus(corpus)
    from bert_jax import storage

    storage.check_output_dir(workdir, "--workdir")
    if os.path.isdir(workdir) and os.listdir(workdir):
        if not os.path.isfile(os.path.join(workdir, "summary.json")) and \
                not os.path.isdir(os.path.join(workdir, "pretrain")):
            raise DemoError(f"--workdir {workdir} is not empty and not an earlier demo; name another folder")
        import shutil

        shutil.rmtree(workdir)
    os.makedirs(workdir)

    import jax

    from bert_jax.experiments import transfer
    from bert_jax.training import pretraining, summaries
    from bert_jax.data import tokenization
    from bert_jax.data.vocab import train_vocab

    # 1-2. corpus and vocabulary
    if corpus is None:
        corpus_file = os.path.join(workdir, "corpus.txt")
        sources = [("pydoc", "pydoc", [])]
        if squad_files:
            sources.append(("SQuAD train contexts", "squad", [squad_files[0]]))
        if sst2_dir:
            sources.append(("SST-2 train sentences", "glue:sst2", [os.path.join(sst2_dir, "train.tsv")]))
        counts = transfer.write_corpus(sources, corpus_file)
        print("[1/6] corpus: " + ", ".join(f"{k} ({v['documents']} documents, {v['sentences']} sentences)"
                                          for k, v in counts.items()) + f" -> {corpus_file}", flush=True)
    else:
        corpus_file = corpus
        print(f"[1/6] corpus: {corpus}", flush=True)
    vocab_file = os.path.join(workdir, "vocab.txt")
    try:
        stats = train_vocab([corpus_file], vocab_size, vocab_file)
    except ValueError as e:
        raise DemoError(f"vocabulary: {e}") from None
    print(f"[2/6] vocabulary: {stats['vocab_size']} WordPiece tokens from {stats['lines']} lines "
          f"({stats['seconds']} s) -> {vocab_file}", flush=True)

    # 3. instances for both phases
    tokenizer = tokenization.Tokenizer(vocab_file)
    config = pretrain_config(workdir, tokenizer.vocab_size, total_steps, dynamic)
    try:
        metas = transfer.prepare_pretraining_data(config, corpus_file, vocab_file, dupe_factor=dupe_factor,
                                                    dynamic=dynamic)
    except ValueError as e:
        raise DemoError(str(e)) from None
    if dynamic:
        print(f"[3/6] tokenized documents: {metas[0]['num_documents']} documents, {metas[0]['num_tokens']} tokens -> "
              f"{config.phases[0].data_dir} (instances drawn while training, lengths "
              f"{' then '.join(str(p.max_seq_length) for p in config.phases)}, packed)", flush=True)
    else:
        for p, meta in zip(config.phases, metas):
            print(f"[3/6] instances: length {p.max_seq_length}: {meta['num_instances']} -> {p.data_dir}", flush=True)

    # 4. pre-training, both phases in one run, 8 simulated devices
    pretrain_dir = os.path.join(workdir, "pretrain")
    print(f"[4/6] pre-training BERT tiny ({config.model.num_hidden_layers} layers, hidden {config.model.hidden_size}) "
          f"for {config.total_steps} steps on {jax.device_count()} {jax.default_backend()} devices "
          f"(mesh data {config.mesh.data} x tensor {config.mesh.tensor})", flush=True)
    pretrain_start = time.perf_counter()
    stopped = pretraining.train_and_evaluate(config, pretrain_dir)
    if stopped["step"] < config.total_steps:  # SIGTERM: checkpoint saved; no fine-tuning of a half-trained encoder
        raise SystemExit(f"demo: pre-training stopped at step {stopped['step']} of {config.total_steps} (SIGTERM); "
                         f"re-run the same command to resume from {pretrain_dir}")
    phases = pretraining.resolve_phases(config)
    records = summaries.read_metrics(pretrain_dir)
    png = summaries.plot_curves(records, ["loss", "mlm_accuracy", "nsp_accuracy", "learning_rate"],
                                os.path.join(pretrain_dir, "training_curves.png"),
                                title="bert_jax demo: pre-training (dashed: phase switch)",
                                vertical_lines=[p.start for p in phases[1:]])
    summarised = phase_summary(records, phases)
    no_learning_baselines(config, phases, summarised)
    summary = {"corpus": corpus_file, "vocab_file": vocab_file, "phases": summarised,
               "pretrain_seconds": round(time.perf_counter() - pretrain_start, 1),
               "checkpoints": [os.path.join(pretrain_dir, "checkpoints", str(s)) for s in sorted(
                   int(d) for d in os.listdir(os.path.join(pretrain_dir, "checkpoints")) if d.isdigit())],
               "tensorboard": os.path.join(pretrain_dir, "tensorboard"), "curves_png": png, "finetune": {}}

    # 5. fine-tuning from the final checkpoint and from random init, each in a fresh process
    stages = []
    if sst2_dir:
        stages.append(("sst2_2k", f"SST-2 ({sst2_train_examples} training sentences, dev accuracy)",
                       dict(data_dir=sst2_dir, max_train_examples=sst2_train_examples)))
    else:
        summary["finetune"]["sst2_2k"] = f"skipped: no GLUE folder (GLUE_DIR or --glue_dir); fetch: {GLUE_DOWNLOAD}"
        print(f"[5/6] SST-2: {summary['finetune']['sst2_2k']}", flush=True)
    if squad_files:
        stages.append(("squad_demo", f"SQuAD v1.1 ({squad_eval_examples} dev questions, F1)",
                       dict(train_file=squad_files[0], predict_file=squad_files[1],
                            max_train_examples=squad_train_examples, max_predict_examples=squad_eval_examples)))
    else:
        summary["finetune"]["squad_demo"] = (f"skipped: no SQuAD files (SQUAD_DIR or --squad_dir); fetch: "
                                             f"{SQUAD_DOWNLOAD}")
        print(f"[5/6] SQuAD: {summary['finetune']['squad_demo']}", flush=True)
    env = dict(os.environ, XLA_FLAGS="")  # one CPU device: faster than 8 simulated ones at this size
    for probe, title, overrides in stages:
        scores = {}
        for init, name in [(pretrain_dir, "pretrained"), ("", "random")][:2 if random_baseline else 1]:
            out_dir = os.path.join(workdir, "finetune", f"{probe}-{name}")
            cmd = transfer.probe_command(probe, out_dir, init_checkpoint=init, vocab_file=vocab_file,
                                           model=transfer.finetune_model(config.model),
                                           seed=0, **overrides)
            print(f"[5/6] {title}, from {'the final checkpoint' if init else 'random initialisation'}, "
                  f"in a new process:\n      {' '.join(cmd)}", flush=True)
            result = subprocess.run(cmd, env=env)
            if result.returncode != 0:
                raise DemoError(f"{probe} fine-tuning ({name}) failed (exit status {result.returncode}); "
                                "see the messages above")
            with open(os.path.join(out_dir, "metrics.json"), encoding="utf-8") as f:
                metrics = json.load(f)
            scores[name] = float(metrics[transfer.PROBES[probe].metric])
            scores[f"{name}_workdir"] = out_dir
            scores[f"{name}_train_loss"] = float(metrics["train_loss"])
            if "majority_accuracy" in metrics:  # a classification task: the dev share of its most frequent label
                scores["majority"] = float(metrics["majority_accuracy"])
        if probe.startswith("sst2"):  # the loss of a label-blind classifier on the training sentences used
            from bert_jax.data import glue

            train_examples = glue.read_glue_tsv("sst2", os.path.join(overrides["data_dir"], "train.tsv"))
            scores["train_prior_loss"] = label_prior_loss(
                [e.label for e in train_examples[:overrides["max_train_examples"]]])
        summary["finetune"][probe] = dict(scores, title=title)
    summary["seconds"] = round(time.perf_counter() - start, 1)
    storage.write_json(os.path.join(workdir, "summary.json"), summary)
    _print_summary(summary)
    return summary


def _print_summary(summary: dict) -> None:
    print("\n=== bert_jax demo summary ===")
    for p in summary["phases"]:
        print(f"pre-training phase {p['phase'] + 1} (length {p['max_seq_length']}, steps {p['steps']}): "
              f"MLM accuracy {p['mlm_accuracy']:.3f} (most frequent token {p['most_frequent_mlm_accuracy']:.3f}), "
              f"loss {p['mlm_loss']:.3f} (unigram {p['unigram_mlm_loss']:.3f}); NSP accuracy {p['nsp_accuracy']:.3f} "
              f"(majority label {p['majority_nsp_accuracy']:.3f}), loss {p['nsp_loss']:.3f} (label prior "
              f"{p['nsp_prior_loss']:.3f})")
    if summary["phases"]:
        print("  (in brackets: what a model that does not learn from the text scores on the same steps' targets)")
    print(f"pre-training time: {summary['pretrain_seconds']:.0f} s; checkpoints: {', '.join(summary['checkpoints'])}")
    print(f"TensorBoard: {summary['tensorboard']}   curves: {summary['curves_png']}")
    for probe, result in summary["finetune"].items():
        if not isinstance(result, dict):
            print(f"{probe}: {result}")
            continue
        line = f"{result['title']}: pre-trained {result['pretrained']:.1f}"
        if "random" in result:
            gain = result["pretrained"] - result["random"]
            line += f", random init {result['random']:.1f} (same recipe): {gain:+.1f} from pre-training"
        print(line)
        notes = []
        if "majority" in result:
            notes.append(f"the majority label scores {result['majority']:.1f}")
        if "pretrained_train_loss" in result:
            notes.append(f"final training loss {result['pretrained_train_loss']:.3f} (pre-trained)" + (
                f", {result['random_train_loss']:.3f} (random init)" if "random_train_loss" in result else "") + (
                f" against {result['train_prior_loss']:.3f} for the training labels' prior"
                if "train_prior_loss" in result else ""))
        if notes:
            print(f"  {'; '.join(notes)}")
    if any(isinstance(r, dict) and "random" in r and r["pretrained"] <= r["random"]
           for r in summary["finetune"].values()):
        print(f"pre-training this short (a few minutes of the tiny model) does not beat random init yet. The budget "
              f"that does, measured step by step with {BENCHMARK}: about an hour of this recipe on one CPU device for "
              f"SQuAD; SST-2 on 2000 sentences needs more than 1.2 M pre-training sequences (more than an encoder "
              f"just past the MLM plateau), and docs/transfer-findings.md says why")
    print(f"total time: {summary['seconds']:.0f} s")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    squad_dir = _SQUAD_DIR.value if _SQUAD_DIR.value is not None else os.environ.get("SQUAD_DIR") or None
    glue_dir = _GLUE_DIR.value if _GLUE_DIR.value is not None else os.environ.get("GLUE_DIR") or None
    try:
        run(_CORPUS.value, _WORKDIR.value, squad_dir, glue_dir, _VOCAB_SIZE.value, _TOTAL_STEPS.value,
            _DUPE_FACTOR.value, _SQUAD_TRAIN_EXAMPLES.value, _SQUAD_EVAL_EXAMPLES.value, _RANDOM_BASELINE.value,
            _DYNAMIC.value, _SST2_TRAIN_EXAMPLES.value)
    except (DemoError, *errors.USER_ERRORS) as e:
        print(errors.exit_with("demo", e).code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from bert_jax import console

    console.install()
    errors.run(main, "demo")
