"""SWAG (Zellers et al. 2018) data: the official CSV files -> four-choice features (paper section 4.4).

Files (rowanz/swagaf `data/`, the "regular" format): train.csv and val.csv with the header

  ,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label

(the first, unnamed column is the row index pandas wrote) and test.csv with the same columns less
`label`. Columns are found by name in the header, so a file with or without the index column reads
the same; `label` is the index (0-3) of the true ending. `startphrase` is `sent1` + " " + `sent2`: the
context sentence, then the start (often the subject) of the sentence to complete.

Inputs, as the paper ("four input sequences, each containing the concatenation of the given sentence
(sentence A) and a possible continuation (sentence B)") and transformers' SWAG example
(examples/pytorch/multiple-choice/run_swag.py, which pairs `sent1` with f"{sent2} {ending_i}"):
`[CLS] sent1 [SEP] sent2 ending_i [SEP]`, token types 0 / 1, the pair truncated to max_seq_length with
run_classifier.py's `_truncate_seq_pair` (drop the last token of the longer side), as transformers'
`truncation=True` (longest first).

Every malformed row is a one-line ValueError naming the file and line: a wrong column count, an empty
ending, a label outside 0-3. SWAG is not in TFDS (it has HellaSwag, a different dataset), so files are
the only source.
"""

from __future__ import annotations

import csv
import dataclasses
import io

import numpy as np

from bert_jax import storage
from bert_jax.data.glue import truncate_seq_pair
from bert_jax.data.tokenization import Tokenizer

NUM_CHOICES = 4
ENDINGS = tuple(f"ending{i}" for i in range(NUM_CHOICES))
REQUIRED_COLUMNS = ("sent1", "sent2", *ENDINGS)
HEADER = ("", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source", *ENDINGS, "label")


@dataclasses.dataclass(frozen=True)
class SwagExample:
    """One SWAG question.

    Attributes:
      guid: the file's index column (its first, unnamed column), else the line number.
      context: `sent1`, sentence A of all four sequences.
      start: `sent2`, the start of the sentence to complete (may be empty).
      endings: the four `ending0` .. `ending3`; sentence B of choice i is `start + " " + endings[i]`.
      label: the index of the true ending, 0-3; -1 in an unlabelled file (test.csv).
    """

    guid: str
    context: str
    start: str
    endings: tuple[str, ...]
    label: int

    def choice(self, i: int) -> str:
        """Sentence B of choice i: sent2 + " " + ending_i (just the ending when sent2 is empty)."""
        return f"{self.start} {self.endings[i]}" if self.start else self.endings[i]


def read_swag_csv(path: str) -> list[SwagExample]:
    """Reads a SWAG CSV file (train.csv / val.csv labelled, test.csv without a label column).

    Returns:
      the examples in file order; label -1 when the header has no `label` column.

    Raises:
      FileNotFoundError: no such file.
      ValueError (one line, naming file and line): an empty file or not CSV; a header without the
        columns sent1, sent2, ending0-3; a row whose column count differs from the header's; an empty
        ending; a label that is not one of 0, 1, 2, 3.
    """
    if not storage.is_file(path):
        raise FileNotFoundError(f"SWAG file {path!r} does not exist")
    reader = csv.reader(io.StringIO(storage.read_text(path).removeprefix("\ufeff")))
    try:
        header = next(reader, None)
        if header is None:
            raise ValueError(f"SWAG file {path!r} is empty")
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{path}:1: SWAG header lacks columns {missing} (expected {','.join(HEADER)})")
        column = {name: header.index(name) for name in (*REQUIRED_COLUMNS, "label") if name in header}
        indexed = header[0] == ""
        examples = []
        for row in reader:
            line = reader.line_num
            if len(row) != len(header):
                raise ValueError(f"{path}:{line}: SWAG row has {len(row)} columns, the header has {len(header)}")
            endings = tuple(row[column[e]] for e in ENDINGS)
            for name, text in zip(ENDINGS, endings):
                if not text.strip():
                    raise ValueError(f"{path}:{line}: {name} is empty")
            label = -1
            if "label" in column:
                value = row[column["label"]].strip()
                if value not in ("0", "1", "2", "3"):
                    raise ValueError(f"{path}:{line}: label {value!r} is not one of 0, 1, 2, 3")
                label = int(value)
            examples.append(SwagExample(row[0] if indexed else str(line), row[column["sent1"]],
                                        row[column["sent2"]].strip(), endings, label))
    except csv.Error as e:
        raise ValueError(f"{path}:{reader.line_num}: not a SWAG CSV row ({e})") from None
    return examples


def convert_examples_to_features(examples: list[SwagExample], tokenizer: Tokenizer,
                                 max_seq_length: int = 128) -> dict[str, np.ndarray]:
    """Examples -> {"input_ids", "token_type_ids", "attention_mask": int32 [N, 4, max_seq_length],
    "labels": int32 [N]} (-1 for unlabelled examples).

    Choice i of example n is `[CLS] context [SEP] start ending_i [SEP]` (module docstring), padded with
    [PAD] (id `tokenizer.pad_id`, attention 0).

    Raises:
      ValueError: max_seq_length < 4.
    """
    if max_seq_length < 4:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for text")
    n = len(examples)
    shape = (n, NUM_CHOICES, max_seq_length)
    ids = np.full(shape, tokenizer.pad_id, np.int32)
    types = np.zeros(shape, np.int32)
    mask = np.zeros(shape, np.int32)
    contexts = tokenizer.encode_batch([e.context for e in examples])
    choices = tokenizer.encode_batch([e.choice(i) for e in examples for i in range(NUM_CHOICES)])
    for j, b in enumerate(choices):
        n_, i = divmod(j, NUM_CHOICES)
        a = list(contexts[n_])
        truncate_seq_pair(a, b, max_seq_length - 3)
        row = [tokenizer.cls_id] + a + [tokenizer.sep_id] + b + [tokenizer.sep_id]
        ids[n_, i, :len(row)] = row
        types[n_, i, len(a) + 2:len(row)] = 1
        mask[n_, i, :len(row)] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
            "labels": np.asarray([e.label for e in examples], np.int32).reshape(n)}
