"""Google's original TensorFlow checkpoints (google-research/bert) in: `tf1.from_tf_checkpoint` against
transformers' own reader (`load_tf_weights_in_bert`), fine-tuning from such a directory, one-line errors.

The checkpoints are written here with TensorFlow's v1 Saver under the original's variable names, spelled
out by hand from google-research/bert's modeling.py and run_pretraining.py (not from bert_jax's table),
with the optimizer slots and step counter of a run_pretraining.py checkpoint.
"""

import json
import logging
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import traverse_util

from bert_jax.model import heads, modeling
from bert_jax.checkpoints import sources, tf1, weights
from bert_jax.training import sharding
from bert_jax.tasks import finetune, job
from bert_jax.configs import glue as glue_config

# bert_config.json as Google ships it: these eleven fields, no layer_norm_eps (1e-12, the original's).
BERT_CONFIG = dict(vocab_size=211, hidden_size=48, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
                   hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                   max_position_embeddings=40, type_vocab_size=2, initializer_range=0.02)
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog", "##s", "."]


def _google_variables(model) -> dict[str, np.ndarray]:
    """A transformers BertForPreTraining's weights under google-research/bert's variable names."""
    sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    out = {f"bert/embeddings/{t}_embeddings": sd[f"bert.embeddings.{t}_embeddings.weight"]
           for t in ("word", "position", "token_type")}

    def dense(scope, hf):  # tf.layers.dense: kernel [in, out]
        out[f"{scope}/kernel"], out[f"{scope}/bias"] = sd[f"{hf}.weight"].T.copy(), sd[f"{hf}.bias"]

    def layer_norm(scope, hf):  # tf.contrib.layers.layer_norm
        out[f"{scope}/gamma"], out[f"{scope}/beta"] = sd[f"{hf}.weight"], sd[f"{hf}.bias"]

    layer_norm("bert/embeddings/LayerNorm", "bert.embeddings.LayerNorm")
    for i in range(model.config.num_hidden_layers):
        tf_layer, hf_layer = f"bert/encoder/layer_{i}", f"bert.encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            dense(f"{tf_layer}/attention/self/{proj}", f"{hf_layer}.attention.self.{proj}")
        dense(f"{tf_layer}/attention/output/dense", f"{hf_layer}.attention.output.dense")
        layer_norm(f"{tf_layer}/attention/output/LayerNorm", f"{hf_layer}.attention.output.LayerNorm")
        dense(f"{tf_layer}/intermediate/dense", f"{hf_layer}.intermediate.dense")
        dense(f"{tf_layer}/output/dense", f"{hf_layer}.output.dense")
        layer_norm(f"{tf_layer}/output/LayerNorm", f"{hf_layer}.output.LayerNorm")
    dense("bert/pooler/dense", "bert.pooler.dense")
    dense("cls/predictions/transform/dense", "cls.predictions.transform.dense")
    layer_norm("cls/predictions/transform/LayerNorm", "cls.predictions.transform.LayerNorm")
    out["cls/predictions/output_bias"] = sd["cls.predictions.bias"]  # [V]; the decoder is the word table
    out["cls/seq_relationship/output_weights"] = sd["cls.seq_relationship.weight"]  # [2, D], not a kernel
    out["cls/seq_relationship/output_bias"] = sd["cls.seq_relationship.bias"]
    return out


def _write_checkpoint(directory, variables, config=BERT_CONFIG, optimizer=True):
    """bert_config.json, vocab.txt and bert_model.ckpt.{index,data-00000-of-00001} as Google's directories,
    written by tf.compat.v1.train.Saver with the names as given; `optimizer`: AdamWeightDecayOptimizer's
    `<variable>/adam_m`, `/adam_v` and `global_step`, as run_pretraining.py saves them."""
    import tensorflow as tf

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "bert_config.json").write_text(json.dumps(config))
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    values = dict(variables)
    if optimizer:
        for name, value in variables.items():
            values[f"{name}/adam_m"] = np.full_like(value, 0.5)
            values[f"{name}/adam_v"] = np.full_like(value, 0.25)
        values["global_step"] = np.int64(1000)
    with tf.Graph().as_default():
        var_list = {name: tf.compat.v1.Variable(value, name=name) for name, value in values.items()}
        saver = tf.compat.v1.train.Saver(var_list=var_list)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(directory / "bert_model.ckpt"), write_meta_graph=False, write_state=False)
    return directory


@pytest.fixture(scope="module")
def google(tmp_path_factory):
    """A random transformers BertForPreTraining (biases and LayerNorms moved off 0/1), its variables
    under the original's names, and its checkpoint directory."""
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(**BERT_CONFIG)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    variables = _google_variables(model)
    return model, variables, _write_checkpoint(tmp_path_factory.mktemp("google") / "uncased_L-3_H-48_A-4",
                                               variables)


