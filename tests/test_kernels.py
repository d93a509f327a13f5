"""The kernel sets of `bert_jax.model.kernels`: the switch, and every operation of each set against an
independent truth (torch for GELU, autodiff of the plain formula) in value and gradient, float32 and
bfloat16; the xla_cpu set against the reference set. Also the forms every set shares, LayerNorm (against
torch) and the masked-LM loss (against autodiff of log_softmax)."""

import dataclasses
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import kernels, layers, modeling
from bert_jax.training import losses, sharding
from bert_jax.model.kernels import dropout as hashed, gpu, reference, xla_cpu

SETS = ["reference", "xla_cpu"]
DTYPES = ["float32", "bfloat16"]


def _tol(dtype, f32=1e-5, bf16=2e-2):
    return dict(rtol=f32, atol=f32) if dtype == "float32" else dict(rtol=bf16, atol=bf16)


def test_auto_is_xla_cpu_on_the_cpu_tpu_on_a_tpu_gpu_on_a_gpu_reference_elsewhere():
    assert kernels.resolve("auto", "cpu") == "xla_cpu" and kernels.resolve("auto", "rocm") == "reference"
    assert kernels.resolve("auto", "tpu") == "tpu" and kernels.resolve("auto", "gpu") == "gpu"
    assert kernels.resolve("xla_cpu", "tpu") == "xla_cpu" and kernels.resolve("reference", "cpu") == "reference"
    assert kernels.resolve("auto") == "xla_cpu"  # these tests run on the CPU backend
    assert kernels.get("auto", "gpu") is gpu.KERNELS and kernels.get("auto", "cpu") is xla_cpu.KERNELS
    # The gpu set: the reference forms, the hashed dropout and the fused attention where it applies, nothing else.
    assert gpu.KERNELS.dropout is hashed.HashedDropout
    assert dataclasses.replace(gpu.KERNELS, name="reference", attention=None, attention_applies=None,
                               attention_dropout=False, attention_packed=False, dropout=nn.Dropout, bias_gelu=None,
                               dropout_add_layer_norm=None) == reference.KERNELS
    tpu = kernels.get("auto", "tpu")  # the reference forms with xla_cpu's GELU, nothing else
    assert tpu.name == "tpu" and tpu.gelu is xla_cpu.gelu
    assert dataclasses.replace(tpu, name="reference", gelu=reference.gelu) == reference.KERNELS
    with pytest.raises(ValueError, match=r"model.kernels='pallas' is not one of \['auto', 'reference', 'xla_cpu', 'tpu', 'splash', 'gpu'\]"):
        kernels.resolve("pallas")
    with pytest.raises(ValueError, match="model.kernels='cuda'"):
        modeling.BertConfig(kernels="cuda")


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_and_its_gradient_equal_torch(name, dtype):
    """Exact GELU over [-8, 8]: value and gradient against torch.nn.functional.gelu in float64; the
    input's dtype is kept."""
    import torch

    gelu = kernels.get(name).gelu
    x64 = np.linspace(-8, 8, 4001)
    x = jnp.asarray(x64, jnp.dtype(dtype))
    weight = np.cos(np.arange(x64.size))
    t = torch.tensor(np.asarray(x.astype(jnp.float32), np.float64), requires_grad=True)
    ref = torch.nn.functional.gelu(t)
    ref.backward(torch.tensor(weight))
    y, grad = jax.value_and_grad(lambda v: jnp.sum(gelu(v).astype(jnp.float32) * jnp.asarray(weight, jnp.float32)))(x)
    assert gelu(x).dtype == grad.dtype == x.dtype
    np.testing.assert_allclose(np.asarray(gelu(x), np.float32), ref.detach().numpy(), **_tol(dtype, 1e-6))
    np.testing.assert_allclose(np.asarray(grad, np.float32), t.grad.numpy(), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_bias_gelu_equals_the_dense_bias_then_the_reference_gelu(dtype):
    """gpu.bias_gelu(x, bias) against reference.gelu(x + bias) (flax Dense's bias add in the dtype): value, d x and
    d bias (float32, over the leading axes) under autodiff of the composition, over [-8, 8]; x's dtype kept."""
    dtype = jnp.dtype(dtype)
    x = jnp.asarray(np.linspace(-8, 8, 4096).reshape(2, 32, 64), dtype)
    bias = jnp.asarray(np.sin(np.arange(64)), jnp.float32)
    weight = jnp.asarray(np.cos(np.arange(x.size)).reshape(x.shape), jnp.float32)

    def loss(f):
        return lambda x, b: jnp.sum(f(x, b).astype(jnp.float32) * weight)

    plain = lambda x, b: reference.gelu(x + b.astype(x.dtype))  # noqa: E731
    (got, want) = (jax.value_and_grad(loss(f), argnums=(0, 1))(x, bias) for f in (gpu.bias_gelu, plain))
    assert gpu.bias_gelu(x, bias).dtype == got[1][0].dtype == dtype and got[1][1].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(gpu.bias_gelu(x, bias), np.float32), np.asarray(plain(x, bias), np.float32),
                               **_tol(dtype, 1e-6))
    for g, w in zip(got[1], want[1]):
        scale = np.abs(np.asarray(w, np.float32)).max()
        np.testing.assert_allclose(np.asarray(g, np.float32) / scale, np.asarray(w, np.float32) / scale,
                                   **_tol(dtype, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_and_its_gradients_equal_torch(dtype):
    """The model's LayerNorm (one form for every kernel set): values and input / scale / bias gradients
    against torch.nn.functional.layer_norm in float64, on rows whose mean is large next to their spread
    (where a one-pass variance loses digits), eps 1e-12; bfloat16 in gives bfloat16 out."""
    import torch

    config = modeling.BertConfig(vocab_size=8, hidden_size=48, num_hidden_layers=1, num_attention_heads=1,
                                 intermediate_size=8, layer_norm_eps=1e-12, dtype=dtype)
    module = layers.layer_norm(config, "LayerNorm")
    rng = np.random.default_rng(0)
    x64 = rng.normal(0.0, 0.5, size=(6, 5, 48)) + rng.normal(0, 8, size=(6, 5, 1))
    scale64, bias64 = rng.normal(1, 0.1, 48), rng.normal(0, 0.1, 48)
    cotangent = rng.normal(size=x64.shape)
    params = {"scale": jnp.asarray(scale64, jnp.float32), "bias": jnp.asarray(bias64, jnp.float32)}
    x = jnp.asarray(x64, jnp.dtype(dtype))
    assert jax.tree.map(jnp.shape, nn.unbox(module.init(jax.random.key(0), x))["params"]) == \
        {"scale": (48,), "bias": (48,)}

    def loss(params, x):
        y = module.apply({"params": params}, x)
        return jnp.sum(y.astype(jnp.float32) * jnp.asarray(cotangent, jnp.float32)), y

    (_, y), (dparams, dx) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
    assert y.dtype == x.dtype and dx.dtype == x.dtype
    t = torch.tensor(np.asarray(x.astype(jnp.float32), np.float64), requires_grad=True)
    ts, tb = torch.tensor(scale64, requires_grad=True), torch.tensor(bias64, requires_grad=True)
    ref = torch.nn.functional.layer_norm(t, (48,), ts, tb, eps=1e-12)
    ref.backward(torch.tensor(cotangent))
    np.testing.assert_allclose(np.asarray(y, np.float32), ref.detach().numpy(), **_tol(dtype))
    np.testing.assert_allclose(np.asarray(dx, np.float32), t.grad.numpy(), **_tol(dtype))
    grad_tol = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=5e-2, atol=5e-1)
    np.testing.assert_allclose(np.asarray(dparams["scale"]), ts.grad.numpy(), **grad_tol)
    np.testing.assert_allclose(np.asarray(dparams["bias"]), tb.grad.numpy(), **grad_tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_xla_cpu_dense_equals_flax_dense_in_value_and_gradients(dtype):
    """nn.Dense with xla_cpu.dot_general against nn.Dense with lax.dot_general: value, and the input /
    kernel / bias gradients, on the feed-forward shape (D_out = 4 D_in)."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 5, 8)), jnp.dtype(dtype))
    cotangent = jnp.asarray(rng.normal(size=(3, 5, 32)), jnp.float32)
    ours, plain = nn.Dense(32, dtype=jnp.dtype(dtype), dot_general=xla_cpu.dot_general), nn.Dense(32, dtype=jnp.dtype(dtype))
    params = plain.init(jax.random.key(0), x)
    params = jax.tree.map(lambda p: p + jnp.asarray(rng.normal(size=p.shape), p.dtype), params)  # non-zero bias

    def loss(module):
        return lambda p, x: jnp.sum(module.apply(p, x).astype(jnp.float32) * cotangent)

    np.testing.assert_allclose(np.asarray(ours.apply(params, x), np.float32),
                               np.asarray(plain.apply(params, x), np.float32), **_tol(dtype))
    a, b = (jax.grad(loss(m), argnums=(0, 1))(params, x) for m in (ours, plain))
    for name, u, v in zip(("kernel", "bias", "x"), (a[0]["params"]["kernel"], a[0]["params"]["bias"], a[1]),
                          (b[0]["params"]["kernel"], b[0]["params"]["bias"], b[1])):
        assert u.dtype == v.dtype and u.shape == v.shape, name
        np.testing.assert_allclose(np.asarray(u, np.float32), np.asarray(v, np.float32), err_msg=name,
                                   **_tol(dtype, 1e-5, 5e-2))
    with pytest.raises(ValueError, match="supports only nn.Dense's contraction"):
        xla_cpu.dot_general(x, jnp.ones((3, 8)), (((0,), (0,)), ((), ())))


@pytest.mark.parametrize("dtype", DTYPES)
def test_xla_cpu_tied_logits_equal_the_reference_in_value_and_gradients(dtype):
    """(d x, d table, d bias) of the hand-written backward against autodiff of the reference einsum,
    under a loss that weights every logit differently."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 3, 16)), jnp.dtype(dtype))  # [B, P, D]
    table = jnp.asarray(rng.normal(size=(37, 16)) * 0.1, jnp.float32)  # [V, D] float32 parameters
    bias = jnp.asarray(rng.normal(size=(37,)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(2, 3, 37)), jnp.float32)

    def grads(fn):
        return jax.grad(lambda *a: jnp.sum(jnp.sin(fn(*a, jnp.dtype(dtype))) * weight), argnums=(0, 1, 2))(x, table, bias)

    np.testing.assert_allclose(xla_cpu.tied_logits(x, table, bias, jnp.dtype(dtype)),
                               reference.tied_logits(x, table, bias, jnp.dtype(dtype)), rtol=1e-6)
    for name, a, b in zip(("x", "table", "bias"), grads(xla_cpu.tied_logits), grads(reference.tied_logits)):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=name,
                                   **_tol(dtype, 1e-5, 2e-2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_lm_loss_gradient_equals_autodiff_of_log_softmax(dtype):
    """The masked-LM loss's gradient (optax's cross-entropy) against autodiff of log_softmax + gather,
    with weights (zero for padding) and labels at both ends of the vocabulary."""
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(3, 5, 97)) * 3, jnp.dtype(dtype))
    ids = jnp.asarray(rng.integers(0, 97, size=(3, 5)), jnp.int32).at[0, 0].set(0).at[0, 1].set(96)
    weights = jnp.asarray(rng.random((3, 5)) > 0.3, jnp.float32)

    def truth(lg):
        lp = jax.nn.log_softmax(lg.astype(jnp.float32), axis=-1)
        return jnp.sum(-jnp.take_along_axis(lp, ids[..., None], axis=-1)[..., 0] * weights)

    value, ours = jax.value_and_grad(lambda lg: losses.masked_lm_loss(lg, ids, weights)[0])(logits)
    ref_value, ref = jax.value_and_grad(truth)(logits)
    assert ours.dtype == ref.dtype == jnp.dtype(dtype)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(ref, np.float32), **_tol(dtype, 1e-5, 1e-2))
    assert float(jnp.abs(ours[weights == 0]).max()) == 0.0  # padding slots get no gradient


