"""Orbax checkpoints of a training run: exact resume, any mesh, params-only restore for fine-tuning.

One lineage per run in `<workdir>/checkpoints/<step>/`, each step holding three items:
  state   the TrainState (step, params, opt_state, rng) as sharded arrays (`ocp.args.StandardSave`),
  data    JSON: the phase index and the input iterator's state (exact data position),
  config  JSON: the run's config, for reference and for fine-tuning jobs.
Saves are asynchronous (training goes on while the arrays are written); a step directory appears
only once complete (Orbax writes to a temporary name and renames), so a killed process leaves the
previous checkpoints intact.

Restoring takes an abstract target (`jax.ShapeDtypeStruct` with shardings), so a checkpoint written
on one mesh or device count restores onto another: each process reads only its shards.

Unreadable checkpoints (`restore_newest_readable`, `restore_params`): a step whose Orbax metadata
(`_CHECKPOINT_METADATA`, the items' directories, the array tree metadata) cannot be read, or whose arrays
fail to read (a truncated or missing file: TensorStore's error), is reported in one line naming the
step, moved aside to `<step>.unreadable` (never deleted) and the next older step is tried; with none
readable, or only steps moved aside earlier, NoReadableCheckpoint (a run never silently starts over).
A checkpoint whose arrays are readable but of other shapes than the target is a configuration error
(CheckpointMismatch, a ValueError), not a corrupt checkpoint, and is left where it is.

A save that runs out of disk space (`save`, `wait`, `close`: an asynchronous save's error surfaces
when it is awaited) raises a one-line CheckpointSaveError naming the step and the directory; the
failed save's temporary directory is removed, so no step of it is listed.

Orbax's and TensorStore's own reports of such a failure (logs, tracebacks from other threads) are
printed as they come unless `bert_jax.console` is installed, as the command-line entry points do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from etils import epath

from bert_jax import console, storage


# Replica-parallel saving (Orbax's default off GPU) splits each replicated array among its replicas, one
# slice program per array shape and replica; below this many bytes per slice one replica writes the whole
# array instead (writing a small array costs less than compiling its slice programs).
MIN_REPLICA_SLICE_BYTES = 1 << 20


def _use_replica_parallel_for_large_arrays() -> None:
    """Registers Orbax's jax.Array handler with `MIN_REPLICA_SLICE_BYTES` (process-wide, as Orbax's
    handler registry is)."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # Orbax warns that its default handler is replaced: it is, on purpose
    try:
        ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(
            min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES), override=True)
    finally:
        absl_logger.setLevel(level)


