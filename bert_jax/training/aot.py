"""Ahead-of-time compilation of the real train step for a TPU topology, on any machine.

  pip install 'libtpu==0.0.42.*'   # the version jax 0.10.2 pairs with; no TPU needed
  python -m bert_jax.aot --topology v3-32 --config pretrain:base   # then the launch's own --config.* overrides

Lowers and compiles, for every phase, the very train step `bert_jax.train` runs (`pretraining.build`: the
same jitted function, shardings, donation and grad_accum_steps) on the topology's compile-only devices
from `jax.experimental.topologies`, and prints, per phase: per-device memory (arguments, temporaries,
outputs, total against the chip's HBM), FLOPs per step from the compiled program, the analytic model
FLOPs (`bert_jax.model.flops`), and a roofline step time max(FLOPs / peak FLOP/s, bytes / HBM bandwidth) per
device. Exit status 1 when a phase does not fit in HBM.

`--topology` takes a `TOPOLOGIES` name or gcloud's accelerator type of the same slice, the value of
`launch/tpu_vm_pod.sh --accelerator_type` (`topology_for`: v5litepod-16 is v5e-16; v3, v4, v5p and v6e
names are spelled alike), so a check and a launch can name the pod the same way.

Chip figures, per JAX device as in `TOPOLOGIES`, which are the devices a real slice shows: a v3 chip's
two TensorCores are two devices; a v4 chip runs its two TensorCores as one "megacore" device (compiled
with libtpu's `chip_config_name="megacore"`), and so does a v5p chip (libtpu's default there); v5e and v6e
chips have one core. v3 core 61.5 bf16 TFLOP/s, 16 GiB, 450 GB/s; v4 chip 275 TFLOP/s, 32 GiB, 1200 GB/s;
v5e chip 197 TFLOP/s, 16 GiB, 819 GB/s; v5p chip 459 TFLOP/s, 95 GiB, 2765 GB/s; v6e chip 918 TFLOP/s,
32 GiB, 1640 GB/s (https://cloud.google.com/tpu/docs/v5p, https://cloud.google.com/tpu/docs/v6e).
"""

from __future__ import annotations

import dataclasses
import os
import sys

# Compile-only use of libtpu: no chip is claimed, so several processes may load it at once.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402

from bert_jax.checkpoints import checkpointing
from bert_jax.training import pretraining, sharding, steps
from bert_jax import errors
from bert_jax.model import flops, kernels  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Chip:
    """A TPU slice to compile for and its roofline figures, per JAX device (see the module docstring).

    Attributes:
      topology: the `jax.experimental.topologies` name, e.g. "v3:4x4x1".
      peak_flops: peak bfloat16 FLOP/s per device.
      hbm_bytes: HBM capacity per device, bytes.
      hbm_bandwidth: HBM bandwidth per device, bytes/s.
      options: extra keyword arguments of `topologies.get_topology_desc` (v4: megacore devices).
    """

    topology: str  # jax.experimental.topologies name
    peak_flops: float  # bf16 FLOP/s per JAX device
    hbm_bytes: float  # per JAX device
    hbm_bandwidth: float  # bytes/s per JAX device
    options: tuple[tuple[str, str], ...] = ()  # extra get_topology_desc keyword arguments

    def devices(self) -> list:
        """The compile-only devices of this slice (needs libtpu)."""
        from jax.experimental import topologies

        return topologies.get_topology_desc(topology_name=self.topology, platform="tpu", **dict(self.options)).devices


GIB = 1024**3
_V3, _V5E = flops.PEAK_BF16_FLOPS_PER_DEVICE["TPU v3"], flops.PEAK_BF16_FLOPS_PER_DEVICE["TPU v5 lite"]
_V4 = flops.PEAK_BF16_FLOPS_PER_DEVICE["TPU v4"]
_V5P, _V6E = flops.PEAK_BF16_FLOPS_PER_DEVICE["TPU v5p"], flops.PEAK_BF16_FLOPS_PER_DEVICE["TPU v6 lite"]
_MEGACORE = (("chip_config_name", "megacore"),)
TOPOLOGIES = {
    "v3-32": Chip("v3:4x4x1", _V3, 16 * GIB, 450e9),     # 16 chips, 32 cores: BERT-Base (paper)
    "v3-128": Chip("v3:8x8x1", _V3, 16 * GIB, 450e9),    # 64 chips: BERT-Large (paper)
    "v3-8": Chip("v3:2x2x1", _V3, 16 * GIB, 450e9),
    # v4 names count TensorCores, like v3's: v4-32 is 16 chips, each one megacore JAX device.
    "v4-32": Chip("v4:2x2x4", _V4, 32 * GIB, 1200e9, _MEGACORE),    # 16 chips
    "v4-128": Chip("v4:4x4x4", _V4, 32 * GIB, 1200e9, _MEGACORE),   # 64 chips
    "v5e-16": Chip("v5e:4x4", _V5E, 16 * GIB, 819e9),      # 16 chips, one core each
    "v5e-64": Chip("v5e:8x8", _V5E, 16 * GIB, 819e9),      # 64 chips
    # v5p names count TensorCores like v4's (v5p-32 is 16 chips, one megacore device each); v6e names chips.
    "v5p-32": Chip("v5p:2x2x4", _V5P, 95 * GIB, 2765e9),   # 16 chips
    "v6e-16": Chip("v6e:4x4", _V6E, 32 * GIB, 1640e9),     # 16 chips
}

