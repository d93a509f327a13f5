"""The shared data folder of the benchmarks (and tests): `$BERT_JAX_DATA`, default ../shared/data beside the
repository, and the layout of its corpora and task files (../shared/data/README.md). Library code never
knows this folder: the benchmarks hand its files to `bert_jax` as arguments."""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = pathlib.Path(os.environ.get("BERT_JAX_DATA", ROOT.parent / "shared" / "data"))

# Corpora: name -> (bert_jax.experiments.transfer reader, files under DATA). Task corpora read only the training split.
SOURCES = {
    "gutenberg": ("sentences", ("corpus/gutenberg-sentences.txt",)),
    "wikitext": ("wikitext", ("corpus/wikitext-2/valid.txt", "corpus/wikitext-2/test.txt")),
    "squad": ("squad", ("squad/train-v1.1-subset-44articles.json",)),
    "sst2": ("glue:sst2", ("glue/SST-2/train.tsv",)),
    "mrpc": ("glue:mrpc", ("glue/MRPC/train.tsv",)),
}
# The task files of bert_jax.experiments.transfer.PROBES' tasks, as config fields.
TASK_FILES = {"sst2": {"data_dir": "glue/SST-2"}, "mrpc": {"data_dir": "glue/MRPC"},
              "squad": {"train_file": "squad/train-v1.1-subset-44articles.json", "predict_file": "squad/dev-v1.1.json"}}


def sources(names, data_dir: str | os.PathLike = DATA) -> list[tuple[str, str, list[str]]]:
    """`SOURCES` entries as (name, reader, files) with the files under `data_dir`, for
    `bert_jax.experiments.transfer.write_corpus` / `read_documents`.

    Raises:
      ValueError: an unknown name.
    """
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise ValueError(f"corpus source {unknown[0]!r} is not one of {sorted(SOURCES)}")
    return [(n, SOURCES[n][0], [os.path.join(data_dir, f) for f in SOURCES[n][1]]) for n in names]


def task_files(task: str, data_dir: str | os.PathLike = DATA) -> dict[str, str]:
    """The config fields naming `task`'s files under `data_dir` (GLUE: data_dir; SQuAD: train_file, predict_file)."""
    return {k: os.path.join(data_dir, v) for k, v in TASK_FILES[task].items()}
