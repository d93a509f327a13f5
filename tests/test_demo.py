"""The main job, run as a user runs it (a subprocess from the project root)."""

import re
import subprocess
import sys

from conftest import ROOT


def _demo(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "bert_jax.demo", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_demo_trains_on_real_text():
    result = _demo("--steps", "40")
    assert result.returncode == 0, result.stderr[-2000:]
    match = re.search(r"summary: MLM loss ([\d.]+) -> ([\d.]+)", result.stdout)
    assert match, result.stdout
    before, after = map(float, match.groups())
    assert after < 0.8 * before  # the loss really falls on the real corpus


def test_demo_rejects_a_missing_corpus(tmp_path):
    result = _demo("--corpus", str(tmp_path / "nope.txt"))
    assert result.returncode != 0
    assert "nope.txt: cannot read" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "empty.txt").write_text("")
    result = _demo("--corpus", str(tmp_path / "empty.txt"))
    assert result.returncode != 0 and "fewer than 10 lines" in result.stderr
    assert "Traceback" not in result.stderr
