"""Batches of in-memory arrays for fine-tuning and feature extraction, with dynamic padding.

`local_batches` yields each process's rows of one global permutation (or of the arrays' order for
prediction), ready for `steps.global_batch`. `Padding` (from a config's `length_buckets` /
`max_length_buckets` / `group_by_length`) cuts each batch to its longest sequence rounded up to a bucket
length (`bucket_lengths`, or lengths placed on the run's own batches by `placed_buckets`), so a step
function compiles one program per bucket used; training batches may come length-grouped (transformers'
`group_by_length`). `FIXED` (length_buckets=0) gives every batch at the arrays' full length L.

Dimension letters as in WORKSPACE.md: N examples, L length.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping

import jax
import ml_collections
import numpy as np

# Batches per length-sorted chunk under group_by_length: transformers' LengthGroupedSampler mega-batch (50).
GROUP_SIZE = 50


def bucket_lengths(max_seq_length: int, multiple: int) -> tuple[int, ...]:
    """The padded lengths a batch may have: the multiples of `multiple` below max_seq_length, then
    max_seq_length itself, e.g. (8, 16, ..., 120, 128) for (128, 8); () for multiple 0 (fixed padding:
    every batch at max_seq_length).

    Each bucket used costs one compilation per step function, once per run; finer spacing leaves fewer
    padded tokens (benchmarks/README.md has the measured trade-off).

    Args:
      max_seq_length: int, the features' full length L (>= 1).
      multiple: int >= 0, the spacing in tokens.

    Returns:
      ascending tuple of ints, the last one max_seq_length; () when multiple is 0.

    Raises:
      ValueError: multiple < 0 or max_seq_length < 1.
    """
    if multiple < 0 or max_seq_length < 1:
        raise ValueError(f"length_buckets={multiple} / max_seq_length={max_seq_length}: need length_buckets >= 0 "
                         "and max_seq_length >= 1")
    if multiple == 0:
        return ()
    return tuple(range(multiple, max_seq_length, multiple)) + (max_seq_length,)


def placed_buckets(batch_lengths: np.ndarray, rows: np.ndarray | int, candidates: tuple[int, ...],
                   count: int, program_tokens: float = 0.0) -> tuple[int, ...]:
    """At most `count` of the `candidates` lengths, chosen so that batches of these longest sequences hold
    the fewest padded tokens: sum over batches of rows * (smallest chosen length >= its longest), plus
    `program_tokens` per length chosen, minimal (exact dynamic programming over the candidates,
    O(count * K^2) for K candidates used).

    Args:
      batch_lengths: int [M], each batch's longest sequence (`sequence_lengths` of its rows, max).
      rows: int [M] or a scalar, the batches' row counts (the token cost of a length per batch).
      candidates: ascending ints, the lengths allowed (`bucket_lengths`); the last >= every batch length.
      count: int >= 1.
      program_tokens: float >= 0, the padded tokens one more length (one more compiled program) must
        save to be chosen: its compile time in units of one token's training time. 0: only `count` limits.

    Returns:
      ascending tuple of at most `count` candidates, the last the smallest candidate >= every batch's
      length; () for no batches.

    Raises:
      ValueError: count < 1, program_tokens < 0, or a batch longer than every candidate.
    """
    if count < 1:
        raise ValueError(f"max_length_buckets={count}: need >= 1")
    if program_tokens < 0:
        raise ValueError(f"bucket_program_tokens={program_tokens}: need >= 0")
    batch_lengths = np.asarray(batch_lengths)
    if not batch_lengths.size:
        return ()
    used = np.unique(bucket_of(batch_lengths, candidates))  # a best choice uses only lengths some batch needs
    weight = np.zeros(len(used))
    np.add.at(weight, np.searchsorted(used, bucket_of(batch_lengths, candidates)),
              np.broadcast_to(np.asarray(rows, np.float64), batch_lengths.shape))
    below = np.concatenate([[0.0], np.cumsum(weight)])  # below[j]: rows of batches needing used[< j]
    k = len(used)
    # cost[c, j]: least tokens of the batches needing used[<= j] with c + 1 lengths, the largest used[j]
    cost = np.full((min(count, k), k), np.inf)
    back = np.zeros(cost.shape, np.int64)
    cost[0] = used * below[1:]
    for c in range(1, len(cost)):
        for j in range(c, k):
            options = cost[c - 1, :j] + used[j] * (below[j + 1] - below[1:j + 1])
            back[c, j] = int(np.argmin(options))
            cost[c, j] = options[back[c, j]]
    c = int(np.argmin(cost[:, -1] + program_tokens * np.arange(1, len(cost) + 1)))
    chosen, j = [], k - 1
    while c >= 0:
        chosen.append(int(used[j]))
        j, c = back[c, j], c - 1
    return tuple(sorted(chosen))


def sequence_lengths(attention_mask: np.ndarray) -> np.ndarray:
    """int64 [N]: per example 1 + the position of its last attended token (0 when it has none), the
    longest of its sequences for [N, ..., L] masks (SWAG's [N, 4, L]: the longest choice). Cutting the
    sequence axis there drops padding only, even for a mask with holes."""
    mask = np.asarray(attention_mask) != 0
    full = mask.shape[-1]
    last = np.where(mask.any(-1), full - np.argmax(mask[..., ::-1], axis=-1), 0)
    return last.reshape(len(mask), -1).max(axis=1)


def bucket_of(lengths: np.ndarray, buckets: tuple[int, ...]) -> np.ndarray:
    """int [...]: the smallest bucket >= each length.

    Raises:
      ValueError: a length over the largest bucket.
    """
    lengths = np.asarray(lengths)
    if lengths.size and lengths.max() > buckets[-1]:
        raise ValueError(f"sequence of {lengths.max()} tokens is longer than the largest length bucket {buckets[-1]}")
    return np.asarray(buckets)[np.searchsorted(buckets, lengths, side="left")]


@dataclasses.dataclass(frozen=True)
class Padding:
    """How `fit` and `predict` pad each batch along the sequence axis (the inputs' last axis, L).

    Attributes:
      buckets: ascending lengths (`bucket_lengths`). Empty (the default): fixed padding, every batch at
        the arrays' full length L, exactly the batches of a job without dynamic padding. Otherwise each
        batch is cut to the smallest bucket >= its longest sequence (`sequence_lengths` of the global
        batch, so every process cuts alike; L itself is always a bucket, buckets over L are ignored):
        a step function compiles at most one program per bucket. Attention masks make the cut padding
        inert: per-example outputs equal the full-length ones (float rounding aside).
      group_by_length: (with buckets) training batches come from length-sorted chunks of `group_size`
        batches of each epoch's seeded permutation (transformers' `group_by_length` /
        LengthGroupedSampler), then the batch order is shuffled with the same seed; sequences of a batch
        have similar lengths, so little padding is left. Without it, training batches are the fixed
        mode's rows, only cut. `predict` sorts by length whenever buckets are set and returns the
        outputs in the arrays' order.
      group_size: batches per sorted chunk (transformers' mega-batch multiplier, 50).
      max_buckets: 0, or at most this many bucket lengths, placed on the training batches by `placed`
        (`placed_buckets`: the fewest padded tokens for that many compiled programs).
      program_tokens: (with max_buckets) the padded tokens one more bucket must save to be placed (its
        program's compile time over one token's training time), so short runs build fewer programs.
    """

    buckets: tuple[int, ...] = ()
    group_by_length: bool = False
    group_size: int = GROUP_SIZE
    max_buckets: int = 0
    program_tokens: float = 0.0

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "Padding":
        """config.length_buckets (int spacing in tokens, 0 = fixed; `bucket_lengths`),
        config.max_length_buckets (int, 0 = every multiple of the spacing; else at most that many, placed
        by `placed` on the training set), config.bucket_program_tokens (float, `placed_buckets`'
        program_tokens) and config.group_by_length (bool) over config.max_seq_length; fixed for a config
        without them (SQuAD).

        Raises:
          ValueError: a negative length_buckets, max_length_buckets or bucket_program_tokens.
        """
        buckets = bucket_lengths(config.max_seq_length, config.get("length_buckets", 0))
        max_buckets = config.get("max_length_buckets", 0)
        if max_buckets < 0:
            raise ValueError(f"max_length_buckets={max_buckets}: need >= 0 (0: every multiple of length_buckets)")
        program_tokens = float(config.get("bucket_program_tokens", 0.0))
        if program_tokens < 0:
            raise ValueError(f"bucket_program_tokens={program_tokens}: need >= 0")
        return cls(buckets, bool(config.get("group_by_length", False)) and bool(buckets),
                   max_buckets=max_buckets if buckets else 0, program_tokens=program_tokens if buckets else 0.0)

    def placed(self, arrays: Mapping[str, np.ndarray], batch_size: int, seed: int, num_steps: int) -> "Padding":
        """With max_buckets, the padding whose buckets are at most max_buckets of these, placed on the
        batches `fit(arrays, batch_size=..., seed=..., num_train_steps=num_steps)` draws (`placed_buckets`:
        the fewest padded tokens over those steps); self otherwise. The largest bucket is the smallest
        one holding the longest training batch; longer batches (in `predict`) take the arrays' full length.
        With no training step (num_steps 0), the buckets are placed on the arrays' prediction batches
        (longest first, as `predict` runs them).
        """
        if not self.max_buckets or not self.buckets:
            return self
        lengths = sequence_lengths(arrays["attention_mask"])
        maxima, epoch = [], 0
        while len(maxima) < num_steps:
            rows = _batch_rows(len(lengths), batch_size, seed + epoch, True, self, lengths)
            if not rows:
                break
            maxima.extend(int(lengths[r].max()) for r in rows[:num_steps - len(maxima)])
            epoch += 1
        if not maxima:
            maxima = [int(lengths[r].max()) for r in _batch_rows(len(lengths), batch_size, None, False, self, lengths)]
        candidates = tuple(b for b in self.buckets if b < arrays["attention_mask"].shape[-1]) + (
            arrays["attention_mask"].shape[-1],)
        placed = placed_buckets(np.asarray(maxima, np.int64), batch_size, candidates, self.max_buckets,
                                self.program_tokens)
        return dataclasses.replace(self, buckets=placed or self.buckets)


FIXED = Padding()


def _batch_rows(n: int, global_batch_size: int, seed: int | None, drop_remainder: bool, padding: Padding,
                lengths: np.ndarray | None) -> list[np.ndarray]:
    """The global batches' row indices (each <= global_batch_size rows) in the order they run."""
    rng = None if seed is None else np.random.default_rng(seed)
    if rng is None:  # prediction: the arrays' order, or longest first (outputs put back by `predict`)
        order = np.arange(n) if lengths is None else np.argsort(-lengths, kind="stable")
    else:
        order = rng.permutation(n)
    if rng is None or lengths is None or not padding.group_by_length:
        batches = [order[start:start + global_batch_size] for start in range(0, n, global_batch_size)]
        if drop_remainder and batches and len(batches[-1]) < global_batch_size:
            batches.pop()
        return batches
    if drop_remainder:  # the same rows as the fixed mode drops
        order = order[:n - n % global_batch_size]
    chunk = padding.group_size * global_batch_size
    grouped = np.concatenate([c[np.argsort(-lengths[c], kind="stable")]
                              for c in np.split(order, range(chunk, len(order), chunk))]) if len(order) else order
    batches = [grouped[start:start + global_batch_size] for start in range(0, len(grouped), global_batch_size)]
    full = [b for b in batches if len(b) == global_batch_size]
    return [full[i] for i in rng.permutation(len(full))] + [b for b in batches if len(b) < global_batch_size]


def local_batches(arrays: Mapping[str, np.ndarray], global_batch_size: int, *, seed: int | None,
                  drop_remainder: bool, padding: Padding = FIXED
                  ) -> Iterator[tuple[dict[str, np.ndarray], int, np.ndarray]]:
    """This process's rows of each global batch -> (arrays, number of real rows in the global batch,
    int [real] the global batch's real rows as indices into `arrays`).

    `arrays` maps names to numpy arrays with a common leading axis N (e.g. int32 [N, L] inputs, int32
    [N] labels); each yielded dict has the same keys and dtypes, with leading axis
    global_batch_size // process_count.

    With seed None the order is the arrays' order (with `padding.buckets`: longest first); otherwise one
    permutation per seed (the same on every process; `padding.group_by_length` groups it by length).
    Without drop_remainder the last batch is padded with copies of its first row. With
    `padding.buckets`, every array whose leading dimensions are attention_mask's ([N, L], [N, 4, L],
    [N, L, k]: inputs, NER's per-token labels and weights) is cut to the batch's bucket length along
    attention_mask's last axis; others ([N] labels) are taken whole.

    Raises (on the first `next`, as a generator):
      ValueError: global_batch_size not divisible by the process count; buckets without an
        attention_mask array.
    """
    if global_batch_size % jax.process_count():
        raise ValueError(f"batch size {global_batch_size} is not divisible by {jax.process_count()} processes")
    n = len(next(iter(arrays.values())))
    lengths, buckets, shape = None, (), None
    if padding.buckets:
        if "attention_mask" not in arrays:
            raise ValueError("dynamic padding (length buckets) needs the attention_mask array")
        shape = arrays["attention_mask"].shape
        buckets = tuple(b for b in padding.buckets if b < shape[-1]) + (shape[-1],)
        lengths = sequence_lengths(arrays["attention_mask"])
    local = global_batch_size // jax.process_count()
    lo = jax.process_index() * local
    for rows in _batch_rows(n, global_batch_size, seed, drop_remainder, padding, lengths):
        real = len(rows)
        padded = rows if real == global_batch_size else np.concatenate([rows, np.full(global_batch_size - real,
                                                                                      rows[0])])
        mine = padded[lo:lo + local]
        if lengths is None:
            yield {k: v[mine] for k, v in arrays.items()}, real, rows
            continue
        cut = int(bucket_of(lengths[rows].max(), buckets))
        yield ({k: v[mine][..., :cut] if v.shape[:len(shape)] == shape and cut < shape[-1] else v[mine]
                for k, v in arrays.items()}, real, rows)
