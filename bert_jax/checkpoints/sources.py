"""Where a job's weights, architecture and vocabulary come from: `config.init_checkpoint`, and the files
a run directory carries for the next job.

`resolve(path, ...)` reads any of these (the original's --init_checkpoint, extended):
  a Hugging Face directory      config.json + model.safetensors / pytorch_model.bin (`hf.from_hf`);
  a TensorFlow checkpoint       google-research/bert: a directory with bert_config.json and
                                bert_model.ckpt.index (or one *.ckpt.index), or a prefix
                                `<dir>/bert_model.ckpt` (`tf1.from_tf_checkpoint`, the `tf` extra);
  a bert_jax run                its workdir or `<workdir>/checkpoints` (the newest readable checkpoint),
                                or `<workdir>/checkpoints/<step>` (that one): pre-training or fine-tuning;
  a released checkpoint's name  one of Google's (`cased_L-12_H-768_A-12`: a TensorFlow checkpoint) or a
                                Hugging Face model id (`bert-base-uncased`, `org/name@revision`), when no path of
                                that name exists: downloaded once into a cache (`released.local_directory`).
The casing is the source's tokenizer_config.json, else, for a TensorFlow checkpoint, google-research/bert's rule
on its folder's name (`released.casing`: `cased_L-12_H-768_A-12` is cased).
The architecture (the twelve bert_config.json fields, and the layer layout of a bert_jax run) comes
from the source; the compute options and the dropout probabilities (`JOB_FIELDS`) are the job's.
`load_params` then reads the source's arrays in the job's shapes and shardings, which
`steps.create_state` puts in place of the random initialisation; what the source lacks (the NSP head
of a BertForMaskedLM, both heads of a BertModel, a pooler) is initialised and named.

A run directory carries itself (`write_run_files`, before a pre-training run's first step):
  bert_config.json       the architecture, in the original's format;
  vocab.txt              the vocabulary of the run's data;
  tokenizer_config.json  {"do_lower_case", "vocab_sha256"} (Hugging Face's file name and casing key).
So `init_checkpoint=WORKDIR` alone gives a fine-tuning job its vocabulary and casing
(`vocabulary`), and `python -m bert_jax.convert to_hf` the files transformers needs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
from typing import Any, Callable, Mapping

import jax
import ml_collections
import numpy as np
from flax import traverse_util

from bert_jax.checkpoints import checkpointing, hf, released, tf1
from bert_jax import storage
from bert_jax.model.bert_config import BERT_CONFIG_FIELDS, BertConfig

# The job's own options whatever the source: compute, and dropout (a training choice, not architecture:
# a run pre-trained without it fine-tunes with it).
JOB_FIELDS = ("dtype", "param_dtype", "remat_policy", "kernels", "hidden_dropout_prob",
              "attention_probs_dropout_prob")
# The architecture a source imposes on the job: bert_config.json's fields but dropout.
ARCHITECTURE_FIELDS = tuple(f for f in BERT_CONFIG_FIELDS if f not in JOB_FIELDS)
VOCAB_NAME = "vocab.txt"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
# Parameters a source may lack, initialised by the job instead: the heads and the pooler.
_OPTIONAL = ("bert/pooler/", "mlm_", "nsp/")


@dataclasses.dataclass
class Initialisation:
    """A resolved init_checkpoint.

    Attributes:
      kind: "random" (no source), "hf" (a Hugging Face directory or a TensorFlow checkpoint: the arrays are
        in `params`) or "orbax" (a bert_jax run: read from `path` at `step` by `load_params`).
      path: the source as given (a released checkpoint's name stays the name); for "orbax" its checkpoints
        directory.
      config: the architecture of the source with the job's `JOB_FIELDS` (for "random": the job's own).
      params: kind "hf": the BertForPreTraining tree of numpy arrays (`hf.from_hf`).
      fresh: kind "hf": "/"-joined paths of `params` the source lacked (filled by the converter, not loaded).
      step: kind "orbax": the checkpoint named (`<workdir>/checkpoints/<step>`); None: the newest readable one
        when the arrays are read (unreadable newer ones are moved aside then).
      vocab_file: the vocab.txt that belongs to the source (beside it, or in the run directory), or None.
      do_lower_case: the source's recorded casing (tokenizer_config.json; for a TensorFlow checkpoint without one,
        `released.casing` of its folder's name), or None when not known.
    """

    kind: str
    path: str
    config: BertConfig
    params: Any = None
    fresh: tuple[str, ...] = ()
    step: int | None = None
    vocab_file: str | None = None
    do_lower_case: bool | None = None


def run_directory(path: str) -> str:
    """The run directory of a bert_jax checkpoints path: `<workdir>` for `<workdir>`,
    `<workdir>/checkpoints` and `<workdir>/checkpoints/<step>`."""
    path = path.rstrip("/")
    parent, name = os.path.split(path)
    if name.isdigit():
        path, name = parent, os.path.basename(parent)
    return os.path.dirname(path) if name == "checkpoints" else path


def resolve(path: str, model: Mapping[str, Any], *, field: str = "config.init_checkpoint") -> Initialisation:
    """Reads the architecture (and, for Hugging Face and TensorFlow checkpoints, the arrays) named by `path`.

    Args:
      path: the source (module docstring), or "" for random initialisation. A string that is no existing
        path is a name (`released`): one of Google's released checkpoints, else a Hugging Face model id.
      model: the job's config.model (bert_config.json fields and compute options): its `JOB_FIELDS`, and
        scan_layers for Hugging Face and TensorFlow sources, are kept; for "" all of it.
      field: the flag named in errors.

    Raises:
      FileNotFoundError: `path` does not exist and is no name, or is none of the sources (one line naming it);
        a bert_jax run whose checkpoints are all unreadable (checkpointing.NoReadableCheckpoint); a Hugging
        Face id not in its cache offline, or not on the Hub (`released.hub_snapshot`).
      ConnectionError: downloading a released checkpoint failed (`released.local_directory`).
      ImportError: a TensorFlow checkpoint without TensorFlow (the `tf` extra).
      ValueError: a bad config or weight file in the source (from `convert`), a bad `model`; a released
        checkpoint whose sha256 differs from the expected one, or is not known.
    """
    compute = {k: model[k] for k in JOB_FIELDS}
    if not path:
        return Initialisation("random", "", BertConfig.from_dict(dict(model)))
    local = path
    if not storage.exists(path) and not storage.exists(f"{path}.index"):
        local = released.local_directory(path, field=field)  # a released checkpoint's name, else an error
    if storage.is_file(storage.join(local, hf.CONFIG_NAME)):
        fresh: list[str] = []
        bert_config, params = hf.from_hf(local, scan_layers=model["scan_layers"], fresh=fresh, **compute)
        return Initialisation("hf", path, bert_config, params, tuple(fresh), None, *_vocabulary_beside(local))
    prefix = tf1.tf_checkpoint_prefix(local) if not storage.is_remote(local) else None
    if prefix is not None:
        fresh = []
        bert_config, params = tf1.from_tf_checkpoint(prefix, scan_layers=model["scan_layers"],
                                                               fresh=fresh, **compute)
        vocab, casing = _vocabulary_beside(os.path.dirname(prefix) or ".")
        return Initialisation("hf", path, bert_config, params, tuple(fresh), None, vocab,
                              released.casing(prefix) if casing is None else casing)
    if local != path:
        raise FileNotFoundError(f"{field}={path!r}: {local} holds neither config.json nor a TensorFlow checkpoint")
    step = None
    parent, name = os.path.split(path.rstrip("/"))
    if name.isdigit() and parent and storage.is_file(storage.join(path, "_CHECKPOINT_METADATA")):
        path, step = parent, int(name)  # one checkpoint of a run: <workdir>/checkpoints/<step>
    ckpt_dir = next((c for c in (storage.join(path, "checkpoints"), path) if checkpointing.has_checkpoints(c)), None)
    if ckpt_dir is None:
        raise FileNotFoundError(f"{field}={path!r} is neither a Hugging Face directory (config.json) nor a "
                                "TensorFlow checkpoint (bert_config.json + bert_model.ckpt) nor a bert_jax run "
                                "with checkpoints")
    checkpointer = checkpointing.Checkpointer(ckpt_dir, async_save=False, read_only=True)
    try:
        if step is None:  # the newest readable checkpoint; unreadable newer ones are moved aside
            found = checkpointing.newest_readable(ckpt_dir, checkpointer.all_steps(), checkpointer.restore_config)
            if found is None:
                raise FileNotFoundError(f"{field}={path!r}: {ckpt_dir} holds no finished checkpoint")
            saved = found[1]  # the arrays are read from the newest readable checkpoint when loaded
        else:  # the one asked for, or a one-line error
            saved = checkpointing.read_step(ckpt_dir, step, checkpointer.restore_config)
    finally:
        checkpointer.close()
    return Initialisation("orbax", ckpt_dir, BertConfig.from_dict(saved["model"], **compute), step=step,
                          **dict(zip(("vocab_file", "do_lower_case"), _vocabulary_beside(run_directory(ckpt_dir)))))


def _vocabulary_beside(directory: str) -> tuple[str | None, bool | None]:
    """(`<directory>/vocab.txt` or None, the casing of `<directory>/tokenizer_config.json` or None)."""
    vocab = storage.join(directory, VOCAB_NAME)
    tokenizer_config = storage.join(directory, TOKENIZER_CONFIG_NAME)
    casing = None
    if storage.is_file(tokenizer_config):
        try:
            casing = storage.read_json(tokenizer_config).get("do_lower_case")
        except ValueError:
            casing = None
    return (vocab if storage.is_file(vocab) else None), (casing if isinstance(casing, bool) else None)


def file_sha256(path: str) -> str:
    """sha256 hex digest of a file's bytes (local or remote)."""
    return hashlib.sha256(storage.read_bytes(path)).hexdigest()


