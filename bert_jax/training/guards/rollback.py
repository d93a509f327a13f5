"""Rolling back instead of dying: what a pre-training run does with a non-finite step or a loss spike.

A step is bad when its loss or gradient norm is not finite, or (after `warmup_steps` steps of a phase) when its
loss exceeds the running mean by more than `spike_sigmas` running standard deviations. With rollback on
(`config.rollback.enabled`), the run restores its newest checkpoint (always one from before the bad step: a
checkpoint is saved only after every step before it was checked), skips the batches drawn since that checkpoint,
the bad one included (the input position moves on; nothing is read twice), and continues. That is PaLM's recipe
for spikes (Chowdhery et al. 2022, section 5.1: restart about 100 steps before the spike and skip 200-500
batches), with the run's own checkpoints: `config.checkpoint_every` bounds how far back a rollback reaches and
how many batches it skips. After `max_rollbacks` rollbacks within `window_steps` steps the run stops with one
line, as it does for every bad step with rollback off (a learning rate that diverges again and again is no spike).

The running statistics are exponential moving averages of the loss (weight `1 - ema_decay` for each new step);
a spike does not enter them. They restart with each phase (another length, another loss level), are saved in
every checkpoint and restored with it, so a run with rollbacks that is killed and restarted from a checkpoint
repeats the same decisions and ends bit-identical to the same run uninterrupted.

Each rollback is one console line and a record `rollback/*` in metrics.jsonl and TensorBoard at the bad step:
`to_step` (the checkpoint it went back to), `skipped_batches`, and the step's `loss` and `grad_norm` where finite.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Mapping

import jax
import tqdm

from bert_jax.checkpoints import checkpointing
from bert_jax.training import loop, summaries


@dataclasses.dataclass(frozen=True)
class Settings:
    """config.rollback's fields.

    Attributes:
      enabled: roll back on a bad step; False: stop there (one line), as before.
      spike_sigmas: a loss above mean + spike_sigmas * std (running) is a spike; 0: spikes are not detected.
      warmup_steps: steps of a phase before spikes are looked for (the statistics settle first).
      ema_decay: the running statistics' decay per step, in (0, 1).
      max_rollbacks: rollbacks allowed within window_steps steps; one more stops the run.
      window_steps: the window of max_rollbacks, in steps.
    """

    enabled: bool
    spike_sigmas: float
    warmup_steps: int
    ema_decay: float
    max_rollbacks: int
    window_steps: int

    @classmethod
    def from_config(cls, rollback: Mapping[str, Any]) -> "Settings":
        """Settings from config.rollback (a ConfigDict or mapping of these fields).

        Raises:
          ValueError: one line naming the field and its bound.
          KeyError: a field missing from config.rollback.
        """
        s = cls(**{f.name: rollback[f.name] for f in dataclasses.fields(cls)})
        checks = [("spike_sigmas", s.spike_sigmas >= 0, ">= 0"), ("warmup_steps", s.warmup_steps >= 0, ">= 0"),
                  ("ema_decay", 0 < s.ema_decay < 1, "in (0, 1)"), ("max_rollbacks", s.max_rollbacks >= 0, ">= 0"),
                  ("window_steps", s.window_steps >= 1, ">= 1")]
        for name, ok, bound in checks:
            if not ok:
                raise ValueError(f"config.rollback.{name}={getattr(s, name)!r} must be {bound}")
        return s


class Guard:
    """The bad-step test, its running statistics and the record of rollbacks (module docstring).

    `verdict(step, loss, grad_norm)` -> None for a good step (its loss enters the statistics), else the reason
    ("non-finite loss nan (gradient norm nan)", "loss spike 9.81 (running mean 6.52, std 0.11)"). `state()` and
    `load()` carry the statistics and the rollback steps through checkpoints.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.mean, self.var, self.count = 0.0, 0.0, 0
        self.rollbacks: list[int] = []  # the bad steps that were rolled back
        self.last = (math.nan, math.nan)  # the loss and gradient norm of the last step tested

    def restart(self) -> None:
        """A new phase: the statistics start again (warm-up included)."""
        self.mean, self.var, self.count = 0.0, 0.0, 0

    def verdict(self, step: int, loss: float, grad_norm: float) -> str | None:
        self.last = (loss, grad_norm)
        if (bad := loop.non_finite(loss, grad_norm)) is not None:
            return bad
        s = self.settings
        std = math.sqrt(self.var)
        if s.spike_sigmas > 0 and self.count >= s.warmup_steps and loss > self.mean + s.spike_sigmas * std:
            return f"loss spike {loss:.4g} (running mean {self.mean:.4g}, std {std:.3g})"
        if self.count == 0:
            self.mean, self.var = loss, 0.0
        else:  # West's exponentially weighted mean and variance
            delta = loss - self.mean
            self.mean += (1 - s.ema_decay) * delta
            self.var = s.ema_decay * (self.var + (1 - s.ema_decay) * delta * delta)
        self.count += 1
        return None

    def allow(self, step: int) -> bool:
        """Whether a rollback at bad step `step` is within max_rollbacks per window_steps (counting this one);
        records it when so."""
        recent = [s for s in self.rollbacks if s > step - self.settings.window_steps]
        if len(recent) >= self.settings.max_rollbacks:
            return False
        self.rollbacks.append(step)
        return True

    def state(self) -> dict:
        """JSON of the statistics and the rollback record, for a checkpoint."""
        return {"mean": self.mean, "var": self.var, "count": self.count, "rollbacks": list(self.rollbacks)}

    def load(self, state: Mapping[str, Any] | None, statistics_only: bool = False) -> None:
        """Restores `state()` (None: a checkpoint from before rollbacks existed: fresh statistics). With
        statistics_only the rollback record kept in memory stays (a rollback restores the statistics of the
        checkpoint it goes back to, and adds itself to the record)."""
        state = state or {}
        self.mean, self.var, self.count = float(state.get("mean", 0.0)), float(state.get("var", 0.0)), \
            int(state.get("count", 0))
        if not statistics_only:
            self.rollbacks = [int(s) for s in state.get("rollbacks", [])]


