"""Property-based fuzzing of every reader of user files (`READERS`): each gets MAX_EXAMPLES malformed inputs
(valid structure mixed with corruption: binary and invalid UTF-8 bytes, NUL bytes, byte-order marks, cut files,
wrong column counts, wrong JSON types, missing keys) written to a file, and must either read it, returning what
its docstring promises for any input (checked per reader), or raise one of the errors the command lines report
in one line (`bert_jax.errors.USER_ERRORS`) with a one-line message naming the file (or its directory); any
other exception is a defect.
"""

import hashlib
import json
import math
import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_jax import errors
from bert_jax.model import bert_config
from bert_jax.model.bert_config import BertConfig
from bert_jax.data import corpus, glue, ner, squad, swag, tokenization
from bert_jax.data.pretraining import document_shards, formats, loader, procedure

MAX_EXAMPLES = 1000
# Each kind of user file and the fuzz test of its readers.
READERS = {"corpus text (sentences, plain text, WikiText)": "test_corpus_text", "vocab.txt": "test_vocab_file",
           "GLUE TSV": "test_glue_tsv", "SQuAD JSON": "test_squad_json", "CoNLL": "test_conll",
           "SWAG CSV": "test_swag_csv", "metadata.json": "test_metadata_json",
           "bert_config.json": "test_bert_config_json"}
FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ----------------------------------------------------------------------------- strategies
# Words are drawn whole from a list of awkward ones, and the corruption is made by one drawn `random.Random`
# (one draw, its seed, instead of dozens: 1000 examples per reader in seconds, at the probabilities written
# here rather than Hypothesis's bias towards small values).

WORDS = ["", " ", "word", "Hello", "two words", "x" * 120, "ça va", "中文", "\t", "'", '"', ",", "0", "1", "-1",
         "2.5", "O", "B-PER", "I-LOC", "[CLS]", "##ing", "\u00a0", "\u200b", "e\u0301", "\U0001F600", "index",
         "label", "\x1b", "-DOCSTART-", "None", "true"]
_WORD = st.sampled_from(WORDS)
_JUNK = [b"\x00", b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x82", b"\xef\xbb\xbf", b"\r", b"\n", b"\t", b",", b'"',
         b"\\", b"{", b"]", b"\x1b[0m", b"\x80\x80\x80", b"\n\n", b"\xed\xa0\x80"]


def random_json(rnd, depth: int = 0):
    """A random JSON value of any type (containers nested at most 2 deep)."""
    kind = rnd.randrange(8 if depth < 2 else 6)
    if kind == 6:
        return [random_json(rnd, depth + 1) for _ in range(rnd.randrange(3))]
    if kind == 7:
        return {rnd.choice(WORDS): random_json(rnd, depth + 1) for _ in range(rnd.randrange(3))}
    return [None, rnd.random() < 0.5, rnd.randint(-2**40, 2**40),
            rnd.choice([0.5, -1.0, float("nan"), float("inf"), 1e300]), rnd.choice(WORDS), rnd.choice(WORDS) * 2][kind]


def corrupt_bytes(rnd, data: bytes) -> bytes:
    """`data` often as it is, else with a few edits: junk or random bytes inserted, a cut, a line dropped or
    repeated; sometimes random bytes altogether."""
    if rnd.random() < 0.1:
        return rnd.randbytes(rnd.randrange(300))
    for _ in range(rnd.choice([0, 0, 1, 1, 2, 4])):
        op, at = rnd.randrange(5), rnd.randrange(len(data) + 1)
        if op == 0:
            data = data[:at] + rnd.choice(_JUNK) + data[at:]
        elif op == 1:
            data = data[:at] + rnd.randbytes(rnd.randint(1, 8)) + data[at:]
        elif op == 2:
            data = data[:at]
        else:
            lines = data.split(b"\n")
            i = rnd.randrange(len(lines))
            lines[i:i + 1] = [] if op == 3 else [lines[i], lines[i]]
            data = b"\n".join(lines)
    return data


