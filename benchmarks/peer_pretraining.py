"""The peer control of the transfer benchmark: transformers' PyTorch `BertForPreTraining` pre-trained on
the same batches with the same recipe as `bert_jax.training.pretraining.train_and_evaluate`, exported as Hugging Face
directories that `bert_jax.checkpoints.hf.from_hf` and bert_jax's fine-tuning jobs load
(`--config.init_checkpoint=<out_dir>/hf`).

  .venv/bin/python benchmarks/peer_pretraining.py --config pretrain:transfer --out_dir DIR \\
      --vocab_file V --config.phases[0].data_dir=... --config.phases[1].data_dir=... \\
      [--max_steps N] [--export_steps 2000,4000] [--log_every N] [--threads N]

Taken from bert_jax itself, not re-derived: the config checks (`pretraining.validate` on a one-device mesh),
the phases' step ranges (`pretraining.resolve_phases`), each phase's batches (`pretraining.iterator`: the same
grain pipeline, seed and order, so step s trains on the rows bert_jax's step s trains on), the MLM bias
init (`pretraining.initial_mlm_bias`) and the learning rate of every step (`optim.learning_rate_schedule`,
evaluated once for all steps; 0 at step 0, peak at warmup_steps, 0 at total_steps).
Written here to the same definitions: sparse MLM (the head applied at the masked positions only, weighted
mean cross-entropy) + mean NSP cross-entropy on the pooled [CLS] (0 = IsNext), gradient accumulation
over rows i, i + k, ... with the whole batch's denominators, AdamW with weight decay off for LayerNorm
parameters and biases, global-norm clipping before the update, dropout on; the held-out evaluation of
`config.eval_data_dir` (same batches, same weighting of the batch metrics).
Different, by design or by library: the initial weights (transformers' own draw: normal(0,
initializer_range) not truncated at 2 sd, and a zero [PAD] embedding row), the dropout masks, torch's
clip_grad_norm_ factor max_norm / (norm + 1e-6) against bert_jax's max_norm / max(norm, max_norm), and
float32 compute whatever config.model.dtype says. LAMB (config.optimizer="lamb") has no torch
counterpart here: ValueError.

Outputs in out_dir (a run starts afresh, no resume): metrics.jsonl and tensorboard/ (`summaries.Writer`,
bert_jax's format: {"step", "prefix": "train" | "eval", loss, mlm_loss, mlm_accuracy, nsp_loss,
nsp_accuracy, num_predictions, grad_norm, learning_rate, sequences_per_second, tokens_per_second}),
hf-<step>/ for each export step, and hf/ at the end; each export is config.json + model.safetensors
(BertForPreTraining names, `bert.` prefix) + vocab.txt.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import sys
import time
from typing import Any, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # jax only evaluates the schedule and checks the config

import numpy as np  # noqa: E402

_LONG_FIELDS = ("input_ids", "token_type_ids", "attention_mask", "masked_lm_positions", "masked_lm_ids",
                "next_sentence_labels")


def build_model(config) -> Any:
    """A freshly initialised transformers `BertForPreTraining` of `config.model` (torch.manual_seed(
    config.seed) first), its MLM output bias set by `config.mlm_bias_init` as bert_jax sets its own
    (`pretraining.initial_mlm_bias`: zeros, or the log prior of the first phase's targets)."""
    import torch
    import transformers

    from bert_jax.training import pretraining

    m = config.model
    torch.manual_seed(config.seed)
    model = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_hidden_layers,
        num_attention_heads=m.num_attention_heads, intermediate_size=m.intermediate_size, hidden_act=m.hidden_act,
        hidden_dropout_prob=m.hidden_dropout_prob, attention_probs_dropout_prob=m.attention_probs_dropout_prob,
        max_position_embeddings=m.max_position_embeddings, type_vocab_size=m.type_vocab_size,
        initializer_range=m.initializer_range, layer_norm_eps=m.layer_norm_eps))
    bias = pretraining.initial_mlm_bias(config)
    if bias is not None:
        with torch.no_grad():
            model.cls.predictions.bias.copy_(torch.from_numpy(bias))  # decoder.bias is the same tensor
    return model


