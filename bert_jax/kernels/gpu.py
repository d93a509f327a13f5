"""The "gpu" kernel set: the reference forms, with attention by cuDNN's fused (flash) attention where it
applies.

  attention   softmax(q k^T + mask) v by `jax.nn.dot_product_attention(..., implementation="cudnn")`: the
              [L, L] scores are never written to HBM. The mask is given as a boolean [B, 1, L, L] from
              per-token segment ids (a token attends to the tokens of its segment): packed rows pass their
              `segment_ids`, unpacked rows their attention_mask (real tokens one segment, padding another,
              whose outputs nothing reads), so padding and packed rows are both served.

`applies` says where cuDNN's kernel takes a layer (jax's `check_is_flash_attention` for bfloat16 / float16:
head size a multiple of 8 and at most 128, an even length with a mask; no dropout on the attention
probabilities, which the fused kernel does not draw). Elsewhere (float32, a head size of 4, dropout in a
training pass) the model computes its own attention, the reference path. `model.kernels="auto"` resolves to
this set when compiling for a GPU.

On a CPU, cuDNN does not exist: the tests run the same function with `IMPLEMENTATION` set to "xla" (jax's own
lowering of the same call) against the reference attention, and check `applies`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from bert_jax.kernels import dropout, reference

IMPLEMENTATION = "cudnn"  # jax.nn.dot_product_attention's implementation; "xla" in CPU tests
MAX_HEAD_SIZE = 128  # cuDNN's bound before Hopper (256 from Hopper on): the portable one


def applies(dtype, head_size: int, length: int, dropout: bool) -> bool:
    """Whether cuDNN's fused attention takes a layer computed in `dtype` with heads of `head_size` over
    `length` tokens; `dropout`: attention-probability dropout is active (a training pass with
    attention_probs_dropout_prob > 0)."""
    return (jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)) and head_size % 8 == 0
            and head_size <= MAX_HEAD_SIZE and length % 2 == 0 and not dropout)


def attention(query: jax.Array, key: jax.Array, value: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """query (already scaled by 1/sqrt(H)), key, value [B, N, L, H] in the compute dtype; segment_ids int32
    [B, L] -> context [B, N, L, H]: softmax(q k^T) v over the keys of the query's segment (`IMPLEMENTATION`
    read at trace time)."""
    mask = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]  # [B, 1, L, L]
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))  # [B, L, N, H]
    out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=1.0, implementation=IMPLEMENTATION)
    return jnp.swapaxes(out, 1, 2)


KERNELS = dataclasses.replace(reference.KERNELS, name="gpu", dropout=dropout.HashedDropout, attention=attention,
                              attention_applies=applies)
