"""Dynamic pre-training instances: tokenized documents on disk, instances and masks drawn while training.

The static path (`pretraining.create_pretraining_data`) writes `dupe_factor` masked copies of the corpus;
this one (as NVIDIA's LDDL and paxml do) tokenizes the corpus once and draws instances with the
original's procedure (`pretraining.instances_from_document`: sentence pairs, 50% random next,
short_seq_prob, 15% masking 80/10/10, whole-word option) while training, a fresh draw every epoch.

The documents are tokenized once into sharded ArrayRecord files (`bert_jax.data.document_shards`;
`python -m bert_jax.data.create_pretraining_data --tokenize_only`), read by random access: a document and
the random other documents its NotNext segments come from.

The instance stream (`instance_stream`, grain):
  MapDataset.range(D) documents -> shuffle (a new permutation per epoch) -> repeat(num_epochs)
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

import functools
import os

import grain
import numpy as np

from bert_jax.data import document_shards, pipeline, pretraining, tokenization

# Instances shuffled together after drawing: a book-length document gives hundreds of instances in a row.
DEFAULT_SHUFFLE_WINDOW = 16384


class _DrawInstances(grain.transforms.Map):
    """(epoch, document) -> the list of the document's encoded instances (`pretraining.encode_record`) for
    that epoch: one output per document, so grain workers (each a slice of the documents, read round-robin)
    give the stream one process gives."""

    def __init__(self, path: str, options: pretraining.InstanceOptions, seed: int, do_lower_case: bool):
        self._path, self._options, self._seed, self._lower = path, options, seed, do_lower_case
        self._store = self._vocab = None

    def __getstate__(self):  # pickled into grain workers without the memory maps
        return {**self.__dict__, "_store": None, "_vocab": None}

    def map(self, element):
        if self._vocab is None:  # opened lazily, in the process that draws (reading threads may race: vocab last)
            self._store = document_shards.Documents(self._path)
            tokenizer = tokenization.Tokenizer(os.path.join(self._path, "vocab.txt"), do_lower_case=self._lower)
            self._vocab = pretraining.VocabInfo.from_tokenizer(tokenizer)
        epoch, document = (int(x) for x in element)
        rng = np.random.default_rng([self._seed, epoch, document])
        return list(pretraining.instances_from_document(self._store, document, self._options, self._vocab, rng))


class _Flatten(grain.experimental.FlatMapTransform):
    """A document's list of instances -> its instances, one by one."""

    max_fan_out = 1 << 20

    def flat_map(self, element):
        return element


def _epoch_and_document(num_documents: int, index: int, document: int) -> tuple[int, int]:
    return index // num_documents, document


def instance_stream(path: str, metadata: dict, options: pretraining.InstanceOptions, *, seed: int, shuffle: bool,
                    num_epochs: int | None, process_index: int, process_count: int,
                    read_options: grain.ReadOptions, shuffle_window: int | None = None,
                    worker_count: int = 0) -> grain.IterDataset:
    """This process's stream of encoded instances drawn from the tokenized documents at `path`
    (module docstring); decode each with `pretraining.decode_instance(record, L, P)`. shuffle_window:
    instances shuffled together (default DEFAULT_SHUFFLE_WINDOW). worker_count: grain worker processes
    drawing (`IterDataset.mp_prefetch`; 0: this process): each draws a slice of the documents and they
    are read round-robin, so the stream is the same for every worker_count.

    Raises:
      ValueError: options that `InstanceOptions.validate` rejects, or fewer than 2 documents (random
        next segments come from another document).
    """
    options.validate()
    num_documents = int(metadata["num_documents"])
    if num_documents < 2:
        raise ValueError(f"{path}: {num_documents} document(s); dynamic instances need at least 2")
    docs = grain.MapDataset.range(num_documents)
    if shuffle:
        docs = docs.shuffle(seed=int(np.random.SeedSequence([seed, 1]).generate_state(1, np.uint32)[0]))
    docs = docs.repeat(num_epochs).map_with_index(functools.partial(_epoch_and_document, num_documents))
    docs = docs[process_index::process_count]
    drawn = docs.map(_DrawInstances(path, options, seed, bool(metadata.get("do_lower_case", True))))
    drawn = pipeline.in_workers(drawn.to_iter_dataset(read_options), worker_count)
    records = grain.experimental.FlatMapIterDataset(drawn, _Flatten())
    if shuffle:
        records = grain.experimental.WindowShuffleIterDataset(
            records, window_size=shuffle_window or DEFAULT_SHUFFLE_WINDOW, seed=int(np.random.SeedSequence([seed, 2]).generate_state(1)[0]))
    return records
