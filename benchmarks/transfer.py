"""Transfer: bert_jax pre-training from scratch on the shared corpora, then fine-tuning from it and
from random initialisation with identical recipes, vocabularies and architectures.

  .venv/bin/python benchmarks/transfer.py --workdir /tmp/transfer [--recipe transfer] [--seeds 3]
      [--probes sst2_2k,sst2,mrpc,squad] [--curve_probe sst2_2k] [--peer]

Stages (bert_jax.experiments.transfer):
  1. corpus: `--sources` (default Gutenberg, WikiText-2, and the unlabelled training text of SQuAD,
     SST-2 and MRPC: in-domain text; dev text never), original format;
  2. a WordPiece vocabulary of `--vocab_size` on it (or `--vocab_file`), instances for both phases of the
     recipe (`--dynamic`: the corpus tokenized once, instances drawn while training);
  3. pre-training with `bert_jax/configs/pretrain.py:<recipe>` (both phases, one CPU device), checkpoints at the
     curve points; wall time, steps and tokens (non-padding) recorded;
  4. the transfer-versus-step curve: `--curve_probe` fine-tuned from each checkpoint (seed 0) beside
     random init, with the MLM / NSP accuracy at that step and the frozen features' linear probe
     (`feature_probe`: logistic regression on the last layer's [CLS] and mean vectors, SST-2 2000 -> dev);
  5. the table: every probe from the final checkpoint and from random init, `--seeds` seeds each:
     mean +- sd, gain, gain in pooled sd (bar: > 3 on sst2_2k and squad);
  6. `--peer`: transformers' BertForPreTraining pre-trained on the same instances with the same recipe
     (benchmarks/peer_pretraining.py), fine-tuned through the same bert_jax jobs (from its Hugging
     Face export), beside bert_jax's.
Writes results.json under the workdir (every fine-tuning run's metrics are cached beside it in
finetune/); prints the curve and the table. Re-running with the same
workdir reuses finished stages (the pre-training run resumes from its checkpoints).
"""

import argparse
import json
import os
import pathlib
import shutil
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import shared_data  # noqa: E402
from shared_data import DATA  # noqa: E402
DEFAULT_SOURCES = "gutenberg,wikitext,squad,sst2,mrpc"


def _cached(path, compute):
    """JSON result at `path`, computed (and written atomically, `storage.write_json`) when missing."""
    from bert_jax import storage

    if os.path.isfile(path):
        return storage.read_json(path)
    value = compute()
    storage.write_json(path, value)
    return value


def pretraining_budget(config, seconds, sample_batches=20):
    """Steps, sequences (instances: a packed row holds several), non-padding tokens and wall time of a
    finished run; the per-row means come from the first `sample_batches` batches each phase's own
    iterator gives (`pretraining.iterator`: static or dynamic, packed or not)."""
    import itertools

    from bert_jax.training import pretraining

    sequences = tokens = 0
    for p in pretraining.resolve_phases(config):
        it = pretraining.iterator(p, config, None)
        batches = list(itertools.islice(it, sample_batches))
        it.close()
        rows = sum(len(b["input_ids"]) for b in batches)
        instances = sum(float(b["next_sentence_weights"].sum()) if "next_sentence_weights" in b
                        else len(b["input_ids"]) for b in batches)
        real = sum(float(b["attention_mask"].sum()) for b in batches)
        n = (p.end - p.start) * p.batch_size  # rows trained on in this phase
        sequences += n * instances / rows
        tokens += n * real / rows
    return {"steps": config.total_steps, "sequences": int(sequences), "tokens": int(tokens), "seconds": seconds}


def set_fields(config, assignments):
    """Applies `FIELD=VALUE` overrides (dotted paths, Python literals or strings) to `config`.

    Raises:
      ValueError: an assignment without "=", or a field the config does not have.
    """
    import ast

    for assignment in assignments:
        field, sep, text = assignment.partition("=")
        if not sep:
            raise ValueError(f"--set {assignment!r} is not FIELD=VALUE")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        *parents, leaf = field.split(".")
        node = config
        for name in parents:
            if isinstance(node, (list, tuple)):
                node = node[int(name)] if name.isdigit() and int(name) < len(node) else None
            else:
                node = node.get(name) if hasattr(node, "get") else None
        if node is None or leaf not in node:
            raise ValueError(f"--set {assignment!r}: the recipe has no field {field!r}")
        node[leaf] = type(node[leaf])(value) if isinstance(node[leaf], float) and isinstance(value, int) else value


