"""Dynamic pre-training instances: tokenized documents on disk, instances and masks drawn while training.

The static path (`procedure.create_pretraining_data`) writes `dupe_factor` masked copies of the corpus;
this one (as NVIDIA's LDDL and paxml do) tokenizes the corpus once and draws instances with the
original's procedure (`procedure.instances_from_document`: sentence pairs, 50% random next, a short
target with probability short_seq_prob, masked_lm_prob of the tokens masked 80/10/10, at most
max_predictions_per_seq, whole words with do_whole_word_mask) while training, a fresh draw every epoch.
The options are the `procedure.InstanceOptions` given (a training phase's config fields,
`bert_jax.configs.pretrain.phase`, through `loader.make_pretraining_iterator`), the same statistics as
static instances written with those flags. Whole words are found as the static path finds them
(`procedure.VocabInfo`): a token whose vocabulary entry starts with "##" continues the word before it,
read from the vocab.txt that `document_shards` writes beside the shards.

The documents are tokenized once into sharded ArrayRecord files (`bert_jax.data.pretraining.document_shards`;
`python -m bert_jax.data.create_pretraining_data --tokenize_only`), read by random access: a document and
the random other documents its NotNext segments come from.

The instance stream (`instance_stream`, grain):
  MapDataset.range(D) documents -> shuffle (a new permutation per epoch) -> repeat(num_epochs)
  -> the run's global order (`stream.Stream`: all of it, or what a run on another process count left)
  -> (epoch, document) pairs -> [process_index::process_count]
  -> map: the document's instances, drawn with np.random.default_rng([seed, epoch, document])
  -> to_iter_dataset -> mp_prefetch(worker_count) if worker_count > 0 -> flatten
  -> window shuffle (instances of one document spread over batches).
So a draw depends only on (seed, epoch, document): two epochs draw different instances and masks, a
resumed run draws the same ones (grain's iterator state: the document position and the instance within
it), and the result depends neither on reading threads nor on the number of grain workers (a worker
draws whole documents, one output each, and grain reads the workers round-robin in document order).
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import grain
import numpy as np

from bert_jax import storage
from bert_jax.data.pretraining import document_shards, formats, packing, procedure, stream
from bert_jax.data import tokenization

# Instances shuffled together after drawing: a book-length document gives hundreds of instances in a row.
# At most about one epoch's instances per process: a longer window would mix a document's draws of two epochs
# (and make a small corpus draw many epochs before its first batch).
DEFAULT_SHUFFLE_WINDOW = 16384


def default_shuffle_window(metadata: dict, options: procedure.InstanceOptions, process_count: int) -> int:
    """min(DEFAULT_SHUFFLE_WINDOW, about one epoch's instances on one process): the documents' tokens
    (`metadata["num_tokens"]`) over the max_seq_length - 3 tokens an instance holds, over process_count."""
    tokens = int(metadata.get("num_tokens", 0))
    if tokens <= 0:
        return DEFAULT_SHUFFLE_WINDOW
    return max(1, min(DEFAULT_SHUFFLE_WINDOW, tokens // ((options.max_seq_length - 3) * process_count)))


class _DrawInstances(grain.transforms.Map):
    """(epoch, document) -> the list of the document's encoded instances (`procedure.encode_record`) for
    that epoch: one output per document, so grain workers (each a slice of the documents, read round-robin)
    give the stream one process gives."""

    def __init__(self, path: str, options: procedure.InstanceOptions, seed: int, do_lower_case: bool,
                 documents: np.ndarray | None = None):
        self._path, self._options, self._seed, self._lower = path, options, seed, do_lower_case
        self._documents = documents  # corpus indices of a `document_shards.Subset`, or None: all
        self._store = self._vocab = None

    def __getstate__(self):  # pickled into grain workers without open documents
        return {**self.__dict__, "_store": None, "_vocab": None}

    def open(self) -> None:
        """Opens the documents and the vocabulary, once, in the process that draws (lazily: reading threads
        may race, so the vocabulary, which marks it done, goes last)."""
        if self._vocab is None:
            store = document_shards.Documents(self._path)
            self._store = store if self._documents is None else document_shards.Subset(store, self._documents)
            tokenizer = tokenization.Tokenizer(storage.join(self._path, formats.VOCAB_NAME), do_lower_case=self._lower)
            self._vocab = procedure.VocabInfo.from_tokenizer(tokenizer)

    def map(self, element):
        self.open()
        epoch, document = (int(x) for x in element)
        corpus_index = document if self._documents is None else int(self._documents[document])
        rng = np.random.default_rng([self._seed, epoch, corpus_index])  # a document draws the same in any subset
        return list(procedure.instances_from_document(self._store, document, self._options, self._vocab, rng))


class FillRows(grain.transforms.Map):
    """A packed row (grain's element layout, `packing.pack`) -> the same row with its free room filled by
    instances drawn to fit, while the row has room for at least MIN_FILL tokens, an instance slot and a
    prediction slot (instances of short documents mostly end a few tokens short of max_seq_length, and the
    stream has too few short instances to fill those gaps).

    A filler is one instance of the original procedure (`procedure.instances_from_document` with
    limit=1) from a random sentence of a random document, with the stream's options (masked_lm_prob,
    do_whole_word_mask) but max_seq_length = the room left (its target length, the short-target draw off)
    and at most the row's free prediction slots. It is an extra
    instance: no instance of the stream is changed, and the rows hold more short instances than the
    original's short_seq_prob gives. The random generator is seeded by (seed, a hash of the row), so a row
    is filled the same way whenever it is packed: a resumed or re-run stream is unchanged, and the
    transform holds no state. `documents`: the corpus indices fillers come from (the stream's subset;
    None: all).

    Raises (from `map`, on first use): FileNotFoundError / ValueError for an incomplete documents
    directory (`formats.open_document_shards`).
    """

    MIN_FILL = 32

    def __init__(self, path: str, options: procedure.InstanceOptions, seed: int, do_lower_case: bool,
                 max_instances: int, documents: np.ndarray | None = None):
        self._draw = _DrawInstances(path, options, seed, do_lower_case, documents)
        self._options, self._seed, self._max_instances = options, seed, max_instances

    def map(self, row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        draw = self._draw
        draw.open()
        row = {k: v.copy() for k, v in row.items()}
        length, predictions = len(row["input_ids"]), len(row["masked_lm_ids"])
        rng = np.random.default_rng([self._seed, 3, zlib.crc32(row["input_ids"].tobytes()),
                                     zlib.crc32(row["masked_lm_ids"].tobytes())])
        while True:
            used = int(np.count_nonzero(row["input_ids_segment_ids"]))
            used_predictions = int(np.count_nonzero(row["masked_lm_ids_segment_ids"]))
            count = int(row["next_sentence_labels_segment_ids"].max())
            room = length - used
            if room < self.MIN_FILL or count >= self._max_instances or used_predictions >= predictions:
                return row
            options = dataclasses.replace(self._options, max_seq_length=room, short_seq_prob=0.0,
                                          max_predictions_per_seq=predictions - used_predictions)
            document = int(rng.integers(0, len(draw._store)))
            first = int(rng.integers(0, len(draw._store[document][1]) - 1))
            (record,) = procedure.instances_from_document(draw._store, document, options, draw._vocab, rng,
                                                            first_sentence=first, limit=1)
            _append(row, packing.unpad(procedure.decode_instance(record, room, options.max_predictions_per_seq)),
                    used, used_predictions, count)


def _append(row: dict[str, np.ndarray], instance: dict[str, np.ndarray], used: int, used_predictions: int,
            count: int) -> None:
    """Writes an unpadded instance (`packing.unpad`) into a packed row in grain's layout, as instance
    count + 1 at token offset `used` and prediction offset `used_predictions`."""
    for name, offset in (("input_ids", used), ("token_type_ids", used), ("masked_lm_positions", used_predictions),
                         ("masked_lm_ids", used_predictions), ("masked_lm_weights", used_predictions),
                         ("next_sentence_labels", count)):
        values = instance[name]
        row[name][offset : offset + len(values)] = values
        row[f"{name}_segment_ids"][offset : offset + len(values)] = count + 1
        row[f"{name}_positions"][offset : offset + len(values)] = np.arange(len(values))


class _Flatten(grain.experimental.FlatMapTransform):
    """A document's list of instances -> its instances, one by one."""

    max_fan_out = 1 << 20

    def flat_map(self, element):
        return element


def _epoch_and_document(num_documents: int, indexed: tuple[int, int]) -> tuple[int, int]:
    index, document = indexed
    return index // num_documents, document


def instance_stream(path: str, metadata: dict, options: procedure.InstanceOptions, *, seed: int, shuffle: bool,
                    num_epochs: int | None, process_index: int, process_count: int,
                    read_options: grain.ReadOptions, shuffle_window: int | None = None,
                    worker_count: int = 0, order: stream.Stream = stream.Stream(),
                    documents: np.ndarray | None = None) -> grain.IterDataset:
    """This process's stream of encoded instances drawn from the tokenized documents at `path`
    (module docstring); decode each with `procedure.decode_instance(record, L, P)`. shuffle_window:
    instances shuffled together (default `default_shuffle_window`). worker_count: grain worker processes
    drawing (`IterDataset.mp_prefetch`; 0: this process): each draws a slice of the documents and they
    are read round-robin, so the stream is the same for every worker_count. order: the global indices of
    (epoch, document) pairs to read (`stream.Stream`; default all, from the first). documents: int [k]
    corpus indices, the only documents the stream reads (`document_shards.Subset`: its instances, NotNext
    segments and nothing else; e.g. `holdout.split`'s training or held-out ones); None: all. A document's
    draw is seeded by its corpus index (seed, epoch, index) in a subset too.

    Raises:
      ValueError: options that `InstanceOptions.validate` rejects, fewer than 2 documents (random
        next segments come from another document), or `documents` outside the corpus or repeated.
    """
    options.validate()
    num_documents = int(metadata["num_documents"])
    if documents is not None:
        documents = document_shards.Subset(document_shards.Documents(path, metadata), documents).indices
        num_documents = len(documents)
    if num_documents < 2:
        raise ValueError(f"{path}: {num_documents} document(s); dynamic instances need at least 2")
    docs = grain.MapDataset.range(num_documents)
    if shuffle:
        docs = docs.shuffle(seed=int(np.random.SeedSequence([seed, 1]).generate_state(1, np.uint32)[0]))
    docs = order.units(docs.repeat(num_epochs), with_index=True).map(functools.partial(_epoch_and_document, num_documents))
    docs = docs[process_index::process_count]
    drawn = docs.map(_DrawInstances(path, options, seed, bool(metadata.get("do_lower_case", True)), documents))
    drawn = stream.in_workers(drawn.to_iter_dataset(read_options), worker_count)
    records = grain.experimental.FlatMapIterDataset(drawn, _Flatten())
    if shuffle:
        records = grain.experimental.WindowShuffleIterDataset(
            records, window_size=shuffle_window or default_shuffle_window(metadata, options, process_count), seed=int(np.random.SeedSequence([seed, 2]).generate_state(1)[0]))
    return records
