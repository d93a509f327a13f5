"""Every command-line entry point given malformed input, run as a user runs it (a subprocess from the project
root): one line on stderr naming the input, exit status 1, no traceback, and nothing left behind (no output
directory, workdir or file created; an existing file in the way unchanged).

The kinds of malformed input: a binary file where text is read, an output directory or workdir that is a
regular file (or inside one), an unknown recipe argument, a recipe of another job, a negative batch size,
a SQuAD predict file with a question that has no answer, and missing inputs.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration  # every test runs commands in subprocesses

BINARY = bytes(range(256)) * 64  # what /bin/ls is to a text reader: NUL bytes and invalid UTF-8 throughout


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _tree(path) -> dict:
    """Every path under `path` with its size (files) or None (directories)."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in dirs:
            out[os.path.join(root, name)] = None
        for name in files:
            out[os.path.join(root, name)] = os.path.getsize(os.path.join(root, name))
    return out


def check_refused(tmp, args, *expected: str) -> str:
    """Runs `python -m <args>`; asserts exit status 1, one stderr line holding every `expected` string, no
    traceback, and `tmp` unchanged. Returns the line."""
    before = _tree(tmp)
    result = _run(*args)
    lines = [line for line in result.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert result.returncode == 1, (args, result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr and len(lines) == 1, (args, result.stderr[-3000:])
    for text in expected:
        assert text in lines[0], (args, lines[0])
    assert _tree(tmp) == before, (args, "left behind", set(_tree(tmp)) ^ set(before))
    return lines[0]


@pytest.fixture
def inputs(tmp_path, data_dir):
    """A binary file, a regular file standing where an output directory goes, the vocabulary, a text corpus."""
    (tmp_path / "binary.txt").write_bytes(BINARY)
    (tmp_path / "afile").write_text("not a directory\n")
    (tmp_path / "corpus.txt").write_text("A first sentence here.\nAnd a second one.\n\nAnother document.\n")
    return tmp_path, str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")


def test_create_pretraining_data(inputs):
    tmp, vocab = inputs
    base = ["bert_jax.data.create_pretraining_data", f"--vocab_file={vocab}"]
    for extra in ([], ["--tokenize_only"]):
        check_refused(tmp, base + extra + [f"--input_file={tmp / 'binary.txt'}", f"--output_dir={tmp / 'out'}"],
                      "create_pretraining_data: ", "binary.txt: not text", "%)")
    check_refused(tmp, base + [f"--input_file={tmp / 'corpus.txt'}", f"--output_dir={tmp / 'afile'}"],
                  "--output_dir=", "afile", "not a directory")
    check_refused(tmp, base + [f"--input_file={tmp / 'corpus.txt'}", f"--output_dir={tmp / 'afile' / 'out'}"],
                  "inside", "not a directory")
    check_refused(tmp, ["bert_jax.data.create_pretraining_data", f"--vocab_file={tmp / 'binary.txt'}",
                        f"--input_file={tmp / 'corpus.txt'}", f"--output_dir={tmp / 'out'}"], "binary.txt", "UTF-8")
    # Flags of static instances with --tokenize_only (given explicitly, even at their defaults): not dropped.
    tokenize = base + ["--tokenize_only", f"--input_file={tmp / 'corpus.txt'}", f"--output_dir={tmp / 'out'}"]
    for flag in ("--do_whole_word_mask", "--nodo_whole_word_mask", "--masked_lm_prob=0.2", "--short_seq_prob=0.1",
                 "--max_predictions_per_seq=20", "--max_seq_length=512"):
        name = flag.split("=")[0].removeprefix("--").removeprefix("no")
        check_refused(tmp, tokenize + [flag], f"create_pretraining_data: --{name} applies to static instances only, "
                      f"not --tokenize_only: it is a phase config field of bert_jax.train when drawing instances "
                      f"while training (--config.phases[i].{name})")
    check_refused(tmp, tokenize + ["--dupe_factor=5", "--random_seed=1"], "--dupe_factor applies to static",
                  "new instances and masks every epoch", "--random_seed applies to static", "config.seed")
    check_refused(tmp, tokenize + ["--short_seq_per_document"], "--short_seq_per_document applies to static")


def test_vocab(inputs):
    tmp, _ = inputs
    base = ["bert_jax.data.vocab", "--vocab_size=1000"]
    check_refused(tmp, base + [f"--input_file={tmp / 'binary.txt'}", f"--output_file={tmp / 'vocab.txt'}"],
                  "vocab: ", "binary.txt: not text")
    check_refused(tmp, base + [f"--input_file={tmp / 'corpus.txt'}", f"--output_file={tmp / 'afile' / 'vocab.txt'}"],
                  "vocab: ", "does not exist")


def test_download_and_convert(inputs):
    tmp, _ = inputs
    check_refused(tmp, ["bert_jax.data.download", "squad", f"--output_dir={tmp / 'afile'}"], "download: ", "afile")
    check_refused(tmp, ["bert_jax.convert", "from_hf", f"--input={tmp / 'missing'}", f"--output_dir={tmp / 'out'}"],
                  "convert: ", "missing")
    check_refused(tmp, ["bert_jax.convert", "from_hf", f"--input={tmp}", f"--output_dir={tmp / 'out'}"],
                  "convert: ", "config.json")


def test_aot(inputs):
    tmp, _ = inputs
    check_refused(tmp, ["bert_jax.aot", "--config", "squad:tiny", "--topology", "v3-8"],
                  "aot: ", "not a pre-training config")
    check_refused(tmp, ["bert_jax.aot", "--config", "pretrain:huge", "--topology", "v3-8"],
                  "--config=pretrain:huge", "'huge' is not one of")


@pytest.mark.slow
def test_train(inputs, instances):
    tmp, _ = inputs
    base = ["bert_jax.train", "--config", "pretrain:tiny", f"--config.phases[0].data_dir={instances / 'p1'}",
            f"--config.phases[1].data_dir={instances / 'p2'}", "--config.mesh.num_devices=1",
            "--config.phases[0].batch_size=4", "--config.phases[1].batch_size=4"]
    check_refused(tmp, ["bert_jax.train", "--config", "pretrain:huge", f"--workdir={tmp / 'run'}"],
                  "--config=pretrain:huge", "'huge' is not one of")
    check_refused(tmp, ["bert_jax.train", "--config", str(tmp / "nothere.py"), f"--workdir={tmp / 'run'}"],
                  "nothere.py", "no such recipe or config file")
    check_refused(tmp, base + [f"--workdir={tmp / 'afile'}"], "train: --workdir=", "afile", "not a directory")
    check_refused(tmp, base + [f"--workdir={tmp / 'afile' / 'run'}"], "train: ", "not a directory")
    check_refused(tmp, base + [f"--workdir={tmp / 'run'}", "--config.phases[0].batch_size=-4"],
                  "train: config.phases[0].batch_size=-4 must be at least 1")
    check_refused(tmp, base + [f"--workdir={tmp / 'run'}", f"--config.phases[1].data_dir={tmp}"],
                  "train: ", "no metadata.json")
    check_refused(tmp, base + [f"--workdir={tmp / 'run'}", "--config.phases[0].do_whole_word_mask=True"],
                  f"train: config.phases[0].do_whole_word_mask=True but {instances / 'p1'} holds static instances "
                  "masked with do_whole_word_mask=False (fixed when they were written): set "
                  "config.phases[0].do_whole_word_mask=False")


def test_command_line_errors(inputs):
    """absl's flag errors (an unknown flag, a bad value, a required flag missing), a --config.<field> override of
    no field, unexpected arguments, and argparse's errors (convert): one line `<command>: ...` naming the flag,
    not absl's two lines, argparse's usage or ml_collections' traceback."""
    tmp, vocab = inputs
    train = ["bert_jax.train", "--config", "pretrain:tiny", f"--workdir={tmp / 'run'}"]
    check_refused(tmp, train + ["--nosuch=1"], "train: ", "Unknown command line flag 'nosuch'")
    check_refused(tmp, train + ["--config.total_steps=abc"], "train: ", "--config.total_steps=abc", "invalid literal")
    check_refused(tmp, train + ["--config.total_step=3"], "train: --config.total_step: no field 'total_step'",
                  'Did you mean "total_steps"')
    check_refused(tmp, ["bert_jax.train"], "train: ", "--config must have a value", "--workdir must have a value")
    check_refused(tmp, ["bert_jax.tasks.glue", "--config", "glue:sst2", f"--workdir={tmp / 'run'}",
                        "--config.model.hiden_size=8"], "glue: --config.model.hiden_size: no field 'hiden_size'")
    check_refused(tmp, ["bert_jax.aot", "--config", "pretrain:tiny", "stray"], "aot: unexpected arguments ['stray']")
    check_refused(tmp, ["bert_jax.extract_features", f"--input_file={tmp / 'corpus.txt'}", "--batch_size=many",
                        f"--output_file={tmp / 'features.json'}", f"--init_checkpoint={tmp / 'missing'}"],
                  "extract_features: ", "--batch_size=many")
    check_refused(tmp, ["bert_jax.data.vocab", "--vocab_size=x", f"--input_file={tmp / 'corpus.txt'}",
                        f"--output_file={tmp / 'vocab.txt'}"], "vocab: ", "--vocab_size=x")
    check_refused(tmp, ["bert_jax.demo", "--bogus"], "demo: ", "Unknown command line flag 'bogus'")
    check_refused(tmp, ["bert_jax.convert", "bogus"], "convert: ", "invalid choice: 'bogus'")
    check_refused(tmp, ["bert_jax.convert", "from_hf", f"--input={tmp}"], "convert from_hf: ", "required: --output_dir")


def _squad(path, answers: list) -> str:
    context = "The tower is 324 metres tall."
    qas = [{"id": "q1", "question": "How tall is the tower?", "answers": answers}]
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}))
    return str(path)


