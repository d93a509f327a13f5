"""Whether a compiled train step fits its device's memory, and what to change where it does not.

One check for `bert_jax.aot` (a target's memory, compiled ahead of time) and `bert_jax.train` (the run's own
devices, every phase compiled before step 0): a program needs its arguments, temporaries and outputs less
what its donated arguments alias (`needed_bytes`, from XLA's `memory_analysis()`), and a run may use the
device's allocator limit (`device_budget`: jax's `memory_stats()["bytes_limit"]` on GPUs and TPUs; on a CPU
none, unless the config sets `device_memory_gib`).
"""

from __future__ import annotations

GIB = 1024**3


def needed_bytes(compiled) -> int:
    """Bytes per device a compiled program (`jax.stages.Compiled`) holds while it runs: arguments + temporaries +
    outputs - outputs aliased to donated arguments."""
    mem = compiled.memory_analysis()
    return mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes


def device_budget(device, configured_gib: float = 0.0) -> tuple[float | None, str]:
    """(bytes a program may use on `device`, how that figure is made), or (None, "") where nothing bounds it.

    Args:
      device: a `jax.Device` (its `memory_stats()`, where the platform reports one).
      configured_gib: a limit the config sets (`config.device_memory_gib`), GiB; 0: the device's own.
    """
    if configured_gib:
        return configured_gib * GIB, f"config.device_memory_gib={configured_gib:g}"
    try:
        stats = device.memory_stats() or {}
    except Exception:  # a platform without memory statistics (the CPU raises or returns None)
        stats = {}
    limit = stats.get("bytes_limit")
    return (float(limit), f"the allocator's limit on {device.device_kind}") if limit else (None, "")


def accumulation_estimate(compiled, budget: float, batch_size: int, grad_accum_steps: int, batch_axis: int) -> int | None:
    """The smallest grad_accum_steps >= 2 x the current that should fit `budget`, estimating that temporaries
    scale with the micro-batch (activations) and arguments / outputs do not; it must split the batch into
    micro-batches that `batch_axis` (data x fsdp) divides. None where none does."""
    mem = compiled.memory_analysis()
    fixed = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
    steps = grad_accum_steps * 2
    while steps <= batch_size:
        if batch_size % steps == 0 and (batch_size // steps) % batch_axis == 0 and \
                fixed + mem.temp_size_in_bytes * grad_accum_steps / steps <= budget:
            return steps
        steps *= 2
    return None


def does_not_fit(phase, needed: float, budget: float, source: str, accumulation: int | None) -> str:
    """The one line saying a phase's step does not fit and what to change: the phase's grad_accum_steps (the estimate of
    `accumulation_estimate`, where there is one), remat_policy, the phase's batch size."""
    fix = (f"'--config.phases[{phase.index}].grad_accum_steps={accumulation}' (estimated to fit), "
           if accumulation else "")
    return (f"phase {phase.index} (batch {phase.batch_size} x {phase.max_seq_length}"
            f"{', packed' if phase.packing else ''}) needs {needed / GIB:.2f} GiB per device, more than the "
            f"{budget / GIB:.2f} GiB it may use ({source}): set {fix}--config.model.remat_policy=dots, or a smaller "
            f"'--config.phases[{phase.index}].batch_size'")
