"""GLUE, all nine tasks: readers of the official TSV layouts (small files written here in each task's
format, and the real MRPC / SST-2 files), the TFDS path (`tfds.testing.mock_data`), metrics against
hand-computed values, the regression head's loss and Hugging Face export, the GLUE job end to end for
STS-B and MNLI with its submission files, and one-line errors for bad input."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.checkpoints import hf
from bert_jax.model import heads, modeling
from bert_jax.training import losses
from bert_jax.data import glue
from bert_jax.tasks import job
from bert_jax.tasks import glue as glue_task
from bert_jax.configs import glue as glue_config
from bert_jax.configs import pretrain


def _tsv(*rows) -> str:
    return "".join("\t".join(row) + "\n" for row in rows)


_MNLI_HEAD = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
              "sentence1_parse", "sentence2_parse", "sentence1", "sentence2")
_STSB_HEAD = ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2")


def _mnli(index, genre, premise, hypothesis, *labels):
    """An MNLI row: ids, genre, (made-up, flat) parses, the two sentences, then the label columns."""
    parse_p, parse_h = f"( {premise} )", f"( {hypothesis} )"
    return (str(index), str(1000 + index), f"{1000 + index}e", genre, parse_p, parse_h, f"(ROOT {parse_p})",
            f"(ROOT {parse_h})", premise, hypothesis, *labels)


def _stsb(index, genre, source, premise, hypothesis, *score):
    return (str(index), genre, source, "2016", f"{index:04d}", "none", "none", premise, hypothesis, *score)


# The small GLUE folder: every task's files in the official layout, and what each file holds as
# (text_a, text_b, label string or score); test files as (index, text_a, text_b).
FILES = {
    "CoLA": {
        "train.tsv": _tsv(("bc01", "1", "", "The kettle boiled over while we talked."),
                          ("bc01", "0", "*", "The kettle boiled the water over talked."),
                          ("ks08", "1", "", "Which report did the editor say she had read?"),
                          ("ks08", "0", "*", "Whom did you meet the man who saw?")),
        "dev.tsv": _tsv(("gj04", "1", "", "Harriet painted the fence green."),
                        ("gj04", "0", "*", "Harriet painted green.")),
        "test.tsv": _tsv(("index", "sentence"), ("0", "The children sang a song to their grandmother."),
                         ("1", "The children seem singing.")),
    },
    "SST-2": {
        "train.tsv": _tsv(("sentence", "label"), ("a warm , funny and quietly moving picture ", "1"),
                          ("the plot limps from one cliche to the next ", "0"),
                          ("its cast is never less than watchable ", "1")),
        "dev.tsv": _tsv(("sentence", "label"), ("a tedious , overlong exercise in style ", "0"),
                        ("one of the year 's most affecting films ", "1")),
        "test.tsv": _tsv(("index", "sentence"), ("0", "an endearing mess of a movie ."),
                         ("1", "i wanted my two hours back .")),
    },
    "MRPC": {
        "train.tsv": _tsv(("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"),
                          ("1", "1001", "1002", "The council approved the budget on Tuesday.",
                           "On Tuesday the council voted to approve the budget."),
                          ("0", "1003", "1004", "Shares of the firm rose 4 percent in early trading.",
                           "The firm said it would hire 200 workers next year.")),
        "dev.tsv": _tsv(("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"),
                        ("1", "2001", "2002", "The storm cut power to 30,000 homes.",
                         "About 30,000 homes lost power in the storm.")),
        "test.tsv": _tsv(("index", "#1 ID", "#2 ID", "#1 String", "#2 String"),
                         ("0", "3001", "3002", "The museum reopens in May.", "In May the museum will open again.")),
    },
    "STS-B": {
        "train.tsv": _tsv(_STSB_HEAD + ("score",),
                          _stsb(0, "main-captions", "images", "A dog runs across a grassy field.",
                                "A dog is running through the grass.", "4.600"),
                          _stsb(1, "main-captions", "images", "A woman is slicing a tomato.",
                                "A man is playing a guitar.", "0.000"),
                          _stsb(2, "main-news", "headlines", "Floods force thousands from their homes.",
                                "Thousands evacuated as rivers flood.", "3.800"),
                          _stsb(3, "main-news", "headlines", "Stocks close higher on bank earnings.",
                                "Bank earnings lift the stock market.", "3.400"),
                          _stsb(4, "main-forums", "answers", "You should water the plant once a week.",
                                "Water the plant every seven days.", "4.250"),
                          _stsb(5, "main-forums", "answers", "The train leaves at noon.",
                                "My sister likes to paint.", "0.200"),
                          _stsb(6, "main-captions", "images", "Two children are playing on a beach.",
                                "Kids play on the sand by the sea.", "3.750"),
                          _stsb(7, "main-captions", "images", "A cat sleeps on a sofa.",
                                "A cat is sleeping on a couch.", "5.000")),
        "dev.tsv": _tsv(_STSB_HEAD + ("score",),
                        _stsb(0, "main-captions", "images", "A man is riding a bicycle.",
                              "A man rides a bike down the road.", "4.000"),
                        _stsb(1, "main-news", "headlines", "The election results were delayed.",
                              "A new bridge opened downtown.", "0.400"),
                        _stsb(2, "main-forums", "answers", "Boil the pasta for ten minutes.",
                              "Cook the pasta for about ten minutes.", "4.800")),
        "test.tsv": _tsv(_STSB_HEAD,
                         _stsb(0, "main-captions", "images", "A bird is perched on a branch.",
                               "A bird sits on a tree branch."),
                         _stsb(1, "main-news", "headlines", "Oil prices fall for a third day.",
                               "The festival drew record crowds.")),
    },
    "QQP": {
        "train.tsv": _tsv(("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
                          ("10", "21", "22", "How do I learn to play the piano as an adult?",
                           "What is the best way for an adult to learn piano?", "1"),
                          ("11", "23", "24", "Why is the sky blue?", "How far away is the moon?", "0"),
                          # A question broken by a stray line break, as in the real train.tsv: two short rows.
                          ("12", "25", "26", "What are good books about the history"),
                          (" of mathematics?", "Which books explain the history of mathematics?", "1"),
                          ("13", "27", "28", "Is coffee bad for you?", "Is drinking coffee unhealthy?", "1")),
        "dev.tsv": _tsv(("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
                        ("40", "81", "82", "How can I improve my handwriting?", "What is the capital of Peru?", "0")),
        "test.tsv": _tsv(("id", "question1", "question2"),
                         ("0", "How do I bake sourdough bread?", "What is a simple sourdough recipe?")),
    },
    "MNLI": {
        "train.tsv": _tsv(_MNLI_HEAD + ("label1", "gold_label"),
                          _mnli(0, "government", "The agency will publish its report next month.",
                                "The report comes out next month.", "entailment", "entailment"),
                          _mnli(1, "government", "The agency will publish its report next month.",
                                "The agency has abandoned the report.", "contradiction", "contradiction"),
                          _mnli(2, "fiction", "She closed the door quietly behind her.",
                                "She was trying not to wake the baby.", "neutral", "neutral"),
                          _mnli(3, "fiction", "She closed the door quietly behind her.",
                                "She slammed the door.", "contradiction", "contradiction"),
                          _mnli(4, "travel", "The old town is best explored on foot.",
                                "Walking is a good way to see the old town.", "entailment", "entailment"),
                          _mnli(5, "travel", "The old town is best explored on foot.",
                                "The old town has many cafes.", "neutral", "neutral"),
                          _mnli(6, "telephone", "I grew up on a farm in Iowa.",
                                "I have never been to Iowa.", "contradiction", "contradiction"),
                          _mnli(7, "telephone", "I grew up on a farm in Iowa.",
                                "I spent my childhood in the countryside.", "entailment", "entailment")),
        "dev_matched.tsv": _tsv(_MNLI_HEAD + ("label1", "label2", "label3", "label4", "label5", "gold_label"),
                                _mnli(0, "slate", "The museum is free on Sundays.",
                                      "You pay nothing to enter on Sunday.",
                                      "entailment", "entailment", "neutral", "entailment", "entailment",
                                      "entailment"),
                                _mnli(1, "slate", "The museum is free on Sundays.",
                                      "The museum is closed every weekend.",
                                      "contradiction", "contradiction", "contradiction", "neutral",
                                      "contradiction", "contradiction")),
        "dev_mismatched.tsv": _tsv(_MNLI_HEAD + ("label1", "label2", "label3", "label4", "label5", "gold_label"),
                                   _mnli(0, "letters", "We thank you for your generous gift.",
                                         "Your donation was large.", "neutral", "entailment", "neutral",
                                         "neutral", "neutral", "neutral"),
                                   _mnli(1, "letters", "We thank you for your generous gift.",
                                         "We received a gift from you.", "entailment", "entailment",
                                         "entailment", "entailment", "entailment", "entailment"),
                                   _mnli(2, "oup", "The survey covered twelve villages.",
                                         "The survey covered a single village.", "contradiction",
                                         "contradiction", "contradiction", "contradiction", "contradiction",
                                         "contradiction")),
        "test_matched.tsv": _tsv(_MNLI_HEAD, _mnli(0, "slate", "The bakery opens at six.",
                                                   "You can buy bread early in the morning."),
                                 _mnli(1, "fiction", "He laughed at the joke.", "He found the joke funny.")),
        "test_mismatched.tsv": _tsv(_MNLI_HEAD, _mnli(0, "letters", "Please renew your membership.",
                                                      "Your membership is expiring.")),
    },
    "QNLI": {
        "train.tsv": _tsv(("index", "question", "sentence", "label"),
                          ("0", "When was the bridge completed?", "The bridge was completed in 1932.", "entailment"),
                          ("1", "Who designed the bridge?", "The bridge carries six lanes of traffic.",
                           "not_entailment")),
        "dev.tsv": _tsv(("index", "question", "sentence", "label"),
                        ("0", "What is the capital of Kenya?", "Nairobi is the capital of Kenya.", "entailment")),
        "test.tsv": _tsv(("index", "question", "sentence"),
                         ("0", "How tall is the tower?", "The tower rises 300 metres above the city.")),
    },
    "RTE": {
        "train.tsv": _tsv(("index", "sentence1", "sentence2", "label"),
                          ("0", "The company was founded in Oslo in 1987 by two engineers.",
                           "The company was founded in Oslo.", "entailment"),
                          ("1", "Heavy rain delayed the final match by two hours.",
                           "The final match was cancelled.", "not_entailment")),
        "dev.tsv": _tsv(("index", "sentence1", "sentence2", "label"),
                        ("0", "The minister resigned after the vote.", "The minister left office.", "entailment")),
        "test.tsv": _tsv(("index", "sentence1", "sentence2"),
                         ("0", "The library lends e-books to members.", "Members can borrow e-books.")),
    },
    "diagnostic": {  # GLUE's AX set, as the GLUE download writes it (diagnostic/diagnostic.tsv)
        "diagnostic.tsv": _tsv(("index", "sentence1", "sentence2"),
                               ("0", "The cat sat on the mat.", "The cat did not sit on the mat."),
                               ("1", "Every student passed the exam.", "Some students passed the exam."),
                               ("2", "Tom's sister lives in Paris.", "Tom has a sister.")),
    },
    "WNLI": {
        "train.tsv": _tsv(("index", "sentence1", "sentence2", "label"),
                          ("0", "The trophy would not fit in the suitcase because it was too big.",
                           "The trophy was too big.", "1"),
                          ("1", "The trophy would not fit in the suitcase because it was too big.",
                           "The suitcase was too big.", "0")),
        "dev.tsv": _tsv(("index", "sentence1", "sentence2", "label"),
                        ("0", "Anna thanked Lucy because she had helped her.", "Lucy had helped Anna.", "1")),
        "test.tsv": _tsv(("index", "sentence1", "sentence2"),
                         ("0", "The dog chased the cat until it was tired.", "The dog was tired.")),
    },
}

# What each small file must read back as: (text_a, text_b, label index or score).
EXPECTED = {
    ("cola", "train.tsv"): [("The kettle boiled over while we talked.", None, 1),
                            ("The kettle boiled the water over talked.", None, 0),
                            ("Which report did the editor say she had read?", None, 1),
                            ("Whom did you meet the man who saw?", None, 0)],
    ("cola", "dev.tsv"): [("Harriet painted the fence green.", None, 1), ("Harriet painted green.", None, 0)],
    ("sst2", "train.tsv"): [("a warm , funny and quietly moving picture ", None, 1),
                            ("the plot limps from one cliche to the next ", None, 0),
                            ("its cast is never less than watchable ", None, 1)],
    ("mrpc", "train.tsv"): [("The council approved the budget on Tuesday.",
                             "On Tuesday the council voted to approve the budget.", 1),
                            ("Shares of the firm rose 4 percent in early trading.",
                             "The firm said it would hire 200 workers next year.", 0)],
    ("stsb", "dev.tsv"): [("A man is riding a bicycle.", "A man rides a bike down the road.", 4.0),
                          ("The election results were delayed.", "A new bridge opened downtown.", 0.4),
                          ("Boil the pasta for ten minutes.", "Cook the pasta for about ten minutes.", 4.8)],
    ("qqp", "train.tsv"): [("How do I learn to play the piano as an adult?",
                            "What is the best way for an adult to learn piano?", 1),
                           ("Why is the sky blue?", "How far away is the moon?", 0),
                           ("Is coffee bad for you?", "Is drinking coffee unhealthy?", 1)],
    ("mnli", "dev_mismatched.tsv"): [("We thank you for your generous gift.", "Your donation was large.", 2),
                                     ("We thank you for your generous gift.", "We received a gift from you.", 1),
                                     ("The survey covered twelve villages.", "The survey covered a single village.",
                                      0)],
    ("qnli", "train.tsv"): [("When was the bridge completed?", "The bridge was completed in 1932.", 0),
                            ("Who designed the bridge?", "The bridge carries six lanes of traffic.", 1)],
    ("rte", "train.tsv"): [("The company was founded in Oslo in 1987 by two engineers.",
                            "The company was founded in Oslo.", 0),
                           ("Heavy rain delayed the final match by two hours.", "The final match was cancelled.", 1)],
    ("wnli", "train.tsv"): [("The trophy would not fit in the suitcase because it was too big.",
                             "The trophy was too big.", 1),
                            ("The trophy would not fit in the suitcase because it was too big.",
                             "The suitcase was too big.", 0)],
}
EXPECTED_TEST = {  # test files: (guid = the file's index column, text_a, text_b), label -1
    ("cola", "test.tsv"): [("0", "The children sang a song to their grandmother.", None),
                           ("1", "The children seem singing.", None)],
    ("sst2", "test.tsv"): [("0", "an endearing mess of a movie .", None), ("1", "i wanted my two hours back .", None)],
    ("mrpc", "test.tsv"): [("0", "The museum reopens in May.", "In May the museum will open again.")],
    ("stsb", "test.tsv"): [("0", "A bird is perched on a branch.", "A bird sits on a tree branch."),
                           ("1", "Oil prices fall for a third day.", "The festival drew record crowds.")],
    ("qqp", "test.tsv"): [("0", "How do I bake sourdough bread?", "What is a simple sourdough recipe?")],
    ("mnli", "test_matched.tsv"): [("0", "The bakery opens at six.", "You can buy bread early in the morning."),
                                   ("1", "He laughed at the joke.", "He found the joke funny.")],
    ("mnli", "test_mismatched.tsv"): [("0", "Please renew your membership.", "Your membership is expiring.")],
    ("qnli", "test.tsv"): [("0", "How tall is the tower?", "The tower rises 300 metres above the city.")],
    ("rte", "test.tsv"): [("0", "The library lends e-books to members.", "Members can borrow e-books.")],
    ("wnli", "test.tsv"): [("0", "The dog chased the cat until it was tired.", "The dog was tired.")],
    ("ax", "diagnostic.tsv"): [("0", "The cat sat on the mat.", "The cat did not sit on the mat."),
                               ("1", "Every student passed the exam.", "Some students passed the exam."),
                               ("2", "Tom's sister lives in Paris.", "Tom has a sister.")],
}


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    for folder, files in FILES.items():
        (root / folder).mkdir()
        for name, text in files.items():
            (root / folder / name).write_text(text, encoding="utf-8")
    return root


def _read(glue_dir, task, name):
    return glue.read_glue_tsv(task, str(glue_dir / glue.get_task(task).folder / name))


def test_the_nine_tasks():
    assert sorted(glue.TASKS) == ["cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb", "wnli"]
    assert {t: glue.TASKS[t].num_labels for t in glue.TASKS} == dict(
        cola=2, mnli=3, mrpc=2, qnli=2, qqp=2, rte=2, sst2=2, stsb=1, wnli=2)
    assert glue.TASKS["mnli"].labels == ("contradiction", "entailment", "neutral")  # run_classifier.py's order
    assert glue.TASKS["qnli"].labels == glue.TASKS["rte"].labels == ("entailment", "not_entailment")
    names = [s.key for t in glue.TASKS.values() for s in t.test_sets]
    assert sorted(names) == sorted(["CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv",
                                    "MNLI-mm.tsv", "QNLI.tsv", "RTE.tsv", "WNLI.tsv"])
    assert [s.file for s in glue.TASKS["mnli"].dev] == ["dev_matched.tsv", "dev_mismatched.tsv"]


@pytest.mark.parametrize("task,name", sorted(EXPECTED))
def test_small_files_read_back(glue_dir, task, name):
    examples = _read(glue_dir, task, name)
    assert [(e.text_a, e.text_b, e.label) for e in examples] == EXPECTED[(task, name)]
    regression = task == "stsb"
    assert all(isinstance(e.label, float if regression else int) for e in examples)


@pytest.mark.parametrize("task,name", sorted(EXPECTED_TEST))
def test_small_test_files_read_unlabelled(glue_dir, task, name):
    examples = _read(glue_dir, task, name)
    assert [(e.guid, e.text_a, e.text_b) for e in examples] == EXPECTED_TEST[(task, name)]
    assert {e.label for e in examples} == {-1}


def test_every_small_file_reads(glue_dir):
    """Every file of the small folder, labelled or not, against its row count (QQP: 2 broken rows skipped)."""
    for task, spec in glue.TASKS.items():
        for name in ["train.tsv", *(s.file for s in spec.dev), *(s.file for s in spec.test_sets)]:
            rows = FILES[spec.folder][name].count("\n") - (0 if task == "cola" and name != "test.tsv" else 1)
            assert len(_read(glue_dir, task, name)) == rows - (2 if (task, name) == ("qqp", "train.tsv") else 0)
    labels = [e.label for e in _read(glue_dir, "mnli", "train.tsv")]
    assert sorted(set(labels)) == [0, 1, 2] and labels[:3] == [1, 0, 2]


def test_qqp_broken_rows_are_skipped_with_one_warning(glue_dir, caplog):
    with caplog.at_level("WARNING", logger="bert_jax.data.glue"):
        examples = _read(glue_dir, "qqp", "train.tsv")
    assert len(examples) == 3 and [e.guid for e in examples] == ["2", "3", "6"]  # line numbers
    (record,) = caplog.records
    assert record.getMessage().endswith("train.tsv: skipped 2 QQP rows with fewer than 6 columns "
                                        "(as the original processor), lines [4, 5]")


def test_quotes_are_text_and_crlf_lines_read_alike(tmp_path):
    """Quotes are part of the text (run_classifier.py reads with quotechar=None, TFDS with QUOTE_NONE): a field
    that starts with a quote or holds an unbalanced one keeps it and ends at the next tab; CRLF line ends (a
    file saved on Windows) read as LF ones, with no carriage return left in a label or text."""
    rows = [("0", '"Stay," she said, "until the rain stops.', 'She asked him to "stay.', "entailment"),
            ("1", '"Unbalanced', "quote", "not_entailment")]
    text = _tsv(("index", "sentence1", "sentence2", "label"), *rows)
    for name, data in (("lf.tsv", text), ("crlf.tsv", text.replace("\n", "\r\n"))):
        (tmp_path / name).write_bytes(data.encode())
        assert [(e.text_a, e.text_b, e.label) for e in glue.read_glue_tsv("rte", str(tmp_path / name))] == [
            ('"Stay," she said, "until the rain stops.', 'She asked him to "stay.', 0), ('"Unbalanced', "quote", 1)]
    cola = FILES["CoLA"]["train.tsv"].replace("\n", "\r\n")  # headerless: the label column, then the sentence
    (tmp_path / "cola.tsv").write_bytes(cola.encode())
    assert [(e.text_a, e.label) for e in glue.read_glue_tsv("cola", str(tmp_path / "cola.tsv"))] == [
        (a, label) for a, _, label in EXPECTED[("cola", "train.tsv")]]


def test_real_mrpc_and_sst2(data_dir):
    """The real files through BERT_JAX_DATA: their official sizes, first rows and label shares."""
    from bert_jax.data import tokenization

    mrpc_train = glue.read_glue_tsv("mrpc", str(data_dir / "glue" / "MRPC" / "train.tsv"))
    mrpc_dev = glue.read_glue_tsv("mrpc", str(data_dir / "glue" / "MRPC" / "dev.tsv"))
    mrpc_test = glue.read_glue_tsv("mrpc", str(data_dir / "glue" / "MRPC" / "test.tsv"))
    sst_dev = glue.read_glue_tsv("sst2", str(data_dir / "glue" / "SST-2" / "dev.tsv"))
    assert (len(mrpc_train), len(mrpc_dev), len(mrpc_test), len(sst_dev)) == (3668, 408, 1725, 872)
    assert mrpc_train[0].text_a.startswith("Amrozi accused") and mrpc_train[0].label == 1
    assert {e.label for e in mrpc_test} == {-1} and [e.guid for e in mrpc_test[:3]] == ["0", "1", "2"]
    assert abs(np.mean([e.label for e in mrpc_dev]) - 0.684) < 0.001  # GLUE's 68.4% positives
    assert sst_dev[0].text_a == "it 's a charming and often affecting journey . " and sst_dev[0].label == 1
    assert sum(e.label for e in sst_dev) == 444  # 444 positive, 428 negative
    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    feats = glue.convert_examples_to_features(mrpc_dev, tok, max_seq_length=32)
    ex = mrpc_dev[0]
    a, b = tok.encode(ex.text_a), tok.encode(ex.text_b)
    glue.truncate_seq_pair(a, b, 29)
    row = [tok.cls_id] + a + [tok.sep_id] + b + [tok.sep_id]
    assert feats["input_ids"][0].tolist() == row + [0] * (32 - len(row))
    assert feats["token_type_ids"][0].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * (32 - len(row))
    assert feats["attention_mask"][0].sum() == len(row) and feats["labels"].dtype == np.int32


def test_regression_features_are_float32(glue_dir, data_dir):
    from bert_jax.data import tokenization

    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    feats = glue.convert_examples_to_features(_read(glue_dir, "stsb", "dev.tsv"), tok, 16, regression=True)
    assert feats["labels"].dtype == np.float32 and feats["labels"].tolist() == pytest.approx([4.0, 0.4, 4.8])
    assert feats["input_ids"].shape == (3, 16) and feats["token_type_ids"].max() == 1


def test_truncate_seq_pair_hand_computed():
    a, b = list(range(10)), list(range(100, 104))
    glue.truncate_seq_pair(a, b, 8)  # pops a until 4 + 4; ties pop b
    assert (a, b) == ([0, 1, 2, 3], [100, 101, 102, 103])
    a, b = [1, 2, 3], [4, 5, 6]
    glue.truncate_seq_pair(a, b, 4)
    assert (a, b) == ([1, 2], [4, 5])


# ----------------------------------------------------------------------------- TFDS


def _tfds_raw(name, split):
    import tensorflow_datasets as tfds

    ds = tfds.data_source(name, split=split)
    return [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("task,splits", [("cola", ["train", "validation", "test"]),
                                         ("stsb", ["train", "validation"]),
                                         ("mnli", ["validation_matched", "validation_mismatched", "test_matched"]),
                                         ("ax", ["test"])])
def test_tfds_path_on_mock_data(task, splits):
    """TFDS glue/<task> under tfds.testing.mock_data (offline, generated examples): texts, idx and labels,
    TFDS's class indices mapped by name into this task's label order (glue/mnli orders them entailment,
    neutral, contradiction; run_classifier.py contradiction, entailment, neutral)."""
    import tensorflow_datasets as tfds
    import tensorflow_datasets.text.glue  # noqa: F401  registers glue/* for tfds.builder

    spec = glue.get_task(task)
    with tfds.testing.mock_data(num_examples=6):
        names = None if spec.is_regression else tfds.builder(spec.tfds_name).info.features["label"].names
        for split in splits:
            ours, raw = glue.read_glue_tfds(task, split), _tfds_raw(spec.tfds_name, split)
            assert len(ours) == len(raw) == 6
            for ex, r in zip(ours, raw):
                assert ex.text_a == r[spec.tfds_text[0]] and ex.guid == str(int(r["idx"]))
                assert ex.text_b == (r[spec.tfds_text[1]] if len(spec.tfds_text) > 1 else None)
                if spec.is_regression:
                    assert ex.label == pytest.approx(float(r["label"]))
                else:
                    assert spec.tfds_labels[ex.label] == names[int(r["label"])]
    if task == "mnli":
        assert names == ["entailment", "neutral", "contradiction"] != list(spec.labels)


# ----------------------------------------------------------------------------- metrics


def test_metrics_hand_computed():
    """Confusion matrix TP 3, TN 2, FP 1, FN 1: MCC = (3*2 - 1*1) / sqrt(4*4*3*3) = 5/12, accuracy 5/7,
    F1 = 2*3 / (2*3 + 1 + 1) = 3/4."""
    labels = np.array([1, 1, 1, 0, 0, 0, 1])
    preds = np.array([1, 1, 1, 0, 0, 1, 0])
    assert glue_task.compute_metrics("cola", preds, labels) == pytest.approx({"mcc": 100 * 5 / 12})
    assert glue_task.compute_metrics("mrpc", preds, labels) == pytest.approx({"accuracy": 100 * 5 / 7, "f1": 75.0})
    assert glue_task.compute_metrics("qqp", 1 - labels, labels)["f1"] == 0.0  # no true positive
    # MNLI: 3 classes, accuracy only.
    assert glue_task.compute_metrics("mnli", [0, 1, 2, 2], [0, 1, 2, 1]) == pytest.approx({"accuracy": 75.0})
    # Perfect and inverted predictions: MCC +1 / -1.
    assert glue_task.compute_metrics("cola", labels, labels)["mcc"] == pytest.approx(100.0)
    assert glue_task.compute_metrics("cola", 1 - labels, labels)["mcc"] == pytest.approx(-100.0)


def test_correlations_hand_computed():
    """x = 1..4, y = x^2: deviations (-1.5, -.5, .5, 1.5) and (-6.5, -3.5, 1.5, 8.5), so Pearson =
    25 / sqrt(5 * 129); y is monotone in x, so Spearman = 1. x = (1, 2, 3), y = (1, 3, 2): both 1/2."""
    m = glue_task.compute_metrics("stsb", np.array([1.0, 2, 3, 4]), np.array([1.0, 4, 9, 16]))
    assert m == pytest.approx({"pearson": 100 * 25 / np.sqrt(645), "spearman": 100.0})
    m = glue_task.compute_metrics("stsb", np.array([1.0, 2, 3]), np.array([1.0, 3, 2]))
    assert m == pytest.approx({"pearson": 50.0, "spearman": 50.0})
    assert np.isnan(glue_task.compute_metrics("stsb", np.ones(3), np.array([1.0, 3, 2]))["pearson"])


def test_accuracy_and_f1_equal_torchmetrics():
    import torch
    from torchmetrics.classification import BinaryAccuracy, BinaryF1Score

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    preds = np.where(rng.random(500) < 0.7, labels, 1 - labels)
    ours = glue_task.compute_metrics("mrpc", preds, labels)
    assert ours["f1"] == pytest.approx(100 * float(BinaryF1Score()(torch.tensor(preds), torch.tensor(labels))),
                                       abs=1e-4)
    assert ours["accuracy"] == pytest.approx(100 * float(BinaryAccuracy()(torch.tensor(preds), torch.tensor(labels))),
                                             abs=1e-4)


# ----------------------------------------------------------------------------- regression head


def test_regression_loss_hand_computed():
    logits = jnp.array([[1.0], [2.5], [0.0]], jnp.bfloat16)
    total, count = losses.regression_loss(logits, jnp.array([2.0, 2.0, 1.0]))
    assert total.dtype == jnp.float32 and float(total) == pytest.approx(1.0 + 0.25 + 1.0) and float(count) == 3
    with pytest.raises(ValueError, match=r"logits \(3, 2\) and labels \(3,\) are not \[B, 1\] and \[B\]"):
        losses.regression_loss(jnp.zeros((3, 2)), jnp.zeros(3))


def test_to_hf_regression_head_matches_transformers(tmp_path):
    """A num_labels=1 classifier exports with problem_type "regression": transformers loads it with no
    missing tensor, gives the same [B, 1] outputs, and its MSE loss equals regression_loss's mean."""
    import torch
    import transformers

    config = modeling.BertConfig(vocab_size=211, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=96, max_position_embeddings=40)
    model = heads.BertForSequenceClassification(config, num_labels=1)
    ids = np.random.default_rng(0).integers(1, 211, (5, 12)).astype(np.int32)
    types = np.zeros_like(ids)
    types[:, 7:] = 1
    mask = np.ones_like(ids)
    mask[3, 9:] = 0
    params = jax.device_get(nn.unbox(model.init(jax.random.key(1), jnp.asarray(ids)))["params"])
    params["classifier"]["kernel"] = np.random.default_rng(2).normal(0, 0.5, (48, 1)).astype(np.float32)
    params["classifier"]["bias"] = np.array([2.5], np.float32)
    hf.to_hf(config, params, str(tmp_path))
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["problem_type"] == "regression" and written["id2label"] == {"0": "LABEL_0"}

    loaded, info = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path),
                                                                              output_loading_info=True)
    assert not any(info.values()), info
    assert loaded.config.problem_type == "regression" and loaded.config.num_labels == 1
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask)).logits)
    scores = np.array([0.5, 1.0, 2.0, 3.5, 4.75], np.float32)
    with torch.no_grad():
        theirs = loaded.eval()(input_ids=torch.from_numpy(ids.astype(np.int64)),
                               token_type_ids=torch.from_numpy(types.astype(np.int64)),
                               attention_mask=torch.from_numpy(mask.astype(np.int64)),
                               labels=torch.from_numpy(scores))
    assert ours.shape == (5, 1) and np.ptp(ours) > 0.1
    np.testing.assert_allclose(ours, theirs.logits.numpy(), atol=1e-5, rtol=0)
    total, count = losses.regression_loss(jnp.asarray(ours), jnp.asarray(scores))
    assert float(total / count) == pytest.approx(float(theirs.loss), rel=1e-5)


