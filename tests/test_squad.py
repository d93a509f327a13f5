"""SQuAD: reading, windowed features, prediction, the official metrics (against independent
implementations), and fine-tuning from a bert_jax pre-training checkpoint."""

import json
import types

import numpy as np
import pytest

from bert_jax.data import squad, tokenization
from bert_jax.tasks import squad as squad_task
from bert_jax.tasks import squad_eval


@pytest.fixture(scope="module")
def tokenizer(data_dir):
    return tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))


@pytest.fixture(scope="module")
def dev_v1(data_dir):
    return squad.read_squad_examples(str(data_dir / "squad" / "dev-v1.1.json"), is_training=False)


@pytest.fixture(scope="module")
def dev_v2(squad_v2_dev):
    return squad.read_squad_examples(str(squad_v2_dev[0]), is_training=False)


def _noisy_predictions(examples, seed=0):
    """Real-looking predictions: gold answers, gold spans shifted or cut, other context spans and ""."""
    rng = np.random.default_rng(seed)
    preds = {}
    for ex in examples:
        words = ex.context_text.split()
        r = rng.random()
        if ex.answers and r < 0.4:
            preds[ex.qas_id] = ex.answers[int(rng.integers(len(ex.answers)))][0]
        elif ex.answers and r < 0.7:
            text, start = ex.answers[0]
            lo = max(0, start + int(rng.integers(-15, 10)))
            preds[ex.qas_id] = ex.context_text[lo:start + len(text) + int(rng.integers(-5, 15))]
        elif r < 0.9:
            i = int(rng.integers(len(words)))
            preds[ex.qas_id] = " ".join(words[i:i + int(rng.integers(1, 6))])
        else:
            preds[ex.qas_id] = ""
    return preds


def test_read_counts_skips_and_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON") as e:
        squad.read_squad_examples(str(bad), is_training=True)
    assert "\n" not in str(e.value) and "bad.json" in str(e.value)
    bad.write_text(json.dumps({"data": [{"title": "t"}]}))
    with pytest.raises(ValueError, match=r"data\[0\] has no 'paragraphs'"):
        squad.read_squad_examples(str(bad), is_training=True)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        squad.read_squad_examples(str(tmp_path / "missing.json"), is_training=True)
    doc = {"data": [{"title": "t", "paragraphs": [
        {"context": "The cat sat on the mat.", "qas": [
            {"id": "ok", "question": "Where?", "answers": [{"text": "the mat", "answer_start": 15}]},
            {"id": "moved", "question": "Where?", "answers": [{"text": "the mat", "answer_start": 3}]},
            {"id": "none", "question": "Who?", "answers": []}]},
        {"context": "   ", "qas": [{"id": "empty", "question": "What?", "answers": [{"text": "x", "answer_start": 0}]}]},
    ]}]}
    path = tmp_path / "train.json"
    path.write_text(json.dumps(doc))
    stats = squad.ReadStats()
    examples = squad.read_squad_examples(str(path), is_training=True, stats=stats)
    assert [e.qas_id for e in examples] == ["ok"]
    assert (stats.answer_mismatch, stats.no_answer, stats.empty_context) == (1, 1, 1)
    # For evaluation every question with a context is kept, answers as given.
    assert len(squad.read_squad_examples(str(path), is_training=False)) == 3


def test_doc_spans_and_max_context_as_the_original():
    # run_squad.py: windows advance by min(length, doc_stride) until one reaches the end.
    assert squad._doc_spans(300, 100, 128) == [(0, 100), (100, 100), (200, 100)]
    assert squad._doc_spans(300, 200, 128) == [(0, 200), (128, 172)]
    assert squad._doc_spans(50, 200, 128) == [(0, 50)]
    spans = [(0, 200), (128, 172)]
    # Token 150: window 0 has min(150, 49) + 2.0 = 51, window 1 has min(22, 149) + 1.72 = 23.72.
    assert squad._max_context(spans, 0, 150) and not squad._max_context(spans, 1, 150)
    # Token 180: window 0: min(180, 19) + 2 = 21; window 1: min(52, 119) + 1.72 = 53.72.
    assert squad._max_context(spans, 1, 180) and not squad._max_context(spans, 0, 180)


