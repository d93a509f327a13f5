"""CoNLL-2003 named-entity data (paper section 5.3): the CoNLL column format or TFDS `conll2003` ->
first-sub-token features, and predictions written back in the CoNLL format.

File format (Tjong Kim Sang and De Meulder 2003): one word per line, its columns separated by
whitespace, `word POS chunk NER` (CoNLL-2003 English: `EU NNP B-NP I-ORG`); a blank line ends a
sentence; `-DOCSTART- -X- -X- O` lines start a document and are skipped. The word is the first
column and the tag the last, so two-column `word NER` copies read too; every word line of a file must
have the column count of its first. Files: eng.train / eng.testa / eng.testb in the original release,
train.txt / valid.txt / test.txt in the common copies (and TFDS's source).

Tags: `O`, `B-TYPE` or `I-TYPE`, used as found. The original release uses IOB1 (an entity starts with
I-, and B- only marks an entity that directly follows one of the same type); many copies (TFDS, Hugging
Face datasets) convert to IOB2 (every entity starts with B-). Both read as they are: the label set is
the tags of the training file (`label_list`), `iob_scheme` says which of the two a file follows, and
the entity-level metrics (`bert_jax.tasks.ner.compute_metrics`) use seqeval's default mode, which
reproduces conlleval.pl's chunking and so reads IOB1 and IOB2 alike.

Features (the paper: "we use the representation of the first sub-token as the input to the
token-level classifier over the NER label set"): each word is WordPiece-tokenized on its own (as
transformers' `is_split_into_words`); its first sub-token carries the word's label (weight 1), the
other sub-tokens, [CLS], [SEP] and padding have weight 0. A word that tokenizes to nothing (only
characters BERT's normaliser removes) becomes one [UNK], so that every word gets a prediction.

Long sentences are split, not truncated: a sentence whose sub-tokens do not fit in max_seq_length - 2
becomes several sequences, cut between words, each word in exactly one of them, and the predictions
are joined back into the sentence. Truncating would leave the words past the cut without a prediction,
and their entities counted as missed by the entity-level scores (the score of every gold entity is
kept). A single word with more sub-tokens than fit keeps its first max_seq_length - 2 (its label is
on the first). Each sentence is its own sequence: no document context is added.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Sequence

import numpy as np

from bert_jax import storage
from bert_jax.data.tokenization import Tokenizer

log = logging.getLogger(__name__)

DOCSTART = "-DOCSTART-"
TFDS_NAME = "conll2003"
_TAG = re.compile(r"^(O|[BI]-\S+)$")


@dataclasses.dataclass(frozen=True)
class Sentence:
    """One sentence: its words, their tags (`O`, `B-TYPE`, `I-TYPE`) and where it came from
    (`source`: "file:line" of its first word, or "TFDS conll2003 <split> example <i>")."""

    words: tuple[str, ...]
    tags: tuple[str, ...]
    source: str


def read_conll(path: str) -> list[Sentence]:
    """Reads a CoNLL-format file (module docstring) -> its sentences in file order.

    Returns:
      sentences with at least one word; -DOCSTART- lines and blank lines are boundaries only.

    Raises:
      FileNotFoundError: no such file.
      ValueError (one line, naming file and line): a word line with fewer than 2 columns or with a
        column count other than the file's first word line's; a tag that is not O, B-TYPE or I-TYPE.
    """
    if not storage.is_file(path):
        raise FileNotFoundError(f"CoNLL file {path!r} does not exist")
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    start, columns, first = 0, None, 0

    def end_sentence():
        if words:
            sentences.append(Sentence(tuple(words), tuple(tags), f"{path}:{start}"))
            words.clear()
            tags.clear()

    for number, line in enumerate(storage.read_text(path).removeprefix("\ufeff").splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0] == DOCSTART:
            end_sentence()
            continue
        if columns is None:
            if len(fields) < 2:
                raise ValueError(f"{path}:{number}: CoNLL line has {len(fields)} column, expected a word and a tag")
            columns, first = len(fields), number
        elif len(fields) != columns:
            raise ValueError(f"{path}:{number}: CoNLL line has {len(fields)} columns, expected {columns} "
                             f"(as line {first})")
        if not _TAG.match(fields[-1]):
            raise ValueError(f"{path}:{number}: tag {fields[-1]!r} is not an IOB tag (O, B-TYPE or I-TYPE)")
        if not words:
            start = number
        words.append(fields[0])
        tags.append(fields[-1])
    end_sentence()
    return sentences


def read_conll_tfds(split: str, data_dir: str | None = None, download: bool = False) -> list[Sentence]:
    """Reads TFDS `conll2003` split `split` ("train", "dev" or "test"; prepared under data_dir,
    downloaded only when asked). Its NER tags are IOB2 class indices, mapped to their names.

    Returns:
      sentences in the split's order (empty ones skipped), source "TFDS conll2003 <split> example <i>".

    Raises:
      ValueError (one line, naming the example): tokens and tags of different lengths, or a tag index
        outside the class list.
      tfds errors (e.g. DatasetNotFoundError / AssertionError): the dataset is not prepared under
        data_dir and download is False, or an unknown split.
    """
    import tensorflow_datasets as tfds  # seconds to import, and only the TFDS readers need it
    import tensorflow_datasets.text.conll2003  # noqa: F401  registers conll2003 (tfds does not without TensorFlow)

    ds = tfds.data_source(TFDS_NAME, split=split, data_dir=data_dir, download=download)
    names = tfds.builder(TFDS_NAME, data_dir=data_dir).info.features["ner"].feature.names
    out = []
    for i in range(len(ds)):
        ex, source = ds[i], f"TFDS {TFDS_NAME} {split} example {i}"
        words = [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in ex["tokens"]]
        indices = [int(t) for t in ex["ner"]]
        if len(words) != len(indices):
            raise ValueError(f"{source}: {len(words)} tokens but {len(indices)} ner tags")
        if any(not 0 <= t < len(names) for t in indices):
            raise ValueError(f"{source}: ner tag index outside 0..{len(names) - 1} ({names})")
        if words:
            out.append(Sentence(tuple(words), tuple(names[t] for t in indices), source))
    return out


def label_list(sentences: Sequence[Sentence]) -> tuple[str, ...]:
    """The tags found in `sentences` (a training set): "O" first (also when absent), then the others sorted."""
    return ("O", *sorted({t for s in sentences for t in s.tags} - {"O"}))


def iob_scheme(sentences: Sequence[Sentence]) -> str:
    """"IOB1" if some entity starts with I- (after O, another type or the sentence start), else "IOB2"."""
    for s in sentences:
        previous = "O"
        for tag in s.tags:
            if tag.startswith("I-") and previous[2:] != tag[2:]:
                return "IOB1"
            previous = tag
    return "IOB2"


def convert_to_features(sentences: Sequence[Sentence], tokenizer: Tokenizer, labels: Sequence[str],
                        max_seq_length: int = 128) -> dict[str, np.ndarray]:
    """Sentences -> first-sub-token features (module docstring), one row per sequence (N rows >= the
    number of sentences: long sentences are split between words).

    Args:
      labels: the label set (`label_list` of the training sentences); label index = position in it.
        A tag outside it (a dev / test tag never seen in training) gets label 0 and weight 0: it is
        still a gold tag for the entity-level metrics, which read the sentences' tags.

    Returns:
      input_ids, token_type_ids (zeros), attention_mask: int32 [N, max_seq_length];
      labels: int32 [N, max_seq_length], the label index at each word's first sub-token, 0 elsewhere;
      label_weights: float32 [N, max_seq_length], 1.0 at first sub-tokens with a known tag, else 0.0;
      word_ids: int32 [N, max_seq_length], the index of the word in its sentence at its first
        sub-token, -1 elsewhere;
      sentence_ids: int32 [N], the index in `sentences` of each row's sentence.

    Raises:
      ValueError: max_seq_length < 3.
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for a word")
    room = max_seq_length - 2
    label_index = {t: i for i, t in enumerate(labels)}
    pieces = tokenizer.encode_batch([w for s in sentences for w in s.words])
    rows: list[tuple[int, list[int], list[tuple[int, int, int]]]] = []  # (sentence, ids, (position, word, label))
    k, split_sentences, cut_words = 0, 0, 0
    for n, s in enumerate(sentences):
        ids: list[int] = []
        firsts: list[tuple[int, int, int]] = []
        chunks = 0
        for w, tag in enumerate(s.tags):
            word = pieces[k] or [tokenizer.unk_id]
            k += 1
            if len(word) > room:
                word, cut_words = word[:room], cut_words + 1
            if len(ids) + len(word) > room:
                rows.append((n, ids, firsts))
                ids, firsts, chunks = [], [], chunks + 1
            firsts.append((len(ids) + 1, w, label_index.get(tag, -1)))
            ids.extend(word)
        rows.append((n, ids, firsts))
        split_sentences += chunks > 0
    if split_sentences or cut_words:
        log.info("CoNLL features: %d sentences split over several sequences of %d tokens, %d words cut to %d "
                 "sub-tokens", split_sentences, max_seq_length, cut_words, room)
    shape = (len(rows), max_seq_length)
    out = {"input_ids": np.full(shape, tokenizer.pad_id, np.int32), "token_type_ids": np.zeros(shape, np.int32),
           "attention_mask": np.zeros(shape, np.int32), "labels": np.zeros(shape, np.int32),
           "label_weights": np.zeros(shape, np.float32), "word_ids": np.full(shape, -1, np.int32),
           "sentence_ids": np.asarray([n for n, _, _ in rows], np.int32).reshape(len(rows))}
    for r, (_, ids, firsts) in enumerate(rows):
        row = [tokenizer.cls_id] + ids + [tokenizer.sep_id]
        out["input_ids"][r, :len(row)] = row
        out["attention_mask"][r, :len(row)] = 1
        for position, w, label in firsts:
            out["word_ids"][r, position] = w
            if label >= 0:
                out["labels"][r, position] = label
                out["label_weights"][r, position] = 1.0
    return out


