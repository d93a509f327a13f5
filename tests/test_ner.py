"""CoNLL-2003 NER (paper section 5.3): BertForTokenClassification against transformers (from_hf / to_hf
both ways, the first-sub-token loss against transformers' ignore-index loss), the CoNLL column reader
on small files written here in the shared task's format (-DOCSTART-, blank lines, IOB1 as the original
release and IOB2 as the common copies), first-sub-token alignment and the splitting of long sentences
checked by hand, seqeval's entity scores against a hand-computed case, the TFDS conll2003 path under
`tfds.testing.mock_data`, the job end to end from random init, and one-line errors for bad lines."""

import contextlib
import json
import logging

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from bert_jax.checkpoints import hf
from bert_jax.model import heads
from bert_jax.training import losses
from bert_jax.data import ner
from bert_jax.data.tokenization import Tokenizer
from bert_jax.tasks import ner as ner_task
from bert_jax.configs import ner as ner_config
from bert_jax.configs import pretrain

SMALL = dict(vocab_size=211, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
             max_position_embeddings=40)
TAGS = ("O", "B-LOC", "I-LOC", "B-PER", "I-PER")


def _conll(*blocks):
    """Sentences as `word POS chunk NER` lines, a blank line after each; a block "-DOCSTART-" starts a document."""
    out = []
    for block in blocks:
        if block == "-DOCSTART-":
            out.append("-DOCSTART- -X- -X- O\n\n")
        else:
            out.append("".join(" ".join(line) + "\n" for line in block) + "\n")
    return "".join(out)


# The original release's tagging, IOB1: an entity starts with I-; B- only where it follows one of its type.
TRAIN = _conll(
    "-DOCSTART-",
    [("Nadim", "NNP", "B-NP", "I-PER"), ("Ladki", "NNP", "I-NP", "I-PER"), ("met", "VBD", "B-VP", "O"),
     ("Werner", "NNP", "B-NP", "I-PER"), ("Zwingmann", "NNP", "I-NP", "I-PER"), ("in", "IN", "B-PP", "O"),
     ("AL-AIN", "NNP", "B-NP", "I-LOC"), (".", ".", "O", "O")],
    [("Fischler", "NNP", "B-NP", "I-PER"), ("told", "VBD", "B-VP", "O"), ("Reuters", "NNP", "B-NP", "I-ORG"),
     ("on", "IN", "B-PP", "O"), ("1996-08-22", "CD", "B-NP", "O"), (".", ".", "O", "O")],
    "-DOCSTART-",
    [("Boris", "NNP", "B-NP", "I-PER"), ("Yeltsin", "NNP", "I-NP", "I-PER"), ("visited", "VBD", "B-VP", "O"),
     ("Kuwait", "NNP", "B-NP", "I-LOC"), (".", ".", "O", "O")],
    [("Fans", "NNS", "B-NP", "O"), ("of", "IN", "B-PP", "O"), ("Rosenborg", "NNP", "B-NP", "I-ORG"),
     ("Hapoel", "NNP", "I-NP", "B-ORG"), ("and", "CC", "O", "O"), ("German", "JJ", "B-NP", "I-MISC"),
     ("clubs", "NNS", "I-NP", "O"), ("cheered", "VBD", "B-VP", "O"), (".", ".", "O", "O")],
)
DEV = _conll(
    "-DOCSTART-",
    [("Yeltsin", "NNP", "B-NP", "I-PER"), ("met", "VBD", "B-VP", "O"), ("Fischler", "NNP", "B-NP", "I-PER"),
     ("in", "IN", "B-PP", "O"), ("Brussels", "NNP", "B-NP", "I-LOC"), (".", ".", "O", "O")],
    [("Reuters", "NNP", "B-NP", "I-ORG"), ("reported", "VBD", "B-VP", "O"), ("from", "IN", "B-PP", "O"),
     ("Kuwait", "NNP", "B-NP", "I-LOC"), (".", ".", "O", "O")],
)
# The common copies' tagging, IOB2 (every entity starts with B-), in the two-column `word NER` form.
TEST = ("-DOCSTART- O\n\nNadim B-PER\nLadki I-PER\nvisited O\nKuwait B-LOC\n. O\n\n"
        "Zwingmann B-PER\ntold O\nReuters B-ORG\n. O\n")


