"""Property-based fuzzing of every reader of user files: each gets MAX_EXAMPLES malformed inputs (valid
structure mixed with corruption: binary and invalid UTF-8 bytes, NUL bytes, byte-order marks, cut files,
wrong column counts, wrong JSON types, missing keys) written to a file, and must either read it or raise
one of the errors the command lines report in one line (`bert_jax.errors.USER_ERRORS`) with a one-line
message naming the file (or its directory); any other exception is a defect.
"""

import json

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bert_jax import errors
from bert_jax.bert_config import BertConfig
from bert_jax.data import conll, corpus, glue, pipeline, squad, swag, tokenization

MAX_EXAMPLES = 1000
FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], phases=[Phase.explicit, Phase.reuse, Phase.generate])  # DEVTMP

# ----------------------------------------------------------------------------- strategies

_WORD = st.text(st.sampled_from("abcdefgXYZ019 .,'\"-é中\t"), min_size=0, max_size=12)
_JUNK = st.sampled_from([b"\x00", b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x82", b"\xef\xbb\xbf", b"\r", b"\n",
                         b"\t", b",", b'"', b"\\", b"{", b"]", b"\x1b[0m", b"\x80\x80\x80"])
_JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                       st.floats(allow_nan=True, allow_infinity=True), _WORD)
_JSON = st.recursive(_JSON_LEAF, lambda children: st.one_of(
    st.lists(children, max_size=3), st.dictionaries(_WORD, children, max_size=3)), max_leaves=8)


