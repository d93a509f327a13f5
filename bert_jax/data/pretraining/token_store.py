"""The tokenized corpus of static-instance creation (`procedure.create_pretraining_data`): documents of
sentences of token ids in three flat arrays, saved as .npy files and memory-mapped, so that worker processes
share its pages and memory does not grow with the corpus beyond the pages in use."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

import numpy as np


@dataclasses.dataclass
class TokenStore:
    """A tokenized corpus, compact: documents of sentences of token ids.

    Attributes:
      tokens: int32 [T] all token ids, concatenated.
      sentence_starts: int64 [S + 1] offsets into `tokens`; sentence s is tokens[starts[s]:starts[s+1]].
      document_starts: int64 [D + 1] offsets into the sentences; document d holds sentences
        document_starts[d] .. document_starts[d+1] - 1.
    """

    tokens: np.ndarray
    sentence_starts: np.ndarray
    document_starts: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.document_starts) - 1

    def __len__(self) -> int:
        return self.num_documents

    def __getitem__(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """Document d -> (tokens int32 [T] (a view), sentence_starts int64 [S + 1] into them), the form
        `document_shards.Documents` gives. IndexError outside [0, num_documents)."""
        if not 0 <= d < self.num_documents:
            raise IndexError(f"document {d} of {self.num_documents}")
        starts = np.asarray(self.sentence_starts[self.document_starts[d] : self.document_starts[d + 1] + 1])
        return np.asarray(self.tokens[starts[0] : starts[-1]]), starts - starts[0]

    def save(self, directory: str) -> None:
        """Writes tokens.npy, sentence_starts.npy and document_starts.npy into `directory` (must exist).

        Raises:
          FileNotFoundError: `directory` does not exist (other `OSError`s as `np.save`).
        """
        for name in ("tokens", "sentence_starts", "document_starts"):
            np.save(os.path.join(directory, f"{name}.npy"), getattr(self, name))

    @classmethod
    def load(cls, directory: str) -> TokenStore:
        """The store `save` wrote in `directory`, memory-mapped read-only (arrays as saved: int32
        tokens, int64 offsets).

        Raises:
          FileNotFoundError: one of the three .npy files is missing.
        """
        # Plain ndarray views of the memory maps: same pages, without np.memmap's per-slice overhead.
        return cls(*(np.load(os.path.join(directory, f"{n}.npy"), mmap_mode="r").view(np.ndarray)
                     for n in ("tokens", "sentence_starts", "document_starts")))


def build_token_store(documents: Iterable[list[str]], tokenizer, directory: str,
                      batch_sentences: int = 20000) -> tuple[TokenStore, int]:
    """Tokenizes `documents` in batches into .npy files under `directory` and memory-maps them.

    Args:
      documents: each a list of sentence strings; empty documents are skipped.
      tokenizer: a `Tokenizer` (its `encode_batch_flat`).
      directory: an existing directory for the .npy files.
      batch_sentences: sentences tokenized per call.

    Returns (store, number of sentences dropped because they had no tokens); documents left without
    a sentence are dropped too.

    Raises:
      ValueError: no document has a sentence with at least one token (an empty corpus included).
      TypeError: a sentence that is not a str (from the tokenizer).
      FileNotFoundError: `directory` does not exist.
    """
    token_chunks, length_chunks, size_chunks = [], [], []
    pending: list[str] = []
    pending_docs: list[int] = []
    dropped = 0

    def flush():
        nonlocal dropped
        if not pending:
            return
        flat, lengths = tokenizer.encode_batch_flat(pending)
        token_chunks.append(flat)
        kept = lengths > 0
        dropped += int((~kept).sum())
        length_chunks.append(lengths[kept])
        sizes = np.add.reduceat(kept, np.cumsum([0] + pending_docs[:-1])) if pending_docs else np.zeros(0)
        size_chunks.append(sizes[sizes > 0])
        pending.clear()
        pending_docs.clear()

    for document in documents:
        if not document:
            continue
        pending.extend(document)
        pending_docs.append(len(document))
        if len(pending) >= batch_sentences:
            flush()
    flush()
    document_sizes = np.concatenate(size_chunks) if size_chunks else np.zeros(0, np.int64)
    if not len(document_sizes):
        raise ValueError("the input holds no document with a non-empty sentence")
    store = TokenStore(
        tokens=np.concatenate(token_chunks),
        sentence_starts=np.concatenate([[0], np.cumsum(np.concatenate(length_chunks))]).astype(np.int64),
        document_starts=np.concatenate([[0], np.cumsum(document_sizes)]).astype(np.int64),
    )
    token_chunks.clear()
    store.save(directory)
    return TokenStore.load(directory), dropped