# gcloud's accelerator-type generations (`gcloud compute tpus tpu-vm create --accelerator-type GEN-N`) whose
# name differs here: a v5e slice of N chips is "v5litepod-N" there. v2, v3, v4, v5p and v6e are spelled alike.
GCLOUD_GENERATIONS = {"v5litepod": "v5e"}


def topology_for(accelerator_type: str) -> str:
    """The `TOPOLOGIES` name of a slice given as gcloud names it: the one mapping between the launcher's
    `--accelerator_type` and `--topology` here (a TOPOLOGIES name maps to itself).

    Args:
      accelerator_type: e.g. "v3-32", "v4-32", "v5litepod-16", "v5p-32", "v6e-16" (gcloud's
        `--accelerator-type`: GENERATION-N, N TensorCores for v2, v3, v4 and v5p, chips for v5e and v6e),
        or a TOPOLOGIES name such as "v5e-16".

    Returns:
      A key of TOPOLOGIES, e.g. "v5e-16" for "v5litepod-16".

    Raises:
      ValueError: (one line) no topology here for that slice, naming the known ones in both spellings.
    """
    generation, sep, size = accelerator_type.partition("-")
    name = f"{GCLOUD_GENERATIONS.get(generation, generation)}-{size}" if sep else accelerator_type
    if name not in TOPOLOGIES:
        raise ValueError(f"--topology {accelerator_type!r} is not one of {sorted(TOPOLOGIES)} (or gcloud's "
                         f"accelerator type of one: {', '.join(sorted(accelerator_type_of(t) for t in TOPOLOGIES))})")
    return name


def accelerator_type_of(topology: str) -> str:
    """A TOPOLOGIES name -> gcloud's accelerator type of that slice ("v5e-16" -> "v5litepod-16"); the inverse
    of `topology_for` (str -> str, no check)."""
    generation, _, size = topology.partition("-")
    gcloud = {ours: theirs for theirs, ours in GCLOUD_GENERATIONS.items()}.get(generation, generation)
    return f"{gcloud}-{size}"


def lower_phase(config, devices, phase: pretraining.Phase) -> tuple[jax.stages.Lowered, jax.sharding.Mesh]:
    """Lowers the train step of `pretraining.build` for one phase on `devices` -> (lowered, mesh).

    The program is the one `train` runs on these devices: the mesh of config.mesh (`steps.make_mesh`,
    presets included) over `devices`, the same jitted step with its shardings, donation and
    config.grad_accum_steps; only `config.model.kernels` is resolved for the devices' platform (the
    target's kernels, not the host's).

    Args:
      config: the pre-training config (model, optimizer, mesh, grad_accum_steps, seed).
      devices: the devices to compile for (a topology's compile-only devices, or e.g. `jax.devices()`).
      phase: gives the batch, `pretraining.batch_shapes(phase)` (packed rows when phase.packing).

    Raises:
      ValueError: a mesh that does not fit `devices`, a bad model config, a parameter or optimizer-state
        dimension the mesh does not divide (`sharding.check_divisible`), or a batch size not divisible by
        data * fsdp (jax's `IndivisibleError`, when lowering).
    """
    config = config.copy_and_resolve_references()
    config.model.kernels = kernels.resolve(config.model.kernels, devices[0].platform)  # the target's, not the host's
    mesh = steps.make_mesh(config.mesh, devices)
    program = pretraining.build(config, mesh)
    state = checkpointing.abstract_like(program.abstract, program.shardings)
    batch = {k: jax.ShapeDtypeStruct(s, dtype, sharding=sharding.batch_sharding(mesh, len(s)))
             for k, (s, dtype) in pretraining.batch_shapes(phase).items()}
    with jax.set_mesh(mesh):
        return program.train_step.lower(state, batch), mesh


def compile_phase(config, devices, phase: pretraining.Phase):
    """`lower_phase`, compiled -> (compiled, mesh); raises as `lower_phase`."""
    lowered, mesh = lower_phase(config, devices, phase)
    with jax.set_mesh(mesh):
        return lowered.compile(), mesh


