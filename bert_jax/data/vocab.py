"""Trains a BERT WordPiece vocabulary (Google vocab.txt format) with SentencePiece.

Usage:
  python -m bert_jax.data.vocab --input_file='corpus/gutenberg/*.txt' --vocab_size=8000 \\
      --output_file=vocab.txt [--nodo_lower_case] [--max_sentences=N]
  python -m bert_jax.data.vocab --tfds_name=wikipedia/20230601.en [--tfds_split=train] \\
      [--tfds_text_key=text] [--tfds_data_dir=DIR] --vocab_size=30522 --output_file=vocab.txt

`--input_file` is a comma-separated list of globs; every non-empty line is text (UTF-8; lines that are
not, or hold NUL bytes, are skipped, and a file with too many of them is refused: `corpus.text_lines`).
`--tfds_name` (with create_pretraining_data's flags and reader, `corpus.read_tfds_documents`) reads a
TFDS text dataset instead: each example one document, its paragraphs split into sentences, each sentence a
line; the same sentences written one a line to a file give the same vocabulary. Give exactly one of the two.
Prints the statistics as JSON.

Method. Google never released its WordPiece trainer; this builds an equivalent vocabulary:
1. The text goes through the tokenizer's own normalisation and pre-tokenisation
   (`tokenization.normalizer`, `tokenization.pre_tokenizer`: lowercasing and accent stripping if
   `do_lower_case`, punctuation and CJK characters split off), so that every word SentencePiece sees is
   a word the Tokenizer will look up, and no piece crosses punctuation or whitespace.
2. SentencePiece (BPE by default, or unigram) learns sub-word pieces within those words. A piece that
   starts a word ("▁the") becomes "the"; one inside a word ("ing") becomes "##ing".
3. Vocabulary = [PAD] [UNK] [CLS] [SEP] [MASK], then every printable ASCII character and every other
   character seen at least `min_char_count` times, both word-initial ("q") and continuation ("##q"), so any word made of such characters can be
   tokenized without [UNK], then the SentencePiece pieces in SentencePiece's order (most useful first)
   until exactly `vocab_size` lines; if SentencePiece learns too few, "[unused0]"... fill the rest.

Words longer than 100 characters are skipped (the Tokenizer maps them to [UNK] whatever the vocabulary).

Training time, [UNK] rate and tokens per word on held-out text: benchmarks/README.md.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import tempfile
import time
from typing import Callable, Iterator, Sequence

import sentencepiece as spm
from absl import app, flags

from bert_jax import errors
from bert_jax.data import corpus as corpus_files
from bert_jax.data import tokenization

_SENTENCE_CHARS = 2000  # words are packed into "sentences" of about this many characters
_MAX_TRAINING_SENTENCES = 2_000_000  # SentencePiece samples this many when given more
_SEED = 12345


def _file_lines(files: Sequence[str]) -> Callable[[corpus_files.ReadStats], Iterator[str]]:
    """The lines of `files` in order (`corpus.text_lines`), line endings kept."""
    return lambda stats: (line for path in files for line in corpus_files.text_lines(path, stats))


def _tfds_lines(name: str, split: str, text_key: str, data_dir: str | None
                ) -> Callable[[corpus_files.ReadStats], Iterator[str]]:
    """The sentences of a TFDS text dataset as create_pretraining_data reads them
    (`corpus.read_tfds_documents`), each as a line ending in "\\n"."""
    return lambda stats: (sentence + "\n" for document in
                          corpus_files.read_tfds_documents(name, split, text_key, data_dir, stats)
                          for sentence in document)


class _Corpus:
    """The input (`read_lines(stats)` -> its lines, line endings kept), read in two streaming passes
    (character counts, then pre-tokenized words)."""

    def __init__(self, read_lines: Callable[[corpus_files.ReadStats], Iterator[str]], do_lower_case: bool,
                 max_sentences: int | None):
        self.read_lines, self.max_sentences = read_lines, max_sentences
        self.normalizer = tokenization.normalizer(do_lower_case)
        self.pre_tokenizer = tokenization.pre_tokenizer()
        self.char_counts: collections.Counter[str] = collections.Counter()
        self.lines = self.words = 0
        self.read_stats = corpus_files.ReadStats()

    def _line_batches(self, batch: int = 1000) -> Iterator[list[str]]:
        lines: list[str] = []
        for line in self.read_lines(self.read_stats):
            if not line.strip():
                continue
            if self.max_sentences is not None and self.lines >= self.max_sentences:
                break
            self.lines += 1
            lines.append(line)
            if len(lines) == batch:
                yield lines
                lines = []
        if lines:
            yield lines

    def count_characters(self) -> None:
        """First pass: counts every character of the normalised text (spaces excluded)."""
        for lines in self._line_batches():
            self.char_counts.update(self.normalizer.normalize_str("".join(lines)))
        del self.char_counts[" "]

    def sentences(self) -> Iterator[str]:
        """Second pass: the words, packed into sentences of about _SENTENCE_CHARS characters."""
        self.lines = self.words = 0
        for lines in self._line_batches():
            text = self.normalizer.normalize_str("".join(lines))
            words = [w for w, _ in self.pre_tokenizer.pre_tokenize_str(text)
                     if len(w) <= tokenization.MAX_INPUT_CHARS_PER_WORD]
            self.words += len(words)
            start, size = 0, 0
            for i, word in enumerate(words):
                size += len(word) + 1
                if size >= _SENTENCE_CHARS or i == len(words) - 1:
                    yield " ".join(words[start:i + 1])
                    start, size = i + 1, 0


def _wordpiece(piece: str) -> str | None:
    """SentencePiece piece -> WordPiece token: "▁the" -> "the", "ing" -> "##ing", "▁" -> None."""
    if piece.startswith("\u2581"):
        return piece[1:] or None
    return None if "\u2581" in piece else "##" + piece


def train_vocab(input_files: str | Sequence[str] | None, vocab_size: int, output_file: str, do_lower_case: bool = True,
                max_sentences: int | None = None, min_char_count: int = 2, model_type: str = "bpe", *,
                tfds_name: str | None = None, tfds_split: str = "train", tfds_text_key: str = "text",
                tfds_data_dir: str | None = None) -> dict:
    """Trains a vocabulary of exactly `vocab_size` tokens and writes it atomically to `output_file`.

    Args:
      input_files: paths or globs of UTF-8 text files (a list, or one comma-separated string); None or empty
        with `tfds_name`.
      vocab_size: number of lines of the vocabulary written.
      output_file: the vocab.txt to write (its folder must exist).
      do_lower_case: lowercase and strip accents first (uncased vocabulary), as the Tokenizer will.
      max_sentences: read at most this many non-empty lines (all if None).
      min_char_count: characters seen fewer times are left out.
      model_type: SentencePiece model, "bpe" or "unigram".
      tfds_name, tfds_split, tfds_text_key, tfds_data_dir: a prepared TFDS text dataset instead of files
        (create_pretraining_data's --tfds_* flags, read by `corpus.read_tfds_documents`: one example one
        document, paragraphs split into sentences, each sentence a line).

    Returns:
      statistics: files (0 for TFDS), tfds_name (None for files), lines, words, characters (kept),
      characters_dropped, pieces (SentencePiece pieces used), unused (filler tokens), vocab_size, seconds,
      sha256 of the file written.

    Raises:
      ValueError: neither or both of input_files and tfds_name, no input file matches, a file is not text
        (`corpus.text_lines`), an unknown TFDS dataset, split or text key (`corpus.tfds_source`), the corpus
        has no words, `vocab_size` is too small for the special tokens and two entries per character, or a
        bad argument. One line each.
    """
    start = time.perf_counter()
    if model_type not in ("bpe", "unigram"):
        raise ValueError(f"model_type must be 'bpe' or 'unigram', got {model_type!r}")
    if max_sentences is not None and max_sentences <= 0:
        raise ValueError(f"max_sentences must be positive, got {max_sentences}")
    output_dir = os.path.dirname(os.path.abspath(output_file))
    if not os.path.isdir(output_dir):
        raise ValueError(f"output folder {output_dir} does not exist")
    specials = list(tokenization.SPECIAL_TOKENS)
    if vocab_size < len(specials) + 2:
        raise ValueError(f"vocab_size={vocab_size} is too small")
    if bool(input_files) == bool(tfds_name):
        raise ValueError("give exactly one of --input_file and --tfds_name")
    if tfds_name:
        files, read_lines = [], _tfds_lines(tfds_name, tfds_split, tfds_text_key, tfds_data_dir)
        source = f"the TFDS dataset {tfds_name!r} (split {tfds_split!r}, feature {tfds_text_key!r})"
    else:
        files = corpus_files.expand_input_files(input_files)
        read_lines, source = _file_lines(files), f"the input files ({', '.join(files)})"
    corpus = _Corpus(read_lines, do_lower_case, max_sentences)
    corpus.count_characters()
    if not corpus.char_counts:
        raise ValueError(f"{source} contain{'s' if tfds_name else ''} no text")
    # Printable ASCII is always in (as in Google's vocabularies): text of another domain then meets no
    # [UNK] for a symbol the training corpus happened to lack (e.g. "=" in WikiText after books).
    always = {chr(c) for c in range(33, 127) if not (do_lower_case and chr(c).isupper())}
    chars = sorted((c for c, n in corpus.char_counts.items() if n >= min_char_count or c in always),
                   key=lambda c: (-corpus.char_counts[c], c))
    chars += sorted(always - set(chars))
    needed = len(specials) + 2 * len(chars)
    if vocab_size < needed:
        raise ValueError(f"vocab_size={vocab_size} cannot hold the {len(specials)} special tokens and "
                         f"{len(chars)} characters as word-initial and ## pieces: need at least {needed}")

    spm.set_random_generator_seed(_SEED)
    model = io.BytesIO()
    try:
        _train_sentencepiece(spm, corpus, model, model_type, vocab_size + len(corpus.char_counts) + 8)
    except RuntimeError as e:  # e.g. every word longer than 100 characters
        raise ValueError(f"SentencePiece failed on {source}: {str(e).splitlines()[0]}") from None
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())

    tokens = specials + chars + ["##" + c for c in chars]
    seen = set(tokens)
    pieces = 0
    for i in range(processor.get_piece_size()):
        if len(tokens) == vocab_size:
            break
        if processor.is_unknown(i) or processor.is_control(i):
            continue
        token = _wordpiece(processor.id_to_piece(i))
        if token is not None and token not in seen:
            tokens.append(token)
            seen.add(token)
            pieces += 1
    unused = vocab_size - len(tokens)
    tokens += [f"[unused{i}]" for i in range(unused)]

    data = "".join(t + "\n" for t in tokens).encode("utf-8")
    _write_atomically(output_file, data)
    return {
        "output_file": output_file, "vocab_size": len(tokens), "files": len(files), "tfds_name": tfds_name,
        "lines": corpus.lines,
        "words": corpus.words, "characters": len(chars), "characters_dropped": len(corpus.char_counts) - len(chars),
        "pieces": pieces, "unused": unused, "seconds": round(time.perf_counter() - start, 2),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _train_sentencepiece(spm, corpus: _Corpus, model: io.BytesIO, model_type: str, pieces: int) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=corpus.sentences(), model_writer=model, model_type=model_type,
        vocab_size=pieces, hard_vocab_limit=False, character_coverage=1.0,
        # The text is normalised and split into words already: SentencePiece must not change it.
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        split_by_whitespace=True, max_sentence_length=8 * _SENTENCE_CHARS + 1024,
        input_sentence_size=_MAX_TRAINING_SENTENCES, shuffle_input_sentence=True,
        unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, num_threads=os.cpu_count() or 1, minloglevel=2)


def _write_atomically(path: str, data: bytes) -> None:
    """Writes `data` to a temporary file beside `path`, then renames it over `path`."""
    fd, tmp = tempfile.mkstemp(prefix=".vocab-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _define_flags() -> None:
    """The CLI's flags (defined only when run as a script, so importing this module defines none)."""
    flags.DEFINE_string("input_file", None, "Comma-separated globs of UTF-8 text files, one sentence or paragraph a line.")
    # create_pretraining_data's TFDS flags, read by its reader (corpus.read_tfds_documents).
    flags.DEFINE_string("tfds_name", None, "TFDS text dataset instead of --input_file, e.g. wikipedia/20230601.en.")
    flags.DEFINE_string("tfds_split", "train", "TFDS split.")
    flags.DEFINE_string("tfds_text_key", "text", "TFDS feature holding the document text.")
    flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir (default: TFDS's own).")
    flags.DEFINE_string("output_file", None, "The vocab.txt to write.")
    flags.DEFINE_integer("vocab_size", None, "Number of tokens (lines) of the vocabulary.")
    flags.DEFINE_bool("do_lower_case", True, "Lowercase and strip accents (uncased vocabulary).")
    flags.DEFINE_integer("max_sentences", None, "Read at most this many non-empty lines.")
    flags.DEFINE_integer("min_char_count", 2, "Leave out characters seen fewer times.")
    flags.mark_flags_as_required(["output_file", "vocab_size"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # TFDS logs its registry look-ups at INFO
    FLAGS = flags.FLAGS
    try:
        stats = train_vocab(FLAGS.input_file, FLAGS.vocab_size, FLAGS.output_file, FLAGS.do_lower_case,
                            FLAGS.max_sentences, FLAGS.min_char_count, tfds_name=FLAGS.tfds_name,
                            tfds_split=FLAGS.tfds_split, tfds_text_key=FLAGS.tfds_text_key,
                            tfds_data_dir=FLAGS.tfds_data_dir)
    except errors.USER_ERRORS as e:
        raise errors.exit_with("vocab", e) from None
    print(json.dumps(stats))


if __name__ == "__main__":
    from bert_jax import console

    console.install()
    _define_flags()
    errors.run(main, "vocab")