def build_optimizer(model, config) -> Any:
    """torch AdamW (betas, eps, weight decay of `config`), decay off for LayerNorm parameters and biases
    (as `optim.weight_decay_mask`). The learning rate is set before every step."""
    import torch

    def no_decay(name):
        return "LayerNorm" in name or name.endswith("bias")

    named = list(model.named_parameters())  # tied tensors once (the decoder's are the embeddings' / bias)
    return torch.optim.AdamW(
        [{"params": [p for n, p in named if not no_decay(n)], "weight_decay": config.weight_decay},
         {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}],
        lr=0.0, betas=(config.adam_b1, config.adam_b2), eps=config.adam_eps)


def to_torch(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """A bert_jax pipeline batch -> torch tensors: the int32 fields as int64 (indices),
    masked_lm_weights float32 [B, P]."""
    import torch

    return {k: torch.from_numpy(np.asarray(v)).long() if k in _LONG_FIELDS else torch.from_numpy(np.asarray(v))
            for k, v in batch.items()}


def batch_losses(model, batch: dict[str, Any], mlm_count: float, nsp_count: float) -> tuple[Any, dict[str, float]]:
    """bert_jax's `losses.pretraining_loss` on the torch model.

    Args:
      model: a transformers BertForPreTraining.
      batch: torch tensors input_ids, token_type_ids, attention_mask int64 [B, L]; masked_lm_positions,
        masked_lm_ids int64 [B, P]; masked_lm_weights float32 [B, P]; next_sentence_labels int64 [B].
      mlm_count, nsp_count: the denominators, sum of masked_lm_weights and number of sequences of the
        whole batch this one is a micro-batch of (floats; mlm_count 0 gives an MLM loss of 0).

    Returns:
      (loss float32 scalar tensor with gradient = MLM part + NSP part, metrics) where metrics holds the
      floats mlm_loss, mlm_accuracy, nsp_loss, nsp_accuracy (this micro-batch's shares) and
      num_predictions (its sum of weights).
    """
    import torch
    import torch.nn.functional as F

    out = model.bert(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                     attention_mask=batch["attention_mask"])
    sequence = out.last_hidden_state  # [B, L, D]
    positions = batch["masked_lm_positions"][..., None].expand(-1, -1, sequence.shape[-1])  # [B, P, D]
    mlm_logits = model.cls.predictions(torch.gather(sequence, 1, positions))  # [B, P, V], sparse MLM
    nsp_logits = model.cls.seq_relationship(out.pooler_output)  # [B, 2]
    ids, weights, labels = batch["masked_lm_ids"], batch["masked_lm_weights"], batch["next_sentence_labels"]
    nll = F.cross_entropy(mlm_logits.flatten(0, 1).float(), ids.flatten(), reduction="none").view_as(weights)
    mlm_count, nsp_count = max(mlm_count, 1e-12), max(nsp_count, 1e-12)  # losses._ratio's guard
    mlm_loss = (nll * weights).sum() / mlm_count
    nsp_loss = F.cross_entropy(nsp_logits.float(), labels, reduction="sum") / nsp_count
    with torch.no_grad():  # argmax: ties to the first index, as losses.masked_lm_accuracy (jnp.argmax)
        mlm_correct = ((mlm_logits.argmax(-1) == ids).float() * weights).sum().item()
        nsp_correct = (nsp_logits.argmax(-1) == labels).float().sum().item()
    metrics = {"mlm_loss": mlm_loss.item(), "mlm_accuracy": mlm_correct / mlm_count, "nsp_loss": nsp_loss.item(),
               "nsp_accuracy": nsp_correct / nsp_count, "num_predictions": weights.sum().item()}
    return mlm_loss + nsp_loss, metrics


def train_step(model, optimizer, batch: dict[str, Any], *, learning_rate: float, max_grad_norm: float,
               grad_accum_steps: int = 1, step: int = 0) -> dict[str, float]:
    """One optimizer step as `bert_jax.training.steps.train_step`: the batch (torch tensors as `batch_losses`,
    B rows) in grad_accum_steps micro-batches (rows i, i + k, ...) normalised by the whole batch's counts,
    gradients summed, clipped to global norm max_grad_norm (0: no clipping), one AdamW update at
    `learning_rate`.

    Returns:
      float metrics loss, mlm_loss, mlm_accuracy, nsp_loss, nsp_accuracy, num_predictions, grad_norm
      (before clipping), learning_rate.

    Raises:
      FloatingPointError: a non-finite loss or gradient norm, naming `step`; the update is not applied.
    """
    import torch

    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    optimizer.zero_grad(set_to_none=True)
    mlm_count, nsp_count = batch["masked_lm_weights"].sum().item(), float(len(batch["input_ids"]))
    totals: dict[str, float] = {}
    for i in range(grad_accum_steps):
        micro = {k: v[i::grad_accum_steps] for k, v in batch.items()}
        loss, metrics = batch_losses(model, micro, mlm_count, nsp_count)
        loss.backward()
        totals = {k: totals.get(k, 0.0) + v for k, v in metrics.items()}
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm or math.inf).item()
    loss = totals["mlm_loss"] + totals["nsp_loss"]
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        raise FloatingPointError(f"peer: non-finite loss {loss} (gradient norm {grad_norm}) at step {step}")
    optimizer.step()
    return dict(totals, loss=loss, grad_norm=grad_norm, learning_rate=learning_rate)


