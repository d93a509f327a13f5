"""Train-step speed: bert_jax against transformers' PyTorch BertForPreTraining + AdamW, same run.

  .venv/bin/python benchmarks/train_step.py [--sizes mini,base] [--rounds 5] [--steps 3] [--malloc default]
      [--kernels auto,reference] [--ablate]

For each size: sequences/s of our jitted `train_step` (one device using all cores, float32, dropout on,
sparse MLM at 20 positions) and of the peer (transformers BertForPreTraining in train mode, masked-LM
labels at the same 20 positions, torch.optim.AdamW, torch threads = the machine's cores), measured in
alternating windows so that both see the same load (this machine's speed drifts by 10-20% over
minutes): the printed rates are medians over the windows and the ratio is the median of the
per-window ratios. MFU = analytic model FLOPs per second (bert_jax.model.flops) over a matmul ceiling
measured in the same window (the best of float32 jnp.dot and torch.matmul on 2048x2048 matrices), and
for information over jnp.dot's alone; medians over the windows.

--malloc tuned re-runs the whole benchmark (both sides: one process) under bert_jax.training.host_malloc's glibc
tunables, which keep XLA:CPU's per-step buffer mapped between steps; the default is glibc's own settings,
the conditions of every figure in README before 2026-11-23. The GLIBC_TUNABLES in effect are printed.

--kernels runs our side once per `model.kernels` set (bert_jax.model.kernels; auto = xla_cpu here), each
against the peer in its own alternating windows. --ablate adds, per xla_cpu kernel, a run of the xla_cpu
set with that one kernel swapped back to its reference form: a kernel whose removal does not slow the
step down does not earn its place.

Bars: ratio >= 2 on mini (L=4, H=256, A=4, batch 32, length 128) and >= 1.2 on base (batch 8),
MFU >= 60% on base.
"""

import argparse
import contextlib
import dataclasses
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax.training import host_malloc, pretraining, sharding, steps
from bert_jax.model import flops, kernels, modeling  # noqa: E402
from bert_jax.configs import pretrain  # noqa: E402

SIZES = {"mini": ("mini", 32), "base": ("base", 8)}
LENGTH, PREDICTIONS = 128, 20


def make_batch(batch, vocab, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(batch, LENGTH)).astype(np.int32)
    positions = np.sort(np.stack([rng.choice(np.arange(1, LENGTH - 1), PREDICTIONS, replace=False)
                                  for _ in range(batch)]), axis=1).astype(np.int32)
    return {
        "input_ids": ids, "token_type_ids": (np.arange(LENGTH)[None] >= LENGTH // 2).repeat(batch, 0).astype(np.int32),
        "attention_mask": np.ones((batch, LENGTH), np.int32), "masked_lm_positions": positions,
        "masked_lm_ids": np.take_along_axis(ids, positions, 1), "masked_lm_weights": np.ones((batch, PREDICTIONS), np.float32),
        "next_sentence_labels": rng.integers(0, 2, size=batch).astype(np.int32),
    }


def make_ours(config, batch):
    """Our jitted train step on one device -> run(n): seconds per step over n steps."""
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model = pretraining.create_model(config)
    tx, schedule = steps.create_optimizer(config)
    state, shardings = pretraining.create_train_state(model, tx, mesh, 0)
    step_fn, _ = pretraining.compile_steps(model, tx, schedule, mesh, shardings)
    with jax.set_mesh(mesh):
        device_batch = pretraining.global_batch(batch, mesh)
    holder = [state]

    def run(n):
        with jax.set_mesh(mesh):
            start = time.perf_counter()
            state = holder[0]
            for _ in range(n):
                state, _ = step_fn(state, device_batch)
            jax.block_until_ready(state)
            holder[0] = state
        return (time.perf_counter() - start) / n

    return run


def make_peer(config, batch):
    """transformers' BertForPreTraining + torch AdamW, same config and batch -> run(n)."""
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count())
    hf = transformers.BertForPreTraining(transformers.BertConfig(
        **{k: config.model[k] for k in modeling.BERT_CONFIG_FIELDS})).train()
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    np.put_along_axis(labels, batch["masked_lm_positions"], batch["masked_lm_ids"], 1)
    inputs = {k: torch.from_numpy(batch[k].astype(np.int64)) for k in ("input_ids", "token_type_ids", "attention_mask")}
    labels = torch.from_numpy(labels)
    nsp = torch.from_numpy(batch["next_sentence_labels"].astype(np.int64))

    def step():
        out = hf(**inputs, labels=labels, next_sentence_label=nsp)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def run(n):
        start = time.perf_counter()
        for _ in range(n):
            step()
        return (time.perf_counter() - start) / n

    return run