@pytest.fixture(scope="module")
def conll_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("conll2003")
    for name, text in (("train.txt", TRAIN), ("valid.txt", DEV), ("test.txt", TEST)):
        (root / name).write_text(text, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def tokenizer(data_dir):
    return Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))


# ----------------------------------------------------------------------------- the head against transformers


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


@pytest.fixture(scope="module")
def hf_tokens(tmp_path_factory):
    """A random transformers BertForTokenClassification of the 5 TAGS, saved, and from_hf of it."""
    torch.manual_seed(0)
    hf_config = transformers.BertConfig(**SMALL, num_labels=len(TAGS), id2label=dict(enumerate(TAGS)),
                                        label2id={t: i for i, t in enumerate(TAGS)})
    reference = transformers.BertForTokenClassification(hf_config).eval()
    with torch.no_grad():  # move biases, LayerNorms and the head off their init so every tensor shows
        for name, p in reference.named_parameters():
            if name.startswith("classifier."):
                p.copy_(0.5 * torch.randn_like(p))
            elif "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("hf_tokens")
    reference.save_pretrained(path)
    with _warnings("bert_jax.checkpoints.weights") as reports:
        config, params = hf.from_hf(str(path))
    return reference, path, config, params, reports


def _token_inputs(seed, batch=4, length=16):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, SMALL["vocab_size"], size=(batch, length))
    lengths = rng.integers(7, length + 1, size=batch)
    mask = (np.arange(length) < lengths[:, None]).astype(np.int64)
    return {"input_ids": ids * mask, "token_type_ids": np.zeros_like(ids), "attention_mask": mask}


