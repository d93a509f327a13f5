"""A post-LayerNorm layer's `LayerNorm(residual + dropout(x + x_bias))` as one Pallas kernel for GPUs (Triton), and
its gradient as one more.

  dropout_add_layer_norm
              y = LayerNorm(residual + dropout(x + x_bias)) over the last axis, x_bias the sub-layer's last dense
              layer's bias (optional): the sum in x's dtype, then float32
              statistics with the exact two-pass variance (flax's `use_fast_variance=False`, torch.nn.LayerNorm,
              the original's LayerNorm), scale and bias in float32, y in x's dtype. The dropout mask is
              `bert_jax.model.kernels.dropout.keep_mask`'s for x's shape [B, L, D] (the mask `HashedDropout`
              draws from the same seeds), computed in the kernel. A `jax.custom_vjp`: the forward writes y
              only; the backward kernel reads x, residual and dy, recomputes the sum, its statistics and the
              mask, and writes dx, dresidual and per-block partial sums of dscale, dbias (and dx_bias), which one
              reduction adds up. Nothing but the inputs is kept for the backward.
  reference   the same in plain jnp, the truth `dropout_add_layer_norm` is checked against (tests).

Where it sits: Devlin et al. 2018, section 3 (BERT's layers are Vaswani et al. 2017's post-LN Transformer layers,
section 5.4: dropout on each sub-layer's output before it is added to the sub-layer's input and normalised).
Left to XLA, the same graph is a bias add, an add-and-mask fusion, the LayerNorm's reductions and its normalisation,
with the sum and the mask written for the backward, and a backward of several more kernels (benchmarks/README.md).

A block is `rows` rows of the hidden size padded to a power of two (Triton's tiles), the padding masked out of every
load and store (BERT-Base's 768 in 1,024 lanes). On a CPU the same kernels run in Pallas's interpreter
(`interpret=True`, the tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec as P

from bert_jax.model.kernels import dropout as hashed

Array = jax.Array

MAX_ROWS = 8  # rows of one block (fewer where the length is not divisible)
MAX_HIDDEN = 8192


@dataclasses.dataclass(frozen=True)
class _Static:
    """The compile-time settings of one call."""

    rows: int
    hidden: int
    width: int  # hidden rounded up to a power of two: a block's lanes
    threshold: int  # drop where (h >> 16) < threshold; 0: no dropout
    epsilon: float
    interpret: bool
    batch_axes: tuple[str, ...]  # mesh axes the batch is split over: each device runs its rows (shard_map)
    x_bias: bool  # a bias added to x before the dropout (the sub-layer's last dense layer's)

    @property
    def inv_keep(self) -> float:
        return 1.0 / (1.0 - self.threshold / hashed.RESOLUTION)


def _lanes(static: _Static, shape: tuple[int, ...]) -> Array | None:
    """The lanes of a block of `shape` (last axis: width) that hold features (bool), None when all do."""
    if static.width == static.hidden:
        return None
    return lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1) < static.hidden


def _load(static: _Static, ref) -> Array:
    """A whole block, zeros in the padding lanes."""
    lanes = _lanes(static, ref.shape)
    return ref[...] if lanes is None else plgpu.load(ref, mask=lanes, other=0)


def _store(static: _Static, ref, value: Array) -> None:
    lanes = _lanes(static, ref.shape)
    if lanes is None:
        ref[...] = value
    else:
        plgpu.store(ref, value, mask=lanes)


def _sum(static: _Static, lead_ref, seed_ref, x_ref, xb_ref, r_ref) -> tuple[Array, Array | None]:
    """The block's residual + dropout(x + x_bias) [rows, width] in x's dtype, and the keep mask (None without
    dropout)."""
    x, r = _load(static, x_ref), _load(static, r_ref)
    if static.x_bias:
        x = x + _load(static, xb_ref).astype(x.dtype)[None, :]
    if not static.threshold:
        return r + x, None
    b, i = pl.program_id(0), pl.program_id(1)
    shape = x.shape
    rows = i * static.rows + lax.broadcasted_iota(jnp.int32, shape, 0)
    inner = rows * jnp.int32(static.hidden) + lax.broadcasted_iota(jnp.int32, shape, 1)
    keep = hashed.kept_int32(lead_ref[b], seed_ref[1], inner, static.threshold)
    dropped = jnp.where(keep, x * jnp.asarray(static.inv_keep, x.dtype), jnp.zeros((), x.dtype))
    return r + dropped, keep


def _normalised(static: _Static, s: Array) -> tuple[Array, Array]:
    """s [rows, width] (zeros in the padding) -> (x_hat float32 [rows, width], 1 / std float32 [rows, 1]),
    two-pass statistics over the hidden features."""
    s = s.astype(jnp.float32)
    centred = s - jnp.sum(s, axis=1, keepdims=True) / static.hidden
    lanes = _lanes(static, s.shape)
    if lanes is not None:
        centred = jnp.where(lanes, centred, 0.0)
    rstd = lax.rsqrt(jnp.sum(centred * centred, axis=1, keepdims=True) / static.hidden + static.epsilon)
    return centred * rstd, rstd


def _forward_kernel(lead_ref, seed_ref, x_ref, xb_ref, r_ref, scale_ref, bias_ref, y_ref, *, static: _Static):
    s, _ = _sum(static, lead_ref, seed_ref, x_ref, xb_ref, r_ref)
    x_hat, _ = _normalised(static, s)
    scale, bias = _load(static, scale_ref).astype(jnp.float32), _load(static, bias_ref).astype(jnp.float32)
    _store(static, y_ref, (x_hat * scale[None, :] + bias[None, :]).astype(y_ref.dtype))


def _backward_kernel(lead_ref, seed_ref, x_ref, xb_ref, r_ref, scale_ref, dy_ref, dx_ref, dr_ref, partial_ref, *,
                     static: _Static):
    s, keep = _sum(static, lead_ref, seed_ref, x_ref, xb_ref, r_ref)
    x_hat, rstd = _normalised(static, s)
    dy = _load(static, dy_ref).astype(jnp.float32)
    dx_hat = dy * _load(static, scale_ref).astype(jnp.float32)[None, :]  # 0 in the padding
    ds = rstd * (dx_hat - jnp.sum(dx_hat, axis=1, keepdims=True) / static.hidden
                 - x_hat * jnp.sum(dx_hat * x_hat, axis=1, keepdims=True) / static.hidden)
    ds = ds.astype(dr_ref.dtype)
    _store(static, dr_ref, ds)
    if keep is not None:
        ds = jnp.where(keep, ds * jnp.asarray(static.inv_keep, ds.dtype), jnp.zeros((), ds.dtype))
    _store(static, dx_ref, ds)
    # The block's shares of dscale and dbias, [2, width].
    _store(static, partial_ref.at[pl.ds(0, 1)], jnp.sum(dy * x_hat, axis=0, keepdims=True))
    _store(static, partial_ref.at[pl.ds(1, 1)], jnp.sum(dy, axis=0, keepdims=True))
    if static.x_bias:  # and of dx_bias
        _store(static, partial_ref.at[pl.ds(2, 1)], jnp.sum(ds.astype(jnp.float32), axis=0, keepdims=True))


def _call(kernel, static: _Static, batch: int, length: int, in_specs, out_specs, out_shape, name, *args):
    return pl.pallas_call(
        functools.partial(kernel, static=static), grid=(batch, length // static.rows), in_specs=in_specs,
        out_specs=out_specs, out_shape=out_shape, interpret=static.interpret, name=name,
        compiler_params=plgpu.CompilerParams(num_warps=4 if static.rows * static.width <= 4096 else 8, num_stages=1),
    )(*args)


def _per_device(static: _Static, call, outputs: int, batch: int):
    """`call(lead, seed, x, x_bias, residual, scale, bias_or_dy)` per device under `jax.shard_map` where the abstract
    mesh has `static.batch_axes` and they divide the batch (the rows split, the vectors whole), else `call` itself."""
    mesh = jax.sharding.get_abstract_mesh()
    if not static.batch_axes or mesh.empty or not set(static.batch_axes) <= set(mesh.axis_names):
        return call
    if batch % math.prod(mesh.shape[axis] for axis in static.batch_axes):
        return call  # e.g. the one-row batch of an initialisation: XLA runs the kernel on the whole
    rows, whole = P(static.batch_axes), P()
    out = P(static.batch_axes) if outputs == 1 else (P(static.batch_axes),) * outputs
    last = rows if outputs > 1 else whole  # dy, or the LayerNorm's bias
    return jax.shard_map(call, mesh=mesh, in_specs=(rows, whole, rows, whole, rows, whole, last), out_specs=out,
                         check_vma=False)


def _specs(static: _Static, batch: int):
    """BlockSpecs of lead hashes [B], seeds [2], a [rows, width] block of a [B, L, D] array, a [D] vector."""
    return (pl.BlockSpec((batch,), lambda b, i: (0,)), pl.BlockSpec((2,), lambda b, i: (0,)),
            pl.BlockSpec((None, static.rows, static.width), lambda b, i: (b, i, 0)),
            pl.BlockSpec((static.width,), lambda b, i: (0,)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(static: _Static, lead, seed, x, x_bias, residual, scale, bias):
    def call(lead, seed, x, x_bias, residual, scale, bias):
        batch, length, _ = x.shape
        lead_spec, seed_spec, block, vector = _specs(static, batch)
        return _call(_forward_kernel, static, batch, length,
                     [lead_spec, seed_spec, block, vector, block, vector, vector], block,
                     jax.ShapeDtypeStruct(x.shape, x.dtype), "dropout_add_layer_norm", lead, seed, x, x_bias, residual,
                     scale, bias)

    return _per_device(static, call, 1, x.shape[0])(lead, seed, x, x_bias, residual, scale, bias)


def _fused_fwd(static, lead, seed, x, x_bias, residual, scale, bias):
    out = _fused(static, lead, seed, x, x_bias, residual, scale, bias)
    return out, (lead, seed, x, x_bias, residual, scale, bias)


def _fused_bwd(static, saved, dy):
    lead, seed, x, x_bias, residual, scale, bias = saved
    sums = 3 if static.x_bias else 2  # dscale, dbias (, dx_bias)

    def call(lead, seed, x, x_bias, residual, scale, dy):
        batch, length, hidden = x.shape
        lead_spec, seed_spec, block, vector = _specs(static, batch)
        partial_spec = pl.BlockSpec((None, None, sums, static.width), lambda b, i: (b, i, 0, 0))
        partial = jax.ShapeDtypeStruct((batch, length // static.rows, sums, hidden), jnp.float32)
        return _call(_backward_kernel, static, batch, length,
                     [lead_spec, seed_spec, block, vector, block, vector, block], [block, block, partial_spec],
                     [jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype), partial],
                     "dropout_add_layer_norm_backward", lead, seed, x, x_bias, residual, scale, dy)

    dx, dr, partials = _per_device(static, call, 3, x.shape[0])(lead, seed, x, x_bias, residual, scale,
                                                                dy.astype(x.dtype))
    totals = jnp.sum(partials, axis=(0, 1))  # [sums, D]: one reduction of every block's partial sums
    dx_bias = totals[2].astype(x_bias.dtype) if static.x_bias else None
    return (None, None, dx, dx_bias, dr, totals[0].astype(scale.dtype), totals[1].astype(bias.dtype))


_fused.defvjp(_fused_fwd, _fused_bwd)


def rows_per_block(length: int) -> int:
    """The rows of one block: the largest power of two up to MAX_ROWS that divides the length."""
    rows = MAX_ROWS
    while length % rows:
        rows //= 2
    return rows


def check(dtype, hidden: int) -> str | None:
    """Why `dropout_add_layer_norm` would reject x of `dtype` with `hidden` features (one line), or None."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32)):
        return f"the fused LayerNorm takes bfloat16, float16 or float32, got {jnp.dtype(dtype)}"
    if not 1 <= hidden <= MAX_HIDDEN:
        return f"the fused LayerNorm takes 1 to {MAX_HIDDEN} features, got {hidden}"
    return None


