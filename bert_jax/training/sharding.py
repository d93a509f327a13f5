"""Device meshes and the one table that maps the model's logical axes to mesh axes.

Mesh axes are `('data', 'fsdp', 'tensor')`:
  data   - pure data parallelism: the batch is split, parameters replicated.
  fsdp   - the batch is split and parameters (their `embed` dimension) are sharded, gathered per layer
           (ZeRO-3 / fully sharded data parallelism).
  tensor - Megatron-style tensor parallelism: attention heads, the MLP's intermediate dimension and the
           vocabulary are split.

`LOGICAL_AXIS_RULES` is the only place where logical names (declared by `bert_jax.model.modeling` on every
parameter and on activations at block boundaries) meet mesh axes. Each logical name has one rule and no
array uses two names of the same mesh axis, so the layout does not depend on the order of the rules: the
model dimension is `embed` on parameters (sharded over fsdp) and `activation_embed` on activations
(replicated, their batch is on fsdp), e.g. the parameter ("vocab", "embed") becomes ("tensor", "fsdp")
and the activation ("batch", "length", "activation_embed") becomes (("data", "fsdp"), None, None).

Presets name the paper's pods (BERT-Base on 16 TPU chips, BERT-Large on 64) for TPU v3 (2 cores = 2 JAX
devices per chip), v4 (2 cores run as one "megacore" device per chip) and v5e (1 core, 1 device per chip),
plus "cpu" (every local device on `data`). Pod names count TensorCores for v3 and v4 (v4-32 is 16 chips)
and chips for v5e.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    # activations only
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("predictions", None),
    ("activation_embed", None),
    # parameters only
    ("embed", "fsdp"),
    ("embed_out", "tensor"),
    ("position", None),
    ("token_type", None),
    ("classes", None),
    ("layers", None),
    # both
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("kv", None),
)

# name: (data, fsdp, tensor); -1 = all remaining devices. A v3 chip shows 2 devices, v4 and v5e chips 1.
MESH_PRESETS: dict[str, tuple[int, int, int]] = {
    "cpu": (-1, 1, 1),
    "v3-32": (32, 1, 1),     # BERT-Base, 16 chips (paper)
    "v4-32": (16, 1, 1),     # 16 chips (32 TensorCores as 16 megacore devices)
    "v5e-16": (16, 1, 1),    # 16 chips
    "v3-128": (16, 8, 1),    # BERT-Large, 64 chips (paper)
    "v4-128": (8, 8, 1),     # 64 chips
    "v5e-64": (8, 8, 1),     # 64 chips
}


def mesh_shape(data: int, fsdp: int, tensor: int, num_devices: int) -> tuple[int, int, int]:
    """Resolves a -1 entry and checks that data * fsdp * tensor == num_devices.

    Raises:
      ValueError: (one line) more than one -1, a non-positive size, or a product that does not equal
        the device count.
    """
    shape = [data, fsdp, tensor]
    if shape.count(-1) > 1:
        raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))}: at most one axis may be -1")
    if any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))}: sizes must be positive (or one -1)")
    known = int(np.prod([s for s in shape if s != -1]))
    if -1 in shape:
        if num_devices % known:
            raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} does not divide the {num_devices} devices")
        shape[shape.index(-1)] = num_devices // known
    if int(np.prod(shape)) != num_devices:
        raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} needs {int(np.prod(shape))} devices, "
                         f"but {num_devices} are available")
    return tuple(shape)


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `Mesh` over `devices` (default: all) with axes ('data', 'fsdp', 'tensor').

    Uses `jax.experimental.mesh_utils.create_device_mesh` so that on TPU the tensor axis follows the
    fastest interconnect. Raises ValueError as `mesh_shape`.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(data, fsdp, tensor, len(devices))
    try:
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(shape, devices=devices)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, MESH_AXES)


def select_devices(num_devices: int) -> list[jax.Device] | None:
    """The first `num_devices` of jax.devices(), or None (every device) for 0: the configs' mesh.num_devices.

    Raises:
      ValueError: (one line) num_devices outside [0, jax.device_count()], or a subset asked for in a
        multi-process run (every process must take part).
    """
    if not 0 <= num_devices <= jax.device_count():
        raise ValueError(f"config.mesh.num_devices={num_devices} is not in [0, {jax.device_count()}] "
                         "(0: every device)")
    if num_devices not in (0, jax.device_count()) and jax.process_count() > 1:
        raise ValueError(f"config.mesh.num_devices={num_devices}: a multi-process run uses every device (0)")
    return jax.devices()[:num_devices] if num_devices else None


def preset_sizes(name: str) -> tuple[int, int, int]:
    """The (data, fsdp, tensor) sizes of a MESH_PRESETS name (-1 = all remaining devices).

    Raises:
      ValueError: (one line) `name` is not a preset, listing the known ones.
    """
    if name not in MESH_PRESETS:
        raise ValueError(f"mesh preset {name!r} is not one of {sorted(MESH_PRESETS)}")
    return MESH_PRESETS[name]


def preset_mesh(name: str, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh of a preset (see MESH_PRESETS); ValueError naming the preset when it is unknown or
    does not fit the devices."""
    sizes = preset_sizes(name)
    try:
        return make_mesh(*sizes, devices=devices)
    except ValueError as e:
        raise ValueError(f"mesh preset {name!r}: {e}") from None