class Checkpointer:
    """Thin wrapper over `ocp.CheckpointManager` for the three items above.

    Args:
      directory: `<workdir>/checkpoints` (local path or gs:// URI).
      max_to_keep: keep the newest N checkpoints (None: all).
      async_save: write in a background thread (default True).
      read_only: only read (fine-tuning from another run's checkpoints): nothing is created, and the
        temporary directories of saves in progress are left alone. A writer removes those of
        unfinished saves (a killed process, a full disk) when it starts (Orbax's
        `cleanup_tmp_directories`).
    """

    def __init__(self, directory: str, *, max_to_keep: int | None = 3, async_save: bool = True,
                 read_only: bool = False):
        self.directory = directory
        self._pending: int | None = None  # the step of the asynchronous save not yet awaited
        self._failed: BaseException | None = None  # a save's failure, already raised once
        if not read_only:
            _use_replica_parallel_for_large_arrays()
        self.manager = ocp.CheckpointManager(
            directory if storage.is_remote(directory) else os.path.abspath(directory),
            options=ocp.CheckpointManagerOptions(max_to_keep=None if read_only else max_to_keep,
                                                 save_interval_steps=0 if read_only else 1,
                                                 enable_async_checkpointing=async_save,
                                                 create=not read_only, read_only=read_only,
                                                 cleanup_tmp_directories=not read_only),
            item_names=("state", "data", "config"),
        )

    def latest_step(self) -> int | None:
        """The newest checkpoint's step, or None when there is none.

        Counts the complete checkpoints found in `directory` when constructed and those saved since
        (an asynchronous save counts from its start: `wait()` for it to be on disk).
        """
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of the checkpoints kept (as `latest_step` counts them), oldest first."""
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, data: dict, config: dict, *, force: bool = True) -> bool:
        """Starts saving `state` (sharded arrays), `data` and `config` (JSON) as checkpoint `step`.

        Waits for the previous asynchronous save first; beyond `max_to_keep`, the oldest checkpoints
        are deleted. Returns whether a save was started (always True with `force`).

        Raises:
          ValueError: checkpoint `step` already exists (Orbax's `StepAlreadyExistsError`).
          CheckpointSaveError: this or the previous (asynchronous) save ran out of disk space (names
            that save's step and the directory; its partial write is removed).
          Exception: whatever else a previous asynchronous save failed with, re-raised when it is
            awaited; a failure of this save surfaces likewise in a later `save`, `wait` or `close`.
        """
        self.wait()
        with self._save_errors(step):
            started = self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data), config=ocp.args.JsonSave(config)),
                force=force)
        self._pending = step if started else None
        return started

    @contextlib.contextmanager
    def _save_errors(self, step: int | None):
        """Turns a save of `step` that failed for lack of space into a one-line CheckpointSaveError
        naming the step and the directory, after removing what it had written (Orbax's temporary
        directory: never a step that `latest_step` lists); other errors pass unchanged. Either way the
        failure is remembered, so that `close` does not raise it a second time."""
        try:
            yield
        except Exception as e:
            self._failed = e
            if not storage.is_out_of_space(e):
                raise
            removed = self._remove_unfinished()
            what = f"checkpoint {step}" if step is not None else "a checkpoint"
            self._failed = CheckpointSaveError(
                f"saving {what} to {self.directory} failed: no space left on device (the earlier checkpoints are "
                f"intact{'; its partial write was removed' if removed else ''})")
            raise self._failed from None

    def _remove_unfinished(self) -> bool:
        """Removes the temporary directories of unfinished saves (Orbax's `tmp_checkpoints`) on
        process 0 -> whether there were any."""
        if jax.process_index() != 0:
            return False
        names = ocp.step.tmp_checkpoints(self.manager.directory)
        for name in names:
            with contextlib.suppress(OSError):
                epath.Path(self.manager.directory, name).rmtree()
        return bool(names)

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """Restores checkpoint `step` onto the shardings of `abstract_state` -> (state, data).

        Args:
          step: the checkpoint; None takes the latest.
          abstract_state: tree of `jax.ShapeDtypeStruct`s with shardings (see `abstract_like`), the
            structure of the saved state.

        Raises:
          FileNotFoundError: no checkpoint `step` (with None: no checkpoint at all).
          ValueError: `abstract_state` whose tree or array shapes differ from the saved state.
        """
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return restored["state"], restored["data"]

    def restore_config(self, step: int) -> dict:
        """The `config` item (the run's config as a JSON dict) of checkpoint `step` (None: the latest).

        Raises:
          FileNotFoundError: no checkpoint `step` (with None: no checkpoint at all).
        """
        return self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]

    def restore_newest_readable(self, abstract_state: Any) -> tuple[int | None, Any, dict | None]:
        """Restores the newest readable checkpoint -> (step, state, data); (None, None, None) when the
        directory holds no checkpoint. Unreadable newer steps are moved aside (module docstring).

        Raises:
          NoReadableCheckpoint: checkpoints exist but none is readable (all moved aside).
          CheckpointMismatch (a ValueError): a readable checkpoint whose arrays differ from `abstract_state`.
        """
        def restore(step):
            check_shapes(storage.join(self.directory, str(step)), {"": abstract_state})
            return self.restore(step, abstract_state)

        steps = self.all_steps()
        found = newest_readable(self.directory, steps, restore)
        if found is None:
            return None, None, None
        step, (state, data) = found
        if step != steps[-1]:  # newer steps were moved aside: the manager lists what is left
            self.manager.reload()
        return step, state, data

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk.

        Raises:
          CheckpointSaveError: the pending save ran out of disk space (see `save`).
          Exception: whatever else it failed with.
        """
        step, self._pending = self._pending, None
        with self._save_errors(step):
            self.manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending asynchronous saves, then releases the manager; the object is unusable after.

        Raises:
          CheckpointSaveError, Exception: as `wait`, for a failure not already raised by `save` or `wait`.
        """
        try:
            if self._failed is None:
                self.wait()
        finally:
            try:
                self.manager.close()  # waits again: a failed save re-raises, already reported
            except Exception:
                if self._failed is None:
                    raise


def abstract_like(tree: Any, shardings: Any) -> Any:
    """`jax.ShapeDtypeStruct`s of `tree` (arrays or shape structs) carrying `shardings`."""
    return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def restore_params(directory: str, abstract_params: Any, step: int | None = None) -> Any:
    """Restores only `state.params` of a pre-training checkpoint (for fine-tuning).

    Args:
      directory: `<workdir>/checkpoints` of a pre-training run.
      abstract_params: target tree of ShapeDtypeStructs (with shardings) for the params subtree to read,
        e.g. just `{"bert": ...}` to take the encoder and leave the heads out.
      step: which checkpoint (default: the newest readable one; unreadable newer ones are moved aside).

    Raises:
      FileNotFoundError: no checkpoint in `directory` (NoReadableCheckpoint: none readable, or `step`
        given and unreadable: that one is left in place).
      CheckpointMismatch (a ValueError): arrays of other shapes than `abstract_params`.
    """
    manager = ocp.CheckpointManager(directory if storage.is_remote(directory) else os.path.abspath(directory),
                                    item_names=("state", "data", "config"),
                                    options=ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0,
                                                                         create=False))

    def restore(s):
        check_shapes(storage.join(directory, str(s)), {"params": abstract_params})
        return manager.restore(s, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item={"params": abstract_params},
            restore_args=jax.tree_util.tree_map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype),
                                                {"params": abstract_params}),
            partial_restore=True)))["state"]["params"]

    try:
        if step is not None:
            return read_step(directory, step, restore)
        found = newest_readable(directory, list(manager.all_steps()), restore)
        if found is None:
            raise FileNotFoundError(f"{directory}: no checkpoint")
        return found[1]
    finally:
        manager.close()


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (no space left on device); earlier checkpoints are intact."""


class NoReadableCheckpoint(FileNotFoundError):
    """Checkpoints exist, but none could be read (each was moved aside), or the one asked for cannot be read."""


class CheckpointMismatch(ValueError):
    """A readable checkpoint whose arrays do not fit the target (another model or config)."""


def _key_name(key: Any) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def _stored_shapes(step_dir: str) -> dict[str, tuple[int, ...]]:
    """{"/"-joined path: shape} of every array of a checkpoint's `state` item (Orbax's tree metadata)."""
    local = not storage.is_remote(step_dir)  # Orbax finds no metadata under a relative path
    handler = ocp.PyTreeCheckpointHandler()
    try:
        tree = handler.metadata(epath.Path(os.path.abspath(step_dir) if local else step_dir, "state"))
    finally:
        handler.close()
    return {"/".join(_key_name(k) for k in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def stored_params(step_dir: str) -> dict[str, tuple[int, ...]]:
    """{"/"-joined parameter path (e.g. "bert/embeddings/word_embeddings/embedding"): shape} of the params a
    checkpoint `<checkpoints>/<step>` holds, read from its metadata (no array is read).

    Raises:
      Exception: whatever Orbax raises when the metadata cannot be read.
    """
    return {path[len("params/"):]: shape for path, shape in _stored_shapes(step_dir).items()
            if path.startswith("params/")}


def check_shapes(step_dir: str, target: dict[str, Any]) -> None:
    """Compares the array shapes recorded in a checkpoint's `state` metadata (Orbax's tree metadata)
    with `target` = {path prefix: tree of arrays or ShapeDtypeStructs} ("" = the whole state,
    "params" = that subtree).

    Raises:
      CheckpointMismatch: a target array missing from the checkpoint or stored with another shape (names it).
      Exception: whatever Orbax raises when the metadata cannot be read (an unreadable checkpoint).
    """
    stored = _stored_shapes(step_dir)
    # The tree as saved (Orbax's _METADATA file): an array named there but without readable metadata
    # is damage, not another model.
    saved = json.loads(storage.read_text(storage.join(step_dir, "state", "_METADATA")))["tree_metadata"]
    saved_names = {"/".join(str(k["key"]) for k in entry["key_metadata"]) for entry in saved.values()}
    for prefix, subtree in target.items():
        for path, leaf in jax.tree_util.tree_leaves_with_path(subtree):
            name = "/".join([prefix] * bool(prefix) + [_key_name(k) for k in path])
            if name not in saved_names:
                raise CheckpointMismatch(f"checkpoint {step_dir} has no array {name} (a checkpoint of another model?)")
            if name not in stored:
                raise OSError(f"array {name} is listed in the checkpoint's tree but its metadata is unreadable")
            if stored[name] != tuple(leaf.shape):
                raise CheckpointMismatch(f"checkpoint {step_dir}: {name} has shape {stored[name]}, the config gives "
                                 f"{tuple(leaf.shape)}")


def _first_line(error: BaseException) -> str:
    """`error` in a few words: the innermost cause (TensorStore's own message names the array and what is
    wrong with its file), first line, without the TensorStore spec and the local path."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = re.sub(r' at local file "[^"]*"', "", str(error).split(". See full TensorStore details")[0]).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:240] if text else ''}"


def _moved_aside(directory: str) -> list[int]:
    """Steps of `directory` moved aside as unreadable (`<step>.unreadable[-N]`), sorted."""
    return sorted({int(name.split(".")[0]) for name in storage.list_names(directory) if _UNREADABLE.fullmatch(name)})


_UNREADABLE = re.compile(r"\d+\.unreadable(-\d+)?")


def has_checkpoints(directory: str) -> bool:
    """Whether `directory` holds checkpoint steps, readable or moved aside as unreadable."""
    return any(name.isdigit() or _UNREADABLE.fullmatch(name) for name in storage.list_names(directory))


def _try(directory: str, step: int, restore: Callable[[int], Any]) -> tuple[Any, str | None]:
    """-> (restore(step), None), or (None, the reason in a few words) when the step cannot be read.
    In a command (`console.install`), Orbax's own reports of a failed try are held back and dropped.

    Raises:
      CheckpointMismatch: from `restore` (a readable checkpoint that does not fit).
    """
    try:
        _check_integrity(storage.join(directory, str(step)))
        with console.held_stderr(storage.join(directory, str(step))):
            return restore(step), None
    except CheckpointMismatch:
        raise
    except Exception as e:  # TensorStore / Orbax / OS / JSON errors reading the files: unreadable
        return None, _first_line(e)


def read_step(directory: str, step: int, restore: Callable[[int], Any]) -> Any:
    """`restore(step)` of the one checkpoint asked for: no fallback, nothing moved.

    Raises:
      NoReadableCheckpoint: the step cannot be read (one line with the reason).
      CheckpointMismatch: from `restore`.
    """
    result, reason = _try(directory, step, restore)
    if reason is not None:
        raise NoReadableCheckpoint(f"checkpoint {step} in {directory} is unreadable ({reason})")
    return result


def newest_readable(directory: str, steps: list[int], restore: Callable[[int], Any]) -> tuple[int, Any] | None:
    """The one fallback policy of every restore: tries `restore(step)` from the newest step down -> (step,
    result) of the first that reads; an unreadable step is reported in one line and moved aside
    (process 0 renames it). None when there are no steps and none was ever moved aside.

    Raises:
      NoReadableCheckpoint: no step could be read, now or in an earlier run (the directory holds only
        steps moved aside: a run does not silently start over from scratch).
      CheckpointMismatch: from `restore` for a readable checkpoint that does not fit (not moved).
    """
    for step in sorted(steps, reverse=True):
        result, reason = _try(directory, step, restore)
        if reason is None:
            return step, result
        step_dir = storage.join(directory, str(step))
        moved = _move_aside(step_dir)
        print(f"checkpoint {step} in {directory} is unreadable ({reason}); "
              + (f"moved to {moved}; " if moved else "could not move it aside; ") + "trying the previous one",
              file=sys.stderr, flush=True)
    set_aside = _moved_aside(directory)
    if set_aside:
        raise NoReadableCheckpoint(f"{directory}: no readable checkpoint (steps {set_aside} are unreadable and "
                                   "were moved aside as <step>.unreadable)")
    return None


def _check_integrity(step_dir: str) -> None:
    """Orbax's own completeness markers: the step metadata parses, and every item was committed.

    Raises:
      ValueError: a missing or unparsable marker (names it).
    """
    try:
        json.loads(storage.read_text(storage.join(step_dir, "_CHECKPOINT_METADATA")))
    except (OSError, ValueError) as e:
        raise ValueError(f"_CHECKPOINT_METADATA unreadable ({type(e).__name__})") from None
    for item in ("state", "data"):
        if not storage.is_file(storage.join(step_dir, item, "_METADATA" if item == "state" else "metadata")):
            raise ValueError(f"item {item!r} missing or incomplete")


def _move_aside(step_dir: str) -> str | None:
    """Renames `step_dir` to `<step_dir>.unreadable` (or `.unreadable-N`) on process 0 -> the new
    name, or None when it cannot be renamed (e.g. a read-only location)."""
    target = step_dir + ".unreadable"
    if jax.process_index() == 0:
        n = 1
        while storage.exists(target):
            target, n = f"{step_dir}.unreadable-{n}", n + 1
        try:
            if storage.is_remote(step_dir):
                        epath.Path(step_dir).rename(target)
            else:
                os.replace(step_dir, target)
        except OSError:
            return None
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"move aside {step_dir}")
    return target
