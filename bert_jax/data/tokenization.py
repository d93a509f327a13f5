"""WordPiece tokenization with the semantics of the original BERT release, run by HF `tokenizers`.

Semantics: google-research/bert `tokenization.py` (`BasicTokenizer` + `WordpieceTokenizer`):

1. Remove U+0000, U+FFFD and control characters (categories Cc and Cf, except tab, newline and
   carriage return); map whitespace (space, tab, newline, carriage return, category Zs) to a space.
2. If `do_lower_case`: lowercase, NFD-decompose and drop non-spacing marks (category Mn), so
   "Café" -> "cafe".
3. Split on whitespace; isolate every punctuation character (any category P*, plus all non-alphanumeric
   ASCII such as "$" and "^") and every CJK ideograph as a word of its own.
4. WordPiece: greedy longest-match-first over the vocabulary, "##" marking a piece that continues a
   word; a word that cannot be covered, or that is longer than 100 characters, becomes one [UNK].

Special-token text is not special: the literal text "[MASK]" is tokenized as "[", "mask", "]" (as the
original, which matches no added tokens inside raw text). No [CLS]/[SEP] are added here.

Implementation: a `tokenizers.Tokenizer` (Rust, parallel `encode_batch`, character offsets into the
input) with a `models.WordPiece` model. Its stock `BertNormalizer`/`BertPreTokenizer` implement the
same steps but with the Rust library's own Unicode tables (with tokenizers 0.22 and Python 3.11, about
380 non-spacing marks, 100 punctuation marks, 13 format characters and the 256 CJK ideographs
U+2B820..U+2B91F are classified differently from Python's `unicodedata`) and remove private-use
characters, which the original keeps. The normalizer and
pre-tokenizer are therefore assembled from `Replace`/`Split` steps whose character classes are
computed from Python's `unicodedata`, i.e. from the same tables the original consults. Only lowercasing
and NFD use the Rust tables; the few characters where they differ from Python's (code points that are
unassigned in Python's Unicode version, U+11938) and lone surrogates (which Rust strings cannot hold)
are replaced one-for-one by the noncharacter U+FFFF before encoding: all of them, like U+FFFF, can only
end up inside a word that becomes [UNK], and the replacement keeps every offset valid.

Known differences from other implementations (all on text that real corpora do not contain):
- transformers' slow `BertTokenizer` matches special tokens in raw text unless `split_special_tokens=True`,
  removes every category-C character (also private-use Co and unassigned Cn, which the original and
  this module keep, so their words become [UNK]) and NFC-composes the text first (which changes results
  only for `do_lower_case=False` on decomposed text, e.g. "e" + U+0301).
- Lowercasing is per character (a word-final capital sigma -> "σ"), as in transformers (which lowercases
  character by character before its BasicTokenizer) and HF tokenizers, and as in the original under
  Python 2 (no final-sigma rule in `unicode.lower()`); the original under Python 3 gives "ς" there.
- The original `WordpieceTokenizer` turns words over 200 characters into [UNK]; this module, like
  transformers, uses 100.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import sys
import unicodedata
from typing import Iterable, Sequence

import numpy as np
import tokenizers
from tokenizers import Regex, models, normalizers, pre_tokenizers

from bert_jax import storage

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_INPUT_CHARS_PER_WORD = 100
# The noncharacter that stands in for characters the Rust library cannot normalise as Python does.
_STAND_IN = "\uffff"
# ASCII fast path: control characters (Cc: 0-31 and 127, but tab, newline, carriage return) are
# removed; words are runs of letters/digits or single punctuation characters (all printable ASCII
# that is not alphanumeric is punctuation to the original).
_ASCII_CONTROL = {c: None for c in [*range(0, 9), 11, 12, *range(14, 32), 127]}
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")
_ASCII_CONTROL_KEEP_NUL = {c: None for c in _ASCII_CONTROL if c != 0}
_ASCII_WORD_OR_NUL = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]|\x00")
_WORD_CACHE_SIZE = 1_000_000
# google-research/bert BasicTokenizer._is_chinese_char, inclusive ranges.
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


@functools.cache
def _category_runs() -> tuple[tuple[int, int, str], ...]:
    """(first, last, category) runs of Python's `unicodedata` over all code points."""
    cats = (unicodedata.category(chr(cp)) for cp in range(0x110000))
    runs, cp = [], 0
    for cat, group in itertools.groupby(cats):
        n = sum(1 for _ in group)
        runs.append((cp, cp + n - 1, cat))
        cp += n
    return tuple(runs)


