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
without its in-kernel dropout (not interpreted), cuDNN's attention without dropout; max errors relative to the
largest entry (tests/test_flash_attention.py's measure, bound 2e-2), then on a GPU the fwd+bwd time of each
against the plain form at BERT-Large's shapes. On a CPU: Pallas's interpreter and XLA's lowering, small shapes.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import importlib.metadata
import json
import os
import pathlib
import statistics
import sys
import threading
import time
import traceback

START = time.monotonic()
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    # jax takes its memory as it needs it, not 75% of the device up front: the peer's torch shares the GPU.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax.model import flops, modeling
from bert_jax.training import pretraining, sharding  # noqa: E402
from bert_jax.configs import pretrain  # noqa: E402
from bert_jax.data.pretraining import packing  # noqa: E402

PHASES = {1: (128, 20), 2: (512, 80)}
BATCHES = {"tiny": (64, 8), "mini": (128, 16), "base": (256, 32), "large": (128, 16)}  # rows: phase 1, phase 2
OURS, PEER, PEER_COMPILED = "bert_jax", "transformers", "transformers+compile"
MODEL_FIELDS = tuple(pretrain.model_config("tiny").keys())


def elapsed() -> float:
    return time.monotonic() - START


def say(line: str) -> None:
    print(line, flush=True)


# ----------------------------------------------------------------------------- batches


def instances(rng: np.random.Generator, count: int, length: int, predictions: int, full: bool) -> list[dict]:
    """`count` unpadded instances (the packer's element, `packing.unpad`): [CLS] A [SEP] B [SEP] with random
    ids, token types, 15% of the tokens masked (at least 1, at most `predictions`), a random NSP label."""
    out = []
    for _ in range(count):
        n = length if full else int(rng.integers(32, length + 1))
        ids = rng.integers(1000, 30000, n).astype(np.int32)
        ids[0], ids[n // 2], ids[-1] = 101, 102, 102
        types = (np.arange(n) > n // 2).astype(np.int32)
        m = min(predictions, max(1, round(0.15 * n)))
        positions = np.sort(rng.choice(np.arange(1, n - 1), m, replace=False)).astype(np.int32)
        out.append({"input_ids": ids, "token_type_ids": types, "masked_lm_positions": positions,
                    "masked_lm_ids": ids[positions].copy(), "masked_lm_weights": np.ones(m, np.float32),
                    "next_sentence_labels": rng.integers(0, 2, 1).astype(np.int32)})
    return out


def padded(batch: list[dict], length: int, predictions: int) -> dict[str, np.ndarray]:
    """One instance per row, padded to `length` / `predictions` (the unpacked batch layout)."""
    b = len(batch)
    out = {k: np.zeros((b, length), np.int32) for k in ("input_ids", "token_type_ids", "attention_mask")}
    out.update({"masked_lm_positions": np.zeros((b, predictions), np.int32),
                "masked_lm_ids": np.zeros((b, predictions), np.int32),
                "masked_lm_weights": np.zeros((b, predictions), np.float32),
                "next_sentence_labels": np.zeros((b,), np.int32)})
    for r, x in enumerate(batch):
        n, m = len(x["input_ids"]), len(x["masked_lm_ids"])
        out["input_ids"][r, :n], out["token_type_ids"][r, :n], out["attention_mask"][r, :n] = (
            x["input_ids"], x["token_type_ids"], 1)
        for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
            out[k][r, :m] = x[k]
        out["next_sentence_labels"][r] = x["next_sentence_labels"][0]
    return out


def packed(stream: list[dict], rows: int, length: int, predictions: int) -> dict[str, np.ndarray]:
    """The first `rows` packed rows of `stream` (bert_jax.data.pretraining.packing, as training packs)."""
    import grain

    k = packing.default_max_instances(length)
    ds = packing.pack(grain.MapDataset.source(stream).to_iter_dataset(), max_seq_length=length,
                      max_predictions_per_seq=predictions, max_instances=k,
                      num_packing_bins=packing.DEFAULT_PACKING_BINS, seed=0)
    it = iter(ds)
    return packing.finalize_batch([next(it) for _ in range(rows)])


@functools.lru_cache(maxsize=8)
def batches(phase: int, rows: int) -> tuple[dict, dict]:
    """(ours, the peer's) batches of `rows` rows of `phase`: phase 1 the same full rows; phase 2 ours `rows`
    packed rows, the peer the same instances padded one per row."""
    length, predictions = PHASES[phase]
    rng = np.random.default_rng(phase)
    if phase == 1:
        batch = padded(instances(rng, rows, length, predictions, full=True), length, predictions)
        return batch, batch
    stream = instances(rng, 40 * rows, length, predictions, full=False)
    ours = packed(stream, rows, length, predictions)
    taken = int(ours["next_sentence_weights"].sum())  # the instances in our rows
    return ours, padded(stream[:taken], length, predictions)


# ----------------------------------------------------------------------------- rows


@dataclasses.dataclass(frozen=True)
class Side:
    """One column of the comparison: bert_jax with `settings` (config.model fields; "batch": rows, or "Nx" the
    default rows times N), or the peer, eager or compiled."""

    name: str
    kind: str  # OURS or PEER
    settings: tuple[tuple[str, object], ...] = ()
    compiled: bool = False

    def rows(self, size: str, phase: int, args) -> int:
        default = (args.p1_batch if phase == 1 else args.p2_batch) or BATCHES[size][phase - 1]
        batch = dict(self.settings).get("batch")
        if batch is None:
            return default
        return int(float(batch[:-1]) * default) if str(batch).endswith("x") else int(batch)


def _value(text: str):
    """A variant's value: True / False, an int, a float, else the string."""
    if text in ("True", "False", "true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_variants(text: str) -> list[Side]:
    """`--variants`: comma-separated variants, each `field=value` settings joined by '+', a field one of
    config.model's (kernels, attention_probs_dropout_prob, remat_policy, scan_layers, ...) or `batch` (rows, or
    `2x` the default rows), e.g. `kernels=reference,attention_probs_dropout_prob=0,remat_policy=dots+batch=2x`.

    Raises:
      ValueError: a setting without `=`, or an unknown field."""
    sides = []
    for variant in filter(None, (v.strip() for v in text.split(","))):
        if variant == "default":
            continue
        settings = []
        for item in variant.split("+"):
            field, sep, value = item.partition("=")
            if not sep or field not in MODEL_FIELDS + ("batch",):
                raise ValueError(f"--variants: {item!r} is not field=value with a field of config.model or batch")
            settings.append((field, value if field == "batch" else _value(value)))
        sides.append(Side(f"{OURS}[{variant}]", OURS, tuple(settings)))
    return sides


def ours(size: str, phase: int, batch: dict, side: Side, args, stage) -> dict:
    """bert_jax's train step (bfloat16 compute, dropout on, kernels auto unless the side says) on `batch`:
    {seconds per step, init_s, lower_s, compile_s, first_step_s, loss, kernels}."""
    from bert_jax.model import kernels

    config = pretrain.get_config(size)
    config.model.dtype = "bfloat16"
    for field, value in side.settings:
        if field != "batch":
            config.model[field] = value
    length, predictions = PHASES[phase]
    config.phases = [pretrain.phase(length, predictions, 1.0, "", len(batch["input_ids"]),
                                    packing="segment_ids" in batch)]
    config.total_steps, config.warmup_steps = 1000, 10
    mesh = sharding.make_mesh(1, 1, 1, jax.devices()[:1])
    out = {"kernels": kernels.resolve(config.model.kernels)}
    if out["kernels"] == "gpu":
        from bert_jax.model.kernels import gpu

        heads = config.model.hidden_size // config.model.num_attention_heads
        dropout = config.model.attention_probs_dropout_prob > 0
        fused = gpu.applies("bfloat16", heads, length, dropout)
        out["kernels"] += (": flash_gpu" if dropout else ": cudnn") if fused else ": the model's attention"
    stage("building")
    start = time.perf_counter()
    program = pretraining.build(config, mesh)
    state, _ = pretraining.create_train_state(program.model, program.tx, mesh, 0, program.shardings)
    device_batch = pretraining.global_batch(batch, mesh)
    jax.block_until_ready((state, device_batch))
    out["init_s"] = time.perf_counter() - start
    with jax.set_mesh(mesh):
        stage("lowering")
        start = time.perf_counter()
        lowered = program.train_step.lower(state, device_batch)
        out["lower_s"] = time.perf_counter() - start
        stage("compiling")
        start = time.perf_counter()
        compiled = lowered.compile()
        out["compile_s"] = time.perf_counter() - start
        stage("stepping")
        holder = [state, None]
        del state

        def step():
            holder[0], holder[1] = compiled(holder[0], device_batch)
            jax.block_until_ready(holder[1]["loss"])

        start = time.perf_counter()
        step()
        out["first_step_s"] = time.perf_counter() - start
        out["seconds"], _ = timed(step, args.rounds, args.steps, args.warmup)
        out["loss"] = float(holder[1]["loss"])
    del holder, compiled, lowered, program, device_batch
    return out


def peer(size: str, batch: dict, side: Side, args, stage) -> dict:
    """transformers' BertForPreTraining (SDPA, bfloat16 autocast, fused AdamW; float32 on a CPU; torch.compile'd
    when the side says) on `batch`: {seconds per step, init_s, compile_s (compiled: its warm-up less as many
    steps), first_step_s, loss, kernels}."""
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    stage("building")
    start = time.perf_counter()
    m = pretrain.model_config(size)
    config = transformers.BertConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size,
                                     num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
                                     intermediate_size=m.intermediate_size, attn_implementation="sdpa")
    model = transformers.BertForPreTraining(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=device == "cuda")
    forward = torch.compile(model, backend=args.peer_compile_backend) if side.compiled else model
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    rows = np.repeat(np.arange(len(labels)), batch["masked_lm_positions"].shape[1])
    real = batch["masked_lm_weights"].reshape(-1) > 0
    labels[rows[real], batch["masked_lm_positions"].reshape(-1)[real]] = batch["masked_lm_ids"].reshape(-1)[real]
    tensors = {k: torch.as_tensor(np.asarray(v, np.int64), device=device) for k, v in (
        ("input_ids", batch["input_ids"]), ("token_type_ids", batch["token_type_ids"]),
        ("attention_mask", batch["attention_mask"]), ("labels", labels),
        ("next_sentence_label", batch["next_sentence_labels"]))}
    losses = []

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):  # CPUs: float32, faster
            loss = forward(**tensors).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        losses[:] = [loss.detach()]

    out = {"kernels": f"torch {'compile, ' + args.peer_compile_backend if side.compiled else 'eager'}, sdpa"
                      + ("" if device == "cuda" else ", float32")}
    out["init_s"] = time.perf_counter() - start
    stage("compiling, then stepping" if side.compiled else "stepping")
    out["seconds"], warmup_s = timed(step, args.rounds, args.steps, max(args.warmup, 1))
    out["first_step_s"] = warmup_s[0]
    out["compile_s"] = max(0.0, sum(warmup_s) - len(warmup_s) * out["seconds"]) if side.compiled else None
    out["loss"] = float(losses[-1])
    del model, optimizer, forward, tensors, losses
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def timed(step, rounds: int, steps: int, warmup: int) -> tuple[float, list[float]]:
    """(median seconds per step over `rounds` windows of `steps` calls of `step()` (which blocks), the seconds
    of each of the `warmup` calls before them)."""
    warmups = []
    for _ in range(warmup):
        start = time.perf_counter()
        step()
        warmups.append(time.perf_counter() - start)
    windows = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        windows.append((time.perf_counter() - start) / steps)
    return statistics.median(windows), warmups


# ----------------------------------------------------------------------------- the report


class Report:
    """The rows so far (measured, failed or skipped), printed as one markdown table at the end, or by the
    watchdog when the hard deadline passes; the JSON file rewritten after every row."""

    def __init__(self, args, env: dict, peak: float | None):
        self.args, self.env, self.peak = args, env, peak
        self.rows: list[dict] = []
        self.kernel_checks: list[dict] = []
        self.lock = threading.Lock()
        self.printed = False

    def add(self, row: dict) -> None:
        with self.lock:
            self.rows.append(row)
            self.write()

    def write(self) -> None:
        if self.args.out:
            pathlib.Path(self.args.out).write_text(json.dumps(
                {"env": self.env, "device": self.env["device_kind"], "rows": self.rows,
                 "kernel_checks": self.kernel_checks}, indent=2, default=str))

    def table(self) -> str:
        """The markdown table: one line per row, ordered by size, phase and side."""
        order = {s: i for i, s in enumerate(self.args.sizes_list)}
        sides = {}
        for row in self.rows:
            sides.setdefault(row["side"], len(sides))
        peer_first = {OURS: 0, PEER: 2, PEER_COMPILED: 3}
        rows = sorted(self.rows, key=lambda r: (order.get(r["size"], 99), r["phase"],
                                                peer_first.get(r["side"], 1), sides[r["side"]]))
        lines = ["| size | phase | side | rows | seq/s | useful tok/s | padding | MFU | ms/step | compile s | "
                 "ratio vs peer | note |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            base = next((p for p in self.rows if p["size"] == r["size"] and p["phase"] == r["phase"]
                         and p["side"] == PEER and p.get("useful_tokens_per_second")), None)
            if r.get("useful_tokens_per_second"):
                ratio = f"{r['useful_tokens_per_second'] / base['useful_tokens_per_second']:.2f}x" if base else "-"
                mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
                compile_s = f"{r['compile_s']:.1f}" if r.get("compile_s") is not None else "-"
                cells = [f"{r['rows']}", f"{r['sequences_per_second']:,.1f}", f"{r['useful_tokens_per_second']:,.0f}",
                         f"{100 * r['padding']:.1f}%", mfu, f"{r['ms_per_step']:.1f}", compile_s, ratio]
            else:
                cells = [f"{r.get('rows', '-')}"] + ["-"] * 7
            lines.append("| " + " | ".join([r["size"], str(r["phase"]), r["side"]] + cells + [r.get("note", "")])
                         + " |")
        return "\n".join(lines)

    def finish(self, reason: str = "") -> None:
        with self.lock:
            if self.printed:
                return
            self.printed = True
            if reason:
                say(reason)
            say("\n" + self.table())
            self.write()


class Watchdog:
    """A daemon thread: past `hard_deadline_s` (from the start) it says which row and stage were running,
    prints the report's table and ends the process (exit status 3)."""

    def __init__(self, report: Report, hard_deadline_s: float):
        self.report, self.hard = report, hard_deadline_s
        self.stage, self.since = "starting", time.monotonic()
        self.active = True
        if hard_deadline_s > 0:
            threading.Thread(target=self._watch, daemon=True).start()

    def set(self, stage: str) -> None:
        self.stage, self.since = stage, time.monotonic()

    def stop(self) -> None:
        """The check is ending by itself: the watchdog does nothing more."""
        self.active = False

    def _watch(self) -> None:
        while self.active and elapsed() < self.hard:
            time.sleep(0.5)
        if not self.active:
            return
        self.report.finish(f"hard deadline {self.hard:.0f} s: stopped while {self.stage} "
                           f"({time.monotonic() - self.since:.0f} s in that stage); the table of the rows done:")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)


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


