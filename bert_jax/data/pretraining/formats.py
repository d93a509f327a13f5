"""The pre-training data directories on disk: metadata.json, the two kinds and their format versions, and
the ArrayRecord shards a metadata.json lists, opened and checked complete.

Two kinds of directory, each complete once its metadata.json exists (written last, `storage.publish`):
  static instances (`procedure.create_pretraining_data`): metadata.json {"format_version": 2,
    "shards", "shard_counts", "num_instances", "flags": {"max_seq_length", "max_predictions_per_seq", ...},
    ...}; no "kind" item.
  tokenized documents (`document_shards.tokenize_documents`): metadata.json {"kind": "documents",
    "format_version": 2, "shards", "shard_documents", "num_documents", ...}, token_counts.npy and vocab.txt
    beside the shards.
Both directories hold vocab.txt. The record formats are those of `pretraining` and `document_shards`.
"""

from __future__ import annotations

import os

from array_record.python import array_record_data_source  # the reader grain.sources.ArrayRecordDataSource extends

from bert_jax import storage

METADATA_NAME = "metadata.json"
VOCAB_NAME = "vocab.txt"
INSTANCES_FORMAT_VERSION = 2  # 2: instances of document j in shard j % n, streams per shard
DOCUMENTS_KIND = "documents"
DOCUMENTS_FORMAT_VERSION = 2
COUNTS_NAME = "token_counts.npy"  # int64 [vocab_size]: occurrences of each token id in the documents


def unpublish(path: str) -> None:
    """Removes the metadata.json of the data directory `path` (local or a URI) if it has one: a writer about to replace
    its shards calls this first, so that until the writer's own metadata.json (written last) the directory reads
    as incomplete, never as the old run's metadata over new or partly written shards.

    Raises:
      OSError: the file exists and cannot be deleted (one line naming it).
    """
    storage.remove(storage.join(path, METADATA_NAME))


