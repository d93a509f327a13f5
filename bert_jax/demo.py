"""The main job (`make demo`): the tiny BERT trained for a few steps on real text, on CPU.

Interim form until the data and pre-training issues land: it trains a WordPiece vocabulary on the
corpus with the `tokenizers` library, builds sentence-pair batches with 15% masking (80/10/10) and
random next sentences, and runs forward + backward passes of `BertForPreTraining` with optax AdamW
under `jax.jit`, printing the masked-LM and next-sentence losses as they fall.

Default corpus: CPython's bundled documentation text (`pydoc_data.topics`), present on every Python
installation; `--corpus FILE` names another (one sentence or paragraph per line).

  python -m bert_jax.demo [--corpus FILE] [--steps 60] [--config configs/pretrain.py:tiny]
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from ml_collections import config_flags

from bert_jax import losses, modeling

_CONFIG = config_flags.DEFINE_config_file("config", "configs/pretrain.py:tiny", "Pre-training config.")
_CORPUS = flags.DEFINE_string("corpus", None, "Text file, one sentence or paragraph per line (UTF-8).")
_STEPS = flags.DEFINE_integer("steps", 60, "Training steps.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 4000, "WordPiece vocabulary size trained on the corpus.")


def _read_lines(path: str | None) -> list[str]:
    if path is None:
        from pydoc_data import topics
        text = "\n".join(topics.topics.values())
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"--corpus {path}: cannot read ({e})") from None
    lines = [line.strip() for line in text.splitlines() if len(line.split()) >= 4]
    if len(lines) < 10:
        raise SystemExit(f"--corpus {path or 'pydoc_data.topics'}: fewer than 10 lines of 4+ words")
    return lines


def _make_batches(lines, tokenizer, batch_size, length, predictions, rng):
    """Sentence pairs (50% the next line, 50% a random line) with the paper's 80/10/10 masking."""
    vocab = tokenizer.get_vocab()
    cls_id, sep_id, mask_id = vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"]
    encoded = [e.ids for e in tokenizer.encode_batch(lines, add_special_tokens=False)]
    half = (length - 3) // 2
    n = batch_size * 8
    fields = {
        "input_ids": np.zeros((n, length), np.int32),
        "token_type_ids": np.zeros((n, length), np.int32),
        "attention_mask": np.zeros((n, length), np.int32),
        "masked_lm_positions": np.zeros((n, predictions), np.int32),
        "masked_lm_ids": np.zeros((n, predictions), np.int32),
        "masked_lm_weights": np.zeros((n, predictions), np.float32),
        "next_sentence_labels": np.zeros((n,), np.int32),
    }
    for row in range(n):
        i = int(rng.integers(len(encoded) - 1))
        not_next = rng.random() < 0.5
        a = encoded[i][:half]
        b = encoded[int(rng.integers(len(encoded)))][:half] if not_next else encoded[i + 1][:half]
        ids = [cls_id, *a, sep_id, *b, sep_id]
        types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        candidates = [p for p, t in enumerate(ids) if t not in (cls_id, sep_id)]
        k = min(predictions, max(1, round(0.15 * len(candidates))))
        positions = np.sort(rng.choice(candidates, size=k, replace=False))
        originals = [ids[p] for p in positions]
        for p in positions:
            r = rng.random()
            ids[p] = mask_id if r < 0.8 else (int(rng.integers(len(vocab))) if r < 0.9 else ids[p])
        fields["input_ids"][row, : len(ids)] = ids
        fields["token_type_ids"][row, : len(ids)] = types
        fields["attention_mask"][row, : len(ids)] = 1
        fields["masked_lm_positions"][row, :k] = positions
        fields["masked_lm_ids"][row, :k] = originals
        fields["masked_lm_weights"][row, :k] = 1.0
        fields["next_sentence_labels"][row] = int(not_next)
    return [{k: v[s : s + batch_size] for k, v in fields.items()} for s in range(0, n, batch_size)]


def main(argv):
    del argv
    from tokenizers import BertWordPieceTokenizer

    config = _CONFIG.value
    lines = _read_lines(_CORPUS.value)
    print(f"corpus: {len(lines)} lines from {_CORPUS.value or 'pydoc_data.topics'}")
    tokenizer = BertWordPieceTokenizer(lowercase=True)
    tokenizer.train_from_iterator(lines, vocab_size=_VOCAB_SIZE.value, show_progress=False)
    rng = np.random.default_rng(config.seed)
    phase = config.phases[0]
    batches = _make_batches(lines, tokenizer, phase.batch_size, phase.max_seq_length,
                            phase.max_predictions_per_seq, rng)

    bert_config = modeling.BertConfig.from_dict(config.model, vocab_size=tokenizer.get_vocab_size())
    model = modeling.BertForPreTraining(bert_config)
    key = jax.random.key(config.seed)
    first = {k: jnp.asarray(v) for k, v in batches[0].items()}
    params = jax.jit(model.init)(key, first["input_ids"], masked_lm_positions=first["masked_lm_positions"])
    params = modeling.nn.unbox(params)["params"]
    optimizer = optax.adamw(1e-3, b1=0.9, b2=0.999, eps=1e-6, weight_decay=config.weight_decay)
    opt_state = optimizer.init(params)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    print(f"model: BERT {bert_config.num_hidden_layers}L/{bert_config.hidden_size}H, {n_params:,} parameters, "
          f"vocab {bert_config.vocab_size}, {jax.device_count()} {jax.default_backend()} device(s)")

    @jax.jit
    def train_step(params, opt_state, batch, step):
        def loss_fn(p):
            out = model.apply({"params": p}, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                              batch["masked_lm_positions"], deterministic=False,
                              rngs={"dropout": jax.random.fold_in(key, step)})
            return losses.pretraining_loss(out.mlm_logits, out.nsp_logits, batch)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, dict(metrics, loss=loss)

    start = time.time()
    history = []
    for step in range(_STEPS.value):
        batch = {k: jnp.asarray(v) for k, v in batches[step % len(batches)].items()}
        params, opt_state, metrics = train_step(params, opt_state, batch, step)
        history.append({k: float(v) for k, v in metrics.items()})
        if step % 10 == 0 or step == _STEPS.value - 1:
            m = history[-1]
            print(f"step {step:4d}  loss {m['loss']:.3f}  mlm {m['mlm_loss']:.3f} (acc {m['mlm_accuracy']:.3f})  "
                  f"nsp {m['nsp_loss']:.3f} (acc {m['nsp_accuracy']:.3f})")
    if not np.isfinite(history[-1]["loss"]):
        raise SystemExit("demo: loss is not finite")
    head, tail = np.mean([h["mlm_loss"] for h in history[:5]]), np.mean([h["mlm_loss"] for h in history[-5:]])
    print(f"summary: MLM loss {head:.3f} -> {tail:.3f} over {_STEPS.value} steps in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
