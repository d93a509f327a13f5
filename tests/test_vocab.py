"""Vocabulary training: an 8000-piece uncased vocabulary from the Gutenberg books (their first TRAINING_LINES
lines), judged on WikiText-2.

Held-out measure: WikiText-2 valid + test, tokenized by our Tokenizer with the trained vocabulary. The
WikiText files carry markup that is not text: "<unk>" placeholders (rare words the dataset replaced),
" @-@ ", " @,@ ", " @.@ " (a split hyphen, thousands separator and decimal point) and " = Title = "
heading markers; the [UNK] rate is asserted on the text with these undone, and also reported raw.
Words are whitespace-separated words of that text.
"""

import json
import os
import re
import subprocess
import sys
import unicodedata

import pytest

from conftest import write_text_tfds

from bert_jax.data.tokenization import SPECIAL_TOKENS, Tokenizer
from bert_jax.data.vocab import train_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The books' first lines the vocabulary is trained on (of about 231,000; in file order: Austen, the Bible,
# Blake, Carroll, Chesterton, ...).
TRAINING_LINES = 100_000


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    stats = train_vocab([str(data_dir / "corpus/gutenberg/*.txt")], 8000, str(path), max_sentences=TRAINING_LINES)
    print(f"\ntrained in {stats['seconds']}s: {stats}")
    return path, stats


def _wikitext_without_markup(text):
    text = text.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".").replace("<unk>", "")
    return re.sub(r"^ *(= )+(.*?)( =)+ *$", r"\2", text, flags=re.M)


def _is_punctuation(c):
    return (not c.isalnum() and c.isascii()) or unicodedata.category(c).startswith("P")


def test_format(trained):
    path, stats = trained
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and "\r" not in "".join(lines)
    tokens = lines[:-1]
    assert len(tokens) == 8000 == stats["vocab_size"]
    assert tuple(tokens[:5]) == SPECIAL_TOKENS
    assert len(set(tokens)) == len(tokens)
    assert all(t and t == t.strip() and " " not in t for t in tokens)
    continuations = [t for t in tokens if t.startswith("##")]
    assert 1000 < len(continuations) < 7000
    # Every corpus character (lowercased: no capitals) is a word-initial and a ## piece.
    chars = [t for t in tokens[5:] if len(t) == 1]
    assert len(chars) == stats["characters"] > 50
    assert all("##" + c in tokens for c in chars)
    assert set("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-") <= set(chars)
    assert not any(c.isupper() for t in tokens[5:] for c in t)
    # No piece crosses punctuation: a punctuation character is a token on its own.
    for t in tokens[5:]:
        body = t.removeprefix("##")
        assert len(body) == 1 or not any(_is_punctuation(c) for c in body), t
    assert stats["unused"] == 0 and stats["pieces"] > 7000
    tokenizer = Tokenizer(path)
    assert tokenizer.vocab_size == 8000 and tokenizer.vocab_sha256 == stats["sha256"]
    assert not [p for p in os.listdir(path.parent) if p != "vocab.txt"]  # no temporary file left


def test_wikitext_unk_rate_and_tokens_per_word(trained, data_dir):
    path, _ = trained
    tokenizer = Tokenizer(path)
    raw = "".join((data_dir / f"corpus/wikitext-2/{split}.txt").read_text(encoding="utf-8")
                  for split in ("valid", "test"))
    results = {}
    for name, text in (("raw", raw), ("without markup", _wikitext_without_markup(raw))):
        lines = [line for line in text.split("\n") if line.strip()]
        ids = [i for line_ids in tokenizer.encode_batch(lines) for i in line_ids]
        words = sum(len(line.split()) for line in lines)
        results[name] = (ids.count(tokenizer.unk_id) / len(ids), len(ids) / words, len(ids), words)
    for name, (unk, per_word, n_tokens, n_words) in results.items():
        print(f"\nWikiText-2 valid+test {name}: {n_words} words, {n_tokens} tokens, "
              f"[UNK] {unk:.3%} of tokens, {per_word:.3f} tokens per word")
    unk, per_word, _, _ = results["without markup"]
    assert unk < 0.01
    assert 1.0 < per_word < 1.6
    assert results["raw"][0] < 0.01  # the markup's ASCII symbols are in the vocabulary too


