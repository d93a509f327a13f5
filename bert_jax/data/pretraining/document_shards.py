"""Tokenized documents on disk: sharded ArrayRecord files, one record per document.

A corpus is tokenized once (`tokenize_documents`; `python -m bert_jax.data.create_pretraining_data
--tokenize_only`) and pre-training instances are drawn from it while training (`bert_jax.data.pretraining.dynamic`),
as NVIDIA's LDDL and paxml do.

Directory layout (`formats`: the names, kind and format version, and the check that a directory is complete):
  documents-{i:05d}-of-{n:05d}.array_record  the documents, one record each
  token_counts.npy  int64 [vocab_size]: occurrences of each token id (the MLM bias's unigram prior)
  vocab.txt         the vocabulary the ids index
  metadata.json     {"kind": "documents", "format_version", "shards", "shard_documents", num_documents,
                    num_sentences, num_tokens, skipped counts, vocab_size, vocab_sha256, do_lower_case,
                    seconds, the source}; written last: its presence marks a complete directory.

Record (little-endian int32): [num_sentences, sentence_lengths[num_sentences], token ids[sum of lengths]].

Document order: the corpus's j-th kept document (sentences without a token and documents left without a
sentence are dropped and counted in metadata "skipped") is record j // n of shard j % n, so document indices follow the corpus whatever the
shard count, and a shard never has to hold a document whole in memory but its own record. Tokenization
runs in `num_workers` processes on batches of documents, written in corpus order: the output depends on
the corpus, vocabulary and shard count only. Memory is bounded by the batches in flight (2 per worker),
not by the corpus. A document is one record however long (a book of a million tokens is a 4 MB record),
so no document is split between shards.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import shutil
import time
from typing import Any, Iterable, Iterator

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from bert_jax import storage
from bert_jax.data import corpus
from bert_jax.data.pretraining import formats

# Sentences tokenized per unit of work (one batch of whole documents).
BATCH_SENTENCES = 20000
# Tokens of decoded documents `Documents` keeps (most recently used first): a book-length document is read
# again for many NotNext segments.
CACHE_TOKENS = 1 << 24


def shard_names(num_shards: int) -> list[str]:
    """The shard file names `documents-{i:05d}-of-{num_shards:05d}.array_record`, in order."""
    return [f"documents-{i:05d}-of-{num_shards:05d}.array_record" for i in range(num_shards)]


def encode_document(tokens: np.ndarray, lengths: np.ndarray) -> bytes:
    """One document -> record bytes. tokens: int [T] ids of all its sentences; lengths: int [S] tokens per
    sentence, summing to T (not checked here: `_tokenize_batch` builds both)."""
    return b"".join([np.asarray([len(lengths)], "<i4").tobytes(), np.asarray(lengths, "<i4").tobytes(),
                     np.asarray(tokens, "<i4").tobytes()])


def decode_document(record: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Record bytes -> (tokens int32 [T], sentence_starts int64 [S + 1]: sentence s is
    tokens[starts[s]:starts[s + 1]]).

    Raises:
      ValueError: a record whose sizes do not add up (a corrupt file).
    """
    values = np.frombuffer(record, "<i4")
    num_sentences = int(values[0]) if len(values) else -1
    lengths = values[1 : 1 + num_sentences]
    if num_sentences < 1 or len(lengths) != num_sentences or (lengths < 1).any() or (
            1 + num_sentences + int(lengths.sum()) != len(values)):
        raise ValueError(f"a document record of {len(record)} bytes is malformed")
    starts = np.zeros(num_sentences + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    tokens = values[1 + num_sentences :].astype(np.int32)
    tokens.flags.writeable = starts.flags.writeable = False  # `Documents` shares them through its cache
    return tokens, starts


# ----------------------------------------------------------------------------- writing

# The ArrayRecord writer options of document shards (part of their bytes).
WRITER_OPTIONS = "group_size:1,uncompressed"

_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer) -> None:
    _WORKER["tokenizer"] = tokenizer


def tokenize_batch(tokenizer, batch: list[list[str]]) -> tuple[list[bytes | None], int, int, np.ndarray]:
    """Documents (lists of sentence strings) -> (one record per document (`encode_document`), None for a
    document left without a sentence holding a token; sentences dropped as empty; sentences kept; token ids'
    counts int64 [vocab_size]). A document's record does not depend on the batch it is in.

    Raises:
      TypeError: a sentence that is not a str (from the tokenizer).
    """
    flat, lengths = tokenizer.encode_batch_flat([s for document in batch for s in document])
    records, dropped, kept_sentences = [], 0, 0
    token_start = sentence = 0
    for document in batch:
        doc_lengths = lengths[sentence : sentence + len(document)]
        sentence += len(document)
        size = int(doc_lengths.sum())
        kept = doc_lengths[doc_lengths > 0]
        dropped += len(doc_lengths) - len(kept)
        records.append(encode_document(flat[token_start : token_start + size], kept) if len(kept) else None)
        kept_sentences += len(kept)
        token_start += size
    return records, dropped, kept_sentences, np.bincount(flat, minlength=tokenizer.vocab_size)


