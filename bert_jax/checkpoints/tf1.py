"""Google's original TensorFlow checkpoints (google-research/bert) in: `from_tf_checkpoint`.

A released checkpoint is a directory with bert_config.json, bert_model.ckpt.index / .data-*, vocab.txt. It is
read through TensorFlow's checkpoint reader (the `tf` extra, imported only here) into the tree that
`hf.from_hf` returns, by the same rules table (`weights.rules`), each variable named as the original's
modeling.py / run_pretraining.py name it (`_tf_variable`).

google-research/bert -> Hugging Face names (then as `weights` maps them to bert_jax):
  bert/embeddings/<x>_embeddings [rows, D]  -> embeddings.<x>_embeddings.weight
  bert/encoder/layer_<i>/...                -> encoder.layer.<i>....
  <scope>/kernel [in, out]                  -> <scope>.weight [out, in]; <scope>/bias -> <scope>.bias
  <scope>/LayerNorm/gamma, beta             -> <scope>.LayerNorm.weight, bias
  cls/predictions/output_bias [V]           -> cls.predictions.bias
  cls/seq_relationship/output_weights [2, D], output_bias [2] -> cls.seq_relationship.weight, bias
  <variable>/adam_m, <variable>/adam_v, global_step (run_pretraining.py's optimizer) -> ignored
"""

from __future__ import annotations

import glob
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.checkpoints import weights
from bert_jax.model.bert_config import BertConfig, read_checkpoint_config

# google-research/bert's released checkpoints: <dir>/bert_config.json and the checkpoint prefix
# <dir>/bert_model.ckpt (files bert_model.ckpt.index, bert_model.ckpt.data-00000-of-00001).
TF_CONFIG_NAME = "bert_config.json"
TF_CHECKPOINT_NAME = "bert_model.ckpt"

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
      fresh: as `hf.from_hf`'s.
      **config_overrides: BertConfig fields to replace (e.g. dtype="bfloat16", scan_layers=True).

    Returns:
      (config, params): params is the BertForPreTraining tree (as `hf.from_hf`'s) of numpy arrays in
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
    config = read_checkpoint_config(directory, TF_CONFIG_NAME, "directory of the TensorFlow checkpoint",
                                    config_overrides)
    config_file = os.path.join(directory, TF_CONFIG_NAME)
    tf = _import_tensorflow(prefix)
    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = {name: tuple(shape) for name, shape in reader.get_variable_to_shape_map().items()}
    except (tf.errors.OpError, ValueError) as e:
        reason = " ".join(str(e).split())[:300]
        raise ValueError(f"{prefix}: cannot read the TensorFlow checkpoint ({reason})") from None

    expected = weights.abstract_params(config)
    param_dtype = np.dtype(jnp.dtype(config.param_dtype))
    flat, used, missing_heads = {}, set(), []
    for rule in weights.rules(config):
        name, transposed = _tf_variable(rule.hf)
        if name not in shapes:
            if rule.ours.startswith(weights.HEAD_PREFIXES):
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
    return config, weights.complete(config, flat, expected, missing_heads, unknown, strict=strict, seed=seed,
                                    source=prefix, noun="variables", fresh=fresh)

