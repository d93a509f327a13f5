"""Released checkpoints by name: Hugging Face model ids and Google's google-research/bert checkpoints.

`local_directory(name)` gives the local directory a name stands for, which `sources.resolve` then reads like
any other Hugging Face directory or TensorFlow checkpoint (`config.init_checkpoint`, `python -m
bert_jax.convert`). A string is read, in this order, as

  an existing path          a local path or a URI that exists is always a path, never a name;
  one of Google's names     a key of `GOOGLE`: the zips google-research/bert's README links
                            (`uncased_L-12_H-768_A-12`, `cased_L-24_H-1024_A-16`, `multi_cased_L-12_H-768_A-12`,
                            the small BERTs `uncased_L-4_H-256_A-4`, ...), downloaded once into
                            `cache_dir()/google/<name>/` (bert_config.json, vocab.txt, bert_model.ckpt.index and
                            .data-*), a TensorFlow checkpoint;
  a Hugging Face model id   `[namespace/]name[@revision]` (`bert-base-uncased`, `google-bert/bert-large-cased@main`)
                            where `[namespace/]name` passes huggingface_hub's `validate_repo_id` (letters, digits,
                            `-`, `_`, `.`; at most one `/`; no `--` or `..`; not starting or ending with `-` or `.`;
                            at most 96 characters): huggingface_hub's `snapshot_download` of config.json,
                            vocab.txt, tokenizer_config.json and model.safetensors (else pytorch_model.bin) into
                            its own cache (HF_HUB_CACHE / HF_HOME); with HF_HUB_OFFLINE=1 only that cache is read;
and anything else is a path that does not exist.

Google's zips are checked before anything reaches the cache: each is downloaded to a temporary file, its members
are unpacked into a temporary directory, and that directory is renamed to `<cache>/google/<name>` only when every
check passed. The checks: for the seven names of `PUBLISHED_SHA256`, the sha256 of each file read (bert_config.json,
vocab.txt, bert_model.ckpt.index, bert_model.ckpt.data-00000-of-00001), as NVIDIA's DeepLearningExamples publish
them (Google publishes none); these always apply, whatever the mirror or a SHA256SUMS file says. For any name, the
sha256 of the zip itself when a SHA256SUMS file is configured and lists `<name>.zip`. A name with neither (the
whole-word-masking and small BERTs: no published sha256 is known) is refused until a SHA256SUMS file lists it.

Environment (read when a name is resolved):
  BERT_JAX_CACHE                the cache; default $XDG_CACHE_HOME/bert_jax, else ~/.cache/bert_jax
  BERT_JAX_RELEASED_URL         a mirror of Google's zips: `<url>/<name>.zip` instead of storage.googleapis.com
  BERT_JAX_RELEASED_SHA256SUMS  a SHA256SUMS file (a path or an http(s) URL) of `<sha256>  <name>.zip` lines,
                                read only when set

Casing: `casing(prefix)` is google-research/bert's rule (tokenization.validate_case_matches_checkpoint: the name
of the directory holding `bert_model.ckpt`, looked up among its released names), over `GOOGLE`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import zipfile

from bert_jax.data import download

CACHE_ENV = "BERT_JAX_CACHE"
URL_ENV = "BERT_JAX_RELEASED_URL"
SHA256SUMS_ENV = "BERT_JAX_RELEASED_SHA256SUMS"
GOOGLE_URL = "https://storage.googleapis.com/bert_models/"
TIMEOUT = 60.0  # seconds without data before a download fails

# sha256 of the files read from Google's zips, as published in NVIDIA/DeepLearningExamples,
# PyTorch/LanguageModeling/BERT/data/GooglePretrainedWeightDownloader.py (commit 1187980309bb6dd6fd1dbdd93afb326c6687f9e0),
# which checks the same URLs' members (it also lists bert_model.ckpt.meta, which is not read here). The uncased
# vocab.txt's equals `bert_jax.data.download.SHA256`'s Hugging Face copy of it.
_CONFIG, _VOCAB, _INDEX, _DATA = ("bert_config.json", "vocab.txt", "bert_model.ckpt.index",
                                  "bert_model.ckpt.data-00000-of-00001")
PUBLISHED_SHA256 = {
    "uncased_L-12_H-768_A-12": ("7b4e5f53efbd058c67cda0aacfafb340113ea1b5797d9ce6ee411704ba21fcbc",
                                "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
                                "04c1323086e2f1c5b7c0759d8d3e484afbb0ab45f51793daab9f647113a0117b",
                                "58580dc5e0bf0ae0d2efd51d0e8272b2f808857f0a43a88aaf7549da6d7a8a84"),
    "uncased_L-24_H-1024_A-16": ("bfa42236d269e2aeb3a6d30412a33d15dbe8ea597e2b01dc9518c63cc6efafcb",
                                 "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
                                 "68b52f2205ffc64dc627d1120cf399c1ef1cbc35ea5021d1afc889ffe2ce2093",
                                 "bc6b3363e3be458c99ecf64b7f472d2b7c67534fd8f564c0556a678f90f4eea1"),
    "cased_L-12_H-768_A-12": ("f11dfb757bea16339a33e1bf327b0aade6e57fd9c29dc6b84f7ddb20682f48bc",
                              "eeaa9875b23b04b4c54ef759d03db9d1ba1554838f8fb26c5d96fa551df93d02",
                              "517d6ef5c41fc2ca1f595276d6fccf5521810d57f5a74e32616151557790f7b1",
                              "734d5a1b68bf98d4e9cb6b6692725d00842a1937af73902e51776905d8f760ea"),
    "cased_L-24_H-1024_A-16": ("7adb2125c8225da495656c982fd1c5f64ba8f20ad020838571a3f8a954c2df57",
                               "eeaa9875b23b04b4c54ef759d03db9d1ba1554838f8fb26c5d96fa551df93d02",
                               "ef42a53f577fbe07381f4161b13c7cab4f4fc3b167cec6a9ae382c53d18049cf",
                               "6ff33640f40d472f7a16af0c17b1179ca9dcc0373155fb05335b6a4dd1657ef0"),
    "multi_cased_L-12_H-768_A-12": ("e76c3964bc14a8bb37a5530cdc802699d2f4a6fddfab0611e153aa2528f234f0",
                                    "fe0fda7c425b48c516fc8f160d594c8022a0808447475c1a7c6d6479763f310c",
                                    "7d8509c2a62b4e300feb55f8e5f1eef41638f4998dd4d887736f42d4f6a34b37",
                                    "55b8a2df41f69c60c5180e50a7c31b7cdf6238909390c4ddf05fbc0d37aa1ac5"),
    "multilingual_L-12_H-768_A-12": ("49063bb061390211d2fdd108cada1ed86faa5f90b80c8f6fdddf406afa4c4624",
                                     "87b44292b452f6c05afa49b2e488e7eedf79ea4f4c39db6f2f4b37764228ef3f",
                                     "87c372c1a3b1dc7effaaa9103c80a81b3cbab04c7933ced224eec3b8ad2cc8e7",
                                     "3cd83912ebeb0efe2abf35c9f1d5a515d8e80295e61c49b75c8853f756658429"),
    "chinese_L-12_H-768_A-12": ("7aaad0335058e2640bcb2c2e9a932b1cd9da200c46ea7b8957d54431f201c015",
                                "45bbac6b341c319adc98a532532882e91a9cefc0329aa57bac9ae761c27b291c",
                                "46315546e05ce62327b3e2cd1bed22836adcb2ff29735ec87721396edb21b82e",
                                "756699356b78ad0ef1ca9ba6528297bcb3dd1aef5feadd31f4775d7c7fc989ba"),
}


@dataclasses.dataclass(frozen=True)
class Released:
    """One of Google's released checkpoints: `name` (the zip's and its folder's), `url` (Google's address of the
    zip), `do_lower_case` (the casing it was pre-trained with), `sha256` ({file name: sha256} of the files read
    from it, published; empty when none is known)."""

    name: str
    url: str
    do_lower_case: bool
    sha256: dict


def _registry() -> dict[str, Released]:
    """The names of google-research/bert's README, with its URLs. Casing: the original's lists
    (tokenization.validate_case_matches_checkpoint) for the seven names it knows; whole word masking by its
    name; the small BERTs (2020) are uncased English models, the 12-layer 768 one being BERT-Base itself
    (`uncased_L-12_H-768_A-12` stays the 2018 release)."""
    dates = {"uncased_L-12_H-768_A-12": "2018_10_18", "uncased_L-24_H-1024_A-16": "2018_10_18",
             "cased_L-12_H-768_A-12": "2018_10_18", "cased_L-24_H-1024_A-16": "2018_10_18",
             "multi_cased_L-12_H-768_A-12": "2018_11_23", "multilingual_L-12_H-768_A-12": "2018_11_03",
             "chinese_L-12_H-768_A-12": "2018_11_03", "wwm_uncased_L-24_H-1024_A-16": "2019_05_30",
             "wwm_cased_L-24_H-1024_A-16": "2019_05_30"}
    for layers in (2, 4, 6, 8, 10, 12):
        for hidden in (128, 256, 512, 768):
            dates.setdefault(f"uncased_L-{layers}_H-{hidden}_A-{hidden // 64}", "2020_02_20")
    cased = {"cased_L-12_H-768_A-12", "cased_L-24_H-1024_A-16", "multi_cased_L-12_H-768_A-12",
             "wwm_cased_L-24_H-1024_A-16"}
    return {name: Released(name, f"{GOOGLE_URL}{date}/{name}.zip", name not in cased,
                           dict(zip((_CONFIG, _VOCAB, _INDEX, _DATA), PUBLISHED_SHA256.get(name, ()))))
            for name, date in dates.items()}


GOOGLE = _registry()
# google-research/bert's validate_case_matches_checkpoint: the model name is the folder of `bert_model.ckpt`.
_ORIGINAL_NAME = re.compile(r"^.*?([A-Za-z0-9_-]+)/bert_model.ckpt")
# The files a TensorFlow checkpoint directory needs; the rest of a zip (bert_model.ckpt.meta) is not unpacked.
_READ = re.compile(r"^(bert_config\.json|vocab\.txt|.+\.ckpt\.(index|data-\d+-of-\d+))$")


def cache_dir() -> str:
    """The cache of Google's checkpoints: $BERT_JAX_CACHE, else $XDG_CACHE_HOME/bert_jax, else
    ~/.cache/bert_jax (its `google/<name>` folders)."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                        "bert_jax")


