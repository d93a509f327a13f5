"""BERT pre-training over a device mesh: sharded state, one jitted step, two phases, exact resume.

  python -m bert_jax.train --config configs/pretrain.py:tiny --workdir /tmp/run \\
      --config.phases[0].data_dir=data/p1 --config.phases[1].data_dir=data/p2

Design: the state is built sharded without ever existing unsharded
(`jax.eval_shape` -> logical partition specs -> `jax.jit(init, out_shardings=...)`); `train_step` is a
pure module-level function compiled once per phase with `in_shardings`, `out_shardings` and
`donate_argnums`; dropout keys are `fold_in(rng, step)`, so a resumed run draws the same masks.

Phases (paper, appendix A.2): `config.phases` splits `total_steps` by `fraction`; the learning-rate
schedule and optimizer state run on across the switch, a checkpoint is written at the switch, and
each checkpoint stores the phase and its input iterator's position, so a run resumed inside phase 2
continues phase-2 data where it stopped.

Failure handling: SIGTERM (TPU preemption) -> checkpoint at the next step boundary and a clean exit;
a non-finite loss -> `FloatingPointError` naming the step, before any checkpoint of that state.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import signal
import sys
import time
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax import checkpointing, distributed, flops, losses, modeling, optim, sharding, storage, summaries

Batch = dict[str, jax.Array]
BATCH_FIELDS = ("input_ids", "token_type_ids", "attention_mask", "masked_lm_positions", "masked_lm_ids",
                "masked_lm_weights", "next_sentence_labels")


@flax.struct.dataclass
class TrainState:
    """Everything a step changes.

    Attributes:
      step: int32 scalar, optimizer steps taken.
      params: the BertForPreTraining parameter tree (float32 unless param_dtype says otherwise).
      opt_state: optax state (AdamW moments, schedule count).
      rng: uint32 [2] base PRNG key; the dropout key of step s is fold_in(rng, s).
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


# ----------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class Phase:
    """One pre-training phase, resolved to absolute steps [start, end)."""

    index: int
    start: int
    end: int
    max_seq_length: int
    max_predictions_per_seq: int
    batch_size: int
    data_dir: str


def resolve_phases(config: ml_collections.ConfigDict) -> list[Phase]:
    """Turns `config.phases` fractions into step ranges; the last phase ends at total_steps.

    Raises:
      ValueError: no phase, fractions not summing to 1, or a phase longer than max_position_embeddings.
    """
    if not config.phases:
        raise ValueError("config.phases is empty")
    total = sum(p.fraction for p in config.phases)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"config.phases fractions sum to {total}, not 1")
    phases, start = [], 0
    for i, p in enumerate(config.phases):
        end = config.total_steps if i == len(config.phases) - 1 else start + round(p.fraction * config.total_steps)
        if end <= start:
            raise ValueError(f"config.phases[{i}] gets no steps (fraction {p.fraction} of total_steps="
                             f"{config.total_steps})")
        if p.max_seq_length > config.model.max_position_embeddings:
            raise ValueError(f"config.phases[{i}].max_seq_length={p.max_seq_length} exceeds "
                             f"config.model.max_position_embeddings={config.model.max_position_embeddings}")
        phases.append(Phase(i, start, end, p.max_seq_length, p.max_predictions_per_seq, p.batch_size, p.data_dir))
        start = end
    return phases


def make_mesh(config: ml_collections.ConfigDict) -> jax.sharding.Mesh:
    """The mesh of `config.mesh` (a preset, or data/fsdp/tensor sizes over the first num_devices)."""
    devices = sharding.select_devices(config.mesh.get("num_devices") or 0)
    if config.mesh.preset:
        return sharding.preset_mesh(config.mesh.preset, devices)
    return sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices)


