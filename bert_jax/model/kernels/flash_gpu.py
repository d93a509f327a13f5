"""Fused (flash) attention with attention-probability dropout drawn in the kernel, in Pallas for GPUs (Triton).

  attention   context = dropout(softmax(q k^T + segment mask)) v per head, never writing the [L, L] scores
              or probabilities to memory: an online-softmax forward that saves the row logsumexp, and a
              `jax.custom_vjp` backward whose two kernels (dq; dk and dv) recompute the probabilities and
              the same dropout mask from the saved logsumexp.
  reference_attention
              the same result in plain jnp, the probabilities written out: the truth `attention` is checked
              against (tests, `benchmarks/device_check.py --gpu_tests`).

Sources: Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"
(arXiv:2205.14135): the tiled online softmax of section 3.1 / algorithm 1, with the dropout of algorithm 2
(appendix B.3) as the forward; the backward of algorithm 4 (appendix B.4): the mask regenerated, not stored,
D_i = rowsum(dO_i * O_i) (here one jnp pass), dS = P * (dP - D). Dividing by the row sum once, at the end of
the forward, is FlashAttention-2's (Dao 2023, arXiv:2307.08691, section 3.1.1).
Dropout is inverted dropout (Srivastava et al. 2014, "Dropout: A Simple Way to Prevent Neural Networks from
Overfitting", JMLR 15; scaled by 1 / keep probability while training so that evaluation needs no rescaling),
applied to the normalised attention probabilities as in the BERT reference (attention_probs_dropout_prob).

The dropout mask is a pure function of (two 32-bit seeds, the element's global index (b, n, q, k)): the
counter hash of `bert_jax.model.kernels.dropout.keep_mask` for the probabilities' shape [B, N, L, L],
  h = fmix32(fmix32(lead ^ s0) ^ (inner * 0x9E3779B9 + s1)),  lead = b * N + n,  inner = q * L + k,
kept where (h >> 16) >= round(rate * 65536), the kept values scaled by 1 / (1 - round(rate * 65536) / 65536).
It is computed in int32 two's-complement arithmetic (logical shifts, wrapping products), which has the
uint32 formula's bits. So the mask is identical in the forward and the backward, does not depend on the block
sizes, is the same under any split of the batch or heads (`lead_hashes`) and on resume, and equals
`keep_mask(rng, (B, N, L, L), rate)` for `seed = seeds(rng)`: the reference path (softmax then
`dropout.HashedDropout` with the same key) drops exactly the same probabilities.

On a CPU the same kernels run in Pallas's interpreter (`interpret=True`, the tests).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from bert_jax.model.kernels import base, dropout as hashed

Array = jax.Array

MAX_HEAD_SIZE = 128
# The packed layout's slot of each projection along its third axis (`base.PACKED_SLOTS`: key, value, query).
PACKED_SLOTS = {name: i for i, name in enumerate(base.PACKED_SLOTS)}
DEFAULT_BLOCK = 64  # block_q = block_k, clipped to the length
_MIN_GPU_BLOCK = 16  # Triton's dot needs M, N, K >= 16

_MASKED = float(jnp.finfo(jnp.float32).min)  # the score of a key in another segment


seeds = hashed.seeds  # rng -> uint32 [2], the draw `bert_jax.model.kernels.dropout.keep_mask` makes from the same key


def make_lead_hashes(seed: Array, batch: int, heads: int) -> Array:
    """The per-(b, n) half of the dropout hash: int32 [batch, heads], fmix32((b * heads + n) ^ s0) as int32 bits,
    for the global [batch, heads]. A caller that splits the batch or heads across devices (shard_map) computes
    this for the global shape and passes each shard its slice (`attention(..., lead_hashes=...)`), so every
    shard draws the mask of the unsplit call.

    Args:
      seed: uint32 (or int32) [2], `seeds(rng)`.
    """
    return hashed.lead_hashes(seed, jnp.arange(batch * heads, dtype=jnp.int32).reshape(batch, heads))


@dataclasses.dataclass(frozen=True)
class _Static:
    """The compile-time settings of one call."""

    block_q: int
    block_k: int
    threshold: int  # drop where (h >> 16) < threshold; 0: no dropout
    interpret: bool
    heads_major: bool  # q, k, v, o laid out [B, N, L, H]; False: [B, L, N, H]
    num_warps: int
    num_stages: int
    packed: bool = False  # q, k, v one [B, L, 3, N, H] array (`PACKED_SLOTS`), o [B, L, N, H]
    biased: bool = False  # q, k, v biases [N, H] added on load
    scale: float = 1.0  # the biased query's factor (1 / sqrt(H) in BERT)

    @property
    def inv_keep(self) -> float:
        return 1.0 / (1.0 - self.threshold / hashed.RESOLUTION)


def _dot(a: Array, b: Array, contract_a: int, contract_b: int) -> Array:
    """2-D a . b contracting a's axis `contract_a` with b's `contract_b`, float32 accumulation."""
    return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32)


def _projected(static: _Static, x: Array, bias_ref, scale: float = 1.0) -> Array:
    """A loaded q, k or v tile [rows, H] as the attention reads it: (x + bias) * scale in x's dtype, rounded after
    each operation (the unfused path's bias add, then a multiplication by `scale`: its division by sqrt(H) to within
    an ulp, exactly for H = 64); x itself when the call has no biases (`_Static.biased`) and scale 1."""
    if static.biased:
        x = (x + bias_ref[...][None, :].astype(x.dtype)).astype(x.dtype)
    return x if scale == 1.0 else (x * scale).astype(x.dtype)


def _scores(q: Array, k: Array, seg_q: Array, seg_k: Array) -> Array:
    """q [bq, H] . k [bk, H]^T -> float32 [bq, bk], keys of other segments at the float32 minimum."""
    s = _dot(q, k, 1, 1)
    return jnp.where(seg_q[:, None] == seg_k[None, :], s, _MASKED)


def _keep(static: _Static, lead_hash: Array, s1: Array, q_start: Array, k_start: Array, length: int,
          shape: tuple[int, int]) -> Array:
    """The keep mask of the [bq, bk] tile at rows q_start.., columns k_start.. -> bool [bq, bk]."""
    rows = q_start + lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = k_start + lax.broadcasted_iota(jnp.int32, shape, 1)
    return hashed.kept_int32(lead_hash, s1, rows * jnp.int32(length) + cols, static.threshold)


def _forward_kernel(lead_ref, seed_ref, seg_ref, bq_ref, bk_ref, bv_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *,
                    static: _Static):
    """One (b, n, query block): q_ref [bq, H], k_ref and v_ref [L, H], seg_ref int32 [L], the head's biases
    b*_ref [H] -> o_ref [bq, H], lse_ref float32 [bq] (log of the softmax's row sums, in the scores' units)."""
    b, n, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bq, bk, length = static.block_q, static.block_k, k_ref.shape[0]
    q_start = i * bq
    q = _projected(static, q_ref[...], bq_ref, static.scale)
    seg_q = seg_ref[pl.ds(q_start, bq)]
    if static.threshold:
        lead_hash, s1 = lead_ref[b, n], seed_ref[1]

    def body(j, carry):
        acc, m, l = carry
        k_start = j * bk
        s = _scores(q, _projected(static, k_ref[pl.ds(k_start, bk), :], bk_ref), seg_q, seg_ref[pl.ds(k_start, bk)])
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[:, None])  # [bq, bk] float32, unnormalised
        l = alpha * l + jnp.sum(p, axis=1)  # the softmax's denominator: before dropout
        if static.threshold:
            p = jnp.where(_keep(static, lead_hash, s1, q_start, k_start, length, (bq, bk)), p, 0.0)
        v = _projected(static, v_ref[pl.ds(k_start, bk), :], bv_ref)
        acc = alpha[:, None] * acc + _dot(p.astype(v.dtype), v, 1, 0)
        return acc, m_new, l

    acc0 = jnp.zeros((bq, q.shape[1]), jnp.float32)
    m0 = jnp.full((bq,), -jnp.inf, jnp.float32)
    acc, m, l = lax.fori_loop(0, length // bk, body, (acc0, m0, jnp.zeros((bq,), jnp.float32)))
    scale = static.inv_keep if static.threshold else 1.0
    o_ref[...] = (acc * (scale / l)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l)


def _probabilities(static, lead_hash, s1, q, k, v, do, seg_q, seg_k, lse, delta, q_start, k_start, length):
    """One [bq, bk] tile of the backward (Dao et al. 2022, algorithm 4): P from the saved logsumexp, the
    dropped-and-scaled probabilities P_d, and dS = P * (dP - D) with dP the gradient through the dropout."""
    p = jnp.exp(_scores(q, k, seg_q, seg_k) - lse[:, None])  # [bq, bk], 0 across segments
    dp = _dot(do, v, 1, 1)  # d(P_d) [bq, bk]
    if static.threshold:
        keep = _keep(static, lead_hash, s1, q_start, k_start, length, p.shape)
        p_dropped = jnp.where(keep, p * static.inv_keep, 0.0)
        dp = jnp.where(keep, dp * static.inv_keep, 0.0)
    else:
        p_dropped = p
    return p_dropped, p * (dp - delta[:, None])


def _dq_kernel(lead_ref, seed_ref, seg_ref, bq_ref, bk_ref, bv_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
               dq_ref, *, static: _Static):
    """One (b, n, query block): q_ref, do_ref [bq, H], k_ref, v_ref [L, H], lse_ref, delta_ref float32 [bq]
    -> dq_ref [bq, H] = scale * sum over key blocks of dS K (the gradient of the query before bias and scale)."""
    b, n, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bq, bk, length = static.block_q, static.block_k, k_ref.shape[0]
    q_start = i * bq
    q, do, lse, delta = _projected(static, q_ref[...], bq_ref, static.scale), do_ref[...], lse_ref[...], delta_ref[...]
    seg_q = seg_ref[pl.ds(q_start, bq)]
    lead_hash, s1 = (lead_ref[b, n], seed_ref[1]) if static.threshold else (None, None)

    def body(j, dq):
        k_start = j * bk
        k = _projected(static, k_ref[pl.ds(k_start, bk), :], bk_ref)
        v = _projected(static, v_ref[pl.ds(k_start, bk), :], bv_ref)
        _, ds = _probabilities(static, lead_hash, s1, q, k, v, do, seg_q,
                               seg_ref[pl.ds(k_start, bk)], lse, delta, q_start, k_start, length)
        return dq + _dot(ds.astype(k.dtype), k, 1, 0)

    dq = lax.fori_loop(0, length // bk, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * static.scale).astype(dq_ref.dtype)


def _dkv_kernel(lead_ref, seed_ref, seg_ref, bq_ref, bk_ref, bv_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
                *out_refs, static: _Static):
    """One (b, n, key block): k_ref, v_ref [bk, H], q_ref, do_ref [L, H], lse_ref, delta_ref float32 [L]
    -> dk = sum over query blocks of dS^T Q, dv = sum of P_d^T dO, [bk, H] each: out_refs (dk_ref, dv_ref), or packed
    (the dq kernel's packed gradient, aliased, and its [bk, 2, H] block of key and value slots)."""
    b, n, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    bq, bk, length = static.block_q, static.block_k, q_ref.shape[0]
    k_start = j * bk
    k, v = _projected(static, k_ref[...], bk_ref), _projected(static, v_ref[...], bv_ref)
    seg_k = seg_ref[pl.ds(k_start, bk)]
    lead_hash, s1 = (lead_ref[b, n], seed_ref[1]) if static.threshold else (None, None)

    def body(i, carry):
        dk, dv = carry
        q_start = i * bq
        rows = pl.ds(q_start, bq)
        q, do = _projected(static, q_ref[rows, :], bq_ref, static.scale), do_ref[rows, :]
        p_dropped, ds = _probabilities(static, lead_hash, s1, q, k, v, do, seg_ref[rows], seg_k, lse_ref[rows],
                                       delta_ref[rows], q_start, k_start, length)
        return dk + _dot(ds.astype(q.dtype), q, 0, 0), dv + _dot(p_dropped.astype(do.dtype), do, 0, 0)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, length // bq, body, (zeros, zeros))
    if static.packed:
        dkv_ref = out_refs[1]
        dkv_ref[:, PACKED_SLOTS["key"], :] = dk.astype(dkv_ref.dtype)
        dkv_ref[:, PACKED_SLOTS["value"], :] = dv.astype(dkv_ref.dtype)
    else:
        dk_ref, dv_ref = out_refs
        dk_ref[...] = dk.astype(dk_ref.dtype)
        dv_ref[...] = dv.astype(dv_ref.dtype)


def _call(kernel, static: _Static, grid, in_specs, out_specs, out_shape, name, *args, aliases=None):
    return pl.pallas_call(
        functools.partial(kernel, static=static), grid=grid, in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape, interpret=static.interpret, name=name, input_output_aliases=aliases or {},
        compiler_params=plgpu.CompilerParams(num_warps=static.num_warps, num_stages=static.num_stages),
    )(*args)


def _common_specs(batch: int, heads: int, length: int, head: int):
    """BlockSpecs of lead hashes [B, N], seeds [2], segment ids [B, L] (whole rows) and the three biases [N, H] (the
    head's row), for a (b, n, block) grid."""
    bias = pl.BlockSpec((None, head), lambda b, n, i: (n, 0))
    return [pl.BlockSpec((batch, heads), lambda b, n, i: (0, 0)),
            pl.BlockSpec((2,), lambda b, n, i: (0,)),
            pl.BlockSpec((None, length), lambda b, n, i: (b, 0)), bias, bias, bias]


def _dims(static: _Static, x: Array) -> tuple[int, int, int, int]:
    """(B, N, L, H) of q, k, v or o in the call's layout (a packed array's: [B, L, 3, N, H])."""
    if x.ndim == 5:
        return x.shape[0], x.shape[3], x.shape[1], x.shape[4]
    return x.shape if static.heads_major else (x.shape[0], x.shape[2], x.shape[1], x.shape[3])


def _tile(static: _Static, rows: int, head: int, whole: bool = False, slot: str | None = None) -> pl.BlockSpec:
    """The [rows, H] block of (b, n) at row block i, for a (b, n, i) grid, in the call's layout; whole: the
    whole [L, H] slice of (b, n) (rows = L) whatever i; slot: of a packed array, the query's, key's or value's."""
    if slot is not None:
        index = PACKED_SLOTS[slot]
        return pl.BlockSpec((None, rows, None, None, head), lambda b, n, i: (b, 0 if whole else i, index, n, 0))
    if static.heads_major:
        return pl.BlockSpec((None, None, rows, head), lambda b, n, i: (b, n, 0 if whole else i, 0))
    return pl.BlockSpec((None, rows, None, head), lambda b, n, i: (b, 0 if whole else i, n, 0))


def _operands(static: _Static, arrays: tuple, length: int, head: int, query_rows: int, key_rows: int | None):
    """(q, k, v) and their BlockSpecs: the query's [query_rows, H] tile and the key's and value's [key_rows, H] tiles
    (None: whole [L, H]) of the three arrays, or of the packed one's slots."""
    def spec(rows, slot):
        return _tile(static, length if rows is None else rows, head, whole=rows is None,
                     slot=slot if static.packed else None)

    return (arrays * 3 if static.packed else arrays), [spec(query_rows, "query"), spec(key_rows, "key"),
                                                       spec(key_rows, "value")]


def _context_shape(static: _Static, q: Array) -> jax.ShapeDtypeStruct:
    """The context's shape: q's, [B, L, N, H] for a packed q."""
    return jax.ShapeDtypeStruct(q.shape[:2] + q.shape[3:] if static.packed else q.shape, q.dtype)


def _forward(static: _Static, lead, seed, seg, biases, arrays):
    batch, heads, length, head = _dims(static, arrays[0])
    bq = static.block_q
    (q, k, v), specs = _operands(static, arrays, length, head, bq, None)
    return _call(_forward_kernel, static, (batch, heads, length // bq),
                 _common_specs(batch, heads, length, head) + specs,
                 [_tile(static, bq, head), pl.BlockSpec((None, None, bq), lambda b, n, i: (b, n, i))],
                 [_context_shape(static, q), jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)],
                 "flash_attention_forward", lead, seed, seg, *biases, q, k, v)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(static: _Static, lead, seed, seg, biases, arrays):
    return _forward(static, lead, seed, seg, biases, arrays)[0]


def _flash_fwd(static, lead, seed, seg, biases, arrays):
    o, lse = _forward(static, lead, seed, seg, biases, arrays)
    return o, (lead, seed, seg, biases, arrays, o, lse)


def _flash_bwd(static, residuals, do):
    lead, seed, seg, biases, arrays, o, lse = residuals
    q = arrays[0]
    batch, heads, length, head = _dims(static, q)
    do = do.astype(q.dtype)
    # D_i = rowsum(dO_i * O_i) = rowsum(dP_d * P_d) (algorithm 4): one elementwise pass, float32.
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)  # [B, N, L] ([B, L, N]: swapped)
    delta = delta if static.heads_major else jnp.swapaxes(delta, 1, 2)
    common = _common_specs(batch, heads, length, head)
    whole = _tile(static, length, head, whole=True)
    whole_row = pl.BlockSpec((None, None, length), lambda b, n, i: (b, n, 0))
    tile = lambda rows: _tile(static, rows, head)  # noqa: E731  (do: the context's layout)
    tile_row = lambda rows: pl.BlockSpec((None, None, rows), lambda b, n, i: (b, n, i))  # noqa: E731
    bq, bk = static.block_q, static.block_k
    (q, k, v), q_specs = _operands(static, arrays, length, head, bq, None)
    (_, _, _), kv_specs = _operands(static, arrays, length, head, None, bk)
    dq_spec = q_specs[0] if static.packed else tile(bq)  # packed: the query's slot of the packed gradient
    dq = _call(_dq_kernel, static, (batch, heads, length // bq),
               common + q_specs + [tile(bq), tile_row(bq), tile_row(bq)], dq_spec,
               jax.ShapeDtypeStruct(arrays[0].shape, q.dtype), "flash_attention_dq",
               lead, seed, seg, *biases, q, k, v, do, lse, delta)
    kv_in = common + kv_specs + [whole, whole_row, whole_row]
    if static.packed:  # the key and value slots written into the dq kernel's output, in place
        packed = _call(_dkv_kernel, static, (batch, heads, length // bk), kv_in + [pl.BlockSpec(memory_space=pl.ANY)],
                       pl.BlockSpec((None, bk, 2, None, head), lambda b, n, j: (b, j, 0, n, 0)),
                       jax.ShapeDtypeStruct(q.shape, q.dtype), "flash_attention_dkv",
                       lead, seed, seg, *biases, q, k, v, do, lse, delta, dq, aliases={len(kv_in): 0})
        grads = (packed,)
    else:
        dk, dv = _call(_dkv_kernel, static, (batch, heads, length // bk), kv_in, [tile(bk), tile(bk)],
                       [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
                       "flash_attention_dkv", lead, seed, seg, *biases, q, k, v, do, lse, delta)
        grads = by_projection = (dq, dk, dv)
    # A bias's gradient: its projection's summed over the batch and the tokens, float32 (packed: one reduction).
    if not static.biased:
        dbiases = tuple(jnp.zeros_like(b) for b in biases)
    elif static.packed:
        sums = jnp.sum(grads[0].astype(jnp.float32), axis=(0, 1))  # [3, N, H]
        dbiases = tuple(sums[PACKED_SLOTS[name]].astype(b.dtype) for name, b in zip(("query", "key", "value"), biases))
    else:
        tokens = (0, 2) if static.heads_major else (0, 1)
        dbiases = tuple(jnp.sum(g.astype(jnp.float32), axis=tokens).astype(b.dtype) for g, b in zip(grads, biases))
    return None, None, None, dbiases, grads


_flash.defvjp(_flash_fwd, _flash_bwd)


def _block(requested: int | None, length: int) -> int:
    return min(DEFAULT_BLOCK if requested is None else requested, length)


def check(dtype, head_size: int, length: int, dropout_rate: float = 0.0, block_q: int | None = None,
          block_k: int | None = None, interpret: bool = False) -> str | None:
    """Why `attention` would reject a layer (one line), or None where it takes it. On a GPU (interpret False)
    the blocks must also be powers of two of at least 16 (Triton's tiles)."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32)):
        return f"flash attention takes bfloat16, float16 or float32, got {jnp.dtype(dtype)}"
    if head_size % 8 or not 8 <= head_size <= MAX_HEAD_SIZE:
        return f"flash attention needs a head size that is a multiple of 8 up to {MAX_HEAD_SIZE}, got {head_size}"
    if not 0.0 <= dropout_rate < 1.0 or hashed.threshold(dropout_rate) >= hashed.RESOLUTION:
        return f"flash attention needs dropout_rate in [0, 1), got {dropout_rate}"
    for name, requested in (("block_q", block_q), ("block_k", block_k)):
        block = _block(requested, length)
        if block < 1 or length % block:
            return f"flash attention needs a length divisible by {name}={block}, got {length}"
        if not interpret and (block < _MIN_GPU_BLOCK or block & (block - 1)):
            return (f"flash attention on a GPU needs {name} a power of two >= {_MIN_GPU_BLOCK}, got {block} "
                    f"(length {length})")
    return None


def supported(dtype, head_size: int, length: int) -> bool:
    """Whether `attention` with the default blocks takes a layer on a GPU (for `Kernels.attention_applies`)."""
    return check(dtype, head_size, length) is None


def attention(query: Array, key: Array | None, value: Array | None, segment_ids: Array, *, dropout_rate: float = 0.0,
              seed: Array | None = None, lead_hashes: Array | None = None, block_q: int | None = None,
              block_k: int | None = None, interpret: bool = False, layout: str = "BNLH",
              bias: tuple[Array, Array, Array] | None = None, scale: float = 1.0) -> Array:
    """Fused attention with inverted dropout on the attention probabilities.

    context = (keep / keep_prob * softmax(q k^T + mask)) v per (b, n), the softmax over the keys of the query's
    segment, its statistics in float32, with q = (query + bias_q) * scale, k = key + bias_k, v = value + bias_v
    computed as each tile is loaded (the projections' biases and 1 / sqrt(H) never take a pass over memory).

    Args:
      query: [B, N, L, H] bfloat16, float16 or float32: the query projection, scaled by `scale` here.
      key, value: [B, N, L, H], query's dtype.
      bias: None, or the query, key and value projections' biases, three [N, H] arrays (any float dtype: a model's
        float32 parameters, cast to query's dtype in the kernel); their gradients, in the biases' dtypes, are the
        projections' summed over the batch and the tokens.
      scale: the query's factor after its bias (1 / sqrt(H) for BERT; 1 for a query scaled already).
      segment_ids: int [B, L]; query i attends to key j iff segment_ids[b, i] == segment_ids[b, j] (packed rows:
        their segment ids; padded rows: attention_mask, real tokens one segment and padding another). Every
        query sees at least itself, so no softmax row is empty.
      dropout_rate: probability of dropping an attention probability, in [0, 1); drawn as
        round(rate * 65536) / 65536, the kept ones scaled by 1 / keep_prob (`dropout.keep_mask`'s rule).
      seed: uint32 [2] (`seeds(rng)`); needed when dropout_rate > 0, unread otherwise.
      lead_hashes: int32 or uint32 [B, N], `make_lead_hashes(seed, B_global, N_global)[this shard]` when the call
        sees a slice of the batch or heads (shard_map); None: this call's [B, N] is the global one.
      block_q, block_k: query and key tile lengths (default 64, clipped to L); must divide L. Neither changes
        the result beyond float rounding order, nor the dropout mask.
      interpret: run in Pallas's interpreter (any backend; the CPU tests).
      layout: "BNLH" (query, key, value and the context [B, N, L, H]), "BLNH" ([B, L, N, H], the projections'
        own layout: the kernels read and write the (b, n) slices in place, no transpose to heads-major and back), or
        "BL3NH": query is the three projections in one [B, L, 3, N, H] array (one matrix product's output; slots
        `PACKED_SLOTS`: key, value, query), key and value None, the context [B, L, N, H]; its gradient is one
        [B, L, 3, N, H] array, the key and value slots written in place into the query's.

    Returns:
      context [B, N, L, H] in query's dtype ([B, L, N, H] for layouts "BLNH" and "BL3NH").

    Raises:
      ValueError (one line): an unknown layout, shapes that differ from [B, N, L, H] / [B, L] / [N, H] (biases), a
        head size that is not a
        multiple of 8 in [8, 128], another dtype, a length not divisible by a block (or, on a GPU, a block
        that is not a power of two >= 16), dropout_rate outside [0, 1), dropout without a seed.
    """
    if layout not in ("BNLH", "BLNH", "BL3NH"):
        raise ValueError(f"flash attention's layout is 'BNLH', 'BLNH' or 'BL3NH', got {layout!r}")
    packed = layout == "BL3NH"
    if packed:
        if key is not None or value is not None or query.ndim != 5 or query.shape[2] != 3:
            raise ValueError("flash attention's layout 'BL3NH' takes one [B, L, 3, N, H] array as query and None as "
                             f"key and value, got {query.shape}, {getattr(key, 'shape', key)}, "
                             f"{getattr(value, 'shape', value)}")
        batch, length, _, heads, head = query.shape
    else:
        shapes = (query.shape, getattr(key, "shape", None), getattr(value, "shape", None))
        if query.ndim != 4 or shapes[1] != query.shape or shapes[2] != query.shape:
            raise ValueError(f"flash attention needs query, key, value of one shape [{', '.join(layout)}], got "
                             f"{query.shape}, {getattr(key, 'shape', key)}, {getattr(value, 'shape', value)}")
        batch, heads, length, head = query.shape if layout == "BNLH" else (query.shape[0], query.shape[2],
                                                                           query.shape[1], query.shape[3])
        if key.dtype != query.dtype or value.dtype != query.dtype:
            raise ValueError(f"flash attention needs one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    if segment_ids.shape != (batch, length):
        raise ValueError(f"flash attention needs segment_ids [B, L] = {(batch, length)}, got {segment_ids.shape}")
    if bias is not None and (len(bias) != 3 or any(jnp.shape(b) != (heads, head) for b in bias)):
        raise ValueError(f"flash attention needs three biases [N, H] = {(heads, head)}, got "
                         f"{[jnp.shape(b) for b in bias] if isinstance(bias, (tuple, list)) else bias!r}")
    problem = check(query.dtype, head, length, dropout_rate, block_q, block_k, interpret)
    if problem:
        raise ValueError(problem)
    threshold = hashed.threshold(dropout_rate)
    if threshold and seed is None:
        raise ValueError(f"flash attention with dropout_rate={dropout_rate} needs a seed (seeds(rng))")
    if threshold:
        seed = hashed.as_int32(seed).reshape(2)
        lead = make_lead_hashes(seed, batch, heads) if lead_hashes is None else hashed.as_int32(lead_hashes)
        if lead.shape != (batch, heads):
            raise ValueError(f"flash attention needs lead_hashes [B, N] = {(batch, heads)}, got {lead.shape}")
    else:
        seed, lead = jnp.zeros((2,), jnp.int32), jnp.zeros((batch, heads), jnp.int32)
    # Triton tiles are powers of two and its dot needs K >= 16: pad the head (zeros change no q.k, and
    # value's zero columns give context columns that are cut off).
    padded = max(_MIN_GPU_BLOCK, 1 << (head - 1).bit_length())
    arrays = tuple(x if padded == head else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, padded - head)])
                   for x in ((query,) if packed else (query, key, value)))
    biases = tuple(jnp.zeros((heads, padded), query.dtype) for _ in range(3)) if bias is None else tuple(
        b if padded == head else jnp.pad(b, [(0, 0), (0, padded - head)]) for b in map(jnp.asarray, bias))
    static = _Static(block_q=_block(block_q, length), block_k=_block(block_k, length), threshold=threshold,
                     interpret=interpret, heads_major=layout == "BNLH", num_warps=4 if padded <= 64 else 8,
                     num_stages=2, biased=bias is not None, scale=float(scale), packed=packed)
    out = _flash(static, lead, seed, segment_ids.astype(jnp.int32), biases, arrays)
    return out if padded == head else out[..., :head]


def reference_attention(query: Array, key: Array, value: Array, segment_ids: Array, *, dropout_rate: float = 0.0,
                        rng: Array | None = None) -> Array:
    """What `attention` computes, in plain jnp, as the truth it is checked against (tests/test_flash_attention.py,
    `benchmarks/device_check.py --gpu_tests`): softmax(query key^T + segment mask) in float32, inverted dropout
    with `dropout.keep_mask(rng, (B, N, L, L), dropout_rate)`'s mask (`dropout.HashedDropout`'s arithmetic; the
    mask `attention` draws for `seed = seeds(rng)`), the probabilities cast to value's dtype, @ value with float32
    accumulation. Writes the [B, N, L, L] probabilities: for checks, not training.

    Args:
      query: [B, N, L, H], already scaled by 1 / sqrt(H).
      key, value: [B, N, L, H].
      segment_ids: int [B, L], as `attention`'s.
      dropout_rate: in [0, 1); 0 draws no mask.
      rng: a PRNG key; read only when dropout_rate > 0.

    Returns:
      context [B, N, L, H] in value's dtype.
    """
    scores = jnp.einsum("bnqh,bnkh->bnqk", query, key, preferred_element_type=jnp.float32)
    same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    probs = jax.nn.softmax(scores + jnp.where(same, 0.0, _MASKED), axis=-1)
    if dropout_rate:
        keep, keep_prob = hashed.keep_mask(rng, probs.shape, dropout_rate)
        probs = jnp.where(keep, probs * jnp.float32(1.0 / keep_prob), 0.0)
    return jnp.einsum("bnqk,bnkh->bnqh", probs.astype(value.dtype), value,
                      preferred_element_type=jnp.float32).astype(value.dtype)
