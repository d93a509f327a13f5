"""The BERT model in Flax linen: embeddings, Transformer encoder and the pre-training heads.

Architecture as in Devlin et al. 2018 (arXiv 1810.04805, section 3) and google-research/bert
`modeling.py`: learned absolute position and token-type embeddings, post-LayerNorm Transformer layers
with exact (erf) GELU, a tanh pooler on [CLS], a masked-LM head tied to the word embeddings and
evaluated only at `masked_lm_positions`, and a next-sentence head on the pooled output.

Packed rows (several pre-training instances in one row, Krell et al. 2021, "Efficient Sequence Packing
without Cross-contamination"): `segment_ids` [B, L] (1, 2, ... per instance, 0 padding) restrict
attention to the tokens of the same instance, `position_ids` [B, L] restart at 0 in each instance, and
the pooler and next-sentence head run at each instance's [CLS] (`next_sentence_positions` [B, K]). An
instance then gets exactly the outputs it gets alone in an unpacked row.

Dimension key used in shapes and einsum strings:
  B batch, L sequence length, D hidden_size, N num_attention_heads, H head size (D / N),
  I intermediate_size, V vocab_size, P max predictions per sequence, T type_vocab_size,
  S max_position_embeddings, C number of classes, K instances per packed row.

Sharding: every parameter is created with logical axis names (`nn.with_logical_partitioning`) and
activations are constrained at block boundaries (`nn.with_logical_constraint`). Both are no-ops unless
`bert_jax.sharding` supplies a mesh and a rules table; the model never names a mesh axis. Parameters
use `vocab`, `embed`, `embed_out` (output side of a D x D kernel), `heads`, `kv`, `mlp`, `position`,
`token_type`, `classes` and (scanned layers) `layers`; activations `batch`, `length`, `embed`, `heads`,
`kv`, `mlp`, `predictions`.

Precision: parameters are stored in `param_dtype` (float32 by default) and cast to `dtype` for
matmuls; attention softmax, LayerNorm statistics and the MLM logits are always float32.

Kernels: GELU, the feed-forward block's first dense layer, the tied MLM logits and dropout (and, in the
splash set, attention) come from `bert_jax.kernels.get(config.kernels)`: flax / jax forms by default,
XLA:CPU forms on CPU. LayerNorm is flax's in every set.
`deterministic` (True: no dropout) is a call argument at every level.

The config is `bert_jax.bert_config.BertConfig` (also importable from here); the fine-tuning heads
(SQuAD, GLUE, SWAG, NER) are in `bert_jax.heads`.
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_jax import kernels
# BERT_CONFIG_FIELDS and BertConfig re-exported: the model's config, importable with the model
from bert_jax.bert_config import ACTIVATIONS, BERT_CONFIG_FIELDS, REMAT_POLICIES, BertConfig  # noqa: F401

Array = jax.Array


@flax.struct.dataclass
class BertOutput:
    """Outputs of `BertModel`.

    Attributes:
      sequence_output: [B, L, D] in config.dtype, the last layer's hidden states.
      pooled_output: [B, D] in config.dtype, tanh(dense(sequence_output[:, 0])); [B, K, D] at the K
        `pooled_positions` when given; None without pooler.
      hidden_states: with `output_hidden_states=True`, num_hidden_layers + 1 arrays [B, L, D] in
        config.dtype: the embedding output, then each layer's output (transformers' `hidden_states`;
        the last is sequence_output); None otherwise.
    """

    sequence_output: Array
    pooled_output: Array | None
    hidden_states: tuple[Array, ...] | None = None


@flax.struct.dataclass
class PreTrainingOutput:
    """Outputs of `BertForPreTraining`.

    Attributes:
      mlm_logits: [B, P, V] float32, masked-LM logits at `masked_lm_positions` only.
      nsp_logits: [B, 2] float32, next-sentence logits (index 0 = IsNext, 1 = NotNext); [B, K, 2], one per
        instance, for packed rows.
      sequence_output: [B, L, D], pooled_output: [B, D] (packed: [B, K, D]), as in `BertOutput`.
    """

    mlm_logits: Array
    nsp_logits: Array
    sequence_output: Array
    pooled_output: Array


def _kernels(config: BertConfig) -> kernels.Kernels:
    return kernels.get(config.kernels)


def _activation(config: BertConfig) -> Callable[[Array], Array]:
    return ACTIVATIONS[config.hidden_act] or _kernels(config).gelu


def _init(config: BertConfig) -> Callable:
    # The original's tf.truncated_normal_initializer(stddev=initializer_range): cut at 2 stddev,
    # no variance correction (jax.nn.initializers.truncated_normal does the same).
    return jax.nn.initializers.truncated_normal(stddev=config.initializer_range)


def _param(module: nn.Module, name: str, init: Callable, shape: tuple[int, ...], axes: tuple[str, ...]):
    """Creates a parameter of `module` with logical axis names `axes`, in config.param_dtype."""
    return module.param(name, nn.with_logical_partitioning(init, axes), shape,
                        jnp.dtype(module.config.param_dtype))


def dense(config: BertConfig, features: int, axes: tuple[str, str], name: str | None = None,
          dot_general=None) -> nn.Dense:
    """A flax Dense layer of the model (also the heads' in `bert_jax.heads`): kernel [D_in, features]
    initialised as the original (truncated normal, initializer_range) on logical `axes`, the bias [features]
    on the second, computed in config.dtype, stored in config.param_dtype. dot_general: a kernel set's."""
    return nn.Dense(features, dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype),
                    kernel_init=nn.with_logical_partitioning(_init(config), axes),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]),
                    dot_general=dot_general, name=name)


