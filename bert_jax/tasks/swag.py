"""SWAG fine-tuning (paper section 4.4, Table 4): four-way multiple choice, accuracy.

  python -m bert_jax.tasks.swag --config swag \\
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/swagaf/data --workdir /tmp/swag

Each example becomes four sequences `[CLS] sent1 [SEP] sent2 ending_i [SEP]` (`bert_jax.data.swag`);
`heads.BertForMultipleChoice` scores each with a [D, 1] projection of its pooled [CLS] output, the
four scores are softmaxed and trained with cross-entropy (`losses.classification_loss` over the
choices), as the paper and transformers' BertForMultipleChoice.

Writes metrics.json (dev `accuracy` in percent, as Table 4), val_predictions.csv (`index,prediction,
label`), tensorboard/ and the fine-tuned state in checkpoints/ under the workdir; with
config.do_predict, test_predictions.csv (`index,prediction`) for test.csv.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax.tasks import batching
from bert_jax.training import losses, steps, summaries
from bert_jax.model import heads
from bert_jax import storage
from bert_jax.data import swag
from bert_jax.tasks import finetune, job, prediction



def compute_metrics(predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """{"accuracy": percent of predictions equal to labels}.

    Args:
      predictions, labels: int [N] choice indices.

    Raises:
      ValueError: predictions and labels of different lengths or empty.
    """
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape or predictions.ndim != 1 or not len(labels):
        raise ValueError(f"SWAG metrics: predictions {predictions.shape} and labels {labels.shape} are not the same "
                         "non-empty [N]")
    return {"accuracy": 100.0 * float(np.mean(predictions == labels))}


def _examples(config: ml_collections.ConfigDict, name: str, labelled: bool) -> list[swag.SwagExample]:
    """The examples of config.data_dir/<name>; ValueError when empty, or (labelled) without labels."""
    path = job.data_file(config, name)
    examples = swag.read_swag_csv(path)
    if not examples:
        raise ValueError(f"{path} holds no examples")
    if labelled and examples[0].label < 0:
        raise ValueError(f"{path} has no label column")
    return examples


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Fine-tunes on config.train_file, evaluates on config.dev_file and, with config.do_predict,
    predicts config.test_file (all in config.data_dir).

    Returns:
      metrics: init, train_examples, train_steps, train_seconds, train_loss, accuracy (dev, percent),
      eval_examples, checkpoint (when saved); with do_predict, test_predictions (the written file).

    Raises:
      ValueError / FileNotFoundError: missing files, bad rows (`swag.read_swag_csv`), a dev file without
        labels, a bad checkpoint, or max_seq_length over the model's max_position_embeddings.
    """
    padding = batching.Padding.from_config(config)  # dynamic padding: config.length_buckets, group_by_length
    init, tokenizer = job.load_encoder(config)

    def features(examples):
        return swag.convert_examples_to_features(examples, tokenizer, config.max_seq_length)

    train_examples = _examples(config, config.train_file, labelled=True)
    if config.max_train_examples > 0:
        train_examples = train_examples[:config.max_train_examples]
    train = features(train_examples)
    dev_examples = _examples(config, config.dev_file, labelled=True)
    dev = features(dev_examples)
    test_examples = _examples(config, config.test_file, labelled=False) if config.do_predict else []

    model = heads.BertForMultipleChoice(init.config)
    mesh = steps.make_mesh(config.mesh)
    num_train_steps = int(len(train["labels"]) / config.train_batch_size * config.num_train_epochs)
    # config.max_length_buckets: bucket lengths placed on the batches fit will draw
    padding = padding.placed(train, config.train_batch_size, config.seed, num_train_steps)
    tx, schedule = finetune.create_optimizer(config, num_train_steps)
    state, shardings = finetune.create_state(model, tx, mesh, init, config.seed)

    def loss_fn(out, batch):  # softmax over the four choices
        return losses.classification_loss(out.logits, batch["labels"])

    step_fn, predict_fn = finetune.compile_steps(model, tx, schedule, mesh, shardings, loss_fn,
                                                 shared_update=config.get("shared_update", False))
    storage.makedirs(workdir)
    is_main = jax.process_index() == 0
    writer = summaries.open_writer(workdir, is_main)
    start = time.perf_counter()
    state, history = finetune.fit(state, step_fn, train, batch_size=config.train_batch_size,
                                  num_train_steps=num_train_steps, seed=config.seed, mesh=mesh, writer=writer,
                                  log_every=config.log_every, desc="SWAG fine-tuning",
                                  padding=padding)
    metrics: dict[str, Any] = {"init": init.kind, "train_examples": len(train["labels"]),
                               "train_steps": num_train_steps, "train_seconds": time.perf_counter() - start,
                               "train_loss": history[-1]["loss"] if history else float("nan")}
    out = prediction.predict(predict_fn, state.params, dev, batch_size=config.eval_batch_size, mesh=mesh,
                           desc=f"SWAG {config.dev_file}", padding=padding)
    predictions = np.argmax(out.logits, axis=-1)
    scores = compute_metrics(predictions, dev["labels"])
    metrics.update(scores, eval_examples=len(dev_examples))
    job.finish(writer, workdir, state, config, init.config, tokenizer, scores, metrics, num_train_steps)
    files = {"val_predictions.csv": "index,prediction,label\n" + "".join(
        f"{e.guid},{p},{e.label}\n" for e, p in zip(dev_examples, predictions))}
    if test_examples:
        out = prediction.predict(predict_fn, state.params, features(test_examples), batch_size=config.eval_batch_size,
                               mesh=mesh, desc=f"SWAG {config.test_file}", padding=padding)
        files["test_predictions.csv"] = "index,prediction\n" + "".join(
            f"{e.guid},{p}\n" for e, p in zip(test_examples, np.argmax(out.logits, axis=-1)))
        metrics["test_predictions"] = storage.join(workdir, "test_predictions.csv")
    if is_main:
        for name, text in files.items():
            storage.write_text(storage.join(workdir, name), text)
        storage.write_json(storage.join(workdir, "metrics.json"), metrics)
    return metrics


if __name__ == "__main__":
    job.cli(run, "swag", "SWAG recipe, e.g. swag (or swag:large, or a config file path).")
