"""GLUE classification fine-tuning (paper section 4.1): MRPC and SST-2.

  python -m bert_jax.tasks.glue --config configs/glue.py:mrpc \\
      --config.init_checkpoint=/path/to/minilm --config.data_dir=../shared/data/glue/MRPC --workdir /tmp/mrpc

The classifier is a dropout + [D, num_labels] projection of the pooled [CLS] output
(`modeling.BertForSequenceClassification`); loss = mean cross-entropy. Data: `train.tsv` / `dev.tsv` of
config.data_dir in GLUE format, or TFDS `glue/<task>` with config.use_tfds. Metrics on the dev set:
accuracy, and F1 of the positive class (label 1) as GLUE reports for MRPC. Writes metrics.json,
dev_predictions.tsv, tensorboard/ and the fine-tuned state in checkpoints/ under the workdir.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax import engine, losses, modeling, storage, summaries
from bert_jax.data import glue
from bert_jax.tasks import finetune

LABEL_NAMES = ("labels",)


def classification_metrics(predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """int [N] predicted and gold labels -> accuracy and binary F1 of label 1, in percent.

    F1 is 0 when there is no true positive (precision or recall undefined or 0).
    """
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    tp = float(np.sum((predictions == 1) & (labels == 1)))
    fp = float(np.sum((predictions == 1) & (labels != 1)))
    fn = float(np.sum((predictions != 1) & (labels == 1)))
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return {"accuracy": 100.0 * float(np.mean(predictions == labels)), "f1": 100.0 * f1}


def _examples(config: ml_collections.ConfigDict, split: str) -> list[glue.InputExample]:
    if config.use_tfds:
        return glue.read_glue_tfds(config.task, "validation" if split == "dev" else split,
                                   data_dir=config.tfds_data_dir or None)
    return glue.read_glue_tsv(config.task, storage.join(config.data_dir, f"{split}.tsv"))


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Fine-tunes on the task's train split and evaluates on its dev split.

    Returns:
      metrics: init, train_examples, train_steps, train_seconds, train_loss, dev accuracy / f1 (percent),
      eval_examples, majority_accuracy (the dev share of the most frequent label), checkpoint.

    Raises:
      ValueError / FileNotFoundError: unknown task, missing files, bad rows or a bad checkpoint.
    """
    if config.task not in glue.TASKS:
        raise ValueError(f"config.task={config.task!r} is not one of {sorted(glue.TASKS)}")
    init = finetune.resolve_init(config)
    tokenizer = finetune.load_tokenizer(config, init)
    if config.max_seq_length > init.config.max_position_embeddings:
        raise ValueError(f"config.max_seq_length={config.max_seq_length} exceeds max_position_embeddings="
                         f"{init.config.max_position_embeddings}")
    train_examples = _examples(config, "train")
    if config.max_train_examples > 0:
        train_examples = train_examples[:config.max_train_examples]
    train = glue.convert_examples_to_features(train_examples, tokenizer, config.max_seq_length)
    dev = glue.convert_examples_to_features(_examples(config, "dev"), tokenizer, config.max_seq_length)
    num_labels = glue.TASKS[config.task][0]
    model = modeling.BertForSequenceClassification(init.config, num_labels=num_labels)
    mesh = engine.make_mesh(config.mesh)
    num_train_steps = int(len(train["labels"]) / config.train_batch_size * config.num_train_epochs)
    tx, schedule = finetune.create_optimizer(config, num_train_steps)
    state, shardings = finetune.create_state(model, tx, mesh, init, config.seed)

    def loss_fn(out, batch):
        return losses.classification_loss(out.logits, batch["labels"])

    step_fn, predict_fn = finetune.compile_steps(model, tx, schedule, mesh, shardings, loss_fn, LABEL_NAMES)
    storage.makedirs(workdir)
    is_main = jax.process_index() == 0
    writer = summaries.open_writer(workdir, is_main)
    start = time.perf_counter()
    state, history = finetune.fit(state, step_fn, train, batch_size=config.train_batch_size,
                                  num_train_steps=num_train_steps, seed=config.seed, mesh=mesh, writer=writer,
                                  log_every=config.log_every, desc=f"GLUE {config.task} fine-tuning")
    metrics: dict[str, Any] = {"init": init.kind, "train_examples": len(train["labels"]),
                               "train_steps": num_train_steps, "train_seconds": time.perf_counter() - start,
                               "train_loss": history[-1]["loss"] if history else float("nan")}
    out = finetune.predict(predict_fn, state.params, dev, batch_size=config.eval_batch_size, mesh=mesh,
                           desc=f"GLUE {config.task} dev")
    predictions = np.argmax(out.logits, axis=-1)
    metrics.update(classification_metrics(predictions, dev["labels"]), eval_examples=len(dev["labels"]),
                   majority_accuracy=100.0 * float(np.max(np.bincount(dev["labels"], minlength=num_labels)))
                   / len(dev["labels"]))
    summaries.write_scalars(writer, num_train_steps, {k: metrics[k] for k in ("accuracy", "f1")}, "eval")
    if config.save_checkpoint and num_train_steps > 0:
        metrics["checkpoint"] = finetune.save_final(workdir, state, config, init.config,
                                                    {k: metrics[k] for k in ("accuracy", "f1")})
    if writer is not None:
        writer.close()
    if is_main:
        rows = "".join(f"{i}\t{p}\t{y}\n" for i, (p, y) in enumerate(zip(predictions, dev["labels"])))
        storage.write_text(storage.join(workdir, "dev_predictions.tsv"), "index\tprediction\tlabel\n" + rows)
        storage.write_json(storage.join(workdir, "metrics.json"), metrics)
    return metrics


if __name__ == "__main__":
    finetune.cli(run, "glue", "GLUE config file, e.g. configs/glue.py:mrpc.")
