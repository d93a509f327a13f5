"""Ahead-of-time compilation of the real train step for a TPU slice or an NVIDIA GPU machine, on any machine.

  pip install -e '.[tpu]'        # libtpu: TPU programs, no TPU needed
  pip install -e '.[gpu-aot]'    # jax's CUDA plugin, ptxas, cuDNN: GPU programs, no GPU or driver needed
  python -m bert_jax.aot --topology v3-32 --config pretrain:base   # then the launch's own --config.* overrides
  python -m bert_jax.aot --topology 8xh100 --config pretrain:large

Lowers and compiles, for every phase, the very train step `bert_jax.train` runs (`pretraining.build`: the
same jitted function, shardings, donation and grad_accum_steps; `model.kernels` and `model.dtype` "auto"
resolved for the target, not the host) on the target's compile-only devices (`targets.Target.devices`), and
prints per phase:
  - memory per device (arguments, temporaries, outputs, less the aliased donations) against what a device may
    use (`targets.Target.memory_budget`), "fits" or "DOES NOT FIT";
  - FLOPs per device: the model's (`bert_jax.model.flops`) and, on TPUs, the compiled program's (XLA's cost
    analysis; GPUs report none) with their ratio;
  - HBM bytes per step: on TPUs XLA's "bytes accessed"; on both, the kernels' operands and results
    (`program_stats`), by kind of kernel (Pallas / Triton calls, cuBLAS and Triton GEMMs, fusions, copies), by
    pass (forward, backward, update) and, on TPUs, by memory space;
  - the kernels XLA's rematerialisation recomputes to fit the memory, where there are any;
  - a roofline bound, not a measurement: compute time (model FLOPs / peak) and memory time (bytes / HBM
    bandwidth); MFU at most compute / max(compute, memory) when the two fully overlap, compute / (compute +
    memory) when they do not overlap at all.
Exit status 1 when a phase does not fit, with one line naming what to change (the phase's grad_accum_steps
estimated to fit is compiled and checked first).

`--topology` names the target (`targets.target`): a TPU slice as bert_jax or gcloud names it (v5litepod-16 is
v5e-16), the value of `launch/tpu_vm_pod.sh --accelerator_type`, or a GPU machine `[HOSTSx][Nx]GPU` (h100, 8xh100,
2x8xa100-80gb; GPUs: `targets.GPUS`). A GPU target needs JAX_PLATFORMS=cpu on a host without a GPU; the
command sets it when unset.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

# Compile-only use of libtpu: no chip is claimed, so several processes may load it at once.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402

from bert_jax.training import pretraining, sharding, steps  # noqa: E402
from bert_jax.training.compiled import memory, program_stats, targets  # noqa: E402
from bert_jax import errors  # noqa: E402
from bert_jax.model import bert_config, flops, kernels  # noqa: E402

GIB = targets.GIB


def resolved(config, platform: str):
    """A copy of `config` with `model.kernels` and `model.dtype` "auto" resolved for `platform` ("gpu", "tpu",
    "cpu"): the program a run there compiles (`kernels.resolve`, `bert_config.resolve_dtype`)."""
    config = config.copy_and_resolve_references()
    config.model.kernels = kernels.resolve(config.model.kernels, platform)
    config.model.dtype = bert_config.resolve_dtype(config.model.dtype, platform)
    return config


def lower_phase(config, devices, phase: pretraining.Phase) -> tuple[jax.stages.Lowered, jax.sharding.Mesh]:
    """Lowers the train step of `pretraining.build` for one phase on `devices` -> (lowered, mesh).

    The program is the one `train` runs on these devices: the mesh of config.mesh (`steps.make_mesh`,
    presets included) over `devices`, the same jitted step with its shardings, donation and
    config.grad_accum_steps; `config.model.kernels` and `config.model.dtype` are resolved for the devices'
    platform (`resolved`: the target's, not the host's).

    Args:
      config: the pre-training config (model, optimizer, mesh, grad_accum_steps, seed).
      devices: the devices to compile for (a topology's compile-only devices, or e.g. `jax.devices()`).
      phase: gives the batch, `pretraining.batch_shapes(phase)` (packed rows when phase.packing).

    Raises:
      ValueError: a mesh that does not fit `devices`, a bad model config, a parameter or optimizer-state
        dimension the mesh does not divide (`sharding.check_divisible`), or a batch size not divisible by
        data * fsdp (jax's `IndivisibleError`, when lowering).
    """
    config = resolved(config, devices[0].platform)
    mesh = steps.make_mesh(config.mesh, devices)
    return pretraining.lower_step(pretraining.build(config, mesh), mesh, phase), mesh


def compile_phase(config, devices, phase: pretraining.Phase):
    """`lower_phase`, compiled -> (compiled, mesh); raises as `lower_phase`."""
    lowered, mesh = lower_phase(config, devices, phase)
    with jax.set_mesh(mesh):
        return lowered.compile(), mesh


@dataclasses.dataclass(frozen=True)
class PhaseReport:
    """One phase's compiled step on a target: bytes needed per device (`memory.needed_bytes`), the analytic
    model FLOPs per device (`bert_jax.model.flops`), XLA's own FLOPs and bytes accessed where it reports them
    (TPU; None on GPUs), and the kernels (`program_stats.analyze` of the optimised program)."""

    phase: pretraining.Phase
    memory: Any  # jax's CompiledMemoryStats
    needed: int
    model_flops: float
    xla_flops: float | None
    xla_bytes: float | None
    stats: program_stats.ProgramStats

    def roofline(self, target: targets.Target) -> tuple[float, float, float]:
        """(compute seconds, memory seconds, seconds with no overlap) per step: model FLOPs / peak, the kernels'
        HBM bytes / bandwidth (XLA's bytes accessed on a TPU, its own count there), and their sum."""
        compute = self.model_flops / target.peak_flops
        nbytes = self.xla_bytes if self.xla_bytes is not None else self.stats.hbm_bytes
        memory_s = nbytes / target.hbm_bandwidth
        return compute, memory_s, compute + memory_s


def analyze_phase(config, devices, phase: pretraining.Phase) -> tuple[PhaseReport, Any]:
    """`compile_phase`, then what the compiled step needs and does -> (PhaseReport, compiled); raises as
    `lower_phase`."""
    compiled, _ = compile_phase(config, devices, phase)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    bert = pretraining.create_model(config).config
    model_flops = flops.train_flops_per_step(bert, phase.batch_size, phase.max_seq_length,
                                             pretraining.batch_shapes(phase)["masked_lm_ids"][0][1]) / len(devices)
    xla_flops = float(cost["flops"]) if cost and "flops" in cost else None
    xla_bytes = float(cost["bytes accessed"]) if cost and "bytes accessed" in cost else None
    return PhaseReport(phase, compiled.memory_analysis(), memory.needed_bytes(compiled), model_flops, xla_flops,
                       xla_bytes, program_stats.analyze(compiled.as_text())), compiled


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def print_phase(r: PhaseReport, target: targets.Target, budget: float, verbose: bool) -> None:
    """The report's lines for one phase (the module docstring's layout)."""
    p, mem, stats = r.phase, r.memory, r.stats
    steps_n = p.end - p.start
    compute, memory_s, serial = r.roofline(target)
    fits = "fits" if r.needed <= budget else "DOES NOT FIT"
    xla = (f"compiled {r.xla_flops / 1e12:.3f} T, analytic {r.model_flops / 1e12:.3f} T (ratio "
           f"{r.xla_flops / r.model_flops:.3f})" if r.xla_flops else f"analytic {r.model_flops / 1e12:.3f} T")
    bytes_line = (f"HBM bytes accessed {r.xla_bytes / 1e9:.2f} GB (XLA's count); kernels' operands and results "
                  f"{_gb(stats.hbm_bytes)}" if r.xla_bytes is not None else
                  f"HBM bytes (kernels' operands and results) {_gb(stats.hbm_bytes)}")
    micro = f" in {p.grad_accum_steps} micro-batches" if p.grad_accum_steps > 1 else ""
    print(f"  phase {p.index} (length {p.max_seq_length}, {p.max_predictions_per_seq} predictions, batch "
          f"{p.batch_size}{micro}{', packed' if p.packing else ''}, {steps_n} steps): memory/device args "
          f"{mem.argument_size_in_bytes / GIB:.2f} + temp {mem.temp_size_in_bytes / GIB:.2f} + out "
          f"{mem.output_size_in_bytes / GIB:.2f} - aliased {mem.alias_size_in_bytes / GIB:.2f} = "
          f"{r.needed / GIB:.2f} GiB of {budget / GIB:.2f} ({fits}); FLOPs/device {xla}; {bytes_line}; "
          f"roofline {max(compute, memory_s) * 1e3:.1f} ms/step")
    table = list(stats.by("kind").items())
    kinds = ", ".join(f"{kind} {n} ({_gb(b)})" for kind, (n, b) in table[:6])
    if len(table) > 6:
        kinds += f", {len(table) - 6} other kinds {sum(n for _, (n, _b) in table[6:])} ({_gb(sum(b for _, (_n, b) in table[6:]))})"
    passes = ", ".join(f"{name} {n} ({_gb(b)})" for name, (n, b) in stats.by("phase").items())
    print(f"    kernels per step {stats.kernel_launches}: {kinds}")
    recomputed, gemms = stats.recomputed()
    if recomputed:
        print(f"    recomputed by XLA to fit the memory (rematerialisation): {recomputed} kernels, {gemms} of them "
              f"matrix multiplications, FLOPs the model's count leaves out (fewer rows per micro-batch avoid them: "
              f"'--config.phases[{p.index}].grad_accum_steps')")
    print(f"    by pass: {passes}")
    spaces = stats.bytes_by_space()
    if len(spaces) > 1:
        print("    by memory space: " + ", ".join(f"{'HBM' if s == 0 else f'S({s})'} {_gb(b)}" for s, b in spaces.items()))
    print(f"    roofline bound (not a measurement): compute {compute * 1e3:.1f} ms + memory {memory_s * 1e3:.1f} ms; "
          f"MFU at most {compute / max(compute, memory_s):.0%} fully overlapped, {compute / serial:.0%} not overlapped")
    if verbose:
        heavy = sorted(stats.kernels, key=lambda k: -k.hbm_bytes)[:15]
        for k in heavy:
            print(f"      {_gb(k.hbm_bytes):>10} x{k.count} {k.kind} {k.phase}: {k.op_name[-110:]}")


def report(config, topology_name: str, verbose: bool = False) -> bool:
    """Compiles every phase of `config` for the target and prints the report (module docstring); True when every
    phase fits. Where one does not, prints after the table the smallest grad_accum_steps estimated to fit it
    (`memory.accumulation_estimate`), compiled and checked.

    Args:
      config: the pre-training config, as `bert_jax.train` gets it (the recipe and its `--config.*` overrides).
      topology_name: a `targets.target` name (TPU slice, or GPU machine such as "8xh100").
      verbose: also print each phase's 15 kernels that move the most HBM bytes.

    Raises:
      ValueError: (one line) not a pre-training config (a fine-tuning recipe), an unknown target or
        config.mesh.preset, a mesh that does not fit the target's devices, or a bad model / phase config; the
        errors of `compile_phase`.
      ImportError: the target's compiler is not installed (libtpu, or jax's CUDA plugin).
    """
    missing = [k for k in ("phases", "mesh", "model", "total_steps") if k not in config]
    if missing or "preset" not in config.mesh:
        raise ValueError(f"--config is not a pre-training config (it lacks {', '.join(missing) or 'mesh.preset'}): "
                         "aot compiles pre-training recipes, e.g. --config pretrain:base")
    target = targets.target(topology_name)
    if config.mesh.preset:
        sizes = sharding.preset_sizes(config.mesh.preset)  # before loading a compiler: an unknown name fails fast
    else:
        sizes = (config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    budget, source = target.memory_budget()
    devices = target.devices()
    mesh_shape = sharding.mesh_shape(*sizes, len(devices))  # the shape steps.make_mesh gives these devices
    phases = pretraining.resolve_phases(config)
    config = resolved(config, target.platform)
    bert = pretraining.create_model(config).config
    kind = target.gpu.description if target.gpu else devices[0].device_kind
    print(f"{target.name}: {len(devices)} devices, mesh {dict(zip(sharding.MESH_AXES, mesh_shape))}, "
          f"model dtype {bert.dtype}, kernels {bert.kernels}, grad_accum_steps {config.grad_accum_steps}; {kind}, "
          f"memory a device may use {budget / GIB:.2f} GiB ({source})")
    fits, total_seconds, failing = True, 0.0, None
    for phase in phases:
        r, compiled = analyze_phase(config, devices, phase)
        print_phase(r, target, budget, verbose)
        total_seconds += max(r.roofline(target)[:2]) * (phase.end - phase.start)
        if r.needed > budget and failing is None:
            failing = (phase, r, compiled)
        fits &= r.needed <= budget
    print(f"  roofline for the whole schedule ({config.total_steps} steps): {total_seconds / 86400:.2f} days")
    if failing is not None:
        phase, r, compiled = failing
        accumulation = memory.accumulation_estimate(compiled, budget, phase.batch_size, phase.grad_accum_steps,
                                                    mesh_shape[0] * mesh_shape[1])
        if accumulation:
            trial = config.copy_and_resolve_references()
            trial.phases[phase.index].grad_accum_steps = accumulation
            again, _ = analyze_phase(trial, devices, dataclasses.replace(phase, grad_accum_steps=accumulation))
            print(f"  phase {phase.index} with '--config.phases[{phase.index}].grad_accum_steps={accumulation}': "
                  f"{again.needed / GIB:.2f} GiB ({'fits' if again.needed <= budget else 'DOES NOT FIT'})")
            accumulation = accumulation if again.needed <= budget else None
        print(f"aot: {memory.does_not_fit(phase, r.needed, budget, source, accumulation)}", file=sys.stderr)
    return fits


def main(argv):
    from absl import app, flags

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")

    f = flags.FLAGS
    try:
        ok = report(f.config, f.topology, verbose=f.verbose)
    except ImportError as e:
        raise SystemExit(f"aot: {e}") from None
    except errors.USER_ERRORS as e:
        raise errors.exit_with("aot", e) from None
    sys.exit(0 if ok else 1)


def define_flags() -> None:
    """Defines the command line's flags: `--config` (a pre-training recipe and its `--config.*` overrides, parsed
    as `bert_jax.train` parses them), `--topology` (a `targets.target` name) and `--verbose`."""
    from absl import flags
    from bert_jax import configs

    configs.define_flag("Pre-training config, e.g. pretrain:base (a recipe name, or a config file path).")
    gcloud = ", ".join(targets.accelerator_type_of(t) for t in targets.TOPOLOGIES)
    flags.DEFINE_string("topology", "v3-32", f"A TPU slice, one of {sorted(targets.TOPOLOGIES)} or gcloud's "
                        f"accelerator type of one (the launcher's --accelerator_type: {gcloud}); or a GPU machine "
                        f"[HOSTSx][Nx]GPU, GPU one of {sorted(targets.GPUS)} (e.g. h100, 8xh100, 2x8xa100-80gb).")
    flags.DEFINE_bool("verbose", False, "Also print each phase's 15 kernels that move the most HBM bytes.")
    flags.mark_flags_as_required(["config"])


if __name__ == "__main__":
    from bert_jax import console

    console.install()
    define_flags()
    errors.run(main, "aot")
