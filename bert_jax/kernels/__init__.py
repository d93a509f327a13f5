"""Backend-specific kernels behind one switch, `model.kernels` ("auto" | "reference" | "xla_cpu" | "tpu" | "splash" |
"gpu").

`bert_jax.modeling` writes the paper's model in plain JAX/Flax; the few places where the compiler of
one backend needs help get their operation from `get(name)` (LayerNorm, the cross-entropy and argmax
had xla_cpu forms until the ablation on BERT-Base showed no win for them):

  operation            reference (every backend)                 xla_cpu (`bert_jax.kernels.xla_cpu`)
  gelu                 jax.nn.gelu(approximate=False), float32   hand-written gradient
  feed-forward dense   flax Dense's lax.dot_general              kernel gradient from x^T, held apart
  tied MLM logits      einsum + bias                             hand-written gradient
  dropout              flax.linen.Dropout (JAX PRNG)             counter-hash mask
  attention            the model's softmax(q k^T + mask) v       (splash set: Pallas splash attention;
                                                                  gpu set: cuDNN fused attention)

The "tpu" set (`bert_jax.kernels.tpu`) is the reference with xla_cpu's GELU, the one kernel that also
gives the TPU a lighter program (benchmarks/aot_kernels.py). The "splash" set (`bert_jax.kernels.splash`) is
the tpu set with Pallas splash attention (segment ids, under shard_map), for TPU runs without
attention-probability dropout; only chosen by name. The "gpu" set (`bert_jax.kernels.gpu`) is the reference
with cuDNN's fused attention where cuDNN takes the layer (bfloat16 / float16, no attention dropout;
`Kernels.attention_applies`) and the reference attention elsewhere. "auto" is "xla_cpu" when compiling for
the CPU, "tpu" for a TPU, "gpu" for a GPU, and "reference" for any other platform. Each kernel is tested against its
reference form (value and gradient, float32 and bfloat16, tests/test_kernels.py) and stays only while it
wins where it runs (benchmarks/train_step.py --ablate on the CPU, benchmarks/aot_kernels.py on TPUs).
"""

from __future__ import annotations

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


import contextlib  # noqa: E402
import dataclasses  # noqa: E402
from typing import Any, Callable, Iterator  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Kernels:
    """One kernel set: the operations `bert_jax.modeling` takes from here.

    Attributes:
      name: "reference", "xla_cpu", "tpu", "splash" or "gpu".
      gelu: x [...] any float dtype -> exact (erf) GELU x * Phi(x), computed in float32, x's dtype.
      dot_general: a `jax.lax.dot_general` stand-in for the feed-forward block's first `nn.Dense`
        (x [..., D] . kernel [D, I]); None for flax's own.
      tied_logits: (x [..., D], table [V, D], bias [V], compute dtype) -> float32 [..., V],
        x @ table^T + bias with x and table cast to the compute dtype.
      dropout: a flax module class, called `dropout(rate)(x, deterministic=...)`: inverted dropout on
        the "dropout" PRNG stream.
      attention: None (the model's own attention), or (query [B, N, L, H] scaled, key, value,
        segment_ids int32 [B, L]) -> context [B, N, L, H], attention within equal segment ids, no dropout.
      attention_applies: None (`attention` takes every layer, and a training pass with attention dropout is
        an error), or (compute dtype, head size H, length L, attention dropout active) -> whether
        `attention` takes the layer; where not, the model's own attention (the reference path).
    """

    name: str
    gelu: Callable
    dot_general: Callable | None
    tied_logits: Callable
    dropout: Any
    attention: Callable | None = None
    attention_applies: Callable[[Any, int, int, bool], bool] | None = None


def get(name: str, platform: str | None = None) -> Kernels:
    """The kernel set `resolve(name, platform)`.

    Raises:
      ValueError: as `resolve`.
    """
    resolved = resolve(name, platform)
    if resolved == "xla_cpu":
        from bert_jax.kernels import xla_cpu

        return xla_cpu.KERNELS
    if resolved == "tpu":
        from bert_jax.kernels import tpu

        return tpu.KERNELS
    if resolved == "splash":
        from bert_jax.kernels import splash

        return splash.KERNELS
    if resolved == "gpu":
        from bert_jax.kernels import gpu

        return gpu.KERNELS
    from bert_jax.kernels import reference

    return reference.KERNELS


@contextlib.contextmanager
def swapped(name: str, field: str) -> Iterator[None]:
    """Within the block, the kernel set `name` ("reference" or "xla_cpu") uses the other set's `field`
    (e.g. swapped("xla_cpu", "gelu"): xla_cpu with the reference GELU), for one-kernel A/B benchmarks;
    the set is restored on exit. Programs traced inside the block see the swap.

    Raises:
      ValueError: `name` is not "reference" or "xla_cpu", or `field` is not a `Kernels` operation.
    """
    from bert_jax.kernels import reference, xla_cpu

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
