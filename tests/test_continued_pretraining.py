"""Continued pre-training (config.init_checkpoint) against transformers, workdirs that carry their
vocabulary and architecture, and the conversion command."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import traverse_util

from bert_jax.checkpoints import checkpointing, hf, sources
from bert_jax.training import pretraining, steps
from bert_jax.configs import pretrain
from bert_jax.data import corpus, tokenization
from bert_jax.data.pretraining import document_shards

from conftest import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=128, type_vocab_size=2)


def _flat(tree):
    return traverse_util.flatten_dict(jax.device_get(tree), sep="/")


@pytest.fixture(scope="module")
def hf_pretraining(data_dir, tmp_path_factory):
    """A small random transformers BertForPreTraining (both heads; biases and LayerNorms moved off 0/1)
    with Google's vocabulary beside it, as `save_pretrained` writes it."""
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(vocab_size=30522, **SMALL)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("hf") / "bert_small"
    model.save_pretrained(path)
    shutil.copyfile(data_dir / "vocab" / "bert-base-uncased-vocab.txt", path / "vocab.txt")
    return model, path


def _config(instances, init_checkpoint, steps=1):
    config = pretrain.get_config("tiny")
    config.init_checkpoint = str(init_checkpoint)
    config.phases = [config.phases[0]]
    config.phases[0].data_dir, config.phases[0].batch_size, config.phases[0].fraction = str(instances / "p1"), 8, 1.0
    config.total_steps, config.warmup_steps, config.log_every, config.checkpoint_every = steps, 1, 1, steps
    config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = 0.0
    config.mesh.num_devices = 1
    return config


