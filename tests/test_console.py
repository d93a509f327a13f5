"""The command line's stderr (`bert_jax.console`): libtpu's probe of a host without a TPU prints nothing,
stderr held during a restore attempt is replayed or dropped, and only the entry points change the process."""

import logging
import os
import re
import subprocess
import sys

import pytest

from bert_jax import console
from conftest import ROOT

LIBTPU_NOISE = ("E0000", "TPU_WORKER_HOSTNAMES", "Source Location Trace", "Failed to find host bounds",
                "Logging before InitGoogle", "Unable to initialize backend", "Jax plugin configuration error")


def _without_tpu_settings():
    """The tests' environment as a user's shell has it: no JAX_PLATFORMS, no TPU topology variables."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS" and k not in console.TOPOLOGY_VARIABLES}
    if console.libtpu_settings(env) == {}:
        pytest.skip("a TPU device file exists here: libtpu's probe is real, and install leaves it alone")
    return dict(env, PYTHONPATH=str(ROOT))


@pytest.mark.integration
def test_a_command_prints_no_libtpu_probe_on_a_host_without_a_tpu(tmp_path):
    """Nor, with the gpu-aot extra, the CUDA plugin's failed start on a host without an NVIDIA GPU."""
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install -e '.[tpu]')")
    env = _without_tpu_settings()
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert "TPU_WORKER_HOSTNAMES" in probe.stderr, ("libtpu printed nothing without bert_jax.console: this test "
                                                    f"shows nothing here {probe.stderr[-2000:]}")
    import importlib.util

    if importlib.util.find_spec("jax_plugins.xla_cuda13"):  # the gpu-aot extra: its failed start, then the CPU
        assert "Jax plugin configuration error" in probe.stderr, probe.stderr[-2000:]
    # The pre-training command's first error (its default data folder is missing): JAX's backends, TPU
    # first, are initialised before it; JAX's debug log of xla_bridge shows that the probe ran.
    result = subprocess.run([sys.executable, "-m", "bert_jax.train", "--config", "pretrain:tiny", "--workdir", "run"],
                            env=dict(env, JAX_DEBUG_LOG_MODULES="jax._src.xla_bridge"), cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert "Initializing backend 'tpu'" in result.stderr, result.stderr[-3000:]
    assert not [marker for marker in LIBTPU_NOISE if marker in result.stderr], result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if not re.match(r"I\d{4} .* xla_bridge\.py:\d+\]", line)]
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("train: config.phases[0].data_dir"), \
        result.stderr[-3000:]


def test_libtpu_is_left_alone_where_a_tpu_or_a_topology_is_named(tmp_path):
    devices = (str(tmp_path / "accel*"),)
    assert console.libtpu_settings({}, devices) == console.SINGLE_HOST
    assert console.libtpu_settings({"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3"}, devices) == {}
    assert console.libtpu_settings({"JAX_FORCE_TPU_INIT": "1"}, devices) == {}
    (tmp_path / "accel0").touch()
    assert console.libtpu_settings({}, devices) == {}


def test_the_library_changes_nothing_process_wide(tmp_path):
    """A program using bert_jax (a Checkpointer, a restore try that fails) keeps its unraisable hook, its
    logging filters, its environment and its file descriptor 2."""
    from bert_jax.checkpoints import checkpointing

    hook, environ, fd2 = sys.unraisablehook, dict(os.environ), os.fstat(2)
    filters = {name: list(logging.getLogger(name).filters) for name in ("absl", "asyncio")}
    checkpointing.Checkpointer(str(tmp_path / "checkpoints"), async_save=False).close()
    step_dir = tmp_path / "checkpoints" / "2"  # Orbax's completeness markers, so that the restore is tried
    for name in ("_CHECKPOINT_METADATA", "state/_METADATA", "data/metadata"):
        (step_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (step_dir / name).write_text("{}")
    during = []

    def failing_restore(_):
        during.append(os.fstat(2))
        raise ValueError("unreadable")

    assert checkpointing._try(str(tmp_path / "checkpoints"), 2, failing_restore) == (None, "ValueError: unreadable")
    assert [(s.st_dev, s.st_ino) for s in during] == [(fd2.st_dev, fd2.st_ino)]  # stderr was not redirected
    assert sys.unraisablehook is hook and dict(os.environ) == environ
    assert {name: list(logging.getLogger(name).filters) for name in filters} == filters


def test_orbax_read_only_warning_is_dropped_and_no_other(console_installed):
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("absl")
    logger.addHandler(handler)
    try:
        for message in ("Given directory is read only=/run/checkpoints", "Some other warning"):
            logger.handle(logging.LogRecord("absl", logging.WARNING, "/site-packages/orbax/checkpoint/"
                                            "checkpoint_manager.py", 849, message, None, None))
    finally:
        logger.removeHandler(handler)
    assert seen == ["Some other warning"]


def _attempt(fail):
    with console.held_stderr("/nowhere/checkpoints/7"):
        os.write(2, b"from the attempt\n")
        if fail:
            raise ValueError("unreadable")


def test_held_stderr_replays_a_success_and_drops_a_failure(capfd, console_installed):
    _attempt(fail=False)
    assert capfd.readouterr().err == "from the attempt\n"
    with pytest.raises(ValueError):
        _attempt(fail=True)
    assert capfd.readouterr().err == ""


def test_held_stderr_holds_nothing_without_install(capfd):
    with pytest.raises(ValueError):
        _attempt(fail=True)
    assert capfd.readouterr().err == "from the attempt\n"
