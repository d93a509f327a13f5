"""WordPiece tokenizer: parity with transformers' slow (pure-Python) BertTokenizer on real corpora.

The reference is `transformers.BertTokenizer` (not the Rust-backed BertTokenizerFast), made to treat
"[MASK]" & co. inside raw text as plain text like the original google-research/bert tokenizer
(`split_special_tokens=True`, which transformers 4.57 does not pass on to its BasicTokenizer, so
`_ReferenceTokenizer` does). For arbitrary Unicode (the fuzz test, the code point sweep) it is also
given the original's definition of a control character (Cc, Cf): transformers removes every category-C
character, including private-use and unassigned ones that the original keeps (their words become
[UNK]). `test_documented_divergences` pins both differences down.
"""

import concurrent.futures
import json
import multiprocessing
import pickle
import re
import time
import unicodedata

import pytest
from hypothesis import given, settings, strategies as st

import transformers
from transformers.models.bert import tokenization_bert

from bert_jax.data.tokenization import Tokenizer

UNCASED_VOCAB = "vocab/bert-base-uncased-vocab.txt"
SQUAD_FILES = ("squad/dev-v1.1.json", "squad/train-v1.1-subset-44articles.json")  # and v2.0 dev (squad_v2_dev)


class _ReferenceTokenizer(transformers.BertTokenizer):
    """transformers' slow BertTokenizer that treats special-token text as plain text, like the original.

    `split_special_tokens=True` only switches off the added-token matcher; transformers does not pass it
    on to `_tokenize`, whose BasicTokenizer would still keep "[MASK]" whole (its `never_split`).
    """

    def _tokenize(self, text, split_special_tokens=False):
        return super()._tokenize(text, split_special_tokens=True)


def _reference(vocab_file, do_lower_case=True):
    return _ReferenceTokenizer(str(vocab_file), do_lower_case=do_lower_case, split_special_tokens=True)


def _reference_ids(reference, text):
    return reference.convert_tokens_to_ids(reference.tokenize(text))