def test_cased_vocabulary(tmp_path, data_dir):
    path = tmp_path / "cased.txt"
    stats = train_vocab([str(data_dir / "corpus/gutenberg-sentences.txt")], 2000, str(path),
                        do_lower_case=False, max_sentences=20_000)
    assert stats["lines"] == 20_000 and stats["vocab_size"] == 2000
    tokenizer = Tokenizer(path, do_lower_case=False)
    assert {"A", "Z", "##A", "The"} <= set(tokenizer.vocab)
    assert tokenizer.tokenize("The THE the")[0] == "The"
    assert "[UNK]" not in tokenizer.tokenize("The Project Gutenberg EBook, by Jane Austen.")


def test_library_errors(tmp_path, data_dir):
    out = tmp_path / "vocab.txt"
    out.write_text("keep me\n", encoding="utf-8")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\x00\x01\n", encoding="utf-8")
    sample = str(data_dir / "corpus/bert_sample_text.txt")
    cases = [
        (([str(tmp_path / "missing-*.txt")], 100), "matches no file"),
        (([str(blank)], 100), "contain no text"),
        (([sample], 40), r"vocab_size=40 cannot hold the 5 special tokens and \d+ characters"),
        (([sample], 100, str(tmp_path / "no" / "dir.txt")), "does not exist"),
    ]
    for args, message in cases:
        args = args + (str(out),) if len(args) == 2 else args
        with pytest.raises(ValueError, match=message) as e:
            train_vocab(*args)
        assert "\n" not in str(e.value)
    assert out.read_text(encoding="utf-8") == "keep me\n"
    assert sorted(os.listdir(tmp_path)) == ["blank.txt", "vocab.txt"]


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "bert_jax.data.vocab", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_cli(tmp_path, data_dir):
    out = tmp_path / "vocab.txt"
    corpus = data_dir / "corpus"
    run = _cli(f"--input_file={corpus / 'bert_sample_text.txt'},{corpus / 'wikitext-2' / 'val*.txt'}",
               "--vocab_size=500", f"--output_file={out}", "--max_sentences=2000")
    assert run.returncode == 0, run.stderr
    stats = json.loads(run.stdout.strip().splitlines()[-1])
    assert stats["files"] == 2 and stats["vocab_size"] == 500 and stats["lines"] == 2000
    tokens = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(tokens) == 500 and tokens[0] == "[PAD]"
    assert Tokenizer(out).tokenize("the")  # loads

    missing = tmp_path / "missing.txt"
    run = _cli(f"--input_file={tmp_path / 'nothing-*.txt'}", "--vocab_size=500", f"--output_file={missing}")
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1] == f"vocab: --input_file: '{tmp_path / 'nothing-*.txt'}' matches no file"
    assert not missing.exists()


@pytest.mark.integration
def test_cli_rejects_positional_arguments(tmp_path, data_dir):
    out = tmp_path / "vocab.txt"
    run = _cli(f"--input_file={data_dir / 'corpus' / 'bert_sample_text.txt'}", "--vocab_size=500",
               f"--output_file={out}", "stray.txt")
    assert run.returncode == 1
    assert run.stderr.strip() == "vocab: unexpected arguments ['stray.txt']"
    assert "Traceback" not in run.stderr and not out.exists()


# ----------------------------------------------------------------------------- a TFDS corpus


TFDS_ARTICLES = 20  # WikiText-2 valid articles in the local TFDS dataset