def _char_class(ranges: Iterable[tuple[int, int]], exclude: str = "") -> str:
    """An Oniguruma character class for inclusive code point `ranges`, minus the characters `exclude`."""
    def hx(cp: int) -> str:
        return "\\x{%X}" % cp

    body = "".join(hx(a) if a == b else f"{hx(a)}-{hx(b)}" for a, b in ranges)
    if exclude:
        return f"[[{body}]&&[^{''.join(hx(ord(c)) for c in exclude)}]]"
    return f"[{body}]"


def _ranges(categories: Iterable[str]) -> list[tuple[int, int]]:
    """Inclusive code point ranges of the given Python `unicodedata` categories."""
    categories = set(categories)
    return [(a, b) for a, b, cat in _category_runs() if cat in categories]


def _disk_cached(name: str, compute):
    """`compute()` (JSON-able), cached in ~/.cache/bert_jax (or $BERT_JAX_CACHE) per Python, Unicode and
    tokenizers version: the Unicode tables below cost about a second per process to derive. The
    cache is only an accelerator: unreadable or unwritable, the value is computed."""
    key = f"{name}-py{sys.version_info[0]}.{sys.version_info[1]}-unicode{unicodedata.unidata_version}-" \
          f"tokenizers{tokenizers.__version__}.json"
    directory = os.environ.get("BERT_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "bert_jax"))
    path = os.path.join(directory, key)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    value = compute()
    try:
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(value, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return value


@functools.cache
def _unicode_classes() -> dict[str, str]:
    return _disk_cached("unicode-classes", _compute_unicode_classes)


def _compute_unicode_classes() -> dict[str, str]:
    """Character classes of the original BasicTokenizer, from Python's `unicodedata`.

    control: removed (`_clean_text`: U+0000, U+FFFD, `_is_control` = Cc or Cf but not \\t \\n \\r).
    whitespace: mapped to " " (`_is_whitespace` = space \\t \\n \\r or Zs), plus the line and paragraph
      separators Zl/Zp, which `str.split()` in `whitespace_tokenize` also splits on (its other extra
      whitespace characters are Cc, removed before).
    mark: category Mn, dropped after NFD when lowercasing (`_run_strip_accents`).
    isolated: punctuation (`_is_punctuation`: ASCII 33-47, 58-64, 91-96, 123-126, or category P*) and
      CJK ideographs (`_is_chinese_char`), each made a word of its own.
    """
    ascii_punct = [(33, 47), (58, 64), (91, 96), (123, 126)]
    punct = _ranges(c for _, _, c in _category_runs() if c.startswith("P"))
    return {
        "control": _char_class(sorted(_ranges(["Cc", "Cf"]) + [(0xFFFD, 0xFFFD)]), exclude="\t\n\r"),
        "whitespace": _char_class(sorted(_ranges(["Zs", "Zl", "Zp"]) + [(9, 10), (13, 13)])),
        "mark": _char_class(_ranges(["Mn"])),
        "isolated": _char_class(sorted(ascii_punct + punct + list(_CJK_RANGES))),
    }


def _python_case_fold(char: str) -> str:
    """The original's lowercasing + accent stripping of one character (`_run_strip_accents(c.lower())`)."""
    return "".join(c for c in unicodedata.normalize("NFD", char.lower()) if unicodedata.category(c) != "Mn")


@functools.cache
def _rust_disagreements() -> frozenset[str]:
    return frozenset(_disk_cached("rust-disagreements", lambda: sorted(_compute_rust_disagreements())))


def _compute_rust_disagreements() -> frozenset[str]:
    """Characters that the Rust Lowercase + NFD maps differently from Python's `lower()` + NFD.

    Computed once per process by running both over every code point (about 0.6 s). With tokenizers
    0.22 and Python 3.11 (Unicode 14): 55 code points unassigned in Unicode 14 that newer Unicode
    versions give a lowercase mapping, and U+11938 (decomposed since Unicode 13).
    """
    rust = normalizers.Sequence([normalizers.Lowercase(), normalizers.NFD()])
    chars = [chr(cp) for cp in range(1, 0x110000) if not 0xD800 <= cp <= 0xDFFF]
    # U+0000 separates the characters: both leave it alone, and it gives no casing context (so no
    # final sigma).
    joined = "\0".join(chars)
    ours = rust.normalize_str(joined).split("\0")
    python = unicodedata.normalize("NFD", joined.lower()).split("\0")
    assert len(ours) == len(python) == len(chars)
    return frozenset(c for c, a, b in zip(chars, ours, python) if a != b)


def _is_word_char(c: str) -> bool:
    """Whether the original keeps `c` inside a word: not removed, not whitespace, punctuation or CJK."""
    cp, cat = ord(c), unicodedata.category(c)
    return not (cat in ("Cc", "Cf", "Zs", "Zl", "Zp") or cat.startswith("P") or c.isspace()
                or cp in (0, 0xFFFD) or 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96
                or 123 <= cp <= 126 or any(a <= cp <= b for a, b in _CJK_RANGES))


def normalizer(do_lower_case: bool) -> normalizers.Normalizer:
    """Steps 1-2 of the module docstring: control characters removed, whitespace -> " ", and if
    `do_lower_case` lowercase + NFD + non-spacing marks removed (offsets stay aligned to the input)."""
    classes = _unicode_classes()
    steps = [normalizers.Replace(Regex(classes["control"]), ""),
             normalizers.Replace(Regex(classes["whitespace"]), " ")]
    if do_lower_case:
        steps += [normalizers.Lowercase(), normalizers.NFD(), normalizers.Replace(Regex(classes["mark"]), "")]
    return normalizers.Sequence(steps)


def pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Step 3 of the module docstring, on normalised text: split on " ", isolate punctuation and CJK."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="removed"),
        pre_tokenizers.Split(Regex(_unicode_classes()["isolated"]), behavior="isolated"),
    ])


