"""SQuAD v1.1 / v2.0: the official JSON -> examples -> fixed-length features (sliding windows).

Follows google-research/bert `run_squad.py` (`read_squad_examples`, `convert_examples_to_features`)
with its flags and defaults (max_seq_length 384, doc_stride 128, max_query_length 64), with one
change of method: answers are located through the WordPiece tokens' character offsets in the raw
context (`Tokenizer.encode_with_offsets`) instead of the original's whitespace words and
`_improve_answer_span`, so the token span of an answer is the smallest one covering its characters,
and predicted spans map back to the exact original context text.

Layout of a feature (as the original): `[CLS] question [SEP] context window [SEP]`, token types 0 for
the question part and 1 for the window; windows start every `doc_stride` context tokens until one
reaches the end of the context. Training windows that do not contain the whole answer get the
[CLS] position (0) as their start and end on v2.0 and are dropped on v1.1, as the original.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import numpy as np

from bert_jax import storage
from bert_jax.data.tokenization import Tokenizer


@dataclasses.dataclass(frozen=True)
class SquadExample:
    """One question.

    Attributes:
      qas_id: the question id of the JSON (the key of predictions.json).
      question_text: the question.
      context_text: the paragraph's context, unchanged.
      answers: (text, character start in context_text) of every gold answer; () when impossible.
      is_impossible: v2.0 question without an answer.
    """

    qas_id: str
    question_text: str
    context_text: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool = False


@dataclasses.dataclass
class ReadStats:
    """What `read_squad_examples` skipped, by reason (counted, never fatal)."""

    empty_context: int = 0
    empty_question: int = 0
    answer_mismatch: int = 0  # the answer text is not at answer_start in the context
    no_answer: int = 0  # v1.1 training question with no answer

    def total(self) -> int:
        """Questions skipped for any reason (the sum of the four counts)."""
        return self.empty_context + self.empty_question + self.answer_mismatch + self.no_answer


def read_squad_examples(path: str, *, is_training: bool, stats: ReadStats | None = None) -> list[SquadExample]:
    """Reads an official SQuAD JSON file (v1.1 or v2.0; the version is taken from the content).

    Args:
      path: the JSON file (`{"version": ..., "data": [{"paragraphs": [{"context", "qas"}]}]}`).
      is_training: training needs a usable answer per question: questions whose (first) answer text
        is not found at its `answer_start` are skipped and counted, as are v1.1 questions without any.
        For evaluation every question is kept with all its answers (the metrics take the max over them).
      stats: receives the counts of skipped questions.

    Raises:
      FileNotFoundError: `path` does not exist.
      ValueError: the file is not JSON or not in the SQuAD layout (names the file and the field).
    """
    stats = stats if stats is not None else ReadStats()
    if not storage.is_file(path):
        raise FileNotFoundError(f"SQuAD file {path!r} does not exist")
    try:
        data = json.loads(storage.read_text(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"SQuAD file {path!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError(f"SQuAD file {path!r} has no top-level 'data' list")
    examples = []
    for a, article in enumerate(data["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise ValueError(f"SQuAD file {path!r}: data[{a}] has no 'paragraphs' list")
        for p, paragraph in enumerate(paragraphs):
            context, qas = (paragraph.get("context"), paragraph.get("qas")) if isinstance(paragraph, dict) else (0, 0)
            if not isinstance(context, str) or not isinstance(qas, list):
                raise ValueError(f"SQuAD file {path!r}: data[{a}].paragraphs[{p}] lacks a 'context' string or a "
                                 "'qas' list")
            for q, qa in enumerate(qas):
                try:
                    qas_id, question, answers = str(qa["id"]), qa["question"], qa.get("answers", [])
                    answers = [(ans["text"], int(ans["answer_start"])) for ans in answers]
                    if not isinstance(question, str) or not all(isinstance(text, str) for text, _ in answers):
                        raise TypeError
                except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
                    raise ValueError(f"SQuAD file {path!r}: data[{a}].paragraphs[{p}].qas[{q}] lacks 'id', "
                                     "'question' or a well-formed answer") from None
                impossible = bool(qa.get("is_impossible", False))
                if not context.strip():
                    stats.empty_context += 1
                    continue
                if not question.strip():
                    stats.empty_question += 1
                    continue
                if impossible:
                    answers = []
                if is_training:
                    if not impossible and not answers:
                        stats.no_answer += 1
                        continue
                    if answers:
                        text, start = answers[0]
                        if start < 0 or not text.strip() or context[start:start + len(text)] != text:
                            stats.answer_mismatch += 1
                            continue
                        answers = answers[:1]
                examples.append(SquadExample(qas_id, question, context, tuple(answers), impossible))
    return examples


@dataclasses.dataclass
class SquadFeatures:
    """Fixed-length windows of examples, as numpy arrays of N features, length L.

    Attributes:
      input_ids, token_type_ids, attention_mask: int32 [N, L] (the model's inputs).
      start_positions, end_positions: int32 [N] gold token positions (0 = [CLS] = no answer in the
        window); only meaningful for training features.
      example_index: int32 [N] index of the feature's example in the example list.
      token_offsets: int32 [N, L, 2] character [start, end) in the example's context_text of each
        context token; -1 for [CLS], question, [SEP] and padding tokens.
      max_context: bool [N, L] True where this window is the token's best context (the original's
        `_check_is_max_context`): only such tokens may start a predicted answer.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray
    example_index: np.ndarray
    token_offsets: np.ndarray
    max_context: np.ndarray

    def __len__(self) -> int:
        return len(self.input_ids)

    def model_inputs(self) -> dict[str, np.ndarray]:
        """The arrays a training step takes, under the standard names (the arrays themselves, not copies).

        Returns:
          input_ids, token_type_ids, attention_mask: int32 [N, L]; start_positions, end_positions: int32 [N].
        """
        return {k: getattr(self, k) for k in ("input_ids", "token_type_ids", "attention_mask", "start_positions",
                                              "end_positions")}