def mutate_json(rnd, value, rate: float):
    """A JSON value with some of its nodes (each with probability `rate`) replaced by values of other types,
    keys dropped or added."""
    if rnd.random() < rate:
        return random_json(rnd)
    if isinstance(value, dict):
        out = {k: mutate_json(rnd, v, rate) for k, v in value.items() if rnd.random() >= rate}  # a missing key
        if rnd.random() < rate:
            out[rnd.choice(WORDS)] = random_json(rnd)
        return out
    if isinstance(value, list):
        return [mutate_json(rnd, v, rate) for v in value]
    return value


@st.composite
def corrupted(draw, valid: st.SearchStrategy[bytes]) -> bytes:
    return corrupt_bytes(draw(st.randoms(use_true_random=True)), draw(valid))


@st.composite
def json_file(draw, structure: st.SearchStrategy) -> bytes:
    """Valid structures, mutated (none, a few or many nodes), as JSON bytes, half of them then corrupted as
    bytes."""
    rnd = draw(st.randoms(use_true_random=True))
    data = json.dumps(mutate_json(rnd, draw(structure), rnd.choice([0.0, 0.02, 0.08])), allow_nan=True).encode()
    return corrupt_bytes(rnd, data) if rnd.random() < 0.5 else data


def lines_file(rows: st.SearchStrategy[list[list[str]]], sep: str) -> st.SearchStrategy[bytes]:
    return corrupted(rows.map(lambda rs: "".join(sep.join(r) + "\n" for r in rs).encode()))


# ----------------------------------------------------------------------------- the check

@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


REFUSED = object()  # `check_read` of a read that raised a user error


def check_read(read, path: str, names=()):
    """`read()`'s value, or REFUSED where it raised a user error, whose message must be one line naming `path`
    (or one of `names`)."""
    try:
        return read()
    except errors.USER_ERRORS as e:
        message = str(e)
        assert "\n" not in message, f"{type(e).__name__} of more than one line: {message!r}"
        assert any(str(n) in message for n in (path, *names)), f"{type(e).__name__} not naming {path}: {message!r}"
        return REFUSED


def check_documents(documents) -> None:
    """Documents as the corpus readers yield them: non-empty lists of sentences, each a non-empty str stripped
    of surrounding whitespace, without a line break."""
    for document in documents:
        assert isinstance(document, list) and document, document
        for sentence in document:
            assert isinstance(sentence, str) and sentence and sentence == sentence.strip(), document
            assert "\n" not in sentence, document


def file_lines(data: bytes) -> int:
    """The lines of a file as `corpus.text_lines` counts them (ended by b"\\n" or the end of the file)."""
    return data.count(b"\n") + (bool(data) and not data.endswith(b"\n"))


# ----------------------------------------------------------------------------- corpus text

_SENTENCES = st.lists(st.lists(_WORD, min_size=1, max_size=4), min_size=1, max_size=4).map(
    lambda docs: "\n\n".join("\n".join(doc) for doc in docs).encode())


@FUZZ
@given(data=corrupted(_SENTENCES))
def test_corpus_text(scratch, data):
    path = _write(scratch / "corpus.txt", data)
    for read in (corpus.read_sentence_documents, corpus.read_text_documents, corpus.read_wikitext_documents):
        stats = corpus.ReadStats()
        documents = check_read(lambda: list(read([path], stats)), path)
        if documents is REFUSED:
            continue
        check_documents(documents)
        # lines that are not UTF-8 or hold NUL are skipped and counted; more than the share refuses the file
        assert not any("\0" in s for d in documents for s in d), documents
        lines = file_lines(data)
        assert stats.lines == lines and stats.invalid_utf8_lines <= corpus.MAX_BAD_LINE_SHARE * lines, stats
        if read is corpus.read_sentence_documents:  # one sentence per line
            assert all(s.encode() in data for d in documents for s in d), documents
        if read is corpus.read_text_documents:  # one document per file
            assert len(documents) <= 1, documents


