"""The training loop of every job (pre-training and each fine-tuning task): steps with periodic actions.

`Runner.run(state, batches)` takes (jitted step, global batch) pairs until `final_step` and, after each
step, does what is due at it, in this order:

  check       each step's loss and gradient norm, one step late (the next step is dispatched first, so
              the device never waits on the host; at most one step in flight), and before any log,
              evaluation or checkpoint: a bad step (a non-finite value; with a `rollback.Guard`, also a loss
              spike) raises `FloatingPointError` naming the step (the step index s the state had when it
              started, whose dropout key is fold_in(rng, s)), or, given `rollback`, is handed to it: the run
              goes on from the state and step it returns (the step in flight, computed from the bad state,
              is dropped), and the actions of that step are not done.
  log         every `log_every` steps and at the last: the step's metrics as floats and the `steps.Lap`
              of the window since the last log, handed to the job's `log`.
  evaluate    every `eval_every` steps and at the last (when the job has one), out of the timed window.
  checkpoint  every `checkpoint_every` steps, at the last and on preemption (when the job has one), once
              per step, out of the timed window; a preempted run stops after it.
  progress    a progress bar on the first process, with the postfix `log` returns, and the model FLOPs
              utilisation where the job's `log` put one in the values ("mfu": pre-training, on a device whose
              peak it knows), as a percentage.

The window's timer (`steps.Chrono`) restarts after a step that compiled (the first of the run, or of a
phase: `recompiling()`), unless that step is logged.
"""

from __future__ import annotations

import math
import signal
import sys
from typing import Any, Callable, Iterable, Mapping

import jax

from bert_jax.training import steps, summaries

Metrics = Mapping[str, jax.Array]


class Preemption:
    """SIGTERM -> `requested`, a flag checked at step boundaries, in a single-process run (a context
    manager: the handler is installed on entry and the previous one put back on exit).

    With several processes the handler is left to JAX: `jax.distributed.initialize` installs the
    preemption notifier that Orbax's `reached_preemption` consults, and a Python handler would replace it.
    """

    def __init__(self):
        self.requested = False
        self._previous = None
        self._installed = False

    def __enter__(self) -> "Preemption":
        if jax.process_count() == 1:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)


def non_finite(loss: float, grad_norm: float) -> str | None:
    """'non-finite loss <loss> (gradient norm <grad_norm>)' when either is not finite, else None: the verdict on a
    step's loss and gradient norm without running statistics."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return None
    return f"non-finite loss {loss} (gradient norm {grad_norm})"


def bad_step(step: int, verdict: str, checkpointed: bool) -> FloatingPointError:
    """The one-line error of a bad step that stops the run: '<verdict> at step <step>[; the last checkpoint is
    kept]'."""
    return FloatingPointError(f"{verdict} at step {step}{'; the last checkpoint is kept' if checkpointed else ''}")


def with_mfu(postfix: Mapping[str, str], values: Mapping[str, float]) -> dict[str, str]:
    """The progress bar's postfix with values["mfu"] (a fraction of the peak) as a percentage, where there is
    one and the job's postfix has none."""
    postfix = dict(postfix)
    if values.get("mfu") is not None and "mfu" not in postfix:
        postfix["mfu"] = f"{100 * values['mfu']:.1f}%"
    return postfix


