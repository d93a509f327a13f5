"""One writer per run directory: a lease on the workdir that a run holds while it writes there.

`hold(workdir, job, timeout_s, heartbeat_s)` (a context manager) takes `<workdir>/lease.json` before the run
writes anything and gives it back when the run ends. The lease records who holds it (job, host, process id,
start time, a random run id) and a heartbeat, the time of its last refresh, which a background thread renews
every `heartbeat_s` seconds. Another run on the same workdir then stops before writing anything, with one
line naming the holder (`WorkdirInUse`). A lease is stale, and the next run takes it over with one line, when
its heartbeat is older than `timeout_s` (a run that crashed or was killed on another host), or at once when its
holder was on this host and its process is gone (kill -9, a crash, a lost terminal).

Every change to the lease is a compare-and-swap, so two runs that find the same stale lease cannot both take it:
  local paths     an exclusive `fcntl.flock` on lease.json for each read-modify-write (released by the kernel
                  when a process dies), the content replaced in place;
  gs:// URIs      Cloud Storage's own preconditions (google-cloud-storage's `if_generation_match`: create
                  only where no lease exists, replace or delete only the generation that was read);
  other URIs      no atomic primitive through fsspec: the lease is advisory there (read, then written).
A holder whose lease was taken over (its heartbeat stalled past the timeout) finds out at its next heartbeat and
stops at its next `check()` (before each checkpoint) with one line, writing nothing more.

Multi-host runs hold one lease: process 0 takes it and every process learns the outcome (a broadcast), so all
stop together when it is held elsewhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any, Iterator

from bert_jax import storage

LEASE_FILE = "lease.json"
# Defaults (pre-training's config.lease_timeout_s and config.lease_heartbeat_s; the fine-tuning jobs' too, where their
# config has no such field), seconds.
TIMEOUT_S = 300.0
HEARTBEAT_S = 30.0


class WorkdirInUse(OSError):
    """The workdir's lease is held by another live run, or was taken over from this one: one line naming both."""


def describe(record: dict[str, Any], now: float) -> str:
    """'train on host H (process P), started 2026-11-28 14:03:11 UTC, last heartbeat 12 s ago' of a lease record."""
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.get("started", 0)))
    return (f"{record.get('job', '?')} on host {record.get('host', '?')} (process {record.get('pid', '?')}), "
            f"started {started}, last heartbeat {now - float(record.get('heartbeat', 0)):.0f} s ago")


def _process_gone(record: dict[str, Any]) -> bool:
    """The holder ran on this host and its process no longer exists (or is a zombie: killed, never waited for)."""
    if record.get("host") != socket.gethostname() or not isinstance(record.get("pid"), int):
        return False
    try:
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{record['pid']}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


class _LocalStore:
    """lease.json on a local filesystem; each read-modify-write under an exclusive flock of the file."""

    def __init__(self, path: str):
        self.path = path

    @contextlib.contextmanager
    def locked(self) -> Iterator[tuple[dict | None, Any]]:
        while True:  # the file locked must still be the one at the path (a release unlinks it)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        try:
            data = os.read(fd, 1 << 20)
            try:
                record = json.loads(data) if data.strip() else None
            except ValueError:  # a write cut short by a crash: no live holder wrote this
                record = {"job": "?", "heartbeat": 0}
            yield record, fd
        finally:
            os.close(fd)  # releases the lock

    def replace(self, fd, record: dict) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(record).encode())
        os.fsync(fd)

    def release(self, run: str) -> None:
        with self.locked() as (record, fd):
            if record is not None and record.get("run") == run:
                os.unlink(self.path)  # a taker waiting on this file's lock finds it unlinked and opens the path anew

    def read(self) -> dict | None:
        with self.locked() as (record, _):
            return record

    def swap(self, expect_run: str | None, record: dict) -> tuple[bool, dict | None]:
        """Writes `record` if the lease still is what the caller saw: held by `expect_run` (None: no lease).
        Returns (written, the lease found)."""
        with self.locked() as (found, fd):
            if (found.get("run") if found else None) != expect_run:
                return False, found
            self.replace(fd, record)
            return True, found