def test_binary_corpus_is_refused_naming_the_share(tmp_path):
    binary = _write(tmp_path / "binary.bin", bytes(range(256)) * 40 + b"\n\x00\n" * 20)
    with pytest.raises(ValueError, match=r"binary.bin: not text: \d+ of its \d+ lines \(\d+%\)") as e:
        list(corpus.read_sentence_documents([binary], corpus.ReadStats()))
    assert "\n" not in str(e.value)
    # a few stray bytes are skipped and counted, not fatal
    mostly = _write(tmp_path / "mostly.txt", b"one sentence.\nbad \xff line\ntwo sentences.\n")
    stats = corpus.ReadStats()
    assert list(corpus.read_sentence_documents([mostly], stats)) == [["one sentence.", "two sentences."]]
    assert stats.invalid_utf8_lines == 1


# ----------------------------------------------------------------------------- vocab.txt

@st.composite
def _vocab(draw) -> bytes:
    rnd = draw(st.randoms(use_true_random=True))
    tokens = list(tokenization.SPECIAL_TOKENS) + [rnd.choice(WORDS) for _ in range(rnd.randrange(12))]
    rnd.shuffle(tokens)
    return "\n".join(tokens).encode()


_VOCAB = _vocab()


_TEXT = " ".join(WORDS)
_ASCII_TEXT = " ".join(w for w in WORDS if w.isascii())


@FUZZ
@given(data=corrupted(_VOCAB))
def test_vocab_file(scratch, data):
    path = _write(scratch / "vocab.txt", data)
    tokenizer = check_read(lambda: tokenization.Tokenizer(path), path)
    if tokenizer is REFUSED:
        return
    # one token per line (stripped), id = line number
    lines = data.decode("utf-8").split("\n")
    tokens = [line.strip() for line in (lines[:-1] if lines[-1] == "" else lines)]
    assert tokenizer.inv_vocab == tokens and tokenizer.vocab == {t: i for i, t in enumerate(tokens)}
    assert tokenizer.vocab_size == len(tokens) and tokenizer.vocab_sha256 == hashlib.sha256(data).hexdigest()
    specials = (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)
    assert [tokens[i] for i in specials] == list(tokenization.SPECIAL_TOKENS)
    ids = [tokenizer.encode(_TEXT), tokenizer.encode(_ASCII_TEXT)]
    assert all(type(i) is int and 0 <= i < tokenizer.vocab_size for row in ids for i in row), ids
    # the batch forms: the same ids
    assert tokenizer.encode_batch([_TEXT, _ASCII_TEXT]) == ids
    flat, lengths = tokenizer.encode_batch_flat([_TEXT, _ASCII_TEXT])
    assert flat.tolist() == ids[0] + ids[1] and lengths.tolist() == [len(ids[0]), len(ids[1])]


# ----------------------------------------------------------------------------- GLUE TSV

@st.composite
def _glue_rows(draw):
    task = glue.get_task(draw(st.sampled_from(sorted(glue.TASKS))))
    rnd = draw(st.randoms(use_true_random=True))
    layout = rnd.choice([task.labelled, task.test])
    columns = rnd.choice(layout.columns)
    labels = list(task.labels) or ["0", "2.5", "5.0"]
    rows = []
    if layout.header:
        rows.append([layout.first or "index"] + [f"c{i}" for i in range(1, columns)])
    for _ in range(rnd.randrange(6)):
        row = [rnd.choice(WORDS) for _ in range(columns)]
        if layout.label is not None:
            row[layout.label] = rnd.choice(labels)
        rows.append(row)
    return task.name, rows


