"""The accelerators `bert_jax.aot` compiles for without having one: TPU slices and NVIDIA GPU machines.

A `Target` gives the compile-only devices of a named machine and the figures its roofline needs, per JAX
device: peak dense bfloat16 FLOP/s, HBM capacity and bandwidth, and the memory a run may use there.

TPU slices (`TOPOLOGIES`) come from libtpu's topologies (`jax.experimental.topologies`, platform "tpu"). A v3
chip's two TensorCores are two devices; a v4 or v5p chip runs its two TensorCores as one "megacore" device
(libtpu's `chip_config_name="megacore"`, its default on v5p); v5e and v6e chips have one core. Per device:
v3 core 61.5 bf16 TFLOP/s, 16 GiB, 450 GB/s; v4 chip 275 TFLOP/s, 32 GiB, 1200 GB/s; v5e chip 197 TFLOP/s,
16 GiB, 819 GB/s; v5p chip 459 TFLOP/s, 95 GiB, 2765 GB/s; v6e chip 918 TFLOP/s, 32 GiB, 1640 GB/s
(https://cloud.google.com/tpu/docs/v5p, https://cloud.google.com/tpu/docs/v6e). `--topology` takes these names
or gcloud's accelerator type of the same slice (`topology_for`: v5litepod-16 is v5e-16).

GPU machines (`GPUS`): `[HOSTSx][Nx]GPU`, e.g. "h100" (one GPU), "8xh100" (one host of eight), "2x8xa100-80gb"
(two hosts of eight). The compile-only devices come from jax's CUDA plugin (the `gpu-aot` extra: jax-cuda13-plugin
and -pjrt, nvidia-cuda-nvcc, nvidia-nvvm, nvidia-cudnn-cu13; no GPU or driver needed) given the GPU's
`stream_executor.GpuTargetConfigProto` (`target_config`), which this module writes from the `Gpu` figures below.
Those device figures (core counts, clocks, memory sizes and bandwidths, L2 and shared-memory sizes, compute
capabilities) are XLA's own, from the target configs OpenXLA publishes under
xla/backends/gpu/target_config/specs/ in github.com/openxla/xla (Apache License 2.0; a100_sxm_40, a100_sxm_80,
h100_sxm, h100_pcie, h200, b200); the peaks are NVIDIA's data sheets' dense bfloat16 figures (without
sparsity): A100 312, H100 SXM and H200 989, H100 PCIe 756, B200 2250 TFLOP/s.

The memory a GPU run may use is not the card's: jax's GPU client preallocates a fraction of it,
XLA_PYTHON_CLIENT_MEM_FRACTION (0.75 unless set), and a program must fit in that (`Target.memory_budget`). XLA's
GPU compiler plans each program (its scheduler's overlap, its rematerialisation) within the memory the run will
have, so the compile-only devices are told that budget, as a real run's compiler is.
"""

from __future__ import annotations

import dataclasses
import os
import re

from bert_jax.model import flops

GIB = 1024**3
DEFAULT_MEM_FRACTION = 0.75  # jax's GPU client's preallocation, XLA_PYTHON_CLIENT_MEM_FRACTION
SCHEDULER_SHARE = 0.8  # XLA's GPU scheduler plans within this share of a device's memory, given none by the client


