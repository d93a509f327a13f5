"""Ahead-of-time compilation of the real train step for a TPU topology (needs libtpu, the [tpu] extra)."""

import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("libtpu", reason="libtpu is not installed (pip install -e '.[tpu]')")


def test_tiny_config_compiles_for_a_v3_8_and_reports(tmp_path):
    cmd = [sys.executable, "-m", "bert_jax.aot", "--config", "configs/pretrain.py:tiny", "--topology", "v3-8",
           "--config.model.dtype=bfloat16", "--config.total_steps=1000"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "v3-8: 8 devices, mesh {'data': 8, 'fsdp': 1, 'tensor': 1}" in out
    lines = [line for line in out.splitlines() if line.strip().startswith("phase")]
    assert len(lines) == 2 and all("(fits)" in line for line in lines)
    # Compiled FLOPs agree with the analytic count.
    for line in lines:
        ratio = float(line.split("(ratio ")[1].split(")")[0])
        assert 0.9 <= ratio <= 1.25, line
    assert "roofline for the whole schedule (1000 steps)" in out


def test_unknown_topology_is_one_line():
    result = subprocess.run([sys.executable, "-m", "bert_jax.aot", "--config", "configs/pretrain.py:tiny",
                             "--topology", "v9-1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "--topology 'v9-1' is not one of" in result.stderr
    assert "Traceback" not in result.stderr
