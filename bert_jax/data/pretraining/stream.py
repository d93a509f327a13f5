"""The global order of a packed or dynamic input stream, how processes and grain workers split it, and
where it continues on another process count.

A packed or dynamic pre-training input (`bert_jax.data.pretraining.loader`) reads a global sequence of units
(instances of a static directory, or (epoch, document) pairs of tokenized documents): unit i of the
shuffled, repeated stream (`base[i]`, a grain MapDataset). Process p of P reads positions p, p + P,
p + 2P, ... of that sequence and checkpoints grain's iterator state, which resumes bit-identically on the
same P only (the packer's and the shuffle window's buffers are per process).

To continue on another process count, a run's stream is `Stream(pending, start)`: the global indices
`pending` (in order), then every index from `start` on. A fresh run's stream is Stream((), 0).
`Stream.after(states)` takes every old process's iterator state, finds in each the position of its slice
from which grain would replay it (the innermost reader's position: the shuffle window's or the packing
window's start), and returns the stream of the units no process has finished: nothing is dropped, and
the units read into an old process's open shuffle window and packing window are drawn again (some of
their instances twice). The new processes split that stream as before ([p::P']).

Within a process, `in_workers` computes a stream's map stages in grain worker processes, each a slice of
the elements, read round-robin: the same elements in the same order for every worker count.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import grain
from absl import flags as absl_flags

# A stream's record in an iterator state: {"pending": [int, ...], "start": int}.
STATE_KEY = "stream"


class _Positions(Sequence):
    """Stream position j -> global index: pending[j], then start + j - len(pending); `total` indices in all."""

    def __init__(self, pending: Sequence[int], start: int, total: int):
        self._pending, self._start = list(pending), start
        self._len = len(self._pending) + max(0, total - start)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, j: int) -> int:
        if not 0 <= j < self._len:
            raise IndexError(j)
        return self._pending[j] if j < len(self._pending) else self._start + j - len(self._pending)


class _Lookup(grain.transforms.Map):
    """Global index i -> base[i], or (i, base[i]) with_index."""

    def __init__(self, base: grain.MapDataset, with_index: bool):
        self._base, self._with_index = base, with_index

    def map(self, i: int):
        return (i, self._base[i]) if self._with_index else self._base[i]


@dataclasses.dataclass(frozen=True)
class Stream:
    """The global indices a run reads, in order: `pending`, then start, start + 1, ...

    Attributes:
      pending: global indices (each < start, distinct) left over from a run on another process count.
      start: the first index of the open-ended rest.
    """

    pending: tuple[int, ...] = ()
    start: int = 0

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> "Stream":
        """The stream an iterator state (`pipeline` get_state) was read from; Stream() for states without one.

        Raises:
          ValueError: a malformed stream record.
        """
        record = (state or {}).get(STATE_KEY) or {}
        pending, start = record.get("pending", []), record.get("start", 0)
        if (not isinstance(start, int) or start < 0 or not isinstance(pending, list)
                or not all(isinstance(i, int) and 0 <= i < start for i in pending)):
            raise ValueError(f"iterator state has a malformed {STATE_KEY} record: {record!r}")
        return cls(tuple(pending), start)

    def to_state(self) -> dict[str, Any]:
        """The JSON record `from_state` reads."""
        return {"pending": list(self.pending), "start": self.start}

    def units(self, base: grain.MapDataset, *, with_index: bool = False) -> grain.MapDataset:
        """The stream over `base` (random access by global index): base[i] (or (i, base[i])) for each index
        i of the stream, in order; as long as base has indices left."""
        return grain.MapDataset.source(_Positions(self.pending, self.start, len(base))).map(_Lookup(base, with_index))

    def index(self, position: int) -> int:
        """The global index at stream position `position`."""
        n = len(self.pending)
        return self.pending[position] if position < n else self.start + position - n

    def after(self, states: Sequence[dict[str, Any]]) -> "Stream":
        """The stream that continues this one after a run whose processes (len(states) of them, in process
        order) stopped at grain iterator states `states` (each a `pipeline` state's "grain" record).

        Raises:
          ValueError: a state whose reader position cannot be found (module docstring).
        """
        count = len(states)
        if count < 1:
            raise ValueError("no iterator states to continue from")
        # Process p has finished its slice's positions [0, r_p): stream positions p + k * count, k < r_p.
        first_open = [p + source_position(s) * count for p, s in enumerate(states)]
        low, high = min(first_open), max(first_open)
        open_positions = [j for j in range(low, high) if j >= first_open[j % count]]
        rest = high - len(self.pending)
        pending = [self.index(j) for j in open_positions]
        if rest < 0:
            pending += list(self.pending[high:])
        return Stream(tuple(pending), self.start + max(0, rest))

    def remaining_in_epoch(self, epoch_size: int) -> tuple[int, int]:
        """(epoch, units of that epoch still to read) at the stream's first index, for a log line."""
        first = self.pending[0] if self.pending else self.start
        epoch = first // epoch_size
        end = (epoch + 1) * epoch_size
        left = sum(1 for i in self.pending if epoch * epoch_size <= i < end) + max(0, end - max(self.start, epoch * epoch_size))
        return epoch, left


def in_workers(ds: grain.IterDataset, worker_count: int) -> grain.IterDataset:
    """`ds` computed in `worker_count` grain worker processes (`mp_prefetch`; each a slice of the map
    stages before `to_iter_dataset`, read round-robin), or as is for 0."""
    if not worker_count:
        return ds
    # grain 0.2.18 reads an absl flag when starting workers and fails if flags were never parsed
    # (scripts and tests without absl.app; google/grain#1355, fixed upstream by #1362).
    if not absl_flags.FLAGS.is_parsed():
        absl_flags.FLAGS.mark_as_parsed()
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))


def source_position(state: Any) -> int:
    """The number of units of its slice that a grain iterator state (of `pipeline`'s packed or dynamic
    iterators) has finished: the position of its innermost reader, which a restore replays from. Through
    the packer's and the window shuffle's window-start states, the flat map's parent state, and grain
    workers (read round-robin: the sum of their positions).

    Raises:
      ValueError: a state of another shape.
    """
    while isinstance(state, dict):
        if set(state) == {"next_index"} and isinstance(state["next_index"], int):
            return state["next_index"]
        if isinstance(state.get("iterators_in_use_states"), list):  # mp_prefetch: workers read round-robin
            return sum(source_position(s) for s in state["iterators_in_use_states"])
        state = state.get("parent_window_start_state", state.get("parent"))
    raise ValueError("iterator state: no reader position found in grain's state (resume on the process count "
                     "it was saved with)")
