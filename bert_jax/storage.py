"""Where bert_jax reads and writes: local paths and object-store URIs (gs://...) alike, through etils.epath.

Workdirs (summaries, metrics.jsonl, predictions, metadata) and data directories may be `gs://` URIs on a
TPU pod; the same code runs on local paths on a laptop. Orbax handles the checkpoints itself. Writes never
leave a half-written file behind:
  - local paths: write to `<name>.tmp<pid>` beside the target, then `os.replace` (atomic on POSIX);
  - URIs: one whole-object upload (an object store publishes an object only once its upload completes,
    and a rename there is a copy, so a temporary name would buy nothing). An upload that fails midway is
    abandoned (`_object_writer`): closing an fsspec file, as leaving a `with` block by an exception does,
    would publish what was written so far under the final name.

A path counts as remote when it contains "://" (gs://, s3://, ...); reading one needs the backend epath
uses for that scheme (gcsfs, or TensorFlow's gfile for gs:// when TensorFlow is installed and EPATH_USE_TF is
not false; gfile cannot abandon an upload). Against a Cloud Storage emulator, the clients are pointed at it
by their environment variables alone (docs/pretraining.md, "Cloud Storage").

Output directories with many or large files (the data writers) are built in a local staging directory and
published file by file (`staging_dir`, `publish`: renamed locally, uploaded to a URI), metadata.json last.
Readers that open only local files and gs:// URIs (ArrayRecord's) read other URIs through `local_file`.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
import threading
from typing import Any, Sequence

from etils import epath


def is_remote(path: str | os.PathLike) -> bool:
    """True for object-store URIs (a "://" in the path), False for local paths."""
    return "://" in os.fspath(path)


def join(path: str | os.PathLike, *names: str) -> str:
    """`path/name/...` as a string, for local paths and URIs (os.path.join would mangle neither, but
    os.path.abspath and friends would mangle URIs)."""
    return os.fspath(epath.Path(path).joinpath(*names)) if is_remote(path) else os.path.join(path, *names)


def exists(path: str | os.PathLike) -> bool:
    """True when `path` (file or directory, local or URI) exists."""
    return epath.Path(path).exists()


def remove(path: str | os.PathLike) -> None:
    """Deletes the file (or object) `path` if it exists.

    Raises:
      OSError: it exists and cannot be deleted (one line naming it).
    """
    try:
        epath.Path(path).unlink(missing_ok=True)
    except OSError as e:
        raise _named(e, f"{os.fspath(path)!r}: cannot delete it") from None


def is_file(path: str | os.PathLike) -> bool:
    """True when `path` is an existing file (an object, on object stores)."""
    return epath.Path(path).is_file()


def is_dir(path: str | os.PathLike) -> bool:
    """True when `path` is an existing directory (a non-empty prefix, on object stores)."""
    return epath.Path(path).is_dir()


def list_names(path: str | os.PathLike) -> list[str]:
    """Names of the entries of directory `path` ([] when it does not exist)."""
    p = epath.Path(path)
    return sorted(child.name for child in p.iterdir()) if p.is_dir() else []


def makedirs(path: str | os.PathLike) -> None:
    """Creates `path` and its parents (no-op when it exists; a prefix only, on object stores)."""
    epath.Path(path).mkdir(parents=True, exist_ok=True)


def read_text(path: str | os.PathLike) -> str:
    """The UTF-8 text of `path`.

    Raises:
      FileNotFoundError: it does not exist (other OSErrors as `open`, e.g. IsADirectoryError).
      ValueError: it is not UTF-8 text (one line naming the file and the offset of the first bad byte).
    """
    try:
        return epath.Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{os.fspath(path)}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def check_output_dir(path: str | os.PathLike, name: str) -> None:
    """Checks, before anything is written, that the directory `path` (the flag or field `name`) can be
    created or used: locally, it is a directory or does not exist, and its nearest existing parent is a
    writable directory. URIs are not checked (their stores create prefixes on write).

    Raises:
      ValueError: empty `path` (one line naming `name`).
      NotADirectoryError: `path`, or the parent it would be created in, is not a directory.
      PermissionError (or the OSError a trial write raised): `path`, or the directory it would be created in,
        is not writable. Every message names `name` and `path` as given, never a path made from it.
    """
    path = os.fspath(path)
    if not path:
        raise ValueError(f"{name} is empty")
    if is_remote(path):
        return
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "is" if existing == os.path.abspath(path) else f"is inside {existing}, which is"
        raise NotADirectoryError(f"{name}={path!r} {what} not a directory")
    where = "write in it" if existing == os.path.abspath(path) else f"create it in {existing}"
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"{name}={path!r}: cannot {where} (not writable)")
    try:  # what os.access cannot tell: a read-only file system, /proc, access control lists, root squashed
        os.rmdir(tempfile.mkdtemp(prefix=".bert_jax-probe-", dir=existing))
    except OSError as e:
        raise _named(e, f"{name}={path!r}: cannot {where}") from None


def _named(error: OSError, message: str) -> OSError:
    """An OSError of `error`'s type (PermissionError, ...) whose text is `message (<the OS's reason>)`: the
    path the user gave instead of the one the OS failed on (a staging or trial directory made from it)."""
    reason = error.strerror or str(error)
    try:
        named = type(error)(f"{message} ({reason})")
    except TypeError:  # an OSError subclass with another signature
        named = OSError(f"{message} ({reason})")
    named.errno = error.errno  # kept for `is_out_of_space` and other callers; the text stays the message
    return named


def read_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of `path`. Raises FileNotFoundError when it does not exist."""
    return epath.Path(path).read_bytes()


def read_json(path: str | os.PathLike) -> Any:
    """The JSON value stored at `path`. Raises FileNotFoundError, or ValueError naming the file."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{os.fspath(path)}: not valid JSON ({e})") from None


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` to `path` all at once (see the module docstring); the parent must exist locally."""
    if is_remote(path):
        with _object_writer(path) as f:
            f.write(data)
        return
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Writes UTF-8 `text` to `path` all at once (see `write_bytes`)."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, value: Any) -> None:
    """Writes `value` as indented JSON (UTF-8, non-ASCII kept) to `path` all at once."""
    write_text(path, json.dumps(value, indent=2, ensure_ascii=False))


# ----------------------------------------------------------------------------- outputs built locally, published


def staging_dir(output_dir: str | os.PathLike) -> str:
    """A new local directory to build an output directory's files in: for a local one, a hidden directory
    in its nearest existing parent (the same file system, so that `publish` renames; `output_dir` itself is
    created only by `publish`, so a run that fails first leaves nothing behind); a temporary local
    directory for a URI, so that `publish` uploads. The caller removes it when done (`shutil.rmtree`).

    Raises:
      NotADirectoryError, PermissionError: as `check_output_dir` (naming `output_dir` as given, not the
        staging directory).
    """
    if is_remote(output_dir):
        return tempfile.mkdtemp(prefix="bert_jax-staging-")
    check_output_dir(output_dir, "output directory")
    parent = os.path.abspath(output_dir)
    while not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    try:
        return tempfile.mkdtemp(prefix=".bert_jax-staging-", dir=parent)
    except OSError as e:
        where = "write in it" if parent == os.path.abspath(output_dir) else f"create it in {parent}"
        raise _named(e, f"output directory {os.fspath(output_dir)!r}: cannot {where}") from None


def publish(work: str, output_dir: str | os.PathLike, names: Sequence[str]) -> None:
    """Moves the files `names` (relative paths, "/"-separated) of the staging directory `work` into
    `output_dir` (created if missing, with the names' folders), one at a time and each whole: renamed
    locally (atomic), uploaded to a URI (an object appears only once its upload completes).
    Write metadata.json after this, so that an interrupted publish never looks finished.

    Raises:
      OSError: a local `output_dir` that cannot be created or written in (one line naming it as given and
        the file, not the staging directory).
    """
    if not is_remote(output_dir):
        name = ""
        try:
            os.makedirs(output_dir, exist_ok=True)
            for name in names:
                os.makedirs(os.path.dirname(os.path.join(output_dir, name)), exist_ok=True)
                os.replace(os.path.join(work, name), os.path.join(output_dir, name))
        except OSError as e:
            what = f"cannot write {name} in it" if name else "cannot create it"
            raise _named(e, f"output directory {os.fspath(output_dir)!r}: {what}") from None
        return
    for name in names:
        upload(os.path.join(work, name), join(output_dir, name))


def upload(local: str, path: str | os.PathLike) -> None:
    """Copies the local file `local` to `path` (a URI), streamed in 16 MiB blocks; nothing is published at
    `path` when the copy fails midway (`_object_writer`)."""
    with open(local, "rb") as src, _object_writer(path) as dst:
        shutil.copyfileobj(src, dst, 16 << 20)


@contextlib.contextmanager
def _object_writer(path: str | os.PathLike):
    """A binary file writing the object `path` (a URI), published when the block ends. When the block
    raises, the upload is abandoned instead: an fsspec file (gcsfs, s3fs) publishes on close whatever it was
    given, and leaving a `with` block by an exception closes it; so its resumable or multipart upload is
    cancelled (`discard`) and the file marked closed. A writer without that API (TensorFlow's gfile) is closed."""
    import fsspec

    f = epath.Path(path).open("wb")
    try:
        yield f
    except BaseException:
        if isinstance(f, fsspec.spec.AbstractBufferedFile):
            with contextlib.suppress(Exception):  # cleanup only: an upload never finalized publishes nothing
                f.discard()
            f.closed = True  # close() now sends nothing; the bytes buffered locally are dropped
        else:
            f.close()
        raise
    f.close()


_LOCAL_COPIES: dict[str, str] = {}
_LOCAL_COPIES_LOCK = threading.Lock()


def local_file(path: str | os.PathLike) -> str:
    """A local path to read `path` with a reader that opens local files (and gs:// URIs) only, as ArrayRecord's:
    `path` itself when local or gs://; otherwise (s3://, az://, ...) a copy downloaded once per process into
    a temporary directory removed at exit. Safe to call from several threads at once."""
    path = os.fspath(path)
    if not is_remote(path) or path.startswith("gs://"):
        return path
    with _LOCAL_COPIES_LOCK:  # threads of one process (Beam's in-memory workers) copy a file once
        if path not in _LOCAL_COPIES:
            if not _LOCAL_COPIES:
                directory = tempfile.mkdtemp(prefix="bert_jax-remote-")
                atexit.register(shutil.rmtree, directory, True)
                _LOCAL_COPIES[""] = directory
            local = os.path.join(_LOCAL_COPIES[""], hashlib.sha256(path.encode()).hexdigest()[:16] + "-" +
                                 os.path.basename(path))
            with epath.Path(path).open("rb") as src, open(local + ".tmp", "wb") as dst:
                shutil.copyfileobj(src, dst, 16 << 20)
            os.replace(local + ".tmp", local)
            _LOCAL_COPIES[path] = local
        return _LOCAL_COPIES[path]


def is_out_of_space(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, is a write that ran out of disk space: errno ENOSPC
    (Python's OSError), or TensorStore's RESOURCE_EXHAUSTED with the OS message."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        if getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in text or \
                "RESOURCE_EXHAUSTED" in text and "space" in text.lower():
            return True
        error = error.__cause__ or error.__context__
    return False
