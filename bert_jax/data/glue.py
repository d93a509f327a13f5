"""GLUE classification data: the GLUE TSV files (MRPC, SST-2) or TFDS `glue/*` -> fixed-length features.

Follows google-research/bert `run_classifier.py`: the processors' column choices (MRPC: label in column
0, sentences in columns 3 and 4; SST-2: sentence and label columns), the layout
`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` with token types 0 / 1, and `_truncate_seq_pair` (drop the
last token of the longer sentence until the pair fits).
"""

from __future__ import annotations

import csv
import dataclasses
import io

import numpy as np

from bert_jax import storage
from bert_jax.data.tokenization import Tokenizer

TASKS = {
    # name: (number of labels, TFDS name, TFDS text fields)
    "mrpc": (2, "glue/mrpc", ("sentence1", "sentence2")),
    "sst2": (2, "glue/sst2", ("sentence",)),
}


@dataclasses.dataclass(frozen=True)
class InputExample:
    """One example: guid, text_a, optional text_b, label (int; -1 when unlabelled)."""

    guid: str
    text_a: str
    text_b: str | None
    label: int


def _read_tsv(path: str) -> list[list[str]]:
    if not storage.is_file(path):
        raise FileNotFoundError(f"GLUE file {path!r} does not exist")
    text = storage.read_text(path).removeprefix("\ufeff")  # MRPC's files start with a byte-order mark
    return list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE))


def _label(value: str, path: str, line: int) -> int:
    if value not in ("0", "1"):
        raise ValueError(f"{path}:{line}: label {value!r} is not 0 or 1")
    return int(value)


def read_glue_tsv(task: str, path: str) -> list[InputExample]:
    """Reads a GLUE-format TSV of `task` (train.tsv / dev.tsv; test.tsv gives label -1).

    Raises:
      FileNotFoundError: no such file.
      ValueError: unknown task, a row with too few columns or a bad label (names file and line).
    """
    if task not in TASKS:
        raise ValueError(f"GLUE task {task!r} is not one of {sorted(TASKS)}")
    rows = _read_tsv(path)
    if not rows:
        raise ValueError(f"GLUE file {path!r} is empty")
    header, body = rows[0], rows[1:]
    unlabelled = header and header[0] == "index"  # test.tsv
    examples = []
    for i, row in enumerate(body, start=2):
        if task == "mrpc":
            if len(row) < 5:
                raise ValueError(f"{path}:{i}: MRPC row has {len(row)} columns, expected 5")
            label = -1 if unlabelled else _label(row[0], path, i)
            examples.append(InputExample(f"{i}", row[3], row[4], label))
        else:
            if unlabelled:
                if len(row) < 2:
                    raise ValueError(f"{path}:{i}: SST-2 test row has {len(row)} columns, expected 2")
                examples.append(InputExample(f"{i}", row[1], None, -1))
                continue
            if len(row) < 2:
                raise ValueError(f"{path}:{i}: SST-2 row has {len(row)} columns, expected 2")
            examples.append(InputExample(f"{i}", row[0], None, _label(row[1], path, i)))
    return examples


def read_glue_tfds(task: str, split: str, data_dir: str | None = None, download: bool = False) -> list[InputExample]:
    """Reads `glue/<task>` from TensorFlow Datasets (prepared under data_dir; downloads only when asked)."""
    import tensorflow_datasets as tfds

    _, name, fields = TASKS[task]
    ds = tfds.data_source(name, split=split, data_dir=data_dir, download=download)
    out = []
    for i, ex in enumerate(ds):
        texts = [ex[f].decode("utf-8") if isinstance(ex[f], bytes) else str(ex[f]) for f in fields]
        out.append(InputExample(str(ex.get("idx", i)), texts[0], texts[1] if len(texts) > 1 else None,
                                int(ex["label"])))
    return out


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_length: int) -> None:
    """In place: drop the last token of the longer list (of b on ties) until len(a) + len(b) <= max_length."""
    while len(tokens_a) + len(tokens_b) > max_length:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def convert_examples_to_features(examples: list[InputExample], tokenizer: Tokenizer,
                                 max_seq_length: int = 128) -> dict[str, np.ndarray]:
    """Examples -> {"input_ids", "token_type_ids", "attention_mask": int32 [N, max_seq_length],
    "labels": int32 [N]}.

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
            "labels": np.asarray([e.label for e in examples], np.int32)}
