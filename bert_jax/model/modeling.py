"""The BERT model in Flax linen, read top-down: the public models, the encoder, one Transformer layer,
self-attention (its projections, then one attention operation on a typed mask), the embeddings. The
building blocks (dense, LayerNorm, dropout, the row gather) are in `bert_jax.model.layers`.

Architecture as in Devlin et al. 2018 (arXiv 1810.04805, section 3) and google-research/bert
`modeling.py`: learned absolute position and token-type embeddings, post-LayerNorm Transformer layers
with exact (erf) GELU, a tanh pooler on [CLS], a masked-LM head tied to the word embeddings and
evaluated only at `masked_lm_positions`, and a next-sentence head on the pooled output.

Packed rows (several pre-training instances in one row, Krell et al. 2021, "Efficient Sequence Packing
without Cross-contamination"): `segment_ids` [B, L] (1, 2, ... per instance, 0 padding) restrict
attention to the tokens of the same instance, `position_ids` [B, L] restart at 0 in each instance, and
the pooler and next-sentence head run at each instance's [CLS] (`next_sentence_positions` [B, K]). An
instance then gets exactly the outputs it gets alone in an unpacked row.

Dimension key used in shapes:
  B batch, L sequence length, D hidden_size, N num_attention_heads, H head size (D / N),
  I intermediate_size, V vocab_size, P max predictions per sequence, T type_vocab_size,
  S max_position_embeddings, C number of classes, K instances per packed row, Q positions computed.

Sharding: every parameter is created with logical axis names (`nn.with_logical_partitioning`) and
activations are constrained at block boundaries (`nn.with_logical_constraint`). Both are no-ops unless
`bert_jax.training.sharding` supplies a mesh and a rules table; the model never names a mesh axis. Parameters
use `vocab`, `embed`, `embed_out` (output side of a D x D kernel), `heads`, `kv`, `mlp`, `position`,
`token_type`, `classes` and (scanned layers) `layers`; activations `batch`, `length`, `activation_embed`,
`heads`, `kv`, `mlp`, `vocab`, `predictions`.

Precision: parameters are stored in `param_dtype` (float32 by default) and cast to `dtype` for
matmuls; attention softmax, LayerNorm statistics and the MLM logits are always float32.

Kernels: GELU, the feed-forward block's first dense layer, the tied MLM logits, dropout and (splash and
gpu sets) attention come from `bert_jax.model.kernels.get(config.kernels)`. `deterministic` (True: no dropout)
is a call argument at every level. The config is `bert_jax.model.bert_config.BertConfig` (also importable from
here); the fine-tuning heads (SQuAD, GLUE, SWAG, NER) are in `bert_jax.model.heads`.
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

# BERT_CONFIG_FIELDS and BertConfig re-exported: the model's config, importable with the model
from bert_jax.model.bert_config import BERT_CONFIG_FIELDS, BertConfig, REMAT_POLICIES  # noqa: F401
from bert_jax.model.kernels.base import PACKED_SLOTS
from bert_jax.model.kernels.dropout import seeds as dropout_seeds
from bert_jax.model.layers import (AttentionMask, SplitDense, activation, dense, dense_activation, dropout,
                                   dropout_add_layer_norm, gather_positions, initializer, kernel_set, layer_norm, param)

Array = jax.Array


@flax.struct.dataclass
class BertOutput:
    """Outputs of `BertModel`.

    Attributes:
      sequence_output: [B, L, D] in config.dtype, the last layer's hidden states ([B, Q, D] at
        `output_positions`).
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


