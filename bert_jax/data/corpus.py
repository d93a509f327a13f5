"""Reading text corpora: input globs, the original one-sentence-per-line format, plain text, TFDS,
WikiText, and the unlabelled text of task training files (SQuAD contexts, GLUE sentences).

Documents are yielded as lists of sentence strings, streaming (one document in memory at a time).
Lines that are not valid UTF-8 or hold a NUL byte are skipped and counted (`ReadStats`), never silently
dropped; a file where they are more than MAX_BAD_LINE_SHARE of the lines (of its first CHECK_LINES lines,
and of the whole file) is not text (a binary file, UTF-16) and is refused with a one-line ValueError
naming it and the share (`text_lines`).

Task text as pre-training text: only a task's *training* files may be read this way (in-domain text,
as task-adaptive pre-training; Gururangan et al. 2020, "Don't Stop Pretraining"), never its dev or
test files, whose text the fine-tuned model is evaluated on.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
from typing import Iterable, Iterator, Sequence

from etils import epath

from bert_jax import storage
from bert_jax.data import glue

# A sentence ends at . ! ? (and any closing quotes or brackets after it), before whitespace and a
# capital, digit or opening quote.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(\s+)(?=[\"'(\[]?[A-Z0-9])")
# WikiText: article titles " = Title = " (sections have two or more "="), and its tokenised number marks.
_WIKITEXT_TITLE = re.compile(r"^ ?= [^=].* = ?$")
_WIKITEXT_MARK = re.compile(r" ?@([-,.])@ ?")  # "1 @,@ 000" -> "1,000", "well @-@ known" -> "well-known"
# A file is refused as not text when more than this share of its lines are not UTF-8 or hold a NUL byte
# (executables, images and compressed files: 2/3 and more; a text file with a few stray bytes: a few percent).
MAX_BAD_LINE_SHARE = 0.5
CHECK_LINES = 1000  # the share is checked after this many lines of a file (fail fast), then at its end


def split_sentences(text: str) -> list[str]:
    """Splits plain text into sentences after . ! ? (closing quotes and brackets stay with their
    sentence) followed by whitespace and a capital, digit or quote; only that whitespace is removed."""
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        sentences.append(text[start:match.start(1)])
        start = match.end(1)
    sentences.append(text[start:])
    return [s.strip() for s in sentences if s.strip()]


def expand_input_files(patterns: str | Sequence[str]) -> list[str]:
    """Comma-separated globs (or a list of them; local paths or URIs such as gs://bucket/c4/*.txt) -> sorted,
    de-duplicated file paths.

    Raises:
      ValueError: a pattern matches no file, or no pattern is given.
    """
    if isinstance(patterns, str):
        patterns = patterns.split(",")
    files = []
    for pattern in (p.strip() for p in patterns):
        if not pattern:
            continue
        if storage.is_remote(pattern):
            scheme, rest = pattern.split("://", 1)
            bucket, _, glob_part = rest.partition("/")
            matched = sorted(os.fspath(p) for p in epath.Path(f"{scheme}://{bucket}").glob(glob_part) if p.is_file())
        else:
            matched = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
        if not matched:
            raise ValueError(f"--input_file: {pattern!r} matches no file")
        files += matched
    if not files:
        raise ValueError("--input_file: no files given")
    return list(dict.fromkeys(files))


def name_the_input(error: BaseException, given: str) -> BaseException:
    """`error` with "the input" of the writers' empty-corpus error ("the input holds no document with a
    non-empty sentence": every file empty, blank or skipped, raised where the documents are tokenized, far
    from the flags) replaced by `given`, the input as the user wrote it (`--input_file=corpus/*.txt`);
    any other error unchanged."""
    text = str(error)
    if isinstance(error, ValueError) and text.startswith("the input holds no document"):
        return ValueError(f"{given}: no document with a non-empty sentence in it")
    return error


@dataclasses.dataclass
class ReadStats:
    """Counts of what reading skipped (documented skips, never silent).

    Attributes:
      lines: lines read.
      invalid_utf8_lines: lines skipped as not UTF-8 or holding a NUL byte.
      empty_sentences: sentences left out as empty.
      dedupe, repeated_lines, repeated_documents: the de-duplication applied ("": none) and what it dropped
        (`bert_jax.data.dedupe`).
    """

    lines: int = 0
    invalid_utf8_lines: int = 0
    empty_sentences: int = 0
    dedupe: str = ""
    repeated_lines: int = 0
    repeated_documents: int = 0

    def skipped(self) -> dict[str, int]:
        """The counts of what reading skipped that metadata.json's "skipped" records: invalid_utf8_lines, and
        repeated_lines and repeated_documents when a de-duplication ran."""
        counts = {"invalid_utf8_lines": self.invalid_utf8_lines}
        if self.dedupe:
            counts.update(repeated_lines=self.repeated_lines, repeated_documents=self.repeated_documents)
        return counts


def _check_text(path: str, lines: int, bad: int) -> None:
    if bad and bad > MAX_BAD_LINE_SHARE * lines:
        raise ValueError(f"{path}: not text: {bad} of {'its' if lines < CHECK_LINES else 'the first'} {lines} lines "
                         f"({100 * bad / lines:.0f}%) are not UTF-8 or hold NUL bytes")


def text_lines(path: str, stats: ReadStats) -> Iterator[str]:
    """The lines of one file (a local path or a URL `etils.epath` opens, e.g. gs://), decoded as UTF-8 (line
    endings kept); lines that are not UTF-8 or hold a NUL byte are skipped and counted in
    `stats.invalid_utf8_lines`.

    Raises:
      FileNotFoundError (and other OSErrors of `open`): the file cannot be read.
      ValueError: not text: more than MAX_BAD_LINE_SHARE of its first CHECK_LINES lines, or of all its
        lines, are skipped (one line naming the file and the share; raised at that point of the stream).
    """
    lines = bad = 0
    with epath.Path(path).open("rb") as f:
        for raw in f:
            stats.lines += 1
            lines += 1
            try:
                line = None if b"\0" in raw else raw.decode("utf-8")
            except UnicodeDecodeError:
                line = None
            if line is None:
                stats.invalid_utf8_lines += 1
                bad += 1
            if lines == CHECK_LINES:
                _check_text(path, lines, bad)
            if line is not None:
                yield line
    _check_text(path, lines, bad)


def _blocks(path: str, stats: ReadStats) -> Iterator[list[str]]:
    """Runs of non-blank lines (stripped) of one file (`text_lines`: lines that are not text are counted,
    skipped; a file that is not text raises ValueError)."""
    block: list[str] = []
    for line in text_lines(path, stats):
        line = line.strip()
        if line:
            block.append(line)
        elif block:
            yield block
            block = []
    if block:
        yield block


def read_sentence_documents(files: Sequence[str], stats: ReadStats) -> Iterator[list[str]]:
    """The original format: one sentence per line, a blank line between documents.

    Yields documents as lists of sentence strings. Lines that are not valid UTF-8 are skipped and
    counted in `stats.invalid_utf8_lines`. Each file also ends a document.
    """
    for path in files:
        yield from _blocks(path, stats)


def read_text_documents(files: Sequence[str], stats: ReadStats) -> Iterator[list[str]]:
    """Plain text: each file is one document; paragraphs (blank-line separated) are split into
    sentences with `split_sentences`. Invalid UTF-8 lines are skipped and counted."""
    for path in files:
        document = [s for block in _blocks(path, stats) for s in split_sentences(" ".join(block))]
        if document:
            yield document


def tfds_source(name: str, split: str, data_dir: str | None):
    """`tfds.data_source` of a TFDS dataset (prepared on first use, as `tfds.data_source` does): random access
    to its examples, len() of them.

    Raises:
      ValueError: one line naming the flag: an unknown dataset (--tfds_name), an unknown or malformed split
        (--tfds_split), or a dataset prepared in a format without random access.
    """
    import tensorflow_datasets as tfds  # seconds to import, and only the TFDS readers need it

    try:
        return tfds.data_source(name, split=split, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:  # its message lists every registered dataset
        where = f" in --tfds_data_dir={data_dir!r}" if data_dir else ""
        raise ValueError(f"--tfds_name {name!r}: no such TFDS dataset (neither registered nor "
                         f"prepared{where})") from None
    except NotImplementedError as e:  # prepared as TFRecord: no random access
        raise ValueError(f"--tfds_name {name!r}: {str(e).splitlines()[0]} (prepare it with "
                         "--file_format=array_record)") from None
    except ValueError as e:  # "Unknown split 'x'. Should be one of [...]", a split that does not parse, ...
        message = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        flag = f"--tfds_split {split!r} of {name!r}" if "split" in message.lower() else f"--tfds_name {name!r}"
        raise ValueError(f"{flag}: {message}") from None


def read_tfds_documents(name: str, split: str, text_key: str, data_dir: str | None,
                        stats: ReadStats, start: int = 0, stop: int | None = None) -> Iterator[list[str]]:
    """A TFDS text dataset (e.g. `wikipedia/20230601.en`, key `text`): one example = one document,
    paragraphs split into sentences; examples start .. stop - 1 (default: all). Uses `tfds.data_source`
    (random access, no TensorFlow)."""
    source = tfds_source(name, split, data_dir)
    for i in range(start, len(source) if stop is None else min(stop, len(source))):
        example = source[i]
        if text_key not in example:
            raise ValueError(f"--tfds_text_key {text_key!r} is not a feature of {name} (has {sorted(example)})")
        text = example[text_key]
        text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)
        stats.lines += 1
        document = [s for p in text.split("\n") for s in split_sentences(p)]
        if document:
            yield document


def read_wikitext_documents(files: Sequence[str], stats: ReadStats) -> Iterator[list[str]]:
    """WikiText-2 / -103 token files (`wiki.*.tokens`, or the `valid.txt` / `test.txt` layout): one
    article (from its ` = Title = ` line to the next) = one document; section headings dropped, the
    number marks ` @-@ `, ` @,@ `, ` @.@ ` joined back, its `<unk>` placeholders (rare words it
    replaced) dropped, paragraphs split into sentences."""
    for path in files:
        document: list[str] = []
        for block in _blocks(path, stats):
            for line in block:
                if _WIKITEXT_TITLE.match(line):
                    if document:
                        yield document
                    document = []
                    continue
                if line.startswith("="):  # a section heading
                    continue
                line = _WIKITEXT_MARK.sub(r"\1", " ".join(t for t in line.split() if t != "<unk>"))
                document.extend(split_sentences(line))
        if document:
            yield document


def read_squad_documents(files: Sequence[str], stats: ReadStats) -> Iterator[list[str]]:
    """The contexts of SQuAD JSON files (v1.1 or v2.0 layout): one paragraph = one document, split
    into sentences; questions and answers are not read.

    Raises:
      ValueError: a file that is not SQuAD JSON (names the file).
    """
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            paragraphs = [p["context"] for article in data["data"] for p in article["paragraphs"]]
            if not all(isinstance(context, str) for context in paragraphs):
                raise TypeError("a context that is not a string")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a SQuAD JSON file ({type(e).__name__}: {e})") from None
        for context in paragraphs:
            stats.lines += 1
            document = split_sentences(" ".join(context.split()))
            if document:
                yield document


def read_glue_documents(files: Sequence[str], task: str, stats: ReadStats,
                        sentences_per_document: int = 8) -> Iterator[list[str]]:
    """The sentences of GLUE training TSVs of `task` (`bert_jax.data.glue.TASKS`), labels ignored:
    a pair task's two sentences form one document; single sentences are grouped, in file order, into
    documents of `sentences_per_document`.

    Raises:
      ValueError / FileNotFoundError: as `bert_jax.data.glue.read_glue_tsv` (names file and line).
    """
    for path in files:
        examples = glue.read_glue_tsv(task, path)
        stats.lines += len(examples)
        group: list[str] = []
        for example in examples:
            texts = [t.strip() for t in (example.text_a, example.text_b) if t and t.strip()]
            if example.text_b is not None:
                if texts:
                    yield texts
                continue
            group += texts
            if len(group) >= sentences_per_document:
                yield group
                group = []
        if group:
            yield group


def write_sentence_documents(documents: Iterable[list[str]], path: str) -> tuple[int, int]:
    """Writes documents in the original format (one sentence per line, a blank line after each
    document) to a temporary name, then renames it to `path` -> (documents, sentences) written.
    Sentences are whitespace-normalised; empty ones and empty documents are left out."""
    docs = sentences = 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for document in documents:
            lines = [" ".join(s.split()) for s in document]
            lines = [line for line in lines if line]
            if lines:
                f.write("\n".join(lines) + "\n\n")
                docs += 1
                sentences += len(lines)
    os.replace(path + ".tmp", path)
    return docs, sentences
