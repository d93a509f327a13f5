"""Weights in and out: Hugging Face BERT checkpoints <-> bert_jax parameter trees.

`from_hf(path)` reads a Hugging Face BERT directory (config.json + model.safetensors or
pytorch_model.bin), with or without the `bert.` prefix and with or without the pre-training heads
(`cls.predictions.*`, `cls.seq_relationship.*`), and returns `(BertConfig, params)` where `params` is the
tree of `bert_jax.modeling.BertForPreTraining` (`params["bert"]` is the `BertModel` tree). Heads missing
from the file are initialised and reported; tensors it does not know are reported, never dropped
silently (`strict=True` turns both reports into errors).

`to_hf(config, params, out_dir)` writes config.json + model.safetensors that transformers'
`from_pretrained` loads into the matching class: `BertForPreTraining`, `BertModel`, and the fine-tuned
`BertForQuestionAnswering` (SQuAD span head `qa_outputs`, encoder without pooler),
`BertForSequenceClassification` (GLUE classifier `classifier`), `BertForMultipleChoice` (SWAG head
`choice_classifier`) and `BertForTokenClassification` (NER head `token_classifier`, encoder without
pooler); the last two are written as transformers' `classifier.*`. `from_hf` reads the encoder, the
pre-training heads and, in a directory whose config.json `architectures` names BertForMultipleChoice or
BertForTokenClassification, that head's `classifier.*` (into `choice_classifier` / `token_classifier`);
in other fine-tuned directories it reports `qa_outputs.*` / `classifier.*` as unknown tensors. Absent
pre-training heads (and the pooler of question-answering and token-classification models) are
initialised and reported.

`from_tf_checkpoint(path)` reads Google's released TensorFlow checkpoints (google-research/bert: a
directory with bert_config.json, bert_model.ckpt.index / .data-*, vocab.txt) through TensorFlow's
checkpoint reader (the `tf` extra, imported only there): the same tree, by the same rules table, each
variable named as the original's modeling.py / run_pretraining.py name it (`_tf_variable`).

Layout differences handled here (Hugging Face -> bert_jax):
  Linear weight [out, in]                -> kernel [in, out]
  query/key/value weight [N*H, D]        -> kernel [D, N, H]; bias [N*H] -> [N, H]
  attention output weight [D, N*H]       -> kernel [N, H, D]
  LayerNorm weight/bias (or gamma/beta)  -> scale/bias
  cls.predictions.decoder.weight         -> tied to the word embeddings (checked equal, not stored)

google-research/bert -> Hugging Face (then as above):
  bert/embeddings/<x>_embeddings [rows, D]  -> embeddings.<x>_embeddings.weight
  bert/encoder/layer_<i>/...                -> encoder.layer.<i>....
  <scope>/kernel [in, out]                  -> <scope>.weight [out, in]; <scope>/bias -> <scope>.bias
  <scope>/LayerNorm/gamma, beta             -> <scope>.LayerNorm.weight, bias
  cls/predictions/output_bias [V]           -> cls.predictions.bias
  cls/seq_relationship/output_weights [2, D], output_bias [2] -> cls.seq_relationship.weight, bias
  <variable>/adam_m, <variable>/adam_v, global_step (run_pretraining.py's optimizer) -> ignored
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import re
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bert_jax.bert_config import BERT_CONFIG_FIELDS, BertConfig, read_json
from bert_jax.heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                            BertForTokenClassification)
from bert_jax.modeling import BertForPreTraining

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
PYTORCH_NAME = "pytorch_model.bin"
# google-research/bert's released checkpoints: <dir>/bert_config.json and the checkpoint prefix
# <dir>/bert_model.ckpt (files bert_model.ckpt.index, bert_model.ckpt.data-00000-of-00001).
TF_CONFIG_NAME = "bert_config.json"
TF_CHECKPOINT_NAME = "bert_model.ckpt"

# Hugging Face buffers and tied copies that carry no parameter of their own.
_IGNORED = {"embeddings.position_ids", "cls.predictions.decoder.bias"}
_TIED_DECODER = "cls.predictions.decoder.weight"
# Created fresh (and reported) when a file lacks them: the pre-training heads, and the pooler, which
# BertForMaskedLM checkpoints do not have.
_HEAD_PREFIXES = ("mlm_", "nsp", "bert/pooler/")


@dataclasses.dataclass(frozen=True)
class _Rule:
    hf: str  # Hugging Face name without the `bert.` prefix ({i} = layer index)
    ours: str  # "/"-joined path in the BertForPreTraining tree ({i} = layer index)
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
    return [_Rule(f"{hf}.weight", f"{ours}/kernel", _transpose, _transpose),
            _Rule(f"{hf}.bias", f"{ours}/bias", _same, _same)]


def _layer_norm(hf, ours):
    return [_Rule(f"{hf}.weight", f"{ours}/scale", _same, _same),
            _Rule(f"{hf}.bias", f"{ours}/bias", _same, _same)]


def _rules(config: BertConfig) -> list[_Rule]:
    rules = [
        _Rule("embeddings.word_embeddings.weight", "bert/embeddings/word_embeddings/embedding", _same, _same),
        _Rule("embeddings.position_embeddings.weight", "bert/embeddings/position_embeddings/embedding",
              _same, _same),
        _Rule("embeddings.token_type_embeddings.weight", "bert/embeddings/token_type_embeddings/embedding",
              _same, _same),
        *_layer_norm("embeddings.LayerNorm", "bert/embeddings/LayerNorm"),
    ]
    for i in range(config.num_hidden_layers):
        hf, ours = f"encoder.layer.{i}", f"bert/encoder/layer_{i}"
        for proj in ("query", "key", "value"):
            rules += [
                _Rule(f"{hf}.attention.self.{proj}.weight", f"{ours}/attention/{proj}_kernel",
                      _qkv_kernel_in, _qkv_kernel_out),
                _Rule(f"{hf}.attention.self.{proj}.bias", f"{ours}/attention/{proj}_bias", _heads_in, _heads_out),
            ]
        rules += [
            _Rule(f"{hf}.attention.output.dense.weight", f"{ours}/attention/output_kernel",
                  _attn_out_in, _attn_out_out),
            _Rule(f"{hf}.attention.output.dense.bias", f"{ours}/attention/output_bias", _same, _same),
            *_layer_norm(f"{hf}.attention.output.LayerNorm", f"{ours}/attention_LayerNorm"),
            *_linear(f"{hf}.intermediate.dense", f"{ours}/intermediate"),
            *_linear(f"{hf}.output.dense", f"{ours}/output"),
            *_layer_norm(f"{hf}.output.LayerNorm", f"{ours}/output_LayerNorm"),
        ]
    rules += [
        *_linear("pooler.dense", "bert/pooler"),
        *_linear("cls.predictions.transform.dense", "mlm_transform"),
        *_layer_norm("cls.predictions.transform.LayerNorm", "mlm_LayerNorm"),
        _Rule("cls.predictions.bias", "mlm_output_bias", _same, _same),
        *_linear("cls.seq_relationship", "nsp"),
    ]
    return rules


# Fine-tuning heads that `to_hf` writes (top-level key of the tree -> transformers class). transformers
# names the heads of BertForSequenceClassification, BertForMultipleChoice and BertForTokenClassification
# all `classifier`; bert_jax names them apart, so that a tree tells its class.
_TASK_HEADS = {"qa_outputs": "BertForQuestionAnswering", "classifier": "BertForSequenceClassification",
               "choice_classifier": "BertForMultipleChoice", "token_classifier": "BertForTokenClassification"}
_TASK_HEAD_RULES = [*_linear("qa_outputs", "qa_outputs"), *_linear("classifier", "classifier"),
                    *_linear("classifier", "choice_classifier"), *_linear("classifier", "token_classifier")]
# The heads `from_hf` reads besides the BertForPreTraining tree: config.json `architectures` -> tree key.
_READ_HEADS = {"BertForMultipleChoice": "choice_classifier", "BertForTokenClassification": "token_classifier"}
# Architectures whose classifier has one column per label (config.json id2label / label2id).
_LABELLED = ("BertForSequenceClassification", "BertForTokenClassification")
_PRETRAINING_KEYS = ("bert", "mlm_transform", "mlm_LayerNorm", "mlm_output_bias", "nsp")


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


def _read_config(path: str, overrides: Mapping[str, Any], name: str = CONFIG_NAME,
                 kind: str = "Hugging Face directory") -> BertConfig:
    """`<path>/<name>` (a Hugging Face config.json or the original's bert_config.json) -> BertConfig."""
    config_file = os.path.join(path, name)
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


def _hf_architecture(path: str) -> str | None:
    """The first class named by config.json `architectures` (already checked to be valid JSON), or None."""
    with open(os.path.join(path, CONFIG_NAME), encoding="utf-8") as f:
        architectures = json.load(f).get("architectures") or [None]
    return architectures[0] if isinstance(architectures, list) else None


def _read_head(head: str, tensors: Mapping[str, np.ndarray], config: BertConfig, weight_file: str) -> dict:
    """transformers' `classifier.weight` [C, D] / `classifier.bias` [C] -> {"<head>/kernel": [D, C],
    "<head>/bias": [C]} (C = 1 for the multiple-choice head); ValueError (one line) if missing or misshapen."""
    for name in ("classifier.weight", "classifier.bias"):
        if name not in tensors:
            raise ValueError(f"{weight_file}: missing tensor {name} of the {head} head")
    weight, bias = np.asarray(tensors["classifier.weight"]), np.asarray(tensors["classifier.bias"])
    columns = 1 if head == "choice_classifier" else (weight.shape[0] if weight.ndim == 2 else -1)
    if weight.shape != (columns, config.hidden_size) or bias.shape != (columns,) or columns < 1:
        c = "1" if head == "choice_classifier" else "C"
        raise ValueError(f"{weight_file}: tensors classifier.weight {weight.shape} and classifier.bias {bias.shape} "
                         f"do not fit {head} ({c}, {config.hidden_size}) and ({c},)")
    param_dtype = np.dtype(jnp.dtype(config.param_dtype))
    return {f"{head}/kernel": weight.T.astype(param_dtype), f"{head}/bias": bias.astype(param_dtype)}


def _read_tensors(path: str) -> tuple[str, dict[str, np.ndarray]]:
    st_file, pt_file = os.path.join(path, SAFETENSORS_NAME), os.path.join(path, PYTORCH_NAME)
    if os.path.isfile(st_file):
        from safetensors.numpy import load_file
        try:
            return st_file, load_file(st_file)
        except Exception as e:  # safetensors raises its own SafetensorError / OSError variants
            raise ValueError(f"{st_file}: cannot read safetensors file ({e})") from None
    if os.path.isfile(pt_file):
        try:
            import torch
        except ImportError:
            raise ImportError(f"{pt_file}: reading pytorch_model.bin needs torch; install bert_jax[test] "
                              "or convert the file to model.safetensors") from None
        state = torch.load(pt_file, map_location="cpu", weights_only=True)
        return pt_file, {k: v.detach().float().numpy() if v.is_floating_point() else v.numpy()
                         for k, v in state.items()}
    raise FileNotFoundError(f"{path}: no {SAFETENSORS_NAME} or {PYTORCH_NAME} weight file")


def _normalise_names(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Strips the `bert.` prefix and maps TF-era `gamma`/`beta` LayerNorm names to weight/bias."""
    out = {}
    for name, value in tensors.items():
        if name.startswith("bert."):
            name = name[len("bert."):]
        if name.endswith(".gamma"):
            name = name[: -len("gamma")] + "weight"
        elif name.endswith(".beta"):
            name = name[: -len("beta")] + "bias"
        out[name] = value
    return out


def _abstract_params(config: BertConfig, architecture: str = "BertForPreTraining", num_labels: int = 2) -> dict:
    """Shapes of the (unscanned) params of the bert_jax model of `architecture` (BertForPreTraining,
    BertForQuestionAnswering, BertForMultipleChoice, or BertForSequenceClassification /
    BertForTokenClassification with `num_labels`), without allocating them."""
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


def init_params(config: BertConfig, seed: int = 0) -> dict:
    """Freshly initialised (unboxed) BertForPreTraining params for `config`, as the original's init.

    Leaves are jax.Arrays in config.param_dtype (the layers stacked under `encoder/layers` with
    scan_layers); `seed` seeds `jax.random.key`.
    """
    model = BertForPreTraining(config)
    ids = jnp.zeros((1, 2), jnp.int32)
    return nn.unbox(jax.jit(model.init)(jax.random.key(seed), ids, masked_lm_positions=ids))["params"]


def from_hf(path: str, *, strict: bool = False, seed: int = 0, fresh: list | None = None,
            **config_overrides) -> tuple[BertConfig, dict]:
    """Loads a Hugging Face BERT directory into bert_jax.

    Args:
      path: directory with config.json and model.safetensors (preferred) or pytorch_model.bin, as
        written by `save_pretrained` of BertModel / BertForPreTraining / BertForMaskedLM; names with or
        without the `bert.` prefix.
      strict: raise instead of reporting missing heads or unknown tensors.
      seed: PRNG seed for heads that the file lacks.
      fresh: when given, extended with the "/"-joined paths of the parameters the file lacks (initialised
        with `seed`), e.g. "nsp/kernel".
      **config_overrides: BertConfig fields to replace (e.g. dtype="bfloat16", scan_layers=True).

    Returns:
      (config, params): params is the BertForPreTraining tree of numpy / jax arrays in
      config.param_dtype; `params["bert"]` is the BertModel tree. With scan_layers the layers are stacked.
      When config.json `architectures` names BertForMultipleChoice or BertForTokenClassification, the
      tree also holds that model's head, read from `classifier.weight` [C, D] / `classifier.bias` [C]:
      `choice_classifier` (kernel [D, 1], bias [1]) or `token_classifier` (kernel [D, C], bias [C]), as
      `heads.BertForMultipleChoice` / `heads.BertForTokenClassification` name them.

    Raises:
      FileNotFoundError: no config.json or no weight file.
      ValueError: config.json is not BERT; an encoder tensor is missing; a tensor has the wrong shape;
        a multiple-choice / token-classification directory without classifier.weight and
        classifier.bias, or with misshapen ones; with strict, a missing head or an unknown tensor. Each
        message names the file and the tensor.
    """
    config = _read_config(path, config_overrides)
    weight_file, raw = _read_tensors(path)
    tensors = _normalise_names(raw)
    expected = _abstract_params(config)
    param_dtype = np.dtype(jnp.dtype(config.param_dtype))
    flat, used, missing_heads = {}, set(), []
    for rule in _rules(config):
        if rule.hf not in tensors:
            if rule.ours.startswith(_HEAD_PREFIXES):
                missing_heads.append(rule.hf)
                continue
            raise ValueError(f"{weight_file}: missing tensor {rule.hf} (or bert.{rule.hf})")
        value = np.asarray(tensors[rule.hf])
        try:
            converted = rule.to_ours(value, config)
        except ValueError:
            converted = None
        want = tuple(expected[rule.ours].shape)
        if converted is None or converted.shape != want:
            raise ValueError(f"{weight_file}: tensor {rule.hf} has shape {tuple(value.shape)}, which does not "
                             f"fit {rule.ours} {want} of config {os.path.join(path, CONFIG_NAME)}")
        flat[rule.ours] = converted.astype(param_dtype)
        used.add(rule.hf)

    head = _READ_HEADS.get(_hf_architecture(path))
    if head is not None:
        flat.update(_read_head(head, tensors, config, weight_file))
        used.update({"classifier.weight", "classifier.bias"})

    if _TIED_DECODER in tensors:
        used.add(_TIED_DECODER)
        decoder, words = tensors[_TIED_DECODER], tensors["embeddings.word_embeddings.weight"]
        if decoder.shape != words.shape or not np.array_equal(decoder, words):
            raise ValueError(f"{weight_file}: tensor {_TIED_DECODER} differs from the word embeddings; "
                             "bert_jax ties the MLM decoder to them, as the original BERT")
    unknown = sorted(set(tensors) - used - _IGNORED)
    return config, _complete(config, flat, expected, missing_heads, unknown, strict=strict, seed=seed,
                             source=weight_file, noun="tensors", fresh=fresh)


def _complete(config: BertConfig, flat: dict, expected: Mapping[str, Any], missing_heads: Sequence[str],
              unknown: Sequence[str], *, strict: bool, seed: int, source: str, noun: str,
              fresh: list | None = None) -> dict:
    """The reports shared by `from_hf` and `from_tf_checkpoint`, then the tree: heads missing from the
    file initialised with `seed`, layers stacked with scan_layers. `flat` ("/"-joined paths -> arrays) is
    filled in place; `noun` names the file's entries in messages ("tensors", "variables"); `fresh`, when
    given, is extended with the paths initialised here.

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
        initial = traverse_util.flatten_dict(init_params(config.replace(scan_layers=False), seed), sep="/")
        for path_ in expected:  # the pre-training tree's; a task head read above is kept as read
            if path_ not in flat:
                flat[path_] = np.asarray(initial[path_])
                if fresh is not None:
                    fresh.append(path_)
    params = traverse_util.unflatten_dict(flat, sep="/")
    if config.scan_layers:
        params = stack_layers(params, config.num_hidden_layers)
    return params


# Variables of google-research/bert checkpoints that carry no model parameter: run_pretraining.py's
# optimizer (AdamWeightDecayOptimizer's slots `<variable>/adam_m`, `<variable>/adam_v`) and step counter
# (`global_step`); `AdamWeightDecayOptimizer[_1]` are slot names transformers' load_tf_weights_in_bert
# skips too. Matched against each "/"-separated part of a name.
_TF_IGNORED_PARTS = frozenset({"adam_m", "adam_v", "global_step", "AdamWeightDecayOptimizer",
                               "AdamWeightDecayOptimizer_1"})
# TensorFlow's own bookkeeping entry in object-based (tf.train.Checkpoint) checkpoints.
_TF_IGNORED = frozenset({"_CHECKPOINTABLE_OBJECT_GRAPH"})
# The heads' variables that do not follow the tf.layers.dense naming (run_pretraining.py's
# get_masked_lm_output / get_next_sentence_output create them with tf.get_variable):
# output_weights is [2, D], laid out as a torch Linear weight, not as a dense kernel.
_TF_SPECIAL = {"cls.predictions.bias": "cls/predictions/output_bias",
               "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
               "cls.seq_relationship.bias": "cls/seq_relationship/output_bias"}


def _tf_variable(hf: str) -> tuple[str, bool]:
    """The google-research/bert variable name of a rule's Hugging Face name (without `bert.`), and whether
    its value is the transpose of the Hugging Face tensor (a tf.layers.dense kernel [in, out] against a
    torch Linear weight [out, in]).

    Names as modeling.py / run_pretraining.py create them: variable scopes `bert/embeddings`,
    `bert/encoder/layer_<i>/{attention/self/{query,key,value}, attention/output/dense,
    attention/output/LayerNorm, intermediate/dense, output/dense, output/LayerNorm}`, `bert/pooler/dense`,
    `cls/predictions/transform/{dense,LayerNorm}`; tf.layers.dense's `kernel` / `bias`,
    tf.contrib.layers.layer_norm's `gamma` / `beta`, the embedding tables `word_embeddings`,
    `position_embeddings`, `token_type_embeddings` directly under `bert/embeddings`.
    """
    if hf in _TF_SPECIAL:
        return _TF_SPECIAL[hf], False
    module, leaf = hf.rsplit(".", 1)
    scope = re.sub(r"\.layer\.(\d+)\.", r".layer_\1.", module).replace(".", "/")
    if not hf.startswith("cls."):
        scope = f"bert/{scope}"
    if module.endswith("_embeddings"):  # [rows, D] tables, as Hugging Face's
        return scope, False
    if module.endswith("LayerNorm"):
        return f"{scope}/{'gamma' if leaf == 'weight' else 'beta'}", False
    return f"{scope}/{'kernel' if leaf == 'weight' else 'bias'}", leaf == "weight"


def tf_checkpoint_prefix(path: str) -> str | None:
    """The checkpoint prefix of a google-research/bert TensorFlow checkpoint at `path`, or None.

    `path` is either a directory holding `bert_model.ckpt.index` (else exactly one `*.ckpt.index`), giving
    `<path>/bert_model.ckpt`, or a prefix itself (`<dir>/bert_model.ckpt`, `<dir>/model.ckpt-1000`: the file
    `<path>.index` exists), as the original's --init_checkpoint names it. Only the index is looked for
    (no TensorFlow needed); `from_tf_checkpoint` checks the rest (bert_config.json beside it, the data).

    Raises:
      ValueError: a directory with several `*.ckpt.index` and no `bert_model.ckpt.index` (one line naming
        them: pass the prefix of the one to read).
    """
    path = str(path).rstrip("/") or "/"
    if os.path.isfile(f"{path}.index"):
        return path
    if not os.path.isdir(path):
        return None
    if os.path.isfile(os.path.join(path, f"{TF_CHECKPOINT_NAME}.index")):
        return os.path.join(path, TF_CHECKPOINT_NAME)
    found = sorted(glob.glob(os.path.join(glob.escape(path), "*.ckpt.index")))
    if len(found) > 1:
        raise ValueError(f"{path}: several TensorFlow checkpoints {[os.path.basename(f) for f in found]} and no "
                         f"{TF_CHECKPOINT_NAME}.index; name one by its prefix (e.g. {found[0][:-len('.index')]})")
    return found[0][:-len(".index")] if found else None


def _import_tensorflow(what: str):
    """TensorFlow, imported on first use only (the `tf` extra); ImportError in one line otherwise."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines at import
    try:
        import tensorflow as tf
    except ImportError:
        raise ImportError(f"{what}: reading a TensorFlow checkpoint needs TensorFlow; install the tf extra: "
                          "pip install 'bert_jax[tf]'") from None
    return tf


def from_tf_checkpoint(path: str, *, strict: bool = False, seed: int = 0, fresh: list | None = None,
                       **config_overrides) -> tuple[BertConfig, dict]:
    """Loads one of Google's original TensorFlow BERT checkpoints (google-research/bert) into bert_jax.

    The variables are those of the original's modeling.py (`bert/embeddings/word_embeddings` [V, D],
    `.../position_embeddings` [max_position_embeddings, D], `.../token_type_embeddings` [type_vocab_size, D],
    `bert/encoder/layer_<i>/attention/self/query/kernel` [D, D] with `bias` [D], ..., LayerNorm `gamma` /
    `beta` [D], `bert/pooler/dense/kernel` [D, D]) and run_pretraining.py's heads
    (`cls/predictions/transform/dense/kernel` [D, D], `cls/predictions/transform/LayerNorm/gamma` [D],
    `cls/predictions/output_bias` [V], `cls/seq_relationship/output_weights` [2, D] and `output_bias` [2]);
    kernels are [in, out]. The MLM decoder is the word-embedding table, as in the original. The
    optimizer's `<variable>/adam_m`, `<variable>/adam_v` and `global_step` are skipped unread. Read with
    TensorFlow's checkpoint reader (`tf.train.load_checkpoint`), imported here only: the `tf` extra
    (tensorflow-cpu, which leaves accelerators to JAX).

    The config is bert_config.json as written: `hidden_act` "gelu" is bert_jax's exact erf GELU, as
    transformers reads these checkpoints and as google-research/bert's first release computed it (its
    later modeling.py computes "gelu" with the tanh approximation: pass hidden_act="gelu_new" for that).

    Args:
      path: a directory with bert_config.json and bert_model.ckpt.{index,data-*} (else exactly one
        `*.ckpt.index`), or a checkpoint prefix (`<dir>/bert_model.ckpt`, `<dir>/model.ckpt-1000`) with
        bert_config.json in `<dir>` (see `tf_checkpoint_prefix`).
      strict: raise instead of reporting missing heads (`cls/*`, `bert/pooler/*`) or unknown variables
        (e.g. a fine-tuned classifier's `output_weights`).
      seed: PRNG seed for heads that the checkpoint lacks.
      fresh: as `from_hf`'s.
      **config_overrides: BertConfig fields to replace (e.g. dtype="bfloat16", scan_layers=True).

    Returns:
      (config, params): params is the BertForPreTraining tree (as `from_hf`'s) of numpy arrays in
      config.param_dtype (float32 by default; the checkpoint's float32 values cast); with scan_layers the
      layers are stacked.

    Raises:
      FileNotFoundError: no checkpoint index at `path`, or no bert_config.json beside it.
      ImportError: TensorFlow is not installed (one line naming the `tf` extra).
      ValueError: several checkpoints and none named; bert_config.json not valid JSON or not a BERT config;
        a checkpoint (index or data) TensorFlow cannot read; a missing encoder variable; a variable whose
        shape disagrees with bert_config.json (naming the variable, its shape and the expected one); with
        strict, missing heads or unknown variables. Each message is one line naming the checkpoint.
    """
    prefix = tf_checkpoint_prefix(path)
    if prefix is None:
        raise FileNotFoundError(f"{path}: no TensorFlow checkpoint ({TF_CHECKPOINT_NAME}.index or one "
                                "*.ckpt.index)")
    directory = os.path.dirname(prefix) or "."
    config = _read_config(directory, config_overrides, TF_CONFIG_NAME, "directory of the TensorFlow checkpoint")
    config_file = os.path.join(directory, TF_CONFIG_NAME)
    tf = _import_tensorflow(prefix)
    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = {name: tuple(shape) for name, shape in reader.get_variable_to_shape_map().items()}
    except (tf.errors.OpError, ValueError) as e:
        reason = " ".join(str(e).split())[:300]
        raise ValueError(f"{prefix}: cannot read the TensorFlow checkpoint ({reason})") from None

    expected = _abstract_params(config)
    param_dtype = np.dtype(jnp.dtype(config.param_dtype))
    flat, used, missing_heads = {}, set(), []
    for rule in _rules(config):
        name, transposed = _tf_variable(rule.hf)
        if name not in shapes:
            if rule.ours.startswith(_HEAD_PREFIXES):
                missing_heads.append(name)
                continue
            raise ValueError(f"{prefix}: missing variable {name}")
        ours = jax.ShapeDtypeStruct(expected[rule.ours].shape, jnp.float32)
        want = jax.eval_shape(lambda x, rule=rule: rule.to_hf(x, config), ours).shape
        want = tuple(reversed(want)) if transposed else tuple(want)
        if shapes[name] != want:
            raise ValueError(f"{prefix}: variable {name} has shape {shapes[name]}, but {config_file} gives "
                             f"{want}")
        try:
            value = np.asarray(reader.get_tensor(name))
        except (tf.errors.OpError, ValueError, IndexError) as e:  # IndexError: a truncated data file
            reason = " ".join(str(e).split())[:300]
            raise ValueError(f"{prefix}: cannot read variable {name} of the TensorFlow checkpoint ({reason})") from None
        flat[rule.ours] = np.asarray(rule.to_ours(value.T if transposed else value, config), dtype=param_dtype)
        used.add(name)
    unknown = sorted(name for name in set(shapes) - used - _TF_IGNORED
                     if not _TF_IGNORED_PARTS.intersection(name.split("/")))
    return config, _complete(config, flat, expected, missing_heads, unknown, strict=strict, seed=seed,
                             source=prefix, noun="variables", fresh=fresh)


def _atomic_write(path: str, write: Callable[[str], None]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _architecture(params: Mapping[str, Any]) -> str:
    """The transformers class that `to_hf` writes a tree as, from the tree's top-level keys."""
    if "bert" not in params:
        return "BertModel"
    heads = sorted(set(params) & set(_TASK_HEADS))
    if len(heads) > 1:
        raise ValueError(f"params: both {' and '.join(heads)} heads; a tree has at most one fine-tuning head")
    architecture = _TASK_HEADS[heads[0]] if heads else "BertForPreTraining"
    extra = sorted(set(params) - ({"bert", *heads} if heads else set(_PRETRAINING_KEYS)))
    if extra:
        paths = sorted(traverse_util.flatten_dict({k: params[k] for k in extra}, sep="/"))
        raise ValueError(f"params: entries not part of a BERT model ({architecture}): {paths}; to_hf writes "
                         "BertModel trees and trees of 'bert' with the pre-training heads (mlm_*, nsp), "
                         "qa_outputs, classifier, choice_classifier or token_classifier")
    return architecture


def to_hf(config: BertConfig, params: Mapping[str, Any], out_dir: str, *,
          labels: Sequence[str] | None = None) -> None:
    """Writes `params` as a Hugging Face BERT directory (config.json + model.safetensors).

    The kind of tree is told by its top-level keys, and transformers' `from_pretrained` of the class
    named in config.json `architectures` loads the directory with no missing or unexpected tensor:
      "bert" + mlm_transform, mlm_LayerNorm, mlm_output_bias, nsp -> `BertForPreTraining`
      "bert" + "qa_outputs" (`heads.BertForQuestionAnswering`, no pooler) -> `BertForQuestionAnswering`
        (qa_outputs.weight [2, D], qa_outputs.bias [2]; start logits index 0, end logits index 1)
      "bert" + "classifier" (`heads.BertForSequenceClassification`) -> `BertForSequenceClassification`
        (classifier.weight [C, D], classifier.bias [C]; config.json id2label / label2id of C labels;
        C = 1, a regression head such as STS-B's, also writes problem_type "regression")
      "bert" + "choice_classifier" (`heads.BertForMultipleChoice`) -> `BertForMultipleChoice`
        (classifier.weight [1, D], classifier.bias [1]: one score per choice)
      "bert" + "token_classifier" (`heads.BertForTokenClassification`, no pooler) ->
        `BertForTokenClassification` (classifier.weight [C, D], classifier.bias [C]; config.json id2label /
        label2id of C labels, e.g. the NER tags)
      embeddings, encoder, pooler (`modeling.BertModel`) -> `BertModel`
    Names are prefixed `bert.` except in a BertModel tree and for the heads.

    Args:
      config: the model config.
      params: one of the trees above, with scanned or unscanned layers; leaves in any float dtype
        (written as float32).
      out_dir: created if missing; each file is written to a temporary name and renamed.
      labels: for a classifier or token_classifier tree only, the C class names in index order, written
        as config.json id2label / label2id; by default "LABEL_0" .. "LABEL_{C-1}", as transformers names
        them.

    Raises:
      ValueError: a parameter that the config and the tree's kind do not predict (an unknown top-level
        head, two task heads, a pooler in a question-answering or token-classification tree), a missing
        one, or one of the wrong shape; `labels` for a tree without classifier / token_classifier, or not C
        distinct strings. Each message is one line naming the parameter.
    """
    params = jax.device_get(dict(params))
    if any("encoder/layers/" in p for p in traverse_util.flatten_dict(params, sep="/")):
        params = unstack_layers(params)
    architecture = _architecture(params)
    flat = traverse_util.flatten_dict(params if "bert" in params else {"bert": params}, sep="/")
    num_labels = 2
    if architecture in _LABELLED:
        head = "classifier" if architecture == "BertForSequenceClassification" else "token_classifier"
        if f"{head}/kernel" not in flat:
            raise ValueError(f"params: missing {head}/kernel for classifier.weight")
        shape = np.shape(flat[f"{head}/kernel"])
        if len(shape) != 2 or shape[1] < 1:
            raise ValueError(f"params: {head}/kernel has shape {shape}, expected "
                             f"({config.hidden_size}, num_labels)")
        num_labels = shape[1]
    if labels is not None:
        if architecture not in _LABELLED:
            raise ValueError(f"labels: given for a {architecture} tree, which has no classifier of labels")
        labels = list(labels)
        if (len(labels) != num_labels or len(set(labels)) != len(labels)
                or not all(isinstance(x, str) for x in labels)):
            raise ValueError(f"labels: {labels} are not {num_labels} distinct strings, one per column of "
                             f"{head}/kernel {shape}")
    expected = _abstract_params(config, architecture, num_labels)
    if architecture == "BertModel":
        rules = [r for r in _rules(config) if r.ours.startswith("bert/")]
    else:
        rules = [r for r in _rules(config) + _TASK_HEAD_RULES if r.ours in expected]
    tensors = {}
    for rule in rules:
        if rule.ours not in flat:
            raise ValueError(f"params: missing {rule.ours} for {rule.hf}")
        value = np.asarray(flat.pop(rule.ours), dtype=np.float32)
        if value.shape != tuple(expected[rule.ours].shape):
            raise ValueError(f"params: {rule.ours} has shape {value.shape}, expected "
                             f"{tuple(expected[rule.ours].shape)}")
        prefixed = architecture != "BertModel" and rule.ours.startswith("bert/")
        tensors[f"bert.{rule.hf}" if prefixed else rule.hf] = np.ascontiguousarray(rule.to_hf(value, config))
    if flat:
        raise ValueError(f"params: entries not part of a BERT model ({architecture}): {sorted(flat)}")

    hf_config = {
        "architectures": [architecture],
        "model_type": "bert",
        **config.to_dict(),
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    }
    if architecture in _LABELLED:
        names = labels if labels is not None else [f"LABEL_{i}" for i in range(num_labels)]
        hf_config["id2label"] = {str(i): name for i, name in enumerate(names)}
        hf_config["label2id"] = {name: i for i, name in enumerate(names)}
    if architecture == "BertForSequenceClassification" and num_labels == 1:
        # a one-output head is a regression head (STS-B): mean-squared-error loss
        hf_config["problem_type"] = "regression"
    os.makedirs(out_dir, exist_ok=True)
    from safetensors.numpy import save_file

    _atomic_write(os.path.join(out_dir, SAFETENSORS_NAME),
                  lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))

    def write_config(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(hf_config, f, indent=2, sort_keys=True)
            f.write("\n")

    _atomic_write(os.path.join(out_dir, CONFIG_NAME), write_config)


if __name__ == "__main__":  # python -m bert_jax.convert {to_hf,from_hf,from_tf}: the command lives in convert_cli
    import sys

    from bert_jax import console, convert_cli

    console.install()
    sys.exit(convert_cli.main())