def feature_probe(init_checkpoint, vocab_file, model, train_examples=2000, max_seq_length=64):
    """The paper's feature-based use (section 5.3) as a diagnostic: the frozen encoder's last layer on
    SST-2 (its first `train_examples` training sentences -> all dev sentences), a logistic regression
    (scikit-learn, standardised features, C by 5-fold cross-validation) on the [CLS] vector and on the
    mean over the tokens -> dev accuracy (percent) of each. `init_checkpoint` "" is the random-init
    network of `model`: a random encoder keeps each word's identity, so pre-training has to beat that."""
    import numpy as np
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from bert_jax.tasks import extract_features
    from bert_jax.checkpoints import sources
    from bert_jax.model import modeling
    from bert_jax.data import glue
    from bert_jax.data.tokenization import Tokenizer

    tokenizer = Tokenizer(vocab_file)
    folder = DATA / "glue" / "SST-2"
    splits = {"train": glue.read_glue_tsv("sst2", str(folder / "train.tsv"))[:train_examples],
              "dev": glue.read_glue_tsv("sst2", str(folder / "dev.tsv"))}
    init = (sources.Initialisation("random", "", modeling.BertConfig.from_dict(model)) if not init_checkpoint
            else None)
    features, labels = {}, {}
    for split, examples in splits.items():
        feats = extract_features.convert_examples([extract_features.Example(e.text_a) for e in examples],
                                                  tokenizer, max_seq_length)
        values = list(extract_features.extract(init_checkpoint, feats, "-1", init=init, batch_size=128,
                                                max_seq_length=max_seq_length))  # each [tokens, 1, D]
        features[split] = {"cls": np.stack([v[0, 0] for v in values]),
                           "mean": np.stack([v[:, 0].mean(0) for v in values])}
        labels[split] = np.array([e.label for e in examples])
    out = {}
    for kind in ("cls", "mean"):
        classifier = make_pipeline(StandardScaler(), LogisticRegressionCV(Cs=8, cv=5, max_iter=3000))
        classifier.fit(features["train"][kind], labels["train"])
        out[kind] = 100.0 * classifier.score(features["dev"][kind], labels["dev"])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--recipe", default="transfer", help="bert_jax/configs/pretrain.py config name")
    parser.add_argument("--sources", default=DEFAULT_SOURCES)
    parser.add_argument("--vocab_size", type=int, default=8000, help="WordPieces trained on the corpus")
    parser.add_argument("--vocab_file", default="",
                        help="use this vocabulary instead of training one, e.g. Google's bert-base-uncased-vocab.txt "
                             "(the shared data's vocab/)")
    parser.add_argument("--dynamic", action="store_true",
                        help="tokenized documents, instances and masks drawn while training (a fresh draw each "
                             "epoch) instead of --dupe_factor static copies")
    parser.add_argument("--dupe_factor", type=int, default=5)
    parser.add_argument("--total_steps", type=int, default=0, help="override the recipe's total_steps")
    parser.add_argument("--curve_points", type=int, default=6, help="checkpoints along the run for the curve")
    parser.add_argument("--curve_probe", default="sst2_2k")
    parser.add_argument("--probes", default="sst2_2k,sst2,mrpc,squad")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--learning_rates", default="",
                        help="comma-separated: each init takes its best of these on dev (seed 0) before the seeds, "
                             "as the paper picks the fine-tuning learning rate (appendix A.3); empty: the probe's own")
    parser.add_argument("--peer", action="store_true", help="also pre-train and fine-tune the transformers peer")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a recipe field (repeatable), e.g. --set model.hidden_dropout_prob=0.0; "
                             "the value is a Python literal, else a string")
    args = parser.parse_args()

    from bert_jax.experiments import transfer
    from bert_jax import storage
    from bert_jax.training import pretraining, summaries
    from bert_jax.data.tokenization import Tokenizer
    from bert_jax.data.vocab import train_vocab
    from bert_jax.configs import pretrain

    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    corpus_file, vocab_file = os.path.join(workdir, "corpus.txt"), os.path.join(workdir, "vocab.txt")
    sources = args.sources.split(",")
    corpus_counts = _cached(os.path.join(workdir, "corpus.json"),
                            lambda: transfer.write_corpus(shared_data.sources(sources, DATA), corpus_file))
    print(f"corpus: {corpus_counts}", flush=True)
    if not os.path.isfile(vocab_file):
        if args.vocab_file:
            shutil.copyfile(args.vocab_file, vocab_file)
        else:
            train_vocab([corpus_file], args.vocab_size, vocab_file)
    config = pretrain.get_config(args.recipe)
    config.model.vocab_size = Tokenizer(vocab_file).vocab_size
    if args.total_steps:
        config.total_steps = args.total_steps
    set_fields(config, args.set)
    for p in config.phases:
        p.data_dir = os.path.join(workdir, "documents" if args.dynamic else f"instances-{p.max_seq_length}")
    config.mesh.data = 1
    curve_steps = sorted({round(config.total_steps * (k + 1) / args.curve_points) for k in range(args.curve_points)})
    config.checkpoint_every = curve_steps[0]
    config.keep_checkpoints = len(curve_steps) + len(config.phases) + 1
    _cached(os.path.join(workdir, "instances.json"),
            lambda: transfer.prepare_pretraining_data(config, corpus_file, vocab_file, dupe_factor=args.dupe_factor,
                                                        num_workers=2, dynamic=args.dynamic))
    run_dir = os.path.join(workdir, "pretrain")

    def pretrain_run():
        start = time.perf_counter()
        stopped = pretraining.train_and_evaluate(config, run_dir)
        if stopped["step"] < config.total_steps:  # SIGTERM: checkpoint saved, run not finished; nothing cached
            sys.exit(f"pre-training stopped at step {stopped['step']} of {config.total_steps} (SIGTERM): "
                     f"re-run the same command to resume from {run_dir}")
        return pretraining_budget(config, time.perf_counter() - start)

    budget = _cached(os.path.join(workdir, "pretrain.json"), pretrain_run)
    print(f"pre-training: {budget}", flush=True)
    records = summaries.read_metrics(run_dir)
    results = {"recipe": args.recipe, "vocab": args.vocab_file or f"trained, {args.vocab_size}",
               "dynamic": args.dynamic, "sources": corpus_counts, "budget": budget,
               "config": json.loads(config.to_json())}
    finetune_dir = os.path.join(workdir, "finetune")
    os.makedirs(finetune_dir, exist_ok=True)
    # Fine-tuning runs with the paper's dropout whatever pre-training used (the random-init network too).
    finetune_model = transfer.finetune_model(config.model)

    def score(probe, init, seed, tag, learning_rate=None):
        lr = {} if learning_rate is None else {"learning_rate": learning_rate}
        name = f"{tag}-{probe}-{seed}" + (f"-lr{learning_rate:g}" if lr else "")

        def compute():
            m = transfer.finetune(probe, os.path.join(finetune_dir, name), init_checkpoint=init,
                                    vocab_file=vocab_file, model=finetune_model, seed=seed,
                                    **shared_data.task_files(transfer.PROBES[probe].task, DATA), **lr)
            return {k: v for k, v in m.items() if isinstance(v, (int, float, str))}
        m = _cached(os.path.join(finetune_dir, f"{name}.json"), compute)
        print(f"  {probe} {tag} seed {seed}{' lr %g' % learning_rate if lr else ''}: {m['score']:.2f}", flush=True)
        return m["score"]

    def best_lr(probe, init, tag):
        """The best of --learning_rates on dev with seed 0 (None: the probe's own learning rate)."""
        if not args.learning_rates:
            return None
        scores = {lr: score(probe, init, 0, tag, lr) for lr in map(float, args.learning_rates.split(","))}
        return max(scores, key=scores.get)

    # the transfer-versus-step curve, with the frozen features' linear probe beside each fine-tuning score
    def features(init, tag):
        return _cached(os.path.join(finetune_dir, f"{tag}-features.json"),
                       lambda: feature_probe(init, vocab_file, finetune_model.to_dict()))

    curve = []
    random_curve = score(args.curve_probe, "", 0, "random")
    random_features = features("", "random")
    for step in curve_steps:
        near = min(records, key=lambda r: abs(r["step"] - step))
        checkpoint = os.path.join(run_dir, "checkpoints", str(step))
        curve.append({"step": step, "score": score(args.curve_probe, checkpoint, 0, f"step{step}"),
                      "features": features(checkpoint, f"step{step}"),
                      "mlm_accuracy": near["mlm_accuracy"], "nsp_accuracy": near["nsp_accuracy"]})
    results["curve"] = {"probe": args.curve_probe, "random": random_curve, "random_features": random_features,
                        "points": curve}

    peer_dir = os.path.join(workdir, "peer")
    if args.peer:  # the same instances and recipe through transformers' BertForPreTraining
        import peer_pretraining

        peer_budget = _cached(os.path.join(workdir, "peer.json"), lambda: peer_pretraining.pretrain_peer(
            config, peer_dir, vocab_file, export_steps=curve_steps))
        peer_records = {r["step"]: r for r in summaries.read_metrics(peer_dir)}
        for point in curve:
            near = peer_records[min(peer_records, key=lambda s: abs(s - point["step"]))]
            point.update(peer_score=score(args.curve_probe, os.path.join(peer_dir, f"hf-{point['step']}"), 0,
                                          f"peer-step{point['step']}"),
                         peer_mlm_accuracy=near["mlm_accuracy"], peer_nsp_accuracy=near["nsp_accuracy"])
        results["peer_budget"] = peer_budget

    # the table
    table = {}
    for probe in args.probes.split(","):
        lr_pre, lr_rnd = best_lr(probe, run_dir, "pretrained"), best_lr(probe, "", "random")
        pre = [score(probe, run_dir, s, "pretrained", lr_pre) for s in range(args.seeds)]
        rnd = [score(probe, "", s, "random", lr_rnd) for s in range(args.seeds)]
        table[probe] = dict(transfer.summarize(pre, rnd), pretrained=pre, random=rnd,
                            learning_rates={"pretrained": lr_pre, "random": lr_rnd})
        if args.peer:
            lr_peer = best_lr(probe, os.path.join(peer_dir, "hf"), "peer")
            peer = [score(probe, os.path.join(peer_dir, "hf"), s, "peer", lr_peer) for s in range(args.seeds)]
            table[f"{probe} (peer)"] = dict(transfer.summarize(peer, rnd), pretrained=peer, random=rnd,
                                            learning_rates={"pretrained": lr_peer, "random": lr_rnd})
    results["table"] = table
    storage.write_json(os.path.join(workdir, "results.json"), results)
    print_table(results)


