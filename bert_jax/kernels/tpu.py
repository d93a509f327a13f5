"""The "tpu" kernel set: the reference forms with two kernels replaced.

  gelu     the exact (erf) GELU whose gradient recomputes Phi(x) and phi(x) from x instead of keeping
           autodiff's intermediates (`bert_jax.kernels.xla_cpu.gelu`; same value and gradient as the
           reference, tests/test_kernels.py).
  dropout  the counter-hash mask (`bert_jax.kernels.dropout.HashedDropout`): two random words per call
           instead of one threefry draw per element.

`model.kernels="auto"` resolves to this set when compiling for a TPU.
"""

from __future__ import annotations

import dataclasses

from bert_jax.kernels import dropout, reference, xla_cpu

KERNELS = dataclasses.replace(reference.KERNELS, name="tpu", gelu=xla_cpu.gelu, dropout=dropout.HashedDropout)
