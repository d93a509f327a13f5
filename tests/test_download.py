"""The data download (`python -m bert_jax.data.download`) against a local HTTP mirror built from the shared
data folder in the official layouts, and `make test`'s fetch of the test data on a machine without it."""

import contextlib
import functools
import hashlib
import http.server
import io
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import threading
import zipfile

import pytest

from bert_jax.data import download, glue
from test_glue import FILES as GLUE_FILES, EXPECTED as GLUE_EXPECTED, _job_config, _submission

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _zip(path: pathlib.Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)


@pytest.fixture(scope="module")
def mirror(data_dir, tmp_path_factory):
    """A folder with every file of `download.sources` at its name, built from the shared copies as the
    official homes pack them, and the sha256 table that accepts it: the official table, with the hashes of
    the files that cannot be rebuilt bit for bit from the shared copies replaced (the full SQuAD train files,
    the archives, the MSR files, of which the shared copies are GLUE's inputs, not the published bytes).
    The GLUE tasks beyond SST-2 and MRPC are test_glue's small files in each task's official format, packed as
    GLUE's zips pack them (`<folder>/...`, a folder entry, files the readers do not read); the diagnostic set
    is GLUE's AX.tsv as it is."""
    root = tmp_path_factory.mktemp("mirror")
    squad = root / "squad"
    squad.mkdir()
    subset = json.loads((data_dir / "squad" / "train-v1.1-subset-44articles.json").read_text(encoding="utf-8"))
    dev = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    # The official train file's first 44 articles are the subset; more articles follow them.
    (squad / "train-v1.1.json").write_text(json.dumps({"data": subset["data"] + dev["data"][:3], "version": "1.1"}))
    shutil.copyfile(data_dir / "squad" / "dev-v1.1.json", squad / "dev-v1.1.json")
    shutil.copyfile(data_dir / "squad" / "cs224n-dev-v2.0.json", squad / "dev-v2.0.json")
    shutil.copyfile(data_dir / "squad" / "cs224n-dev-v2.0.json", squad / "train-v2.0.json")
    sst2 = data_dir / "glue" / "SST-2"
    dev_rows = (sst2 / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    test = "index\tsentence\n" + "".join(f"{i}\t{row.split(chr(9))[0]}\n" for i, row in enumerate(dev_rows))
    _zip(root / "glue" / "SST-2.zip", {"SST-2/train.tsv": (sst2 / "train.tsv").read_bytes(),
                                       "SST-2/dev.tsv": (sst2 / "dev.tsv").read_bytes(),
                                       "SST-2/test.tsv": test.encode(), "SST-2/original/README.txt": b"SST\n"})
    (root / "glue" / "MRPC").mkdir()
    for name in ("msr_paraphrase_train.txt", "msr_paraphrase_test.txt", "dev_ids.tsv"):
        shutil.copyfile(data_dir / "glue" / "MRPC" / name, root / "glue" / "MRPC" / name)
    glue_zips = {}
    for task in ("cola", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"):
        folder = glue.TASKS[task].folder
        glue_zips[task] = f"glue/{'QNLIv2' if task == 'qnli' else folder}.zip"  # GLUE's file names
        members = {f"{folder}/{name}": text.encode() for name, text in GLUE_FILES[folder].items()}
        _zip(root / glue_zips[task], {f"{folder}/": b"", **members, f"{folder}/original/README.txt": b"not read\n"})
    (root / "glue" / "diagnostic").mkdir()
    (root / "glue" / "diagnostic" / "diagnostic.tsv").write_text(GLUE_FILES["diagnostic"]["diagnostic.tsv"])
    books = {f"gutenberg/{p.name}": p.read_bytes() for p in sorted((data_dir / "corpus" / "gutenberg").iterdir())}
    books["gutenberg/bryant-stories.txt"] = b"A book the tests do not read.\n"  # NLTK's zip has 18 books
    _zip(root / "corpus" / "gutenberg.zip", books)
    shutil.copytree(data_dir / "corpus" / "wikitext-2", root / "corpus" / "wikitext-2")
    shutil.copyfile(data_dir / "corpus" / "bert_sample_text.txt", root / "corpus" / "bert_sample_text.txt")
    (root / "vocab").mkdir()
    shutil.copyfile(data_dir / "vocab" / "bert-base-uncased-vocab.txt", root / "vocab" / "bert-base-uncased-vocab.txt")
    replaced = ("squad/train-v1.1.json", "squad/train-v2.0.json", "squad/dev-v2.0.json", "glue/SST-2.zip",
                "glue/MRPC/msr_paraphrase_train.txt", "glue/MRPC/msr_paraphrase_test.txt", *glue_zips.values(),
                "glue/diagnostic/diagnostic.tsv")
    expected = {**download.SHA256, **{name: _sha((root / name).read_bytes()) for name in replaced}}
    return root, expected


@contextlib.contextmanager
def _serve(folder):
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _tree(path: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_every_dataset_into_the_tests_layout(mirror, data_dir, tmp_path, capsys):
    root, expected = mirror
    with _serve(root) as url:
        download.download("all", str(tmp_path / "data"), base_url=url, expected=expected)
    out = _tree(tmp_path / "data")
    # Every file of the shared folder is there, bit for bit, derived files included (MRPC by GLUE's rule,
    # gutenberg-sentences.txt by its regular expression, the 44-article subset); in place of the unpublished
    # cs224n-dev-v2.0.json, the published dev-v2.0.json (the tests read either). The table's hashes hold.
    shared = {name: data for name, data in _tree(data_dir).items()
              if name not in ("README.md", "squad/cs224n-dev-v2.0.json")}
    assert sorted(set(shared) - set(out)) == [] and "squad/dev-v2.0.json" in out and "README.md" in out
    for name, data in shared.items():
        assert out[name] == data, name
    for name, data in out.items():
        if name in expected:
            assert _sha(data) == expected[name], name
    assert "corpus/gutenberg/bryant-stories.txt" not in out and "glue/SST-2/original/README.txt" not in out
    assert sorted({n.split("/")[1] for n in out if n.startswith("glue/")}) == ["MRPC", "SST-2"]  # the tests' GLUE
    assert sorted(n for n in out if n.startswith("squad/")) == [
        "squad/dev-v1.1.json", "squad/dev-v2.0.json", "squad/train-v1.1-subset-44articles.json",
        "squad/train-v1.1.json", "squad/train-v2.0.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # no staging folder left beside it
    assert f"wrote {tmp_path / 'data' / 'README.md'}" in capsys.readouterr().out


def test_one_dataset_into_its_folder_with_the_old_command_line(mirror, data_dir, tmp_path):
    root, expected = mirror
    with _serve(root) as url:
        download.download("squad", str(tmp_path / "squad"), "1.1", base_url=url, expected=expected)
        assert download.main(["wikitext-2", f"--output_dir={tmp_path / 'corpus'}", f"--base_url={url}"]) == 0
    assert sorted(_tree(tmp_path / "squad")) == ["dev-v1.1.json", "train-v1.1-subset-44articles.json",
                                                 "train-v1.1.json"]
    assert (tmp_path / "corpus" / "wikitext-2" / "valid.txt").read_bytes() == (
        data_dir / "corpus" / "wikitext-2" / "valid.txt").read_bytes()


@pytest.fixture(scope="module")
def glue_download(mirror, tmp_path_factory):
    """`download glue` (every task, the default of --tasks) from the mirror, through the command line: the
    folder it wrote and its stdout."""
    root, expected = mirror
    out = tmp_path_factory.mktemp("glue-download") / "glue"
    with _serve(root) as url, pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as log:
        patch.setattr(download, "SHA256", expected)
        assert download.main(["glue", f"--output_dir={out}", f"--base_url={url}"]) == 0
    return out, log.getvalue()


def test_glue_every_task_from_one_command(glue_download, data_dir):
    """Every task's files in the layout the readers and the jobs read (GLUE's download script's), bit for bit
    as the zips hold them (nothing else of the zips), SST-2 and MRPC as `all` writes them, AX as
    diagnostic/diagnostic.tsv; each file reads back as test_glue's small files do."""
    out, log = glue_download
    tree = _tree(out)
    small = {f"{folder}/{name}": text.encode() for folder, files in GLUE_FILES.items()
             if folder not in ("SST-2", "MRPC") for name, text in files.items()}
    shared = {name.removeprefix("glue/"): data for name, data in _tree(data_dir).items()
              if name.startswith(("glue/SST-2/", "glue/MRPC/")) and name != "glue/SST-2/test.tsv"}
    assert tree.pop("SST-2/test.tsv").startswith(b"index\tsentence\n")  # the mirror's (no shared copy)
    assert tree == {**small, **shared}
    assert sorted(name.split("/")[0] for name in tree if name.endswith("train.tsv")) == [
        "CoLA", "MNLI", "MRPC", "QNLI", "QQP", "RTE", "SST-2", "STS-B", "WNLI"]
    assert [line.rsplit("/", 1)[1] for line in log.splitlines() if line.startswith("fetched ")] == [
        "CoLA.zip", "SST-2.zip", "msr_paraphrase_train.txt", "msr_paraphrase_test.txt", "dev_ids.tsv", "QQP.zip",
        "STS-B.zip", "MNLI.zip", "QNLIv2.zip", "RTE.zip", "WNLI.zip", "diagnostic.tsv"]
    for (task, name), rows in GLUE_EXPECTED.items():
        if task in ("sst2", "mrpc"):  # the real files here: test_glue reads those
            continue
        examples = glue.read_glue_tsv(task, str(out / glue.TASKS[task].folder / name))
        assert [(e.text_a, e.text_b, e.label) for e in examples] == rows, (task, name)
    assert len(glue.read_glue_tsv("ax", str(out / "diagnostic" / "diagnostic.tsv"))) == 3


def test_glue_job_reads_the_downloaded_folder(glue_download, data_dir, tmp_path):
    """MNLI's job end to end on the downloaded folder: both dev sets, both test sets and AX.tsv from the
    diagnostic file the download put beside MNLI/, where the job looks for it."""
    from bert_jax.tasks import glue as glue_task

    out, _ = glue_download
    metrics = glue_task.run(_job_config("mnli", out, data_dir), str(tmp_path))
    assert (metrics["matched_eval_examples"], metrics["mismatched_eval_examples"]) == (2, 3)
    assert [p.rsplit("/", 1)[1] for p in metrics["submission"]] == ["MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"]
    assert [i for i, _ in _submission(tmp_path / "submission" / "AX.tsv")] == ["0", "1", "2"]


def test_glue_tasks_fetches_only_those(mirror, tmp_path, capsys):
    """`--tasks RTE, cola` from a mirror that holds only those two zips: any other fetch would fail (HTTP 404)."""
    root, expected = mirror
    only = tmp_path / "mirror"
    for name in ("glue/CoLA.zip", "glue/RTE.zip"):
        (only / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / name, only / name)
    with _serve(only) as url:
        written = download.download("glue", str(tmp_path / "glue"), base_url=url, expected=expected,
                                    tasks="RTE, cola")
    assert sorted(_tree(tmp_path / "glue")) == ["CoLA/dev.tsv", "CoLA/test.tsv", "CoLA/train.tsv",
                                                "RTE/dev.tsv", "RTE/test.tsv", "RTE/train.tsv"]
    assert len(written) == 6 and capsys.readouterr().out.count("fetched ") == 2


def test_glue_tasks_parsing_and_one_line_errors(mirror, tmp_path, capsys, monkeypatch):
    assert download.glue_tasks(None) == download.glue_tasks("all") == download.glue_tasks("rte,all") == (
        "cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "ax")
    assert set(download.GLUE_TASKS) == {*glue.TASKS, glue.AX.name}  # the readers' names, the diagnostic set's
    assert download.glue_tasks(" MNLI,ax,mnli ") == ("mnli", "ax") and download.glue_tasks(["wnli", "cola"]) == (
        "cola", "wnli")
    valid = "valid: all, or a comma-separated list of cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli, ax"
    out = tmp_path / "out"
    for argv, message in (
            (["glue", "--tasks=cola,boolq"], f"--tasks: 'boolq' is not a GLUE task; {valid}"),
            (["glue", "--tasks="], f"--tasks: '' is not a GLUE task; {valid}"),
            (["squad", "--tasks=cola"], "--tasks names GLUE tasks: it goes with the glue dataset, not squad (all "
                                        "fetches GLUE's sst2 and mrpc, the tests' layout)")):
        assert download.main([*argv, f"--output_dir={out}", "--base_url=http://127.0.0.1:9"]) == 1
        assert capsys.readouterr().err.strip() == f"download: {message}"
    # A zip without a file the job reads: one line naming both, nothing written.
    root, expected = mirror
    bad = tmp_path / "mirror" / "glue" / "MNLI.zip"
    members = {f"MNLI/{n}": t.encode() for n, t in GLUE_FILES["MNLI"].items() if n != "test_mismatched.tsv"}
    _zip(bad, members)
    monkeypatch.setattr(download, "SHA256", {**expected, "glue/MNLI.zip": _sha(bad.read_bytes())})
    with _serve(tmp_path / "mirror") as url:
        assert download.main(["glue", "--tasks=mnli", f"--output_dir={out}", f"--base_url={url}"]) == 1
    assert capsys.readouterr().err.strip() == "download: glue/MNLI.zip: no member 'MNLI/test_mismatched.tsv'"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror"]


def test_a_corrupt_file_fails_naming_it_and_both_hashes(mirror, tmp_path, capsys):
    root, _ = mirror
    bad = tmp_path / "mirror"
    shutil.copytree(root / "corpus", bad / "corpus")
    valid = bad / "corpus" / "wikitext-2" / "valid.txt"
    valid.write_bytes(valid.read_bytes().replace(b" the ", b" thE ", 1))
    (tmp_path / "out").mkdir()
    with _serve(bad) as url:
        status = download.main(["wikitext-2", f"--output_dir={tmp_path / 'out' / 'data'}", f"--base_url={url}"])
    err = capsys.readouterr().err.strip()
    assert status == 1 and len(err.splitlines()) == 1, err
    assert err.startswith("download: corpus/wikitext-2/valid.txt from ") and "sha256 " in err
    assert _sha(valid.read_bytes()) in err and download.SHA256["corpus/wikitext-2/valid.txt"] in err
    assert list((tmp_path / "out").iterdir()) == []  # nothing left behind, not even the staging folder


def test_network_failures_are_one_line_naming_the_url(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    silent = socket.socket()  # accepts connections (the kernel's backlog) but never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        with _serve(tmp_path / "empty") as url:
            for base, reason in ((f"http://127.0.0.1:{port}", "refused"), (url, "HTTP 404"),
                                 (f"http://127.0.0.1:{silent.getsockname()[1]}", "timed out")):
                status = download.main(["vocab", f"--output_dir={tmp_path / 'out'}", f"--base_url={base}",
                                        "--timeout=0.5"])
                err = capsys.readouterr().err.strip()
                assert status == 1 and len(err.splitlines()) == 1, err
                assert err.startswith(f"download: cannot download {base}/vocab/bert-base-uncased-vocab.txt: "), err
                assert reason in err, err
    finally:
        silent.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


@pytest.mark.parametrize("make_output_dir", ["a file", "inside a file"])
def test_output_dir_errors_are_ours(tmp_path, capsys, make_output_dir):
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" if make_output_dir == "a file" else tmp_path / "afile" / "data"
    assert download.main(["all", f"--output_dir={out}", "--base_url=http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"download: --output_dir={str(out)!r} ") and "not a directory" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_bad_flags_are_one_line(tmp_path, capsys):
    assert download.main(["squad", f"--output_dir={tmp_path / 'out'}", "--version=3.0"]) == 1
    assert capsys.readouterr().err.strip() == "download: --version '3.0' is not one of ['1.1', '2.0'] or 'all'"
    assert download.main(["vocab", f"--output_dir={tmp_path / 'out'}", "--timeout=0"]) == 1
    assert capsys.readouterr().err.strip() == "download: --timeout=0.0 must be a positive number of seconds"
    assert list(tmp_path.iterdir()) == []


def test_glue_mrpc_rule_and_squad_subset_rule():
    train = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n1\t1\t2\tA.\tB.\r\n0\t3\t4\tC.\tD.\r\n"
    test = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t5\t6\tE.\tF.\n"
    files = download.glue_mrpc(train, test, "3\t4\n")
    assert files["train.tsv"] == "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA.\tB.\n"
    assert files["dev.tsv"].endswith("\n0\t3\t4\tC.\tD.\n")
    assert files["test.tsv"] == "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n0\t5\t6\tE.\tF.\n"
    with pytest.raises(ValueError, match=r"^msr_paraphrase_train.txt line 2: 4 tab-separated fields"):
        download.glue_mrpc(train.replace("\tB.", ""), test, "")
    data = {"version": "1.1", "data": [{"title": f"t{i}", "paragraphs": []} for i in range(50)]}
    assert json.loads(download.squad_subset(data))["data"] == data["data"][:44]
    text = "One.  Two (a). Three\nfour!\n \n(Five; six.) Seven: \"Eight.\" Nine? [Ten] eleven."
    assert download.sentences_document(text) == ["One.", "Two (a).", "Three four!", "(Five; six.) Seven:",
                                                 "\"Eight.\" Nine?", "[Ten] eleven."]


def _make(tmp_path, *args, **env):
    """Runs `make -s` with the project's Makefile in a checkout-like folder without ../shared/data and a
    venv stamp already made (nothing installed), with this interpreter as the venv's and this tree's package."""
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    for name in ("Makefile", "setup.cfg", "pyproject.toml", "constraints.txt"):
        shutil.copyfile(ROOT / name, repo / name)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "python").write_text(  # pytest itself only says which data folder it was given
        '#!/bin/sh\nif [ "$1 $2" = "-m pytest" ]; then echo "pytest BERT_JAX_DATA=$BERT_JAX_DATA"; exit 0; fi\n'
        f'exec "{sys.executable}" "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".installed").touch()
    # a user's own `make`, not a sub-make of the `make test` that may be running this suite
    full_env = {k: v for k, v in os.environ.items() if k not in ("BERT_JAX_DATA", "MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    full_env.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run(["make", "-s", f"VENV={venv}", *args], cwd=repo, env=full_env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.integration
def test_make_test_fetches_only_without_the_data_folder(tmp_path):
    dry = _make(tmp_path, "-n", "test")
    assert "bert_jax.data.download all --output_dir .data" in dry.stdout and "-m pytest" in dry.stdout
    dry = _make(tmp_path, "-n", "test", BERT_JAX_DATA=str(tmp_path))
    assert "bert_jax.data.download" not in dry.stdout and "-m pytest" in dry.stdout, dry.stdout
    (tmp_path / "repo" / ".data").mkdir()
    (tmp_path / "repo" / ".data" / "README.md").write_text("downloaded before\n")  # fetched once, then reused
    run = _make(tmp_path, "test")
    assert run.returncode == 0 and run.stdout == f"pytest BERT_JAX_DATA={tmp_path / 'repo' / '.data'}\n", run
    (tmp_path / "shared" / "data").mkdir(parents=True)  # ../shared/data of the checkout, as in CI
    dry = _make(tmp_path, "-n", "test")
    assert "bert_jax.data.download" not in dry.stdout and "-m pytest" in dry.stdout, dry.stdout
    run = _make(tmp_path, "test")
    assert run.returncode == 0 and run.stdout == "pytest BERT_JAX_DATA=\n", run  # conftest's default: unchanged


@pytest.mark.integration
def test_make_demo_fetches_the_task_files_only_without_the_data_folder(tmp_path):
    """A fresh clone (no ../shared/data): `make demo` fetches SQuAD and GLUE with the download command into .data
    and gives the demo those folders; offline it goes on (the demo skips those stages and says how to fetch them);
    beside the shared data folder it fetches nothing."""
    dry = _make(tmp_path, "-n", "demo")
    for dataset in ("squad", "glue --tasks sst2"):  # the demo's GLUE stage reads SST-2 only
        assert f"bert_jax.data.download {dataset} " in dry.stdout
        assert f"--output_dir .data/{dataset.split()[0]}/" in dry.stdout
    assert ('SQUAD_DIR="$(test -d .data/squad && echo .data/squad)" '
            'GLUE_DIR="$(test -d .data/glue/SST-2 && echo .data/glue)"') in dry.stdout, dry.stdout
    assert "-m bert_jax.demo" in dry.stdout
    (tmp_path / "repo" / ".data" / "glue" / "SST-2").mkdir(parents=True)
    (tmp_path / "repo" / ".data" / "glue" / "SST-2" / "dev.tsv").write_text("sentence\tlabel\n")  # fetched before
    offline = _make(tmp_path, "-n", "demo", "DATA_MIRROR=http://127.0.0.1:9")
    assert "download squad" in offline.stdout and "download glue" not in offline.stdout, offline.stdout
    (tmp_path / "shared" / "data" / "squad").mkdir(parents=True)
    (tmp_path / "shared" / "data" / "glue").mkdir(parents=True)
    dry = _make(tmp_path, "-n", "demo")
    assert "bert_jax.data.download" not in dry.stdout and "shared/data/squad" in dry.stdout, dry.stdout


@pytest.mark.integration
def test_make_test_without_network_says_what_to_set(tmp_path):
    result = _make(tmp_path, "test", "DATA_MIRROR=http://127.0.0.1:9")
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and lines[0].startswith("make test: no test data: download: cannot download "
                                                          "http://127.0.0.1:9/squad/train-v1.1.json"), result.stderr
    assert "set BERT_JAX_DATA to a folder with the shared data, or rerun with a network" in lines[0]
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("make: ***")), result.stderr  # make's own
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["Makefile", "constraints.txt", "pyproject.toml", "setup.cfg"]


def _tfds_checksums() -> dict[str, str]:
    """URL -> sha256 from the url checksum files TFDS ships (squad, glue): an independent record of the
    official files' hashes. GLUE's AX.tsv is recorded at the short URL TFDS fetches it through (GLUE's older
    address): it is added under its GLUE_URL address, by TFDS's name for it and its size (222,257 bytes)."""
    import tensorflow_datasets

    home = pathlib.Path(tensorflow_datasets.__file__).parent
    table = {}
    for path in (home / "datasets" / "squad" / "checksums.tsv", home / "url_checksums" / "glue.txt"):
        for line in path.read_text().splitlines():
            fields = line.split("\t") if "\t" in line else line.split()
            if len(fields) >= 3 and fields[0].startswith("http"):
                table[fields[0]] = fields[2]
                if fields[1:2] == ["222257"] and fields[3:4] == ["tsvsWithoutLabels_AX.tsv"]:
                    table[download.GLUE_URL + "AX.tsv"] = fields[2]
    return table


def test_official_hashes_agree_with_tfds():
    """The sha256 table's entries for files TFDS also downloads equal TFDS's own checksums of the same URLs,
    among them those the test mirror cannot rebuild from the shared copies (`mirror`'s `replaced`: every GLUE
    zip, AX.tsv): those are checked here against a record made from the official homes, not against the mirror."""
    tfds = _tfds_checksums()
    checked = {}
    for dataset in ("squad", "glue"):
        for source in download.sources(dataset, "all") if dataset == "squad" else download.sources(dataset):
            if source.url in tfds and source.name in download.SHA256:
                checked[source.name] = (download.SHA256[source.name], tfds[source.url])
    glue_zips = {f"glue/{name}" for name in download.GLUE_FILES.values() if name.endswith(".zip")}
    assert len(glue_zips) == 8 and {
        "squad/train-v1.1.json", "squad/train-v2.0.json", "squad/dev-v2.0.json", "squad/dev-v1.1.json",
        "glue/MRPC/msr_paraphrase_train.txt", "glue/MRPC/msr_paraphrase_test.txt", "glue/diagnostic/diagnostic.tsv",
        *glue_zips} <= set(checked)
    differ = {name: pair for name, pair in checked.items() if pair[0] != pair[1]}
    assert not differ, differ


def test_glue_urls_and_zip_folders_agree_with_tfds():
    """Each task's official URL, and the folder its zip holds (the readers' `GlueTask.folder`), are TFDS glue's
    (`data_url`, `data_dir`); MRPC comes from the same MSR files; TFDS fetches AX.tsv through a short URL."""
    import tensorflow_datasets.text.glue as tfds_glue

    configs = {c.name: c for c in tfds_glue.Glue.BUILDER_CONFIGS}
    for task in download.GLUE_TASKS:
        urls = [s.url for s in download.sources("glue", tasks=task)]
        if task == "mrpc":
            assert urls[:2] == [tfds_glue._MRPC_TRAIN, tfds_glue._MRPC_TEST]
        elif task != "ax":
            assert urls == [configs[task].data_url] and glue.TASKS[task].folder == configs[task].data_dir, task
