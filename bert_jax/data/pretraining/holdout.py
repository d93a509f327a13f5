"""Held-out documents: a fixed share of a tokenized-documents directory kept out of training, for evaluation.

`split(num_documents, fraction)` picks k = round(fraction * num_documents) documents: those whose index has
the k smallest keys of a fixed hash (SplitMix64 of the index). The choice depends on the document count and
the fraction only (not on config.seed, the shard count or the process count), is spread over the whole
corpus (not its last books), and keeps most of its documents when documents are appended. Training draws
from the other documents only (`document_shards.Subset`: instances, NotNext segments and row fillers), and
evaluation from the held-out ones only (`bert_jax.training.evaluation`).
"""

from __future__ import annotations

import numpy as np

from bert_jax.data.pretraining import document_shards, formats

MIN_DOCUMENTS = 2  # a dynamic stream draws its NotNext segments from another document


def _keys(n: int) -> np.ndarray:
    """SplitMix64 of 1 .. n: uint64 [n], a fixed pseudo-random key per document index."""
    with np.errstate(over="ignore"):
        z = (np.arange(n, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def split(num_documents: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The training and held-out documents of a corpus of `num_documents` (module docstring).

    Args:
      num_documents: documents in the directory (metadata.json's num_documents).
      fraction: share held out, in (0, 1); k = round(fraction * num_documents) documents.

    Returns:
      (training, held_out): int64 [num_documents - k] and int64 [k], corpus indices in ascending order,
      disjoint, together all of them.

    Raises:
      ValueError: fraction outside (0, 1), or fewer than MIN_DOCUMENTS documents on either side (one line
        with the counts).
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"eval_fraction={fraction} must be in (0, 1)")
    k = int(round(fraction * num_documents))
    if k < MIN_DOCUMENTS:
        raise ValueError(f"eval_fraction={fraction} holds out {k} of {num_documents} documents; evaluation needs "
                         f"at least {MIN_DOCUMENTS}")
    if num_documents - k < MIN_DOCUMENTS:
        raise ValueError(f"eval_fraction={fraction} holds out {k} of {num_documents} documents, leaving "
                         f"{num_documents - k} for training; it needs at least {MIN_DOCUMENTS}")
    held = np.zeros(num_documents, bool)
    held[np.argsort(_keys(num_documents), kind="stable")[:k]] = True
    return np.flatnonzero(~held).astype(np.int64), np.flatnonzero(held).astype(np.int64)


def split_directory(path: str, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """`split` of the tokenized documents at `path` (its metadata.json's num_documents).

    Raises:
      FileNotFoundError / ValueError: no or a bad metadata.json (`formats.read_metadata`), static instances
        rather than documents, or `split`'s errors.
    """
    metadata = formats.read_metadata(path)
    if not formats.is_documents(metadata):
        raise ValueError(f"{path} holds static instances, not tokenized documents to hold some out of")
    return split(int(metadata["num_documents"]), fraction)


def training_log_prior(path: str, vocab_size: int, held_out: np.ndarray) -> np.ndarray:
    """`procedure.masked_token_log_prior` of tokenized documents without the `held_out` ones: the centred,
    add-one smoothed log unigram distribution of the training documents' tokens -> float32 [vocab_size]
    (token_counts.npy less the held-out documents' tokens, read once).

    Raises:
      ValueError: a token id >= vocab_size; the errors of `document_shards.Documents`.
    """
    documents = document_shards.Documents(path)
    token_counts = documents.token_counts().astype(np.int64)
    for d in held_out:
        tokens, _ = documents[int(d)]
        token_counts -= np.bincount(tokens, minlength=len(token_counts))[: len(token_counts)]
    used = np.flatnonzero(token_counts)
    if len(used) and used[-1] >= vocab_size:
        raise ValueError(f"{path}: token id {int(used[-1])} >= vocab_size={vocab_size}")
    counts = np.zeros(vocab_size, np.float64)
    counts[: min(len(token_counts), vocab_size)] = token_counts[:vocab_size]
    log_prior = np.log((counts + 1.0) / (counts + 1.0).sum())
    return (log_prior - log_prior.mean()).astype(np.float32)