class Runner:
    """Runs steps `step` + 1 ... `final_step` (counted as the state's step after each) with the periodic
    actions of the module docstring.

    Args:
      step: the step the run starts at (the restored state's step, 0 when fresh).
      final_step: the step to stop at.
      desc: the progress bar's label.
      log_every: >= 1.
      log: (step, {name: float} of the step's metrics, Lap of the window) -> the progress bar's postfix
        ({name: str}); the job writes its summaries here, and may add the window's throughput to the values
        (a float "mfu" is then shown too, e.g. "mfu=41.3%").
      evaluate: (step, state) -> None, every eval_every (>= 1) steps and at the last; None: never.
      save: (step, state) -> None, every checkpoint_every (>= 1) steps, at the last and on preemption;
        None: never. `checkpointed`: a step whose checkpoint exists (a resumed run's), not saved again.
      preempted: step -> whether to checkpoint and stop now (every process must agree); None: never.
      guard: the bad-step test with running statistics (`bert_jax.training.guards.rollback.Guard`); None: non-finite
        values only.
      rollback: (bad step, verdict) -> (step, state) to go on from (`check`); None: a bad step stops the run.

    Attributes:
      step: the steps taken so far (the state's step).
      state: the current state (after `run`, the final one).
      stopped_by_preemption: `run` stopped at a preemption checkpoint.
    """

    def __init__(self, step: int, final_step: int, *, desc: str, log_every: int,
                 log: Callable[[int, dict[str, float], steps.Lap], Mapping[str, str]],
                 eval_every: int = 0, evaluate: Callable[[int, Any], None] | None = None,
                 checkpoint_every: int = 0, save: Callable[[int, Any], None] | None = None,
                 checkpointed: int | None = None, preempted: Callable[[int], bool] | None = None,
                 guard: Any = None, rollback: Callable[[int, str], tuple[int, Any]] | None = None):
        self.step, self.final_step = step, final_step
        self.guard, self.rollback = guard, rollback
        self.log_every, self.log = log_every, log
        self.eval_every, self.evaluate = eval_every, evaluate
        self.checkpoint_every, self.save = checkpoint_every, save
        self.preempted = preempted
        self.saved = {checkpointed}
        self.state = None
        self.stopped_by_preemption = False
        self.timer = steps.Chrono()
        self.progress = summaries.progress_bar(step, final_step, jax.process_index() == 0, desc)
        self._compiling_step = step + 1
        self._pending: tuple[int, Metrics] | None = None  # the last step's metrics, not yet checked

    def due(self, every: int) -> bool:
        """Whether an action every `every` steps is due now (always at the final step)."""
        return self.step == self.final_step or self.step % every == 0

    def recompiling(self) -> None:
        """The next step compiles (new batch shapes): its time is left out of the throughput."""
        self._compiling_step = self.step + 1

    def run(self, state: Any, batches: Iterable[tuple[Callable, Any]]) -> Any:
        """Steps through `batches` ((step function (state, batch) -> (state, metrics), global batch) pairs,
        drawn one per step; they may call `checkpoint` before yielding, e.g. at a phase switch) until
        final_step, a preemption checkpoint, or their end; every step's metrics checked. Returns the
        final state.

        Raises:
          FloatingPointError: a non-finite loss or gradient norm, naming the step, before anything
            (log, evaluation, checkpoint) happens to a state it produced.
        """
        self.state = state
        if self.step >= self.final_step:
            return state
        for step_fn, batch in batches:
            state, metrics = step_fn(self.state, batch)
            if self.check():  # the previous step's was bad: rolled back, the step in flight dropped
                continue
            self.state = state
            self._pending = (self.step, metrics)
            self.step += 1
            self.timer.tick()
            self.progress.update(1)
            if self.step == self._compiling_step and not self.due(self.log_every):
                self.timer.restart(wait_for=self.state)  # the step compiled: time from here
            if self._after_step():
                print(f"SIGTERM: checkpoint saved at step {self.step}, exiting", file=sys.stderr, flush=True)
                self.stopped_by_preemption = True
                break
            if self.step >= self.final_step:
                break
        self.check()
        return self.state

    def check(self, values: Mapping[str, float] | None = None) -> bool:
        """Checks the last step's metrics if not yet done (`values`: those metrics already on the host, else read
        here): a bad step (module docstring) raises FloatingPointError (`bad_step`) or is rolled back. Returns True
        when it was rolled back (`step` and `state` are the ones to go on from)."""
        if self._pending is None:
            return False
        (step, metrics), self._pending = self._pending, None
        if values is None:
            fetched = jax.device_get((metrics["loss"], metrics["grad_norm"]))
            values = {"loss": float(fetched[0]), "grad_norm": float(fetched[1])}
        loss, grad_norm = values["loss"], values["grad_norm"]
        verdict = self.guard.verdict(step, loss, grad_norm) if self.guard is not None else non_finite(loss, grad_norm)
        if verdict is None:
            return False
        if self.rollback is None:
            raise bad_step(step, verdict, self.save is not None)
        self.step, self.state = self.rollback(step, verdict)
        self.saved.add(self.step)  # the checkpoint it went back to
        self.progress.n = self.step
        self.progress.refresh()
        self.timer.restart(wait_for=self.state)
        return True

    def checkpoint(self) -> None:
        """Saves the current state (once per step) after checking every step so far, out of the timed window;
        nothing when the check rolled back."""
        if self.check() or self.save is None or self.step in self.saved:
            return
        with self.timer.paused(wait_for=self.state):
            self.save(self.step, self.state)
        self.saved.add(self.step)

    def _after_step(self) -> bool:
        """The actions due at this step, after checking it where one is; True when preempted (checkpointed:
        stop)."""
        preempted = self.preempted is not None and self.preempted(self.step)
        due = self.due(self.log_every) or (self.evaluate is not None and self.due(self.eval_every)) or \
            (self.save is not None and self.due(self.checkpoint_every))
        values = None  # a logged step's metrics, read from the device once for the check and the log
        if self.due(self.log_every) and self._pending is not None:
            values = {k: float(v) for k, v in jax.device_get(self._pending[1]).items()}
        if (due or preempted) and self.check(values):
            return False  # rolled back: this step's actions are not done
        if values is not None:
            self.progress.set_postfix(**with_mfu(self.log(self.step, values, self.timer.lap()), values))
        if self.evaluate is not None and self.due(self.eval_every):
            with self.timer.paused(wait_for=self.state):
                self.evaluate(self.step, self.state)
        if preempted or (self.save is not None and self.due(self.checkpoint_every)):
            self.checkpoint()
        return preempted

    def close(self) -> None:
        self.progress.close()