class Rollbacks:
    """A pre-training run's `loop.Runner` rollback: `__call__(bad step, verdict)` restores the newest checkpoint
    of `checkpointer` onto `abstract` (shardings included) and returns (its step, its state), after one console
    line and a `rollback/*` record in `writer` (metrics.jsonl, TensorBoard); or raises FloatingPointError (one
    line) where no checkpoint exists yet or max_rollbacks within window_steps are spent.

    The run tells it what it draws and saves: `drew()` per batch drawn, `saving(step)` -> the JSON to store in
    checkpoint `step` (the guard's state), `resumed(step, data)` after restoring checkpoint `step` at start.
    """

    def __init__(self, settings: Settings, checkpointer: checkpointing.Checkpointer, abstract: Any, writer,
                 checkpoint_every: int):
        self.guard = Guard(settings)
        self.checkpointer, self.abstract, self.writer = checkpointer, abstract, writer
        self.checkpoint_every = checkpoint_every
        self.drawn = 0  # batches drawn by this process since it started
        self._drawn_at: dict[int, int] = {}  # checkpoint step -> batches drawn when the state was at it

    def drew(self) -> None:
        self.drawn += 1

    def saving(self, step: int) -> dict:
        self._drawn_at[step] = self.drawn
        return self.guard.state()

    def resumed(self, step: int | None, data: Mapping[str, Any] | None) -> None:
        self.guard.load((data or {}).get("rollback"))
        if step is not None:
            self._drawn_at[step] = self.drawn

    def __call__(self, step: int, verdict: str) -> tuple[int, Any]:
        self.checkpointer.wait()
        back = self.checkpointer.latest_step()
        if back is None:
            raise FloatingPointError(f"{verdict} at step {step}; no checkpoint to roll back to yet (the first is due "
                                     f"at step {self.checkpoint_every}: config.checkpoint_every)")
        settings = self.guard.settings
        if not self.guard.allow(step):
            raise FloatingPointError(
                f"{verdict} at step {step}, after {settings.max_rollbacks} rollbacks within {settings.window_steps} "
                f"steps (config.rollback.max_rollbacks, window_steps); the last checkpoint is kept")
        state, data = self.checkpointer.restore(back, checkpointing.abstract_like(*self.abstract))
        self.guard.load(data.get("rollback"), statistics_only=True)
        skipped = self.drawn - self._drawn_at.get(back, self.drawn)
        self._drawn_at[back] = self.drawn
        if jax.process_index() == 0:  # above the progress bar
            tqdm.tqdm.write(f"train: {verdict} at step {step}: rolled back to the checkpoint at step {back}, skipping "
                            f"the {skipped} batches drawn since it", file=sys.stderr)
        record = {"to_step": float(back), "skipped_batches": float(skipped)}
        record.update((k, v) for k, v in zip(("loss", "grad_norm"), self.guard.last) if math.isfinite(v))
        summaries.write_scalars(self.writer, step, record, "rollback")
        return back, state
