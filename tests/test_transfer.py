"""The transfer machinery: task-text corpus readers on the real files, the MLM log-prior bias init,
the pooled-sd summary and the probe configs/commands (bert_jax.experiments.transfer)."""

import json
import math
import re
import statistics

import jax
import numpy as np
import pytest

from bert_jax.training import pretraining, steps
from bert_jax.experiments import transfer
from bert_jax.data import corpus
from bert_jax.data.pretraining import procedure
from bert_jax.configs import pretrain


def test_wikitext_articles_are_documents(data_dir, tmp_path):
    files = [str(data_dir / "corpus" / "wikitext-2" / f) for f in ("valid.txt", "test.txt")]
    titles = sum(1 for f in files for line in open(f, encoding="utf-8") if re.fullmatch(r" = [^=].* = \n", line))
    docs = list(corpus.read_wikitext_documents(files, corpus.ReadStats()))
    non_empty_titles = 0
    for f in files:  # an article with body text between its title and the next one
        lines = open(f, encoding="utf-8").read().split("\n")
        starts = [i for i, line in enumerate(lines) if re.fullmatch(r" = [^=].* = ", line)] + [len(lines)]
        non_empty_titles += sum(any(line.strip() and not line.strip().startswith("=") for line in lines[a + 1:b])
                                for a, b in zip(starts, starts[1:]))
    assert titles >= len(docs) == non_empty_titles > 100
    text = " ".join(s for d in docs for s in d)
    assert " @-@ " not in text and "<unk>" not in text and "= =" not in text
    assert docs[0][0].startswith("Homarus gammarus , known as the European lobster or common lobster , is a species of lobster")


def test_squad_contexts_are_documents(data_dir):
    path = data_dir / "squad" / "train-v1.1-subset-44articles.json"
    paragraphs = [p["context"] for a in json.loads(path.read_text())["data"] for p in a["paragraphs"]]
    docs = list(corpus.read_squad_documents([str(path)], corpus.ReadStats()))
    assert len(docs) == len(paragraphs)
    assert all(" ".join(d) == " ".join(p.split()) for d, p in zip(docs, paragraphs))  # nothing lost or added


def test_squad_reader_names_a_bad_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"version\": 1}")
    with pytest.raises(ValueError, match="bad.json: not a SQuAD JSON file"):
        list(corpus.read_squad_documents([str(bad)], corpus.ReadStats()))


def test_glue_training_text_as_documents(data_dir):
    sst2 = list(corpus.read_glue_documents([str(data_dir / "glue" / "SST-2" / "train.tsv")], "sst2", corpus.ReadStats(),
                                           sentences_per_document=8))
    assert sum(len(d) for d in sst2) == 67349 and len(sst2) == math.ceil(67349 / 8)
    # The shared copy's row order differs from the published file's (GLUE's SST-2.zip, as downloaded).
    assert sst2[0][:2] in (["when are bears bears and", "kids , spirit"],
                           ["hide new secretions from the parental units", "contains no wit , only labored gags"])
    mrpc = list(corpus.read_glue_documents([str(data_dir / "glue" / "MRPC" / "train.tsv")], "mrpc", corpus.ReadStats()))
    assert len(mrpc) == 3668 and all(len(d) == 2 for d in mrpc)


def test_write_corpus_counts_and_round_trips(data_dir, tmp_path):
    path = str(tmp_path / "corpus.txt")
    mrpc = ("mrpc", "glue:mrpc", [str(data_dir / "glue" / "MRPC" / "train.tsv")])
    counts = transfer.write_corpus([mrpc, ("pydoc", "pydoc", [])], path)
    docs = list(corpus.read_sentence_documents([path], corpus.ReadStats()))
    assert counts["mrpc"] == {"documents": 3668, "sentences": 7336}
    assert len(docs) == counts["mrpc"]["documents"] + counts["pydoc"]["documents"]
    assert sum(map(len, docs)) == counts["mrpc"]["sentences"] + counts["pydoc"]["sentences"]
    with pytest.raises(ValueError, match="corpus reader 'books' is not one of"):
        transfer.write_corpus([("x", "books", [])], path)
    with pytest.raises(ValueError, match="nope.json does not exist"):
        transfer.write_corpus([("x", "squad", [str(tmp_path / "nope.json")])], path)