def _original_is_control(char):
    """google-research/bert tokenization._is_control."""
    if char in "\t\n\r":
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def _original_reference_ids(reference, texts):
    """Reference ids of each text, with the original's control characters (Cc, Cf) instead of C*."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tokenization_bert, "_is_control", _original_is_control)
        return [_reference_ids(reference, t) for t in texts]


@pytest.fixture(scope="module")
def uncased_vocab(data_dir):
    return data_dir / UNCASED_VOCAB


@pytest.fixture(scope="module")
def tokenizer(uncased_vocab):
    return Tokenizer(uncased_vocab)


@pytest.fixture(scope="module")
def reference(uncased_vocab):
    return _reference(uncased_vocab)


@pytest.fixture(scope="module")
def squad(data_dir, squad_v2_dev):
    paths = [data_dir / name for name in SQUAD_FILES] + [squad_v2_dev[0]]
    return {str(p.relative_to(data_dir)): json.loads(p.read_text(encoding="utf-8"))["data"] for p in paths}


def _corpus_lines(data_dir, squad):
    lines = []
    for name in ("corpus/gutenberg-sentences.txt", "corpus/wikitext-2/valid.txt", "corpus/wikitext-2/test.txt"):
        text = (data_dir / name).read_text(encoding="utf-8")
        lines += [line for line in text.split("\n") if line.strip()]
    for articles in squad.values():
        for article in articles:
            for paragraph in article["paragraphs"]:
                lines.append(paragraph["context"])
                lines += [qa["question"] for qa in paragraph["qas"]]
    return lines


def _reference_worker(args):
    vocab_file, do_lower_case, texts = args
    reference = _reference(vocab_file, do_lower_case)
    return [_reference_ids(reference, t) for t in texts]


def _reference_ids_parallel(vocab_file, texts, do_lower_case=True, processes=2):
    """The slow reference over `texts`, split over `processes` spawned processes."""
    chunks = [texts[i::processes] for i in range(processes)]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        parts = list(pool.map(_reference_worker, [(str(vocab_file), do_lower_case, c) for c in chunks]))
    out = [None] * len(texts)
    for i, part in enumerate(parts):
        out[i::processes] = part
    return out


# The suite compares every distinct line holding a non-ASCII character (the Unicode rules: accents, CJK,
# control and punctuation classes; 2,870 lines) and every SAMPLE_STRIDE-th distinct ASCII line (the ASCII fast
# path); benchmarks/tokenizer_parity.py compares every line (its time: benchmarks/README.md).
SAMPLE_STRIDE = 8


def compare_with_reference(lines: list[str], vocab_file, stride: int) -> tuple[list[str], int, str]:
    """The distinct lines of `lines` that hold a non-ASCII character and every `stride`-th distinct ASCII line,
    tokenized by bert_jax's Tokenizer and by the reference (on 2 processes), uncased: (lines whose ids differ,
    lines compared, a one-line summary with both timings)."""
    distinct = list(dict.fromkeys(lines))
    ascii_lines = [t for t in distinct if t.isascii()]
    compared = [t for t in distinct if not t.isascii()] + ascii_lines[::stride]
    start = time.perf_counter()
    ours = Tokenizer(vocab_file).encode_batch(compared)
    ours_s = time.perf_counter() - start
    start = time.perf_counter()
    expected = _reference_ids_parallel(vocab_file, compared)
    reference_s = time.perf_counter() - start
    summary = (f"{len(lines)} non-empty lines, {len(compared)} distinct compared (all {len(distinct) - len(ascii_lines)} "
               f"non-ASCII, every {stride} of the ASCII), {sum(map(len, compared)) / 1e6:.1f}M chars: ours "
               f"{ours_s:.1f}s, reference {reference_s:.1f}s on 2 processes")
    return [t for t, a, b in zip(compared, ours, expected) if a != b], len(compared), summary


@pytest.mark.slow
def test_ids_match_reference_on_corpus_lines(data_dir, squad, uncased_vocab):
    mismatches, compared, summary = compare_with_reference(_corpus_lines(data_dir, squad), uncased_vocab, SAMPLE_STRIDE)
    print("\n" + summary)
    assert not mismatches, f"{len(mismatches)} lines differ, first: {mismatches[0][:200]!r}"
    assert compared > 16_000


@pytest.fixture(scope="module")
def cased_vocab(tmp_path_factory, uncased_vocab):
    """A cased vocabulary: the uncased one plus capitalised and upper-case forms of its pieces."""
    tokens = uncased_vocab.read_text(encoding="utf-8").split("\n")[:-1]
    extra = []
    for t in tokens:
        if t.startswith("[") or not t.strip("#").isalpha():
            continue
        extra += [t.capitalize(), t.upper()] if not t.startswith("##") else ["##" + t[2:].upper()]
    seen = set(tokens)
    tokens += [t for t in dict.fromkeys(extra) if t not in seen]
    path = tmp_path_factory.mktemp("cased") / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


def test_cased_ids_match_reference_on_squad(squad, cased_vocab):
    ours = Tokenizer(cased_vocab, do_lower_case=False)
    reference = _reference(cased_vocab, do_lower_case=False)
    texts = [p["context"] for a in squad["squad/dev-v1.1.json"] for p in a["paragraphs"]]
    texts += [qa["question"] for a in squad["squad/dev-v1.1.json"] for p in a["paragraphs"] for qa in p["qas"]]
    # transformers NFC-composes first, the original does not; these lines are all NFC already.
    assert all(unicodedata.is_normalized("NFC", t) for t in texts)
    got = ours.encode_batch(texts)
    mismatches = [t for t, ids in zip(texts, got) if ids != _reference_ids(reference, t)]
    assert not mismatches, f"{len(mismatches)} of {len(texts)} differ, first: {mismatches[0][:200]!r}"
    assert ours.tokenize("Hello PARIS, naïve") == ["Hello", "PARIS", ",", "[UNK]"]
    assert Tokenizer(cased_vocab).tokenize("Hello PARIS, naïve") == ["hello", "paris", ",", "naive"]


def _normalise(text):
    """Lowercase + accent strip + control character removal, as the uncased tokenizer does."""
    text = "".join(c for c in text if not _original_is_control(c))
    return "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")


def test_offsets_cover_the_token_text(squad, tokenizer):
    paragraphs = [p["context"] for a in squad["squad/dev-v1.1.json"] for p in a["paragraphs"]][::5]
    checked = 0
    for context in paragraphs:
        ids, offsets = tokenizer.encode_with_offsets(context)
        assert len(ids) == len(offsets) and ids == tokenizer.encode(context)
        for token, (start, end) in zip(tokenizer.convert_ids_to_tokens(ids), offsets):
            assert 0 <= start < end <= len(context)
            if token != "[UNK]":
                assert _normalise(context[start:end]) == token.removeprefix("##"), (token, context[start:end])
                checked += 1
    assert checked > 50_000


def test_squad_answers_map_to_token_spans(squad, tokenizer):
    answers = exact = 0
    for article in squad["squad/dev-v1.1.json"]:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            _, offsets = tokenizer.encode_with_offsets(context)
            for qa in paragraph["qas"]:
                for answer in qa["answers"]:
                    text = answer["text"]
                    start = answer["answer_start"]
                    end = start + len(text)
                    assert context[start:end] == text
                    # The tokens overlapping the answer are contiguous and cover its non-space text.
                    covering = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
                    first, last = covering[0], covering[-1]
                    assert covering == list(range(first, last + 1))
                    assert offsets[first][0] <= start + len(text) - len(text.lstrip())
                    assert offsets[last][1] >= end - len(text) + len(text.rstrip())
                    exact += offsets[first][0] == start and offsets[last][1] == end
                    answers += 1
    print(f"\n{answers} answers, {exact / answers:.1%} on exact token boundaries")
    assert answers > 30_000 and exact / answers > 0.95


EDGE_CASES = [
    "",
    "   \t\n ",
    "Héllo Wörld Ångström naïve façade Ærøskøbing İstanbul straße",
    "Cafe\u0301 vs Caf\u00e9",  # decomposed and composed accent
    "中文字符 mixed with 日本語 and 한국어 and 𠀀𪜀",
    "a\x00b\x01c\u200bd\ufffde\x7ff\u00adg\u2060h",  # NUL, C0, zero-width space, U+FFFD, DEL, soft hyphen
    "a\u00a0b\u2003c\u3000d\te\nf\rg\u2028h\u2029i\x0bj\x0ck\x1cl\x85m\u1680n\u202fo",  # whitespace
    "a" * 100,
    "a" * 101,
    "x " + "b" * 101 + " y",
    "Hello!!! (world) -- $5.00 & 50% @user #tag ^_^ `q` «g» “smart” ‘q’ — – … ¿¡ 【括弧】 ・ ¶ §",
    "I ❤️ 🤗 👍🏽 🇫🇷 👨‍👩‍👧 ☃",
    "[MASK] [CLS] [SEP] [PAD] [UNK] [mask] [unused0]",
    "ΟΔΟΣ ΣΟΦΟΣ Σ όδος",  # capital sigma: per-character lowercasing
    "\u212a \u212b \u2126 \ufb01 \u0130 \u1e9e",  # Kelvin, Angstrom, Ohm, fi ligature, dotted I, capital sharp s
    "unaffable 12,345.67 e-mail U.S.A. don't",
]


@pytest.mark.parametrize("text", EDGE_CASES)
def test_edge_cases_match_reference(text, tokenizer, reference):
    assert tokenizer.encode(text) == _reference_ids(reference, text)
    assert tokenizer.tokenize(text) == reference.tokenize(text)


def test_edge_case_details(tokenizer):
    assert tokenizer.tokenize("") == []
    assert "[UNK]" not in tokenizer.tokenize("a" * 100)
    assert tokenizer.tokenize("a" * 101) == ["[UNK]"]
    assert tokenizer.tokenize("[MASK] x") == ["[", "mask", "]", "x"]
    assert tokenizer.tokenize("Héllo, WÖRLD!") == ["hello", ",", "world", "!"]
    assert tokenizer.tokenize("中文") == ["中", "文"]
    assert tokenizer.tokenize("a\u00a0b\x00c") == ["a", "bc"]
    ids, offsets = tokenizer.encode_with_offsets("Cafe\u0301 unaffable \U0001F600")
    assert tokenizer.convert_ids_to_tokens(ids) == ["cafe", "una", "##ffa", "##ble", "[UNK]"]
    # The combining accent (removed by the normalisation) lies outside every span.
    assert offsets == [(0, 4), (6, 9), (9, 12), (12, 15), (16, 17)]


def test_documented_divergences(tokenizer, reference, uncased_vocab):
    # transformers by default matches special tokens inside raw text; the original does not.
    for options in ({}, {"split_special_tokens": True}):
        default = transformers.BertTokenizer(str(uncased_vocab), do_lower_case=True, **options)
        assert default.tokenize("[MASK] x") == ["[MASK]", "x"]
    assert tokenizer.tokenize("[MASK] x") == reference.tokenize("[MASK] x") == ["[", "mask", "]", "x"]
    # Private-use and unassigned characters: the original keeps them, so the word becomes [UNK];
    # transformers removes them. Lone surrogates are kept the same way, without an encoding error.
    for text in ("abc\ue000", "x \u0378 y", "abc\ud800"):
        assert [tokenizer.encode(text)] == _original_reference_ids(reference, [text])
        assert tokenizer.unk_id in tokenizer.encode(text)
        assert tokenizer.unk_id not in _reference_ids(reference, text)
    # Characters whose lowercase or NFD differs between the Rust library's Unicode tables and Python's.
    for text in ("A\ua7dcB", "x\U00011938"):
        assert tokenizer.tokenize(text) == ["[UNK]"]


def test_every_code_point_in_context_matches_reference(tokenizer, reference):
    """Each code point (assigned ones outside the CJK ideograph blocks, every 50th other one) in "a_b"."""
    cjk = ((0x3400, 0x9FFF), (0x20000, 0x3134F), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F), (0xAC00, 0xD7A3))
    code_points = [cp for cp in range(0x110000)
                   if (unicodedata.category(chr(cp)) not in ("Cn", "Co", "Cs")
                       and not any(a <= cp <= b for a, b in cjk)) or cp % 50 == 0]
    code_points += [0xA7DC, 0x11938, 0x1C89, 0x2B820]  # the Rust/Python table differences
    texts = [f"a{chr(cp)}b" for cp in code_points]
    ours = tokenizer.encode_batch(texts)
    expected = _original_reference_ids(reference, texts)
    mismatches = [hex(cp) for cp, a, b in zip(code_points, ours, expected) if a != b]
    assert not mismatches, f"{len(mismatches)} of {len(texts)} code points differ: {mismatches[:20]}"


def test_vocab_errors_are_one_line(tmp_path, uncased_vocab):
    with pytest.raises(FileNotFoundError, match="vocab file not found: .*nope.txt$"):
        Tokenizer(tmp_path / "nope.txt")
    tokens = uncased_vocab.read_text(encoding="utf-8").split("\n")[:-1]
    cases = {
        "no_mask.txt": ([t for t in tokens if t != "[MASK]"], "lacks the special token\\(s\\) \\[MASK\\]$"),
        "empty.txt": ([], "is empty$"),
        "dup.txt": (tokens + ["the"], "duplicate token 'the' on lines 1997 and 30523$"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_text("".join(t + "\n" for t in content), encoding="utf-8")
        with pytest.raises(ValueError, match=f"^vocab file {re.escape(str(path))} .*{message}") as e:
            Tokenizer(path)
        assert "\n" not in str(e.value)


def test_api(tokenizer, uncased_vocab):
    assert tokenizer.vocab_size == len(tokenizer.inv_vocab) == len(tokenizer.vocab) == 30522
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id) == (
        0, 100, 101, 102, 103)
    assert tokenizer.vocab_sha256 == "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
    assert all(tokenizer.vocab[t] == i for i, t in enumerate(tokenizer.inv_vocab))
    assert tokenizer.convert_tokens_to_ids(["hello", "##ing", "not-a-token"]) == [7592, 2075, 100]
    assert tokenizer.convert_ids_to_tokens([101, 7592, 102]) == ["[CLS]", "hello", "[SEP]"]
    with pytest.raises(IndexError):
        tokenizer.convert_ids_to_tokens([30522])
    texts = ["Hello world.", "", "Unaffable café!"]
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(t) for t in texts]
    for bad in (b"bytes", None, 3):
        with pytest.raises(TypeError, match="^text must be str"):
            tokenizer.encode(bad)
    with pytest.raises(TypeError, match=r"^texts\[1\] must be str, got int"):
        tokenizer.encode_batch(["ok", 1])
    with pytest.raises(TypeError, match="^texts must be a sequence of str"):
        tokenizer.encode_batch("not a list")
    clone = pickle.loads(pickle.dumps(tokenizer))
    assert clone.encode("Unaffable café!") == tokenizer.encode("Unaffable café!")
    assert (clone.vocab_sha256, clone.do_lower_case, clone.vocab_file) == (
        tokenizer.vocab_sha256, True, str(uncased_vocab))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40) | st.text(st.sampled_from(
    "aZé e\u0301ΣΟß中Ⅻ !.,-'\"#$[]\u00a0\u3000\t\n\x00\x01\u200b\ufffd\ue000\u0378İ\u212a\ufb01\u0345\u1fef🤗"),
    max_size=40))
def test_fuzz_matches_reference(tokenizer, reference, text):
    assert [tokenizer.encode(text)] == _original_reference_ids(reference, [text])


@given(texts=st.lists(st.text(alphabet=st.characters(max_codepoint=127), max_size=300), max_size=8),
       lower=st.booleans())
@settings(max_examples=150, deadline=None)
def test_ascii_fast_path_equals_the_rust_pipeline(texts, lower, uncased_vocab):
    """encode_batch's ASCII fast path gives exactly the ids of the full pipeline (encode)."""
    tok = _FAST_PATH_TOKENIZERS.setdefault(lower, Tokenizer(uncased_vocab, do_lower_case=lower))
    texts = texts + ["A" * 101 + " ok", "x" * 100, "tab\there\x0bvt\x7fdel", "[MASK] can't stop"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


_FAST_PATH_TOKENIZERS: dict = {}


@given(texts=st.lists(st.one_of(st.text(alphabet=st.characters(max_codepoint=127), max_size=80),
                                st.text(max_size=40)), max_size=10))
@settings(max_examples=200, deadline=None)
def test_encode_batch_flat_equals_encode_batch(texts, uncased_vocab):
    tok = _FAST_PATH_TOKENIZERS.setdefault(True, Tokenizer(uncased_vocab, do_lower_case=True))
    ids, lengths = tok.encode_batch_flat(texts)
    expected = tok.encode_batch(texts)
    assert lengths.tolist() == [len(e) for e in expected]
    assert ids.dtype.name == "int32" and ids.tolist() == [i for e in expected for i in e]
