"""The stderr of a bert_jax command: its own one-line reports, not the libraries' echoes of them.

`install()` is called by the `python -m bert_jax...` entry points before they start, and by nothing else: a
program or test that imports bert_jax keeps its process as it is. For the whole process it quiets

  - libtpu's probe of a host without a TPU. With libtpu installed (the [tpu] and test extras), JAX tries
    the TPU backend first, and libtpu, finding no TPU, prints `E0000 ... INVALID_ARGUMENT ...
    TPU_WORKER_HOSTNAMES` lines and a source-location trace that read as a failure. Where no TPU device
    file exists (`TPU_DEVICES`) and the environment names no TPU topology, `install` sets libtpu's
    single-host topology (`SINGLE_HOST`: one host, this one); the probe then fails silently (JAX's own
    INFO record of it, "Unable to initialize backend 'tpu'", is dropped too), and the compile-only
    topologies of `bert_jax.aot` are the same. On a TPU VM nothing is set: libtpu's errors show.
  - jax's CUDA plugin failing to start on a host without an NVIDIA GPU (no `NVIDIA_DEVICES` file): with the
    `gpu-aot` extra installed (compiling for GPUs ahead of time), JAX tries the plugin at every start and logs
    "Jax plugin configuration error" with a traceback, then runs on the CPU; that record is dropped. On a host
    with a GPU it shows.
  - the late reports of a failure the command has already reported in one line (`checkpointing`: an
    unreadable checkpoint, a save out of disk space). Orbax's other work of the failed operation reports
    it again from other threads, often at exit; dropped are Orbax's ERROR logs of a save out of space
    (absl), asyncio's "Task exception was never retrieved" for an out-of-space write or a read of a failed
    restore and its "error while reading array", unraisable exceptions of Orbax's abandoned reads and of
    TensorStore callbacks into a closed event loop, and "coroutine ... was never awaited" warnings of those
    reads.
  - Orbax's warning, for each checkpoint directory opened read-only (fine-tuning, conversion, feature
    extraction), that the directory is read-only.
Every other report passes.

`held_stderr(path)` wraps one attempt whose failure the caller reports itself (a checkpoint restore).
"""

from __future__ import annotations

import contextlib
import gc
import glob
import logging
import os
import sys
import tempfile
import time
import warnings
from typing import Iterator, Mapping

from bert_jax import storage

