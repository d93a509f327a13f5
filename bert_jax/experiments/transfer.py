"""Transfer experiments: pre-train from scratch, then fine-tune from the checkpoint and from random
initialisation with one recipe, and compare (paper section 5.1: pre-training must beat no
pre-training). `make demo` (`bert_jax.demo`) and `benchmarks/transfer.py` are built from these calls.

  corpus   `write_corpus([(name, reader, files), ...], path)`: corpora (files read with one of `READERS`)
           and the unlabelled text of task *training* files (in-domain text, as task-adaptive
           pre-training; never dev text), in the original one-sentence-per-line format;
  data     `prepare_pretraining_data(config, corpus_file, vocab_file)`: instances (or tokenized documents)
           for every phase;
  probes   `PROBES`: fine-tuning recipes (task, data, length, epochs, learning rate) that are run
           unchanged from a pre-trained encoder and from random init;
  compare  `finetune(probe, ...)` per init and seed, `summarize` -> mean, sd, and the gain in pooled
           standard deviations.

Errors: `ValueError` naming the source, probe or file that is wrong (unknown names, missing data).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from typing import Any, Iterator, Mapping, Sequence

import ml_collections

# ----------------------------------------------------------------------------- corpus

READERS = ("pydoc", "sentences", "text", "wikitext", "squad", "glue:sst2", "glue:mrpc")


def pydoc_documents() -> Iterator[list[str]]:
    """CPython's bundled documentation text (`pydoc_data.topics`, on every Python installation): one
    topic = one document, paragraphs split into sentences."""
    from pydoc_data import topics

    from bert_jax.data.corpus import split_sentences

    for name in sorted(topics.topics):
        sentences = [s for p in topics.topics[name].split("\n\n") for s in split_sentences(" ".join(p.split()))]
        if sentences:
            yield sentences


def read_documents(reader: str, files: Sequence[str], stats) -> Iterator[list[str]]:
    """The documents of `files` read with one of `READERS` ("pydoc" reads no file).

    Raises:
      ValueError: unknown reader, or a file that does not exist.
    """
    from bert_jax.data import corpus

    if reader not in READERS:
        raise ValueError(f"corpus reader {reader!r} is not one of {READERS}")
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise ValueError(f"corpus file {missing[0]} does not exist")
    if reader == "pydoc":
        yield from pydoc_documents()
    elif reader.startswith("glue:"):
        yield from corpus.read_glue_documents(files, reader.split(":")[1], stats)
    else:
        yield from {"sentences": corpus.read_sentence_documents, "text": corpus.read_text_documents,
                    "wikitext": corpus.read_wikitext_documents, "squad": corpus.read_squad_documents}[reader](
            files, stats)


def write_corpus(sources: Sequence[tuple[str, str, Sequence[str]]], path: str) -> dict[str, dict[str, int]]:
    """Writes the documents of `sources`, each (name, reader, files), in order to `path` in the original
    format (temporary name, then renamed) -> {name: {"documents": n, "sentences": n}}.

    Raises:
      ValueError: as `read_documents`, or no source given.
    """
    from bert_jax.data import corpus

    if not sources:
        raise ValueError("no corpus source given")
    counts: dict[str, dict[str, int]] = {}

    def documents():
        for name, reader, files in sources:
            stats = corpus.ReadStats()
            counts[name] = {"documents": 0, "sentences": 0}
            for document in read_documents(reader, files, stats):
                counts[name]["documents"] += 1
                counts[name]["sentences"] += len(document)
                yield document

    corpus.write_sentence_documents(documents(), path)
    return counts


def prepare_pretraining_data(config: ml_collections.ConfigDict, corpus_file: str, vocab_file: str, *,
                             dupe_factor: int, num_workers: int = 1, num_shards: int = 2,
                             dynamic: bool = False) -> list[dict]:
    """Pre-training data for every phase of `config` in its `phases[i].data_dir` -> the metadata of each phase.

    Static (default): instances by the original procedure (`bert_jax.data.pretraining.procedure.create_pretraining_data`;
    `dupe_factor` masked copies, seed 12345 + phase index). dynamic: the corpus tokenized once
    (`bert_jax.data.pretraining.document_shards.tokenize_documents`) into each distinct data_dir (phases may share one), instances
    and masks drawn while training with the phase's length (dupe_factor unused).

    Raises:
      ValueError: a phase with fewer static instances than its batch (names the corpus and the length).
    """
    from bert_jax.data import corpus, tokenization
    from bert_jax.data.pretraining import document_shards, procedure

    tokenizer = tokenization.Tokenizer(vocab_file)
    metas, written = [], {}
    for i, p in enumerate(config.phases):
        read_stats = corpus.ReadStats()
        documents = corpus.read_sentence_documents([corpus_file], read_stats)
        if dynamic:
            if p.data_dir not in written:
                written[p.data_dir] = document_shards.tokenize_documents(documents, tokenizer, p.data_dir,
                                                                      read_stats=read_stats)
            metas.append(written[p.data_dir])
            continue
        meta = procedure.create_pretraining_data(
            documents, tokenizer, p.data_dir,
            options=procedure.InstanceOptions(max_seq_length=p.max_seq_length,
                                                max_predictions_per_seq=p.max_predictions_per_seq),
            dupe_factor=dupe_factor, num_shards=num_shards, num_workers=num_workers, random_seed=12345 + i,
            read_stats=read_stats)
        if meta["num_instances"] < p.batch_size:
            raise ValueError(f"corpus {corpus_file}: only {meta['num_instances']} length-{p.max_seq_length} "
                             f"instances, fewer than a batch of {p.batch_size}; use a larger corpus")
        metas.append(meta)
    return metas


# ----------------------------------------------------------------------------- fine-tuning probes


@dataclasses.dataclass(frozen=True)
class Probe:
    """A fine-tuning recipe run unchanged from every initialisation.

    Attributes:
      task: "sst2" | "mrpc" (GLUE job, dev accuracy) or "squad" (SQuAD v1.1 job, dev F1).
      metric: the metrics.json key compared (percent).
      overrides: config fields set on top of bert_jax/configs/glue.py:<task> or bert_jax/configs/squad.py.
    """

    task: str
    metric: str
    overrides: Mapping[str, Any]


PROBES = {
    # SST-2 on its first 2000 training sentences, all 872 dev sentences: quick and sensitive.
    "sst2_2k": Probe("sst2", "accuracy", dict(max_train_examples=2000, max_seq_length=64, num_train_epochs=5.0,
                                              learning_rate=3e-4, train_batch_size=32)),
    # SST-2, all 67349 training sentences, one epoch.
    "sst2": Probe("sst2", "accuracy", dict(max_seq_length=64, num_train_epochs=1.0, learning_rate=3e-4,
                                           train_batch_size=32)),
    # MRPC, all 3668 training pairs, the paper's 3 epochs.
    "mrpc": Probe("mrpc", "accuracy", dict(max_seq_length=128, num_train_epochs=3.0, learning_rate=3e-4,
                                           train_batch_size=32)),
    # SQuAD v1.1: the shared training subset (11877 questions) -> the first 2000 dev questions.
    "squad": Probe("squad", "f1", dict(max_seq_length=256, doc_stride=128, max_query_length=48,
                                       num_train_epochs=2.0, learning_rate=1e-3, train_batch_size=32,
                                       predict_batch_size=64, max_predict_examples=2000)),
    # The demo's SQuAD stage: short windows, the first 2000 training questions -> the first 500 dev ones.
    "squad_demo": Probe("squad", "f1", dict(max_seq_length=128, doc_stride=64, max_query_length=32,
                                            num_train_epochs=2.0, learning_rate=1e-3, train_batch_size=32,
                                            predict_batch_size=64, max_train_examples=2000,
                                            max_predict_examples=500)),
}

FINETUNE_DROPOUT = 0.1  # paper, section 3 / appendix A.3: dropout 0.1 on all layers when fine-tuning


def finetune_model(pretrain_model: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The model config that fine-tunes a pre-trained architecture: the same fields, dropout 0.1 (a
    recipe may pre-train without dropout; fine-tuning, and the random-init network it is compared
    with, use the paper's)."""
    model = ml_collections.ConfigDict(pretrain_model.to_dict())
    model.hidden_dropout_prob = model.attention_probs_dropout_prob = FINETUNE_DROPOUT
    return model


