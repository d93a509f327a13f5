"""CoNLL-2003 named-entity recognition (paper section 5.3, Table 7): token classification, entity F1.

  python -m bert_jax.tasks.ner --config ner \\
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/conll2003 --workdir /tmp/ner

`heads.BertForTokenClassification` (dropout -> [D, C] on every token) is trained with cross-entropy
at the first sub-token of each word (`losses.token_classification_loss`); a word's prediction is the
argmax at its first sub-token (`bert_jax.data.ner`: features, splitting of long sentences). Labels
are the IOB tags of the training file, IOB1 or IOB2 as found.

Metrics (`compute_metrics`, percent): entity-level precision, recall and F1 (micro over entity types)
and per-type F1 from seqeval in its default mode, which chunks tags as conlleval.pl does (the CoNLL-2003
shared task's scorer; reads IOB1 and IOB2), plus word-level accuracy. Reported for the dev set
(`dev_` keys, Table 7's "Dev F1") and, when config.test_file is set, the test set (`test_`).

Writes metrics.json, dev_predictions.txt / test_predictions.txt (`word gold predicted` per line, a blank
line between sentences: conlleval.pl's input), tensorboard/ and the fine-tuned state in checkpoints/
under the workdir.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np
from seqeval import metrics as seqeval_metrics

from bert_jax.tasks import batching
from bert_jax.training import losses, steps, summaries
from bert_jax.model import heads
from bert_jax import storage
from bert_jax.data import ner
from bert_jax.tasks import finetune, job, prediction

LABEL_NAMES = ("labels", "label_weights")
# TFDS conll2003 split names of the files' roles.
TFDS_SPLITS = {"train": "train", "dev": "dev", "test": "test"}


def compute_metrics(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level scores of predicted tag sequences against gold ones, in percent (seqeval).

    Args:
      gold, predicted: one list of IOB tags (IOB1 or IOB2) per sentence, of equal lengths.

    Returns:
      precision, recall, f1: micro-averaged over entities; an entity is right when its type and both
      boundaries are (seqeval's default mode: conlleval.pl's chunks, so an I- tag after O or another type
      starts an entity); f1_<TYPE> for each entity type of the gold or predicted tags; accuracy: the share
      of words whose tag is right. A score with a zero denominator (no predicted / gold entity) is 0.

    Raises:
      ValueError: different numbers of sentences, a sentence whose two sequences differ in length, or
        no words at all.
    """
    if len(gold) != len(predicted) or any(len(g) != len(p) for g, p in zip(gold, predicted)):
        raise ValueError("NER metrics: gold and predicted tags are not one sequence per sentence of the same lengths")
    if not sum(map(len, gold)):
        raise ValueError("NER metrics: no words")
    gold, predicted = [list(g) for g in gold], [list(p) for p in predicted]
    values = {
        "precision": seqeval_metrics.precision_score(gold, predicted, zero_division=0),
        "recall": seqeval_metrics.recall_score(gold, predicted, zero_division=0),
        "f1": seqeval_metrics.f1_score(gold, predicted, zero_division=0),
        "accuracy": seqeval_metrics.accuracy_score(gold, predicted),
    }
    report = seqeval_metrics.classification_report(gold, predicted, output_dict=True, zero_division=0)
    for name, row in report.items():
        if not name.endswith(" avg"):  # micro / macro / weighted avg rows
            values[f"f1_{name}"] = row["f1-score"]
    return {k: 100.0 * float(v) for k, v in values.items()}


