"""Pre-training data on Apache Beam: the tokenized documents and the static instances of
`bert_jax.data.create_pretraining_data`, byte for byte, on any Beam runner.

  python -m bert_jax.data.create_pretraining_data --input_file=corpus/*.txt --output_dir=out \\
      --vocab_file=vocab.txt --num_shards=64 --runner=DirectRunner --direct_num_workers=2 \\
      --direct_running_mode=multi_processing

(`--runner` and the options after it are Beam's: DataflowRunner, FlinkRunner, SparkRunner at scale.) The
work is the local path's, done by its own functions on Beam's workers:
  1. each part of the corpus (`Part`: an input file, or a range of a TFDS dataset's examples) is read
     (`bert_jax.data.corpus`), filtered of repeats (`bert_jax.data.dedupe`: the repeats are found first,
     across the whole corpus, from hashes) and tokenized in batches (`document_shards.tokenize_batch`) by one
     worker; its k-th kept document is the corpus's document offset[part] + k, the offsets being the kept
     documents of the parts before it (input order);
  2. document j goes to shard j % n at place j // n; each shard is sorted by place and written
     (`document_shards.WRITER_OPTIONS`), with token_counts.npy and the metadata (`documents_metadata`);
  3. static instances (without --tokenize_only): the documents of step 2 are a temporary tokenized-documents
     directory; each output shard s is one element: its units of work (`procedure.shard_tasks`,
     `task_records`, reading any document for NotNext segments through `document_shards.Documents`) and its
     shuffle (`procedure.write_shard`) run on one worker, from the shard's own random streams.
Nothing depends on the order in which the runner hands elements over, so the output equals the local
path's for the same corpus, vocabulary, seed and shard count (metadata.json but for "seconds").

Outputs: a local --output_dir is built in a staging directory beside it and its files renamed into it; a URI
(gs://...) gets each shard uploaded by the worker that wrote it (`storage.publish`), temporary files under
`<output_dir>/.beam-staging`. metadata.json is written last by the launching process either way.
Parallelism: parts in step 1 (one file is read by one worker: split a large corpus into many files), shards
in steps 2 and 3; a shard's records are sorted in one worker's memory in step 2.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from bert_jax import storage
from bert_jax.data import corpus, dedupe
from bert_jax.data.pretraining import document_shards, formats, procedure

READERS = {"sentences": corpus.read_sentence_documents, "text": corpus.read_text_documents}
TFDS_EXAMPLES_PER_PART = 10000  # examples of a TFDS dataset one worker reads and tokenizes


@dataclasses.dataclass(frozen=True)
class Part:
    """What one worker reads in step 1: a text file in an input format (`READERS`), or examples start ..
    stop - 1 of a TFDS text dataset (`tfds`: name, split, text key, data_dir; `corpus.read_tfds_documents`)."""

    input_format: str = "sentences"
    path: str | None = None
    tfds: tuple[str, str, str, str | None] | None = None
    start: int = 0
    stop: int = 0

    def documents(self, stats: corpus.ReadStats):
        """Its documents in corpus order (lists of sentence strings), counting what reading skips in `stats`."""
        if self.tfds:
            return corpus.read_tfds_documents(*self.tfds, stats, start=self.start, stop=self.stop)
        return READERS[self.input_format]([self.path], stats)


def file_parts(files: Sequence[str], input_format: str) -> list[Part]:
    """One `Part` per input file, in order.

    Raises:
      ValueError: an input format not in READERS.
    """
    return [Part(input_format, path=f) for f in files]


def tfds_parts(name: str, split: str, text_key: str, data_dir: str | None,
               examples_per_part: int = TFDS_EXAMPLES_PER_PART) -> list[Part]:
    """A prepared TFDS text dataset as `Part`s of `examples_per_part` examples, in order (the same documents
    as `corpus.read_tfds_documents` reads at once)."""
    size = len(corpus.tfds_source(name, split, data_dir))
    return [Part(tfds=(name, split, text_key, data_dir), start=s, stop=min(s + examples_per_part, size))
            for s in range(0, size, examples_per_part)]
RESULT_NAME = "result.json"  # the pipeline's metadata, for the launcher (in the control directory)


def runner_args(runner: str, num_workers: int | None, beam_args: Sequence[str]) -> list[str]:
    """Apache Beam's pipeline arguments of a `create_pretraining_data --runner` run: --runner, --num_workers where the
    command line gave it (Beam's own option of that name: Dataflow's initial number of workers; None: the runner's
    default), then the remaining arguments `beam_args` (--name=value, Beam's pipeline options)."""
    workers = [f"--num_workers={num_workers}"] if num_workers is not None else []
    return [f"--runner={runner}", *workers, *beam_args]


def _import_beam():
    """apache_beam, imported without the warnings its optional cloud clients log on import."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        import apache_beam as beam  # the `beam` extra; only this path needs it
    except ImportError:
        raise ValueError("--runner needs Apache Beam: pip install -e '.[beam]'") from None
    finally:
        root.setLevel(level)
    logging.getLogger("apache_beam").setLevel(logging.WARNING)  # a line per stage and worker otherwise
    logging.getLogger("apache_beam.runners.dataflow").setLevel(logging.INFO)  # the job's URL
    return beam


def pipeline_options(args: Sequence[str]):
    """(Beam's `PipelineOptions`, the runner) from command-line arguments (`--runner=...` and the runner's
    options). DirectRunner is Beam's FnApiRunner (what DirectRunner runs this pipeline on without Prism).

    Raises:
      ValueError: an argument that is not a Beam pipeline option, a bad value, or an unknown runner (one line
        naming it).
    """
    _import_beam()
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    options = PipelineOptions(list(args))
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            known = options.get_all_options(retain_unknown_options=False)
    except SystemExit:  # argparse's error: the last line of what it printed names the option
        lines = stderr.getvalue().strip().splitlines() or ["a bad pipeline option"]
        raise ValueError(f"Beam pipeline options: {lines[-1].split('error: ')[-1]}") from None
    for arg in args:
        name = arg.lstrip("-").split("=", 1)[0]
        if not arg.startswith("--") or name.replace("-", "_") not in known:
            raise ValueError(f"{arg!r} is not an Apache Beam pipeline option")
    name = options.view_as(StandardOptions).runner
    if name in ("DirectRunner", "BundleBasedDirectRunner"):
        # The DirectRunner would first try Prism (a Go binary it downloads) and ignore the direct_* options
        # there; its FnApiRunner, made as the DirectRunner makes it, honours them (direct_running_mode
        # in_memory, multi_threading, multi_processing; direct_num_workers). The workers' logs go to this
        # terminal: quiet unless asked for (a worker's error is raised in this process, `run`).
        if not any(arg.startswith("--default_sdk_harness_log_level") for arg in args):
            options = PipelineOptions([*args, "--default_sdk_harness_log_level=CRITICAL"])
        from apache_beam.portability.api import beam_provision_api_pb2
        from apache_beam.runners.portability import portable_runner
        from apache_beam.runners.portability.fn_api_runner import fn_runner

        encoded = portable_runner.JobServiceHandle.encode_pipeline_options(options.get_all_options())
        info = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
        return options, fn_runner.FnApiRunner(provision_info=info)
    try:
        from apache_beam.runners.runner import create_runner

        runner = create_runner(name)
    except (ValueError, ImportError) as e:
        raise ValueError(f"--runner={name}: {str(e).splitlines()[0]}") from None
    return options, runner


_USER_ERROR = re.compile(r"^(?:builtins\.)?(ValueError|UnicodeDecodeError|OSError|FileNotFoundError|PermissionError|"
                         r"NotADirectoryError|IsADirectoryError|FileExistsError): (.+?)(?: \[while running .*\])?$")


def _user_error(error: Exception) -> Exception:
    """The error a worker raised for bad input (a ValueError or OSError, as the runner reports it: re-raised or
    as text) as that type with its own one-line message; any other error as it is (a defect)."""
    if isinstance(error, (ValueError, OSError)):  # re-raised as it was, Beam's step name appended
        return (OSError if isinstance(error, OSError) else ValueError)(re.sub(r" \[while running .*\]$", "", str(error)))
    found = [m for m in map(_USER_ERROR.match, str(error).splitlines()) if m]
    if not found:
        return error
    name, message = found[-1].groups()
    return ValueError(message) if name in ("ValueError", "UnicodeDecodeError") else OSError(message)


def _sum_stats(stats: Sequence[dict]) -> dict:
    """Per-part counts (numbers and numpy arrays) added up."""
    total: dict = {}
    for s in stats:
        for key, value in s.items():
            total[key] = total[key] + value if key in total else value
    return total


def _read_stats(stats: dict, dedupe_mode: str) -> corpus.ReadStats:
    """The corpus's `ReadStats` from the parts' counts added up."""
    fields = {f.name for f in dataclasses.fields(corpus.ReadStats)} - {"dedupe"}
    return corpus.ReadStats(**{k: v for k, v in stats.items() if k in fields},
                            dedupe="" if dedupe_mode == "none" else dedupe_mode)


def _put(dest: str, name: str, write) -> None:
    """Calls write(local_path) to make the file `name`, then renames or uploads it into `dest` whole."""
    work = tempfile.mkdtemp(prefix=".bert_jax-beam-", dir=None if storage.is_remote(dest) else dest)
    try:
        write(os.path.join(work, name))
        storage.publish(work, dest, [name])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _make_dofns(beam):
    """The pipeline's DoFns (defined once Beam is imported)."""

    class PartRepeats(beam.DoFn):
        """(part index, `Part`) -> (hash, (part index, place)) of each line or document (`dedupe.keys`)."""

        def __init__(self, mode: str):
            self.mode = mode

        def process(self, element):
            part_index, part = element
            for place, key in dedupe.keys(part.documents(corpus.ReadStats()), self.mode):
                yield key, (part_index, place)

    class TokenizePart(beam.DoFn):
        """(part index, (`Part`, repeats)) -> (part index, k, record) of its kept documents; tagged "parts":
        (part index, kept documents), "stats": the part's counts."""

        def __init__(self, mode: str, tokenizer):
            self.mode, self.tokenizer = mode, tokenizer

        def process(self, element):
            part_index, (part, repeats) = element
            stats, read = corpus.ReadStats(), collections.Counter()
            repeats = {tuple(place) for place in repeats}
            documents = dedupe.drop_repeats(part.documents(stats), self.mode,
                                            lambda place, key: place in repeats, stats)
            k = dropped = sentences = 0
            counts = np.zeros(self.tokenizer.vocab_size, np.int64)
            for batch in document_shards.batches(documents, read):
                records, batch_dropped, batch_sentences, batch_counts = document_shards.tokenize_batch(
                    self.tokenizer, batch)
                for record in filter(None, records):
                    yield part_index, k, record
                    k += 1
                dropped, sentences, counts = dropped + batch_dropped, sentences + batch_sentences, counts + batch_counts
            yield beam.pvalue.TaggedOutput("parts", (part_index, k))
            yield beam.pvalue.TaggedOutput("stats", {
                **{k: v for k, v in dataclasses.asdict(stats).items() if k != "dedupe"},
                "documents_read": read["documents"], "dropped_sentences": dropped, "sentences": sentences,
                "token_counts": counts})

    class WriteDocumentShard(beam.DoFn):
        """(shard, [(place, record) or None]) -> (shard, documents): the shard file, records in place order."""

        def __init__(self, dest: str, num_shards: int):
            self.dest, self.num_shards = dest, num_shards

        def process(self, element):
            shard, items = element
            items = sorted(item for item in items if item is not None)
            assert [place for place, _ in items] == list(range(len(items))), "document places are not contiguous"

            def write(path):
                writer = ArrayRecordWriter(path, document_shards.WRITER_OPTIONS)
                try:
                    for _, record in items:
                        writer.write(record)
                finally:
                    writer.close()

            _put(self.dest, document_shards.shard_names(self.num_shards)[shard], write)
            yield shard, len(items)

    class WriteInstanceShard(beam.DoFn):
        """shard -> (shard, instances): the static instances' shard file, from the documents' directory."""

        def __init__(self, dest: str, documents_dir: str, num_shards: int, tokenizer, options, flags: dict):
            self.dest, self.documents_dir, self.num_shards = dest, documents_dir, num_shards
            self.tokenizer, self.options, self.flags = tokenizer, options, flags

        def process(self, shard, documents_metadata):
            documents = document_shards.Documents(self.documents_dir, documents_metadata)
            vocab = procedure.VocabInfo.from_tokenizer(self.tokenizer)
            name = os.path.basename(procedure.shard_paths("", self.num_shards)[shard])
            count = []

            def write(path):
                bucket = procedure.ShardBucket(path + ".bucket")
                try:
                    for task in procedure.shard_tasks(len(documents), self.num_shards, shard, **self.flags):
                        bucket.add(procedure.task_records(documents, task, self.options, vocab))
                finally:
                    bucket.close()
                count.append(procedure.write_shard(bucket.path, path, self.flags["random_seed"], shard))

            _put(self.dest, name, write)
            yield shard, count[0]

    return PartRepeats, TokenizePart, WriteDocumentShard, WriteInstanceShard


def _documents_metadata(stats: dict, dedupe_mode: str, shard_documents: list, tokenizer,
                        extra_metadata: dict) -> dict:
    counts = [n for _, n in sorted(shard_documents)]
    metadata = document_shards.documents_metadata(
        shard_documents=counts, num_sentences=stats["sentences"], num_tokens=int(stats["token_counts"].sum()),
        skipped={**_read_stats(stats, dedupe_mode).skipped(), "empty_sentences": stats["dropped_sentences"],
                 "empty_documents": stats["documents_read"] - sum(counts)},
        tokenizer=tokenizer, extra_metadata=extra_metadata, seconds=0.0)
    if sum(counts) == 0:
        raise ValueError("the input holds no document with a non-empty sentence")
    return metadata


def run(parts: Sequence[Part], tokenizer, output_dir: str, *, beam_args: Sequence[str],
        tokenize_only: bool, num_shards: int, options: procedure.InstanceOptions | None = None,
        dupe_factor: int = 10, random_seed: int = 12345, documents_per_task: int = 8, dedupe_mode: str = "none",
        extra_metadata: dict | None = None) -> dict:
    """Writes tokenized documents (`tokenize_only`) or static instances of `parts` into `output_dir` on the
    Beam runner `beam_args` name (module docstring) -> the metadata written. The arguments are those of
    `document_shards.tokenize_documents` and `procedure.create_pretraining_data` (the same output).

    Args:
      parts: the corpus in order, each read by one worker (`file_parts`, `tfds_parts`).
      beam_args: Beam's command-line options, `--runner=...` among them (`pipeline_options`).
      dedupe_mode: "none", "lines" or "documents" (`bert_jax.data.dedupe`).

    Raises:
      ValueError: bad options or counts, bad Beam options, or a corpus with no usable document.
      OSError: an output directory that cannot be made; errors of the workers as the runner reports them.
    """
    options = options or procedure.InstanceOptions()
    procedure.check_counts(options, num_shards=num_shards, dupe_factor=dupe_factor,
                             documents_per_task=documents_per_task)
    beam_options, runner = pipeline_options(beam_args)
    beam = _import_beam()
    start = time.time()
    remote = storage.is_remote(output_dir)
    control = storage.join(output_dir, ".beam-staging") if remote else storage.staging_dir(output_dir)
    shards_dest = output_dir if remote else control
    documents_dir = control if tokenize_only else storage.join(control, "documents")
    documents_dest = shards_dest if tokenize_only else documents_dir
    try:
        if remote:  # the workers write the shards into output_dir itself: no old metadata.json over them
            formats.unpublish(output_dir)
        storage.makedirs(documents_dir)
        if not tokenize_only:  # the temporary documents directory: complete for `document_shards.Documents`
            _put(documents_dir, formats.VOCAB_NAME, lambda path: shutil.copyfile(tokenizer.vocab_file, path))
        extra = dict(extra_metadata or {})
        PartRepeats, TokenizePart, WriteDocumentShard, WriteInstanceShard = _make_dofns(beam)
        beam_logger = logging.getLogger("apache_beam")
        level = beam_logger.level
        beam_logger.setLevel(logging.CRITICAL)  # a worker's error is raised below, not logged with its traceback
        try:
            with beam.Pipeline(runner=runner, options=beam_options) as p:
                indexed = p | "parts" >> beam.Create(list(enumerate(parts)))
                if dedupe_mode == "none":
                    repeats = p | "no repeats" >> beam.Create([])
                else:
                    repeats = (indexed | "hash" >> beam.ParDo(PartRepeats(dedupe_mode))
                               | "by hash" >> beam.GroupByKey()
                               | "repeats" >> beam.FlatMap(lambda kv: [(f, place) for f, place in sorted(kv[1])[1:]]))
                per_part = ({"part": indexed, "repeats": repeats} | "join repeats" >> beam.CoGroupByKey()
                            | "with repeats" >> beam.Map(lambda kv: (kv[0], (kv[1]["part"][0], kv[1]["repeats"]))))
                tokenized = per_part | "tokenize" >> beam.ParDo(TokenizePart(dedupe_mode, tokenizer)) \
                    .with_outputs("parts", "stats", main="documents")
                offsets = tokenized.parts | "offsets" >> beam.combiners.ToList() | beam.Map(
                    lambda counts: dict(zip(sorted(f for f, _ in counts),
                                            np.cumsum([0] + [n for _, n in sorted(counts)][:-1]).tolist())))
                stats = tokenized.stats | "stats" >> beam.combiners.ToList() | beam.Map(_sum_stats)

                def place(document, offsets):
                    part_index, k, record = document
                    j = offsets[part_index] + k
                    return j % num_shards, (j // num_shards, record)

                placed = tokenized.documents | "place" >> beam.Map(place, beam.pvalue.AsSingleton(offsets))
                every_shard = p | "every shard" >> beam.Create([(s, None) for s in range(num_shards)])
                shard_documents = ((placed, every_shard) | beam.Flatten() | "by shard" >> beam.GroupByKey()
                                   | "write documents" >> beam.ParDo(WriteDocumentShard(documents_dest, num_shards))
                                   | "shard documents" >> beam.combiners.ToList())

                def finish_documents(_, stats, shard_documents):
                    metadata = _documents_metadata(stats, dedupe_mode, shard_documents, tokenizer, extra)
                    _put(documents_dest, formats.COUNTS_NAME, lambda path: np.save(path, stats["token_counts"]))
                    if not tokenize_only:  # the temporary directory step 3 reads: complete
                        storage.write_json(storage.join(documents_dir, formats.METADATA_NAME), metadata)
                    return metadata

                documents_metadata = p | "documents done" >> beam.Create([None]) | beam.Map(
                    finish_documents, beam.pvalue.AsSingleton(stats), beam.pvalue.AsSingleton(shard_documents))
                if tokenize_only:
                    result = documents_metadata
                else:
                    flags = dict(dupe_factor=dupe_factor, random_seed=random_seed, documents_per_task=documents_per_task)
                    shard_counts = (p | "instance shards" >> beam.Create(list(range(num_shards)))
                                    | "write instances" >> beam.ParDo(
                                        WriteInstanceShard(shards_dest, documents_dir, num_shards, tokenizer, options,
                                                           flags), beam.pvalue.AsSingleton(documents_metadata))
                                    | "shard instances" >> beam.combiners.ToList())

                    def finish_instances(_, stats, documents, shard_counts):
                        return procedure.instances_metadata(
                            shard_counts=[n for _, n in sorted(shard_counts)], num_documents=documents["num_documents"],
                            num_sentences=documents["num_sentences"], num_tokens=documents["num_tokens"],
                            skipped={**_read_stats(stats, dedupe_mode).skipped(),
                                     "empty_sentences": stats["dropped_sentences"]},
                            input_lines=stats["lines"], tokenizer=tokenizer, options=options, extra_metadata=extra,
                            seconds=0.0, **flags)

                    result = p | "instances done" >> beam.Create([None]) | beam.Map(
                        finish_instances, beam.pvalue.AsSingleton(stats), beam.pvalue.AsSingleton(documents_metadata),
                        beam.pvalue.AsSingleton(shard_counts))
                _ = result | "result" >> beam.Map(lambda m: storage.write_json(storage.join(control, RESULT_NAME), m))
        except Exception as e:
            raise _user_error(e) from None
        finally:
            beam_logger.setLevel(level)
        metadata = storage.read_json(storage.join(control, RESULT_NAME))
        metadata["seconds"] = round(time.time() - start, 3)
        names = metadata["shards"] + ([formats.COUNTS_NAME] if tokenize_only else [])
        if not remote:
            formats.unpublish(output_dir)
            storage.publish(control, output_dir, names)
        _put(output_dir, formats.VOCAB_NAME, lambda path: shutil.copyfile(tokenizer.vocab_file, path))
        storage.write_json(storage.join(output_dir, formats.METADATA_NAME), metadata)
        return metadata
    finally:
        if remote:
            with contextlib.suppress(OSError):
                from etils import epath

                epath.Path(control).rmtree()
        else:
            shutil.rmtree(control, ignore_errors=True)