def evaluate(model, config, batch_size: int) -> dict[str, float]:
    """`bert_jax.training.pretraining._evaluate` on the torch model: the first config.eval_batches batches of
    config.eval_data_dir in order (batch_size rows, no shuffle), dropout off; MLM metrics weighted by each
    batch's predictions, the others by batch; loss = mlm_loss + nsp_loss; num_predictions summed."""
    import torch

    from bert_jax.data.pretraining import loader

    it = loader.make_pretraining_iterator(config.eval_data_dir, global_batch_size=batch_size, shuffle=False,
                                            num_epochs=1, process_index=0, process_count=1)
    totals: dict[str, float] = {}
    weights: dict[str, float] = {}
    model.eval()
    try:
        with torch.no_grad():
            for n, local in enumerate(it):
                if n == config.eval_batches:
                    break
                batch = to_torch(local)
                _, metrics = batch_losses(model, batch, batch["masked_lm_weights"].sum().item(),
                                          float(len(batch["input_ids"])))
                metrics["loss"] = metrics["mlm_loss"] + metrics["nsp_loss"]
                for k, v in metrics.items():
                    w = metrics["num_predictions"] if k.startswith("mlm_") else 1.0
                    totals[k] = totals.get(k, 0.0) + w * v
                    weights[k] = weights.get(k, 0.0) + w
    finally:
        model.train()
        it.close()
    out = {k: totals[k] / weights[k] for k in totals if weights[k]}
    if "num_predictions" in totals:
        out["num_predictions"] = totals["num_predictions"]
    if "mlm_loss" in out:
        out["loss"] = out["mlm_loss"] + out["nsp_loss"]
    return out