def vocabulary(init: Initialisation, vocab_file: str, do_lower_case: bool | None, *,
               field: str = "config") -> tuple[str, bool]:
    """The vocabulary and casing of a job that starts from `init`: the job's own when given (and agreeing
    with the source's), else the source's; casing True when neither records one.

    Raises:
      ValueError: no vocabulary given and none beside the source; a given vocabulary whose bytes differ
        from the source's vocab.txt; a given casing that differs from the source's (one line naming both).
    """
    if vocab_file and init.vocab_file and file_sha256(vocab_file) != file_sha256(init.vocab_file):
        raise ValueError(f"{field}.vocab_file={vocab_file!r} differs from the vocabulary of {field}.init_checkpoint "
                         f"({init.vocab_file}); leave vocab_file empty to use the checkpoint's")
    if do_lower_case is not None and init.do_lower_case is not None and do_lower_case != init.do_lower_case:
        raise ValueError(f"{field}.do_lower_case={do_lower_case} conflicts with {field}.init_checkpoint="
                         f"{init.path!r}, pre-trained with do_lower_case={init.do_lower_case}")
    vocab = vocab_file or init.vocab_file
    if not vocab:
        raise ValueError(f"{field}.vocab_file is empty and {field}.init_checkpoint has no vocab.txt: name the "
                         "WordPiece vocabulary the encoder was pre-trained with")
    casing = do_lower_case if do_lower_case is not None else init.do_lower_case
    return vocab, True if casing is None else casing