@FUZZ
@given(task_rows=_glue_rows(), edit=st.data())
def test_glue_tsv(scratch, task_rows, edit):
    task, rows = task_rows
    data = edit.draw(lines_file(st.just(rows), "\t"))
    path = _write(scratch / "train.tsv", data)
    spec = glue.get_task(task)
    pair = spec.labelled.text_b is not None
    examples = check_read(lambda: glue.read_glue_tsv(task, path), path)
    if examples is not REFUSED:
        unlabelled = [e.label == -1 for e in examples]
        assert all(unlabelled) or not any(unlabelled), examples  # a test file (label -1) or a labelled one
        for e in examples:
            assert isinstance(e.guid, str) and isinstance(e.text_a, str) and "\n" not in e.text_a, e
            assert (e.text_b is not None) == pair and "\n" not in (e.text_b or ""), e
            if e.label == -1:
                assert type(e.label) is int, e
            elif spec.is_regression:
                assert type(e.label) is float and glue.STSB_RANGE[0] <= e.label <= glue.STSB_RANGE[1], e
            else:
                assert type(e.label) is int and 0 <= e.label < spec.num_labels, e
        if not any(unlabelled):  # guid: the line number
            lines = [int(e.guid) for e in examples]
            assert lines == sorted(set(lines)) and all(n >= 1 for n in lines), lines
    per_document = 3
    documents = check_read(lambda: list(corpus.read_glue_documents([path], task, corpus.ReadStats(),
                                                                   sentences_per_document=per_document)), path)
    if documents is not REFUSED:
        check_documents(documents)
        if pair:  # a pair's two sentences (or the one that is not blank)
            assert all(len(d) <= 2 for d in documents), documents
        else:  # groups of per_document, the last one maybe shorter
            assert all(len(d) == per_document for d in documents[:-1]), documents
            assert all(len(d) <= per_document for d in documents[-1:]), documents


# ----------------------------------------------------------------------------- SQuAD JSON

@st.composite
def _squad(draw) -> dict:
    """A SQuAD file's structure whose answers are mostly spans of their context, at their offset or off it
    (shifted, or counted from the context's end)."""
    rnd = draw(st.randoms(use_true_random=True))

    def answer(context: str) -> dict:
        start = rnd.randrange(len(context) + 1)
        text = context[start:rnd.randint(start, len(context))] if rnd.random() < 0.8 else rnd.choice(WORDS)
        at = rnd.choice([start, start, start, start + 1, start - len(context), rnd.randint(-2, 30)])
        return {"text": text, "answer_start": at}

    def qa(context: str) -> dict:
        out = {"id": rnd.choice(WORDS), "question": rnd.choice(WORDS),
               "answers": [answer(context) for _ in range(rnd.randrange(3))]}
        if rnd.random() < 0.5:
            out["is_impossible"] = rnd.random() < 0.5
        return out

    def paragraph() -> dict:
        context = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 4)))
        return {"context": context, "qas": [qa(context) for _ in range(rnd.randrange(4))]}

    return {"version": rnd.choice(["1.1", "v2.0"]), "data": [
        {"title": rnd.choice(WORDS), "paragraphs": [paragraph() for _ in range(rnd.randint(1, 2))]}
        for _ in range(rnd.randint(1, 2))]}


_SQUAD = _squad()


@FUZZ
@given(data=json_file(_SQUAD), is_training=st.booleans())
def test_squad_json(scratch, data, is_training):
    path = _write(scratch / "squad.json", data)
    stats = squad.ReadStats()
    examples = check_read(lambda: squad.read_squad_examples(path, is_training=is_training, stats=stats), path)
    if examples is not REFUSED:
        paragraphs = [p for article in json.loads(data.decode("utf-8"))["data"] for p in article["paragraphs"]]
        assert len(examples) + stats.total() == sum(len(p["qas"]) for p in paragraphs), stats  # kept or counted
        for e in examples:
            assert isinstance(e.qas_id, str) and isinstance(e.is_impossible, bool), e
            assert isinstance(e.question_text, str) and e.question_text.strip(), e
            assert isinstance(e.context_text, str) and e.context_text.strip(), e
            assert all(isinstance(text, str) and type(start) is int for text, start in e.answers), e
            assert not (e.is_impossible and e.answers), e
            if is_training:  # one usable answer, or none when impossible
                assert len(e.answers) == (0 if e.is_impossible else 1), e
                for text, start in e.answers:
                    assert text.strip() and 0 <= start and e.context_text[start:start + len(text)] == text, e
    documents = check_read(lambda: list(corpus.read_squad_documents([path], corpus.ReadStats())), path)
    if documents is not REFUSED:
        check_documents(documents)
        assert all(s == " ".join(s.split()) for d in documents for s in d), documents  # whitespace normalised


