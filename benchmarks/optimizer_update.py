"""Optimizer-update speed: the pre-training AdamW chain with our global-norm clipping against the same
chain with optax's `clip_by_global_norm`, same run.

  .venv/bin/python benchmarks/optimizer_update.py [--size base] [--rounds 5] [--steps 5]

Parameters and gradients have the shapes of the config's BertForPreTraining (BERT-Base: 110M float32
parameters); each variant is one jitted `tx.update` + `optax.apply_updates` with the parameters and the
optimizer state donated, as inside `steps.train_step`. The variants run in alternating windows (this
machine's speed drifts over minutes); printed: median milliseconds per update of each, the median of the
per-window ratios, and the bytes an ideal fused update must move (read parameters, gradients, both
moments; write parameters and both moments) over our time, in GB/s.
"""

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from bert_jax.training import pretraining, sharding, steps  # noqa: E402
from bert_jax.configs import pretrain  # noqa: E402


def make_update(tx, params, grads):
    """-> run(n): seconds per update over n donated updates of `tx` from a fresh state."""
    def update(p, opt_state, g):
        updates, opt_state = tx.update(g, opt_state, p)
        return optax.apply_updates(p, updates), opt_state

    step = jax.jit(update, donate_argnums=(0, 1))
    state = [jax.tree_util.tree_map(jnp.copy, params), tx.init(params)]

    def run(n):
        p, s = state
        start = time.perf_counter()
        for _ in range(n):
            p, s = step(p, s, grads)
        jax.block_until_ready(p)
        state[:] = [p, s]
        return (time.perf_counter() - start) / n

    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="base")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    config = pretrain.get_config(args.size)
    model = pretraining.create_model(config)
    tx, _ = steps.create_optimizer(config)
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    abstract, _ = steps.state_shardings(pretraining.state_init(model, tx, 0), mesh)
    key = iter(jax.random.split(jax.random.PRNGKey(0), 1000))
    params = jax.tree_util.tree_map(lambda s: 0.02 * jax.random.normal(next(key), s.shape, s.dtype), abstract.params)
    grads = jax.tree_util.tree_map(lambda s: jax.random.normal(next(key), s.shape, s.dtype), abstract.params)
    size = sum(x.size for x in jax.tree_util.tree_leaves(params))

    unclipped = config.copy_and_resolve_references()
    unclipped.max_grad_norm = 0.0  # create_optimizer then returns the AdamW core alone
    core, _ = steps.create_optimizer(unclipped)
    peer_tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), core)
    ours, peer = make_update(tx, params, grads), make_update(peer_tx, params, grads)
    ours(2), peer(2)
    windows = []
    for _ in range(args.rounds):
        t_ours, t_peer = ours(args.steps), peer(args.steps)
        windows.append((t_ours, t_peer, t_peer / t_ours))
    t_ours, t_peer, ratio = (statistics.median(c) for c in zip(*windows))
    ideal_bytes = 7 * 4 * size
    print(f"{args.size}: {size / 1e6:.1f}M float32 parameters, AdamW + clipping at {config.max_grad_norm}")
    print(f"ours (optim.clip_by_global_norm) {t_ours * 1e3:8.1f} ms/update   "
          f"optax.clip_by_global_norm {t_peer * 1e3:8.1f} ms/update   ratio {ratio:.2f}x   "
          f"ours {ideal_bytes / t_ours / 1e9:.1f} GB/s of the ideal {ideal_bytes / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
