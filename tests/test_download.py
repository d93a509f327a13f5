"""The data download (`python -m bert_jax.data.download`) against a local HTTP mirror built from the shared
data folder in the official layouts, and `make test`'s fetch of the test data on a machine without it."""

import contextlib
import functools
import hashlib
import http.server
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

from bert_jax.data import download

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
    the archives, the MSR files, of which the shared copies are GLUE's inputs, not the published bytes)."""
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
    books = {f"gutenberg/{p.name}": p.read_bytes() for p in sorted((data_dir / "corpus" / "gutenberg").iterdir())}
    books["gutenberg/bryant-stories.txt"] = b"A book the tests do not read.\n"  # NLTK's zip has 18 books
    _zip(root / "corpus" / "gutenberg.zip", books)
    shutil.copytree(data_dir / "corpus" / "wikitext-2", root / "corpus" / "wikitext-2")
    shutil.copyfile(data_dir / "corpus" / "bert_sample_text.txt", root / "corpus" / "bert_sample_text.txt")
    (root / "vocab").mkdir()
    shutil.copyfile(data_dir / "vocab" / "bert-base-uncased-vocab.txt", root / "vocab" / "bert-base-uncased-vocab.txt")
    replaced = ("squad/train-v1.1.json", "squad/train-v2.0.json", "squad/dev-v2.0.json", "glue/SST-2.zip",
                "glue/MRPC/msr_paraphrase_train.txt", "glue/MRPC/msr_paraphrase_test.txt")
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
    for dataset in ("squad", "glue"):
        assert f"bert_jax.data.download {dataset}" in dry.stdout and f"--output_dir .data/{dataset}/" in dry.stdout
    assert 'SQUAD_DIR=".data/squad" GLUE_DIR=".data/glue"' in dry.stdout and "-m bert_jax.demo" in dry.stdout
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
    official files' hashes."""
    import tensorflow_datasets

    home = pathlib.Path(tensorflow_datasets.__file__).parent
    table = {}
    for path in (home / "datasets" / "squad" / "checksums.tsv", home / "url_checksums" / "glue.txt"):
        for line in path.read_text().splitlines():
            fields = line.split("\t") if "\t" in line else line.split()
            if len(fields) >= 3 and fields[0].startswith("http"):
                table[fields[0]] = fields[2]
    return table


def test_official_hashes_agree_with_tfds():
    """The sha256 table's entries for files TFDS also downloads equal TFDS's own checksums of the same URLs,
    among them the six the test mirror cannot rebuild from the shared copies (`mirror`'s `replaced`): those
    are checked here against a record made from the official homes, not against the mirror."""
    tfds = _tfds_checksums()
    checked = {}
    for dataset in ("squad", "glue"):
        for source in download.sources(dataset, "all") if dataset == "squad" else download.sources(dataset):
            if source.url in tfds and source.name in download.SHA256:
                checked[source.name] = (download.SHA256[source.name], tfds[source.url])
    assert {"squad/train-v1.1.json", "squad/train-v2.0.json", "squad/dev-v2.0.json", "squad/dev-v1.1.json",
            "glue/SST-2.zip", "glue/MRPC/msr_paraphrase_train.txt", "glue/MRPC/msr_paraphrase_test.txt"} <= set(checked)
    differ = {name: pair for name, pair in checked.items() if pair[0] != pair[1]}
    assert not differ, differ
