"""Dropout whose keep mask is a counter-based hash of each element's index: the dropout of the xla_cpu and gpu
kernel sets.

Inverted dropout (Srivastava et al. 2014; the original BERT's `dropout`: keep with probability 1 - rate,
scale the kept by 1 / (1 - rate)) draws one random number per element with the JAX PRNG (`flax.linen.Dropout`,
threefry by default): about 20 rounds of 32-bit arithmetic per pair of elements, which is what a BERT step's
attention-probability dropout ([B, N, L, L] per layer) costs on every backend. Here only two 32-bit seeds are
drawn per call; each element's bits are two rounds of MurmurHash3's finaliser over (seeds, index), integer
operations that XLA fuses into the consumer (on a TPU the program moves slightly more HBM bytes than with
threefry, so the tpu set keeps JAX's: benchmarks/README.md).

Properties (tests/test_kernels.py): keep probability 1 - round(rate * 65536) / 65536 (0.8999939 for 0.1);
masks of neighbouring elements, of the calls of one step (a new key each: flax's `make_rng`, split per layer
by `nn.scan`) and of successive steps uncorrelated; the mask is a function of the key and the element's global
index only, so it is the same under any sharding and bit-exact on resume (the key comes from the step's rng).
`bert_jax.model.kernels.flash_gpu` draws the same mask inside its fused attention.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

# The keep threshold's resolution: an element is kept when the top 16 bits of its hash are at least
# round(rate * RESOLUTION).
RESOLUTION = 65536


def _fmix32(h: Array) -> Array:
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def seeds(rng: Array) -> Array:
    """The two 32-bit seeds of one dropout call: uint32 [2] drawn from `rng` (any PRNG key)."""
    return jax.random.bits(rng, (2,), jnp.uint32)


def threshold(rate: float) -> int:
    """The drop threshold of `rate`: an element is dropped when the top 16 bits of its hash are below it."""
    return round(rate * RESOLUTION)


def hash_bits(seed: Array, lead: Array, inner: Array) -> Array:
    """The 16 bits (uint32 in [0, 65536)) that decide an element: h = fmix32(fmix32(lead ^ s0) ^ (inner *
    0x9E3779B9 + s1)) >> 16, with seed uint32 [2] = (s0, s1), `lead` uint32 the element's index over the
    leading dims and `inner` uint32 its index over the last two (row * columns + column); lead and inner
    broadcast. Pure jnp integer arithmetic, usable inside a Pallas kernel."""
    h = _fmix32(_fmix32(lead ^ seed[0]) ^ (inner * jnp.uint32(0x9E3779B9) + seed[1]))
    return h >> 16


def keep_mask(rng: Array, shape: tuple[int, ...], rate: float) -> tuple[Array, float]:
    """Keep mask of inverted dropout from a counter-based hash -> (bool mask of `shape`, keep probability).

    `seeds(rng)` are drawn once; element i is kept when `hash_bits` of its index is at least
    `threshold(rate)`, so the keep probability is 1 - round(rate * RESOLUTION) / RESOLUTION (0.8999939 for
    rate 0.1). A 1-D shape is one row; an N-D shape's last two dims are the rows and columns. The mask depends
    only on the key and the global index, so it is the same under any sharding.

    Raises:
      ValueError: a 0-d shape.
    """
    return seeded_keep_mask(seeds(rng), shape, rate)


def seeded_keep_mask(seed: Array, shape: tuple[int, ...], rate: float) -> tuple[Array, float]:
    """`keep_mask` from its two seeds (uint32 [2], `seeds(rng)`) instead of the key.

    Raises:
      ValueError: a 0-d shape.
    """
    if not shape:
        raise ValueError("dropout needs an input with at least one axis")
    lead = math.prod(shape[:-2]) if len(shape) > 2 else 1
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape[-2:]
    outer = jax.lax.broadcasted_iota(jnp.uint32, (lead, 1, 1), 0)
    inner = (jax.lax.broadcasted_iota(jnp.uint32, (1, rows, cols), 1) * jnp.uint32(cols)
             + jax.lax.broadcasted_iota(jnp.uint32, (1, rows, cols), 2))
    drop = threshold(rate)
    return (hash_bits(seed, outer, inner) >= drop).reshape(shape), 1.0 - drop / RESOLUTION


# The hash in int32 two's-complement arithmetic (logical shifts, wrapping products), which has the uint32 formula's
# bits: the form Pallas kernels compute it in (`flash_gpu`, `layer_norm_gpu`; Triton's unsigned support is partial).
_GOLDEN_INT32 = 0x9E3779B9 - (1 << 32)
_FMIX_1_INT32 = 0x85EBCA6B - (1 << 32)
_FMIX_2_INT32 = 0xC2B2AE35 - (1 << 32)


def fmix32_int32(h: Array) -> Array:
    """`_fmix32` on int32 bit patterns: the same bits as the uint32 finaliser of the same bits."""
    h = h ^ jax.lax.shift_right_logical(h, jnp.int32(16))
    h = h * jnp.int32(_FMIX_1_INT32)
    h = h ^ jax.lax.shift_right_logical(h, jnp.int32(13))
    h = h * jnp.int32(_FMIX_2_INT32)
    return h ^ jax.lax.shift_right_logical(h, jnp.int32(16))


def as_int32(x: Array) -> Array:
    """Seeds or lead hashes (uint32 or int32) as int32 bit patterns.

    Raises:
      ValueError: another dtype.
    """
    x = jnp.asarray(x)
    if x.dtype == jnp.int32:
        return x
    if x.dtype == jnp.uint32:
        return jax.lax.bitcast_convert_type(x, jnp.int32)
    raise ValueError(f"seeds and lead hashes must be uint32 or int32, got {x.dtype}")


def lead_hashes(seed: Array, lead: Array) -> Array:
    """The per-lead half of the hash, int32 fmix32(lead ^ s0), for int32 `lead` indices (any shape) and seed
    uint32 or int32 [2]."""
    return fmix32_int32(lead ^ as_int32(seed)[0])


def kept_int32(lead_hash: Array, s1: Array, inner: Array, drop: int) -> Array:
    """Whether the elements at int32 `inner` indices are kept (bool, broadcast shape): `hash_bits` >= drop, from
    the lead hash (`lead_hashes`) and the seed's second word s1, in int32 arithmetic."""
    h = fmix32_int32(lead_hash ^ (inner * jnp.int32(_GOLDEN_INT32) + s1))
    return jax.lax.shift_right_logical(h, jnp.int32(16)) >= jnp.int32(drop)


