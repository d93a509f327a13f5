"""SWAG (paper section 4.4): BertForMultipleChoice against transformers (from_hf / to_hf both ways, loss),
the reader on small files written here in the official CSV layout (header of rowanz/swagaf's data/),
the four choice sequences checked token by token, the job end to end from random init, and one-line
errors for bad rows. SWAG is not in TFDS, so there is no TFDS path to test."""

import contextlib
import csv
import io
import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from bert_jax.checkpoints import hf
from bert_jax.model import heads
from bert_jax.training import losses
from bert_jax.data import swag
from bert_jax.data.tokenization import Tokenizer
from bert_jax.tasks import swag as swag_task
from bert_jax.configs import pretrain
from bert_jax.configs import swag as swag_config

SMALL = dict(vocab_size=211, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
             max_position_embeddings=40)
HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"


def _row(index, sent1, sent2, endings, label=None, video="anetv_x1", gold="gold"):
    """One CSV row in the official layout (csv module quoting, as the released files)."""
    out = io.StringIO()
    fields = [index, video, 1000 + index, f"{sent1} {sent2}", sent1, sent2, gold, *endings]
    csv.writer(out, lineterminator="\n").writerow(fields + ([] if label is None else [label]))
    return out.getvalue()


TRAIN_ROWS = [
    ("A man is standing on a ladder against the house.", "He", ("paints the window frames white.",
     "swims across the lake.", "eats the ladder slowly.", "flies over the roof."), 0),
    ("The woman pours batter into a hot pan.", "She", ("reads a newspaper on the roof.",
     "flips the pancake with a spatula.", "drives the pan to work.", "sings to the batter."), 1),
    ("Two kids kick a ball across the field.", "One of them", ("plants a tree in the ball.",
     "paints the goal blue.", "scores a goal past the keeper.", "falls asleep on the bench."), 2),
    ("Someone opens the car door.", "Someone", ("eats the door.", "jumps into the sea.",
     "folds the car.", "gets in and starts the engine."), 3),
    ("A chef chops onions on a board.", "The chef", ("adds them to the pot.", "throws the board away.",
     "runs out of the city.", "paints the onions."), 0),
    ("The dog waits by the door.", "Its owner", ("grabs the leash and opens the door.",
     "flies to the moon.", "reads the dog.", "cooks the door."), 0),
    ("A girl climbs onto the stage.", "She", ("eats the stage.", "bows to the audience.",
     "digs a tunnel.", "sleeps under the stage."), 1),
    ("A man lifts a heavy box.", "He", ("throws it at the moon.", "eats the box.",
     "carries it to the truck.", "paints it green."), 2),
]
DEV_ROWS = [
    ("A boy holds a kite in the wind.", "The kite", ("rises into the sky.", "eats the boy.",
     "turns into a fish.", "reads a book."), 0),
    ("The baker puts dough in the oven.", "She", ("swims in the dough.", "closes the oven door.",
     "flies home.", "sings to the oven."), 1),
    ("A woman ties her running shoes.", "She", ("eats the shoes.", "plants the shoes.",
     "starts jogging down the road.", "paints the road."), 2),
]
TEST_ROWS = [
    ("A man picks up a guitar.", "He", ("strums a few chords.", "eats the guitar.", "flies away.",
     "swims in the guitar.")),
    ("The cat jumps onto the table.", "It", ("knocks over a glass.", "reads the table.", "drives a car.",
     "bakes a cake.")),
]


def _csv(rows, labelled=True):
    header = HEADER if labelled else HEADER.rsplit(",", 1)[0]
    return header + "\n" + "".join(_row(i, *r[:3], r[3] if labelled else None) for i, r in enumerate(rows))


@pytest.fixture(scope="module")
def swag_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("swag")
    (root / "train.csv").write_text(_csv(TRAIN_ROWS), encoding="utf-8")
    (root / "val.csv").write_text(_csv(DEV_ROWS), encoding="utf-8")
    (root / "test.csv").write_text(_csv(TEST_ROWS, labelled=False), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def tokenizer(data_dir):
    return Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))


# ----------------------------------------------------------------------------- the head against transformers


