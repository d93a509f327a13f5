"""Pre-training and fine-tuning losses and accuracies, pure jnp.

Each function returns `(weighted_sum, denominator)` so that callers divide once, after any
cross-device reduction; `pretraining_loss` does that division for a single batch. All log-softmaxes are
computed in float32 whatever the logits' dtype.

Sources: google-research/bert `run_pretraining.py` (`get_masked_lm_output`, `get_next_sentence_output`:
the masked-LM loss is the weighted mean over real predictions, the total is MLM + NSP, paper appendix
A.2), `run_squad.py` (span loss = mean of the start and end cross-entropies) and, for GLUE's one
regression task (STS-B), the mean squared error of a one-output head, as transformers'
BertForSequenceClassification with `problem_type="regression"`. Multiple choice (SWAG, paper section
4.4) is `classification_loss` over the K choice scores; token classification (CoNLL-2003 NER, paper
section 5.3) is `token_classification_loss`, the cross-entropy at the labelled (first) sub-tokens.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import optax

Array = jax.Array


def _cross_entropy(logits: Array, labels: Array) -> Array:
    """logits [..., K] (any float dtype), labels int [...] in [0, K) -> float32 [...] negative log-likelihood,
    computed in float32: optax's integer-label cross-entropy (its value; tests/test_losses.py), with the gradient
    softmax(logits) - onehot(labels) written in one pass over the logits (`_nll`)."""
    return _nll(logits.astype(jnp.float32), labels.astype(jnp.int32))


@jax.custom_vjp
def _nll(logits: Array, labels: Array) -> Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def _nll_fwd(logits, labels):
    lse = jax.nn.logsumexp(logits, axis=-1)
    nll = lse - jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return nll, (logits, lse, labels)


def _nll_bwd(residuals, g):
    """d nll / d logits = softmax(logits) - onehot(labels): one elementwise pass over the saved logits (autodiff's
    form scatters the label's gradient into a zero [..., K] array and adds it, two passes more)."""
    logits, lse, labels = residuals
    onehot = jnp.arange(logits.shape[-1], dtype=jnp.int32) == labels[..., None]
    return g[..., None] * (jnp.exp(logits - lse[..., None]) - onehot), None


_nll.defvjp(_nll_fwd, _nll_bwd)


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


def masked_lm_accuracy(logits: Array, masked_lm_ids: Array, masked_lm_weights: Array) -> tuple[Array, Array]:
    """(weighted count of argmax == masked_lm_ids (ties: the first index), sum of weights), float32
    scalars; shapes as `masked_lm_loss`."""
    weights = masked_lm_weights.astype(jnp.float32)
    correct = (jnp.argmax(logits, axis=-1) == masked_lm_ids).astype(jnp.float32)
    return jnp.sum(correct * weights), jnp.sum(weights)


def classification_loss(logits: Array, labels: Array) -> tuple[Array, Array]:
    """logits [B, C], labels int32 [B] in [0, C) -> (sum of cross-entropy, B), float32 scalars.

    Also the multiple-choice loss: logits [B, K] of `BertForMultipleChoice`, softmax over the K choices
    (transformers' BertForMultipleChoice loss is the ratio)."""
    nll = _cross_entropy(logits, labels)
    return jnp.sum(nll), jnp.asarray(nll.shape[0], jnp.float32)


def classification_accuracy(logits: Array, labels: Array) -> tuple[Array, Array]:
    """logits [B, C], labels int32 [B] -> (count of argmax == label, B), float32 scalars."""
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(correct), jnp.asarray(correct.shape[0], jnp.float32)


def regression_loss(logits: Array, labels: Array) -> tuple[Array, Array]:
    """Squared error of a one-output regression head (STS-B; transformers' `problem_type="regression"`).

    Args:
      logits: [B, 1] predictions (any float dtype; `BertForSequenceClassification` with num_labels=1).
      labels: float [B] targets.

    Returns:
      (sum over the batch of (prediction - label)^2, B), float32 scalars: their ratio is the mean
      squared error (torch.nn.MSELoss).

    Raises:
      ValueError: logits not of shape [B, 1] or labels not of shape [B].
    """
    if logits.ndim != 2 or logits.shape[1] != 1 or labels.shape != logits.shape[:1]:
        raise ValueError(f"regression_loss: logits {logits.shape} and labels {labels.shape} are not [B, 1] and [B]")
    error = logits[:, 0].astype(jnp.float32) - labels.astype(jnp.float32)
    return jnp.sum(jnp.square(error)), jnp.asarray(error.shape[0], jnp.float32)


def next_sentence_loss(logits: Array, next_sentence_labels: Array,
                       next_sentence_weights: Array | None = None) -> tuple[Array, Array]:
    """Next-sentence cross-entropy: (sum over instances of weight * nll, sum of weights), float32 scalars.

    Args:
      logits: [B, 2], or [B, K, 2] for packed rows (one per instance).
      next_sentence_labels: int32 [B] (0 IsNext, 1 NotNext), or [B, K].
      next_sentence_weights: float32 [B, K], 1.0 for a real instance, 0.0 for a padding entry; None: all
        ones (the `classification_loss` of unpacked rows).
    """
    nll = _cross_entropy(logits, next_sentence_labels)
    weights = jnp.ones_like(nll) if next_sentence_weights is None else next_sentence_weights.astype(jnp.float32)
    return jnp.sum(nll * weights), jnp.sum(weights)


def next_sentence_accuracy(logits: Array, next_sentence_labels: Array,
                           next_sentence_weights: Array | None = None) -> tuple[Array, Array]:
    """(weighted count of argmax == label, sum of weights); shapes as `next_sentence_loss`."""
    correct = (jnp.argmax(logits, axis=-1) == next_sentence_labels).astype(jnp.float32)
    weights = jnp.ones_like(correct) if next_sentence_weights is None else next_sentence_weights.astype(jnp.float32)
    return jnp.sum(correct * weights), jnp.sum(weights)


def _ratio(pair: tuple[Array, Array]) -> Array:
    total, count = pair
    return total / jnp.maximum(count, 1e-12)


def pretraining_loss(mlm_logits: Array, nsp_logits: Array, batch: Mapping[str, Array],
                     denominators: tuple[Array, Array] | None = None) -> tuple[Array, dict[str, Array]]:
    """Total pre-training loss = mean masked-LM loss + mean next-sentence loss (paper, appendix A.2).

    Args:
      mlm_logits: [B, P, V]; nsp_logits: [B, 2], or [B, K, 2] for packed rows (from `BertForPreTraining`).
      batch: mapping with masked_lm_ids int32 [B, P], masked_lm_weights float32 [B, P] and
        next_sentence_labels int32 [B]; packed rows: next_sentence_labels and next_sentence_weights [B, K].
        Both losses are means over instances' predictions and instances, so a packed batch gives the
        loss of the same instances unpacked.
      denominators: (sum of masked_lm_weights, number of instances), float32 scalars, of a larger batch
        that this one is a micro-batch of; default this batch's own. With them, the losses and
        accuracies of the micro-batches add up to those of the whole batch (gradient accumulation that
        equals one big batch even when micro-batches hold different numbers of predictions).

    Returns:
      (loss float32 scalar, metrics) where metrics holds float32 scalars `mlm_loss`, `mlm_accuracy`,
      `nsp_loss`, `nsp_accuracy` and `num_predictions` (sum of this batch's masked_lm_weights).
    """
    mlm = masked_lm_loss(mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"])
    nsp_weights = batch.get("next_sentence_weights")
    nsp = next_sentence_loss(nsp_logits, batch["next_sentence_labels"], nsp_weights)
    mlm_correct = masked_lm_accuracy(mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"])
    nsp_correct = next_sentence_accuracy(nsp_logits, batch["next_sentence_labels"], nsp_weights)
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


def token_classification_loss(logits: Array, labels: Array, label_weights: Array) -> tuple[Array, Array]:
    """Weighted per-token cross-entropy of a token classifier (CoNLL-2003 NER, paper section 5.3).

    Args:
      logits: [B, L, C] logits of `BertForTokenClassification` (any float dtype).
      labels: int [B, L] label indices in [0, C) where weighted; at zero-weight positions any value
        (e.g. 0, or transformers' ignore index -100), clipped into [0, C) so it never indexes out of range.
      label_weights: float32 [B, L], 1.0 at the labelled tokens (the first sub-token of each word), 0.0 at
        the others, [CLS], [SEP] and padding.

    Returns:
      (sum over tokens of weight * nll, sum of weights), float32 scalars: their ratio is transformers'
      BertForTokenClassification loss when the zero-weight positions carry label -100.

    Raises:
      ValueError: logits not [B, L, C], or labels / label_weights not of shape [B, L].
    """
    if logits.ndim != 3 or labels.shape != logits.shape[:2] or label_weights.shape != logits.shape[:2]:
        raise ValueError(f"token_classification_loss: logits {logits.shape}, labels {labels.shape} and label_weights "
                         f"{label_weights.shape} are not [B, L, C], [B, L] and [B, L]")
    weights = label_weights.astype(jnp.float32)
    nll = _cross_entropy(logits, jnp.clip(labels, 0, logits.shape[-1] - 1))
    return jnp.sum(nll * weights), jnp.sum(weights)