def _tokenize_batch(batch: list[list[str]]) -> tuple[list[bytes | None], int, int, np.ndarray]:
    return tokenize_batch(_WORKER["tokenizer"], batch)


def batches(documents: Iterable[list[str]], counts: collections.Counter) -> Iterator[list[list[str]]]:
    """Documents in batches of about BATCH_SENTENCES sentences (empty documents left out);
    counts["documents"] counts every document read."""
    batch, size = [], 0
    for document in documents:
        counts["documents"] += 1
        if not document:
            continue
        batch.append(list(document))
        size += len(document)
        if size >= BATCH_SENTENCES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _in_order(batches: Iterator[list[list[str]]], num_workers: int, tokenizer) -> Iterator[tuple]:
    """`_tokenize_batch` over `batches`, results in input order; num_workers > 1: in a process pool with at
    most 2 batches per worker in flight (Pool.imap would read the whole corpus ahead)."""
    if num_workers == 1:
        _init_worker(tokenizer)
        yield from map(_tokenize_batch, batches)
        return
    with multiprocessing.get_context("spawn").Pool(num_workers, _init_worker, (tokenizer,)) as pool:
        pending: collections.deque = collections.deque()
        for batch in batches:
            pending.append(pool.apply_async(_tokenize_batch, (batch,)))
            if len(pending) >= 2 * num_workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def tokenize_documents(documents: Iterable[list[str]], tokenizer, output_dir: str, *, num_shards: int = 1,
                       num_workers: int = 1, read_stats=None, extra_metadata: dict | None = None) -> dict:
    """Tokenizes `documents` once into sharded ArrayRecord files in `output_dir` (module docstring) -> the
    metadata written.

    Args:
      documents: iterable of documents, each a list of sentence strings (`bert_jax.data.corpus` readers).
      tokenizer: a `bert_jax.data.tokenization.Tokenizer`; its vocabulary file is copied into output_dir.
      output_dir: a local directory (created if missing; files are written under a temporary directory
        inside it and renamed) or a URI (gs://...; files are written locally and uploaded one by one),
        metadata.json last (`storage.staging_dir`, `storage.publish`).
      num_shards: output shards (documents go round-robin).
      num_workers: tokenizing processes (the output does not depend on it).
      read_stats: the reader's `corpus.ReadStats` (its invalid-UTF-8 count goes into the metadata).

    Raises:
      ValueError: num_shards or num_workers below 1, or no document has a sentence with a token.
      TypeError: a sentence that is not a str (from the tokenizer).
    """
    for name, value in (("num_shards", num_shards), ("num_workers", num_workers)):
        if value < 1:
            raise ValueError(f"--{name}={value} must be at least 1")
    start = time.time()
    work = storage.staging_dir(output_dir)
    names = shard_names(num_shards)
    writers = []
    try:
        shard_documents = [0] * num_shards
        counts = np.zeros(tokenizer.vocab_size, np.int64)
        num_documents = num_sentences = dropped = 0
        read = collections.Counter()
        try:
            writers.extend(ArrayRecordWriter(os.path.join(work, n), WRITER_OPTIONS) for n in names)
            for records, batch_dropped, batch_sentences, batch_counts in _in_order(
                    batches(documents, read), num_workers, tokenizer):
                for record in filter(None, records):
                    writers[num_documents % num_shards].write(record)
                    shard_documents[num_documents % num_shards] += 1
                    num_documents += 1
                dropped += batch_dropped
                num_sentences += batch_sentences
                counts += batch_counts
        finally:
            for writer in writers:
                writer.close()
        if not num_documents:
            raise ValueError("the input holds no document with a non-empty sentence")
        np.save(os.path.join(work, formats.COUNTS_NAME), counts)
        shutil.copyfile(tokenizer.vocab_file, os.path.join(work, formats.VOCAB_NAME))
        formats.unpublish(output_dir)  # a previous run's metadata never describes these shards
        storage.publish(work, output_dir, [*names, formats.COUNTS_NAME, formats.VOCAB_NAME])
        metadata = documents_metadata(
            shard_documents=shard_documents, num_sentences=num_sentences, num_tokens=int(counts.sum()),
            skipped={**(read_stats or corpus.ReadStats()).skipped(), "empty_sentences": dropped, "empty_documents": read["documents"] - num_documents},
            tokenizer=tokenizer, extra_metadata=extra_metadata, seconds=time.time() - start)
        storage.write_json(storage.join(output_dir, formats.METADATA_NAME), metadata)
        return metadata
    finally:
        shutil.rmtree(work, ignore_errors=True)


