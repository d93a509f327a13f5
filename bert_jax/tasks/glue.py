"""GLUE fine-tuning (paper section 4.1): the nine tasks of `bert_jax.data.glue.TASKS`.

  python -m bert_jax.tasks.glue --config glue:mnli \\
      --config.init_checkpoint=/path/to/minilm --config.data_dir=/path/to/glue_data/MNLI --workdir /tmp/mnli \\
      --config.do_predict=true

The head is a dropout + [D, num_labels] projection of the pooled [CLS] output
(`heads.BertForSequenceClassification`): cross-entropy over the task's labels, or for STS-B one output
with the mean squared error (`losses.regression_loss`). Data: the task's GLUE-format files in
config.data_dir, or TFDS `glue/<task>` with config.use_tfds.

Dev metrics (percent), the GLUE benchmark's per task, from scikit-learn / scipy (`compute_metrics`):
CoLA Matthews correlation (`mcc`); SST-2, MNLI, QNLI, RTE, WNLI `accuracy`; MRPC, QQP `accuracy` and
`f1` (of label 1); STS-B `pearson` and `spearman`. MNLI has two dev sets: its keys are prefixed
`matched_` (dev_matched.tsv) and `mismatched_` (dev_mismatched.tsv).

Writes metrics.json, dev_predictions.tsv (MNLI: dev_matched_predictions.tsv, dev_mismatched_predictions.tsv),
tensorboard/ and the fine-tuned state in checkpoints/ under the workdir; with config.do_predict, the
GLUE-server submission files of the test set(s) in <workdir>/submission/ (`write_submission`); MNLI
also writes AX.tsv, its model's predictions on GLUE's diagnostic set (`glue.AX`; config.diagnostic_file,
config.predict_diagnostic), which the server needs for a complete submission.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np

from bert_jax.tasks import batching
from bert_jax.training import losses, steps, summaries
from bert_jax.model import heads
from bert_jax import storage
from bert_jax.data import glue
from bert_jax.tasks import finetune, job, prediction

SUBMISSION_DIR = "submission"


def compute_metrics(task: str, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The GLUE metrics of `task`, in percent.

    Args:
      predictions, labels: [N] label indices (int) of a classification task, or float scores (STS-B).

    Returns:
      {name: value} for the task's metrics (`GlueTask.metrics`): `mcc` sklearn.metrics.matthews_corrcoef
      (0 when a class is never predicted or never gold); `accuracy` accuracy_score; `f1` f1_score of
      label 1 (binary; 0 without a true positive); `pearson` / `spearman` scipy.stats.pearsonr /
      spearmanr (nan when the predictions or labels are constant).

    Raises:
      ValueError: unknown task, or predictions and labels of different lengths or empty.
    """
    spec = glue.get_task(task)
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape or predictions.ndim != 1 or not len(labels):
        raise ValueError(f"{task} metrics: predictions {predictions.shape} and labels {labels.shape} are not "
                         "the same non-empty [N]")
    # Imported here, not with the module: only the evaluation needs scipy.stats and sklearn.metrics, and importing
    # them is a large share of a job's start (its flag errors included).
    from scipy import stats
    from sklearn import metrics as skm

    values = {}
    for name in spec.metrics:
        if name == "mcc":
            value = skm.matthews_corrcoef(labels, predictions)
        elif name == "accuracy":
            value = skm.accuracy_score(labels, predictions)
        elif name == "f1":
            value = skm.f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0)
        elif name == "pearson":
            value = stats.pearsonr(predictions, labels).statistic if _varies(predictions, labels) else np.nan
        elif name == "spearman":
            value = stats.spearmanr(predictions, labels).statistic if _varies(predictions, labels) else np.nan
        else:  # pragma: no cover - TASKS names only the metrics above
            raise ValueError(f"unknown GLUE metric {name!r}")
        values[name] = 100.0 * float(value)
    return values


def _varies(*arrays: np.ndarray) -> bool:
    return all(np.ptp(a) > 0 for a in arrays)