def export(model, vocab_file: str, path: str) -> str:
    """`save_pretrained(path)` (config.json + model.safetensors) plus vocab.txt, written under
    `<path>.tmp` and renamed over any previous `path`. Returns path."""
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.copy(vocab_file, os.path.join(tmp, "vocab.txt"))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def _check(config, vocab_file: str, log_every: int) -> list:
    """bert_jax's checks (`pretraining.validate` on one device: phases, data directories, eval data) plus the
    peer's own; returns the resolved phases. One-line ValueError / FileNotFoundError."""
    import jax

    from bert_jax.training import pretraining, sharding

    phases = pretraining.validate(config, sharding.make_mesh(1, 1, 1, jax.devices()[:1]))
    if config.optimizer != "adamw":
        raise ValueError(f"config.optimizer={config.optimizer!r}: the peer has torch's AdamW only")
    if log_every < 1:
        raise ValueError(f"log_every={log_every} must be at least 1")
    if not os.path.isfile(vocab_file):
        raise FileNotFoundError(f"vocab_file={vocab_file!r} does not exist")
    with open(vocab_file, encoding="utf-8") as f:
        tokens = sum(1 for _ in f)
    if tokens > config.model.vocab_size:
        raise ValueError(f"vocab_file={vocab_file!r} holds {tokens} tokens, more than "
                         f"config.model.vocab_size={config.model.vocab_size}")
    return phases


