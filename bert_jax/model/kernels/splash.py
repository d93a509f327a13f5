"""The "splash" kernel set: the TPU set with attention computed by Pallas splash attention.

  attention   softmax(q k^T + mask) v by `jax.experimental.pallas.ops.tpu.splash_attention` (a blocked,
              online-softmax TPU kernel: the [L, L] scores are never written to HBM), with per-token
              segment ids: a token attends only to tokens of its segment. Packed rows pass their
              `segment_ids`; unpacked rows their attention_mask (real tokens one segment, padding
              another, whose outputs nothing reads).

Under a mesh (`jax.set_mesh`, as training runs) the kernel runs inside `jax.shard_map` over the batch
axes (data, fsdp) and the heads axis (tensor), each device on its own rows and heads; without one it runs
on the whole batch. The kernel has no dropout on the attention probabilities, so this set is for runs
with model.attention_probs_dropout_prob = 0 (or deterministic passes); the model raises otherwise.

On a CPU the kernel only runs in Pallas' interpret mode (`interpret_kernels()`, tests), which is how it
is checked against the reference attention; TPU programs compile ahead of time (`python -m bert_jax.aot
--config.model.kernels=splash`). Source: the splash-attention kernel of JAX (google/jax, Apache 2.0),
used through its public entry points.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from bert_jax.model.kernels import tpu
from bert_jax.model.kernels.base import BATCH_AXES, HEADS_AXIS

BLOCK = 128  # the kernel's default block along both sequence axes


def _local_attention(query, key, value, segment_ids, interpret: bool):
    """One device's rows: query, key, value [b, n, L, H] (query already scaled), segment_ids int32 [b, L]."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    heads, length = query.shape[1], query.shape[2]
    mask = masks.MultiHeadMask([masks.FullMask((length, length)) for _ in range(heads)])
    splash = kernel.make_splash_mha(mask, head_shards=1, q_seq_shards=1, interpret=interpret)

    def one(q, k, v, s):
        return splash(q, k, v, segment_ids=kernel.SegmentIds(q=s, kv=s))

    return jax.vmap(one)(query, key, value, segment_ids)


def attention(query: jax.Array, key: jax.Array, value: jax.Array, segment_ids: jax.Array, *,
              interpret: bool = False) -> jax.Array:
    """Segment-masked softmax attention by the splash kernel.

    Args:
      query: [B, N, L, H], already scaled by 1 / sqrt(H); key, value: [B, N, L, H] (same dtype).
      segment_ids: int32 [B, L]; query i attends to key j iff segment_ids[i] == segment_ids[j].
      interpret: run the Pallas kernel in interpret mode (any backend; slow), for tests on a CPU.

    Returns:
      [B, N, L, H] in query's dtype (the kernel accumulates the softmax in float32).

    A length that is not a multiple of the kernel's block (BLOCK = 128 tokens) is padded up to one, the
    padding in a segment of its own (-1), and cut off again.
    """
    length = query.shape[2]
    pad = -length % BLOCK
    if pad:
        query, key, value = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (query, key, value))
        segment_ids = jnp.pad(segment_ids, ((0, 0), (0, pad)), constant_values=-1)
    fn = functools.partial(_local_attention, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES + (HEADS_AXIS,)) <= set(mesh.axis_names):
        out = fn(query, key, value, segment_ids.astype(jnp.int32))
    else:
        qkv = P(BATCH_AXES, HEADS_AXIS, None, None)
        out = jax.shard_map(fn, mesh=mesh, in_specs=(qkv, qkv, qkv, P(BATCH_AXES, None)), out_specs=qkv,
                            check_vma=False)(query, key, value, segment_ids.astype(jnp.int32))
    return out[:, :, :length] if pad else out


KERNELS = dataclasses.replace(tpu.KERNELS, name="splash", attention=attention)


def interpret_kernels():
    """The splash set with the kernel in Pallas' interpret mode (runs on a CPU; for tests)."""
    return dataclasses.replace(KERNELS, attention=functools.partial(attention, interpret=True))