def _sentences(config: ml_collections.ConfigDict, role: str) -> list[ner.Sentence]:
    """The sentences of one role (train / dev / test): config.<role>_file in config.data_dir, or TFDS."""
    if config.use_tfds:
        sentences = ner.read_conll_tfds(TFDS_SPLITS[role], data_dir=config.tfds_data_dir or None)
        source = f"TFDS {ner.TFDS_NAME} {TFDS_SPLITS[role]}"
    else:
        source = job.data_file(config, config[f"{role}_file"])
        sentences = ner.read_conll(source)
    if not sentences:
        raise ValueError(f"{source} holds no sentences")
    return sentences


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Fine-tunes on the training sentences, then evaluates the dev (and, with config.test_file or
    TFDS, the test) sentences.

    Returns:
      metrics: init, labels (the label set, training-file order of `ner.label_list`), iob_scheme (of
      the training file), train_sentences, train_sequences, train_steps, train_seconds, train_loss;
      per evaluated set (prefix dev_ / test_) the `compute_metrics` scores and <prefix>sentences;
      checkpoint (when saved).

    Raises:
      ValueError / FileNotFoundError: missing files, malformed lines (`ner.read_conll`), a bad
        checkpoint, or max_seq_length over the model's max_position_embeddings.
    """
    padding = batching.Padding.from_config(config)  # dynamic padding: config.length_buckets, group_by_length
    init, tokenizer = job.load_encoder(config)
    train_sentences = _sentences(config, "train")
    if config.max_train_examples > 0:
        train_sentences = train_sentences[:config.max_train_examples]
    labels = ner.label_list(train_sentences)
    evals = [(role, _sentences(config, role)) for role in ("dev", "test")
             if config.use_tfds or config[f"{role}_file"]]

    def features(sentences):
        return ner.convert_to_features(sentences, tokenizer, labels, config.max_seq_length)

    train = features(train_sentences)
    model = heads.BertForTokenClassification(init.config, num_labels=len(labels))
    mesh = steps.make_mesh(config.mesh)
    num_train_steps = int(len(train["labels"]) / config.train_batch_size * config.num_train_epochs)
    # config.max_length_buckets: bucket lengths placed on the batches fit will draw
    padding = padding.placed(train, config.train_batch_size, config.seed, num_train_steps)
    tx, schedule = finetune.create_optimizer(config, num_train_steps)
    state, shardings = finetune.create_state(model, tx, mesh, init, config.seed)

    def loss_fn(out, batch):  # cross-entropy at the first sub-token of each word
        return losses.token_classification_loss(out.logits, batch["labels"], batch["label_weights"])

    step_fn, predict_fn = finetune.compile_steps(model, tx, schedule, mesh, shardings, loss_fn,
                                                 shared_update=config.get("shared_update", False))
    storage.makedirs(workdir)
    is_main = jax.process_index() == 0
    writer = summaries.open_writer(workdir, is_main)
    start = time.perf_counter()
    arrays = {k: train[k] for k in (*prediction.INPUT_NAMES, *LABEL_NAMES)}
    state, history = finetune.fit(state, step_fn, arrays, batch_size=config.train_batch_size,
                                  num_train_steps=num_train_steps, seed=config.seed, mesh=mesh, writer=writer,
                                  log_every=config.log_every, desc="CoNLL-2003 NER fine-tuning",
                                  padding=padding)
    metrics: dict[str, Any] = {"init": init.kind, "labels": list(labels),
                               "iob_scheme": ner.iob_scheme(train_sentences),
                               "train_sentences": len(train_sentences), "train_sequences": len(train["labels"]),
                               "train_steps": num_train_steps, "train_seconds": time.perf_counter() - start,
                               "train_loss": history[-1]["loss"] if history else float("nan")}
    scores, files = {}, {}
    for role, sentences in evals:
        feats = features(sentences)
        out = prediction.predict(predict_fn, state.params, feats, batch_size=config.eval_batch_size, mesh=mesh,
                               desc=f"CoNLL-2003 {role}", padding=padding)
        predicted = ner.word_predictions(feats, np.argmax(out.logits, axis=-1), sentences, labels)
        scores.update({f"{role}_{k}": v for k, v in compute_metrics([s.tags for s in sentences], predicted).items()})
        metrics[f"{role}_sentences"] = len(sentences)
        files[f"{role}_predictions.txt"] = (sentences, predicted)
    metrics.update(scores)
    job.finish(writer, workdir, state, config, init.config, tokenizer, scores, metrics, num_train_steps)
    if is_main:
        for name, (sentences, predicted) in files.items():
            ner.write_conll(storage.join(workdir, name), sentences, predicted)
        storage.write_json(storage.join(workdir, "metrics.json"), metrics)
    return metrics


if __name__ == "__main__":
    job.cli(run, "ner", "NER recipe, e.g. ner (or ner:large, or a config file path).")