def check_explicit_fields(config: ml_collections.ConfigDict, source: BertConfig, path: str) -> None:
    """The architecture fields set by hand (`config.explicit_model_fields`, from the command line) must agree
    with the init_checkpoint's architecture, which the job takes.

    Raises:
      ValueError: one line naming the first field that conflicts, both values and the checkpoint.
    """
    for field in config.get("explicit_model_fields", ()):
        if field in ARCHITECTURE_FIELDS and config.model[field] != getattr(source, field):
            raise ValueError(f"--config.model.{field}={config.model[field]} conflicts with config.init_checkpoint="
                             f"{path!r}, whose {field} is {getattr(source, field)} (its architecture is the job's)")


def architecture_changes(model: Mapping[str, Any], config: BertConfig) -> dict[str, tuple[Any, Any]]:
    """{field: (the job's value, the source's)} of the `ARCHITECTURE_FIELDS` that differ."""
    values = config.to_dict()
    return {f: (model[f], values[f]) for f in ARCHITECTURE_FIELDS if model[f] != values[f]}


def load_params(init: Initialisation, params: Any, shardings: Any, mesh: jax.sharding.Mesh, *,
                take: Callable[[str], bool] = lambda path: True) -> tuple[dict[str, jax.Array], list[str]]:
    """The source's arrays for the job's parameters -> (loaded, fresh), for `steps.create_state(...,
    params=loaded)`.

    Args:
      init: a resolved source (kind "hf" or "orbax"; "random" loads nothing).
      params: the job's parameter tree: anything with .shape and .dtype per leaf (the abstract
        ShapeDtypeStructs of `steps.state_shardings`, or arrays).
      shardings: the tree of NamedShardings of `params`.
      mesh: the mesh of `shardings`.
      take: which "/"-joined parameter paths may come from the source (fine-tuning: "bert/..." only).

    Returns:
      (loaded, fresh): `loaded` maps each taken path the source holds to its array, in the job's shape,
      dtype and sharding; `fresh` lists the taken paths the source lacks (left to the job's initialisation).

    Raises:
      ValueError: a source that lacks an encoder parameter other than the pooler, or holds one of another
        shape (one line naming it).
      checkpointing.CheckpointMismatch / NoReadableCheckpoint: from reading a bert_jax run.
    """
    if init.kind == "random":
        return {}, []
    flat = traverse_util.flatten_dict(params, sep="/")
    flat_shardings = traverse_util.flatten_dict(shardings, sep="/")
    wanted = [p for p in flat if take(p)]
    if init.kind == "hf":
        source = traverse_util.flatten_dict(init.params, sep="/")
        have = _held(init, {p: tuple(np.shape(source[p])) for p in source if p not in init.fresh}, flat, wanted)
        loaded = {}
        for p in have:
            value = np.asarray(source[p], dtype=flat[p].dtype)
            loaded[p] = jax.make_array_from_callback(value.shape, flat_shardings[p], lambda i, v=value: v[i])
    else:
        def restore(step):
            held = checkpointing.stored_params(storage.join(init.path, str(step)))
            if not held:  # a checkpoint whose tree metadata lists no parameter: damage
                raise OSError("the checkpoint's tree metadata lists no parameter")
            have = _held(init, held, flat, wanted)
            target = traverse_util.unflatten_dict(
                {tuple(p.split("/")): jax.ShapeDtypeStruct(flat[p].shape, flat[p].dtype, sharding=flat_shardings[p])
                 for p in have})
            with jax.set_mesh(mesh):
                return have, checkpointing.restore_params(init.path, target, step)

        have, restored = read_run(init, restore)
        loaded = traverse_util.flatten_dict(restored, sep="/")
    return loaded, [p for p in wanted if p not in have]


