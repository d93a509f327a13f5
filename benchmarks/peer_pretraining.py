"""The peer control of the transfer benchmark: transformers' PyTorch `BertForPreTraining` pre-trained on
the same instances with the same recipe as `bert_jax.train`, exported as a Hugging Face directory that
bert_jax's fine-tuning jobs load (`config.init_checkpoint=<out_dir>/hf`).

  .venv/bin/python benchmarks/peer_pretraining.py --config configs/pretrain.py:transfer --out_dir DIR \\
      --vocab_file V --config.phases[0].data_dir=... --config.phases[1].data_dir=... [--max_steps N]

Same as bert_jax: the phases' step ranges (`train.resolve_phases`), the instances of each phase's
data_dir, the architecture (config.model), the MLM bias init (`train.initial_mlm_bias`), sparse MLM (the
head applied at the masked positions only) + NSP on [CLS], AdamW with decay off for LayerNorm and biases,
the learning-rate schedule (`optim.learning_rate_schedule`, evaluated per step) and global-norm clipping.
Different: the data order (numpy permutation per epoch, seeded by config.seed and the phase) and the
initial weights (torch's own draw from the same distributions).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import time
from typing import Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402


def _phase_arrays(data_dir: str) -> dict[str, np.ndarray]:
    from bert_jax.data import pretraining

    instances = list(pretraining.iterate_instances(data_dir))
    return {k: np.stack([x[k] for x in instances]) for k in instances[0]}


def pretrain_peer(config, out_dir: str, vocab_file: str, *, max_steps: int | None = None, log_every: int = 100,
                  export_steps: Sequence[int] = (), threads: int | None = None) -> dict:
    """Pre-trains the transformers peer per `config` (a configs/pretrain.py config) -> a summary dict
    (steps, seconds, sequences, last logged metrics). Writes `<out_dir>/metrics.jsonl` (bert_jax's keys,
    prefix "train"), `<out_dir>/hf-<step>` for each export step, and `<out_dir>/hf` at the end, each with
    vocab.txt beside the weights."""
    import torch
    import transformers

    from bert_jax import optim, train

    torch.set_num_threads(threads or os.cpu_count())
    torch.manual_seed(config.seed)
    m = config.model
    model = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_hidden_layers,
        num_attention_heads=m.num_attention_heads, intermediate_size=m.intermediate_size, hidden_act="gelu",
        hidden_dropout_prob=m.hidden_dropout_prob, attention_probs_dropout_prob=m.attention_probs_dropout_prob,
        max_position_embeddings=m.max_position_embeddings, type_vocab_size=m.type_vocab_size,
        initializer_range=m.initializer_range, layer_norm_eps=m.layer_norm_eps))
    bias = train.initial_mlm_bias(config)
    if bias is not None:
        with torch.no_grad():
            model.cls.predictions.bias.copy_(torch.from_numpy(bias))
    no_decay = [p for n, p in model.named_parameters() if "LayerNorm" in n or n.endswith("bias")]
    decay = [p for n, p in model.named_parameters() if not ("LayerNorm" in n or n.endswith("bias"))]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.learning_rate,
                                  betas=(config.adam_b1, config.adam_b2), eps=config.adam_eps)
    schedule = optim.learning_rate_schedule(config.learning_rate, config.warmup_steps, config.total_steps)
    os.makedirs(out_dir, exist_ok=True)
    final = min(config.total_steps, max_steps or config.total_steps)

    def export(name):
        path = os.path.join(out_dir, name)
        model.save_pretrained(path + ".tmp")
        shutil.copy(vocab_file, os.path.join(path + ".tmp", "vocab.txt"))
        shutil.rmtree(path, ignore_errors=True)
        os.replace(path + ".tmp", path)

    start, step, last = time.perf_counter(), 0, {}
    model.train()
    with open(os.path.join(out_dir, "metrics.jsonl"), "w", encoding="utf-8") as log:
        for phase in train.resolve_phases(config):
            arrays = {k: torch.from_numpy(v) for k, v in _phase_arrays(phase.data_dir).items()}
            n = len(arrays["input_ids"])
            rng = np.random.default_rng(config.seed + 1000 * phase.index)
            order, cursor, window = rng.permutation(n), 0, time.perf_counter()
            while step < min(phase.end, final):
                if cursor + phase.batch_size > n:
                    order, cursor = rng.permutation(n), 0
                rows = torch.from_numpy(order[cursor:cursor + phase.batch_size])
                cursor += phase.batch_size
                b = {k: v[rows] for k, v in arrays.items()}
                for group in optimizer.param_groups:
                    group["lr"] = float(schedule(step))
                out = model.bert(input_ids=b["input_ids"].long(), attention_mask=b["attention_mask"].long(),
                                 token_type_ids=b["token_type_ids"].long())
                positions = b["masked_lm_positions"].long()
                hidden = torch.gather(out.last_hidden_state, 1,
                                      positions[..., None].expand(-1, -1, out.last_hidden_state.shape[-1]))
                logits = model.cls.predictions(hidden)  # [B, P, V]
                weights = b["masked_lm_weights"].float()
                nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), b["masked_lm_ids"].long(),
                                                        reduction="none")
                mlm_loss = (nll * weights).sum() / weights.sum().clamp(min=1.0)
                nsp_logits = model.cls.seq_relationship(out.pooler_output)
                nsp_loss = torch.nn.functional.cross_entropy(nsp_logits, b["next_sentence_labels"].long())
                loss = mlm_loss + nsp_loss
                optimizer.zero_grad()
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                optimizer.step()
                step += 1
                if step % log_every == 0 or step == final:
                    with torch.no_grad():
                        mlm_acc = ((logits.argmax(-1) == b["masked_lm_ids"]).float() * weights).sum() / weights.sum()
                        nsp_acc = (nsp_logits.argmax(-1) == b["next_sentence_labels"]).float().mean()
                    seconds = time.perf_counter() - window
                    last = {"step": step, "prefix": "train", "loss": loss.item(), "mlm_loss": mlm_loss.item(),
                            "mlm_accuracy": mlm_acc.item(), "nsp_loss": nsp_loss.item(),
                            "nsp_accuracy": nsp_acc.item(), "grad_norm": grad_norm.item(),
                            "learning_rate": float(schedule(step - 1)),
                            "sequences_per_second": log_every * phase.batch_size / seconds}
                    log.write(json.dumps(last) + "\n")
                    log.flush()
                    print(f"peer step {step}: loss {last['loss']:.3f} MLM acc {last['mlm_accuracy']:.3f} "
                          f"NSP acc {last['nsp_accuracy']:.3f}", flush=True)
                    window = time.perf_counter()
                if step in export_steps:
                    export(f"hf-{step}")
    export("hf")
    return {"steps": step, "seconds": time.perf_counter() - start, "final": last}


def main():
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "bert_jax pre-training config, e.g. configs/pretrain.py:transfer.")
    flags.DEFINE_string("out_dir", None, "Output directory.")
    flags.DEFINE_string("vocab_file", None, "The vocabulary the instances were made with.")
    flags.DEFINE_integer("max_steps", None, "Stop after this step.")
    flags.mark_flags_as_required(["config", "out_dir", "vocab_file"])

    def run(argv):
        del argv
        f = flags.FLAGS
        print(json.dumps(pretrain_peer(f.config, f.out_dir, f.vocab_file, max_steps=f.max_steps)))

    app.run(run)


if __name__ == "__main__":
    main()