def dropout_add_layer_norm(x: Array, residual: Array, scale: Array, bias: Array, *, epsilon: float,
                           x_bias: Array | None = None, dropout_rate: float = 0.0, seed: Array | None = None,
                           lead_hashes: Array | None = None, interpret: bool = False,
                           batch_axes: tuple[str, ...] = ()) -> Array:
    """LayerNorm(residual + dropout(x + x_bias)) with the bias, the dropout, the sum and the LayerNorm in one kernel
    (module docstring).

    Args:
      x: [B, L, D] bfloat16, float16 or float32, a sub-layer's output (the dropout's input).
      x_bias: [D] or None, a bias added to x in x's dtype before the dropout (the sub-layer's last dense layer's,
        so that its output is not written once more with the bias added); its gradient is one more partial sum.
      residual: [B, L, D], x's dtype: the sub-layer's input.
      scale, bias: [D] (float32 parameters, any float dtype), the LayerNorm's gamma and beta.
      epsilon: added to the variance (bert_config.json's layer_norm_eps).
      dropout_rate: in [0, 1); drawn as round(rate * 65536) / 65536, the kept values scaled by 1 / keep probability
        (`dropout.keep_mask`'s rule for the shape [B, L, D]).
      seed: uint32 [2] (`dropout.seeds(rng)`), needed when dropout_rate > 0.
      lead_hashes: int32 or uint32 [B], `dropout.lead_hashes(seed, rows of this shard)` when the call sees a slice
        of the batch (shard_map); None: this call's B is the whole batch.
      interpret: Pallas's interpreter (any backend; the CPU tests).
      batch_axes: mesh axes the batch is split over; where the abstract mesh has them, each device runs the kernels
        on its rows (`jax.shard_map`), drawing its rows of the global mask, and dscale / dbias add up every
        device's rows.

    Returns:
      y [B, L, D] in x's dtype.

    Raises:
      ValueError (one line): shapes or dtypes that differ, x not 3-D, scale, bias or x_bias not [D], a hidden size
        `check` refuses, dropout_rate outside [0, 1), dropout without a seed, lead_hashes not [B].
    """
    if x.ndim != 3 or residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"the fused LayerNorm needs x and residual of one shape [B, L, D] and dtype, got "
                         f"{x.shape} {x.dtype} and {residual.shape} {residual.dtype}")
    batch, length, hidden = x.shape
    if scale.shape != (hidden,) or bias.shape != (hidden,) or (x_bias is not None and x_bias.shape != (hidden,)):
        raise ValueError(f"the fused LayerNorm needs scale, bias and x_bias [{hidden}], got {scale.shape}, "
                         f"{bias.shape}, {None if x_bias is None else x_bias.shape}")
    problem = check(x.dtype, hidden)
    if problem:
        raise ValueError(problem)
    if not 0.0 <= dropout_rate < 1.0 or hashed.threshold(dropout_rate) >= hashed.RESOLUTION:
        raise ValueError(f"the fused LayerNorm needs dropout_rate in [0, 1), got {dropout_rate}")
    threshold = hashed.threshold(dropout_rate)
    if threshold:
        if seed is None:
            raise ValueError(f"the fused LayerNorm with dropout_rate={dropout_rate} needs a seed (dropout.seeds(rng))")
        seed = hashed.as_int32(seed).reshape(2)
        lead = (hashed.lead_hashes(seed, jnp.arange(batch, dtype=jnp.int32)) if lead_hashes is None
                else hashed.as_int32(lead_hashes))
        if lead.shape != (batch,):
            raise ValueError(f"the fused LayerNorm needs lead_hashes [B] = {(batch,)}, got {lead.shape}")
    else:
        seed, lead = jnp.zeros((2,), jnp.int32), jnp.zeros((batch,), jnp.int32)
    static = _Static(rows=rows_per_block(length), hidden=hidden, width=1 << (hidden - 1).bit_length(),
                     threshold=threshold, epsilon=float(epsilon), interpret=interpret, batch_axes=tuple(batch_axes),
                     x_bias=x_bias is not None)
    x_bias = jnp.zeros((hidden,), jnp.float32) if x_bias is None else x_bias
    return _fused(static, lead, seed, x, x_bias, residual, scale, bias)


def reference(x: Array, residual: Array, scale: Array, bias: Array, *, epsilon: float, x_bias: Array | None = None,
              dropout_rate: float = 0.0, seed: Array | None = None) -> Array:
    """What `dropout_add_layer_norm` computes, in plain jnp: x + x_bias in x's dtype, `dropout.apply(., seed, rate)`,
    added to residual in x's dtype, then LayerNorm with float32 two-pass statistics, y in x's dtype. Shapes as
    there."""
    x = x if x_bias is None else x + x_bias.astype(x.dtype)
    dropped = hashed.apply(x, seed, dropout_rate) if hashed.threshold(dropout_rate) else x
    s = (residual + dropped).astype(jnp.float32)
    centred = s - jnp.mean(s, axis=-1, keepdims=True)
    y = centred * lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + epsilon)
    return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)
