"""Dynamic instances: drawn from tokenized documents while reading, with the original's procedure."""

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.data import corpus, document_shards, dynamic, formats, packing, pipeline, pretraining, tokenization
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
    return pipeline.make_pretraining_iterator(str(path), **args)


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
    transform = dynamic._DrawInstances(str(documents), pretraining.InstanceOptions(), seed=0, do_lower_case=True)
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
        pipeline.make_pretraining_iterator(str(documents), global_batch_size=8, process_index=0, process_count=1)


def test_a_phase_may_read_documents_but_evaluation_may_not(documents, instances):
    import jax

    from bert_jax import sharding, train
    from bert_jax.configs import pretrain

    config = pretrain.get_config("tiny")
    config.phases[0].data_dir = str(documents)
    config.phases[1].data_dir = str(instances / "p2")
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    assert [p.data_dir for p in train.validate(config, mesh)] == [str(documents), str(instances / "p2")]
    config.eval_data_dir = str(documents)
    with pytest.raises(ValueError, match="holds tokenized documents; evaluation needs fixed instances"):
        train.validate(config, mesh)


def test_log_prior_of_documents_is_the_tokens_unigram(documents):
    """`config.mlm_bias_init="log_prior"` on tokenized documents: the centred, add-one smoothed log unigram
    distribution of every token of the documents, computed here by hand from the decoded documents."""
    store = document_shards.Documents(str(documents))
    tokens = np.concatenate([store[d][0] for d in range(len(store))])
    counts = np.bincount(tokens, minlength=30522).astype(np.float64) + 1.0
    want = np.log(counts / counts.sum())
    np.testing.assert_allclose(pretraining.masked_token_log_prior(str(documents), 30522), want - want.mean(),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="token id"):
        pretraining.masked_token_log_prior(str(documents), 100)


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
    options = pretraining.InstanceOptions(max_seq_length=64, max_predictions_per_seq=10)
    assert dynamic.default_shuffle_window({"num_tokens": 61_000}, options, 1) == 1000
    assert dynamic.default_shuffle_window({"num_tokens": 61_000}, options, 2) == 500
    assert dynamic.default_shuffle_window({"num_tokens": 30}, options, 1) == 1
    assert dynamic.default_shuffle_window({"num_tokens": 10**9}, options, 8) == dynamic.DEFAULT_SHUFFLE_WINDOW
    assert dynamic.default_shuffle_window({}, options, 1) == dynamic.DEFAULT_SHUFFLE_WINDOW
