"""The TPU kernel set: the reference forms, with one kernel that compiles to a lighter TPU program.

  gelu   the exact (erf) GELU whose gradient recomputes Phi(x) and phi(x) from x instead of keeping
         autodiff's intermediates (`bert_jax.kernels.xla_cpu.gelu`, tested against autodiff of the
         plain formula in tests/test_kernels.py).

Measured with `benchmarks/aot_kernels.py --sets reference,reference+gelu` (BERT-Base, bfloat16, batch
256, per device and step; README: Kernels): fewer HBM bytes accessed on TPU v4-32 and v5e-16 in both
phases, and fewer FLOPs. Every other xla_cpu kernel moves as many or more bytes on v5e, so it is not
here. `model.kernels="auto"` resolves to this set when compiling for a TPU.
"""

from __future__ import annotations

import dataclasses

from bert_jax.kernels import reference, xla_cpu

KERNELS = dataclasses.replace(reference.KERNELS, name="tpu", gelu=xla_cpu.gelu)