@pytest.fixture(scope="module")
def wikitext_tfds(tmp_path_factory, data_dir):
    """A TFDS text dataset prepared offline (`conftest.write_text_tfds`): the first
    TFDS_ARTICLES WikiText-2 valid articles, one example each, its sentences one a line in feature "text";
    and the same sentences written as a file (one a line, a blank line between articles)."""
    from bert_jax.data import corpus

    articles = list(corpus.read_wikitext_documents([str(data_dir / "corpus/wikitext-2/valid.txt")],
                                                   corpus.ReadStats()))[:TFDS_ARTICLES]
    root = tmp_path_factory.mktemp("vocab_tfds")
    write_text_tfds("vocab_wikitext_sample", ("\n".join(sentences) for sentences in articles), root / "tfds")
    text_file = root / "articles.txt"
    text_file.write_text("".join("\n".join(s) + "\n\n" for s in articles), encoding="utf-8")
    return "vocab_wikitext_sample", str(root / "tfds"), text_file, sum(len(s) for s in articles)


def test_tfds_vocabulary_equals_the_files(wikitext_tfds, tmp_path):
    """--tfds_name reads the dataset as create_pretraining_data does (`corpus.read_tfds_documents`): the
    vocabulary equals, byte for byte, the one trained from the same sentences written as a file."""
    name, tfds_dir, text_file, sentences = wikitext_tfds
    from_tfds = train_vocab(None, 600, str(tmp_path / "tfds.txt"), tfds_name=name, tfds_data_dir=tfds_dir)
    from_file = train_vocab([str(text_file)], 600, str(tmp_path / "file.txt"))
    assert from_tfds["lines"] == from_file["lines"] == sentences and from_tfds["words"] == from_file["words"]
    assert from_tfds["sha256"] == from_file["sha256"] and from_tfds["pieces"] > 100
    assert (tmp_path / "tfds.txt").read_bytes() == (tmp_path / "file.txt").read_bytes()
    assert from_tfds["tfds_name"] == name and from_tfds["files"] == 0
    for kwargs, message in ((dict(tfds_name=name, tfds_data_dir=tfds_dir, tfds_text_key="body"), "--tfds_text_key 'body'"),
                            (dict(tfds_name=name, tfds_data_dir=tfds_dir, tfds_split="test"), "--tfds_split 'test'"),
                            (dict(), "give exactly one of --input_file and --tfds_name")):
        with pytest.raises(ValueError, match=message) as e:
            train_vocab(None, 600, str(tmp_path / "bad.txt"), **kwargs)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="give exactly one"):
        train_vocab([str(text_file)], 600, str(tmp_path / "bad.txt"), tfds_name=name)
    assert not (tmp_path / "bad.txt").exists()


@pytest.mark.integration
def test_cli_tfds_and_its_one_line_errors(wikitext_tfds, tmp_path):
    """The command with create_pretraining_data's --tfds_* flags; an unknown dataset or split is one line
    naming the flag, no traceback, nothing written."""
    name, tfds_dir, _, _ = wikitext_tfds
    out = tmp_path / "vocab.txt"
    run = _cli(f"--tfds_name={name}", f"--tfds_data_dir={tfds_dir}", "--vocab_size=600", f"--output_file={out}")
    assert run.returncode == 0, run.stderr
    stats = json.loads(run.stdout.strip().splitlines()[-1])
    assert stats["tfds_name"] == name and stats["vocab_size"] == 600 and len(out.read_text().splitlines()) == 600
    for flag, message in (("--tfds_name=no_such_corpus", "vocab: --tfds_name 'no_such_corpus': no such TFDS dataset"),
                          ("--tfds_split=test", f"vocab: --tfds_split 'test' of '{name}': Unknown split 'test'")):
        args = [f"--tfds_name={name}", f"--tfds_data_dir={tfds_dir}", "--vocab_size=600",
                f"--output_file={tmp_path / 'bad.txt'}", flag]
        run = _cli(*args)
        assert run.returncode == 1 and "Traceback" not in run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(message), run.stderr[-2000:]
        assert not (tmp_path / "bad.txt").exists()