class _GcsStore:
    """lease.json in a Cloud Storage bucket, each change conditioned on the object's generation."""

    def __init__(self, path: str):
        from google.cloud import storage as gcs  # the gcs extra; honours STORAGE_EMULATOR_HOST

        bucket, _, name = path[len("gs://"):].partition("/")
        self.blob_name = name
        self.bucket = gcs.Client.create_anonymous_client() if os.environ.get("STORAGE_EMULATOR_HOST") else gcs.Client()
        self.bucket = self.bucket.bucket(bucket)

    def _get(self) -> tuple[dict | None, int]:
        blob = self.bucket.get_blob(self.blob_name)
        if blob is None:
            return None, 0
        try:
            return json.loads(blob.download_as_bytes(if_generation_match=blob.generation)), blob.generation
        except ValueError:
            return {"job": "?", "heartbeat": 0}, blob.generation
        except Exception as e:  # changed between the two requests: read again
            if getattr(e, "code", None) in (404, 412):
                return self._get()
            raise

    def read(self) -> dict | None:
        return self._get()[0]

    def swap(self, expect_run: str | None, record: dict) -> tuple[bool, dict | None]:
        from google.api_core import exceptions

        found, generation = self._get()
        if (found.get("run") if found else None) != expect_run:
            return False, found
        try:
            self.bucket.blob(self.blob_name).upload_from_string(
                json.dumps(record), content_type="application/json", if_generation_match=generation)
        except exceptions.PreconditionFailed:
            return False, self._get()[0]
        return True, found

    def release(self, run: str) -> None:
        from google.api_core import exceptions

        found, generation = self._get()
        if found is not None and found.get("run") == run:
            with contextlib.suppress(exceptions.PreconditionFailed, exceptions.NotFound):
                self.bucket.blob(self.blob_name).delete(if_generation_match=generation)


class _AdvisoryStore:
    """lease.json at another URI scheme (s3://, ...): read, then written, without a precondition."""

    def __init__(self, path: str):
        self.path = path

    def read(self) -> dict | None:
        if not storage.exists(self.path):
            return None
        try:
            return storage.read_json(self.path)
        except ValueError:
            return {"job": "?", "heartbeat": 0}

    def swap(self, expect_run: str | None, record: dict) -> tuple[bool, dict | None]:
        found = self.read()
        if (found.get("run") if found else None) != expect_run:
            return False, found
        storage.write_json(self.path, record)
        return True, found

    def release(self, run: str) -> None:
        found = self.read()
        if found is not None and found.get("run") == run:
            from etils import epath

            epath.Path(self.path).unlink(missing_ok=True)


def _store(workdir: str):
    path = storage.join(workdir, LEASE_FILE)
    if not storage.is_remote(workdir):
        return _LocalStore(path)
    if workdir.startswith("gs://"):
        return _GcsStore(path)
    return _AdvisoryStore(path)


class Lease:
    """A held lease (made by `acquire`): `check()` raises once it was taken over; `release()` gives it back."""

    def __init__(self, store, record: dict, heartbeat_s: float, workdir: str, created: bool = False):
        self.store, self.record, self.workdir, self.created = store, record, workdir, created
        self.lost: dict | None = None  # the record that replaced ours
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(heartbeat_s,), daemon=True, name="bert_jax-lease")
        self._thread.start()

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            record = dict(self.record, heartbeat=time.time())
            try:
                written, found = self.store.swap(self.record["run"], record)
            except Exception:  # noqa: BLE001 (OSError, or a storage client's own type): the next beat tries again
                continue
            if written:
                self.record = record
            else:
                self.lost = found or {"job": "?", "heartbeat": 0}
                return

    def check(self) -> None:
        """Raises WorkdirInUse (one line) when another run took the lease over (our heartbeat had stalled past
        the timeout): this run must write nothing more to the workdir."""
        if self.lost is not None:
            raise WorkdirInUse(f"--workdir {self.workdir}: this run's lease was taken over by "
                               f"{describe(self.lost, time.time())} (this run's heartbeat had stalled); stopping "
                               f"without writing more")

    def release(self) -> None:
        """Stops the heartbeat and deletes the lease if it is still this run's; a local workdir that `acquire`
        created and the run left empty (it stopped before writing, e.g. on a config error) is removed too."""
        self._stop.set()
        self._thread.join(timeout=10)
        with contextlib.suppress(Exception):
            self.store.release(self.record["run"])
        if self.created:
            with contextlib.suppress(OSError):
                os.rmdir(self.workdir)  # only when empty