def test_token_classification_head_matches_transformers_both_ways(hf_tokens, tmp_path):
    reference, path, config, params, reports = hf_tokens
    assert not any("classifier" in r for r in reports)  # read, not reported as unknown
    assert any("pooler.dense.weight" in r for r in reports)  # BertForTokenClassification has no pooler
    assert params["token_classifier"]["kernel"].shape == (48, 5)
    tree = {"bert": {k: v for k, v in params["bert"].items() if k != "pooler"},
            "token_classifier": params["token_classifier"]}
    model = heads.BertForTokenClassification(config, num_labels=5)
    inputs = _token_inputs(1)
    ours = np.asarray(model.apply({"params": tree}, **{k: jnp.asarray(v, jnp.int32) for k, v in inputs.items()}).logits)
    # Labels on "first sub-tokens" (every other real token), -100 (ignored) elsewhere, as transformers' run_ner.
    rng = np.random.default_rng(2)
    first = (np.arange(16) % 2 == 1) & (inputs["attention_mask"] == 1)
    labels = np.where(first, rng.integers(0, 5, first.shape), -100)
    with torch.no_grad():
        theirs = reference(**{k: torch.from_numpy(v) for k, v in inputs.items()}, labels=torch.from_numpy(labels))
    assert ours.shape == (4, 16, 5) and ours.dtype == np.float32 and np.ptp(ours, axis=-1).min() > 0.05
    np.testing.assert_allclose(ours, theirs.logits.numpy(), atol=1e-5, rtol=0)
    total, count = losses.token_classification_loss(jnp.asarray(ours), jnp.asarray(labels),
                                                    jnp.asarray(first, jnp.float32))
    assert float(count) == first.sum() and float(total / count) == pytest.approx(float(theirs.loss), rel=1e-5)

    hf.to_hf(config, tree, str(tmp_path / "out"), labels=TAGS)
    written_config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written_config["architectures"] == ["BertForTokenClassification"]
    assert written_config["id2label"] == {str(i): t for i, t in enumerate(TAGS)}
    original, written = (load_file(str(d / "model.safetensors")) for d in (path, tmp_path / "out"))
    assert set(written) == set(original) and written["classifier.weight"].shape == (5, 48)
    for name, value in written.items():
        np.testing.assert_array_equal(value, original[name], err_msg=name)
    loaded, info = transformers.BertForTokenClassification.from_pretrained(str(tmp_path / "out"),
                                                                           output_loading_info=True)
    assert not any(info.values()), info
    assert loaded.config.id2label == dict(enumerate(TAGS))
    with torch.no_grad():
        again = loaded.eval()(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.numpy()
    np.testing.assert_allclose(ours, again, atol=1e-5, rtol=0)


def test_token_classification_bad_trees_are_one_line(hf_tokens, tmp_path):
    _, _, config, params, _ = hf_tokens
    tree = {"bert": params["bert"], "token_classifier": params["token_classifier"]}  # with the pooler: wrong
    encoder = {k: v for k, v in params["bert"].items() if k != "pooler"}
    for bad, kwargs, match in [
        (tree, {}, r"not part of a BERT model \(BertForTokenClassification\): \['bert/pooler/bias'"),
        (dict(tree, bert=encoder), {"labels": TAGS[:4]}, r"not 5 distinct strings, one per column of token_classifier"),
        (dict(tree, bert=encoder, qa_outputs={}), {}, "both qa_outputs and token_classifier heads"),
        (dict(bert=encoder, token_classifier={"kernel": np.zeros((48, 3))}), {}, "missing token_classifier/bias"),
    ]:
        with pytest.raises(ValueError, match=match) as e:
            hf.to_hf(config, bad, str(tmp_path / "never"), **kwargs)
        assert "\n" not in str(e.value)
    assert not (tmp_path / "never").exists()


def test_token_loss_hand_computed():
    """Two weighted tokens of uniform logits over 4 labels: loss log 4 each; out-of-range labels at
    zero weight (-100) count nothing."""
    logits = jnp.zeros((1, 3, 4), jnp.bfloat16)
    total, count = losses.token_classification_loss(logits, jnp.array([[1, -100, 3]]), jnp.array([[1.0, 0.0, 1.0]]))
    assert total.dtype == jnp.float32 and float(total) == pytest.approx(2 * np.log(4)) and float(count) == 2
    with pytest.raises(ValueError, match=r"logits \(1, 3, 4\), labels \(1, 2\) and label_weights \(1, 3\)"):
        losses.token_classification_loss(logits, jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 3)))


# ----------------------------------------------------------------------------- reader, labels, features


def test_reader_skips_docstart_and_splits_on_blank_lines(conll_dir):
    train = ner.read_conll(str(conll_dir / "train.txt"))
    assert [len(s.words) for s in train] == [8, 6, 5, 9]
    assert train[0].words[:2] == ("Nadim", "Ladki") and train[0].tags[:2] == ("I-PER", "I-PER")
    assert train[0].source == f"{conll_dir / 'train.txt'}:3" and train[2].source.endswith("train.txt:21")
    assert train[3].tags[2:4] == ("I-ORG", "B-ORG")
    assert ner.label_list(train) == ("O", "B-ORG", "I-LOC", "I-MISC", "I-ORG", "I-PER")
    assert ner.iob_scheme(train) == "IOB1"
    test = ner.read_conll(str(conll_dir / "test.txt"))  # two columns, IOB2, no blank line at the end
    assert [s.words for s in test] == [("Nadim", "Ladki", "visited", "Kuwait", "."),
                                       ("Zwingmann", "told", "Reuters", ".")]
    assert ner.iob_scheme(test) == "IOB2"