def word_predictions(features: dict[str, np.ndarray], predicted: np.ndarray, sentences: Sequence[Sentence],
                     labels: Sequence[str]) -> list[list[str]]:
    """Per-token label indices -> one predicted tag per word of each sentence.

    Args:
      features: `convert_to_features` output for `sentences` (word_ids, sentence_ids).
      predicted: int [N, max_seq_length] label indices (the argmax of the token logits).

    Returns:
      tags[n][w] = labels[predicted at word w's first sub-token], for every word of every sentence.

    Raises:
      ValueError: a word without a first sub-token in the features (features of other sentences).
    """
    out: list[list[str | None]] = [[None] * len(s.words) for s in sentences]
    rows, positions = np.nonzero(features["word_ids"] >= 0)
    for r, p in zip(rows, positions):
        out[features["sentence_ids"][r]][features["word_ids"][r, p]] = labels[int(predicted[r, p])]
    for s, tags in zip(sentences, out):
        if None in tags:
            raise ValueError(f"{s.source}: word {tags.index(None)} has no sub-token in the features")
    return out  # type: ignore[return-value]


def write_conll(path: str, sentences: Sequence[Sentence], predictions: Sequence[Sequence[str]]) -> None:
    """Writes `word gold predicted` per line, a blank line after each sentence: conlleval.pl's input
    (its last two columns are the gold and the guessed tag).

    Raises:
      ValueError: not one tag sequence per sentence, or a sentence whose predictions do not have one tag
        per word.
    """
    if len(predictions) != len(sentences):
        raise ValueError(f"{path}: {len(sentences)} sentences but {len(predictions)} predicted tag sequences")
    lines = []
    for s, tags in zip(sentences, predictions):
        if len(tags) != len(s.words):
            raise ValueError(f"{s.source}: {len(s.words)} words but {len(tags)} predicted tags")
        lines.extend(f"{w} {g} {p}\n" for w, g, p in zip(s.words, s.tags, tags))
        lines.append("\n")
    storage.write_text(path, "".join(lines))
