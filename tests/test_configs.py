"""bert_jax/configs/pretrain.py: every named size builds a valid model config of the documented shape."""

import pytest

from bert_jax.model import modeling
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


def test_a_recipe_name_is_the_recipe_and_a_path_is_written_as_one(tmp_path, monkeypatch):
    """`--config squad` is the recipe from any directory, `./squad` the path; a bare recipe name that is also a
    file or directory in the working directory (the user's data folder `squad`) is a one-line error saying
    which is which and how to write each, never silently the one or the other."""
    import os

    from bert_jax import configs

    recipe = os.path.join(os.path.dirname(configs.__file__), "squad.py")
    monkeypatch.chdir(tmp_path)
    assert configs.resolve("squad") == recipe and configs.resolve("squad:tiny") == recipe + ":tiny"
    assert configs.resolve("./squad") == "./squad" and configs.resolve("my.py:x") == "my.py:x"
    (tmp_path / "squad").mkdir()
    (tmp_path / "glue").write_text("")
    assert configs.resolve("./squad:tiny") == "./squad:tiny"
    with pytest.raises(ValueError) as raised:
        configs.resolve("squad:tiny")
    assert str(raised.value) == (f"'squad' is both the recipe squad and the directory ./squad in the working "
                                 f"directory: write --config={recipe}:tiny for the recipe (or run from another "
                                 f"directory), --config=./squad:tiny for the directory")
    with pytest.raises(ValueError, match=r"^'glue' is both the recipe glue and the file ./glue .* --config=./glue "):
        configs.resolve("glue")
    assert configs.resolve("pretrain:tiny").endswith("pretrain.py:tiny")  # no clash: the recipe
