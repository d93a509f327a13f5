"""A lost host noticed in bounded time: every process of a multi-host run watches the others' heartbeats.

When one process of a multi-host run dies (SIGKILL, a crashed host, a preempted VM), the others would block in
their next collective until JAX's coordination service gives up on it and aborts them with a fatal-error dump,
minutes later (or never, on some transports). `start(timeout_s, command)` runs a thread in each process that
writes this process's heartbeat to the coordination service's key-value store every `timeout_s / 5` seconds and
reads the others'. A process whose heartbeat has not changed for `timeout_s` seconds (by this process's clock) is
lost; so is the coordinator (process 0) when the store cannot be reached for that long. Every surviving process
then prints one line naming the lost process and exits with status `EXIT_LOST` (75, EX_TEMPFAIL: "try again"),
without waiting on the collective it may be blocked in: a pod manager restarts the whole run, which resumes from
the newest checkpoint (on the same process count, bit-identical to a run never interrupted).

A process that fails with an error marks itself failed before it exits (`exit_on_error`): the others stop with
one line saying so (status 1) instead of reporting it lost; the failing process itself, when its error may be the
symptom of a lost peer (a collective that failed), waits up to the timeout for a verdict on its peers first. A
process that finishes marks itself done (`stop`). JAX's own heartbeat timeout is set to `JAX_TIMEOUT_FACTOR`
times this one, so that its abort never comes first.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import NoReturn

EXIT_LOST = 75  # EX_TEMPFAIL: a peer was lost; restarting the run resumes it
JAX_TIMEOUT_FACTOR = 3
_KEY = "bert_jax/watchdog/{}"

_watchdog: "Watchdog | None" = None


class Watchdog:
    """The heartbeat thread of one process (module docstring). `client`: JAX's distributed runtime client (its
    key_value_set / key_value_try_get)."""

    def __init__(self, client, process_id: int, num_processes: int, timeout_s: float, command: str):
        self.client, self.process_id, self.num_processes = client, process_id, num_processes
        self.timeout_s, self.command = timeout_s, command
        self.interval = max(0.2, timeout_s / 5)
        self.state = "running"
        self._stop = threading.Event()
        self._seen: dict[int, tuple[str | None, float]] = {}  # process -> (its last heartbeat value, when it changed)
        self._reached = time.monotonic()  # the last time the store answered
        self._thread = threading.Thread(target=self._run, daemon=True, name="bert_jax-watchdog")

    def start(self) -> None:
        now = time.monotonic()
        self._seen = {i: (None, now) for i in range(self.num_processes) if i != self.process_id}
        self._beat(now)
        self._thread.start()

    def _beat(self, now: float) -> None:
        value = json.dumps({"beat": time.time(), "state": self.state})
        try:
            self.client.key_value_set(_KEY.format(self.process_id), value, allow_overwrite=True)
            self._reached = now
        except Exception:  # noqa: BLE001 (jax's runtime error): the store is on process 0
            if now - self._reached > self.timeout_s and self.process_id != 0:
                self._lost(0, now - self._reached, "the coordinator's key-value store does not answer")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            self._beat(now)
            for i, (last, since) in list(self._seen.items()):
                try:
                    value = self.client.key_value_try_get(_KEY.format(i))
                except Exception:  # noqa: BLE001 (not written yet, or the store is gone: both age)
                    value = last
                if value != last:
                    self._seen[i] = (value, now)
                    state = json.loads(value).get("state") if value else None
                    if state in ("done", "stopped") or (state == "failed" and self.state == "failed"):
                        del self._seen[i]  # no longer watched
                    elif state == "failed":
                        self.mark("stopped")
                        self._exit(f"{self.command}: process {i} of {self.num_processes} stopped with an error (its "
                                   f"log says which); stopping this one too", 1)
                elif now - since > self.timeout_s:
                    self._lost(i, now - since, "no heartbeat")

    def _lost(self, process: int, age: float, why: str) -> NoReturn:
        self._exit(f"{self.command}: lost process {process} of {self.num_processes} ({why} for {age:.0f} s, more "
                   f"than --process_timeout={self.timeout_s:g}): it crashed or its host is gone; stopping (status "
                   f"{EXIT_LOST}): restart the whole run to resume from the newest checkpoint", EXIT_LOST)

    @staticmethod
    def _exit(line: str, status: int) -> NoReturn:
        import tqdm

        for bar in list(getattr(tqdm.tqdm, "_instances", ())):  # the progress bar ends its line: ours is the last
            with contextlib.suppress(Exception):
                bar.close()
        print(line, file=sys.stderr, flush=True)
        os._exit(status)  # not sys.exit: no wait on a collective, nor on JAX's shutdown barrier with a lost peer

    def watched(self) -> int:
        """The peers still watched (neither done, stopped nor, when this process failed too, failed)."""
        return len(self._seen)

    def mark(self, state: str) -> None:
        """Publishes this process's state at once: "done" (finished), "failed" (an error), "stopped" (after a peer's
        error)."""
        self.state = state
        self._beat(time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)


def start(timeout_s: float, command: str) -> Watchdog | None:
    """Starts this process's watchdog where the run has several processes (after `jax.distributed.initialize`);
    None for one process.

    Raises:
      ValueError: timeout_s <= 0.
    """
    global _watchdog
    import jax
    from jax._src import distributed as jax_distributed

    if timeout_s <= 0:
        raise ValueError(f"--process_timeout={timeout_s} must be positive (seconds)")
    if jax.process_count() == 1:
        return None
    _watchdog = Watchdog(jax_distributed.global_state.client, jax.process_index(), jax.process_count(), timeout_s,
                         command)
    _watchdog.start()
    return _watchdog


def stop() -> None:
    """This process finished: marks it done (the others no longer watch it) and stops its watchdog."""
    global _watchdog
    if _watchdog is not None:
        _watchdog.mark("done")
        _watchdog.stop()
        _watchdog = None


def exit_on_error(message: str) -> None:
    """In a multi-host run, instead of raising the one-line error `message`: marks this process failed, waits up to
    the timeout for the watchdog to find a lost peer (whose line and status then win: the error was its symptom),
    else prints `message` and exits with status 1, skipping JAX's shutdown barrier, which would wait on peers that
    are still running. Returns only in a single-process run (the caller raises as usual)."""
    watchdog = _watchdog
    if watchdog is None:
        return
    watchdog.mark("failed")
    deadline = time.monotonic() + watchdog.timeout_s + 2 * watchdog.interval
    while watchdog.watched() and time.monotonic() < deadline:  # the watchdog exits the process if a peer is lost
        time.sleep(0.1)
    Watchdog._exit(message, 1)
