"""The documentation's commands run: every fenced ```bash block of README.md and docs/*.md is either run here
at small sizes or marked `<!-- not run: REASON -->` on the line before it (a pod, a GPU or the network).

How a page runs: its runnable blocks, in order, as one bash script in a fresh temporary directory outside
the repository, with the README's placeholders set (`$DATA`: a folder of the shared data under the official
file names, small copies of the SQuAD and GLUE sets; `$CORPUS`: a glob of two documents of 800 Gutenberg sentences
each; `$HF_BERT`: a small random Hugging Face BERT with Google's vocabulary), `python` the interpreter
running the tests and this checkout first on PYTHONPATH. Each command is first made small by the rule of
`SMALL` its program matches (flags appended or substituted: fewer steps, examples and shards; `gs://`
buckets made local; the pod launcher's `--dry_run`); a command that matches no rule fails the suite, so a
new documented command needs a rule or a marker. README.md's commands that a docs page holds verbatim
(`RUN_ON_DOCS_PAGE`: the AOT check and GLUE) run on that page only.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import FAST_COMPILE, ROOT
from test_continued_pretraining import assert_pretraining_export_matches
from test_demo import DEMO_SST2_SENTENCES, DEMO_TOTAL_STEPS, assert_whole_pipeline, small_task_folders

PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(\S.*?)\s*-->$")
FENCE = re.compile(r"^```(\S*)\s*$")
LANGUAGES = {"bash", "text", "python"}  # an unlabelled fence could hide a command

_TRAIN_SMALL = ("--config.total_steps=6 --config.warmup_steps=1 --config.log_every=3 --config.checkpoint_every=6 "
                "--config.phases[0].batch_size=8 --config.phases[1].batch_size=8 "
                "--config.phases[0].max_seq_length=64 --config.phases[0].max_predictions_per_seq=10 "
                "--config.phases[1].max_seq_length=64 --config.phases[1].max_predictions_per_seq=10")


@dataclasses.dataclass(frozen=True)
class Rule:
    """How a documented command runs at small size: `program` (a regex) matches the command after any leading
    VAR=value assignments; `substitute` pairs (regex, replacement) are applied, then `append` is added;
    `xla_flags` are added to the command's XLA_FLAGS."""

    program: str
    substitute: tuple[tuple[str, str], ...] = ()
    append: str = ""
    xla_flags: str = ""


# A few steps of a small model: compiling dominates, so XLA's CPU backend skips LLVM's optimisation (as
# conftest.xla_flags does for the tests' own programs).
_COMPILE_FAST = f"--xla_backend_optimization_level=0 {FAST_COMPILE}"


SMALL = (
    Rule(r"python -m bert_jax\.data\.vocab\b", append="--vocab_size=2000"),
    Rule(r"python -m bert_jax\.data\.create_pretraining_data\b",
         substitute=((r"gs://my-bucket/", "bucket/"), (r"--num_shards=\d+", "--num_shards=2"),
                     (r"--num_workers=\d+", "--num_workers=1"), (r"--dupe_factor=\d+", "--dupe_factor=1"))),
    Rule(r"python -m bert_jax\.train\b", append=_TRAIN_SMALL, xla_flags=_COMPILE_FAST),
    Rule(r"python -m bert_jax\.aot\b", substitute=((r"pretrain:(base|large)\b", "pretrain:tiny"),),
         append="--config.phases[0].batch_size=128 --config.phases[1].batch_size=128 --config.total_steps=1000 "
                "--config.model.num_hidden_layers=1 --config.model.vocab_size=4096"),
    # the whole pipeline, random-init stages included, checked by tests/test_demo.py's `assert_whole_pipeline`
    Rule(r"python -m bert_jax\.demo\b", append=f"--total_steps={DEMO_TOTAL_STEPS} "
                                                 f"--sst2_train_examples={DEMO_SST2_SENTENCES} "
                                                 "--squad_train_examples=64 --squad_eval_examples=16"),
    Rule(r"python -m bert_jax\.tasks\.glue\b", append="--config.max_train_examples=32 --config.num_train_epochs=1 "
                                                     "--config.train_batch_size=16 --config.max_seq_length=64"),
    Rule(r"python -m bert_jax\.tasks\.squad\b",
         append="--config.max_train_examples=16 --config.max_predict_examples=8 --config.max_seq_length=64 "
                "--config.doc_stride=32 --config.max_query_length=16 --config.num_train_epochs=1 "
                "--config.train_batch_size=8"),
    Rule(r"launch/tpu_vm_pod\.sh --help$", substitute=((r"^launch/", f"{ROOT}/launch/"),)),
    Rule(r"launch/tpu_vm_pod\.sh\b", substitute=((r"^launch/", f"{ROOT}/launch/"), (r" -- ", " --dry_run -- "))),
    # small already
    Rule(r"python -m bert_jax\.convert (to_hf|from_hf)\b"),
    Rule(r"python -m bert_jax\.extract_features\b"),
    Rule(r"python -c\b"),
    Rule(r"printf\b"),
)

