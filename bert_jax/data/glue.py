"""GLUE data for the nine tasks: the official GLUE TSV files or TFDS `glue/*` -> fixed-length features.

Tasks (`TASKS`, keyed by TFDS config name) and their files in the GLUE download's layout
(`<GLUE_DIR>/<folder>/{train,dev,test}.tsv`):

  task   folder  labels (index order)                   train/dev columns            test columns
  cola   CoLA    0 1                                    4, no header: label 1, text 3  2: index, sentence
  sst2   SST-2   0 1                                    2: sentence, label             2: index, sentence
  mrpc   MRPC    0 1                                    5: label 0, texts 3, 4         5: index, ..., texts 3, 4
  stsb   STS-B   score in [0, 5] (regression)           10: texts 7, 8, score last     9: texts 7, 8
  qqp    QQP     0 1                                    6: texts 3, 4, label 5         3: id, texts 1, 2
  mnli   MNLI    contradiction entailment neutral       12 (train) / 16 (dev): texts   10: texts 8, 9
                                                        8, 9, gold label last
  qnli   QNLI    entailment not_entailment              4: index, texts 1, 2, label    3: index, texts 1, 2
  rte    RTE     entailment not_entailment              4 (as QNLI)                    3
  wnli   WNLI    0 1                                    4 (as QNLI)                    3

MNLI's dev sets are dev_matched.tsv and dev_mismatched.tsv, its test sets test_matched.tsv and
test_mismatched.tsv. GLUE's diagnostic set (`AX`, read as task "ax": diagnostic/diagnostic.tsv, 3 columns
index, sentence1, sentence2, or TFDS glue/ax) is predicted with the MNLI model for the server's AX.tsv.
Column choices and label orders are google-research/bert `run_classifier.py`'s processors
(ColaProcessor, MrpcProcessor, MnliProcessor: labels contradiction, entailment, neutral) and, for the
tasks it has no processor for, transformers' `data/processors/glue.py` processors that extend them in the
same style (Sst2, Stsb, Qqp, Qnli, Rte, Wnli). A test file is told by its header: its
first column is the test layout's (`index`, QQP `id`) and it has the test layout's column count.

QQP: the released train.tsv has a few rows broken by stray line breaks inside a question (a row cut in
two: neither part has 6 columns). The original processors skip them (transformers' QqpProcessor drops
rows that have too few columns; TFDS `glue/qqp` drops rows with a missing field); so does this reader,
for QQP only, logging one warning with the count and the first line numbers. Every other malformed row,
in any task, is a one-line ValueError naming the file and line.

The model inputs follow run_classifier.py: `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` with token types
0 / 1, and `_truncate_seq_pair` (drop the last token of the longer sentence until the pair fits).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import math

import numpy as np

from bert_jax import storage
from bert_jax.data.tokenization import Tokenizer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one kind of a task's TSV files (train/dev, or test) keeps its fields.

    Attributes:
      columns: the column counts a file of this kind may have (MNLI: 12 in train.tsv, 16 in dev).
      header: whether the first row is a header (CoLA's train/dev files have none).
      text_a, text_b: column indices of the texts (text_b None: single-sentence task).
      label: column index of the label (-1: the last column), None for unlabelled (test) files.
      first: the header's first column name (how a test file is told apart), None when not checked.
    """

    columns: tuple[int, ...]
    header: bool
    text_a: int
    text_b: int | None
    label: int | None
    first: str | None = None


@dataclasses.dataclass(frozen=True)
class Split:
    """One evaluation or test file of a task: `file` in the GLUE folder, `tfds` the TFDS split, `key`
    the metrics prefix of a dev set ("" for a task's only one) or the GLUE-server file name of a test set."""

    file: str
    tfds: str
    key: str


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """A GLUE task: files, labels, metrics and its TFDS form.

    Attributes:
      name: TFDS config name and `bert_jax/configs/glue.py` argument ("cola", ...).
      folder: its folder in the GLUE download ("CoLA", ...).
      labels: label strings as written in the TSV files, in label-index order; () for regression (STS-B).
      metrics: the GLUE metrics of the task ("mcc", "accuracy", "f1", "pearson", "spearman").
      labelled, test: the layouts of train/dev files and of test files.
      dev, test_sets: the dev and test `Split`s.
      tfds_text: TFDS feature names of text_a (and text_b).
      tfds_labels: TFDS class names in this task's label order (TFDS orders some differently, e.g.
        glue/mnli: entailment, neutral, contradiction).
      skip_short_rows: drop rows with too few columns instead of failing (QQP, as the original).
    """

    name: str
    folder: str
    labels: tuple[str, ...]
    metrics: tuple[str, ...]
    labelled: Layout
    test: Layout
    dev: tuple[Split, ...]
    test_sets: tuple[Split, ...]
    tfds_text: tuple[str, ...]
    tfds_labels: tuple[str, ...] = ()
    skip_short_rows: bool = False

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        """Classifier outputs: the number of labels, 1 for regression."""
        return len(self.labels) or 1

    @property
    def tfds_name(self) -> str:
        return f"glue/{self.name}"


