"""gs:// against a Cloud Storage API: the emulator of `tests/gcs_emulator.py` (fake-gcs-server), reached by the
clients users run with, pointed at it by their standard environment variables only.

One pipeline of the commands users run (`pipeline`): tokenized documents and static instances written to gs://
by `create_pretraining_data`; pre-training reading them in place through array_record's GCS reader (google-cloud-cpp),
its checkpoints (Orbax: TensorStore's gcs driver and gcsfs), TensorBoard event files (tensorboardX:
google-cloud-storage) and metrics.jsonl (gcsfs) written to a gs:// workdir; a GLUE fine-tuning job restoring from
that workdir into a gs:// workdir of its own; `convert to_hf` of the gs:// run. Each output is checked against the
same command run on local paths. Also: an upload failing midway publishes nothing, so a data directory interrupted
while uploading has no metadata.json and no partial shard.

Not tested here: TensorFlow's GCS filesystem (epath's gs:// backend where TensorFlow is installed and EPATH_USE_TF
is not false), which has no endpoint setting and so cannot reach an emulator; the Storage Control gRPC API (zonal
and hierarchical-namespace buckets), which fake-gcs-server lacks; preparation on Apache Beam (`--runner`) to gs://.
"""

import json
import os
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util

from bert_jax import storage
from bert_jax.data import corpus, tokenization
from bert_jax.data.pretraining import document_shards, formats
from conftest import ROOT, SMALL_VOCAB_SIZE, xla_flags
from gcs_emulator import bucket, gcs  # noqa: F401 (fixtures)
from test_continued_pretraining import assert_pretraining_export_matches
from test_remote_data import _same_directory

pytestmark = pytest.mark.integration

STEPS = 4  # pre-training steps: phase 1 (dynamic, packed at 64) for 2, phase 2 (static, 128) for 2
# Scalars that measure time, not the run: left out of comparisons between two runs.
TIMED = ("sequences_per_second", "tokens_per_second", "seconds")


def _env() -> dict:
    return dict(os.environ, XLA_FLAGS=xla_flags(1), PYTHONPATH=str(ROOT))


