"""Losses and accuracies against values computed by hand."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import losses


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


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cross_entropy_gradient_equals_autodiff_of_log_softmax(dtype):
    """The hand-written gradient (softmax - one_hot) against autodiff of log_softmax + gather, with
    weights (zero for padding) and labels at both ends of the vocabulary."""
    import jax

    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(3, 5, 97)) * 3, dtype)
    ids = jnp.asarray(rng.integers(0, 97, size=(3, 5)), jnp.int32).at[0, 0].set(0).at[0, 1].set(96)
    weights = jnp.asarray(rng.random((3, 5)) > 0.3, jnp.float32)

    def reference(lg):
        lp = jax.nn.log_softmax(lg.astype(jnp.float32), axis=-1)
        return jnp.sum(-jnp.take_along_axis(lp, ids[..., None], axis=-1)[..., 0] * weights)

    ours = jax.grad(lambda lg: losses.masked_lm_loss(lg, ids, weights)[0])(logits)
    ref = jax.grad(reference)(logits)
    assert ours.dtype == ref.dtype == dtype
    np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(ref, np.float32),
                               rtol=1e-5 if dtype == jnp.float32 else 1e-2, atol=1e-7 if dtype == jnp.float32 else 1e-3)
    assert float(jnp.abs(ours[weights == 0]).max()) == 0.0  # padding slots get no gradient


def test_is_argmax_matches_argmax_with_ties():
    rng = np.random.default_rng(0)
    # Few distinct values, so that most rows have ties for the maximum.
    logits = rng.integers(-2, 3, size=(64, 7)).astype(np.float32)
    labels = rng.integers(0, 7, size=64)
    expected = np.argmax(logits, axis=-1) == labels
    assert expected.sum() > 5 and (~expected).sum() > 5
    np.testing.assert_array_equal(np.asarray(losses.is_argmax(jnp.asarray(logits), jnp.asarray(labels))), expected)
    # Every label of every row of real-valued logits, in bfloat16 too.
    logits = rng.normal(size=(3, 50)).astype(np.float32)
    for dtype in (jnp.float32, jnp.bfloat16):
        x = jnp.asarray(logits, dtype)
        for label in range(50):
            labels = np.full(3, label)
            expected = np.argmax(np.asarray(x.astype(jnp.float32)), axis=-1) == labels
            np.testing.assert_array_equal(np.asarray(losses.is_argmax(x, jnp.asarray(labels))), expected)
