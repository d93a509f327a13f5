"""Device check: BERT-Base and BERT-Large pre-training steps on one accelerator in bfloat16, beside transformers'
PyTorch BertForPreTraining (SDPA attention, bfloat16 autocast, fused AdamW) in the same run.

  benchmarks/device_check.sh                       # = python benchmarks/device_check.py --sizes base,large
  python benchmarks/device_check.py --sizes tiny --steps 2 --warmup 1 --p1_batch 8 --p2_batch 2  # a smoke run

Needs the gpu and test extras on the device (`pip install -e '.[gpu,test]'`); on a machine without a GPU it
runs on the CPU (the smoke run above checks the script, not the speed).

Phases, as pre-training runs them:
  phase 1  length 128, 20 predictions, one instance per row, every instance full length (the paper's phase 1,
           where almost every instance fills its 128 tokens);
  phase 2  length 512, 80 predictions; instance lengths drawn uniformly from [32, 512] (about half of the
           slots padding unpacked, as Krell et al. 2021 measure on Wikipedia at 512): ours packed by
           bert_jax.data.packing (the packer training uses), the peer padded one instance per row.
Token ids are random (speed does not depend on them); the batches are built before timing.

Per side, size and phase: sequences/s (instances), useful tokens/s (real tokens), and MFU = the analytic
training FLOPs of the rows computed (bert_jax.flops, padded rows counted whole) per second over the device's
published dense bfloat16 peak (`bert_jax.flops.PEAK_BF16_FLOPS_PER_DEVICE`, or --peak_tflops). Each rate is the
median of --rounds windows of --steps steps after --warmup steps (compilation excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax import flops, modeling, sharding, train  # noqa: E402
from bert_jax.configs import pretrain  # noqa: E402
from bert_jax.data import packing  # noqa: E402

PHASES = {1: (128, 20), 2: (512, 80)}
BATCHES = {"tiny": (64, 8), "mini": (128, 16), "base": (256, 32), "large": (128, 16)}  # rows: phase 1, phase 2


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
    """The first `rows` packed rows of `stream` (bert_jax.data.packing, as training packs)."""
    import grain

    k = packing.default_max_instances(length)
    ds = packing.pack(grain.MapDataset.source(stream).to_iter_dataset(), max_seq_length=length,
                      max_predictions_per_seq=predictions, max_instances=k,
                      num_packing_bins=packing.DEFAULT_PACKING_BINS, seed=0)
    it = iter(ds)
    return packing.finalize_batch([next(it) for _ in range(rows)])


def timed(step, rounds: int, steps: int, warmup: int) -> float:
    """Median seconds per step over `rounds` windows of `steps` calls of `step()` (which blocks)."""
    for _ in range(warmup):
        step()
    windows = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        windows.append((time.perf_counter() - start) / steps)
    return statistics.median(windows)


def ours(size: str, phase: int, batch: dict, args) -> float:
    """Seconds per step of bert_jax's train step (bfloat16 compute, dropout on, kernels=auto) on `batch`."""
    config = pretrain.get_config(size)
    config.model.dtype = "bfloat16"
    length, predictions = PHASES[phase]
    config.phases = [pretrain.phase(length, predictions, 1.0, "", len(batch["input_ids"]),
                                    packing="segment_ids" in batch)]
    config.total_steps, config.warmup_steps = 1000, 10
    mesh = sharding.make_mesh(1, 1, 1, jax.devices()[:1])
    program = train.build(config, mesh)
    state, _ = train.create_train_state(program.model, program.tx, mesh, 0, program.shardings)
    device_batch = train.global_batch(batch, mesh)
    holder = [state]

    def step():
        holder[0], metrics = program.train_step(holder[0], device_batch)
        jax.block_until_ready(metrics["loss"])

    with jax.set_mesh(mesh):
        return timed(step, args.rounds, args.steps, args.warmup)


