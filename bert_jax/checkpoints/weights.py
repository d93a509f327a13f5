"""BERT's parameters by name: the bert_jax tree and the one table that names its leaves in Hugging Face.

`rules(config)` lists, for every parameter of `bert_jax.model.modeling.BertForPreTraining`, its Hugging Face
tensor name (without the `bert.` prefix), its "/"-joined path in the bert_jax tree, and the layout
transforms both ways; `TASK_HEAD_RULES` does the same for the fine-tuning heads. Both checkpoint readers
(`hf.from_hf`, `tf1.from_tf_checkpoint`, the latter through `tf_checkpoint`'s variable names)
and the writer (`hf.to_hf`) go through this one table.

Layout differences (Hugging Face -> bert_jax):
  Linear weight [out, in]                -> kernel [in, out]
  query/key/value weight [N*H, D]        -> kernel [D, N, H]; bias [N*H] -> [N, H]
  attention output weight [D, N*H]       -> kernel [N, H, D]
  LayerNorm weight/bias (or gamma/beta)  -> scale/bias
  cls.predictions.decoder.weight         -> tied to the word embeddings (checked equal, not stored)

The tree itself: `init_params` (fresh), `abstract_params` (shapes only), `stack_layers` /
`unstack_layers` (the `scan_layers` layout: `encoder/layers` [L, ...] against `encoder/layer_{i}`), and
`complete` (a tree read from a checkpoint, its missing heads initialised and reported).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bert_jax.model.bert_config import BertConfig
from bert_jax.model.heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification)
from bert_jax.model.modeling import BertForPreTraining

log = logging.getLogger(__name__)

# Paths of the tree that a reader creates fresh (and reports) when a checkpoint lacks them: the pre-training
# heads, and the pooler, which BertForMaskedLM checkpoints do not have.
HEAD_PREFIXES = ("mlm_", "nsp", "bert/pooler/")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One parameter: its Hugging Face tensor name without the `bert.` prefix, its "/"-joined path in the
    BertForPreTraining tree, and the layout transforms `to_ours(hf_value, config)` and
    `to_hf(our_value, config)` (numpy arrays, or abstract values under `jax.eval_shape`)."""

    hf: str
    ours: str
    to_ours: Callable[[np.ndarray, BertConfig], np.ndarray]
    to_hf: Callable[[np.ndarray, BertConfig], np.ndarray]


def _same(x, c):
    return x


def _transpose(x, c):
    return x.T


def _qkv_kernel_in(x, c):  # [N*H, D] -> [D, N, H]
    return x.T.reshape(c.hidden_size, c.num_attention_heads, c.head_size)


def _qkv_kernel_out(x, c):  # [D, N, H] -> [N*H, D]
    return x.reshape(c.hidden_size, -1).T


def _heads_in(x, c):  # [N*H] -> [N, H]
    return x.reshape(c.num_attention_heads, c.head_size)


def _heads_out(x, c):  # [N, H] -> [N*H]
    return x.reshape(-1)


def _attn_out_in(x, c):  # [D, N*H] -> [N, H, D]
    return x.T.reshape(c.num_attention_heads, c.head_size, c.hidden_size)


def _attn_out_out(x, c):  # [N, H, D] -> [D, N*H]
    return x.reshape(-1, c.hidden_size).T


def _linear(hf, ours):
    return [Rule(f"{hf}.weight", f"{ours}/kernel", _transpose, _transpose),
            Rule(f"{hf}.bias", f"{ours}/bias", _same, _same)]


def _layer_norm(hf, ours):
    return [Rule(f"{hf}.weight", f"{ours}/scale", _same, _same),
            Rule(f"{hf}.bias", f"{ours}/bias", _same, _same)]


