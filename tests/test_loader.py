"""The grain pre-training pipeline: fields, coverage of one epoch, per-process sharding, shuffling,
exact resume (JSON and Orbax), errors, worker processes."""

import collections
import json

import grain
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax.data import corpus, tokenization
from bert_jax.data.pretraining import procedure
from bert_jax.data.pretraining.loader import make_pretraining_iterator

FIELDS = {  # name -> (dtype, per-row shape as a function of (L, P))
    "input_ids": (np.int32, lambda L, P: (L,)),
    "token_type_ids": (np.int32, lambda L, P: (L,)),
    "attention_mask": (np.int32, lambda L, P: (L,)),
    "masked_lm_positions": (np.int32, lambda L, P: (P,)),
    "masked_lm_ids": (np.int32, lambda L, P: (P,)),
    "masked_lm_weights": (np.float32, lambda L, P: (P,)),
    "next_sentence_labels": (np.int32, lambda L, P: ()),
}


@pytest.fixture(scope="module")
def instances(data_dir, tmp_path_factory):
    """bert_sample_text.txt -> 4 shards (one of them possibly empty) with short sequences."""
    out = tmp_path_factory.mktemp("instances")
    documents = corpus.read_sentence_documents([str(data_dir / "corpus" / "bert_sample_text.txt")],
                                               corpus.ReadStats())
    tokenizer = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    meta = procedure.create_pretraining_data(
        documents, tokenizer, str(out), dupe_factor=3, num_shards=4,
        options=procedure.InstanceOptions(max_seq_length=64, max_predictions_per_seq=10))
    assert meta["num_instances"] >= 20
    return str(out), meta


def _rows(batches):
    """Batches -> list of per-row hashable keys (every field's bytes)."""
    return [tuple(b[k][i].tobytes() for k in FIELDS) for b in batches for i in range(len(b["input_ids"]))]


def _take(it, n):
    return [next(it) for _ in range(n)]


