"""The "gpu" kernel set: the reference forms with the hashed dropout, and fused attention where it applies.

  bias_gelu   the feed-forward block's GELU(x + bias) as one elementwise pass whose gradient recomputes the sum and
              Phi from the dense layer's bfloat16 product x and the bias: no float32 copy of the [B, L, I] activation
              is written for the backward pass (autodiff's reference GELU keeps one).
  dropout     `bert_jax.model.kernels.dropout.HashedDropout`: two random words per call, each element's keep bit
              a hash of its index, instead of one threefry draw per element.
  dropout_add_layer_norm
              a layer's LayerNorm(residual + dropout(x + bias)), twice a layer, as one Pallas kernel forward and one
              backward (`bert_jax.model.kernels.layer_norm_gpu`), the same mask as the hashed dropout's.
  attention   softmax(q k^T + mask) v without writing the [L, L] scores to HBM, on per-token segment ids
              (a token attends to the tokens of its segment): packed rows pass their `segment_ids`, unpadded
              rows their attention_mask (real tokens one segment, padding another, whose outputs nothing reads).
              - no attention-probability dropout in the pass (evaluation, or a recipe without it): cuDNN's fused
                attention, `jax.nn.dot_product_attention(..., implementation="cudnn")`, with a boolean
                [B, 1, L, L] mask;
              - with it (training at the paper's attention_probs_dropout_prob=0.1): the Pallas flash attention of
                `bert_jax.model.kernels.flash_gpu`, which draws the same mask as the reference path's hashed dropout
                inside the kernel, per device under `jax.shard_map` over the batch and heads axes.

`applies` says where a kernel takes a layer: bfloat16 / float16, a head size that is a multiple of 8 and at
most 128; without dropout an even length (cuDNN's `check_is_flash_attention`), with dropout a length divisible
by flash_gpu's block (64, or the length itself when a power of two of at least 16). Elsewhere (float32, a head
size of 4) the model computes its own attention, the reference path. `model.kernels="auto"` resolves to this
set when compiling for a GPU.

On a CPU neither cuDNN nor Triton exists: the tests run the same functions with `IMPLEMENTATION` set to "xla"
(jax's own lowering of the cuDNN call) and `INTERPRET` True (Pallas's interpreter), against the reference.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax.sharding import PartitionSpec as P

from bert_jax.model.kernels import dropout, flash_gpu, layer_norm_gpu, reference, xla_cpu
from bert_jax.model.kernels.base import BATCH_AXES, HEADS_AXIS, PACKED_SLOTS

IMPLEMENTATION = "cudnn"  # jax.nn.dot_product_attention's implementation; "xla" in CPU tests
INTERPRET = False  # flash_gpu in Pallas's interpreter: True in CPU tests
MAX_HEAD_SIZE = 128  # cuDNN's bound before Hopper (256 from Hopper on): the portable one


def applies(dtype, head_size: int, length: int, dropout: bool) -> bool:
    """Whether a fused kernel takes a layer computed in `dtype` with heads of `head_size` over `length` tokens;
    `dropout`: attention-probability dropout is active (a training pass with attention_probs_dropout_prob > 0):
    flash_gpu then, cuDNN otherwise."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return False
    if dropout:
        return flash_gpu.supported(dtype, head_size, length)
    return head_size % 8 == 0 and head_size <= MAX_HEAD_SIZE and length % 2 == 0


def _flash(query, key, value, segment_ids, dropout_rate: float, seed: jax.Array, bias, scale: float) -> jax.Array:
    """flash_gpu's attention on query, key, value [B, L, N, H] (the projections' layout, "BLNH": no transpose to
    heads-major and back), or on the packed projections [B, L, 3, N, H] ("BL3NH", key and value None), and biases
    [N, H] (or None) -> [B, L, N, H], per device under shard_map where a mesh splits the batch or heads; each device
    draws its slice of the global [B, N, L, L] mask (`flash_gpu.make_lead_hashes` of the global shape)."""
    packed = key is None
    batch, heads = query.shape[0], query.shape[-2]
    lead = flash_gpu.make_lead_hashes(seed, batch, heads)  # int32 [B, N]

    def local(q, k, v, s, lead_hashes, seed, bias):
        return flash_gpu.attention(q, k, v, s, dropout_rate=dropout_rate, seed=seed, lead_hashes=lead_hashes,
                                   interpret=INTERPRET, layout="BL3NH" if packed else "BLNH", bias=bias, scale=scale)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES + (HEADS_AXIS,)) <= set(mesh.axis_names):
        return local(query, key, value, segment_ids, lead, seed, bias)
    out = P(BATCH_AXES, None, HEADS_AXIS, None)
    qkv = P(BATCH_AXES, None, None, HEADS_AXIS, None) if packed else out
    kv = None if packed else qkv
    bias_specs = None if bias is None else (P(HEADS_AXIS, None),) * 3  # their gradients summed over the batch shards
    return jax.shard_map(local, mesh=mesh, in_specs=(qkv, kv, kv, P(BATCH_AXES, None), P(BATCH_AXES, HEADS_AXIS),
                                                     P(), bias_specs),
                         out_specs=out, check_vma=False)(query, key, value, segment_ids, lead, seed, bias)