def test_first_sub_token_alignment_by_hand(conll_dir, tokenizer):
    train = ner.read_conll(str(conll_dir / "train.txt"))
    labels = ner.label_list(train)  # O 0, B-ORG 1, I-LOC 2, I-MISC 3, I-ORG 4, I-PER 5
    feats = ner.convert_to_features(train[:1], tokenizer, labels, max_seq_length=20)
    tokens = tokenizer.convert_ids_to_tokens(feats["input_ids"][0])
    assert tokens == ["[CLS]", "nad", "##im", "lad", "##ki", "met", "werner", "z", "##wing", "##mann", "in",
                      "al", "-", "ain", ".", "[SEP]"] + ["[PAD]"] * 4
    firsts = [1, 3, 5, 6, 7, 10, 11, 14]  # Nadim Ladki met Werner Zwingmann in AL-AIN .
    assert np.flatnonzero(feats["label_weights"][0]).tolist() == firsts
    assert feats["labels"][0, firsts].tolist() == [5, 5, 0, 5, 5, 0, 2, 0]
    assert feats["labels"][0].sum() == 22 and feats["word_ids"][0, firsts].tolist() == list(range(8))
    assert (np.delete(feats["word_ids"][0], firsts) == -1).all()
    assert feats["attention_mask"][0].sum() == 16 and not feats["token_type_ids"].any()
    assert feats["labels"].dtype == np.int32 and feats["label_weights"].dtype == np.float32

    # A tag never seen in training (IOB2's B-PER in test.txt): weight 0, still predicted per word.
    test = ner.read_conll(str(conll_dir / "test.txt"))
    feats = ner.convert_to_features(test, tokenizer, labels, max_seq_length=16)
    assert feats["label_weights"][0, 1] == 0 and feats["word_ids"][0, 1] == 0
    # (B-PER and B-LOC are unknown: label 0, "O")
    assert ner.word_predictions(feats, feats["labels"], test, labels)[0] == ["O", "I-PER", "O", "O", "O"]


def test_long_sentences_are_split_between_words(conll_dir, tokenizer):
    """Sentence 1 has word pieces 2 2 1 1 3 1 3 1; with max_seq_length 8 (6 pieces a sequence) it becomes
    Nadim Ladki met Werner | Zwingmann in | AL-AIN ., and the predictions join back to one per word."""
    train = ner.read_conll(str(conll_dir / "train.txt"))
    labels = ner.label_list(train)
    feats = ner.convert_to_features(train[:2], tokenizer, labels, max_seq_length=8)
    assert feats["sentence_ids"].tolist() == [0, 0, 0, 1, 1]
    words = [feats["word_ids"][r][feats["word_ids"][r] >= 0].tolist() for r in range(5)]
    assert words == [[0, 1, 2, 3], [4, 5], [6, 7], [0, 1, 2, 3], [4, 5]]
    assert tokenizer.convert_ids_to_tokens(feats["input_ids"][1]) == ["[CLS]", "z", "##wing", "##mann", "in", "[SEP]",
                                                                      "[PAD]", "[PAD]"]
    joined = ner.word_predictions(feats, feats["labels"], train[:2], labels)
    assert joined == [list(s.tags) for s in train[:2]]
    # A word longer than a whole sequence keeps its first pieces (and its label, on the first).
    feats = ner.convert_to_features(train[:1], tokenizer, labels, max_seq_length=4)
    zwingmann = np.flatnonzero(feats["word_ids"].max(axis=1) == 4)[0]
    assert tokenizer.convert_ids_to_tokens(feats["input_ids"][zwingmann]) == ["[CLS]", "z", "##wing", "[SEP]"]
    # 2 pieces a sequence: Nadim | Ladki | met Werner | Zwingmann (cut) | in | AL-AIN | .
    assert len(feats["sentence_ids"]) == 7


def test_write_conll_is_conlleval_input(conll_dir, tmp_path):
    test = ner.read_conll(str(conll_dir / "test.txt"))
    predicted = [["B-PER", "I-PER", "O", "O", "O"], ["B-PER", "O", "B-ORG", "O"]]
    ner.write_conll(str(tmp_path / "out.txt"), test, predicted)
    assert (tmp_path / "out.txt").read_text() == (
        "Nadim B-PER B-PER\nLadki I-PER I-PER\nvisited O O\nKuwait B-LOC O\n. O O\n\n"
        "Zwingmann B-PER B-PER\ntold O O\nReuters B-ORG B-ORG\n. O O\n\n")
    # What conlleval reads back: the last two columns of each line.
    back = ner.read_conll(str(tmp_path / "out.txt"))
    assert [s.tags for s in back] == [tuple(p) for p in predicted]
    with pytest.raises(ValueError, match="5 words but 4 predicted tags"):
        ner.write_conll(str(tmp_path / "bad.txt"), test, [p[:4] for p in predicted])


