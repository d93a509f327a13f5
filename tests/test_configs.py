"""bert_jax/configs/pretrain.py: every named size builds a valid model config of the documented shape."""

import pytest

from bert_jax import modeling
from bert_jax.configs import pretrain


@pytest.mark.parametrize("arg,layers,hidden,heads", [
    ("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("small", 4, 512, 8), ("base", 12, 768, 12), ("large", 24, 1024, 16)])
def test_sizes(arg, layers, hidden, heads):
    config = modeling.BertConfig.from_dict(pretrain.get_config(arg).model)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (layers, hidden, heads)
    assert config.intermediate_size == 4 * hidden
    assert config.vocab_size == 30522 and config.max_position_embeddings == 512
    assert config.to_dict()["hidden_act"] == "gelu"


def test_unknown_size_is_an_error():
    with pytest.raises(ValueError, match="'huge' is not one of"):
        pretrain.get_config("huge")
