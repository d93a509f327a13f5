"""The conversion command, `python -m bert_jax.convert`:

  to_hf   --checkpoint WORKDIR_OR_STEP --output_dir DIR   a bert_jax run (pre-training: BertForPreTraining;
          fine-tuning: its task model, e.g. BertForQuestionAnswering; an encoder alone: BertModel) -> a Hugging Face directory that
          transformers' `AutoModelFor...` / `AutoTokenizer` load: config.json, model.safetensors, vocab.txt,
          tokenizer_config.json (casing);
  from_hf --input HF_DIR_OR_ID --output_dir DIR          a Hugging Face BERT directory, or a model id
          (`bert-base-uncased`, `org/name@revision`, through huggingface_hub's cache) -> a bert_jax checkpoint
  from_tf --input TF_CHECKPOINT_OR_NAME --output_dir DIR  google-research/bert's bert_model.ckpt (directory or
          prefix), or one of Google's released names (`cased_L-12_H-768_A-12`: downloaded once, sha256-checked,
          cached) -> a bert_jax checkpoint.
  from_hf / from_tf --do_lower_case=true|false            the casing written, instead of the source's.

A bert_jax checkpoint written by from_hf / from_tf is `DIR/checkpoints/0` (the parameters the source holds,
no optimizer state) with bert_config.json, vocab.txt and tokenizer_config.json beside it
(`sources.write_run_files`): `config.init_checkpoint=DIR` of pre-training, fine-tuning and
extract_features reads it alone. Names are resolved as `config.init_checkpoint` resolves them
(`released`: an existing path is always a path); the casing written is the source's (tokenizer_config.json,
else google-research/bert's rule for Google's names), True when unknown, or --do_lower_case. Every output is built under a temporary name and renamed when complete;
bad input (a missing or unknown source, an output that exists) is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys

from bert_jax.checkpoints import checkpointing, hf, released, sources, tf1
from bert_jax import errors, storage
from bert_jax.model.bert_config import BertConfig


def _model_defaults() -> dict:
    """The compute options of a conversion: float32, unscanned layers (what a source's architecture leaves)."""
    return dataclasses.asdict(BertConfig())


def _labels(saved_config: dict) -> list[str] | None:
    """A fine-tuned GLUE classifier's label names (config item "task"), else None (transformers' LABEL_i)."""
    from bert_jax.data.glue import TASKS

    task = TASKS.get(saved_config.get("task")) if isinstance(saved_config.get("task"), str) else None
    return list(task.labels) if task is not None and task.labels else None


def _host_params(init: sources.Initialisation) -> tuple[dict, dict]:
    """(every parameter of a bert_jax source's checkpoint on the first local device, float32; the run's saved
    config) of the checkpoint `sources.read_run` picks."""
    import jax
    import jax.numpy as jnp
    from flax import traverse_util

    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def restore(step):
        stored = checkpointing.stored_params(storage.join(init.path, str(step)))
        target = traverse_util.unflatten_dict({tuple(p.split("/")): jax.ShapeDtypeStruct(s, jnp.float32, sharding=device)
                                               for p, s in stored.items()})
        params = jax.device_get(checkpointing.restore_params(init.path, target, step))
        reader = checkpointing.Checkpointer(init.path, async_save=False, read_only=True)
        try:
            return params, reader.restore_config(step)
        finally:
            reader.close()

    return sources.read_run(init, restore)


def to_hf(checkpoint: str, output_dir: str) -> str:
    """A bert_jax run (workdir, its checkpoints directory, or one `checkpoints/<step>`) -> a Hugging Face
    directory at `output_dir` -> the transformers class written (config.json `architectures`).

    Raises:
      FileNotFoundError: no bert_jax run at `checkpoint`.
      ValueError: `checkpoint` is not a bert_jax run; its parameters are no BERT model `hf.to_hf` writes.
    """
    init = sources.resolve(checkpoint, _model_defaults(), field="--checkpoint")
    if init.kind != "orbax":
        raise ValueError(f"--checkpoint={checkpoint!r} is not a bert_jax run (it is already a Hugging Face or "
                         "TensorFlow checkpoint)")
    params, saved_config = _host_params(init)
    if set(params) == {"bert"}:  # an encoder alone (from_hf / from_tf of a BertModel): a BertModel directory
        params = params["bert"]
    labels = _labels(saved_config)

    def write(tmp: str) -> None:
        hf.to_hf(init.config, params, tmp, labels=labels)
        sources.write_run_files(tmp, init.config, init.vocab_file,
                                       True if init.do_lower_case is None else init.do_lower_case, bert_config=False)

    _write_directory(output_dir, write)
    return storage.read_json(os.path.join(output_dir, hf.CONFIG_NAME))["architectures"][0]


def to_checkpoint(source: str, output_dir: str, *, field: str, do_lower_case: bool | None = None) -> list[str]:
    """A Hugging Face directory or a TensorFlow checkpoint (or a released checkpoint's name) -> a bert_jax
    checkpoint directory at `output_dir` (module docstring) -> the top-level modules the source lacked (not
    written). `do_lower_case`: the casing written instead of the source's (None: the source's, True if unknown).

    Raises:
      FileNotFoundError / ValueError / ImportError / ConnectionError: from `sources.resolve` (a missing or
        unknown source, a bad weight file, TensorFlow missing for a TF checkpoint, a failed download).
    """
    import jax
    from flax import traverse_util

    init = sources.resolve(source, _model_defaults(), field=field)
    if init.kind != "hf":
        raise ValueError(f"{field}={source!r} is a bert_jax run already: use it as init_checkpoint directly")
    flat = {p: v for p, v in traverse_util.flatten_dict(init.params, sep="/").items() if p not in init.fresh}
    params = jax.device_put(traverse_util.unflatten_dict(flat, sep="/"))

    def write(tmp: str) -> None:
        writer = checkpointing.Checkpointer(os.path.join(tmp, "checkpoints"), async_save=False)
        origin = os.path.abspath(source) if os.path.exists(source) else source  # a name or URI as given
        writer.save(0, {"params": params}, {"source": origin}, {"model": init.config.to_dict()})
        writer.close()
        casing = do_lower_case if do_lower_case is not None else init.do_lower_case
        sources.write_run_files(tmp, init.config, init.vocab_file, True if casing is None else casing)

    _write_directory(output_dir, write)
    return [sources.summarize_paths(list(init.fresh))] if init.fresh else []


def _write_directory(output_dir: str, write) -> None:
    """`write(tmp)` into a temporary sibling of `output_dir`, renamed to it when complete.

    Raises:
      ValueError: `output_dir` exists and is not an empty directory, or is a URI (gs://...).
    """
    if storage.is_remote(output_dir):  # os.path would make it a local path under the working directory
        raise ValueError(f"--output_dir={output_dir!r} is a URI: convert writes a local directory (copy it to the "
                         "bucket afterwards)")
    output_dir = os.path.abspath(output_dir)
    if os.path.exists(output_dir) and (not os.path.isdir(output_dir) or os.listdir(output_dir)):
        raise ValueError(f"--output_dir={output_dir!r} exists and is not an empty directory")
    parent = os.path.dirname(output_dir)
    if not os.path.isdir(parent):
        raise ValueError(f"--output_dir={output_dir!r}: its parent directory does not exist")
    tmp = f"{output_dir}.tmp-{os.getpid()}"
    try:
        os.makedirs(tmp)
        write(tmp)
        os.replace(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = errors.ArgumentParser(prog="python -m bert_jax.convert", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("to_hf", help="a bert_jax run -> a Hugging Face directory")
    p.add_argument("--checkpoint", required=True, help="a bert_jax workdir, its checkpoints/, or checkpoints/<step>")
    p.add_argument("--output_dir", required=True, help="the Hugging Face directory to create")
    for name, what in (("from_hf", "a Hugging Face BERT directory or model id"),
                       ("from_tf", "a google-research/bert TF checkpoint (directory or bert_model.ckpt prefix) or "
                                   "one of Google's released names")):
        p = commands.add_parser(name, help=f"{what} -> a bert_jax checkpoint directory")
        p.add_argument("--input", required=True, help=what)
        p.add_argument("--output_dir", required=True, help="the bert_jax checkpoint directory to create")
        p.add_argument("--do_lower_case", choices=("true", "false"), default=None,
                       help="the casing to record, instead of the source's")
    args = parser.parse_args(argv)
    try:
        if args.command == "to_hf":
            kind = to_hf(args.checkpoint, args.output_dir)
            print(f"{args.output_dir}: {kind}")
        else:
            name = None if storage.exists(args.input) else released.kind(args.input)  # "google", "hf" or None
            if args.command == "from_tf" and tf1.tf_checkpoint_prefix(args.input) is None and name != "google":
                raise FileNotFoundError(f"--input={args.input!r}: no TensorFlow checkpoint (bert_model.ckpt.index), "
                                        "nor one of Google's released names")
            if args.command == "from_hf" and not storage.is_file(storage.join(args.input, hf.CONFIG_NAME)) \
                    and name != "hf":
                raise FileNotFoundError(f"--input={args.input!r}: no Hugging Face directory (config.json)"
                                        + (", and a name of Google's: use from_tf" if name == "google" else ""))
            casing = None if args.do_lower_case is None else args.do_lower_case == "true"
            fresh = to_checkpoint(args.input, args.output_dir, field="--input", do_lower_case=casing)
            print(f"{args.output_dir}: bert_jax checkpoint" + (f" (not in the source: {fresh[0]})" if fresh else ""))
    except (*errors.USER_ERRORS, ImportError) as e:
        print(errors.exit_with("convert", e).code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from bert_jax import console

    console.install()
    sys.exit(main())
