"""Packed and dynamic input resumed on another process count (`bert_jax.data.pretraining.stream`)."""

import collections
import json

import numpy as np
import pytest

from bert_jax.data import corpus, tokenization
from bert_jax.data.pretraining import document_shards, dynamic, loader, procedure, stream

WINDOW = 64  # instances shuffled together (small: a few documents' worth)
LENGTH, PREDICTIONS = 64, 10


def test_after_hand_computed():
    """Process 0 of 2 finished its positions 0, 2, 4 and process 1 position 1: the rest is 3, 5, then 6 on.
    Continued by one process that finished one unit (index 3): 5, then 6 on."""
    two = stream.Stream().after([{"next_index": 3}, {"next_index": 1}])
    assert two == stream.Stream((3, 5), 6)
    assert [two.index(j) for j in range(4)] == [3, 5, 6, 7]
    assert two.after([{"next_index": 1}]) == stream.Stream((5,), 6)
    assert two.after([{"next_index": 3}]) == stream.Stream((), 7)
    # grain's nesting: packer -> window shuffle -> flat map -> workers read round-robin (2 + 1 units).
    nested = {"parent": {"parent_window_start_state": {"parent": {"iterators_in_use_states": [
        {"next_index": 2}, {"next_index": 1}]}, "next_index_in_buffer": 4}}, "next_row": 3}
    assert stream.source_position(nested) == 3
    assert stream.Stream.from_state({"stream": two.to_state()}) == two
    with pytest.raises(ValueError, match="no reader position"):
        stream.source_position({"parent": {"something": 1}})
    with pytest.raises(ValueError, match="malformed stream"):
        stream.Stream.from_state({"stream": {"pending": [9], "start": 2}})