# ----------------------------------------------------------------------------- CoNLL

@st.composite
def _conll_rows(draw):
    rnd = draw(st.randoms(use_true_random=True))
    n = rnd.randint(2, 4)
    rows = []
    for _ in range(rnd.randrange(9)):
        kind = rnd.randrange(6)
        if kind == 0:
            rows.append([])
        elif kind == 1:
            rows.append(["-DOCSTART-", "-X-", "-X-", "O"][:n])
        else:
            word = rnd.choice([w for w in WORDS if w.strip()])
            rows.append([word] + ["NN"] * (n - 2) + [rnd.choice(["O", "B-PER", "I-PER", "B-LOC", "I-ORG", "X", "b-per"])])
    return rows


_CONLL = _conll_rows()


@FUZZ
@given(data=lines_file(_CONLL, " "))
def test_conll(scratch, data):
    path = _write(scratch / "eng.train", data)
    sentences = check_read(lambda: ner.read_conll(path), path)
    if sentences is REFUSED:
        return
    starts = []
    for s in sentences:
        assert s.words and len(s.words) == len(s.tags), s
        assert all(isinstance(w, str) and w.split() == [w] and w != ner.DOCSTART for w in s.words), s
        assert all(re.fullmatch(r"O|[BI]-\S+", t) for t in s.tags), s
        assert s.source.startswith(f"{path}:"), s
        starts.append(int(s.source[len(path) + 1:]))
    assert starts == sorted(set(starts)) and all(n >= 1 for n in starts), starts  # in file order
    if ner.iob_scheme(sentences) == "IOB2":  # every entity starts with B-
        for s in sentences:
            for previous, tag in zip(("O",) + s.tags, s.tags):
                assert not tag.startswith("I-") or previous[2:] == tag[2:], s
    labels = ner.label_list(sentences)
    assert labels[0] == "O" and set(labels) == {"O", *(t for s in sentences for t in s.tags)}, labels


# ----------------------------------------------------------------------------- SWAG CSV

@st.composite
def _swag_rows(draw):
    rnd = draw(st.randoms(use_true_random=True))
    header = list(swag.HEADER) if rnd.random() < 0.5 else list(swag.HEADER[:-1])
    rows = [header]
    for i in range(rnd.randrange(5)):
        row = [str(i)] + [rnd.choice(WORDS) for _ in header[1:]]
        if header[-1] == "label":
            row[-1] = rnd.choice(["0", "1", "2", "3", "4", "", "x"])
        rows.append(row)
    return rows


def _csv(rows) -> bytes:
    import csv
    import io

    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue().encode()


@FUZZ
@given(data=corrupted(_swag_rows().map(_csv)))
def test_swag_csv(scratch, data):
    path = _write(scratch / "train.csv", data)
    examples = check_read(lambda: swag.read_swag_csv(path), path)
    if examples is REFUSED:
        return
    unlabelled = [e.label == -1 for e in examples]
    assert all(unlabelled) or not any(unlabelled), examples  # the file has a label column or not
    for e in examples:
        assert len(e.endings) == swag.NUM_CHOICES and all(isinstance(t, str) and t.strip() for t in e.endings), e
        assert type(e.label) is int and -1 <= e.label < swag.NUM_CHOICES, e
        assert isinstance(e.guid, str) and isinstance(e.context, str), e
        assert isinstance(e.start, str) and e.start == e.start.strip(), e


