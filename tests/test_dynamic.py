"""Dynamic instances: drawn from tokenized documents while reading, with the original's procedure."""

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.data import corpus, tokenization
from bert_jax.data.pretraining import document_shards, dynamic, formats, loader, packing, procedure
from conftest import ROOT


@pytest.fixture(scope="module")
def gutenberg(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gutenberg") / "docs"
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.data.create_pretraining_data", "--tokenize_only",
         f"--input_file={data_dir / 'corpus' / 'gutenberg-sentences.txt'}", f"--output_dir={out}",
         f"--vocab_file={data_dir / 'vocab' / 'bert-base-uncased-vocab.txt'}", "--num_shards=3", "--num_workers=2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def _iterator(path, **kw):
    args = dict(global_batch_size=64, seed=0, process_index=0, process_count=1, max_seq_length=128,
                max_predictions_per_seq=20)
    args.update(kw)
    return loader.make_pretraining_iterator(str(path), **args)


@pytest.mark.integration
def test_tokenized_documents_metadata(gutenberg, data_dir):
    """The command's shards (3, tokenized by 2 processes) hold the corpus's documents in order, each sentence
    tokenized as the tokenizer does alone; the counts and the token histogram add up."""
    meta = json.loads((gutenberg / "metadata.json").read_text())
    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    assert meta["kind"] == "documents" and meta["vocab_sha256"] == tok.vocab_sha256
    assert meta["shards"] == document_shards.shard_names(3) and sum(meta["shard_documents"]) == meta["num_documents"]
    docs = list(corpus.read_sentence_documents([str(data_dir / "corpus" / "gutenberg-sentences.txt")],
                                               corpus.ReadStats()))
    store = document_shards.Documents(str(gutenberg))
    assert len(store) == len(docs) == meta["num_documents"]
    counts = np.zeros(tok.vocab_size, np.int64)
    for d in range(len(store)):
        tokens, starts = store[d]
        counts += np.bincount(tokens, minlength=tok.vocab_size)
        for s in (0, len(starts) - 2):  # first and last sentence of every document
            sentence = docs[d][s] if s == 0 else next(x for x in reversed(docs[d]) if tok.tokenize(x))
            assert list(tokens[starts[s]:starts[s + 1]]) == tok.convert_tokens_to_ids(tok.tokenize(sentence))
    np.testing.assert_array_equal(counts, store.token_counts())
    assert meta["num_tokens"] == counts.sum()


def test_documents_are_the_same_for_any_shard_or_worker_count(documents, data_dir, tmp_path, monkeypatch):
    """Tokenizing in one process into one shard gives the documents (and so the dynamic batches) of the
    session fixture's two shards; a truncated or corrupt shard, a missing one, or a document count that
    disagrees with metadata.json is a one-line error naming the shard."""
    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    one = tmp_path / "one"
    document_shards.tokenize_documents(corpus.read_sentence_documents(
        [str(data_dir / "corpus" / "bert_sample_text.txt")], corpus.ReadStats()), tok, str(one), num_shards=1)
    monkeypatch.setattr(dynamic, "DEFAULT_SHUFFLE_WINDOW", 256)  # a small corpus: a window of a few epochs
    a, b = document_shards.Documents(str(one)), document_shards.Documents(str(documents))
    assert len(a) == len(b) > 2
    for d in range(len(a)):
        for x, y in zip(a[d], b[d], strict=True):
            np.testing.assert_array_equal(x, y)
    for x, y in zip(itertools.islice(_iterator(one, global_batch_size=8), 3),
                    itertools.islice(_iterator(documents, global_batch_size=8), 3)):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)
    meta = json.loads((one / "metadata.json").read_text())
    shard = one / meta["shards"][0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"documents-00000-of-00001.array_record: not a readable ArrayRecord file"):
        formats.check(str(one), meta)
    with pytest.raises(ValueError, match=r"documents-00000-of-00001.array_record: not a readable ArrayRecord file"):
        _iterator(one, packing=True)
    shard.write_bytes(data)
    with pytest.raises(ValueError, match=r"holds \d+ documents, metadata.json records 1000"):
        formats.check(str(one), dict(meta, shard_documents=[1000]))
    shard.unlink()
    with pytest.raises(FileNotFoundError, match="shard listed in metadata.json is missing"):
        formats.check(str(one), meta)
    with pytest.raises(ValueError, match="format_version 1"):
        formats.check(str(one), dict(meta, format_version=1))
    with pytest.raises(ValueError, match="holds tokenized documents, not static instances"):
        formats.open_shards(str(one), meta)
    with pytest.raises(ValueError, match="is malformed"):
        document_shards.decode_document(np.array([3, 1, 1], "<i4").tobytes())