def test_log_prior_matches_a_hand_count(instances):
    vocab_size = 30522
    prior = procedure.masked_token_log_prior(str(instances / "p1"), vocab_size)
    counts = np.ones(vocab_size)
    for x in procedure.iterate_instances(str(instances / "p1")):
        ids = x["masked_lm_ids"][x["masked_lm_weights"] > 0]
        counts += np.bincount(ids, minlength=vocab_size)
    expected = np.log(counts / counts.sum())
    np.testing.assert_allclose(prior, expected - expected.mean(), rtol=1e-5, atol=1e-5)
    assert prior.dtype == np.float32 and abs(float(prior.mean())) < 1e-4
    with pytest.raises(ValueError, match="beyond vocab_size=100"):
        procedure.masked_token_log_prior(str(instances / "p1"), 100)


def test_log_prior_init_starts_at_the_unigram_loss(instances):
    """A new run with mlm_bias_init=log_prior starts from that bias, sharded like the zero one, and
    its untrained model's MLM loss on real instances is the prior's own cross-entropy on their targets
    (computed by hand, within 0.1), far below the zero-bias model's ~log(V)."""
    config = pretrain.get_config("tiny")
    config.phases[0].data_dir = str(instances / "p1")
    config.mlm_bias_init = "log_prior"
    config.mesh.num_devices = 1
    mesh = steps.make_mesh(config.mesh)
    model = pretraining.create_model(config)
    tx, _ = steps.create_optimizer(config)
    prior = pretraining.initial_mlm_bias(config)
    state, shardings = pretraining.create_train_state(model, tx, mesh, 0, mlm_bias=prior)
    zero_state, _ = pretraining.create_train_state(model, tx, mesh, 0)
    assert state.params["mlm_output_bias"].sharding == zero_state.params["mlm_output_bias"].sharding
    np.testing.assert_array_equal(np.asarray(state.params["mlm_output_bias"]), prior)
    every = list(procedure.iterate_instances(str(instances / "p1")))  # all of them: the prior's own targets
    batch = {k: np.stack([x[k] for x in every]) for k in pretraining.BATCH_FIELDS}
    losses = {}
    for name, s in (("prior", state), ("zeros", zero_state)):
        out = model.apply({"params": jax.device_get(s.params)}, batch["input_ids"], batch["token_type_ids"],
                          batch["attention_mask"], masked_lm_positions=batch["masked_lm_positions"],
                          deterministic=True)
        logp = jax.nn.log_softmax(np.asarray(out.mlm_logits, np.float64), axis=-1)
        nll = -np.take_along_axis(np.asarray(logp), batch["masked_lm_ids"][..., None], -1)[..., 0]
        losses[name] = float((nll * batch["masked_lm_weights"]).sum() / batch["masked_lm_weights"].sum())
    assert losses["zeros"] == pytest.approx(math.log(30522), abs=0.1)
    # the smoothed prior's own cross-entropy on these targets (what a context-free head scores), by hand
    counts = np.ones(30522)
    targets = batch["masked_lm_ids"][batch["masked_lm_weights"] > 0]
    counts += np.bincount(targets, minlength=30522)
    prior_cross_entropy = float(-np.log(counts[targets] / counts.sum()).mean())
    print(losses, prior_cross_entropy, len(every), len(targets))
    assert losses["prior"] == pytest.approx(prior_cross_entropy, abs=0.1), losses
    assert losses["prior"] < losses["zeros"] - 1.5, losses
    config.mlm_bias_init = "ones"
    with pytest.raises(ValueError, match="mlm_bias_init='ones' is not"):
        pretraining.validate(config, mesh, need_data=False)


def test_summarize_hand_computed():
    s = transfer.summarize([74.0, 76.0, 75.0], [70.0, 71.0, 72.0])
    assert s["pretrained_mean"] == 75.0 and s["random_mean"] == 71.0 and s["gain"] == 4.0
    assert s["pretrained_sd"] == s["random_sd"] == 1.0 == s["pooled_sd"] == statistics.stdev([70.0, 71.0, 72.0])
    assert s["gain_in_pooled_sd"] == 4.0
    assert transfer.summarize([80.0], [70.0])["gain_in_pooled_sd"] == math.inf


