"""Sequence packing: padding per corpus and phase, packed against padded; useful tokens/s of the train step.

  .venv/bin/python benchmarks/packing.py [--workdir /tmp/packing] [--rounds 3] [--steps 3] [--padding_only]

1. Padding fraction (padded token slots / all token slots) over one pass of each corpus's instances,
   unpacked (one instance per row) and packed (`bert_jax.data.pretraining.packing`, default window and K), at the
   two phases of the paper (128 / 20 and 512 / 80), on three shared corpora: Gutenberg (book-length
   documents), WikiText-2 (articles) and the SQuAD train subset's paragraphs taken as documents (short
   Wikipedia text). Instances: create_pretraining_data with Google's uncased vocabulary, dupe_factor 1,
   seed 12345 (cached under --workdir). Bar: packed <= 5% at 128 and 512. Then the same corpora as
   tokenized documents, one epoch of dynamic instances: padded, packed, and packed with the rows' free
   room filled (`dynamic.FillRows`), with the fillers' share of the instances.
2. The input pipeline per process (reading, decoding, drawing instances, packing; the training process's
   threads, and for dynamic packed data also 1 and 2 grain worker processes drawing): rows/s and
   instances/s, start-up included, over 100 batches of 64 (dynamic: three windows of the instance
   shuffle, 768 batches), of static and dynamic instances (`bert_jax.data.pretraining.dynamic`, from
   the corpus tokenized once), unpacked and packed, against what one host of a v4-32 pod (4 hosts, global batch
   256) must feed at the roofline step time of `python -m bert_jax.aot` for Base (--roofline_ms: phase 1,
   phase 2 packed; float32).
3. Speed: the mini model's train step (4 layers, hidden 256; float32, one device = both cores), rows of
   the SQuAD-paragraph corpus, padded against packed, same batch size in rows: useful (non-padding)
   tokens per second, in alternating windows (medians; ratio = median of the per-window ratios). Phase 2
   (512, batch 8) is the bar (>= 2.5x: a packed row there carries about 3.5x the real tokens of a padded
   one); phase 1 (128, batch 32) is also timed.
"""

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from bert_jax.training import pretraining, sharding, steps
from bert_jax.experiments import transfer  # noqa: E402
from bert_jax.data import corpus, tokenization
from bert_jax.data.pretraining import document_shards, dynamic, formats, loader, packing, procedure  # noqa: E402
from bert_jax.configs import pretrain  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from shared_data import DATA  # noqa: E402
import shared_data  # noqa: E402
CORPORA = ("gutenberg", "wikitext", "squad")
PHASES = ((128, 20, 32), (512, 80, 8))  # length, predictions, batch rows of the speed test


def instances(workdir: pathlib.Path, name: str, length: int, predictions: int) -> str:
    out = workdir / f"{name}-{length}"
    if not (out / formats.METADATA_NAME).is_file():
        _, reader, files = shared_data.sources([name], DATA)[0]
        tok = tokenization.Tokenizer(str(DATA / "vocab" / "bert-base-uncased-vocab.txt"))
        procedure.create_pretraining_data(
            transfer.read_documents(reader, files, corpus.ReadStats()), tok, str(out),
            options=procedure.InstanceOptions(max_seq_length=length, max_predictions_per_seq=predictions),
            dupe_factor=1, num_shards=1)
    return str(out)


def documents(workdir: pathlib.Path, name: str) -> str:
    out = workdir / f"{name}-documents"
    if not (out / formats.METADATA_NAME).is_file():
        _, reader, files = shared_data.sources([name], DATA)[0]
        tok = tokenization.Tokenizer(str(DATA / "vocab" / "bert-base-uncased-vocab.txt"))
        document_shards.tokenize_documents(transfer.read_documents(reader, files, corpus.ReadStats()), tok, str(out))
    return str(out)


def pipeline_rate(path: str, packed: bool, length: int, predictions: int, batches: int = 100, batch_size: int = 64,
                  workers: int = 0):
    """(rows/s, instances/s) over `batches` batches of a fresh iterator with `workers` grain worker
    processes (start-up included)."""
    start = time.perf_counter()
    it = loader.make_pretraining_iterator(path, global_batch_size=batch_size, seed=0, process_index=0,
                                            process_count=1, packing=packed, max_seq_length=length,
                                            max_predictions_per_seq=predictions, worker_count=workers)
    count = 0
    for _ in range(batches):
        batch = next(it)
        count += int(batch["next_sentence_weights"].sum()) if packed else batch_size
    seconds = time.perf_counter() - start
    it.close()
    return batches * batch_size / seconds, count / seconds


def one_pass(path: str, packed: bool, batch_size: int = 64, **kw):
    """(padding fraction, rows, instances, seconds) over one shuffled pass (of the instances, or of the
    documents: kw gives the length, predictions and fill_rows for tokenized documents)."""
    it = loader.make_pretraining_iterator(path, global_batch_size=batch_size, seed=0, num_epochs=1,
                                            process_index=0, process_count=1, packing=packed, **kw)
    real = slots = rows = count = 0
    start = time.perf_counter()
    for batch in it:
        real += int(batch["attention_mask"].sum())
        slots += batch["attention_mask"].size
        rows += len(batch["attention_mask"])
        count += int(batch["next_sentence_weights"].sum()) if packed else len(batch["attention_mask"])
    return 1.0 - real / slots, rows, count, time.perf_counter() - start