def documents_metadata(*, shard_documents: list[int], num_sentences: int, num_tokens: int, skipped: dict,
                       tokenizer, extra_metadata: dict | None, seconds: float) -> dict:
    """The metadata.json of tokenized documents (module docstring): shard names and document counts, the
    corpus's counts, what was skipped, the vocabulary, `extra_metadata` (the source) and the seconds taken."""
    return {
        "kind": formats.DOCUMENTS_KIND,
        "format_version": formats.DOCUMENTS_FORMAT_VERSION,
        "shards": shard_names(len(shard_documents)),
        "shard_documents": [int(n) for n in shard_documents],
        "num_documents": int(sum(shard_documents)),
        "num_sentences": int(num_sentences),
        "num_tokens": int(num_tokens),
        "skipped": skipped,
        "vocab_size": tokenizer.vocab_size,
        "vocab_sha256": tokenizer.vocab_sha256,
        "do_lower_case": tokenizer.do_lower_case,
        **(extra_metadata or {}),
        "seconds": round(seconds, 3),
    }


# ----------------------------------------------------------------------------- reading


class Documents:
    """Random access to the documents of a tokenized-documents directory, by corpus index.

    `docs[d]` -> (tokens int32 [T], sentence_starts int64 [S + 1]) as `decode_document` (read-only: shared
    with a cache of the most recently used documents, CACHE_TOKENS tokens). Shards are opened on first use
    (so an instance pickles into grain workers without open files). `metadata`: the directory's
    metadata.json, read from `path` when not given (FileNotFoundError without one, `formats.read_metadata`).

    Raises (on first use / indexing):
      FileNotFoundError, ValueError: as `formats.open_document_shards` (an incomplete directory: missing,
        truncated or corrupt shards); ValueError for a malformed record (names the shard and the document).
      IndexError: d outside [0, num_documents).
    """

    def __init__(self, path: str, metadata: dict | None = None):
        self.path = path
        self.metadata = metadata if metadata is not None else formats.read_metadata(path)
        self.num_documents = int(self.metadata["num_documents"])
        self._sources = None
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._cached_tokens = 0

    def __getstate__(self):
        return {**self.__dict__, "_sources": None, "_cache": collections.OrderedDict(), "_cached_tokens": 0}

    def __len__(self) -> int:
        return self.num_documents

    def __getitem__(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= d < self.num_documents:
            raise IndexError(f"document {d} of {self.num_documents} in {self.path}")
        if d in self._cache:
            self._cache.move_to_end(d)
            return self._cache[d]
        if self._sources is None:
            self._sources = formats.open_document_shards(self.path, self.metadata)
        shard = d % len(self._sources)
        try:
            document = decode_document(self._sources[shard][d // len(self._sources)])
        except ValueError as e:
            raise ValueError(f"{storage.join(self.path, self.metadata['shards'][shard])}: document {d}: {e}") from None
        self._cache[d] = document
        self._cached_tokens += len(document[0])
        while self._cached_tokens > CACHE_TOKENS and len(self._cache) > 1:
            self._cached_tokens -= len(self._cache.popitem(last=False)[1][0])
        return document

    def token_counts(self) -> np.ndarray:
        """int64 [vocab_size]: occurrences of each token id over all documents (token_counts.npy)."""
        return np.load(storage.local_file(storage.join(self.path, formats.COUNTS_NAME)))


class Subset:
    """Some documents of a `Documents`, renumbered: `sub[i]` is `documents[indices[i]]` (the same read-only
    (tokens int32 [T], sentence_starts int64 [S + 1])), len() the number of indices. Dynamic instances drawn
    from a Subset take their NotNext segments (and packed rows their fillers) from its documents only: a
    training stream never reads a held-out document (`bert_jax.data.pretraining.holdout`), nor an evaluation stream a
    training one.

    Attributes:
      documents: the whole corpus (`Documents`).
      indices: int64 [k], the corpus indices of the subset's documents, in its order.

    Raises:
      ValueError (construction): an index outside [0, len(documents)), or a repeated one.
      IndexError (indexing): i outside [0, k).
    """

    def __init__(self, documents: Documents, indices):
        self.documents = documents
        self.indices = np.asarray(indices, np.int64).reshape(-1)
        if len(self.indices) and (self.indices.min() < 0 or self.indices.max() >= len(documents)):
            raise ValueError(f"document indices outside [0, {len(documents)}) of {documents.path}")
        if len(np.unique(self.indices)) != len(self.indices):
            raise ValueError(f"repeated document indices in a subset of {documents.path}")

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= i < len(self.indices):
            raise IndexError(f"document {i} of a subset of {len(self.indices)} documents of {self.documents.path}")
        return self.documents[int(self.indices[i])]
