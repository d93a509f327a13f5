"""The record every kernel set fills: `Kernels`, the operations `bert_jax.model.modeling` takes from a set.

The bottom of the kernels package: the sets (`reference`, `xla_cpu`, `tpu`, `splash`, `gpu`) build their
`KERNELS` from it, and `bert_jax.model.kernels` (`get`, `swapped`) hands them out.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Kernels:
    """One kernel set: the operations `bert_jax.model.modeling` takes from here.

    Attributes:
      name: "reference", "xla_cpu", "tpu", "splash" or "gpu".
      gelu: x [...] any float dtype -> exact (erf) GELU x * Phi(x), computed in float32, x's dtype.
      dot_general: a `jax.lax.dot_general` stand-in for the feed-forward block's first `nn.Dense`
        (x [..., D] . kernel [D, I]); None for flax's own.
      tied_logits: (x [..., D], table [V, D], bias [V], compute dtype) -> float32 [..., V],
        x @ table^T + bias with x and table cast to the compute dtype.
      dropout: a flax module class, called `dropout(rate)(x, deterministic=...)`: inverted dropout on
        the "dropout" PRNG stream.
      attention: None (the model's own attention), or (query [B, N, L, H] scaled, key, value,
        segment_ids int32 [B, L]) -> context [B, N, L, H], attention within equal segment ids; with
        `attention_dropout`, also called as (..., dropout_rate=rate, seed=uint32 [2]) in a training pass with
        attention-probability dropout (`bert_jax.model.kernels.dropout.seeds` of the "dropout" stream).
      attention_applies: None (`attention` takes every layer, and a training pass with attention dropout is
        an error unless `attention_dropout`), or (compute dtype, head size H, length L, attention dropout
        active) -> whether `attention` takes the layer; where not, the model's own attention (the reference path).
      attention_packed: `attention` also takes (packed, None, None, segment_ids, ..., bias=(query, key, value
        biases, [N, H] each), scale=s): packed [B, L, 3, N, H] the three projections from one matrix product, slots
        `PACKED_SLOTS`, without their biases and the query unscaled; context = attention((query + b_q) * s, key + b_k,
        value + b_v) [B, N, L, H], the gradients of packed and the biases returned (where the kernel takes the
        layer: `AttentionOp.takes_packed`).
      attention_dropout: `attention` draws the attention-probability dropout itself (the mask of
        `bert_jax.model.kernels.dropout.keep_mask` for the probabilities [B, N, L, L]).
      dropout_add_layer_norm: None (the model's dropout, add and flax LayerNorm), or (x [B, L, D] a sub-layer's
        output without its bias, residual [B, L, D], scale [D], bias [D], *, epsilon, x_bias [D], dropout_rate, seed
        uint32 [2] or None) -> LayerNorm(residual + dropout(x + x_bias)) [B, L, D] in x's dtype, float32 statistics,
        the dropout mask that
        `dropout` draws from the same seeds (`bert_jax.model.kernels.dropout.keep_mask` for [B, L, D]); taken
        where the compute dtype is bfloat16 or float16, as the fused attention.
      bias_gelu: None (the feed-forward block's Dense adds its bias, then `gelu`), or (x [..., I] the dense layer's
        product in the compute dtype, bias [I]) -> gelu(x + bias) in x's dtype, the gradients of x and bias; taken
        for hidden_act "gelu" where the compute dtype is bfloat16 or float16.
    """

    name: str
    gelu: Callable
    dot_general: Callable | None
    tied_logits: Callable
    dropout: Any
    attention: Callable | None = None
    attention_applies: Callable[[Any, int, int, bool], bool] | None = None
    attention_dropout: bool = False
    attention_packed: bool = False
    dropout_add_layer_norm: Callable | None = None
    bias_gelu: Callable | None = None


# The mesh axes a kernel that runs per device (Pallas) splits the batch and the heads over (`bert_jax.training.sharding`'s
# logical rules: "batch" -> ("data", "fsdp"), "heads" -> "tensor").
BATCH_AXES = ("data", "fsdp")
HEADS_AXIS = "tensor"

# The slots of the packed projections ([B, L, 3, N, H], `Kernels.attention_packed`): key and value first, so that
# flash_gpu's dk / dv kernel writes its two outputs as one block of the packed gradient.
PACKED_SLOTS = ("key", "value", "query")
