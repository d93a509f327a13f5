"""SQuAD v1.1 / v2.0 fine-tuning and prediction (paper section 4.2 and 4.3).

  python -m bert_jax.tasks.squad --config squad \\
      --config.init_checkpoint=/path/to/pretrain_workdir --config.vocab_file=vocab.txt \\
      --config.train_file=train-v1.1.json --config.predict_file=dev-v1.1.json --workdir /tmp/squad

Prediction follows google-research/bert `run_squad.py` (`write_predictions`): per window the
n_best_size best start and end logits; candidate spans start at a context token whose window is its
best context, end at a context token not before the start, and are at most max_answer_length tokens;
the best spans over all windows of a question, by start + end logit, give the answer (text cut from
the original context through the token offsets) and nbest_predictions.json with softmax
probabilities. SQuAD v2.0: the null score is the smallest [CLS] start + end logit over the windows,
null_odds = null score - best span score, and the prediction is "" when null_odds exceeds the
threshold; with tune_null_threshold the threshold is the one of best dev F1 (official v2.0 script's
best_f1_thresh), then applied.

Writes to the workdir: predictions.json, nbest_predictions.json, null_odds.json (v2.0), metrics.json,
tensorboard/, and the fine-tuned state in checkpoints/.
"""

from __future__ import annotations

import collections
import sys
import time
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np

from bert_jax.training import losses, steps, summaries
from bert_jax.model import heads
from bert_jax import storage
from bert_jax.data import squad
from bert_jax.tasks import finetune, job, prediction, squad_eval



def _softmax(scores: np.ndarray) -> np.ndarray:
    if not len(scores):
        return scores
    e = np.exp(scores - scores.max())
    return e / e.sum()


def postprocess(examples: Sequence[squad.SquadExample], features: squad.SquadFeatures, start_logits: np.ndarray,
                end_logits: np.ndarray, *, n_best_size: int = 20, max_answer_length: int = 30,
                version_2_with_negative: bool = False,
                null_score_diff_threshold: float = 0.0) -> tuple[dict[str, str], dict[str, list], dict[str, float]]:
    """Logits of every feature -> (predictions, nbest, null_odds) keyed by qas_id (see module docstring).

    Args:
      examples, features: as passed to / returned by `squad.convert_examples_to_features` (eval mode).
      start_logits, end_logits: float [N, L], one row per feature.

    Returns:
      predictions: qas_id -> answer text ("" = no answer, v2.0 only).
      nbest: qas_id -> list of {"text", "probability", "start_logit", "end_logit"}, best first.
      null_odds: qas_id -> null score minus best span score (v2.0; empty for v1.1).

    Raises:
      ValueError: logits whose shape is not [N, L] of the features.
    """
    if start_logits.shape != features.input_ids.shape or end_logits.shape != features.input_ids.shape:
        raise ValueError(f"start/end logits of shape {start_logits.shape}/{end_logits.shape} do not match the "
                         f"features {features.input_ids.shape}")
    by_example: dict[int, list[int]] = collections.defaultdict(list)
    for f, e in enumerate(features.example_index):
        by_example[int(e)].append(f)
    predictions, nbest_out, null_odds = {}, {}, {}
    lengths = np.arange(features.input_ids.shape[1])
    for ex_index, ex in enumerate(examples):
        candidates = []  # (score, start_logit, end_logit, char_start, char_end)
        null = None  # (score, start_logit, end_logit)
        for f in by_example.get(ex_index, []):
            s_log, e_log = start_logits[f], end_logits[f]
            offsets, max_context = features.token_offsets[f], features.max_context[f]
            if version_2_with_negative:
                score = float(s_log[0] + e_log[0])
                if null is None or score < null[0]:
                    null = (score, float(s_log[0]), float(e_log[0]))
            starts = np.argsort(-s_log, kind="stable")[:n_best_size]
            ends = np.argsort(-e_log, kind="stable")[:n_best_size]
            s, e = np.meshgrid(starts, ends, indexing="ij")
            valid = ((offsets[s, 0] >= 0) & (offsets[e, 0] >= 0) & max_context[s] & (e >= s)
                     & (lengths[e] - lengths[s] + 1 <= max_answer_length))
            for i, j in zip(*np.nonzero(valid)):
                si, ej = s[i, j], e[i, j]
                candidates.append((float(s_log[si] + e_log[ej]), float(s_log[si]), float(e_log[ej]),
                                   int(offsets[si, 0]), int(offsets[ej, 1])))
        if version_2_with_negative and null is not None:
            candidates.append((null[0], null[1], null[2], -1, -1))  # ranked with the spans, as the original
        candidates.sort(key=lambda c: -c[0])
        nbest, seen = [], set()
        for score, s_logit, e_logit, c0, c1 in candidates:
            if len(nbest) >= n_best_size:
                break
            text = ex.context_text[c0:c1] if c0 >= 0 else ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append((text, s_logit, e_logit))
        if version_2_with_negative and null is not None and "" not in seen:
            nbest.append(("", null[1], null[2]))
            if len(nbest) == 1:  # only the null answer: add a nonce span, as the original
                nbest.insert(0, ("empty", 0.0, 0.0))
        if not nbest:
            nbest.append(("empty", 0.0, 0.0))
        probs = _softmax(np.asarray([s + e for _, s, e in nbest], np.float64))
        nbest_out[ex.qas_id] = [{"text": t, "probability": float(p), "start_logit": s, "end_logit": e}
                                for (t, s, e), p in zip(nbest, probs)]
        best_span = next((n for n in nbest if n[0]), nbest[0])
        if version_2_with_negative and null is not None:
            diff = null[0] - best_span[1] - best_span[2]
            null_odds[ex.qas_id] = diff
            predictions[ex.qas_id] = "" if diff > null_score_diff_threshold else best_span[0]
        else:
            predictions[ex.qas_id] = nbest[0][0]
    return predictions, nbest_out, null_odds


