"""The official SQuAD metrics: exact match and F1 (v1.1), plus v2.0's HasAns / NoAns split and best
no-answer thresholds.

Definitions (the official `evaluate-v1.1.py` and `evaluate-v2.0.py` of the SQuAD explorer site):
  - answers are normalised: lowercase, punctuation removed, the articles a / an / the removed, runs
    of whitespace collapsed;
  - EM is 1 when the normalised prediction equals a normalised gold answer; F1 is the bag-of-tokens
    F1 of the normalised strings; both take the max over the gold answers and are reported in percent,
    averaged over every question of the dataset (a question without a prediction scores 0);
  - v1.1: F1 is 0 when no token is shared (so two empty strings score 0);
  - v2.0: a question without gold answers has the single gold answer "" and scores 1 exactly when the
    prediction is empty; gold answers that normalise to "" are dropped; the no-answer probability of
    a question (here: the null score difference) above the threshold makes its prediction "";
    `best_f1_thresh` / `best_exact_thresh` is the threshold that maximises the score over the dev set.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Mapping, Sequence

from bert_jax.data.squad import SquadExample

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lowercase, drop punctuation and articles, collapse whitespace (the official normalisation)."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0 (`exact_match_score` of the official
    evaluate-v1.1.py, `compute_exact` of evaluate-v2.0.py); two empty strings score 1.0.

    Raises:
      AttributeError / TypeError: an argument that is not a str (from `normalize_answer`).
    """
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, *, version_2: bool = False) -> float:
    """Token F1 of the normalised strings; with version_2 an empty side scores (both empty)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version_2 and (not pred or not ref):
        return float(pred == ref)
    common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def _gold(example: SquadExample, version_2: bool) -> list[str]:
    answers = [text for text, _ in example.answers]
    if version_2:
        answers = [a for a in answers if normalize_answer(a)] or [""]
    return answers


def raw_scores(examples: Sequence[SquadExample], predictions: Mapping[str, str],
               version_2: bool) -> tuple[dict[str, float], dict[str, float]]:
    """Per-question (exact, f1) in [0, 1], max over gold answers; questions without a prediction are absent."""
    exact, f1 = {}, {}
    for ex in examples:
        if ex.qas_id not in predictions:
            continue
        pred = predictions[ex.qas_id]
        gold = _gold(ex, version_2)
        exact[ex.qas_id] = max(exact_match(pred, g) for g in gold)
        f1[ex.qas_id] = max(f1_score(pred, g, version_2=version_2) for g in gold)
    return exact, f1


def evaluate_v1(examples: Sequence[SquadExample], predictions: Mapping[str, str]) -> dict[str, float]:
    """The official v1.1 evaluation -> {"exact_match", "f1"} in percent over all `examples`."""
    exact, f1 = raw_scores(examples, predictions, version_2=False)
    n = max(len(examples), 1)
    return {"exact_match": 100.0 * sum(exact.values()) / n, "f1": 100.0 * sum(f1.values()) / n}


def _best_threshold(examples, predictions, scores, na_probs, num_no_ans: int) -> tuple[float, float]:
    """The official find_best_thresh: sweep the questions by no-answer probability -> (best %, threshold)."""
    current = best = float(num_no_ans)
    threshold = 0.0
    for ex in sorted(examples, key=lambda e: na_probs[e.qas_id]):
        qid = ex.qas_id
        if qid not in scores:
            continue
        if ex.answers:
            diff = scores[qid]
        elif predictions[qid]:
            diff = -1.0
        else:
            diff = 0.0
        current += diff
        if current > best:
            best, threshold = current, na_probs[qid]
    return 100.0 * best / max(len(scores), 1), threshold


def evaluate_v2(examples: Sequence[SquadExample], predictions: Mapping[str, str],
                na_probs: Mapping[str, float] | None = None, na_prob_thresh: float = 1.0) -> dict[str, float]:
    """The official v2.0 evaluation.

    Args:
      examples: all dev questions (with `answers` empty for the unanswerable ones).
      predictions: qas_id -> answer text ("" = no answer).
      na_probs: qas_id -> no-answer score (null_odds.json); absent: 0 for every question.
      na_prob_thresh: questions with na_prob above it count as answered "".

    Returns:
      exact, f1, total, HasAns_exact/f1/total, NoAns_exact/f1/total (when present), and with na_probs:
      best_exact, best_exact_thresh, best_f1, best_f1_thresh. Scores in percent over the questions
      that have a prediction (as the official script, which reports the others as missing).
    """
    tune = na_probs is not None
    na_probs = na_probs if tune else {ex.qas_id: 0.0 for ex in examples}
    num_no_ans = sum(1 for ex in examples if not ex.answers)  # over the whole dataset, as the official sweep
    examples = [ex for ex in examples if ex.qas_id in predictions]  # the official script skips the others
    exact, f1 = raw_scores(examples, predictions, version_2=True)

    def thresholded(scores):
        out = {}
        for ex in examples:
            if ex.qas_id in scores:
                out[ex.qas_id] = float(not ex.answers) if na_probs[ex.qas_id] > na_prob_thresh else scores[ex.qas_id]
        return out

    exact_t, f1_t = thresholded(exact), thresholded(f1)

    def summary(subset, prefix=""):
        n = len(subset)
        return {f"{prefix}exact": 100.0 * sum(exact_t.get(e.qas_id, 0.0) for e in subset) / max(n, 1),
                f"{prefix}f1": 100.0 * sum(f1_t.get(e.qas_id, 0.0) for e in subset) / max(n, 1),
                f"{prefix}total": float(n)}

    out = summary(examples)
    has_ans = [e for e in examples if e.answers]
    no_ans = [e for e in examples if not e.answers]
    if has_ans:
        out.update(summary(has_ans, "HasAns_"))
    if no_ans:
        out.update(summary(no_ans, "NoAns_"))
    if tune:
        out["best_exact"], out["best_exact_thresh"] = _best_threshold(examples, predictions, exact, na_probs, num_no_ans)
        out["best_f1"], out["best_f1_thresh"] = _best_threshold(examples, predictions, f1, na_probs, num_no_ans)
    return out
