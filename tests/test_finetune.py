"""Fine-tuning: initial weights from a bert_jax Orbax checkpoint / Hugging Face / random, onto any
mesh; the job's dropout over the checkpoint's; SQuAD and GLUE jobs end to end on small real data (GLUE
reading and metrics: tests/test_glue.py)."""

import json

import jax
import numpy as np
import pytest
from flax import traverse_util

from bert_jax.checkpoints import checkpointing, hf, sources
from bert_jax.training import losses, pretraining, sharding, steps
from bert_jax.model import heads
from bert_jax.tasks import finetune, job
from bert_jax.tasks import glue as glue_task
from bert_jax.tasks import squad as squad_task
from bert_jax.configs import glue as glue_config
from bert_jax.configs import pretrain
from bert_jax.configs import squad as squad_config


def _flat(tree):
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(jax.device_get(tree), sep="/").items()}


@pytest.fixture(scope="module")
def pretrained(instances, tmp_path_factory):
    """A tiny BERT pre-trained by bert_jax for 6 steps on one device (checkpoints 3 and 6): its workdir."""
    config = pretrain.get_config("tiny")
    config.phases = [pretrain.phase(64, 10, 1.0, str(instances / "p1"), 8)]
    config.total_steps, config.warmup_steps, config.checkpoint_every, config.log_every = 6, 2, 3, 3
    config.mesh.num_devices = 1
    workdir = tmp_path_factory.mktemp("pretrain")
    pretraining.train_and_evaluate(config, str(workdir))
    return workdir


@pytest.fixture(scope="module")
def small_squad(data_dir, tmp_path_factory):
    """The first 4 paragraphs (real questions) of the SQuAD train subset as a SQuAD file."""
    with open(data_dir / "squad" / "train-v1.1-subset-44articles.json", encoding="utf-8") as f:
        data = json.load(f)
    article = data["data"][0]
    data["data"] = [dict(article, paragraphs=article["paragraphs"][:4])]
    path = tmp_path_factory.mktemp("squad") / "small.json"
    path.write_text(json.dumps(data))
    return path


def _squad_config(tmp_init, vocab, train_file):
    config = squad_config.get_config("tiny")
    config.init_checkpoint = str(tmp_init)
    config.vocab_file = str(vocab)
    config.train_file = config.predict_file = str(train_file)
    config.max_seq_length, config.doc_stride, config.max_query_length = 64, 32, 16
    config.train_batch_size, config.predict_batch_size, config.num_train_epochs = 8, 16, 2.0
    config.learning_rate, config.log_every = 1e-3, 5
    return config


def test_orbax_encoder_restores_onto_another_mesh_and_dtype(pretrained):
    """The encoder of the pre-training checkpoint lands bit-exactly in a fine-tuning state on a
    (2, 2, 2) mesh with bfloat16 compute; the QA head is fresh and the pooler is left out."""
    config = squad_config.get_config("tiny")
    config.init_checkpoint = str(pretrained)
    config.model.dtype = "bfloat16"
    init = sources.resolve(config.init_checkpoint, config.model)
    assert init.kind == "orbax" and init.config.dtype == "bfloat16" and init.config.num_hidden_layers == 2
    model = heads.BertForQuestionAnswering(init.config)
    tx, _ = finetune.create_optimizer(config, 10)
    mesh = sharding.make_mesh(2, 2, 2)
    state, shardings = finetune.create_state(model, tx, mesh, init, seed=3)
    saved = checkpointing.Checkpointer(str(pretrained / "checkpoints"), async_save=False)
    pre_config = pretrain.get_config("tiny")
    pre_tx, _ = steps.create_optimizer(pre_config)
    abstract, pre_shardings = steps.state_shardings(pretraining.state_init(pretraining.create_model(pre_config), pre_tx, 0),
                                                     sharding.make_mesh(1, 1, 1, jax.devices()[:1]))
    pre_state, _ = saved.restore(saved.latest_step(), checkpointing.abstract_like(abstract, pre_shardings))
    saved.close()
    ours, theirs = _flat(state.params["bert"]), _flat(pre_state.params["bert"])
    assert set(theirs) - set(ours) == {"pooler/kernel", "pooler/bias"}
    for k, v in ours.items():
        np.testing.assert_array_equal(v, theirs[k], err_msg=k)
        assert v.dtype == np.float32
    word = state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert word.sharding.spec == shardings.params["bert"]["embeddings"]["word_embeddings"]["embedding"].spec
    assert len(word.sharding.device_set) == 8
    assert set(state.params) == {"bert", "qa_outputs"}
    head = np.asarray(state.params["qa_outputs"]["kernel"])
    assert 0.01 < head.std() < 0.03  # freshly initialised (stddev initializer_range 0.02, truncated)


