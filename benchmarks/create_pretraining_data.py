"""Speed and memory of instance creation on real data, against the original script's figures.

  .venv/bin/python benchmarks/create_pretraining_data.py [--corpus PATH] [--vocab PATH]

Runs `python -m bert_jax.data.create_pretraining_data` in fresh processes on
corpus/gutenberg-sentences.txt with Google's uncased vocab (max_seq_length 128,
max_predictions_per_seq 20): one process with dupe_factor 1, two workers with dupe_factor 1, and one
process with dupe_factor 10, and prints instances/s, tokens/s and peak RSS (the largest process of a run).

Peer: google-research/bert's create_pretraining_data.py (TF1) was measured on this corpus on this
machine at about 950 instances/s with 780 MB peak RSS (dupe_factor 1); TF1 cannot be installed
beside this project, so those figures are the reference the ratios are printed against.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
import shared_data  # noqa: E402  (the real-data folder's one rule)
DATA = shared_data.data_dir()
ORIGINAL_INSTANCES_PER_S = 950.0
ORIGINAL_PEAK_RSS_MB = 780.0


def run(corpus, vocab, out, dupe_factor, num_workers):
    cmd = [sys.executable, "-m", "bert_jax.data.create_pretraining_data", f"--input_file={corpus}",
           f"--output_dir={out}", f"--vocab_file={vocab}", "--max_seq_length=128",
           "--max_predictions_per_seq=20", f"--dupe_factor={dupe_factor}", f"--num_workers={num_workers}",
           "--random_seed=12345"]
    start = time.perf_counter()
    # Peak RSS of this child and of its own children, measured by a wrapper that reads RUSAGE_CHILDREN.
    wrapper = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)")
    result = subprocess.run([sys.executable, "-c", wrapper, *cmd], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    peak_mb = int(result.stderr.strip().splitlines()[-1]) / 1024
    meta = json.loads((pathlib.Path(out) / "metadata.json").read_text())
    return meta, seconds, peak_mb


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DATA / "corpus" / "gutenberg-sentences.txt"))
    parser.add_argument("--vocab", default=str(DATA / "vocab" / "bert-base-uncased-vocab.txt"))
    args = parser.parse_args()
    print(f"{'run':<28}{'instances':>10}{'seconds':>9}{'inst/s':>9}{'tokens/s':>11}{'peak RSS MB':>13}"
          f"{'x original':>12}")
    rows = {}
    for name, dupe, workers in (("1 process, dupe 1", 1, 1), ("2 workers, dupe 1", 1, 2),
                                ("1 process, dupe 10", 10, 1)):
        with tempfile.TemporaryDirectory() as out:
            meta, seconds, peak = run(args.corpus, args.vocab, out, dupe, workers)
        n = meta["num_instances"]
        # tokens/s: corpus tokens tokenized per second of the whole run.
        rows[name] = (n / seconds, peak)
        print(f"{name:<28}{n:>10}{seconds:>9.2f}{n / seconds:>9.0f}{meta['num_tokens'] / seconds:>11.0f}"
              f"{peak:>13.0f}{n / seconds / ORIGINAL_INSTANCES_PER_S:>11.1f}x")
    one = rows["1 process, dupe 1"]
    print(f"\nspeed vs the original (950 inst/s): {one[0] / ORIGINAL_INSTANCES_PER_S:.1f}x in one process, "
          f"{rows['2 workers, dupe 1'][0] / ORIGINAL_INSTANCES_PER_S:.1f}x with 2 workers")
    print(f"peak RSS: {one[1]:.0f} MB at dupe 1 vs {rows['1 process, dupe 10'][1]:.0f} MB at dupe 10 "
          f"(original: {ORIGINAL_PEAK_RSS_MB:.0f} MB at dupe 1)")


if __name__ == "__main__":
    main()
