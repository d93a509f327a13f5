"""Where bert_jax reads and writes: local paths and object-store URIs (gs://...) alike, through etils.epath.

Workdirs (summaries, metrics.jsonl, predictions, metadata) and data directories may be `gs://` URIs on a
TPU pod; the same code runs on local paths on a laptop. Orbax handles the checkpoints itself. Writes never
leave a half-written file behind:
  - local paths: write to `<name>.tmp<pid>` beside the target, then `os.replace` (atomic on POSIX);
  - URIs: one whole-object upload (an object store publishes an object only once its upload completes,
    and a rename there is a copy, so a temporary name would buy nothing).

A path counts as remote when it contains "://" (gs://, s3://, ...); reading one needs the backend epath
uses for that scheme (gcsfs or TensorFlow's gfile for gs://).
"""

from __future__ import annotations

import json
import os
from typing import Any

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
    """The UTF-8 text of `path`. Raises FileNotFoundError when it does not exist."""
    return epath.Path(path).read_text(encoding="utf-8")


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
        epath.Path(path).write_bytes(data)
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