def rules(config: BertConfig) -> list[Rule]:
    """The `Rule` of every parameter of BertForPreTraining for `config` (unscanned layers: `layer_{i}`), in
    the order embeddings, layers 0..L-1, pooler, masked-LM head, next-sentence head."""
    table = [
        Rule("embeddings.word_embeddings.weight", "bert/embeddings/word_embeddings/embedding", _same, _same),
        Rule("embeddings.position_embeddings.weight", "bert/embeddings/position_embeddings/embedding",
              _same, _same),
        Rule("embeddings.token_type_embeddings.weight", "bert/embeddings/token_type_embeddings/embedding",
              _same, _same),
        *_layer_norm("embeddings.LayerNorm", "bert/embeddings/LayerNorm"),
    ]
    for i in range(config.num_hidden_layers):
        hf, ours = f"encoder.layer.{i}", f"bert/encoder/layer_{i}"
        for proj in ("query", "key", "value"):
            table += [
                Rule(f"{hf}.attention.self.{proj}.weight", f"{ours}/attention/{proj}_kernel",
                      _qkv_kernel_in, _qkv_kernel_out),
                Rule(f"{hf}.attention.self.{proj}.bias", f"{ours}/attention/{proj}_bias", _heads_in, _heads_out),
            ]
        table += [
            Rule(f"{hf}.attention.output.dense.weight", f"{ours}/attention/output_kernel",
                  _attn_out_in, _attn_out_out),
            Rule(f"{hf}.attention.output.dense.bias", f"{ours}/attention/output_bias", _same, _same),
            *_layer_norm(f"{hf}.attention.output.LayerNorm", f"{ours}/attention_LayerNorm"),
            *_linear(f"{hf}.intermediate.dense", f"{ours}/intermediate"),
            *_linear(f"{hf}.output.dense", f"{ours}/output"),
            *_layer_norm(f"{hf}.output.LayerNorm", f"{ours}/output_LayerNorm"),
        ]
    table += [
        *_linear("pooler.dense", "bert/pooler"),
        *_linear("cls.predictions.transform.dense", "mlm_transform"),
        *_layer_norm("cls.predictions.transform.LayerNorm", "mlm_LayerNorm"),
        Rule("cls.predictions.bias", "mlm_output_bias", _same, _same),
        *_linear("cls.seq_relationship", "nsp"),
    ]
    return table


# The fine-tuning heads `hf.to_hf` writes: transformers names the heads of BertForSequenceClassification,
# BertForMultipleChoice and BertForTokenClassification all `classifier`; bert_jax names them apart, so that a
# tree tells its class.
TASK_HEAD_RULES = [*_linear("qa_outputs", "qa_outputs"), *_linear("classifier", "classifier"),
                   *_linear("classifier", "choice_classifier"), *_linear("classifier", "token_classifier")]


def stack_layers(params: Mapping[str, Any], num_layers: int) -> dict:
    """Turns `encoder/layer_{i}` subtrees into one `encoder/layers` tree with a leading [num_layers] axis.

    `params` is a BertForPreTraining tree (with "bert") or a BertModel tree; returns a new tree for a
    config with `scan_layers=True`. Stacked leaves are numpy arrays [num_layers, ...] in the layers'
    dtype; the other leaves are passed through unchanged.

    Raises:
      ValueError: a stacked parameter whose layer indices are not exactly 0..num_layers-1, layers whose
        shapes differ (`np.stack`), or a `layer_<suffix>` whose suffix is not an integer.
    """
    flat = traverse_util.flatten_dict(dict(params), sep="/")
    out, layers = {}, {}
    for path, value in flat.items():
        parts = path.split("/")
        if "encoder" in parts and parts[parts.index("encoder") + 1].startswith("layer_"):
            k = parts.index("encoder") + 1
            i = int(parts[k][len("layer_"):])
            layers.setdefault("/".join(parts[:k] + ["layers"] + parts[k + 1:]), {})[i] = value
        else:
            out[path] = value
    for path, per_layer in layers.items():
        if sorted(per_layer) != list(range(num_layers)):
            raise ValueError(f"params: {path} has layers {sorted(per_layer)}, expected 0..{num_layers - 1}")
        out[path] = np.stack([np.asarray(per_layer[i]) for i in range(num_layers)])
    return traverse_util.unflatten_dict(out, sep="/")


def unstack_layers(params: Mapping[str, Any]) -> dict:
    """Inverse of `stack_layers`: `encoder/layers` [L, ...] leaves -> `encoder/layer_{i}` subtrees."""
    flat = traverse_util.flatten_dict(dict(params), sep="/")
    out = {}
    for path, value in flat.items():
        parts = path.split("/")
        if "encoder" in parts and parts[parts.index("encoder") + 1] == "layers":
            k = parts.index("encoder") + 1
            for i in range(value.shape[0]):
                out["/".join(parts[:k] + [f"layer_{i}"] + parts[k + 1:])] = np.asarray(value[i])
        else:
            out[path] = value
    return traverse_util.unflatten_dict(out, sep="/")