def validate(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, *, need_data: bool = True) -> list[Phase]:
    """All checks that can fail before compiling anything (one-line ValueError / FileNotFoundError)."""
    modeling.BertConfig.from_dict(config.model)  # raises on a bad model config
    phases = resolve_phases(config)
    for field in ("grad_accum_steps", "log_every", "checkpoint_every", "eval_every", "eval_batches", "keep_checkpoints"):
        if config[field] < 1:
            raise ValueError(f"config.{field}={config[field]} must be at least 1")
    if config.get("mlm_bias_init", "zeros") not in ("zeros", "log_prior"):
        raise ValueError(f"config.mlm_bias_init={config.mlm_bias_init!r} is not 'zeros' or 'log_prior'")
    for p in phases:
        sharding.check_batch(p.batch_size, mesh)
        if p.batch_size % config.grad_accum_steps or \
                (p.batch_size // config.grad_accum_steps) % sharding.batch_axis_size(mesh):
            raise ValueError(f"config.phases[{p.index}].batch_size={p.batch_size} does not split into "
                             f"grad_accum_steps={config.grad_accum_steps} micro-batches divisible by "
                             f"data*fsdp={sharding.batch_axis_size(mesh)}")
        if p.batch_size % jax.process_count():
            raise ValueError(f"config.phases[{p.index}].batch_size={p.batch_size} is not divisible by the "
                             f"{jax.process_count()} processes")
        sharding.check_process_rows(mesh, p.batch_size)
        if need_data:
            _check_data(p.data_dir, f"config.phases[{p.index}].data_dir", config, p.max_seq_length,
                        p.max_predictions_per_seq)
    if need_data and config.eval_data_dir:
        meta = _check_data(config.eval_data_dir, "config.eval_data_dir", config)
        length = meta["flags"]["max_seq_length"]
        if length > config.model.max_position_embeddings:
            raise ValueError(f"config.eval_data_dir={config.eval_data_dir!r} holds length {length}, over "
                             f"config.model.max_position_embeddings={config.model.max_position_embeddings}")
        largest = max(p.batch_size for p in phases)  # evaluation uses the current phase's batch size
        if meta["num_instances"] < largest:
            raise ValueError(f"config.eval_data_dir={config.eval_data_dir!r} holds {meta['num_instances']} "
                             f"instances, fewer than one batch of {largest}")
    return phases


def _check_data(data_dir: str, field: str, config, max_seq_length: int | None = None,
                max_predictions_per_seq: int | None = None) -> dict:
    """The metadata.json of the instance directory in config `field`, checked against the config: its
    length and predictions (when given) and its vocabulary size, and its shards present and complete (so
    that phase 2's or the eval's data fail at the start, not at their first use). One-line
    FileNotFoundError / ValueError."""
    from bert_jax.data import pipeline

    meta_file = storage.join(data_dir, "metadata.json")
    if not storage.is_file(meta_file):
        raise FileNotFoundError(f"{field}={data_dir!r}: no metadata.json "
                                "(run python -m bert_jax.data.create_pretraining_data first)")
    meta = storage.read_json(meta_file)
    flags = meta["flags"]
    if max_seq_length is not None and (flags["max_seq_length"], flags["max_predictions_per_seq"]) != (
            max_seq_length, max_predictions_per_seq):
        raise ValueError(f"{field.rsplit('.', 1)[0]} wants length {max_seq_length} / {max_predictions_per_seq} "
                         f"predictions but {data_dir} holds {flags['max_seq_length']} / {flags['max_predictions_per_seq']}")
    if meta.get("vocab_size", 0) > config.model.vocab_size:
        raise ValueError(f"{data_dir}: vocabulary of {meta['vocab_size']} tokens exceeds "
                         f"config.model.vocab_size={config.model.vocab_size}")
    pipeline.open_shards(data_dir, meta)
    return meta


# ----------------------------------------------------------------------------- state and steps


def create_model(config: ml_collections.ConfigDict) -> modeling.BertForPreTraining:
    return modeling.BertForPreTraining(modeling.BertConfig.from_dict(config.model))


def create_optimizer(config: ml_collections.ConfigDict) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The config's optimizer; accumulation happens inside `train_step`, so one update per step."""
    return optim.create_optimizer(
        learning_rate=config.learning_rate, warmup_steps=config.warmup_steps, total_steps=config.total_steps,
        optimizer=config.optimizer, weight_decay=config.weight_decay, b1=config.adam_b1, b2=config.adam_b2,
        eps=config.adam_eps, max_grad_norm=config.max_grad_norm)


def _init_state(model: nn.Module, tx: optax.GradientTransformation, seed: int, boxed: bool) -> TrainState:
    params_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed))
    ids = jnp.zeros((1, 8), jnp.int32)
    variables = model.init({"params": params_rng}, ids, masked_lm_positions=ids[:, :2])
    params = variables["params"]
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=dropout_rng)
    return state if boxed else nn.unbox(state)


