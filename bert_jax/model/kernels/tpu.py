"""The "tpu" kernel set: the reference forms with one kernel replaced.

  gelu   the exact (erf) GELU whose gradient recomputes Phi(x) and phi(x) from x instead of keeping
         autodiff's intermediates (`bert_jax.model.kernels.xla_cpu.gelu`; same value and gradient as the
         reference, tests/test_kernels.py).

Dropout stays the reference's (JAX's partitionable threefry): the counter-hash mask of the other sets makes
the TPU program move more HBM bytes per step (benchmarks/aot_kernels.py, benchmarks/README.md).

`model.kernels="auto"` resolves to this set when compiling for a TPU.
"""

from __future__ import annotations

import dataclasses

from bert_jax.model.kernels import reference, xla_cpu

KERNELS = dataclasses.replace(reference.KERNELS, name="tpu", gelu=xla_cpu.gelu)
