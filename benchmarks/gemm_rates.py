"""GEMM rates of XLA:CPU against torch (MKL / oneDNN) at BERT-Base's shapes, per core and per dtype layout.

  .venv/bin/python benchmarks/gemm_rates.py [--rounds 5]

Two tables, in GFLOP/s (fastest of `rounds` timings of a jitted jnp.dot / lax.dot_general and of
torch.matmul; a multiply-add counts 2 FLOPs):

1. float32 row-major a [M, K] @ b [K, N] at the feed-forward shapes and 2048^3, on one core and on all
   cores. The one-core figures come from a child process pinned to one core (os.sched_setaffinity before
   jax is imported: XLA sizes its thread pool by the usable cores; torch threads 1). Where XLA's and MKL's
   rates differ by the same factor on one core and on all, the gap is the GEMM kernel, not threading.
2. bfloat16 operands, all cores: the result dtype and the operand layouts (x @ w, x @ w^T, x^T @ w) that
   XLA:CPU runs on the CPU's bfloat16 matrix units (AMX where present) and those it converts to float32
   first. torch.matmul in bfloat16 beside them.

Issue 4's notes and README's "Train-step speed on CPU" quote these figures.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ONE_CORE_CHILD = "--one-core-child"
if ONE_CORE_CHILD in sys.argv:  # pinned before jax starts: XLA sizes its thread pool by the usable cores
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.gemm_bound import fastest, gemm_flops  # noqa: E402

SHAPES = ((1024, 768, 3072), (1024, 3072, 768), (2048, 2048, 2048))  # (M, K, N)
CORES = len(os.sched_getaffinity(0))  # 1 in the pinned child
torch.set_num_threads(CORES)


def float32_rates(rounds: int) -> list[tuple[float, float]]:
    """-> [(xla, torch) GFLOP/s] for each of SHAPES, float32, on the cores this process may use."""
    dot = jax.jit(jnp.dot)
    rng = np.random.default_rng(0)
    out = []
    for m, k, n in SHAPES:
        a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
        ja, jb, ta, tb = jnp.asarray(a), jnp.asarray(b), torch.from_numpy(a), torch.from_numpy(b)
        flop = gemm_flops((m, k), (k, n))
        out.append((flop / fastest(lambda: dot(ja, jb).block_until_ready(), rounds) / 1e9,
                    flop / fastest(lambda: torch.matmul(ta, tb), rounds) / 1e9))
    return out


def bfloat16_rates(rounds: int) -> list[tuple[str, float]]:
    """-> [(form, GFLOP/s)] of bfloat16 matmuls at 1024 x 768 x 3072, on all cores."""
    m, k, n = SHAPES[0]
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k), np.float32), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((k, n), np.float32), jnp.bfloat16)
    x_t, w_t = x.T.copy(), w.T.copy()  # the same values stored transposed: every form computes x @ w
    f32 = jnp.float32
    forms = {
        "xla  x @ w     -> float32": (lambda x, w: jnp.dot(x, w, preferred_element_type=f32), (x, w)),
        "xla  x @ w     -> bfloat16": (lambda x, w: jnp.dot(x, w), (x, w)),
        "xla  x @ w^T   -> float32": (lambda x, w_t: jax.lax.dot_general(
            x, w_t, (((1,), (1,)), ((), ())), preferred_element_type=f32), (x, w_t)),
        "xla  x^T @ w   -> float32": (lambda x_t, w: jax.lax.dot_general(
            x_t, w, (((0,), (0,)), ((), ())), preferred_element_type=f32), (x_t, w)),
    }
    flop = gemm_flops((m, k), (k, n))
    out = []
    for name, (fn, args) in forms.items():
        jitted = jax.jit(fn)
        out.append((name, flop / fastest(lambda: jitted(*args).block_until_ready(), rounds) / 1e9))
    tx = torch.from_numpy(np.asarray(x, np.float32)).bfloat16()
    tw = torch.from_numpy(np.asarray(w, np.float32)).bfloat16()
    out.append(("torch x @ w   -> bfloat16", flop / fastest(lambda: torch.matmul(tx, tw), rounds) / 1e9))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="timings per matmul; the fastest is kept")
    parser.add_argument(ONE_CORE_CHILD, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_core_child:  # already pinned to one core, at import
        print(json.dumps(float32_rates(args.rounds)))
        return
    child = subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds), ONE_CORE_CHILD],
                           capture_output=True, text=True, check=True)
    one_core = json.loads(child.stdout.strip().splitlines()[-1])
    all_cores = float32_rates(args.rounds)
    print(f"float32 GFLOP/s: one core, and all {CORES} cores")
    print(f"{'M x K x N':<18}{'xla 1':>9}{'torch 1':>9}{'ratio':>7}{'xla all':>9}{'torch all':>11}{'ratio':>7}")
    for (m, k, n), (x1, t1), (xa, ta) in zip(SHAPES, one_core, all_cores):
        print(f"{f'{m}x{k}x{n}':<18}{x1:>9.1f}{t1:>9.1f}{x1 / t1:>7.2f}{xa:>9.1f}{ta:>11.1f}{xa / ta:>7.2f}")
    print(f"\nbfloat16 operands, {'x'.join(map(str, SHAPES[0]))}, all {CORES} cores, GFLOP/s")
    for name, rate in bfloat16_rates(args.rounds):
        print(f"{name:<30}{rate:>9.1f}")


if __name__ == "__main__":
    main()
