"""Multi-host start-up flags (bert_jax.training.distributed) and the fine-tuning CLI that takes them."""

import socket
import subprocess
import sys

import jax
import pytest
from absl import flags

from bert_jax.training import distributed
from conftest import ROOT


def _parsed(*args):
    values = flags.FlagValues()
    distributed.define_flags(values)
    values(["prog", *args])
    return values


@pytest.fixture
def calls(monkeypatch):
    recorded = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: recorded.append(kwargs))
    return recorded


def test_initialize_passes_the_flags_through(calls):
    assert distributed.initialize_from_flags(_parsed("--jax_distributed")) is True
    assert distributed.initialize_from_flags(_parsed("--coordinator_address=10.0.0.1:1234", "--num_processes=4",
                                                     "--process_id=3")) is True
    # JAX's own heartbeat timeout stays longer than the watchdog's (--process_timeout, 60 s: 3 x 60 = 180 s)
    assert calls == [dict(coordinator_address=None, num_processes=None, process_id=None, heartbeat_timeout_seconds=180),
                     dict(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3,
                          heartbeat_timeout_seconds=180)]
    distributed.initialize_from_flags(_parsed("--jax_distributed", "--process_timeout=10"))
    assert calls[-1]["heartbeat_timeout_seconds"] == 100  # never under JAX's default
    with pytest.raises(ValueError, match=r"^--process_timeout=0.0 must be positive \(seconds\)$"):
        distributed.initialize_from_flags(_parsed("--jax_distributed", "--process_timeout=0"))


def test_single_process_without_flags(calls):
    assert distributed.initialize_from_flags(_parsed()) is False
    assert calls == []


def test_process_flags_without_a_coordinator_are_one_line(calls):
    with pytest.raises(ValueError) as e:
        distributed.initialize_from_flags(_parsed("--num_processes=2", "--process_id=1"))
    assert str(e.value) == "--num_processes=2 --process_id=1 needs --coordinator_address (or --jax_distributed)"
    assert calls == []


@pytest.mark.integration
def test_finetune_cli_takes_the_launcher_flags(tmp_path):
    """launch/tpu_vm_pod.sh passes --jax_distributed to every entry point: the fine-tuning CLI accepts the
    multi-host flags and initialises jax.distributed (here one real process) before the job runs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "bert_jax.tasks.glue", "--config", "glue:mrpc", "--workdir",
           str(tmp_path), "--config.task=ax", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=1",
           "--process_id=0"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    # Past flag parsing and jax.distributed.initialize, stopped by the job's own check of the config.
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "glue: config.task='ax' is not one of ['cola', 'mnli', 'mrpc', 'qnli', 'qqp', 'rte', 'sst2', 'stsb', 'wnli']")
    bad = subprocess.run(cmd[:-3] + ["--num_processes=2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == (
        "glue: --num_processes=2 needs --coordinator_address (or --jax_distributed)")