def state_shardings(model: nn.Module, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh,
                    seed: int = 0) -> tuple[Any, Any]:
    """(abstract unboxed TrainState, tree of NamedShardings) from the logical axis names, no allocation."""
    boxed = jax.eval_shape(functools.partial(_init_state, model, tx, seed, True))
    specs = nn.get_partition_spec(boxed)
    shardings = sharding.logical_sharding(specs, mesh)
    return jax.eval_shape(functools.partial(_init_state, model, tx, seed, False)), shardings


def create_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh,
                       seed: int, shardings: Any = None, mlm_bias: np.ndarray | None = None) -> tuple[TrainState, Any]:
    """A freshly initialised, sharded TrainState (never materialised unsharded) and its shardings
    (derived with `state_shardings` unless given); `mlm_bias` (float32 [V], e.g. `initial_mlm_bias`)
    replaces the zero-initialised MLM output bias."""
    if shardings is None:
        _, shardings = state_shardings(model, tx, mesh, seed)
    with jax.set_mesh(mesh):
        state = jax.jit(functools.partial(_init_state, model, tx, seed, False), out_shardings=shardings)()
    if mlm_bias is not None:
        bias_sharding = shardings.params["mlm_output_bias"]
        bias = jax.make_array_from_callback(mlm_bias.shape, bias_sharding, lambda index: mlm_bias[index])
        state = state.replace(params={**state.params, "mlm_output_bias": bias})
    return state, shardings


def initial_mlm_bias(config: ml_collections.ConfigDict) -> np.ndarray | None:
    """The MLM output bias a new run starts from: None (zeros, the original's) for
    config.mlm_bias_init == "zeros"; for "log_prior" the centred log unigram distribution of the
    first phase's masked-LM targets (`pretraining.masked_token_log_prior`), float32 [vocab_size]."""
    if config.get("mlm_bias_init", "zeros") == "zeros":
        return None
    from bert_jax.data import pretraining

    return pretraining.masked_token_log_prior(config.phases[0].data_dir, config.model.vocab_size)


def _loss_and_metrics(params, model: nn.Module, batch: Batch, dropout_rng, deterministic: bool, denominators=None):
    out = model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                      batch["masked_lm_positions"], deterministic=deterministic, rngs={"dropout": dropout_rng})
    return losses.pretraining_loss(out.mlm_logits, out.nsp_logits, batch, denominators, kernels=model.config.kernels)


