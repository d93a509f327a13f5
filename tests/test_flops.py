"""Analytic FLOPs (bert_jax.model.flops) against XLA's own count of the compiled forward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import flops, modeling
from bert_jax.checkpoints import weights

CONFIG = modeling.BertConfig(vocab_size=101, hidden_size=512, num_hidden_layers=2, num_attention_heads=8,
                             intermediate_size=2048, max_position_embeddings=64, kernels="reference")
B, L = 2, 64


def _xla_flops(output_positions=None) -> float:
    """XLA's cost analysis of BertModel's forward pass (matmuls and the element-wise work) per sequence."""
    params = weights.init_params(CONFIG, seed=0)["bert"]
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 101, (B, L)), jnp.int32)
    model = modeling.BertModel(CONFIG)
    forward = jax.jit(lambda p, x: model.apply({"params": p}, x, output_positions=output_positions).sequence_output)
    cost = forward.lower(params, ids).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"] / B


def test_encoder_flops_match_xla_for_all_rows_and_for_cls_only():
    pooler = 2 * CONFIG.hidden_size ** 2  # computed by BertModel, not part of the encoder
    full, cls = _xla_flops(), _xla_flops(jnp.zeros((B, 1), jnp.int32))
    analytic_full = flops.encoder_forward_flops(CONFIG, L)
    analytic_cls = flops.encoder_forward_flops(CONFIG, L, query_rows=1)
    # XLA also counts LayerNorm, GELU, softmax and biases: a few percent more at this size
    assert analytic_full + pooler < full and analytic_cls + pooler < cls
    assert analytic_full + pooler == pytest.approx(full, rel=0.04)
    assert analytic_cls + pooler == pytest.approx(cls, rel=0.04)
    # what the [CLS]-only last layer saves: 63 rows of queries, attention, output projection and FFN
    assert analytic_full - analytic_cls == pytest.approx(full - cls, rel=0.04)
    assert analytic_full - analytic_cls == 63 * (4 * 512 ** 2 + 4 * 512 * 2048 + 4 * L * 512)
    assert flops.encoder_forward_flops(CONFIG, L, query_rows=L) == analytic_full
    with pytest.raises(ValueError, match="query_rows=0 is not within 1..seq_length=64"):
        flops.encoder_forward_flops(CONFIG, L, query_rows=0)