@pytest.mark.slow
def test_finetuning_jobs(inputs, data_dir):
    tmp, vocab = inputs
    tiny = [f"--config.vocab_file={vocab}", "--config.mesh.num_devices=1", "--config.model.num_hidden_layers=1",
            "--config.model.hidden_size=32", "--config.model.num_attention_heads=2",
            "--config.model.intermediate_size=64"]
    unanswered = _squad(tmp / "unanswered.json", [])
    check_refused(tmp, ["bert_jax.tasks.squad", "--config", "squad:tiny", *tiny, f"--config.predict_file={unanswered}",
                        f"--workdir={tmp / 'run'}"], "squad: ", "unanswered.json", "without an answer", "q1")
    check_refused(tmp, ["bert_jax.tasks.squad", "--config", "squad:tiny", *tiny,
                        f"--config.predict_file={tmp / 'binary.txt'}", f"--workdir={tmp / 'run'}"],
                  "squad: ", "binary.txt", "not UTF-8")
    sst2 = str(data_dir / "glue" / "SST-2")
    for field in ("train_batch_size", "eval_batch_size"):
        check_refused(tmp, ["bert_jax.tasks.glue", "--config", "glue:sst2", *tiny, f"--config.data_dir={sst2}",
                            f"--config.{field}=-4", f"--workdir={tmp / 'run'}"],
                      f"glue: config.{field}=-4 must be at least 1")
    check_refused(tmp, ["bert_jax.tasks.glue", "--config", "glue:sst3", f"--workdir={tmp / 'run'}"],
                  "--config=glue:sst3", "'sst3' is not one of")
    check_refused(tmp, ["bert_jax.tasks.ner", "--config", "ner:tiny", *tiny, f"--config.data_dir={tmp}",
                        f"--workdir={tmp / 'afile'}"], "ner: --workdir=", "not a directory")
    check_refused(tmp, ["bert_jax.tasks.swag", "--config", "swag:huge", f"--workdir={tmp / 'run'}"],
                  "--config=swag:huge", "'huge' is not one of")