def _hf_multiple_choice(seed):
    torch.manual_seed(seed)
    model = transformers.BertForMultipleChoice(transformers.BertConfig(**SMALL)).eval()
    with torch.no_grad():  # move biases, LayerNorms and the head off their init so every tensor shows
        for name, p in model.named_parameters():
            if name.startswith("classifier."):
                p.copy_(0.5 * torch.randn_like(p))
            elif "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _choice_inputs(seed, batch=3, choices=4, length=14):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, SMALL["vocab_size"], size=(batch, choices, length))
    lengths = rng.integers(6, length + 1, size=(batch, choices))
    mask = (np.arange(length) < lengths[..., None]).astype(np.int64)
    types = ((np.arange(length) >= lengths[..., None] // 2) * mask).astype(np.int64)
    return {"input_ids": ids * mask, "token_type_ids": types, "attention_mask": mask}


def _logits(model, params, inputs):
    out = model.apply({"params": params}, **{k: jnp.asarray(v, jnp.int32) for k, v in inputs.items()})
    return np.asarray(out.logits)


@pytest.fixture(scope="module")
def hf_mc(tmp_path_factory):
    """A random transformers BertForMultipleChoice saved with save_pretrained, and from_hf of it."""
    path = tmp_path_factory.mktemp("hf_mc")
    reference = _hf_multiple_choice(0)
    reference.save_pretrained(path)
    with _warnings("bert_jax.checkpoints.weights") as reports:
        config, params = hf.from_hf(str(path))
    return reference, path, config, params, reports


@contextlib.contextmanager
def _warnings(logger):
    """The messages of the WARNING records that `logger` emits inside the block (a module fixture's caplog)."""
    reports, handler = [], logging.Handler(logging.WARNING)
    handler.emit = lambda record: reports.append(record.getMessage())
    logging.getLogger(logger).addHandler(handler)
    try:
        yield reports
    finally:
        logging.getLogger(logger).removeHandler(handler)


def test_multiple_choice_head_matches_transformers_both_ways(hf_mc, tmp_path):
    reference, path, config, params, reports = hf_mc
    assert not any("classifier" in r for r in reports)  # read, not reported as unknown
    assert any("cls.seq_relationship.weight" in r for r in reports)  # absent pre-training heads: reported
    assert params["choice_classifier"]["kernel"].shape == (48, 1)
    tree = {"bert": params["bert"], "choice_classifier": params["choice_classifier"]}
    model = heads.BertForMultipleChoice(config)
    inputs = _choice_inputs(1)
    labels = np.array([2, 0, 3])
    ours = _logits(model, tree, inputs)
    with torch.no_grad():
        theirs = reference(**{k: torch.from_numpy(v) for k, v in inputs.items()}, labels=torch.from_numpy(labels))
    assert ours.shape == (3, 4) and ours.dtype == np.float32 and np.ptp(ours, axis=1).min() > 0.05
    np.testing.assert_allclose(ours, theirs.logits.numpy(), atol=1e-5, rtol=0)
    total, count = losses.classification_loss(jnp.asarray(ours), jnp.asarray(labels))
    assert float(total / count) == pytest.approx(float(theirs.loss), rel=1e-5)

    hf.to_hf(config, tree, str(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["BertForMultipleChoice"]
    original, written = (load_file(str(d / "model.safetensors")) for d in (path, tmp_path / "out"))
    assert set(written) == set(original) and written["classifier.weight"].shape == (1, 48)
    for name, value in written.items():
        np.testing.assert_array_equal(value, original[name], err_msg=name)
    loaded, info = transformers.BertForMultipleChoice.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not any(info.values()), info
    with torch.no_grad():
        again = loaded.eval()(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.numpy()
    np.testing.assert_allclose(ours, again, atol=1e-5, rtol=0)
    # A [B, L] input is one choice each (the shape fine-tuning initialises with).
    one = {k: v[:, 0] for k, v in inputs.items()}
    np.testing.assert_allclose(_logits(model, tree, one), ours[:, :1], atol=1e-6)


def test_multiple_choice_bad_directories_and_trees_are_one_line(hf_mc, tmp_path):
    _, path, config, params, _ = hf_mc
    tensors = load_file(str(path / "model.safetensors"))
    hf_config = json.loads((path / "config.json").read_text())
    for name, bad, match in [
        ("nobias", {k: v for k, v in tensors.items() if k != "classifier.bias"},
         r"missing tensor classifier\.bias of the choice_classifier head"),
        ("twocols", dict(tensors, **{"classifier.weight": np.zeros((2, 48), np.float32)}),
         r"classifier\.weight \(2, 48\) and classifier\.bias \(1,\) do not fit choice_classifier \(1, 48\)"),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(hf_config))
        save_file(bad, str(tmp_path / name / "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(ValueError, match=match) as e:
            hf.from_hf(str(tmp_path / name))
        assert "\n" not in str(e.value) and "model.safetensors" in str(e.value)

    tree = {"bert": params["bert"], "choice_classifier": params["choice_classifier"]}
    for bad, kwargs, match in [
        (dict(tree, classifier={"kernel": np.zeros((48, 2)), "bias": np.zeros(2)}), {},
         "both choice_classifier and classifier heads"),
        (tree, {"labels": ["a"]}, "labels: given for a BertForMultipleChoice tree"),
        (dict(tree, choice_classifier={"kernel": np.zeros((48, 2)), "bias": np.zeros(1)}), {},
         r"choice_classifier/kernel has shape \(48, 2\), expected \(48, 1\)"),
        (params, {}, r"not part of a BERT model \(BertForMultipleChoice\).*mlm_LayerNorm"),
    ]:
        with pytest.raises(ValueError, match=match) as e:
            hf.to_hf(config, bad, str(tmp_path / "never"), **kwargs)
        assert "\n" not in str(e.value)
    assert not (tmp_path / "never").exists()
    with pytest.raises(ValueError, match=r"input_ids must be \[batch, choices, length\], got shape \(2,\)"):
        heads.BertForMultipleChoice(config).init(jax.random.key(0), jnp.zeros((2,), jnp.int32))


# ----------------------------------------------------------------------------- reader and features


def test_reader_on_the_official_layout(swag_dir):
    train = swag.read_swag_csv(str(swag_dir / "train.csv"))
    assert len(train) == 8 and [e.label for e in train] == [0, 1, 2, 3, 0, 0, 1, 2]
    first = train[0]
    assert (first.guid, first.context, first.start) == ("0", "A man is standing on a ladder against the house.", "He")
    assert first.endings == TRAIN_ROWS[0][2]
    assert first.choice(0) == "He paints the window frames white."  # sent2 + " " + ending, as run_swag.py
    test = swag.read_swag_csv(str(swag_dir / "test.csv"))
    assert [e.label for e in test] == [-1, -1] and test[1].endings[0] == "knocks over a glass."
    # Without the leading index column: columns by name, guid = line number.
    text = (swag_dir / "val.csv").read_text()
    plain = "\n".join(line.split(",", 1)[1] for line in text.splitlines()) + "\n"
    (swag_dir / "plain.csv").write_text(plain)
    rows = swag.read_swag_csv(str(swag_dir / "plain.csv"))
    assert [(e.guid, e.label) for e in rows] == [("2", 0), ("3", 1), ("4", 2)]
    assert rows[1].endings == DEV_ROWS[1][2]


def test_four_choice_features_token_by_token(swag_dir, tokenizer):
    dev = swag.read_swag_csv(str(swag_dir / "val.csv"))
    feats = swag.convert_examples_to_features(dev, tokenizer, max_seq_length=20)
    assert feats["input_ids"].shape == (3, 4, 20) and feats["labels"].tolist() == [0, 1, 2]
    assert all(feats[k].dtype == np.int32 for k in feats)
    tokens = tokenizer.convert_ids_to_tokens(feats["input_ids"][0, 0][feats["attention_mask"][0, 0] == 1])
    assert tokens == ["[CLS]", "a", "boy", "holds", "a", "kite", "in", "the", "wind", ".", "[SEP]",
                      "the", "kite", "rises", "into", "the", "sky", ".", "[SEP]"]
    assert feats["token_type_ids"][0, 0].tolist() == [0] * 11 + [1] * 8 + [0]
    assert tokenizer.convert_ids_to_tokens(feats["input_ids"][0, 1, 11:17]) == ["the", "kite", "eats", "the", "boy",
                                                                                 "."]
    # Truncation drops the last tokens of the longer side first (run_classifier.py's _truncate_seq_pair).
    short = swag.convert_examples_to_features(dev[:1], tokenizer, max_seq_length=12)
    tokens = tokenizer.convert_ids_to_tokens(short["input_ids"][0, 0])
    # a: 9 tokens, b: 7, room 9: pops a, a, b (tie), a, b, a, b -> 5 + 4.
    assert tokens == ["[CLS]", "a", "boy", "holds", "a", "kite", "[SEP]", "the", "kite", "rises", "into", "[SEP]"]


# ----------------------------------------------------------------------------- configs and the job


def test_config_is_the_papers_recipe():
    config = swag_config.get_config()
    assert (config.num_train_epochs, config.learning_rate, config.train_batch_size) == (3.0, 2e-5, 16)
    assert (config.train_file, config.dev_file, config.test_file) == ("train.csv", "val.csv", "test.csv")
    assert swag_config.get_config("tiny").model.hidden_size == 128


def test_swag_job_end_to_end_from_random_init(swag_dir, data_dir, tmp_path):
    config = swag_config.get_config("tiny")
    config.model = pretrain.model_config("tiny")
    config.vocab_file = str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    config.data_dir = str(swag_dir)
    config.max_seq_length, config.train_batch_size, config.eval_batch_size = 24, 4, 4
    config.num_train_epochs, config.learning_rate, config.log_every = 2.0, 1e-3, 1
    config.do_predict, config.save_checkpoint = True, False
    config.mesh.num_devices = 1
    metrics = swag_task.run(config, str(tmp_path))
    assert metrics["init"] == "random" and metrics["train_steps"] == 4 and np.isfinite(metrics["train_loss"])
    assert metrics["train_examples"] == 8 and metrics["eval_examples"] == 3
    assert min(abs(metrics["accuracy"] - 100 * k / 3) for k in range(4)) < 1e-9
    assert json.loads((tmp_path / "metrics.json").read_text())["accuracy"] == metrics["accuracy"]
    rows = list(csv.DictReader(open(tmp_path / "val_predictions.csv")))
    assert [r["index"] for r in rows] == ["0", "1", "2"] and [r["label"] for r in rows] == ["0", "1", "2"]
    assert 100 * np.mean([r["prediction"] == r["label"] for r in rows]) == pytest.approx(metrics["accuracy"])
    test = list(csv.DictReader(open(tmp_path / "test_predictions.csv")))
    assert [r["index"] for r in test] == ["0", "1"] and {r["prediction"] for r in test} <= {"0", "1", "2", "3"}
    assert metrics["test_predictions"] == str(tmp_path / "test_predictions.csv")


def test_accuracy_hand_computed():
    assert swag_task.compute_metrics(np.array([0, 1, 2, 3]), np.array([0, 1, 3, 3])) == {"accuracy": 75.0}
    with pytest.raises(ValueError, match="not the same non-empty"):
        swag_task.compute_metrics(np.array([0]), np.array([0, 1]))


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("text,match", [
    (HEADER + "\n" + _row(0, "A man sits.", "He", ("stands.", "", "runs.", "eats."), 0),
     r"bad.csv:2: ending1 is empty$"),
    (HEADER + "\n" + _row(0, "A man sits.", "He", ("stands.", "sleeps.", "runs.", "eats."), 4),
     r"bad.csv:2: label '4' is not one of 0, 1, 2, 3$"),
    (HEADER + "\n" + _row(0, "A man sits.", "He", ("stands.", "sleeps.", "runs.", "eats."), 0)
     + _row(1, "A man sits.", "He", ("stands.", "sleeps.", "runs."), 1),
     r"bad.csv:3: SWAG row has 11 columns, the header has 12$"),
    (HEADER + "\n" + _row(0, "A man sits.", "He", ("stands.", "sleeps.", "runs.", "eats."), "x"),
     r"bad.csv:2: label 'x' is not one of 0, 1, 2, 3$"),
    (",video-id,startphrase,sent1,sent2,ending0,ending1,ending2,label\n",
     r"bad.csv:1: SWAG header lacks columns \['ending3'\]"),
])
def test_bad_rows_are_one_line(tmp_path, text, match):
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        swag.read_swag_csv(str(bad))
    assert "\n" not in str(e.value) and str(bad) in str(e.value)


def test_missing_and_empty_files_are_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="train.csv' does not exist"):
        swag.read_swag_csv(str(tmp_path / "train.csv"))
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="empty.csv' is empty"):
        swag.read_swag_csv(str(tmp_path / "empty.csv"))