def report(config, topology_name: str) -> bool:
    """Prints the per-phase table; True when every phase fits in HBM.

    Args:
      config: the pre-training config, as `bert_jax.train` gets it (the recipe and its `--config.*` overrides).
      topology_name: a key of TOPOLOGIES (`topology_for` turns gcloud's accelerator types into one).

    Raises:
      ValueError: (one line) not a pre-training config (a fine-tuning recipe), an unknown config.mesh.preset, a mesh that does not fit the topology's
        devices, or a bad model / phase config; the errors of `compile_phase`.
      KeyError: `topology_name` is not in TOPOLOGIES (`main` maps and checks it first: `topology_for`).
      ImportError: libtpu is not installed (checked first: jax would raise a RuntimeError later).
    """
    import importlib.util

    missing = [k for k in ("phases", "mesh", "model", "total_steps") if k not in config]
    if missing or "preset" not in config.mesh:
        raise ValueError(f"--config is not a pre-training config (it lacks {', '.join(missing) or 'mesh.preset'}): "
                         "aot compiles pre-training recipes, e.g. --config pretrain:base")
    if importlib.util.find_spec("libtpu") is None:
        raise ImportError("libtpu is not installed, so there is no TPU compiler")

    chip = TOPOLOGIES[topology_name]
    if config.mesh.preset:
        sizes = sharding.preset_sizes(config.mesh.preset)  # before loading libtpu: an unknown name fails fast
    else:
        sizes = (config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    devices = chip.devices()
    mesh_shape = sharding.mesh_shape(*sizes, len(devices))  # the shape steps.make_mesh gives these devices
    phases = pretraining.resolve_phases(config)
    bert = pretraining.create_model(config).config
    print(f"{topology_name}: {len(devices)} devices, mesh {dict(zip(sharding.MESH_AXES, mesh_shape))}, "
          f"model dtype {bert.dtype}, kernels {kernels.resolve(bert.kernels, 'tpu')}, "
          f"grad_accum_steps {config.grad_accum_steps}")
    fits, total_seconds = True, 0.0
    for phase in phases:
        compiled, _ = compile_phase(config, devices, phase)
        mem = compiled.memory_analysis()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        used = mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
        compiled_flops = float(cost.get("flops", 0.0))  # per device
        analytic = flops.train_flops_per_step(bert, phase.batch_size, phase.max_seq_length,
                                              pretraining.batch_shapes(phase)["masked_lm_ids"][0][1]) / len(devices)
        bytes_accessed = float(cost.get("bytes accessed", 0.0))
        step_s = max(compiled_flops / chip.peak_flops, bytes_accessed / chip.hbm_bandwidth)
        steps = phase.end - phase.start
        total_seconds += step_s * steps
        fits &= used <= chip.hbm_bytes
        print(f"  phase {phase.index} (length {phase.max_seq_length}, {phase.max_predictions_per_seq} predictions, "
              f"batch {phase.batch_size}{', packed' if phase.packing else ''}, {steps} steps): memory/device args {mem.argument_size_in_bytes / GIB:.2f} "
              f"+ temp {mem.temp_size_in_bytes / GIB:.2f} + out {mem.output_size_in_bytes / GIB:.2f} "
              f"- aliased {mem.alias_size_in_bytes / GIB:.2f} = {used / GIB:.2f} GiB of {chip.hbm_bytes / GIB:.0f} "
              f"({'fits' if used <= chip.hbm_bytes else 'DOES NOT FIT'}); FLOPs/device compiled "
              f"{compiled_flops / 1e12:.3f} T, analytic {analytic / 1e12:.3f} T "
              f"(ratio {compiled_flops / analytic:.3f}); HBM bytes accessed {bytes_accessed / 1e9:.2f} GB; "
              f"roofline {step_s * 1e3:.1f} ms/step")
    print(f"  roofline for the whole schedule ({config.total_steps} steps): {total_seconds / 86400:.2f} days")
    return fits


def main(argv):
    from absl import app, flags

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")

    f = flags.FLAGS
    try:
        ok = report(f.config, topology_for(f.topology))
    except ImportError as e:
        raise SystemExit(f"aot: {e} (install libtpu: pip install 'libtpu==0.0.42.*')") from None
    except errors.USER_ERRORS as e:
        raise errors.exit_with("aot", e) from None
    sys.exit(0 if ok else 1)


def define_flags() -> None:
    """Defines the command line's flags: `--config` (a pre-training recipe and its `--config.*` overrides, parsed
    as `bert_jax.train` parses them) and `--topology` (a TOPOLOGIES name or gcloud's accelerator type)."""
    from absl import flags
    from bert_jax import configs

    configs.define_flag("Pre-training config, e.g. pretrain:base (a recipe name, or a config file path).")
    gcloud = ", ".join(accelerator_type_of(t) for t in TOPOLOGIES)
    flags.DEFINE_string("topology", "v3-32", f"One of {sorted(TOPOLOGIES)}, or gcloud's accelerator type of one "
                        f"(the launcher's --accelerator_type: {gcloud}).")
    flags.mark_flags_as_required(["config"])


if __name__ == "__main__":
    from bert_jax import console

    console.install()
    define_flags()
    errors.run(main, "aot")