# ----------------------------------------------------------------------------- configs


def test_configs_for_every_task():
    for task, spec in glue.TASKS.items():
        config = glue_config.get_config(task)
        assert config.task == task and config.data_dir == ""  # no default folder: the user names it
        assert (config.train_batch_size, config.num_train_epochs, config.max_seq_length) == (32, 3.0, 128)
        assert config.learning_rate in glue_config.LEARNING_RATES and config.do_predict is False
    assert glue_config.LEARNING_RATES == (5e-5, 4e-5, 3e-5, 2e-5)
    for task in ("mrpc", "sst2"):  # as before: run_classifier.py's defaults
        config = glue_config.get_config(task)
        assert (config.learning_rate, config.warmup_proportion, config.eval_batch_size) == (5e-5, 0.1, 64)
    assert glue_config.get_config("").task == "mrpc"
    with pytest.raises(ValueError, match=r"config arg 'ax' is not one of \['cola', "):
        glue_config.get_config("ax")
    with pytest.raises(ValueError, match=r"^config.data_dir is empty: name the folder that holds train.tsv$"):
        job.data_file(glue_config.get_config("rte"), "train.tsv")


# ----------------------------------------------------------------------------- the job end to end


def _job_config(task, glue_dir, data_dir):
    config = glue_config.get_config(task)
    config.model = pretrain.model_config("tiny")
    config.vocab_file = str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    config.data_dir = str(glue_dir / glue.TASKS[task].folder)
    config.max_seq_length, config.train_batch_size, config.eval_batch_size = 32, 4, 4
    config.num_train_epochs, config.learning_rate, config.log_every = 2.0, 1e-3, 1
    config.do_predict, config.save_checkpoint = True, False
    config.mesh.num_devices = 1
    return config


