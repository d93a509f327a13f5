"""Dynamic padding in fine-tuning (`batching.Padding`): bucket lengths by hand, fixed mode = the batches
of before, bucketed logits = full-length logits per example, predictions in the arrays' order, one
compiled program per bucket, training curves unchanged by the cut (dropout off)."""

import dataclasses
import itertools

import jax
import ml_collections
import numpy as np
import pytest

from bert_jax.tasks import batching
from bert_jax.model import heads, modeling
from bert_jax.checkpoints import sources
from bert_jax.training import losses, sharding
from bert_jax.tasks import finetune, prediction
from bert_jax.configs import glue as glue_config
from bert_jax.configs import ner as ner_config
from bert_jax.configs import pretrain
from bert_jax.configs import swag as swag_config

L = 64
BUCKETS = (16, 32, 48, 64)


def _arrays(n, seed=0, length=L, lo=3, hi=L, choices=None, skew=False):
    """Random inputs with prefix masks of lengths in [lo, hi] (uniform, or with skew lo + geometric of
    mean 10, capped at hi: mostly short, as sentences), [N] labels and [N, L] token labels/weights."""
    rng = np.random.default_rng(seed)
    shape = (n, length) if choices is None else (n, choices, length)
    if skew:
        lengths = np.minimum(hi, lo + rng.geometric(0.1, size=shape[:-1]))
    else:
        lengths = rng.integers(lo, hi + 1, size=shape[:-1])
    mask = (np.arange(length) < lengths[..., None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(5, 1000, size=shape), 0).astype(np.int32)
    types = (mask * (np.arange(length) >= lengths[..., None] // 2)).astype(np.int32)
    out = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
           "labels": rng.integers(0, 2, size=n).astype(np.int32)}
    if choices is None:
        out["token_labels"] = (rng.integers(0, 3, size=shape) * mask).astype(np.int32)
        out["label_weights"] = mask.astype(np.float32)
    return out


def _config():
    config = pretrain.model_config("tiny")
    config.update(dict(vocab_size=1000, max_position_embeddings=L, hidden_size=64, num_hidden_layers=1,
                       intermediate_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    return modeling.BertConfig.from_dict(config)


def _todays_batches(arrays, global_batch_size, seed, drop_remainder):
    """The batching of fit / predict before dynamic padding, written out (one process)."""
    n = len(arrays["input_ids"])
    order = np.arange(n) if seed is None else np.random.default_rng(seed).permutation(n)
    for start in range(0, n, global_batch_size):
        rows = order[start:start + global_batch_size]
        real = len(rows)
        if real < global_batch_size:
            if drop_remainder:
                return
            rows = np.concatenate([rows, np.full(global_batch_size - real, rows[0])])
        yield {k: v[rows] for k, v in arrays.items()}, real


def test_bucket_lengths_hand_computed():
    assert batching.bucket_lengths(128, 16) == (16, 32, 48, 64, 80, 96, 112, 128)
    assert batching.bucket_lengths(100, 32) == (32, 64, 96, 100)
    assert batching.bucket_lengths(128, 128) == (128,) == batching.bucket_lengths(128, 200)
    assert batching.bucket_lengths(128, 0) == ()
    with pytest.raises(ValueError, match="need length_buckets >= 0"):
        batching.bucket_lengths(128, -16)
    mask = np.array([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(batching.sequence_lengths(mask), [2, 1, 0, 3, 5])
    # [N, 2, L] (multiple choice): the longest choice
    np.testing.assert_array_equal(batching.sequence_lengths(mask[[0, 1, 2, 3]].reshape(2, 2, 5)), [2, 3])
    buckets = batching.bucket_lengths(128, 16)
    np.testing.assert_array_equal(batching.bucket_of(np.array([0, 1, 15, 16, 17, 33, 112, 113, 128]), buckets),
                                  [16, 16, 16, 16, 32, 48, 112, 128, 128])
    with pytest.raises(ValueError, match="129 tokens is longer than the largest length bucket 128"):
        batching.bucket_of(np.array([5, 129]), buckets)


def test_configs_and_the_off_switch():
    """GLUE, NER and SWAG pad dynamically by default; length_buckets=0 is fixed padding whatever
    group_by_length says; SQuAD's config has no such fields: fixed."""
    for config, program_tokens in ((glue_config.get_config("sst2"), 10_000), (ner_config.get_config(), 10_000),
                                   (swag_config.get_config(), 2_500)):  # SWAG: example positions of 4 tokens
        assert batching.Padding.from_config(config) == batching.Padding(tuple(range(1, 129)), True, max_buckets=12,
                                                                        program_tokens=program_tokens)
        config.length_buckets = 0
        assert batching.Padding.from_config(config) == batching.FIXED == batching.Padding()
    from bert_jax.configs import squad as squad_config
    assert batching.Padding.from_config(squad_config.get_config()) == batching.FIXED


def test_placed_buckets_are_the_best_subset():
    """placed_buckets against every subset of the candidates (brute force), on random batch lengths: the
    fewest padded tokens plus program_tokens per length chosen."""
    rng = np.random.default_rng(0)
    candidates = (3, 5, 8, 10, 13, 16)
    for trial in range(20):
        lengths = rng.integers(1, 17, size=rng.integers(1, 30))
        rows = rng.integers(1, 9, size=len(lengths))
        for count, program_tokens in itertools.product((1, 2, 3, 6), (0, 7.5, 40)):
            chosen = batching.placed_buckets(lengths, rows, candidates, count, program_tokens)
            cost = lambda b: int((rows * np.asarray(b)[np.searchsorted(b, lengths)]).sum()) + program_tokens * len(b)
            best = min(cost(s) for n in range(1, count + 1) for s in itertools.combinations(candidates, n)
                       if s[-1] >= lengths.max())
            assert len(chosen) <= count and set(chosen) <= set(candidates), (trial, count, program_tokens)
            assert cost(chosen) == pytest.approx(best), (trial, count, program_tokens)
            assert chosen[-1] == min(c for c in candidates if c >= lengths.max())
    assert batching.placed_buckets(np.array([4, 4, 9]), 2, candidates, 2) == (5, 10)  # 2 * (5 + 5 + 10)
    # (5, 10) saves 2 * (10 + 10 + 10) - 40 = 20 tokens over (10,): worth it at 19 per program, not at 21
    assert batching.placed_buckets(np.array([4, 4, 9]), 2, candidates, 2, program_tokens=19) == (5, 10)
    assert batching.placed_buckets(np.array([4, 4, 9]), 2, candidates, 2, program_tokens=21) == (10,)
    with pytest.raises(ValueError, match="max_length_buckets=0: need >= 1"):
        batching.placed_buckets(np.array([4]), 1, candidates, 0)
    with pytest.raises(ValueError, match="bucket_program_tokens=-1: need >= 0"):
        batching.placed_buckets(np.array([4]), 1, candidates, 2, program_tokens=-1)


def test_placed_padding_covers_the_steps_fit_draws():
    """Padding.placed chooses at most max_buckets lengths over the batches of the steps fit runs (two
    epochs here), and those batches then use only those lengths."""
    arrays = _arrays(203, lo=1, hi=L)
    padding = batching.Padding(tuple(range(1, L + 1)), group_by_length=True, group_size=4, max_buckets=3)
    placed = padding.placed(arrays, 8, seed=1, num_steps=40)
    assert len(placed.buckets) == 3 and placed.max_buckets == 3
    used = {b["input_ids"].shape[1] for epoch in (0, 1)
            for b, _, _ in batching.local_batches(arrays, 8, seed=1 + epoch, drop_remainder=True, padding=placed)}
    assert used <= set(placed.buckets) and max(used) == max(placed.buckets)
    assert batching.Padding(BUCKETS).placed(arrays, 8, seed=1, num_steps=40) == batching.Padding(BUCKETS)
    # no training step: placed on the prediction batches (longest first), the longest one's length on top
    for_predict = padding.placed(arrays, 8, seed=1, num_steps=0)
    assert len(for_predict.buckets) == 3 and for_predict.buckets[-1] == batching.sequence_lengths(
        arrays["attention_mask"]).max()
    # a compile cost per program: a short run places fewer buckets (from the config, as the jobs do)
    config = ml_collections.ConfigDict(dict(max_seq_length=L, length_buckets=1, max_length_buckets=3,
                                            group_by_length=True, bucket_program_tokens=1e6))
    costly = batching.Padding.from_config(config)
    assert costly.program_tokens == 1e6 and len(costly.placed(arrays, 8, seed=1, num_steps=40).buckets) == 1
    config.bucket_program_tokens = -5
    with pytest.raises(ValueError, match="bucket_program_tokens=-5.0: need >= 0"):
        batching.Padding.from_config(config)


@pytest.mark.parametrize("seed,drop_remainder", [(3, True), (None, False)])
def test_fixed_padding_gives_todays_batches(seed, drop_remainder):
    arrays = _arrays(45)
    ours = list(batching.local_batches(arrays, 8, seed=seed, drop_remainder=drop_remainder, padding=batching.FIXED))
    theirs = list(_todays_batches(arrays, 8, seed, drop_remainder))
    assert len(ours) == len(theirs) == (5 if drop_remainder else 6)
    for (batch, real, rows), (expected, expected_real) in zip(ours, theirs):
        assert real == expected_real == len(rows) and list(batch) == list(expected)
        for k in batch:
            assert batch[k].dtype == expected[k].dtype
            np.testing.assert_array_equal(batch[k], expected[k], err_msg=k)
            np.testing.assert_array_equal(batch[k][:real], arrays[k][rows], err_msg=k)


@pytest.mark.parametrize("group", [False, True])
def test_bucketed_batches_cut_only_padding(group):
    """Each batch is cut to its bucket along the sequence axis ([N, L] arrays; [N] labels whole), the
    cut columns were padding, an epoch takes the fixed mode's rows (the same ones dropped), and
    grouping by length leaves less padding."""
    arrays = _arrays(203, lo=1, hi=L)
    padding = batching.Padding(BUCKETS, group_by_length=group, group_size=4)
    fixed = {int(r) for _, _, rows in batching.local_batches(arrays, 8, seed=1, drop_remainder=True) for r in rows}
    seen, padded = [], 0
    for batch, real, rows in batching.local_batches(arrays, 8, seed=1, drop_remainder=True, padding=padding):
        cut = batch["input_ids"].shape[1]
        longest = arrays["attention_mask"][rows].sum(1).max()
        assert cut == min(b for b in BUCKETS if b >= longest) and real == 8
        for k in ("input_ids", "token_type_ids", "attention_mask", "token_labels", "label_weights"):
            assert batch[k].shape == (8, cut) and batch[k].dtype == arrays[k].dtype
            np.testing.assert_array_equal(batch[k], arrays[k][rows, :cut], err_msg=k)
            assert not arrays[k][rows, cut:].any(), k
        np.testing.assert_array_equal(batch["labels"], arrays["labels"][rows])
        seen.extend(rows.tolist())
        padded += batch["attention_mask"].size - batch["attention_mask"].sum()
    assert len(seen) == len(set(seen)) == 200 and set(seen) == fixed
    ungrouped = sum(b["attention_mask"].size - b["attention_mask"].sum() for b, _, _ in batching.local_batches(
        arrays, 8, seed=1, drop_remainder=True, padding=batching.Padding(BUCKETS)))
    assert (padded < 0.6 * ungrouped) if group else padded == ungrouped


def _steps(model, loss_fn, mesh, config):
    init = sources.Initialisation("random", "", model.config)
    tx, schedule = finetune.create_optimizer(config, 8)
    state, shardings = finetune.create_state(model, tx, mesh, init, seed=0)
    return state, finetune.compile_steps(model, tx, schedule, mesh, shardings, loss_fn)


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh(2, 1, 1, jax.devices()[:2])


def test_bucketed_predictions_equal_full_length_in_order(mesh):
    """Sequence and token classification: logits of the bucketed, longest-first prediction equal the
    fixed full-length ones per example (within 1e-5, float32), in the arrays' order; token logits
    beyond a batch's bucket are zeros; the predict step compiled one program per bucket used."""
    arrays = _arrays(37, seed=2, lo=2, hi=L)
    padding = batching.Padding(BUCKETS)
    config = glue_config.get_config("sst2")
    mask = arrays["attention_mask"] > 0
    for model in (heads.BertForSequenceClassification(_config(), num_labels=3),
                  heads.BertForTokenClassification(_config(), num_labels=5)):
        state, (_, predict_fn) = _steps(model, lambda o, b: (0.0, 1.0), mesh, config)
        fixed = prediction.predict(predict_fn, state.params, arrays, batch_size=8, mesh=mesh)
        assert predict_fn._cache_size() == 1
        ours = prediction.predict(predict_fn, state.params, arrays, batch_size=8, mesh=mesh, padding=padding)
        assert ours.logits.shape == fixed.logits.shape and ours.logits.dtype == np.float32
        used = {int(batching.bucket_of(batching.sequence_lengths(arrays["attention_mask"][rows]).max(), BUCKETS))
                for _, _, rows in batching.local_batches(arrays, 8, seed=None, drop_remainder=False, padding=padding)}
        assert used == set(BUCKETS) and predict_fn._cache_size() == len(BUCKETS)  # L=64 shared with the fixed run
        if ours.logits.ndim == 2:
            np.testing.assert_allclose(ours.logits, fixed.logits, atol=1e-5, rtol=1e-5)
        else:
            np.testing.assert_allclose(ours.logits[mask], fixed.logits[mask], atol=1e-5, rtol=1e-5)
            lengths = batching.sequence_lengths(arrays["attention_mask"])
            assert any(not ours.logits[i, batching.bucket_of(n, BUCKETS):].any() for i, n in enumerate(lengths))
        # the order is the arrays': a permuted input gives the permuted output
        perm = np.random.default_rng(0).permutation(37)
        shuffled = prediction.predict(predict_fn, state.params, {k: v[perm] for k, v in arrays.items()}, batch_size=8,
                                    mesh=mesh, padding=padding)
        np.testing.assert_array_equal(shuffled.logits, ours.logits[perm])


def test_multiple_choice_bucketed_predictions(mesh):
    """SWAG's [N, 4, L] inputs are cut on their last axis: choice logits equal the full-length ones."""
    arrays = _arrays(11, seed=4, lo=2, hi=30, choices=4)  # every batch cut to 32
    model = heads.BertForMultipleChoice(_config())
    state, (_, predict_fn) = _steps(model, lambda o, b: (0.0, 1.0), mesh, swag_config.get_config())
    fixed = prediction.predict(predict_fn, state.params, arrays, batch_size=4, mesh=mesh)
    ours = prediction.predict(predict_fn, state.params, arrays, batch_size=4, mesh=mesh, padding=batching.Padding((32,)))
    assert ours.logits.shape == (11, 4) and predict_fn._cache_size() == 2
    np.testing.assert_allclose(ours.logits, fixed.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_training_same_loss_and_one_program_per_bucket(mesh, monkeypatch):
    """NER-style token classification (labels and weights [N, L], cut with the inputs), dropout off:
    the bucketed batches train exactly as the fixed ones (same rows, same order: same losses within
    1e-5); with grouping on as well, the step compiled one program per bucket used, all before the first
    step (`_compile_ahead`), none on the way."""
    programs = []
    compile_ahead = finetune._compile_ahead
    monkeypatch.setattr(finetune, "_compile_ahead", lambda *a: programs.append(compile_ahead(*a)) or programs[-1])
    arrays = _arrays(96, seed=5, lo=2, hi=L, skew=True)
    model = heads.BertForTokenClassification(_config(), num_labels=3)
    config = ner_config.get_config()

    def loss_fn(out, batch):
        return losses.token_classification_loss(out.logits, batch["token_labels"], batch["label_weights"])

    curves = []
    for padding in (batching.FIXED, batching.Padding(BUCKETS)):
        state, (step_fn, _) = _steps(model, loss_fn, mesh, config)
        _, history = finetune.fit(state, step_fn, arrays, batch_size=16, num_train_steps=6, seed=0, mesh=mesh,
                                  log_every=1, padding=padding)
        curves.append([h["loss"] for h in history])
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-5)
    assert programs[0] == {} and step_fn._cache_size() == 0  # fixed: none ahead; bucketed: all ahead, none in the loop
    used = {b["input_ids"].shape[1] for b, _, _ in batching.local_batches(arrays, 16, seed=0, drop_remainder=True,
                                                                          padding=batching.Padding(BUCKETS))}
    assert {shape[1] for shape in programs[1]} == used and len(used) > 1
    state, (step_fn, _) = _steps(model, loss_fn, mesh, config)
    grouped = dataclasses.replace(batching.Padding(BUCKETS), group_by_length=True, group_size=2)
    finetune.fit(state, step_fn, arrays, batch_size=16, num_train_steps=6, seed=0, mesh=mesh, padding=grouped)
    used = {b["input_ids"].shape[1] for b, _, _ in
            batching.local_batches(arrays, 16, seed=0, drop_remainder=True, padding=grouped)}
    assert {shape[1] for shape in programs[2]} == used <= set(BUCKETS) and step_fn._cache_size() == 0
