"""The reference kernel set: the plain JAX / Flax / optax form of each operation, autodiff gradients.

The default wherever XLA needs no help (TPU, GPU); the truth every other kernel set is tested against.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model.kernels.base import Kernels


def gelu(x: jax.Array) -> jax.Array:
    """Exact (erf) GELU, x * Phi(x), as the original and Hugging Face's "gelu": any shape, computed
    in float32, returned in x's dtype."""
    return jax.nn.gelu(x.astype(jnp.float32), approximate=False).astype(x.dtype)


def tied_logits(x: jax.Array, table: jax.Array, bias: jax.Array, dtype) -> jax.Array:
    """x [..., D] @ table [V, D]^T + bias [V] -> float32 [..., V]; x and table cast to `dtype`, float32
    accumulation (the original's `get_masked_lm_output` output layer)."""
    return jnp.einsum("...d,vd->...v", x.astype(dtype), table.astype(dtype),
                      preferred_element_type=jnp.float32) + bias.astype(jnp.float32)


KERNELS = Kernels(name="reference", gelu=gelu, dot_general=None, tied_logits=tied_logits, dropout=nn.Dropout)
