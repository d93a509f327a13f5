"""The model's structure and behaviour: parameter tree with logical axes, counts, scan/remat, masking,
dropout, bfloat16 and input errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from bert_jax.model import heads, layers, modeling
from bert_jax.training import sharding
from bert_jax.checkpoints import weights
from bert_jax.configs import pretrain

# The original tester's sizes: batch 13, length 7, vocab 99, hidden 32.
TINY = modeling.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=37, max_position_embeddings=64)
B, L, P = 13, 7, 3


@pytest.fixture(params=["reference", "xla_cpu"])
def kernel_set(request):
    """The numerics tests run with both `bert_jax.model.kernels` sets."""
    return request.param


def _layer_tree(prefix=()):
    """path -> (shape, logical names) of one layer; `prefix` is prepended for scanned stacks."""
    n = len(prefix)
    pre = lambda shape, names: ((2,) * n + shape, prefix + names)
    tree = {}
    for proj in ("query", "key", "value"):
        tree[f"attention/{proj}_kernel"] = pre((32, 4, 8), ("embed", "heads", "kv"))
        tree[f"attention/{proj}_bias"] = pre((4, 8), ("heads", "kv"))
    tree.update({
        "attention/output_kernel": pre((4, 8, 32), ("heads", "kv", "embed")),
        "attention/output_bias": pre((32,), ("embed",)),
        "attention_LayerNorm/scale": pre((32,), ("embed",)),
        "attention_LayerNorm/bias": pre((32,), ("embed",)),
        "intermediate/kernel": pre((32, 37), ("embed", "mlp")),
        "intermediate/bias": pre((37,), ("mlp",)),
        "output/kernel": pre((37, 32), ("mlp", "embed")),
        "output/bias": pre((32,), ("embed",)),
        "output_LayerNorm/scale": pre((32,), ("embed",)),
        "output_LayerNorm/bias": pre((32,), ("embed",)),
    })
    return tree


def _expected_tree(scan: bool):
    tree = {
        "bert/embeddings/word_embeddings/embedding": ((99, 32), ("vocab", "embed")),
        "bert/embeddings/position_embeddings/embedding": ((64, 32), ("position", "embed")),
        "bert/embeddings/token_type_embeddings/embedding": ((2, 32), ("token_type", "embed")),
        "bert/embeddings/LayerNorm/scale": ((32,), ("embed",)),
        "bert/embeddings/LayerNorm/bias": ((32,), ("embed",)),
        "bert/pooler/kernel": ((32, 32), ("embed", "embed_out")),
        "bert/pooler/bias": ((32,), ("embed_out",)),
        "mlm_transform/kernel": ((32, 32), ("embed", "embed_out")),
        "mlm_transform/bias": ((32,), ("embed_out",)),
        "mlm_LayerNorm/scale": ((32,), ("embed",)),
        "mlm_LayerNorm/bias": ((32,), ("embed",)),
        "mlm_output_bias": ((99,), ("vocab",)),
        "nsp/kernel": ((32, 2), ("embed", "classes")),
        "nsp/bias": ((2,), ("classes",)),
    }
    if scan:
        tree.update({f"bert/encoder/layers/{k}": v for k, v in _layer_tree(("layers",)).items()})
    else:
        for i in range(2):
            tree.update({f"bert/encoder/layer_{i}/{k}": v for k, v in _layer_tree().items()})
    return tree


def _inputs(seed=0, batch=B, length=L, vocab=99):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, size=(batch, length)).astype(np.int32)
    types = (np.arange(length)[None] >= rng.integers(1, length, size=(batch, 1))).astype(np.int32)
    lengths = rng.integers(2, length + 1, size=(batch,))
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    positions = np.stack([rng.choice(int(n), size=min(P, int(n)), replace=False).tolist()
                          + [0] * (P - min(P, int(n))) for n in lengths]).astype(np.int32)
    return {"input_ids": jnp.asarray(ids * mask), "token_type_ids": jnp.asarray(types * mask),
            "attention_mask": jnp.asarray(mask), "masked_lm_positions": jnp.asarray(positions)}


def _init_boxed(config):
    x = _inputs()
    return jax.eval_shape(lambda: modeling.BertForPreTraining(config).init(
        jax.random.key(0), x["input_ids"], masked_lm_positions=x["masked_lm_positions"]))["params"]


@pytest.mark.parametrize("scan", [False, True])
def test_parameter_tree_with_logical_axes(kernel_set, scan):
    tiny = TINY.replace(kernels=kernel_set)
    boxed = _init_boxed(tiny.replace(scan_layers=scan))
    flat = traverse_util.flatten_dict(boxed, sep="/", is_leaf=lambda _, v: isinstance(v, nn.Partitioned))
    got = {k: (tuple(v.value.shape), tuple(v.names)) for k, v in flat.items()}
    assert got == _expected_tree(scan)
    assert all(v.value.dtype == jnp.float32 for v in flat.values())



def test_logical_axes_resolve_the_same_under_any_rule_order(monkeypatch):
    """Every logical axis name the model uses has a rule, and each parameter's and activation's layout
    is the same under the rules in their order and reversed (no name takes a mesh axis another name
    of the same array would take first)."""
    constrained = []
    real = nn.with_logical_constraint
    monkeypatch.setattr(nn, "with_logical_constraint", lambda x, axes: constrained.append(tuple(axes)) or real(x, axes))
    x = _inputs()
    packed = {"segment_ids": x["attention_mask"], "position_ids": jnp.zeros_like(x["input_ids"]),
              "next_sentence_positions": jnp.zeros((B, 2), jnp.int32)}
    boxed = jax.eval_shape(lambda: modeling.BertForPreTraining(TINY).init(jax.random.key(0), **x, **packed))
    jax.eval_shape(lambda: modeling.BertForPreTraining(TINY).init(jax.random.key(0), **x))
    params = jax.tree_util.tree_leaves(nn.get_partition_spec(boxed), is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
    specs = {tuple(s) for s in params} | set(constrained)
    assert {"activation_embed", "batch", "heads", "vocab"} <= {n for s in constrained for n in s}
    assert not any("embed" in s for s in constrained)  # the parameters' model dimension only
    rules = sharding.LOGICAL_AXIS_RULES
    assert {n for s in specs for n in s if n} <= {name for name, _ in rules}
    assert len({name for name, _ in rules}) == len(rules)
    for spec in specs:
        assert nn.logical_to_mesh_axes(spec, rules) == nn.logical_to_mesh_axes(spec, rules[::-1]), spec


def _count(config, model_cls=modeling.BertModel):
    x = _inputs()
    shapes = jax.eval_shape(lambda: nn.unbox(model_cls(config).init(jax.random.key(0), x["input_ids"])))
    return sum(int(np.prod(s.shape)) for s in jax.tree_util.tree_leaves(shapes))


@pytest.mark.parametrize("size,paper_millions", [("base", 110), ("large", 340)])
def test_parameter_count_matches_transformers(size, paper_millions):
    import torch
    import transformers

    fields = dict(pretrain.model_config(size))
    ours = _count(modeling.BertConfig.from_dict(fields))
    hf_config = transformers.BertConfig(**{k: fields[k] for k in modeling.BERT_CONFIG_FIELDS})
    with torch.device("meta"):
        theirs = sum(p.numel() for p in transformers.BertModel(hf_config).parameters())
    assert ours == theirs
    assert abs(ours / 1e6 - paper_millions) / paper_millions < 0.02


def test_scan_matches_layer_loop(kernel_set):
    tiny = TINY.replace(kernels=kernel_set)
    x = _inputs()
    params = weights.init_params(tiny, seed=3)
    scanned = weights.stack_layers(params, tiny.num_hidden_layers)
    out_loop = modeling.BertForPreTraining(tiny).apply({"params": params}, **x)
    out_scan = modeling.BertForPreTraining(tiny.replace(scan_layers=True)).apply({"params": scanned}, **x)
    np.testing.assert_allclose(out_scan.mlm_logits, out_loop.mlm_logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out_scan.nsp_logits, out_loop.nsp_logits, atol=1e-5, rtol=1e-5)
    back = weights.unstack_layers(scanned)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, back, jax.device_get(params)))


@pytest.mark.slow
@pytest.mark.parametrize("policy,scan", [("full", False), ("dots", True)])
def test_remat_gives_the_same_gradients(kernel_set, policy, scan):
    tiny = TINY.replace(kernels=kernel_set)
    x = _inputs()
    base = tiny.replace(scan_layers=scan)
    params = weights.init_params(base, seed=1)

    def grads(config):
        def loss(p):
            out = modeling.BertForPreTraining(config).apply(
                {"params": p}, **x, deterministic=False, rngs={"dropout": jax.random.key(7)})
            return jnp.sum(out.mlm_logits ** 2) + jnp.sum(out.nsp_logits)
        return jax.jit(jax.grad(loss))(params)

    plain, remat = grads(base), grads(base.replace(remat_policy=policy))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), remat, plain)


def test_padding_does_not_change_real_tokens(kernel_set):
    tiny = TINY.replace(kernels=kernel_set)
    x = _inputs()
    params = weights.init_params(tiny, seed=2)
    model = modeling.BertModel(tiny)
    out = model.apply({"params": params["bert"]}, x["input_ids"], x["token_type_ids"], x["attention_mask"])
    # Fill padded positions with other ids and types, and pad further: real tokens must not move.
    mask = np.asarray(x["attention_mask"])
    noise = np.random.default_rng(5).integers(1, 99, size=mask.shape)
    ids = np.where(mask == 1, np.asarray(x["input_ids"]), noise)
    ids, types, mask2 = (np.pad(a, ((0, 0), (0, 4)), constant_values=v)
                         for a, v in ((ids, 17), (np.asarray(x["token_type_ids"]), 1), (mask, 0)))
    out2 = model.apply({"params": params["bert"]}, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask2))
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(out2.sequence_output)[:, :L][real],
                               np.asarray(out.sequence_output)[real], atol=1e-5)
    np.testing.assert_allclose(out2.pooled_output, out.pooled_output, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_output_positions_equal_the_full_rows(kernel_set, scan):
    """The last layer at some positions only (output_positions) = the full encoder's rows there: states,
    pooled output and the gradients of a loss on them; padded and packed rows."""
    tiny = TINY.replace(kernels=kernel_set, scan_layers=scan)
    x = _inputs()
    params = weights.init_params(tiny.replace(scan_layers=False), seed=6)["bert"]
    if scan:
        params = weights.stack_layers({"bert": params}, tiny.num_hidden_layers)["bert"]
    model = modeling.BertModel(tiny)
    rng = np.random.default_rng(8)
    positions = jnp.asarray(np.concatenate([np.zeros((B, 1)), rng.integers(0, L, (B, 3))], 1), jnp.int32)
    segments = jnp.asarray(np.sort(rng.integers(0, 3, (B, L)), axis=1)[:, ::-1].copy(), jnp.int32)
    for packed in ({}, {"segment_ids": segments}):
        args = (x["input_ids"], x["token_type_ids"], x["attention_mask"])

        def rows(p, sparse):
            if sparse:
                out = model.apply({"params": p}, *args, output_positions=positions, **packed)
                return out.sequence_output, out.pooled_output
            out = model.apply({"params": p}, *args, **packed)
            return layers.gather_positions(out.sequence_output, positions), out.pooled_output

        (seq_full, pooled_full), (seq, pooled) = rows(params, False), rows(params, True)
        assert seq.shape == (B, 4, 32)
        np.testing.assert_allclose(seq, seq_full, atol=1e-5)
        np.testing.assert_allclose(pooled, pooled_full, atol=1e-5)
        grad = lambda sparse: jax.grad(lambda p: sum(jnp.sum(jnp.sin(a)) for a in rows(p, sparse)))(params)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                               grad(True), grad(False))
    with pytest.raises(ValueError, match="output_positions must be"):
        model.apply({"params": params}, x["input_ids"], output_positions=positions[0])


def test_mlm_logits_only_at_masked_positions(kernel_set):
    tiny = TINY.replace(kernels=kernel_set)
    x = _inputs()
    params = weights.init_params(tiny, seed=4)
    model = modeling.BertForPreTraining(tiny)
    out = model.apply({"params": params}, **x)
    assert out.mlm_logits.shape == (B, P, 99) and out.mlm_logits.dtype == jnp.float32
    assert out.nsp_logits.shape == (B, 2)
    # Independent dense computation: every position's logits through the same head, then gather.
    all_positions = jnp.tile(jnp.arange(L, dtype=jnp.int32)[None], (B, 1))
    dense = model.apply({"params": params}, **dict(x, masked_lm_positions=all_positions)).mlm_logits
    gathered = np.take_along_axis(np.asarray(dense), np.asarray(x["masked_lm_positions"])[..., None], axis=1)
    np.testing.assert_allclose(out.mlm_logits, gathered, atol=1e-5)
    # The decoder is tied: the output projection uses the word-embedding table (perturbing it moves logits).
    bumped = jax.tree_util.tree_map(lambda a: a, params)
    bumped["bert"]["embeddings"]["word_embeddings"]["embedding"] = (
        params["bert"]["embeddings"]["word_embeddings"]["embedding"].at[5].add(1.0))
    h = model.apply({"params": bumped}, **x).mlm_logits
    assert not np.allclose(np.asarray(h)[..., 5], np.asarray(out.mlm_logits)[..., 5])


def test_dropout_is_active_only_when_not_deterministic(kernel_set):
    tiny = TINY.replace(kernels=kernel_set)
    x = _inputs()
    params = weights.init_params(tiny, seed=0)
    apply = lambda **kw: modeling.BertModel(tiny).apply({"params": params["bert"]}, x["input_ids"],
                                                         x["token_type_ids"], x["attention_mask"], **kw)
    det1, det2 = apply(deterministic=True), apply(deterministic=True)
    np.testing.assert_array_equal(det1.sequence_output, det2.sequence_output)
    d1 = apply(deterministic=False, rngs={"dropout": jax.random.key(1)})
    d2 = apply(deterministic=False, rngs={"dropout": jax.random.key(2)})
    assert not np.allclose(d1.sequence_output, d2.sequence_output)
    assert not np.allclose(d1.sequence_output, det1.sequence_output)


@pytest.fixture(scope="module")
def base_params():
    """BERT-Base's encoder parameters, once for the module: the tree `weights.init_params` gives, its values
    drawn by numpy as the original's initialiser draws them (normal with standard deviation 0.02; LayerNorm
    scales 1, biases 0), faster than running the initialiser on 110M values."""
    abstract = jax.eval_shape(lambda: weights.init_params(modeling.BertConfig(), seed=0))["bert"]
    rng = np.random.default_rng(0)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if name.endswith("['scale']"):
            return np.ones(leaf.shape, leaf.dtype)
        if name.endswith("bias']"):
            return np.zeros(leaf.shape, leaf.dtype)
        return 0.02 * rng.standard_normal(leaf.shape, leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, abstract)


def test_bfloat16_compute_on_base_is_close_to_float32(kernel_set, base_params):
    config = modeling.BertConfig(kernels=kernel_set)  # BERT-Base
    params = base_params
    x = _inputs(batch=2, length=128, vocab=config.vocab_size)
    f32 = modeling.BertModel(config).apply({"params": params}, x["input_ids"], x["token_type_ids"],
                                            x["attention_mask"])
    bf16 = modeling.BertModel(config.replace(dtype="bfloat16")).apply(
        {"params": params}, x["input_ids"], x["token_type_ids"], x["attention_mask"])
    assert bf16.sequence_output.dtype == jnp.bfloat16
    a = np.asarray(bf16.sequence_output, np.float32)
    b = np.asarray(f32.sequence_output)
    rel = np.linalg.norm(a - b) / np.linalg.norm(b)
    assert rel < 2e-2, rel
    assert rel > 0  # the bfloat16 path really ran in lower precision


def test_input_errors_are_one_line():
    params = weights.init_params(TINY, seed=0)["bert"]
    model = modeling.BertModel(TINY)
    too_long = jnp.ones((1, 65), jnp.int32)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=64"):
        model.apply({"params": params}, too_long)
    with pytest.raises(ValueError, match="token_type_ids shape"):
        model.apply({"params": params}, jnp.ones((2, 5), jnp.int32), jnp.ones((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="masked_lm_positions"):
        modeling.BertForPreTraining(TINY).apply({"params": weights.init_params(TINY)}, jnp.ones((2, 5), jnp.int32))


@pytest.mark.parametrize("bad,match", [
    (dict(hidden_size=30, num_attention_heads=4), "not divisible"),
    (dict(hidden_act="swish"), "hidden_act"),
    (dict(remat_policy="some"), "remat_policy"),
    (dict(num_hidden_layers=0), "num_hidden_layers must be positive"),
    (dict(dtype="bf16"), r"BertConfig.dtype='bf16' is not a floating-point dtype name"),
    (dict(param_dtype="int8"), r"BertConfig.param_dtype='int8' is not a floating-point dtype name"),
    (dict(dtype=None), r"BertConfig.dtype=None is not a floating-point dtype name"),
])
def test_config_errors(bad, match):
    with pytest.raises(ValueError, match=match) as e:
        modeling.BertConfig(**bad)
    assert "\n" not in str(e.value)


def test_config_accepts_floating_dtype_names():
    config = modeling.BertConfig.from_dict({"dtype": "bfloat16", "param_dtype": "float32"})
    assert (config.dtype, config.param_dtype) == ("bfloat16", "float32")


def test_task_heads_shapes():
    x = _inputs()
    qa = heads.BertForQuestionAnswering(TINY)
    v = qa.init(jax.random.key(0), x["input_ids"])
    out = qa.apply(nn.unbox(v), x["input_ids"], x["token_type_ids"], x["attention_mask"])
    assert out.start_logits.shape == (B, L) and out.end_logits.shape == (B, L)
    assert "pooler" not in v["params"]["bert"]
    cls = heads.BertForSequenceClassification(TINY, num_labels=3)
    v = cls.init(jax.random.key(0), x["input_ids"])
    assert cls.apply(nn.unbox(v), x["input_ids"]).logits.shape == (B, 3)


def test_kernel_sets_compute_the_same_model():
    """reference and xla_cpu on the same parameters: equal outputs and gradients (deterministic), the
    same parameter tree."""
    x = _inputs()
    params = weights.init_params(TINY, seed=6)

    def run(kernel_set):
        model = modeling.BertForPreTraining(TINY.replace(kernels=kernel_set))

        def loss(p):
            out = model.apply({"params": p}, **x)
            return jnp.sum(jnp.sin(out.mlm_logits)) + jnp.sum(out.nsp_logits ** 2), out
        return jax.value_and_grad(loss, has_aux=True)(params)

    ((_, ref), ref_grads), ((_, cpu), cpu_grads) = run("reference"), run("xla_cpu")
    np.testing.assert_allclose(cpu.mlm_logits, ref.mlm_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cpu.nsp_logits, ref.nsp_logits, rtol=1e-5, atol=1e-5)
    assert jax.tree.structure(cpu_grads) == jax.tree.structure(ref_grads)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), cpu_grads, ref_grads)