def test_training_features_hold_the_answers(data_dir, tokenizer):
    """Every training window's labels cut the answer out of the context (up to word-piece boundaries)."""
    examples = squad.read_squad_examples(str(data_dir / "squad" / "train-v1.1-subset-44articles.json"),
                                         is_training=True)
    assert len(examples) == 11877
    feats = squad.convert_examples_to_features(examples, tokenizer, is_training=True)
    assert len(feats) >= len(examples) and set(feats.example_index) == set(range(len(examples)))
    exact = 0
    for f in range(len(feats)):
        ex = examples[feats.example_index[f]]
        s, e = feats.start_positions[f], feats.end_positions[f]
        assert 0 < s <= e < feats.attention_mask[f].sum() - 1
        assert feats.token_type_ids[f, s] == 1 and feats.token_type_ids[f, e] == 1
        text = ex.context_text[feats.token_offsets[f, s, 0]:feats.token_offsets[f, e, 1]]
        assert ex.answers[0][0] in text  # the smallest covering span
        exact += squad_eval.normalize_answer(text) == squad_eval.normalize_answer(ex.answers[0][0])
    assert exact / len(feats) > 0.99, exact / len(feats)
    # Layout: [CLS] question [SEP] window [SEP] padding.
    ids = feats.input_ids[0]
    n = feats.attention_mask[0].sum()
    assert ids[0] == tokenizer.cls_id and ids[n - 1] == tokenizer.sep_id and (ids[n:] == tokenizer.pad_id).all()
    q = len(tokenizer.encode(examples[0].question_text))
    assert ids[q + 1] == tokenizer.sep_id and feats.token_type_ids[0, :q + 2].sum() == 0


def _gold_logits(features, examples):
    """Logits that put all mass on the first gold answer's tokens (or on [CLS] when not in the window)."""
    start = np.zeros(features.input_ids.shape, np.float32)
    end = np.zeros_like(start)
    start[:, 0] = end[:, 0] = 5.0
    for f in range(len(features)):
        ex = examples[features.example_index[f]]
        if not ex.answers:
            continue
        text, char_start = ex.answers[0]
        offsets = features.token_offsets[f]
        in_window = np.nonzero(offsets[:, 0] >= 0)[0]
        span = squad.answer_token_span([tuple(o) for o in offsets[in_window]], char_start, char_start + len(text))
        if span is None or offsets[in_window[span[0]], 0] > char_start or \
                offsets[in_window[span[1]], 1] < char_start + len(text):
            continue  # the answer is not (wholly) in this window
        start[f, in_window[span[0]]] = end[f, in_window[span[1]]] = 10.0
    return start, end


def test_gold_spans_round_trip_all_dev_questions(dev_v1, tokenizer):
    assert len(dev_v1) == 10570
    feats = squad.convert_examples_to_features(dev_v1, tokenizer, is_training=False)
    assert set(feats.example_index) == set(range(10570))  # every question featurises
    start, end = _gold_logits(feats, dev_v1)
    preds, nbest, _ = squad_task.postprocess(dev_v1, feats, start, end)
    scores = squad_eval.evaluate_v1(dev_v1, preds)
    assert scores["exact_match"] >= 99.0, scores
    first = dev_v1[0]
    assert nbest[first.qas_id][0]["text"] == preds[first.qas_id]
    assert abs(sum(n["probability"] for n in nbest[first.qas_id]) - 1) < 1e-6


def test_v1_metric_equals_torchmetrics(dev_v1):
    from torchmetrics.text import SQuAD

    preds = _noisy_predictions(dev_v1)
    ours = squad_eval.evaluate_v1(dev_v1, preds)
    metric = SQuAD()
    metric.update([{"prediction_text": preds[e.qas_id], "id": e.qas_id} for e in dev_v1],
                  [{"answers": {"text": [t for t, _ in e.answers], "answer_start": [s for _, s in e.answers]},
                    "id": e.qas_id} for e in dev_v1])
    theirs = {k: float(v) for k, v in metric.compute().items()}
    assert 20 < ours["f1"] < 80  # the predictions are a real mix of hits and misses
    # torchmetrics sums 10570 per-question scores in float32: agreement to its precision.
    assert ours["exact_match"] == pytest.approx(theirs["exact_match"], rel=2e-5)
    assert ours["f1"] == pytest.approx(theirs["f1"], rel=2e-5)