@pytest.mark.parametrize("name", ["reference", "xla_cpu", "gpu"])
def test_dropout_rate_scaling_and_independence(name):
    """Each set's dropout: the keep rate, neighbours and two keys uncorrelated (|r| < 4 / sqrt(n)), inverted
    scaling (mean kept), identity when deterministic."""
    dropout = kernels.get(name).dropout(0.1)
    shape = (8, 4, 128, 128)
    x = jnp.ones(shape)
    y = np.asarray(dropout.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)}))
    keep = (y > 0).astype(np.float64)
    p = 0.9 if name == "reference" else 1 - 6554 / 65536
    assert abs(keep.mean() - p) < 4 * np.sqrt(p * (1 - p) / keep.size)
    np.testing.assert_allclose(np.unique(y), [0.0, 1 / p], rtol=1e-6)
    other = np.asarray(dropout.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(1)}) > 0, np.float64)
    centred = keep - keep.mean()
    pairs = [(centred[..., 1:], centred[..., :-1]), (centred[:, :, 1:], centred[:, :, :-1]),
             (centred[:, 1:], centred[:, :-1]), (centred[1:], centred[:-1]), (centred, other - other.mean())]
    for a, b in pairs:
        r = (a * b).mean() / np.sqrt((a * a).mean() * (b * b).mean())
        assert abs(r) < 4 / np.sqrt(a.size), r
    assert dropout.apply({}, x, deterministic=True) is x


