"""Sequence packing of pre-training instances: several instances per row instead of one row each plus padding.

Krell et al. 2021 ("Efficient Sequence Packing without Cross-contamination", arXiv 2107.02027) measure
about half of the tokens of Wikipedia at length 512 as padding; packing puts those slots to use. Each
row holds up to K instances; an instance's tokens attend only to its own tokens (`segment_ids`), its
positions restart at 0 (`position_ids`), its masked-LM positions point into the row, and its
next-sentence prediction is read at its own [CLS] (`next_sentence_positions`). So every instance gets
exactly the outputs and loss it gets alone (`bert_jax.model.modeling`, `bert_jax.training.losses.pretraining_loss`).

The packing algorithm is grain's online best-fit (`grain.experimental.BestFitPackIterDataset`): instances
arrive in the shuffled order, each goes into the open row where it leaves the least room, and when one
fits in none of the `num_packing_bins` open rows they are all emitted (in a shuffled order) and packing
restarts. Its state (the parent's position at the start of the window and the rows emitted from it) is
part of the iterator state, so a resumed run packs the same rows.

Packed batch (one process), B rows, L = max_seq_length, P = `row_predictions(...)`, K = max instances:
  input_ids, token_type_ids, attention_mask (1 on real tokens), segment_ids (1..k per instance, 0
    padding), position_ids (0.. within each instance): int32 [B, L]
  masked_lm_positions (in [0, L), row positions), masked_lm_ids: int32 [B, P]; masked_lm_weights float32 [B, P]
  next_sentence_labels: int32 [B, K]; next_sentence_positions ([CLS] of each instance; 0 on padding
    entries): int32 [B, K]; next_sentence_weights: float32 [B, K] (1.0 real instance, 0.0 padding)
"""

from __future__ import annotations

from typing import Sequence

import grain
import numpy as np

# The fields of one instance that packing concatenates (per-token, per-prediction, per-instance).
_TOKEN_FIELDS = ("input_ids", "token_type_ids")
_PREDICTION_FIELDS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
# The packer's window in rows. Online best-fit emits the whole window when an instance fits in no open
# row, so full-length instances close windows early; 1024 rows keep padding under 5% on the shared
# corpora (benchmarks/packing.py).
DEFAULT_PACKING_BINS = 1024


def default_max_instances(max_seq_length: int) -> int:
    """K when the config gives none: one instance per 32 tokens of the row (4 at 128, 16 at 512), room
    for short documents' instances; the next-sentence head costs K pooler rows per row."""
    return max(2, max_seq_length // 32)


def row_predictions(max_predictions_per_seq: int, max_instances: int) -> int:
    """P of a packed row: the phase's max_predictions_per_seq plus one per two instances. Each instance
    masks round(15% of its tokens) (at least one), so K instances sharing L tokens hold at most about
    15% of L plus K / 2 predictions from rounding; a row whose instances need more is not filled
    further (the packer tries another row)."""
    return max_predictions_per_seq + -(-max_instances // 2)


def unpad(instance: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A padded instance (`procedure.decode_instance`) -> its real entries only, the packer's element:
    input_ids, token_type_ids [n]; masked_lm_positions, masked_lm_ids, masked_lm_weights [m];
    next_sentence_labels int32 [1] (n real tokens, m real predictions)."""
    n = int(instance["attention_mask"].sum())
    m = int(np.count_nonzero(instance["masked_lm_weights"]))
    out = {k: instance[k][:n] for k in _TOKEN_FIELDS}
    out.update({k: instance[k][:m] for k in _PREDICTION_FIELDS})
    out["next_sentence_labels"] = np.reshape(instance["next_sentence_labels"], (1,)).astype(np.int32)
    return out


def pack(instances: grain.IterDataset, *, max_seq_length: int, max_predictions_per_seq: int, max_instances: int,
         num_packing_bins: int, seed: int) -> grain.IterDataset:
    """Unpadded instances (`unpad`) -> packed rows (grain's element layout: each field plus
    `<field>_segment_ids` and `<field>_positions`); `finalize_batch` turns a list of them into a batch.

    Raises:
      ValueError: max_instances or num_packing_bins below 1.
    """
    if max_instances < 1 or num_packing_bins < 1:
        raise ValueError(f"packing needs max_instances >= 1 and num_packing_bins >= 1, got {max_instances} and "
                         f"{num_packing_bins}")
    predictions = row_predictions(max_predictions_per_seq, max_instances)
    lengths = {k: max_seq_length for k in _TOKEN_FIELDS}
    lengths.update({k: predictions for k in _PREDICTION_FIELDS})
    lengths["next_sentence_labels"] = max_instances
    return grain.experimental.BestFitPackIterDataset(
        instances, length_struct=lengths, num_packing_bins=num_packing_bins, seed=seed, shuffle_bins=True,
        max_sequences_per_bin=max_instances)


def finalize_batch(rows: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Packed rows from `pack` -> the packed batch (module docstring): masked-LM positions moved from
    instance to row positions, the [CLS] of each instance located, weights for the padding entries."""
    batch = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    segment_ids = batch["input_ids_segment_ids"]  # [B, L], 1..k in the order the instances were placed
    position_ids = batch["input_ids_positions"]
    num_rows, max_instances = batch["next_sentence_labels"].shape
    # starts[b, s] = the row position of instance s's first token ([CLS]); instances are contiguous.
    starts = np.zeros((num_rows, max_instances + 1), np.int32)
    rows_, cols = np.nonzero((position_ids == 0) & (segment_ids > 0))
    starts[rows_, segment_ids[rows_, cols]] = cols
    prediction_segments = batch["masked_lm_positions_segment_ids"]  # [B, P], 0 on padding
    masked_lm_positions = np.where(
        prediction_segments > 0,
        batch["masked_lm_positions"] + np.take_along_axis(starts, prediction_segments, axis=1), 0)
    instance_segments = batch["next_sentence_labels_segment_ids"]  # [B, K]
    return {
        "input_ids": batch["input_ids"].astype(np.int32),
        "token_type_ids": batch["token_type_ids"].astype(np.int32),
        "attention_mask": (segment_ids > 0).astype(np.int32),
        "segment_ids": segment_ids.astype(np.int32),
        "position_ids": position_ids.astype(np.int32),
        "masked_lm_positions": masked_lm_positions.astype(np.int32),
        "masked_lm_ids": batch["masked_lm_ids"].astype(np.int32),
        "masked_lm_weights": batch["masked_lm_weights"].astype(np.float32),
        "next_sentence_labels": batch["next_sentence_labels"].astype(np.int32),
        "next_sentence_positions": np.where(instance_segments > 0, starts[:, 1:], 0).astype(np.int32),
        "next_sentence_weights": (instance_segments > 0).astype(np.float32),
    }


def padding_fraction(batch: dict[str, np.ndarray]) -> float:
    """Padded token slots / all token slots of a batch (packed or not), from its attention_mask."""
    mask = batch["attention_mask"]
    return float(1.0 - mask.sum() / mask.size)
