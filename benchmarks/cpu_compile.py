"""XLA's CPU compile and step time with its fusion emitters (the default) against its loop emitters
(`--xla_cpu_use_fusion_emitters=false`, the suite's FAST_COMPILE in tests/conftest.py), at -O0 (the suite's
setting) and -O2 (XLA's default).

  .venv/bin/python benchmarks/cpu_compile.py [--repeats 3]

Each setting runs in a fresh process (XLA_FLAGS are read once): the gradient of the tiny test model
(tests/test_modeling.py's TINY, batch 13, length 7, with dropout) and one pre-training step of `pretrain:tiny`
(Google's vocabulary size, batch 32, length 128, 20 predictions) are compiled, then run. Prints the best of
`repeats` processes per setting: compile seconds and the step's milliseconds, and the ratios against the fusion
emitters at the same optimisation level.
"""

import argparse
import json
import os
import subprocess
import sys

from shared_data import ROOT

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp, numpy as np
from bert_jax.checkpoints import weights
from bert_jax.model import modeling
from bert_jax.training import pretraining, sharding, steps
from bert_jax.configs import pretrain
import test_modeling as tm

out = {}
x = tm._inputs()
params = weights.init_params(tm.TINY, seed=1)
def loss(p):
    o = modeling.BertForPreTraining(tm.TINY).apply({"params": p}, **x, deterministic=False,
                                                  rngs={"dropout": jax.random.key(7)})
    return jnp.sum(o.mlm_logits ** 2) + jnp.sum(o.nsp_logits)
t = time.perf_counter(); grad = jax.jit(jax.grad(loss)).lower(params).compile()
out["tiny_grad_compile_s"] = time.perf_counter() - t

config = pretrain.get_config("tiny")
mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
model = pretraining.create_model(config)
tx, schedule = steps.create_optimizer(config)
state, shardings = pretraining.create_train_state(model, tx, mesh, 0)
step, _ = pretraining.compile_steps(model, tx, schedule, mesh, shardings)
rng = np.random.default_rng(0)
batch = {"input_ids": rng.integers(1, 30000, (32, 128), dtype=np.int32),
         "token_type_ids": np.zeros((32, 128), np.int32), "attention_mask": np.ones((32, 128), np.int32),
         "masked_lm_positions": rng.integers(0, 128, (32, 20), dtype=np.int32),
         "masked_lm_ids": rng.integers(1, 30000, (32, 20), dtype=np.int32),
         "masked_lm_weights": np.ones((32, 20), np.float32), "next_sentence_labels": np.zeros((32,), np.int32)}
with jax.set_mesh(mesh):
    b = pretraining.global_batch(batch, mesh)
    t = time.perf_counter(); compiled = step.lower(state, b).compile()
    out["tiny_step_compile_s"] = time.perf_counter() - t
    state, m = compiled(state, b); jax.block_until_ready(m)
    times = []
    for _ in range(5):
        t = time.perf_counter(); state, m = compiled(state, b); jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
out["tiny_step_ms"] = 1000 * min(times)
print(json.dumps(out))
"""

SETTINGS = {
    "-O0 fusion emitters": "--xla_backend_optimization_level=0",
    "-O0 loop emitters": "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false",
    "-O2 fusion emitters": "--xla_backend_optimization_level=2",
    "-O2 loop emitters": "--xla_backend_optimization_level=2 --xla_cpu_use_fusion_emitters=false",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="processes per setting (the best is kept)")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR",)}
    results = {}
    for _ in range(args.repeats):  # interleaved, so that a slow minute of the machine hits every setting
        for name, flags in SETTINGS.items():
            run = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT / "tests")], cwd=ROOT, capture_output=True,
                                 text=True, env=dict(env, XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
                                                     PYTHONPATH=str(ROOT)))
            if run.returncode:
                print(run.stderr[-2000:], file=sys.stderr)
                return 1
            got = json.loads(run.stdout.strip().splitlines()[-1])
            best = results.setdefault(name, got)
            for k, v in got.items():
                best[k] = min(best[k], v)
    for name, r in results.items():
        base = results[name.replace("loop", "fusion")]
        print(f"{name}: tiny gradient compile {r['tiny_grad_compile_s']:.2f} s "
              f"({r['tiny_grad_compile_s'] / base['tiny_grad_compile_s']:.2f}x), pre-training step compile "
              f"{r['tiny_step_compile_s']:.2f} s ({r['tiny_step_compile_s'] / base['tiny_step_compile_s']:.2f}x), "
              f"step {r['tiny_step_ms']:.1f} ms ({r['tiny_step_ms'] / base['tiny_step_ms']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
