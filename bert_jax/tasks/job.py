"""The plumbing every fine-tuning job shares: its data files, its encoder and vocabulary, the end of the
run (scores, final checkpoint, run files) and the command line.

Initial weights (`config.init_checkpoint`, paper section 4: the pre-trained encoder, fresh task head):
whatever `bert_jax.checkpoints.sources.resolve` reads (a Hugging Face directory, a google-research/bert
TensorFlow checkpoint, a bert_jax run or one of its checkpoints; "" for random initialisation), the
architecture from the source, the compute options and dropout from this job's `config.model`. The
vocabulary and casing are the source's (its vocab.txt and tokenizer_config.json) unless config.vocab_file /
config.do_lower_case name them, which must then agree.
"""

from __future__ import annotations

import json
from typing import Callable, Mapping

import jax
import ml_collections

from bert_jax.checkpoints import checkpointing, sources
from bert_jax import errors, storage
from bert_jax.model import modeling
from bert_jax.training import summaries
from bert_jax.data.tokenization import Tokenizer
from bert_jax.training.steps import TrainState


def data_file(config: ml_collections.ConfigDict, name: str) -> str:
    """`config.data_dir`/`name`, the path of one of a task's files.

    Raises:
      ValueError: config.data_dir is empty (one line: the job has no default data folder).
    """
    if not config.data_dir:
        raise ValueError(f"config.data_dir is empty: name the folder that holds {name}")
    return storage.join(config.data_dir, name)


def load_tokenizer(config: ml_collections.ConfigDict, init: sources.Initialisation) -> Tokenizer:
    """The WordPiece tokenizer of the job: config.vocab_file and config.do_lower_case when set, else the
    source's (`sources.vocabulary`), checked against the encoder.

    Raises:
      ValueError: no vocabulary, or one / a casing that conflicts with the source's (`vocabulary`); a
        vocabulary with more tokens than the model's vocab_size (its ids would index past the embeddings).
      FileNotFoundError: the vocabulary file does not exist.
    """
    vocab_file, do_lower_case = sources.vocabulary(init, config.vocab_file, config.get("do_lower_case"))
    tokenizer = Tokenizer(vocab_file, do_lower_case=do_lower_case)
    if tokenizer.vocab_size > init.config.vocab_size:
        raise ValueError(f"vocabulary {tokenizer.vocab_file} has {tokenizer.vocab_size} tokens, more than the model's "
                         f"vocab_size {init.config.vocab_size}")
    return tokenizer


def load_encoder(config: ml_collections.ConfigDict) -> tuple[sources.Initialisation, Tokenizer]:
    """What every task job starts from: `sources.resolve` of config.init_checkpoint (its
    architecture, the job's compute options) and `load_tokenizer`, with config.max_seq_length checked
    against the encoder's positions.

    Raises:
      the errors of `sources.resolve` and `load_tokenizer`;
      ValueError: a batch size (config.*_batch_size) below 1 or a negative config.num_train_epochs (checked
        first); config.max_seq_length over the encoder's max_position_embeddings; an architecture field set
        on the command line that conflicts with the init_checkpoint's (`check_explicit_fields`).
    """
    for name in sorted(k for k in config.keys() if k.endswith("_batch_size")):
        if config[name] < 1:
            raise ValueError(f"config.{name}={config[name]} must be at least 1")
    if config.get("num_train_epochs", 0) < 0:
        raise ValueError(f"config.num_train_epochs={config.num_train_epochs} must be non-negative")
    init = sources.resolve(config.init_checkpoint, config.model)
    if init.kind != "random":
        sources.check_explicit_fields(config, init.config, config.init_checkpoint)
    tokenizer = load_tokenizer(config, init)
    if config.max_seq_length > init.config.max_position_embeddings:
        raise ValueError(f"config.max_seq_length={config.max_seq_length} exceeds max_position_embeddings="
                         f"{init.config.max_position_embeddings}")
    return init, tokenizer


