"""The fine-tuning loop shared by the task jobs: sharded state from an encoder, the task's steps, `fit`.

Mesh, optimizer, sharded state, train step and timer are `bert_jax.training.steps`'s, as in pre-training: the
state is built sharded (`jax.eval_shape` -> logical partition specs -> `jax.jit(..., out_shardings=...)`)
and the task's loss goes through `steps.train_step`, jitted with explicit shardings and donation.
`fit` runs it with `bert_jax.training.loop.Runner` (as pre-training does: logging, progress bar, the non-finite
check) over batches of `bert_jax.tasks.batching` (each process's rows of one global permutation, optionally cut
to length buckets, one compiled program per bucket used).
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
from typing import Any, Callable, Iterator, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax.training import loop, sharding, steps, summaries
from bert_jax.checkpoints import sources
from bert_jax.tasks.batching import FIXED, Padding, local_batches
from bert_jax.training.steps import TrainState, global_batch
from bert_jax.tasks.prediction import INPUT_NAMES, predict_step


def create_state(model: nn.Module, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh,
                 init: sources.Initialisation, seed: int, seq_length: int = 8) -> tuple[TrainState, Any]:
    """The sharded TrainState of `model` (a BertFor... task model with an encoder named "bert"), its
    encoder taken from `init` (`sources.load_params` of the "bert/..." parameters; a pooler the
    source lacks, and the task head, as initialised with `seed`), and the tree of NamedShardings
    (`steps.state_shardings`).

    Raises:
      ValueError: a parameter or optimizer-state dimension the mesh does not divide
        (`sharding.check_divisible`); a source without a matching encoder (`load_params`).
      FileNotFoundError / ValueError: from Orbax when the checkpoint does not hold a matching encoder.
    """
    ids = jnp.zeros((1, seq_length), jnp.int32)
    state_init = steps.state_init(model, tx, seed, ids, ids, ids)
    abstract, shardings = steps.state_shardings(state_init, mesh)
    sharding.check_divisible(abstract, shardings)
    encoder, _ = sources.load_params(init, abstract.params, shardings.params, mesh,
                                            take=lambda path: path.startswith("bert/"))
    return steps.create_state(state_init, mesh, shardings, params=encoder), shardings


TaskLoss = Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, jax.Array]]


def task_loss(params: Any, batch: Mapping[str, jax.Array], dropout_rng: jax.Array, denominators=None, *,
              model: nn.Module, loss_fn: TaskLoss) -> tuple[jax.Array, dict]:
    """The `steps.LossFn` of a task: `model` on INPUT_NAMES (int32 [B, L]) with dropout, then
    `loss_fn(outputs, batch)` -> (sum, count) -> float32 scalar sum / count (sum / denominators when
    given: the whole batch's row count under accumulation), and no further metrics."""
    out = model.apply({"params": params}, *(batch[k] for k in INPUT_NAMES), deterministic=False,
                      rngs={"dropout": dropout_rng})
    total, count = loss_fn(out, batch)
    return total / (jnp.maximum(count, 1.0) if denominators is None else denominators), {}


def compile_steps(model, tx, schedule, mesh, shardings, loss_fn: TaskLoss,
                  shared_update: bool = False) -> tuple[Callable, Callable]:
    """(train_step, predict_step) jitted with explicit shardings (`steps.jit_train_step`, state donated).

    Args:
      shardings: the TrainState tree of NamedShardings from `create_state`.
      loss_fn: (model outputs, batch) -> (float32 sum of the per-example losses, float32 count).
      shared_update: the optimizer update as one program for every batch shape
        (`steps.SharedUpdateStep`; config.shared_update of the GLUE, NER and SWAG jobs).

    The train step's metrics: loss (sum / count), grad_norm, learning_rate, float32 scalars. Every batch
    array (inputs [B, L], labels [B] or [B, ...]) is sharded over its rows (data, fsdp).

    Raises:
      ValueError: a mesh without the "data" and "fsdp" axes (from `NamedSharding`). Nothing is
        compiled here: jax traces and compiles on the first call, and raises there for a batch whose keys
        or shapes do not fit these shardings.
    """
    step = steps.jit_train_step(functools.partial(task_loss, model=model, loss_fn=loss_fn), tx, schedule, mesh,
                                 shardings, shared_update=shared_update)
    predict = steps.jit_eval_step(functools.partial(predict_step, model=model), mesh, shardings.params)
    return step, predict


def create_optimizer(config: ml_collections.ConfigDict, num_train_steps: int):
    """AdamW as the original's fine-tuning (`optimization.create_optimizer`): linear warmup over
    warmup_proportion of the steps, linear decay to 0, weight decay 0.01, clipping at 1.0
    (`steps.create_optimizer` over max(num_train_steps, 1) steps)."""
    return steps.create_optimizer(config, max(num_train_steps, 1))


def _training_batches(arrays: Mapping[str, np.ndarray], batch_size: int, seed: int, num_steps: int,
                      padding: Padding) -> Iterator[dict[str, np.ndarray]]:
    """This process's batches of `fit`'s first num_steps steps: epoch e shuffled with seed + e, the
    remainder dropped (`local_batches`); fewer when an epoch holds no batch."""
    step, epoch = 0, 0
    while step < num_steps:
        drawn = 0
        for local, _, _ in local_batches(arrays, batch_size, seed=seed + epoch, drop_remainder=True, padding=padding):
            yield local
            step, drawn = step + 1, drawn + 1
            if step == num_steps:
                return
        if not drawn:
            return
        epoch += 1


def _compile_ahead(step_fn: Callable, state: TrainState, arrays: Mapping[str, np.ndarray], batch_size: int,
                   seed: int, num_steps: int, padding: Padding, mesh) -> dict[tuple[int, ...], Callable]:
    """With length buckets, step_fn compiled for each batch shape the first num_steps steps of `fit` use,
    several programs at once (XLA compiles outside the GIL, one thread per CPU): {local attention_mask
    shape: compiled step}. {} without buckets (one shape: the first call compiles it)."""
    if not padding.buckets or num_steps <= 0:
        return {}
    examples = {}
    for local in _training_batches(arrays, batch_size, seed, num_steps, padding):
        examples.setdefault(local["attention_mask"].shape, local)

    def build(local):
        with jax.set_mesh(mesh):
            return step_fn.lower(state, global_batch(local, mesh, tuple(local))).compile()

    with concurrent.futures.ThreadPoolExecutor(max(1, min(len(examples), os.cpu_count() or 1))) as pool:
        return dict(zip(examples, pool.map(build, examples.values())))


def fit(state: TrainState, step_fn: Callable, arrays: Mapping[str, np.ndarray], *, batch_size: int,
        num_train_steps: int, seed: int, mesh, writer=None, log_every: int = 50,
        desc: str = "fine-tuning", padding: Padding = FIXED) -> tuple[TrainState, list[dict[str, float]]]:
    """Runs `num_train_steps` steps over epochs of `arrays` (reshuffled per epoch, remainder dropped).

    Args:
      step_fn: the jitted train step of `compile_steps`.
      arrays: numpy [N, ...] under exactly the step's batch keys: input_ids, token_type_ids,
        attention_mask int32 [N, L] (SWAG [N, 4, L]) and the labels (e.g. int32 [N]; NER int32 /
        float32 [N, L]), N >= batch_size.
      batch_size: global rows per step, divisible by the process count and by data * fsdp.
      seed: the shuffle of epoch e uses seed + e.
      padding: `Padding`: fixed (default) or length buckets, optionally length-grouped batches; each
        bucket length the run uses compiles step_fn once, all of them before the first step and several
        at a time (`_compile_ahead`).

    The loop is `loop.Runner`'s, as pre-training's: every step's loss and gradient norm checked one
    step late (at most one step in flight), the metrics logged every `log_every` steps and at the end.

    Returns the final state and the logged metrics (step, loss, grad_norm, learning_rate,
    examples_per_second; examples_per_second leaves out a first step that compiled).

    Raises:
      FloatingPointError: a non-finite loss or gradient norm, naming the step (`loop.non_finite`, `loop.bad_step`).
      ValueError: fewer than batch_size training rows (no batch would ever form), or batch_size not
        divisible by the process count (`local_batches`).
    """
    rows = len(next(iter(arrays.values())))
    if num_train_steps > 0 and rows < batch_size:
        raise ValueError(f"{rows} training examples are fewer than one batch of train_batch_size={batch_size}")
    history = []

    def log(step: int, values: dict[str, float], lap: steps.Lap) -> dict[str, str]:
        values["examples_per_second"] = lap.examples_per_second(batch_size)
        summaries.write_scalars(writer, step, values, "train")
        history.append(dict(values, step=step))
        return dict(loss=f"{values['loss']:.3f}")

    with jax.set_mesh(mesh):
        programs = _compile_ahead(step_fn, state, arrays, batch_size, seed, num_train_steps, padding, mesh)
        batches = ((programs.get(local["attention_mask"].shape, step_fn), global_batch(local, mesh, tuple(local)))
                   for local in _training_batches(arrays, batch_size, seed, num_train_steps, padding))
        runner = loop.Runner(0, num_train_steps, desc=desc, log_every=log_every, log=log)
        try:
            state = runner.run(state, batches)
        finally:
            runner.close()
    return state, history