def _layer_norm(config: BertConfig, name: str) -> nn.Module:
    """flax's LayerNorm with the exact two-pass variance (as torch.nn.LayerNorm and the original's
    tf.contrib LayerNorm), float32 statistics, parameters `scale` / `bias` [D] on logical axis `embed`."""
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=jnp.dtype(config.dtype),
                        param_dtype=jnp.dtype(config.param_dtype), use_fast_variance=False,
                        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), name=name)


def dropout(config: BertConfig, rate: float, x: Array, deterministic: bool) -> Array:
    """The kernel set's dropout of `rate` on x (any shape and dtype, kept); identity when deterministic.
    Inside a module only (it creates a flax submodule); needs the "dropout" PRNG stream otherwise."""
    return _kernels(config).dropout(rate)(x, deterministic=deterministic)


class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings -> LayerNorm -> dropout (paper figure 2)."""

    config: BertConfig

    def setup(self):
        c = self.config

        def table(rows, axis):
            return nn.Embed(rows, c.hidden_size, dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.param_dtype),
                            embedding_init=nn.with_logical_partitioning(_init(c), (axis, "embed")))

        self.word_embeddings = table(c.vocab_size, "vocab")
        self.position_embeddings = table(c.max_position_embeddings, "position")
        self.token_type_embeddings = table(c.type_vocab_size, "token_type")
        self.layer_norm = _layer_norm(c, "LayerNorm")
        self.dropout = _kernels(c).dropout(c.hidden_dropout_prob)

    def __call__(self, input_ids: Array, token_type_ids: Array, deterministic: bool,
                 position_ids: Array | None = None) -> Array:
        """input_ids, token_type_ids: int32 [B, L] -> embeddings [B, L, D] in config.dtype.

        Args:
          input_ids: int32 [B, L] WordPiece ids in [0, V); L <= max_position_embeddings.
          token_type_ids: int32 [B, L] segment ids in [0, T).
          deterministic: disables dropout when True.
          position_ids: int32 [B, L] rows of the position table (packed rows: 0.. within each instance);
            None: 0..L-1 (the first L rows of the [S, D] table).

        Ids are not checked here (`BertModel` checks shapes): an id >= V (or type >= T) gives a NaN row
        (`jnp.take`'s "fill" mode) and a negative one (>= -V) counts from the end of the table.

        Raises:
          TypeError: L > max_position_embeddings, or token_type_ids whose shape does not broadcast to
            input_ids' (jax broadcasting).
          flax.errors.InvalidRngError: deterministic False without a "dropout" PRNG stream.
        """
        # Summed in param_dtype (float32) so that bfloat16 compute loses nothing before the LayerNorm.
        words = jnp.take(self.word_embeddings.embedding, input_ids, axis=0)  # [B, L, D]
        if position_ids is None:
            positions = self.position_embeddings.embedding[:input_ids.shape[1]][None]  # [1, L, D]
        else:
            positions = jnp.take(self.position_embeddings.embedding, position_ids, axis=0)  # [B, L, D]
        types = jnp.take(self.token_type_embeddings.embedding, token_type_ids, axis=0)  # [B, L, D]
        x = self.dropout(self.layer_norm(words + positions + types), deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))

    def attend(self, x: Array, bias: Array) -> Array:
        """Tied output projection: x [..., D] -> float32 logits [..., V] = x @ word_embeddings^T + bias [V]."""
        return _kernels(self.config).tied_logits(x, self.word_embeddings.embedding, bias, jnp.dtype(self.config.dtype))


class BertSelfAttention(nn.Module):
    """Bidirectional multi-head self-attention with the padding mask, then the output projection."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: Array, mask: tuple[Array, Array], deterministic: bool,
                 positions: Array | None = None) -> Array:
        """x: [B, L, D]; mask: (bias, segments) -> [B, L, D] ([B, Q, D] with positions).

        mask: bias float32 [B, 1, 1, L] (0 real key, very negative padding), or [B, 1, L, L] for packed rows
        (`segment_mask_bias`); segments int32 [B, L], the same mask as segment ids (the attention_mask, or
        a packed row's segment_ids) for a kernel set with its own attention (`bert_jax.kernels.splash`).
        positions: int32 [B, Q] or None: the queries are the tokens at these positions only (keys and
        values are still every token), so the output holds their rows, equal to the full output's rows
        there. A kernel set's own attention computes every row and then takes these.

        Scaled dot-product attention (Vaswani et al. 2017, section 3.2): softmax(q k^T / sqrt(H) + mask_bias) v
        per head. x (any float dtype) is cast to config.dtype; scores and softmax are float32; the output is
        in config.dtype. mask_bias may be any shape that broadcasts to the scores [B, N, L, L].

        Raises (inputs are checked by `BertModel`):
          TypeError: x's last axis is not hidden_size (reshape), or mask_bias does not broadcast to
            [B, N, L, L].
          ValueError: a kernel set with its own attention (no dropout) while attention_probs_dropout_prob > 0
            and deterministic is False.
          flax.errors.InvalidRngError: deterministic=False without a "dropout" PRNG stream.
        """
        c = self.config
        dtype = jnp.dtype(c.dtype)
        n, h, d = c.num_attention_heads, c.head_size, c.hidden_size
        batch, length = x.shape[:2]
        kernel_set = _kernels(c)
        kernel = kernel_set.attention
        if kernel is not None and kernel_set.attention_applies is not None and not kernel_set.attention_applies(
                dtype, h, length, c.attention_probs_dropout_prob > 0 and not deterministic):
            kernel = None  # where the kernel set's attention does not apply: the model's own
        # Queries at `positions` only (the last layer when only some outputs are read), unless a kernel
        # set's own attention computes every row (the rows are taken after it).
        sparse = positions is not None and kernel is None
        queries = gather_positions(x, positions) if sparse else x  # [B, Q, D]
        rows = queries.shape[1]

        # Kernels are [D, N, H] (heads on their own logical axis), multiplied as their free [D, N*H]
        # view over the flattened tokens, then one transpose to heads-major [B, N, L, H].
        def project(name, inputs):
            tokens = inputs.reshape(-1, d).astype(dtype)  # [B*L, D]
            kernel = _param(self, f"{name}_kernel", _init(c), (d, n, h), ("embed", "heads", "kv"))
            bias = _param(self, f"{name}_bias", nn.initializers.zeros, (n, h), ("heads", "kv"))
            y = jnp.dot(tokens, kernel.reshape(d, n * h).astype(dtype)) + bias.reshape(n * h).astype(dtype)
            y = y.reshape(batch, inputs.shape[1], n, h).transpose(0, 2, 1, 3)
            return nn.with_logical_constraint(y, ("batch", "heads", "length", "kv"))

        query, key, value = project("query", queries), project("key", x), project("value", x)
        mask_bias, segments = mask
        if kernel is not None:  # the kernel set's attention, e.g. splash (no attention dropout)
            if c.attention_probs_dropout_prob > 0 and not deterministic:
                raise ValueError(f"model.kernels={c.kernels!r} has no attention-probability dropout: set "
                                 f"attention_probs_dropout_prob=0 (it is {c.attention_probs_dropout_prob})")
            context = kernel((query / math.sqrt(h)).astype(dtype), key, value, segments)
        else:
            if sparse and mask_bias.shape[2] > 1:  # a packed row's [B, 1, L, L] bias: the queries' rows
                mask_bias = jnp.take_along_axis(mask_bias, positions[:, None, :, None].astype(jnp.int32), axis=2)
            scores = jnp.matmul(query, jnp.swapaxes(key, -1, -2), preferred_element_type=jnp.float32)
            probs = jax.nn.softmax(scores / math.sqrt(h) + mask_bias, axis=-1)  # [B, N, Q, L] float32
            probs = dropout(c, c.attention_probs_dropout_prob, probs, deterministic)
            context = jnp.matmul(probs.astype(dtype), value)  # [B, N, Q, H]
        context = nn.with_logical_constraint(context, ("batch", "heads", "length", "kv"))
        context = context.transpose(0, 2, 1, 3)  # [B, Q, N, H]
        if positions is not None and not sparse:
            context = gather_positions(context.reshape(batch, length, n * h), positions)
            rows = positions.shape[1]
        context = context.reshape(batch * rows, n * h)  # [B*Q, N*H]
        out_kernel = _param(self, "output_kernel", _init(c), (n, h, d), ("heads", "kv", "embed"))
        out_bias = _param(self, "output_bias", nn.initializers.zeros, (d,), ("embed",))
        out = jnp.dot(context, out_kernel.reshape(n * h, d).astype(dtype)) + out_bias.astype(dtype)
        return out.reshape(batch, rows, d)


