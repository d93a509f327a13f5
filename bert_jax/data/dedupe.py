"""Exact de-duplication of a corpus (`--dedupe=lines|documents` of create_pretraining_data): a line (a
sentence, in the `sentences` input format a line) or a document that occurred before anywhere in the corpus,
in corpus order, is dropped and counted (`corpus.ReadStats.repeated_lines` / `repeated_documents`, in
metadata.json's "skipped"); a document left without a line is dropped as a repeated document.

Texts are compared by a 128-bit BLAKE2b digest of their UTF-8 bytes (`key`: a collision is as likely as
guessing a random 128-bit number). One process (`first_seen`) keeps the set of digests seen, about 100 bytes
of memory per distinct line or document; Apache Beam (`bert_jax.data.pretraining.beam_pipeline`) groups the digests
with their places instead and drops all but the first place of each, which gives the same output.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator

MODES = ("none", "lines", "documents")


def key(text: str) -> bytes:
    """The 16-byte digest texts are compared by."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def _document_key(document: list[str]) -> bytes:
    return key("\n".join(document))


def keys(documents: Iterable[list[str]], mode: str) -> Iterator[tuple[tuple[int, ...], bytes]]:
    """(place, digest) of every line ((document, sentence) places) or document ((document,) places) of
    `documents` (documents counted from 0 in the order given), as `drop_repeats` checks them."""
    for d, document in enumerate(documents):
        if mode == "documents":
            yield (d,), _document_key(document)
        elif mode == "lines":
            for s, sentence in enumerate(document):
                yield (d, s), key(sentence)


def first_seen() -> Callable[[tuple[int, ...], bytes], bool]:
    """An `is_repeat` for `drop_repeats` in one process: True for a digest it was given before."""
    seen: set[bytes] = set()

    def is_repeat(place, digest):
        if digest in seen:
            return True
        seen.add(digest)
        return False

    return is_repeat


def drop_repeats(documents: Iterable[list[str]], mode: str, is_repeat: Callable[[tuple[int, ...], bytes], bool],
                 stats) -> Iterator[list[str]]:
    """`documents` without the lines or documents `is_repeat(place, digest)` calls repeats (places and
    digests as `keys`); mode "none" passes them through. Counts what it drops in `stats` (a
    `corpus.ReadStats`: repeated_lines, repeated_documents; its `dedupe` set to `mode`).

    Raises:
      ValueError: a mode not in MODES.
    """
    if mode not in MODES:
        raise ValueError(f"--dedupe={mode!r} is not one of {', '.join(MODES)}")
    if mode == "none":
        yield from documents
        return
    stats.dedupe = mode
    for d, document in enumerate(documents):
        if mode == "documents":
            if is_repeat((d,), _document_key(document)):
                stats.repeated_documents += 1
                continue
            yield document
            continue
        kept = [sentence for s, sentence in enumerate(document) if not is_repeat((d, s), key(sentence))]
        stats.repeated_lines += len(document) - len(kept)
        if kept:
            yield kept
        else:
            stats.repeated_documents += 1
