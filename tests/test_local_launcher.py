"""launch/local_cpu.sh runs the Python the user installed bert_jax into (issue #50): `python3` on PATH (an
activated environment's) when it has bert_jax and jax, the repository's .venv only as a fallback, and a
one-line error when there is neither. Each test runs a copy of the launcher in a directory laid out like
the repository but without a .venv, in the user's environment: no PYTHON, VIRTUAL_ENV, XLA_FLAGS or JAX_*
inherited from the test session (tests/conftest.py sets its own), so that the launcher's own defaults are
what the child sees."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration  # runs the launcher in subprocesses

SHOW = "import os, jax; print(jax.device_count(), jax.default_backend(), os.environ['XLA_FLAGS'])\n"


def _layout(tmp_path, python: str):
    """A copy of launch/local_cpu.sh at <tmp>/repo/launch (no .venv beside it), `python3` on <tmp>/bin
    running `python`, and a module `show_devices` that prints what JAX sees -> (launcher, environment)."""
    launcher = tmp_path / "repo" / "launch" / "local_cpu.sh"
    launcher.parent.mkdir(parents=True)
    shutil.copy2(ROOT / "launch" / "local_cpu.sh", launcher)
    assert not (tmp_path / "repo" / ".venv").exists()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "show_devices.py").write_text(SHOW)
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "PYTHON", "VIRTUAL_ENV", "PYTHONPATH", "CONDA_PREFIX")
           and not k.startswith("JAX_")}
    # Only the shell's tools besides our python3: no other python3 or python (pyenv shims, a virtual
    # environment) that the launcher could pick.
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", PYTHONPATH=str(modules), BERT_JAX_MODULE="show_devices",
               BERT_JAX_MALLOC_TUNING="off")
    return launcher, env


def test_runs_the_python_on_path_that_has_bert_jax_with_8_simulated_devices(tmp_path):
    launcher, env = _layout(tmp_path, sys.executable)  # the environment bert_jax is installed in (editable)
    result = subprocess.run([str(launcher)], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["8", "cpu", "--xla_force_host_platform_device_count=8"], result.stdout


def test_no_python_with_bert_jax_and_no_venv_is_a_one_line_error(tmp_path):
    bare = shutil.which("python3", path="/usr/bin:/bin")
    if bare is None or subprocess.run([bare, "-c", "import jax"], capture_output=True).returncode == 0:
        pytest.fail("needs a python3 in /usr/bin or /bin without jax, to stand for a Python bert_jax is not in")
    launcher, env = _layout(tmp_path, bare)
    result = subprocess.run([str(launcher)], capture_output=True, text=True, timeout=60, env=env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("local_cpu.sh: no python3 or python on PATH has bert_jax") and "PYTHON=" in lines[0]