def acquire(workdir: str, job: str, timeout_s: float, heartbeat_s: float) -> Lease:
    """Takes `workdir`'s lease for `job` (e.g. "train") on this process (see the module docstring).

    Raises:
      WorkdirInUse: a live run holds it (one line: the holder, its heartbeat's age and the timeout).
      ValueError: timeout_s <= heartbeat_s or heartbeat_s <= 0.
      OSError: the workdir cannot be written (storage's own errors).
    """
    if not 0 < heartbeat_s < timeout_s:
        raise ValueError(f"config.lease_heartbeat_s={heartbeat_s} must be positive and below config.lease_timeout_s="
                         f"{timeout_s}")
    created = not storage.is_remote(workdir) and not os.path.isdir(workdir)
    storage.makedirs(workdir)
    store = _store(workdir)
    now = time.time()
    record = {"run": uuid.uuid4().hex, "job": job, "host": socket.gethostname(), "pid": os.getpid(),
              "started": now, "heartbeat": now}
    for _ in range(3):  # a lease that changed between our read and our write: look again
        found = store.read()
        expect, note = None, None
        if found is not None:
            age = now - float(found.get("heartbeat", 0))
            gone = _process_gone(found)
            if age <= timeout_s and not gone:
                raise WorkdirInUse(
                    f"--workdir {workdir} is in use by {describe(found, now)}: one run writes a run directory at a "
                    f"time; stop that run, or wait until its lease expires {timeout_s:.0f} s after its last heartbeat "
                    f"(config.lease_timeout_s)")
            expect = found.get("run")
            reason = "its process is gone" if gone else f"no heartbeat for {age:.0f} s > {timeout_s:.0f} s"
            note = f"{job}: took over the lease of --workdir {workdir} from {describe(found, now)} ({reason})"
        written, _ = store.swap(expect, record)
        if written:
            if note:
                print(note, file=sys.stderr, flush=True)
            return Lease(store, record, heartbeat_s, workdir, created)
    raise WorkdirInUse(f"--workdir {workdir}: its lease kept changing while this run tried to take it; another run "
                       f"is starting there")


@contextlib.contextmanager
def hold(workdir: str, job: str, timeout_s: float | None = None,
         heartbeat_s: float | None = None) -> Iterator[Lease | None]:
    """The lease for the duration of a run (module docstring): taken by process 0 (`acquire`), the outcome shared
    with every process; released on exit, an exception included. Yields the Lease on process 0, None elsewhere.

    Raises:
      WorkdirInUse / ValueError / OSError: as `acquire`, on every process of a multi-host run.
    timeout_s and heartbeat_s of 0 (or None) are the defaults, TIMEOUT_S and HEARTBEAT_S.
    """
    import jax

    timeout_s, heartbeat_s = timeout_s or TIMEOUT_S, heartbeat_s or HEARTBEAT_S
    lease, error = None, None
    if jax.process_index() == 0:
        try:
            lease = acquire(workdir, job, timeout_s, heartbeat_s)
        except (OSError, ValueError) as e:
            error = e
    if jax.process_count() > 1:
        import numpy as np
        from jax.experimental import multihost_utils

        ok = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
        if not ok and error is None:
            error = WorkdirInUse(f"--workdir {workdir}: process 0 could not take the run's lease (its log says why)")
    if error is not None:
        raise error
    try:
        yield lease
    finally:
        if lease is not None:
            lease.release()

