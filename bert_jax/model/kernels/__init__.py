"""Backend-specific operations behind one switch, `model.kernels` ("auto" | "reference" | "xla_cpu" | "tpu" |
"splash" | "gpu").

`bert_jax.model.modeling` writes the model in plain JAX/Flax and takes these operations from `get(name)`, a
`Kernels` record; everything else (LayerNorm, the losses) is the same in every set:

  operation            reference (every backend)                 other sets
  gelu                 jax.nn.gelu(approximate=False), float32   xla_cpu, tpu, splash: hand-written gradient
  feed-forward dense   flax Dense's lax.dot_general              xla_cpu: kernel gradient from x^T, held apart
  tied MLM logits      einsum + bias                             xla_cpu: hand-written gradient
  dropout              flax.linen.Dropout (JAX PRNG, one draw    xla_cpu, gpu: counter-hash mask
                       per element)                              (`bert_jax.model.kernels.dropout`)
  attention            the model's softmax(q k^T + mask) v       splash: Pallas splash attention (TPU);
                                                                 gpu: cuDNN fused attention

Sets:
  reference  the plain forms (`bert_jax.model.kernels.reference`); the truth every other set is tested against.
  xla_cpu    forms written for XLA's CPU backend (`bert_jax.model.kernels.xla_cpu`).
  tpu        the reference with xla_cpu's GELU (`bert_jax.model.kernels.tpu`).
  splash     the tpu set with Pallas splash attention (`bert_jax.model.kernels.splash`), for TPU runs without
             attention-probability dropout (the model raises ValueError otherwise); only chosen by name.
  gpu        the reference with the hashed dropout and cuDNN's fused attention where cuDNN takes the layer
             (bfloat16 / float16, no attention dropout: `Kernels.attention_applies`), the reference attention
             elsewhere (`bert_jax.model.kernels.gpu`).
  auto       "xla_cpu" when compiling for the CPU, "tpu" for a TPU, "gpu" for a GPU, "reference" for any
             other platform.

Every kernel has its reference form's value and gradient (float32 and bfloat16, tests/test_kernels.py).
The measurements behind each set are in benchmarks/README.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from bert_jax.model.kernels.base import Kernels

KERNELS = ("auto", "reference", "xla_cpu", "tpu", "splash", "gpu")


def resolve(name: str, platform: str | None = None) -> str:
    """The kernel set `name` stands for on `platform` -> "reference", "xla_cpu", "tpu", "splash" or "gpu".

    Args:
      name: one of `KERNELS`.
      platform: the platform compiled for ("cpu", "tpu", "gpu"); default `jax.default_backend()`.
        Ahead-of-time compilation for a TPU from a CPU host must name "tpu".

    Raises:
      ValueError: a name not in `KERNELS`.
    """
    if name not in KERNELS:
        raise ValueError(f"model.kernels={name!r} is not one of {list(KERNELS)}")
    if name != "auto":
        return name
    if platform is None:
        import jax

        platform = jax.default_backend()
    return {"cpu": "xla_cpu", "tpu": "tpu", "gpu": "gpu", "cuda": "gpu"}.get(platform, "reference")


def get(name: str, platform: str | None = None) -> Kernels:
    """The kernel set `resolve(name, platform)`.

    Raises:
      ValueError: as `resolve`.
    """
    resolved = resolve(name, platform)
    if resolved == "xla_cpu":
        from bert_jax.model.kernels import xla_cpu

        return xla_cpu.KERNELS
    if resolved == "tpu":
        from bert_jax.model.kernels import tpu

        return tpu.KERNELS
    if resolved == "splash":
        from bert_jax.model.kernels import splash

        return splash.KERNELS
    if resolved == "gpu":
        from bert_jax.model.kernels import gpu

        return gpu.KERNELS
    from bert_jax.model.kernels import reference

    return reference.KERNELS


@contextlib.contextmanager
def swapped(name: str, field: str) -> Iterator[None]:
    """Within the block, the kernel set `name` ("reference" or "xla_cpu") uses the other set's `field`
    (e.g. swapped("xla_cpu", "gelu"): xla_cpu with the reference GELU), for one-kernel A/B benchmarks;
    the set is restored on exit. Programs traced inside the block see the swap.

    Raises:
      ValueError: `name` is not "reference" or "xla_cpu", or `field` is not a `Kernels` operation.
    """
    from bert_jax.model.kernels import reference, xla_cpu

    modules = {"reference": (reference, xla_cpu), "xla_cpu": (xla_cpu, reference)}
    operations = [f.name for f in dataclasses.fields(Kernels) if f.name != "name"]
    if name not in modules or field not in operations:
        raise ValueError(f"cannot swap {field!r} in kernel set {name!r}: sets {list(modules)}, operations {operations}")
    own, other = modules[name]
    original = own.KERNELS  # `get` reads <module>.KERNELS at every call
    own.KERNELS = dataclasses.replace(original, **{field: getattr(other.KERNELS, field)})
    try:
        yield
    finally:
        own.KERNELS = original
