"""bert_jax: BERT (Devlin et al., arXiv 1810.04805) pre-training and fine-tuning in JAX/Flax.

The public API, imported on first use (`import bert_jax` itself loads neither jax nor flax):

  BertConfig                       the bert_config.json fields (`bert_jax.model.bert_config`)
  BertModel, BertForPreTraining    the encoder and the pre-training model (`bert_jax.model.modeling`)
  BertForQuestionAnswering, BertForSequenceClassification, BertForMultipleChoice, BertForTokenClassification
                                   the fine-tuning heads (`bert_jax.model.heads`)
  from_hf, to_hf                   Hugging Face directories <-> (BertConfig, params) (`bert_jax.checkpoints.hf`)
  from_tf_checkpoint               Google's original TF checkpoints -> (BertConfig, params)
                                   (`bert_jax.checkpoints.tf1`)
  Tokenizer                        WordPiece as google-research/bert's (`bert_jax.data.tokenization`)

The package's rooms: `model`, `data`, `checkpoints`, `training`, `tasks`, `configs` (the recipes),
`experiments` (the demo); the commands are `python -m bert_jax.train`, `bert_jax.convert`, `bert_jax.aot`,
`bert_jax.extract_features`, `bert_jax.demo`, `bert_jax.data.*` and `bert_jax.tasks.*` (WORKSPACE.md).
"""

import importlib

__version__ = "0.1.0"  # the package's version: setup.cfg reads it (version = attr: bert_jax.__version__)

_EXPORTS = {
    "BertConfig": "bert_jax.model.bert_config",
    "BertModel": "bert_jax.model.modeling",
    "BertForPreTraining": "bert_jax.model.modeling",
    "BertForQuestionAnswering": "bert_jax.model.heads",
    "BertForSequenceClassification": "bert_jax.model.heads",
    "BertForMultipleChoice": "bert_jax.model.heads",
    "BertForTokenClassification": "bert_jax.model.heads",
    "from_hf": "bert_jax.checkpoints.hf",
    "to_hf": "bert_jax.checkpoints.hf",
    "from_tf_checkpoint": "bert_jax.checkpoints.tf1",
    "Tokenizer": "bert_jax.data.tokenization",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    """The public names above, each imported from its module on first use (PEP 562).

    Raises:
      AttributeError: `name` is not one of them.
    """
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bert_jax' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