def probe_config(probe: str, *, init_checkpoint: str, vocab_file: str, model: ml_collections.ConfigDict,
                 seed: int, **overrides) -> ml_collections.ConfigDict:
    """The fine-tuning config of `PROBES[probe]` (plus `overrides`) for one initialisation and seed.

    Args:
      init_checkpoint: a bert_jax pre-training workdir, one of its checkpoints, or "" for random init
        with the architecture `model` (the pre-trained one, so that both inits are the same network).
      overrides: config fields on top of the probe's, among them the task's files (GLUE: data_dir; SQuAD:
        train_file, predict_file).

    Raises:
      ValueError: unknown probe.
    """
    from bert_jax.configs import glue as glue_config
    from bert_jax.configs import squad as squad_config

    if probe not in PROBES:
        raise ValueError(f"probe {probe!r} is not one of {sorted(PROBES)}")
    spec = PROBES[probe]
    if spec.task == "squad":
        config = squad_config.get_config("tiny")
    else:
        config = glue_config.get_config(spec.task)
    config.model = ml_collections.ConfigDict(dict(model))
    config.init_checkpoint, config.vocab_file, config.seed = init_checkpoint, vocab_file, seed
    config.mesh.num_devices = 1
    config.log_every = 100
    config.save_checkpoint = False
    for key, value in {**spec.overrides, **overrides}.items():
        config[key] = value
    return config