def pretrain_peer(config, out_dir: str, vocab_file: str, *, max_steps: int | None = None,
                  log_every: int | None = None, export_steps: Sequence[int] = (),
                  threads: int | None = None) -> dict:
    """Pre-trains transformers' BertForPreTraining per `config` on bert_jax's batches (module docstring).

    Args:
      config: a bert_jax/configs/pretrain.py config (`get_config(...)` with its overrides); not modified.
      out_dir: output directory (created); metrics.jsonl, tensorboard/, hf-<step>/ and hf/ are replaced.
      vocab_file: the vocabulary the instances were made with, copied into each export as vocab.txt.
      max_steps: stop after this step (short runs); default config.total_steps. The schedule is still
        that of total_steps, as bert_jax's max_steps.
      log_every: steps between train metrics; default config.log_every (bert_jax's grid). The last step
        of each phase and the final step are logged too.
      export_steps: steps after which to write `<out_dir>/hf-<step>` (steps past the end are skipped).
      threads: torch intra-op threads; default os.cpu_count(). Set process-wide.

    Returns:
      {"steps": steps taken, "seconds": wall time of the call, "sequences": sequences trained on,
       "tokens": non-padding tokens trained on, "final": [per phase reached, its last logged train
       metrics with "step" and "phase"], "eval": the last evaluation (only with config.eval_data_dir)}.

    Raises:
      ValueError / FileNotFoundError: a bad config, data directory or vocab_file (one line, before
        training).
      FloatingPointError: a non-finite loss or gradient norm, naming the step.
    """
    import torch

    from bert_jax.training import optim, pretraining, summaries

    began = time.perf_counter()
    log_every = config.log_every if log_every is None else log_every
    phases = _check(config, vocab_file, log_every)
    final_step = min(config.total_steps, max_steps or config.total_steps)
    schedule = optim.learning_rate_schedule(config.learning_rate, config.warmup_steps, config.total_steps)
    learning_rates = np.asarray(schedule(np.arange(final_step)), np.float32)  # [steps], the lr of step s
    torch.set_num_threads(threads or os.cpu_count())
    model = build_model(config)
    optimizer = build_optimizer(model, config)
    model.train()
    os.makedirs(out_dir, exist_ok=True)
    for name in ("metrics.jsonl", "tensorboard"):  # a fresh run: the Writer would append to old records
        path = os.path.join(out_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    writer = summaries.Writer(out_dir)
    step, sequences, tokens, untimed = 0, 0, 0, 0.0
    finals: list[dict] = []
    last_eval: dict[str, float] = {}
    try:
        for phase in phases:
            if step >= final_step:
                break
            finals.append({})
            iterator = pretraining.iterator(phase, config, None)  # bert_jax's batches, seed and order
            try:
                window_start, window_steps, untimed = time.perf_counter(), 0, 0.0
                while step < min(phase.end, final_step):
                    batch = to_torch(next(iterator))
                    metrics = train_step(model, optimizer, batch, learning_rate=float(learning_rates[step]),
                                         max_grad_norm=config.max_grad_norm,
                                         grad_accum_steps=config.grad_accum_steps, step=step)
                    step += 1
                    window_steps += 1
                    sequences += phase.batch_size
                    tokens += int(batch["attention_mask"].sum())
                    if step == phase.start + 1 and step % log_every and step != phase.end and step != final_step:
                        # as bert_jax times from after a phase's first (compiling) step: here the pipeline start
                        window_start, window_steps, untimed = time.perf_counter(), 0, 0.0
                    if step % log_every == 0 or step == phase.end or step == final_step:
                        seqs = window_steps * phase.batch_size / (time.perf_counter() - window_start - untimed)
                        values = dict(metrics, sequences_per_second=seqs, tokens_per_second=seqs * phase.max_seq_length)
                        writer.scalars(step, values, "train")
                        finals[-1] = dict(values, step=step, phase=phase.index)
                        print(f"peer step {step}/{final_step} (phase {phase.index}): loss {values['loss']:.3f} "
                              f"mlm {values['mlm_loss']:.3f} acc {values['mlm_accuracy']:.3f} nsp "
                              f"{values['nsp_loss']:.3f} acc {values['nsp_accuracy']:.3f} lr "
                              f"{values['learning_rate']:.2e} {seqs:.1f} seq/s", flush=True)
                        window_start, window_steps, untimed = time.perf_counter(), 0, 0.0
                    side = time.perf_counter()
                    if config.eval_data_dir and (step % config.eval_every == 0 or step == final_step):
                        last_eval = dict(evaluate(model, config, phase.batch_size), step=step)
                        writer.scalars(step, {k: v for k, v in last_eval.items() if k != "step"}, "eval")
                        print(f"peer eval at step {step}: loss {last_eval['loss']:.3f} mlm acc "
                              f"{last_eval['mlm_accuracy']:.3f} nsp acc {last_eval['nsp_accuracy']:.3f}", flush=True)
                    if step in export_steps:
                        export(model, vocab_file, os.path.join(out_dir, f"hf-{step}"))
                    untimed += time.perf_counter() - side  # evaluations and exports stay out of seq/s
            finally:
                iterator.close()
    finally:
        writer.close()
    export(model, vocab_file, os.path.join(out_dir, "hf"))
    summary = {"steps": step, "seconds": time.perf_counter() - began, "sequences": sequences, "tokens": tokens,
               "final": finals}
    if last_eval:
        summary["eval"] = last_eval
    return summary


def main(argv):
    from absl import app, flags

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    f = flags.FLAGS
    try:
        summary = pretrain_peer(f.config, f.out_dir, f.vocab_file, max_steps=f.max_steps, log_every=f.log_every,
                                export_steps=[int(s) for s in f.export_steps or ()], threads=f.threads)
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        raise SystemExit(f"peer_pretraining: {e}") from None
    print(json.dumps(summary))
    return 0


def _define_flags():
    from absl import flags
    from bert_jax import configs

    configs.define_flag("bert_jax pre-training config, e.g. pretrain:tiny (a recipe name, or a config file path).")
    flags.DEFINE_string("out_dir", None, "Output directory: metrics.jsonl, tensorboard/, hf/, hf-<step>/.")
    flags.DEFINE_string("vocab_file", None, "The vocabulary the instances were made with (copied into hf/).")
    flags.DEFINE_integer("max_steps", None, "Stop after this step (default: config.total_steps).")
    flags.DEFINE_integer("log_every", None, "Steps between logs (default: config.log_every).")
    flags.DEFINE_list("export_steps", [], "Steps after which to write hf-<step>/, e.g. 2000,4000.")
    flags.DEFINE_integer("threads", None, "torch threads (default: all CPU cores).")
    flags.mark_flags_as_required(["config", "out_dir", "vocab_file"])


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