def _assert_same(batches_a, batches_b):
    assert len(batches_a) == len(batches_b)
    for a, b in zip(batches_a, batches_b):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_fields_and_one_epoch_in_order(instances):
    path, meta = instances
    it = make_pretraining_iterator(path, global_batch_size=4, shuffle=False, num_epochs=1,
                                   max_seq_length=64, max_predictions_per_seq=10)
    assert it.metadata == meta and it.local_batch_size == 4
    batches = list(it)
    n = meta["num_instances"]
    assert len(batches) == n // 4 == it.num_batches
    for batch in batches:
        assert set(batch) == set(FIELDS)
        for k, (dtype, shape) in FIELDS.items():
            assert batch[k].dtype == dtype and batch[k].shape == (4, *shape(64, 10)), k
    # Without shuffling: iterate_instances' order, the last n % 4 records dropped.
    assert _rows(batches) == _rows([{k: v[None] for k, v in x.items()}
                                    for x in procedure.iterate_instances(path)])[: n // 4 * 4]


def test_shuffled_epochs_are_permutations(instances):
    path, meta = instances
    n = meta["num_instances"]
    everything = collections.Counter(_rows([{k: v[None] for k, v in x.items()}
                                            for x in procedure.iterate_instances(path)]))
    rows = _rows(list(make_pretraining_iterator(path, global_batch_size=1, seed=3, num_epochs=2)))
    assert len(rows) == 2 * n
    assert collections.Counter(rows[:n]) == everything == collections.Counter(rows[n:])
    assert rows[:n] != rows[n:]  # reshuffled each epoch
    in_order = _rows(list(make_pretraining_iterator(path, global_batch_size=1, shuffle=False, num_epochs=1)))
    assert rows[:n] != in_order


def test_processes_read_disjoint_records_covering_the_data(instances):
    path, meta = instances
    n = meta["num_instances"]
    for shuffle in (False, True):
        its = [make_pretraining_iterator(path, global_batch_size=4, shuffle=shuffle, num_epochs=1,
                                         process_index=p, process_count=2) for p in range(2)]
        per_process = [list(it) for it in its]
        assert [it.local_batch_size for it in its] == [2, 2]
        assert len(per_process[0]) == len(per_process[1]) == n // 4  # same step count everywhere
        single = list(make_pretraining_iterator(path, global_batch_size=4, shuffle=shuffle, num_epochs=1,
                                                process_index=0, process_count=1))
        # Global batch s is process 0's rows then process 1's: the same as one process would read.
        _assert_same(single, [{k: np.concatenate([a[k], b[k]]) for k in a} for a, b in zip(*per_process)])
        a, b = (collections.Counter(_rows(x)) for x in per_process)
        everything = collections.Counter(_rows(single))
        assert a + b == everything and sum(everything.values()) == n // 4 * 4
        assert not set(_rows(per_process[0])) & set(_rows(per_process[1]))


def test_shuffle_is_deterministic_per_seed(instances):
    path, _ = instances
    first = _take(make_pretraining_iterator(path, global_batch_size=4, seed=7), 8)
    _assert_same(first, _take(make_pretraining_iterator(path, global_batch_size=4, seed=7), 8))
    other = _take(make_pretraining_iterator(path, global_batch_size=4, seed=8), 8)
    assert _rows(first) != _rows(other)


@pytest.mark.parametrize("num_epochs", [None, 2])
def test_resume_from_json_state_matches_uninterrupted(instances, num_epochs):
    path, meta = instances
    kwargs = dict(global_batch_size=4, seed=11, num_epochs=num_epochs, process_index=1, process_count=2)
    reference = list(make_pretraining_iterator(path, **kwargs)) if num_epochs else \
        _take(make_pretraining_iterator(path, **kwargs), 3 * meta["num_instances"] // 4)
    for k in (0, 1, len(reference) // 2 + 1, len(reference) - 1, len(reference)):
        # k batches of 4 global rows; len // 2 + 1 and later are past the first epoch boundary.
        it = make_pretraining_iterator(path, **kwargs)
        _take(it, k)
        state = json.loads(json.dumps(it.get_state()))
        assert state["next_batch"] == k
        resumed = make_pretraining_iterator(path, **kwargs)
        resumed.set_state(state)
        _assert_same(_take(resumed, len(reference) - k), reference[k:])
        if num_epochs:
            with pytest.raises(StopIteration):
                next(resumed)


def test_state_is_checked_against_the_settings(instances):
    path, _ = instances
    state = make_pretraining_iterator(path, global_batch_size=4, seed=1).get_state()
    with pytest.raises(ValueError, match="seed"):
        make_pretraining_iterator(path, global_batch_size=4, seed=2).set_state(state)
    with pytest.raises(ValueError, match="global_batch_size"):
        make_pretraining_iterator(path, global_batch_size=8, seed=1).set_state(state)
    finite = make_pretraining_iterator(path, global_batch_size=4, num_epochs=1)
    with pytest.raises(ValueError, match="next_batch"):
        finite.set_state({**finite.get_state(), "next_batch": finite.num_batches + 1})


def test_bad_arguments_and_paths(instances, tmp_path):
    path, meta = instances
    cases = [
        (ValueError, "global_batch_size", dict(global_batch_size=5, process_index=0, process_count=2)),
        (ValueError, "max_seq_length", dict(global_batch_size=4, max_seq_length=128)),
        (ValueError, "max_predictions_per_seq", dict(global_batch_size=4, max_predictions_per_seq=20)),
        (ValueError, "process_index", dict(global_batch_size=4, process_index=2, process_count=2)),
        (ValueError, "num_epochs", dict(global_batch_size=4, num_epochs=0)),
    ]
    for error, name, kwargs in cases:
        with pytest.raises(error, match=name) as info:
            make_pretraining_iterator(path, **kwargs)
        assert "\n" not in str(info.value)
    for missing in (tmp_path, tmp_path / "nowhere"):  # an empty directory, a missing one
        with pytest.raises(FileNotFoundError, match=str(missing)) as info:
            make_pretraining_iterator(str(missing), global_batch_size=4)
        assert "\n" not in str(info.value)
    (tmp_path / "future").mkdir()
    (tmp_path / "future" / "metadata.json").write_text(json.dumps(dict(meta, format_version=7)))
    with pytest.raises(ValueError, match="future: format_version 7, expected 2$"):
        make_pretraining_iterator(str(tmp_path / "future"), global_batch_size=4)


def test_orbax_checkpoint_of_iterator_state(instances, tmp_path):
    path, _ = instances
    reference = _take(make_pretraining_iterator(path, global_batch_size=4, seed=5), 6)
    it = make_pretraining_iterator(path, global_batch_size=4, seed=5)
    _take(it, 4)
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(4, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                             data=grain.checkpoint.CheckpointSave(it)))
        mngr.wait_until_finished()
    resumed = make_pretraining_iterator(path, global_batch_size=4, seed=5)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        assert mngr.latest_step() == 4
        restored = mngr.restore(4, args=ocp.args.Composite(params=ocp.args.StandardRestore(params),
                                                           data=grain.checkpoint.CheckpointRestore(resumed)))
    np.testing.assert_array_equal(restored["params"]["w"], params["w"])
    assert restored["data"] is resumed and resumed.get_state()["next_batch"] == 4
    _assert_same(_take(resumed, 2), reference[4:])


def test_worker_processes_give_the_same_batches_and_states(instances):
    path, _ = instances
    reference = _take(make_pretraining_iterator(path, global_batch_size=4, seed=2), 6)
    it = make_pretraining_iterator(path, global_batch_size=4, seed=2, worker_count=2)
    try:
        _assert_same(_take(it, 3), reference[:3])
        state = it.get_state()
    finally:
        it.close()
    in_process = make_pretraining_iterator(path, global_batch_size=4, seed=2)
    in_process.set_state(state)  # states carry over between worker counts
    _assert_same(_take(in_process, 3), reference[3:])