def test_init_from_one_checkpoint_of_a_run(pretrained):
    """init_checkpoint=<workdir>/checkpoints/<step> takes that step's encoder, not the latest's."""
    encoders = {}
    for path in (pretrained / "checkpoints" / "3", pretrained):
        config = glue_config.get_config("sst2")
        config.init_checkpoint = str(path)
        init = sources.resolve(config.init_checkpoint, config.model)
        model = heads.BertForSequenceClassification(init.config, num_labels=2)
        tx, _ = finetune.create_optimizer(config, 10)
        state, _ = finetune.create_state(model, tx, sharding.make_mesh(1, 1, 1, jax.devices()[:1]), init, seed=0)
        encoders[init.step] = _flat(state.params["bert"])
    assert list(encoders) == [3, None]  # None: the newest readable checkpoint (6)
    restored = checkpointing.restore_params(str(pretrained / "checkpoints"), jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])),
        {"bert": jax.device_get(state.params["bert"])}), step=3)
    for k, v in _flat(restored["bert"]).items():
        np.testing.assert_array_equal(encoders[3][k], v, err_msg=k)
    assert not np.array_equal(encoders[3]["embeddings/word_embeddings/embedding"],
                              encoders[None]["embeddings/word_embeddings/embedding"])


@pytest.mark.slow
def test_hf_encoder_and_fresh_head(minilm_dir, optimized_programs):
    config = glue_config.get_config("mrpc")
    config.init_checkpoint = str(minilm_dir)
    init = sources.resolve(config.init_checkpoint, config.model)
    assert init.kind == "hf" and init.config.hidden_size == 384
    model = heads.BertForSequenceClassification(init.config, num_labels=2)
    tx, _ = finetune.create_optimizer(config, 10)
    state, _ = finetune.create_state(model, tx, sharding.make_mesh(8, 1, 1), init, seed=0)
    _, reference = hf.from_hf(str(minilm_dir))
    ours, theirs = _flat(state.params["bert"]), _flat(reference["bert"])
    assert set(ours) == set(theirs)  # the classifier keeps the pooler
    for k in ours:
        np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)
    assert np.asarray(state.params["classifier"]["bias"]).sum() == 0


def test_dropout_is_the_jobs_architecture_the_checkpoints(pretrained, minilm_dir):
    """Dropout comes from the fine-tuning config (a recipe may pre-train without it), the architecture
    from the checkpoint, for both a bert_jax run (saved with 0.1) and a Hugging Face directory."""
    for path, hidden in ((pretrained, 128), (minilm_dir, 384)):
        config = glue_config.get_config("sst2")
        config.init_checkpoint = str(path)
        config.model.hidden_dropout_prob, config.model.attention_probs_dropout_prob = 0.25, 0.0
        init = sources.resolve(config.init_checkpoint, config.model)
        assert init.config.hidden_size == hidden != config.model.hidden_size
        assert (init.config.hidden_dropout_prob, init.config.attention_probs_dropout_prob) == (0.25, 0.0)


def test_bad_init_checkpoint_is_one_line(tmp_path):
    config = squad_config.get_config("tiny")
    config.init_checkpoint = str(tmp_path)
    with pytest.raises(FileNotFoundError, match="neither a Hugging Face directory") as e:
        sources.resolve(config.init_checkpoint, config.model)
    assert "\n" not in str(e.value)


def test_fewer_examples_than_a_batch_is_one_line():
    """No batch would ever form (remainders are dropped): fit stops at once instead of looping forever."""
    arrays = {"input_ids": np.zeros((5, 8), np.int32), "labels": np.zeros((5,), np.int32)}
    with pytest.raises(ValueError, match="^5 training examples are fewer than one batch of train_batch_size=8$"):
        finetune.fit(None, None, arrays, batch_size=8, num_train_steps=3, seed=0, mesh=None)


