"""Weights in and out: Hugging Face BERT checkpoints <-> bert_jax parameter trees.

`from_hf(path)` reads a Hugging Face BERT directory (config.json + model.safetensors or
pytorch_model.bin), with or without the `bert.` prefix and with or without the pre-training heads
(`cls.predictions.*`, `cls.seq_relationship.*`), and returns `(BertConfig, params)` where `params` is the
tree of `bert_jax.model.modeling.BertForPreTraining` (`params["bert"]` is the `BertModel` tree). Heads missing
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

The name table and layout transforms are `weights.rules`; Google's TensorFlow checkpoints are read by
`tf1.from_tf_checkpoint` through the same table. `python -m bert_jax.convert` is the command
(`checkpoints.convert`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bert_jax.checkpoints import weights
from bert_jax.model.bert_config import BertConfig, read_checkpoint_config

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
PYTORCH_NAME = "pytorch_model.bin"

# Hugging Face buffers and tied copies that carry no parameter of their own.
_IGNORED = {"embeddings.position_ids", "cls.predictions.decoder.bias"}
_TIED_DECODER = "cls.predictions.decoder.weight"

# Fine-tuning heads that `to_hf` writes (top-level key of the tree -> transformers class; their tensor names
# are `weights.TASK_HEAD_RULES`).
_TASK_HEADS = {"qa_outputs": "BertForQuestionAnswering", "classifier": "BertForSequenceClassification",
               "choice_classifier": "BertForMultipleChoice", "token_classifier": "BertForTokenClassification"}
# The heads `from_hf` reads besides the BertForPreTraining tree: config.json `architectures` -> tree key.
_READ_HEADS = {"BertForMultipleChoice": "choice_classifier", "BertForTokenClassification": "token_classifier"}
# Architectures whose classifier has one column per label (config.json id2label / label2id).
_LABELLED = ("BertForSequenceClassification", "BertForTokenClassification")
_PRETRAINING_KEYS = ("bert", "mlm_transform", "mlm_LayerNorm", "mlm_output_bias", "nsp")


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
    config = read_checkpoint_config(path, CONFIG_NAME, "Hugging Face directory", config_overrides)
    weight_file, raw = _read_tensors(path)
    tensors = _normalise_names(raw)
    expected = weights.abstract_params(config)
    param_dtype = np.dtype(jnp.dtype(config.param_dtype))
    flat, used, missing_heads = {}, set(), []
    for rule in weights.rules(config):
        if rule.hf not in tensors:
            if rule.ours.startswith(weights.HEAD_PREFIXES):
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
    return config, weights.complete(config, flat, expected, missing_heads, unknown, strict=strict, seed=seed,
                                    source=weight_file, noun="tensors", fresh=fresh)



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
        params = weights.unstack_layers(params)
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
    expected = weights.abstract_params(config, architecture, num_labels)
    if architecture == "BertModel":
        rules = [r for r in weights.rules(config) if r.ours.startswith("bert/")]
    else:
        rules = [r for r in weights.rules(config) + weights.TASK_HEAD_RULES if r.ours in expected]
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
