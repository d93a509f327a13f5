"""`bert_jax.model.kernels.layer_norm_gpu`: LayerNorm(residual + dropout(x + x_bias)) in one Pallas kernel and its
gradient in one more, run in Pallas's interpreter on the CPU, against `layer_norm_gpu.reference` (plain jnp: `dropout.apply`'s
mask and arithmetic, float32 two-pass statistics) and against flax's LayerNorm after `dropout.HashedDropout` (the
model's unfused path), in value and gradient, float32 and bfloat16, with and without dropout, for hidden sizes that
are and are not powers of two and lengths that give blocks of 8, 4 and 1 rows; per device on a mesh that splits the
batch; compiled for sm_90; the one-line errors."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model.kernels import dropout as hashed, layer_norm_gpu
from bert_jax.training import sharding

pytestmark = pytest.mark.unit

EPS = 1e-12


def _inputs(shape, dtype, key=0):
    kx, kr, ks, kb, kg, kxb = jax.random.split(jax.random.key(key), 6)
    x = jax.random.normal(kx, shape).astype(dtype)
    residual = (3.0 + 2.0 * jax.random.normal(kr, shape)).astype(dtype)  # a mean far from 0: two-pass matters
    scale = 1.0 + 0.1 * jax.random.normal(ks, shape[-1:])
    bias = 0.1 * jax.random.normal(kb, shape[-1:])
    weight = jax.random.normal(kg, shape)
    x_bias = 0.5 * jax.random.normal(kxb, shape[-1:])
    return x, residual, scale, bias, weight, x_bias


@functools.partial(jax.jit, static_argnames=("fn", "rate"))
def _value_and_grads(fn, x, residual, scale, bias, weight, seed, rate, x_bias=None):
    """(y, dx, dresidual, dscale, dbias[, dx_bias]) for loss = sum(y * weight)."""
    if x_bias is None:
        f = functools.partial(fn, epsilon=EPS, dropout_rate=rate, seed=seed)
        out, vjp = jax.vjp(f, x, residual, scale, bias)
    else:
        def f(x, residual, scale, bias, x_bias):
            return fn(x, residual, scale, bias, epsilon=EPS, dropout_rate=rate, seed=seed, x_bias=x_bias)

        out, vjp = jax.vjp(f, x, residual, scale, bias, x_bias)
    return (out, *vjp(weight.astype(out.dtype)))


def _tol(dtype, f32):
    return dict(atol=f32, rtol=f32) if dtype == "float32" else dict(atol=6e-2, rtol=6e-2)


@pytest.mark.parametrize("dtype,rate,shape,with_x_bias", [
    ("float32", 0.1, (2, 16, 32), True),  # blocks of 8 rows, a power-of-two hidden size
    ("float32", 0.0, (3, 12, 48), False),  # blocks of 4 rows; 48 features in 64 lanes
    ("bfloat16", 0.1, (2, 20, 24), True),  # blocks of 4 rows; 24 features in 32 lanes
    ("bfloat16", 0.1, (2, 7, 16), False),  # an odd length: blocks of one row
])
def test_value_and_gradients_equal_the_reference_and_flax(dtype, rate, shape, with_x_bias):
    x, residual, scale, bias, weight, x_bias = _inputs(shape, dtype)
    x_bias = x_bias if with_x_bias else None
    seed = hashed.seeds(jax.random.key(3))
    kernel = functools.partial(layer_norm_gpu.dropout_add_layer_norm, interpret=True)
    got = _value_and_grads(kernel, x, residual, scale, bias, weight, seed, rate, x_bias)
    want = _value_and_grads(layer_norm_gpu.reference, x, residual, scale, bias, weight, seed, rate, x_bias)
    assert len(got) == (6 if with_x_bias else 5)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), **_tol(dtype, 2e-5))

    # The model's unfused path: the dense layer's bias added in the compute dtype, HashedDropout's seeds from the same
    # key, then flax's LayerNorm in the compute dtype.
    def flax_path(x, residual, scale, bias, epsilon, dropout_rate, seed, x_bias=None):
        x = x if x_bias is None else x + x_bias.astype(x.dtype)
        dropped = hashed.apply(x, seed, dropout_rate) if dropout_rate else x
        norm = nn.LayerNorm(epsilon=epsilon, dtype=x.dtype, use_fast_variance=False)
        return norm.apply({"params": {"scale": scale, "bias": bias}}, residual + dropped)

    flax_result = _value_and_grads(flax_path, x, residual, scale, bias, weight, seed, rate, x_bias)
    for g, w in zip(got, flax_result):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), **_tol(dtype, 2e-5))
    if rate:  # dx is exactly 0 where the mask drops and nowhere else: the mask is keep_mask's for [B, L, D]
        keep, _ = hashed.seeded_keep_mask(seed, shape, rate)
        np.testing.assert_array_equal(np.asarray(got[1]) != 0, np.asarray(keep))
        assert 0.8 < np.asarray(keep).mean() < 0.97


def test_per_device_on_a_batch_split_mesh_equals_one_device():
    """On a data=2 x fsdp=2 mesh each device runs its rows (shard_map) with its rows of the global mask; values and
    gradients equal the unsplit call's, dscale, dbias and dx_bias summed over every device's rows."""
    shape = (8, 16, 32)
    x, residual, scale, bias, weight, x_bias = _inputs(shape, "float32", key=1)
    seed = hashed.seeds(jax.random.key(4))

    def fn(*args, **kw):
        return layer_norm_gpu.dropout_add_layer_norm(*args, **kw, interpret=True, batch_axes=("data", "fsdp"))

    want = _value_and_grads(fn, x, residual, scale, bias, weight, seed, 0.1, x_bias)
    mesh = sharding.make_mesh(2, 2, 1, jax.devices()[:4])
    with jax.set_mesh(mesh):
        rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
        args = [jax.device_put(a, rows) for a in (x, residual)]
        got = _value_and_grads(fn, *args, scale, bias, jax.device_put(weight, rows), seed, 0.1, x_bias)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-5)


def test_bad_inputs_raise_one_line_value_errors():
    x, residual, scale, bias, _, _ = _inputs((2, 8, 16), "float32")
    fn = functools.partial(layer_norm_gpu.dropout_add_layer_norm, epsilon=EPS, interpret=True)
    cases = [
        (lambda: fn(x, residual[:, :4], scale, bias), "x and residual of one shape"),
        (lambda: fn(x, residual, scale[:8], bias), r"scale, bias and x_bias \[16\]"),
        (lambda: fn(x, residual, scale, bias, x_bias=bias[:3]), r"scale, bias and x_bias \[16\]"),
        (lambda: fn(x[0], residual[0], scale, bias), "x and residual of one shape"),
        (lambda: fn(x.astype(jnp.int32), residual.astype(jnp.int32), scale, bias), "takes bfloat16, float16 or float32"),
        (lambda: fn(x, residual, scale, bias, dropout_rate=1.0), r"dropout_rate in \[0, 1\)"),
        (lambda: fn(x, residual, scale, bias, dropout_rate=0.1), "needs a seed"),
        (lambda: fn(x, residual, scale, bias, dropout_rate=0.1, seed=jnp.zeros(2, jnp.uint32),
                    lead_hashes=jnp.zeros(3, jnp.int32)), r"lead_hashes \[B\]"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as error:
            call()
        assert "\n" not in str(error.value)
