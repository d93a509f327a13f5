"""Multi-host start-up flags shared by the command-line entry points.

  define_flags()            --jax_distributed, --coordinator_address, --num_processes, --process_id, --process_timeout
  initialize_from_flags()   jax.distributed.initialize(...) when asked for, before any JAX computation, and the
                            lost-process watchdog (bert_jax.training.guards.watchdog)
  allgather_json(value)     every process's JSON value (per-process input-pipeline states)

On a TPU VM pod `--jax_distributed` alone is enough (JAX finds the coordinator, the process count and
this process's index itself; launch/tpu_vm_pod.sh passes it to every entry point). Elsewhere
`--coordinator_address=host:port --num_processes=N --process_id=i` name them.
"""

from __future__ import annotations

from typing import Any

from absl import flags


def allgather_json(value: Any) -> list[Any]:
    """Every process's JSON-serialisable `value`, in process order (a collective: all processes call it).
    One process: [value]. Used for per-process input-pipeline states in checkpoints, which Orbax's JSON
    items write from the first process only."""
    import json

    import jax
    import numpy as np

    if jax.process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    lengths = np.asarray(multihost_utils.process_allgather(np.array([len(data)], np.int32))).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[:len(data)] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
    return [json.loads(bytes(row[:n]).decode()) for row, n in zip(gathered, lengths)]


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the five multi-host flags in `flag_values` (once per process; absl raises
    DuplicateFlagError on a second definition)."""
    flags.DEFINE_bool("jax_distributed", False, "Call jax.distributed.initialize() (multi-host; auto on TPU pods).",
                      flag_values=flag_values)
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for clusters other than TPU pods.",
                        flag_values=flag_values)
    flags.DEFINE_integer("num_processes", None, "Number of processes (with --coordinator_address).",
                         flag_values=flag_values)
    flags.DEFINE_integer("process_id", None, "This process's index (with --coordinator_address).",
                         flag_values=flag_values)
    flags.DEFINE_float("process_timeout", 60.0, "Seconds without a heartbeat after which a process of a multi-host "
                       "run counts as lost: every other process then exits (status 75) with one line naming it "
                       "(bert_jax.training.guards.watchdog).", flag_values=flag_values)


def initialize_from_flags(flag_values: flags.FlagValues = flags.FLAGS, command: str = "train") -> bool:
    """Calls `jax.distributed.initialize` when --jax_distributed or --coordinator_address is set, then starts the
    lost-process watchdog (`bert_jax.training.guards.watchdog`, --process_timeout; `command` names the job in its
    line); JAX's own heartbeat timeout is `watchdog.JAX_TIMEOUT_FACTOR` times longer.

    The flags must be defined (`define_flags`) and parsed. Call before any JAX computation.

    Returns:
      True when jax.distributed was initialised, False for a single-process run.

    Raises:
      ValueError: (one line) --num_processes or --process_id without --jax_distributed or
        --coordinator_address, where they would be silently ignored.
    """
    f = flag_values
    if not (f.jax_distributed or f.coordinator_address):
        given = [f"--{name}={f[name].value}" for name in ("num_processes", "process_id") if f[name].value is not None]
        if given:
            raise ValueError(f"{' '.join(given)} needs --coordinator_address (or --jax_distributed)")
        return False
    import jax

    # On a TPU VM pod every argument is found automatically; elsewhere they come from the flags.
    from bert_jax.training.guards import watchdog

    if f.process_timeout <= 0:
        raise ValueError(f"--process_timeout={f.process_timeout} must be positive (seconds)")
    jax.distributed.initialize(coordinator_address=f.coordinator_address, num_processes=f.num_processes,
                               process_id=f.process_id,
                               heartbeat_timeout_seconds=max(100, round(watchdog.JAX_TIMEOUT_FACTOR * f.process_timeout)))
    watchdog.start(f.process_timeout, command)
    return True