# ----------------------------------------------------------------------------- metadata.json

@pytest.fixture(scope="module")
def outputs(data_dir, tmp_path_factory):
    """Real create_pretraining_data outputs (static instances, tokenized documents) of the sample text,
    whose metadata.json the fuzzer replaces: (their parent folder, {kind: its metadata})."""
    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    out = tmp_path_factory.mktemp("outputs")
    sample = [str(data_dir / "corpus" / "bert_sample_text.txt")]
    instances = procedure.create_pretraining_data(
        corpus.read_sentence_documents(sample, corpus.ReadStats()), tok, str(out / "instances"),
        options=procedure.InstanceOptions(max_seq_length=32, max_predictions_per_seq=5), dupe_factor=1)
    documents = document_shards.tokenize_documents(corpus.read_sentence_documents(sample, corpus.ReadStats()), tok,
                                                   str(out / "documents"), num_shards=2)
    return out, {"instances": instances, "documents": documents}


def check_metadata(metadata, kind: str, written: dict) -> None:
    """`metadata` read from the `kind` directory (whose metadata.json, as written, is `written`) and checked
    complete (`formats.check`): the fields the readers use, of their types, and the counts of the files."""
    def count(v):
        return type(v) is int and v >= 0

    assert isinstance(metadata, dict) and formats.is_documents(metadata) == (kind == "documents"), metadata
    # optional fields the readers use
    assert all(count(metadata[name]) for name in ("vocab_size", "num_tokens") if name in metadata), metadata
    assert type(metadata.get("do_lower_case", True)) is bool, metadata
    shards = metadata["shards"]
    assert isinstance(shards, list) and shards, metadata
    assert all(isinstance(s, str) and s and os.path.basename(s) == s for s in shards), metadata
    if kind == "documents":
        assert metadata["format_version"] == formats.DOCUMENTS_FORMAT_VERSION, metadata
        assert list(zip(shards, metadata["shard_documents"], strict=True)) == list(
            zip(written["shards"], written["shard_documents"])), metadata
        assert metadata["num_documents"] == sum(metadata["shard_documents"]), metadata
    else:
        assert metadata["format_version"] == formats.INSTANCES_FORMAT_VERSION, metadata
        assert shards == written["shards"] and metadata["num_instances"] == written["num_instances"], metadata
        flags = metadata["flags"]
        assert isinstance(flags, dict) and count(flags["max_predictions_per_seq"]), metadata
        assert count(flags["max_seq_length"]) and flags["max_seq_length"] >= 2, metadata
        for name in ("masked_lm_prob", "short_seq_prob"):  # compared with the masking a run asks for
            assert name not in flags or type(flags[name]) in (int, float) and 0 <= flags[name] <= 1, metadata
        assert type(flags.get("do_whole_word_mask", False)) is bool, metadata


_MASKING = {name: getattr(procedure.InstanceOptions(), name) for name in procedure.MASKING_FIELDS}  # the data's


@FUZZ
@given(kind=st.sampled_from(["instances", "documents"]), edit=st.data(), packing=st.booleans(),
       shuffle=st.booleans(), masking=st.sampled_from([{}, _MASKING]))
def test_metadata_json(outputs, kind, edit, packing, shuffle, masking):
    out, metadata = outputs
    path = out / kind
    data = edit.draw(json_file(st.just(metadata[kind])))
    original = (path / "metadata.json").read_bytes()
    _write(path / "metadata.json", data)
    full = edit.draw(st.integers(0, 9)) == 0  # the whole iterator (slower) for a tenth of the examples

    def read():
        if full:
            it = loader.make_pretraining_iterator(
                str(path), global_batch_size=2, shuffle=shuffle, num_epochs=1, process_index=0, process_count=1,
                max_seq_length=32, max_predictions_per_seq=5, packing=packing, **masking)
            try:
                return it, next(it)
            finally:
                it.close()
        read_metadata = formats.read_metadata(str(path))  # what training checks before it starts
        formats.check(str(path), read_metadata)
        return read_metadata

    try:
        result = check_read(read, str(path))
    finally:
        _write(path / "metadata.json", original)
    if result is REFUSED:
        return
    if full:
        it, batch = result
        assert isinstance(it, loader.PackedPretrainingIterator if packing or kind == "documents"
                          else loader.PretrainingIterator), it
        assert it.local_batch_size == 2, it.local_batch_size
        for name in ("input_ids", "token_type_ids", "attention_mask"):
            assert batch[name].shape == (2, 32) and batch[name].dtype == np.int32, (name, batch[name])
        result = it.metadata
    check_metadata(result, kind, metadata[kind])