def _submission(path):
    lines = path.read_text().splitlines()
    assert lines[0] == "index\tprediction"
    return [tuple(line.split("\t")) for line in lines[1:]]


def test_stsb_job_regression_end_to_end(glue_dir, data_dir, tmp_path):
    metrics = glue_task.run(_job_config("stsb", glue_dir, data_dir), str(tmp_path))
    assert metrics["train_steps"] == 4 and np.isfinite(metrics["train_loss"]) and metrics["eval_examples"] == 3
    assert {"pearson", "spearman"} <= set(metrics) and "majority_accuracy" not in metrics
    assert all(-100 <= metrics[k] <= 100 for k in ("pearson", "spearman"))
    assert metrics["submission"] == [str(tmp_path / "submission" / "STS-B.tsv")]
    rows = _submission(tmp_path / "submission" / "STS-B.tsv")
    assert [i for i, _ in rows] == ["0", "1"] and all(len(p.split(".")[1]) == 3 for _, p in rows)
    assert all(np.isfinite(float(p)) for _, p in rows)
    dev = (tmp_path / "dev_predictions.tsv").read_text().splitlines()
    assert dev[0] == "index\tprediction\tlabel" and len(dev) == 4 and dev[1].endswith("\t4.0000")
    assert json.loads((tmp_path / "metrics.json").read_text())["eval_examples"] == 3