def probe_command(probe: str, workdir: str, **kwargs) -> list[str]:
    """The command line of the probe's job, as a user would type it: `python -m
    bert_jax.tasks.glue|squad --config <file>:<arg>`, a `--config.<field>=<value>` for each field
    that differs from that config file's default, `--workdir`. `kwargs` as `probe_config`."""
    import sys

    from bert_jax.configs import glue as glue_config
    from bert_jax.configs import squad as squad_config

    spec = PROBES[probe]
    config = probe_config(probe, **kwargs).to_dict()
    if spec.task == "squad":
        module, config_file, default = "squad", "squad:tiny", squad_config.get_config("tiny").to_dict()
    else:
        module, config_file = "glue", f"glue:{spec.task}"
        default = glue_config.get_config(spec.task).to_dict()
    flags = []
    for key, value in config.items():
        pairs = ([(f"{key}.{k}", v, default[key].get(k)) for k, v in value.items()] if isinstance(value, dict)
                 else [(key, value, default.get(key))])
        flags += [f"--config.{name}={v}" for name, v, d in pairs if v != d]
    return [sys.executable, "-m", f"bert_jax.tasks.{module}", "--config", config_file, *flags,
            f"--workdir={workdir}"]


def finetune(probe: str, workdir: str, **kwargs) -> dict[str, Any]:
    """Runs the probe's job in this process (`bert_jax.tasks.glue.run` / `squad.run`) -> its metrics,
    with "score" = the probe's metric. `kwargs` as `probe_config`."""
    from bert_jax.tasks import glue, squad

    config = probe_config(probe, **kwargs)
    job = squad.run if PROBES[probe].task == "squad" else glue.run
    metrics = job(config, workdir)
    return dict(metrics, score=float(metrics[PROBES[probe].metric]))


def summarize(pretrained: Sequence[float], random: Sequence[float]) -> dict[str, float]:
    """Scores of one probe over seeds -> means, sample standard deviations (0 for one seed), the gain
    (pre-trained mean - random mean) and the gain in pooled standard deviations
    (sqrt((sd_p^2 + sd_r^2) / 2); inf when both are 0 and the gain positive)."""
    sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0  # noqa: E731
    sd_p, sd_r = sd(pretrained), sd(random)
    pooled = math.sqrt((sd_p ** 2 + sd_r ** 2) / 2)
    gain = statistics.fmean(pretrained) - statistics.fmean(random)
    return {"pretrained_mean": statistics.fmean(pretrained), "pretrained_sd": sd_p,
            "random_mean": statistics.fmean(random), "random_sd": sd_r, "gain": gain, "pooled_sd": pooled,
            "gain_in_pooled_sd": gain / pooled if pooled else (math.inf if gain > 0 else 0.0)}
