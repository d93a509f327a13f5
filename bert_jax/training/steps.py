"""The step machinery of every job: pre-training, each fine-tuning task and ahead-of-time compilation.

  mesh         `make_mesh(config.mesh)`: a preset of `sharding.MESH_PRESETS` or data/fsdp/tensor sizes.
  optimizer    `create_optimizer(config)`: `optim.create_optimizer` from a pre-training or fine-tuning config.
  state        `state_shardings(init)` -> `create_state(init, mesh, shardings)`: `jax.eval_shape` ->
               logical partition specs -> `jax.jit(init, out_shardings=...)`, never materialised unsharded.
  step         `train_step(state, batch, loss_fn=..., grad_accum_steps=k)`: one optimizer step for any
               loss, k micro-batches summing to the gradient of the whole batch;
               `jit_train_step` compiles it with in/out shardings and the state donated, as one program or
               (shared_update) as `gradients` per batch shape plus one `apply_gradients` for all shapes.
  timer        `Chrono`: steps and seconds between reports (a `Lap`), pauses (checkpoints, evaluations) left out.

Dimension letters as in WORKSPACE.md: B batch, L length.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import flax.struct
import flax.traverse_util
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax.training import optim, sharding

Batch = Mapping[str, jax.Array]
# loss_fn(params, batch, dropout_rng, denominators) -> (float32 scalar loss, {name: float32 scalar}).
LossFn = Callable[[Any, Batch, jax.Array, Any], tuple[jax.Array, dict[str, jax.Array]]]


@flax.struct.dataclass
class TrainState:
    """Everything a step changes.

    Attributes:
      step: int32 scalar, optimizer steps taken.
      params: the model's parameter tree (float32 unless param_dtype says otherwise).
      opt_state: optax state (AdamW moments, schedule count).
      rng: uint32 [2] base PRNG key; the dropout key of step s is fold_in(rng, s).
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


# ----------------------------------------------------------------------------- mesh and optimizer


def make_mesh(mesh_config: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
    """The mesh a config's `mesh` field describes.

    Args:
      mesh_config: `config.mesh`: `preset` (optional, a `sharding.MESH_PRESETS` name; wins when set),
        else the sizes `data`, `fsdp`, `tensor` (one may be -1); `num_devices` (optional, 0: all).
      devices: the devices to lay out (e.g. a TPU topology's compile-only devices); default the first
        `num_devices` of `jax.devices()`.

    Raises:
      ValueError: (one line) an unknown preset, sizes that do not fit the devices, or num_devices
        outside [0, jax.device_count()] (`sharding.select_devices`).
    """
    if devices is None:
        devices = sharding.select_devices(mesh_config.get("num_devices") or 0)
    if mesh_config.get("preset"):
        return sharding.preset_mesh(mesh_config.preset, devices)
    return sharding.make_mesh(mesh_config.data, mesh_config.fsdp, mesh_config.tensor, devices)


def create_optimizer(config: ml_collections.ConfigDict,
                     total_steps: int | None = None) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """`optim.create_optimizer` from a config: one update per train step (accumulation is in `train_step`).

    Args:
      config: learning_rate and weight_decay; total_steps (pre-training) or the `total_steps` argument;
        warmup_steps, or warmup_proportion of the total (fine-tuning, as the original's run_squad.py);
        optional optimizer ("adamw"), adam_b1 (0.9), adam_b2 (0.999), adam_eps (1e-6), max_grad_norm (1.0).
      total_steps: optimizer steps of the schedule; default config.total_steps.

    Returns:
      (transformation, schedule); schedule(step) is the learning rate (float32) at an optimizer step.

    Raises:
      ValueError: an unknown optimizer name or a bad schedule (from `optim.create_optimizer`).
    """
    total = config.total_steps if total_steps is None else total_steps
    warmup = config.warmup_steps if "warmup_steps" in config else int(config.warmup_proportion * total)
    return optim.create_optimizer(
        learning_rate=config.learning_rate, warmup_steps=warmup, total_steps=total,
        optimizer=config.get("optimizer", "adamw"), weight_decay=config.weight_decay, b1=config.get("adam_b1", 0.9),
        b2=config.get("adam_b2", 0.999), eps=config.get("adam_eps", 1e-6),
        max_grad_norm=config.get("max_grad_norm", 1.0))


# ----------------------------------------------------------------------------- sharded state


def state_init(model: nn.Module, tx: optax.GradientTransformation, seed: int, *inputs: jax.Array,
               **kwargs: jax.Array) -> Callable[[], TrainState]:
    """A function of no arguments -> the fresh TrainState of `model`, its params still boxed with their
    logical axis names (nn.Partitioned), for `state_shardings` and `create_state`.

    `inputs` / `kwargs` are dummy model inputs (e.g. int32 [1, 8] ids); PRNGKey(seed) splits into the
    params key and the state's dropout rng.
    """
    def init() -> TrainState:
        params_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed))
        params = model.init({"params": params_rng}, *inputs, **kwargs)["params"]
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=dropout_rng)

    return init


