"""`bert_jax.model.kernels.layer_norm_gpu`: LayerNorm(residual + dropout(x)) in one Pallas kernel and its gradient in
one more, run in Pallas's interpreter on the CPU, against `layer_norm_gpu.reference` (plain jnp: `dropout.apply`'s
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
    kx, kr, ks, kb, kg = jax.random.split(jax.random.key(key), 5)
    x = jax.random.normal(kx, shape).astype(dtype)
    residual = (3.0 + 2.0 * jax.random.normal(kr, shape)).astype(dtype)  # a mean far from 0: two-pass matters
    scale = 1.0 + 0.1 * jax.random.normal(ks, shape[-1:])
    bias = 0.1 * jax.random.normal(kb, shape[-1:])
    weight = jax.random.normal(kg, shape)
    return x, residual, scale, bias, weight


@functools.partial(jax.jit, static_argnames=("fn", "rate"))
def _value_and_grads(fn, x, residual, scale, bias, weight, seed, rate):
    f = functools.partial(fn, epsilon=EPS, dropout_rate=rate, seed=seed)
    out, vjp = jax.vjp(f, x, residual, scale, bias)
    return (out, *vjp(weight.astype(out.dtype)))


def _tol(dtype, f32):
    return dict(atol=f32, rtol=f32) if dtype == "float32" else dict(atol=6e-2, rtol=6e-2)


@pytest.mark.parametrize("dtype,rate,shape", [
    ("float32", 0.1, (2, 16, 32)),  # blocks of 8 rows, a power-of-two hidden size
    ("float32", 0.0, (3, 12, 48)),  # blocks of 4 rows; 48 features in 64 lanes
    ("bfloat16", 0.1, (2, 20, 24)),  # blocks of 4 rows; 24 features in 32 lanes
    ("bfloat16", 0.1, (2, 7, 16)),  # an odd length: blocks of one row
])
def test_value_and_gradients_equal_the_reference_and_flax(dtype, rate, shape):
    x, residual, scale, bias, weight = _inputs(shape, dtype)
    seed = hashed.seeds(jax.random.key(3))
    kernel = functools.partial(layer_norm_gpu.dropout_add_layer_norm, interpret=True)
    got = _value_and_grads(kernel, x, residual, scale, bias, weight, seed, rate)
    want = _value_and_grads(layer_norm_gpu.reference, x, residual, scale, bias, weight, seed, rate)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), **_tol(dtype, 2e-5))

    # The model's unfused path: HashedDropout's seeds from the same key, then flax's LayerNorm in the compute dtype.
    def flax_path(x, residual, scale, bias, epsilon, dropout_rate, seed):
        dropped = hashed.apply(x, seed, dropout_rate) if dropout_rate else x
        norm = nn.LayerNorm(epsilon=epsilon, dtype=x.dtype, use_fast_variance=False)
        return norm.apply({"params": {"scale": scale, "bias": bias}}, residual + dropped)

    flax_result = _value_and_grads(flax_path, x, residual, scale, bias, weight, seed, rate)
    for g, w in zip(got, flax_result):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), **_tol(dtype, 2e-5))
    if rate:  # dx is exactly 0 where the mask drops and nowhere else: the mask is keep_mask's for [B, L, D]
        keep, _ = hashed.seeded_keep_mask(seed, shape, rate)
        np.testing.assert_array_equal(np.asarray(got[1]) != 0, np.asarray(keep))
        assert 0.8 < np.asarray(keep).mean() < 0.97


def test_per_device_on_a_batch_split_mesh_equals_one_device():
    """On a data=2 x fsdp=2 mesh each device runs its rows (shard_map) with its rows of the global mask; values and
    gradients equal the unsplit call's, dscale and dbias summed over every device's rows."""
    shape = (8, 16, 32)
    x, residual, scale, bias, weight = _inputs(shape, "float32", key=1)
    seed = hashed.seeds(jax.random.key(4))

    def fn(*args, **kw):
        return layer_norm_gpu.dropout_add_layer_norm(*args, **kw, interpret=True, batch_axes=("data", "fsdp"))

    want = _value_and_grads(fn, x, residual, scale, bias, weight, seed, 0.1)
    mesh = sharding.make_mesh(2, 2, 1, jax.devices()[:4])
    with jax.set_mesh(mesh):
        rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
        args = [jax.device_put(a, rows) for a in (x, residual)]
        got = _value_and_grads(fn, *args, scale, bias, jax.device_put(weight, rows), seed, 0.1)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-5)


def test_bad_inputs_raise_one_line_value_errors():
    x, residual, scale, bias, _ = _inputs((2, 8, 16), "float32")
    fn = functools.partial(layer_norm_gpu.dropout_add_layer_norm, epsilon=EPS, interpret=True)
    cases = [
        (lambda: fn(x, residual[:, :4], scale, bias), "x and residual of one shape"),
        (lambda: fn(x, residual, scale[:8], bias), r"scale and bias \[16\]"),
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