def train_step(state: TrainState, batch: Batch, *, model: nn.Module, tx: optax.GradientTransformation,
               schedule: optax.Schedule, grad_accum_steps: int = 1) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step (pure). batch: the standard fields, global [B, ...] arrays.

    With grad_accum_steps = k > 1 the batch is split into k micro-batches of B / k rows (rows i, i + k,
    ... form micro-batch i, so that no rows move between devices), run one after
    the other (`lax.scan`, so activations of one micro-batch at a time). Each micro-batch's losses are
    normalised by the whole batch's prediction and sequence counts, so the summed gradient and metrics
    equal those of the whole batch at once (dropout aside), even when the micro-batches hold different
    numbers of masked positions. One optimizer (and schedule) step per call whatever k.

    Returns the new state and float32 scalar metrics: loss, mlm_loss, mlm_accuracy, nsp_loss,
    nsp_accuracy, num_predictions, grad_norm, learning_rate.
    """
    dropout_rng = jax.random.fold_in(state.rng, state.step)
    grad_fn = jax.value_and_grad(_loss_and_metrics, has_aux=True)
    with sharding.axis_rules():
        if grad_accum_steps == 1:
            (loss, metrics), grads = grad_fn(state.params, model, batch, dropout_rng, False)
        else:
            denominators = (jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
                            jnp.asarray(batch["next_sentence_labels"].shape[0], jnp.float32))
            # Micro-batch i holds rows i, i + k, i + 2k, ...: every device keeps its own rows (a contiguous
            # split would put each micro-batch on 1/k of the batch shards and gather it there).
            micro = jax.tree_util.tree_map(
                lambda x: x.reshape((x.shape[0] // grad_accum_steps, grad_accum_steps) + x.shape[1:]).swapaxes(0, 1),
                batch)

            def accumulate(carry, inputs):
                i, micro_batch = inputs
                (loss, metrics), grads = grad_fn(state.params, model, micro_batch,
                                                 jax.random.fold_in(dropout_rng, i), False, denominators)
                return jax.tree_util.tree_map(jnp.add, carry, (grads, dict(metrics, loss=loss))), None

            zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
            shapes = jax.eval_shape(lambda: grad_fn(state.params, model, jax.tree_util.tree_map(lambda x: x[0], micro),
                                                    dropout_rng, False, denominators))
            zero_metrics = {k: jnp.zeros((), jnp.float32) for k in dict(shapes[0][1], loss=None)}
            (grads, metrics), _ = jax.lax.scan(accumulate, (zeros, zero_metrics),
                                               (jnp.arange(grad_accum_steps), micro))
            loss = metrics.pop("loss")
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, loss=loss, grad_norm=optim.global_norm(grads), learning_rate=schedule(state.step))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: Batch, *, model: nn.Module) -> dict[str, jax.Array]:
    """Deterministic forward pass -> the metrics of `losses.pretraining_loss` (float32 scalars)."""
    with sharding.axis_rules():
        loss, metrics = _loss_and_metrics(params, model, batch, jax.random.PRNGKey(0), True)
    return dict(metrics, loss=loss)


def compile_steps(model, tx, schedule, mesh, shardings, grad_accum_steps: int = 1) -> tuple[Callable, Callable]:
    """(train_step, eval_step) jitted with explicit shardings; the state's buffers are donated."""
    batch_shardings = {k: sharding.batch_sharding(mesh, 1 if k == "next_sentence_labels" else 2) for k in BATCH_FIELDS}
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    step = jax.jit(functools.partial(train_step, model=model, tx=tx, schedule=schedule,
                                     grad_accum_steps=grad_accum_steps),
                   in_shardings=(shardings, batch_shardings), out_shardings=(shardings, replicated),
                   donate_argnums=(0,))
    evaluate = jax.jit(functools.partial(eval_step, model=model),
                       in_shardings=(shardings.params, batch_shardings), out_shardings=replicated)
    return step, evaluate


def global_batch(local: dict[str, np.ndarray], mesh: jax.sharding.Mesh,
                 fields: tuple[str, ...] = BATCH_FIELDS) -> Batch:
    """Per-process numpy batch -> global jax.Arrays sharded over (data, fsdp), for the keys `fields`."""
    out = {}
    for k in fields:
        x = local[k]
        global_shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
        out[k] = jax.make_array_from_process_local_data(sharding.batch_sharding(mesh, x.ndim), x, global_shape)
    return out


# ----------------------------------------------------------------------------- the loop


class _Preemption:
    """SIGTERM -> a flag checked at step boundaries, in a single-process run.

    With several processes the handler is left to JAX: `jax.distributed.initialize` installs the
    preemption notifier that Orbax's `reached_preemption` consults, and a Python handler would replace it.
    """

    def __init__(self):
        self.requested = False
        self._previous = None
        self._installed = False

    def __enter__(self):
        if jax.process_count() == 1:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)


def _iterator(phase: Phase, config, state: dict | None):
    from bert_jax.data import pipeline

    it = pipeline.make_pretraining_iterator(
        phase.data_dir, global_batch_size=phase.batch_size, seed=config.seed + 1000 * phase.index,
        max_seq_length=phase.max_seq_length, max_predictions_per_seq=phase.max_predictions_per_seq)
    if state is not None:
        it.set_state(state)
    return it


def _phase_at(phases: list[Phase], step: int) -> Phase:
    return next((p for p in phases if p.start <= step < p.end), phases[-1])


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       max_steps: int | None = None) -> dict[str, float]:
    """Pre-trains according to `config`, writing checkpoints and summaries under `workdir`.

    Args:
      config: a configs/pretrain.py config.
      workdir: run directory (local or gs://): checkpoints/, tensorboard/; resumes from the latest
        checkpoint in it.
      max_steps: stop after this global step (for tests and benchmarks); default total_steps.

    Returns:
      The last logged metrics (floats), with "step" = the step the run stopped at.

    Raises:
      ValueError / FileNotFoundError: bad config, mesh or data (before compiling).
      FloatingPointError: a non-finite loss, naming the step.
    """
    with _Preemption() as preemption:  # from the start: a SIGTERM during restore or compilation counts too
        return _train(config, workdir, max_steps, preemption)