def print_table(results):
    b = results["budget"]
    print(f"\npre-training: {b['steps']} steps, {b['sequences']} sequences, {b['tokens'] / 1e6:.1f} M tokens, "
          f"{b['seconds'] / 60:.1f} min")
    print(f"curve ({results['curve']['probe']}, seed 0; random init {results['curve']['random']:.2f}):")
    if "random_features" in results["curve"]:
        f = results["curve"]["random_features"]
        print(f"  frozen features, logistic regression on SST-2 2000 -> dev: random init [CLS] {f['cls']:.2f}, "
              f"mean {f['mean']:.2f}")
    for p in results["curve"]["points"]:
        peer = (f"; peer {p['peer_score']:.2f} (MLM acc {p['peer_mlm_accuracy']:.3f}, NSP acc "
                f"{p['peer_nsp_accuracy']:.3f})") if "peer_score" in p else ""
        frozen = f"; frozen [CLS] {p['features']['cls']:.2f}, mean {p['features']['mean']:.2f}" if "features" in p else ""
        print(f"  step {p['step']:6d}: {p['score']:.2f}  (MLM acc {p['mlm_accuracy']:.3f}, NSP acc "
              f"{p['nsp_accuracy']:.3f}{frozen}){peer}")
    print("\n| probe | pre-trained | random init | gain | gain / pooled sd |\n|---|---|---|---|---|")
    for probe, t in results["table"].items():
        print(f"| {probe} | {t['pretrained_mean']:.2f} ± {t['pretrained_sd']:.2f} | {t['random_mean']:.2f} ± "
              f"{t['random_sd']:.2f} | {t['gain']:+.2f} | {t['gain_in_pooled_sd']:.1f} |")


if __name__ == "__main__":
    main()
