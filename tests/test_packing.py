"""Sequence packing: packed rows hold the instances unchanged, and give each instance exactly its
unpacked losses and the same gradients (real instances from the original's sample text)."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.training import pretraining
from bert_jax.model import modeling
from bert_jax.data.pretraining import loader, packing, procedure
from bert_jax.configs import pretrain as pretrain_configs


def _packed_batches(path, batch_size=8, **kw):
    it = loader.make_pretraining_iterator(path, global_batch_size=batch_size, shuffle=False, num_epochs=1,
                                            process_index=0, process_count=1, packing=True, **kw)
    return list(it)


def _unpack(batch):
    """Packed batch -> its instances, each as the padded layout of `procedure.decode_instance` (lengths
    L and the phase's P from the row's widths), in row order."""
    out = []
    length = batch["input_ids"].shape[1]
    for b in range(batch["input_ids"].shape[0]):
        for k in np.flatnonzero(batch["next_sentence_weights"][b]):
            start = batch["next_sentence_positions"][b, k]
            in_segment = batch["segment_ids"][b] == batch["segment_ids"][b, start]
            n = int(in_segment.sum())
            assert np.array_equal(np.flatnonzero(in_segment), np.arange(start, start + n))  # contiguous
            preds = (batch["masked_lm_weights"][b] > 0) & (batch["masked_lm_positions"][b] >= start) & (
                batch["masked_lm_positions"][b] < start + n)
            out.append({
                "input_ids": batch["input_ids"][b, start:start + n],
                "token_type_ids": batch["token_type_ids"][b, start:start + n],
                "position_ids": batch["position_ids"][b, start:start + n],
                "masked_lm_positions": batch["masked_lm_positions"][b][preds] - start,
                "masked_lm_ids": batch["masked_lm_ids"][b][preds],
                "next_sentence_labels": batch["next_sentence_labels"][b, k],
            })
    return out, length


def _key(inst):
    return (tuple(inst["input_ids"]), tuple(inst["token_type_ids"]), tuple(inst["masked_lm_positions"]),
            tuple(inst["masked_lm_ids"]), int(inst["next_sentence_labels"]))


def test_packed_rows_hold_every_instance_unchanged(instances):
    """Round trip: the instances cut back out of the packed rows are the directory's instances, each at
    most once, positions restarting at 0, with padding cut from 1 - (real tokens / all slots)."""
    path = str(instances / "p2")
    originals = collections.Counter()
    for inst in procedure.iterate_instances(path):
        n = int(inst["attention_mask"].sum())
        m = int(inst["masked_lm_weights"].sum())
        originals[_key({"input_ids": inst["input_ids"][:n], "token_type_ids": inst["token_type_ids"][:n],
                        "masked_lm_positions": inst["masked_lm_positions"][:m],
                        "masked_lm_ids": inst["masked_lm_ids"][:m],
                        "next_sentence_labels": inst["next_sentence_labels"]})] += 1
    batches = _packed_batches(path, num_packing_bins=64)
    seen = collections.Counter()
    for batch in batches:
        for inst in _unpack(batch)[0]:
            assert np.array_equal(inst["position_ids"], np.arange(len(inst["input_ids"])))
            seen[_key(inst)] += 1
    assert not seen - originals  # nothing invented or duplicated
    total = sum(originals.values())
    rows = sum(len(b["input_ids"]) for b in batches)
    assert total - sum(seen.values()) < 8 * packing.default_max_instances(128)  # only the dropped last batch
    assert rows < 0.9 * total  # rows hold several instances
    unpacked = np.mean([packing.padding_fraction(b) for b in loader.make_pretraining_iterator(
        path, global_batch_size=8, shuffle=False, num_epochs=1, process_index=0, process_count=1)])
    packed = np.mean([packing.padding_fraction(b) for b in batches])
    assert packed < unpacked / 2


def _model():
    config = pretrain_configs.get_config("tiny")
    config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = 0.0
    return modeling.BertForPreTraining(modeling.BertConfig.from_dict(config.model))


def _pad(instances, length, predictions):
    """Unpacked instances -> a standard (one instance per row) batch."""
    b = len(instances)
    batch = {k: np.zeros((b, length), np.int32) for k in ("input_ids", "token_type_ids", "attention_mask")}
    batch.update({k: np.zeros((b, predictions), np.int32) for k in ("masked_lm_positions", "masked_lm_ids")})
    batch["masked_lm_weights"] = np.zeros((b, predictions), np.float32)
    batch["next_sentence_labels"] = np.array([i["next_sentence_labels"] for i in instances], np.int32)
    for r, inst in enumerate(instances):
        n, m = len(inst["input_ids"]), len(inst["masked_lm_ids"])
        batch["input_ids"][r, :n] = inst["input_ids"]
        batch["token_type_ids"][r, :n] = inst["token_type_ids"]
        batch["attention_mask"][r, :n] = 1
        batch["masked_lm_positions"][r, :m] = inst["masked_lm_positions"]
        batch["masked_lm_ids"][r, :m] = inst["masked_lm_ids"]
        batch["masked_lm_weights"][r, :m] = 1.0
    return batch


def _per_instance_losses(model, params, batch, instances_per_row):
    """Per-prediction MLM nll (row order) and per-instance NSP nll of a batch, float32 numpy."""
    fields = {k: jnp.asarray(v) for k, v in batch.items()}
    out = model.apply({"params": params}, fields["input_ids"], fields["token_type_ids"], fields["attention_mask"],
                      fields["masked_lm_positions"], segment_ids=fields.get("segment_ids"),
                      position_ids=fields.get("position_ids"),
                      next_sentence_positions=fields.get("next_sentence_positions"))
    mlm = -jnp.take_along_axis(jax.nn.log_softmax(out.mlm_logits), fields["masked_lm_ids"][..., None], -1)[..., 0]
    nsp = -jnp.take_along_axis(jax.nn.log_softmax(out.nsp_logits), fields["next_sentence_labels"][..., None], -1)[..., 0]
    mlm = np.asarray(mlm)[np.asarray(batch["masked_lm_weights"]) > 0]
    nsp = np.asarray(nsp)[np.asarray(instances_per_row)] if instances_per_row is not None else np.asarray(nsp)
    return mlm, nsp


@pytest.mark.slow
def test_packed_batch_gives_each_instance_its_unpacked_losses_and_gradients(instances):
    """A packed batch of real instances and the same instances one per row: equal per-prediction MLM and
    per-instance NSP losses, equal total loss and gradients, within 1e-5 (float32)."""
    batch = _packed_batches(str(instances / "p2"), batch_size=8, num_packing_bins=64)[0]
    assert (batch["next_sentence_weights"].sum(1) > 1).any()  # some rows hold several instances
    unpacked_instances, length = _unpack(batch)
    # row order within the packed batch = row-major (row, instance slot), as _unpack walks it
    unpacked = _pad(unpacked_instances, length, 20)
    model = _model()
    params = model.init(jax.random.PRNGKey(0), jnp.asarray(unpacked["input_ids"][:1]),
                        masked_lm_positions=jnp.asarray(unpacked["masked_lm_positions"][:1]))["params"]
    packed_mlm, packed_nsp = _per_instance_losses(model, params, batch, batch["next_sentence_weights"] > 0)
    plain_mlm, plain_nsp = _per_instance_losses(model, params, unpacked, None)
    # predictions of a packed row are in instance order, positions ascending within each: same order
    np.testing.assert_allclose(packed_mlm, plain_mlm, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(packed_nsp, plain_nsp, rtol=1e-5, atol=1e-5)

    def loss(p, b):
        return pretraining.loss_and_metrics(p, b, jax.random.PRNGKey(1), model=model, deterministic=True)[0]

    loss_and_grads = jax.jit(jax.value_and_grad(loss))  # one program per layout, not op by op
    packed_loss, packed_grads = loss_and_grads(params, {k: jnp.asarray(v) for k, v in batch.items()})
    plain_loss, plain_grads = loss_and_grads(params, {k: jnp.asarray(v) for k, v in unpacked.items()})
    np.testing.assert_allclose(packed_loss, plain_loss, rtol=1e-5)
    for (path, g), h in zip(jax.tree_util.tree_leaves_with_path(packed_grads), jax.tree_util.tree_leaves(plain_grads)):
        np.testing.assert_allclose(g, h, rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_packed_iterator_resumes_the_same_rows(instances):
    """get_state after 3 batches -> a fresh iterator set to it yields batches 4.. identically (packing
    window replayed); another packing window size is refused in one line."""
    path = str(instances / "p2")
    kw = dict(global_batch_size=8, seed=3, process_index=0, process_count=1, packing=True, num_packing_bins=16)
    it = loader.make_pretraining_iterator(path, **kw)
    for _ in range(3):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(4)]
    resumed = loader.make_pretraining_iterator(path, **kw)
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    other = loader.make_pretraining_iterator(path, **dict(kw, num_packing_bins=32))
    with pytest.raises(ValueError, match="num_packing_bins"):
        other.set_state(state)


# ----------------------------------------------------------------------------- splash attention (interpret mode)


def test_splash_attention_equals_the_reference_with_segment_ids():
    """The Pallas splash kernel (interpret mode on the CPU) against the model's attention formula with
    `AttentionMask.packed`, float32, three packed segments and padding: within 1e-5 at the real tokens."""
    from bert_jax.model.kernels import splash

    b, n, h = 2, 2, 64
    for length in (128, 100):  # 100: padded to the kernel's block inside, cut off again
        q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, b, n, length, h))
        segments = np.zeros((b, length), np.int32)
        segments[0, :40], segments[0, 40:70], segments[0, 70:90] = 1, 2, 3
        segments[1, :] = 1
        segments = jnp.asarray(segments)
        scores = jnp.einsum("bnqh,bnkh->bnqk", q, k) / np.sqrt(h) + modeling.AttentionMask.packed(segments).bias
        want = jnp.einsum("bnqk,bnkh->bnqh", jax.nn.softmax(scores, axis=-1), v)
        got = splash.attention(q / np.sqrt(h), k, v, segments, interpret=True)
        assert got.shape == want.shape
        real = np.asarray(segments > 0)[:, None, :, None]
        np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), atol=1e-5, rtol=1e-5)


def test_splash_kernel_set_in_the_model_under_a_mesh(instances, monkeypatch):
    """kernels="splash" (interpret mode) in BertForPreTraining on a packed batch, jitted on a data=2 x
    tensor=2 mesh (the kernel under shard_map): same MLM and NSP logits as the reference set within 1e-5;
    with attention dropout on, a one-line error."""
    from bert_jax.training import sharding
    from bert_jax.model.kernels import splash

    monkeypatch.setattr(splash, "KERNELS", splash.interpret_kernels())
    batch = _packed_batches(str(instances / "p2"), batch_size=4, num_packing_bins=16)[0]
    config = pretrain_configs.get_config("tiny")
    config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = 0.0
    config.model.num_attention_heads = 2
    mesh = sharding.make_mesh(2, 1, 2, devices=jax.devices()[:4])
    outs = {}
    for name in ("reference", "splash"):
        config.model.kernels = name
        model = modeling.BertForPreTraining(modeling.BertConfig.from_dict(config.model))
        fields = {k: jnp.asarray(v) for k, v in batch.items()}
        params = model.init(jax.random.PRNGKey(0), fields["input_ids"][:1],
                            masked_lm_positions=fields["masked_lm_positions"][:1])["params"]

        @jax.jit
        def forward(params, f):
            with sharding.axis_rules():
                return model.apply({"params": params}, f["input_ids"], f["token_type_ids"], f["attention_mask"],
                                   f["masked_lm_positions"], segment_ids=f["segment_ids"],
                                   position_ids=f["position_ids"], next_sentence_positions=f["next_sentence_positions"])

        with jax.set_mesh(mesh):
            out = forward(params, fields)
        outs[name] = (np.asarray(out.mlm_logits), np.asarray(out.nsp_logits))
    np.testing.assert_allclose(outs["splash"][0], outs["reference"][0], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(outs["splash"][1], outs["reference"][1], atol=1e-5, rtol=1e-5)
    config.model.attention_probs_dropout_prob = 0.1
    model = modeling.BertForPreTraining(modeling.BertConfig.from_dict(config.model))
    with pytest.raises(ValueError, match="no attention-probability dropout"):
        model.apply({"params": params}, fields["input_ids"], masked_lm_positions=fields["masked_lm_positions"],
                    deterministic=False, rngs={"dropout": jax.random.PRNGKey(0)})


def test_a_truncated_shard_is_a_one_line_error_naming_it(instances, tmp_path):
    import shutil

    copy = tmp_path / "p2"
    shutil.copytree(instances / "p2", copy)
    shard = sorted(copy.glob("*.array_record"))[0]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    for packed in (False, True):
        with pytest.raises(ValueError, match=f"{shard.name}: not a readable ArrayRecord file"):
            loader.make_pretraining_iterator(str(copy), global_batch_size=8, process_index=0, process_count=1,
                                               packing=packed)