def _inputs(seed, batch=4, length=19, predictions=3):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, BERT_CONFIG["vocab_size"], size=(batch, length))
    lengths = rng.integers(6, length + 1, size=batch)
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int64)
    types = ((np.arange(length)[None] >= (lengths[:, None] // 2)) * mask).astype(np.int64)
    positions = np.stack([rng.choice(n - 1, predictions, replace=False) + 1 for n in lengths])
    return {"input_ids": ids * mask, "token_type_ids": types, "attention_mask": mask}, positions


def _flat(tree):
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(jax.device_get(tree), sep="/").items()}


def _one_line(excinfo):
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


def test_tf_checkpoint_matches_transformers_reader(google, caplog):
    """Ours and transformers' load_tf_weights_in_bert read the same checkpoint: same MLM / NSP logits and
    sequence output; every variable is used (strict), the optimizer slots skipped without a report."""
    source, variables, directory = google
    with caplog.at_level(logging.WARNING):
        config, params = tf1.from_tf_checkpoint(str(directory), strict=True)
    assert not caplog.records
    assert config.to_dict() == dict(BERT_CONFIG, layer_norm_eps=1e-12)
    assert config.hidden_act == "gelu"  # as bert_config.json says, and as transformers reads it

    reference = transformers.BertForPreTraining(transformers.BertConfig(**BERT_CONFIG)).eval()
    transformers.load_tf_weights_in_bert(reference, reference.config, str(directory / "bert_model.ckpt"))
    for name, value in source.state_dict().items():  # transformers read every variable as written
        np.testing.assert_array_equal(reference.state_dict()[name].numpy(), value.numpy(), err_msg=name)

    model = modeling.BertForPreTraining(config)
    for seed in (0, 1, 2):
        inputs, positions = _inputs(seed)
        out = model.apply({"params": params}, **{k: jnp.asarray(v, jnp.int32) for k, v in inputs.items()},
                          masked_lm_positions=jnp.asarray(positions, jnp.int32))
        with torch.no_grad():
            ref = reference(**{k: torch.from_numpy(v) for k, v in inputs.items()}, output_hidden_states=True)
        ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), positions[..., None], axis=1)
        real = inputs["attention_mask"].astype(bool)
        assert np.abs(np.asarray(out.mlm_logits) - ref_mlm).max() < 1e-5
        assert np.abs(np.asarray(out.nsp_logits) - ref.seq_relationship_logits.numpy()).max() < 1e-5
        assert np.abs(np.asarray(out.sequence_output)[real] - ref.hidden_states[-1].numpy()[real]).max() < 1e-5

    # Layouts: a dense kernel is kept [in, out] (split per head), output_weights [2, D] transposed.
    np.testing.assert_array_equal(params["bert"]["encoder"]["layer_1"]["attention"]["query_kernel"].reshape(48, 48),
                                  variables["bert/encoder/layer_1/attention/self/query/kernel"])
    np.testing.assert_array_equal(params["nsp"]["kernel"], variables["cls/seq_relationship/output_weights"].T)
    # The prefix form (as the original's --init_checkpoint) and scanned layers read the same values.
    _, scanned = tf1.from_tf_checkpoint(str(directory / "bert_model.ckpt"), scan_layers=True)
    stacked = _flat(weights.stack_layers(params, 3))
    assert stacked.keys() == _flat(scanned).keys()
    for k, v in _flat(scanned).items():
        np.testing.assert_array_equal(v, stacked[k], err_msg=k)


def test_finetuning_starts_from_a_google_directory(google):
    """init_checkpoint = the directory (or its bert_model.ckpt prefix): the encoder is the checkpoint's,
    the classifier fresh, vocab.txt the default vocabulary."""
    _, variables, directory = google
    _, params = tf1.from_tf_checkpoint(str(directory))
    inits = {}
    for path in (directory, directory / "bert_model.ckpt"):
        config = glue_config.get_config("mrpc")
        config.init_checkpoint, config.vocab_file = str(path), ""
        inits[path] = init = sources.resolve(config.init_checkpoint, config.model)
        assert init.config.hidden_size == 48 and init.config.num_hidden_layers == 3
        assert init.config.hidden_dropout_prob == config.model.hidden_dropout_prob  # the job's, as for HF
        assert sources.vocabulary(init, config.vocab_file, None)[0] == str(directory / "vocab.txt")
        assert job.load_tokenizer(config, init).vocab_size == len(VOCAB)
    for k, v in _flat(inits[directory].params["bert"]).items():
        np.testing.assert_array_equal(_flat(inits[directory / "bert_model.ckpt"].params["bert"])[k], v, err_msg=k)

    model = heads.BertForSequenceClassification(init.config, num_labels=2)
    tx, _ = finetune.create_optimizer(config, 10)
    state, _ = finetune.create_state(model, tx, sharding.make_mesh(8, 1, 1), init, seed=0)
    ours, theirs = _flat(state.params["bert"]), _flat(params["bert"])
    assert ours.keys() == theirs.keys()  # the classifier keeps the pooler
    for k in ours:
        np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)
    np.testing.assert_array_equal(ours["embeddings/word_embeddings/embedding"],
                                  variables["bert/embeddings/word_embeddings"])
    np.testing.assert_array_equal(ours["encoder/layer_2/intermediate/kernel"],
                                  variables["bert/encoder/layer_2/intermediate/dense/kernel"])
    np.testing.assert_array_equal(ours["pooler/kernel"], variables["bert/pooler/dense/kernel"])
    assert np.asarray(state.params["classifier"]["bias"]).sum() == 0