def test_hashed_dropout_gradient_uses_the_forward_mask():
    """HashedDropout's gradient is the forward's mask times the scale: equal to the gradient of the plain form
    where(mask, x / p, 0) with the module's seeds, float32 and bfloat16, inside jit and under jax.checkpoint
    (the mask recomputed there)."""
    key = jax.random.key(4)
    for dtype in (jnp.float32, jnp.bfloat16):
        x = jax.random.normal(jax.random.key(1), (2, 3, 16, 16), dtype)
        g = jax.random.normal(jax.random.key(2), x.shape, dtype)
        layer = hashed.HashedDropout(0.1)
        ours = lambda v: jnp.sum(layer.apply({}, v, deterministic=False, rngs={"dropout": key}) * g)

        seed = layer.apply({}, rngs={"dropout": key}, method=lambda m: hashed.seeds(m.make_rng("dropout")))

        def plain(v):
            keep, p = hashed.seeded_keep_mask(seed, v.shape, 0.1)
            return jnp.sum(jnp.where(keep, v * jnp.asarray(1 / p, v.dtype), 0) * g)

        want = jax.grad(plain)(x)
        for fn in (jax.grad(ours), jax.jit(jax.grad(ours)), jax.jit(jax.grad(jax.checkpoint(ours)))):
            np.testing.assert_array_equal(np.asarray(fn(x), np.float32), np.asarray(want, np.float32))
        assert float(jnp.mean(want == 0)) > 0.05  # dropped elements get no gradient