def batch_axis_size(mesh: Mesh) -> int:
    """How many ways the batch is split: data * fsdp."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch(global_batch_size: int, mesh: Mesh) -> None:
    """ValueError (one line) when the global batch does not split evenly over data * fsdp."""
    ways = batch_axis_size(mesh)
    if global_batch_size % ways:
        raise ValueError(f"batch_size={global_batch_size} is not divisible by data*fsdp={ways} "
                         f"of mesh {dict(mesh.shape)}")


def rows_per_process(mesh: Mesh, global_batch_size: int, process_of=None) -> dict[int, int]:
    """How many distinct batch rows each process's devices hold under `batch_sharding`: {process: rows}.

    Every process feeds its own rows (`jax.make_array_from_process_local_data`), so a usable mesh gives
    each process global_batch_size / process_count of them. `process_of(device) -> int` defaults to
    `device.process_index` (a test can pretend devices live on several hosts).
    """
    process_of = process_of or (lambda d: d.process_index)
    indices = batch_sharding(mesh, 1).devices_indices_map((global_batch_size,))
    rows: dict[int, set] = {}
    for device, index in indices.items():
        start, stop, _ = index[0].indices(global_batch_size)
        rows.setdefault(process_of(device), set()).update(range(start, stop))
    return {p: len(r) for p, r in sorted(rows.items())}


def check_process_rows(mesh: Mesh, global_batch_size: int, process_of=None) -> None:
    """ValueError (one line) unless every process holds global_batch_size / process_count distinct rows
    (e.g. tensor=8 over two hosts of 4 devices: both hosts would hold every row)."""
    rows = rows_per_process(mesh, global_batch_size, process_of)
    wanted = global_batch_size // len(rows)
    if any(r != wanted for r in rows.values()):
        raise ValueError(f"mesh {dict(mesh.shape)} gives the {len(rows)} processes {sorted(set(rows.values()))} "
                         f"batch rows each, not batch_size/{len(rows)}={wanted}: the data and fsdp axes must "
                         "split the batch across processes")


def logical_sharding(logical_axes: Any, mesh: Mesh) -> Any:
    """Tree of logical PartitionSpecs -> tree of `NamedSharding`s under `LOGICAL_AXIS_RULES`."""
    return nn.logical_to_mesh_sharding(logical_axes, mesh, LOGICAL_AXIS_RULES)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Sharding of an input array [B, ...] of rank `ndim`: batch over data and fsdp, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *([None] * (ndim - 1))))


def axis_rules():
    """Context manager that makes `nn.with_logical_constraint` in the model use the rules table."""
    return nn.logical_axis_rules(LOGICAL_AXIS_RULES)


def check_divisible(abstract: Any, shardings: Any) -> None:
    """ValueError (one line, naming the array) when a sharded dimension does not divide evenly.

    abstract: tree of arrays / ShapeDtypeStructs; shardings: matching tree of NamedShardings. E.g. a
    vocabulary of 30522 on tensor=8 fails: pad `vocab_size` to a multiple (30528), ids are unaffected.
    """
    leaves = jax.tree_util.tree_flatten_with_path(abstract)[0]
    for (path, leaf), s in zip(leaves, jax.tree_util.tree_leaves(shardings)):
        for dim, axes in zip(leaf.shape, s.spec):
            names = (axes,) if isinstance(axes, str) else tuple(axes or ())
            ways = int(np.prod([s.mesh.shape[a] for a in names])) if names else 1
            if dim % ways:
                raise ValueError(f"{jax.tree_util.keystr(path)} of shape {leaf.shape} cannot be split {ways} ways "
                                 f"over mesh axes {names} (mesh {dict(s.mesh.shape)})")
