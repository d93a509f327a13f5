"""The paper's optimizer on optax: AdamW with linear warmup and linear decay, and clipping.

Paper (Devlin et al. 2018, appendix A.2) and google-research/bert `optimization.py`: Adam with
lr 1e-4, beta1 0.9, beta2 0.999, epsilon 1e-6, L2 weight decay 0.01 decoupled from the gradient
(AdamW) and not applied to LayerNorm parameters and biases, learning-rate warmup over the first 10,000
steps then linear decay to 0, gradients clipped to global norm 1.0. One difference, as Hugging Face and
NVIDIA: optax's Adam applies bias correction, which the original's AdamWeightDecayOptimizer omits.

LAMB (You et al. 2019, for batches of 32k and more) is available as `optimizer="lamb"`, with the same
schedule, mask and clipping. Gradient accumulation is not an optimizer wrapper here: `steps.train_step`
sums the micro-batch gradients inside one compiled step, so there is one optimizer (and schedule) step
per training step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util


def learning_rate_schedule(learning_rate: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to `learning_rate` over `warmup_steps`, then linear decay to 0 at
    `total_steps`, from the peak at the end of the warmup (as transformers' linear schedule). The original's
    optimization.py decays from step 0 instead (learning_rate * (1 - step / total_steps) once warm), which
    is lower by the factor (1 - warmup_steps / total_steps) right after the warmup: 1% for BERT-Base's
    10k of 1M steps.

    Raises:
      ValueError: non-positive total_steps, negative warmup_steps, or warmup_steps > total_steps.
    """
    if total_steps <= 0 or warmup_steps < 0 or warmup_steps > total_steps:
        raise ValueError(f"schedule needs 0 <= warmup_steps ({warmup_steps}) <= total_steps ({total_steps}) "
                         "and total_steps > 0")
    warmup = optax.linear_schedule(0.0, learning_rate, max(warmup_steps, 1))
    decay = optax.linear_schedule(learning_rate, 0.0, max(total_steps - warmup_steps, 1))
    return optax.join_schedules([warmup, decay], [warmup_steps])


def weight_decay_mask(params: Any) -> Any:
    """Tree of bools like `params`: True where weight decay applies.

    False for LayerNorm parameters (any path component containing "LayerNorm") and for biases (a leaf
    name ending in "bias", e.g. `bias`, `query_bias`, `mlm_output_bias`), as the original's
    `_do_use_weight_decay` with exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"].
    """
    flat = traverse_util.flatten_dict(params)
    mask = {path: not (any("LayerNorm" in p for p in path) or path[-1].endswith("bias")) for path in flat}
    return traverse_util.unflatten_dict(mask)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """Scale every update by max_norm / max(global_norm, max_norm): the original's
    `tf.clip_by_global_norm(grads, clip_norm=1.0)` (google-research/bert `optimization.py`).

    Updates: any tree of float arrays; each leaf keeps its shape and dtype, and the factor is a float32
    scalar cast to the leaf's dtype. The result equals `optax.clip_by_global_norm`'s (bit for bit below
    max_norm, within an ulp above it). optax selects between the leaf and leaf / norm * max_norm, and XLA
    then writes the divided leaf out in full for its two readers (Adam's two moments), on every backend:
    the update is slower on XLA:CPU (`benchmarks/optimizer_update.py`) and the TPU step reads and writes
    more HBM bytes (`benchmarks/aot_kernels.py`; docs/kernels.md), so this plain form is the only one.
    A non-finite norm gives non-finite updates, which the training loop reports.

    Raises:
      ValueError: max_norm is not positive.
    """
    if max_norm <= 0:
        raise ValueError(f"max_norm={max_norm} must be positive")

    def update_fn(updates, state, params=None):
        del params
        factor = max_norm / jnp.maximum(optax.tree.norm(updates), max_norm)
        return jax.tree_util.tree_map(lambda t: t * factor.astype(t.dtype), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def create_optimizer(*, learning_rate: float = 1e-4, warmup_steps: int = 10_000, total_steps: int = 1_000_000,
                     optimizer: str = "adamw", weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999,
                     eps: float = 1e-6, max_grad_norm: float = 1.0) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The pre-training optimizer (defaults: the paper's BERT-Base recipe).

    Returns:
      (transformation, schedule); `schedule(step)` is the learning rate at an optimizer step.

    Raises:
      ValueError: unknown optimizer name, a bad schedule, or a negative max_grad_norm.
    """
    schedule = learning_rate_schedule(learning_rate, warmup_steps, total_steps)
    if optimizer == "adamw":
        core = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=weight_decay_mask)
    elif optimizer == "lamb":
        core = optax.lamb(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=weight_decay_mask)
    else:
        raise ValueError(f"optimizer {optimizer!r} is not 'adamw' or 'lamb'")
    if max_grad_norm < 0:
        raise ValueError(f"max_grad_norm={max_grad_norm} must be positive, or 0 for no clipping")
    tx = optax.chain(clip_by_global_norm(max_grad_norm), core) if max_grad_norm else core
    return tx, schedule


def global_norm(tree: Any) -> jax.Array:
    """L2 norm over all leaves (float32 scalar), e.g. of the gradients for logging."""
    return optax.tree.norm(tree)