def compare(config, batch, rounds, steps, model_flops):
    """Alternates `rounds` windows of: the matmul ceiling, `steps` steps of ours, `steps` steps of the peer
    (after two warm-up steps each), so that all three see the same machine load.

    Returns medians over the windows: (s/step ours, s/step peer, peer/ours ratio, MFU against the best
    ceiling, MFU against jnp.dot's ceiling, best ceiling in FLOP/s); ratio and MFU are computed per window.
    """
    ours, peer = make_ours(config, batch), make_peer(config, batch)
    ours(2), peer(2)
    windows = []
    for _ in range(rounds):
        ceiling, jax_rate, _ = matmul_ceiling()
        t_ours, t_peer = ours(steps), peer(steps)
        windows.append((t_ours, t_peer, t_peer / t_ours, model_flops / t_ours / ceiling,
                        model_flops / t_ours / jax_rate, ceiling))
    return tuple(statistics.median(column) for column in zip(*windows))


@jax.jit
def _square(x):
    return x @ x


def matmul_ceiling(n=2048, repeats=5):
    """float32 n x n matmul rates -> (best, jnp.dot, torch.matmul) in FLOP/s."""
    import torch

    a = jnp.ones((n, n), jnp.float32)
    _square(a).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        out = _square(a)
    out.block_until_ready()
    jax_rate = 2 * n**3 * repeats / (time.perf_counter() - start)
    t = torch.ones(n, n)
    torch.matmul(t, t)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(t, t)
    torch_rate = 2 * n**3 * repeats / (time.perf_counter() - start)
    return max(jax_rate, torch_rate), jax_rate, torch_rate


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="mini,base")
    parser.add_argument("--rounds", type=int, default=5, help="alternating windows of ours and the peer")
    parser.add_argument("--steps", type=int, default=3, help="steps per window")
    parser.add_argument("--kernels", default="auto", help="model.kernels sets to run, comma-separated")
    parser.add_argument("--ablate", action="store_true",
                        help="also xla_cpu with each kernel in turn swapped back to the reference form")
    parser.add_argument("--malloc", choices=("default", "tuned"), default="default",
                        help="glibc malloc settings for the whole run: glibc's defaults, or bert_jax.training.host_malloc's")
    args = parser.parse_args()
    if args.malloc == "tuned":
        host_malloc.reexec_tuned("train_step")  # returns when already tuned (or not glibc)
    print(f"{jax.device_count()} JAX device(s), {os.cpu_count()} cores, "
          f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES') or '(unset)'}")
    print(f"{'size':<6}{'kernels':<22}{'batch':>6}{'ours seq/s':>12}{'peer seq/s':>12}{'ratio':>8}{'MFU':>7}{'MFU/jnp.dot':>13}"
          f"{'ceiling GFLOP/s':>17}")
    variants = [(k, None) for k in args.kernels.split(",")]
    if args.ablate:
        variants += [("xla_cpu", f.name) for f in dataclasses.fields(kernels.Kernels) if f.name != "name"]
    for name in args.sizes.split(","):
        size, batch_size = SIZES[name]
        for kernel_set, swapped in variants:
            config = pretrain.get_config(size)
            config.model.kernels = kernel_set
            batch = make_batch(batch_size, config.model.vocab_size)
            model_flops = flops.train_flops_per_step(modeling.BertConfig.from_dict(config.model), batch_size,
                                                     LENGTH, PREDICTIONS)
            with kernels.swapped("xla_cpu", swapped) if swapped else contextlib.nullcontext():
                ours, peer, ratio, mfu, mfu_jax, ceiling = compare(config, batch, args.rounds, args.steps, model_flops)
            label = f"{kernel_set}" + (f" -{swapped}" if swapped else "")
            print(f"{name:<6}{label:<22}{batch_size:>6}{batch_size / ours:>12.2f}{batch_size / peer:>12.2f}"
                  f"{ratio:>7.2f}x{mfu:>7.0%}{mfu_jax:>13.0%}{ceiling / 1e9:>17.1f}", flush=True)


if __name__ == "__main__":
    main()
