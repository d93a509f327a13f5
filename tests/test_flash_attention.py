"""`bert_jax.model.kernels.flash_gpu`: the fused attention with in-kernel dropout, run in Pallas's interpreter on the CPU,
against `flash_gpu.reference_attention`, plain jnp (softmax(q k^T + segment mask), the probabilities dropped with
`bert_jax.model.kernels.dropout.keep_mask` of the same key, then @ v), in value and gradient, float32 and bfloat16,
with and without dropout, on a padded row (attention_mask as segment ids) and a packed row (three segments and
padding) in one batch. Then the mask itself (recovered through an identity value: exactly keep_mask's, keeps
~0.9, independent across seeds, the same for other block sizes and for a shard of the batch and heads), and the
one-line errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model.kernels import dropout, flash_gpu

pytestmark = pytest.mark.unit  # about 18 s in all on a 2-core CPU (interpreted kernels; compilation dominates)

B, N, L, H = 2, 2, 64, 32
# Row 0: a padded row (attention_mask: 50 real tokens, then padding). Row 1: a packed row, three segments
# and padding; segment 3 starts after two 16-token key blocks that are all other segments.
SEGMENTS = np.array([[1] * 50 + [0] * 14, [1] * 10 + [2] * 30 + [3] * 17 + [0] * 7], np.int32)


def _inputs(dtype, head=H, length=L, key=0):
    kq, kk, kv, kw = jax.random.split(jax.random.key(key), 4)
    q = jax.random.normal(kq, (B, N, length, head)) / np.sqrt(head)
    k, v = jax.random.normal(kk, (B, N, length, head)), jax.random.normal(kv, (B, N, length, head))
    weight = jax.random.normal(kw, (B, N, length, head))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype), weight


@functools.partial(jax.jit, static_argnames=("rate", "block_q", "block_k"))
def _value_and_grads(q, k, v, weight, segment_ids, rng, rate, block_q, block_k):
    """(value, dq, dk, dv) of the kernel and of the reference for loss = sum(out * weight)."""
    kernel = functools.partial(flash_gpu.attention, segment_ids=segment_ids, dropout_rate=rate,
                               seed=flash_gpu.seeds(rng), block_q=block_q, block_k=block_k, interpret=True)
    plain = functools.partial(flash_gpu.reference_attention, segment_ids=segment_ids, dropout_rate=rate, rng=rng)
    results = []
    for f in (kernel, plain):
        out, vjp = jax.vjp(f, q, k, v)
        results.append((out, *vjp(weight.astype(out.dtype))))
    return results


# Each case its own tiling (query block x key block): all equal the reference, so the result does not depend on
# it. H = 24 is padded to 32 inside the kernel (Triton's power-of-two tiles).
@pytest.mark.parametrize("dtype,rate,block_q,block_k,head", [
    ("float32", 0.0, 32, 16, 32), ("float32", 0.1, 16, 64, 32), ("bfloat16", 0.0, 64, 32, 24),
    ("bfloat16", 0.1, 32, 16, 32)])
def test_value_and_gradients_equal_the_reference(dtype, rate, block_q, block_k, head):
    """Context and d query, d key, d value against autodiff of the reference: float32 to 5e-6, bfloat16 to
    bfloat16 rounding (the reference also rounds its probabilities to bfloat16 before @ v), relative to the
    largest entry. Every output and gradient is finite: no softmax row is empty (padding attends to padding)."""
    q, k, v, weight = _inputs(jnp.dtype(dtype), head=head)
    got, want = _value_and_grads(q, k, v, weight, jnp.asarray(SEGMENTS), jax.random.key(7), rate, block_q, block_k)
    for name, g, w in zip(("context", "dq", "dk", "dv"), got, want):
        assert g.dtype == w.dtype == jnp.dtype(dtype) and g.shape == w.shape, name
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        assert np.isfinite(g).all(), name
        scale = np.abs(w).max()
        tol = 5e-6 if dtype == "float32" else 2e-2
        np.testing.assert_allclose(g / scale, w / scale, rtol=0, atol=tol, err_msg=name)


@pytest.mark.parametrize("dtype,rate", [("float32", 0.1), ("bfloat16", 0.1)])
def test_token_major_layout_equals_heads_major(dtype, rate):
    """layout="BLNH" ([B, L, N, H], the projections' own layout) reads and writes the same (b, n) slices in place:
    its context and gradients are the heads-major call's, transposed, with the same dropout mask."""
    q, k, v, weight = _inputs(jnp.dtype(dtype))
    seed = flash_gpu.seeds(jax.random.key(3))
    segments = jnp.asarray(SEGMENTS)

    def run(layout):
        swap = (lambda x: x) if layout == "BNLH" else (lambda x: jnp.swapaxes(x, 1, 2))

        def f(q, k, v):
            out = flash_gpu.attention(swap(q), swap(k), swap(v), segments, dropout_rate=rate, seed=seed, block_q=32,
                                      block_k=16, interpret=True, layout=layout)
            return swap(out)

        out, vjp = jax.vjp(f, q, k, v)
        return (out, *vjp(weight.astype(out.dtype)))

    for name, a, b in zip(("context", "dq", "dk", "dv"), run("BNLH"), run("BLNH")):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=0, atol=1e-6,
                                   err_msg=name)
    with pytest.raises(ValueError, match="^flash attention's layout is 'BNLH', 'BLNH' or 'BL3NH', got 'NLH'$"):
        flash_gpu.attention(q, k, v, segments, layout="NLH", interpret=True)