def test_mnli_job_both_dev_sets_end_to_end(glue_dir, data_dir, tmp_path):
    metrics = glue_task.run(_job_config("mnli", glue_dir, data_dir), str(tmp_path))
    assert metrics["train_steps"] == 4 and np.isfinite(metrics["train_loss"])
    assert (metrics["matched_eval_examples"], metrics["mismatched_eval_examples"]) == (2, 3)
    for key in ("matched_accuracy", "mismatched_accuracy"):
        assert 0 <= metrics[key] <= 100
    assert metrics["matched_majority_accuracy"] == 50.0 and metrics["mismatched_majority_accuracy"] == pytest.approx(
        100 / 3)
    assert "accuracy" not in metrics
    assert [p.rsplit("/", 1)[1] for p in metrics["submission"]] == ["MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"]
    matched, mismatched, ax = (_submission(tmp_path / "submission" / n) for n in ("MNLI-m.tsv", "MNLI-mm.tsv",
                                                                                   "AX.tsv"))
    assert [i for i, _ in matched] == ["0", "1"] and [i for i, _ in mismatched] == ["0"]
    assert [i for i, _ in ax] == ["0", "1", "2"]  # the diagnostic file beside MNLI/, predicted by the MNLI model
    assert {p for _, p in matched + mismatched + ax} <= {"contradiction", "entailment", "neutral"}
    for name, n in (("dev_matched_predictions.tsv", 2), ("dev_mismatched_predictions.tsv", 3)):
        assert len((tmp_path / name).read_text().splitlines()) == n + 1