def test_hashed_keep_mask_rates_for_other_rates_and_shapes():
    for rate, shape in ((0.5, (4096,)), (0.25, (64, 512))):
        keep, p = hashed.keep_mask(jax.random.key(3), shape, rate)
        assert keep.shape == shape and p == 1 - round(rate * 65536) / 65536
        assert abs(float(np.mean(keep)) - p) < 4 * np.sqrt(p * (1 - p) / np.prod(shape))
    with pytest.raises(ValueError, match="at least one axis"):
        hashed.keep_mask(jax.random.key(0), (), 0.1)


def _correlation(a, b) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).mean() / np.sqrt((a * a).mean() * (b * b).mean()))


def test_hashed_dropout_is_the_same_under_any_sharding_and_on_a_rerun():
    """The mask is a function of the key and each element's global index: the output of a jitted call sharded
    over a 2x4 mesh (batch and heads, as the model's logical axes place attention probabilities) equals the
    unsharded call's bit for bit, and a second call with the same key (a resumed step) repeats it."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    layer = hashed.HashedDropout(0.1)
    x = jax.random.normal(jax.random.key(5), (8, 4, 32, 32), jnp.float32)
    key = jax.random.key(11)
    apply = lambda v: layer.apply({}, v, deterministic=False, rngs={"dropout": key})
    whole = np.asarray(jax.jit(apply)(x))
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("data", "heads"))
    for spec in (P("data", "heads"), P(None, None, "data"), P(("data", "heads"))):
        sharding = NamedSharding(mesh, spec)
        sharded = jax.jit(apply, in_shardings=sharding, out_shardings=sharding)(jax.device_put(x, sharding))
        np.testing.assert_array_equal(np.asarray(sharded), whole)
    np.testing.assert_array_equal(np.asarray(jax.jit(apply)(x)), whole)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_model_dropout_masks_are_independent_across_calls_layers_and_steps(scan_layers):
    """In BertModel with the gpu set's hashed dropout (rates 0.1): every dropout call of a training pass keeps
    about 0.9 of its elements; the masks of the two layers' attention probabilities, of the two residual
    dropouts of one layer, and of the same call in two steps (two step keys) are uncorrelated
    (|r| < 4 / sqrt(n)); the same step key gives the same masks (bit-exact resume)."""
    config = modeling.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=64, kernels="gpu",
                                 scan_layers=scan_layers)
    model = modeling.BertModel(config)
    ids = jax.random.randint(jax.random.key(0), (8, 64), 1, 64)
    params = model.init(jax.random.key(1), ids)["params"]

    def masks(step_key):
        _, state = model.apply({"params": params}, ids, deterministic=False, rngs={"dropout": step_key},
                               capture_intermediates=lambda mdl, _: isinstance(mdl, hashed.HashedDropout),
                               mutable=["intermediates"])
        found = {}
        for path, value in jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]:
            name = "/".join(str(getattr(k, "key", k)) for k in path)
            value = np.asarray(value) != 0
            if scan_layers and "layers" in name:  # stacked along a leading layer axis
                for i in range(value.shape[0]):
                    found[name.replace("layers", f"layers_{i}")] = value[i]
            else:
                found[name] = value
        return found

    first, second, again = masks(jax.random.key(7)), masks(jax.random.key(8)), masks(jax.random.key(7))
    assert len(first) == 1 + 2 * 3, sorted(first)  # embeddings, then per layer: probabilities and two residuals
    for name, keep in first.items():
        p = 1 - 6554 / 65536
        assert abs(keep.mean() - p) < 4 * np.sqrt(p * (1 - p) / keep.size), name
        np.testing.assert_array_equal(keep, again[name])
        assert abs(_correlation(keep.astype(float), second[name].astype(float))) < 4 / np.sqrt(keep.size), name
    probabilities = sorted(n for n, v in first.items() if v.ndim == 4)
    residuals = sorted(n for n, v in first.items() if v.ndim == 3 and "embeddings" not in n)
    assert len(probabilities) == 2 and len(residuals) == 4, sorted(first)
    pairs = [probabilities] + [residuals[i:i + 2] for i in (0, 2)] + [[residuals[0], residuals[2]]]
    for a, b in pairs:
        r = _correlation(first[a].astype(float), first[b].astype(float))
        assert abs(r) < 4 / np.sqrt(first[a].size), (a, b, r)


def test_swapped_replaces_one_operation_for_the_block_only():
    with kernels.swapped("xla_cpu", "gelu"):
        inside = kernels.get("xla_cpu")
        assert inside.gelu is reference.gelu and inside.tied_logits is xla_cpu.tied_logits
    assert kernels.get("xla_cpu") is xla_cpu.KERNELS and xla_cpu.KERNELS.gelu is xla_cpu.gelu
    with kernels.swapped("reference", "dropout"):
        assert kernels.get("reference").dropout is hashed.HashedDropout
    assert kernels.get("reference").dropout is nn.Dropout
    with pytest.raises(ValueError, match="cannot swap 'softmax' in kernel set 'xla_cpu'"):
        with kernels.swapped("xla_cpu", "softmax"):
            pass


# ----------------------------------------------------------------------------- the gpu set's attention


def test_gpu_attention_applies_where_a_fused_kernel_takes_the_layer():
    """Without attention dropout, cuDNN's fused attention (jax's check_is_flash_attention): bfloat16 / float16,
    head size a multiple of 8 up to 128, an even length with a mask. With it, flash_gpu: the same dtypes and
    head sizes, a length its 64-token block divides (or a power-of-two length of at least 16). The reference
    path elsewhere."""
    assert gpu.applies(jnp.bfloat16, 64, 128, False) and gpu.applies("float16", 128, 512, False)
    assert not gpu.applies(jnp.float32, 64, 128, False)  # float32: no cuDNN flash attention
    assert not gpu.applies(jnp.bfloat16, 4, 128, False) and not gpu.applies(jnp.bfloat16, 12, 128, False)
    assert not gpu.applies(jnp.bfloat16, 256, 128, False)  # over the pre-Hopper bound
    assert not gpu.applies(jnp.bfloat16, 64, 127, False)  # an odd length with a mask
    # attention dropout: flash_gpu at BERT's shapes (Base / Large heads of 64, lengths 128 and 512)
    assert gpu.applies(jnp.bfloat16, 64, 128, True) and gpu.applies(jnp.bfloat16, 64, 512, True)
    assert gpu.applies("float16", 32, 32, True) and not gpu.applies(jnp.float32, 64, 128, True)
    assert not gpu.applies(jnp.bfloat16, 64, 96, True)  # 96: neither a multiple of 64 nor a power of two
    assert not gpu.applies(jnp.bfloat16, 12, 128, True) and not gpu.applies(jnp.bfloat16, 64, 8, True)


def _segments(length):
    segments = np.zeros((2, length), np.int32)
    segments[0, :12], segments[0, 12:20], segments[0, 20:26] = 1, 2, 3  # packed, then padding
    segments[1, : length - 5] = 1  # one sequence, then padding
    return jnp.asarray(segments)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_attention_equals_the_reference_with_segment_ids(dtype, monkeypatch):
    """The gpu set's call of jax.nn.dot_product_attention (its "xla" lowering here: no cuDNN on a CPU) against
    the model's formula with `AttentionMask.packed`, at the real tokens, value and gradient."""
    monkeypatch.setattr(gpu, "IMPLEMENTATION", "xla")
    b, n, length, h = 2, 2, 32, 16
    q, k, v = (x.astype(dtype) for x in jax.random.normal(jax.random.PRNGKey(0), (3, b, n, length, h)))
    segments = _segments(length)
    real = (segments > 0)[:, None, :, None]

    def reference_attention(q, k, v):
        scores = jnp.einsum("bnqh,bnkh->bnqk", q, k, preferred_element_type=jnp.float32) / np.sqrt(h)
        probs = jax.nn.softmax(scores + modeling.AttentionMask.packed(segments).bias, axis=-1)
        return jnp.einsum("bnqk,bnkh->bnqh", probs.astype(dtype), v)

    def ours(q, k, v):
        return gpu.attention((q / np.sqrt(h)).astype(dtype), k, v, segments)

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.where(real, fn(q, k, v), 0).astype(jnp.float32) ** 2)

    tol = _tol(dtype, f32=1e-5, bf16=3e-2)
    got, want = ours(q, k, v), reference_attention(q, k, v)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.where(real, got, 0).astype(np.float32), np.where(real, want, 0).astype(np.float32),
                               **tol)
    for g, w in zip(jax.grad(loss(ours), (0, 1, 2))(q, k, v), jax.grad(loss(reference_attention), (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), **_tol(dtype, 1e-4, 1e-1))


@pytest.mark.slow
def test_gpu_kernel_set_in_the_model_and_its_fallback(monkeypatch):
    """kernels="gpu" in BertForPreTraining on packed rows: bfloat16 without attention dropout takes cuDNN's
    kernel, and a bfloat16 training pass with attention dropout 0.1 takes flash_gpu (interpreted), both with
    layer_norm_gpu's fused LayerNorm(residual + dropout(x)) twice a layer, bias_gelu once, and with the
    logits of the reference set (with the hashed dropout: the same masks) within bfloat16's tolerance, the latter
    also jitted on a data=2 x tensor=2 mesh (flash_gpu per device under shard_map); float32 takes the reference
    path: the reference set's outputs exactly."""
    monkeypatch.setattr(gpu, "IMPLEMENTATION", "xla")
    monkeypatch.setattr(gpu, "INTERPRET", True)
    calls, norms, gelus = [], [], []
    monkeypatch.setattr(gpu, "KERNELS", dataclasses.replace(
        gpu.KERNELS, attention=lambda *a, **kw: calls.append(1) or gpu.attention(*a, **kw),
        dropout_add_layer_norm=lambda *a, **kw: norms.append(1) or gpu.dropout_add_layer_norm(*a, **kw),
        bias_gelu=lambda *a: gelus.append(1) or gpu.bias_gelu(*a)))
    length = 32
    segments = _segments(length)
    starts = [[0, 12, 20], [0, 0, 0]]
    positions = np.zeros((2, length), np.int32)
    for row in range(2):
        for s in range(length):
            positions[row, s] = s - max(t for t in starts[row] if t <= s)
    inputs = dict(input_ids=jax.random.randint(jax.random.PRNGKey(1), (2, length), 5, 99), token_type_ids=None,
                  attention_mask=(segments > 0).astype(jnp.int32), masked_lm_positions=jnp.array([[1, 13, 21], [2, 3, 4]]))
    packed = dict(segment_ids=segments, position_ids=jnp.asarray(positions),
                  next_sentence_positions=jnp.array([[0, 12, 20], [0, 0, 0]]))

    def run(name, dtype, dropout, deterministic=True, jit=False, key=2):
        config = modeling.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, dtype=dtype, kernels=name,
                                     attention_probs_dropout_prob=dropout)
        model = modeling.BertForPreTraining(config)
        params = model.init(jax.random.PRNGKey(0), inputs["input_ids"][:1],
                            masked_lm_positions=inputs["masked_lm_positions"][:1])["params"]
        calls.clear(), norms.clear(), gelus.clear()

        def apply(params, inputs, packed):
            return model.apply({"params": params}, **inputs, **packed, deterministic=deterministic,
                               rngs={"dropout": jax.random.PRNGKey(key)})

        out = (jax.jit(apply) if jit else apply)(params, inputs, packed)
        fused = dtype == "bfloat16" and name == "gpu"
        assert len(norms) == (4 if fused else 0) and len(gelus) == (2 if fused else 0)  # two and one a layer
        return (np.asarray(out.mlm_logits, np.float32), np.asarray(out.nsp_logits, np.float32)), len(calls)

    for dropout, deterministic in ((0.0, True), (0.1, False)):
        got, used = run("gpu", "bfloat16", dropout, deterministic)
        with kernels.swapped("reference", "dropout"):  # the gpu set's dropout is the hashed one
            want, _ = run("reference", "bfloat16", dropout, deterministic)
        assert used == 2  # a kernel took both layers
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=5e-2, rtol=5e-2)
        if dropout:
            mesh = sharding.make_mesh(2, 1, 2, jax.devices()[:4])
            with jax.set_mesh(mesh):
                meshed, used = run("gpu", "bfloat16", dropout, deterministic, jit=True)
            assert used == 2
            for g, w in zip(meshed, got):
                np.testing.assert_allclose(g, w, atol=5e-2, rtol=5e-2)
            other, _ = run("gpu", "bfloat16", dropout, deterministic, key=3)  # another step: other masks
            assert np.abs(other[0] - got[0]).max() > 0.1
    got, used = run("gpu", "float32", 0.0, True)
    want, _ = run("reference", "float32", 0.0, True)
    assert used == 0  # the reference path, not the kernel
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