def _run_together(commands: list[list[str]], timeout: int = 300) -> list[str]:
    """Runs `commands` at once (2 cores: the small ones overlap) -> their stdouts; a failure shows its stderr."""
    procs = [subprocess.Popen(c, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    outs = [p.communicate(timeout=timeout) for p in procs]
    for command, proc, (_, err) in zip(commands, procs, outs):
        assert proc.returncode == 0, f"{' '.join(map(str, command[2:4]))}: {err[-3000:]}"
    return [out for out, _ in outs]


def _prepare(corpus_file, vocab, output_dir, *flags) -> list[str]:
    return [sys.executable, "-m", "bert_jax.data.create_pretraining_data", f"--input_file={corpus_file}",
            f"--output_dir={output_dir}", f"--vocab_file={vocab}", "--num_shards=2", "--num_workers=1", *flags]


def _pretrain(data: str, workdir: str) -> list[str]:
    return [sys.executable, "-m", "bert_jax.train", "--config", "pretrain:tiny", "--workdir", workdir,
            f"--config.phases[0].data_dir={data}/docs", f"--config.phases[1].data_dir={data}/p2",
            f"--config.total_steps={STEPS}", "--config.warmup_steps=2", "--config.phases[0].fraction=0.5",
            "--config.phases[1].fraction=0.5", "--config.phases[0].batch_size=8", "--config.phases[1].batch_size=8",
            "--config.phases[0].packing=True", "--config.checkpoint_every=2", "--config.log_every=1",
            f"--config.model.vocab_size={SMALL_VOCAB_SIZE}", "--config.mesh.num_devices=1"]


@pytest.fixture(scope="module")
def pipeline(gcs, data_dir, small_vocab, tmp_path_factory):
    """The commands of the module docstring, on a bucket of their own and, for comparison, on local paths ->
    {"remote": gs://BUCKET, "local": local folder, "finetune": the GLUE job's metrics, "export": a local
    Hugging Face directory of the gs:// run}. Same layout on both sides: docs/, p2/, run/ (and mrpc/ on gs://)."""
    remote, local = gcs.new_bucket(), tmp_path_factory.mktemp("gcs_local")
    sample = data_dir / "corpus" / "bert_sample_text.txt"
    docs, p2 = ("--tokenize_only",), ("--max_seq_length=128", "--max_predictions_per_seq=20", "--dupe_factor=2")
    _run_together([_prepare(sample, small_vocab, f"{root}/{name}", *flags)
                   for root in (remote, local) for name, flags in (("docs", docs), ("p2", p2))])
    _run_together([_pretrain(remote, f"{remote}/run"), _pretrain(str(local), str(local / "run"))])
    finetune, export = _run_together([
        [sys.executable, "-m", "bert_jax.tasks.glue", "--config", "glue:mrpc", "--workdir", f"{remote}/mrpc",
         f"--config.init_checkpoint={remote}/run", f"--config.data_dir={data_dir / 'glue' / 'MRPC'}",
         "--config.max_seq_length=32", "--config.length_buckets=0", "--config.max_train_examples=32",
         "--config.num_train_epochs=1", "--config.train_batch_size=16", "--config.eval_batch_size=128",
         "--config.learning_rate=0", "--config.mesh.num_devices=1"],
        [sys.executable, "-m", "bert_jax.convert", "to_hf", "--checkpoint", f"{remote}/run",
         "--output_dir", str(local / "hf")]])
    return {"remote": remote, "local": local, "finetune": json.loads(finetune.strip().splitlines()[-1]),
            "export": export}


def _params(workdir: str, step: int) -> dict:
    """{"/"-joined name: array} of the parameters of checkpoint `step` of the run at `workdir` (local or gs://)."""
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(storage.join(workdir, "checkpoints"), item_names=("state", "data", "config"),
                               options=ocp.CheckpointManagerOptions(read_only=True)) as manager:
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return traverse_util.flatten_dict(jax.device_get(restored["state"]["params"]), sep="/")


def _event_scalars(directory: str) -> dict[tuple[str, int], float]:
    """{(tag, step): value} of the scalars in the TensorBoard event files of `directory` (local or gs://), read
    as TFRecords of `Event` protos."""
    from tensorboardX.proto import event_pb2

    scalars = {}
    for name in storage.list_names(directory):
        data, offset = storage.read_bytes(storage.join(directory, name)), 0
        while offset < len(data):  # a record: length (uint64), its crc, the Event, the Event's crc
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars[(value.tag, event.step)] = value.simple_value
    return scalars


def _untimed(scalars: dict) -> dict:
    return {k: v for k, v in scalars.items() if not any(t in k[0] for t in TIMED)}


@pytest.mark.slow
def test_data_written_to_gcs_equals_local_and_is_read_in_place(pipeline):
    """Both data directories on gs:// hold the files, byte for byte, of the same command run locally (metadata.json
    but its timing); array_record reads every record back from gs:// itself (no local copy is made), equal to the
    local directory's."""
    remote, local = pipeline["remote"], pipeline["local"]
    for name in ("docs", "p2"):
        _same_directory(f"{remote}/{name}", local / name)
    before = set(storage._LOCAL_COPIES)
    meta = storage.read_json(f"{remote}/p2/metadata.json")
    ours, theirs = formats.open_shards(f"{remote}/p2", meta), formats.open_shards(str(local / "p2"), meta)
    assert len(ours) == meta["num_instances"] > 0
    assert [ours[i] for i in range(len(ours))] == [theirs[i] for i in range(len(theirs))]
    meta = storage.read_json(f"{remote}/docs/metadata.json")
    for ours, theirs in zip(formats.open_document_shards(f"{remote}/docs", meta),
                            formats.open_document_shards(str(local / "docs"), meta), strict=True):
        assert len(ours) > 0 and [ours[i] for i in range(len(ours))] == [theirs[i] for i in range(len(theirs))]
    assert set(storage._LOCAL_COPIES) == before  # gs:// shards are opened in place, never downloaded


@pytest.mark.slow
def test_pretraining_on_gcs_writes_what_the_local_run_writes(pipeline):
    """The run on gs:// data with a gs:// workdir: the checkpoints the local run has, whose parameters restore
    (TensorStore from gs://) to the local run's bit for bit; the same run files; metrics.jsonl and the TensorBoard
    scalars of the local run (all but timings), the event files read back from the bucket."""
    remote, local = f"{pipeline['remote']}/run", pipeline["local"] / "run"
    assert storage.list_names(f"{remote}/checkpoints") == sorted(os.listdir(local / "checkpoints")) == ["2", "4"]
    for step in (2, STEPS):
        ours, theirs = _params(remote, step), _params(str(local), step)
        assert ours.keys() == theirs.keys()
        for k, v in theirs.items():
            np.testing.assert_array_equal(ours[k], v, err_msg=f"step {step}: {k}")
    for name in ("bert_config.json", "vocab.txt", "tokenizer_config.json"):
        assert storage.read_bytes(f"{remote}/{name}") == (local / name).read_bytes(), name

    def records(text):
        return [{k: v for k, v in json.loads(line).items() if k not in TIMED} for line in text.splitlines()]

    ours = records(storage.read_text(f"{remote}/metrics.jsonl"))
    assert len(ours) >= STEPS and ours == records((local / "metrics.jsonl").read_text())
    scalars = _untimed(_event_scalars(f"{remote}/tensorboard"))
    assert ("train/loss", STEPS) in scalars and scalars == _untimed(_event_scalars(str(local / "tensorboard")))


@pytest.mark.slow
def test_finetuning_restores_the_gcs_run_and_saves_to_gcs(pipeline):
    """A GLUE job initialised from the gs:// pre-training workdir, with learning rate 0, saves into its own gs://
    workdir an encoder equal to the pre-training run's final one (the local run's, bit for bit): what was
    restored is what was saved."""
    metrics = pipeline["finetune"]
    assert metrics["init"] == "orbax" and metrics["train_steps"] == 2
    assert metrics["checkpoint"] == f"{pipeline['remote']}/mrpc/checkpoints/2"
    tuned, pretrained = _params(f"{pipeline['remote']}/mrpc", 2), _params(str(pipeline["local"] / "run"), STEPS)
    encoder = [k for k in pretrained if k.startswith("bert/")]
    assert encoder and set(encoder) <= set(tuned)
    for k in encoder:
        np.testing.assert_array_equal(tuned[k], pretrained[k], err_msg=k)
    assert storage.is_file(f"{pipeline['remote']}/mrpc/metrics.json")


@pytest.mark.slow
def test_to_hf_of_the_gcs_run_matches_the_model(pipeline):
    """`convert to_hf` of the gs:// run: a directory transformers loads, whose MLM and NSP logits equal bert_jax's
    on the local run's parameters (within 1e-5)."""
    assert pipeline["export"].strip().endswith(": BertForPreTraining")
    assert_pretraining_export_matches(pipeline["local"] / "run", pipeline["local"] / "hf")


@pytest.mark.slow
def test_convert_refuses_a_gcs_output_dir(pipeline, tmp_path, monkeypatch, capsys):
    """convert writes local directories: a gs:// --output_dir is one line, and no local folder named after it."""
    from bert_jax.checkpoints import convert

    monkeypatch.chdir(tmp_path)
    target = f"{pipeline['remote']}/hf"
    assert convert.main(["to_hf", "--checkpoint", f"{pipeline['remote']}/run", "--output_dir", target]) == 1
    assert capsys.readouterr().err.strip() == (f"convert: --output_dir={target!r} is a URI: convert writes a local "
                                               "directory (copy it to the bucket afterwards)")
    assert os.listdir(tmp_path) == [] and not storage.exists(target)


def _failing_copy(monkeypatch, fail_at: int, written: int):
    """`shutil.copyfileobj` (storage.upload's) failing from its `fail_at`-th call on (1-based), each time after
    writing `written` bytes of the source: a connection lost mid-upload."""
    import shutil

    real, calls = shutil.copyfileobj, []

    def copy(src, dst, length=0):
        calls.append(dst)
        if len(calls) >= fail_at:
            dst.write(src.read(written))
            raise OSError("connection reset")
        real(src, dst, length)

    monkeypatch.setattr(shutil, "copyfileobj", copy)


def test_an_upload_failing_midway_publishes_nothing(bucket, tmp_path, monkeypatch):
    """A 12 MiB upload (resumable, in chunks) that fails after 8 MiB leaves the object as it was: the earlier
    version whole, or no object at all; closing the file would have published the 8 MiB."""
    data = np.random.default_rng(0).bytes(12 << 20)
    (tmp_path / "shard").write_bytes(data)
    storage.upload(str(tmp_path / "shard"), f"{bucket}/old")
    _failing_copy(monkeypatch, 1, 8 << 20)
    for name in ("old", "new"):
        with pytest.raises(OSError, match="connection reset"):
            storage.upload(str(tmp_path / "shard"), f"{bucket}/{name}")
    assert storage.list_names(bucket) == ["old"] and storage.read_bytes(f"{bucket}/old") == data


def test_data_interrupted_while_uploading_has_no_metadata(bucket, data_dir, small_vocab, monkeypatch):
    """Tokenized documents written to gs:// whose second shard's upload fails midway: the first shard only, no
    partial second shard, and no metadata.json (a directory without it is unfinished)."""
    _failing_copy(monkeypatch, 2, 100)
    documents = corpus.read_sentence_documents([str(data_dir / "corpus" / "bert_sample_text.txt")], corpus.ReadStats())
    with pytest.raises(OSError, match="connection reset"):
        document_shards.tokenize_documents(documents, tokenization.Tokenizer(str(small_vocab)), f"{bucket}/docs",
                                           num_shards=3)
    assert storage.list_names(f"{bucket}/docs") == ["documents-00000-of-00003.array_record"]


@pytest.mark.slow
def test_an_unreadable_checkpoint_on_gcs_is_moved_aside(pipeline, bucket, capfd):
    """The gs:// run's checkpoints copied to a fresh bucket, step 4 truncated (its array data files deleted): restoring
    reports it in one line, moves it aside to 4.unreadable (on an object store, a rename object by object; Orbax's
    commit marker goes along) and reads step 2, equal to the local run's step 2."""
    import fsspec

    from bert_jax.checkpoints import checkpointing

    fs = fsspec.filesystem("gcs")
    fs.copy(f"{pipeline['remote']}/run/checkpoints", f"{bucket}/checkpoints", recursive=True)
    # every data file of step 4's arrays (one alone may hold only optimizer moments, which a restore of the
    # parameters never reads)
    fs.rm(fs.find(f"{bucket}/checkpoints/4/state/ocdbt.process_0/d"))
    expected = _params(str(pipeline["local"] / "run"), 2)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = traverse_util.unflatten_dict({tuple(k.split("/")): jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device)
                                           for k, v in expected.items()})
    restored = traverse_util.flatten_dict(jax.device_get(
        checkpointing.restore_params(f"{bucket}/checkpoints", target)), sep="/")
    assert restored.keys() == expected.keys()
    for k, v in expected.items():
        np.testing.assert_array_equal(restored[k], v, err_msg=k)
    assert storage.list_names(f"{bucket}/checkpoints") == ["2", "4.unreadable"]
    assert f"checkpoint 4 in {bucket}/checkpoints is unreadable (" in capfd.readouterr().err
    assert storage.is_file(f"{bucket}/checkpoints/4.unreadable/commit_success.txt")


def test_the_workdir_lease_on_cloud_storage(bucket):
    """`bert_jax.training.guards.lease` on a gs:// workdir, by the object store's own preconditions: a second run is
    refused while the lease is fresh; of several runs that find the same stale lease at once, exactly one takes it;
    the holder's heartbeat refreshes it in place; release deletes it only while it is the holder's."""
    import threading
    import time

    from google.cloud import storage as gcs_client

    from bert_jax.training.guards import lease

    workdir = f"{bucket}/run"
    held = lease.acquire(workdir, "train", timeout_s=30, heartbeat_s=0.3)
    with pytest.raises(lease.WorkdirInUse, match=r"^--workdir gs://.*/run is in use by train on host "):
        lease.acquire(workdir, "train", timeout_s=30, heartbeat_s=10)
    store = gcs_client.Client.create_anonymous_client().bucket(bucket[len("gs://"):])

    def blob():  # a new handle each time: one that has read an object asks for that generation again
        return store.blob("run/lease.json")

    first = json.loads(blob().download_as_bytes())["heartbeat"]
    time.sleep(1.0)
    assert json.loads(blob().download_as_bytes())["heartbeat"] > first  # refreshed by the heartbeat thread
    held.release()
    assert not blob().exists()
    stale = {"run": "old", "job": "train", "host": "gone-host", "pid": 1, "started": 0.0, "heartbeat": time.time() - 60}
    blob().upload_from_string(json.dumps(stale))
    results, barrier = [], threading.Barrier(4)

    def take():
        barrier.wait()
        try:
            results.append(lease.acquire(workdir, "train", timeout_s=30, heartbeat_s=10))
        except lease.WorkdirInUse as e:
            results.append(e)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if isinstance(r, lease.Lease)]
    assert len(winners) == 1 and len(results) == 4, results
    assert json.loads(blob().download_as_bytes())["run"] == winners[0].record["run"]
    winners[0].release()