@pytest.mark.integration
def test_dynamic_instances_statistics_in_the_originals_bands(gutenberg):
    """Gutenberg at 128 / 20, 6400 instances: 15% of candidates masked, 80/10/10, NotNext near half (the
    original's band over seeds: IsNext 47.3-48.0%, benchmarks/instance_statistics.py), exact layout."""
    it = _iterator(gutenberg)
    batches = [next(it) for _ in range(100)]
    b = {k: np.concatenate([x[k] for x in batches]) for k in batches[0]}
    n = b["attention_mask"].sum(1)
    w = b["masked_lm_weights"] > 0
    assert 0.145 < w.sum() / (n - 3).sum() < 0.16
    original = b["masked_lm_ids"][w]
    shown = np.take_along_axis(b["input_ids"], b["masked_lm_positions"], 1)[w]
    masked, same = np.mean(shown == 103), np.mean(shown == original)
    assert 0.78 < masked < 0.82 and 0.08 < same < 0.12 and 0.08 < 1 - masked - same < 0.12
    assert 0.49 < b["next_sentence_labels"].mean() < 0.56
    for row in range(len(n)):  # [CLS] A [SEP] B [SEP], types 0 through the first [SEP], then 1
        ids, types = b["input_ids"][row, :n[row]], b["token_type_ids"][row, :n[row]]
        seps = np.flatnonzero(ids == 102)
        assert ids[0] == 101 and len(seps) == 2 and seps[-1] == n[row] - 1
        assert (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:] == 1).all()
        assert (b["input_ids"][row, n[row]:] == 0).all()


def test_each_epoch_draws_afresh_and_a_resumed_stream_is_identical(documents, monkeypatch):
    """The same document in epochs 0 and 1 gives other instances (masks, pairs); the same (epoch,
    document) gives the same ones; a stream restored from get_state (packed too) continues identically."""
    monkeypatch.setattr(dynamic, "DEFAULT_SHUFFLE_WINDOW", 256)  # a small corpus: a window of a few epochs
    transform = dynamic._DrawInstances(str(documents), procedure.InstanceOptions(), seed=0, do_lower_case=True)
    assert transform.map((0, 1)) == transform.map((0, 1))
    assert transform.map((0, 1)) != transform.map((1, 1))
    for packing in (False, True):
        it = _iterator(documents, global_batch_size=8, packing=packing, num_packing_bins=8)
        for _ in range(5):
            next(it)
        state = it.get_state()
        want = [next(it) for _ in range(4)]
        resumed = _iterator(documents, global_batch_size=8, packing=packing, num_packing_bins=8)
        resumed.set_state(json.loads(json.dumps(state)))
        for w in want:
            got = next(resumed)
            for k in w:
                np.testing.assert_array_equal(got[k], w[k], err_msg=k)
    with pytest.raises(ValueError, match="iterator state has dynamic=False"):  # a static stream's state
        _iterator(documents, global_batch_size=8, packing=True, num_packing_bins=8).set_state(dict(state, dynamic=False))


@pytest.mark.parametrize("source", ["documents", "static"])
def test_grain_workers_give_the_same_batches_and_resume(source, documents, instances, monkeypatch):
    """Two grain worker processes drawing instances from documents, or decoding static ones, then packed,
    give the batches the training process gives alone and resume from their own state; another
    worker_count's state is a one-line error (grain's state holds the workers')."""
    monkeypatch.setattr(dynamic, "DEFAULT_SHUFFLE_WINDOW", 256)
    path = documents if source == "documents" else instances / "p2"
    kw = dict(global_batch_size=8, packing=True, num_packing_bins=8)
    want = list(itertools.islice(_iterator(path, **kw), 6))
    it = _iterator(path, worker_count=2, **kw)
    got = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(it.get_state()))
    it.close()
    resumed = _iterator(path, worker_count=2, **kw)
    resumed.set_state(state)
    got += [next(resumed) for _ in range(3)]
    resumed.close()
    for w, g in zip(want, got, strict=True):
        for k in w:
            np.testing.assert_array_equal(g[k], w[k], err_msg=k)
    with pytest.raises(ValueError, match="saved with worker_count=2, this iterator has worker_count=0"):
        _iterator(path, **kw).set_state(state)


def test_bad_document_inputs_are_one_line_errors(documents, data_dir, tmp_path):
    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    with pytest.raises(ValueError, match="no document with a non-empty sentence"):
        document_shards.tokenize_documents([[], ["", "  "]], tok, str(tmp_path / "empty"))
    meta = document_shards.tokenize_documents([[], ["One lonely sentence.", "And another."], ["", " \t"]], tok,
                                              str(tmp_path / "one"))
    assert meta["num_documents"] == 1 and meta["skipped"]["empty_documents"] == 2
    assert meta["skipped"]["empty_sentences"] == 2
    with pytest.raises(ValueError, match="1 document"):
        next(_iterator(tmp_path / "one"))
    with pytest.raises(ValueError, match="give max_seq_length and max_predictions_per_seq"):
        loader.make_pretraining_iterator(str(documents), global_batch_size=8, process_index=0, process_count=1)