TPU_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*")  # a TPU's device files: v2-v4 (accel), v5 and later (vfio groups)
NVIDIA_DEVICES = ("/dev/nvidia[0-9]*",)  # an NVIDIA GPU's device files
SINGLE_HOST = {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_HOST_BOUNDS": "1,1,1"}
# Variables that describe a TPU topology (or force JAX's TPU set-up): where one is set, libtpu's are left alone.
TOPOLOGY_VARIABLES = ("TPU_WORKER_HOSTNAMES", "TPU_HOST_BOUNDS", "TPU_PROCESS_BOUNDS", "TPU_PROCESS_ADDRESSES",
                      "TPU_ACCELERATOR_TYPE", "TPU_CHIPS_PER_PROCESS_BOUNDS", "JAX_FORCE_TPU_INIT")


def libtpu_settings(environ: Mapping[str, str], devices: tuple[str, ...] = TPU_DEVICES) -> dict[str, str]:
    """The libtpu variables `install` sets: `SINGLE_HOST` where no file matches the glob patterns `devices`
    and `environ` names none of `TOPOLOGY_VARIABLES`, else {}."""
    if any(name in environ for name in TOPOLOGY_VARIABLES) or any(glob.glob(pattern) for pattern in devices):
        return {}
    return dict(SINGLE_HOST)


class _Console:
    """What `install` changed (to undo it) and the paths of the failed attempts whose late reports are dropped."""

    def __init__(self):
        self.installed = False
        self.failed_paths: set[str] = set()
        self._environ: dict[str, str] = {}
        self._no_gpu = False
        self._hook = None
        self._warnings: list = []

    def install(self) -> None:
        if self.installed:
            return
        self._environ = libtpu_settings(os.environ)
        os.environ.update(self._environ)
        self._no_gpu = not any(glob.glob(pattern) for pattern in NVIDIA_DEVICES)
        if self._environ or self._no_gpu:
            logging.getLogger("jax._src.xla_bridge").addFilter(self.keep_jax)
        self._hook, sys.unraisablehook = sys.unraisablehook, self.unraisable
        logging.getLogger("absl").addFilter(self.keep_absl)
        logging.getLogger("asyncio").addFilter(self.keep_asyncio)
        self._warnings = warnings.filters[:]
        warnings.filterwarnings("ignore", r"coroutine '\w*_read_array\w*' was never awaited", RuntimeWarning)
        self.installed = True

    def uninstall(self) -> None:
        if not self.installed:
            return
        for name, value in self._environ.items():
            if os.environ.get(name) == value:
                del os.environ[name]
        if sys.unraisablehook == self.unraisable:
            sys.unraisablehook = self._hook
        logging.getLogger("jax._src.xla_bridge").removeFilter(self.keep_jax)
        logging.getLogger("absl").removeFilter(self.keep_absl)
        logging.getLogger("asyncio").removeFilter(self.keep_asyncio)
        warnings.filters[:] = self._warnings
        self.failed_paths.clear()
        self.installed = False

    def unraisable(self, unraisable) -> None:
        """Drops Orbax's abandoned array reads (coroutines finalised late) and TensorStore's callbacks from
        C++ into an event loop already closed ("Event loop is closed" in `call_soon_threadsafe`)."""
        tb = unraisable.exc_traceback
        if "_read_array" in getattr(unraisable.object, "__qualname__", ""):
            return
        if unraisable.exc_type is RuntimeError and str(unraisable.exc_value) == "Event loop is closed" and \
                tb is not None and tb.tb_frame.f_code.co_name == "call_soon_threadsafe":
            return
        self._hook(unraisable)

    def keep_jax(self, record: logging.LogRecord) -> bool:
        """False for JAX's record of the TPU backend failing to start (on a host without a TPU) and of its CUDA
        plugin failing to start (on a host without an NVIDIA GPU)."""
        message = record.getMessage()
        if self._environ and message.startswith("Unable to initialize backend 'tpu'"):
            return False
        return not (self._no_gpu and message.startswith("Jax plugin configuration error: Exception when calling "
                                                        "jax_plugins.xla_cuda"))

    @staticmethod
    def keep_absl(record: logging.LogRecord) -> bool:
        """False for Orbax's ERROR records of a save out of disk space (once per background thread) and
        its warning that a checkpoint directory opened read-only is read-only."""
        if "orbax" not in record.pathname:
            return True
        error = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        return not (record.levelno >= logging.ERROR
                    and (storage.is_out_of_space(error) or "No space left on device" in message)
                    or message.startswith("Given directory is read only="))

    def keep_asyncio(self, record: logging.LogRecord) -> bool:
        """False for asyncio's reports of Orbax's reads of a failed attempt (naming a path in
        `failed_paths`, or Orbax's "error while reading array") and of writes out of disk space."""
        error = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        text = message + str(error or "")
        return not ("error while reading array" in text
                    or "never retrieved" in text and any(path in text for path in self.failed_paths)
                    or "never retrieved" in message
                    and (storage.is_out_of_space(error) or "No space left on device" in message))


_console = _Console()


def install() -> None:
    """Quiets libtpu's probe and the late reports of failures already reported (module docstring), for
    the rest of the process; a second call does nothing."""
    _console.install()


def uninstall() -> None:
    """Undoes `install` (for tests that install in their own process)."""
    _console.uninstall()


@contextlib.contextmanager
def held_stderr(path: str) -> Iterator[None]:
    """Around one attempt whose failure the caller reports in one line, e.g. a restore of the checkpoint at
    `path`. After `install`: what is written to stderr meanwhile (file descriptor 2: Python and C++
    threads alike) is held back, then written out if the attempt succeeds and dropped if it raises
    (after waiting up to 5 s for the attempt's other work to report); later reports naming `path` are
    dropped too. Without `install`, nothing is held."""
    if not _console.installed:
        yield
        return
    sys.stderr.flush()
    saved_fd, saved_hook = os.dup(2), sys.unraisablehook
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        sys.unraisablehook = lambda _: None
        ok = False
        try:
            yield
            ok = True
        finally:
            if not ok:  # let the attempt's other reads finish and report (up to 5 s, until quiet)
                _console.failed_paths.add(path.rstrip("/") + "/")
                size, quiet, deadline = -1, 0, time.monotonic() + 5.0
                while quiet < 3 and time.monotonic() < deadline:
                    time.sleep(0.25)
                    gc.collect()
                    grown = os.fstat(held.fileno()).st_size
                    quiet, size = (quiet + 1, size) if grown == size else (0, grown)
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            sys.unraisablehook = saved_hook
            if ok:
                held.seek(0)
                os.write(2, held.read())