def _held(init: Initialisation, held: Mapping[str, tuple], flat: Mapping[str, Any], wanted: list[str]) -> list[str]:
    """The `wanted` paths the source holds (`held`: path -> shape), checked against the job's `flat` arrays.

    Raises:
      checkpointing.CheckpointMismatch (a ValueError): an encoder parameter other than the pooler missing, or
        a parameter of another shape (a source of another model, not a damaged one).
    """
    missing = [p for p in wanted if p not in held and not p.startswith(_OPTIONAL)]
    if missing:
        raise checkpointing.CheckpointMismatch(
            f"init_checkpoint {init.path}: no parameter {missing[0]} (and {len(missing) - 1} more); a source of "
            "another model?")
    have = [p for p in wanted if p in held]
    for p in have:
        if held[p] != tuple(flat[p].shape):
            raise checkpointing.CheckpointMismatch(f"init_checkpoint {init.path}: parameter {p} has shape {held[p]}, "
                                                   f"the model wants {tuple(flat[p].shape)}")
    return have


def read_run(init: Initialisation, restore: Callable[[int], Any]) -> Any:
    """`restore(step)` of a bert_jax source (kind "orbax"): of `init.step` when named (an unreadable one is
    a one-line NoReadableCheckpoint, left in place), else of the newest readable checkpoint (the one
    fallback policy, `checkpointing.newest_readable`: unreadable newer steps reported and moved aside).

    Raises:
      checkpointing.NoReadableCheckpoint: as above, or no readable checkpoint at all.
      checkpointing.CheckpointMismatch: from `restore`.
    """
    if init.step is not None:
        return checkpointing.read_step(init.path, init.step, restore)
    steps = sorted(int(name) for name in storage.list_names(init.path) if name.isdigit())
    found = checkpointing.newest_readable(init.path, steps, restore)
    if found is None:
        raise checkpointing.NoReadableCheckpoint(f"{init.path}: no checkpoint")
    return found[1]


