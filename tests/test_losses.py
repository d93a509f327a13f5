"""Losses and accuracies against values computed by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.training import losses


def test_masked_lm_loss_hand_computed():
    # Two predictions in one sequence plus one padded slot whose weight is 0.
    logits = jnp.array([[[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [5.0, -5.0, 9.0]]])  # [1, 3, 3]
    ids = jnp.array([[1, 0, 1]])
    weights = jnp.array([[1.0, 1.0, 0.0]])
    total, count = losses.masked_lm_loss(logits, ids, weights)
    expected = math.log(3.0) + (math.log(math.exp(2.0) + 2.0) - 2.0)
    assert float(count) == 2.0
    assert float(total) == pytest.approx(expected, rel=1e-6)
    correct, count = losses.masked_lm_accuracy(logits, ids, weights)
    # argmax of the first row is 0 (ties go to the first index) != 1; second row argmax 0 == 0.
    assert (float(correct), float(count)) == (1.0, 2.0)


def test_bfloat16_logits_use_float32_log_softmax():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 4, 50)).astype(np.float32) * 4
    ids = rng.integers(0, 50, size=(2, 4))
    weights = np.ones((2, 4), np.float32)
    as_bf16 = jnp.asarray(logits, jnp.bfloat16)
    total, _ = losses.masked_lm_loss(as_bf16, ids, weights)
    assert total.dtype == jnp.float32
    # Reference: float64 log-softmax of the same bfloat16-rounded values.
    x = np.asarray(as_bf16.astype(jnp.float32), np.float64)
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    ref = np.sum(lse - np.take_along_axis(x, ids[..., None], -1)[..., 0])
    assert float(total) == pytest.approx(ref, rel=1e-5)


def test_pretraining_loss_is_sum_of_means():
    mlm_logits = jnp.array([[[1.0, 0.0], [0.0, 3.0]]])  # [1, 2, 2]
    nsp_logits = jnp.array([[0.0, 1.0], [2.0, 2.0]])  # [2, 2]
    batch = {
        "masked_lm_ids": jnp.array([[0, 0]]),
        "masked_lm_weights": jnp.array([[1.0, 0.0]]),
        "next_sentence_labels": jnp.array([1, 0]),
    }
    loss, metrics = losses.pretraining_loss(mlm_logits, nsp_logits, batch)
    mlm = math.log(1 + math.exp(-1.0))  # only the first prediction counts
    nsp = (math.log(1 + math.exp(-1.0)) + math.log(2.0)) / 2
    assert float(metrics["mlm_loss"]) == pytest.approx(mlm, rel=1e-6)
    assert float(metrics["nsp_loss"]) == pytest.approx(nsp, rel=1e-6)
    assert float(loss) == pytest.approx(mlm + nsp, rel=1e-6)
    assert float(metrics["mlm_accuracy"]) == 1.0
    assert float(metrics["nsp_accuracy"]) == 1.0  # ties -> index 0, the label of the second example
    assert float(metrics["num_predictions"]) == 1.0


def test_pretraining_loss_with_no_predictions_is_finite():
    batch = {"masked_lm_ids": jnp.zeros((1, 2), jnp.int32), "masked_lm_weights": jnp.zeros((1, 2)),
             "next_sentence_labels": jnp.array([0])}
    loss, metrics = losses.pretraining_loss(jnp.zeros((1, 2, 5)), jnp.zeros((1, 2)), batch)
    assert float(metrics["mlm_loss"]) == 0.0
    assert float(loss) == pytest.approx(math.log(2.0), rel=1e-6)


def test_span_loss_hand_computed():
    start = jnp.array([[0.0, 1.0, 0.0]])
    end = jnp.array([[0.0, 0.0, 0.0]])
    total, count = losses.span_loss(start, end, jnp.array([1]), jnp.array([2]))
    start_nll = math.log(2 + math.e) - 1.0
    end_nll = math.log(3.0)
    assert float(count) == 1.0
    assert float(total) == pytest.approx((start_nll + end_nll) / 2, rel=1e-6)


def test_classification_loss_and_accuracy():
    logits = jnp.array([[3.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    total, count = losses.classification_loss(logits, jnp.array([0, 1]))
    expected = (math.log(math.exp(3) + 2) - 3) + (math.log(2 + math.e) - 0.0)
    assert float(total) == pytest.approx(expected, rel=1e-6) and float(count) == 2.0
    correct, _ = losses.classification_accuracy(logits, jnp.array([0, 1]))
    assert float(correct) == 1.0


def test_cross_entropy_value_and_gradient_equal_optax():
    """The one-pass gradient (`losses._nll`) against autodiff of optax's integer-label cross-entropy, float32
    and bfloat16 logits, weighted as the MLM loss weights them."""
    import optax

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (4, 5, 37)).astype(np.float32)
    labels = rng.integers(0, 37, (4, 5)).astype(np.int32)
    weights = rng.integers(0, 2, (4, 5)).astype(np.float32)
    for dtype in (jnp.float32, jnp.bfloat16):
        x = jnp.asarray(logits, dtype)

        def ours(x):
            return losses.masked_lm_loss(x, labels, weights)[0]

        def theirs(x):
            nll = optax.softmax_cross_entropy_with_integer_labels(x.astype(jnp.float32), labels)
            return jnp.sum(nll * weights)

        np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-6)
        np.testing.assert_allclose(jax.grad(ours)(x).astype(np.float32), jax.grad(theirs)(x).astype(np.float32),
                                   rtol=1e-5, atol=1e-6)