def _train(config, workdir: str, max_steps: int | None, preemption: _Preemption) -> dict[str, float]:
    mesh = make_mesh(config)
    phases = validate(config, mesh)
    model = create_model(config)
    tx, schedule = create_optimizer(config)
    bert_config = model.config
    abstract, shardings = state_shardings(model, tx, mesh, config.seed)
    sharding.check_divisible(abstract, shardings)
    is_main = jax.process_index() == 0
    checkpointer = checkpointing.Checkpointer(storage.join(workdir, "checkpoints"),
                                              max_to_keep=config.keep_checkpoints)
    latest, state, data_state = checkpointer.restore_newest_readable(checkpointing.abstract_like(abstract, shardings))
    if latest is None:
        state, _ = create_train_state(model, tx, mesh, config.seed, shardings, initial_mlm_bias(config))
    else:
        if is_main:
            print(f"train: resumed from the checkpoint at step {latest}", file=sys.stderr, flush=True)
    step_fn, eval_fn = compile_steps(model, tx, schedule, mesh, shardings, config.grad_accum_steps)
    writer = summaries.open_writer(workdir, is_main)
    final_step = min(config.total_steps, max_steps or config.total_steps)
    start_step = int(jax.device_get(state.step))
    config_json = json.loads(config.to_json())
    # MFU's denominator: the config's figure, else the published peak of a known TPU; none on CPU.
    peak_flops = (config.peak_tflops_per_device * 1e12
                  or flops.peak_flops_per_device(mesh.devices.flat[0].device_kind))

    saved = {latest}

    def save(step, phase, iterator):
        if step not in saved:
            checkpointer.save(step, state, {"phase": phase.index, "iterator": iterator.get_state()}, config_json)
            saved.add(step)

    metrics_out: dict[str, float] = {}
    phase = _phase_at(phases, start_step)
    iterator = _iterator(phase, config, data_state["iterator"] if data_state and data_state["phase"] == phase.index
                         else None)
    progress = summaries.progress_bar(start_step, final_step, is_main, "pre-training")
    pending: tuple[int, dict] | None = None  # the previous step's metrics, checked one step late
    window_start, window_steps = time.perf_counter(), 0
    compiling_step = start_step + 1  # a step that includes compilation, timed out of the throughput

    def untimed(work):  # waits for the steps so far (their time stays in), then keeps work()'s time out
        nonlocal window_start
        jax.block_until_ready(state)
        began = time.perf_counter()
        result = work()
        window_start += time.perf_counter() - began
        return result

    step = start_step
    try:
        with jax.set_mesh(mesh):
            while step < final_step:
                if step == phase.end:  # phase switch: checkpoint, then the next phase's data
                    _check_finite(pending)
                    untimed(lambda: save(step, phase, iterator))
                    phase = phases[phase.index + 1]
                    iterator.close()
                    iterator = _iterator(phase, config, None)
                    compiling_step = step + 1  # new shapes: the step compiles again
                batch = global_batch(next(iterator), mesh)
                state, metrics = step_fn(state, batch)
                _check_finite(pending)
                pending = (step, metrics)
                step += 1
                window_steps += 1
                progress.update(1)
                if step == compiling_step and step % config.log_every and step != final_step:
                    # The first step of a process or of a phase includes compilation: time from here.
                    jax.block_until_ready(state)
                    window_start, window_steps = time.perf_counter(), 0
                if step % config.log_every == 0 or step == final_step:
                    values = {k: float(v) for k, v in jax.device_get(metrics).items()}
                    _check_finite((step - 1, values))
                    elapsed = time.perf_counter() - window_start
                    seqs = window_steps * phase.batch_size / elapsed
                    values.update(sequences_per_second=seqs, tokens_per_second=seqs * phase.max_seq_length)
                    if peak_flops:
                        model_flops = flops.train_flops_per_step(bert_config, phase.batch_size, phase.max_seq_length,
                                                                 phase.max_predictions_per_seq)
                        values["mfu"] = model_flops * window_steps / elapsed / (peak_flops * mesh.devices.size)
                    metrics_out = dict(values, step=step, phase=phase.index)
                    summaries.write_scalars(writer, step, values, "train")
                    progress.set_postfix(loss=f"{values['loss']:.3f}", mlm_acc=f"{values['mlm_accuracy']:.3f}",
                                         nsp_acc=f"{values['nsp_accuracy']:.3f}", phase=phase.index)
                    window_start, window_steps = time.perf_counter(), 0
                if config.eval_data_dir and (step % config.eval_every == 0 or step == final_step):
                    values = untimed(lambda: _evaluate(eval_fn, state.params, config, phase, mesh))
                    summaries.write_scalars(writer, step, values, "eval")
                # One process alone may have seen SIGTERM: on several hosts, Orbax's preemption sync (the
                # JAX coordination service) makes all of them agree on the step.
                preempted = preemption.requested if jax.process_count() == 1 else \
                    checkpointer.manager.reached_preemption(step)
                if preempted or step % config.checkpoint_every == 0 or step == final_step:
                    _check_finite(pending)
                    untimed(lambda: save(step, phase, iterator))
                    if preempted:
                        print(f"SIGTERM: checkpoint saved at step {step}, exiting", file=sys.stderr, flush=True)
                        break
    finally:
        progress.close()
        iterator.close()
        checkpointer.close()
        if writer is not None:
            writer.close()
    metrics_out["step"] = step  # where the run stopped (the metrics are those of the last log)
    return metrics_out