def test_bad_checkpoints_give_one_line_errors(google, tmp_path, caplog, monkeypatch):
    _, variables, directory = google

    # bert_config.json disagreeing with the variables: the first variable it misfits, both shapes.
    shutil.copytree(directory, tmp_path / "config")
    (tmp_path / "config" / "bert_config.json").write_text(json.dumps(dict(BERT_CONFIG, intermediate_size=100)))
    with pytest.raises(ValueError) as e:
        tf1.from_tf_checkpoint(str(tmp_path / "config"))
    message = _one_line(e)
    assert "bert/encoder/layer_0/intermediate/dense/kernel" in message and "bert_config.json" in message
    assert "(48, 96)" in message and "(48, 100)" in message

    # A variable written with the wrong shape.
    bad = dict(variables, **{"cls/seq_relationship/output_weights": np.zeros((48, 2), np.float32)})
    _write_checkpoint(tmp_path / "shape", bad, optimizer=False)
    with pytest.raises(ValueError, match=r"variable cls/seq_relationship/output_weights has shape \(48, 2\).*"
                                         r"gives \(2, 48\)") as e:
        tf1.from_tf_checkpoint(str(tmp_path / "shape"))
    _one_line(e)

    # A missing encoder variable.
    missing = {k: v for k, v in variables.items() if k != "bert/encoder/layer_2/output/dense/bias"}
    _write_checkpoint(tmp_path / "missing", missing, optimizer=False)
    with pytest.raises(ValueError, match=r"bert_model\.ckpt: missing variable bert/encoder/layer_2/output/dense/bias"):
        tf1.from_tf_checkpoint(str(tmp_path / "missing"))

    # A fine-tuned classifier's checkpoint (run_classifier.py): NSP head absent, output_weights unknown.
    classifier = {k: v for k, v in variables.items() if not k.startswith("cls/seq_relationship/")}
    classifier.update(output_weights=np.zeros((3, 48), np.float32), output_bias=np.zeros(3, np.float32))
    _write_checkpoint(tmp_path / "classifier", classifier)
    with caplog.at_level(logging.WARNING):
        _, params = tf1.from_tf_checkpoint(str(tmp_path / "classifier"))
    reports = " ".join(r.getMessage() for r in caplog.records)
    assert "cls/seq_relationship/output_weights" in reports and "'output_weights'" in reports
    assert "adam_m" not in reports and "global_step" not in reports
    assert params["nsp"]["kernel"].shape == (48, 2)
    with pytest.raises(ValueError, match="strict load failed") as e:
        tf1.from_tf_checkpoint(str(tmp_path / "classifier"), strict=True)
    assert "output_bias" in _one_line(e)

    # No bert_config.json; no checkpoint; an unreadable checkpoint.
    shutil.copytree(directory, tmp_path / "noconfig")
    (tmp_path / "noconfig" / "bert_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="bert_config.json") as e:
        tf1.from_tf_checkpoint(str(tmp_path / "noconfig"))
    _one_line(e)
    with pytest.raises(FileNotFoundError, match="no TensorFlow checkpoint") as e:
        tf1.from_tf_checkpoint(str(tmp_path))
    _one_line(e)
    shutil.copytree(directory, tmp_path / "corrupt")
    (tmp_path / "corrupt" / "bert_model.ckpt.index").write_bytes(b"not a checkpoint index")
    with pytest.raises(ValueError, match="cannot read the TensorFlow checkpoint") as e:
        tf1.from_tf_checkpoint(str(tmp_path / "corrupt"))
    _one_line(e)
    shutil.copy(directory / "bert_model.ckpt.index", tmp_path / "corrupt")
    (tmp_path / "corrupt" / "bert_model.ckpt.data-00000-of-00001").write_bytes(b"truncated")
    with pytest.raises(ValueError, match="cannot read variable bert/embeddings/word_embeddings") as e:
        tf1.from_tf_checkpoint(str(tmp_path / "corrupt"))
    _one_line(e)
    config = glue_config.get_config("mrpc")
    config.init_checkpoint = str(tmp_path / "missing")
    with pytest.raises(ValueError, match="missing variable"):
        sources.resolve(config.init_checkpoint, config.model)

    # TensorFlow not installed: one line naming the extra, from the converter and from fine-tuning.
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(ImportError, match=r"bert_jax\[tf\]") as e:
        tf1.from_tf_checkpoint(str(directory))
    _one_line(e)
    config.init_checkpoint = str(directory)
    with pytest.raises(ImportError, match=r"tf extra"):
        sources.resolve(config.init_checkpoint, config.model)
