"""The main job (`make demo`): the whole bert_jax pipeline on a laptop CPU, offline, in minutes.

  python -m bert_jax.demo [--corpus FILE] [--workdir DIR] [--squad_dir DIR] [--total_steps 300]

Stages (each the library call a user would make, with progress bars):
  1. corpus: CPython's bundled documentation text (`pydoc_data.topics`, on every Python
     installation; each topic a document, one sentence per line), or --corpus FILE in the original
     BERT format (one sentence per line, blank lines between documents);
  2. a WordPiece vocabulary trained with sentencepiece (`bert_jax.data.vocab.train_vocab`);
  3. pre-training instances for phase 1 (length 128, 20 predictions) and phase 2 (512, 80)
     (`bert_jax.data.pretraining.create_pretraining_data`, ArrayRecord shards);
  4. pre-training of the tiny BERT through both phases in one run on 8 simulated CPU devices (mesh
     data 4 x tensor 2), with Orbax checkpoints (`bert_jax.train.train_and_evaluate`);
  5. SQuAD v1.1 fine-tuning from the final checkpoint, in a fresh process
     (`python -m bert_jax.tasks.squad`), when SQuAD files are found: --squad_dir, else $SQUAD_DIR;
     without them the demo says how to download them and stops after pre-training;
  6. a summary (MLM / NSP accuracy per phase, checkpoint paths, SQuAD EM / F1) and a PNG of the
     training curves beside the TensorBoard logs.
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

_CORPUS = flags.DEFINE_string("corpus", None, "Corpus in the original BERT format (default: pydoc_data.topics).")
_WORKDIR = flags.DEFINE_string("workdir", "demo_run", "Output directory (replaced if it holds an earlier demo).")
_SQUAD_DIR = flags.DEFINE_string("squad_dir", None, "Folder with train-v1.1*.json and dev-v1.1.json "
                                 "(default: $SQUAD_DIR; none: the SQuAD stage is skipped with a message).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 4000, "WordPiece vocabulary size trained on the corpus.")
_TOTAL_STEPS = flags.DEFINE_integer("total_steps", 300, "Pre-training steps over both phases (90% / 10%).")
_DUPE_FACTOR = flags.DEFINE_integer("dupe_factor", 5, "Passes over the corpus when generating instances.")
_SQUAD_TRAIN_EXAMPLES = flags.DEFINE_integer("squad_train_examples", 2000, "SQuAD training questions used.")
_SQUAD_EVAL_EXAMPLES = flags.DEFINE_integer("squad_eval_examples", 500, "SQuAD dev questions evaluated.")

SQUAD_DOWNLOAD = ("python -m bert_jax.data.download squad --output_dir data/squad   "
                  "(then: make demo SQUAD_DIR=data/squad)")


class DemoError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


def write_pydoc_corpus(path: str) -> int:
    """Writes `pydoc_data.topics` in the original BERT format -> number of documents."""
    from pydoc_data import topics

    from bert_jax.data.corpus import split_sentences

    docs = 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for name in sorted(topics.topics):
            sentences = [s for p in topics.topics[name].split("\n\n") for s in split_sentences(" ".join(p.split()))]
            if sentences:
                f.write("\n".join(sentences) + "\n\n")
                docs += 1
    os.replace(path + ".tmp", path)
    return docs


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
    """(train file, dev file) in squad_dir, None when no folder is named.

    Raises:
      DemoError: the named folder does not exist or lacks the files.
    """
    if not squad_dir:
        return None
    if not os.path.isdir(squad_dir):
        raise DemoError(f"SQuAD folder {squad_dir!r} does not exist; get the files with: {SQUAD_DOWNLOAD}")
    names = sorted(os.listdir(squad_dir))
    train = next((n for n in names if n.startswith("train-v1.1") and n.endswith(".json")), None)
    if train is None or "dev-v1.1.json" not in names:
        raise DemoError(f"SQuAD folder {squad_dir!r} lacks train-v1.1*.json or dev-v1.1.json; get them with: "
                        f"{SQUAD_DOWNLOAD}")
    return os.path.join(squad_dir, train), os.path.join(squad_dir, "dev-v1.1.json")


def pretrain_config(workdir: str, vocab_size: int, total_steps: int):
    from configs import pretrain

    config = pretrain.get_config("tiny")
    config.model.vocab_size = vocab_size
    config.total_steps = total_steps
    config.warmup_steps = max(total_steps // 10, 1)
    config.learning_rate = 2e-3
    config.phases = [pretrain.phase(128, 20, 0.9, os.path.join(workdir, "data", "phase1"), 32),
                     pretrain.phase(512, 80, 0.1, os.path.join(workdir, "data", "phase2"), 16)]
    config.mesh.data, config.mesh.tensor = 4, 2
    config.log_every = 10
    config.checkpoint_every = total_steps
    return config


def phase_summary(records: list[dict], phases) -> list[dict]:
    """Mean metrics over the last 3 logs of each phase."""
    out = []
    for p in phases:
        logs = [r for r in records if p.start < r["step"] <= p.end][-3:]
        if logs:
            out.append({"phase": p.index, "max_seq_length": p.max_seq_length, "steps": f"{p.start}-{p.end}",
                        **{k: sum(r[k] for r in logs) / len(logs)
                           for k in ("mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy")}})
    return out


def run(corpus: str | None, workdir: str, squad_dir: str | None, vocab_size: int, total_steps: int,
        dupe_factor: int, squad_train_examples: int, squad_eval_examples: int) -> dict:
    """The whole pipeline (module docstring) -> the summary dict (also written to workdir/summary.json)."""
    start = time.perf_counter()
    workdir = os.path.abspath(workdir)
    squad_files = find_squad(squad_dir)  # a wrong path fails before any work
    if corpus is not None:
        check_corpus(corpus)
    if os.path.isdir(workdir) and os.listdir(workdir):
        if not os.path.isfile(os.path.join(workdir, "summary.json")) and \
                not os.path.isdir(os.path.join(workdir, "pretrain")):
            raise DemoError(f"--workdir {workdir} is not empty and not an earlier demo; name another folder")
        import shutil

        shutil.rmtree(workdir)
    os.makedirs(workdir)

    import jax

    from bert_jax import storage, summaries, train
    from bert_jax.data import corpus as corpus_lib
    from bert_jax.data import pretraining, tokenization
    from bert_jax.data.vocab import train_vocab

    # 1-2. corpus and vocabulary
    corpus_file = corpus or os.path.join(workdir, "corpus.txt")
    if corpus is None:
        docs = write_pydoc_corpus(corpus_file)
        print(f"[1/5] corpus: pydoc_data.topics, {docs} documents -> {corpus_file}", flush=True)
    else:
        print(f"[1/5] corpus: {corpus}", flush=True)
    vocab_file = os.path.join(workdir, "vocab.txt")
    try:
        stats = train_vocab([corpus_file], vocab_size, vocab_file)
    except ValueError as e:
        raise DemoError(f"vocabulary: {e}") from None
    print(f"[2/5] vocabulary: {stats['vocab_size']} WordPiece tokens from {stats['lines']} lines "
          f"({stats['seconds']} s) -> {vocab_file}", flush=True)

    # 3. instances for both phases
    tokenizer = tokenization.Tokenizer(vocab_file)
    config = pretrain_config(workdir, tokenizer.vocab_size, total_steps)
    for i, p in enumerate(config.phases):
        read_stats = corpus_lib.ReadStats()
        meta = pretraining.create_pretraining_data(
            corpus_lib.read_sentence_documents([corpus_file], read_stats), tokenizer, p.data_dir,
            options=pretraining.InstanceOptions(max_seq_length=p.max_seq_length,
                                                max_predictions_per_seq=p.max_predictions_per_seq),
            dupe_factor=dupe_factor, num_shards=2, random_seed=12345 + i, read_stats=read_stats)
        if meta["num_instances"] < p.batch_size:
            raise DemoError(f"corpus {corpus_file}: only {meta['num_instances']} length-{p.max_seq_length} "
                            f"instances, fewer than a batch of {p.batch_size}; use a larger corpus")
        print(f"[3/5] instances: phase {i + 1}, length {p.max_seq_length}: {meta['num_instances']} -> {p.data_dir}",
              flush=True)

    # 4. pre-training, both phases in one run, 8 simulated devices
    pretrain_dir = os.path.join(workdir, "pretrain")
    print(f"[4/5] pre-training BERT tiny ({config.model.num_hidden_layers} layers, hidden {config.model.hidden_size}) "
          f"for {total_steps} steps on {jax.device_count()} {jax.default_backend()} devices "
          f"(mesh data {config.mesh.data} x tensor {config.mesh.tensor})", flush=True)
    train.train_and_evaluate(config, pretrain_dir)
    phases = train.resolve_phases(config)
    records = summaries.read_metrics(pretrain_dir)
    png = summaries.plot_curves(records, ["loss", "mlm_accuracy", "nsp_accuracy", "learning_rate"],
                                os.path.join(pretrain_dir, "training_curves.png"),
                                title="bert_jax demo: pre-training (dashed: phase switch)",
                                vertical_lines=[p.start for p in phases[1:]])
    summary = {"corpus": corpus_file, "vocab_file": vocab_file, "phases": phase_summary(records, phases),
               "chance_mlm_accuracy": 1.0 / tokenizer.vocab_size,
               "checkpoints": [os.path.join(pretrain_dir, "checkpoints", str(s)) for s in sorted(
                   int(d) for d in os.listdir(os.path.join(pretrain_dir, "checkpoints")) if d.isdigit())],
               "tensorboard": os.path.join(pretrain_dir, "tensorboard"), "curves_png": png}

    # 5. SQuAD from the final checkpoint, in a fresh process (as a user's fine-tuning job)
    if squad_files is None:
        summary["squad"] = f"skipped: no SQuAD files (set SQUAD_DIR or --squad_dir); download: {SQUAD_DOWNLOAD}"
        print(f"[5/5] SQuAD: {summary['squad']}", flush=True)
    else:
        squad_dir_out = os.path.join(workdir, "squad")
        cmd = [sys.executable, "-m", "bert_jax.tasks.squad", "--config", os.path.join(_project_root(), "configs", "squad.py") + ":tiny",
               f"--config.init_checkpoint={pretrain_dir}", f"--config.vocab_file={vocab_file}",
               f"--config.train_file={_subset(squad_files[0], squad_train_examples, workdir)}",
               f"--config.predict_file={squad_files[1]}", f"--config.max_predict_examples={squad_eval_examples}",
               "--config.max_seq_length=128", "--config.doc_stride=64", "--config.max_query_length=32",
               "--config.num_train_epochs=2", "--config.learning_rate=1e-3", "--config.predict_batch_size=64",
               "--config.log_every=10", "--config.mesh.num_devices=1", f"--workdir={squad_dir_out}"]
        print(f"[5/5] SQuAD v1.1: fine-tuning from {pretrain_dir} in a new process:\n      {' '.join(cmd)}",
              flush=True)
        env = dict(os.environ, XLA_FLAGS="")  # one CPU device: faster than 8 simulated ones at this size
        result = subprocess.run(cmd, env=env, cwd=_project_root())
        if result.returncode != 0:
            raise DemoError(f"SQuAD stage failed (exit status {result.returncode}); see the messages above")
        with open(os.path.join(squad_dir_out, "metrics.json"), encoding="utf-8") as f:
            squad_metrics = json.load(f)
        summary["squad"] = {k: squad_metrics[k] for k in ("exact_match", "f1", "predict_examples", "train_steps",
                                                          "checkpoint")}
        records = summaries.read_metrics(squad_dir_out)
        summary["squad"]["curves_png"] = summaries.plot_curves(
            records, ["loss", "learning_rate"], os.path.join(squad_dir_out, "training_curves.png"),
            title="bert_jax demo: SQuAD fine-tuning")
    summary["seconds"] = round(time.perf_counter() - start, 1)
    storage.write_json(os.path.join(workdir, "summary.json"), summary)
    _print_summary(summary)
    return summary


def _project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _subset(path: str, n: int, workdir: str) -> str:
    """The first n questions of a SQuAD file, as a SQuAD file in workdir."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    kept, articles = 0, []
    for article in data["data"]:
        paragraphs = []
        for p in article["paragraphs"]:
            if kept >= n:
                break
            qas = p["qas"][: n - kept]
            kept += len(qas)
            paragraphs.append(dict(p, qas=qas))
        if paragraphs:
            articles.append(dict(article, paragraphs=paragraphs))
    out = os.path.join(workdir, "squad_train_subset.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(dict(data, data=articles), f)
    return out


def _print_summary(summary: dict) -> None:
    print("\n=== bert_jax demo summary ===")
    for p in summary["phases"]:
        print(f"pre-training phase {p['phase'] + 1} (length {p['max_seq_length']}, steps {p['steps']}): "
              f"MLM accuracy {p['mlm_accuracy']:.3f} (loss {p['mlm_loss']:.3f}; chance "
              f"{summary['chance_mlm_accuracy']:.4f}), NSP accuracy {p['nsp_accuracy']:.3f}")
    print(f"checkpoints: {', '.join(summary['checkpoints'])}")
    print(f"TensorBoard: {summary['tensorboard']}   curves: {summary['curves_png']}")
    squad = summary["squad"]
    if isinstance(squad, dict):
        print(f"SQuAD v1.1 ({squad['predict_examples']} dev questions, tiny model): EM {squad['exact_match']:.1f} "
              f"F1 {squad['f1']:.1f}   fine-tuned checkpoint: {squad['checkpoint']}")
    else:
        print(f"SQuAD: {squad}")
    print(f"total time: {summary['seconds']:.0f} s")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    squad_dir = _SQUAD_DIR.value if _SQUAD_DIR.value is not None else os.environ.get("SQUAD_DIR") or None
    try:
        run(_CORPUS.value, _WORKDIR.value, squad_dir, _VOCAB_SIZE.value, _TOTAL_STEPS.value, _DUPE_FACTOR.value,
            _SQUAD_TRAIN_EXAMPLES.value, _SQUAD_EVAL_EXAMPLES.value)
    except (DemoError, ValueError, FileNotFoundError, FloatingPointError) as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    app.run(main)
