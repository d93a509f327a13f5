"""The device check's measurements (benchmarks/device_check.py): one train step timed on one batch, bert_jax's
(its train step lowered and compiled ahead of the first call, both timed) or the peer's, transformers'
BertForPreTraining (SDPA attention, bfloat16 autocast, fused AdamW; eager, or under torch.compile, whose compile
time is its warm-up steps' time less as many median steps). Each rate is the median of args.rounds windows of
args.steps steps after args.warmup steps.
"""

from __future__ import annotations

import gc
import statistics
import time

import jax
import numpy as np

from bert_jax.configs import pretrain
from bert_jax.training import pretraining, sharding
from device_check_rows import PHASES, Side


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