def apply(x: Array, seed: Array, rate: float) -> Array:
    """Inverted dropout of x (any shape, at least 1-D, floating; x's dtype kept) with
    `seeded_keep_mask(seed, x.shape, rate)`: the kept elements scaled by 1 / keep probability, the rest 0."""
    keep, keep_prob = seeded_keep_mask(seed, x.shape, rate)
    return jnp.where(keep, x * jnp.asarray(1.0 / keep_prob, x.dtype), jnp.zeros((), x.dtype))


class HashedDropout(nn.Module):
    """Inverted dropout on the "dropout" PRNG stream with the mask of `keep_mask`: drops with
    probability round(rate * RESOLUTION) / RESOLUTION and scales the rest by 1 / keep probability."""

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        """x: any shape (at least 1-D), floating dtype -> same shape and dtype; x itself when deterministic
        or rate is 0, zeros when rate is 1.

        Raises (only when applied):
          flax.errors.InvalidRngError: no "dropout" PRNG stream (`rngs={"dropout": key}`).
          ValueError: a 0-d x.
        """
        if deterministic or self.rate == 0.0:
            return x
        if self.rate >= 1.0 or threshold(self.rate) == RESOLUTION:
            return jnp.zeros_like(x)
        if not x.shape:
            raise ValueError("dropout needs an input with at least one axis")
        return apply(x, seeds(self.make_rng("dropout")), self.rate)
