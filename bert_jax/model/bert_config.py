"""BERT's hyper-parameters: `BertConfig`, the fields of the original's `bert_config.json`.

The twelve architecture fields are google-research/bert's `BertConfig` (and Hugging Face's, which reads
the same JSON); the rest choose how `bert_jax.model.modeling` computes the same model (dtypes, scanned layers,
rematerialisation, the kernel set).
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from bert_jax.model import kernels

# hidden_act -> the function `bert_jax.model.modeling` applies: exact erf GELU ("gelu", the original's first
# release and transformers'; None: the kernel set's), the tanh approximation under transformers' two
# names, and ReLU.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array] | None] = {
    "gelu": None,
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}
# remat_policy -> the `jax.checkpoint_policies` policy of each layer (None: no rematerialisation).
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# bert_config.json fields, in the original's order.
BERT_CONFIG_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                      "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                      "type_vocab_size", "initializer_range", "layer_norm_eps")


def resolve_dtype(name: str, platform: str | None = None) -> str:
    """The compute dtype `name` stands for on `platform` ("cpu", "gpu" / "cuda", "tpu"; default
    `jax.default_backend()`): "auto" is "bfloat16" on accelerators (their matrix units' dtype; parameters, softmax,
    LayerNorm statistics and logits stay float32) and "float32" on CPUs; any other name is itself."""
    if name != "auto":
        return name
    if platform is None:
        import jax

        platform = jax.default_backend()
    return "bfloat16" if platform in ("gpu", "cuda", "rocm", "tpu") else "float32"


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Model hyper-parameters, named as in the original `bert_config.json`.

    The first twelve fields are those of `bert_config.json` (google-research/bert) and of Hugging Face's
    `BertConfig`; defaults are BERT-Base. The rest choose how the same model is computed:

    Attributes:
      dtype: compute dtype name for matmuls and activations, "float32" or "bfloat16"; "auto" (`resolve_dtype`):
        bfloat16 on GPUs and TPUs, float32 on CPUs, for the default backend at construction (programs compiled
        ahead of time resolve it for their target first).
      param_dtype: storage dtype name of the parameters (float32 by default).
      scan_layers: stack the layers under `nn.scan` (parameters get a leading `layers` axis of length
        num_hidden_layers); compiles 24 layers as fast as one.
      remat_policy: activation rematerialisation of each layer: "none", "full", "dots" or
        "dots_no_batch" (a `jax.checkpoint_policies` policy).
      kernels: "auto", "reference", "xla_cpu", "tpu", "splash" or "gpu", the `bert_jax.model.kernels` set (auto: xla_cpu
        when the default backend is the CPU, tpu on a TPU, gpu on a GPU; programs compiled ahead of time resolve
        it for their target).

    Raises:
      ValueError: at construction, for hidden_size not divisible by num_attention_heads, an unknown
        hidden_act, remat_policy or kernels, a dtype or param_dtype that is not a floating-point dtype name,
        a size that is not a positive integer, a dropout probability outside [0, 1], initializer_range or
        layer_norm_eps that is not a non-negative number, or scan_layers that is not a bool.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = False
    remat_policy: str = "none"
    kernels: str = "auto"

    def __post_init__(self):
        if self.dtype == "auto":
            object.__setattr__(self, "dtype", resolve_dtype(self.dtype))
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
            if value <= 0:
                raise ValueError(f"BertConfig.{name} must be positive, got {value}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "layer_norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0 <= value < float("inf") or (
                    name.endswith("_prob") and value > 1):
                raise ValueError(f"BertConfig.{name} must be a {'probability' if name.endswith('_prob') else 'number'}"
                                 f"{' in [0, 1]' if name.endswith('_prob') else ' >= 0'}, got {value!r}")
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"BertConfig.scan_layers must be true or false, got {self.scan_layers!r}")
        for name in ("hidden_act", "remat_policy", "kernels"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"BertConfig.{name} must be a string, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"BertConfig.hidden_size={self.hidden_size} is not divisible by "
                             f"num_attention_heads={self.num_attention_heads}")
        for name, known in (("hidden_act", ACTIVATIONS), ("remat_policy", REMAT_POLICIES)):
            if getattr(self, name) not in known:
                raise ValueError(f"BertConfig.{name}={getattr(self, name)!r} is not one of {sorted(known)}")
        kernels.resolve(self.kernels, "cpu")  # raises on an unknown name
        for name in ("dtype", "param_dtype"):
            value = getattr(self, name)
            try:
                floating = jnp.issubdtype(jnp.dtype(value), jnp.floating)
            except TypeError:  # an unknown dtype name
                floating = False
            if not isinstance(value, str) or not floating:
                raise ValueError(f"BertConfig.{name}={value!r} is not a floating-point dtype name "
                                 "(e.g. 'float32', 'bfloat16')")

    @property
    def head_size(self) -> int:
        """H = hidden_size // num_attention_heads (exact: checked at construction)."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, source: str | None = None, **overrides) -> "BertConfig":
        """Builds a config from a `bert_config.json` / Hugging Face `config.json` mapping.

        Unknown keys (e.g. `architectures`, `model_type`, `pad_token_id`) are ignored; `overrides`
        replace fields (e.g. `dtype="bfloat16"`); `source` (a file) is named in the errors.

        Raises:
          ValueError: a value the constructor rejects (see the class); with `source`, also what would be a
            TypeError, as one line `<source>: <message>`.
          TypeError: an override that is not a BertConfig field (without `source`).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in names}
        kwargs.update(overrides)
        if source is None:
            return cls(**kwargs)
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{source}: {e}") from None

    @classmethod
    def from_json_file(cls, path: str, **overrides) -> "BertConfig":
        """Reads a `bert_config.json` (or Hugging Face `config.json`) file (`read_json`); `overrides` as
        `from_dict`.

        Raises:
          FileNotFoundError: no file at `path` (other `OSError`s as `open`).
          ValueError: as `read_json`, and a value the constructor rejects (one line naming the file).
        """
        return cls.from_dict(read_json(path), source=path, **overrides)

    def to_dict(self) -> dict[str, Any]:
        """The twelve `bert_config.json` fields, as a plain dict."""
        return {k: getattr(self, k) for k in BERT_CONFIG_FIELDS}

    def replace(self, **changes) -> "BertConfig":
        """A copy with `changes` applied, validated again (raises as the constructor; TypeError: not a field)."""
        return dataclasses.replace(self, **changes)


def read_json(path: str) -> dict[str, Any]:
    """The JSON object of a `bert_config.json` / Hugging Face `config.json` file, not yet checked.

    Raises:
      FileNotFoundError: no file at `path` (other `OSError`s as `open`).
      ValueError: the file is not UTF-8 JSON, or its top level is not an object (one line naming the file).
    """
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: holds a JSON {type(values).__name__}, not an object of BERT config fields")
    return values


def read_checkpoint_config(directory: str, name: str, kind: str, overrides: Mapping[str, Any]) -> BertConfig:
    """The BertConfig of a checkpoint: `<directory>/<name>` (a Hugging Face config.json or the original's
    bert_config.json), with `overrides` (BertConfig fields such as dtype, scan_layers) applied.

    Raises:
      FileNotFoundError: no `<name>` in `directory` (the message calls the directory `kind`, e.g.
        "Hugging Face directory").
      ValueError: as `read_json`; a `model_type` other than "bert", one of the first five architecture
        fields missing, a `position_embedding_type` other than "absolute", or a value `from_dict` rejects.
        Each message is one line naming the file.
    """
    config_file = os.path.join(directory, name)
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{config_file}: no {name} in the {kind}")
    values = read_json(config_file)
    model_type = values.get("model_type", "bert")
    if model_type != "bert":
        raise ValueError(f"{config_file}: model_type {model_type!r} is not a BERT model")
    missing = [k for k in BERT_CONFIG_FIELDS[:5] if k not in values]
    if missing:
        raise ValueError(f"{config_file}: not a BERT config, missing {', '.join(missing)}")
    if values.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{config_file}: position_embedding_type {values['position_embedding_type']!r} "
                         "is not supported (only 'absolute', as the original BERT)")
    return BertConfig.from_dict(values, source=config_file, **overrides)
