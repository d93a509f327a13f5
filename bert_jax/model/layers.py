"""The building blocks of `bert_jax.model.modeling` and `bert_jax.model.heads`: parameters with logical axis names,
the original's initialiser, dense and LayerNorm layers, dropout, the activation, the row gather, the attention
mask record (`AttentionMask`), and the kernel set of a config (`bert_jax.model.kernels`).

Every parameter made here carries logical axis names (`nn.with_logical_partitioning`), mapped to mesh
axes only by `bert_jax.training.sharding`; parameters are stored in config.param_dtype and computed in config.dtype.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_jax.model import kernels
from bert_jax.model.bert_config import ACTIVATIONS, BertConfig
from bert_jax.model.kernels.dropout import seeds as dropout_seeds

Array = jax.Array


def kernel_set(config: BertConfig) -> kernels.Kernels:
    """The operations of config.kernels on the default backend (`bert_jax.model.kernels.get`).

    Raises:
      ValueError: an unknown kernel set name.
    """
    return kernels.get(config.kernels)


def activation(config: BertConfig) -> Callable[[Array], Array]:
    """config.hidden_act as a function of any array (same shape and dtype); "gelu" is the kernel set's
    exact GELU."""
    return ACTIVATIONS[config.hidden_act] or kernel_set(config).gelu


def initializer(config: BertConfig) -> Callable:
    """The original's tf.truncated_normal_initializer(stddev=initializer_range): cut at 2 stddev, no
    variance correction (as jax.nn.initializers.truncated_normal)."""
    return jax.nn.initializers.truncated_normal(stddev=config.initializer_range)


def param(module: nn.Module, name: str, init: Callable, shape: tuple[int, ...], axes: tuple[str, ...]) -> Array:
    """Creates the parameter `name` of `module` (which has a `config`) with logical axis names `axes`, in
    config.param_dtype."""
    return module.param(name, nn.with_logical_partitioning(init, axes), shape,
                        jnp.dtype(module.config.param_dtype))


def dense(config: BertConfig, features: int, axes: tuple[str, str], name: str | None = None,
          dot_general=None) -> nn.Dense:
    """A flax Dense layer: kernel [D_in, features] initialised as the original (`initializer`) on logical
    `axes`, the bias [features] on the second, computed in config.dtype, stored in config.param_dtype.
    dot_general: a kernel set's (None: flax's)."""
    return nn.Dense(features, dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype),
                    kernel_init=nn.with_logical_partitioning(initializer(config), axes),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]),
                    dot_general=dot_general, name=name)


def layer_norm(config: BertConfig, name: str) -> nn.Module:
    """flax's LayerNorm with the exact two-pass variance (as torch.nn.LayerNorm and the original's
    tf.contrib LayerNorm), float32 statistics, parameters `scale` / `bias` [D] on logical axis `embed`."""
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=jnp.dtype(config.dtype),
                        param_dtype=jnp.dtype(config.param_dtype), use_fast_variance=False,
                        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), name=name)


def dropout(config: BertConfig, rate: float, x: Array, deterministic: bool) -> Array:
    """The kernel set's dropout of `rate` on x (any shape and dtype, kept); identity when deterministic.
    Inside a module only (it creates a flax submodule); needs the "dropout" PRNG stream otherwise."""
    return kernel_set(config).dropout(rate)(x, deterministic=deterministic)


class LayerNormParams(nn.Module):
    """The parameters of `layer_norm(config, name)` alone, for a kernel that computes the LayerNorm itself: `scale`
    and `bias` [D] in config.param_dtype on logical axis `embed`, initialised as flax's (ones, zeros)."""

    config: BertConfig
    features: int

    @nn.compact
    def __call__(self) -> tuple[Array, Array]:
        scale = param(self, "scale", nn.initializers.ones, (self.features,), ("embed",))
        return scale, param(self, "bias", nn.initializers.zeros, (self.features,), ("embed",))


class SplitDense(nn.Module):
    """`dense`'s parameters (kernel [D_in, features] on logical `axes`, bias [features] on the second, initialised and
    stored alike) returning x @ kernel in config.dtype and the bias apart, for the sub-layer output whose bias
    `dropout_add_layer_norm` adds (in the fused kernel, where the kernel set has one)."""

    config: BertConfig
    features: int
    axes: tuple[str, str]

    @nn.compact
    def __call__(self, x: Array) -> tuple[Array, Array]:
        """x [..., D_in] -> (x @ kernel [..., features] in config.dtype, bias [features] in config.param_dtype)."""
        c = self.config
        kernel = param(self, "kernel", initializer(c), (x.shape[-1], self.features), self.axes)
        bias = param(self, "bias", nn.initializers.zeros, (self.features,), self.axes[1:])
        dtype = jnp.dtype(c.dtype)
        product = jax.lax.dot_general(x.astype(dtype), kernel.astype(dtype), (((x.ndim - 1,), (0,)), ((), ())))
        return product, bias