# ----------------------------------------------------------------------------- bert_config.json

_BERT_CONFIG = st.fixed_dictionaries({
    "vocab_size": st.integers(1, 100), "hidden_size": st.sampled_from([4, 8, 6]),
    "num_hidden_layers": st.integers(1, 3), "num_attention_heads": st.sampled_from([1, 2, 4]),
    "intermediate_size": st.integers(1, 32), "hidden_act": st.sampled_from(["gelu", "relu", "swish"]),
    "hidden_dropout_prob": st.floats(0, 1), "attention_probs_dropout_prob": st.floats(0, 1),
    "max_position_embeddings": st.integers(1, 512), "type_vocab_size": st.integers(1, 2),
    "initializer_range": st.floats(0, 1), "layer_norm_eps": st.floats(1e-12, 1e-3)},
    optional={"model_type": st.sampled_from(["bert", "roberta"]), "architectures": st.just(["BertModel"]),
              "position_embedding_type": st.sampled_from(["absolute", "relative_key"])})


@FUZZ
@given(data=json_file(_BERT_CONFIG))
def test_bert_config_json(scratch, data):
    from bert_jax.model.bert_config import read_checkpoint_config

    path = _write(scratch / "bert_config.json", data)
    config = check_read(lambda: BertConfig.from_json_file(path), path)
    checkpoint = check_read(lambda: read_checkpoint_config(str(scratch), "bert_config.json", "directory", {}), path)
    if config is REFUSED:
        assert checkpoint is REFUSED, checkpoint  # it checks more, never less
        return
    values = json.loads(data.decode("utf-8"))
    default = BertConfig()
    for name in bert_config.BERT_CONFIG_FIELDS:  # the file's values, the others BERT-Base's
        assert getattr(config, name) == values.get(name, getattr(default, name)), (name, config)
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size"):
        value = getattr(config, name)
        assert type(value) is int and value > 0, (name, config)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "layer_norm_eps"):
        value = getattr(config, name)
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (name, config)
        assert 0 <= value < math.inf and (value <= 1 or not name.endswith("_prob")), (name, config)
    assert config.head_size * config.num_attention_heads == config.hidden_size, config
    assert config.hidden_act in bert_config.ACTIVATIONS, config
    if checkpoint is not REFUSED:
        assert checkpoint == config, (checkpoint, config)
        assert values.get("model_type", "bert") == "bert", values
        assert values.get("position_embedding_type", "absolute") == "absolute", values
        assert all(name in values for name in bert_config.BERT_CONFIG_FIELDS[:5]), values


def test_every_reader_is_fuzzed_with_enough_examples():
    """One fuzz test per entry of READERS, each run with its own settings (those hypothesis keeps on the test
    as `_hypothesis_internal_use_settings` and runs it with): at least 1000 examples, derandomized."""
    fuzzed = {name: f for name, f in globals().items()
              if name.startswith("test_") and getattr(f, "is_hypothesis_test", False)}
    assert sorted(fuzzed) == sorted(READERS.values()), sorted(fuzzed)
    for name, test in fuzzed.items():
        used = test._hypothesis_internal_use_settings
        assert used.max_examples >= 1000 and used.derandomize, f"{name}: {used!r}"