def _read_vocab(vocab_file: str) -> tuple[list[str], str]:
    """Reads a Google-format vocab.txt (one token per line, id = line number) -> (tokens, sha256 hex).

    Tokens are stripped of surrounding whitespace, as in google-research/bert `load_vocab`.

    Raises:
      FileNotFoundError: no such file.
      ValueError: not UTF-8, empty, a duplicate token, or a missing special token (one line, naming the
        file).
    """
    try:
        data = storage.read_bytes(vocab_file)
    except FileNotFoundError:
        raise FileNotFoundError(f"vocab file not found: {vocab_file}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"vocab file {vocab_file} is not UTF-8: {e}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    tokens = [line.strip() for line in lines]
    if not tokens:
        raise ValueError(f"vocab file {vocab_file} is empty")
    seen: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token in seen:
            raise ValueError(
                f"vocab file {vocab_file} has duplicate token {token!r} on lines {seen[token] + 1} and {i + 1}")
        seen[token] = i
    missing = [t for t in SPECIAL_TOKENS if t not in seen]
    if missing:
        raise ValueError(f"vocab file {vocab_file} lacks the special token(s) {' '.join(missing)}")
    return tokens, hashlib.sha256(data).hexdigest()


class _WordCache(dict):
    """word -> WordPiece ids, filled on first lookup from the WordPiece model."""

    def __init__(self, model: models.WordPiece):
        super().__init__()
        self.model = model

    def __missing__(self, word: str) -> list[int]:
        ids = self[word] = [t.id for t in self.model.tokenize(word)]
        return ids


def _check_str(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, got {type(value).__name__}")
    return value


class Tokenizer:
    """BERT WordPiece tokenizer over a Google-format vocab.txt (see the module docstring).

    Attributes:
      vocab_file: the path it was built from.
      do_lower_case: lowercase and strip accents (uncased models) or keep text as is (cased models).
      vocab: token -> id, in file order.
      inv_vocab: id -> token.
      vocab_size: number of tokens (lines).
      pad_id, unk_id, cls_id, sep_id, mask_id: ids of [PAD] [UNK] [CLS] [SEP] [MASK].
      vocab_sha256: sha256 hex digest of the vocab file's bytes.

    Picklable: the pickle holds the tokens, not the Rust object, and is rebuilt on load (for
    multiprocessing workers).

    Raises (constructor):
      FileNotFoundError: `vocab_file` does not exist.
      ValueError: the vocabulary is empty, not UTF-8, has a duplicate token or lacks one of
        [PAD] [UNK] [CLS] [SEP] [MASK].
    """

    def __init__(self, vocab_file: str, do_lower_case: bool = True):
        vocab_file = os.fspath(vocab_file)
        tokens, sha256 = _read_vocab(vocab_file)
        self._setup(vocab_file, bool(do_lower_case), tokens, sha256)

    def _setup(self, vocab_file: str, do_lower_case: bool, tokens: list[str], sha256: str):
        self.vocab_file = vocab_file
        self.do_lower_case = do_lower_case
        self.inv_vocab = list(tokens)
        self.vocab = {t: i for i, t in enumerate(tokens)}
        self.vocab_size = len(tokens)
        self.vocab_sha256 = sha256
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self.vocab[t] for t in SPECIAL_TOKENS)
        # The WordPiece model alone serves the ASCII fast path; the full pipeline (whose Unicode
        # tables cost about a second to build) is built on first use, i.e. on the first non-ASCII text.
        self._wordpiece = self._wordpiece_model()
        self._word_cache = _WordCache(self._wordpiece)

    def _wordpiece_model(self) -> models.WordPiece:
        return models.WordPiece(self.vocab, unk_token="[UNK]", max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)

    @functools.cached_property
    def _tokenizer(self) -> tokenizers.Tokenizer:
        tok = tokenizers.Tokenizer(self._wordpiece_model())
        tok.normalizer = normalizer(self.do_lower_case)
        tok.pre_tokenizer = pre_tokenizer()
        return tok

    @functools.cached_property
    def _stand_in_pattern(self) -> re.Pattern:
        """Lone surrogates, plus (when lowercasing) the characters the Rust tables map differently.

        A character is replaced only when it cannot change the tokens: Python maps it to a non-empty
        string of characters that no vocabulary token contains and that are not whitespace, punctuation
        or CJK, so its word becomes [UNK] either way, exactly as with U+FFFF.
        """
        chars = "\ud800-\udfff"
        if self.do_lower_case:
            vocab_chars = set("".join(self.inv_vocab))
            for c in sorted(_rust_disagreements()):
                folded = _python_case_fold(c)
                if folded and not (set(folded) & vocab_chars) and all(_is_word_char(x) for x in folded):
                    chars += re.escape(c)
        return re.compile(f"[{chars}]")

    def __getstate__(self):
        return {"vocab_file": self.vocab_file, "do_lower_case": self.do_lower_case,
                "tokens": self.inv_vocab, "vocab_sha256": self.vocab_sha256}

    def __setstate__(self, state):
        self._setup(state["vocab_file"], state["do_lower_case"], state["tokens"], state["vocab_sha256"])

    def __repr__(self):
        return (f"Tokenizer({self.vocab_file!r}, do_lower_case={self.do_lower_case}, "
                f"vocab_size={self.vocab_size})")

    def _prepare(self, text: str) -> str:
        """Replaces the characters of `_stand_in_pattern` by U+FFFF (same length, same offsets)."""
        if not text.isascii() and self._stand_in_pattern.search(text):
            return self._stand_in_pattern.sub(_STAND_IN, text)
        return text

    def _encode(self, text: str) -> tokenizers.Encoding:
        return self._tokenizer.encode(self._prepare(_check_str("text", text)), add_special_tokens=False)

    def tokenize(self, text: str) -> list[str]:
        """text -> WordPiece tokens, e.g. "Unaffable!" -> ["una", "##ffa", "##ble", "!"] (uncased BERT).

        Raises:
          TypeError: `text` is not a str (e.g. bytes).
        """
        return self._encode(text).tokens

    def encode(self, text: str) -> list[int]:
        """text -> token ids (ints in [0, vocab_size)), no special tokens added.

        Raises:
          TypeError: `text` is not a str (e.g. bytes).
        """
        return self._encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (no special tokens).

        ASCII texts (nearly all of an English corpus) take a fast path with the same result: on ASCII
        the original's BasicTokenizer reduces to "drop control characters, lowercase when uncased, words
        are runs of letters and digits, every other printable character is a word of its own", and each
        distinct word's WordPiece ids come from the Rust tokenizer once, then from a cache. Other texts
        are encoded in parallel by the Rust library (the speed against the Rust library alone:
        benchmarks/README.md, benchmarks/create_pretraining_data.py).

        Raises:
          TypeError: `texts` is a single str or not iterable, or an element is not a str (named by index).
        """
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of str, got a single str")
        out: list[list[int] | None] = []
        others: list[int] = []
        for i, text in enumerate(texts):
            if _check_str(f"texts[{i}]", text).isascii():
                out.append(self._encode_ascii(text))
            else:
                out.append(None)
                others.append(i)
        if others:
            prepared = [self._prepare(texts[i]) for i in others]
            for i, e in zip(others, self._tokenizer.encode_batch(prepared, add_special_tokens=False)):
                out[i] = e.ids
        return out

    def encode_batch_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Bulk form of `encode_batch` for corpus building: (ids int32 [T], lengths int64 [N]) where
        ids concatenates the ids of all N texts and lengths[i] counts text i's tokens.

        The ASCII texts are tokenized in one pass over their joined text (no per-text Python work), the
        others by the Rust library; same ids as `encode_batch`.

        Raises:
          TypeError: `texts` is a single str or not iterable, or an element is not a str (named by index).
        """
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of str, got a single str")
        for i, text in enumerate(texts):
            _check_str(f"texts[{i}]", text)
        # U+0000 separates the joined texts; the original removes it, so texts holding it go the slow way.
        fast = np.fromiter((t.isascii() and "\0" not in t for t in texts), bool, len(texts))
        fast_ids, fast_lengths = self._encode_ascii_joined([t for t, f in zip(texts, fast) if f])
        others = self.encode_batch([t for t, f in zip(texts, fast) if not f])
        other_lengths = np.fromiter(map(len, others), np.int64, len(others))
        lengths = np.empty(len(texts), np.int64)
        lengths[fast], lengths[~fast] = fast_lengths, other_lengths
        if not len(others):
            return fast_ids, lengths
        combined = np.concatenate([fast_ids, np.fromiter(itertools.chain.from_iterable(others), np.int32)])
        source_start = np.empty(len(texts), np.int64)  # where each text's ids start in `combined`
        source_start[fast] = np.cumsum(fast_lengths) - fast_lengths
        source_start[~fast] = len(fast_ids) + np.cumsum(other_lengths) - other_lengths
        out_start = np.cumsum(lengths) - lengths
        index = np.repeat(source_start - out_start, lengths) + np.arange(int(lengths.sum()))
        return combined[index], lengths

    def _encode_ascii_joined(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """ASCII texts free of U+0000 -> (ids int32 [T], lengths int64 [N]) in one regex pass."""
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        text = "\0".join(texts).translate(_ASCII_CONTROL_KEEP_NUL)
        if self.do_lower_case:
            text = text.lower()
        words = _ASCII_WORD_OR_NUL.findall(text)
        words.append("\0")
        if len(self._word_cache) > _WORD_CACHE_SIZE:
            self._word_cache.clear()
        self._word_cache["\0"] = [-1]  # end-of-text marker; no real id is negative
        flat = np.fromiter(itertools.chain.from_iterable(map(self._word_cache.__getitem__, words)), np.int32)
        ends = np.flatnonzero(flat < 0)
        lengths = np.diff(ends, prepend=-1) - 1
        return flat[flat >= 0], lengths.astype(np.int64)

    def _encode_ascii(self, text: str) -> list[int]:
        """The ASCII fast path of `encode_batch` (same ids as `encode`)."""
        text = text.translate(_ASCII_CONTROL)
        if self.do_lower_case:
            text = text.lower()
        if len(self._word_cache) > _WORD_CACHE_SIZE:
            self._word_cache.clear()
        return list(itertools.chain.from_iterable(map(self._word_cache.__getitem__, _ASCII_WORD.findall(text))))

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """text -> (ids, offsets): offsets[i] = (start, end) character span of token i in `text`.

        Spans index the original string (`text[start:end]`), so they include accents and other
        characters that normalisation changed; a "##" piece spans only its own characters. Characters
        that normalisation removes (control characters, a combining accent after its letter in
        decomposed text) may lie outside every span.

        Raises:
          TypeError: `text` is not a str (e.g. bytes).
        """
        enc = self._encode(text)
        return enc.ids, [tuple(o) for o in enc.offsets]

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        """Token strings -> ids; a token not in the vocabulary -> unk_id."""
        return [self.vocab.get(t, self.unk_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        """Ids -> token strings.

        Raises:
          IndexError: an id outside [0, vocab_size).
        """
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise IndexError(f"token id {i} is outside [0, {self.vocab_size})")
            out.append(self.inv_vocab[i])
        return out
