"""Statistics of the instances over seeds, in both short-target modes, against the original's band.

  .venv/bin/python benchmarks/instance_statistics.py [--seeds 6]

On corpus/gutenberg-sentences.txt with Google's uncased vocab (max_seq_length 128,
max_predictions_per_seq 20, dupe_factor 1). The original TF1 script, six seeds, measured here:
23638 to 29891 instances, IsNext 42.3% to 48.4%, 15.3% of non-special tokens masked, 80.1/10.0/10.0%
[MASK]/random/kept, 50% to 97% of instances full-length (its short target is drawn per document).
"""

import argparse
import os
import pathlib
import sys
import tempfile


ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import shared_data  # noqa: E402  (the real-data folder's one rule)
DATA = shared_data.data_dir()

from bert_jax.data import corpus, tokenization
from bert_jax.data.pretraining import procedure  # noqa: E402


def statistics(path, mask_id):
    n = nonspecial = masked = full = is_next = mask = kept = 0
    for x in procedure.iterate_instances(path):
        length = int(x["attention_mask"].sum())
        k = int(x["masked_lm_weights"].sum())
        at = x["input_ids"][x["masked_lm_positions"][:k]]
        labels = x["masked_lm_ids"][:k]
        n += 1
        nonspecial += length - 3
        masked += k
        full += length == 128
        is_next += int(x["next_sentence_labels"]) == 0
        mask += int((at == mask_id).sum())
        kept += int(((at == labels) & (at != mask_id)).sum())
    return dict(instances=n, is_next=is_next / n, full=full / n, masked=masked / nonspecial,
                mask=mask / masked, random=1 - (mask + kept) / masked, kept=kept / masked)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=6)
    args = parser.parse_args()
    tokenizer = tokenization.Tokenizer(str(DATA / "vocab" / "bert-base-uncased-vocab.txt"))
    text = str(DATA / "corpus" / "gutenberg-sentences.txt")
    print(f"{'mode':<14}{'seed':>6}{'instances':>11}{'IsNext':>8}{'full':>7}{'masked':>8}{'[MASK]':>8}"
          f"{'random':>8}{'kept':>7}")
    for per_document in (False, True):
        for seed in range(1, args.seeds + 1):
            with tempfile.TemporaryDirectory() as out:
                procedure.create_pretraining_data(
                    corpus.read_sentence_documents([text], corpus.ReadStats()), tokenizer, out,
                    options=procedure.InstanceOptions(short_seq_per_document=per_document),
                    dupe_factor=1, random_seed=seed)
                s = statistics(out, tokenizer.mask_id)
            mode = "per document" if per_document else "per instance"
            print(f"{mode:<14}{seed:>6}{s['instances']:>11}{s['is_next']:>8.1%}{s['full']:>7.0%}{s['masked']:>8.1%}"
                  f"{s['mask']:>8.1%}{s['random']:>8.1%}{s['kept']:>7.1%}")


if __name__ == "__main__":
    main()