# README.md's commands of these programs are docs pages' commands verbatim (checked), and no later README command
# reads what they write: they run on the docs page only.
RUN_ON_DOCS_PAGE = (r"python -m bert_jax\.aot\b", r"python -m bert_jax\.tasks\.glue\b")

# Pages whose commands train or compile (tens of seconds each on a 2-core machine).
SLOW_PAGES = {"README.md", "docs/pretraining-data.md", "docs/pretraining.md", "docs/finetuning.md",
              "docs/checkpoints.md", "docs/tpu-pods.md", "docs/kernels.md", "docs/gpu.md"}

# Lines of the output a page shows, and files its commands write.
EXPECT = {
    "README.md": ("[1/6] corpus: pydoc", "[2/6] vocabulary:", "[3/6] tokenized documents:", "[4/6] pre-training BERT tiny",
                  "=== bert_jax demo summary ===", "+ gcloud compute tpus tpu-vm create bert-base",
                  "demo_hf: BertForPreTraining", "bert_ckpt: bert_jax checkpoint"),
    "docs/pretraining-data.md": ("documents, ", "tokens to data/docs", "instances in 2 shard(s) to data/p1"),
    "docs/checkpoints.md": ("converted: bert_jax checkpoint (not in the source: mlm_LayerNorm, mlm_output_bias, "
                            "mlm_transform, nsp)", "mrpc_hf: BertForSequenceClassification"),
    "docs/finetuning.md": ("wrote features of 2 examples to features.jsonl",),
    "docs/tpu-pods.md": ("v3-32: 32 devices, mesh {'data': 32, 'fsdp': 1, 'tensor': 1}, model dtype bfloat16, kernels tpu, "
                         "grad_accum_steps 1", "v3-128: 128 devices, mesh {'data': 16, 'fsdp': 8, 'tensor': 1}",
                         "roofline for the whole schedule (1000 steps)", "--accelerator_type TYPE",
                         "+ gcloud compute tpus tpu-vm create bert-base"),
    "docs/kernels.md": ("kernels splash", "(fits)"),
    "docs/pretraining.md": ('"step": 6', "train: architecture from config.init_checkpoint=",
                            "initialised fresh: mlm_LayerNorm, mlm_output_bias, mlm_transform, nsp"),
}
FILES = {
    "README.md": ("demo_run/summary.json", "runs/squad/predictions.json", "demo_hf/model.safetensors"),
    "docs/pretraining.md": ("runs/tiny/bert_config.json", "runs/mesh/vocab.txt", "runs/continued/tokenizer_config.json"),
    "docs/finetuning.md": ("runs/mrpc/metrics.json", "runs/squad/nbest_predictions.json", "features.jsonl"),
}

