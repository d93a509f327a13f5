"""Pre-training configs: `get_config("tiny" | "mini" | "small" | "base" | "large")`.

Launch (from the project root), e.g.:
  python -m bert_jax.demo                                   # tiny model on real text, CPU
Model fields are named as in `bert_config.json`; `bert_jax.modeling.BertConfig.from_dict(config.model)`
turns them into the model's arguments (model code never sees a ConfigDict).

Sizes (L layers, H hidden, A heads): tiny 2/128/2 (CPU tests), mini 4/256/4, small 4/512/8,
base 12/768/12 (paper: 110M parameters), large 24/1024/16 (paper: 340M). Vocab 30522, 512 positions.
"""

import ml_collections

_SIZES = {
    # name: (num_hidden_layers, hidden_size, num_attention_heads)
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def model_config(size: str) -> ml_collections.ConfigDict:
    """The `bert_config.json` fields of a named size, plus compute options."""
    if size not in _SIZES:
        raise ValueError(f"config arg {size!r} is not one of {sorted(_SIZES)}")
    layers, hidden, heads = _SIZES[size]
    return ml_collections.ConfigDict(dict(
        vocab_size=30522,  # Google's uncased WordPiece vocabulary
        hidden_size=hidden,  # D
        num_hidden_layers=layers,  # L
        num_attention_heads=heads,  # A; head size D / A = 64 for all but tiny
        intermediate_size=4 * hidden,  # feed-forward size, 4D as in the paper
        hidden_act="gelu",  # exact erf GELU
        hidden_dropout_prob=0.1,  # paper: dropout 0.1 on all layers
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=512,  # learned absolute positions
        type_vocab_size=2,  # sentence A / B
        initializer_range=0.02,  # truncated normal stddev
        layer_norm_eps=1e-12,
        dtype="float32",  # compute dtype; "bfloat16" on TPU
        param_dtype="float32",  # parameters stay float32
        scan_layers=False,  # nn.scan over layers (fast compile of deep models)
        remat_policy="none",  # none | full | dots | dots_no_batch
    ))


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.model = model_config(arg)
    config.seed = 0  # PRNG seed for init, dropout and masking
    config.max_seq_length = 128  # phase-1 length (paper: 128 for 90% of steps, then 512)
    config.max_predictions_per_seq = 20  # masked positions per sequence at length 128
    config.batch_size = 256  # global batch (paper: 256 sequences)
    config.learning_rate = 1e-4  # AdamW peak learning rate (paper)
    config.weight_decay = 0.01  # AdamW decoupled weight decay (paper)
    if arg == "tiny":
        config.batch_size = 16
        config.max_seq_length = 64
        config.max_predictions_per_seq = 10
    return config