def test_extract_features_and_demo(inputs):
    tmp, vocab = inputs
    check_refused(tmp, ["bert_jax.extract_features", f"--input_file={tmp / 'binary.txt'}",
                        f"--output_file={tmp / 'features.json'}", f"--init_checkpoint={tmp / 'missing'}"],
                  "extract_features: ", "binary.txt: not text", "%)", "not UTF-8")
    (tmp / "nul.txt").write_bytes(b"a sentence\0 with a NUL byte\n" * 3)  # UTF-8, but not text
    check_refused(tmp, ["bert_jax.extract_features", f"--input_file={tmp / 'nul.txt'}",
                        f"--output_file={tmp / 'features.json'}", f"--init_checkpoint={tmp / 'missing'}"],
                  "extract_features: ", "nul.txt: not text: 3 of its 3 lines (100%)", "NUL bytes")
    check_refused(tmp, ["bert_jax.demo", f"--corpus={tmp / 'binary.txt'}", f"--workdir={tmp / 'demo'}"],
                  "demo: ", "binary.txt")
    (tmp / "corpus10.txt").write_text("".join(f"Sentence number {i} of the corpus.\n" for i in range(12)))
    check_refused(tmp, ["bert_jax.demo", f"--corpus={tmp / 'corpus10.txt'}", f"--workdir={tmp / 'afile'}"],
                  "demo: --workdir=", "afile", "not a directory")


