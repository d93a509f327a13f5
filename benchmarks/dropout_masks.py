"""Dropout on the attention probabilities: seconds per forward + backward of each way of drawing the mask.

  python benchmarks/dropout_masks.py                           # [128, 16, 128, 128] on a GPU, smaller on a CPU
  python benchmarks/dropout_masks.py --shape 16,16,128,128     # any shape

The tensor is BERT-Large phase 1's attention probabilities (batch 128, 16 heads, 128 x 128) in float32, one
layer's worth; a CPU run defaults to a 16th of it ([8, 16, 128, 128]). Each form computes loss = sum(dropout(x) *
w) and its gradient with respect to x in one jitted program, a new key per call (folded with the call's index,
as a training step folds its step), rate 0.1:

  flax nn.Dropout with the JAX PRNG implementation `jax_default_prng_impl` would give: threefry2x32 (JAX's
  default, partitionable as the reference kernel set runs it; and not partitionable), rbg and unsafe_rbg
  (`lax.rng_bit_generator`, what MaxText trains with);
  bert_jax.model.kernels.dropout.HashedDropout (every kernel set but the reference): two 32-bit seeds per call, each
  element's keep bit a hash of its index;
  none: loss = sum(x * w) alone, the floor every form pays.

Prints ms per call (median of --rounds windows of --iters calls after one warm-up) and the ratio to threefry's.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bert_jax.model.kernels import dropout  # noqa: E402

GPU_SHAPE = (128, 16, 128, 128)
CPU_SHAPE = (8, 16, 128, 128)
RATE = 0.1

# name: (module or None, PRNG implementation of the key, threefry partitionable)
FORMS = {
    "none (x * w only)": (None, "threefry2x32", True),
    "flax threefry2x32 (partitionable)": (nn.Dropout, "threefry2x32", True),
    "flax threefry2x32 (not partitionable)": (nn.Dropout, "threefry2x32", False),
    "flax rbg": (nn.Dropout, "rbg", True),
    "flax unsafe_rbg": (nn.Dropout, "unsafe_rbg", True),
    "HashedDropout": (dropout.HashedDropout, "threefry2x32", True),
}
BASELINE = "flax threefry2x32 (partitionable)"


def program(module_cls):
    """jit((x, w, key, i) -> (loss, d loss / d x)) for one form, the key folded with i inside."""
    def loss(x, w, key, i):
        if module_cls is None:
            return jnp.sum(x * w)
        rng = jax.random.fold_in(key, i)
        if module_cls is nn.Dropout:
            y = nn.Dropout(RATE).apply({}, x, deterministic=False, rngs={"dropout": rng})
        else:
            y = module_cls(RATE).apply({}, x, False, rngs={"dropout": rng})
        return jnp.sum(y * w)

    return jax.jit(jax.value_and_grad(loss))


def measure(name: str, x, w, iters: int, rounds: int) -> float:
    """Median seconds per call of `name`'s program (compiled and run once first)."""
    module_cls, impl, partitionable = FORMS[name]
    previous = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", partitionable)  # read when the program is traced
    try:
        key = jax.random.key(0, impl=impl)
        step = program(module_cls)
        jax.block_until_ready(step(x, w, key, 0))
        windows = []
        for r in range(rounds):
            start = time.perf_counter()
            for i in range(iters):
                out = step(x, w, key, 1 + r * iters + i)
            jax.block_until_ready(out)
            windows.append((time.perf_counter() - start) / iters)
    finally:
        jax.config.update("jax_threefry_partitionable", previous)
    return statistics.median(windows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="", help="comma-separated; default 128,16,128,128 on a GPU, "
                        "8,16,128,128 elsewhere")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--forms", default=",".join(FORMS), help="comma-separated names of FORMS")
    args = parser.parse_args()
    on_gpu = jax.default_backend() == "gpu"
    shape = tuple(int(d) for d in args.shape.split(",")) if args.shape else (GPU_SHAPE if on_gpu else CPU_SHAPE)
    names = [n.strip() for n in args.forms.split(",") if n.strip()]
    unknown = [n for n in names if n not in FORMS]
    if unknown:
        parser.error(f"unknown forms {unknown}; known: {list(FORMS)}")
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.nn.softmax(jax.random.normal(kx, shape, jnp.float32), axis=-1)
    w = jax.random.normal(kw, shape, jnp.float32)
    elements = x.size
    print(f"dropout on float32 {list(shape)} ({elements / 1e6:.1f} M elements, {4 * elements / 2 ** 20:.0f} MiB), "
          f"rate {RATE}, forward + backward, on {jax.devices()[0].device_kind} ({jax.default_backend()}), "
          f"jax {jax.__version__}", flush=True)
    results = {}
    for name in names:
        results[name] = measure(name, x, w, args.iters, args.rounds)
        print(f"  {name}: {1e3 * results[name]:.3f} ms", flush=True)
    base = results.get(BASELINE)
    print("\n| form | ms per fwd+bwd | vs threefry |\n|---|---|---|")
    for name, seconds in results.items():
        ratio = f"{seconds / base:.2f}x" if base else "-"
        print(f"| {name} | {1e3 * seconds:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
