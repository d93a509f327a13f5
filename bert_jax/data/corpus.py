"""Reading text corpora: input globs, the original one-sentence-per-line format, plain text, TFDS.

Documents are yielded as lists of sentence strings, streaming (one document in memory at a time).
Lines that are not valid UTF-8 are skipped and counted (`ReadStats`), never silently dropped.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from typing import Iterator, Sequence

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")



def split_sentences(text: str) -> list[str]:
    """Splits plain text into sentences after . ! ? followed by space and a capital, digit or quote."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def expand_input_files(patterns: str | Sequence[str]) -> list[str]:
    """Comma-separated globs (or a list of them) -> sorted, de-duplicated file paths.

    Raises:
      ValueError: a pattern matches no file, or no pattern is given.
    """
    if isinstance(patterns, str):
        patterns = patterns.split(",")
    files = []
    for pattern in (p.strip() for p in patterns):
        if not pattern:
            continue
        matched = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
        if not matched:
            raise ValueError(f"--input_file: {pattern!r} matches no file")
        files += matched
    if not files:
        raise ValueError("--input_file: no files given")
    return list(dict.fromkeys(files))


@dataclasses.dataclass
class ReadStats:
    """Counts of what reading skipped (documented skips, never silent)."""

    lines: int = 0
    invalid_utf8_lines: int = 0
    empty_sentences: int = 0


def _blocks(path: str, stats: ReadStats) -> Iterator[list[str]]:
    """Runs of non-blank lines (stripped) of one file; lines that are not UTF-8 are counted, skipped."""
    block: list[str] = []
    with open(path, "rb") as f:
        for raw in f:
            stats.lines += 1
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                stats.invalid_utf8_lines += 1
                continue
            if line:
                block.append(line)
            elif block:
                yield block
                block = []
    if block:
        yield block


def read_sentence_documents(files: Sequence[str], stats: ReadStats) -> Iterator[list[str]]:
    """The original format: one sentence per line, a blank line between documents.

    Yields documents as lists of sentence strings. Lines that are not valid UTF-8 are skipped and
    counted in `stats.invalid_utf8_lines`. Each file also ends a document.
    """
    for path in files:
        yield from _blocks(path, stats)


def read_text_documents(files: Sequence[str], stats: ReadStats) -> Iterator[list[str]]:
    """Plain text: each file is one document; paragraphs (blank-line separated) are split into
    sentences with `split_sentences`. Invalid UTF-8 lines are skipped and counted."""
    for path in files:
        document = [s for block in _blocks(path, stats) for s in split_sentences(" ".join(block))]
        if document:
            yield document


def read_tfds_documents(name: str, split: str, text_key: str, data_dir: str | None,
                        stats: ReadStats) -> Iterator[list[str]]:
    """A TFDS text dataset (e.g. `wikipedia/20230601.en`, key `text`): one example = one document,
    paragraphs split into sentences. Uses `tfds.data_source` (random access, no TensorFlow)."""
    import tensorflow_datasets as tfds

    source = tfds.data_source(name, split=split, data_dir=data_dir)
    for i in range(len(source)):
        example = source[i]
        if text_key not in example:
            raise ValueError(f"--tfds_text_key {text_key!r} is not a feature of {name} (has {sorted(example)})")
        text = example[text_key]
        text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)
        stats.lines += 1
        document = [s for p in text.split("\n") for s in split_sentences(p)]
        if document:
            yield document
