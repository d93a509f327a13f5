"""Preparation on Apache Beam's DirectRunner against the local path, on the same corpus: tokens/s and the ratio.

  .venv/bin/python benchmarks/beam_prep.py [--corpus PATH] [--vocab PATH] [--files 4]

Splits the corpus (default corpus/gutenberg-sentences.txt, Google's uncased vocab) at document boundaries into
--files files (the Beam path reads each file in one worker), then runs `python -m
bert_jax.data.create_pretraining_data` in fresh processes: tokenized documents (--tokenize_only) and static
instances (128 / 20, dupe_factor 1), each by the local path (one process; two workers) and by Beam's
DirectRunner with two worker processes (multi_processing). tokens/s = the corpus's tokens over the seconds the
command reports (its work, not the interpreter's start); every Beam output is checked byte-equal to the local
one. Needs the `beam` extra.
"""

import argparse
import filecmp
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
import shared_data  # noqa: E402  (the real-data folder's one rule)
DATA = shared_data.data_dir()
BEAM = ["--runner=DirectRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def split(corpus: str, parts: int, out: pathlib.Path) -> str:
    """The corpus's documents (blank-line separated) dealt into `parts` files of about equal size -> their glob."""
    documents = pathlib.Path(corpus).read_bytes().split(b"\n\n")
    size, target, index, chunk = 0, sum(map(len, documents)) / parts, 0, []
    for document in documents:
        chunk.append(document)
        size += len(document)
        if size >= target * (index + 1) and index < parts - 1:
            (out / f"part-{index:02d}.txt").write_bytes(b"\n\n".join(chunk) + b"\n")
            index, chunk = index + 1, []
    (out / f"part-{index:02d}.txt").write_bytes(b"\n\n".join(chunk) + b"\n")
    return str(out / "part-*.txt")


def run(args: list[str], out: pathlib.Path) -> dict:
    result = subprocess.run([sys.executable, "-m", "bert_jax.data.create_pretraining_data", *args,
                             f"--output_dir={out}"], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    return json.loads((out / "metadata.json").read_text())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DATA / "corpus" / "gutenberg-sentences.txt"))
    parser.add_argument("--vocab", default=str(DATA / "vocab" / "bert-base-uncased-vocab.txt"))
    parser.add_argument("--files", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "corpus").mkdir()
        common = [f"--input_file={split(args.corpus, args.files, tmp / 'corpus')}", f"--vocab_file={args.vocab}",
                  "--num_shards=8"]
        static = ["--max_seq_length=128", "--max_predictions_per_seq=20", "--dupe_factor=1"]  # not --tokenize_only's
        print(f"{'output':<12}{'run':<30}{'tokens':>10}{'seconds':>9}{'tokens/s':>11}{'x local':>9}")
        for kind, flags in (("documents", ["--tokenize_only"]), ("instances", static)):
            local_seconds = None
            for name, extra in (("local, 1 process", ["--num_workers=1"]), ("local, 2 workers", ["--num_workers=2"]),
                                ("Beam DirectRunner, 2 workers", BEAM)):
                out = tmp / f"{kind}-{name.split(',')[0].split()[0]}-{len(extra)}"
                meta = run(common + flags + extra, out)
                local_seconds = local_seconds or meta["seconds"]
                print(f"{kind:<12}{name:<30}{meta['num_tokens']:>10,}{meta['seconds']:>9.2f}"
                      f"{meta['num_tokens'] / meta['seconds']:>11,.0f}{local_seconds / meta['seconds']:>9.2f}")
            local, beam = tmp / f"{kind}-local-1", tmp / f"{kind}-Beam-3"
            same = all(filecmp.cmp(local / f, beam / f, shallow=False) for f in meta["shards"])
            print(f"{'':<12}Beam's shards byte-equal to the local path's: {same}")


if __name__ == "__main__":
    main()
