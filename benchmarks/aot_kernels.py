"""The accelerator program with each kernel set, side by side: `bert_jax.aot`'s train step compiled ahead of time
(libtpu, or jax's CUDA plugin for GPU targets; no accelerator needed) with each `model.kernels` set, per phase.

  .venv/bin/python benchmarks/aot_kernels.py [--runs base:v4-32,base:v5e-16,large:v4-128] [--dtype bfloat16]
  .venv/bin/python benchmarks/aot_kernels.py --runs large:h100 --sets gpu --batch 128 --phases 0

Prints, per run and phase, for each kernel set: HBM bytes per device and step (on a TPU XLA's cost analysis,
"bytes accessed"; on a GPU, which reports none, the kernels' operands and results,
`bert_jax.training.compiled.program_stats`), kernels per step (program_stats), temporary memory per device, FLOPs
per device and step (TPU only), and the ratio to the reference. `auto` resolves to the `tpu` set on a TPU target
and to `gpu` on a GPU one (bert_jax.model.kernels.resolve).
"""

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from bert_jax.training import aot, pretraining
from bert_jax.training.compiled import program_stats, targets
from bert_jax.model import kernels  # noqa: E402
from bert_jax.configs import pretrain  # noqa: E402

SETS = ("reference", "tpu", "xla_cpu")


def measure(size: str, topology: str, kernel_set: str, dtype: str, phases: str = "", overrides=()) -> list[dict]:
    """Compiles every phase (or those in `phases`, comma-separated indices) of `bert_jax/configs/pretrain.py:<size>`
    for `topology` with `kernel_set`: "reference", "tpu", "xla_cpu", or one with a kernel swapped in from the
    other set ("reference+dropout": reference with xla_cpu's dropout; "xla_cpu-gelu": xla_cpu with the
    reference GELU) -> per phase: bytes accessed, temporary bytes, FLOPs (per device and step)."""
    for sep, base in (("+", "reference"), ("-", "xla_cpu")):
        if sep in kernel_set:
            head, field = kernel_set.split(sep)
            assert head == base, f"{kernel_set}: '{sep}' goes with {base}"
            with kernels.swapped(base, field):
                return _measure(size, topology, base, dtype, phases, overrides)
    return _measure(size, topology, kernel_set, dtype, phases, overrides)


def _measure(size, topology, kernel_set, dtype, phases, overrides):
    config = pretrain.get_config(size)
    config.model.dtype, config.model.kernels = dtype, kernel_set
    for apply in overrides:
        apply(config)
    devices = targets.target(topology).devices()
    rows = []
    wanted = {int(i) for i in phases.split(",")} if phases else None
    for phase in pretraining.resolve_phases(config):
        if wanted is not None and phase.index not in wanted:
            continue
        compiled, _ = aot.compile_phase(config, devices, phase)
        cost = compiled.cost_analysis()
        cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
        stats = program_stats.analyze(compiled.as_text())
        rows.append({"phase": phase.index, "length": phase.max_seq_length, "batch": phase.batch_size,
                     "bytes": float(cost.get("bytes accessed", stats.hbm_bytes)), "flops": float(cost.get("flops", 0.0)),
                     "kernels": stats.kernel_launches, "temp": float(compiled.memory_analysis().temp_size_in_bytes),
                     "passes": {name: b for name, (_, b) in stats.by("phase").items()}})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="base:v4-32,base:v5e-16,large:v4-128", help="size:topology, comma-separated")
    parser.add_argument("--dtype", default="bfloat16", help="model compute dtype")
    parser.add_argument("--prng_impl", default="threefry2x32",
                        help="jax_default_prng_impl for dropout's keys: threefry2x32 (JAX's default) or rbg")
    parser.add_argument("--sets", default=",".join(SETS),
                        help="kernel sets, comma-separated; reference+<kernel> / xla_cpu-<kernel> swap one kernel")
    parser.add_argument("--phases", default="", help="phase indices to compile, comma-separated (default all)")
    parser.add_argument("--batch", type=int, default=0, help="every phase's batch size (0: the recipe's)")
    parser.add_argument("--layers", type=int, default=0, help="num_hidden_layers (0: the recipe's), for quick proxies")
    parser.add_argument("--packed", action="store_true", help="both phases packed")
    args = parser.parse_args()
    overrides = []
    if args.batch:
        overrides.append(lambda c: [p.update(batch_size=args.batch) for p in c.phases])
    if args.layers:
        overrides.append(lambda c: c.model.update(num_hidden_layers=args.layers))
    if args.packed:
        overrides.append(lambda c: [p.update(packing=True) for p in c.phases])
    import jax

    jax.config.update("jax_default_prng_impl", args.prng_impl)
    sets = args.sets.split(",")
    print(f"auto on a TPU target = {kernels.resolve('auto', 'tpu')}; compute dtype {args.dtype}; "
          f"PRNG {args.prng_impl} (partitionable threefry: {jax.config.jax_threefry_partitionable})")
    print(f"{'run':<16} {'phase':<14} {'kernels':<18} {'HBM bytes/step':>15} {'temp GiB':>9} {'TFLOPs/step':>12} "
          f"{'launches':>9}  bytes by pass")
    for run in args.runs.split(","):
        size, topology = run.split(":")
        results = {k: measure(size, topology, k, args.dtype, args.phases, overrides) for k in sets}
        for i, first in enumerate(results[sets[0]]):
            label = f"{first['phase']} ({first['length']}x{first['batch']})"
            for name in sets:
                row = results[name][i]
                passes = ", ".join(f"{k} {b / 1e9:.2f} GB" for k, b in row["passes"].items())
                print(f"{run:<16} {label:<14} {name:<18} {row['bytes'] / 1e9:13.2f} GB {row['temp'] / 2**30:9.2f} "
                      f"{row['flops'] / 1e12:12.3f} {row['kernels']:9d}  {passes}", flush=True)
            if "reference" in sets:
                ref = results["reference"][i]
                for name in (n for n in sets if n != "reference"):
                    row = results[name][i]
                    print(f"{run:<16} {label:<14} {'ratio':<18} {row['bytes'] / ref['bytes']:15.3f} "
                          f"{row['temp'] / ref['temp']:9.3f} {row['flops'] / (ref['flops'] or 1):12.3f}   "
                          f"({name} / reference)", flush=True)


if __name__ == "__main__":
    main()
