"""The reference kernel set: the plain JAX / Flax / optax form of each operation, autodiff gradients.

The default wherever XLA needs no help (TPU, GPU); the truth every other kernel set is tested against.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax.kernels import Kernels


def gelu(x: jax.Array) -> jax.Array:
    """Exact (erf) GELU, x * Phi(x), as the original and Hugging Face's "gelu": any shape, computed
    in float32, returned in x's dtype."""
    return jax.nn.gelu(x.astype(jnp.float32), approximate=False).astype(x.dtype)


def tied_logits(x: jax.Array, table: jax.Array, bias: jax.Array, dtype) -> jax.Array:
    """x [..., D] @ table [V, D]^T + bias [V] -> float32 [..., V]; x and table cast to `dtype`, float32
    accumulation (the original's `get_masked_lm_output` output layer)."""
    return jnp.einsum("...d,vd->...v", x.astype(dtype), table.astype(dtype),
                      preferred_element_type=jnp.float32) + bias.astype(jnp.float32)


def layer_norm(epsilon: float, dtype, param_dtype, name: str | None = None) -> nn.Module:
    """flax's LayerNorm with the exact two-pass variance (as torch.nn.LayerNorm and the original's
    tf.contrib LayerNorm), float32 statistics, parameters `scale` / `bias` [D] on logical axis `embed`."""
    return nn.LayerNorm(epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, use_fast_variance=False,
                        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), name=name)


def nll(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """float32 logits [..., K], int32 labels [...] -> float32 [...] = logsumexp(logits) - logits[label]."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def is_argmax(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """bool [...]: labels == argmax(logits, axis=-1) (ties: the first index)."""
    return jnp.argmax(logits, axis=-1) == labels


KERNELS = Kernels(name="reference", gelu=gelu, dot_general=None, tied_logits=tied_logits, dropout=nn.Dropout,
                  layer_norm=layer_norm, nll=nll, is_argmax=is_argmax)