def _refused_in(cwd, args, *expected: str) -> str:
    """`check_refused`, run from `cwd` (inputs written relative to it, as a user in that directory writes them)."""
    before = _tree(cwd)
    result = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert result.returncode == 1, (args, result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr and len(lines) == 1, (args, result.stderr[-3000:])
    for text in expected:
        assert text in lines[0], (args, lines[0])
    assert _tree(cwd) == before, (args, "left behind", set(_tree(cwd)) ^ set(before))
    return lines[0]


def test_a_recipe_name_that_is_also_a_path_here(tmp_path):
    """Issue #50: `--config squad` run where the user's data folder `squad` is in the working directory: one
    line saying which is which and how to write each; `./squad` (the folder, written as a path) is not a
    config file. Every entry point parses --config with `configs.define_flag` (tests/test_configs.py: the
    clash with a file, `pretrain:tiny` beside `./pretrain`)."""
    from bert_jax import configs

    (tmp_path / "squad").mkdir()
    (tmp_path / "squad" / "train-v1.1.json").write_text("{}")
    recipes = os.path.dirname(configs.__file__)
    _refused_in(tmp_path, ["bert_jax.tasks.squad", "--config", "squad:tiny", "--workdir=run"],
                "--config=squad:tiny: 'squad' is both the recipe squad and the directory ./squad in the working "
                f"directory: write --config={recipes}/squad.py:tiny for the recipe (or run from another directory), "
                "--config=./squad:tiny for the directory")
    _refused_in(tmp_path, ["bert_jax.aot", "--config", "./squad", "--topology", "v3-8"],
                "--config=./squad: a directory, not a config file")


def test_errors_name_the_output_dir_and_the_input_as_written(inputs):
    """Issue #50: an --output_dir that cannot be created (under a regular file: refused for root too) is
    named as given (relative), never by the hidden staging directory made beside it; a corpus with no text
    names the --input_file given, with static instances and --tokenize_only."""
    tmp, vocab = inputs
    (tmp / "empty.txt").write_text("\n  \n")
    base = ["bert_jax.data.create_pretraining_data", f"--vocab_file={vocab}"]
    line = _refused_in(tmp, base + ["--input_file=corpus.txt", "--output_dir=afile/sub"],
                       "create_pretraining_data: --output_dir='afile/sub' is inside", "not a directory")
    assert "staging" not in line
    for extra in ([], ["--tokenize_only"]):
        _refused_in(tmp, base + extra + ["--input_file=empty.txt", "--output_dir=out"],
                    "create_pretraining_data: --input_file=empty.txt: no document with a non-empty sentence in it")