def test_a_phase_and_the_evaluation_may_read_documents(documents, instances, small_documents):
    """config.eval_data_dir may hold tokenized documents (instances drawn with each phase's length and masking,
    `bert_jax.training.evaluation`), of the training data's vocabulary: another one is a one-line error."""
    import jax

    from bert_jax.training import pretraining, sharding
    from bert_jax.configs import pretrain

    config = pretrain.get_config("tiny")
    config.phases[0].data_dir = str(documents)
    config.phases[1].data_dir = str(instances / "p2")
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    assert [p.data_dir for p in pretraining.validate(config, mesh)] == [str(documents), str(instances / "p2")]
    config.eval_data_dir = str(documents)
    pretraining.validate(config, mesh)
    config.eval_data_dir = str(small_documents)  # the small vocabulary's ids
    with pytest.raises(ValueError, match=r"^config.eval_data_dir='.*' was tokenized with another vocabulary .* than "
                                         r"config.phases\[0\].data_dir="):
        pretraining.validate(config, mesh)


# ----------------------------------------------------------------------------- held-out documents


@pytest.fixture(scope="module")
def articles(data_dir, tmp_path_factory):
    """The first 20 WikiText-2 valid articles as tokenized documents (Google's vocabulary, 2 shards)."""
    out = tmp_path_factory.mktemp("articles") / "docs"
    docs = list(corpus.read_wikitext_documents([str(data_dir / "corpus" / "wikitext-2" / "valid.txt")],
                                               corpus.ReadStats()))[:20]
    document_shards.tokenize_documents(iter(docs), tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")),
                                       str(out), num_shards=2)
    return out


def test_holdout_split_is_fixed_disjoint_and_checked():
    from bert_jax.data.pretraining import holdout

    train_docs, held = holdout.split(1000, 0.05)
    assert len(held) == 50 and len(train_docs) == 950 and not set(train_docs) & set(held)
    assert sorted(set(train_docs) | set(held)) == list(range(1000))
    assert held.min() < 100 and held.max() > 900  # spread over the corpus, not its end
    again = holdout.split(1000, 0.05)
    np.testing.assert_array_equal(again[1], held)
    assert len(set(holdout.split(1100, 0.05)[1]) & set(held)) >= 40  # appending 10% keeps most
    for count, share, message in ((20, 0.0, r"eval_fraction=0.0 must be in \(0, 1\)"),
                                  (20, 1.0, r"eval_fraction=1.0 must be in \(0, 1\)"),
                                  (20, 0.05, "holds out 1 of 20 documents; evaluation needs at least 2"),
                                  (20, 0.95, "holds out 19 of 20 documents, leaving 1 for training; it needs at least 2")):
        with pytest.raises(ValueError, match=message):
            holdout.split(count, share)


def test_training_never_reads_held_out_documents(articles, instances, monkeypatch):
    """With a documents subset (`holdout.split`'s training side), a whole epoch, unpacked and packed with filled
    rows, reads exactly the training documents (instances, NotNext segments and fillers), never a held-out one;
    the evaluation's draw reads held-out documents only. A state of one subset does not resume another."""
    from bert_jax.training import evaluation, pretraining
    from bert_jax.configs import pretrain
    from bert_jax.data.pretraining import holdout

    train_docs, held = holdout.split(20, 0.2)
    read = []
    # reads of the Documents this test's iterators open (not of an earlier test's iterator still prefetching)
    mine = set()
    original_init, original = document_shards.Documents.__init__, document_shards.Documents.__getitem__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        mine.add(id(self))

    def getitem(self, d):
        if id(self) in mine:
            read.append(d)
        return original(self, d)

    monkeypatch.setattr(document_shards.Documents, "__init__", init)
    monkeypatch.setattr(document_shards.Documents, "__getitem__", getitem)
    batches = list(_iterator(articles, global_batch_size=16, num_epochs=1, documents=train_docs))
    assert len(batches) > 10 and set(read) == set(train_docs.tolist())
    read.clear()
    packed = _iterator(articles, global_batch_size=16, packing=True, documents=train_docs)
    for _ in range(5):
        next(packed)
    assert read and not set(read) & set(held.tolist())
    state = packed.get_state()
    with pytest.raises(ValueError, match=r"iterator state read 16 documents, crc32 \w+, this iterator reads 16 "
                                         r"documents, crc32 \w+: resume with the same documents"):
        _iterator(articles, global_batch_size=16, packing=True, documents=np.arange(16)).set_state(state)
    with pytest.raises(ValueError, match=r"iterator state read 16 documents, crc32 \w+, this iterator reads all "
                                         r"documents"):
        _iterator(articles, global_batch_size=16, packing=True).set_state(state)
    packed.close()
    read.clear()
    config = pretrain.get_config("tiny")
    config.phases = [pretrain.phase(64, 10, 1.0, str(articles), 16)]
    config.eval_fraction, config.eval_batches = 0.2, 4
    evaluation.draw(config, pretraining.resolve_phases(config)[0])
    assert read and set(read) <= set(held.tolist())
    with pytest.raises(ValueError, match="holds static instances: documents= applies to tokenized documents"):
        _iterator(instances / "p1", max_seq_length=None, max_predictions_per_seq=None, documents=train_docs)