def apply_null_threshold(predictions: Mapping[str, str], nbest: Mapping[str, list], null_odds: Mapping[str, float],
                         threshold: float) -> dict[str, str]:
    """v2.0 predictions for another threshold: "" where null_odds > threshold, else the best non-empty span."""
    out = {}
    for qid in predictions:
        best = next((n["text"] for n in nbest[qid] if n["text"]), "")
        out[qid] = "" if null_odds[qid] > threshold else best
    return out


def _read(path: str, *, is_training: bool, what: str, limit: int = 0) -> list[squad.SquadExample]:
    stats = squad.ReadStats()
    examples = squad.read_squad_examples(path, is_training=is_training, stats=stats)
    if stats.total():
        print(f"{what}: skipped {stats.total()} questions ({stats})", file=sys.stderr)
    if limit:
        examples = examples[:limit]
    if not examples:
        raise ValueError(f"{what} {path!r} holds no usable question")
    return examples


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Fine-tunes on config.train_file (when given) and predicts / evaluates config.predict_file (when given).

    Returns:
      metrics: train_seconds, train_features, train_steps, final train loss, and for prediction the
      official metrics (v1.1: exact_match, f1; v2.0: exact, f1 and HasAns/NoAns at
      config.null_score_diff_threshold, best_f1 / best_f1_thresh of the official sweep, and tuned_*
      after applying that threshold, which predictions.json then holds).

    Raises:
      ValueError / FileNotFoundError: bad config, files or checkpoint (one-line messages, before training).
    """
    if not config.train_file and not config.predict_file:
        raise ValueError("set config.train_file and/or config.predict_file")
    init, tokenizer = job.load_encoder(config)
    feature_args = dict(max_seq_length=config.max_seq_length, doc_stride=config.doc_stride,
                        max_query_length=config.max_query_length,
                        version_2_with_negative=config.version_2_with_negative)
    train_examples = _read(config.train_file, is_training=True, what="config.train_file",
                           limit=config.max_train_examples) if config.train_file else []
    eval_examples = _read(config.predict_file, is_training=False, what="config.predict_file",
                          limit=config.max_predict_examples) if config.predict_file else []
    unanswered = [ex.qas_id for ex in eval_examples if not ex.answers]
    if unanswered and not config.version_2_with_negative:
        raise ValueError(f"config.predict_file {config.predict_file!r}: {len(unanswered)} question(s) without an "
                         f"answer (first: id {unanswered[0]!r}); SQuAD v1.1 scoring needs one per question "
                         "(set config.version_2_with_negative=True for unanswerable questions)")
    mesh = steps.make_mesh(config.mesh)
    model = heads.BertForQuestionAnswering(init.config)
    storage.makedirs(workdir)
    is_main = jax.process_index() == 0
    writer = summaries.open_writer(workdir, is_main)
    metrics: dict[str, Any] = {"init": init.kind}

    train_features = squad.convert_examples_to_features(train_examples, tokenizer, is_training=True,
                                                        **feature_args) if train_examples else None
    num_train_steps = int(len(train_features) / config.train_batch_size * config.num_train_epochs) \
        if train_features is not None else 0
    tx, schedule = finetune.create_optimizer(config, num_train_steps)
    state, shardings = finetune.create_state(model, tx, mesh, init, config.seed)

    def loss_fn(out, batch):
        return losses.span_loss(out.start_logits, out.end_logits, batch["start_positions"], batch["end_positions"])

    step_fn, predict_fn = finetune.compile_steps(model, tx, schedule, mesh, shardings, loss_fn)
    if train_features is not None and num_train_steps > 0:
        start = time.perf_counter()
        state, history = finetune.fit(state, step_fn, train_features.model_inputs(),
                                      batch_size=config.train_batch_size, num_train_steps=num_train_steps,
                                      seed=config.seed, mesh=mesh, writer=writer, log_every=config.log_every,
                                      desc="SQuAD fine-tuning")
        metrics.update(train_seconds=time.perf_counter() - start, train_features=len(train_features),
                       train_steps=num_train_steps, train_loss=history[-1]["loss"])
    if eval_examples:
        features = squad.convert_examples_to_features(eval_examples, tokenizer, is_training=False, **feature_args)
        start = time.perf_counter()
        out = prediction.predict(predict_fn, state.params, features.model_inputs(),
                               batch_size=config.predict_batch_size, mesh=mesh, desc="SQuAD prediction")
        metrics["predict_seconds"] = time.perf_counter() - start
        predictions, nbest, null_odds = postprocess(
            eval_examples, features, out.start_logits, out.end_logits, n_best_size=config.n_best_size,
            max_answer_length=config.max_answer_length, version_2_with_negative=config.version_2_with_negative,
            null_score_diff_threshold=config.null_score_diff_threshold)
        if config.version_2_with_negative:
            metrics.update(squad_eval.evaluate_v2(eval_examples, predictions))  # at null_score_diff_threshold
            if config.tune_null_threshold:
                # The sweep needs every question's best span, the no-answer decision left to null_odds.
                spans = apply_null_threshold(predictions, nbest, null_odds, float("inf"))
                sweep = squad_eval.evaluate_v2(eval_examples, spans, null_odds)
                threshold = sweep["best_f1_thresh"]
                predictions = apply_null_threshold(predictions, nbest, null_odds, threshold)
                tuned = squad_eval.evaluate_v2(eval_examples, predictions)
                metrics.update({k: sweep[k] for k in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")})
                metrics.update({f"tuned_{k}": v for k, v in tuned.items()}, tuned_threshold=threshold)
        else:
            metrics.update(squad_eval.evaluate_v1(eval_examples, predictions))
        metrics["predict_examples"], metrics["predict_features"] = len(eval_examples), len(features)
        if is_main:
            storage.write_json(storage.join(workdir, "predictions.json"), predictions)
            storage.write_json(storage.join(workdir, "nbest_predictions.json"), nbest)
            if config.version_2_with_negative:
                storage.write_json(storage.join(workdir, "null_odds.json"), null_odds)
    scores = {k: v for k, v in metrics.items() if isinstance(v, float)} if eval_examples else {}
    job.finish(writer, workdir, state, config, init.config, tokenizer, scores, metrics, num_train_steps,
                    step=int(jax.device_get(state.step)))
    if is_main:
        storage.write_json(storage.join(workdir, "metrics.json"), metrics)
    return metrics


if __name__ == "__main__":
    job.cli(run, "squad", "SQuAD recipe, e.g. squad (or a config file path).")