class BertLayer(nn.Module):
    """One post-LayerNorm Transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)).

    `__call__` returns `(hidden, carry_out)` so that the same module runs under `nn.scan`: carry_out is the
    hidden state again with `return_state` (scan then stacks the layers' outputs), else None.
    """

    config: BertConfig
    return_state: bool = False

    @nn.compact
    def __call__(self, x: Array, mask: tuple[Array, Array], deterministic: bool,
                 positions: Array | None = None) -> tuple[Array, Array | None]:
        """x: [B, L, D]; mask as `BertSelfAttention` -> ([B, L, D], [B, L, D] or None).

        positions: int32 [B, Q] or None: compute the layer's output at these positions only ([B, Q, D], the
        full output's rows there): keys and values from every token, queries, the residuals, LayerNorms and
        the feed-forward block at Q rows (the last layer when a head reads only some outputs).
        """
        c = self.config
        attn = BertSelfAttention(c, name="attention")(x, mask, deterministic, positions)
        if positions is not None:
            x = gather_positions(x, positions)
        x = _layer_norm(c, "attention_LayerNorm")(x + dropout(c, c.hidden_dropout_prob, attn, deterministic))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        y = dense(c, c.intermediate_size, ("embed", "mlp"), "intermediate", _kernels(c).dot_general)(x)
        y = nn.with_logical_constraint(_activation(c)(y), ("batch", "length", "mlp"))  # [B, L, I]
        y = dense(c, c.hidden_size, ("mlp", "embed"), "output")(y)
        x = _layer_norm(c, "output_LayerNorm")(x + dropout(c, c.hidden_dropout_prob, y, deterministic))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        return x, (x if self.return_state else None)


