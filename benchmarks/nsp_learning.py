"""Does next-sentence prediction learn beyond its label prior? The tiny config on Gutenberg, held-out books.

  .venv/bin/python benchmarks/nsp_learning.py [--steps 2000] [--eval_every 250] [--batch 32]

Instances (length 64, 10 predictions, dupe_factor 1) are built from corpus/gutenberg-sentences.txt: all
books but the last two for training, the last two held out. `pretraining.train_and_evaluate` runs the tiny
config (lr 1e-3, 20 warmup steps, linear decay to 0 at --steps) on one device and evaluates every
--eval_every steps on every held-out instance; the evaluations are read back from metrics.jsonl.

Why a benchmark and not a test: the labels are not balanced. As in the original
create_pretraining_data.py, a chunk of one sentence always gets a random next segment, and at length 64
many Gutenberg chunks are one long sentence, so about 60% of the labels are NotNext. Predicting that
majority already beats 50%, which 100 steps do (tests/test_train.py -k learns); learning the task
itself (a random segment comes from another book) takes longer. Printed: held-out NSP accuracy against
the majority rate, NSP loss against the label prior's entropy (what a model blind to the text reaches),
and held-out MLM loss, at each evaluation.
"""

import argparse
import json
import math
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import shared_data  # noqa: E402  (the real-data folder's one rule)
DATA = shared_data.data_dir()

from bert_jax.training import pretraining  # noqa: E402
from bert_jax.data import corpus, tokenization
from bert_jax.data.pretraining import procedure  # noqa: E402
from bert_jax.configs import pretrain  # noqa: E402

LENGTH, PREDICTIONS = 64, 10


def build(workdir: pathlib.Path) -> tuple[str, str, int, float]:
    """-> (training dir, held-out dir, held-out instance count, held-out NotNext rate)."""
    tok = tokenization.Tokenizer(str(DATA / "vocab" / "bert-base-uncased-vocab.txt"))
    books = list(corpus.read_sentence_documents([str(DATA / "corpus" / "gutenberg-sentences.txt")],
                                                corpus.ReadStats()))
    options = procedure.InstanceOptions(max_seq_length=LENGTH, max_predictions_per_seq=PREDICTIONS)
    paths = {}
    for name, part in (("train", books[:-2]), ("heldout", books[-2:])):
        paths[name] = str(workdir / name)
        procedure.create_pretraining_data(part, tok, paths[name], options=options, dupe_factor=1, num_shards=1)
    labels = [int(x["next_sentence_labels"]) for x in procedure.iterate_instances(paths["heldout"])]
    return paths["train"], paths["heldout"], len(labels), sum(labels) / len(labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--eval_every", type=int, default=250)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        train_dir, heldout_dir, n_heldout, not_next = build(tmp)
        eval_batches = n_heldout // args.batch
        labels_seen = eval_batches * args.batch
        config = pretrain.get_config("tiny")
        config.phases = [pretrain.phase(LENGTH, PREDICTIONS, 1.0, train_dir, args.batch)]
        config.total_steps, config.log_every, config.checkpoint_every = args.steps, 50, args.steps
        config.mesh.num_devices = 1
        config.eval_data_dir, config.eval_every, config.eval_batches = heldout_dir, args.eval_every, eval_batches
        start = time.perf_counter()
        pretraining.train_and_evaluate(config, str(tmp / "run"))
        seconds = time.perf_counter() - start
        rows = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    majority = max(not_next, 1 - not_next)
    prior_entropy = -(not_next * math.log(not_next) + (1 - not_next) * math.log(1 - not_next))
    print(f"held-out: {n_heldout} instances from 2 books ({labels_seen} evaluated), NotNext {not_next:.3f}; "
          f"majority-label accuracy {majority:.3f}, label-prior loss {prior_entropy:.3f}; "
          f"{args.steps} steps of batch {args.batch} in {seconds:.0f} s")
    print(f"{'step':>6}{'NSP accuracy':>14}{'NSP loss':>10}{'MLM loss':>10}{'MLM accuracy':>14}")
    for row in rows:
        if row["prefix"] == "eval":
            print(f"{row['step']:>6}{row['nsp_accuracy']:>14.3f}{row['nsp_loss']:>10.3f}{row['mlm_loss']:>10.3f}"
                  f"{row['mlm_accuracy']:>14.3f}")


if __name__ == "__main__":
    main()