def _doc_spans(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) windows over num_tokens context tokens, the original's loop."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans


def _max_context(spans: list[tuple[int, int]], span_index: int, position: int) -> bool:
    """Whether window `span_index` is the best context of token `position` (the original's score:
    min(left, right) context + 0.01 * window length; the first best window wins)."""
    best_score, best_index = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, i
    return best_index == span_index


def answer_token_span(offsets: Sequence[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int] | None:
    """Smallest token span [first, last] covering the characters [char_start, char_end) of an answer.

    Args:
      offsets: (start, end) character span of each context token.

    Returns:
      (first, last) token indices, or None when no token overlaps the answer.
    """
    first = next((i for i, (s, e) in enumerate(offsets) if e > char_start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < char_end), None)
    if first is None or last is None or last < first:
        return None
    return first, last


def convert_examples_to_features(examples: Sequence[SquadExample], tokenizer: Tokenizer, *,
                                 max_seq_length: int = 384, doc_stride: int = 128, max_query_length: int = 64,
                                 is_training: bool, version_2_with_negative: bool = False) -> SquadFeatures:
    """Examples -> windows (see the module docstring).

    Args:
      examples: from `read_squad_examples`.
      tokenizer: the model's WordPiece tokenizer.
      max_seq_length, doc_stride, max_query_length: in tokens, as the original's flags.
      is_training: compute start/end positions; drop (v1.1) or null-label (v2.0) windows without the answer.
      version_2_with_negative: SQuAD v2.0 semantics.

    Raises:
      ValueError: max_seq_length too small for max_query_length plus one context token, or doc_stride < 1.
    """
    max_tokens_for_doc = max_seq_length - max_query_length - 3
    if max_tokens_for_doc < 1 or doc_stride < 1:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for context after max_query_length="
                         f"{max_query_length} (or doc_stride={doc_stride} < 1)")
    cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
    rows: dict[str, list] = {k: [] for k in ("input_ids", "token_type_ids", "start", "end", "example", "offsets",
                                              "max_context", "length")}
    context_cache: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
    for ex_index, ex in enumerate(examples):
        query = tokenizer.encode(ex.question_text)[:max_query_length]
        if ex.context_text not in context_cache:
            context_cache = {ex.context_text: tokenizer.encode_with_offsets(ex.context_text)}  # one paragraph at a time
        doc_ids, doc_offsets = context_cache[ex.context_text]
        if not doc_ids:
            continue
        answer_span = None
        if is_training and not ex.is_impossible:
            text, start = ex.answers[0]
            answer_span = answer_token_span(doc_offsets, start, start + len(text))
        spans = _doc_spans(len(doc_ids), max_seq_length - len(query) - 3, doc_stride)
        for span_index, (span_start, span_length) in enumerate(spans):
            start_pos = end_pos = 0
            if is_training:
                span_end = span_start + span_length - 1
                inside = answer_span is not None and span_start <= answer_span[0] and answer_span[1] <= span_end
                if not inside and not version_2_with_negative:
                    continue
                if inside:
                    shift = len(query) + 2 - span_start
                    start_pos, end_pos = answer_span[0] + shift, answer_span[1] + shift
            ids = [cls_id] + query + [sep_id] + doc_ids[span_start:span_start + span_length] + [sep_id]
            types = [0] * (len(query) + 2) + [1] * (span_length + 1)
            offsets = np.full((max_seq_length, 2), -1, np.int32)
            max_context = np.zeros(max_seq_length, bool)
            first = len(query) + 2
            offsets[first:first + span_length] = doc_offsets[span_start:span_start + span_length]
            for i in range(span_length):
                max_context[first + i] = _max_context(spans, span_index, span_start + i)
            pad = max_seq_length - len(ids)
            rows["input_ids"].append(ids + [tokenizer.pad_id] * pad)
            rows["length"].append(len(ids))
            rows["token_type_ids"].append(types + [0] * pad)
            rows["start"].append(start_pos)
            rows["end"].append(end_pos)
            rows["example"].append(ex_index)
            rows["offsets"].append(offsets)
            rows["max_context"].append(max_context)
    n = len(rows["input_ids"])
    input_ids = np.asarray(rows["input_ids"], np.int32).reshape(n, max_seq_length)
    return SquadFeatures(
        input_ids=input_ids,
        token_type_ids=np.asarray(rows["token_type_ids"], np.int32).reshape(n, max_seq_length),
        attention_mask=(np.arange(max_seq_length) < np.asarray(rows["length"], np.int32).reshape(n, 1)).astype(np.int32),
        start_positions=np.asarray(rows["start"], np.int32),
        end_positions=np.asarray(rows["end"], np.int32),
        example_index=np.asarray(rows["example"], np.int32),
        token_offsets=np.asarray(rows["offsets"], np.int32).reshape(n, max_seq_length, 2),
        max_context=np.asarray(rows["max_context"], bool).reshape(n, max_seq_length))
