"""Ahead-of-time compilation for a TPU topology (needs libtpu, the [tpu] extra): its errors and topologies here; the
reports of compiled recipes on docs/tpu-pods.md's and docs/kernels.md's commands (tests/test_docs.py,
`assert_aot_report`)."""

import subprocess
import sys

import pytest

from bert_jax.training import sharding
from conftest import ROOT

pytest.importorskip("libtpu", reason="libtpu is not installed (pip install -e '.[tpu]')")


@pytest.mark.integration
def test_unknown_topology_is_one_line():
    result = subprocess.run([sys.executable, "-m", "bert_jax.aot", "--config", "pretrain:tiny",
                             "--topology", "v9-1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "--topology 'v9-1' is not one of" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.integration
def test_unknown_mesh_preset_and_positional_arguments_are_one_line():
    base = [sys.executable, "-m", "bert_jax.aot", "--config", "pretrain:tiny", "--topology", "v3-8"]
    result = subprocess.run(base + ["--config.mesh.preset=v9-1"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"aot: mesh preset 'v9-1' is not one of {sorted(sharding.MESH_PRESETS)}")
    result = subprocess.run(base + ["stray"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "aot: unexpected arguments ['stray']"


@pytest.mark.integration
def test_pod_presets_cover_their_topologies():
    """Each pod's mesh preset uses exactly the devices libtpu's topology exposes (v3 two per chip; v4
    one megacore device per chip, as on a real slice; v5e one), and the paper's pods are 16 and 64 chips
    for every generation."""
    script = ("from bert_jax.training import sharding\nfrom bert_jax.training.compiled import targets\n"
              "import math\n"
              "for name in targets.TOPOLOGIES:\n"
              "    devices = targets.target(name).devices()\n"
              "    chips = len({tuple(d.coords) for d in devices})\n"
              "    preset = math.prod(sharding.MESH_PRESETS[name]) if name in sharding.MESH_PRESETS else None\n"
              "    print('ROW', name, len(devices), chips, preset)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r[1]: tuple(None if x == "None" else int(x) for x in r[2:])
            for r in (line.split() for line in result.stdout.splitlines() if line.startswith("ROW"))}
    for name, (devices, chips, preset) in rows.items():
        assert preset in (None, devices), (name, devices, preset)
        assert devices == (2 * chips if name.startswith("v3") else chips), (name, devices, chips)
    assert {name: rows[name][1] for name in ("v3-32", "v4-32", "v5e-16")} == {"v3-32": 16, "v4-32": 16, "v5e-16": 16}
    assert {name: rows[name][1] for name in ("v3-128", "v4-128", "v5e-64")} == {"v3-128": 64, "v4-128": 64,
                                                                                 "v5e-64": 64}


def test_missing_libtpu_is_an_import_error(monkeypatch):
    """Without libtpu, report() says so (main turns it into one line) instead of jax's later RuntimeError."""
    import importlib.util

    from bert_jax.training import aot
    from bert_jax.configs import pretrain

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a))
    with pytest.raises(ImportError, match=r"^libtpu is not installed, so there is no TPU compiler \(pip install -e '\.\[tpu\]'\)$"):
        aot.report(pretrain.get_config("tiny"), "v3-8")