def _task(name, folder, labels, metrics, labelled, test, tfds_text, tfds_labels=(), **kwargs) -> GlueTask:
    return GlueTask(name, folder, labels, metrics, labelled, test, (Split("dev.tsv", "validation", ""),),
                    (Split("test.tsv", "test", f"{folder}.tsv"),), tfds_text, tfds_labels, **kwargs)


_PAIR4 = Layout((4,), True, 1, 2, -1)  # QNLI, RTE, WNLI: index, text_a, text_b, label
_PAIR3_TEST = Layout((3,), True, 1, 2, None, "index")
_BINARY = ("0", "1")

TASKS: dict[str, GlueTask] = {t.name: t for t in [
    _task("cola", "CoLA", _BINARY, ("mcc",), Layout((4,), False, 3, None, 1),
          Layout((2,), True, 1, None, None, "index"), ("sentence",), ("unacceptable", "acceptable")),
    _task("sst2", "SST-2", _BINARY, ("accuracy",), Layout((2,), True, 0, None, 1),
          Layout((2,), True, 1, None, None, "index"), ("sentence",), ("negative", "positive")),
    _task("mrpc", "MRPC", _BINARY, ("accuracy", "f1"), Layout((5,), True, 3, 4, 0),
          Layout((5,), True, 3, 4, None, "index"), ("sentence1", "sentence2"), ("not_equivalent", "equivalent")),
    _task("stsb", "STS-B", (), ("pearson", "spearman"), Layout((10,), True, 7, 8, -1),
          Layout((9,), True, 7, 8, None, "index"), ("sentence1", "sentence2")),
    _task("qqp", "QQP", _BINARY, ("accuracy", "f1"), Layout((6,), True, 3, 4, 5),
          Layout((3,), True, 1, 2, None, "id"), ("question1", "question2"), ("not_duplicate", "duplicate"),
          skip_short_rows=True),
    GlueTask("mnli", "MNLI", ("contradiction", "entailment", "neutral"), ("accuracy",),
             Layout((12, 16), True, 8, 9, -1), Layout((10,), True, 8, 9, None, "index"),
             (Split("dev_matched.tsv", "validation_matched", "matched_"),
              Split("dev_mismatched.tsv", "validation_mismatched", "mismatched_")),
             (Split("test_matched.tsv", "test_matched", "MNLI-m.tsv"),
              Split("test_mismatched.tsv", "test_mismatched", "MNLI-mm.tsv")),
             ("premise", "hypothesis"), ("contradiction", "entailment", "neutral")),
    _task("qnli", "QNLI", ("entailment", "not_entailment"), ("accuracy",), _PAIR4, _PAIR3_TEST,
          ("question", "sentence"), ("entailment", "not_entailment")),
    _task("rte", "RTE", ("entailment", "not_entailment"), ("accuracy",), _PAIR4, _PAIR3_TEST,
          ("sentence1", "sentence2"), ("entailment", "not_entailment")),
    _task("wnli", "WNLI", _BINARY, ("accuracy",), _PAIR4, _PAIR3_TEST, ("sentence1", "sentence2"),
          ("not_entailment", "entailment")),
]}
STSB_RANGE = (0.0, 5.0)  # STS-B similarity scores
# GLUE's diagnostic set (AX): unlabelled NLI pairs, predicted by an MNLI model for the GLUE server's AX.tsv;
# `<GLUE_DIR>/diagnostic/diagnostic.tsv` (index, sentence1, sentence2) or TFDS glue/ax "test". Not a
# task to fine-tune on: `get_task("ax")` reads it, `TASKS` leaves it out.
AX = GlueTask("ax", "diagnostic", TASKS["mnli"].labels, (), Layout((3,), True, 1, 2, None, "index"), _PAIR3_TEST,
              (), (Split("diagnostic.tsv", "test", "AX.tsv"),), ("premise", "hypothesis"),
              ("contradiction", "entailment", "neutral"))


