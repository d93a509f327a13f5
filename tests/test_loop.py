"""The one training loop (`bert_jax.training.loop.Runner`): the order of its periodic actions and its non-finite
check, on a host-side step function (no compilation)."""

import math

import pytest

from bert_jax.training import loop


def _step(losses):
    """A step function whose state is the step count and whose loss at step s is losses[s]."""
    def step(state, batch):
        return state + 1, {"loss": losses[state], "grad_norm": 1.0, "learning_rate": 0.1}
    return step


def _run(losses, final_step, start=0, **kwargs):
    events = []
    runner = loop.Runner(
        start, final_step, desc="test", log_every=kwargs.pop("log_every", 2),
        log=lambda step, values, lap: events.append(("log", step, values["loss"])) or {},
        eval_every=3, evaluate=lambda step, state: events.append(("eval", step, state)),
        checkpoint_every=4, save=lambda step, state: events.append(("save", step, state)), **kwargs)
    step = _step(losses)
    batches = ((step, None) for _ in iter(int, 1))
    try:
        return runner.run(start, batches), events, runner
    finally:
        runner.close()


def test_actions_at_their_steps_and_at_the_end():
    state, events, runner = _run([1.0] * 10, final_step=6)
    assert state == runner.step == 6
    assert events == [("log", 2, 1.0), ("eval", 3, 3), ("log", 4, 1.0), ("save", 4, 4),
                      ("log", 6, 1.0), ("eval", 6, 6), ("save", 6, 6)]


def test_checkpoint_once_per_step_and_not_the_restored_one():
    """A phase switch's checkpoint (the batches call `checkpoint` first) at the restored step or at a
    step just saved is not written again."""
    saves = []
    runner = loop.Runner(4, 8, desc="test", log_every=100, log=lambda *a: {}, checkpoint_every=2,
                         save=lambda step, state: saves.append(step), checkpointed=4)

    def batches():
        while True:
            runner.checkpoint()
            yield _step([1.0] * 10), None

    assert runner.run(4, batches()) == 8
    runner.close()
    assert saves == [5, 6, 7, 8]  # each once: not 4 (restored), not 6 or 8 again at the next draw
    runner = loop.Runner(4, 4, desc="test", log_every=1, log=lambda *a: {}, save=lambda *a: saves.append(a))
    assert runner.run(4, batches()) == 4 and saves == [5, 6, 7, 8]  # nothing left to do: no step, no action


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_loss_is_caught_one_step_late_before_any_action(bad):
    """The bad step 4 (state 4 -> 5; no action due after it) is named when step 5 has been dispatched,
    before step 5's evaluation or checkpoint."""
    losses = [1.0] * 4 + [bad] + [1.0] * 5
    with pytest.raises(FloatingPointError, match=r"at step 4; the last checkpoint is kept$"):
        _run(losses, final_step=10, log_every=100)


def test_non_finite_grad_norm_and_no_checkpoint_message_without_save():
    def step(state, batch):
        return state + 1, {"loss": 1.0, "grad_norm": math.nan if state == 2 else 1.0}

    runner = loop.Runner(0, 5, desc="test", log_every=100, log=lambda *a: {})
    with pytest.raises(FloatingPointError, match=r"^non-finite loss 1.0 \(gradient norm nan\) at step 2$"):
        runner.run(0, ((step, None) for _ in range(5)))
    runner.close()


def test_last_step_checked_when_batches_run_out():
    """A run whose batches end before final_step still checks its last step."""
    runner = loop.Runner(0, 10, desc="test", log_every=100, log=lambda *a: {})
    with pytest.raises(FloatingPointError, match="at step 2"):
        runner.run(0, ((_step([1.0, 1.0, math.nan]), None) for _ in range(3)))
    runner.close()


def test_preemption_checkpoints_and_stops():
    state, events, runner = _run([1.0] * 10, final_step=10, preempted=lambda step: step == 5)
    assert state == 5 and runner.stopped_by_preemption
    assert events[-1] == ("save", 5, 5)


def test_progress_bar_shows_the_mfu_the_job_logged():
    """Pre-training's `log` adds the window's MFU to the values where the device's peak is known: the bar shows
    it as a percentage after the job's own postfix; without one (a CPU, fine-tuning) nothing is added."""
    def log(step, values, lap):
        values["mfu"] = 0.4132
        return {"loss": f"{values['loss']:.3f}"}

    runner = loop.Runner(0, 4, desc="test", log_every=2, log=log)
    runner.run(0, ((_step([1.0] * 5), None) for _ in range(4)))
    runner.close()
    assert runner.progress.postfix == "loss=1.000, mfu=41.3%"
    assert loop.with_mfu({"loss": "1.0"}, {"loss": 1.0}) == {"loss": "1.0"}
    assert loop.with_mfu({"mfu": "own"}, {"mfu": 0.5}) == {"mfu": "own"}