def test_mnli_predict_without_the_diagnostic_file_is_one_line(glue_dir, data_dir, tmp_path):
    """MNLI's do_predict needs GLUE's diagnostic set for AX.tsv: a missing file fails before training,
    naming it and the two ways out; only MNLI's config predicts it by default."""
    config = _job_config("mnli", glue_dir, data_dir)
    config.diagnostic_file = str(tmp_path / "AX" / "diagnostic.tsv")
    with pytest.raises(FileNotFoundError, match=r"AX/diagnostic.tsv' does not exist .* set config.diagnostic_file, "
                                                r"or config.predict_diagnostic=False$"):
        glue_task.run(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    assert glue_config.get_config("mnli").predict_diagnostic and not glue_config.get_config("rte").predict_diagnostic


def test_submission_writer_label_strings(tmp_path):
    glue_task.write_submission(str(tmp_path / "QNLI.tsv"), "qnli", ["0", "1", "2"], np.array([1, 0, 1]))
    assert (tmp_path / "QNLI.tsv").read_text() == ("index\tprediction\n0\tnot_entailment\n1\tentailment\n"
                                                   "2\tnot_entailment\n")
    glue_task.write_submission(str(tmp_path / "CoLA.tsv"), "cola", ["0", "1"], np.array([1, 0]))
    assert (tmp_path / "CoLA.tsv").read_text() == "index\tprediction\n0\t1\n1\t0\n"
    glue_task.write_submission(str(tmp_path / "STS-B.tsv"), "stsb", ["0", "1"], np.array([3.14159, 0.5], np.float32))
    assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t3.142\n1\t0.500\n"
    with pytest.raises(ValueError, match="MNLI-m.tsv: predictions outside 0..2"):
        glue_task.write_submission(str(tmp_path / "MNLI-m.tsv"), "mnli", ["0"], np.array([3]))
    with pytest.raises(ValueError, match="2 test examples but 1 predictions"):
        glue_task.write_submission(str(tmp_path / "RTE.tsv"), "rte", ["0", "1"], np.array([0]))


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("task,text,match", [
    ("mrpc", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n2\t1\t2\ta\tb\n",
     r"dev.tsv:2: label '2' is not one of \['0', '1'\] \(MRPC\)$"),
    ("mnli", _tsv(_MNLI_HEAD + ("label1", "gold_label"), _mnli(0, "slate", "A.", "B.", "maybe", "maybe")),
     r"dev.tsv:2: label 'maybe' is not one of \['contradiction', 'entailment', 'neutral'\] \(MNLI\)$"),
    ("qnli", "index\tquestion\tsentence\tlabel\n0\tWho?\tHim.\tyes\n",
     r"dev.tsv:2: label 'yes' is not one of \['entailment', 'not_entailment'\] \(QNLI\)$"),
    ("stsb", _tsv(_STSB_HEAD + ("score",), _stsb(0, "g", "f", "A.", "B.", "5.5")),
     r"dev.tsv:2: score '5.5' is not a number in \[0, 5\]$"),
    ("stsb", _tsv(_STSB_HEAD + ("score",), _stsb(0, "g", "f", "A.", "B.", "high")),
     r"dev.tsv:2: score 'high' is not a number in \[0, 5\]$"),
    ("cola", "gj04\t1\t\tFine.\ngj04\t0\tBad\n", r"dev.tsv:2: CoLA row has 3 columns, expected 4$"),
    ("rte", "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tentailment\n1\tA.\tB.\n",
     r"dev.tsv:3: RTE row has 3 columns, expected 4$"),
    ("qqp", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n1\t2\t3\tA?\tB?\t0\textra\n",
     r"dev.tsv:2: QQP row has 7 columns, expected 6$"),
    ("stsb", "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\t1\n",
     r"dev.tsv:1: STS-B header has 4 columns, expected 10 \(train/dev\) or 9 \(test, first column 'index'\)$"),
    ("wnli", "index\tsentence1\tsentence2\n0\tA.\tB.\n1\tA.\n", r"dev.tsv:3: WNLI row has 2 columns, expected 3$"),
])
def test_bad_rows_are_one_line(tmp_path, task, text, match):
    bad = tmp_path / "dev.tsv"
    bad.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        glue.read_glue_tsv(task, str(bad))
    assert "\n" not in str(e.value) and str(bad) in str(e.value)


def test_bad_task_and_missing_file_are_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^GLUE task 'boolq' is not one of \['cola', 'mnli', "):
        glue.read_glue_tsv("boolq", str(tmp_path / "dev.tsv"))
    with pytest.raises(FileNotFoundError, match="dev.tsv' does not exist"):
        glue.read_glue_tsv("cola", str(tmp_path / "dev.tsv"))
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(ValueError, match="empty.tsv' is empty"):
        glue.read_glue_tsv("rte", str(tmp_path / "empty.tsv"))
    config = glue_config.get_config("rte")
    config.task = "ax"
    with pytest.raises(ValueError, match=r"^config.task='ax' is not one of \['cola', "):
        glue_task.run(config, str(tmp_path / "run"))