def read_metadata(path: str) -> dict:
    """metadata.json of a create_pretraining_data output directory (static instances, or tokenized documents),
    with the fields its readers use checked present and of the right type: shards (file names), and
    num_instances and flags.max_seq_length / max_predictions_per_seq (instances), or shard_documents (one
    count per shard) and num_documents, their sum (documents); where present, vocab_size and num_tokens
    (counts), do_lower_case (a bool) and the instances' masking flags (masked_lm_prob and short_seq_prob
    probabilities, do_whole_word_mask a bool).

    Raises:
      FileNotFoundError: no metadata.json (the output is incomplete).
      ValueError: not UTF-8 JSON, not an object, or a field missing or wrong (one line naming the file and
        the field).
    """
    meta_file = storage.join(path, METADATA_NAME)
    if not storage.is_file(meta_file):
        raise FileNotFoundError(f"{path}: no {METADATA_NAME} (not a complete create_pretraining_data output)")
    metadata = storage.read_json(meta_file)
    if not isinstance(metadata, dict):
        raise ValueError(f"{meta_file}: holds a JSON {type(metadata).__name__}, not an object")

    def check(mapping: dict, name: str, ok, want: str):
        if not ok(mapping.get(name)):
            raise ValueError(f"{meta_file}: {name} is {mapping.get(name)!r}, not {want}")

    def count(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    def probability(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1

    for name, ok, want in (("vocab_size", count, "a count"), ("num_tokens", count, "a count"),
                           ("do_lower_case", lambda v: isinstance(v, bool), "true or false")):
        if name in metadata:
            check(metadata, name, ok, want)
    if "kind" in metadata:  # static instances carry none
        check(metadata, "kind", lambda v: v == DOCUMENTS_KIND, f'"{DOCUMENTS_KIND}" (static instances have no kind)')
    check(metadata, "shards", lambda v: isinstance(v, list) and v and all(
        isinstance(s, str) and s and os.path.basename(s) == s for s in v), "a list of shard file names")
    if is_documents(metadata):
        check(metadata, "shard_documents", lambda v: isinstance(v, list) and len(v) == len(metadata["shards"])
              and all(count(n) for n in v), f"{len(metadata['shards'])} document counts, one per shard")
        check(metadata, "num_documents", lambda v: count(v) and v == sum(metadata["shard_documents"]),
              "the sum of shard_documents")
    else:
        check(metadata, "num_instances", count, "a count")
        check(metadata, "flags", lambda v: isinstance(v, dict), "an object")
        check(metadata["flags"], "max_seq_length", lambda v: count(v) and v >= 2, "a length of 2 or more")
        check(metadata["flags"], "max_predictions_per_seq", count, "a count")
        for name, ok, want in (("masked_lm_prob", probability, "a probability"),
                               ("short_seq_prob", probability, "a probability"),
                               ("do_whole_word_mask", lambda v: isinstance(v, bool), "true or false")):
            if name in metadata["flags"]:
                check(metadata["flags"], name, ok, want)
    return metadata


def is_documents(metadata: dict) -> bool:
    """Whether a directory's metadata.json describes tokenized documents (else static instances)."""
    return metadata.get("kind") == DOCUMENTS_KIND


def check_version(path: str, metadata: dict) -> None:
    """Checks that `metadata` (the metadata.json of `path`) has the format version of its kind.

    Raises:
      ValueError: another format version (the message names `path`, the version found and the one expected).
    """
    version = metadata.get("format_version")
    if is_documents(metadata) and version != DOCUMENTS_FORMAT_VERSION:
        raise ValueError(f"{path}: tokenized documents of format_version {version!r}, expected "
                         f"{DOCUMENTS_FORMAT_VERSION} (tokenize the corpus again)")
    if not is_documents(metadata) and version != INSTANCES_FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {version!r}, expected {INSTANCES_FORMAT_VERSION}")


def open_shard(shard: str) -> array_record_data_source.ArrayRecordDataSource:
    """One ArrayRecord file that a metadata.json lists (local or a URI, `storage.local_file`), opened alone.

    Raises:
      FileNotFoundError: it is missing.
      ValueError: ArrayRecord cannot open it (truncated or corrupt; the message names it).
    """
    if not storage.is_file(shard):
        raise FileNotFoundError(f"{shard}: shard listed in {METADATA_NAME} is missing")
    try:
        return array_record_data_source.ArrayRecordDataSource([storage.local_file(shard)])
    except Exception:  # array_record raises a bare RuntimeError for a truncated or corrupt file
        raise ValueError(f"{shard}: not a readable ArrayRecord file (truncated or corrupt)") from None


def open_shards(path: str, metadata: dict) -> array_record_data_source.ArrayRecordDataSource:
    """The static instances' shards that `metadata` (the metadata.json of `path`) lists, as one source
    (records in shard order), checked complete.

    Raises:
      FileNotFoundError: a listed shard is missing.
      ValueError: not format version INSTANCES_FORMAT_VERSION of static instances, a shard that ArrayRecord
        cannot open (truncated or corrupt; the message names it), or shards holding no records, or not
        metadata["num_instances"] of them.
    """
    if is_documents(metadata):
        raise ValueError(f"{path} holds tokenized documents, not static instances")
    check_version(path, metadata)
    shards = [storage.join(path, s) for s in metadata["shards"]]
    for shard in shards:
        if not storage.is_file(shard):
            raise FileNotFoundError(f"{shard}: shard listed in {METADATA_NAME} is missing")
    try:
        source = array_record_data_source.ArrayRecordDataSource([storage.local_file(s) for s in shards])
    except Exception:  # array_record raises a bare RuntimeError: find the shard and name it
        for shard in shards:
            open_shard(shard)
        raise
    if len(source) != metadata["num_instances"] or len(source) == 0:
        raise ValueError(f"{path}: shards hold {len(source)} records, {METADATA_NAME} "
                         f"num_instances={metadata['num_instances']}")
    return source


def open_document_shards(path: str, metadata: dict) -> list[array_record_data_source.ArrayRecordDataSource]:
    """The tokenized documents' shards that `metadata` (the metadata.json of `path`) lists, one source
    each, in order, checked complete: the format version, token_counts.npy and vocab.txt present, each
    shard holding the number of documents metadata["shard_documents"] records.

    Raises:
      FileNotFoundError: a listed shard, token_counts.npy or vocab.txt is missing (names it).
      ValueError: not format version DOCUMENTS_FORMAT_VERSION of tokenized documents, a truncated or
        corrupt shard (names it), or a shard holding another number of documents than recorded.
    """
    if not is_documents(metadata):
        raise ValueError(f"{path} holds static instances, not tokenized documents")
    check_version(path, metadata)
    for name in (COUNTS_NAME, VOCAB_NAME):
        if not storage.is_file(storage.join(path, name)):
            raise FileNotFoundError(f"{storage.join(path, name)}: missing (tokenized documents incomplete)")
    sources = []
    for name, expected in zip(metadata["shards"], metadata["shard_documents"], strict=True):
        shard = storage.join(path, name)
        source = open_shard(shard)
        if len(source) != expected:
            raise ValueError(f"{shard}: holds {len(source)} documents, {METADATA_NAME} records {expected}")
        sources.append(source)
    return sources


def check(path: str, metadata: dict) -> None:
    """Checks the data directory `path` (either kind; `metadata` its metadata.json) complete: its format
    version, and every file it lists present and readable with the recorded counts (`open_shards` or
    `open_document_shards`).

    Raises:
      FileNotFoundError, ValueError: as `open_shards` (static instances) or `open_document_shards`.
    """
    if is_documents(metadata):
        open_document_shards(path, metadata)
    else:
        open_shards(path, metadata)