# ----------------------------------------------------------------------------- metrics


def test_entity_scores_hand_computed():
    """Gold: Peter Blackburn (PER), Brussels (LOC), European Commission (ORG). Predicted: PER and LOC right,
    ORG missed, one spurious MISC: P = 2/3, R = 2/3, F1 = 2/3; words right 6 of 9."""
    gold = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["O", "B-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-LOC", "B-MISC"], ["O", "O", "O", "O"]]
    scores = ner_task.compute_metrics(gold, pred)
    assert scores == pytest.approx({"precision": 200 / 3, "recall": 200 / 3, "f1": 200 / 3, "accuracy": 600 / 9,
                                    "f1_PER": 100.0, "f1_LOC": 100.0, "f1_ORG": 0.0, "f1_MISC": 0.0})
    # The same entities in IOB1 (the original release's tags) score the same: conlleval's chunking.
    iob1 = [[t.replace("B-", "I-") for t in s] for s in gold]
    iob1_pred = [[t.replace("B-", "I-") for t in s] for s in pred]
    assert ner_task.compute_metrics(iob1, iob1_pred) == pytest.approx(scores)
    # A wrong boundary is a wrong entity: B-PER I-PER predicted as two one-word entities.
    split = ner_task.compute_metrics([["B-PER", "I-PER"]], [["B-PER", "B-PER"]])
    assert (split["precision"], split["recall"]) == (0.0, 0.0)
    with pytest.raises(ValueError, match="not one sequence per sentence"):
        ner_task.compute_metrics(gold, pred[:1])


# ----------------------------------------------------------------------------- TFDS


def test_tfds_conll2003_on_mock_data():
    """TFDS conll2003 under tfds.testing.mock_data: examples supplied through `as_data_source_fn` (the
    random generator draws tokens and tags of different lengths), tag indices mapped to TFDS's IOB2 names;
    the random examples give a one-line error naming the example."""
    import tensorflow_datasets as tfds

    examples = [{"tokens": np.array([b"EU", b"rejects", b"German", b"call"], dtype=object),
                 "pos": np.array([21, 37, 16, 21]), "chunks": np.array([11, 21, 11, 12]),
                 "ner": np.array([3, 0, 7, 0])},
                {"tokens": np.array([b"Peter", b"Blackburn"], dtype=object), "pos": np.array([22, 22]),
                 "chunks": np.array([11, 12]), "ner": np.array([1, 2])},
                {"tokens": np.array([], dtype=object), "pos": np.array([], np.int64),
                 "chunks": np.array([], np.int64), "ner": np.array([], np.int64)}]

    def data_source(self, split, **kwargs):
        return examples

    with tfds.testing.mock_data(as_data_source_fn=data_source):
        sentences = ner.read_conll_tfds("train")
    assert [(s.words, s.tags) for s in sentences] == [
        (("EU", "rejects", "German", "call"), ("B-ORG", "O", "B-MISC", "O")),
        (("Peter", "Blackburn"), ("B-PER", "I-PER"))]
    assert sentences[1].source == "TFDS conll2003 train example 1"
    with tfds.testing.mock_data(num_examples=2):
        with pytest.raises(ValueError, match=r"^TFDS conll2003 dev example 0: \d+ tokens but \d+ ner tags$"):
            ner.read_conll_tfds("dev")


# ----------------------------------------------------------------------------- configs and the job


def test_config_is_the_papers_recipe():
    config = ner_config.get_config()
    assert (config.train_batch_size, config.num_train_epochs, config.learning_rate) == (32, 3.0, 5e-5)
    assert ner_config.LEARNING_RATES == (5e-5, 3e-5, 2e-5) and config.num_train_epochs in ner_config.EPOCHS
    assert (config.train_file, config.dev_file, config.test_file) == ("train.txt", "valid.txt", "test.txt")


