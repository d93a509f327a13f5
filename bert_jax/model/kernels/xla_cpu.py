"""The XLA:CPU kernel set: the same operations as `bert_jax.model.kernels.reference`, written for XLA's CPU
backend, where the plain forms compile to extra passes over memory or slow reductions.

Every function here has the reference's value (and, where it has one, gradient): tests/test_kernels.py
checks value and gradient against the reference in float32 and bfloat16. Each stays only while it wins
where it runs: `benchmarks/train_step.py --ablate` times the train step with each kernel swapped back
to its reference form.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from bert_jax.model.kernels import dropout, reference
from bert_jax.model.kernels.base import Kernels

Array = jax.Array
_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _normal_cdf(x: Array) -> Array:
    """Phi(x) = (1 + erf(x / sqrt(2))) / 2, the form of torch.nn.functional.gelu."""
    return 0.5 + 0.5 * jax.lax.erf(x * _SQRT_HALF)


@jax.custom_vjp
def gelu(x: Array) -> Array:
    """Exact (erf) GELU, x * Phi(x), in float32, x's dtype kept; the gradient g * (Phi(x) + x phi(x)) is
    one elementwise pass over the saved input. Autodiff lets XLA CPU share erf(x / sqrt 2) between the
    passes, written to memory in the forward and read back in the backward."""
    x32 = x.astype(jnp.float32)
    return (x32 * _normal_cdf(x32)).astype(x.dtype)


def _gelu_fwd(x):
    return gelu(x), x


def gelu_derivative(x32: Array) -> Array:
    """d GELU / dx = Phi(x) + x phi(x) of float32 x (any shape), float32."""
    return _normal_cdf(x32) + x32 * (jnp.exp(-0.5 * x32 * x32) * _INV_SQRT_2PI)


def _gelu_bwd(x, g):
    x32 = jax.lax.optimization_barrier(x).astype(jnp.float32)  # recompute erf here, not share it
    return ((g.astype(jnp.float32) * gelu_derivative(x32)).astype(x.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


@jax.custom_vjp
def _dot_transposed_input_grad(x: Array, kernel: Array) -> Array:
    return jnp.dot(x, kernel)


def _dot_fwd(x, kernel):
    return jnp.dot(x, kernel), (x, kernel)


def _dot_bwd(residuals, dy):
    x, kernel = residuals
    flat_x, flat_dy = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])  # [N, D_in], [N, D_out]
    x_t = jax.lax.optimization_barrier(flat_x.T)  # [D_in, N], written out once
    dkernel = jnp.dot(x_t, flat_dy, preferred_element_type=jnp.float32).astype(kernel.dtype)
    return jnp.dot(dy, kernel.T), dkernel


_dot_transposed_input_grad.defvjp(_dot_fwd, _dot_bwd)


def dot_general(x: Array, kernel: Array, dimension_numbers, precision=None, preferred_element_type=None) -> Array:
    """`jax.lax.dot_general` for `nn.Dense` (x [..., D_in] contracted with kernel [D_in, D_out]) whose
    kernel gradient multiplies a transposed copy of the input, x^T [D_in, N] @ dy [N, D_out], held apart
    from the forward by an optimization barrier. Left to itself XLA CPU transposes the wider dy instead
    (D_out = 4 D_in in the feed-forward block's first layer).

    Raises:
      ValueError: dimension numbers other than Dense's (last axis of x with the first of kernel),
        a precision or a preferred_element_type.
    """
    if tuple(map(tuple, dimension_numbers[0])) != ((x.ndim - 1,), (0,)) or any(dimension_numbers[1]) \
            or precision is not None or preferred_element_type is not None:
        raise ValueError("xla_cpu.dot_general supports only nn.Dense's contraction, without precision "
                         f"or preferred_element_type; got {dimension_numbers}, {precision}, {preferred_element_type}")
    return _dot_transposed_input_grad(x, kernel)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def tied_logits(x: Array, table: Array, bias: Array, dtype) -> Array:
    """x [..., D] @ table [V, D]^T + bias [V] -> float32 [..., V], as the reference. The gradient is
    written out: d bias is a matrix-vector product (ones @ d logits) instead of a reduction over the
    [N, V] cotangent, and d table = (x^T @ d logits)^T transposes the [D, V] result, not the [N, V]
    cotangent; XLA CPU runs the reduction and that transpose slowly."""
    return reference.tied_logits(x, table, bias, dtype)


def _tied_logits_fwd(x, table, bias, dtype):
    return tied_logits(x, table, bias, dtype), (x, table, bias)


def _tied_logits_bwd(dtype, residuals, dlogits):
    x, table, bias = residuals
    d32 = dlogits.reshape(-1, dlogits.shape[-1])  # [N, V] float32
    d = d32.astype(dtype)
    flat_x = x.reshape(-1, x.shape[-1]).astype(dtype)  # [N, D]
    dx = jnp.einsum("nv,vd->nd", d, table.astype(dtype), preferred_element_type=jnp.float32)
    dtable = jnp.einsum("nd,nv->dv", flat_x, d, preferred_element_type=jnp.float32).T  # [V, D]
    dbias = jnp.ones(d32.shape[:1], jnp.float32) @ d32  # [V]
    return dx.reshape(x.shape).astype(x.dtype), dtable.astype(table.dtype), dbias.astype(bias.dtype)


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


KERNELS = Kernels(name="xla_cpu", gelu=gelu, dot_general=dot_general, tied_logits=tied_logits,
                  dropout=dropout.HashedDropout)