def state_shardings(init: Callable[[], TrainState], mesh: jax.sharding.Mesh) -> tuple[TrainState, Any]:
    """(abstract unboxed TrainState of ShapeDtypeStructs, matching tree of NamedShardings), from the
    logical axis names under `sharding.LOGICAL_AXIS_RULES`; nothing is allocated. Unchecked: see
    `sharding.check_divisible`."""
    boxed = jax.eval_shape(init)
    return nn.unbox(boxed), sharding.logical_sharding(nn.get_partition_spec(boxed), mesh)


def create_state(init: Callable[[], TrainState], mesh: jax.sharding.Mesh, shardings: Any,
                 params: Mapping[str, jax.Array] | None = None) -> TrainState:
    """The TrainState of `init` built directly in `shardings` (one jit with out_shardings).

    `params` ("/"-joined parameter paths -> jax.Arrays of the parameter's shape, dtype and sharding, e.g.
    a checkpoint's encoder) replace those of `init`, whose random initialisation of them the compiled
    program then leaves out; they are donated. The optimizer state is `init`'s (built from shapes only:
    zeros for every optimizer of `optim`).

    Raises:
      KeyError: a path of `params` that `init`'s parameters lack.
    """
    given = dict(params or {})

    def build(given):
        state = nn.unbox(init())
        flat = flax.traverse_util.flatten_dict(state.params, sep="/")
        for path in given:
            if path not in flat:
                raise KeyError(f"create_state: no parameter {path!r} to replace")
        flat.update(given)
        return state.replace(params=flax.traverse_util.unflatten_dict(flat, sep="/"))

    with jax.set_mesh(mesh):
        return jax.jit(build, out_shardings=shardings, donate_argnums=0)(given)


# ----------------------------------------------------------------------------- the step