def test_held_out_instances_are_fixed_and_drawn_with_the_phase_masking(articles, instances, data_dir):
    """evaluation.draw: the same batches at every call (seed EVAL_SEED, epoch 0, whatever config.seed), kept per
    phase by HeldOut; drawn with the phase's masking: masked_lm_prob of the tokens predicted, and whole words
    masked together with do_whole_word_mask."""
    from bert_jax.training import evaluation, pretraining
    from bert_jax.configs import pretrain

    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    config = pretrain.get_config("tiny")
    config.phases = [pretrain.phase(64, 20, 0.5, str(articles), 16, masked_lm_prob=0.3, do_whole_word_mask=True),
                     pretrain.phase(64, 20, 0.5, str(articles), 16)]
    config.eval_fraction, config.eval_batches = 0.2, 6
    whole, plain = pretraining.resolve_phases(config)
    first = evaluation.draw(config, whole)
    config.seed = 7
    for a, b in zip(first, evaluation.draw(config, whole), strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    held_out = evaluation.HeldOut(config)
    assert held_out.batches(whole) is held_out.batches(whole) and len(held_out.batches(whole)) == 6
    config.eval_fraction, config.eval_data_dir = 0.0, str(articles)  # a directory of documents: all of them
    assert [b["input_ids"].shape for b in evaluation.HeldOut(config).batches(plain)] == [(16, 64)] * 6
    config.eval_data_dir = str(instances / "p1")  # static instances: read afresh by train._evaluate
    assert evaluation.HeldOut(config).batches(plain) is None
    config.eval_fraction, config.eval_data_dir = 0.2, ""

    def rate(batches):
        predicted = sum(b["masked_lm_weights"].sum() for b in batches)
        tokens = sum(b["attention_mask"].sum() - 3 * len(b["attention_mask"]) for b in batches)
        return predicted / tokens

    plain_batches = evaluation.draw(config, plain)
    assert 0.27 < rate(first) < 0.33 and 0.13 < rate(plain_batches) < 0.17

    def continuations(batches):
        """(masked "##" pieces, those whose previous piece is unmasked although it is not [CLS] / [SEP]: a
        truncated segment may start inside a word)."""
        count = alone = 0
        for b in batches:
            for ids, positions, labels, weights in zip(b["input_ids"], b["masked_lm_positions"], b["masked_lm_ids"],
                                                       b["masked_lm_weights"]):
                masked = {int(p) for p, w in zip(positions, weights) if w}
                for p, label, w in zip(positions, labels, weights):
                    if w and tok.convert_ids_to_tokens([int(label)])[0].startswith("##"):
                        count += 1
                        alone += int(p) - 1 not in masked and int(ids[int(p) - 1]) not in (tok.cls_id, tok.sep_id)
        return count, alone

    (whole_count, whole_alone), (_, plain_alone) = continuations(first), continuations(plain_batches)
    assert whole_count > 10 and whole_alone == 0 and plain_alone > 0


def test_log_prior_of_documents_is_the_tokens_unigram(documents):
    """`config.mlm_bias_init="log_prior"` on tokenized documents: the centred, add-one smoothed log unigram
    distribution of every token of the documents, computed here by hand from the decoded documents."""
    store = document_shards.Documents(str(documents))
    tokens = np.concatenate([store[d][0] for d in range(len(store))])
    counts = np.bincount(tokens, minlength=30522).astype(np.float64) + 1.0
    want = np.log(counts / counts.sum())
    np.testing.assert_allclose(procedure.masked_token_log_prior(str(documents), 30522), want - want.mean(),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="token id"):
        procedure.masked_token_log_prior(str(documents), 100)


def test_log_prior_with_held_out_documents_counts_the_training_documents_only(articles):
    """mlm_bias_init="log_prior" with config.eval_fraction: the unigram of the training documents' tokens."""
    from bert_jax.training import pretraining
    from bert_jax.configs import pretrain
    from bert_jax.data.pretraining import holdout

    store = document_shards.Documents(str(articles))
    config = pretrain.get_config("tiny")
    config.phases[0].data_dir, config.mlm_bias_init, config.eval_fraction = str(articles), "log_prior", 0.2
    train_docs, _ = holdout.split(len(store), 0.2)
    counts = sum(np.bincount(store[int(d)][0], minlength=config.model.vocab_size) for d in train_docs).astype(np.float64)
    want = np.log((counts + 1) / (counts + 1).sum())
    np.testing.assert_allclose(pretraining.initial_mlm_bias(config), want - want.mean(), rtol=1e-5, atol=1e-5)


def test_filled_rows_keep_their_instances_and_add_valid_ones(documents, monkeypatch):
    """dynamic.FillRows on packed rows of the sample text: the packer's instances are untouched, each
    filler is a well-formed instance ([CLS] A [SEP] B [SEP], types, masked positions inside it) at most
    the room left, placed only where MIN_FILL tokens were free, padding falls, and the same row is filled the same way."""
    monkeypatch.setattr(dynamic, "DEFAULT_SHUFFLE_WINDOW", 256)
    kw = dict(global_batch_size=16, packing=True, num_packing_bins=16, seed=5)
    plain = list(itertools.islice(_iterator(documents, fill_rows=False, **kw), 4))
    filled = list(itertools.islice(_iterator(documents, **kw), 4))
    again = next(_iterator(documents, **kw))
    for k in again:
        np.testing.assert_array_equal(again[k], filled[0][k], err_msg=k)
    fillers = 0
    for p, f in zip(plain, filled):
        for r in range(len(p["input_ids"])):
            n, k = int(p["attention_mask"][r].sum()), int(p["next_sentence_weights"][r].sum())
            for name in ("input_ids", "token_type_ids", "segment_ids", "position_ids"):
                np.testing.assert_array_equal(f[name][r, :n], p[name][r, :n], err_msg=name)
            np.testing.assert_array_equal(f["next_sentence_labels"][r, :k], p["next_sentence_labels"][r, :k])
            for s in range(k + 1, int(f["segment_ids"][r].max()) + 1):  # the fillers
                fillers += 1
                at = np.flatnonzero(f["segment_ids"][r] == s)
                ids, types = f["input_ids"][r, at], f["token_type_ids"][r, at]
                assert 5 <= len(at) <= 128 - at[0] and at[0] >= n and 128 - at[0] >= dynamic.FillRows.MIN_FILL
                seps = np.flatnonzero(ids == 102)
                assert ids[0] == 101 and len(seps) == 2 and seps[-1] == len(ids) - 1
                assert (types[: seps[0] + 1] == 0).all() and (types[seps[0] + 1 :] == 1).all()
                assert f["next_sentence_positions"][r, s - 1] == at[0]
                mine = f["masked_lm_weights"][r] > 0
                inside = (f["masked_lm_positions"][r] >= at[0]) & (f["masked_lm_positions"][r] <= at[-1])
                assert (inside & mine).sum() >= 1
        assert packing.padding_fraction(f) <= packing.padding_fraction(p)
    assert fillers > 0
    assert sum(map(packing.padding_fraction, filled)) < sum(map(packing.padding_fraction, plain))


def test_default_shuffle_window_is_at_most_one_epoch_per_process():
    """The window holds about one epoch's instances of a process (tokens over max_seq_length - 3, over the
    process count), at most DEFAULT_SHUFFLE_WINDOW; without a token count, DEFAULT_SHUFFLE_WINDOW."""
    options = procedure.InstanceOptions(max_seq_length=64, max_predictions_per_seq=10)
    assert dynamic.default_shuffle_window({"num_tokens": 61_000}, options, 1) == 1000
    assert dynamic.default_shuffle_window({"num_tokens": 61_000}, options, 2) == 500
    assert dynamic.default_shuffle_window({"num_tokens": 30}, options, 1) == 1
    assert dynamic.default_shuffle_window({"num_tokens": 10**9}, options, 8) == dynamic.DEFAULT_SHUFFLE_WINDOW
    assert dynamic.default_shuffle_window({}, options, 1) == dynamic.DEFAULT_SHUFFLE_WINDOW


# ----------------------------------------------------------------------------- masking options: both paths

# Whole documents of 40 consecutive sentences of the shared Gutenberg corpus: 300 documents, ~294k tokens,
# ~3,000 instances at length 128 (one pass / epoch): a few seconds per path.
DOCUMENTS, SENTENCES = 300, 40
LENGTH = 128
# Masking options (the phase config fields and the original's flags). "cap": masked_lm_prob so high that
# max_predictions_per_seq binds; "whole_words": Google's later masking.
MASKINGS = {
    "defaults": dict(masked_lm_prob=0.15, max_predictions_per_seq=20, do_whole_word_mask=False, short_seq_prob=0.1),
    "whole_words": dict(masked_lm_prob=0.3, max_predictions_per_seq=40, do_whole_word_mask=True, short_seq_prob=0.5),
    "cap": dict(masked_lm_prob=0.3, max_predictions_per_seq=20, do_whole_word_mask=False, short_seq_prob=0.0),
}
Z = 4.0  # tolerances: 4 binomial standard errors


def _gutenberg_documents(data_dir):
    documents, sentences = [], []
    with open(data_dir / "corpus" / "gutenberg-sentences.txt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                sentences.append(line.strip())
            if len(sentences) == SENTENCES:
                documents.append(sentences)
                sentences = []
                if len(documents) == DOCUMENTS:
                    return documents
    raise AssertionError("the corpus is shorter than the test needs")


class _Drawn:
    """Instances of one masking on one path, as per-instance arrays (both paths decoded alike)."""

    def __init__(self, rows):
        self.rows = rows  # [(ids shown int32 [n], token_type_ids [n], masked positions [k], original ids [k])]

    @classmethod
    def unpacked(cls, x):
        n = x["attention_mask"].sum(1)
        k = (x["masked_lm_weights"] > 0).sum(1)
        return cls([(x["input_ids"][r, :n[r]], x["token_type_ids"][r, :n[r]], x["masked_lm_positions"][r, :k[r]],
                     x["masked_lm_ids"][r, :k[r]]) for r in range(len(n))])

    @classmethod
    def packed(cls, batches, plain_batches):
        """(the packer's instances, the fillers) of filled packed rows (instance s of a row: segment s), the
        packer's being those of the same rows packed without filling (`plain_batches`)."""
        own, fillers = [], []
        for b, plain in zip(batches, plain_batches, strict=True):
            for r in range(len(b["input_ids"])):
                real = b["masked_lm_weights"][r] > 0
                positions, labels = b["masked_lm_positions"][r][real], b["masked_lm_ids"][r][real]
                packed_here = int(plain["next_sentence_weights"][r].sum())
                for s in range(1, int(b["segment_ids"][r].max()) + 1):
                    at = np.flatnonzero(b["segment_ids"][r] == s)
                    mine = (positions >= at[0]) & (positions <= at[-1])
                    row = (b["input_ids"][r, at], b["token_type_ids"][r, at], positions[mine] - at[0], labels[mine])
                    (fillers if s > packed_here else own).append(row)
        return cls(own), cls(fillers)

    def lengths(self):
        return np.array([len(ids) for ids, _, _, _ in self.rows])

    def predictions(self):
        return np.array([len(p) for _, _, p, _ in self.rows])

    def shown_and_original(self):
        return (np.concatenate([ids[p] for ids, _, p, _ in self.rows]),
                np.concatenate([labels for _, _, _, labels in self.rows]))

    def words(self, is_continuation):
        """(multi-piece words, those partly masked) over all instances. Words as the original groups them: the
        tokens but [CLS] and the [SEP]s, in order, a "##" piece joining the group before it."""
        whole = partial = 0
        for ids, types, positions, labels in self.rows:
            original = ids.copy()
            original[positions] = labels
            sep = int(np.argmax(types == 1)) - 1
            candidates = [p for p in range(1, len(ids) - 1) if p != sep]
            masked = np.zeros(len(ids), bool)
            masked[positions] = True
            groups = []
            for p in candidates:
                if groups and is_continuation[original[p]]:
                    groups[-1].append(p)
                else:
                    groups.append([p])
            for g in groups:
                if len(g) > 1:
                    whole += 1
                    partial += 0 < masked[g].sum() < len(g)
        return whole, partial


@pytest.fixture(scope="module")
def masking_corpus(data_dir, tokenizer, tmp_path_factory):
    """(the documents, their tokenized-documents directory, a scratch directory) for the masking tests."""
    documents = _gutenberg_documents(data_dir)
    out = tmp_path_factory.mktemp("masking")
    document_shards.tokenize_documents(iter(documents), tokenizer, str(out / "docs"), num_shards=2)
    return documents, out / "docs", out


@pytest.fixture(scope="module")
def drawn(masking_corpus, tokenizer):
    """{masking name: (static instances, dynamic instances)}: create_pretraining_data with the options as flags
    (dupe_factor 1) and `loader.make_pretraining_iterator` on the tokenized documents with them (one epoch, in
    document order), the same documents."""
    documents, docs_dir, out = masking_corpus
    result = {}
    for name, masking in MASKINGS.items():
        procedure.create_pretraining_data(iter(documents), tokenizer, str(out / name), dupe_factor=1, num_shards=2,
                                            options=procedure.InstanceOptions(max_seq_length=LENGTH, **masking))
        static = _Drawn.unpacked(_stack(procedure.iterate_instances(str(out / name))))
        batches = list(_iterator(docs_dir, global_batch_size=50, shuffle=False, num_epochs=1, **masking))
        result[name] = static, _Drawn.unpacked({k: np.concatenate([b[k] for b in batches]) for k in batches[0]})
    return result


def _stack(rows):
    rows = list(rows)
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def _agree(a: float, na: int, b: float, nb: int, what: str) -> None:
    """Two binomial proportions (a of na trials, b of nb) equal within Z standard errors of their difference."""
    p = (a * na + b * nb) / (na + nb)
    se = np.sqrt(max(p * (1 - p), 1e-12) * (1 / na + 1 / nb))
    assert abs(a - b) <= Z * se, f"{what}: {a:.4f} of {na} vs {b:.4f} of {nb} (tolerance {Z * se:.4f})"


@pytest.mark.parametrize("name", list(MASKINGS))
def test_both_paths_mask_with_the_options_statistics(name, drawn):
    """Static instances (the options as create_pretraining_data flags) and instances drawn from tokenized
    documents (the same options through make_pretraining_iterator) of the same 300 documents. Each instance of n
    tokens masks the original's count, min(max_predictions_per_seq, max(1, round(n * masked_lm_prob))) (whole
    words: at most that, a word that does not fit is skipped), so the masked share of the tokens is
    masked_lm_prob within half a token per instance plus Z binomial errors (below it where the cap binds), the
    same on both paths (Z errors); the [MASK] / random / kept split is 80 / 10 / 10 (Z binomial errors, on each
    path and between them)."""
    masking = MASKINGS[name]
    p, cap = masking["masked_lm_prob"], masking["max_predictions_per_seq"]
    shares = []
    for path, x in zip(("static", "dynamic"), drawn[name], strict=True):
        n, k = x.lengths(), x.predictions()
        assert len(n) > 2000 and (n <= LENGTH).all(), (path, len(n))
        want = np.minimum(cap, np.maximum(1, np.round(n * p).astype(int)))  # the original's count per instance
        if masking["do_whole_word_mask"]:
            assert (k <= want).all(), path
        else:
            np.testing.assert_array_equal(k, np.minimum(want, n - 3), err_msg=path)
        share, tokens = k.sum() / n.sum(), n.sum()
        tolerance = 0.5 * len(n) / tokens + Z * np.sqrt(p * (1 - p) / tokens)
        if cap >= np.round(LENGTH * p):
            assert abs(share - p) <= tolerance, (path, share, p, tolerance)
        else:  # the cap binds on full-length instances
            assert share < p - tolerance and (k[n == LENGTH] == cap).all(), (path, share)
        shown, original = x.shown_and_original()
        split = {"mask": np.mean(shown == 103), "kept": np.mean(shown == original)}
        split["random"] = 1 - split["mask"] - split["kept"]
        for part, expected in (("mask", 0.8), ("kept", 0.1), ("random", 0.1)):
            assert abs(split[part] - expected) <= Z * np.sqrt(expected * (1 - expected) / len(shown)), (path, split)
        shares.append((share, tokens, split, len(shown)))
    (a, na, sa, ka), (b, nb, sb, kb) = shares
    _agree(a, na, b, nb, f"{name}: masked share of the tokens")
    for part in ("mask", "kept", "random"):
        _agree(sa[part], ka, sb[part], kb, f"{name}: {part} share of the predictions")


def test_whole_word_masking_masks_whole_words_on_both_paths(drawn, tokenizer):
    """With do_whole_word_mask no word (a token and the "##" pieces after it, as the original groups them) is
    ever partly masked, on either path, and words are masked as often on both (Z errors); without it, on the
    same documents, masked positions often split words (so the check can fail)."""
    is_continuation = np.array([t.startswith("##") for t in tokenizer.inv_vocab])
    counts = {}
    for name in ("whole_words", "defaults"):
        for path, x in zip(("static", "dynamic"), drawn[name], strict=True):
            counts[name, path] = x.words(is_continuation)
    for path in ("static", "dynamic"):
        words, partial = counts["whole_words", path]
        assert words > 5000 and partial == 0, (path, words, partial)
        words, partial = counts["defaults", path]
        assert partial > 0.05 * words, (path, words, partial)  # 15% of the pieces, drawn one by one
    shares = {}
    for path, x in zip(("static", "dynamic"), drawn["whole_words"], strict=True):
        _, original = x.shown_and_original()
        shares[path] = np.mean(is_continuation[original]), len(original)
    _agree(*shares["static"], *shares["dynamic"], "whole words: '##' pieces among the masked tokens")


def test_short_targets_follow_short_seq_prob_on_both_paths(drawn):
    """The share of instances shorter than max_seq_length (a short target, uniform in [2, max_seq_length - 3],
    or a document's end) is the same on both paths for each short_seq_prob (0, 0.1, 0.5; Z binomial errors);
    over the share at 0 (the documents' ends alone), the excess estimates short_seq_prob:
    s_hat = (f(s) - f(0)) / (1 - f(0)) lies in [0.6 s, s] (within Z errors): a short target near the maximum
    still gives a full instance when its last sentence carries the chunk over)."""
    short = {}
    for name in MASKINGS:
        for path, x in zip(("static", "dynamic"), drawn[name], strict=True):
            n = x.lengths()
            short[name, path] = np.mean(n < LENGTH), len(n)
        _agree(*short[name, "static"], *short[name, "dynamic"], f"{name}: share of short instances")
    for path in ("static", "dynamic"):
        f0, n0 = short["cap", path]  # short_seq_prob 0
        for name in ("defaults", "whole_words"):
            s = MASKINGS[name]["short_seq_prob"]
            f, nf = short[name, path]
            estimate = (f - f0) / (1 - f0)
            se = np.sqrt(f * (1 - f) / nf + f0 * (1 - f0) / n0) / (1 - f0)
            assert 0.6 * s - Z * se <= estimate <= s + Z * se, (path, name, s, estimate, se)


def test_filled_rows_draw_with_the_phases_masking(masking_corpus, tokenizer):
    """Packed rows of tokenized documents with their free room filled (`dynamic.FillRows`): the fillers too are
    drawn with the phase's masking: no word partly masked with do_whole_word_mask, masked_lm_prob's share."""
    _, docs_dir, _ = masking_corpus
    masking = MASKINGS["whole_words"]
    kw = dict(global_batch_size=32, packing=True, num_packing_bins=32, **masking)
    own, fillers = _Drawn.packed(list(itertools.islice(_iterator(docs_dir, **kw), 30)),
                                 list(itertools.islice(_iterator(docs_dir, fill_rows=False, **kw), 30)))
    is_continuation = np.array([t.startswith("##") for t in tokenizer.inv_vocab])
    for x in (own, fillers):
        words, partial = x.words(is_continuation)
        assert len(x.rows) > 40 and words > 40 and partial == 0, (len(x.rows), words, partial)
    n, k = fillers.lengths(), fillers.predictions()
    p = masking["masked_lm_prob"]
    share = k.sum() / n.sum()
    assert p - 0.5 * len(n) / n.sum() - Z * np.sqrt(p * (1 - p) / n.sum()) <= share <= p + 0.5 * len(n) / n.sum(), share


def test_train_phases_carry_the_masking(masking_corpus, instances, tokenizer):
    """`bert_jax.train`: a phase's masking fields (the original's defaults) reach the instances drawn from
    tokenized documents (whole words, train.iterator); static instances hold theirs fixed, so a phase field
    that differs from the data's metadata flag is a one-line error naming the field and both values, as is a
    field out of range; make_pretraining_iterator refuses the same, and a dynamic stream's state
    refuses to resume with other masking."""
    import jax

    from bert_jax.training import pretraining, sharding
    from bert_jax.configs import pretrain

    default = pretrain.phase(128, 20, 1.0, "", 8)
    assert (default.masked_lm_prob, default.do_whole_word_mask, default.short_seq_prob) == (0.15, False, 0.1)
    _, docs_dir, _ = masking_corpus

    def tiny(phase: int = 0, **fields):
        config = pretrain.get_config("tiny")
        config.phases[0].data_dir = str(docs_dir)
        config.phases[0].do_whole_word_mask = True
        config.phases[1].data_dir = str(instances / "p2")
        config.phases[phase].update(fields)
        return config

    config = tiny()
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    phases = pretraining.validate(config, mesh)
    assert phases[0].masking() == dict(masked_lm_prob=0.15, do_whole_word_mask=True, short_seq_prob=0.1)
    it = pretraining.iterator(phases[0], config, None)
    batches = [next(it) for _ in range(10)]
    it.close()
    is_continuation = np.array([t.startswith("##") for t in tokenizer.inv_vocab])
    words, partial = _Drawn.unpacked({k: np.concatenate([b[k] for b in batches]) for k in batches[0]}).words(
        is_continuation)
    assert words > 100 and partial == 0
    p2 = instances / "p2"
    for field, value, held in (("do_whole_word_mask", True, False), ("masked_lm_prob", 0.2, 0.15),
                               ("short_seq_prob", 0.0, 0.1)):
        message = (rf"config.phases\[1\].{field}={value} but {p2} holds static instances masked with {field}={held} "
                   rf"\(fixed when they were written\): set config.phases\[1\].{field}={held}")
        with pytest.raises(ValueError, match=message) as raised:
            pretraining.validate(tiny(1, **{field: value}), mesh)
        assert "\n" not in str(raised.value)
        with pytest.raises(ValueError, match=rf"{field}={value} requested but {p2} holds static instances masked "
                                             rf"with {field}={held}"):
            _iterator(p2, **{field: value})
    for field, value, error in (("masked_lm_prob", 1.5, r"masked_lm_prob=1.5 must be in \(0, 1\)"),
                                ("short_seq_prob", -0.1, r"short_seq_prob=-0.1 must be in \[0, 1\]")):
        with pytest.raises(ValueError, match=rf"^config.phases\[0\].{error}$"):
            pretraining.validate(tiny(0, **{field: value}), mesh)
    it = _iterator(docs_dir, global_batch_size=8)
    next(it)
    state = json.loads(json.dumps(it.get_state()))
    it.close()
    with pytest.raises(ValueError, match="iterator state was drawn with do_whole_word_mask=False, this iterator "
                                         "draws with do_whole_word_mask=True"):
        _iterator(docs_dir, global_batch_size=8, do_whole_word_mask=True).set_state(state)
    for key in procedure.MASKING_FIELDS:  # a state of before the masking fields: drawn with the defaults
        del state[key]
    _iterator(docs_dir, global_batch_size=8).set_state(state)