# ----------------------------------------------------------------------------- kernel checks


def _attention_reference(q, k, v, segment_ids, rate, rng):
    """softmax(q k^T + segment mask) in float32, inverted dropout with `dropout.keep_mask`'s mask (the reference
    path's HashedDropout), cast to the input dtype, @ v (tests/test_flash_attention.py's reference)."""
    import jax.numpy as jnp

    from bert_jax.model.kernels import dropout

    scores = jnp.einsum("bnqh,bnkh->bnqk", q, k, preferred_element_type=jnp.float32)
    same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    probs = jax.nn.softmax(scores + jnp.where(same, 0.0, jnp.finfo(jnp.float32).min), axis=-1)
    if rate:
        keep, keep_prob = dropout.keep_mask(rng, probs.shape, rate)
        probs = jnp.where(keep, probs * jnp.float32(1.0 / keep_prob), 0.0)
    return jnp.einsum("bnqk,bnkh->bnqh", probs.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(v.dtype)


def _segments(batch: int, length: int) -> np.ndarray:
    """int32 [batch, length]: row 0 padded (80% real tokens: segment 1, then padding: 0), row 1 packed (segments
    1, 2, 3 and padding), the rest one full segment."""
    seg = np.ones((batch, length), np.int32)
    seg[0, int(0.8 * length):] = 0
    if batch > 1:
        e = length // 8
        seg[1] = [1] * e + [2] * 3 * e + [3] * 3 * e + [0] * (length - 7 * e)
    return seg


def kernel_checks(report: Report) -> bool:
    """The gpu set's fused attention kernels against `_attention_reference`, value and gradients, bfloat16, and on
    a GPU their fwd+bwd times at BERT-Large's shapes. Prints a line per case; True when every error is within
    2e-2 of the largest entry."""
    import jax.numpy as jnp

    from bert_jax.model.kernels import flash_gpu, gpu

    on_gpu = jax.default_backend() == "gpu"
    if not on_gpu:
        gpu.IMPLEMENTATION = "xla"  # cuDNN's call lowered by XLA (the CPU tests' setting)
    shapes = [(4, 16, 128, 64), (2, 16, 512, 64)] if on_gpu else [(2, 2, 64, 64)]
    say(f"kernel checks on {jax.devices()[0].device_kind} ({'GPU kernels' if on_gpu else 'CPU: Pallas interpreter'}"
        f", cuDNN attention as {gpu.IMPLEMENTATION}), bfloat16, errors relative to the largest entry (bound 2e-2):")
    all_ok = True
    rng = jax.random.key(7)
    cases = [("flash_gpu", 0.1), ("flash_gpu", 0.0), ("cudnn", 0.0)]
    for b, n, length, h in shapes:
        keys = jax.random.split(jax.random.key(length), 4)
        q = (jax.random.normal(keys[0], (b, n, length, h)) / np.sqrt(h)).astype(jnp.bfloat16)
        k, v = (jax.random.normal(x, (b, n, length, h)).astype(jnp.bfloat16) for x in keys[1:3])
        weight = jax.random.normal(keys[3], (b, n, length, h)).astype(jnp.bfloat16)
        seg = jnp.asarray(_segments(b, length))
        for name, rate in cases:
            if name == "flash_gpu":
                kernel = functools.partial(flash_gpu.attention, segment_ids=seg, dropout_rate=rate,
                                           seed=flash_gpu.seeds(rng), interpret=not on_gpu)
            else:
                kernel = functools.partial(gpu.attention, segment_ids=seg)
            plain = functools.partial(_attention_reference, segment_ids=seg, rate=rate, rng=rng)

            @jax.jit
            def both(q, k, v, weight, kernel=kernel, plain=plain):
                out = []
                for f in (kernel, plain):
                    value, vjp = jax.vjp(f, q, k, v)
                    out.append((value, *vjp(weight)))
                return out

            label = f"{name} [{b}, {n}, {length}, {h}] dropout {rate}"
            start = time.perf_counter()
            try:
                got, want = jax.device_get(both(q, k, v, weight))
            except Exception as e:  # noqa: BLE001 - a kernel that does not compile is a result to report
                first = (str(e).strip().splitlines() or [""])[0][:300]
                say(f"  {label}: FAILED: {type(e).__name__}: {first}")
                traceback.print_exc(file=sys.stderr)
                report.kernel_checks.append({"case": label, "error": f"{type(e).__name__}: {first}"})
                all_ok = False
                continue
            errors = {}
            for out_name, g, w in zip(("context", "dq", "dk", "dv"), got, want):
                g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
                errors[out_name] = float(np.abs(g - w).max() / np.abs(w).max()) if np.isfinite(g).all() else np.inf
            ok = all(e <= 2e-2 for e in errors.values())
            all_ok &= ok
            report.kernel_checks.append({"case": label, "errors": errors, "ok": ok})
            say(f"  {label}: " + ", ".join(f"{k} {e:.1e}" for k, e in errors.items())
                + f" {'ok' if ok else 'OVER THE BOUND'} ({time.perf_counter() - start:.1f} s with compilation)")
    if on_gpu:
        _kernel_times(report, rng)
    return all_ok


def _kernel_times(report: Report, rng) -> None:
    """ms per fwd+bwd of each attention form at BERT-Large's phase 1 and packed phase 2 shapes (on a GPU)."""
    import jax.numpy as jnp

    from bert_jax.model.kernels import flash_gpu, gpu

    say("attention fwd+bwd, ms (median of 10), BERT-Large shapes, bfloat16:")
    for b, n, length, h in ((128, 16, 128, 64), (16, 16, 512, 64)):
        keys = jax.random.split(jax.random.key(1), 4)
        q, k, v, weight = (jax.random.normal(x, (b, n, length, h)).astype(jnp.bfloat16) for x in keys)
        seg = jnp.asarray(_segments(b, length))
        forms = {"flash_gpu dropout 0.1": functools.partial(flash_gpu.attention, segment_ids=seg, dropout_rate=0.1,
                                                            seed=flash_gpu.seeds(rng)),
                 "jnp + hashed dropout 0.1": functools.partial(_attention_reference, segment_ids=seg, rate=0.1,
                                                               rng=rng),
                 "cudnn, no dropout": functools.partial(gpu.attention, segment_ids=seg),
                 "flash_gpu, no dropout": functools.partial(flash_gpu.attention, segment_ids=seg),
                 "jnp, no dropout": functools.partial(_attention_reference, segment_ids=seg, rate=0.0, rng=rng)}
        cells = []
        for name, f in forms.items():
            grad = jax.jit(jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v).astype(jnp.float32) * weight),
                                    argnums=(0, 1, 2)))
            try:
                jax.block_until_ready(grad(q, k, v))
                times = []
                for _ in range(10):
                    start = time.perf_counter()
                    jax.block_until_ready(grad(q, k, v))
                    times.append(time.perf_counter() - start)
                ms = 1e3 * statistics.median(times)
                cells.append(f"{name} {ms:.2f}")
                report.kernel_checks.append({"time": f"{name} [{b}, {n}, {length}, {h}]", "ms": ms})
            except Exception as e:  # noqa: BLE001
                cells.append(f"{name} failed ({type(e).__name__})")
        say(f"  [{b}, {n}, {length}, {h}]: " + "; ".join(cells))


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
