"""Feature-based use of BERT (paper section 5.3): every token's activations of chosen encoder layers.

The command line of google-research/bert's `extract_features.py`, on a bert_jax encoder:

  python -m bert_jax.extract_features --input_file=input.txt --output_file=features.jsonl \\
      --init_checkpoint=/path/to/hf_dir_or_workdir --layers=-1,-2,-3,-4 --max_seq_length=128 --batch_size=32

Input (`read_examples`): one example per line, UTF-8; `text_a ||| text_b` for a pair (token types 0 and
1). Examples are tokenized as the original (`convert_examples`): [CLS] a [SEP] (b [SEP]), a single text
cut to max_seq_length - 2 tokens, a pair to max_seq_length - 3 with `data.glue.truncate_seq_pair`.

Layers (`parse_layers`): indices into the encoder layers' outputs as the original's
`get_all_encoder_layers()[index]`: -1 is the last layer, 0 the first layer (not the embeddings), valid
in [-num_hidden_layers, num_hidden_layers).

Output (`--output_format`):
  json  the original's JSON lines, one per input line:
        {"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]},
        ...]}, ...]} (the original's key names, "linex_index" included; values rounded to 6 decimals as
        the original's `round(float(x), 6)`; [CLS] and [SEP] included, padding not).
  npz   for large inputs: a NumPy .npz archive, written entry by entry: "layers" int32 [K] (the --layers
        indices), and per example i "features_{i}" float32 [num_tokens, K, D] and "tokens_{i}" (str
        [num_tokens]).
With --concat_layers each token gets one vector, the K layers concatenated in --layers order ([num_tokens,
K*D]; json: one "layers" entry whose "index" is the list of indices): the paper's best feature-based
setting (Table 7, "Concat Last Four Hidden", the default --layers).
The output file is written under a temporary name beside it and renamed when complete (a local path).

Encoder (`--init_checkpoint`): whatever fine-tuning accepts (`bert_jax.checkpoints.sources.resolve`): a Hugging
Face directory, a google-research/bert checkpoint, a bert_jax pre-training workdir or one of its
`checkpoints/<step>`, or a released checkpoint's name (`bert-base-uncased`, `uncased_L-12_H-768_A-12`:
`bert_jax.checkpoints.released`); `--vocab_file` as
fine-tuning's (default: the source's vocab.txt and casing). The encoder runs in float32, in one
process, data parallel over --num_devices devices (default all; `steps.make_mesh`); each batch is padded
to a length bucket (16, 32, 64, ... capped at max_seq_length), which leaves real tokens' values unchanged.

Differences from the original: a blank line, or a line with more than one "|||", is an error (the
original makes an empty example, or splits at the last " ||| "); the pair separator may come without
surrounding spaces; there is no --bert_config_file (the architecture comes with the checkpoint).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import zipfile
from typing import Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import app, flags, logging

from bert_jax.tasks import batching
from bert_jax.training import sharding, steps
from bert_jax import errors, storage
from bert_jax.checkpoints import sources
from bert_jax.model import modeling
from bert_jax.data import corpus
from bert_jax.data.glue import truncate_seq_pair
from bert_jax.data.tokenization import Tokenizer
from bert_jax.tasks import finetune, job, prediction

PAIR_SEPARATOR = "|||"
OUTPUT_FORMATS = ("json", "npz")
_MIN_BUCKET = 16


@dataclasses.dataclass
class Example:
    """One input line: text_a, and text_b for a `text_a ||| text_b` pair (else None)."""

    text_a: str
    text_b: str | None = None


@dataclasses.dataclass
class Feature:
    """An example as the encoder sees it: WordPiece `tokens` ([CLS] ... [SEP], no padding), their
    `input_ids` and `token_type_ids` (ints, the same length)."""

    tokens: list[str]
    input_ids: list[int]
    token_type_ids: list[int]


def read_examples(input_file: str) -> list[Example]:
    """The examples of a UTF-8 text file, one per line (the original's `read_examples`).

    A line is stripped of surrounding whitespace; `a ||| b` is the pair (a, b), each side stripped. The
    file is read by `corpus.text_lines`, which refuses a file that is not text; every line must be an
    example, so a text file with some lines that are not UTF-8 (or hold NUL bytes) is refused too.

    Raises:
      FileNotFoundError: no such file.
      ValueError: (one line) not text (`<input_file>: not text: N of its M lines (P%) ...`); or
        `<input_file>:<line>: ...`: a line that is not UTF-8 or holds a NUL byte, a blank line, a line with
        more than one "|||", an empty side of a pair; or a file without any line.
    """
    stats = corpus.ReadStats()
    numbered = [(stats.lines, line) for line in corpus.text_lines(input_file, stats)]  # refuses non-text
    if stats.invalid_utf8_lines:
        first = next((expected for expected, (number, _) in enumerate(numbered, 1) if number != expected),
                     len(numbered) + 1)
        raise ValueError(f"{input_file}:{first}: not UTF-8 text or holds a NUL byte (lines of that kind: "
                         f"{stats.invalid_utf8_lines} of {stats.lines}; every line is an example)")
    examples = [_parse_line(line, input_file, number) for number, line in numbered]
    if not examples:
        raise ValueError(f"{input_file}: no examples (the file is empty)")
    return examples


def _parse_line(line: str, input_file: str, number: int) -> Example:
    line = line.strip()
    if not line:
        raise ValueError(f"{input_file}:{number}: empty line (one example per line, 'text_a ||| text_b' for a pair)")
    parts = line.split(PAIR_SEPARATOR)
    if len(parts) > 2:
        raise ValueError(f"{input_file}:{number}: {len(parts) - 1} '{PAIR_SEPARATOR}' separators; a pair is "
                         f"'text_a {PAIR_SEPARATOR} text_b'")
    if len(parts) == 1:
        return Example(line)
    a, b = (p.strip() for p in parts)
    if not a or not b:
        raise ValueError(f"{input_file}:{number}: empty {'text_a' if not a else 'text_b'} in a "
                         f"'text_a {PAIR_SEPARATOR} text_b' pair")
    return Example(a, b)


def parse_layers(layers: str, num_hidden_layers: int | None = None) -> tuple[int, ...]:
    """--layers ("-1,-2,-3,-4") -> the layer indices (ints, in the given order, repeats kept).

    An index counts as in the original's `get_all_encoder_layers()[index]`: 0 is the first encoder
    layer's output, -1 the last's. Without num_hidden_layers only the syntax is checked.

    Raises:
      ValueError: (one line, naming --layers) an entry that is not an integer (an empty flag included),
        or an index outside [-num_hidden_layers, num_hidden_layers).
    """
    try:
        indices = tuple(int(x) for x in layers.split(","))
    except ValueError:
        raise ValueError(f"--layers={layers!r} is not a comma-separated list of integers") from None
    if num_hidden_layers is None:
        return indices
    bad = [i for i in indices if not -num_hidden_layers <= i < num_hidden_layers]
    if bad:
        raise ValueError(f"--layers={layers!r}: index {bad[0]} is outside [-{num_hidden_layers}, "
                         f"{num_hidden_layers}) for a model with {num_hidden_layers} layers")
    return indices


def convert_examples(examples: Sequence[Example], tokenizer: Tokenizer, max_seq_length: int) -> list[Feature]:
    """Examples -> Features as the original's `convert_examples_to_features`, without padding.

    [CLS] tokens_a [SEP] (type 0), then tokens_b [SEP] (type 1) for a pair; a single text keeps its
    first max_seq_length - 2 tokens, a pair is cut to max_seq_length - 3 by dropping the last token of the
    longer side (`truncate_seq_pair`).

    Raises:
      ValueError: max_seq_length < 3 (naming --max_seq_length).
    """
    if max_seq_length < 3:
        raise ValueError(f"--max_seq_length={max_seq_length} leaves no room for text ([CLS], [SEP], [SEP])")
    features = []
    for example in examples:
        tokens_a = tokenizer.tokenize(example.text_a)
        tokens_b = tokenizer.tokenize(example.text_b) if example.text_b is not None else None
        if tokens_b is None:
            tokens_a = tokens_a[:max_seq_length - 2]
        else:
            truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
        tokens = ["[CLS]", *tokens_a, "[SEP]"]
        types = [0] * len(tokens)
        if tokens_b is not None:
            tokens += [*tokens_b, "[SEP]"]
            types += [1] * (len(tokens_b) + 1)
        features.append(Feature(tokens, tokenizer.convert_tokens_to_ids(tokens), types))
    return features


class _LayerFeatures(nn.Module):
    """The encoder (named "bert", so that fine-tuning's loading applies) -> the chosen layers' outputs,
    float32 [B, L, K, D]; `layers` index the encoder layers as `parse_layers` does."""

    config: modeling.BertConfig
    layers: tuple[int, ...]

    @nn.compact
    def __call__(self, input_ids, token_type_ids, attention_mask, deterministic: bool = True):
        out = modeling.BertModel(self.config, add_pooling_layer=False, name="bert")(
            input_ids, token_type_ids, attention_mask, deterministic, output_hidden_states=True)
        encoder_layers = out.hidden_states[1:]  # the embedding output is not an encoder layer
        return jnp.stack([encoder_layers[i] for i in self.layers], axis=2).astype(jnp.float32)


def _job_config(init_checkpoint: str, vocab_file: str, do_lower_case: bool | None) -> ml_collections.ConfigDict:
    """The fields of a fine-tuning config that `sources.resolve` / `job.load_tokenizer` read."""
    model = ml_collections.ConfigDict(dataclasses.asdict(modeling.BertConfig()))  # compute options: float32
    return ml_collections.ConfigDict(dict(init_checkpoint=init_checkpoint, vocab_file=vocab_file,
                                          do_lower_case=do_lower_case, model=model))


def _batches(features: Sequence[Feature], rows: int, max_seq_length: int) -> Iterator[tuple[dict, list[Feature]]]:
    """({input_ids, token_type_ids, attention_mask: int32 [rows, bucket]}, the batch's features) per batch
    of features in order; rows past the real ones are padding (all zeros but an attended [PAD] at 0)."""
    doublings = (_MIN_BUCKET << i for i in range(max_seq_length.bit_length()))
    buckets = tuple(b for b in doublings if b < max_seq_length) + (max_seq_length,)
    for start in range(0, len(features), rows):
        chunk = list(features[start:start + rows])
        length = int(batching.bucket_of(max(len(f.tokens) for f in chunk), buckets))
        arrays = {k: np.zeros((rows, length), np.int32) for k in prediction.INPUT_NAMES}
        arrays["attention_mask"][:, 0] = 1  # padding rows attend to one token: no all-masked softmax
        for r, f in enumerate(chunk):
            n = len(f.tokens)
            arrays["input_ids"][r, :n] = f.input_ids
            arrays["token_type_ids"][r, :n] = f.token_type_ids
            arrays["attention_mask"][r, :n] = 1
        yield arrays, chunk


def extract(init_checkpoint: str, features: Sequence[Feature], layers: str, *, init=None, batch_size: int = 32,
            max_seq_length: int = 128, num_devices: int = 0) -> Iterator[np.ndarray]:
    """Runs the encoder of `init_checkpoint` over `features` -> per feature, in order, float32
    [num_tokens, K, D]: the outputs of the K `layers` (a --layers string, see `parse_layers`) at its tokens.

    Args:
      init: `sources.resolve`'s Initialisation of init_checkpoint, when the caller has it.
      batch_size: examples per forward pass (rounded up to a multiple of the device count with padding rows).
      num_devices: devices of the data-parallel mesh (0: all).

    A generator: the encoder is loaded on the first `next`, one batch runs on the devices while the
    previous one is handed out.

    Raises (on the first `next`):
      ValueError: bad --layers (`parse_layers`), batch_size < 1, max_seq_length over the model's
        max_position_embeddings, num_devices outside [0, device count]; bad checkpoints as
        `sources.resolve`.
      FileNotFoundError: init_checkpoint holds no encoder (`sources.resolve`).
    """
    if batch_size < 1:
        raise ValueError(f"--batch_size={batch_size} must be positive")
    init = init or sources.resolve(init_checkpoint, _job_config(init_checkpoint, "", None).model,
                                          field="--init_checkpoint")
    config = init.config
    indices = parse_layers(layers, config.num_hidden_layers)
    if max_seq_length > config.max_position_embeddings:
        raise ValueError(f"--max_seq_length={max_seq_length} exceeds the model's max_position_embeddings="
                         f"{config.max_position_embeddings}")
    if not 0 <= num_devices <= jax.device_count():
        raise ValueError(f"--num_devices={num_devices} is not in [0, {jax.device_count()}] (0: every device)")
    mesh = steps.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, num_devices=num_devices)))
    ways = sharding.batch_axis_size(mesh)
    rows = -(-batch_size // ways) * ways
    model = _LayerFeatures(config, indices)
    state, shardings = finetune.create_state(model, optax.identity(), mesh, init, seed=0)
    step = steps.jit_eval_step(functools.partial(prediction.predict_step, model=model), mesh, shardings.params)

    def handed_out(values, chunk):
        values = np.asarray(jax.device_get(values))
        for r, f in enumerate(chunk):
            yield values[r, :len(f.tokens)]

    pending = None
    with jax.set_mesh(mesh):
        for arrays, chunk in _batches(features, rows, max_seq_length):
            values = step(state.params, steps.global_batch(arrays, mesh))  # dispatched, not waited for
            if pending is not None:
                yield from handed_out(*pending)
            pending = values, chunk
    if pending is not None:
        yield from handed_out(*pending)


def _atomic_binary(output_file: str):
    """(file object open for writing at a temporary name beside output_file, commit(), abort())."""
    if storage.is_remote(output_file):
        raise ValueError(f"--output_file={output_file!r}: a local path is needed (the file is renamed into place)")
    tmp = f"{output_file}.tmp{os.getpid()}"
    try:
        f = open(tmp, "wb")
    except OSError as e:
        raise ValueError(f"--output_file={output_file!r}: cannot write beside it ({e.strerror})") from None

    def commit():
        f.close()
        os.replace(tmp, output_file)

    def abort():
        f.close()
        if os.path.exists(tmp):
            os.remove(tmp)

    return f, commit, abort


def _json_line(index: int, tokens: Sequence[str], values: np.ndarray, layers: Sequence[int], concat: bool) -> str:
    """The original's output line: values [num_tokens, K, D] float32, rounded as round(float(x), 6)."""
    features = []
    for token, per_token in zip(tokens, values):
        if concat:
            entries = [{"index": list(layers), "values": [round(x, 6) for x in per_token.reshape(-1).tolist()]}]
        else:
            entries = [{"index": layer, "values": [round(x, 6) for x in v.tolist()]}
                       for layer, v in zip(layers, per_token)]
        features.append({"token": token, "layers": entries})
    return json.dumps({"linex_index": index, "features": features}) + "\n"


def write_features(output_file: str, features: Sequence[Feature], values: Iterator[np.ndarray],
                   layers: Sequence[int], output_format: str = "json", concat_layers: bool = False) -> int:
    """Writes the `values` of `features` (float32 [num_tokens, K, D] each, as `extract` yields them) to
    output_file in `output_format` (see the module docstring), under a temporary name renamed at the end.

    Returns the number of examples written.

    Raises:
      ValueError: an unknown output_format, a remote output_file or one whose directory cannot be written;
        the errors of `values` (e.g. `extract`'s) pass through. Nothing is left behind on any error.
    """
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"--output_format={output_format!r} is not one of {list(OUTPUT_FORMATS)}")
    f, commit, abort = _atomic_binary(output_file)
    count = 0
    try:
        archive = zipfile.ZipFile(f, "w", allowZip64=True) if output_format == "npz" else None
        if archive is not None:
            _write_npy(archive, "layers", np.asarray(layers, np.int32))
        for count, (feature, v) in enumerate(zip(features, values), 1):
            if archive is None:
                f.write(_json_line(count - 1, feature.tokens, v, layers, concat_layers).encode("utf-8"))
                continue
            v = v.reshape(len(v), -1) if concat_layers else v
            _write_npy(archive, f"features_{count - 1}", np.ascontiguousarray(v, np.float32))
            _write_npy(archive, f"tokens_{count - 1}", np.asarray(feature.tokens, dtype=str))
        if archive is not None:
            archive.close()
        commit()
    except BaseException:
        abort()
        raise
    return count


def _write_npy(archive: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    """One .npy entry of an .npz archive (what np.savez writes), streamed into the zip."""
    with archive.open(f"{name}.npy", "w", force_zip64=True) as entry:
        np.lib.format.write_array(entry, array, allow_pickle=False)


def _define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """The original's flags (less the TPU estimator's and --bert_config_file), plus the output options."""
    string, integer, boolean = (functools.partial(define, flag_values=flag_values)
                                for define in (flags.DEFINE_string, flags.DEFINE_integer, flags.DEFINE_bool))
    string("input_file", None, "Text file, one example per line; 'text_a ||| text_b' for a pair.")
    string("output_file", None, "Output file: JSON lines (--output_format=json) or an .npz archive (npz).")
    string("layers", "-1,-2,-3,-4", "Comma-separated encoder layer indices (-1: the last layer, 0: the first).")
    integer("max_seq_length", 128, "Maximum WordPiece tokens per example, [CLS] and [SEP]s included; longer "
            "inputs are truncated.")
    string("init_checkpoint", None, "The encoder: a Hugging Face directory, a bert_jax pre-training workdir or "
           "<workdir>/checkpoints/<step>.")
    string("vocab_file", "", "WordPiece vocabulary (default: the vocab.txt of --init_checkpoint).")
    boolean("do_lower_case", None, "Lower-case and strip accents (uncased models); default: the casing recorded "
            "with --init_checkpoint, else True.")
    integer("batch_size", 32, "Examples per forward pass.")
    flags.DEFINE_enum("output_format", "json", list(OUTPUT_FORMATS), "json: the original's JSON lines; npz: "
                      "float32 arrays per example (large inputs).", flag_values=flag_values)
    boolean("concat_layers", False, "One vector per token: the --layers outputs concatenated (paper Table 7).")
    integer("num_devices", 0, "Devices to run on (0: all).")
    flags.mark_flags_as_required(["input_file", "output_file", "init_checkpoint"], flag_values=flag_values)


def parse_flags(argv: Sequence[str]) -> flags.FlagValues:
    """argv (program name first) parsed against a fresh set of this command's flags, for calling `main`
    in-process. Raises flags.Error for an unknown flag, a bad value or a missing required flag."""
    flag_values = flags.FlagValues()
    _define_flags(flag_values)
    flag_values(list(argv))
    return flag_values


def main(argv: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    """The command: read --input_file, tokenize, run the encoder, write --output_file.

    Bad input (file, line, flag, checkpoint) exits with one line `extract_features: <message>`
    (SystemExit), leaving no output file.
    """
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {list(argv[1:])}")
    logging.set_verbosity(logging.WARNING)
    f = flag_values
    try:
        parse_layers(f.layers)  # the syntax, before any work
        examples = read_examples(f.input_file)
        config = _job_config(f.init_checkpoint, f.vocab_file, f.do_lower_case)
        init = sources.resolve(config.init_checkpoint, config.model, field="--init_checkpoint")
        layers = parse_layers(f.layers, init.config.num_hidden_layers)  # before the encoder is built
        features = convert_examples(examples, job.load_tokenizer(config, init), f.max_seq_length)
        values = extract(f.init_checkpoint, features, f.layers, init=init, batch_size=f.batch_size,
                         max_seq_length=f.max_seq_length, num_devices=f.num_devices)
        count = write_features(f.output_file, features, values, layers, f.output_format, f.concat_layers)
    except errors.USER_ERRORS as e:
        raise errors.exit_with("extract_features", e) from None
    print(f"wrote features of {count} examples to {f.output_file}")
    return 0


if __name__ == "__main__":
    from bert_jax import console

    console.install()
    _define_flags()
    errors.run(main, "extract_features")
