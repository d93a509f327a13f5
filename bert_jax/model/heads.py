"""The fine-tuning heads on the BERT encoder (paper section 4 and 5.3), each matching its transformers class.

`BertForQuestionAnswering` (SQuAD, section 4.2), `BertForSequenceClassification` (GLUE, section 4.1;
regression with one label), `BertForMultipleChoice` (SWAG, section 4.4) and `BertForTokenClassification`
(CoNLL-2003 NER, section 5.3). Each is `bert` (`modeling.BertModel`) plus a dense layer; parameter names
and layouts are those `bert_jax.convert` maps to and from Hugging Face. Shapes use `bert_jax.model.modeling`'s
dimension key (B batch, L length, D hidden_size, C classes, K choices).

The two heads on the pooled output (classification, multiple choice) ask the encoder for the [CLS] state
only (`cls_position`): its last layer then computes one row per sequence instead of L, the logits
unchanged (the classification analogue of the sparse MLM head).
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_jax.model.layers import dense, dropout
from bert_jax.model.modeling import BertConfig, BertModel

Array = jax.Array


@flax.struct.dataclass
class SpanOutput:
    """Outputs of `BertForQuestionAnswering`: start_logits, end_logits, each [B, L] float32."""

    start_logits: Array
    end_logits: Array


@flax.struct.dataclass
class ClassificationOutput:
    """Outputs of `BertForSequenceClassification`: logits [B, C] float32."""

    logits: Array


def cls_position(input_ids: Array) -> Array:
    """int32 [B, 1] zeros: the [CLS] position, the only last-layer state a pooled-output head reads
    (`BertModel`'s output_positions: its last layer then runs at [CLS] alone; the logits are unchanged)."""
    return jnp.zeros((input_ids.shape[0], 1), jnp.int32)


class BertForQuestionAnswering(nn.Module):
    """BERT with the SQuAD span head: a [D, 2] projection giving start and end logits per token."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
                 attention_mask: Array | None = None, deterministic: bool = True) -> SpanOutput:
        """int32 [B, L] inputs -> SpanOutput(start_logits, end_logits), each float32 [B, L].

        Arguments as `BertModel.__call__`; the span head of the paper's section 4.2 (SQuAD).

        Raises:
          ValueError: a non-2-D input_ids, a length over max_position_embeddings or mismatched shapes
            (`BertModel`).
          flax.errors.InvalidRngError: deterministic=False without a "dropout" PRNG stream.
        """
        out = BertModel(self.config, add_pooling_layer=False, name="bert")(
            input_ids, token_type_ids, attention_mask, deterministic)
        logits = dense(self.config, 2, ("embed", "classes"), "qa_outputs")(out.sequence_output)
        logits = logits.astype(jnp.float32)  # [B, L, 2]
        return SpanOutput(start_logits=logits[..., 0], end_logits=logits[..., 1])


class BertForSequenceClassification(nn.Module):
    """BERT with a classifier on the pooled output (dropout -> [D, C] projection), as GLUE in the paper."""

    config: BertConfig
    num_labels: int = 2

    @nn.compact
    def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
                 attention_mask: Array | None = None, deterministic: bool = True) -> ClassificationOutput:
        """int32 [B, L] inputs -> ClassificationOutput(logits float32 [B, C]), C = num_labels.

        Arguments as `BertModel.__call__`; the classifier of the paper's section 4.1 (GLUE).

        Raises:
          ValueError: a non-2-D input_ids, a length over max_position_embeddings or mismatched shapes
            (`BertModel`).
          flax.errors.InvalidRngError: deterministic=False without a "dropout" PRNG stream.
        """
        out = BertModel(self.config, name="bert")(input_ids, token_type_ids, attention_mask, deterministic,
                                                  output_positions=cls_position(input_ids))
        pooled = dropout(self.config, self.config.hidden_dropout_prob, out.pooled_output, deterministic)
        logits = dense(self.config, self.num_labels, ("embed", "classes"), "classifier")(pooled)
        return ClassificationOutput(logits=logits.astype(jnp.float32))


@flax.struct.dataclass
class MultipleChoiceOutput:
    """Outputs of `BertForMultipleChoice`: logits [B, K] float32, one score per choice (softmax over K)."""

    logits: Array


@flax.struct.dataclass
class TokenClassificationOutput:
    """Outputs of `BertForTokenClassification`: logits [B, L, C] float32, one row of C label scores per token."""

    logits: Array


class BertForMultipleChoice(nn.Module):
    """BERT with a multiple-choice head: each choice is one sequence, scored by a [D, 1] projection of its
    pooled [CLS] output (dropout first); the K scores of an example are its logits (paper section 4.4,
    SWAG: "a vector whose dot product with the [CLS] token representation C denotes a score for each
    choice which is normalized with a softmax layer"). Matches transformers' `BertForMultipleChoice`
    (`hf.to_hf` writes the head as its `classifier.weight` [1, D] / `classifier.bias` [1]).
    """

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
                 attention_mask: Array | None = None, deterministic: bool = True) -> MultipleChoiceOutput:
        """int32 [B, K, L] inputs (K choices of one example, e.g. SWAG's four) -> logits float32 [B, K].

        Args:
          input_ids: int32 [B, K, L]; a 2-D [B, L] is one choice per example (K = 1, logits [B, 1]: the
            shape `tasks.finetune.create_state` initialises with).
          token_type_ids, attention_mask: int32 of input_ids' shape, or None (zeros / ones), as
            `BertModel.__call__`.
          deterministic: disables dropout when True.

        The K choices run through the encoder as B * K rows of length L.

        Raises:
          ValueError: input_ids neither 2-D nor 3-D, token_type_ids or attention_mask of another shape,
            or L over max_position_embeddings (`BertModel`).
          flax.errors.InvalidRngError: deterministic=False without a "dropout" PRNG stream.
        """
        if input_ids.ndim not in (2, 3):
            raise ValueError(f"input_ids must be [batch, choices, length], got shape {input_ids.shape}")
        for name, value in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
            if value is not None and value.shape != input_ids.shape:
                raise ValueError(f"{name} shape {value.shape} differs from input_ids shape {input_ids.shape}")
        rows = input_ids.shape[:-1]  # (B, K), or (B,) for one choice each

        def flat(x):  # [B, K, L] -> [B * K, L]
            return None if x is None else x.reshape(-1, input_ids.shape[-1])

        ids = flat(input_ids)
        out = BertModel(self.config, name="bert")(ids, flat(token_type_ids), flat(attention_mask), deterministic,
                                                  output_positions=cls_position(ids))
        pooled = dropout(self.config, self.config.hidden_dropout_prob, out.pooled_output, deterministic)
        scores = dense(self.config, 1, ("embed", "classes"), "choice_classifier")(pooled)  # [B * K, 1]
        logits = scores.astype(jnp.float32).reshape(rows if input_ids.ndim == 3 else rows + (1,))
        return MultipleChoiceOutput(logits=logits)


class BertForTokenClassification(nn.Module):
    """BERT with a token classifier: dropout -> [D, C] projection of every token of the sequence output
    (paper section 5.3, CoNLL-2003 NER: the first sub-token of each word is the one labelled). No pooler.
    Matches transformers' `BertForTokenClassification` (`hf.to_hf` writes the head as its
    `classifier.weight` [C, D] / `classifier.bias` [C]).
    """

    config: BertConfig
    num_labels: int = 9

    @nn.compact
    def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
                 attention_mask: Array | None = None, deterministic: bool = True) -> TokenClassificationOutput:
        """int32 [B, L] inputs -> TokenClassificationOutput(logits float32 [B, L, C]), C = num_labels.

        Arguments as `BertModel.__call__`; logits at padding positions are computed like any other and
        are the caller's to ignore.

        Raises:
          ValueError: a non-2-D input_ids, a length over max_position_embeddings or mismatched shapes
            (`BertModel`).
          flax.errors.InvalidRngError: deterministic=False without a "dropout" PRNG stream.
        """
        out = BertModel(self.config, add_pooling_layer=False, name="bert")(
            input_ids, token_type_ids, attention_mask, deterministic)
        x = dropout(self.config, self.config.hidden_dropout_prob, out.sequence_output, deterministic)
        logits = dense(self.config, self.num_labels, ("embed", "classes"), "token_classifier")(x)
        return TokenClassificationOutput(logits=logits.astype(jnp.float32))