# Pages with `python -m bert_jax.aot` reports (how many), checked by `assert_aot_report`.
AOT_REPORTS = {"docs/tpu-pods.md": 2, "docs/kernels.md": 1, "docs/gpu.md": 1}

# What a page's commands read that an earlier page makes (run first, in the same directory).
SETUP = {
    "docs/pretraining.md": "cp \"$DATA/vocab.txt\" vocab.txt && python -m bert_jax.data.create_pretraining_data "
                           "--tokenize_only --input_file=\"$CORPUS\" --output_dir=data/docs --vocab_file=vocab.txt "
                           "--num_shards=2",
}


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    not_run: str | None  # the marker's reason


def read_blocks(page: str) -> list[Block]:
    """The fenced blocks of a page. Raises AssertionError on an unlabelled or unclosed fence."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, language = i, match.group(1)
        assert language in LANGUAGES, f"{page}:{i + 1}: fence language {language!r} is not one of {sorted(LANGUAGES)}"
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{page}:{i + 1}: unclosed fence"
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.match(before)
        blocks.append(Block(page, start + 1, language, "\n".join(lines[start + 1:end]),
                            marker.group(1) if marker else None))
        i = end + 1
    return blocks


def commands(text: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments and blank lines dropped."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = _strip_comment(line).strip()
        if line:
            out.append(re.sub(r"\s+", " ", line))
    return out


def _strip_comment(line: str) -> str:
    """`line` without a `#` comment (a `#` at the start or after whitespace, outside quotes)."""
    quote = None
    for k, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k]
    return line


def small(command: str) -> str:
    """`command` at small size (its rule of SMALL). Raises LookupError when no rule matches."""
    env, rest = re.match(r"^((?:[A-Z_]+=\S*\s+)*)(.*)$", command).groups()
    for rule in SMALL:
        if re.match(rule.program, rest):
            for pattern, replacement in rule.substitute:
                rest = re.sub(pattern, replacement, rest)
            if rule.xla_flags:
                own = re.search(r"\bXLA_FLAGS=(\S+)\s+", env)
                env = (env[:own.start()] + env[own.end():] if own else env) + \
                    f'XLA_FLAGS="{own.group(1) + " " if own else ""}{rule.xla_flags}" '
            return f"{env}{rest} {rule.append}".rstrip()
    raise LookupError(command)


def _runnable(page: str) -> list[Block]:
    return [b for b in read_blocks(page) if b.language == "bash" and b.not_run is None]


def run_here(page: str, command: str) -> bool:
    """False for a README.md command that RUN_ON_DOCS_PAGE leaves to a docs page."""
    return page != "README.md" or not any(re.match(program, command) for program in RUN_ON_DOCS_PAGE)


# ----------------------------------------------------------------------------- structure (fast)


def test_readme_is_a_short_front_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", "\n".join(lines)), "dates belong in benchmarks/README.md"


def test_every_docs_page_is_in_the_readme_index():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert len(pages) >= 8
    missing = [p.name for p in pages if f"](docs/{p.name})" not in readme]
    assert not missing, f"docs pages not linked from README.md: {missing}"


def test_links_between_pages_resolve():
    for page in PAGES + ["benchmarks/README.md"]:
        text = (ROOT / page).read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not re.match(r"[a-z]+://", target):
                assert ((ROOT / page).parent / target).exists(), f"{page}: link to {target} does not resolve"


def test_the_readme_names_the_ci_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    blocks = [b for b in read_blocks("README.md") if b.language == "bash"]
    assert any(commands(b.text) == ["make test"] for b in blocks)


def test_every_command_is_run_or_marked():
    """Each bash block has a small-size rule for every command, or a not-run marker with a reason."""
    unruled, marked = [], 0
    for page in PAGES:
        for block in read_blocks(page):
            if block.language != "bash":
                continue
            assert commands(block.text), f"{page}:{block.line}: an empty bash block"
            if block.not_run is not None:
                marked += 1
                continue
            for command in commands(block.text):
                try:
                    small(command)
                except LookupError:
                    unruled.append(f"{page}:{block.line}: {command}")
    assert not unruled, "commands with no small-size rule (add one to SMALL, or mark the block):\n" + "\n".join(unruled)
    assert marked >= 5
    on_docs_pages = {c for page in PAGES[1:] for block in _runnable(page) for c in commands(block.text)}
    elsewhere = [c for block in _runnable("README.md") for c in commands(block.text) if not run_here("README.md", c)]
    assert elsewhere and all(c in on_docs_pages for c in elsewhere), elsewhere


def test_small_rules():
    assert small("python -m bert_jax.data.create_pretraining_data --output_dir=gs://my-bucket/docs --num_shards=64") \
        == "python -m bert_jax.data.create_pretraining_data --output_dir=bucket/docs --num_shards=2"
    assert small("A=1 XLA_FLAGS=--x=8 python -m bert_jax.train --config pretrain:tiny").startswith(
        f'A=1 XLA_FLAGS="--x=8 {_COMPILE_FAST}" python -m bert_jax.train --config pretrain:tiny --config.total_steps=6')
    assert small("python -m bert_jax.train --config pretrain:tiny").startswith(f'XLA_FLAGS="{_COMPILE_FAST}" python')
    assert small("launch/tpu_vm_pod.sh --name n -- --config pretrain:base") == \
        f"{ROOT}/launch/tpu_vm_pod.sh --name n --dry_run -- --config pretrain:base"
    assert commands("a \\\n  b  # note\n# only a comment\nc '#x'\n") == ["a b", "c '#x'"]
    with pytest.raises(LookupError):
        small("rm -rf /")


# ----------------------------------------------------------------------------- the commands


def tiny_hf_bert(out: pathlib.Path, vocab_file: pathlib.Path) -> pathlib.Path:
    """A small random Hugging Face BertModel directory (config.json, model.safetensors, vocab.txt) in `out`: a
    stand-in for $HF_BERT that the documented commands load and train quickly."""
    import shutil

    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                                     intermediate_size=256)
    transformers.BertModel(config).save_pretrained(out)
    shutil.copyfile(vocab_file, out / "vocab.txt")
    return out


def make_doc_env(root: pathlib.Path, data_dir: pathlib.Path) -> dict:
    """The placeholders' values (files under `root`) and the environment of a documented command."""
    data = root / "data"
    small_task_folders(data_dir, data)  # SQuAD: 3 training articles and 1 dev article; SST-2: 2000 and 872 sentences
    (data / "glue" / "MRPC").mkdir()
    for name in ("train.tsv", "dev.tsv"):  # MRPC: the header and 200 (train) or 100 (dev) examples
        head = (data_dir / "glue" / "MRPC" / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (data / "glue" / "MRPC" / name).write_text("".join(head[:201 if name == "train.tsv" else 101]),
                                                   encoding="utf-8")
    (data / "vocab.txt").symlink_to(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    corpus = root / "corpus"
    corpus.mkdir()
    text = (data_dir / "corpus" / "gutenberg-sentences.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    (corpus / "books.txt").write_text("".join(text[:800]) + "\n" + "".join(text[-800:]), encoding="utf-8")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a link would leave the venv
    (bin_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SQUAD_DIR", "GLUE_DIR")}
    hf_bert = tiny_hf_bert(root / "hf_bert", data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    env.update(DATA=str(data), CORPUS=str(corpus / "*.txt"), HF_BERT=str(hf_bert), JAX_PLATFORMS="cpu",
               PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]))
    return env


_DOC_ENV: dict[str, dict] = {}


@pytest.fixture
def doc_env(tmp_path_factory, data_dir):
    """`make_doc_env`, built once per test worker and shared by the pages it runs (their commands only read the
    placeholders' files). Function-scoped, so that the pages spread over the workers (tests/conftest.py keeps a
    module's tests on one worker when they share a module- or session-scoped fixture of the module)."""
    if "env" not in _DOC_ENV:
        _DOC_ENV["env"] = make_doc_env(tmp_path_factory.mktemp("doc_env"), data_dir)
    return dict(_DOC_ENV["env"])


def run_page(page: str, env: dict, workdir: pathlib.Path) -> subprocess.CompletedProcess:
    """The page's runnable commands at small size, as one bash script in `workdir`."""
    lines = ["set -euo pipefail"]
    if page in SETUP:
        lines.append(SETUP[page])
    for block in _runnable(page):
        lines += [f"echo '+ {page}:{block.line}'"] + [small(c) for c in commands(block.text) if run_here(page, c)]
    return subprocess.run(["bash", "-c", "\n".join(lines)], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=1800)


def _page_params():
    return [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES else p for p in PAGES if _runnable(p)]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("page", _page_params())
def test_page_commands_run(page, doc_env, tmp_path):
    workdir = tmp_path / "work"  # outside the repository
    workdir.mkdir()
    result = run_page(page, doc_env, workdir)
    for archive in re.findall(r"^archive: (\S+)$", result.stdout, flags=re.M):  # the launcher's dry run
        pathlib.Path(archive).unlink(missing_ok=True)
    assert result.returncode == 0, f"{page}:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-5000:]
    for expected in EXPECT.get(page, ()):  # the output the page shows
        assert expected in result.stdout + result.stderr, f"{page}: {expected!r} not in the output:\n{result.stdout[-3000:]}"
    for path in FILES.get(page, ()):
        assert (workdir / path).is_file(), f"{page}: {path} not written"
    if page == "README.md":  # quick path 1: the demo's whole pipeline; its pre-training exported for transformers
        assert_whole_pipeline(workdir / "demo_run", result.stdout)
        assert_pretraining_export_matches(workdir / "demo_run" / "pretrain", workdir / "demo_hf")
    if page in AOT_REPORTS:
        assert_aot_report(result.stdout, pods=AOT_REPORTS[page])


def assert_aot_report(stdout: str, pods: int) -> None:
    """`pods` reports of `python -m bert_jax.aot` for the two-phase pre-training recipes in `stdout`: every phase
    fits, its kernels move HBM bytes, where XLA counts FLOPs (TPUs) they agree with the analytic count, and a GPU
    program holds the fused attention."""
    lines = [line for line in stdout.splitlines() if line.strip().startswith("phase")]
    assert len(lines) == 2 * pods and all("(fits)" in line for line in lines), stdout[-3000:]
    for line in lines:
        nbytes = re.search(r"HBM bytes (?:accessed|\(kernels' operands and results\)) ([\d.]+) GB", line)
        assert nbytes and float(nbytes.group(1)) > 0, line
        if "(ratio " in line:
            assert 0.9 <= float(line.split("(ratio ")[1].split(")")[0]) <= 1.25, line
    assert stdout.count("roofline bound (not a measurement)") == 2 * pods, stdout[-3000:]
    if "kernels gpu" in stdout:  # a GPU program: flash_gpu's Triton calls in every phase's kernels
        kernel_lines = [line for line in stdout.splitlines() if line.strip().startswith("kernels per step")]
        assert len(kernel_lines) == 2 * pods and all(" pallas " in line for line in kernel_lines), stdout[-3000:]


@pytest.mark.slow
def test_readme_python_example_runs(minilm_dir):
    """The README's "Using the model" block, with `hf_dir` the MiniLM directory."""
    block = next(b for b in read_blocks("README.md") if b.language == "python")
    namespace = {"hf_dir": str(minilm_dir)}
    exec(compile(block.text, "README.md", "exec"), namespace)
    out = namespace["out"]
    assert out.sequence_output.shape == (1, 4, 384) and out.pooled_output.shape == (1, 384)