def test_probe_command_names_only_what_differs(tmp_path):
    model = pretrain.get_config("transfer").model
    model.vocab_size = 8000
    cmd = transfer.probe_command("sst2_2k", str(tmp_path / "w"), init_checkpoint="", vocab_file="v.txt",
                                   model=model, seed=1, data_dir="/data/glue/SST-2")
    flags = [c for c in cmd if c.startswith("--config.")]
    assert "--config.max_train_examples=2000" in flags and "--config.model.vocab_size=8000" in flags
    assert "--config.data_dir=/data/glue/SST-2" in flags and "--config.seed=1" in flags
    assert "--config.model.hidden_size=128" in flags  # bert_jax/configs/glue.py's default architecture is base
    assert not any(f.startswith("--config.train_batch_size=") for f in flags)  # 32 is the default
    config = transfer.probe_config("squad", init_checkpoint="run", vocab_file="v.txt", model=model, seed=0,
                                     train_file="/data/train.json", max_train_examples=10)
    assert config.train_file == "/data/train.json" and config.max_train_examples == 10 and config.num_train_epochs == 2.0
    assert transfer.probe_config("sst2_2k", init_checkpoint="", vocab_file="v.txt", model=model,
                                   seed=0, data_dir="/elsewhere/SST-2").data_dir == "/elsewhere/SST-2"
    with pytest.raises(ValueError, match="probe 'cola' is not one of"):
        transfer.probe_config("cola", init_checkpoint="", vocab_file="v", model=model, seed=0)


def test_peer_pretraining_learns_and_exports_for_bert_jax(instances, tmp_path, data_dir):
    """The transfer benchmark's peer (transformers BertForPreTraining on the same instances and recipe):
    its loss falls, its Hugging Face export loads in bert_jax to the same encoder outputs (1e-5), and
    it starts from the same log-prior MLM bias as bert_jax."""
    import sys

    import torch

    from bert_jax.checkpoints import hf
    from bert_jax.model import modeling
    from conftest import ROOT

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peer_pretraining

    config = pretrain.get_config("tiny")
    config.phases = [pretrain.phase(64, 10, 1.0, str(instances / "p1"), 16)]
    config.total_steps, config.warmup_steps, config.learning_rate = 30, 3, 1e-3
    config.mlm_bias_init = "log_prior"
    vocab = str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    summary = peer_pretraining.pretrain_peer(config, str(tmp_path), vocab, log_every=10, export_steps=(10,), threads=2)
    losses = [json.loads(line)["mlm_loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert summary["steps"] == 30 and len(losses) == 3 and losses[-1] < losses[0] - 0.5, losses
    assert (tmp_path / "hf-10" / "vocab.txt").is_file()
    bert_config, params = hf.from_hf(str(tmp_path / "hf"))
    peer = __import__("transformers").BertForPreTraining.from_pretrained(str(tmp_path / "hf")).eval()
    batch = next(procedure.iterate_instances(str(instances / "p1")))
    ids, types, mask = (np.asarray(batch[k])[None] for k in ("input_ids", "token_type_ids", "attention_mask"))
    ours = modeling.BertModel(bert_config).apply({"params": params["bert"]}, ids, types, mask, deterministic=True)
    with torch.no_grad():
        theirs = peer.bert(input_ids=torch.from_numpy(ids).long(), token_type_ids=torch.from_numpy(types).long(),
                           attention_mask=torch.from_numpy(mask).long())
    np.testing.assert_allclose(np.asarray(ours.sequence_output), theirs.last_hidden_state.numpy(), atol=1e-5)
    initial = pretraining.initial_mlm_bias(config)
    assert abs(float(np.corrcoef(peer.cls.predictions.bias.detach().numpy(), initial)[0, 1])) > 0.9


@pytest.mark.slow
def test_prepare_dynamic_data_tokenizes_once_for_both_phases(data_dir, tmp_path):
    """dynamic=True writes tokenized documents once into a data_dir the phases share, holding every
    document of the corpus, and each phase's iterator draws its own length from it."""
    path = str(tmp_path / "corpus.txt")
    counts = transfer.write_corpus([("mrpc", "glue:mrpc", [str(data_dir / "glue" / "MRPC" / "train.tsv")])], path)
    config = pretrain.get_config("tiny")
    for p in config.phases:
        p.data_dir = str(tmp_path / "documents")
    metas = transfer.prepare_pretraining_data(config, path, str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"),
                                                dupe_factor=1, dynamic=True)
    assert metas[0] is metas[1] and metas[0]["kind"] == "documents"
    assert (metas[0]["num_documents"], metas[0]["num_sentences"]) == (counts["mrpc"]["documents"],
                                                                     counts["mrpc"]["sentences"])
    for phase in pretraining.resolve_phases(config):
        it = pretraining.iterator(phase, config, None)
        batch = next(iter(it))
        it.close()
        assert batch["input_ids"].shape == (phase.batch_size, phase.max_seq_length)