class BertEncoder(nn.Module):
    """The stack of `num_hidden_layers` layers: `layer_{i}` each, or one scanned `layers` stack."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: Array, mask: tuple[Array, Array], deterministic: bool,
                 output_hidden_states: bool = False,
                 positions: Array | None = None) -> Array | tuple[Array, tuple[Array, ...]]:
        """x: [B, L, D]; mask as `BertSelfAttention` -> [B, L, D].

        With output_hidden_states, returns ([B, L, D], hidden_states): hidden_states is x followed by
        each layer's output, num_hidden_layers + 1 arrays [B, L, D] (both layer layouts; the scanned
        one stacks them under `nn.scan`). The parameters are the same either way.

        positions: int32 [B, Q] or None: only the last layer's outputs at these positions are wanted, and
        the result is [B, Q, D]: the last layer computes them alone (`BertLayer`'s positions) in the
        loop layout; the scanned layout computes every row and takes these.

        Raises:
          ValueError: positions with output_hidden_states.
        """
        c = self.config
        if positions is not None and output_hidden_states:
            raise ValueError("output positions and output_hidden_states exclude each other: hidden states are "
                             "every token's")
        layer_cls = BertLayer
        if c.remat_policy != "none":  # argument 3 (deterministic, after self, x, mask) is static
            layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[c.remat_policy], prevent_cse=not c.scan_layers,
                                 static_argnums=(3,))
        if c.scan_layers:
            stack = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                            in_axes=(nn.broadcast, nn.broadcast), length=c.num_hidden_layers,
                            metadata_params={nn.PARTITION_NAME: "layers"})
            out, stacked = stack(c, output_hidden_states, name="layers")(x, mask, deterministic)
            if not output_hidden_states:
                return out if positions is None else gather_positions(out, positions)
            return out, (x, *(stacked[i] for i in range(c.num_hidden_layers)))
        states = [x]
        for i in range(c.num_hidden_layers):
            last = i == c.num_hidden_layers - 1
            x, _ = layer_cls(c, name=f"layer_{i}")(x, mask, deterministic, positions if last else None)
            states.append(x)
        return (x, tuple(states)) if output_hidden_states else x


def attention_mask_bias(attention_mask: Array) -> Array:
    """int [B, L] (1 real, 0 padding) -> float32 [B, 1, 1, L] additive bias (0 or float32 min)."""
    return jnp.where(attention_mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min)


def segment_mask_bias(segment_ids: Array) -> Array:
    """Packed rows' mask: int [B, L] (1, 2, ... per instance, 0 padding) -> float32 [B, 1, L, L] additive bias,
    0 where query and key are in the same segment, float32 min elsewhere. Padding attends to padding only
    (its outputs are never read), so no row of the softmax is fully masked. The same rule as splash
    attention's `SegmentIds` (jax.experimental.pallas.ops.tpu.splash_attention)."""
    same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    return jnp.where(same, 0.0, jnp.finfo(jnp.float32).min)


def _check_inputs(config: BertConfig, input_ids: Array, token_type_ids, attention_mask, segment_ids=None,
                  position_ids=None):
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    if input_ids.shape[1] > config.max_position_embeddings:
        raise ValueError(
            f"input_ids length {input_ids.shape[1]} exceeds max_position_embeddings="
            f"{config.max_position_embeddings}")
    for name, value in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask),
                        ("segment_ids", segment_ids), ("position_ids", position_ids)):
        if value is not None and value.shape != input_ids.shape:
            raise ValueError(f"{name} shape {value.shape} differs from input_ids shape {input_ids.shape}")