def _torch_losses(model, batch):
    """transformers' MLM (mean over the weighted positions) and NSP losses of one unpacked batch."""
    ids = torch.tensor(np.asarray(batch["input_ids"]), dtype=torch.long)
    labels = torch.full_like(ids, -100)
    for row, (positions, targets, weights) in enumerate(zip(batch["masked_lm_positions"], batch["masked_lm_ids"],
                                                            batch["masked_lm_weights"])):
        for p, t, w in zip(positions, targets, weights):
            if w > 0:
                labels[row, int(p)] = int(t)
    with torch.no_grad():
        out = model(input_ids=ids, token_type_ids=torch.tensor(np.asarray(batch["token_type_ids"]), dtype=torch.long),
                    attention_mask=torch.tensor(np.asarray(batch["attention_mask"]), dtype=torch.long))
    ce = torch.nn.functional.cross_entropy
    mlm = ce(out.prediction_logits.reshape(-1, out.prediction_logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    nsp = ce(out.seq_relationship_logits, torch.tensor(np.asarray(batch["next_sentence_labels"]), dtype=torch.long))
    return float(mlm), float(nsp)


def test_step0_losses_equal_transformers_from_a_bert_for_pretraining(instances, hf_pretraining, tmp_path, capfd):
    """Both heads come from the source: the first step's MLM and NSP losses (logged before the update) are
    transformers' on the same batch; the recipe's architecture (tiny) is replaced by the source's."""
    model, path = hf_pretraining
    config = _config(instances, path)
    metrics = pretraining.train_and_evaluate(config, str(tmp_path / "run"))
    err = capfd.readouterr().err
    assert "architecture from config.init_checkpoint" in err and "hidden_size 128 -> 32" in err
    assert "initialised fresh" not in err
    resolved, _ = sources.pretraining_source(config, str(tmp_path / "other"))
    batch = next(pretraining.iterator(pretraining.resolve_phases(resolved)[0], resolved, None))
    mlm, nsp = _torch_losses(model, batch)
    assert metrics["mlm_loss"] == pytest.approx(mlm, abs=1e-4) and metrics["nsp_loss"] == pytest.approx(nsp, abs=1e-4)
    # The workdir carries itself: the source's architecture, the data's vocabulary and casing.
    run = tmp_path / "run"
    assert json.loads((run / "bert_config.json").read_text())["hidden_size"] == 32
    assert (run / "vocab.txt").read_bytes() == (path / "vocab.txt").read_bytes()
    assert json.loads((run / "tokenizer_config.json").read_text())["do_lower_case"] is True


@pytest.fixture(scope="module")
def gutenberg_documents(data_dir, minilm_dir, tmp_path_factory):
    """The first 3000 sentences of the Gutenberg corpus as documents of 200 sentences, tokenized with MiniLM's
    (Google's) vocabulary."""
    out = tmp_path_factory.mktemp("gutenberg")
    with open(data_dir / "corpus" / "gutenberg-sentences.txt", encoding="utf-8") as f:
        lines = [line for line in (next(f) for _ in range(3100)) if line.strip()][:3000]
    lines = [line + ("\n" if i % 200 == 199 else "") for i, line in enumerate(lines)]
    (out / "corpus.txt").write_text("".join(lines), encoding="utf-8")
    tok = tokenization.Tokenizer(str(minilm_dir / "vocab.txt"))
    document_shards.tokenize_documents(
        corpus.read_sentence_documents([str(out / "corpus.txt")], corpus.ReadStats()), tok, str(out / "docs"),
        num_shards=1)
    return out / "docs"


def _real_sentences(data_dir, n=4):
    """`n` Gutenberg sentences of different lengths (a padded batch)."""
    with open(data_dir / "corpus" / "gutenberg-sentences.txt", encoding="utf-8") as f:
        lines = [line.strip() for line in (next(f) for _ in range(200)) if len(line.split()) > 3]
    return sorted(lines[:40], key=len)[:: 40 // n][:n]


def test_minilm_files_load_as_transformers_loads_them(minilm_dir, data_dir):
    """The real all-MiniLM-L6-v2 files, read by transformers (`AutoModel.from_pretrained`, torch, float32) and by
    bert_jax (`hf.from_hf`): every hidden state (embeddings, 6 layers) and the pooled output equal within
    float32 rounding on a padded batch of real sentences, and the file's pooler (its only head) is in the tree
    value for value, read from the safetensors file directly."""
    from safetensors.numpy import load_file

    from bert_jax.model import modeling

    theirs = transformers.AutoModel.from_pretrained(minilm_dir, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    batch = tokenizer(_real_sentences(data_dir), padding=True, return_tensors="np")
    assert batch["attention_mask"].min() == 0  # padded: the mask matters
    with torch.no_grad():
        want = theirs(**{k: torch.tensor(v) for k, v in batch.items()}, output_hidden_states=True)
    config, params = hf.from_hf(str(minilm_dir))
    ours = modeling.BertModel(config).apply(
        {"params": params["bert"]}, *(np.asarray(batch[k], np.int32) for k in ("input_ids", "token_type_ids",
                                                                               "attention_mask")),
        deterministic=True, output_hidden_states=True)
    real = batch["attention_mask"].astype(bool)
    assert len(ours.hidden_states) == len(want.hidden_states) == 7
    for layer, (a, b) in enumerate(zip(ours.hidden_states, want.hidden_states)):
        np.testing.assert_allclose(np.asarray(a)[real], b.numpy()[real], atol=1e-4, rtol=0, err_msg=f"layer {layer}")
    np.testing.assert_allclose(np.asarray(ours.pooled_output), want.pooler_output.numpy(), atol=1e-5, rtol=0)
    tensors = load_file(str(minilm_dir / "model.safetensors"))
    np.testing.assert_array_equal(params["bert"]["pooler"]["kernel"], tensors["pooler.dense.weight"].T)
    np.testing.assert_array_equal(params["bert"]["pooler"]["bias"], tensors["pooler.dense.bias"])


# The pre-training heads' tensors: bert_jax's name, transformers' name, whether transposed ([in, out] vs torch's
# [out, in]). Written out here, independently of bert_jax's table (`weights.rules`).
HEAD_NAMES = (("mlm_transform/kernel", "cls.predictions.transform.dense.weight", True),
              ("mlm_transform/bias", "cls.predictions.transform.dense.bias", False),
              ("mlm_LayerNorm/scale", "cls.predictions.transform.LayerNorm.weight", False),
              ("mlm_LayerNorm/bias", "cls.predictions.transform.LayerNorm.bias", False),
              ("mlm_output_bias", "cls.predictions.bias", False),
              ("nsp/kernel", "cls.seq_relationship.weight", True), ("nsp/bias", "cls.seq_relationship.bias", False))


def _torch_heads_from(model, params):
    """Copies bert_jax's pre-training heads (from `params`) into a transformers BertForPreTraining (HEAD_NAMES)."""
    flat, state = _flat(params), model.state_dict()
    with torch.no_grad():
        for ours, theirs, transposed in HEAD_NAMES:
            value = flat[ours].T if transposed else flat[ours]
            state[theirs].copy_(torch.from_numpy(np.array(value, np.float32)))
    assert model.cls.predictions.decoder.bias is None or torch.equal(model.cls.predictions.decoder.bias,
                                                                      model.cls.predictions.bias)


@pytest.mark.slow
def test_continued_from_minilm_matches_transformers(gutenberg_documents, minilm_dir, tmp_path, capfd,
                                                    optimized_programs):
    """Continued pre-training from the real MiniLM encoder (no heads): the run's first step (logged before its
    update) has transformers' MLM and NSP losses on the same batch, transformers reading the encoder from the
    file itself (`BertForPreTraining.from_pretrained`) with bert_jax's fresh heads copied in by name; 4 steps
    run on Gutenberg, moving every encoder tensor.

    No learning is claimed: a fresh MLM head on this encoder does not get under the unigram cross-entropy of the
    same targets in a run this suite affords (measured with the log-prior bias, which starts the head there: its
    random transform adds about 0.65 nats at step 1, still about 0.2 after 12 steps at this learning rate and
    0.05 after 30 steps at 1e-3), and getting down to the unigram is a fresh head learning word frequencies, not the encoder's
    context. Learning against the unigram: tests/test_train.py (from scratch)."""
    config = pretrain.get_config("tiny")
    config.init_checkpoint = str(minilm_dir)
    config.phases = [config.phases[0]]  # one phase (length 64): one program of the 6-layer model to compile
    config.phases[0].data_dir, config.phases[0].batch_size, config.phases[0].fraction = str(gutenberg_documents), 8, 1.0
    config.total_steps, config.warmup_steps, config.learning_rate = 4, 1, 1e-4
    config.log_every, config.checkpoint_every = 1, 4
    config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = 0.0
    config.mesh.num_devices = 1
    resolved, init = sources.pretraining_source(config, str(tmp_path / "run"))
    assert resolved.model.hidden_size == 384 and resolved.model.num_hidden_layers == 6
    mesh = steps.make_mesh(resolved.mesh)
    program = pretraining.build(resolved, mesh)
    state = pretraining.initial_state(resolved, program, mesh, init)  # the run's own start: its fresh heads
    assert "initialised fresh: mlm_LayerNorm, mlm_output_bias, mlm_transform, nsp" in capfd.readouterr().err
    assert init.kind == "hf"
    theirs = transformers.BertForPreTraining.from_pretrained(minilm_dir, dtype=torch.float32).eval()
    _torch_heads_from(theirs, jax.device_get(state.params))
    start = _flat(state.params["bert"])
    del state
    batch = next(pretraining.iterator(pretraining.resolve_phases(resolved)[0], resolved, None))
    assert "segment_ids" not in batch
    mlm, nsp = _torch_losses(theirs, batch)

    pretraining.train_and_evaluate(config, str(tmp_path / "run"))
    from bert_jax.training import summaries

    records = summaries.read_metrics(str(tmp_path / "run"))
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[0]["mlm_loss"] == pytest.approx(mlm, abs=1e-4) and records[0]["nsp_loss"] == pytest.approx(nsp, abs=1e-4)
    final = _final_params(tmp_path / "run", 4)
    moved = [k for k, v in start.items() if not np.array_equal(final[f"bert/{k}"], v)]
    assert len(moved) == len(start), sorted(set(start) - set(moved))


@pytest.mark.slow
def test_tf_checkpoint_run_equals_hugging_face_run_bit_for_bit(instances, hf_pretraining, tmp_path):
    """The same weights as a google-research/bert TF1 checkpoint and as a Hugging Face directory: three
    continued steps end in the same parameters, bit for bit."""
    from test_tf_checkpoint import _google_variables, _write_checkpoint

    model, path = hf_pretraining
    tf_dir = _write_checkpoint(tmp_path / "google", _google_variables(model),
                               config=json.loads((path / "config.json").read_text()))
    shutil.copyfile(path / "vocab.txt", tf_dir / "vocab.txt")
    finals = []
    for source in (path, tf_dir):
        workdir = tmp_path / f"run_{source.name}"
        pretraining.train_and_evaluate(_config(instances, source, steps=3), str(workdir))
        finals.append(_final_params(workdir, 3))
    assert finals[0].keys() == finals[1].keys()
    for k, v in finals[0].items():
        np.testing.assert_array_equal(finals[1][k], v, err_msg=k)


def _final_params(workdir, step):
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(str(workdir / "checkpoints"), item_names=("state", "data", "config"),
                               options=ocp.CheckpointManagerOptions(read_only=True)) as m:
        restored = m.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return _flat(restored["state"]["params"])


def _train_cmd(instances, workdir, source, steps=8):
    return [sys.executable, "-m", "bert_jax.train", "--config", "pretrain:tiny", "--workdir", str(workdir),
            f"--config.init_checkpoint={source}", f"--config.phases[0].data_dir={instances / 'p1'}",
            f"--config.phases[1].data_dir={instances / 'p2'}", f"--config.total_steps={steps}", "--config.warmup_steps=2",
            "--config.checkpoint_every=2", "--config.log_every=2", "--config.keep_checkpoints=50",
            "--config.phases[0].batch_size=8", "--config.phases[1].batch_size=8", "--config.mesh.num_devices=1"]


def _env():
    return dict(os.environ, XLA_FLAGS=xla_flags(1), PYTHONPATH=ROOT)


@pytest.mark.slow
def test_stopped_continued_run_resumes_from_its_workdir_not_the_source(instances, hf_pretraining, tmp_path, capfd):
    """A run continued from a Hugging Face directory, stopped at step 4 and resumed after the directory is gone,
    resumes from its own checkpoint and ends with the uninterrupted run's parameters, bit for bit (resuming
    from any point of a killed run: tests/test_train.py)."""
    _, path = hf_pretraining
    source = tmp_path / "source"
    shutil.copytree(path, source)
    config = _config(instances, source, steps=8)
    config.checkpoint_every = 2
    pretraining.train_and_evaluate(config, str(tmp_path / "whole"))
    pretraining.train_and_evaluate(config, str(tmp_path / "stopped"), max_steps=4)
    shutil.rmtree(source)  # a resume that read the source would fail
    capfd.readouterr()
    pretraining.train_and_evaluate(config, str(tmp_path / "stopped"))
    assert "holds checkpoints: resuming from them" in capfd.readouterr().err
    expected, got = _final_params(tmp_path / "whole", 8), _final_params(tmp_path / "stopped", 8)
    for k, v in expected.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.mark.integration
@pytest.mark.parametrize("case", ["missing", "unknown", "vocabulary", "model_flag"])
def test_bad_init_checkpoint_is_one_line_and_writes_nothing(case, instances, hf_pretraining, tmp_path):
    _, path = hf_pretraining
    if case == "missing":
        source, message = tmp_path / "nowhere", "does not exist"
    elif case == "unknown":
        source, message = tmp_path / "junk", "is neither a Hugging Face directory"
        source.mkdir()
        (source / "weights.bin").write_bytes(b"\0" * 64)
    elif case == "vocabulary":
        source, message = tmp_path / "other_vocab", "was tokenized with another vocabulary than"
        shutil.copytree(path, source)
        (source / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    else:  # an architecture flag set by hand that the source contradicts (hidden_size 32)
        source, message = path, "--config.model.hidden_size=64 conflicts with config.init_checkpoint="
    workdir = tmp_path / "run"
    extra = ["--config.model.hidden_size=64"] if case == "model_flag" else []
    result = subprocess.run(_train_cmd(instances, workdir, source) + extra, env=_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train: ") and message in lines[0], result.stderr
    assert not workdir.exists()


def test_finetuning_vocabulary_comes_from_the_source_and_conflicts_are_errors(hf_pretraining, tmp_path):
    _, path = hf_pretraining
    init = sources.resolve(str(path), pretrain.model_config("tiny"))
    config = pretrain.get_config("tiny")  # a model field set on the command line must agree with the source
    config.model.hidden_size, config.model.num_hidden_layers, config.explicit_model_fields = 32, 4, ["hidden_size"]
    sources.check_explicit_fields(config, init.config, str(path))  # agrees; layers not set by hand
    config.explicit_model_fields = ["hidden_size", "num_hidden_layers"]
    with pytest.raises(ValueError, match=r"^--config.model.num_hidden_layers=4 conflicts with .* whose "
                                         r"num_hidden_layers is 2"):
        sources.check_explicit_fields(config, init.config, str(path))
    assert sources.vocabulary(init, "", None) == (str(path / "vocab.txt"), True)
    assert sources.vocabulary(init, str(path / "vocab.txt"), None)[0] == str(path / "vocab.txt")
    other = tmp_path / "vocab.txt"
    other.write_text("[PAD]\n[UNK]\n")
    with pytest.raises(ValueError, match=r"^config.vocab_file='.*' differs from the vocabulary of config.init_checkpoint"):
        sources.vocabulary(init, str(other), None)
    (tmp_path / "cased").mkdir()
    shutil.copyfile(path / "vocab.txt", tmp_path / "cased" / "vocab.txt")
    (tmp_path / "cased" / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    cased = sources.Initialisation("orbax", "x", init.config, vocab_file=str(tmp_path / "cased" / "vocab.txt"),
                                          do_lower_case=False)
    assert sources.vocabulary(cased, "", None)[1] is False
    with pytest.raises(ValueError, match="do_lower_case=True conflicts with"):
        sources.vocabulary(cased, "", True)


def assert_pretraining_export_matches(workdir, hf_dir) -> None:
    """`hf_dir`, `python -m bert_jax.convert to_hf` of the pre-training workdir `workdir`, loads in transformers
    (BertForPreTraining and its tokenizer) and gives bert_jax's MLM and NSP logits within 1e-5. tests/test_docs.py
    runs it on the README's export of the demo's pre-training (a run from outside the repository)."""
    from bert_jax.checkpoints import convert

    ids = transformers.AutoTokenizer.from_pretrained(hf_dir)(
        "who wrote the book?", "the book was written by a writer in london.", return_tensors="np")
    inputs = [np.asarray(ids[k], np.int32) for k in ("input_ids", "token_type_ids", "attention_mask")]
    init = sources.resolve(str(workdir), pretrain.model_config("tiny"))
    params = convert._host_params(init)[0]
    positions = np.array([[1, 2, 3]], np.int32)
    ours = pretraining.create_model(_tiny_config(init)).apply({"params": params}, *inputs, positions, deterministic=True)
    pre = transformers.AutoModelForPreTraining.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        theirs = pre(**{k: torch.tensor(v, dtype=torch.long) for k, v in ids.items()})
    np.testing.assert_allclose(theirs.prediction_logits.numpy()[:, 1:4], np.asarray(ours.mlm_logits), atol=1e-5)
    np.testing.assert_allclose(theirs.seq_relationship_logits.numpy(), np.asarray(ours.nsp_logits), atol=1e-5)


def _tiny_config(init):
    config = pretrain.get_config("tiny")
    config.model.update({k: v for k, v in init.config.to_dict().items() if k in config.model})
    return config


@pytest.mark.parametrize("command", ["from_hf", "from_tf"])
def test_conversion_into_a_bert_jax_checkpoint_is_an_init_checkpoint(command, hf_pretraining, tmp_path, capsys):
    """from_hf / from_tf (the conversion command's `main`, in this process; its command line runs in
    tests/test_docs.py) write a checkpoint directory that init_checkpoint reads alone, with the source's
    arrays and vocabulary; a missing input is one line on stderr, exit status 1, nothing written."""
    from test_tf_checkpoint import _google_variables, _write_checkpoint

    from bert_jax.checkpoints import convert

    model, path = hf_pretraining
    source = path
    if command == "from_tf":
        source = _write_checkpoint(tmp_path / "google", _google_variables(model),
                                   config=json.loads((path / "config.json").read_text()))
        shutil.copyfile(path / "vocab.txt", source / "vocab.txt")
    assert convert.main([command, "--input", str(source), "--output_dir", str(tmp_path / "out")]) == 0
    init = sources.resolve(str(tmp_path / "out"), pretrain.model_config("tiny"))
    assert init.kind == "orbax" and init.config.hidden_size == 32
    assert sources.vocabulary(init, "", None)[0] == str(tmp_path / "out" / "vocab.txt")
    stored = checkpointing.stored_params(str(tmp_path / "out" / "checkpoints" / "0"))
    assert init.step is None  # the newest readable checkpoint: 0
    _, reference = hf.from_hf(str(path))
    assert set(stored) == set(_flat(reference))
    written = _flat(convert._host_params(init)[0])  # the source's heads, value for value (HEAD_NAMES)
    torch_state = model.state_dict()
    for ours, theirs, transposed in HEAD_NAMES:
        want = torch_state[theirs].numpy()
        np.testing.assert_array_equal(written[ours], want.T if transposed else want, err_msg=ours)
    # A fine-tuning job starts from it: the encoder is the source's, bit for bit.
    import optax

    from bert_jax.model import heads
    from bert_jax.training import sharding
    from bert_jax.tasks import finetune

    model = heads.BertForSequenceClassification(init.config, num_labels=3)
    state, _ = finetune.create_state(model, optax.sgd(0.1), sharding.make_mesh(1, 1, 1, jax.devices()[:1]), init, 0)
    ours = _flat(state.params["bert"])
    for k, v in _flat(reference["bert"]).items():
        np.testing.assert_array_equal(ours[k], v, err_msg=k)
    capsys.readouterr()
    status = convert.main([command, "--input", str(tmp_path / "none"), "--output_dir", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert status == 1 and len(err.strip().splitlines()) == 1 and "none" in err and not (tmp_path / "bad").exists()


def test_an_encoder_alone_goes_from_hf_and_back_to_a_bert_model(tmp_path, capsys):
    """from_hf of a Hugging Face BertModel (no heads) and then to_hf of that checkpoint (the conversion
    command's `main`, in this process; its command line runs in tests/test_docs.py): a BertModel directory
    that transformers loads with the source's tensors, bit for bit."""
    from bert_jax.checkpoints import convert

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    source = transformers.BertModel(config).eval()
    source.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                         + [f"w{i}" for i in range(94)]) + "\n")
    assert convert.main(["from_hf", "--input", str(tmp_path / "hf"), "--output_dir", str(tmp_path / "ckpt")]) == 0
    assert convert.main(["to_hf", "--checkpoint", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path / "back")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{tmp_path / 'back'}: BertModel"
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == ["BertModel"]
    back = transformers.BertModel.from_pretrained(tmp_path / "back")
    want = source.state_dict()
    for name, tensor in back.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), want[name].numpy(), err_msg=name)