def attention(query: jax.Array, key: jax.Array | None, value: jax.Array | None, segment_ids: jax.Array,
              dropout_rate: float = 0.0, seed: jax.Array | None = None, bias=None, scale: float = 1.0) -> jax.Array:
    """query, key, value [B, N, L, H] in the compute dtype, or query the packed projections [B, L, 3, N, H] (slots
    `PACKED_SLOTS`) with key and value None; segment_ids int32 [B, L]; bias None or the three projections' biases
    [N, H] -> context [B, N, L, H]: softmax(q k^T) v over the keys of the query's segment with q = (query + bias_q)
    * scale, k = key + bias_k, v = value + bias_v (flash_gpu adds them as it loads its tiles, reading the packed
    array in place; cuDNN's path first, in jnp); with dropout_rate > 0, inverted dropout on the probabilities with
    the mask `dropout.keep_mask` draws from seed uint32 [2] (flash_gpu). `IMPLEMENTATION` and `INTERPRET` are read
    at trace time.

    Raises:
      ValueError: dropout_rate > 0 without a seed, or a layer flash_gpu does not take (see `applies`).
    """
    segment_ids = segment_ids.astype(jnp.int32)
    if dropout_rate > 0:
        if seed is None:
            raise ValueError(f"gpu attention with dropout_rate={dropout_rate} needs a seed")
        if key is None:
            return jnp.swapaxes(_flash(query, None, None, segment_ids, dropout_rate, seed, bias, scale), 1, 2)
        # The model's [B, N, L, H] is its projections' [B, L, N, H] transposed: XLA cancels the two transposes.
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))
        return jnp.swapaxes(_flash(q, k, v, segment_ids, dropout_rate, seed, bias, scale), 1, 2)
    if key is None:  # the packed projections' slots, heads-major
        query, key, value = (jnp.swapaxes(query[:, :, PACKED_SLOTS.index(name)], 1, 2)
                             for name in ("query", "key", "value"))
    if bias is not None:  # the unfused projections' arithmetic: the bias added, then the scale, in the dtype
        query, key, value = ((x + b[:, None, :].astype(x.dtype)).astype(x.dtype) for x, b in
                             zip((query, key, value), bias))
    if scale != 1.0:
        query = (query * scale).astype(query.dtype)
    mask = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]  # [B, 1, L, L]
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))  # [B, L, N, H]
    out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=1.0, implementation=IMPLEMENTATION)
    return jnp.swapaxes(out, 1, 2)


def dropout_add_layer_norm(x: jax.Array, residual: jax.Array, scale: jax.Array, bias: jax.Array, *, epsilon: float,
                           x_bias: jax.Array | None = None, dropout_rate: float = 0.0,
                           seed: jax.Array | None = None) -> jax.Array:
    """LayerNorm(residual + dropout(x + x_bias)) in one Pallas kernel (`layer_norm_gpu.dropout_add_layer_norm`), per
    device under shard_map where a mesh splits the batch; x, residual [B, L, D] -> [B, L, D] in x's dtype.
    `INTERPRET` is read at trace time."""
    return layer_norm_gpu.dropout_add_layer_norm(x, residual, scale, bias, epsilon=epsilon, x_bias=x_bias,
                                                 dropout_rate=dropout_rate, seed=seed, interpret=INTERPRET,
                                                 batch_axes=BATCH_AXES)


@jax.custom_vjp
def bias_gelu(x: jax.Array, bias: jax.Array) -> jax.Array:
    """Exact GELU of x + bias: x [..., I] a dense layer's product in the compute dtype, bias [I] (its parameter, any
    float dtype) -> [..., I] in x's dtype, the sum rounded to x's dtype and the GELU computed in float32 (the value
    of flax Dense's bias add and `reference.gelu`). The gradient keeps x and bias only and recomputes the rest:
    d x = g * GELU'(x + bias), d bias = d x summed over the leading axes (float32, in bias's dtype)."""
    return reference.gelu((x + bias.astype(x.dtype)).astype(x.dtype))


def _bias_gelu_fwd(x, bias):
    return bias_gelu(x, bias), (x, bias)


def _bias_gelu_bwd(saved, g):
    x, bias = saved
    h32 = (x + bias.astype(x.dtype)).astype(x.dtype).astype(jnp.float32)
    dx = (g.astype(jnp.float32) * xla_cpu.gelu_derivative(h32)).astype(x.dtype)
    return dx, jnp.sum(dx.astype(jnp.float32), axis=tuple(range(x.ndim - 1))).astype(bias.dtype)


bias_gelu.defvjp(_bias_gelu_fwd, _bias_gelu_bwd)


KERNELS = dataclasses.replace(reference.KERNELS, name="gpu", dropout=dropout.HashedDropout, attention=attention,
                              attention_applies=applies, attention_dropout=True, attention_packed=True,
                              dropout_add_layer_norm=dropout_add_layer_norm, bias_gelu=bias_gelu)
