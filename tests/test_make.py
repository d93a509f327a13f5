"""The Makefile's first commands as a newcomer meets them: which Python makes the virtual environment, and `make demo`
offline (nothing fetched: the demo still runs, told only of the folders that exist)."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
pytestmark = pytest.mark.integration


def _checkout(tmp_path) -> pathlib.Path:
    """A checkout-like folder (Makefile and package metadata; no ../shared/data beside it)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("Makefile", "setup.cfg", "pyproject.toml", "constraints.txt"):
        shutil.copyfile(ROOT / name, repo / name)
    return repo


def _interpreter(folder: pathlib.Path, name: str, version: tuple[int, int]) -> None:
    """An executable `name` in folder that reports `version` to the Makefile's version check and otherwise runs
    this interpreter."""
    folder.mkdir(exist_ok=True)
    script = folder / name
    script.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec "{sys.executable}" -c "import sys; '
                      f'sys.exit({version} < (3, 11))"; fi\nexec "{sys.executable}" "$@"\n')
    script.chmod(0o755)


def _make(repo, *args, path: str, **env):
    """`make -s` as a user runs it (not as a sub-make of the `make test` that may run this suite), with PATH `path`."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("BERT_JAX_DATA", "MAKELEVEL", "MAKEFLAGS", "MFLAGS",
                                                                   "SQUAD_DIR", "GLUE_DIR", "PYTHON")}
    full_env.update(PATH=path, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([MAKE, "-s", *args], cwd=repo, env=full_env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_the_newest_python_of_at_least_3_11_makes_the_venv(tmp_path):
    """No python3.11 on the PATH: make picks the newest 3.11+ it finds (python3.12 here, before an older python3),
    PYTHON= names another; with none at 3.11 or newer, one line says so and what to set."""
    repo, bin_dir = _checkout(tmp_path), tmp_path / "bin"
    _interpreter(bin_dir, "python3.12", (3, 12))
    _interpreter(bin_dir, "python3", (3, 10))
    dry = _make(repo, "-n", "demo", path=str(bin_dir))
    assert dry.returncode == 0 and "python3.12 -m venv .venv" in dry.stdout, dry
    named = _make(repo, "-n", "demo", "PYTHON=/opt/python3.13/bin/python3", path=str(bin_dir))
    assert "/opt/python3.13/bin/python3 -m venv .venv" in named.stdout, named
    (bin_dir / "python3.12").unlink()
    result = _make(repo, "demo", path=str(bin_dir))
    lines = [line for line in result.stderr.splitlines() if not line.startswith("make: ***")]
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert lines[0].startswith("make: no Python 3.11 or newer on the PATH") and "PYTHON=" in lines[0], lines
    assert sorted(p.name for p in repo.iterdir()) == ["Makefile", "constraints.txt", "pyproject.toml", "setup.cfg"]


def test_make_demo_offline_runs_the_demo_without_the_missing_folders(tmp_path):
    """A fresh clone without a network: each fetch fails in one line naming what it could not download, make goes
    on, and the demo is started with SQUAD_DIR and GLUE_DIR empty (it skips those stages and names the command that
    fetches their files: tests/test_demo.py) rather than with folders that do not exist."""
    repo = _checkout(tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(  # the demo itself only reports what it was given
        '#!/bin/sh\nif [ "$1 $2" = "-m bert_jax.demo" ]; then echo "demo SQUAD_DIR=[$SQUAD_DIR] GLUE_DIR=[$GLUE_DIR]";'
        f' exit 0; fi\nexec "{sys.executable}" "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".installed-demo").touch()
    result = _make(repo, f"VENV={venv}", "demo", "DATA_MIRROR=http://127.0.0.1:9", path=os.environ["PATH"])
    assert result.returncode == 0, result
    assert result.stdout == "demo SQUAD_DIR=[] GLUE_DIR=[]\n", result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    for line, what, url in zip(lines, ("SQuAD", "SST-2"), ("squad/train-v1.1.json", "glue/SST-2.zip")):
        assert line.startswith(f"make demo: {what} not fetched (download: cannot download http://127.0.0.1:9/{url}"), line
        assert line.endswith("the demo skips its stage"), line
    assert not any((repo / ".data").rglob("*.json")) and not (repo / ".data" / "fetch.err").exists()


def test_the_data_folder_rule(tmp_path, monkeypatch):
    """Tests and benchmarks find the real data by one rule (benchmarks/shared_data.data_dir): $BERT_JAX_DATA; else
    ../shared/data beside the checkout; else the checkout's .data, where `make test` downloads it on a fresh clone."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import shared_data

    root = tmp_path / "repo"
    (root / ".data").mkdir(parents=True)
    monkeypatch.delenv("BERT_JAX_DATA", raising=False)
    assert shared_data.data_dir(root) == (root / ".data").resolve()
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert shared_data.data_dir(root) == (tmp_path / "shared" / "data").resolve()
    monkeypatch.setenv("BERT_JAX_DATA", str(tmp_path / "elsewhere"))
    assert shared_data.data_dir(root) == (tmp_path / "elsewhere").resolve()