def speed(path: str, length: int, batch_size: int, rounds: int, num_steps: int):
    """Per window: useful tokens/s padded and packed (the mini train step, one device)."""
    config = pretrain.get_config("mini")
    config.model.vocab_size = 30522
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model = pretraining.create_model(config)
    tx, schedule = steps.create_optimizer(config)
    _, shardings = steps.state_shardings(pretraining.state_init(model, tx, 0), mesh)
    step_fn, _ = pretraining.compile_steps(model, tx, schedule, mesh, shardings)
    sides = {}
    for packed in (False, True):
        it = loader.make_pretraining_iterator(path, global_batch_size=batch_size, seed=0, process_index=0,
                                                process_count=1, packing=packed)
        batches = [next(it) for _ in range(num_steps)]
        it.close()
        with jax.set_mesh(mesh):
            device = [pretraining.global_batch(b, mesh) for b in batches]
            state, _ = pretraining.create_train_state(model, tx, mesh, 0)
            state, _ = step_fn(state, device[0])  # compile
            jax.block_until_ready(state)
        sides[packed] = {"state": state, "batches": device,
                         "tokens": sum(int(b["attention_mask"].sum()) for b in batches)}
    windows = []
    for _ in range(rounds):
        rates = {}
        for packed, side in sides.items():
            with jax.set_mesh(mesh):
                start = time.perf_counter()
                state = side["state"]
                for b in side["batches"]:
                    state, _ = step_fn(state, b)
                jax.block_until_ready(state)
                side["state"] = state
            rates[packed] = side["tokens"] / (time.perf_counter() - start)
        windows.append(rates)
    padded = statistics.median(w[False] for w in windows)
    packed = statistics.median(w[True] for w in windows)
    ratio = statistics.median(w[True] / w[False] for w in windows)
    return padded, packed, ratio


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/bert_jax_packing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--roofline_ms", default="28.0,82.7",
                        help="Base train step on v4-32 at the AOT roofline, phase 1 and phase 2 packed (ms)")
    parser.add_argument("--skip_speed", action="store_true")
    parser.add_argument("--padding_only", action="store_true", help="only part 1, the padding fractions")
    args = parser.parse_args()
    workdir = pathlib.Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    print("padding fraction (padded slots / all slots), one pass, unpacked -> packed "
          f"(K = {packing.default_max_instances(128)} at 128, {packing.default_max_instances(512)} at 512; "
          f"window {packing.DEFAULT_PACKING_BINS} rows):", flush=True)
    for name in CORPORA:
        for length, predictions, _ in PHASES:
            path = instances(workdir, name, length, predictions)
            pad, rows, n, _ = one_pass(path, False)
            ppad, prows, pn, seconds = one_pass(path, True)
            print(f"  {name:9s} {length:3d}: {pad:6.1%} -> {ppad:5.1%}  ({rows} rows -> {prows}; "
                  f"{pn / prows:.2f} instances per packed row; pipeline {prows / seconds:.0f} rows/s, "
                  f"{pn / seconds:.0f} instances/s)", flush=True)
    print("dynamic instances (tokenized documents, one epoch of documents), padded -> packed -> packed with the "
          f"free room filled (dynamic.FillRows, rows with >= {dynamic.FillRows.MIN_FILL} free tokens):", flush=True)
    for name in CORPORA:
        path = documents(workdir, name)
        for length, predictions, _ in PHASES:
            kw = dict(max_seq_length=length, max_predictions_per_seq=predictions)
            pad, rows, n, _ = one_pass(path, False, **kw)
            ppad, prows, pn, _ = one_pass(path, True, fill_rows=False, **kw)
            fpad, frows, fn, _ = one_pass(path, True, **kw)
            print(f"  {name:9s} {length:3d}: {pad:6.1%} -> {ppad:5.1%} -> {fpad:5.1%}  (instances per packed row "
                  f"{pn / prows:.2f} -> {fn / frows:.2f}: fillers {(fn - pn) / fn:.1%} of the "
                  f"instances)", flush=True)

    if args.padding_only:
        return
    need = [64 / (float(ms) / 1e3) for ms in args.roofline_ms.split(",")]
    print(f"input pipeline, one process (a v4-32 host needs {need[0]:.0f} rows/s in phase 1 and {need[1]:.0f} in "
          f"phase 2 at the roofline step times {args.roofline_ms} ms):", flush=True)
    for length, predictions, _ in PHASES:
        for name in ("gutenberg", "squad"):
            for kind, path in (("static", instances(workdir, name, length, predictions)),
                               ("dynamic", documents(workdir, name))):
                for packed in (False, True):
                    for workers in (0, 1, 2) if kind == "dynamic" and packed else (0,):
                        # dynamic: three windows of the instance shuffle (it draws a whole window at a time)
                        batches = 3 * dynamic.DEFAULT_SHUFFLE_WINDOW // 64 if kind == "dynamic" else 100
                        rows, inst = pipeline_rate(path, packed, length, predictions, batches, workers=workers)
                        print(f"  {length:3d} {name:9s} {kind:7s} {'packed' if packed else 'padded'}"
                              f"{f' {workers} grain worker(s)' if workers else ''}: {rows:6.0f} rows/s, "
                              f"{inst:6.0f} instances/s", flush=True)
    if args.skip_speed:
        return
    print(f"useful tokens/s of the mini train step, SQuAD paragraphs, padded vs packed "
          f"({args.rounds} windows of {args.steps} steps):", flush=True)
    for length, predictions, batch_size in PHASES:
        padded, packed_rate, ratio = speed(instances(workdir, "squad", length, predictions), length, batch_size,
                                           args.rounds, args.steps)
        print(f"  phase {length} (batch {batch_size}): padded {padded:.0f}, packed {packed_rate:.0f} tokens/s: "
              f"{ratio:.2f}x", flush=True)


if __name__ == "__main__":
    main()