def write_submission(path: str, task: str, guids: Sequence[str], predictions: np.ndarray) -> None:
    """Writes one GLUE-server test-set file: a header `index\\tprediction`, then one row per example.

    Args:
      path: the file (named as the server expects: CoLA.tsv, ..., MNLI-m.tsv, MNLI-mm.tsv; see
        `GlueTask.test_sets`).
      guids: [N] the test file's index column (`InputExample.guid` of a test file).
      predictions: [N] label indices (int), written as the task's label strings (entailment /
        not_entailment for QNLI and RTE, MNLI's contradiction / entailment / neutral, 0 / 1 for the
        others), or STS-B float scores, written with 3 decimals (as the GLUE files' scores).

    Raises:
      ValueError: unknown task, guids and predictions of different lengths, a label index out of range.
    """
    spec = glue.get_task(task)
    predictions = np.asarray(predictions)
    if len(guids) != len(predictions):
        raise ValueError(f"{path}: {len(guids)} test examples but {len(predictions)} predictions")
    if spec.is_regression:
        values = [f"{float(p):.3f}" for p in predictions]
    else:
        if len(predictions) and not 0 <= predictions.min() <= predictions.max() < spec.num_labels:
            raise ValueError(f"{path}: predictions outside 0..{spec.num_labels - 1}")
        values = [spec.labels[int(p)] for p in predictions]
    storage.write_text(path, "index\tprediction\n" + "".join(f"{g}\t{v}\n" for g, v in zip(guids, values)))


def _examples(config: ml_collections.ConfigDict, file: str, tfds_split: str) -> list[glue.InputExample]:
    """The examples of one split (TSV `file` in config.data_dir, or TFDS `tfds_split`); none: ValueError."""
    if config.use_tfds:
        examples = glue.read_glue_tfds(config.task, tfds_split, data_dir=config.tfds_data_dir or None)
        source = f"TFDS glue/{config.task} {tfds_split}"
    else:
        source = job.data_file(config, file)
        examples = glue.read_glue_tsv(config.task, source)
    if not examples:
        raise ValueError(f"{source} holds no examples")
    return examples


def _diagnostic_examples(config: ml_collections.ConfigDict) -> list[glue.InputExample]:
    """GLUE's diagnostic set (`glue.AX`): TFDS glue/ax "test", or config.diagnostic_file (default
    diagnostic/diagnostic.tsv beside the MNLI folder, the GLUE download's layout).

    Raises:
      FileNotFoundError: no such file (one line, saying how to point to it or turn it off).
    """
    if config.use_tfds:
        return glue.read_glue_tfds(glue.AX.name, "test", data_dir=config.tfds_data_dir or None)
    path = config.diagnostic_file or storage.join(os.path.dirname(str(config.data_dir).rstrip("/")),
                                                  glue.AX.folder, glue.AX.test_sets[0].file)
    if not storage.is_file(path):
        raise FileNotFoundError(f"GLUE diagnostic file {path!r} does not exist (MNLI's do_predict writes AX.tsv "
                                f"from it): set config.diagnostic_file, or config.predict_diagnostic=False")
    return glue.read_glue_tsv(glue.AX.name, path)


def _predictions(spec: glue.GlueTask, logits: np.ndarray) -> np.ndarray:
    """float32 [N, C] logits -> int [N] label indices, or float32 [N] scores (regression, C = 1)."""
    return logits[:, 0] if spec.is_regression else np.argmax(logits, axis=-1)


