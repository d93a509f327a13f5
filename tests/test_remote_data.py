"""Data directories at a URI: the writers build locally and upload (metadata.json last), training reads the
URI. The very code gs:// takes, on a fake "s3" scheme backed by fsspec's in-memory filesystem (epath's
fsspec backend; nothing here reaches Cloud Storage)."""

import io
import json

import jax
import numpy as np
import pytest
from flax import traverse_util

from bert_jax import storage
from bert_jax.training import pretraining
from bert_jax.configs import pretrain
from bert_jax.data import corpus, tokenization
from bert_jax.data.pretraining import document_shards, procedure


@pytest.fixture
def s3(monkeypatch):
    """s3:// served from memory for this test (epath: the fsspec backend, as without TensorFlow)."""
    import fsspec
    from etils.epath import gpath
    from fsspec.implementations.memory import MemoryFileSystem

    class FakeS3(MemoryFileSystem):
        protocol = ("s3",)
        store: dict = {}
        pseudo_dirs = [""]

        def _open(self, path, mode="rb", **kwargs):  # a reader of its own, as an object store gives each
            key = self._strip_protocol(path)       # (fsspec's memory files share one position between readers)
            if mode == "rb" and key in self.store:
                return io.BytesIO(self.store[key].getvalue())
            return super()._open(path, mode, **kwargs)

    fsspec.register_implementation("s3", FakeS3, clobber=True)
    monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
    yield "s3://bucket"
    FakeS3.store.clear()


def _documents(data_dir):
    return corpus.read_sentence_documents([str(data_dir / "corpus" / "bert_sample_text.txt")], corpus.ReadStats())


def _same_directory(remote: str, local, skip=("seconds",)):
    names = storage.list_names(remote)
    assert names == sorted(p.name for p in local.iterdir())
    for name in names:
        if name == "metadata.json":
            ours, theirs = storage.read_json(storage.join(remote, name)), json.loads((local / name).read_text())
            assert {k: v for k, v in ours.items() if k not in skip} == {k: v for k, v in theirs.items() if k not in skip}
        else:
            assert storage.read_bytes(storage.join(remote, name)) == (local / name).read_bytes(), name


def _params(workdir, step):
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(str(workdir / "checkpoints"), item_names=("state", "data", "config"),
                               options=ocp.CheckpointManagerOptions(read_only=True)) as m:
        restored = m.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return traverse_util.flatten_dict(jax.device_get(restored["state"]["params"]), sep="/")


@pytest.mark.slow
def test_tokenized_documents_at_a_uri_train_bit_for_bit_as_local_ones(s3, data_dir, tmp_path):
    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    remote, local = f"{s3}/docs", tmp_path / "docs"
    document_shards.tokenize_documents(_documents(data_dir), tok, remote, num_shards=2)
    document_shards.tokenize_documents(_documents(data_dir), tok, str(local), num_shards=2)
    _same_directory(remote, local)
    finals = []
    for name, path in (("remote", remote), ("local", str(local))):
        config = pretrain.get_config("tiny")
        config.phases = [config.phases[0]]
        config.phases[0].data_dir, config.phases[0].batch_size, config.phases[0].fraction = path, 8, 1.0
        config.total_steps, config.warmup_steps, config.checkpoint_every = 4, 2, 4
        config.mesh.num_devices = 1
        pretraining.train_and_evaluate(config, str(tmp_path / name))
        finals.append(_params(tmp_path / name, 4))
    for k, v in finals[1].items():
        np.testing.assert_array_equal(finals[0][k], v, err_msg=k)


def test_static_instances_at_a_uri_equal_local_ones(s3, data_dir, tmp_path):
    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    options = procedure.InstanceOptions(max_seq_length=64, max_predictions_per_seq=10)
    remote, local = f"{s3}/p1", tmp_path / "p1"
    for out in (remote, str(local)):
        procedure.create_pretraining_data(_documents(data_dir), tok, out, options=options, dupe_factor=2,
                                            num_shards=3)
    _same_directory(remote, local)
    assert sum(1 for _ in procedure.iterate_instances(remote)) == storage.read_json(f"{remote}/metadata.json")[
        "num_instances"]


def test_an_upload_failing_halfway_leaves_no_metadata(s3, data_dir, monkeypatch):
    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    real, calls = storage.upload, []

    def failing(local, path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(f"{path}: connection reset")
        real(local, path)

    monkeypatch.setattr(storage, "upload", failing)
    with pytest.raises(OSError, match="connection reset"):
        document_shards.tokenize_documents(_documents(data_dir), tok, f"{s3}/docs", num_shards=3)
    assert storage.list_names(f"{s3}/docs") == ["documents-00000-of-00003.array_record"]
    assert not storage.exists(f"{s3}/docs/metadata.json")


def test_a_remote_file_is_copied_once_for_threads_reading_it_together(s3, monkeypatch):
    """Beam's in-memory workers are threads of one process: reading the same URI at once gives each the one local
    copy (a shared temporary name once let the second rename fail)."""
    from concurrent.futures import ThreadPoolExecutor

    data = bytes(range(256)) * 4096
    with storage.epath.Path(f"{s3}/shard.bin").open("wb") as f:
        f.write(data)
    monkeypatch.setattr(storage, "_LOCAL_COPIES", {})
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda _: storage.local_file(f"{s3}/shard.bin"), range(16)))
    assert len(set(paths)) == 1
    with open(paths[0], "rb") as f:
        assert f.read() == data