def summarize_paths(paths: list[str]) -> str:
    """Parameter paths in a few words: their top-level modules ("nsp, mlm_transform"; "bert/pooler")."""
    names = []
    for p in paths:
        parts = p.split("/")
        name = "/".join(parts[:2]) if parts[0] == "bert" else parts[0]
        if name not in names:
            names.append(name)
    return ", ".join(names)


def write_run_files(workdir: str, config: BertConfig, vocab_file: str | None, do_lower_case: bool, *,
                    bert_config: bool = True) -> None:
    """`bert_config.json` (unless `bert_config` is False: a Hugging Face export has its config.json),
    `vocab.txt` (a copy of `vocab_file`, when given) and `tokenizer_config.json` (casing, sha256, the
    positions as model_max_length) in `workdir`, each written whole (temporary name, then rename); files
    already there are kept."""
    files = {tf1.TF_CONFIG_NAME: lambda: storage.write_json(
        storage.join(workdir, tf1.TF_CONFIG_NAME), {k: v for k, v in config.to_dict().items()
                                                          if k in BERT_CONFIG_FIELDS})} if bert_config else {}
    if vocab_file:
        files[VOCAB_NAME] = lambda: storage.write_bytes(storage.join(workdir, VOCAB_NAME),
                                                        storage.read_bytes(vocab_file))
        files[TOKENIZER_CONFIG_NAME] = lambda: storage.write_json(
            storage.join(workdir, TOKENIZER_CONFIG_NAME),
            {"do_lower_case": bool(do_lower_case), "vocab_sha256": file_sha256(vocab_file),
             "tokenizer_class": "BertTokenizer", "model_max_length": config.max_position_embeddings})
    storage.makedirs(workdir)
    for name, write in files.items():
        if not storage.is_file(storage.join(workdir, name)):
            write()


# ----------------------------------------------------------------------------- pre-training


