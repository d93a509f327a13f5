"""benchmarks/peer_pretraining.py follows bert_jax's recipe: the same batches, schedule, phases, loss and
evaluation, and exports that bert_jax loads. (That it learns: tests/test_transfer.py.)"""

import json
import sys

import numpy as np
import pytest

from bert_jax.checkpoints import hf
from bert_jax.training import losses, optim, pretraining
from bert_jax.model import modeling
from bert_jax.configs import pretrain
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import peer_pretraining  # noqa: E402


def _config(instances, steps=6):
    config = pretrain.get_config("tiny")
    config.phases = [pretrain.phase(64, 10, 0.5, str(instances / "p1"), 8),
                     pretrain.phase(128, 20, 0.5, str(instances / "p2"), 8)]
    config.total_steps, config.warmup_steps = steps, 2
    config.eval_data_dir, config.eval_every, config.eval_batches = str(instances / "p2"), 3, 1
    return config


def test_peer_runs_bert_jax_phases_batches_schedule_and_eval(instances, tmp_path, data_dir):
    config = _config(instances)
    vocab = str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    summary = peer_pretraining.pretrain_peer(config, str(tmp_path), vocab, log_every=1, export_steps=(3, 99),
                                             threads=2)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trains = [r for r in records if r["prefix"] == "train"]
    assert [r["step"] for r in trains] == [1, 2, 3, 4, 5, 6]
    schedule = optim.learning_rate_schedule(config.learning_rate, config.warmup_steps, config.total_steps)
    np.testing.assert_allclose([r["learning_rate"] for r in trains], [float(schedule(s)) for s in range(6)],
                               rtol=1e-6)
    assert trains[0]["learning_rate"] == 0.0  # optax's step 0, as bert_jax
    assert set(trains[0]) >= {"loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "num_predictions",
                              "grad_norm", "sequences_per_second", "tokens_per_second"}
    assert [r["step"] for r in records if r["prefix"] == "eval"] == [3, 6]
    phases = pretraining.resolve_phases(config)
    assert [(f["phase"], f["step"]) for f in summary["final"]] == [(0, phases[0].end), (1, phases[1].end)]
    tokens = 0
    for p in phases:  # bert_jax's own batches of each phase
        it = pretraining.iterator(p, config, None)
        tokens += sum(int(next(it)["attention_mask"].sum()) for _ in range(p.end - p.start))
        it.close()
    assert summary["steps"] == 6 and summary["sequences"] == 48 and summary["tokens"] == tokens
    assert summary["eval"]["step"] == 6 and 0.0 <= summary["eval"]["mlm_accuracy"] <= 1.0
    assert (tmp_path / "hf-3" / "vocab.txt").is_file() and not (tmp_path / "hf-99").exists()
    hf.from_hf(str(tmp_path / "hf-3"), strict=True)


def test_peer_loss_is_bert_jax_loss_and_accumulation_is_one_batch(instances, tmp_path):
    import torch

    config = _config(instances)
    model = peer_pretraining.build_model(config).eval()  # dropout off: the two sides must agree
    it = pretraining.iterator(pretraining.resolve_phases(config)[1], config, None)
    local = next(it)
    it.close()
    batch = peer_pretraining.to_torch(local)
    with torch.no_grad():
        loss, metrics = peer_pretraining.batch_losses(model, batch, batch["masked_lm_weights"].sum().item(), 8.0)
    model.save_pretrained(str(tmp_path / "hf"))
    bert_config, params = hf.from_hf(str(tmp_path / "hf"), strict=True)
    out = modeling.BertForPreTraining(bert_config).apply(
        {"params": params}, local["input_ids"], local["token_type_ids"], local["attention_mask"],
        local["masked_lm_positions"], deterministic=True)
    ours, ours_metrics = losses.pretraining_loss(out.mlm_logits, out.nsp_logits, local)
    assert float(loss) == pytest.approx(float(ours), abs=1e-4)
    for k in ("mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "num_predictions"):
        assert metrics[k] == pytest.approx(float(ours_metrics[k]), abs=1e-4), k

    after = []
    for accum in (1, 2):
        model = peer_pretraining.build_model(config).eval()
        optimizer = peer_pretraining.build_optimizer(model, config)
        step = peer_pretraining.train_step(model, optimizer, batch, learning_rate=1e-3, max_grad_norm=1.0,
                                           grad_accum_steps=accum)
        after.append((step, [p.grad.clone() for p in model.parameters()]))  # summed, clipped gradients
    (one, p1), (two, p2) = after
    for k in ("loss", "mlm_accuracy", "nsp_loss", "num_predictions", "grad_norm"):
        assert two[k] == pytest.approx(one[k], rel=1e-5), k
    for a, b in zip(p1, p2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