class BertModel(nn.Module):
    """The BERT encoder: embeddings, `num_hidden_layers` layers and the pooler.

    Applied as `model.apply({"params": params}, input_ids=..., token_type_ids=..., attention_mask=...,
    deterministic=True)`; dropout needs `rngs={"dropout": key}` when `deterministic=False`.
    Matches Hugging Face `transformers.BertModel` (see `bert_jax.convert.from_hf`).
    """

    config: BertConfig
    add_pooling_layer: bool = True

    def setup(self):
        c = self.config
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        if self.add_pooling_layer:
            self.pooler = dense(c, c.hidden_size, ("embed", "embed_out"))

    def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
                 attention_mask: Array | None = None, deterministic: bool = True,
                 output_hidden_states: bool = False, segment_ids: Array | None = None,
                 position_ids: Array | None = None, pooled_positions: Array | None = None,
                 output_positions: Array | None = None) -> BertOutput:
        """Encodes a batch.

        Args:
          input_ids: int32 [B, L] WordPiece ids, L <= max_position_embeddings.
          token_type_ids: int32 [B, L], 0 sentence A, 1 sentence B; zeros when None.
          attention_mask: int32 [B, L], 1 real token, 0 padding; all ones when None. Ignored when
            segment_ids is given.
          deterministic: disables dropout when True.
          output_hidden_states: also return every layer's output (the feature-based approach, paper
            section 5.3; google-research/bert's `get_all_encoder_layers` plus the embedding output).
          segment_ids: int32 [B, L] of packed rows, 1, 2, ... per instance and 0 on padding: a token attends
            only to tokens of its own segment (`segment_mask_bias`).
          position_ids: int32 [B, L] position-table rows (packed rows: restarting at 0 in each instance);
            None: 0..L-1.
          pooled_positions: int32 [B, K], the pooler's inputs as rows of sequence_output (each packed
            instance's [CLS]); None: row 0 only ([CLS]).
          output_positions: int32 [B, Q], positions in [0, L) whose last-layer states are all a head reads
            (e.g. [CLS] for a classifier): the last layer then computes those rows only (its queries,
            feed-forward block and LayerNorms; keys and values from every token), as the MLM head runs
            only at the masked positions, and sequence_output is [B, Q, D], row q the full
            sequence_output's row at output_positions[:, q]. None: every position.

        Returns:
          BertOutput with sequence_output [B, L, D] ([B, Q, D] with output_positions) and pooled_output
          [B, D] (config.dtype), and hidden_states (num_hidden_layers + 1 arrays [B, L, D]: embeddings,
          then each layer) when output_hidden_states, else None.

        Raises:
          ValueError: for a non-2-D input_ids, a length over max_position_embeddings or mismatched shapes;
            output_positions not [B, Q], or with output_hidden_states.
        """
        _check_inputs(self.config, input_ids, token_type_ids, attention_mask, segment_ids, position_ids)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if segment_ids is not None:
            mask = (segment_mask_bias(segment_ids), segment_ids)
        else:
            attention_mask = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
            mask = (attention_mask_bias(attention_mask), attention_mask)
        x = self.embeddings(input_ids, token_type_ids, deterministic, position_ids)
        if output_positions is not None and (output_positions.ndim != 2
                                             or output_positions.shape[0] != input_ids.shape[0]):
            raise ValueError(f"output_positions must be [batch, positions] with batch {input_ids.shape[0]}, got "
                             f"shape {output_positions.shape}")
        x = self.encoder(x, mask, deterministic, output_hidden_states, output_positions)
        x, hidden_states = x if output_hidden_states else (x, None)
        first = x[:, 0] if pooled_positions is None else gather_positions(x, pooled_positions)  # [B, D] / [B, K, D]
        pooled = jnp.tanh(self.pooler(first)) if self.add_pooling_layer else None
        return BertOutput(sequence_output=x, pooled_output=pooled, hidden_states=hidden_states)

    def attend(self, x: Array, bias: Array) -> Array:
        """Tied word-embedding projection, x [..., D] -> float32 [..., V] = x @ word_embeddings^T + bias [V]."""
        return self.embeddings.attend(x, bias)


