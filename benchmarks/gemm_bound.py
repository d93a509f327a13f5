"""How much of the pre-training step its matmuls take, with XLA's GEMMs and with torch's (MKL), same run.

  .venv/bin/python benchmarks/gemm_bound.py [--size base] [--rounds 3]

Lists every matmul of one `BertForPreTraining` train step (sparse MLM at 20 positions, batch and length
of benchmarks/train_step.py). Per encoder layer: the four attention projections and the two
feed-forward matmuls, each forward, input gradient (dy @ W^T) and kernel gradient (x^T @ dy); attention's
scores and context batched matmuls and their four gradients. Then the MLM head's transform and tied
decoder, the pooler and the NSP classifier, each forward and both gradients. Each shape is timed alone
as a jitted jnp.matmul and as torch.matmul (float32, torch threads = cores; fastest of `rounds`
timings), all as row-major a [M, K] @ b [K, N]: XLA's transposed layouts run within a few percent of it
at these shapes (issue 4's notes).

Printed: the list with counts and both libraries' times; their sums (the step's GEMM time if its
matmuls ran back to back at the isolated speed); our measured step time beside them; the GEMM-only share
of our step; and the MFU bound of each library: analytic FLOPs over its GEMM-only time, against the
benchmark's ceiling (best of jnp.dot and torch.matmul on 2048^3, the highest of `rounds` measurements),
i.e. the MFU the step would reach with that library's GEMMs if all its non-matmul work took no time.
"""

import argparse
import math
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import train_step as bench  # noqa: E402
from bert_jax.model import flops, modeling  # noqa: E402
from bert_jax.configs import pretrain  # noqa: E402


def step_gemms(config: modeling.BertConfig, batch: int, length: int, predictions: int):
    """-> [(name, count, a_shape, b_shape)]: the matmuls of one train step as a [.., M, K] @ b [.., K, N]."""
    d, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    heads, head_size, layers = config.num_attention_heads, config.head_size, config.num_hidden_layers
    tokens, rows, pairs = batch * length, batch * predictions, batch * heads
    out = []

    def dense(name, count, m, k, n):  # y [m, n] = x [m, k] @ w [k, n], and its two gradients
        out.append((f"{name} forward", count, (m, k), (k, n)))
        out.append((f"{name} d input", count, (m, n), (n, k)))
        out.append((f"{name} d kernel", count, (k, m), (m, n)))

    dense("attention projection (q, k, v, out)", 4 * layers, tokens, d, d)
    dense("feed-forward in", layers, tokens, d, i)
    dense("feed-forward out", layers, tokens, i, d)
    per_head, per_head_t, square = (pairs, length, head_size), (pairs, head_size, length), (pairs, length, length)
    out.append(("scores q @ k^T forward", layers, per_head, per_head_t))
    out.append(("scores d q, d k", 2 * layers, square, per_head))
    out.append(("context p @ v forward", layers, square, per_head))
    out.append(("context d p", layers, per_head, per_head_t))
    out.append(("context d v", layers, square, per_head))
    dense("MLM transform", 1, rows, d, d)
    dense("MLM tied decoder", 1, rows, d, v)
    dense("pooler", 1, batch, d, d)
    dense("NSP classifier", 1, batch, d, 2)
    return out


def gemm_flops(a_shape, b_shape) -> float:
    return 2.0 * math.prod(a_shape) * b_shape[-1]


def fastest(run, rounds: int, min_seconds: float = 0.05) -> float:
    """Seconds per call of `run()` (which blocks until done): fastest of `rounds` timings."""
    run()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            run()
        if time.perf_counter() - start >= min_seconds:
            break
        calls *= 2
    best = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


_matmul = jax.jit(jnp.matmul)  # one jitted function: shapes that recur in the list compile once


def time_both(a_shape, b_shape, rounds: int) -> tuple[float, float]:
    """-> (seconds of jnp.matmul, seconds of torch.matmul) for a float32 a @ b."""
    import torch

    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape, np.float32)
    b = rng.standard_normal(b_shape, np.float32)
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return (fastest(lambda: _matmul(ja, jb).block_until_ready(), rounds),
            fastest(lambda: torch.matmul(ta, tb), rounds))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="base", choices=sorted(bench.SIZES))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(os.cpu_count())
    size, batch_size = bench.SIZES[args.size]
    config = pretrain.get_config(size)
    model_config = modeling.BertConfig.from_dict(config.model)
    gemms = step_gemms(model_config, batch_size, bench.LENGTH, bench.PREDICTIONS)

    print(f"{args.size}: batch {batch_size}, length {bench.LENGTH}, {bench.PREDICTIONS} predictions; "
          f"{os.cpu_count()} cores, float32")
    print(f"{'matmul':<46}{'count':>6}{'a @ b':>30}{'GFLOP':>9}{'XLA ms':>9}{'torch ms':>10}")
    total = {"flops": 0.0, "xla": 0.0, "torch": 0.0}
    for name, count, a_shape, b_shape in gemms:
        t_xla, t_torch = time_both(a_shape, b_shape, args.rounds)
        gemm = gemm_flops(a_shape, b_shape)
        total["flops"] += count * gemm
        total["xla"] += count * t_xla
        total["torch"] += count * t_torch
        shapes = f"{'x'.join(map(str, a_shape))} @ {'x'.join(map(str, b_shape))}"
        print(f"{name:<46}{count:>6}{shapes:>30}{gemm / 1e9:>9.3f}{t_xla * 1e3:>9.2f}{t_torch * 1e3:>10.2f}")

    model_flops = flops.train_flops_per_step(model_config, batch_size, bench.LENGTH, bench.PREDICTIONS)
    run = bench.make_ours(config, bench.make_batch(batch_size, model_config.vocab_size))
    run(2)
    step = min(run(3) for _ in range(args.rounds))
    ceiling = max(bench.matmul_ceiling()[0] for _ in range(args.rounds))
    print(f"matmul FLOPs {total['flops'] / 1e9:.1f} G (analytic model FLOPs {model_flops / 1e9:.1f} G)")
    print(f"our train step: {step:.3f} s/step (fastest of {args.rounds} windows of 3), "
          f"MFU {model_flops / step / ceiling:.0%} of a {ceiling / 1e9:.1f} GFLOP/s ceiling")
    for lib in ("xla", "torch"):
        print(f"{lib:>5} GEMMs alone: {total[lib]:.3f} s = {total[lib] / step:.0%} of our step; "
              f"{total['flops'] / total[lib] / 1e9:.1f} GFLOP/s; MFU bound {model_flops / total[lib] / ceiling:.0%}")


if __name__ == "__main__":
    main()
