"""The shared data folder of the benchmarks and tests (`data_dir`: `$BERT_JAX_DATA`, default ../shared/data beside
the repository, else the repository's .data where `make test` downloads the public files), and the layout of its corpora and task files (../shared/data/README.md). Library code never
knows this folder: the benchmarks hand its files to `bert_jax` as arguments."""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def data_dir(root: pathlib.Path = ROOT) -> pathlib.Path:
    """The real-data folder: $BERT_JAX_DATA; else ../shared/data beside the checkout `root` where it exists (CI);
    else `root`/.data, where `make test` downloads the public files on a fresh clone (`python -m
    bert_jax.data.download all --output_dir .data`), so that `pytest` and the benchmarks alone find them too."""
    if "BERT_JAX_DATA" in os.environ:
        return pathlib.Path(os.environ["BERT_JAX_DATA"]).resolve()
    shared = root.parent / "shared" / "data"
    return (shared if shared.is_dir() or not (root / ".data").is_dir() else root / ".data").resolve()


DATA = data_dir()

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
