"""What one row of the device check (benchmarks/device_check.py) measures: its side (bert_jax's default recipe, a
`--variants` entry, or the peer) and its batch, built before any timing.

Phases, as pre-training runs them:
  phase 1  length 128, 20 predictions, one instance per row, every instance full length;
  phase 2  length 512, 80 predictions; instance lengths drawn uniformly from [32, 512]: ours packed by
           bert_jax.data.pretraining.packing (the packer training uses), the peer padded one instance per row.
Token ids are random (speed does not depend on them).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from bert_jax.configs import pretrain
from bert_jax.data.pretraining import packing
from device_check_report import OURS

PHASES = {1: (128, 20), 2: (512, 80)}  # phase -> (length, predictions)
BATCHES = {"tiny": (64, 8), "mini": (128, 16), "base": (256, 32), "large": (128, 16)}  # rows: phase 1, phase 2
MODEL_FIELDS = tuple(pretrain.model_config("tiny").keys())


# ----------------------------------------------------------------------------- sides


@dataclasses.dataclass(frozen=True)
class Side:
    """One column of the comparison: bert_jax with `settings` (config.model fields; "batch": rows, or "Nx" the
    default rows times N), or the peer, eager or compiled."""

    name: str
    kind: str  # OURS or PEER
    settings: tuple[tuple[str, object], ...] = ()
    compiled: bool = False

    def rows(self, size: str, phase: int, args) -> int:
        """The batch rows of this side at `size` and `phase`: args.p1_batch / args.p2_batch or the size's default
        (`BATCHES`), times N or replaced by the side's "batch" setting."""
        default = (args.p1_batch if phase == 1 else args.p2_batch) or BATCHES[size][phase - 1]
        batch = dict(self.settings).get("batch")
        if batch is None:
            return default
        return int(float(batch[:-1]) * default) if str(batch).endswith("x") else int(batch)


def _value(text: str):
    """A variant's value: True / False, an int, a float, else the string."""
    if text in ("True", "False", "true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_variants(text: str) -> list[Side]:
    """`--variants`: comma-separated variants, each `field=value` settings joined by '+', a field one of
    config.model's (kernels, attention_probs_dropout_prob, remat_policy, scan_layers, ...) or `batch` (rows, or
    `2x` the default rows), e.g. `kernels=reference,attention_probs_dropout_prob=0,remat_policy=dots+batch=2x`.

    Raises:
      ValueError: a setting without `=`, or an unknown field."""
    sides = []
    for variant in filter(None, (v.strip() for v in text.split(","))):
        if variant == "default":
            continue
        settings = []
        for item in variant.split("+"):
            field, sep, value = item.partition("=")
            if not sep or field not in MODEL_FIELDS + ("batch",):
                raise ValueError(f"--variants: {item!r} is not field=value with a field of config.model or batch")
            settings.append((field, value if field == "batch" else _value(value)))
        sides.append(Side(f"{OURS}[{variant}]", OURS, tuple(settings)))
    return sides


# ----------------------------------------------------------------------------- batches


TAG_BASE = 1000  # the token after [CLS] is TAG_BASE + the instance's index in its stream (random ids are above)


def instances(rng: np.random.Generator, count: int, length: int, predictions: int, full: bool) -> list[dict]:
    """`count` (at most 29,000) unpadded instances (the packer's element, `packing.unpad`): [CLS] A [SEP] B [SEP]
    with random ids (the first of A: TAG_BASE + the instance's index, `packed_indices` reads it back), token
    types, 15% of the tokens masked (at least 1, at most `predictions`), a random NSP label."""
    out = []
    for index in range(count):
        n = length if full else int(rng.integers(32, length + 1))
        ids = rng.integers(TAG_BASE + count, 30000, n).astype(np.int32)
        ids[0], ids[1], ids[n // 2], ids[-1] = 101, TAG_BASE + index, 102, 102
        types = (np.arange(n) > n // 2).astype(np.int32)
        m = min(predictions, max(1, round(0.15 * n)))
        positions = np.sort(rng.choice(np.arange(1, n - 1), m, replace=False)).astype(np.int32)
        out.append({"input_ids": ids, "token_type_ids": types, "masked_lm_positions": positions,
                    "masked_lm_ids": ids[positions].copy(), "masked_lm_weights": np.ones(m, np.float32),
                    "next_sentence_labels": rng.integers(0, 2, 1).astype(np.int32)})
    return out


def padded(batch: list[dict], length: int, predictions: int) -> dict[str, np.ndarray]:
    """One instance per row, padded to `length` / `predictions` (the unpacked batch layout)."""
    b = len(batch)
    out = {k: np.zeros((b, length), np.int32) for k in ("input_ids", "token_type_ids", "attention_mask")}
    out.update({"masked_lm_positions": np.zeros((b, predictions), np.int32),
                "masked_lm_ids": np.zeros((b, predictions), np.int32),
                "masked_lm_weights": np.zeros((b, predictions), np.float32),
                "next_sentence_labels": np.zeros((b,), np.int32)})
    for r, x in enumerate(batch):
        n, m = len(x["input_ids"]), len(x["masked_lm_ids"])
        out["input_ids"][r, :n], out["token_type_ids"][r, :n], out["attention_mask"][r, :n] = (
            x["input_ids"], x["token_type_ids"], 1)
        for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
            out[k][r, :m] = x[k]
        out["next_sentence_labels"][r] = x["next_sentence_labels"][0]
    return out


def packed(stream: list[dict], rows: int, length: int, predictions: int) -> dict[str, np.ndarray]:
    """The first `rows` packed rows of `stream` (bert_jax.data.pretraining.packing, as training packs)."""
    import grain

    k = packing.default_max_instances(length)
    ds = packing.pack(grain.MapDataset.source(stream).to_iter_dataset(), max_seq_length=length,
                      max_predictions_per_seq=predictions, max_instances=k,
                      num_packing_bins=packing.DEFAULT_PACKING_BINS, seed=0)
    it = iter(ds)
    return packing.finalize_batch([next(it) for _ in range(rows)])


def packed_indices(batch: dict[str, np.ndarray]) -> list[int]:
    """The stream indices of the instances in packed rows, row by row (each instance's [CLS] is followed by its
    tag, `instances`)."""
    ids = batch["input_ids"]
    rows, starts = np.nonzero(ids == 101)
    return [int(ids[r, s + 1]) - TAG_BASE for r, s in zip(rows, starts)]


@functools.lru_cache(maxsize=8)
def batches(phase: int, rows: int) -> tuple[dict, dict]:
    """(ours, the peer's) batches of `rows` rows of `phase`: phase 1 the same full rows; phase 2 ours `rows`
    packed rows, the peer the very instances those rows hold, padded one per row."""
    length, predictions = PHASES[phase]
    rng = np.random.default_rng(phase)
    if phase == 1:
        batch = padded(instances(rng, rows, length, predictions, full=True), length, predictions)
        return batch, batch
    stream = instances(rng, 40 * rows, length, predictions, full=False)
    ours = packed(stream, rows, length, predictions)
    held = packed_indices(ours)
    assert len(held) == int(ours["next_sentence_weights"].sum())  # every instance in our rows found
    return ours, padded([stream[i] for i in held], length, predictions)