def peer(size: str, batch: dict, args) -> float:
    """Seconds per step of transformers' BertForPreTraining (SDPA, bfloat16 autocast, fused AdamW) on `batch`."""
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    m = pretrain.model_config(size)
    config = transformers.BertConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size,
                                     num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
                                     intermediate_size=m.intermediate_size, attn_implementation="sdpa")
    model = transformers.BertForPreTraining(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=device == "cuda")
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    rows = np.repeat(np.arange(len(labels)), batch["masked_lm_positions"].shape[1])
    real = batch["masked_lm_weights"].reshape(-1) > 0
    labels[rows[real], batch["masked_lm_positions"].reshape(-1)[real]] = batch["masked_lm_ids"].reshape(-1)[real]
    tensors = {k: torch.as_tensor(np.asarray(v, np.int64), device=device) for k, v in (
        ("input_ids", batch["input_ids"]), ("token_type_ids", batch["token_type_ids"]),
        ("attention_mask", batch["attention_mask"]), ("labels", labels),
        ("next_sentence_label", batch["next_sentence_labels"]))}

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(**tensors).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    return timed(step, args.rounds, args.steps, args.warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="base,large")
    parser.add_argument("--phases", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--p1_batch", type=int, default=0, help="phase-1 rows (0: the size's default)")
    parser.add_argument("--p2_batch", type=int, default=0, help="phase-2 packed rows (0: the size's default)")
    parser.add_argument("--peak_tflops", type=float, default=0.0, help="the device's bf16 peak (0: published)")
    parser.add_argument("--no_peer", action="store_true")
    parser.add_argument("--out", default="", help="also write the rows as JSON here")
    args = parser.parse_args()
    kind = jax.devices()[0].device_kind
    peak = args.peak_tflops * 1e12 or flops.peak_flops_per_device(kind)
    print(f"device: {kind} ({jax.default_backend()}), bf16 peak: {peak / 1e12 if peak else 'unknown'} TFLOP/s",
          flush=True)
    rows = []
    for size in args.sizes.split(","):
        bert = modeling.BertConfig.from_dict(pretrain.model_config(size))
        for phase in map(int, args.phases.split(",")):
            length, predictions = PHASES[phase]
            rng = np.random.default_rng(phase)
            if phase == 1:
                count = args.p1_batch or BATCHES[size][0]
                stream = instances(rng, count, length, predictions, full=True)
                ours_batch = peer_batch = padded(stream, length, predictions)
            else:
                count = args.p2_batch or BATCHES[size][1]
                stream = instances(rng, 40 * count, length, predictions, full=False)
                ours_batch = packed(stream, count, length, predictions)
                taken = int(ours_batch["next_sentence_weights"].sum())  # the instances in our rows
                peer_batch = padded(stream[:taken], length, predictions)
            sides = [("bert_jax", ours_batch, lambda b: ours(size, phase, b, args))]
            if not args.no_peer:
                sides.append(("transformers", peer_batch, lambda b: peer(size, b, args)))
            for side, batch, run in sides:
                seconds = run(batch)
                sequences = (float(batch["next_sentence_weights"].sum()) if "next_sentence_weights" in batch
                             else len(batch["input_ids"]))
                useful = float(batch["attention_mask"].sum())
                row_flops = flops.train_flops_per_step(bert, len(batch["input_ids"]), length,
                                                       batch["masked_lm_ids"].shape[1])
                row = {"size": size, "phase": phase, "side": side, "rows": len(batch["input_ids"]),
                       "sequences_per_second": sequences / seconds, "useful_tokens_per_second": useful / seconds,
                       "padding": 1.0 - useful / batch["attention_mask"].size,
                       "mfu": row_flops / seconds / peak if peak else None, "ms_per_step": 1e3 * seconds}
                rows.append(row)
                mfu = f"{100 * row['mfu']:.1f}%" if peak else "-"
                print(f"{size:>6} phase {phase} {side:>12}: {row['rows']:4d} rows, "
                      f"{row['sequences_per_second']:9.1f} seq/s, {row['useful_tokens_per_second']:11.0f} useful tok/s, "
                      f"padding {100 * row['padding']:4.1f}%, MFU {mfu}, {row['ms_per_step']:.1f} ms/step", flush=True)
    for size in args.sizes.split(","):
        for phase in map(int, args.phases.split(",")):
            pair = {r["side"]: r for r in rows if r["size"] == size and r["phase"] == phase}
            if len(pair) == 2:
                ratio = pair["bert_jax"]["useful_tokens_per_second"] / pair["transformers"]["useful_tokens_per_second"]
                print(f"{size} phase {phase}: bert_jax / transformers useful tokens/s = {ratio:.2f}x")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"device": kind, "rows": rows}, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    main()