def gather_positions(sequence: Array, positions: Array) -> Array:
    """sequence [B, L, D], positions int32 [B, P] -> [B, P, D] (the original's gather_indexes).

    The dtype of `sequence` is kept. Position values are not checked and never raise: with
    `jnp.take_along_axis`'s default "fill" mode a position in [-L, 0) counts from the end, and one
    >= L or < -L gives a NaN row (the dtype's minimum for an integer sequence).

    Raises:
      IndexError: 1-D positions.
      ValueError: a batch size of positions that neither equals nor broadcasts to B.
    """
    return jnp.take_along_axis(sequence, positions[:, :, None].astype(jnp.int32), axis=1)


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM and next-sentence heads (paper section 3.1, appendix A.2).

    The MLM head (dense -> activation -> LayerNorm -> tied decoder + output bias) runs only at
    `masked_lm_positions`, as the original's `get_masked_lm_output`, never over all L positions.
    """

    config: BertConfig

    def setup(self):
        c = self.config
        self.bert = BertModel(c, name="bert")
        self.mlm_transform = dense(c, c.hidden_size, ("embed", "embed_out"))
        self.mlm_layer_norm = _layer_norm(c, "mlm_LayerNorm")
        self.nsp = dense(c, 2, ("embed", "classes"))
        self.mlm_output_bias = _param(self, "mlm_output_bias", nn.initializers.zeros, (c.vocab_size,),
                                      ("vocab",))

    def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
                 attention_mask: Array | None = None, masked_lm_positions: Array | None = None,
                 deterministic: bool = True, segment_ids: Array | None = None, position_ids: Array | None = None,
                 next_sentence_positions: Array | None = None) -> PreTrainingOutput:
        """Pre-training forward pass, on instances one per row or packed several per row.

        Args:
          input_ids, token_type_ids, attention_mask: int32 [B, L], as `BertModel`.
          masked_lm_positions: int32 [B, P], positions in [0, L) to predict (zero padded).
          deterministic: disables dropout when True.
          segment_ids, position_ids: int32 [B, L] of packed rows, as `BertModel`.
          next_sentence_positions: int32 [B, K], the [CLS] position of each instance of a packed row
            (padding entries: any position in [0, L), their logits are weighted 0 by the loss).

        Returns:
          PreTrainingOutput: mlm_logits float32 [B, P, V], nsp_logits float32 [B, 2] ([B, K, 2] with
          next_sentence_positions), and the encoder outputs.

        Raises:
          ValueError: masked_lm_positions missing or not [B, P]; the errors of `BertModel`.
        """
        if masked_lm_positions is None or masked_lm_positions.ndim != 2:
            raise ValueError("masked_lm_positions must be given as int32 [batch, max_predictions]")
        out = self.bert(input_ids, token_type_ids, attention_mask, deterministic, segment_ids=segment_ids,
                        position_ids=position_ids, pooled_positions=next_sentence_positions)
        return PreTrainingOutput(
            mlm_logits=self.mlm_logits(out.sequence_output, masked_lm_positions),
            nsp_logits=self.nsp(out.pooled_output).astype(jnp.float32),
            sequence_output=out.sequence_output,
            pooled_output=out.pooled_output,
        )

    def mlm_logits(self, sequence_output: Array, masked_lm_positions: Array) -> Array:
        """sequence_output [B, L, D], masked_lm_positions int32 [B, P] -> float32 logits [B, P, V]."""
        c = self.config
        x = gather_positions(sequence_output, masked_lm_positions)  # [B, P, D]
        x = nn.with_logical_constraint(x, ("batch", "predictions", "embed"))
        x = self.mlm_layer_norm(_activation(c)(self.mlm_transform(x)))
        logits = self.bert.attend(x, self.mlm_output_bias)
        return nn.with_logical_constraint(logits, ("batch", "predictions", "vocab"))