def get_task(task: str) -> GlueTask:
    """`TASKS[task]`, or `AX` for "ax". Raises ValueError (one line): not a GLUE task."""
    if task == AX.name:
        return AX
    if task not in TASKS:
        raise ValueError(f"GLUE task {task!r} is not one of {sorted(TASKS)}")
    return TASKS[task]


@dataclasses.dataclass(frozen=True)
class InputExample:
    """One example: guid, text_a, optional text_b, label.

    label: the label index (int) of a classification task, the similarity score (float) for STS-B;
    -1 when unlabelled (test files). guid: a test file's own index column (what a GLUE submission
    names), else the line number in the file (TFDS: the `idx` feature).
    """

    guid: str
    text_a: str
    text_b: str | None
    label: int | float


def _read_tsv(path: str) -> list[list[str]]:
    if not storage.is_file(path):
        raise FileNotFoundError(f"GLUE file {path!r} does not exist")
    text = storage.read_text(path).removeprefix("\ufeff")  # MRPC's files start with a byte-order mark
    # QUOTE_NONE: quotes are text (run_classifier.py reads with quotechar=None; TFDS with QUOTE_NONE).
    reader = csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
    rows = []
    try:
        for row in reader:
            rows.append(row)
    except csv.Error as e:
        raise ValueError(f"{path}:{reader.line_num}: not a GLUE TSV row ({e})") from None
    return rows


def _label(task: GlueTask, value: str, path: str, line: int) -> int | float:
    if task.is_regression:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        lo, hi = STSB_RANGE
        if not lo <= score <= hi:
            raise ValueError(f"{path}:{line}: score {value!r} is not a number in [{lo:g}, {hi:g}]")
        return score
    if value not in task.labels:
        raise ValueError(f"{path}:{line}: label {value!r} is not one of {list(task.labels)} ({task.folder})")
    return task.labels.index(value)


def _is_test_header(task: GlueTask, row: list[str]) -> bool:
    return len(row) in task.test.columns and bool(row) and row[0] == task.test.first


def read_glue_tsv(task: str, path: str) -> list[InputExample]:
    """Reads a GLUE TSV file of `task`: train.tsv / dev*.tsv (labelled) or test*.tsv (label -1).

    Follows the run_classifier.py processors (see the module docstring for each task's columns). QQP
    rows with too few columns are skipped with a warning, as the original does; everything else that
    does not fit the task's layout is an error.

    Returns:
      the examples in file order; labels are int label indices (float scores for STS-B).

    Raises:
      FileNotFoundError: no such file.
      ValueError (one line, naming file and line): unknown task; an empty file; a header whose column
        count fits neither the task's train/dev nor its test layout; a row with a wrong column count;
        a label outside the task's label set (STS-B: a score that is not a number in [0, 5]).
    """
    spec = get_task(task)
    rows = _read_tsv(path)
    if not rows:
        raise ValueError(f"GLUE file {path!r} is empty")
    if spec.test.header and _is_test_header(spec, rows[0]):
        layout = spec.test
    else:
        layout = spec.labelled
        if layout.header and len(rows[0]) not in layout.columns:
            raise ValueError(f"{path}:1: {spec.folder} header has {len(rows[0])} columns, expected "
                             f"{' or '.join(map(str, layout.columns))} (train/dev) or {spec.test.columns[0]} "
                             f"(test, first column {spec.test.first!r})")
    start = 2 if layout.header else 1
    expected = (len(rows[0]),) if layout.header else layout.columns
    examples, skipped = [], []
    for line, row in enumerate(rows[start - 1:], start=start):
        if len(row) not in expected:
            if spec.skip_short_rows and len(row) < min(expected):
                skipped.append(line)
                continue
            raise ValueError(f"{path}:{line}: {spec.folder} row has {len(row)} columns, expected "
                             f"{' or '.join(map(str, expected))}")
        if layout.label is None:
            guid, label = row[0], -1
        else:
            guid, label = str(line), _label(spec, row[layout.label], path, line)
        text_b = row[layout.text_b] if layout.text_b is not None else None
        examples.append(InputExample(guid, row[layout.text_a], text_b, label))
    if skipped:
        log.warning("%s: skipped %d %s rows with fewer than %d columns (as the original processor), lines %s%s",
                    path, len(skipped), spec.folder, min(expected), skipped[:5], " ..." if len(skipped) > 5 else "")
    return examples


