"""Property-based fuzzing of every reader of user files: each gets MAX_EXAMPLES malformed inputs (valid
structure mixed with corruption: binary and invalid UTF-8 bytes, NUL bytes, byte-order marks, cut files,
wrong column counts, wrong JSON types, missing keys) written to a file, and must either read it or raise
one of the errors the command lines report in one line (`bert_jax.errors.USER_ERRORS`) with a one-line
message naming the file (or its directory); any other exception is a defect.
"""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_jax import errors
from bert_jax.model.bert_config import BertConfig
from bert_jax.data import corpus, glue, ner, squad, swag, tokenization
from bert_jax.data.pretraining import document_shards, formats, loader, procedure

MAX_EXAMPLES = 1000
FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ----------------------------------------------------------------------------- strategies
# Words are drawn whole from a list of awkward ones, and the corruption is made by one drawn `random.Random`
# (one draw instead of dozens: 1000 examples per reader in seconds).

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


def mutate_json(rnd, value):
    """A JSON value with some of its nodes replaced by values of other types, keys dropped or added."""
    if rnd.random() < 0.08:
        return random_json(rnd)
    if isinstance(value, dict):
        out = {k: mutate_json(rnd, v) for k, v in value.items() if rnd.random() >= 0.07}  # a missing key
        if rnd.random() < 0.07:
            out[rnd.choice(WORDS)] = random_json(rnd)
        return out
    if isinstance(value, list):
        return [mutate_json(rnd, v) for v in value]
    return value


@st.composite
def corrupted(draw, valid: st.SearchStrategy[bytes]) -> bytes:
    return corrupt_bytes(draw(st.randoms(use_true_random=False)), draw(valid))


@st.composite
def json_file(draw, structure: st.SearchStrategy) -> bytes:
    """Valid structures, mutated, as JSON bytes, then corrupted as bytes."""
    rnd = draw(st.randoms(use_true_random=False))
    return corrupt_bytes(rnd, json.dumps(mutate_json(rnd, draw(structure)), allow_nan=True).encode())


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

@st.composite
def _vocab(draw) -> bytes:
    rnd = draw(st.randoms(use_true_random=False))
    tokens = list(tokenization.SPECIAL_TOKENS) + [rnd.choice(WORDS) for _ in range(rnd.randrange(12))]
    rnd.shuffle(tokens)
    return "\n".join(tokens).encode()


_VOCAB = _vocab()


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
    rnd = draw(st.randoms(use_true_random=False))
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

@st.composite
def _conll_rows(draw):
    rnd = draw(st.randoms(use_true_random=False))
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
    check_read(lambda: ner.read_conll(path), path)


# ----------------------------------------------------------------------------- SWAG CSV

@st.composite
def _swag_rows(draw):
    rnd = draw(st.randoms(use_true_random=False))
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
    check_read(lambda: swag.read_swag_csv(path), path)


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


@FUZZ
@given(kind=st.sampled_from(["instances", "documents"]), edit=st.data(), packing=st.booleans())
def test_metadata_json(outputs, kind, edit, packing):
    out, metadata = outputs
    path = out / kind
    data = edit.draw(json_file(st.just(metadata[kind])))
    original = (path / "metadata.json").read_bytes()
    _write(path / "metadata.json", data)
    full = edit.draw(st.integers(0, 9)) == 0  # the whole iterator (slower) for a tenth of the examples

    def read():
        if full:
            loader.make_pretraining_iterator(
                str(path), global_batch_size=2, shuffle=False, num_epochs=1, process_index=0, process_count=1,
                max_seq_length=32, max_predictions_per_seq=5, packing=packing).close()
            return
        metadata = formats.read_metadata(str(path))  # what training checks before it starts
        formats.check(str(path), metadata)

    try:
        check_read(read, str(path))
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
    from bert_jax.model.bert_config import read_checkpoint_config

    path = _write(scratch / "bert_config.json", data)
    check_read(lambda: BertConfig.from_json_file(path), path)
    check_read(lambda: read_checkpoint_config(str(scratch), "bert_config.json", "directory", {}), path)


def test_every_reader_is_fuzzed_with_enough_examples():
    fuzzed = [name for name, f in globals().items() if name.startswith("test_") and hasattr(f, "hypothesis")]
    assert len(fuzzed) == 8 and MAX_EXAMPLES >= 1000, fuzzed