def test_metric_hand_computed():
    assert squad_eval.normalize_answer("The  Cat's, a HAT!") == "cats hat"
    # pred "cat sat mat" vs gold "the cat on the mat": common {cat, mat}; P = 2/3, R = 2/3.
    assert squad_eval.f1_score("cat sat mat", "the cat on the mat") == pytest.approx(2 / 3)
    assert squad_eval.f1_score("", "") == 0.0 and squad_eval.f1_score("", "", version_2=True) == 1.0
    ex = [squad.SquadExample("q1", "?", "c", (("Denver Broncos", 0), ("the Broncos", 0))),
          squad.SquadExample("q2", "?", "c", (("1990", 0),))]
    scores = squad_eval.evaluate_v1(ex, {"q1": "broncos", "q2": "in 1990"})
    # q1: EM 0; F1 max(2*1*0.5/1.5, 1.0) = 1 against "the Broncos" -> "broncos". q2: F1 2*0.5*1/1.5.
    assert scores["exact_match"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)


def test_v2_metric_equals_transformers(dev_v2, squad_v2_dev):
    from transformers.data.metrics import squad_metrics

    preds = _noisy_predictions(dev_v2, seed=1)
    rng = np.random.default_rng(2)
    na_probs = {e.qas_id: float(rng.normal()) for e in dev_v2}
    ours = squad_eval.evaluate_v2(dev_v2, preds, na_probs, na_prob_thresh=0.3)
    ref_examples = [types.SimpleNamespace(qas_id=e.qas_id, answers=[{"text": t} for t, _ in e.answers])
                    for e in dev_v2]
    theirs = squad_metrics.squad_evaluate(ref_examples, preds, na_probs, 0.3)
    assert sum(not e.answers for e in dev_v2) == squad_v2_dev[1]
    for key in ("exact", "f1", "total", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact",
                "best_f1", "best_f1_thresh", "best_exact_thresh"):
        assert ours[key] == pytest.approx(theirs[key], abs=1e-6), key


def test_v2_gold_round_trip_and_tuned_threshold(dev_v2, tokenizer):
    feats = squad.convert_examples_to_features(dev_v2, tokenizer, is_training=False, version_2_with_negative=True)
    start, end = _gold_logits(feats, dev_v2)
    # Blur the logits so that neither the spans nor the null decisions are all right.
    rng = np.random.default_rng(0)
    start, end = start + rng.normal(0, 3, start.shape), end + rng.normal(0, 3, end.shape)
    preds, nbest, null_odds = squad_task.postprocess(dev_v2, feats, start, end, version_2_with_negative=True)
    at_zero = squad_eval.evaluate_v2(dev_v2, preds)
    spans = squad_task.apply_null_threshold(preds, nbest, null_odds, float("inf"))
    sweep = squad_eval.evaluate_v2(dev_v2, spans, null_odds)
    tuned = squad_eval.evaluate_v2(dev_v2, squad_task.apply_null_threshold(preds, nbest, null_odds,
                                                                           sweep["best_f1_thresh"]))
    # Applying the tuned threshold scores at least the sweep's best: the official sweep counts an
    # answered no-answer question as wrong whenever its text is non-empty, even when it normalises
    # to "" (e.g. "the") and then scores 1.
    assert sweep["best_f1"] <= tuned["f1"] <= sweep["best_f1"] + 0.5
    assert tuned["f1"] >= at_zero["f1"]
    assert 30 < at_zero["f1"] < 99
    # Without noise the gold logits answer (almost) everything right, null questions included.
    start, end = _gold_logits(feats, dev_v2)
    preds, _, _ = squad_task.postprocess(dev_v2, feats, start, end, version_2_with_negative=True)
    assert squad_eval.evaluate_v2(dev_v2, preds)["exact"] >= 99.0