def read_glue_tfds(task: str, split: str, data_dir: str | None = None, download: bool = False) -> list[InputExample]:
    """Reads TFDS `glue/<task>` split `split` (prepared under data_dir; downloads only when asked).

    Splits: train, validation (MNLI: validation_matched, validation_mismatched), test (MNLI:
    test_matched, test_mismatched). TFDS class indices are mapped to this task's label order by name
    (`GlueTask.tfds_labels`); TFDS's unlabelled test examples (label -1) keep label -1.

    Returns:
      examples with guid = TFDS `idx`, labels as `read_glue_tsv` (int indices; float scores for STS-B).

    Raises:
      ValueError: unknown task, or a label outside the TFDS class list.
      tfds errors (e.g. DatasetNotFoundError / AssertionError): the dataset is not prepared under
        data_dir and download is False, or an unknown split.
    """
    import tensorflow_datasets as tfds  # seconds to import, and only the TFDS readers need it
    import tensorflow_datasets.text.glue  # noqa: F401  registers glue/* (tfds does not without TensorFlow)

    spec = get_task(task)
    ds = tfds.data_source(spec.tfds_name, split=split, data_dir=data_dir, download=download)
    names = None if spec.is_regression else tfds.builder(spec.tfds_name, data_dir=data_dir).info.features[
        "label"].names
    out = []
    for i, ex in enumerate(ds):
        texts = [ex[f].decode("utf-8") if isinstance(ex[f], bytes) else str(ex[f]) for f in spec.tfds_text]
        raw = ex["label"]
        if spec.is_regression:
            label = float(raw)
        elif int(raw) == -1:
            label = -1
        elif 0 <= int(raw) < len(names):
            label = spec.tfds_labels.index(names[int(raw)])
        else:
            raise ValueError(f"TFDS {spec.tfds_name} {split} example {i}: label {int(raw)} is not one of "
                             f"0..{len(names) - 1} ({names})")
        out.append(InputExample(str(int(ex.get("idx", i))), texts[0], texts[1] if len(texts) > 1 else None, label))
    return out


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_length: int) -> None:
    """In place: drop the last token of the longer list (of b on ties) until len(a) + len(b) <= max_length."""
    while len(tokens_a) + len(tokens_b) > max_length:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def convert_examples_to_features(examples: list[InputExample], tokenizer: Tokenizer,
                                 max_seq_length: int = 128, regression: bool = False) -> dict[str, np.ndarray]:
    """Examples -> {"input_ids", "token_type_ids", "attention_mask": int32 [N, max_seq_length],
    "labels": int32 [N] (regression: float32 [N] scores)}.

    Raises:
      ValueError: max_seq_length < 4.
    """
    if max_seq_length < 4:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for text")
    n = len(examples)
    ids = np.full((n, max_seq_length), tokenizer.pad_id, np.int32)
    types = np.zeros((n, max_seq_length), np.int32)
    mask = np.zeros((n, max_seq_length), np.int32)
    a_ids = tokenizer.encode_batch([e.text_a for e in examples])
    b_ids = tokenizer.encode_batch([e.text_b or "" for e in examples])
    for i, (ex, a, b) in enumerate(zip(examples, a_ids, b_ids)):
        if ex.text_b is not None:
            truncate_seq_pair(a, b, max_seq_length - 3)
            row = [tokenizer.cls_id] + a + [tokenizer.sep_id] + b + [tokenizer.sep_id]
            types[i, len(a) + 2:len(row)] = 1
        else:
            row = [tokenizer.cls_id] + a[:max_seq_length - 2] + [tokenizer.sep_id]
        ids[i, :len(row)] = row
        mask[i, :len(row)] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
            "labels": np.asarray([e.label for e in examples], np.float32 if regression else np.int32)}