@st.composite
def corrupted(draw, valid: st.SearchStrategy[bytes]) -> bytes:
    """`valid` bytes, often as they are, else with a few edits: junk or random bytes inserted, a cut, a
    line dropped or repeated; sometimes random bytes altogether."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))
    data = draw(valid)
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 4]))):
        op = draw(st.integers(0, 4))
        at = draw(st.integers(0, len(data)))
        if op == 0:
            data = data[:at] + draw(_JUNK) + data[at:]
        elif op == 1:
            data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
        elif op == 2:
            data = data[:at]
        else:
            lines = data.split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i + 1] = [] if op == 3 else [lines[i], lines[i]]
            data = b"\n".join(lines)
    return data


@st.composite
def mutated(draw, value):
    """A JSON value with some of its nodes replaced by values of other types, keys dropped or added."""
    if draw(st.integers(0, 11)) == 0:
        return draw(_JSON)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if draw(st.integers(0, 14)) == 0:
                continue  # a missing key
            out[k] = draw(mutated(v))
        if draw(st.integers(0, 14)) == 0:
            out[draw(_WORD)] = draw(_JSON)
        return out
    if isinstance(value, list):
        return [draw(mutated(v)) for v in value]
    return value


def json_file(structure: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """Valid structures, mutated, as JSON bytes, then corrupted as bytes."""
    return corrupted(structure.flatmap(mutated).map(lambda v: json.dumps(v, allow_nan=True).encode()))


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


def check_read(read, path: str, names=()) -> None:
    """`read()` succeeds, or raises a user error whose message is one line naming `path` (or one of `names`)."""
    try:
        read()
    except errors.USER_ERRORS as e:
        message = str(e)
        assert "\n" not in message, f"{type(e).__name__} of more than one line: {message!r}"
        assert any(str(n) in message for n in (path, *names)), f"{type(e).__name__} not naming {path}: {message!r}"


# ----------------------------------------------------------------------------- corpus text

_SENTENCES = st.lists(st.lists(_WORD, min_size=1, max_size=4), min_size=1, max_size=4).map(
    lambda docs: "\n\n".join("\n".join(doc) for doc in docs).encode())


@FUZZ
@given(data=corrupted(_SENTENCES))
def test_corpus_text(scratch, data):
    path = _write(scratch / "corpus.txt", data)
    for read in (corpus.read_sentence_documents, corpus.read_text_documents, corpus.read_wikitext_documents):
        check_read(lambda: list(read([path], corpus.ReadStats())), path)


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

_VOCAB = st.lists(_WORD, max_size=12).flatmap(lambda words: st.permutations(
    list(tokenization.SPECIAL_TOKENS) + words)).map(lambda tokens: "\n".join(tokens).encode())


@FUZZ
@given(data=corrupted(_VOCAB))
def test_vocab_file(scratch, data):
    path = _write(scratch / "vocab.txt", data)

    def read():
        tokenizer = tokenization.Tokenizer(path)
        tokenizer.encode("Hello, wörld 中文")

    check_read(read, path)


# ----------------------------------------------------------------------------- GLUE TSV

@st.composite
def _glue_rows(draw):
    task = glue.get_task(draw(st.sampled_from(sorted(glue.TASKS))))
    layout = draw(st.sampled_from([task.labelled, task.test]))
    columns = draw(st.sampled_from(layout.columns))
    labels = list(task.labels) or ["0", "2.5", "5.0"]
    rows = []
    if layout.header:
        rows.append([layout.first or "index"] + [f"c{i}" for i in range(1, columns)])
    for _ in range(draw(st.integers(0, 5))):
        row = [draw(_WORD) for _ in range(columns)]
        if layout.label is not None:
            row[layout.label] = draw(st.sampled_from(labels))
        rows.append(row)
    return task.name, rows


@FUZZ
@given(task_rows=_glue_rows(), edit=st.data())
def test_glue_tsv(scratch, task_rows, edit):
    task, rows = task_rows
    data = edit.draw(lines_file(st.just(rows), "\t"))
    path = _write(scratch / "train.tsv", data)
    check_read(lambda: glue.read_glue_tsv(task, path), path)
    check_read(lambda: list(corpus.read_glue_documents([path], task, corpus.ReadStats())), path)


# ----------------------------------------------------------------------------- SQuAD JSON

_ANSWER = st.fixed_dictionaries({"text": _WORD, "answer_start": st.integers(-2, 30)})
_QA = st.fixed_dictionaries({"id": _WORD, "question": _WORD, "answers": st.lists(_ANSWER, max_size=2)},
                            optional={"is_impossible": st.booleans()})
_SQUAD = st.fixed_dictionaries({
    "version": st.sampled_from(["1.1", "v2.0"]),
    "data": st.lists(st.fixed_dictionaries({"title": _WORD, "paragraphs": st.lists(st.fixed_dictionaries(
        {"context": _WORD, "qas": st.lists(_QA, max_size=3)}), max_size=2)}), max_size=2)})


@FUZZ
@given(data=json_file(_SQUAD), is_training=st.booleans())
def test_squad_json(scratch, data, is_training):
    path = _write(scratch / "squad.json", data)
    check_read(lambda: squad.read_squad_examples(path, is_training=is_training), path)
    check_read(lambda: list(corpus.read_squad_documents([path], corpus.ReadStats())), path)


# ----------------------------------------------------------------------------- CoNLL

_TAG = st.sampled_from(["O", "B-PER", "I-PER", "B-LOC", "I-ORG", "X", "b-per"])
_CONLL = st.integers(2, 4).flatmap(lambda n: st.lists(st.one_of(
    st.tuples(_WORD.filter(lambda w: w.strip()), *[st.just("NN")] * (n - 2), _TAG).map(list),
    st.just([]), st.just(["-DOCSTART-", "-X-", "-X-", "O"][:n])), max_size=8))


@FUZZ
@given(data=lines_file(_CONLL, " "))
def test_conll(scratch, data):
    path = _write(scratch / "eng.train", data)
    check_read(lambda: conll.read_conll(path), path)


# ----------------------------------------------------------------------------- SWAG CSV

@st.composite
def _swag_rows(draw):
    header = list(swag.HEADER) if draw(st.booleans()) else list(swag.HEADER[:-1])
    rows = [header]
    for i in range(draw(st.integers(0, 4))):
        row = [str(i)] + [draw(_WORD) for _ in header[1:]]
        if header[-1] == "label":
            row[-1] = draw(st.sampled_from(["0", "1", "2", "3", "4", "", "x"]))
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
    check_read(lambda: swag.read_swag_csv(path), path)


# ----------------------------------------------------------------------------- metadata.json

@pytest.fixture(scope="module")
def outputs(data_dir, tmp_path_factory):
    """Real create_pretraining_data outputs (static instances, tokenized documents) of the sample text,
    whose metadata.json the fuzzer replaces: (instances dir, its metadata, documents dir, its metadata)."""
    from bert_jax.data import document_shards, pretraining

    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    out = tmp_path_factory.mktemp("outputs")
    sample = [str(data_dir / "corpus" / "bert_sample_text.txt")]
    instances = pretraining.create_pretraining_data(
        corpus.read_sentence_documents(sample, corpus.ReadStats()), tok, str(out / "instances"),
        options=pretraining.InstanceOptions(max_seq_length=32, max_predictions_per_seq=5), dupe_factor=1)
    documents = document_shards.tokenize_documents(corpus.read_sentence_documents(sample, corpus.ReadStats()), tok,
                                                   str(out / "documents"), num_shards=2)
    return out, {"instances": instances, "documents": documents}


@FUZZ
@given(kind=st.sampled_from(["instances", "documents"]), edit=st.data(), packing=st.booleans())
def test_metadata_json(outputs, kind, edit, packing):
    out, metadata = outputs
    path = out / kind
    data = edit.draw(json_file(st.just(metadata[kind])))
    original = (path / "metadata.json").read_bytes()
    _write(path / "metadata.json", data)
    try:
        check_read(lambda: pipeline.make_pretraining_iterator(
            str(path), global_batch_size=2, shuffle=False, num_epochs=1, process_index=0, process_count=1,
            max_seq_length=32, max_predictions_per_seq=5, packing=packing).close(), str(path))
    finally:
        _write(path / "metadata.json", original)


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
    from bert_jax import convert

    path = _write(scratch / "bert_config.json", data)
    check_read(lambda: BertConfig.from_json_file(path), path)
    check_read(lambda: convert._read_config(str(scratch), {}, name="bert_config.json"), path)


def test_every_reader_is_fuzzed_with_enough_examples():
    fuzzed = [name for name, f in globals().items() if name.startswith("test_") and hasattr(f, "hypothesis")]
    assert len(fuzzed) == 8 and MAX_EXAMPLES >= 1000, fuzzed
