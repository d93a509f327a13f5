"""Pre-training and fine-tuning losses and accuracies, pure jnp.

Each function returns `(weighted_sum, denominator)` so that callers divide once, after any
cross-device reduction; `pretraining_loss` does that division for a single batch. All log-softmaxes are
computed in float32 whatever the logits' dtype.

Sources: google-research/bert `run_pretraining.py` (`get_masked_lm_output`, `get_next_sentence_output`:
the masked-LM loss is the weighted mean over real predictions, the total is MLM + NSP, paper appendix
A.2) and `run_squad.py` (span loss = mean of the start and end cross-entropies).
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp

Array = jax.Array


@jax.custom_vjp
def _nll(logits: Array, labels: Array) -> Array:
    """float32 logits [..., K], int32 labels [...] -> float32 [...] = logsumexp(logits) - logits[label]."""
    return _nll_fwd(logits, labels)[0]


def _nll_fwd(logits, labels):
    lse = jax.nn.logsumexp(logits, axis=-1)
    return lse - jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0], (logits, labels, lse)


def _nll_bwd(residuals, g):
    # d nll / d logits = softmax(logits) - one_hot(label), written as one elementwise pass over [..., K].
    # Autodiff of log_softmax + take_along_axis instead materialises a zero [..., K] buffer, scatters
    # into it and reduces it again: 25-30% of the masked-LM head's backward time on CPU.
    logits, labels, lse = residuals
    one_hot = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == labels[..., None]
    dlogits = (jnp.exp(logits - lse[..., None]) - one_hot.astype(logits.dtype)) * g[..., None]
    return dlogits, None


_nll.defvjp(_nll_fwd, _nll_bwd)


def _cross_entropy(logits: Array, labels: Array) -> Array:
    """logits [..., K] (any float dtype), labels int [...] -> float32 [...] negative log-likelihood.

    Computed in float32 (log-sum-exp minus the label's logit), with a hand-written gradient
    (softmax - one_hot); tests check it against autodiff of `jax.nn.log_softmax`.
    """
    return _nll(logits.astype(jnp.float32), labels.astype(jnp.int32))


def masked_lm_loss(logits: Array, masked_lm_ids: Array, masked_lm_weights: Array) -> tuple[Array, Array]:
    """Weighted masked-LM cross-entropy.

    Args:
      logits: [B, P, V] logits at the masked positions (float32 or bfloat16).
      masked_lm_ids: int32 [B, P] original token ids at those positions (padding entries: any id).
      masked_lm_weights: float32 [B, P], 1.0 for a real prediction, 0.0 for padding.

    Returns:
      (sum over positions of weight * nll, sum of weights), both float32 scalars. The original's loss is
      their ratio (it adds 1e-5 to the denominator; `pretraining_loss` guards the empty case instead).
    """
    weights = masked_lm_weights.astype(jnp.float32)
    return jnp.sum(_cross_entropy(logits, masked_lm_ids) * weights), jnp.sum(weights)


def is_argmax(logits: Array, labels: Array) -> Array:
    """bool [...]: whether labels == argmax(logits, axis=-1), ties going to the first index as argmax.

    logits [..., K] (any float dtype), labels int [...] in [0, K). The label is the argmax when no logit
    is greater than the label's and no earlier one equals it: one `any` over [..., K] instead of
    argmax's (value, index) reduction, which XLA CPU runs about 3x slower (45 against 16 ms on the
    [640, 30522] masked-LM logits of the `mini` benchmark). Tests check it against jnp.argmax,
    ties included.
    """
    labels = labels.astype(jnp.int32)[..., None]
    picked = jnp.take_along_axis(logits, labels, axis=-1)
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    beaten = (logits > picked) | ((logits == picked) & (index < labels))
    return ~jnp.any(beaten, axis=-1)


def masked_lm_accuracy(logits: Array, masked_lm_ids: Array, masked_lm_weights: Array) -> tuple[Array, Array]:
    """(weighted count of argmax == masked_lm_ids, sum of weights), float32 scalars; shapes as above."""
    weights = masked_lm_weights.astype(jnp.float32)
    correct = is_argmax(logits, masked_lm_ids).astype(jnp.float32)
    return jnp.sum(correct * weights), jnp.sum(weights)


def classification_loss(logits: Array, labels: Array) -> tuple[Array, Array]:
    """logits [B, C], labels int32 [B] in [0, C) -> (sum of cross-entropy, B), float32 scalars."""
    nll = _cross_entropy(logits, labels)
    return jnp.sum(nll), jnp.asarray(nll.shape[0], jnp.float32)


def classification_accuracy(logits: Array, labels: Array) -> tuple[Array, Array]:
    """logits [B, C], labels int32 [B] -> (count of argmax == label, B), float32 scalars."""
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(correct), jnp.asarray(correct.shape[0], jnp.float32)


def next_sentence_loss(logits: Array, next_sentence_labels: Array) -> tuple[Array, Array]:
    """The 2-class `classification_loss`: logits [B, 2], labels int32 [B] (0 IsNext, 1 NotNext)."""
    return classification_loss(logits, next_sentence_labels)


def next_sentence_accuracy(logits: Array, next_sentence_labels: Array) -> tuple[Array, Array]:
    """The 2-class `classification_accuracy`: logits [B, 2], labels int32 [B]."""
    return classification_accuracy(logits, next_sentence_labels)


def _ratio(pair: tuple[Array, Array]) -> Array:
    total, count = pair
    return total / jnp.maximum(count, 1e-12)


def pretraining_loss(mlm_logits: Array, nsp_logits: Array, batch: Mapping[str, Array],
                     denominators: tuple[Array, Array] | None = None,
                     kernels: str = "reference") -> tuple[Array, dict[str, Array]]:
    """Total pre-training loss = mean masked-LM loss + mean next-sentence loss (paper, appendix A.2).

    Args:
      mlm_logits: [B, P, V]; nsp_logits: [B, 2] (from `BertForPreTraining`).
      batch: mapping with masked_lm_ids int32 [B, P], masked_lm_weights float32 [B, P] and
        next_sentence_labels int32 [B].
      denominators: (sum of masked_lm_weights, number of sequences), float32 scalars, of a larger batch
        that this one is a micro-batch of; default this batch's own. With them, the losses and
        accuracies of the micro-batches add up to those of the whole batch (gradient accumulation that
        equals one big batch even when micro-batches hold different numbers of predictions).

    Returns:
      (loss float32 scalar, metrics) where metrics holds float32 scalars `mlm_loss`, `mlm_accuracy`,
      `nsp_loss`, `nsp_accuracy` and `num_predictions` (sum of this batch's masked_lm_weights).
    """
    mlm = masked_lm_loss(mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"])
    nsp = next_sentence_loss(nsp_logits, batch["next_sentence_labels"])
    mlm_correct = masked_lm_accuracy(mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"])
    nsp_correct = next_sentence_accuracy(nsp_logits, batch["next_sentence_labels"])
    mlm_count, nsp_count = denominators if denominators is not None else (mlm[1], nsp[1])
    mlm_loss, nsp_loss = _ratio((mlm[0], mlm_count)), _ratio((nsp[0], nsp_count))
    metrics = {
        "mlm_loss": mlm_loss,
        "mlm_accuracy": _ratio((mlm_correct[0], mlm_count)),
        "nsp_loss": nsp_loss,
        "nsp_accuracy": _ratio((nsp_correct[0], nsp_count)),
        "num_predictions": mlm[1],
    }
    return mlm_loss + nsp_loss, metrics


def span_loss(start_logits: Array, end_logits: Array, start_positions: Array,
              end_positions: Array) -> tuple[Array, Array]:
    """SQuAD span loss as run_squad.py: (start_nll + end_nll) / 2 per example.

    Args:
      start_logits, end_logits: [B, L] logits over token positions.
      start_positions, end_positions: int32 [B] gold token positions (0 = [CLS] = no answer).

    Returns:
      (sum over the batch of the per-example loss, B), float32 scalars.
    """
    per_example = 0.5 * (_cross_entropy(start_logits, start_positions) + _cross_entropy(end_logits, end_positions))
    return jnp.sum(per_example), jnp.asarray(per_example.shape[0], jnp.float32)