def train_step(state: TrainState, batch: Batch, *, loss_fn: LossFn, tx: optax.GradientTransformation,
               schedule: optax.Schedule, grad_accum_steps: int = 1,
               denominators: Callable[[Batch], Any] | None = None) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step (pure): gradient of `loss_fn`, clipping and update by `tx`
    (`apply_gradients(state, *gradients(state, batch, ...))`).

    Args:
      state: the TrainState; the step's dropout key is fold_in(state.rng, state.step).
      batch: global arrays [B, ...] (e.g. int32 [B, L] ids, int32 [B] labels).
      loss_fn: (params, batch, dropout_rng, denominators) -> (float32 scalar loss, dict of float32 scalar
        metrics). With denominators None the loss is its batch's mean; otherwise its sum divided by them.
      grad_accum_steps: k; with k > 1 the batch is split into k micro-batches of B / k rows (rows i, i + k,
        ... form micro-batch i, so no row moves between devices), run one after the other (`lax.scan`:
        one micro-batch's activations at a time), each normalised by `denominators(batch)` of the whole
        batch, so that the summed gradient and metrics equal the whole batch's (dropout aside).
      denominators: batch -> the whole batch's normalisers passed to loss_fn (e.g. float32 scalars);
        needed when k > 1.

    Returns:
      The new state (step + 1) and the loss_fn metrics plus loss, grad_norm (of the summed gradient,
      before clipping) and learning_rate (of the step taken), float32 scalars.

    Raises:
      ValueError: (while tracing) k > 1 without `denominators`, or B not divisible by k.
    """
    grads, metrics = gradients(state, batch, loss_fn=loss_fn, grad_accum_steps=grad_accum_steps,
                               denominators=denominators)
    return apply_gradients(state, grads, metrics, tx=tx, schedule=schedule)


def gradients(state: TrainState, batch: Batch, *, loss_fn: LossFn, grad_accum_steps: int = 1,
              denominators: Callable[[Batch], Any] | None = None) -> tuple[Any, dict[str, jax.Array]]:
    """The first half of `train_step` (pure): the gradient of `loss_fn` at state.params -> (gradient
    tree like params, float32 [] metrics: loss_fn's and loss). Arguments and errors as `train_step`."""
    dropout_rng = jax.random.fold_in(state.rng, state.step)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    with sharding.axis_rules():
        if grad_accum_steps == 1:
            (loss, metrics), grads = grad_fn(state.params, batch, dropout_rng, None)
        else:
            grads, metrics = _accumulate(grad_fn, state.params, batch, dropout_rng, grad_accum_steps, denominators)
            loss = metrics.pop("loss")
    return grads, dict(metrics, loss=loss)


def apply_gradients(state: TrainState, grads: Any, metrics: Mapping[str, jax.Array], *,
                    tx: optax.GradientTransformation,
                    schedule: optax.Schedule) -> tuple[TrainState, dict[str, jax.Array]]:
    """The second half of `train_step` (pure): `tx`'s update from `grads` (a tree like state.params) ->
    (state with step + 1, `metrics` plus grad_norm and learning_rate, float32 scalars)."""
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, grad_norm=optim.global_norm(grads), learning_rate=schedule(state.step))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def _accumulate(grad_fn, params, batch: Batch, dropout_rng, k: int, denominators) -> tuple[Any, dict]:
    """Sum of grad_fn's gradients and metrics (loss included) over k interleaved micro-batches."""
    if denominators is None:
        raise ValueError(f"grad_accum_steps={k} needs the whole batch's loss denominators")
    rows = next(iter(batch.values())).shape[0]
    if rows % k:
        raise ValueError(f"batch of {rows} rows does not split into grad_accum_steps={k} micro-batches")
    whole = denominators(batch)
    # Micro-batch i holds rows i, i + k, i + 2k, ...: every device keeps its own rows (a contiguous split
    # would put each micro-batch on 1/k of the batch shards and gather it there).
    micro = jax.tree_util.tree_map(lambda x: x.reshape((x.shape[0] // k, k) + x.shape[1:]).swapaxes(0, 1), batch)

    def body(carry, inputs):
        i, micro_batch = inputs
        (loss, metrics), grads = grad_fn(params, micro_batch, jax.random.fold_in(dropout_rng, i), whole)
        return jax.tree_util.tree_map(jnp.add, carry, (grads, dict(metrics, loss=loss))), None

    shapes = jax.eval_shape(lambda: grad_fn(params, jax.tree_util.tree_map(lambda x: x[0], micro), dropout_rng, whole))
    zero_metrics = {name: jnp.zeros((), jnp.float32) for name in dict(shapes[0][1], loss=None)}
    zeros = (jax.tree_util.tree_map(jnp.zeros_like, params), zero_metrics)
    (grads, metrics), _ = jax.lax.scan(body, zeros, (jnp.arange(k), micro))
    return grads, metrics


def batch_shardings(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
    """The sharding of every array of a batch, as a pytree prefix of the batch dict: rows over
    (data, fsdp), other dimensions replicated, whatever the fields and their ranks (>= 1)."""
    return sharding.batch_sharding(mesh, 1)


def replicated(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
    """The sharding of a value every device holds whole (metrics, scalars)."""
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def jit_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, schedule: optax.Schedule,
                   mesh: jax.sharding.Mesh, shardings: Any, *, grad_accum_steps: int = 1,
                   denominators: Callable[[Batch], Any] | None = None, shared_update: bool = False) -> Callable:
    """`train_step` under `jax.jit`: (state, batch) -> (state, metrics).

    Args:
      shardings: the TrainState tree of NamedShardings (`state_shardings`); the state's buffers are donated.
      loss_fn, tx, schedule, grad_accum_steps, denominators: as `train_step`.
      shared_update: False: one program per batch shape. True: a `SharedUpdateStep`, the gradient one
        program per batch shape and the optimizer update one program for all of them (for jobs that
        compile a program per length bucket: each bucket then builds only the forward and backward pass).

    Nothing is compiled here: jax compiles on the first call (or `.lower(...).compile()`), once per
    distinct batch shape, and raises there for a batch whose keys or shapes do not fit.
    """
    if not shared_update:
        step = functools.partial(train_step, loss_fn=loss_fn, tx=tx, schedule=schedule,
                                 grad_accum_steps=grad_accum_steps, denominators=denominators)
        return jax.jit(step, in_shardings=(shardings, batch_shardings(mesh)),
                       out_shardings=(shardings, replicated(mesh)), donate_argnums=(0,))
    grads = functools.partial(gradients, loss_fn=loss_fn, grad_accum_steps=grad_accum_steps,
                              denominators=denominators)
    update = functools.partial(apply_gradients, tx=tx, schedule=schedule)
    return SharedUpdateStep(
        jax.jit(grads, in_shardings=(shardings, batch_shardings(mesh)),
                out_shardings=(shardings.params, replicated(mesh))),
        jax.jit(update, in_shardings=(shardings, shardings.params, replicated(mesh)),
                out_shardings=(shardings, replicated(mesh)), donate_argnums=(0,)))


class SharedUpdateStep:
    """`train_step` as two programs: `gradients` (jitted, one program per batch shape) then
    `apply_gradients` (jitted, the state donated: one program for every batch shape).

    Used as the one-program step is: `step(state, batch)` -> (state, metrics), and
    `step.lower(state, batch).compile()` -> a callable (state, batch) -> (state, metrics) with the gradient
    compiled for that batch's shapes and the update compiled once (safe from several threads). The
    result equals `train_step`'s (the same operations; XLA may order float32 sums differently).
    Built by `jit_train_step(..., shared_update=True)`. The gradient program holds no learning rate, so
    the runs of a learning-rate sweep share it (e.g. through jax's persistent compilation cache).

    Attributes:
      gradients: the jitted `gradients`, (state, batch) -> (gradient tree, metrics).
      update: the jitted `apply_gradients`, (state, gradient tree, metrics) -> (state, metrics).
    """

    def __init__(self, gradients_jit: Callable, update_jit: Callable):
        self.gradients, self.update = gradients_jit, update_jit
        self._compiled_update = None
        self._lock = threading.Lock()

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        grads, metrics = self.gradients(state, batch)
        return self.update(state, grads, metrics)

    def lower(self, state: TrainState, batch: Batch) -> "_SharedUpdateLowered":
        """The gradient lowered for `batch`'s shapes; `.compile()` also builds the update (once)."""
        return _SharedUpdateLowered(self, self.gradients.lower(state, batch), state)

    def _cache_size(self) -> int:
        """Gradient programs compiled by calling the step (not through `lower`), as `jax.jit`'s."""
        return self.gradients._cache_size()

    def _update_program(self, state: TrainState, gradients_out: Any) -> Callable:
        """The update compiled once, for `gradients_out` (the abstract (gradient tree, metrics) of a lowered
        gradient program: the same for every batch shape)."""
        with self._lock:
            if self._compiled_update is None:
                self._compiled_update = self.update.lower(state, *gradients_out).compile()
            return self._compiled_update


@dataclasses.dataclass
class _SharedUpdateLowered:
    """`SharedUpdateStep.lower`'s result: the gradient lowered for one batch's shapes and the state the
    update's (one) compilation needs; `compile()` -> the callable (state, batch) -> (state, metrics)."""

    step: SharedUpdateStep
    lowered: Any
    state: Any

    def compile(self) -> Callable:
        gradients_program = self.lowered.compile()
        update_program = self.step._update_program(self.state, self.lowered.out_info)

        def run(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
            return update_program(state, *gradients_program(state, batch))

        return run


def jit_eval_step(fn: Callable[[Any, Batch], Any], mesh: jax.sharding.Mesh, param_shardings: Any) -> Callable:
    """`fn(params, batch)` (a deterministic forward pass) under one `jax.jit`, its outputs replicated."""
    return jax.jit(fn, in_shardings=(param_shardings, batch_shardings(mesh)),
                   out_shardings=replicated(mesh))


def global_batch(local: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh,
                 fields: Sequence[str] | None = None) -> dict[str, jax.Array]:
    """This process's rows -> global jax.Arrays sharded over (data, fsdp).

    Args:
      local: numpy [b, ...] per name, b = B / process_count rows of every global batch.
      fields: the names to take (default all of `local`).

    Returns:
      {name: jax.Array [B, ...]} with the local arrays' dtypes.
    """
    out = {}
    for name in local if fields is None else fields:
        x = local[name]
        global_shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
        out[name] = jax.make_array_from_process_local_data(sharding.batch_sharding(mesh, x.ndim), x, global_shape)
    return out


# ----------------------------------------------------------------------------- the timer


class Chrono:
    """Training throughput over report windows, pauses left out (after big_vision's `Chrono`,
    google-research/big_vision big_vision/utils.py).

    `tick()` after each dispatched step; `lap()` -> the `Lap` (steps, seconds) since the last lap (or restart) and
    starts the next window; `with paused(wait_for=state):` waits for the steps so far (their time stays in
    the window), then keeps its body's time (a checkpoint, an evaluation) out; `restart(wait_for=state)`
    starts a fresh window once the steps so far are done (e.g. after a step that compiled). Seconds are
    wall-clock (`time.perf_counter`).
    """

    def __init__(self):
        self._start = time.perf_counter()
        self._steps = 0

    def tick(self) -> None:
        self._steps += 1

    def restart(self, wait_for: Any = None) -> None:
        jax.block_until_ready(wait_for)
        self._start, self._steps = time.perf_counter(), 0

    @contextlib.contextmanager
    def paused(self, wait_for: Any = None):
        jax.block_until_ready(wait_for)
        began = time.perf_counter()
        try:
            yield
        finally:
            self._start += time.perf_counter() - began

    def lap(self) -> "Lap":
        now = time.perf_counter()
        lap = Lap(self._steps, now - self._start)
        self._start, self._steps = now, 0
        return lap


@dataclasses.dataclass(frozen=True)
class Lap:
    """One window of `Chrono`: steps taken and the seconds they took (pauses left out)."""

    steps: int
    seconds: float

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds

    def examples_per_second(self, batch_size: int) -> float:
        """Rows per second at `batch_size` global rows per step."""
        return self.steps * batch_size / self.seconds