@dataclasses.dataclass(frozen=True)
class Chip:
    """A TPU slice: its `jax.experimental.topologies` name (e.g. "v3:4x4x1"), figures per JAX device (peak bf16
    FLOP/s, HBM bytes, HBM bytes/s) and extra `get_topology_desc` keyword arguments (v4: megacore devices)."""

    topology: str
    peak_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    options: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Gpu:
    """An NVIDIA GPU as XLA's target config describes it (module docstring), and its dense bf16 peak.

    Attributes:
      description: the `jax.Device.device_kind` a real one reports, e.g. "NVIDIA H100 80GB HBM3".
      compute_capability: (major, minor), e.g. (9, 0); sm_90a and sm_100a get their accelerated features.
      cores: streaming multiprocessors; fpus_per_core: FP32 lanes per SM; clock_ghz: SM clock, GHz.
      memory_bytes: device memory, bytes; bandwidth: HBM bytes/s; l2_bytes: L2 cache, bytes.
      shared_per_core, shared_per_block_optin: shared memory per SM and per block (opt-in), bytes.
      peak_flops: dense bfloat16 FLOP/s.
    """

    description: str
    compute_capability: tuple[int, int]
    cores: int
    fpus_per_core: int
    clock_ghz: float
    memory_bytes: int
    bandwidth: float
    l2_bytes: int
    shared_per_core: int
    shared_per_block_optin: int
    peak_flops: float

    def target_config(self, memory_bytes: int | None = None) -> str:
        """This GPU's `stream_executor.GpuTargetConfigProto` in text format (what `get_topology_desc` takes), with
        `memory_bytes` as its device memory when given (default `memory_bytes` of the card)."""
        major, minor = self.compute_capability
        accelerated = "ACCELERATED_FEATURES" if major >= 9 else "NONE"
        return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {self.shared_per_core}
  threads_per_core_limit: 2048
  core_count: {self.cores}
  fpus_per_core: {self.fpus_per_core}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(self.bandwidth)}
  l2_cache_size: {self.l2_bytes}
  clock_rate_ghz: {self.clock_ghz}
  device_memory_size: {memory_bytes or self.memory_bytes}
  shared_memory_per_block_optin: {self.shared_per_block_optin}
  cuda_compute_capability {{
    major: {major}
    minor: {minor}
    feature_extension: {accelerated}
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 10
  patch: 0
}}
device_description_str: "{self.description}"
"""


_PEAK = flops.PEAK_BF16_FLOPS_PER_DEVICE
GPUS = {
    "a100-40gb": Gpu("NVIDIA A100-SXM4-40GB", (8, 0), 108, 64, 1.41, 42331013120, 1555.2e9, 41943040, 167936,
                     166912, _PEAK["NVIDIA A100-SXM4-40GB"]),
    "a100-80gb": Gpu("NVIDIA A100-SXM4-80GB", (8, 0), 108, 64, 1.41, 85100068864, 2039.04e9, 41943040, 167936,
                     166912, _PEAK["NVIDIA A100-SXM4-80GB"]),
    "h100-sxm": Gpu("NVIDIA H100 80GB HBM3", (9, 0), 132, 128, 1.98, 84942979072, 3352.32e9, 52428800, 233472,
                    232448, _PEAK["NVIDIA H100 80GB HBM3"]),
    "h100-pcie": Gpu("NVIDIA H100 PCIe", (9, 0), 114, 128, 1.755, 84942979072, 2039.04e9, 52428800, 233472, 232448,
                     _PEAK["NVIDIA H100 PCIe"]),
    "h200": Gpu("NVIDIA H200", (9, 0), 132, 128, 1.98, 151397597184, 4800e9, 52428800, 233472, 232448,
                _PEAK["NVIDIA H200"]),
    "b200": Gpu("NVIDIA B200", (10, 0), 148, 128, 1.965, 191514411008, 7672.32e9, 132644864, 233472, 232448,
                _PEAK["NVIDIA B200"]),
}
GPU_ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb"}  # the SXM H100; the 80 GB A100

_V3, _V5E, _V4 = _PEAK["TPU v3"], _PEAK["TPU v5 lite"], _PEAK["TPU v4"]
_V5P, _V6E = _PEAK["TPU v5p"], _PEAK["TPU v6 lite"]
_MEGACORE = (("chip_config_name", "megacore"),)
TOPOLOGIES = {
    "v3-32": Chip("v3:4x4x1", _V3, 16 * GIB, 450e9),     # 16 chips, 32 cores: BERT-Base (paper)
    "v3-128": Chip("v3:8x8x1", _V3, 16 * GIB, 450e9),    # 64 chips: BERT-Large (paper)
    "v3-8": Chip("v3:2x2x1", _V3, 16 * GIB, 450e9),
    # v4 names count TensorCores, like v3's: v4-32 is 16 chips, each one megacore JAX device.
    "v4-32": Chip("v4:2x2x4", _V4, 32 * GIB, 1200e9, _MEGACORE),    # 16 chips
    "v4-128": Chip("v4:4x4x4", _V4, 32 * GIB, 1200e9, _MEGACORE),   # 64 chips
    "v5e-16": Chip("v5e:4x4", _V5E, 16 * GIB, 819e9),      # 16 chips, one core each
    "v5e-64": Chip("v5e:8x8", _V5E, 16 * GIB, 819e9),      # 64 chips
    # v5p names count TensorCores like v4's (v5p-32 is 16 chips, one megacore device each); v6e names chips.
    "v5p-32": Chip("v5p:2x2x4", _V5P, 95 * GIB, 2765e9),   # 16 chips
    "v6e-16": Chip("v6e:4x4", _V6E, 32 * GIB, 1640e9),     # 16 chips
}

# gcloud's accelerator-type generations (`gcloud compute tpus tpu-vm create --accelerator-type GEN-N`) whose
# name differs here: a v5e slice of N chips is "v5litepod-N" there. v2, v3, v4, v5p and v6e are spelled alike.
GCLOUD_GENERATIONS = {"v5litepod": "v5e"}


@dataclasses.dataclass(frozen=True)
class Target:
    """A machine to compile for: `name` as given, `platform` ("tpu" | "gpu"), JAX devices `hosts` x
    `per_host`, and per device the peak bf16 FLOP/s, HBM bytes and HBM bytes/s; `chip` (TPU) or `gpu` (GPU)."""

    name: str
    platform: str
    hosts: int
    per_host: int
    peak_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    chip: Chip | None = None
    gpu: Gpu | None = None

    @property
    def num_devices(self) -> int:
        return self.hosts * self.per_host

    def memory_budget(self) -> tuple[float, str]:
        """(bytes a program may use per device, how that figure is made): a TPU's HBM; a GPU's memory times jax's
        preallocated fraction (XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 unless set).

        Raises:
          ValueError: XLA_PYTHON_CLIENT_MEM_FRACTION is not a number in (0, 1].
        """
        if self.platform != "gpu":
            return self.hbm_bytes, f"{self.hbm_bytes / GIB:.0f} GiB of HBM"
        text = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "")
        try:
            fraction = float(text) if text else DEFAULT_MEM_FRACTION
        except ValueError:
            fraction = -1.0
        if not 0 < fraction <= 1:
            raise ValueError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={text!r} is not a fraction in (0, 1]")
        return self.hbm_bytes * fraction, (f"{fraction:.0%} of {self.hbm_bytes / GIB:.1f} GiB, jax's preallocation "
                                           "(XLA_PYTHON_CLIENT_MEM_FRACTION)")

    def devices(self) -> list:
        """The compile-only devices (TPU: needs libtpu; GPU: jax's CUDA plugin, the `gpu-aot` extra).

        Raises:
          ImportError: the compiler for this platform is not installed (one line saying what to install).
        """
        import importlib.util

        from jax.experimental import topologies

        if self.platform == "tpu":
            if importlib.util.find_spec("libtpu") is None:
                raise ImportError("libtpu is not installed, so there is no TPU compiler (pip install -e '.[tpu]')")
            return topologies.get_topology_desc(topology_name=self.chip.topology, platform="tpu",
                                                **dict(self.chip.options)).devices
        if importlib.util.find_spec("jax_plugins.xla_cuda13") is None and \
                importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
            raise ImportError("jax's CUDA plugin is not installed, so there is no GPU compiler "
                              "(pip install -e '.[gpu-aot]')")
        # XLA's GPU scheduler and rematerialisation plan a program within a memory limit: on a real GPU the
        # allocator's (jax passes its bytes_limit as the build's device_memory_size), without one 80% of the target
        # config's device memory. Telling it budget / 0.8 makes the compile-only program plan within the budget.
        planned = int(self.memory_budget()[0] / SCHEDULER_SHARE)
        try:
            return topologies.get_topology_desc(platform="cuda", target_config=self.gpu.target_config(planned),
                                                topology=f"1x{self.hosts}x{self.per_host}").devices
        except NotImplementedError:
            raise ImportError("jax's CUDA plugin did not load, so there is no GPU compiler (on a machine without a "
                              "GPU run with JAX_PLATFORMS=cpu; python -m bert_jax.aot sets it)") from None


def topology_for(accelerator_type: str) -> str:
    """The `TOPOLOGIES` name of a slice given as gcloud names it: the one mapping between the launcher's
    `--accelerator_type` and `--topology` here (a TOPOLOGIES name maps to itself).

    Args:
      accelerator_type: e.g. "v3-32", "v4-32", "v5litepod-16", "v5p-32", "v6e-16" (gcloud's
        `--accelerator-type`: GENERATION-N, N TensorCores for v2, v3, v4 and v5p, chips for v5e and v6e),
        or a TOPOLOGIES name such as "v5e-16".

    Returns:
      A key of TOPOLOGIES, e.g. "v5e-16" for "v5litepod-16".

    Raises:
      ValueError: (one line) no topology here for that slice, naming the known ones in both spellings.
    """
    generation, sep, size = accelerator_type.partition("-")
    name = f"{GCLOUD_GENERATIONS.get(generation, generation)}-{size}" if sep else accelerator_type
    if name not in TOPOLOGIES:
        raise ValueError(f"--topology {accelerator_type!r} is not one of {sorted(TOPOLOGIES)} (or gcloud's "
                         f"accelerator type of one: {', '.join(sorted(accelerator_type_of(t) for t in TOPOLOGIES))})"
                         f", nor a GPU machine [HOSTSx][Nx]GPU with GPU one of {sorted(GPUS)}")
    return name


def accelerator_type_of(topology: str) -> str:
    """A TOPOLOGIES name -> gcloud's accelerator type of that slice ("v5e-16" -> "v5litepod-16"); the inverse
    of `topology_for` (str -> str, no check)."""
    generation, _, size = topology.partition("-")
    gcloud = {ours: theirs for theirs, ours in GCLOUD_GENERATIONS.items()}.get(generation, generation)
    return f"{gcloud}-{size}"


def target(name: str) -> Target:
    """The `Target` a `--topology` value names: a TPU slice (`topology_for`) or a GPU machine `[HOSTSx][Nx]GPU`
    ("h100", "8xh100-sxm", "2x8xa100-80gb"; GPU a key of GPUS or GPU_ALIASES, case-insensitive).

    Raises:
      ValueError: (one line) neither, naming the known slices and GPUs.
    """
    m = re.fullmatch(r"(?:(\d+)x)?(?:(\d+)x)?([a-z0-9\-]+)", name.strip().lower())
    if m and (GPU_ALIASES.get(m.group(3), m.group(3)) in GPUS):
        counts = [int(c) for c in m.groups()[:2] if c is not None]
        hosts, per_host = (counts if len(counts) == 2 else [1] + (counts or [1]))
        if hosts < 1 or per_host < 1:
            raise ValueError(f"--topology {name!r}: host and GPU counts must be at least 1")
        gpu = GPUS[GPU_ALIASES.get(m.group(3), m.group(3))]
        return Target(name, "gpu", hosts, per_host, gpu.peak_flops, gpu.memory_bytes, gpu.bandwidth, gpu=gpu)
    chip = TOPOLOGIES[topology_for(name)]
    return Target(topology_for(name), "tpu", 1, 0, chip.peak_flops, chip.hbm_bytes, chip.hbm_bandwidth, chip=chip)