def _half(config: BertConfig) -> bool:
    """Whether config computes in bfloat16 or float16, where the kernel sets' fused forms are taken."""
    return jnp.dtype(config.dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def dense_activation(config: BertConfig, name: str, x: Array) -> Array:
    """The feed-forward block's first layer: activation(dense `name`(x)), x [..., D] -> [..., intermediate_size] in
    config.dtype, the Dense's kernel [D, I] on logical axes ("embed", "mlp"). The kernel set's `bias_gelu` (the bias
    and GELU in one recomputing pass, the same parameters) where it has one, hidden_act is "gelu" and the compute
    dtype is bfloat16 or float16; else the Dense with the set's dot_general, then `activation`. Inside a module
    only."""
    ops = kernel_set(config)
    if ops.bias_gelu is not None and config.hidden_act == "gelu" and _half(config):
        return ops.bias_gelu(*SplitDense(config, config.intermediate_size, ("embed", "mlp"), name=name)(x))
    return activation(config)(dense(config, config.intermediate_size, ("embed", "mlp"), name, ops.dot_general)(x))


def dropout_add_layer_norm(config: BertConfig, name: str, x: Array, x_bias: Array, residual: Array,
                           deterministic: bool) -> Array:
    """LayerNorm `name`(residual + dropout(x + x_bias)) at hidden_dropout_prob: a post-LN layer's sub-layer output x
    [B, L, D] (its last dense layer's product, `SplitDense`) plus that layer's bias x_bias [D], added to the sub-layer's
    input residual [B, L, D] -> [B, L, D] in config.dtype. The kernel set's fused form where it has one and the
    compute dtype is bfloat16 or float16 (`Kernels.dropout_add_layer_norm`: the same parameters, the same dropout mask
    from the same "dropout" key), else the bias added, `dropout` and `layer_norm`. Inside a module only (it creates
    submodules)."""
    ops = kernel_set(config)
    dtype = jnp.dtype(config.dtype)
    if ops.dropout_add_layer_norm is None or not _half(config):
        x = x + x_bias.astype(dtype)
        return layer_norm(config, name)(residual + dropout(config, config.hidden_dropout_prob, x, deterministic))
    rate = 0.0 if deterministic else config.hidden_dropout_prob
    # The key the unfused path's dropout module (same name, same order) would draw.
    seed = dropout_seeds(ops.dropout(rate).make_rng("dropout")) if rate > 0 else None
    scale, bias = LayerNormParams(config, x.shape[-1], name=name)()
    return ops.dropout_add_layer_norm(x.astype(dtype), residual.astype(dtype), scale, bias, x_bias=x_bias,
                                      epsilon=config.layer_norm_eps, dropout_rate=rate, seed=seed)


def gather_positions(sequence: Array, positions: Array) -> Array:
    """sequence [B, L, ...], positions int32 [B, P] -> [B, P, ...] (the original's gather_indexes).

    The dtype of `sequence` is kept. Position values are not checked and never raise: with
    `jnp.take_along_axis`'s default "fill" mode a position in [-L, 0) counts from the end, and one
    >= L or < -L gives a NaN row (the dtype's minimum for an integer sequence).

    Raises:
      IndexError: 1-D positions.
      ValueError: a batch size of positions that neither equals nor broadcasts to B.
    """
    index = positions[(slice(None), slice(None)) + (None,) * (sequence.ndim - 2)].astype(jnp.int32)
    return jnp.take_along_axis(sequence, index, axis=1)


@flax.struct.dataclass
class AttentionMask:
    """Which keys each query attends to, in the two forms the attention implementations take.

    Attributes:
      bias: float32 additive bias, 0 where attended and float32 min elsewhere: [B, 1, 1, L] (`padding`)
        or [B, 1, L, L] (`packed`); broadcasts to the scores [B, N, L, L].
      segment_ids: int32 [B, L], the same mask as segment ids (query i attends to key j iff they are
        equal), for a kernel set's own attention (`bert_jax.model.kernels`).
    """

    bias: Array
    segment_ids: Array

    @classmethod
    def padding(cls, attention_mask: Array) -> AttentionMask:
        """attention_mask int [B, L] (1 real, 0 padding): every query attends to the real tokens."""
        bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min)
        return cls(bias=bias, segment_ids=attention_mask)

    @classmethod
    def packed(cls, segment_ids: Array) -> AttentionMask:
        """Packed rows' segment_ids int [B, L] (1, 2, ... per instance, 0 padding): a query attends to the
        keys of its own segment. Padding attends to padding only (its outputs are never read), so no row
        of the softmax is fully masked: the rule of splash attention's `SegmentIds`."""
        same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
        return cls(bias=jnp.where(same, 0.0, jnp.finfo(jnp.float32).min), segment_ids=segment_ids)

    def query_bias(self, positions: Array | None) -> Array:
        """The bias of the queries at positions int32 [B, Q] ([B, 1, Q, L] packed, [B, 1, 1, L] padding);
        the whole bias for None."""
        if positions is None or self.bias.shape[2] == 1:
            return self.bias
        return jnp.take_along_axis(self.bias, positions[:, None, :, None].astype(jnp.int32), axis=2)