def test_ner_job_end_to_end_from_random_init(conll_dir, data_dir, tmp_path):
    config = ner_config.get_config("tiny")
    config.model = pretrain.model_config("tiny")
    config.vocab_file = str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    config.data_dir = str(conll_dir)
    config.max_seq_length, config.train_batch_size, config.eval_batch_size = 12, 4, 4
    config.num_train_epochs, config.learning_rate, config.log_every = 2.0, 1e-3, 1
    config.save_checkpoint = False
    config.mesh.num_devices = 1
    metrics = ner_task.run(config, str(tmp_path))
    # max_seq_length 12 (10 pieces): sentences 1 (14 pieces) and 2 (12) are split, 4 sentences -> 6 sequences.
    assert (metrics["train_sentences"], metrics["train_sequences"], metrics["train_steps"]) == (4, 6, 3)
    assert metrics["iob_scheme"] == "IOB1" and metrics["labels"] == ["O", "B-ORG", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
    assert np.isfinite(metrics["train_loss"]) and (metrics["dev_sentences"], metrics["test_sentences"]) == (2, 2)
    for role in ("dev", "test"):
        for key in ("precision", "recall", "f1", "accuracy"):
            assert 0 <= metrics[f"{role}_{key}"] <= 100
    assert json.loads((tmp_path / "metrics.json").read_text())["dev_f1"] == metrics["dev_f1"]
    dev = ner.read_conll(str(tmp_path / "dev_predictions.txt"))
    lines = (tmp_path / "dev_predictions.txt").read_text().splitlines()
    assert len(lines) == 6 + 1 + 5 + 1 and lines[0].startswith("Yeltsin I-PER ") and lines[6] == ""
    gold = [line.split()[1] for line in lines if line]
    assert gold == [t for s in ner.read_conll(str(conll_dir / "valid.txt")) for t in s.tags]
    predicted = [list(s.tags) for s in dev]  # the file's last column
    scores = ner_task.compute_metrics([s.tags for s in ner.read_conll(str(conll_dir / "valid.txt"))], predicted)
    assert scores["f1"] == pytest.approx(metrics["dev_f1"])
    assert (tmp_path / "test_predictions.txt").read_text().startswith("Nadim B-PER ")


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("text,match", [
    ("-DOCSTART- -X- -X- O\n\nEU NNP B-NP I-ORG\nrejects VBZ B-VP\n",
     r"bad.txt:4: CoNLL line has 3 columns, expected 4 \(as line 3\)$"),
    ("EU NNP B-NP I-ORG\n\nGerman JJ B-NP I-MISC extra\n", r"bad.txt:3: CoNLL line has 5 columns, expected 4 "
                                                           r"\(as line 1\)$"),
    ("EU\n", r"bad.txt:1: CoNLL line has 1 column, expected a word and a tag$"),
    ("EU NNP B-NP ORG\n", r"bad.txt:1: tag 'ORG' is not an IOB tag \(O, B-TYPE or I-TYPE\)$"),
    ("EU NNP B-NP I-ORG\nsays VBZ B-VP S-PER\n", r"bad.txt:2: tag 'S-PER' is not an IOB tag"),
])
def test_bad_lines_are_one_line(tmp_path, text, match):
    bad = tmp_path / "bad.txt"
    bad.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        ner.read_conll(str(bad))
    assert "\n" not in str(e.value) and str(bad) in str(e.value)


def test_missing_and_empty_files_are_one_line(conll_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="train.txt' does not exist"):
        ner.read_conll(str(tmp_path / "train.txt"))
    (tmp_path / "train.txt").write_text("-DOCSTART- -X- -X- O\n\n")
    assert ner.read_conll(str(tmp_path / "train.txt")) == []
    config = ner_config.get_config("tiny")
    config.vocab_file, config.data_dir = str(conll_dir / "train.txt"), str(tmp_path)
    with pytest.raises(ValueError, match="train.txt holds no sentences"):
        ner_task._sentences(config, "train")
