"""Analytic model FLOPs of a BERT pre-training step (for MFU and for checking compiled programs), and of
the encoder alone, its last layer at some rows only (`output_positions`; fine-tuning benchmarks).

Counts multiply-adds as 2 FLOPs and the backward pass as twice the forward (training = 3x forward), the
convention of Kaplan et al. 2020 and PaLM's MFU (Chowdhery et al. 2022, appendix B). Embedding
lookups, softmax, LayerNorm and other element-wise work are left out; attention's two L x L matmuls are
counted; the MLM head is counted at the P predicted positions only, as `BertForPreTraining` computes it.
tests/test_flops.py checks the encoder's count against XLA's cost analysis of the compiled forward pass.
"""

from __future__ import annotations

from bert_jax.model.modeling import BertConfig


def encoder_forward_flops(config: BertConfig, seq_length: int, query_rows: int | None = None) -> float:
    """FLOPs of one forward pass of `BertModel`'s encoder (no embeddings, no pooler) for one sequence.

    Args:
      config: the model's sizes (hidden_size D, intermediate_size I, num_hidden_layers N).
      seq_length: L, the tokens of the sequence (padding included: it is computed).
      query_rows: None for every row; Q for `BertModel(output_positions=[B, Q])`, whose last layer
        computes keys and values at all L tokens but queries, attention, the output projection and the
        feed-forward block at Q rows only (e.g. 1: a classifier's [CLS]).

    Returns:
      FLOPs (multiply-add = 2): per token and layer 2 (4 D^2 + 2 D I) for the projections and the
      feed-forward block, plus 4 L D for the scores and the context.

    Raises:
      ValueError: query_rows outside 1..seq_length.
    """
    d, i, n_layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_token_layer = 2 * (4 * d * d + 2 * d * i) + 2 * 2 * seq_length * d
    if query_rows is None:
        return float(n_layers * seq_length * per_token_layer)
    if not 1 <= query_rows <= seq_length:
        raise ValueError(f"query_rows={query_rows} is not within 1..seq_length={seq_length}")
    keys_values = seq_length * 2 * (2 * d * d)
    return float((n_layers - 1) * seq_length * per_token_layer + keys_values
                 + query_rows * (per_token_layer - 2 * (2 * d * d)))


def forward_flops_per_sequence(config: BertConfig, seq_length: int, max_predictions: int) -> float:
    """FLOPs of one forward pass of `BertForPreTraining` for one sequence of `seq_length` tokens."""
    d, v = config.hidden_size, config.vocab_size
    pooler_nsp = 2 * (d * d + 2 * d)
    mlm = max_predictions * 2 * (d * d + d * v)  # transform dense + tied decoder
    return encoder_forward_flops(config, seq_length) + float(pooler_nsp + mlm)


def train_flops_per_step(config: BertConfig, batch_size: int, seq_length: int, max_predictions: int) -> float:
    """FLOPs of one training step (forward + backward = 3x forward) over a global batch."""
    return 3.0 * batch_size * forward_flops_per_sequence(config, seq_length, max_predictions)


# Peak dense bfloat16 FLOP/s of one JAX device, by `jax.Device.device_kind`, from Google Cloud's TPU
# system-architecture pages (a v3 device is one TensorCore, half a 123 TFLOP/s chip; v4 and v5p devices
# are whole chips, their two TensorCores run as one "megacore"; v5e and v6e chips have one core each) and
# NVIDIA's data sheets (dense, without sparsity: A100 312, H100 SXM and H200 989, H100 PCIe 756, B200 2250 TFLOP/s).
PEAK_BF16_FLOPS_PER_DEVICE: dict[str, float] = {
    "TPU v3": 61.5e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,  # v5e
    "TPU v5": 459e12,  # v5p
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,  # v6e (Trillium)
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA H100 80GB HBM3": 989e12,  # SXM
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H200": 989e12,
    "NVIDIA B200": 2250e12,
}


def peak_flops_per_device(device_kind: str) -> float | None:
    """Peak bfloat16 FLOP/s of one device of `device_kind` (e.g. jax.devices()[0].device_kind), or None
    for a kind without a published figure here (CPUs, other GPUs: set the config's peak by hand)."""
    return PEAK_BF16_FLOPS_PER_DEVICE.get(device_kind)