def _format(spec: glue.GlueTask, value) -> str:
    """A dev prediction or label as dev_predictions.tsv writes it: the label index, or the score."""
    return f"{float(value):.4f}" if spec.is_regression else str(int(value))


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Fine-tunes on the task's train split, evaluates on its dev split(s), and with config.do_predict
    writes the test-set submission files.

    Returns:
      metrics: init, train_examples, train_steps, train_seconds, train_loss; per dev set (prefix "" or,
      for MNLI, "matched_" / "mismatched_") the task's metrics (`compute_metrics`, percent),
      eval_examples and, for classification, majority_accuracy (the dev share of the most frequent
      label); checkpoint; with do_predict, submission (the written files).

    Raises:
      ValueError / FileNotFoundError: unknown task, missing files, bad rows or a bad checkpoint.
    """
    if config.task not in glue.TASKS:
        raise ValueError(f"config.task={config.task!r} is not one of {sorted(glue.TASKS)}")
    spec = glue.TASKS[config.task]
    padding = batching.Padding.from_config(config)  # dynamic padding: config.length_buckets, group_by_length
    init, tokenizer = job.load_encoder(config)

    def features(examples):
        return glue.convert_examples_to_features(examples, tokenizer, config.max_seq_length, spec.is_regression)

    train_examples = _examples(config, "train.tsv", "train")
    if config.max_train_examples > 0:
        train_examples = train_examples[:config.max_train_examples]
    train = features(train_examples)
    devs = [(split, features(_examples(config, split.file, split.tfds))) for split in spec.dev]
    tests = ([(split, _examples(config, split.file, split.tfds)) for split in spec.test_sets]
             if config.do_predict else [])  # read before training: a bad file fails first
    if config.do_predict and spec.name == "mnli" and config.get("predict_diagnostic", True):
        tests.append((glue.AX.test_sets[0], _diagnostic_examples(config)))  # AX.tsv, MNLI's labels
    model = heads.BertForSequenceClassification(init.config, num_labels=spec.num_labels)
    mesh = steps.make_mesh(config.mesh)
    num_train_steps = int(len(train["labels"]) / config.train_batch_size * config.num_train_epochs)
    # config.max_length_buckets: bucket lengths placed on the batches fit will draw
    padding = padding.placed(train, config.train_batch_size, config.seed, num_train_steps)
    tx, schedule = finetune.create_optimizer(config, num_train_steps)
    state, shardings = finetune.create_state(model, tx, mesh, init, config.seed)
    head_loss = losses.regression_loss if spec.is_regression else losses.classification_loss

    def loss_fn(out, batch):
        return head_loss(out.logits, batch["labels"])

    step_fn, predict_fn = finetune.compile_steps(model, tx, schedule, mesh, shardings, loss_fn,
                                                 shared_update=config.get("shared_update", False))
    storage.makedirs(workdir)
    is_main = jax.process_index() == 0
    writer = summaries.open_writer(workdir, is_main)
    start = time.perf_counter()
    state, history = finetune.fit(state, step_fn, train, batch_size=config.train_batch_size,
                                  num_train_steps=num_train_steps, seed=config.seed, mesh=mesh, writer=writer,
                                  log_every=config.log_every, desc=f"GLUE {config.task} fine-tuning",
                                  padding=padding)
    metrics: dict[str, Any] = {"init": init.kind, "train_examples": len(train["labels"]),
                               "train_steps": num_train_steps, "train_seconds": time.perf_counter() - start,
                               "train_loss": history[-1]["loss"] if history else float("nan")}
    scores, prediction_files = {}, {}
    for split, dev in devs:
        out = prediction.predict(predict_fn, state.params, dev, batch_size=config.eval_batch_size, mesh=mesh,
                               desc=f"GLUE {config.task} {split.file}", padding=padding)
        predictions, labels = _predictions(spec, out.logits), dev["labels"]
        scores.update({split.key + k: v for k, v in compute_metrics(config.task, predictions, labels).items()})
        metrics[split.key + "eval_examples"] = len(labels)
        if not spec.is_regression:
            counts = np.bincount(labels, minlength=spec.num_labels)
            metrics[split.key + "majority_accuracy"] = 100.0 * float(counts.max()) / len(labels)
        prediction_files[split.file.replace(".tsv", "_predictions.tsv")] = "index\tprediction\tlabel\n" + "".join(
            f"{i}\t{_format(spec, p)}\t{_format(spec, y)}\n" for i, (p, y) in enumerate(zip(predictions, labels)))
    metrics.update(scores)
    job.finish(writer, workdir, state, config, init.config, tokenizer, scores, metrics, num_train_steps)
    submissions = []
    for split, examples in tests:
        test = features(examples)
        out = prediction.predict(predict_fn, state.params, test, batch_size=config.eval_batch_size, mesh=mesh,
                               desc=f"GLUE {config.task} {split.file}", padding=padding)
        path = storage.join(workdir, SUBMISSION_DIR, split.key)
        if is_main:
            storage.makedirs(storage.join(workdir, SUBMISSION_DIR))
            write_submission(path, config.task, [e.guid for e in examples], _predictions(spec, out.logits))
        submissions.append(path)
    if submissions:
        metrics["submission"] = submissions
    if is_main:
        for name, text in prediction_files.items():
            storage.write_text(storage.join(workdir, name), text)
        storage.write_json(storage.join(workdir, "metrics.json"), metrics)
    return metrics


if __name__ == "__main__":
    job.cli(run, "glue", "GLUE recipe, e.g. glue:mrpc (or a config file path).")