def save_final(workdir: str, state: TrainState, config: ml_collections.ConfigDict, bert_config: modeling.BertConfig,
               metrics: Mapping[str, float], tokenizer: Tokenizer | None = None) -> str:
    """Writes the fine-tuned state as an Orbax checkpoint `<workdir>/checkpoints/<step>` (config item:
    the job's config with the resolved model), and, with `tokenizer`, the run files that make the workdir
    an init_checkpoint or a `bert_jax.convert to_hf` input alone (`sources.write_run_files`:
    bert_config.json, vocab.txt, tokenizer_config.json); returns the checkpoint's path."""
    step = int(jax.device_get(state.step))
    config_json = json.loads(config.to_json())
    config_json["model"] = bert_config.to_dict()
    if tokenizer is not None and jax.process_index() == 0:
        sources.write_run_files(workdir, bert_config, tokenizer.vocab_file, tokenizer.do_lower_case)
    checkpointer = checkpointing.Checkpointer(storage.join(workdir, "checkpoints"), max_to_keep=1, async_save=False)
    checkpointer.save(step, state, {"metrics": dict(metrics)}, config_json)
    checkpointer.close()
    return storage.join(workdir, "checkpoints", str(step))


def finish(writer, workdir: str, state: TrainState, config: ml_collections.ConfigDict, bert_config: modeling.BertConfig,
           tokenizer: Tokenizer, scores: Mapping[str, float], metrics: dict, num_train_steps: int,
           step: int | None = None) -> None:
    """The end of every task job: `scores` to TensorBoard as "eval" (at `step`, default num_train_steps), the
    final checkpoint with the run files of `tokenizer` (`save_final`, when config.save_checkpoint and the job
    trained; its path into metrics["checkpoint"]), the writer closed (None on other processes than the
    first)."""
    if scores:
        summaries.write_scalars(writer, num_train_steps if step is None else step, scores, "eval")
    if config.save_checkpoint and num_train_steps > 0:
        metrics["checkpoint"] = save_final(workdir, state, config, bert_config, scores, tokenizer)
    if writer is not None:
        writer.close()


def check_recipe_kind(config: ml_collections.ConfigDict, name: str) -> None:
    """Checks that `config` is a config of the job `name` ("squad", "glue", "ner", "swag"): it has every
    top-level field of that job's packaged recipe (`bert_jax/configs/<name>.py`, its default argument).

    Raises:
      ValueError: fields are missing (one line naming them and the job's recipe), e.g. a pre-training config
        given to a fine-tuning job.
    """
    import importlib

    wanted = importlib.import_module(f"bert_jax.configs.{name}").get_config()
    missing = sorted(set(wanted.keys()) - set(config.keys()))
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ValueError(f"--config is not a {name} config: it has no {shown} (a {name} recipe: --config={name}"
                         f"{':mrpc' if name == 'glue' else ''}, or a file derived from bert_jax/configs/{name}.py)")


def cli(run: Callable[[ml_collections.ConfigDict, str], dict], name: str, config_help: str) -> None:
    """The command line of a fine-tuning job: --config (with --config.x=y overrides), --workdir and the
    multi-host flags of `bert_jax.training.distributed` (--jax_distributed, as launch/tpu_vm_pod.sh passes);
    holds the workdir's lease while the job runs (`bert_jax.training.guards.lease`: a second job on the same workdir stops
    in one line); prints the metrics as JSON; bad input exits with one line `<name>: <message>`."""
    from absl import app, flags, logging
    from bert_jax import configs

    from bert_jax import console
    from bert_jax.training import distributed
    from bert_jax.training.guards import lease, watchdog

    console.install()

    configs.define_flag(config_help)
    flags.DEFINE_string("workdir", None, "Output directory: predictions, metrics, TensorBoard, checkpoint.")
    distributed.define_flags()
    flags.mark_flags_as_required(["config", "workdir"])

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments {argv[1:]}")
        logging.set_verbosity(logging.WARNING)
        try:
            check_recipe_kind(flags.FLAGS.config, name)
            storage.check_output_dir(flags.FLAGS.workdir, "--workdir")
            distributed.initialize_from_flags(command=name)
            config = flags.FLAGS.config
            with lease.hold(flags.FLAGS.workdir, name, config.get("lease_timeout_s"),
                            config.get("lease_heartbeat_s")):  # one job per workdir (0 or absent: the defaults)
                metrics = run(configs.mark_explicit_model_fields(config), flags.FLAGS.workdir)
        except errors.USER_ERRORS as e:
            error = errors.exit_with(name, e)
            watchdog.exit_on_error(error.code)  # several processes: a lost peer's line wins; never returns there
            raise error from None
        watchdog.stop()
        if jax.process_index() == 0:
            print(json.dumps(metrics))

    errors.run(main, name)