@pytest.mark.parametrize("task", ["glue", "squad"])
def test_vocabulary_larger_than_the_model_is_one_line(task, data_dir, tmp_path):
    """bert-base-uncased's 30522 tokens cannot index a 1000-row embedding: both jobs stop before training."""
    if task == "glue":
        config, run = glue_config.get_config("mrpc"), glue_task.run
        config.data_dir = str(data_dir / "glue" / "MRPC")
    else:
        config, run = squad_config.get_config("tiny"), squad_task.run
        config.train_file = str(data_dir / "squad" / "train-v1.1-subset-44articles.json")
    config.model = pretrain.model_config("tiny")
    config.model.vocab_size = 1000
    vocab = data_dir / "vocab" / "bert-base-uncased-vocab.txt"
    config.vocab_file = str(vocab)
    with pytest.raises(ValueError, match=f"vocabulary {vocab} has 30522 tokens, more than the model's "
                                         "vocab_size 1000") as e:
        run(config, str(tmp_path / "run"))
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_sequences_longer_than_the_encoders_positions_are_one_line(data_dir, tmp_path):
    """job.load_encoder, which every job calls first: max_seq_length over max_position_embeddings."""
    config = glue_config.get_config("sst2")
    config.model = pretrain.model_config("tiny")
    config.model.max_position_embeddings = 64
    config.vocab_file = str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    config.data_dir, config.max_seq_length = str(data_dir / "glue" / "SST-2"), 65
    with pytest.raises(ValueError, match=r"^config.max_seq_length=65 exceeds max_position_embeddings=64$"):
        glue_task.run(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    config.max_seq_length = 64
    init, tokenizer = job.load_encoder(config)
    assert init.kind == "random" and tokenizer.vocab_size == 30522


def test_squad_finetunes_from_a_bert_jax_checkpoint(pretrained, small_squad, data_dir, tmp_path):
    vocab = data_dir / "vocab" / "bert-base-uncased-vocab.txt"
    config = _squad_config(pretrained, vocab, small_squad)
    metrics = squad_task.run(config, str(tmp_path / "run"))
    assert metrics["init"] == "orbax" and metrics["train_steps"] > 0
    assert np.isfinite(metrics["train_loss"]) and 0 <= metrics["f1"] <= 100
    predictions = json.loads((tmp_path / "run" / "predictions.json").read_text())
    nbest = json.loads((tmp_path / "run" / "nbest_predictions.json").read_text())
    assert len(predictions) == metrics["predict_examples"] and set(nbest) == set(predictions)
    assert (tmp_path / "run" / "checkpoints" / str(metrics["train_steps"])).is_dir()
    assert list((tmp_path / "run" / "tensorboard").iterdir())


@pytest.mark.slow
def test_finetune_loss_same_on_any_mesh(pretrained, small_squad, data_dir):
    """3 SQuAD steps (dropout on) on one device and on a (2, 2, 2) mesh give the same losses."""
    vocab = data_dir / "vocab" / "bert-base-uncased-vocab.txt"
    from bert_jax.data import squad, tokenization

    tok = tokenization.Tokenizer(str(vocab))
    feats = squad.convert_examples_to_features(squad.read_squad_examples(str(small_squad), is_training=True), tok,
                                               max_seq_length=64, doc_stride=32, max_query_length=16,
                                               is_training=True)
    config = _squad_config(pretrained, vocab, small_squad)
    init = sources.resolve(config.init_checkpoint, config.model)
    model = heads.BertForQuestionAnswering(init.config)
    curves = []
    for mesh in (sharding.make_mesh(1, 1, 1, jax.devices()[:1]), sharding.make_mesh(2, 2, 2)):
        tx, schedule = finetune.create_optimizer(config, 3)
        state, shardings = finetune.create_state(model, tx, mesh, init, seed=0)
        step, _ = finetune.compile_steps(
            model, tx, schedule, mesh, shardings,
            lambda out, b: losses.span_loss(out.start_logits, out.end_logits, b["start_positions"], b["end_positions"]))
        _, history = finetune.fit(state, step, feats.model_inputs(), batch_size=8, num_train_steps=3, seed=0,
                                  mesh=mesh, log_every=1)
        curves.append([h["loss"] for h in history])
    np.testing.assert_allclose(curves[0], curves[1], rtol=1e-5)


def test_glue_mrpc_job_from_random_init(data_dir, tmp_path):
    config = glue_config.get_config("mrpc")
    config.model = pretrain.model_config("tiny")
    config.vocab_file = str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    config.data_dir = str(data_dir / "glue" / "MRPC")
    config.max_seq_length, config.num_train_epochs, config.train_batch_size = 32, 0.1, 32
    config.mesh.num_devices = 1
    metrics = glue_task.run(config, str(tmp_path))
    assert metrics["train_steps"] == int(3668 / 32 * 0.1) and metrics["eval_examples"] == 408
    assert metrics["majority_accuracy"] == pytest.approx(100 * 279 / 408)
    assert 0 <= metrics["accuracy"] <= 100 and np.isfinite(metrics["train_loss"])
    assert (tmp_path / "dev_predictions.tsv").read_text().count("\n") == 409


@pytest.mark.parametrize("name", ["squad", "glue", "ner", "swag"])
def test_a_config_of_another_job_is_one_line(name):
    """A pre-training recipe (or another task's) given to a fine-tuning job: one line naming the missing fields,
    before anything runs; the job's own recipes pass."""
    import importlib

    with pytest.raises(ValueError, match=rf"^--config is not a {name} config: it has no .* --config={name}"):
        job.check_recipe_kind(pretrain.get_config("tiny"), name)
    other = "glue" if name == "squad" else "squad"
    with pytest.raises(ValueError, match=f"not a {name} config"):
        job.check_recipe_kind(importlib.import_module(f"bert_jax.configs.{other}").get_config(), name)
    job.check_recipe_kind(importlib.import_module(f"bert_jax.configs.{name}").get_config(), name)
