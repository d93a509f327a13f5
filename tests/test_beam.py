"""Preparation on Apache Beam (`bert_jax.data.pretraining.beam_pipeline`): every output file byte-equal to the local
path's (metadata.json equal but for "seconds") on Beam's DirectRunner, in_memory and multi_processing, for
tokenized documents and static instances, shard counts 1, 3 and 7, on the original's sample text and on a
slice of Gutenberg with documents left empty and invalid UTF-8 lines; exact de-duplication against counts
worked out by hand; bad input refused in one line with nothing left behind.

apache-beam comes with the test extra (a missing install is a failure, not a skip).
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, write_text_tfds
from test_bad_input import check_refused
from test_remote_data import _same_directory, s3  # s3: the fake object store fixture

from bert_jax.data.pretraining import beam_pipeline, document_shards, procedure
from bert_jax.data import corpus, dedupe

OPTIONS = procedure.InstanceOptions(max_seq_length=64, max_predictions_per_seq=10)


@pytest.fixture(scope="module")
def gutenberg_files(data_dir, tmp_path_factory):
    """Three files: two slices of Gutenberg (documents cut every 150 lines) with invalid UTF-8 lines, a
    document of zero-width spaces only (no token: dropped, counted) and an empty-line run between them."""
    lines = (data_dir / "corpus" / "gutenberg-sentences.txt").read_bytes().splitlines()[:1200]
    tmp = tmp_path_factory.mktemp("gutenberg")
    paths = []
    for i, part in enumerate((lines[:600], lines[600:])):
        body = b""
        for s in range(0, len(part), 150):
            body += b"\n".join(part[s : s + 150]) + b"\n\n\n"
            body += b"bad \xff\xfe bytes\n" if s % 300 == 0 else b""
        body += "\u200b\n\u200b \u200d\n\n".encode()  # a document without a token
        paths.append(tmp / f"part-{i}.txt")
        paths[-1].write_bytes(body)
    paths.append(tmp / "part-2.txt")
    paths[-1].write_bytes("\u200b\n\n".encode() + b"\n".join(lines[1200 - 80 :]) + b"\n")
    return [str(p) for p in paths]


def _local(files, tokenizer, out, *, tokenize_only, num_shards, dedupe_mode="none", input_format="sentences",
           extra=None):
    """The local path as create_pretraining_data runs it."""
    stats = corpus.ReadStats()
    documents = dedupe.drop_repeats(beam_pipeline.READERS[input_format](files, stats), dedupe_mode,
                                    dedupe.first_seen(), stats)
    if tokenize_only:
        return document_shards.tokenize_documents(documents, tokenizer, str(out), num_shards=num_shards,
                                                  read_stats=stats, extra_metadata=extra or {"source": "test"})
    return procedure.create_pretraining_data(documents, tokenizer, str(out), options=OPTIONS, dupe_factor=2,
                                               random_seed=3, num_shards=num_shards, read_stats=stats,
                                               extra_metadata=extra or {"source": "test"})


def _beam(files, tokenizer, out, *, tokenize_only, num_shards, mode, dedupe_mode="none", input_format="sentences"):
    args = ["--runner=DirectRunner", f"--direct_running_mode={mode}", "--direct_num_workers=2"]
    parts = files if isinstance(files[0], beam_pipeline.Part) else beam_pipeline.file_parts(files, input_format)
    return beam_pipeline.run(parts, tokenizer, str(out), beam_args=args, tokenize_only=tokenize_only,
                             num_shards=num_shards, options=OPTIONS, dupe_factor=2, random_seed=3,
                             dedupe_mode=dedupe_mode, extra_metadata={"source": "test"})


def _assert_same(local, beam):
    names = sorted(os.listdir(local))
    assert names == sorted(os.listdir(beam)), (names, os.listdir(beam))
    for name in names:
        a, b = (local / name).read_bytes(), (beam / name).read_bytes()
        if name == "metadata.json":
            a, b = json.loads(a), json.loads(b)
            assert a.pop("seconds") >= 0 and b.pop("seconds") >= 0
        assert a == b, name
    assert not [p for p in os.listdir(beam.parent) if p.startswith(".")], "staging left behind"


@pytest.mark.parametrize(("num_shards", "mode"), [(1, "in_memory"), (3, "multi_threading"), (7, "in_memory")])
def test_sample_text(num_shards, mode, data_dir, tokenizer, tmp_path):
    """Both outputs; seven shards of three documents leave four empty. (Worker processes: the CLI test below and
    docs/pretraining-data.md's command.)"""
    files = [str(data_dir / "corpus" / "bert_sample_text.txt")]
    for tokenize_only in (True, False):
        kind = "documents" if tokenize_only else "instances"
        _local(files, tokenizer, tmp_path / f"local-{kind}", tokenize_only=tokenize_only, num_shards=num_shards)
        _beam(files, tokenizer, tmp_path / f"beam-{kind}", tokenize_only=tokenize_only, num_shards=num_shards,
              mode=mode)
        _assert_same(tmp_path / f"local-{kind}", tmp_path / f"beam-{kind}")


def test_gutenberg_multi_processing_cli(gutenberg_files, tokenizer, vocab_file, tmp_path):
    """The documented command (docs/pretraining-data.md): two worker processes; here three files, seven shards,
    static instances (the documents stage runs inside)."""
    extra = {"input_file": ",".join(gutenberg_files), "tfds_name": None, "input_format": "sentences",
             "do_lower_case": True}
    meta = _local(gutenberg_files, tokenizer, tmp_path / "local", tokenize_only=False, num_shards=7, extra=extra)
    assert meta["skipped"]["invalid_utf8_lines"] == 4 and meta["num_documents"] == 9, meta
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.data.create_pretraining_data", f"--input_file={extra['input_file']}",
         f"--output_dir={tmp_path / 'beam'}", f"--vocab_file={vocab_file}", "--max_seq_length=64",
         "--max_predictions_per_seq=10", "--dupe_factor=2", "--random_seed=3", "--num_shards=7",
         "--runner=DirectRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"wrote {meta['num_instances']} instances in 7 shard(s)"), result.stdout
    _assert_same(tmp_path / "local", tmp_path / "beam")


def test_gutenberg_documents_in_memory(gutenberg_files, tokenizer, tmp_path):
    meta = _local(gutenberg_files, tokenizer, tmp_path / "local", tokenize_only=True, num_shards=3)
    assert meta["skipped"]["empty_documents"] == 3 and meta["skipped"]["invalid_utf8_lines"] == 4, meta
    _beam(gutenberg_files, tokenizer, tmp_path / "beam", tokenize_only=True, num_shards=3, mode="in_memory")
    _assert_same(tmp_path / "local", tmp_path / "beam")


def test_dedupe_counts_and_beam_equal(tokenizer, tmp_path):
    # Documents: a1 [cat, dog], a2 [cat, dog], a3 [birds], b1 [cat, dog], b2 [birds, fish].
    # Lines: a2's two and b1's two lines and b2's "birds" repeat -> 5 repeated lines; a2 and b1 are left
    # empty -> 2 repeated documents. Documents: a2 and b1 repeat a1 -> 2 repeated documents, 3 kept.
    (tmp_path / "a.txt").write_text("the cat sat.\na dog ran.\n\nthe cat sat.\na dog ran.\n\nbirds fly high.\n")
    (tmp_path / "b.txt").write_text("the cat sat.\na dog ran.\n\nbirds fly high.\nfish swim.\n")
    files = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    expected = {"lines": (5, 2), "documents": (0, 2)}  # (repeated lines, repeated documents)
    for mode, (lines, documents) in expected.items():
        meta = _local(files, tokenizer, tmp_path / f"local-{mode}", tokenize_only=True, num_shards=2, dedupe_mode=mode)
        assert (meta["skipped"]["repeated_lines"], meta["skipped"]["repeated_documents"]) == (lines, documents), mode
    assert meta["num_documents"] == 3  # documents mode: 5 read, 2 repeats
    _beam(files, tokenizer, tmp_path / "beam-lines", tokenize_only=True, num_shards=2, mode="in_memory",
          dedupe_mode="lines")
    _assert_same(tmp_path / "local-lines", tmp_path / "beam-lines")
    assert "repeated_lines" not in _local(files, tokenizer, tmp_path / "none", tokenize_only=True,
                                          num_shards=1)["skipped"]


def test_bad_input_one_line_nothing_written(data_dir, vocab_file, tmp_path):
    (tmp_path / "afile").write_text("not a directory\n")
    corpus_file = str(data_dir / "corpus" / "bert_sample_text.txt")
    base = ["bert_jax.data.create_pretraining_data", f"--vocab_file={vocab_file}"]
    ok = [f"--input_file={corpus_file}", f"--output_dir={tmp_path / 'out'}"]
    check_refused(tmp_path, base + [f"--input_file={tmp_path / 'missing.txt'}", f"--output_dir={tmp_path / 'out'}",
                                    "--runner=DirectRunner"], "create_pretraining_data: ", "matches no file")
    check_refused(tmp_path, base + [f"--input_file={corpus_file}", f"--output_dir={tmp_path / 'afile' / 'out'}",
                                    "--runner=DirectRunner"], "inside", "not a directory")
    check_refused(tmp_path, base + ok + ["--runner=NoSuchRunner"], "--runner=NoSuchRunner")
    check_refused(tmp_path, base + ok + ["--runner=DirectRunner", "--direct_num_workers=two"],
                  "direct_num_workers", "two")
    check_refused(tmp_path, base + ok + ["--direct_num_workers=2"], "unknown flags", "--runner")


def test_static_instances_at_a_uri(s3, data_dir, tokenizer, tmp_path):
    """Shards uploaded by the workers, the temporary documents under the URI read back and removed."""
    files = [str(data_dir / "corpus" / "bert_sample_text.txt")]
    _local(files, tokenizer, tmp_path / "local", tokenize_only=False, num_shards=3)
    _beam(files, tokenizer, f"{s3}/p1", tokenize_only=False, num_shards=3, mode="in_memory")
    _same_directory(f"{s3}/p1", tmp_path / "local")


def test_tfds_dataset_in_parts(data_dir, tokenizer, tmp_path):
    """A TFDS text dataset (prepared offline) read by parts of two examples: the documents of one read."""
    paragraphs = [p for p in (data_dir / "corpus" / "bert_sample_text.txt").read_text().split("\n\n") if p.strip()]
    # Each paragraph on one line, twice; every fourth example a zero-width space alone (no token).
    texts = [" ".join(p.split("\n")) if i % 4 != 1 else "\u200b" for i, p in enumerate(paragraphs * 2)]
    tfds_dir = str(tmp_path / "tfds")
    write_text_tfds("beam_sample_corpus", texts, tfds_dir)
    stats = corpus.ReadStats()
    document_shards.tokenize_documents(corpus.read_tfds_documents("beam_sample_corpus", "train", "text", tfds_dir, stats),
                                       tokenizer, str(tmp_path / "local"), num_shards=2, read_stats=stats,
                                       extra_metadata={"source": "test"})
    parts = beam_pipeline.tfds_parts("beam_sample_corpus", "train", "text", tfds_dir, examples_per_part=2)
    assert len(parts) == 3
    _beam(parts, tokenizer, tmp_path / "beam", tokenize_only=True, num_shards=2, mode="in_memory")
    _assert_same(tmp_path / "local", tmp_path / "beam")


def test_num_workers_goes_to_the_runner_as_its_own_option():
    """--num_workers with --runner is Apache Beam's option of that name (Dataflow's initial number of workers), as
    Beam's own parser reads it; not given, the runner's default stands."""
    from apache_beam.options.pipeline_options import PipelineOptions, WorkerOptions

    from bert_jax.data.pretraining import beam_pipeline

    args = beam_pipeline.runner_args("DataflowRunner", 40, ["--region=europe-west4"])
    assert args == ["--runner=DataflowRunner", "--num_workers=40", "--region=europe-west4"]
    assert PipelineOptions(args).view_as(WorkerOptions).num_workers == 40
    args = beam_pipeline.runner_args("DataflowRunner", None, [])
    assert args == ["--runner=DataflowRunner"] and PipelineOptions(args).view_as(WorkerOptions).num_workers is None
