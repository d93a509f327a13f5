"""Pre-training instances: exact layout on every instance, the original's statistics on real data,
determinism, whole-word masking, truncation, bad input, the CLI and a fuzz test of the builder."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_jax.data import corpus
from bert_jax.data.pretraining import procedure as pt
from bert_jax.data.pretraining import token_store
from conftest import ROOT, write_text_tfds

# The original TF1 script on gutenberg-sentences.txt (max_seq_length 128, max_predictions_per_seq 20,
# dupe_factor 1), six seeds: the band its outputs fell in.
ORIGINAL_INSTANCES = (23638, 29891)
ORIGINAL_IS_NEXT = (0.423, 0.484)
ORIGINAL_MASKED = 0.153


def _generate(tokenizer, files, out, **kwargs):
    stats = corpus.ReadStats()
    options = pt.InstanceOptions(**kwargs.pop("options", {}))
    meta = pt.create_pretraining_data(corpus.read_sentence_documents(files, stats), tokenizer, str(out),
                                      options=options, read_stats=stats, **kwargs)
    return meta


def _load(path):
    batch = list(pt.iterate_instances(str(path)))
    return {k: np.stack([b[k] for b in batch]) for k in batch[0]}


@pytest.fixture(scope="module")
def gutenberg(tokenizer, data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gutenberg")
    meta = _generate(tokenizer, [str(data_dir / "corpus" / "gutenberg-sentences.txt")], out,
                     dupe_factor=1, num_shards=2)
    return meta, _load(out)


def _check_layout(x, tokenizer, max_seq_length, max_predictions, whole_word=False):
    """Asserts the [CLS] A [SEP] B [SEP] layout, token types and masking invariants on every row."""
    n = x["attention_mask"].sum(1)
    assert (n <= max_seq_length).all() and (n >= 5).all()
    rows = np.arange(len(n))
    types = x["token_type_ids"]
    b_start = np.argmax(types == 1, axis=1)
    assert (types[rows, b_start] == 1).all()
    # types: 0 up to the first [SEP], 1 from B to the last [SEP], 0 in padding
    idx = np.arange(x["input_ids"].shape[1])[None]
    expected_types = ((idx >= b_start[:, None]) & (idx < n[:, None])).astype(np.int32)
    np.testing.assert_array_equal(types, expected_types)
    ids = x["input_ids"]
    assert (ids[:, 0] == tokenizer.cls_id).all()
    assert (ids[rows, b_start - 1] == tokenizer.sep_id).all()
    assert (ids[rows, n - 1] == tokenizer.sep_id).all()
    assert (ids[idx >= n[:, None]] == 0).all()
    assert (b_start >= 2).all() and (n - b_start >= 2).all()  # A and B non-empty
    k = x["masked_lm_weights"].sum(1).astype(int)
    expected_k = np.minimum(max_predictions, np.maximum(1, np.round(n * 0.15).astype(int)))
    if whole_word:
        # Whole words that do not fit are skipped, so a row can even end with no prediction, as in
        # the original (a word of more pieces than num_to_predict).
        assert (k <= expected_k).all()
    else:
        expected_k = np.minimum(expected_k, n - 3)
        np.testing.assert_array_equal(k, expected_k)
    pos = x["masked_lm_positions"]
    real = x["masked_lm_weights"] > 0
    assert (np.diff(np.where(real, pos, np.iinfo(np.int32).max), axis=1)[real[:, 1:]] > 0).all()  # increasing
    special = (pos == 0) | (pos == (b_start - 1)[:, None]) | (pos == (n - 1)[:, None]) | (pos >= n[:, None])
    assert not (special & real).any()
    # [MASK] appears only at masked positions (the text never produces the [MASK] id).
    masked_here = np.zeros_like(ids, bool)
    masked_here[np.repeat(rows, pos.shape[1])[real.ravel()], pos[real]] = True
    assert not ((ids == tokenizer.mask_id) & ~masked_here).any()
    return n, b_start, pos, real


def test_every_instance_has_the_exact_layout(gutenberg, tokenizer):
    _, x = gutenberg
    _check_layout(x, tokenizer, 128, 20)


def test_statistics_match_the_original(gutenberg, tokenizer):
    meta, x = gutenberg
    num = meta["num_instances"]
    assert num == len(x["input_ids"]) == sum(meta["shard_counts"])
    assert ORIGINAL_INSTANCES[0] <= num <= ORIGINAL_INSTANCES[1], num
    is_next = float(np.mean(x["next_sentence_labels"] == 0))
    assert ORIGINAL_IS_NEXT[0] <= is_next <= ORIGINAL_IS_NEXT[1], is_next
    n = x["attention_mask"].sum(1)
    real = x["masked_lm_weights"] > 0
    masked_rate = real.sum() / (n - 3).sum()
    assert abs(masked_rate - ORIGINAL_MASKED) < 0.01, masked_rate
    rows = np.repeat(np.arange(len(n)), real.shape[1]).reshape(real.shape)
    at = x["input_ids"][rows[real], x["masked_lm_positions"][real]]
    labels = x["masked_lm_ids"][real]
    mask_frac = np.mean(at == tokenizer.mask_id)
    kept_frac = np.mean((at == labels) & (at != tokenizer.mask_id))
    random_frac = 1 - mask_frac - kept_frac
    assert abs(mask_frac - 0.80) < 0.01 and abs(kept_frac - 0.10) < 0.01 and abs(random_frac - 0.10) < 0.01
    assert meta["vocab_sha256"] == "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"


def _synthetic_store(num_docs, sentences, length):
    total = num_docs * sentences * length
    tokens = (np.arange(total) % 40 + 5).astype(np.int32)
    return token_store.TokenStore(tokens, np.arange(0, total + 1, length), np.arange(0, num_docs * sentences + 1, sentences))


def test_per_document_short_target_reproduces_the_original_quirk():
    # Documents of 400 five-token sentences. An IsNext instance holds its whole chunk, whose length is
    # fixed by the target: 5 * ceil(target / 5). With one draw per document (the original's actual
    # behaviour) every IsNext instance of a document has the same length (but the document's last);
    # with draws per instance
    # (the default) the lengths vary inside a document.
    store = _synthetic_store(2, 400, 5)
    vocab = pt.VocabInfo(size=50, cls_id=2, sep_id=3, mask_id=4, is_continuation=np.zeros(50, bool))
    distinct = {}
    for per_doc in (True, False):
        options = pt.InstanceOptions(max_seq_length=64, short_seq_prob=0.5, short_seq_per_document=per_doc)
        counts = []
        for seed in range(20):
            records = pt.instances_from_document(store, 0, options, vocab, np.random.default_rng(seed))
            rows = [np.frombuffer(r, "<i4")[:4] for r in records]
            counts.append(len({int(n) for n, _, _, label in rows if label == 0}))
        distinct[per_doc] = counts
    assert max(distinct[True]) <= 2  # the document's last chunk may be shorter
    assert np.mean(distinct[False]) > 2 * np.mean(distinct[True]), distinct


def test_deterministic_whatever_num_workers(tokenizer, data_dir, tmp_path):
    files = [str(data_dir / "corpus" / "bert_sample_text.txt")]
    common = dict(dupe_factor=3, num_shards=2, random_seed=7, documents_per_task=1)
    _generate(tokenizer, files, tmp_path / "w1", num_workers=1, **common)
    _generate(tokenizer, files, tmp_path / "w2", num_workers=2, **common)
    _generate(tokenizer, files, tmp_path / "s8", num_workers=1, **dict(common, random_seed=8))
    for name in ("instances-00000-of-00002.array_record", "instances-00001-of-00002.array_record"):
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()
    a, c = _load(tmp_path / "w1"), _load(tmp_path / "s8")
    assert not np.array_equal(a["input_ids"][:10], c["input_ids"][:10])
    assert not [p for p in os.listdir(tmp_path / "w1") if p.startswith(".work") or p.endswith(".tmp")]


def test_whole_word_masking_masks_whole_words(tokenizer, data_dir, tmp_path):
    meta = _generate(tokenizer, [str(data_dir / "corpus" / "bert_sample_text.txt")], tmp_path, dupe_factor=5,
                     options=dict(do_whole_word_mask=True))
    x = _load(tmp_path)
    n, b_start, pos, real = _check_layout(x, tokenizer, 128, 20, whole_word=True)
    original = x["input_ids"].copy()
    rows = np.repeat(np.arange(len(n)), real.shape[1]).reshape(real.shape)
    original[rows[real], pos[real]] = x["masked_lm_ids"][real]
    is_cont = np.array([t.startswith("##") for t in tokenizer.inv_vocab])
    checked = 0
    for r in range(len(n)):
        masked = set(pos[r][real[r]].tolist())
        for p in masked:
            if p + 1 < n[r] - 1 and is_cont[original[r, p + 1]] and p + 1 != b_start[r] - 1:
                assert p + 1 in masked  # the rest of the word goes with it
                checked += 1
            if is_cont[original[r, p]] and p - 1 >= 1 and p - 1 != b_start[r] - 1:
                assert p - 1 in masked
    assert checked > 20 and meta["flags"]["do_whole_word_mask"]


def _truncate_by_tokens(la, lb, max_num_tokens):
    """The original truncate_seq_pair loop, lengths only (deterministic part)."""
    while la + lb > max_num_tokens:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


@given(st.integers(1, 400), st.integers(1, 400), st.integers(2, 300))
@settings(max_examples=300, deadline=None)
def test_truncation_lengths_match_the_original_loop(la, lb, max_num_tokens):
    a, b = np.arange(la), np.arange(1000, 1000 + lb)
    ta, tb = pt._truncate_pair(a, b, max_num_tokens, np.random.default_rng(la * 7 + lb))
    assert (len(ta), len(tb)) == _truncate_by_tokens(la, lb, max_num_tokens)
    # What is kept is a contiguous run of the original segment.
    assert len(ta) == 0 or np.array_equal(ta, np.arange(ta[0], ta[0] + len(ta)))
    assert len(tb) == 0 or np.array_equal(tb, np.arange(tb[0], tb[0] + len(tb)))


def test_truncation_cuts_front_and_back_fairly():
    rng = np.random.default_rng(0)
    fronts = [pt._truncate_pair(np.arange(300), np.arange(10), 110, rng)[0][0] for _ in range(2000)]
    # 200 tokens removed from A, each side with probability 1/2: the front cut averages 100.
    assert abs(np.mean(fronts) - 100) < 2


def test_bad_input(tokenizer, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    with pytest.raises(ValueError, match="no document"):
        _generate(tokenizer, [str(empty)], tmp_path / "o1", dupe_factor=1)
    # One-sentence documents, a 1 MB line and an invalid UTF-8 line.
    mixed = tmp_path / "mixed.txt"
    with open(mixed, "wb") as f:
        f.write(b"only one sentence here.\n\nanother lonely sentence.\n\n")
        f.write(("word " * 200_000).encode() + b"\n")
        f.write(b"bad \xff\xfe bytes\n")
        f.write(b"a closing sentence of the long document.\n")
    meta = _generate(tokenizer, [str(mixed)], tmp_path / "o2", dupe_factor=2)
    assert meta["skipped"]["invalid_utf8_lines"] == 1
    x = _load(tmp_path / "o2")
    _check_layout(x, tokenizer, 128, 20)
    assert meta["num_documents"] == 3
    with pytest.raises(ValueError, match="max_seq_length=4"):
        _generate(tokenizer, [str(mixed)], tmp_path / "o3", options=dict(max_seq_length=4))
    with pytest.raises(ValueError, match="matches no file"):
        corpus.expand_input_files(str(tmp_path / "nothing*.txt"))


@given(st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=12), min_size=1, max_size=6),
       st.integers(5, 70), st.booleans(), st.floats(0.0, 1.0), st.booleans(), st.integers(0, 2**31))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_instance_builder(doc_sentence_lengths, max_seq_length, whole_word, short_prob, per_doc, seed):
    rng = np.random.default_rng(seed)
    vocab_size = 50
    is_cont = np.zeros(vocab_size, bool)
    is_cont[30:] = True
    vocab = pt.VocabInfo(size=vocab_size, cls_id=2, sep_id=3, mask_id=4, is_continuation=is_cont)
    lengths = [n for doc in doc_sentence_lengths for n in doc]
    tokens = rng.integers(5, vocab_size, size=sum(lengths)).astype(np.int32)
    store = token_store.TokenStore(tokens, np.concatenate([[0], np.cumsum(lengths)]),
                          np.concatenate([[0], np.cumsum([len(d) for d in doc_sentence_lengths])]))
    options = pt.InstanceOptions(max_seq_length=max_seq_length, max_predictions_per_seq=max(1, max_seq_length // 6),
                                 do_whole_word_mask=whole_word, short_seq_prob=short_prob,
                                 short_seq_per_document=per_doc)
    records = [r for d in range(store.num_documents) for r in pt.instances_from_document(store, d, options, vocab, rng)]
    assert records
    rows = [pt.decode_instance(r, max_seq_length, options.max_predictions_per_seq) for r in records]
    x = {k: np.stack([row[k] for row in rows]) for k in rows[0]}

    class Ids:
        cls_id, sep_id, mask_id = 2, 3, 4
    _check_layout(x, Ids, max_seq_length, options.max_predictions_per_seq, whole_word=whole_word)


@pytest.mark.integration
def test_cli_writes_instances_and_fails_cleanly(data_dir, tmp_path):
    vocab = str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    cmd = [sys.executable, "-m", "bert_jax.data.create_pretraining_data",
           f"--input_file={data_dir / 'corpus' / 'bert_sample_text.txt'}", f"--output_dir={tmp_path / 'out'}",
           f"--vocab_file={vocab}", "--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=2",
           "--num_shards=2"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["flags"]["max_seq_length"] == 64 and meta["flags"]["dupe_factor"] == 2
    assert meta["num_instances"] == sum(1 for _ in pt.iterate_instances(str(tmp_path / "out")))
    bad = subprocess.run(cmd[:3] + [f"--input_file={tmp_path / 'missing.txt'}"] + cmd[4:], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "matches no file" in bad.stderr and "Traceback" not in bad.stderr
    stray = subprocess.run(cmd[:4] + [f"--output_dir={tmp_path / 'stray'}"] + cmd[5:] + ["more.txt"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert stray.returncode == 1 and stray.stderr.strip().splitlines() == [
        "create_pretraining_data: unexpected arguments ['more.txt']"]
    assert "Traceback" not in stray.stderr and not (tmp_path / "stray").exists()


def test_tfds_text_dataset_offline(tokenizer, data_dir, tmp_path):
    """A local TFDS builder (prepared offline, ArrayRecord format) read through --tfds_name semantics."""
    paragraphs = (data_dir / "corpus" / "bert_sample_text.txt").read_text(encoding="utf-8").split("\n\n")
    write_text_tfds("sample_corpus", [" ".join(p.split("\n")) for p in paragraphs], tmp_path / "tfds",
                    titles=[f"doc {i}" for i in range(len(paragraphs))])
    stats = corpus.ReadStats()
    docs = list(corpus.read_tfds_documents("sample_corpus", "train", "text", str(tmp_path / "tfds"), stats))
    assert len(docs) == len([p for p in paragraphs if p.strip()]) and all(len(d) >= 1 for d in docs)
    assert sum(len(d) for d in docs) >= 0.8 * sum(len(p.strip().splitlines()) for p in paragraphs)
    meta = pt.create_pretraining_data(iter(docs), tokenizer, str(tmp_path / "out"), dupe_factor=2, read_stats=stats)
    _check_layout(_load(tmp_path / "out"), tokenizer, 128, 20)
    assert meta["input_lines"] == len(docs)
    from bert_jax.data.pretraining import document_shards  # the same documents, tokenized once for dynamic instances

    docs_meta = document_shards.tokenize_documents(iter(docs), tokenizer, str(tmp_path / "docs"), num_shards=2)
    stored = document_shards.Documents(str(tmp_path / "docs"))
    assert docs_meta["num_documents"] == len(stored) == len(docs)
    tokens, starts = stored[len(docs) - 1]
    want = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(s)) for s in docs[-1]]
    assert [list(tokens[a:b]) for a, b in zip(starts[:-1], starts[1:])] == [w for w in want if w]
    with pytest.raises(ValueError, match="--tfds_text_key 'body'"):
        list(corpus.read_tfds_documents("sample_corpus", "train", "body", str(tmp_path / "tfds"), stats))


def test_empty_documents_are_dropped(tokenizer, tmp_path):
    store, dropped = token_store.build_token_store([["a b", "c"], [], ["d e f"], [""], []], tokenizer, str(tmp_path))
    assert store.num_documents == 2 and dropped == 1
    assert np.diff(store.document_starts).tolist() == [2, 1]
    assert np.diff(store.sentence_starts).tolist() == [2, 1, 3]


def test_masking_mismatch_names_the_first_differing_field():
    """`masking_mismatch`: static instances' metadata flags against wanted masking (None: any; a flag absent
    from old metadata: the InstanceOptions default), probabilities to 1e-9."""
    flags = dict(masked_lm_prob=0.15, do_whole_word_mask=True, short_seq_prob=0.1)
    assert pt.masking_mismatch(flags, {}) is None
    assert pt.masking_mismatch(flags, dict(masked_lm_prob=0.15 + 1e-12, do_whole_word_mask=True,
                                           short_seq_prob=None)) is None
    assert pt.masking_mismatch(flags, dict(do_whole_word_mask=False)) == ("do_whole_word_mask", False, True)
    assert pt.masking_mismatch(flags, dict(masked_lm_prob=0.2, short_seq_prob=0.0)) == ("masked_lm_prob", 0.2, 0.15)
    assert pt.masking_mismatch({}, dict(short_seq_prob=0.5)) == ("short_seq_prob", 0.5, 0.1)
    assert pt.MASKING_FIELDS == ("masked_lm_prob", "do_whole_word_mask", "short_seq_prob")


@pytest.mark.parametrize("kind", ["instances", "documents"])
def test_a_rerun_into_a_finished_directory_that_fails_while_publishing_leaves_it_incomplete(kind, tokenizer,
                                                                                           monkeypatch, tmp_path):
    """A second run into a finished output directory removes its metadata.json before it replaces any shard: when
    that run fails midway through publishing (here after its first file), the directory reads as incomplete (no
    metadata.json: the loaders refuse it in one line), never as the first run's metadata over the second run's
    shards. Without a failure the second run's metadata describes its shards."""
    from bert_jax import storage
    from bert_jax.data.pretraining import document_shards, formats

    docs = [[f"sentence {d} {s} of the corpus ." for s in range(4)] for d in range(12)]
    out = str(tmp_path / "out")

    def write(documents, num_shards):
        if kind == "instances":
            return pt.create_pretraining_data(iter(documents), tokenizer, out, dupe_factor=1, num_shards=num_shards)
        return document_shards.tokenize_documents(iter(documents), tokenizer, out, num_shards=num_shards)

    first = write(docs, 2)
    assert formats.read_metadata(out)["shards"] == first["shards"]
    real_publish = storage.publish

    def publish_one_then_fail(work, output_dir, names):
        real_publish(work, output_dir, names[:1])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage, "publish", publish_one_then_fail)
    with pytest.raises(OSError, match="No space left"):
        write(docs[:6], 3)
    with pytest.raises(FileNotFoundError, match="no metadata.json"):
        formats.read_metadata(out)
    monkeypatch.setattr(storage, "publish", real_publish)
    second = write(docs[:6], 3)
    assert formats.read_metadata(out) == json.loads(json.dumps(second)) and len(second["shards"]) == 3