class BertModel(nn.Module):
    """The BERT encoder: embeddings, `num_hidden_layers` layers and the pooler.

    Applied as `model.apply({"params": params}, input_ids=..., token_type_ids=..., attention_mask=...,
    deterministic=True)`; dropout needs `rngs={"dropout": key}` when `deterministic=False`.
    Matches Hugging Face `transformers.BertModel` (see `bert_jax.checkpoints.hf.from_hf`).
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
            only to tokens of its own segment (`AttentionMask.packed`).
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
        _check_inputs(self.config, input_ids, token_type_ids, attention_mask, segment_ids, position_ids,
                      output_positions)
        token_type_ids = jnp.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        attention_mask = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
        mask = AttentionMask.padding(attention_mask) if segment_ids is None else AttentionMask.packed(segment_ids)
        x = self.embeddings(input_ids, token_type_ids, deterministic, position_ids)
        x = self.encoder(x, mask, deterministic, output_hidden_states, output_positions)
        x, hidden_states = x if output_hidden_states else (x, None)
        first = x[:, 0] if pooled_positions is None else gather_positions(x, pooled_positions)  # [B, D] / [B, K, D]
        pooled = jnp.tanh(self.pooler(first)) if self.add_pooling_layer else None
        return BertOutput(sequence_output=x, pooled_output=pooled, hidden_states=hidden_states)

    def attend(self, x: Array, bias: Array) -> Array:
        """Tied word-embedding projection, x [..., D] -> float32 [..., V] = x @ word_embeddings^T + bias [V]."""
        return self.embeddings.attend(x, bias)


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
        self.mlm_layer_norm = layer_norm(c, "mlm_LayerNorm")
        self.nsp = dense(c, 2, ("embed", "classes"))
        self.mlm_output_bias = param(self, "mlm_output_bias", nn.initializers.zeros, (c.vocab_size,),
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
        x = nn.with_logical_constraint(x, ("batch", "predictions", "activation_embed"))
        x = self.mlm_layer_norm(activation(c)(self.mlm_transform(x)))
        logits = self.bert.attend(x, self.mlm_output_bias)
        return nn.with_logical_constraint(logits, ("batch", "predictions", "vocab"))


class BertEncoder(nn.Module):
    """The stack of `num_hidden_layers` layers: `layer_{i}` each, or one scanned `layers` stack."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: Array, mask: AttentionMask, deterministic: bool, output_hidden_states: bool = False,
                 positions: Array | None = None) -> Array | tuple[Array, tuple[Array, ...]]:
        """x: [B, L, D]; mask: the `AttentionMask` of the rows -> [B, L, D].

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
            stack = nn.scan(layer_cls, variable_axes={"params": 0, "intermediates": 0},  # intermediates: per layer
                            split_rngs={"params": True, "dropout": True},
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


class BertLayer(nn.Module):
    """One post-LayerNorm Transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)).

    `__call__` returns `(hidden, carry_out)` so that the same module runs under `nn.scan`: carry_out is the
    hidden state again with `return_state` (scan then stacks the layers' outputs), else None.
    """

    config: BertConfig
    return_state: bool = False

    @nn.compact
    def __call__(self, x: Array, mask: AttentionMask, deterministic: bool,
                 positions: Array | None = None) -> tuple[Array, Array | None]:
        """x: [B, L, D]; mask: the `AttentionMask` of the rows -> ([B, L, D], [B, L, D] or None).

        positions: int32 [B, Q] or None: compute the layer's output at these positions only ([B, Q, D], the
        full output's rows there): keys and values from every token, queries, the residuals, LayerNorms and
        the feed-forward block at Q rows (the last layer when a head reads only some outputs).
        """
        c = self.config
        attn, attn_bias = BertSelfAttention(c, name="attention")(x, mask, deterministic, positions)
        if positions is not None:
            x = gather_positions(x, positions)
        x = dropout_add_layer_norm(c, "attention_LayerNorm", attn, attn_bias, x, deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "activation_embed"))
        y = nn.with_logical_constraint(dense_activation(c, "intermediate", x), ("batch", "length", "mlp"))  # [B, L, I]
        y, y_bias = SplitDense(c, c.hidden_size, ("mlp", "embed"), name="output")(y)
        x = dropout_add_layer_norm(c, "output_LayerNorm", y, y_bias, x, deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "activation_embed"))
        return x, (x if self.return_state else None)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention: the query, key and value projections, `AttentionOp`, the output projection.

    Parameters (named as the original's attention/self and attention/output dense layers):
    `{query,key,value}_kernel` [D, N, H] and `_bias` [N, H]; `output_kernel` [N, H, D], `output_bias` [D].
    """

    config: BertConfig

    @nn.compact
    def __call__(self, x: Array, mask: AttentionMask, deterministic: bool,
                 positions: Array | None = None) -> tuple[Array, Array]:
        """x: [B, L, D] (any float dtype, cast to config.dtype) -> (the output projection's product [B, L, D] in
        config.dtype ([B, Q, D], the full output's rows, with positions int32 [B, Q]), its bias `output_bias` [D]):
        the layer adds the bias with its dropout and LayerNorm (`dropout_add_layer_norm`).

        Raises (inputs are checked by `BertModel`):
          TypeError: x's last axis is not hidden_size (reshape).
          The errors of `AttentionOp`.
        """
        c = self.config
        dtype = jnp.dtype(c.dtype)
        n, h, d = c.num_attention_heads, c.head_size, c.hidden_size
        op = AttentionOp(c, name="op")
        weights = {name: (param(self, f"{name}_kernel", initializer(c), (d, n, h), ("embed", "heads", "kv")),
                          param(self, f"{name}_bias", nn.initializers.zeros, (n, h), ("heads", "kv")))
                   for name in ("query", "key", "value")}
        if op.takes_packed(x.shape[1], deterministic):
            # One matrix product for the three projections, their biases and the query's scale left to the kernel.
            kernel = jnp.stack([weights[name][0].astype(dtype) for name in PACKED_SLOTS], axis=1)  # [D, 3, N, H]
            # Heads kept an axis of their own, so a tensor-split kernel stays split (no gather of the weights).
            packed = nn.with_logical_constraint(jnp.einsum("bld,dsnh->blsnh", x.astype(dtype), kernel),
                                                ("batch", "length", None, "heads", "kv"))
            context = op(packed, None, None, mask, deterministic, positions,
                         tuple(weights[name][1] for name in ("query", "key", "value")))  # [B, Q, N, H]
        else:
            # Kernels are [D, N, H] (heads on their own logical axis), multiplied as their free [D, N*H]
            # view over the flattened tokens, then one transpose to heads-major [B, N, L, H].
            def project(name, inputs):
                kernel, bias = weights[name]
                y = jnp.dot(inputs.reshape(-1, d).astype(dtype), kernel.reshape(d, n * h).astype(dtype))
                y = (y + bias.reshape(n * h).astype(dtype)).reshape(inputs.shape[0], inputs.shape[1], n, h)
                return nn.with_logical_constraint(y.transpose(0, 2, 1, 3), ("batch", "heads", "length", "kv"))

            context = op(project("query", op.queries(x, positions, deterministic)), project("key", x),
                         project("value", x), mask, deterministic, positions)  # [B, Q, N, H]
        batch, rows = context.shape[:2]
        out_kernel = param(self, "output_kernel", initializer(c), (n, h, d), ("heads", "kv", "embed"))
        out_bias = param(self, "output_bias", nn.initializers.zeros, (d,), ("embed",))
        out = jnp.dot(context.reshape(batch * rows, n * h), out_kernel.reshape(n * h, d).astype(dtype))
        return out.reshape(batch, rows, d), out_bias


class AttentionOp(nn.Module):
    """Scaled dot-product attention (Vaswani et al. 2017, section 3.2), softmax(q k^T / sqrt(H) + mask) v per
    head, by the kernel set's attention where it takes the layer (`Kernels.attention_applies`), else here
    with float32 scores and softmax and attention-probability dropout.

    With query positions, only those rows are wanted: computed here, the queries are only those rows
    (`queries`); a kernel set's attention computes every row and the rows are taken after it.
    """

    config: BertConfig

    def _kernel(self, length: int, deterministic: bool) -> Callable | None:
        c = self.config
        ops = kernel_set(c)
        dropout_active = c.attention_probs_dropout_prob > 0 and not deterministic
        if ops.attention is None or (ops.attention_applies is not None and not ops.attention_applies(
                jnp.dtype(c.dtype), c.head_size, length, dropout_active)):
            return None
        if dropout_active and not ops.attention_dropout:
            raise ValueError(f"model.kernels={c.kernels!r} has no attention-probability dropout: set "
                             f"attention_probs_dropout_prob=0 (it is {c.attention_probs_dropout_prob})")
        return ops.attention

    def takes_packed(self, length: int, deterministic: bool) -> bool:
        """Whether the projections go in as one packed array without their biases, the query unscaled: the kernel
        set's attention takes the layer and adds them itself (`Kernels.attention_packed`)."""
        return self._kernel(length, deterministic) is not None and kernel_set(self.config).attention_packed

    def queries(self, x: Array, positions: Array | None, deterministic: bool) -> Array:
        """The inputs of the query projection: x [B, L, D] at positions int32 [B, Q] ([B, Q, D]) when the
        attention is computed here, else x."""
        if positions is None or self._kernel(x.shape[1], deterministic) is not None:
            return x
        return gather_positions(x, positions)

    @nn.compact
    def __call__(self, query: Array, key: Array | None, value: Array | None, mask: AttentionMask, deterministic: bool,
                 positions: Array | None = None, bias: tuple[Array, Array, Array] | None = None) -> Array:
        """query [B, N, Q, H] (Q = L without positions), key and value [B, N, L, H] in config.dtype ->
        context [B, Q, N, H] in config.dtype. Where `takes_packed`: query the packed projections [B, L, 3, N, H]
        (slots `PACKED_SLOTS`), key and value None, bias the three biases [N, H] the kernel adds, scaling the query.

        Raises:
          ValueError: a kernel set whose attention draws no dropout (`Kernels.attention_dropout` False) taking
            the layer while attention_probs_dropout_prob > 0 and deterministic is False.
          TypeError: mask.bias does not broadcast to the scores [B, N, Q, L].
          flax.errors.InvalidRngError: deterministic=False without a "dropout" PRNG stream.
        """
        c = self.config
        dtype, scale = jnp.dtype(c.dtype), math.sqrt(c.head_size)
        kernel = self._kernel(query.shape[1] if key is None else key.shape[2], deterministic)
        if kernel is not None:
            args = dict(bias=bias, scale=1.0 / scale) if bias is not None else {}
            query = query if bias is not None else (query / scale).astype(dtype)
            if c.attention_probs_dropout_prob > 0 and not deterministic:
                # The kernel draws the mask the reference path's dropout module (same name, same key) would draw.
                args["seed"] = dropout_seeds(kernel_set(c).dropout(c.attention_probs_dropout_prob).make_rng("dropout"))
                args["dropout_rate"] = c.attention_probs_dropout_prob
            context = kernel(query, key, value, mask.segment_ids, **args)  # [B, N, L, H]
        else:
            scores = jnp.matmul(query, jnp.swapaxes(key, -1, -2), preferred_element_type=jnp.float32)
            probs = jax.nn.softmax(scores / scale + mask.query_bias(positions), axis=-1)  # [B, N, Q, L] float32
            probs = dropout(c, c.attention_probs_dropout_prob, probs, deterministic)
            context = jnp.matmul(probs.astype(dtype), value)  # [B, N, Q, H]
        context = nn.with_logical_constraint(context, ("batch", "heads", "length", "kv")).transpose(0, 2, 1, 3)
        return context if kernel is None or positions is None else gather_positions(context, positions)


class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings -> LayerNorm -> dropout (paper figure 2)."""

    config: BertConfig

    def setup(self):
        c = self.config

        def table(rows, axis):
            return nn.Embed(rows, c.hidden_size, dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.param_dtype),
                            embedding_init=nn.with_logical_partitioning(initializer(c), (axis, "embed")))

        self.word_embeddings = table(c.vocab_size, "vocab")
        self.position_embeddings = table(c.max_position_embeddings, "position")
        self.token_type_embeddings = table(c.type_vocab_size, "token_type")
        self.layer_norm = layer_norm(c, "LayerNorm")
        self.dropout = kernel_set(c).dropout(c.hidden_dropout_prob)

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
        return nn.with_logical_constraint(x, ("batch", "length", "activation_embed"))

    def attend(self, x: Array, bias: Array) -> Array:
        """Tied output projection: x [..., D] -> float32 logits [..., V] = x @ word_embeddings^T + bias [V]."""
        return kernel_set(self.config).tied_logits(x, self.word_embeddings.embedding, bias, jnp.dtype(self.config.dtype))


def _check_inputs(config: BertConfig, input_ids: Array, token_type_ids, attention_mask, segment_ids, position_ids,
                  output_positions):
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
    if output_positions is not None and (output_positions.ndim != 2 or output_positions.shape[0] != input_ids.shape[0]):
        raise ValueError(f"output_positions must be [batch, positions] with batch {input_ids.shape[0]}, got "
                         f"shape {output_positions.shape}")