@pytest.mark.parametrize("dtype,layout,head", [("float32", "BLNH", 32), ("bfloat16", "BNLH", 24),
                                               ("float32", "BL3NH", 32), ("bfloat16", "BL3NH", 24)])
def test_biases_and_scale_applied_on_load_equal_the_unfused_projections(dtype, layout, head):
    """bias=(b_q, b_k, b_v), scale=s gives the context of the reference on q = (query + b_q) * s, k = key + b_k,
    v = value + b_v (each rounded to the dtype, as the model's bias add and division), with dropout; the gradients
    of query, key, value and the three biases equal autodiff of that composition (a bias's: its projection's summed
    over the batch and the tokens). H = 24 pads the biases with the head. "BL3NH" takes the three projections as
    one [B, L, 3, N, H] array (slots key, value, query) and returns its gradient as one, each slot in its place."""
    dtype = jnp.dtype(dtype)
    q, k, v, weight = _inputs(dtype, head=head)
    biases = tuple(jax.random.normal(jax.random.key(10 + i), (N, head)) for i in range(3))
    scale = 1.0 / np.sqrt(head)
    rng, segments = jax.random.key(5), jnp.asarray(SEGMENTS)
    swap = (lambda x: x) if layout == "BNLH" else (lambda x: jnp.swapaxes(x, 1, 2))

    def fused(q, k, v, bq, bk, bv):
        options = dict(dropout_rate=0.1, seed=flash_gpu.seeds(rng), block_q=32, block_k=16, interpret=True,
                       layout=layout, bias=(bq, bk, bv), scale=scale)
        if layout == "BL3NH":
            slots = sorted(flash_gpu.PACKED_SLOTS, key=flash_gpu.PACKED_SLOTS.get)
            packed = jnp.stack([jnp.swapaxes(dict(query=q, key=k, value=v)[name], 1, 2) for name in slots], axis=2)
            return jnp.swapaxes(flash_gpu.attention(packed, None, None, segments, **options), 1, 2)
        return swap(flash_gpu.attention(swap(q), swap(k), swap(v), segments, **options))

    def unfused(q, k, v, bq, bk, bv):
        add = lambda x, b: (x + b[None, :, None, :].astype(dtype)).astype(dtype)  # noqa: E731
        return flash_gpu.reference_attention((add(q, bq) * scale).astype(dtype), add(k, bk), add(v, bv), segments,
                                             dropout_rate=0.1, rng=rng)

    got, want = ((out, *vjp(weight.astype(out.dtype))) for out, vjp in
                 (jax.vjp(jax.jit(f), q, k, v, *biases) for f in (fused, unfused)))
    got, want = list(got), list(want)
    names = ("context", "dq", "dk", "dv", "d bias_q", "d bias_k", "d bias_v")
    for name, g, w in zip(names, got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        # d bias_k is 0 up to rounding (q . bias_k shifts a whole softmax row): against d key's scale.
        scale = np.abs(np.asarray(want[2] if name == "d bias_k" else w, np.float32)).max()
        tol = 2e-5 if dtype == jnp.float32 else 3e-2
        np.testing.assert_allclose(g / scale, w / scale, rtol=0, atol=tol, err_msg=name)
    with pytest.raises(ValueError, match=r"^flash attention needs three biases \[N, H\] = \(2, "):
        flash_gpu.attention(q, k, v, segments, bias=biases[:2], interpret=True)
    with pytest.raises(ValueError, match=r"^flash attention's layout 'BL3NH' takes one \[B, L, 3, N, H\] array"):
        flash_gpu.attention(q, k, v, segments, layout="BL3NH", interpret=True)


@functools.partial(jax.jit, static_argnames=("block_q", "block_k"))
def _implied_mask(seed, block_q, block_k, lead_hashes=None):
    """The kept entries of the [b, n, L, L] probabilities: uniform attention over one segment (q = 0) of an
    identity value (H = L) gives context[b, n, q, k] = keep[b, n, q, k] / (L * keep_prob)."""
    batch, heads = (B, N) if lead_hashes is None else lead_hashes.shape
    q = jnp.zeros((batch, heads, L, L), jnp.float32)
    v = jnp.broadcast_to(jnp.eye(L, dtype=jnp.float32), q.shape)
    out = flash_gpu.attention(q, q, v, jnp.ones((batch, L), jnp.int32), dropout_rate=0.1, seed=seed,
                              lead_hashes=lead_hashes, block_q=block_q, block_k=block_k, interpret=True)
    return out * (L * (1.0 - dropout.threshold(0.1) / dropout.RESOLUTION)) > 0.5


def test_the_mask_is_keep_masks_keeps_0_9_is_independent_across_seeds_and_blocks_and_shards():
    rng_a, rng_b = jax.random.key(1), jax.random.key(2)
    seed_a, seed_b = flash_gpu.seeds(rng_a), flash_gpu.seeds(rng_b)
    assert seed_a.dtype == jnp.uint32 and seed_a.shape == (2,)
    mask_a = np.asarray(_implied_mask(seed_a, 32, 32))
    # Exactly the reference's mask for the [B, N, L, L] probabilities and the same key.
    np.testing.assert_array_equal(mask_a, np.asarray(dropout.keep_mask(rng_a, (B, N, L, L), 0.1)[0]))
    # Keeps 0.9 (16384 draws: standard deviation 0.0023), per head too; another seed draws another mask.
    assert abs(mask_a.mean() - 0.9) < 0.01 and np.all(np.abs(mask_a.mean(axis=(2, 3)) - 0.9) < 0.03)
    mask_b = np.asarray(_implied_mask(seed_b, 32, 32))
    assert abs(mask_b.mean() - 0.9) < 0.01
    assert abs((mask_a == mask_b).mean() - (0.9 ** 2 + 0.1 ** 2)) < 0.015  # independent: agree 82% of the time
    assert abs((mask_a & mask_b).mean() - 0.81) < 0.015
    # Another tiling draws the same mask.
    np.testing.assert_array_equal(np.asarray(_implied_mask(seed_a, 16, 64)), mask_a)
    # A shard (batch row 1, head 1) given its slice of the global lead hashes draws its slice of the mask.
    shard = flash_gpu.make_lead_hashes(seed_a, B, N)[1:, 1:]
    np.testing.assert_array_equal(np.asarray(_implied_mask(seed_a, 32, 32, shard)), mask_a[1:, 1:])


def test_bad_inputs_raise_one_line_value_errors():
    q = jnp.zeros((1, 1, 48, 32), jnp.float32)
    seg = jnp.ones((1, 48), jnp.int32)
    seed = flash_gpu.seeds(jax.random.key(0))
    cases = [
        (dict(block_q=32), "flash attention needs a length divisible by block_q=32, got 48"),
        (dict(block_k=20), "flash attention needs a length divisible by block_k=20, got 48"),
        (dict(dropout_rate=1.0, seed=seed), r"flash attention needs dropout_rate in \[0, 1\), got 1.0"),
        (dict(dropout_rate=-0.1, seed=seed), r"flash attention needs dropout_rate in \[0, 1\), got -0.1"),
        (dict(dropout_rate=0.1), r"flash attention with dropout_rate=0.1 needs a seed \(seeds\(rng\)\)"),
        (dict(dropout_rate=0.1, seed=seed, lead_hashes=jnp.zeros((2, 1), jnp.int32)),
         r"flash attention needs lead_hashes \[B, N\] = \(1, 1\), got \(2, 1\)"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=f"^{message}$"):
            flash_gpu.attention(q, q, q, seg, interpret=True, **kwargs)
    for head in (12, 136):
        x = jnp.zeros((1, 1, 48, head))
        message = rf"^flash attention needs a head size that is a multiple of 8 up to 128, got {head}$"
        with pytest.raises(ValueError, match=message):
            flash_gpu.attention(x, x, x, seg, interpret=True)
    message = r"^flash attention on a GPU needs block_q a power of two >= 16, got 48 \(length 48\)$"
    with pytest.raises(ValueError, match=message):
        flash_gpu.attention(q, q, q, seg)  # not interpreted: Triton's tiles
    with pytest.raises(ValueError, match=r"^flash attention needs segment_ids \[B, L\] = \(1, 48\), got \(48,\)$"):
        flash_gpu.attention(q, q, q, seg[0], interpret=True)
    with pytest.raises(ValueError, match=r"^flash attention needs query, key, value of one shape \[B, N, L, H\]"):
        flash_gpu.attention(q, q[:, :, :32], q, seg, interpret=True)
    with pytest.raises(ValueError, match=r"^flash attention takes bfloat16, float16 or float32, got int32$"):
        x = jnp.zeros((1, 1, 48, 32), jnp.int32)
        flash_gpu.attention(x, x, x, seg, interpret=True)
    # What a GPU run takes with the default blocks (for the kernel set's attention_applies).
    assert flash_gpu.supported(jnp.bfloat16, 64, 512) and flash_gpu.supported(jnp.float32, 64, 128)
    assert flash_gpu.supported(jnp.float16, 40, 384) and flash_gpu.supported(jnp.bfloat16, 128, 16)
    assert not flash_gpu.supported(jnp.bfloat16, 64, 8) and not flash_gpu.supported(jnp.bfloat16, 64, 100)
    assert not flash_gpu.supported(jnp.bfloat16, 12, 128) and not flash_gpu.supported(jnp.bfloat16, 256, 128)