@pytest.fixture(scope="module")
def short_documents(data_dir, tmp_path_factory):
    """Real text in many short documents: the first 4000 Gutenberg sentences, 40 per document (100)."""
    lines = (data_dir / "corpus" / "gutenberg-sentences.txt").read_text().splitlines()
    sentences = [s for s in lines if s.strip()][:4000]
    tmp = tmp_path_factory.mktemp("short_documents")
    (tmp / "corpus.txt").write_text("\n\n".join("\n".join(sentences[i:i + 40]) for i in range(0, 4000, 40)) + "\n")
    tok = tokenization.Tokenizer(str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"))
    out = tmp / "docs"
    document_shards.tokenize_documents(corpus.read_sentence_documents([str(tmp / "corpus.txt")], corpus.ReadStats()),
                                       tok, str(out), num_shards=2)
    return out


def _iterators(path, count, stream_=None, packed=False):
    return [loader.make_pretraining_iterator(
        str(path), global_batch_size=8, seed=0, process_index=p, process_count=count, max_seq_length=LENGTH,
        max_predictions_per_seq=PREDICTIONS, packing=packed, num_packing_bins=4, fill_rows=False, stream=stream_)
        for p in range(count)]


def _instances(batch, packed):
    """The instances of a batch, each as bytes of its tokens and masked positions."""
    if not packed:
        return [batch["input_ids"][r].tobytes() + batch["masked_lm_positions"][r].tobytes()
                for r in range(len(batch["input_ids"]))]
    out = []
    for r in range(len(batch["input_ids"])):
        for s in range(1, int(batch["segment_ids"][r].max()) + 1):
            ids = np.zeros(LENGTH, np.int32)
            tokens = batch["input_ids"][r][batch["segment_ids"][r] == s]
            ids[: len(tokens)] = tokens
            positions = np.zeros(PREDICTIONS, np.int32)
            starts = np.flatnonzero(batch["segment_ids"][r] == s)[0]
            mine = batch["masked_lm_positions"][r][batch["masked_lm_weights"][r] > 0]
            mine = [p - starts for p in mine if batch["segment_ids"][r][p] == s]
            positions[: len(mine)] = mine
            out.append(ids.tobytes() + positions.tobytes())
    return out


def _drawn(path, epochs):
    """Each instance of epochs [0, epochs) (bytes as `_instances`) -> its (epoch, document), from the
    procedure itself: a draw depends only on (seed, epoch, document)."""
    meta = json.loads((path / "metadata.json").read_text())
    draw = dynamic._DrawInstances(str(path), procedure.InstanceOptions(max_seq_length=LENGTH,
                                                                        max_predictions_per_seq=PREDICTIONS),
                                  seed=0, do_lower_case=True)
    owner = {}
    for e in range(epochs):
        for d in range(meta["num_documents"]):
            for record in draw.map((e, d)):
                row = procedure.decode_instance(record, LENGTH, PREDICTIONS)
                owner[row["input_ids"].tobytes() + row["masked_lm_positions"].tobytes()] = (e, d)
    by_document = collections.Counter(owner.values())
    return owner, by_document, meta["num_documents"]


@pytest.mark.parametrize("old,new,packed", [(2, 1, False), (1, 2, False), (2, 1, True), (4, 2, True)])
def test_another_process_count_draws_every_document_once_more_at_most_a_window(
        short_documents, monkeypatch, old, new, packed):
    """A run on `old` processes stops after 20 steps; `new` processes continue from its states. Over epoch 0,
    the instances read across the restart are the uninterrupted run's (every document of the epoch drawn in
    full: none dropped), plus at most one shuffle window (and packing window) per old process read twice."""
    monkeypatch.setattr(dynamic, "DEFAULT_SHUFFLE_WINDOW", WINDOW)
    owner, by_document, num_documents = _drawn(short_documents, 2)
    before = _iterators(short_documents, old, packed=packed)
    seen = [i for _ in range(20) for it in before for i in _instances(next(it), packed)]
    states = [json.loads(json.dumps(it.get_state())) for it in before]
    order = stream.Stream.from_state(states[0]).after([s["grain"] for s in states])
    assert order != stream.Stream()
    after = _iterators(short_documents, new, order, packed)
    later = [0] * new  # instances of later epochs read by each new process: stop two windows past epoch 0
    while min(later) < 2 * WINDOW + 4 * 8:
        for p, it in enumerate(after):
            batch = _instances(next(it), packed)
            seen += batch
            later[p] += sum(owner.get(i, (2, 0))[0] >= 1 for i in batch)
    counts = collections.Counter(owner[i] for i in seen if owner.get(i, (2, 0))[0] == 0)
    full = {d for (e, d), n in counts.items() if n >= by_document[(e, d)]}
    assert full == set(range(num_documents))  # no document of epoch 0 dropped
    repeated = collections.Counter(seen)
    twice = sum(n - 1 for i, n in repeated.items() if n > 1 and owner.get(i, (2, 0))[0] == 0)
    largest = max(by_document.values())
    assert 0 < twice <= old * (WINDOW + 4 * 8 + largest)  # window + packing bins' rows + a document
    # The restarted stream resumes bit-identically on its own count.
    states = [json.loads(json.dumps(it.get_state())) for it in after]
    want = [next(it) for it in after]
    again = _iterators(short_documents, new, stream.Stream.from_state(states[0]), packed)
    for it, state, w in zip(again, states, want):
        it.set_state(state)
        got = next(it)
        for k in w:
            np.testing.assert_array_equal(got[k], w[k], err_msg=k)
    with pytest.raises(ValueError, match="make it with stream= from the state"):
        _iterators(short_documents, new, packed=packed)[0].set_state(states[0])


def test_static_packed_instances_resume_on_another_count(instances):
    """Static instances, packed: 2 processes -> 1 reads every instance of the epoch (the rows' token
    multiset covers the uninterrupted single-process epoch's)."""
    path = instances / "p1"
    kw = dict(global_batch_size=4, seed=0, max_seq_length=64, max_predictions_per_seq=10, packing=True,
              num_packing_bins=4)
    meta = json.loads((path / "metadata.json").read_text())
    before = [loader.make_pretraining_iterator(str(path), process_index=p, process_count=2, **kw) for p in range(2)]
    for _ in range(3):
        for it in before:
            next(it)
    order = stream.Stream().after([it.get_state()["grain"] for it in before])
    left = order.remaining_in_epoch(meta["num_instances"])
    assert left[0] == 0 and 0 < left[1] < meta["num_instances"]
    one = loader.make_pretraining_iterator(str(path), process_index=0, process_count=1, stream=order, **kw)
    batch = next(one)
    assert batch["input_ids"].shape == (4, 64) and batch["segment_ids"].max() >= 1
    with pytest.raises(ValueError, match="stream= applies to packed or dynamic input"):
        loader.make_pretraining_iterator(str(path), process_index=0, process_count=1, stream=order,
                                           **dict(kw, packing=False))