def casing(prefix: str) -> bool | None:
    """The casing of a TensorFlow checkpoint by google-research/bert's rule: do_lower_case of the released name
    that is the folder of `bert_model.ckpt` in `prefix` (`.../cased_L-12_H-768_A-12/bert_model.ckpt` -> False),
    None for a folder of another name (the original checks nothing then)."""
    match = _ORIGINAL_NAME.match(str(prefix).replace(os.sep, "/"))
    entry = GOOGLE.get(match.group(1)) if match else None
    return None if entry is None else entry.do_lower_case


def is_model_id(name: str) -> bool:
    """Whether `name` has the syntax of a Hugging Face model id, `[namespace/]name[@revision]` (huggingface_hub's
    `validate_repo_id`); nothing is looked up."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo, at, revision = name.partition("@")
    if at and not revision.strip():
        return False
    try:
        validate_repo_id(repo)
    except HFValidationError:
        return False
    return True


def kind(name: str) -> str | None:
    """What the name `name` stands for: "google" (one of Google's names), "hf" (a Hugging Face model id) or None
    (neither); the caller has checked that `name` is not an existing path."""
    return "google" if name in GOOGLE else "hf" if is_model_id(name) else None


def local_directory(name: str, *, field: str = "config.init_checkpoint") -> str:
    """The local directory the name `name` stands for (module docstring), downloaded first where needed.

    Raises:
      FileNotFoundError: `name` is neither a name nor an existing path (`<field>=<name> does not exist`); a
        Hugging Face id not in its cache with HF_HUB_OFFLINE=1, or no such model or revision.
      ConnectionError: a download failed (naming the URL or the model and the cache).
      ImportError: one of Google's names without TensorFlow installed (before any download).
      ValueError: a sha256 mismatch, a Google name whose sha256 is not known, a zip without a checkpoint, a
        malformed SHA256SUMS file. Each one line.
    """
    found = kind(name)
    if found == "google":
        return fetch_google(name)
    if found == "hf":
        return hub_snapshot(name, field=field)
    raise FileNotFoundError(f"{field}={name!r} does not exist (nor is it one of Google's released names or a "
                            "Hugging Face model id)")


def hub_snapshot(model_id: str, *, field: str = "config.init_checkpoint") -> str:
    """The local snapshot of the Hugging Face model `model_id` (`repo[@revision]`), through huggingface_hub's
    `snapshot_download` and its cache: config.json, vocab.txt, tokenizer_config.json and model.safetensors, or
    pytorch_model.bin where the repository has no safetensors.

    Raises (one line naming the id, and the cache where it matters):
      FileNotFoundError: not in the cache with HF_HUB_OFFLINE=1; no such model or revision (or a private or
        gated one without access).
      ConnectionError: the Hub cannot be reached and the cache has no snapshot.
    """
    from huggingface_hub import constants, errors, snapshot_download
    from huggingface_hub.utils import HFValidationError

    repo, _, revision = model_id.partition("@")
    small = ["config.json", "vocab.txt", "tokenizer_config.json"]
    where = f"{field}={model_id!r} is no path; the Hugging Face model {model_id}"
    try:
        folder = snapshot_download(repo, revision=revision or None, allow_patterns=small + ["model.safetensors"])
        if not os.path.isfile(os.path.join(folder, "model.safetensors")):
            folder = snapshot_download(repo, revision=revision or None, allow_patterns=small + ["pytorch_model.bin"])
    except errors.RevisionNotFoundError:
        raise FileNotFoundError(f"{where} has no revision {revision!r}") from None
    except (errors.RepositoryNotFoundError, errors.GatedRepoError):
        raise FileNotFoundError(f"{where} does not exist on the Hub (or is private or gated: log in with "
                                "`hf auth login`)") from None
    except errors.LocalEntryNotFoundError as e:
        if constants.HF_HUB_OFFLINE:
            raise FileNotFoundError(f"{where} is not in the Hugging Face cache {constants.HF_HUB_CACHE} and "
                                    "HF_HUB_OFFLINE=1 (download it once online)") from None
        raise ConnectionError(f"{where} is not in the Hugging Face cache {constants.HF_HUB_CACHE} and the Hub "
                              f"({constants.ENDPOINT}) cannot be reached ({type(e.__cause__ or e).__name__})") from None
    except (errors.HfHubHTTPError, HFValidationError, OSError) as e:
        reason = " ".join(str(e).split())[:200]
        raise ConnectionError(f"{where}: cannot download it ({reason})") from None
    return folder


def listed_sha256(file_name: str) -> str | None:
    """The sha256 that the SHA256SUMS file named by $BERT_JAX_RELEASED_SHA256SUMS (a path or an http(s) URL)
    lists for `file_name`; None when the variable is unset or the file does not list it.

    Raises:
      FileNotFoundError / ConnectionError: the file cannot be read.
      ValueError: a line that is not `<64 hex digits> [ *]<file name>` (naming the file and line).
    """
    source = os.environ.get(SHA256SUMS_ENV)
    if not source:
        return None
    if re.match(r"^https?://", source):
        with tempfile.TemporaryDirectory() as tmp:
            download.fetch(source, os.path.join(tmp, "SHA256SUMS"), TIMEOUT)
            with open(os.path.join(tmp, "SHA256SUMS"), encoding="utf-8") as f:
                text = f.read()
    else:
        try:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise FileNotFoundError(f"{SHA256SUMS_ENV}={source!r}: {e.strerror or e}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = re.match(r"^([0-9a-fA-F]{64}) [ *](.+)$", line.strip())
        if match is None:
            raise ValueError(f"{SHA256SUMS_ENV}={source!r} line {number}: not `<sha256>  <file name>`")
        if os.path.basename(match.group(2).strip()) == file_name:
            return match.group(1).lower()
    return None


def fetch_google(name: str, *, timeout: float = TIMEOUT) -> str:
    """`cache_dir()/google/<name>`, downloaded and checked (module docstring) when not there yet; one line on
    stderr after a download.

    Raises:
      KeyError: `name` is not in `GOOGLE`.
      ImportError: TensorFlow is not installed (the `tf` extra), checked before downloading.
      ValueError: no sha256 known for the name; the zip's or a file's sha256 differs from the expected one
        (naming both); not a zip, or no checkpoint in it. Nothing is left in the cache.
      ConnectionError: the download failed (naming the URL and the cache).
    """
    entry = GOOGLE[name]
    target = os.path.join(cache_dir(), "google", name)
    if os.path.isdir(target):
        return target
    try:
        tensorflow = importlib.util.find_spec("tensorflow")
    except ValueError:  # a module set to None in sys.modules: not importable
        tensorflow = None
    if tensorflow is None:  # checked before a download whose files could not be read
        raise ImportError(f"{name}: Google's checkpoints are TensorFlow checkpoints; reading them needs TensorFlow: "
                          "pip install 'bert_jax[tf]'")
    mirror = os.environ.get(URL_ENV)
    url = f"{mirror.rstrip('/')}/{name}.zip" if mirror else entry.url
    zip_sha256 = listed_sha256(f"{name}.zip")
    if zip_sha256 is None and not entry.sha256:
        raise ValueError(f"{name}: no published sha256 is known for {entry.url}; list `<sha256>  {name}.zip` in a "
                         f"SHA256SUMS file named by {SHA256SUMS_ENV}, or unzip the checkpoint yourself and give "
                         "its directory")
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp_zip, tmp_dir = f"{target}.zip.tmp-{os.getpid()}", f"{target}.tmp-{os.getpid()}"
    try:
        try:
            download.fetch(url, tmp_zip, timeout)
        except ConnectionError as e:
            raise ConnectionError(f"{name} is not in the cache {parent}: {e}") from None
        if zip_sha256 is not None:
            got = download.sha256_of(tmp_zip)
            if got != zip_sha256:
                raise ValueError(f"{name}: {url} has sha256 {got}, {SHA256SUMS_ENV} lists {zip_sha256} (nothing "
                                 "was written)")
        _unpack(entry, url, tmp_zip, tmp_dir)
        try:
            os.replace(tmp_dir, target)
        except OSError:
            if not os.path.isdir(target):  # else another process finished the same download first
                raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if os.path.exists(tmp_zip):
            os.remove(tmp_zip)
    print(f"{name}: downloaded {url} (sha256 checked) into {target}", file=sys.stderr, flush=True)
    return target


def _unpack(entry: Released, url: str, archive: str, directory: str) -> None:
    """The checkpoint files of the zip `archive` (at its root or in one folder) into `directory`, each checked
    against `entry.sha256` while written; ValueError (one line naming the file, both hashes) otherwise."""
    os.makedirs(directory)
    try:
        with zipfile.ZipFile(archive) as z:
            members = {}
            for info in z.infolist():
                base = os.path.basename(info.filename)
                if info.is_dir() or not _READ.match(base):
                    continue
                if base in members:
                    raise ValueError(f"{entry.name}: {url} holds two files named {base}")
                members[base] = info
            missing = sorted(set(entry.sha256) - set(members)) + [_CONFIG] * (_CONFIG not in members) \
                + ["*.ckpt.index"] * (not any(m.endswith(".index") for m in members))
            if missing:
                raise ValueError(f"{entry.name}: {url} is no google-research/bert checkpoint (no {missing[0]})")
            for base, info in members.items():
                if entry.sha256 and base not in entry.sha256:
                    raise ValueError(f"{entry.name}: {url} holds {base}, a file of no published sha256")
                digest = hashlib.sha256()
                with z.open(info) as src, open(os.path.join(directory, base), "wb") as dst:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        dst.write(chunk)
                want = entry.sha256.get(base)
                if want is not None and digest.hexdigest() != want:
                    raise ValueError(f"{entry.name}: {base} of {url} has sha256 {digest.hexdigest()}, published "
                                     f"{want} (corrupt or not Google's; nothing was written)")
    except zipfile.BadZipFile as e:
        raise ValueError(f"{entry.name}: {url} is not a zip archive ({e})") from None
