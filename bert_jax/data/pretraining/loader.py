"""The pre-training input pipeline: grain over the ArrayRecord directories of create_pretraining_data.

    it = make_pretraining_iterator("instances/", global_batch_size=256, seed=0)
    batch = next(it)        # dict of numpy arrays, one per-process batch (keys below)
    state = it.get_state()  # a small JSON dict; `set_state(state)` on a fresh iterator resumes exactly

The global stream (grain `MapDataset`, random access all through):
  ArrayRecordDataSource(every shard, in metadata order)           N records
  -> shuffle (global, index_shuffle; a new permutation per epoch)  if `shuffle`
  -> repeat(num_epochs)                                           N * num_epochs, or endless
  -> batch(local_batch_size, drop_remainder=True), decoding each record with
     `procedure.decode_instance` (padded to the lengths in metadata.json)
  -> the first (N * num_epochs) // global_batch_size global batches (endless: all)
  -> [process_index::process_count]
  -> to_iter_dataset (reading threads), then mp_prefetch(worker_count) when worker_count > 0.
Global batch s is records [s * G, (s + 1) * G) of the shuffled, repeated stream (G = global_batch_size);
process p holds its rows [p * b, (p + 1) * b) (b = local_batch_size = G // process_count). So the
processes read disjoint records and together read every global batch, and a global batch does not
depend on process_count (rows in process order). Epochs flow into each other (a batch may straddle two);
with a fixed num_epochs the last (N * num_epochs) % G records are dropped so that every process
yields the same number of batches (no process waits on a batch its peers never make).

Batch (one process), B = local_batch_size, L = max_seq_length, P = max_predictions_per_seq:
  input_ids, token_type_ids, attention_mask: int32 [B, L]
  masked_lm_positions, masked_lm_ids: int32 [B, P]
  masked_lm_weights: float32 [B, P] (1.0 on real predictions, 0.0 on padding)
  next_sentence_labels: int32 [B] (0 IsNext, 1 NotNext)

Determinism and resume: the batch at a position depends only on the directory, seed, shuffle,
num_epochs, global_batch_size and the process's slot. `get_state()` is
{"next_batch": s, ...the settings above} and `set_state` slices the random-access dataset at s: no
replay, O(1) whatever s. The state is the same on every process and may be restored under another
process_count or worker_count (same global batches). The user seed goes through
`np.random.SeedSequence` before grain's shuffle, whose per-epoch seed is seed + epoch: seeds 0 and 1
do not give the same permutations one epoch apart.

Orbax: PretrainingIterator is a `grain.DatasetIterator`, so grain's own Orbax handler takes it:
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(train_state),
                                            data=grain.checkpoint.CheckpointSave(it)))
    mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                               data=grain.checkpoint.CheckpointRestore(it)))
It writes `process_{i}-of-{n}.json` holding `get_state()`; restoring that way needs the same
process_count (the JSON state itself does not).

Packing (`packing=True`, `bert_jax.data.pretraining.packing`): the shuffled, repeated instances are split between
processes one instance at a time ([process_index::process_count]), unpadded, packed several per row by
grain's best-fit packer, and batched; the batch gains segment_ids, position_ids, next_sentence_positions
and next_sentence_weights and next_sentence_labels becomes [B, K] (layout in `packing`). The state is
grain's iterator state (the position where the current packing window started, and the rows already
emitted from it): a resumed iterator gives the same rows. The state is this process's own (it holds
process_index): training checkpoints every process's state (`train`). On the same process_count a
resume is exact. On another, `stream.Stream.after` turns the old processes' states into the global order
of the units (instances, or (epoch, document) pairs) none of them finished, which the new processes
split between them (`stream=`): no unit is dropped, those of each old process's open shuffle and packing
windows are read again, and the rows differ from an uninterrupted run's. With worker_count > 0 the instances are decoded (or, from documents, drawn) in grain
worker processes, one output per record (per document), read round-robin: the rows are the same for
every worker_count, but grain's state is not, so a run resumes with the worker_count it saved with.

Tokenized documents (a directory of `bert_jax.data.pretraining.dynamic`, `create_pretraining_data --tokenize_only`):
the instances are drawn while reading (`dynamic.instance_stream`: documents shuffled per epoch and split
between processes, each drawn with rng (seed, epoch, document), a window shuffle), then batched or packed
as above; packed rows then get their free room filled (`fill_rows`, `dynamic.FillRows`: a stateless map
seeded by each row's content); the state is grain's, as for packing. Both draw with the masking given
(masked_lm_prob, do_whole_word_mask, short_seq_prob; the original's defaults), which the state records.

Sources: grain's MapDataset API (shuffle/repeat/batch/slice/to_iter_dataset/mp_prefetch and
`grain.checkpoint.CheckpointSave/CheckpointRestore`); the batch fields are those of google-research/bert
`run_pretraining.py` `input_fn_builder`.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any, Sequence

import grain
import jax
import numpy as np

from bert_jax.data.pretraining import dynamic, formats, packing as packing_lib, procedure, stream as stream_lib

# Reading threads and the read-ahead buffer, in batches (grain's defaults, 16 and 500, would buffer
# 500 batches).
_READ_OPTIONS = grain.ReadOptions(num_threads=8, prefetch_buffer_size=16)
# The settings a state must match to be restored (besides `next_batch`).
_STATE_KEYS = ("seed", "shuffle", "num_epochs", "global_batch_size", "num_instances")
_PACKED_STATE_KEYS = _STATE_KEYS + ("max_instances", "num_packing_bins", "process_count", "process_index", "dynamic",
                                    "max_seq_length", "max_predictions_per_seq", "fill_rows")


def _decode_batch(records: Sequence[bytes], max_seq_length: int,
                  max_predictions_per_seq: int) -> dict[str, np.ndarray]:
    """Record bytes [B] -> the batch fields (module docstring), via `procedure.decode_instance`."""
    rows = [procedure.decode_instance(r, max_seq_length, max_predictions_per_seq) for r in records]
    return {k: np.stack([row[k] for row in rows]) for k in rows[0]}


class PretrainingIterator(grain.DatasetIterator):
    """Per-process batches of pre-training instances; checkpointable (see the module docstring).

    Attributes:
      metadata: the directory's metadata.json.
      local_batch_size: rows per batch on this process (global_batch_size // process_count).
      num_batches: batches this process yields in all (about sys.maxsize / global_batch_size when
        num_epochs is None).
    """

    def __init__(self, batches: grain.MapDataset, *, metadata: dict, local_batch_size: int,
                 settings: dict[str, Any], worker_count: int):
        super().__init__()
        self._batches = batches
        self._settings = settings
        self._worker_count = worker_count
        self.metadata = metadata
        self.local_batch_size = local_batch_size
        self.num_batches = len(batches)
        self._next_batch = 0
        self._it = self._start(0)

    def _start(self, position: int) -> grain.DatasetIterator:
        return iter(stream_lib.in_workers(self._batches[position:].to_iter_dataset(_READ_OPTIONS), self._worker_count))

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._it)
        self._next_batch += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        """{"next_batch": index of the next batch, plus the settings it is valid for}; JSON-serialisable."""
        return {"next_batch": self._next_batch, **self._settings}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from `state` (from `get_state`, possibly after a JSON round trip).

        Raises:
          ValueError: a state made with other settings (seed, shuffle, num_epochs, global_batch_size,
            data) or a position past the end.
        """
        for key in _STATE_KEYS:
            if state.get(key) != self._settings[key]:
                raise ValueError(f"iterator state has {key}={state.get(key)!r}, this iterator "
                                 f"{key}={self._settings[key]!r}")
        position = state.get("next_batch")
        if not isinstance(position, int) or not 0 <= position <= self.num_batches:
            raise ValueError(f"iterator state next_batch={position!r} is not in [0, {self.num_batches}]")
        self._it.close()
        self._it = self._start(position)
        self._next_batch = position

    def start_prefetch(self) -> None:
        """Starts reading and decoding the next batches in the background (threads, or the worker
        processes when worker_count > 0) before the first `next`, e.g. while a checkpoint is restored;
        idempotent.

        Raises:
          ValueError: the iterator was closed and worker_count > 0 (from grain; with threads it is a no-op).
        """
        self._it.start_prefetch()

    def close(self) -> None:
        """Stops the reading threads and worker processes; idempotent. `next` afterwards raises grain's
        ValueError; `set_state` starts a fresh reader."""
        if getattr(self, "_it", None) is not None:  # also called by __del__, maybe on a half-built object
            self._it.close()


class PackedPretrainingIterator(grain.DatasetIterator):
    """Per-process batches of packed rows (module docstring: Packing) or of instances drawn from tokenized
    documents (`bert_jax.data.pretraining.dynamic`); checkpointable as `PretrainingIterator`, with grain's own iterator
    state inside its state.

    Attributes:
      metadata: the directory's metadata.json.
      local_batch_size: rows per batch on this process.
    """

    def __init__(self, batches: grain.IterDataset, *, metadata: dict, local_batch_size: int,
                 settings: dict[str, Any]):
        super().__init__()
        self._batches = batches
        self._settings = settings
        self.metadata = metadata
        self.local_batch_size = local_batch_size
        self._it = iter(batches)

    def __next__(self) -> dict[str, np.ndarray]:
        return next(self._it)

    def get_state(self) -> dict[str, Any]:
        """{"grain": grain's iterator state, plus the settings it is valid for}; JSON-serialisable."""
        return {"grain": self._it.get_state(), **self._settings}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from `state` (from `get_state`).

        Raises:
          ValueError: a state made with other settings (those of `PretrainingIterator`, the packing
            settings, another process_count or worker_count, other masking of or another subset of tokenized
            documents), or without grain's state.
        """
        if state.get("documents") != self._settings["documents"]:  # a subset of tokenized documents (or all: None)
            raise ValueError(f"iterator state read {state.get('documents') or 'all documents'}, this iterator reads "
                             f"{self._settings['documents'] or 'all documents'}: resume with the same documents "
                             f"(bert_jax.train: the same config.eval_fraction)")
        for key in _PACKED_STATE_KEYS:
            saved = state.get(key, False if key == "fill_rows" else None)  # states before fill_rows: none
            if saved != self._settings[key]:
                raise ValueError(f"iterator state has {key}={saved!r}, this iterator "
                                 f"{key}={self._settings[key]!r}")
        for key in procedure.MASKING_FIELDS:  # tokenized documents: the masking drawn
            saved = state.get(key, getattr(procedure.InstanceOptions, key))
            if key in self._settings and saved != self._settings[key]:
                raise ValueError(f"iterator state was drawn with {key}={saved!r}, this iterator draws with "
                                 f"{key}={self._settings[key]!r}")
        if state.get("worker_count", 0) != self._settings["worker_count"]:  # grain's state differs with workers
            raise ValueError(f"iterator state was saved with worker_count={state.get('worker_count', 0)}, this "
                             f"iterator has worker_count={self._settings['worker_count']}: resume with the same "
                             f"number of grain workers")
        saved_stream = stream_lib.Stream.from_state(state).to_state()
        if saved_stream != self._settings[stream_lib.STATE_KEY]:
            raise ValueError(f"iterator state was read from the stream {saved_stream}, this iterator from "
                             f"{self._settings[stream_lib.STATE_KEY]}: make it with stream= from the state")
        if not isinstance(state.get("grain"), dict):
            raise ValueError("iterator state has no grain state (not a packed iterator's state)")
        self._it.close()
        self._it = iter(self._batches)
        self._it.set_state(state["grain"])

    def start_prefetch(self) -> None:
        """Starts reading ahead (threads) before the first `next`; idempotent."""
        self._it.start_prefetch()

    def close(self) -> None:
        """Stops the reading threads; idempotent."""
        if getattr(self, "_it", None) is not None:
            self._it.close()


def _subset_key(indices: np.ndarray | None) -> str | None:
    """A state's record of the documents read: None (all), or "<k> documents, crc32 <hex>" of their indices."""
    if indices is None:
        return None
    return f"{len(indices)} documents, crc32 {zlib.crc32(np.asarray(indices, '<i8').tobytes()):08x}"


def _decode_unpadded(record: bytes, max_seq_length: int, max_predictions_per_seq: int) -> dict[str, np.ndarray]:
    return packing_lib.unpad(procedure.decode_instance(record, max_seq_length, max_predictions_per_seq))


def make_pretraining_iterator(path: str, *, global_batch_size: int, seed: int = 0, shuffle: bool = True,
                              num_epochs: int | None = None, process_index: int | None = None,
                              process_count: int | None = None, max_seq_length: int | None = None,
                              max_predictions_per_seq: int | None = None, masked_lm_prob: float | None = None,
                              do_whole_word_mask: bool | None = None, short_seq_prob: float | None = None,
                              worker_count: int = 0, packing: bool = False, max_instances: int | None = None,
                              num_packing_bins: int | None = None, fill_rows: bool = True,
                              stream: stream_lib.Stream | None = None,
                              documents: Sequence[int] | np.ndarray | None = None,
                              ) -> PretrainingIterator | PackedPretrainingIterator:
    """This process's batches of a create_pretraining_data output directory (static instances), or of
    tokenized documents (`bert_jax.data.pretraining.dynamic`: instances drawn while reading).

    Args:
      path: directory holding metadata.json and the ArrayRecord shards, or tokenized documents.
      global_batch_size: rows per step over all processes.
      seed: shuffle seed (non-negative int); for documents also the seed of every draw.
      shuffle: shuffle globally, a new permutation each epoch; False reads the shards in order.
      num_epochs: passes over the data; None repeats forever.
      process_index, process_count: this process's slot; default jax.process_index() and
        jax.process_count().
      max_seq_length, max_predictions_per_seq: if given, must equal the directory's (metadata flags); for
        tokenized documents, required: the instances to draw.
      masked_lm_prob, do_whole_word_mask, short_seq_prob: the masking (`procedure.MASKING_FIELDS`; None:
        the data's for static instances, the original's defaults, `procedure.InstanceOptions`, for
        tokenized documents). Static instances were masked when written: a value given must equal their
        metadata flag. Tokenized documents: the instances drawn (packed rows' fillers too) use them, whole
        words from the `##` pieces of the documents' vocab.txt.
      worker_count: grain worker processes (0: in this process, with threads): decoding static instances
        (batches, or instances before packing), or drawing instances from tokenized documents; the same
        stream for every count.
      packing: pack several instances per row (module docstring: Packing).
      max_instances: K, instances per packed row; default `packing.default_max_instances`.
      num_packing_bins: rows the packer fills at once (its window); default packing.DEFAULT_PACKING_BINS.
      fill_rows: packed rows of tokenized documents get their free room filled with instances drawn to fit
        (`dynamic.FillRows`); no effect on static instances or unpacked rows.
      stream: packed or dynamic input only: the global order of units to read (`stream.Stream`; default
        all of them from the first), e.g. what a run on another process count left
        (`stream.Stream.after`).
      documents: tokenized documents only: int [k] corpus indices, the only documents read (their instances,
        NotNext segments and row fillers; `dynamic.instance_stream`), e.g. `holdout.split`'s training or
        held-out ones; None: all. The stream's unit count (and its state's num_instances) is then k.

    Returns:
      A PretrainingIterator (static instances, unpacked) or a PackedPretrainingIterator (packed, or drawn
      from documents) of dicts of numpy arrays (shapes and dtypes in the module docstring).

    Raises:
      FileNotFoundError: `path` has no metadata.json (incomplete or not an output), or a shard is
        missing.
      ValueError: global_batch_size not divisible by process_count, a bad argument (`InstanceOptions.validate`
        for documents), lengths or masking that differ from static instances' metadata (or no lengths given
        for documents), `documents` given for static instances or outside the corpus, an unknown format
        version, or shards not holding the recorded count.
    """
    metadata = formats.read_metadata(path)
    formats.check_version(path, metadata)
    document_indices, documents = documents, formats.is_documents(metadata)  # documents: now the directory's kind
    masking = {"masked_lm_prob": masked_lm_prob, "do_whole_word_mask": do_whole_word_mask,
               "short_seq_prob": short_seq_prob}
    if documents:
        if max_seq_length is None or max_predictions_per_seq is None:
            raise ValueError(f"{path} holds tokenized documents: give max_seq_length and max_predictions_per_seq")
        formats.check(path, metadata)  # here, not in a reading thread
        flags = {"max_seq_length": max_seq_length, "max_predictions_per_seq": max_predictions_per_seq}
    else:
        flags = metadata["flags"]
        for name, wanted in (("max_seq_length", max_seq_length),
                             ("max_predictions_per_seq", max_predictions_per_seq)):
            if wanted is not None and wanted != flags[name]:
                raise ValueError(f"{name}={wanted} requested but {path} holds {name}={flags[name]}")
        mismatch = procedure.masking_mismatch(flags, masking)
        if mismatch:
            name, wanted, held = mismatch
            raise ValueError(f"{name}={wanted} requested but {path} holds static instances masked with "
                             f"{name}={held} (fixed when they were written)")
    if process_index is None or process_count is None:
        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} is not in [0, process_count={process_count})")
    if global_batch_size < 1 or global_batch_size % process_count:
        raise ValueError(f"global_batch_size={global_batch_size} must be a positive multiple of "
                         f"process_count={process_count}")
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs={num_epochs} must be at least 1 (or None: forever)")
    if seed < 0:
        raise ValueError(f"seed={seed} must be non-negative")
    if worker_count < 0:
        raise ValueError(f"worker_count={worker_count} must be non-negative")
    if document_indices is not None and not documents:
        raise ValueError(f"{path} holds static instances: documents= applies to tokenized documents")
    if stream is not None and not (packing or documents):
        raise ValueError("stream= applies to packed or dynamic input (static batches resume on any process count)")
    stream = stream or stream_lib.Stream()
    if (packing or documents) and process_count > 1 and num_epochs is not None:
        raise ValueError(f"packing or tokenized documents on {process_count} processes need num_epochs=None "
                         f"(processes would make different numbers of rows from a finite stream)")
    local_batch_size = global_batch_size // process_count
    length, predictions = flags["max_seq_length"], flags["max_predictions_per_seq"]
    if documents:
        num_instances = int(metadata["num_documents"])  # the stream's unit: documents
        if document_indices is not None:
            document_indices = np.asarray(document_indices, np.int64).reshape(-1)
            num_instances = len(document_indices)
        given = {k: (bool if k == "do_whole_word_mask" else float)(v) for k, v in masking.items() if v is not None}
        options = procedure.InstanceOptions(max_seq_length=length, max_predictions_per_seq=predictions, **given)
        records = dynamic.instance_stream(path, metadata, options, seed=seed, shuffle=shuffle, num_epochs=num_epochs,
                                          process_index=process_index, process_count=process_count,
                                          read_options=_READ_OPTIONS, worker_count=worker_count, order=stream,
                                          documents=document_indices)
    else:
        source = formats.open_shards(path, metadata)
        num_instances = len(source)
        ds = grain.MapDataset.source(source)
        if shuffle:
            shuffle_seed = int(np.random.SeedSequence(seed).generate_state(1, np.uint32)[0])
            ds = ds.shuffle(seed=shuffle_seed)
        ds = ds.repeat(num_epochs)
    decode_unpadded = functools.partial(_decode_unpadded, max_seq_length=length, max_predictions_per_seq=predictions)
    if packing or documents:
        if packing:
            max_instances = max_instances or packing_lib.default_max_instances(length)
            num_packing_bins = num_packing_bins or packing_lib.DEFAULT_PACKING_BINS
            if documents:
                instances = records.map(decode_unpadded)
            else:  # decoded in the workers: one output per record, so the same stream for any worker_count
                instances = stream_lib.in_workers(stream.units(ds)[process_index::process_count].map(decode_unpadded)
                                       .to_iter_dataset(_READ_OPTIONS), worker_count)
            rows = packing_lib.pack(
                instances,
                max_seq_length=length, max_predictions_per_seq=predictions, max_instances=max_instances,
                num_packing_bins=num_packing_bins,
                seed=int(np.random.SeedSequence([seed, process_index]).generate_state(1)[0]))
            fill_rows = fill_rows and documents
            if fill_rows:
                rows = rows.map(dynamic.FillRows(path, options, seed, bool(metadata.get("do_lower_case", True)),
                                                 max_instances, document_indices))
            batches = rows.batch(local_batch_size, drop_remainder=True, batch_fn=packing_lib.finalize_batch)
        else:
            batches = records.batch(local_batch_size, drop_remainder=True, batch_fn=functools.partial(
                _decode_batch, max_seq_length=length, max_predictions_per_seq=predictions))
        settings = {"seed": seed, "shuffle": shuffle, "num_epochs": num_epochs, "global_batch_size": global_batch_size,
                    "num_instances": num_instances, "max_instances": max_instances if packing else 0,
                    "num_packing_bins": num_packing_bins if packing else 0, "process_count": process_count,
                    "process_index": process_index,
                    "dynamic": documents, "max_seq_length": length, "max_predictions_per_seq": predictions,
                    "worker_count": worker_count, "fill_rows": bool(packing and fill_rows),
                    "documents": _subset_key(document_indices), stream_lib.STATE_KEY: stream.to_state()}
        if documents:  # what was drawn; a state without them was drawn with the defaults
            settings.update({name: getattr(options, name) for name in procedure.MASKING_FIELDS})
        return PackedPretrainingIterator(batches, metadata=metadata, local_batch_size=local_batch_size,
                                         settings=settings)
    ds = ds.batch(local_batch_size, drop_remainder=True,
                  batch_fn=functools.partial(_decode_batch, max_seq_length=length, max_predictions_per_seq=predictions))
    ds = ds[: len(ds) // process_count * process_count][process_index::process_count]
    settings = {"seed": seed, "shuffle": shuffle, "num_epochs": num_epochs,
                "global_batch_size": global_batch_size, "num_instances": num_instances}
    return PretrainingIterator(ds, metadata=metadata, local_batch_size=local_batch_size, settings=settings,
                               worker_count=worker_count)


def check_data_dir(data_dir: str, field: str, vocab_size: int, max_seq_length: int | None = None,
                   max_predictions_per_seq: int | None = None, masking: dict | None = None) -> dict:
    """The metadata.json of the instance directory in config `field` (pre-training's `validate`), checked against
    the model's `vocab_size` and, when given, the phase's length, predictions and masking
    (`procedure.MASKING_FIELDS`; static instances were masked when written, so a phase's field must equal the
    metadata flag), and its shards present and complete (so that phase 2's or the eval's data fail at the start,
    not at their first use). One-line FileNotFoundError / ValueError."""
    from bert_jax import storage

    meta_file = storage.join(data_dir, "metadata.json")
    if not storage.is_file(meta_file):
        raise FileNotFoundError(f"{field}={data_dir!r}: no metadata.json "
                                "(run python -m bert_jax.data.create_pretraining_data first)")
    meta = formats.read_metadata(data_dir)
    if meta.get("vocab_size", 0) > vocab_size:
        raise ValueError(f"{data_dir}: vocabulary of {meta['vocab_size']} tokens exceeds "
                         f"config.model.vocab_size={vocab_size}")
    if formats.is_documents(meta):  # tokenized documents: instances are drawn at any length
        formats.check(data_dir, meta)
        return meta
    flags = meta["flags"]
    if max_seq_length is not None and (flags["max_seq_length"], flags["max_predictions_per_seq"]) != (
            max_seq_length, max_predictions_per_seq):
        raise ValueError(f"{field.rsplit('.', 1)[0]} wants length {max_seq_length} / {max_predictions_per_seq} "
                         f"predictions but {data_dir} holds {flags['max_seq_length']} / {flags['max_predictions_per_seq']}")
    mismatch = procedure.masking_mismatch(flags, masking or {})
    if mismatch:
        name, wanted, held = mismatch
        phase = field.rsplit(".", 1)[0]
        raise ValueError(f"{phase}.{name}={wanted} but {data_dir} holds static instances masked with "
                         f"{name}={held} (fixed when they were written): set {phase}.{name}={held}, or give the "
                         f"phase tokenized documents (create_pretraining_data --tokenize_only), drawn while "
                         f"training with its masking")
    formats.check(data_dir, meta)
    return meta
