"""Device check: BERT-Base and BERT-Large pre-training steps on one accelerator in bfloat16, beside transformers'
PyTorch BertForPreTraining (SDPA attention, bfloat16 autocast, fused AdamW; eager, and with --peer_compile under
torch.compile) in the same run.

  benchmarks/device_check.sh                       # kernel checks, dropout masks, then this at base,large
  python benchmarks/device_check.py --sizes tiny --steps 1 --warmup 1 --rounds 1 --p1_batch 8 --p2_batch 2
                                                   # a smoke run (tests/test_device_check.py)
  python benchmarks/device_check.py --gpu_tests --sizes none   # the fused attention kernels against jnp only

Needs the gpu and test extras on the device (`pip install -e '.[gpu,test]'`, or an image with its own jax, torch
and transformers); on a machine without a GPU it runs on the CPU (the smoke run checks the script, not the speed).

Phases, as pre-training runs them:
  phase 1  length 128, 20 predictions, one instance per row, every instance full length (the paper's phase 1,
           where almost every instance fills its 128 tokens);
  phase 2  length 512, 80 predictions; instance lengths drawn uniformly from [32, 512] (about half of the
           slots padding unpacked, as Krell et al. 2021 measure on Wikipedia at 512): ours packed by
           bert_jax.data.pretraining.packing (the packer training uses), the peer padded one instance per row.
Token ids are random (speed does not depend on them); the batches are built before timing.

Rows, in this order: first every size and phase's default recipe (bert_jax: bfloat16, dropout on, kernels=auto)
and the eager peer; then the extras, each over every size (or --extras_sizes) and phase: the compiled peer
(--peer_compile), then each --variants entry (bert_jax with config.model fields changed, or another batch).
Each row prints as soon as it is measured. --deadline_s: rows not started by then are skipped (one line each);
--hard_deadline_s: a watchdog prints the table of the rows done and exits (a compilation cannot be
interrupted), so the command always ends with a table.

Per row: sequences/s (instances), useful tokens/s (real tokens), padding, MFU = the analytic training FLOPs of
the rows computed (bert_jax.model.flops, padded rows counted whole, the MLM head at the P predicted positions for both
sides) per second over the device's published dense bfloat16 peak (`bert_jax.model.flops.PEAK_BF16_FLOPS_PER_DEVICE`,
or --peak_tflops), ms/step, compile seconds, and the ratio of useful tokens/s to the eager peer's. Each rate is
the median of --rounds windows of --steps steps after --warmup steps. Compilation is left out of the rates:
bert_jax's train step is lowered and compiled ahead of the first call (`train_step.lower(state, batch).compile()`,
both timed); the compiled peer's compile time is its warm-up steps' time less as many median steps.

--gpu_tests first runs the fused attention kernels of the gpu set against a plain jnp reference, value and
gradients (d query, d key, d value), at BERT's shapes in bfloat16 (H = 64, L = 128 and 512): flash_gpu with and
without its in-kernel dropout (not interpreted), cuDNN's attention without dropout, and layer_norm_gpu (value and
five gradients, BERT-Large's and BERT-Base's hidden sizes); max errors relative to the largest entry
(tests/test_flash_attention.py's measure, bound 2e-2), then on a GPU the fwd+bwd time of each attention form
against the plain form at BERT-Large's shapes. On a CPU: Pallas's interpreter and XLA's lowering, small shapes.

This file is the command: its flags, the plan of rows, the deadlines, one row's run and figures. The parts, beside
it in benchmarks/: device_check_rows.py (sides, variants, batches), device_check_steps.py (the timed train steps,
ours and the peer's), device_check_kernels.py (the kernel checks), device_check_report.py (printed lines, the
table, the JSON file, the watchdog).
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    # jax takes its memory as it needs it, not 75% of the device up front: the peer's torch shares the GPU.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# The report module first: the run's clock starts at its import.
from device_check_report import OURS, PEER, PEER_COMPILED, Report, Watchdog, elapsed, say  # noqa: E402

import jax  # noqa: E402

from bert_jax.configs import pretrain  # noqa: E402
from bert_jax.model import flops, modeling  # noqa: E402
from device_check_kernels import kernel_checks  # noqa: E402
from device_check_rows import PHASES, Side, batches, parse_variants  # noqa: E402
from device_check_steps import ours, peer  # noqa: E402


# ----------------------------------------------------------------------------- one row


def measure(size: str, phase: int, side: Side, args, report: Report, watchdog: Watchdog) -> None:
    """One row: measured and printed, or failed (one line, the traceback on stderr), or skipped (deadline)."""
    label = f"{size} phase {phase} {side.name}"
    row = {"size": size, "phase": phase, "side": side.name, "settings": dict(side.settings)}
    if args.deadline_s and elapsed() > args.deadline_s:
        say(f"{label}: skipped (deadline {args.deadline_s:.0f} s passed at {elapsed():.0f} s)")
        report.add(dict(row, note="skipped: deadline"))
        return
    length, predictions = PHASES[phase]
    stage = lambda what: watchdog.set(f"{label}: {what}")  # noqa: E731
    start = time.perf_counter()
    try:
        stage("building the batch")
        rows = side.rows(size, phase, args)
        ours_batch, peer_batch = batches(phase, rows)
        batch = ours_batch if side.kind == OURS else peer_batch
        result = (ours(size, phase, batch, side, args, stage) if side.kind == OURS
                  else peer(size, batch, side, args, stage))
    except Exception as e:  # noqa: BLE001 - one row's failure (e.g. out of memory) must not end the check
        first = (str(e).strip().splitlines() or [""])[0][:300]
        say(f"{label}: FAILED after {time.perf_counter() - start:.1f} s while {watchdog.stage.split(': ')[-1]}: "
            f"{type(e).__name__}: {first}")
        traceback.print_exc(file=sys.stderr)
        report.add(dict(row, note=f"failed: {type(e).__name__}: {first[:80]}"))
        gc.collect()
        return
    watchdog.set("between rows")
    seconds = result["seconds"]
    sequences = (float(batch["next_sentence_weights"].sum()) if "next_sentence_weights" in batch
                 else len(batch["input_ids"]))
    useful = float(batch["attention_mask"].sum())
    bert = modeling.BertConfig.from_dict(pretrain.model_config(size))
    row_flops = flops.train_flops_per_step(bert, len(batch["input_ids"]), length, batch["masked_lm_ids"].shape[1])
    row.update(result, rows=len(batch["input_ids"]), sequences_per_second=sequences / seconds,
               useful_tokens_per_second=useful / seconds, padding=1.0 - useful / batch["attention_mask"].size,
               mfu=row_flops / seconds / report.peak if report.peak else None, ms_per_step=1e3 * seconds,
               wall_s=time.perf_counter() - start, note=result["kernels"])
    report.add(row)
    mfu = f"{100 * row['mfu']:.1f}%" if report.peak else "-"
    times = ", ".join(f"{k[:-2]} {result[k]:.1f} s" for k in ("init_s", "lower_s", "compile_s", "first_step_s")
                      if result.get(k) is not None)
    say(f"{label}: {row['rows']} rows, {row['sequences_per_second']:,.1f} seq/s, "
        f"{row['useful_tokens_per_second']:,.0f} useful tok/s, padding {100 * row['padding']:.1f}%, MFU {mfu}, "
        f"{row['ms_per_step']:.1f} ms/step, loss {result['loss']:.3f}; {times}; {result['kernels']} "
        f"[{elapsed():.0f} s]")


# ----------------------------------------------------------------------------- main


def environment() -> dict:
    """Versions, device and the flags that change the programs."""
    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "-"

    device = jax.devices()[0]
    env = {name: version(name) for name in ("jax", "jaxlib", "flax", "optax", "torch", "transformers")}
    plugins = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()
               if d.metadata["Name"] and d.metadata["Name"].startswith(("jax-cuda", "jax_cuda"))}
    env.update(python=sys.version.split()[0], jax_runtime=jax.__version__, plugins=plugins,
               backend=jax.default_backend(), device_kind=device.device_kind, devices=jax.device_count(),
               compute_capability=getattr(device, "compute_capability", None),
               prng=jax.config.jax_default_prng_impl, threefry_partitionable=jax.config.jax_threefry_partitionable,
               XLA_FLAGS=os.environ.get("XLA_FLAGS", ""),
               XLA_PYTHON_CLIENT_PREALLOCATE=os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", ""),
               XLA_PYTHON_CLIENT_MEM_FRACTION=os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", ""))
    try:
        from jax._src.lib import cuda_versions

        env["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions else None
    except Exception:  # noqa: BLE001 - informational only
        env["cudnn"] = None
    return env


def plan(args) -> list[tuple[str, int, Side]]:
    """The rows in run order: every size and phase's default bert_jax and eager peer first, then the extras
    (the compiled peer, each variant) over every size and phase."""
    default = [Side(OURS, OURS)] + ([] if args.no_peer else [Side(PEER, PEER)])
    extras = ([Side(PEER_COMPILED, PEER, compiled=True)] if args.peer_compile and not args.no_peer else [])
    extras += parse_variants(args.variants)
    cells = [(size, phase) for size in args.sizes_list for phase in args.phases_list]
    extra_cells = [(size, phase) for size, phase in cells if size in (args.extras_sizes or args.sizes).split(",")]
    return ([(size, phase, side) for size, phase in cells for side in default]
            + [(size, phase, side) for side in extras for size, phase in extra_cells])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="base,large", help="comma-separated pretrain sizes, or none")
    parser.add_argument("--phases", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--p1_batch", type=int, default=0, help="phase-1 rows (0: the size's default)")
    parser.add_argument("--p2_batch", type=int, default=0, help="phase-2 packed rows (0: the size's default)")
    parser.add_argument("--variants", default="", help="bert_jax alternatives measured after the defaults: "
                        "comma-separated, each field=value settings of config.model (or batch=N / batch=2x) "
                        "joined by '+', e.g. kernels=reference,attention_probs_dropout_prob=0,remat_policy=dots")
    parser.add_argument("--extras_sizes", default="", help="the sizes the extras (compiled peer, variants) run "
                        "at (default: every size)")
    parser.add_argument("--peak_tflops", type=float, default=0.0, help="the device's bf16 peak (0: published)")
    parser.add_argument("--no_peer", action="store_true")
    parser.add_argument("--peer_compile", action="store_true", help="also the peer under torch.compile")
    parser.add_argument("--peer_compile_backend", default="inductor", help="torch.compile's backend")
    parser.add_argument("--gpu_tests", action="store_true", help="first check the fused attention kernels")
    parser.add_argument("--deadline_s", type=float, default=0.0, help="start no row after this many seconds")
    parser.add_argument("--hard_deadline_s", type=float, default=0.0,
                        help="print the table and exit at this many seconds (0: deadline_s + 120 with a deadline)")
    parser.add_argument("--out", default="", help="also write the rows as JSON here (rewritten after each row)")
    args = parser.parse_args()
    args.sizes_list = [s for s in args.sizes.split(",") if s and s != "none"]
    args.phases_list = [int(p) for p in args.phases.split(",") if p]
    try:
        rows = plan(args)
        for size in args.sizes_list:
            pretrain.model_config(size)
    except ValueError as e:
        parser.error(str(e))
    env = environment()
    peak = args.peak_tflops * 1e12 or flops.peak_flops_per_device(env["device_kind"])
    say("env: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    say(f"device: {env['device_kind']} ({env['backend']}), bf16 peak: "
        f"{f'{peak / 1e12:g} TFLOP/s' if peak else 'unknown (no MFU; --peak_tflops)'}; {len(rows)} rows planned"
        + (f", deadline {args.deadline_s:.0f} s" if args.deadline_s else ""))
    report = Report(args, env, peak)
    hard = args.hard_deadline_s or (args.deadline_s + 120 if args.deadline_s else 0)
    watchdog = Watchdog(report, hard)
    checks_ok = True
    if args.gpu_tests:
        watchdog.set("kernel checks")
        checks_ok = kernel_checks(report)
        report.write()
    for size, phase, side in rows:
        measure(size, phase, side, args, report, watchdog)
    watchdog.stop()
    if rows:
        report.finish(f"done in {elapsed():.0f} s")
    if not checks_ok:
        say("kernel checks: some case FAILED or was over the bound (above)")
        sys.exit(1)


if __name__ == "__main__":
    main()