def abstract_params(config: BertConfig, architecture: str = "BertForPreTraining", num_labels: int = 2) -> dict:
    """{"/"-joined path: jax.ShapeDtypeStruct} of the (unscanned) params of the bert_jax model of
    `architecture` (BertForPreTraining, BertForQuestionAnswering, BertForMultipleChoice, or
    BertForSequenceClassification / BertForTokenClassification with `num_labels`), without allocating them."""
    config = config.replace(scan_layers=False)
    ids = jnp.zeros((1, 2), jnp.int32)
    if architecture == "BertForQuestionAnswering":
        model, extra = BertForQuestionAnswering(config), {}
    elif architecture == "BertForSequenceClassification":
        model, extra = BertForSequenceClassification(config, num_labels=num_labels), {}
    elif architecture == "BertForMultipleChoice":
        model, extra = BertForMultipleChoice(config), {}
    elif architecture == "BertForTokenClassification":
        model, extra = BertForTokenClassification(config, num_labels=num_labels), {}
    else:
        model, extra = BertForPreTraining(config), {"masked_lm_positions": ids}
    shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), ids, **extra)))
    return traverse_util.flatten_dict(shapes["params"], sep="/")


def init_params(config: BertConfig, seed: int = 0, paths: Sequence[str] | None = None) -> dict:
    """Freshly initialised (unboxed) BertForPreTraining params for `config`, as the original's init.

    Leaves are jax.Arrays in config.param_dtype (the layers stacked under `encoder/layers` with
    scan_layers); `seed` seeds `jax.random.key`. With `paths` ("/"-joined, e.g. "nsp/kernel"), only those:
    a flat {path: array} holding the values the whole tree would (the compiled program computes no other).

    Raises:
      KeyError: a path of `paths` the model lacks.
    """
    model = BertForPreTraining(config)
    ids = jnp.zeros((1, 2), jnp.int32)

    def init(key):
        params = nn.unbox(model.init(key, ids, masked_lm_positions=ids))["params"]
        if paths is None:
            return params
        flat = traverse_util.flatten_dict(params, sep="/")
        return {p: flat[p] for p in paths}

    return jax.jit(init)(jax.random.key(seed))


def complete(config: BertConfig, flat: dict, expected: Mapping[str, Any], missing_heads: Sequence[str],
             unknown: Sequence[str], *, strict: bool, seed: int, source: str, noun: str,
             fresh: list | None = None) -> dict:
    """The tree of a checkpoint read by `rules` (`hf.from_hf`, `tf1.from_tf_checkpoint`): the
    file's unknown entries and missing heads reported (WARNING records of this module's logger), the heads
    initialised with `seed`, the layers stacked with scan_layers. `flat` ("/"-joined paths -> arrays in
    config.param_dtype) is filled in place; `expected` is `abstract_params(config)`; `noun` names the file's
    entries in messages ("tensors", "variables"); `fresh`, when given, is extended with the paths
    initialised here.

    Raises:
      ValueError: with strict, one line naming `source`, the missing heads and the unknown entries.
    """
    if strict and (unknown or missing_heads):
        raise ValueError(f"{source}: strict load failed: missing heads {list(missing_heads)}, "
                         f"unknown {noun} {list(unknown)}")
    if unknown:
        log.warning("%s: %d %s not used by BertForPreTraining: %s", source, len(unknown), noun, list(unknown))
    if missing_heads:
        log.warning("%s: heads absent, initialised with seed %d: %s", source, seed, list(missing_heads))
        absent = [p for p in expected if p not in flat]  # the pre-training tree's; a task head read is kept
        flat.update((p, np.asarray(v)) for p, v in
                    init_params(config.replace(scan_layers=False), seed, paths=absent).items())
        if fresh is not None:
            fresh.extend(absent)
    params = traverse_util.unflatten_dict(flat, sep="/")
    if config.scan_layers:
        params = stack_layers(params, config.num_hidden_layers)
    return params