def _check_finite(pending: tuple[int, dict] | None) -> None:
    if pending is None:
        return
    step, metrics = pending
    loss, grad_norm = float(metrics["loss"]), float(metrics["grad_norm"])
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        raise FloatingPointError(f"non-finite loss {loss} (gradient norm {grad_norm}) at step {step}; "
                                 "the last checkpoint is kept")


def _evaluate(eval_fn, params, config, phase: Phase, mesh) -> dict[str, float]:
    from bert_jax.data import pipeline

    it = pipeline.make_pretraining_iterator(config.eval_data_dir, global_batch_size=phase.batch_size, shuffle=False,
                                            num_epochs=1)
    # MLM metrics are per prediction (each batch weighted by its masked_lm_weights sum), the others per
    # sequence (batches are equal): the values one pass over all the batches at once would give.
    totals: dict[str, float] = {}
    weights: dict[str, float] = {}
    for n, local in enumerate(it):
        if n == config.eval_batches:
            break
        metrics = {k: float(v) for k, v in jax.device_get(eval_fn(params, global_batch(local, mesh))).items()}
        for k, v in metrics.items():
            w = metrics["num_predictions"] if k.startswith("mlm_") else 1.0
            totals[k] = totals.get(k, 0.0) + w * v
            weights[k] = weights.get(k, 0.0) + w
    it.close()
    out = {k: totals[k] / weights[k] for k in totals if weights[k]}
    if "num_predictions" in totals:
        out["num_predictions"] = totals["num_predictions"]  # all of them
    if "mlm_loss" in out:
        out["loss"] = out["mlm_loss"] + out["nsp_loss"]  # as the step's loss: mean MLM + mean NSP
    return out


def main(argv):
    from absl import app, flags, logging

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
    f = flags.FLAGS
    try:
        distributed.initialize_from_flags()
        metrics = train_and_evaluate(f.config, f.workdir, max_steps=f.max_steps)
    except (ValueError, FileNotFoundError, FloatingPointError, checkpointing.CheckpointSaveError) as e:
        raise SystemExit(f"train: {e}") from None
    if jax.process_index() == 0:
        print(json.dumps(metrics))
    return 0


def _define_flags():
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Pre-training config file, e.g. configs/pretrain.py:tiny.")
    flags.DEFINE_string("workdir", None, "Run directory: checkpoints and TensorBoard summaries.")
    flags.DEFINE_integer("max_steps", None, "Stop after this step (default: config.total_steps).")
    distributed.define_flags()
    flags.mark_flags_as_required(["config", "workdir"])


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
