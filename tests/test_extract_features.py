"""Feature extraction (paper section 5.3, google-research/bert extract_features.py) and BertModel's
output_hidden_states.

Truth: transformers' BertModel(output_hidden_states=True). The real all-MiniLM-L6-v2 on real MRPC sentences
and pairs through the command's `main` (in-process, array output: < 1e-5), its values also written in the
original's JSON layout (< 1e-4 after its rounding); the JSON command end to end on a tiny transformers
checkpoint through `python -m` (two devices, two batches, padding rows).
"""

import csv
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax.tasks import extract_features
from bert_jax.model import modeling
from bert_jax.checkpoints import weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(vocab_size=97, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=128)
TINY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "the", "a", "cat", "dog", "sat", "on", "mat",
              "ran", "##s", "##ing"]
TINY_LINES = [("The cat sat on the mat.", "A dog ran"), ("the dogs sat", None), ("cats, dogs", "a zebra"),
              ("running on", "the mat"), ("A cat.", None)]  # "zebra": [UNK]


def _lines(data_dir):
    """3 MRPC dev pairs and 3 single sentences, spread over the file."""
    with open(data_dir / "glue" / "MRPC" / "dev.tsv", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    picked = [rows[i] for i in np.linspace(0, len(rows) - 1, 6).astype(int)]
    return [(r[3], r[4]) for r in picked[:3]] + [(r[3], None) for r in picked[3:]]


def _run(tmp_path, name, lines, *flags_):
    """Writes `lines` ((text_a, text_b or None) or a raw line) and runs the command's main in-process ->
    the output path."""
    input_file, output_file = tmp_path / f"{name}.txt", tmp_path / name
    input_file.write_text("".join(f"{a} ||| {b}\n" if b else f"{a}\n" for a, b in lines), encoding="utf-8")
    argv = ["extract_features", f"--input_file={input_file}", f"--output_file={output_file}", *flags_]
    extract_features.main(["extract_features"], extract_features.parse_flags(argv))
    return output_file


def _reference(model, tokenizer, lines):
    """Per line: transformers' tokens and hidden states [num_layers + 1, num_tokens, D] (embeddings first)."""
    out = []
    for a, b in lines:
        enc = tokenizer(a, b, return_tensors="pt") if b else tokenizer(a, return_tensors="pt")
        with torch.no_grad():
            states = model(**enc, output_hidden_states=True).hidden_states
        out.append((tokenizer.convert_ids_to_tokens(enc["input_ids"][0]), np.stack([s[0].numpy() for s in states])))
    return out


def _check_json(path, reference, layers=(-1, -2, -3, -4), tolerance=1e-4):
    """The original's layout, its rounding, the tokens, and values within `tolerance` of `reference`."""
    records = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert [r["linex_index"] for r in records] == list(range(len(reference)))
    worst = 0.0
    for record, (tokens, states) in zip(records, reference):
        assert list(record) == ["linex_index", "features"]
        assert [f["token"] for f in record["features"]] == tokens
        for t, feature in enumerate(record["features"]):
            assert list(feature) == ["token", "layers"]
            assert [layer["index"] for layer in feature["layers"]] == list(layers)
            for layer in feature["layers"]:
                assert list(layer) == ["index", "values"]
                values = np.asarray(layer["values"])
                assert values.shape == (states.shape[-1],)
                assert np.array_equal(values, np.round(values, 6))  # the original's round(float(x), 6)
                worst = max(worst, np.abs(values - states[layer["index"]][t]).max())
    assert worst < tolerance, worst


@pytest.fixture(scope="module")
def truth(minilm_dir, data_dir):
    lines = _lines(data_dir)
    tokenizer = transformers.BertTokenizer(str(minilm_dir / "vocab.txt"), do_lower_case=True)
    return lines, _reference(transformers.BertModel.from_pretrained(str(minilm_dir)).eval(), tokenizer, lines)


@pytest.fixture(scope="module")
def npz_run(truth, minilm_dir, tmp_path_factory):
    path = _run(tmp_path_factory.mktemp("npz"), "features.npz", truth[0], f"--init_checkpoint={minilm_dir}",
                "--output_format=npz", "--layers=-1,-2,-3,-4,0", "--num_devices=1")
    assert sorted(p.name for p in path.parent.iterdir()) == ["features.npz", "features.npz.txt"]  # no temporary
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A 4-layer BertForPreTraining saved by transformers (heads included: loading initialises nothing),
    with a 17-token vocabulary; -> (directory, the model's encoder, its tokenizer)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_hf")
    model = transformers.BertForPreTraining(transformers.BertConfig(**SMALL)).eval()
    model.save_pretrained(path)
    (path / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    return path, model.bert, transformers.BertTokenizer(str(path / "vocab.txt"), do_lower_case=True)


def test_npz_matches_transformers(truth, npz_run):
    lines, reference = truth
    assert npz_run["layers"].tolist() == [-1, -2, -3, -4, 0] and npz_run["layers"].dtype == np.int32
    assert len(npz_run) == 1 + 2 * len(lines)
    for i, (tokens, states) in enumerate(reference):
        values = npz_run[f"features_{i}"]
        assert npz_run[f"tokens_{i}"].tolist() == tokens
        assert values.dtype == np.float32 and values.shape == (len(tokens), 5, states.shape[-1])
        # index 0 is the first encoder layer: transformers' hidden_states[1] (0 is the embeddings)
        expected = np.stack([states[k] for k in (-1, -2, -3, -4, 1)], axis=1)
        assert np.abs(values - expected).max() < 1e-5


def test_json_of_minilm_features(truth, npz_run, tmp_path):
    """MiniLM's extracted values written in the original's JSON layout: within 1e-4 of transformers."""
    lines, reference = truth
    features = [extract_features.Feature(npz_run[f"tokens_{i}"].tolist(), [], []) for i in range(len(lines))]
    values = (npz_run[f"features_{i}"][:, :4] for i in range(len(lines)))  # layers -1, -2, -3, -4
    path = tmp_path / "features.jsonl"
    assert extract_features.write_features(str(path), features, values, [-1, -2, -3, -4]) == len(lines)
    _check_json(path, reference)


@pytest.mark.integration
def test_json_command_matches_transformers(tiny_hf, tmp_path):
    """`python -m bert_jax.extract_features` with the original's flags and output; 2 devices, 3 examples per
    batch (4 rows, padding rows in both batches), two batches."""
    directory, model, tokenizer = tiny_hf
    input_file, output_file = tmp_path / "input.txt", tmp_path / "features.jsonl"
    input_file.write_text("".join(f"{a} ||| {b}\n" if b else f"{a}\n" for a, b in TINY_LINES), encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "bert_jax.extract_features", f"--input_file={input_file}",
                             f"--output_file={output_file}", f"--init_checkpoint={directory}", "--layers=-1,-2,-3,-4",
                             "--max_seq_length=128", "--batch_size=3", "--do_lower_case", "--num_devices=2"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == f"wrote features of {len(TINY_LINES)} examples to {output_file}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features.jsonl", "input.txt"]  # no temporary
    reference = _reference(model, tokenizer, TINY_LINES)
    assert "[UNK]" in reference[2][0] and reference[0][0].count("[SEP]") == 2
    _check_json(output_file, reference)


def test_concat_layers(truth, npz_run, tmp_path):
    """--concat_layers: one [4 * D] vector per token, the four layers' outputs in --layers order."""
    lines, reference = truth
    features = [extract_features.Feature(npz_run[f"tokens_{i}"].tolist(), [], []) for i in range(len(lines))]
    four = [npz_run[f"features_{i}"][:, :4] for i in range(len(lines))]  # layers -1, -2, -3, -4
    for output_format in ("npz", "json"):
        path = str(tmp_path / f"concat.{output_format}")
        n = extract_features.write_features(path, features, iter(four), [-1, -2, -3, -4], output_format,
                                            concat_layers=True)
        assert n == len(lines)
        if output_format == "npz":
            with np.load(path, allow_pickle=False) as z:
                concat = [z[f"features_{i}"] for i in range(len(lines))]
        else:
            records = [json.loads(line) for line in open(path, encoding="utf-8")]
            assert all(len(f["layers"]) == 1 and f["layers"][0]["index"] == [-1, -2, -3, -4]
                       for r in records for f in r["features"])
            concat = [np.asarray([f["layers"][0]["values"] for f in r["features"]]) for r in records]
        for i, (tokens, states) in enumerate(reference):
            d = states.shape[-1]
            assert concat[i].shape == (len(tokens), 4 * d)
            expected = np.concatenate([four[i][:, k] for k in range(4)], axis=-1)
            # JSON holds round(x, 6): at most half a unit of the 6th decimal off, plus float32's own step
            np.testing.assert_allclose(concat[i], expected, atol=5e-7 + 1e-7 if output_format == "json" else 0,
                                       rtol=0)
            truth_concat = np.concatenate([states[k] for k in (-1, -2, -3, -4)], axis=-1)
            assert np.abs(concat[i] - truth_concat).max() < 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["concat.json", "concat.npz"]


def _random_params(config, seed=0):
    """A BertModel tree of random numpy values (no compiled initialiser): biases and LayerNorms moved too."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: nn.unbox(modeling.BertModel(config).init(jax.random.key(0),
                                                                             jnp.zeros((1, 4), jnp.int32))))

    def value(path, x):
        scale = jax.tree_util.keystr(path).endswith("['scale']")  # LayerNorm gains around 1
        return (scale + rng.normal(0.0, 0.1 if scale else 0.05, x.shape)).astype(np.float32)

    return jax.tree_util.tree_map_with_path(value, shapes["params"])


def test_hidden_states_scan_equals_loop():
    config = modeling.BertConfig(**dict(SMALL, num_hidden_layers=2), kernels="reference")
    params = _random_params(config)
    scanned = weights.stack_layers(params, config.num_hidden_layers)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, SMALL["vocab_size"], (3, 11)), jnp.int32)
    mask = jnp.asarray(np.arange(11)[None] < np.array([[11], [7], [4]]), jnp.int32)
    types = jnp.asarray(np.arange(11)[None] >= 5, jnp.int32) * mask
    scan_configs = [config.replace(scan_layers=True, remat_policy=r) for r in ("none", "full")]

    @jax.jit
    def run(params, scanned):
        def apply(cfg, p, **kwargs):
            return modeling.BertModel(cfg).apply({"params": p}, ids, types, mask, **kwargs)

        embeddings = modeling.BertModel(config).apply({"params": params}, ids, types, True,
                                                      method=lambda m, *a: m.embeddings(*a))
        return (apply(config, params), apply(config, params, output_hidden_states=True), embeddings,
                [apply(c, scanned, output_hidden_states=True) for c in scan_configs])

    plain, loop, embeddings, scans = run(params, scanned)
    assert plain.hidden_states is None  # the default is unchanged
    assert len(loop.hidden_states) == config.num_hidden_layers + 1
    np.testing.assert_array_equal(loop.sequence_output, plain.sequence_output)
    np.testing.assert_array_equal(loop.hidden_states[-1], loop.sequence_output)
    np.testing.assert_array_equal(loop.hidden_states[0], embeddings)
    for scan in scans:
        assert len(scan.hidden_states) == config.num_hidden_layers + 1
        for a, b in zip(loop.hidden_states, scan.hidden_states):
            assert b.shape == (3, 11, SMALL["hidden_size"])
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
        np.testing.assert_allclose(loop.pooled_output, scan.pooled_output, atol=1e-5, rtol=0)
    # The same parameter trees with and without hidden states, in both layouts.
    for cfg in (config, scan_configs[0]):
        ids1 = jnp.zeros((1, 4), jnp.int32)
        trees = [jax.eval_shape(lambda h=h: modeling.BertModel(cfg).init(jax.random.key(0), ids1,
                                                                         output_hidden_states=h))
                 for h in (False, True)]
        assert jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), trees[0]) == \
            jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), trees[1])


def test_truncation_as_the_original(minilm_dir):
    from bert_jax.data.tokenization import Tokenizer

    tok = Tokenizer(str(minilm_dir / "vocab.txt"))
    long_a, short_b = "one two three four five six seven eight", "nine ten"
    single, pair = extract_features.convert_examples(
        [extract_features.Example(long_a), extract_features.Example(long_a, short_b)], tok, 8)
    assert single.tokens == ["[CLS]", "one", "two", "three", "four", "five", "six", "[SEP]"]
    assert pair.tokens == ["[CLS]", "one", "two", "three", "[SEP]", "nine", "ten", "[SEP]"]
    assert pair.token_type_ids == [0] * 5 + [1] * 3 and pair.input_ids == tok.convert_tokens_to_ids(pair.tokens)


def test_layer_indices():
    assert extract_features.parse_layers("-1,-2,-3,-4", 6) == (-1, -2, -3, -4)
    assert extract_features.parse_layers("0,5,-6", 6) == (0, 5, -6)
    for bad in ("-7", "6", "-1,-7"):
        with pytest.raises(ValueError, match=r"^--layers='[-0-9,]+': index -?[67] is outside \[-6, 6\) for a model "
                                             "with 6 layers$"):
            extract_features.parse_layers(bad, 6)


@pytest.mark.parametrize("text, flag, message", [
    ("a sentence\n\nanother\n", "", "in.txt:2: empty line"),
    ("a ||| b\nx ||| y ||| z\n", "", "in.txt:2: 2 '|||' separators"),
    ("a |||  \n", "", "in.txt:1: empty text_b"),
    (b"fine\ncaf\xe9\n", "", "in.txt:2: not UTF-8 text"),
    ("", "", "in.txt: no examples (the file is empty)"),
    ("a sentence\n", "--layers=-1,-5", "--layers='-1,-5': index -5 is outside [-4, 4) for a model with 4 layers"),
    ("a sentence\n", "--layers=-1,last", "--layers='-1,last' is not a comma-separated list of integers"),
])
def test_bad_input_one_line_errors(tiny_hf, tmp_path, text, flag, message):
    (tmp_path / "in.txt").write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    argv = ["extract_features", f"--input_file={tmp_path / 'in.txt'}", f"--output_file={tmp_path / 'out'}",
            f"--init_checkpoint={tiny_hf[0]}", *([flag] if flag else [])]
    with pytest.raises(SystemExit) as e:
        extract_features.main(["extract_features"], extract_features.parse_flags(argv))
    assert str(e.value).startswith("extract_features: ") and message in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]  # no output, no temporary
