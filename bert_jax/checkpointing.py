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
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from bert_jax import storage


class Checkpointer:
    """Thin wrapper over `ocp.CheckpointManager` for the three items above.

    Args:
      directory: `<workdir>/checkpoints` (local path or gs:// URI).
      max_to_keep: keep the newest N checkpoints (None: all).
      async_save: write in a background thread (default True).
    """

    def __init__(self, directory: str, *, max_to_keep: int | None = 3, async_save: bool = True):
        self.directory = directory
        self.manager = ocp.CheckpointManager(
            directory if storage.is_remote(directory) else os.path.abspath(directory),
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save,
                                                 create=True),
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
          Exception: whatever a previous asynchronous save failed with, re-raised when it is awaited;
            a failure of this save surfaces likewise in a later `save`, `wait` or `close`.
        """
        return self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data), config=ocp.args.JsonSave(config)),
            force=force)

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

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending asynchronous saves, then releases the manager; the object is unusable after.

        Raises:
          Exception: whatever a pending asynchronous save failed with (re-raised by Orbax).
        """
        self.manager.wait_until_finished()
        self.manager.close()


def abstract_like(tree: Any, shardings: Any) -> Any:
    """`jax.ShapeDtypeStruct`s of `tree` (arrays or shape structs) carrying `shardings`."""
    return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def restore_params(directory: str, abstract_params: Any, step: int | None = None) -> Any:
    """Restores only `state.params` of a pre-training checkpoint (for fine-tuning).

    Args:
      directory: `<workdir>/checkpoints` of a pre-training run.
      abstract_params: target tree of ShapeDtypeStructs (with shardings) for the params subtree to read,
        e.g. just `{"bert": ...}` to take the encoder and leave the heads out.
      step: which checkpoint (default: latest).

    Raises:
      FileNotFoundError: no checkpoint in `directory`.
    """
    manager = ocp.CheckpointManager(directory if storage.is_remote(directory) else os.path.abspath(directory),
                                    item_names=("state", "data", "config"),
                                    options=ocp.CheckpointManagerOptions(read_only=True))
    step = manager.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{directory}: no checkpoint")
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item={"params": abstract_params},
        restore_args=jax.tree_util.tree_map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype),
                                            {"params": abstract_params}),
        partial_restore=True)))
    manager.close()
    return restored["state"]["params"]