def pretraining_source(config: ml_collections.ConfigDict, workdir: str
                       ) -> tuple[ml_collections.ConfigDict, Initialisation | None]:
    """The run's config and the source of its initial weights (google-research/bert's --init_checkpoint).

    With config.init_checkpoint set and no checkpoint in `workdir` yet: the source resolved
    (`resolve`), its architecture replacing the config's (`ARCHITECTURE_FIELDS`, and the
    layer layout of a bert_jax run; `architecture_changes` names the fields that changed); compute options
    and dropout
    stay the config's. With checkpoints in `workdir` the run resumes from them and the source is not read:
    the architecture is the workdir's bert_config.json. Without init_checkpoint: (config, None).

    Raises:
      FileNotFoundError / ValueError / ImportError: from `resolve` (a source that does not
        exist, of no known format, or unreadable).
    """
    path = config.get("init_checkpoint", "")
    if not path:
        return config, None
    if checkpointing.has_checkpoints(storage.join(workdir, "checkpoints")):
        say(f"train: {workdir} holds checkpoints: resuming from them, config.init_checkpoint={path!r} is not read")
        saved = storage.join(workdir, tf1.TF_CONFIG_NAME)
        if not storage.is_file(saved):
            return config, None
        return _with_architecture(config, BertConfig.from_dict(storage.read_json(saved))), None
    init = resolve(path, config.model)
    check_explicit_fields(config, init.config, path)
    return _with_architecture(config, init.config), init


def _with_architecture(config: ml_collections.ConfigDict, source: BertConfig) -> ml_collections.ConfigDict:
    """A copy of `config` whose model has `source`'s architecture fields and layer layout."""
    config = config.copy_and_resolve_references()
    with config.unlocked():
        for field in (*ARCHITECTURE_FIELDS, "scan_layers"):
            config.model[field] = getattr(source, field)
    return config


def data_vocabulary(config: ml_collections.ConfigDict, init: Initialisation | None
                    ) -> tuple[str | None, bool]:
    """The vocabulary file and casing of the run's data (the first phase's vocab.txt and metadata.json),
    checked against every phase and against the source of `init`.

    Returns:
      (the data's vocab.txt, or None for instances written without one; do_lower_case, True if unrecorded).

    Raises:
      ValueError: phases built with different vocabularies; a data vocabulary larger than the source's
        embeddings, or whose sha256 differs from the vocab.txt beside the source, or another casing
        (one line naming both).
    """
    metas = [(p.data_dir, storage.read_json(storage.join(p.data_dir, "metadata.json"))) for p in config.phases]
    first_dir, first = metas[0]
    for data_dir, meta in metas[1:]:
        if meta.get("vocab_sha256") != first.get("vocab_sha256"):
            raise ValueError(f"{data_dir} and {first_dir} were built with different vocabularies")
    casing = first.get("do_lower_case", first.get("flags", {}).get("do_lower_case"))
    vocab_file = storage.join(first_dir, VOCAB_NAME)
    vocab_file = vocab_file if storage.is_file(vocab_file) else None
    if init is not None:
        source = f"config.init_checkpoint={init.path!r}"
        if first.get("vocab_size", 0) > init.config.vocab_size:
            raise ValueError(f"config.phases[0].data_dir={first_dir!r} has a vocabulary of {first['vocab_size']} "
                             f"tokens, more than the {init.config.vocab_size} embeddings of {source}")
        if init.vocab_file and first.get("vocab_sha256") and \
                file_sha256(init.vocab_file) != first["vocab_sha256"]:
            raise ValueError(f"config.phases[0].data_dir={first_dir!r} was tokenized with another vocabulary than "
                             f"{init.vocab_file} of {source} (sha256 differs)")
        if init.do_lower_case is not None and casing is not None and init.do_lower_case != casing:
            raise ValueError(f"config.phases[0].data_dir={first_dir!r} has do_lower_case={casing}, {source} "
                             f"do_lower_case={init.do_lower_case}")
    return vocab_file, True if casing is None else bool(casing)


def say(line: str) -> None:
    """One line to stderr from the first process."""
    if jax.process_index() == 0:
        print(line, file=sys.stderr, flush=True)
