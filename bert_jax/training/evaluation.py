"""Held-out evaluation during pre-training: its data checked before anything runs, its batches, its metrics.

Held-out data (at most one source a run; "eval" records of metrics.jsonl and TensorBoard, every
config.eval_every steps and at the end):
  config.eval_data_dir  static instances (create_pretraining_data): the first config.eval_batches batches in
                        file order; or tokenized documents (--tokenize_only, the training data's vocabulary),
                        instances drawn from all of them as below.
  config.eval_fraction  a share of each phase's tokenized documents (`bert_jax.data.pretraining.holdout.split`: fixed by
                        the document count and the fraction), which training never reads: its instances,
                        NotNext segments and row fillers come from the other documents, and
                        mlm_bias_init="log_prior" counts the other documents' tokens only.
Instances from documents are drawn with the phase's length and masking (max_seq_length, max_predictions_per_seq,
masked_lm_prob, do_whole_word_mask, short_seq_prob), seed EVAL_SEED, the documents in corpus order from
epoch 0, unpacked; the first config.eval_batches batches of the phase's batch size are drawn once per phase
and kept, so every evaluation of a phase (in every run, whatever config.seed) sees the same instances.
Held-out documents that give fewer than eval_batches batches continue into epoch 1 (new masks of the same
documents). Metrics: those of `pretraining.eval_step`, pooled over the batches by `pooled`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import ml_collections
import numpy as np

from bert_jax.data.pretraining import formats, holdout

# The seed of instances drawn for evaluation: the same held-out instances for every config.seed.
EVAL_SEED = 20181011


def fraction(config: ml_collections.ConfigDict) -> float:
    """config.eval_fraction (0.0 when absent: no held-out documents)."""
    return float(config.get("eval_fraction", 0.0) or 0.0)


def enabled(config: ml_collections.ConfigDict) -> bool:
    """Whether a run evaluates: config.eval_data_dir or config.eval_fraction set."""
    return bool(config.eval_data_dir) or fraction(config) > 0


def check(config: ml_collections.ConfigDict, phases: list, phase_metadata: list[dict],
          eval_metadata: dict | None) -> None:
    """The evaluation settings against the data, before anything is written or compiled.

    Args:
      config: a pre-training config (eval_data_dir, eval_fraction, model.max_position_embeddings).
      phases: `pretraining.Phase`s, and phase_metadata their data_dirs' metadata.json (already checked complete).
      eval_metadata: config.eval_data_dir's metadata.json (checked complete), or None without one.

    Raises:
      ValueError (one line naming the config field): eval_fraction outside [0, 1) or set with eval_data_dir,
        eval_fraction with a phase of static instances, a fraction leaving fewer than 2 documents to hold out
        or to train on (`holdout.split`), an eval_data_dir of another vocabulary than a phase's data, of fewer
        than 2 documents, or of static instances longer than max_position_embeddings or fewer than one batch.
    """
    share = config.get("eval_fraction", 0.0) or 0.0
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0.0 <= share < 1.0:
        raise ValueError(f"config.eval_fraction={share!r} must be in (0, 1) (0: no held-out documents)")
    if share and config.eval_data_dir:
        raise ValueError(f"config.eval_fraction={share} and config.eval_data_dir={config.eval_data_dir!r} are both "
                         "set: evaluate on one of them (a share of the phases' documents, or a directory)")
    if share:
        for p, meta in zip(phases, phase_metadata):
            field = f"config.phases[{p.index}].data_dir={p.data_dir!r}"
            if not formats.is_documents(meta):
                raise ValueError(f"config.eval_fraction={share} holds out tokenized documents, but {field} holds "
                                 "static instances: give the phase tokenized documents (create_pretraining_data "
                                 "--tokenize_only), or held-out static instances as config.eval_data_dir")
            try:
                holdout.split(int(meta["num_documents"]), share)
            except ValueError as e:
                raise ValueError(f"config.{e} ({field})") from None
    if eval_metadata is None:
        return
    field = f"config.eval_data_dir={config.eval_data_dir!r}"
    for p, meta in zip(phases, phase_metadata):
        ours, theirs = eval_metadata.get("vocab_sha256"), meta.get("vocab_sha256")
        if ours and theirs and ours != theirs:
            raise ValueError(f"{field} was tokenized with another vocabulary (sha256 {ours[:12]}...) than "
                             f"config.phases[{p.index}].data_dir={p.data_dir!r} ({theirs[:12]}...)")
    if formats.is_documents(eval_metadata):
        if int(eval_metadata["num_documents"]) < holdout.MIN_DOCUMENTS:
            raise ValueError(f"{field} holds {eval_metadata['num_documents']} document(s); evaluation draws from "
                             f"at least {holdout.MIN_DOCUMENTS}")
        return
    length = eval_metadata["flags"]["max_seq_length"]
    if length > config.model.max_position_embeddings:
        raise ValueError(f"{field} holds length {length}, over "
                         f"config.model.max_position_embeddings={config.model.max_position_embeddings}")
    largest = max(p.batch_size for p in phases)  # evaluation uses the current phase's batch size
    if eval_metadata["num_instances"] < largest:
        raise ValueError(f"{field} holds {eval_metadata['num_instances']} instances, fewer than one batch of {largest}")


def training_documents(config: ml_collections.ConfigDict, data_dir: str) -> np.ndarray | None:
    """The corpus indices (int64 [k], ascending) of `data_dir`'s tokenized documents that training reads with
    config.eval_fraction set (`holdout.split`'s training side); None without it (all documents).

    Raises:
      FileNotFoundError / ValueError: as `holdout.split_directory`.
    """
    return holdout.split_directory(data_dir, fraction(config))[0] if fraction(config) else None


class HeldOut:
    """The evaluation batches of a run's phases (module docstring).

    `batches(phase)` -> None for static instances in config.eval_data_dir (read afresh at each evaluation,
    `pretraining._evaluate`), else the list of config.eval_batches local batches (dicts of numpy arrays, the unpacked
    layout of `bert_jax.data.pretraining.loader`: int32 [B, L] ids, int32 / float32 [B, P] predictions, int32 [B] NSP
    labels; B = the phase's batch_size / process count) drawn from the held-out documents on the first call for
    that phase and kept.
    """

    def __init__(self, config: ml_collections.ConfigDict):
        self.config = config
        self._static = bool(config.eval_data_dir) and not formats.is_documents(
            formats.read_metadata(config.eval_data_dir))
        self._kept: dict[int, list[dict[str, np.ndarray]]] = {}

    def batches(self, phase) -> list[dict[str, np.ndarray]] | None:
        """The batches to evaluate `phase` (a `pretraining.Phase`) on; None: config.eval_data_dir's static instances.

        Raises:
          ValueError / FileNotFoundError: as `loader.make_pretraining_iterator` and `holdout.split_directory`.
        """
        if self._static:
            return None
        if phase.index not in self._kept:
            self._kept[phase.index] = draw(self.config, phase)
        return self._kept[phase.index]


def draw(config: ml_collections.ConfigDict, phase) -> list[dict[str, np.ndarray]]:
    """config.eval_batches local batches drawn for `phase` from config.eval_data_dir's documents, or from
    the documents config.eval_fraction holds out of the phase's data_dir (module docstring; shapes as
    `HeldOut`). Deterministic: seed EVAL_SEED, corpus order, epoch 0 first.

    Raises:
      FileNotFoundError / ValueError: an incomplete directory, or settings `loader.make_pretraining_iterator`
        or `holdout.split_directory` reject (`check` rejects them first in a run).
    """
    from bert_jax.data.pretraining import loader

    if config.eval_data_dir:
        path, documents = config.eval_data_dir, None
    else:
        path, documents = phase.data_dir, holdout.split_directory(phase.data_dir, fraction(config))[1]
    it = loader.make_pretraining_iterator(
        path, global_batch_size=phase.batch_size, seed=EVAL_SEED, shuffle=False, num_epochs=None,
        max_seq_length=phase.max_seq_length, max_predictions_per_seq=phase.max_predictions_per_seq,
        **phase.masking(), documents=documents)
    try:
        return [next(it) for _ in range(config.eval_batches)]
    finally:
        it.close()


def pooled(eval_fn: Callable[[Any, dict], dict], params: Any, batches: Iterable[dict[str, np.ndarray]],
           to_global: Callable[[dict[str, np.ndarray]], dict], max_batches: int) -> dict[str, float]:
    """`eval_fn(params, to_global(batch))` over the first `max_batches` of `batches`, pooled: MLM metrics
    (mlm_*) per prediction (each batch weighted by its num_predictions), the others per sequence (batches are
    equal), so the values one pass over all the batches at once would give; num_predictions summed; loss =
    mlm_loss + nsp_loss (as the training step's). Floats; {} for no batch."""
    totals: dict[str, float] = {}
    weights: dict[str, float] = {}
    for n, local in enumerate(batches):
        if n == max_batches:
            break
        metrics = {k: float(v) for k, v in jax.device_get(eval_fn(params, to_global(local))).items()}
        for k, v in metrics.items():
            w = metrics["num_predictions"] if k.startswith("mlm_") else 1.0
            totals[k] = totals.get(k, 0.0) + w * v
            weights[k] = weights.get(k, 0.0) + w
    out = {k: totals[k] / weights[k] for k in totals if weights[k]}
    if "num_predictions" in totals:
        out["num_predictions"] = totals["num_predictions"]  # all of them
    if "mlm_loss" in out:
        out["loss"] = out["mlm_loss"] + out["nsp_loss"]  # as the step's loss: mean MLM + mean NSP
    return out
