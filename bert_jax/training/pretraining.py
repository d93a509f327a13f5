"""BERT pre-training over a device mesh: sharded state, one jitted step, two phases, exact resume.

  python -m bert_jax.train --config pretrain:tiny --workdir /tmp/run \\
      --config.phases[0].data_dir=data/p1 --config.phases[1].data_dir=data/p2

Design: `bert_jax.training.steps` is the machinery (mesh, optimizer, sharded state, step, timer); this module
binds the pre-training loss to it. `build` gives the `Program` a run compiles (`aot` lowers the same
one): the state built sharded without ever existing unsharded, and `steps.train_step` with
`loss_and_metrics` under one jit with `in_shardings`, `out_shardings` and `donate_argnums`, compiled
once per phase; dropout keys are `fold_in(rng, step)`, so a resumed run draws the same masks. The
loop is `bert_jax.training.loop.Runner`'s (as fine-tuning's), given `_Run`'s batches (next phase at a switch)
and actions (log, evaluate, save, preempted).

Phases (paper, appendix A.2): `config.phases` splits `total_steps` by `fraction`; the learning-rate
schedule and optimizer state run on across the switch, a checkpoint is written at the switch, and
each checkpoint stores the phase and its input iterator's position, so a run resumed inside phase 2
continues phase-2 data where it stopped.

Failure handling (`loop.Runner`): SIGTERM (TPU preemption) -> checkpoint at the next step boundary and a
clean exit; a non-finite loss or gradient norm, or a loss spike -> back to the newest checkpoint, the batches
since skipped (`bert_jax.training.guards.rollback`; config.rollback.enabled=False: `FloatingPointError` naming the
step), never a checkpoint or evaluation of that state; one run per workdir (`bert_jax.training.guards.lease`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax.checkpoints import checkpointing, sources
from bert_jax.training import distributed, evaluation, loop, losses, sharding, steps, summaries
from bert_jax.training.guards import lease, rollback, watchdog
from bert_jax.training.compiled import memory
from bert_jax import errors, storage
from bert_jax.model import bert_config, flops, modeling
from bert_jax.data.pretraining import stream as data_stream
from bert_jax.training.steps import TrainState

Batch = dict[str, jax.Array]
BATCH_FIELDS = ("input_ids", "token_type_ids", "attention_mask", "masked_lm_positions", "masked_lm_ids",
                "masked_lm_weights", "next_sentence_labels")
# The fields packed rows add (`bert_jax.data.pretraining.packing`): next_sentence_labels is then [B, K].
PACKED_FIELDS = ("segment_ids", "position_ids", "next_sentence_positions", "next_sentence_weights")
# config.precompile: every phase's step compiled (and its memory checked) before step 0: "auto" on accelerators.
PRECOMPILE = ("auto", "always", "never")


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
    packing: bool = False  # several instances per row (bert_jax.data.pretraining.packing)
    max_instances: int = 0  # K, instances per packed row (0: packing.default_max_instances)
    fill_rows: bool = True  # packed rows of tokenized documents: free room filled (bert_jax.data.pretraining.dynamic.FillRows)
    grad_accum_steps: int = 1  # micro-batches per step: the phase's own, else config.grad_accum_steps
    # The masking (`procedure.MASKING_FIELDS`): tokenized documents are drawn with it, static data must hold it.
    masked_lm_prob: float = 0.15
    do_whole_word_mask: bool = False
    short_seq_prob: float = 0.1

    def masking(self) -> dict[str, Any]:
        """{name: value} of the phase's masking fields (`procedure.MASKING_FIELDS`)."""
        return {k: getattr(self, k) for k in ("masked_lm_prob", "do_whole_word_mask", "short_seq_prob")}


def resolve_phases(config: ml_collections.ConfigDict) -> list[Phase]:
    """Turns `config.phases` fractions into step ranges; the last phase ends at total_steps.

    Raises:
      ValueError: no phase, fractions not summing to 1, a batch size below 1, a phase longer than
        max_position_embeddings, or instance and masking fields `procedure.InstanceOptions.validate` rejects.
    """
    from bert_jax.data.pretraining import procedure

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
        if p.batch_size < 1:
            raise ValueError(f"config.phases[{i}].batch_size={p.batch_size} must be at least 1")
        if p.max_seq_length > config.model.max_position_embeddings:
            raise ValueError(f"config.phases[{i}].max_seq_length={p.max_seq_length} exceeds "
                             f"config.model.max_position_embeddings={config.model.max_position_embeddings}")
        if p.get("max_instances", 0) < 0:
            raise ValueError(f"config.phases[{i}].max_instances={p.max_instances} must be >= 0 (0: the default)")
        if p.get("grad_accum_steps", 0) < 0:
            raise ValueError(f"config.phases[{i}].grad_accum_steps={p.grad_accum_steps} must be >= 0 "
                             "(0: config.grad_accum_steps)")
        masking = {name: p.get(name, getattr(procedure.InstanceOptions, name)) for name in procedure.MASKING_FIELDS}
        try:
            procedure.InstanceOptions(max_seq_length=p.max_seq_length,
                                        max_predictions_per_seq=p.max_predictions_per_seq, **masking).validate()
        except ValueError as e:  # "<field>=<value> must be ...": named as the config field
            raise ValueError(f"config.phases[{i}].{e}") from None
        phases.append(Phase(i, start, end, p.max_seq_length, p.max_predictions_per_seq, p.batch_size, p.data_dir,
                            bool(p.get("packing", False)), int(p.get("max_instances", 0)),
                            bool(p.get("fill_rows", True)),
                            int(p.get("grad_accum_steps", 0) or config.get("grad_accum_steps", 1)), **masking))
        start = end
    return phases


def validate(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, *, need_data: bool = True) -> list[Phase]:
    """All checks that can fail before compiling anything (one-line ValueError / FileNotFoundError), the
    held-out evaluation's included (`evaluation.check`)."""
    modeling.BertConfig.from_dict(config.model)  # raises on a bad model config
    phases = resolve_phases(config)
    for field in ("grad_accum_steps", "log_every", "checkpoint_every", "eval_every", "eval_batches", "keep_checkpoints"):
        if config[field] < 1:
            raise ValueError(f"config.{field}={config[field]} must be at least 1")
    if config.get("mlm_bias_init", "zeros") not in ("zeros", "log_prior"):
        raise ValueError(f"config.mlm_bias_init={config.mlm_bias_init!r} is not 'zeros' or 'log_prior'")
    if config.get("precompile", "auto") not in PRECOMPILE:
        raise ValueError(f"config.precompile={config.precompile!r} is not one of {list(PRECOMPILE)}")
    if config.get("device_memory_gib", 0.0) < 0:
        raise ValueError(f"config.device_memory_gib={config.device_memory_gib} must be >= 0 (0: the device's own)")
    if config.get("data_workers", 0) < 0:
        raise ValueError(f"config.data_workers={config.data_workers} must be non-negative")
    from bert_jax.data.pretraining import loader

    metadata = []
    for p in phases:
        sharding.check_batch(p.batch_size, mesh)
        if p.batch_size % p.grad_accum_steps or \
                (p.batch_size // p.grad_accum_steps) % sharding.batch_axis_size(mesh):
            raise ValueError(f"config.phases[{p.index}].batch_size={p.batch_size} does not split into "
                             f"grad_accum_steps={p.grad_accum_steps} micro-batches divisible by "
                             f"data*fsdp={sharding.batch_axis_size(mesh)}")
        if p.batch_size % jax.process_count():
            raise ValueError(f"config.phases[{p.index}].batch_size={p.batch_size} is not divisible by the "
                             f"{jax.process_count()} processes")
        sharding.check_process_rows(mesh, p.batch_size)
        if need_data:
            metadata.append(loader.check_data_dir(p.data_dir, f"config.phases[{p.index}].data_dir",
                                                  config.model.vocab_size, p.max_seq_length,
                                                  p.max_predictions_per_seq, p.masking()))
    if need_data:
        eval_meta = (loader.check_data_dir(config.eval_data_dir, "config.eval_data_dir", config.model.vocab_size)
                     if config.eval_data_dir else None)
        evaluation.check(config, phases, metadata, eval_meta)
    return phases


# ----------------------------------------------------------------------------- state and steps


def create_model(config: ml_collections.ConfigDict) -> modeling.BertForPreTraining:
    """The config's `BertForPreTraining` (raises ValueError on a bad config.model, from `BertConfig`)."""
    return modeling.BertForPreTraining(modeling.BertConfig.from_dict(config.model))


def state_init(model: nn.Module, tx: optax.GradientTransformation, seed: int) -> Callable[[], TrainState]:
    """`steps.state_init` of the pre-training model (dummy int32 [1, 8] ids, 2 masked positions): the
    function `steps.state_shardings` and `steps.create_state` take."""
    ids = jnp.zeros((1, 8), jnp.int32)
    return steps.state_init(model, tx, seed, ids, masked_lm_positions=ids[:, :2])


def create_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh,
                       seed: int, shardings: Any = None, mlm_bias: np.ndarray | None = None,
                       params: Mapping[str, jax.Array] | None = None) -> tuple[TrainState, Any]:
    """A freshly initialised, sharded TrainState (never materialised unsharded) and its shardings
    (derived with `steps.state_shardings` unless given); `mlm_bias` (float32 [V], e.g. `initial_mlm_bias`)
    replaces the zero-initialised MLM output bias, and `params` ("/"-joined paths -> sharded arrays, e.g.
    `sources.load_params`'s) the parameters they name (`steps.create_state`)."""
    init = state_init(model, tx, seed)
    if shardings is None:
        _, shardings = steps.state_shardings(init, mesh)
    given = dict(params or {})
    if mlm_bias is not None:
        bias_sharding = shardings.params["mlm_output_bias"]
        given["mlm_output_bias"] = jax.make_array_from_callback(mlm_bias.shape, bias_sharding,
                                                                lambda index: mlm_bias[index])
    return steps.create_state(init, mesh, shardings, params=given), shardings


def initial_state(config: ml_collections.ConfigDict, program: "Program", mesh: jax.sharding.Mesh,
                  init: sources.Initialisation | None) -> TrainState:
    """The state a new run starts from (`create_train_state`): the parameters of `init`'s source
    (`sources.load_params`; one line names what the source lacks) in place of their initialisation,
    the rest freshly initialised (the MLM bias of `initial_mlm_bias` where the source has none); step,
    optimizer state and data position fresh, as the original's --init_checkpoint."""
    loaded, fresh = {}, []
    if init is not None:
        loaded, fresh = sources.load_params(init, program.abstract.params, program.shardings.params, mesh)
    if fresh:
        sources.say(f"train: not in config.init_checkpoint={init.path!r}, initialised fresh: "
             f"{sources.summarize_paths(fresh)}")
    bias = None if "mlm_output_bias" in loaded else initial_mlm_bias(config)  # the source's bias wins
    return create_train_state(program.model, program.tx, mesh, config.seed, program.shardings, bias, loaded)[0]


def initial_mlm_bias(config: ml_collections.ConfigDict) -> np.ndarray | None:
    """The MLM output bias a new run starts from: None (zeros, the original's) for
    config.mlm_bias_init == "zeros"; for "log_prior" the centred log unigram distribution of the
    first phase's masked-LM targets (`procedure.masked_token_log_prior`; of its training documents only with
    config.eval_fraction, `holdout.training_log_prior`), float32 [vocab_size]."""
    if config.get("mlm_bias_init", "zeros") == "zeros":
        return None
    from bert_jax.data.pretraining import holdout, procedure

    path = config.phases[0].data_dir
    if evaluation.fraction(config):
        held_out = holdout.split_directory(path, evaluation.fraction(config))[1]
        return holdout.training_log_prior(path, config.model.vocab_size, held_out)
    return procedure.masked_token_log_prior(path, config.model.vocab_size)


def loss_and_metrics(params: Any, batch: Batch, dropout_rng: jax.Array, denominators=None, *, model: nn.Module,
                     deterministic: bool = False) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The `steps.LossFn` of pre-training: `model` on the batch's standard fields (BATCH_FIELDS, global
    [B, ...]) -> `losses.pretraining_loss` (float32 scalar loss = mean MLM + mean NSP, and its metrics),
    normalised by `denominators` (`loss_denominators` of a whole batch this is a micro-batch of) if given."""
    out = model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                      batch["masked_lm_positions"], deterministic=deterministic, rngs={"dropout": dropout_rng},
                      segment_ids=batch.get("segment_ids"), position_ids=batch.get("position_ids"),
                      next_sentence_positions=batch.get("next_sentence_positions"))
    return losses.pretraining_loss(out.mlm_logits, out.nsp_logits, batch, denominators)


def loss_denominators(batch: Batch) -> tuple[jax.Array, jax.Array]:
    """(sum of masked_lm_weights, number of instances), float32 scalars: the whole batch's normalisers
    under gradient accumulation, so k micro-batches add up to the whole batch even when they hold
    different numbers of masked positions (or, packed, of instances)."""
    if "next_sentence_weights" in batch:
        instances = jnp.sum(batch["next_sentence_weights"].astype(jnp.float32))
    else:
        instances = jnp.asarray(batch["next_sentence_labels"].shape[0], jnp.float32)
    return jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)), instances


def eval_step(params: Any, batch: Batch, *, model: nn.Module) -> dict[str, jax.Array]:
    """Deterministic forward pass -> the metrics of `losses.pretraining_loss` (float32 scalars)."""
    with sharding.axis_rules():
        loss, metrics = loss_and_metrics(params, batch, jax.random.PRNGKey(0), model=model, deterministic=True)
    return dict(metrics, loss=loss)


def compile_steps(model, tx, schedule, mesh, shardings, grad_accum_steps: int = 1) -> tuple[Callable, Callable]:
    """(train_step, eval_step) jitted with explicit shardings (`steps.jit_train_step`, the state donated).

    The train step is `steps.train_step` with `loss_and_metrics` and `loss_denominators`: one optimizer
    step over the batch's grad_accum_steps micro-batches. Metrics (float32 scalars): loss, mlm_loss,
    mlm_accuracy, nsp_loss, nsp_accuracy, num_predictions, grad_norm, learning_rate.
    """
    step = steps.jit_train_step(functools.partial(loss_and_metrics, model=model), tx, schedule, mesh, shardings,
                                 grad_accum_steps=grad_accum_steps, denominators=loss_denominators)
    evaluate = steps.jit_eval_step(functools.partial(eval_step, model=model), mesh, shardings.params)
    return step, evaluate


@dataclasses.dataclass(frozen=True)
class Program:
    """What a pre-training run compiles on its mesh: the model, optimizer and schedule, the state's
    abstract tree (ShapeDtypeStructs) and NamedShardings, and the jitted `train_step` / `eval_step` of
    `compile_steps` (with config.grad_accum_steps), and `train_steps` {micro-batches: jitted train step} for every
    phase's grad_accum_steps (`step_for`). `aot` lowers these same steps."""

    model: modeling.BertForPreTraining
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    abstract: TrainState
    shardings: Any
    train_step: Callable
    eval_step: Callable
    train_steps: dict[int, Callable]

    def step_for(self, phase: Phase) -> Callable:
        """The jitted train step of `phase`'s grad_accum_steps micro-batches.

        Raises:
          KeyError: a phase of another config (`build` makes one step per phase's grad_accum_steps).
        """
        return self.train_steps[phase.grad_accum_steps]


def build(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> Program:
    """The `Program` of `config` on `mesh`; nothing is allocated or compiled.

    Raises:
      ValueError: a bad model config, or a parameter / optimizer-state dimension the mesh does not
        divide (`sharding.check_divisible`, one line naming the array).
    """
    model = create_model(config)
    tx, schedule = steps.create_optimizer(config)
    abstract, shardings = steps.state_shardings(state_init(model, tx, config.seed), mesh)
    sharding.check_divisible(abstract, shardings)
    step, evaluate = compile_steps(model, tx, schedule, mesh, shardings, config.grad_accum_steps)
    train_steps = {config.grad_accum_steps: step}
    for k in {p.grad_accum_steps for p in resolve_phases(config)} - train_steps.keys():
        train_steps[k] = compile_steps(model, tx, schedule, mesh, shardings, k)[0]
    return Program(model, tx, schedule, abstract, shardings, step, evaluate, train_steps)


def lower_step(program: Program, mesh: jax.sharding.Mesh, phase: Phase) -> jax.stages.Lowered:
    """`program.step_for(phase)` lowered for `phase`'s batches (`batch_shapes`, sharded over (data, fsdp)) and the
    state's abstract tree: what a run's first step of that phase compiles (`aot` compiles the same)."""
    state = checkpointing.abstract_like(program.abstract, program.shardings)
    batch = {k: jax.ShapeDtypeStruct(s, dtype, sharding=sharding.batch_sharding(mesh, len(s)))
             for k, (s, dtype) in batch_shapes(phase).items()}
    with jax.set_mesh(mesh):
        return program.step_for(phase).lower(state, batch)


def compile_phases(config, program: Program, mesh: jax.sharding.Mesh, phases: list[Phase]) -> dict[int, Callable]:
    """{phase index: compiled train step} of `phases`, each checked against the memory a device may use
    (`memory.device_budget`), for config.precompile "always", or "auto" on an accelerator; else {}.

    Raises:
      ValueError: (one line, `memory.does_not_fit`) a phase's step needs more memory than a device may use.
    """
    device = mesh.local_devices[0]  # this process's: every process checks its own devices, all stop alike
    mode = config.get("precompile", "auto")
    if mode == "never" or (mode == "auto" and device.platform == "cpu"):
        return {}
    budget, source = memory.device_budget(device, config.get("device_memory_gib", 0.0))
    compiled = {}
    for phase in phases:
        with jax.set_mesh(mesh):
            step = lower_step(program, mesh, phase).compile()
        needed = memory.needed_bytes(step)
        if budget is not None and needed > budget:
            accumulation = memory.accumulation_estimate(step, budget, phase.batch_size, phase.grad_accum_steps,
                                                        sharding.batch_axis_size(mesh))
            raise ValueError(memory.does_not_fit(phase, needed, budget, source, accumulation))
        compiled[phase.index] = step
    return compiled


def batch_shapes(phase: Phase) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{field: (global shape, dtype)} of `phase`'s batches: those of `bert_jax.data.pretraining.loader` (B = batch_size,
    L = max_seq_length, P = max_predictions_per_seq), or packed (`bert_jax.data.pretraining.packing`: P the row's
    prediction slots, K instances per row, next_sentence_labels [B, K])."""
    from bert_jax.data.pretraining import packing

    b, length, p = phase.batch_size, phase.max_seq_length, phase.max_predictions_per_seq
    k = phase.max_instances or packing.default_max_instances(length)
    if phase.packing:
        p = packing.row_predictions(p, k)
    shapes = {name: ((b, length), np.int32) for name in ("input_ids", "token_type_ids", "attention_mask")}
    shapes.update({"masked_lm_positions": ((b, p), np.int32), "masked_lm_ids": ((b, p), np.int32),
                   "masked_lm_weights": ((b, p), np.float32), "next_sentence_labels": ((b,), np.int32)})
    if phase.packing:
        shapes.update({"segment_ids": ((b, length), np.int32), "position_ids": ((b, length), np.int32),
                       "next_sentence_labels": ((b, k), np.int32), "next_sentence_positions": ((b, k), np.int32),
                       "next_sentence_weights": ((b, k), np.float32)})
    return shapes


def global_batch(local: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> Batch:
    """Per-process numpy batch -> global jax.Arrays sharded over (data, fsdp) (`steps.global_batch`), for
    BATCH_FIELDS and, in a packed batch, PACKED_FIELDS."""
    return steps.global_batch(local, mesh, BATCH_FIELDS + tuple(k for k in PACKED_FIELDS if k in local))


# ----------------------------------------------------------------------------- the loop


def iterator(phase: Phase, config: ml_collections.ConfigDict, state: dict | None,
             order: data_stream.Stream | None = None):
    """The checkpointable iterator of `phase`'s batches (this process's rows of global batch_size; seed
    config.seed + 1000 * phase index; config.data_workers grain worker processes; without the documents
    config.eval_fraction holds out), positioned at `state` (its `get_state()`) when given; `order`: a packed or
    dynamic input's global order (`_packed_resume`)."""
    from bert_jax.data.pretraining import loader

    it = loader.make_pretraining_iterator(
        phase.data_dir, global_batch_size=phase.batch_size, seed=config.seed + 1000 * phase.index,
        max_seq_length=phase.max_seq_length, max_predictions_per_seq=phase.max_predictions_per_seq,
        **phase.masking(), packing=phase.packing, max_instances=phase.max_instances or None,
        fill_rows=phase.fill_rows, worker_count=config.get("data_workers", 0), stream=order,
        documents=evaluation.training_documents(config, phase.data_dir))
    if state is not None:
        it.set_state(state)
    return it


def _packed_resume(states: list[dict], phase: Phase, is_main: bool) -> tuple[dict | None, data_stream.Stream]:
    """A packed or dynamic input's checkpointed states (one per process that wrote them) -> (this process's
    state to restore, or None, and the global order to read). On the same process count: its own state,
    bit-identical. On another: no state, and the units none of the old processes finished
    (`stream.Stream.after`), re-split over this run's processes, with one line saying so."""
    if len(states) == jax.process_count():
        state = states[jax.process_index()]
        return state, data_stream.Stream.from_state(state)
    order = data_stream.Stream.from_state(states[0]).after([s["grain"] for s in states])
    if is_main:
        unit = "documents" if states[0].get("dynamic") else "instances"
        epoch, left = order.remaining_in_epoch(int(states[0]["num_instances"]))
        print(f"train: phase {phase.index}'s input ran on {len(states)} processes, this run has "
              f"{jax.process_count()}: it continues in epoch {epoch} with {left} of {states[0]['num_instances']} "
              f"{unit} left, re-split over the processes (the old processes' open shuffle and packing windows are "
              f"drawn again; not bit-identical to an uninterrupted run)", file=sys.stderr, flush=True)
    return None, order


def _phase_at(phases: list[Phase], step: int) -> Phase:
    return next((p for p in phases if p.start <= step < p.end), phases[-1])


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       max_steps: int | None = None) -> dict[str, float]:
    """Pre-trains according to `config`, writing checkpoints and summaries under `workdir`.

    Args:
      config: a bert_jax/configs/pretrain.py config.
      workdir: run directory (local or gs://): checkpoints/, tensorboard/; resumes from the latest
        checkpoint in it.
      max_steps: stop after this global step (for tests and benchmarks); default total_steps.

    Returns:
      The last logged metrics (floats), with "step" = the step the run stopped at.

    Raises:
      ValueError / FileNotFoundError: bad config, mesh or data (before compiling).
      FloatingPointError: a non-finite loss, naming the step.
    """
    with loop.Preemption() as preemption:  # from the start: a SIGTERM during restore or compilation counts too
        return _train(config, workdir, max_steps, preemption)


def _train(config, workdir: str, max_steps: int | None, preemption: loop.Preemption) -> dict[str, float]:
    storage.check_output_dir(workdir, "--workdir")
    mesh = steps.make_mesh(config.mesh)
    recipe, (config, init) = config.model, sources.pretraining_source(config, workdir)
    config.model.dtype = bert_config.resolve_dtype(config.model.dtype, mesh.devices.flat[0].platform)  # recorded
    phases = validate(config, mesh)
    vocab_file, do_lower_case = sources.data_vocabulary(config, init)
    program = build(config, mesh)
    changes = sources.architecture_changes(recipe, init.config) if init is not None else {}
    if changes:
        sources.say(f"train: architecture from config.init_checkpoint={init.path!r}: "
                           + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items()))
    with lease.hold(workdir, "train", config.lease_timeout_s, config.lease_heartbeat_s) as held:  # before any write
        if jax.process_index() == 0:  # before the first step: what fine-tuning and conversion read
            sources.write_run_files(workdir, program.model.config, vocab_file, do_lower_case)
        run = _Run(config, workdir, mesh, phases, program, max_steps, init, preemption, held)
        try:
            with jax.set_mesh(mesh):
                run.runner.run(run.start_state, run.batches())
        finally:
            run.close()
    return dict(run.logged, step=run.runner.step)  # the metrics of the last log, and where the run stopped


class _Run:
    """One pre-training run's moving parts for `loop.Runner`: state (restored or fresh), phase and its
    data iterator, checkpointer, summaries, and the runner's actions (log, evaluate, save, preempted)."""

    def __init__(self, config, workdir: str, mesh, phases: list[Phase], program: Program, max_steps: int | None,
                 init: sources.Initialisation | None, preemption: loop.Preemption, held: lease.Lease | None = None):
        self.config, self.mesh, self.phases, self.program = config, mesh, phases, program
        self.preemption, self.lease = preemption, held
        self.is_main = jax.process_index() == 0
        self.checkpointer = checkpointing.Checkpointer(storage.join(workdir, "checkpoints"),
                                                       max_to_keep=config.keep_checkpoints)
        latest, state, data_state = self.checkpointer.restore_newest_readable(
            checkpointing.abstract_like(program.abstract, program.shardings))
        if latest is None:
            state = initial_state(config, program, mesh, init)
        elif self.is_main:
            print(f"train: resumed from the checkpoint at step {latest}", file=sys.stderr, flush=True)
        settings = rollback.Settings.from_config(config.rollback)
        self.start_state = state
        step = int(jax.device_get(state.step))
        self.phase = _phase_at(phases, step)
        self.steps = compile_phases(config, program, mesh, phases[self.phase.index:])  # before step 0: fits or stops
        resume = data_state["iterator"] if data_state and data_state["phase"] == self.phase.index else None
        order = None
        if isinstance(resume, dict) and "per_process" in resume:  # packed / dynamic: each process's own state
            resume, order = _packed_resume(resume["per_process"], self.phase, self.is_main)
        self.iterator = iterator(self.phase, config, resume, order)
        self.writer = summaries.open_writer(workdir, self.is_main)
        self.rollbacks = rollback.Rollbacks(settings, self.checkpointer, (program.abstract, program.shardings),
                                            self.writer, config.checkpoint_every)
        self.rollbacks.resumed(latest, data_state)
        self.config_json = json.loads(config.to_json())
        # MFU's denominator: the config's figure, else the published peak of a known TPU; none on CPU.
        self.peak_flops = (config.peak_tflops_per_device * 1e12
                           or flops.peak_flops_per_device(mesh.devices.flat[0].device_kind))
        self.logged: dict[str, float] = {}
        self.held_out = evaluation.HeldOut(config) if evaluation.enabled(config) else None
        if self.held_out is not None:
            self.held_out.batches(self.phase)  # drawn before the first step: a failure costs no training
        self.runner = loop.Runner(
            step, min(config.total_steps, max_steps or config.total_steps), desc="pre-training",
            log_every=config.log_every, log=self.log, eval_every=config.eval_every,
            evaluate=self.evaluate if self.held_out is not None else None, checkpoint_every=config.checkpoint_every,
            save=self.save, checkpointed=latest, preempted=self.preempted,
            guard=self.rollbacks.guard if settings.enabled else None, rollback=self.rollbacks if settings.enabled else None)

    def batches(self):
        """(train step, global batch) per step; at a phase switch, a checkpoint first, then the next
        phase's data (new shapes: the step compiles)."""
        while True:
            if self.runner.step == self.phase.end:
                self.runner.checkpoint()
            if self.runner.step == self.phase.end:  # (the check before the save may have rolled back)
                self.phase = self.phases[self.phase.index + 1]
                self.rollbacks.guard.restart()
                self.iterator.close()
                self.iterator = iterator(self.phase, self.config, None)
                if self.held_out is not None:
                    self.held_out.batches(self.phase)  # the new phase's evaluation batches, before its first step
                if self.phase.index not in self.steps:  # compiled at its first step, not before step 0
                    self.runner.recompiling()
            batch = global_batch(next(self.iterator), self.mesh)
            self.rollbacks.drew()
            yield self.steps.get(self.phase.index) or self.program.step_for(self.phase), batch

    def log(self, step: int, values: dict[str, float], lap: steps.Lap) -> dict[str, str]:
        """Writes the step's metrics with the window's throughput (sequences, tokens, MFU) as "train"."""
        phase = self.phase
        seqs = lap.examples_per_second(phase.batch_size)
        values.update(sequences_per_second=seqs, tokens_per_second=seqs * phase.max_seq_length)
        if self.peak_flops:
            model_flops = flops.train_flops_per_step(self.program.model.config, phase.batch_size,
                                                     phase.max_seq_length, batch_shapes(phase)["masked_lm_ids"][0][1])
            values["mfu"] = model_flops * lap.steps / lap.seconds / (self.peak_flops * self.mesh.devices.size)
        self.logged = dict(values, step=step, phase=phase.index)
        summaries.write_scalars(self.writer, step, values, "train")
        return dict(loss=f"{values['loss']:.3f}", mlm_acc=f"{values['mlm_accuracy']:.3f}",
                    nsp_acc=f"{values['nsp_accuracy']:.3f}", phase=str(phase.index))

    def evaluate(self, step: int, state: TrainState) -> None:
        """The held-out metrics (`evaluation`: config.eval_data_dir or config.eval_fraction) as "eval"."""
        values = _evaluate(self.program.eval_step, state.params, self.config, self.phase, self.mesh,
                           self.held_out.batches(self.phase))
        summaries.write_scalars(self.writer, step, values, "eval")

    def preempted(self, step: int) -> bool:
        """SIGTERM seen. One process alone may have seen it: on several hosts, Orbax's preemption sync (the
        JAX coordination service) makes all of them agree on the step."""
        if jax.process_count() == 1:
            return self.preemption.requested
        return self.checkpointer.manager.reached_preemption(step)

    def save(self, step: int, state: TrainState) -> None:
        """Checkpoints the state, phase and data position at `step` (after checking that the workdir's lease is still
        this run's)."""
        if self.lease is not None:
            self.lease.check()
        self.checkpointer.save(step, state, {"phase": self.phase.index, "iterator": self.iterator_state(),
                                             "rollback": self.rollbacks.saving(step)},
                               self.config_json)

    def iterator_state(self) -> dict:
        """The data position to checkpoint. A static unpacked stream's state is the same on every process; a
        packed or dynamic one (grain's state) differs per process, and Orbax writes JSON items from the first
        process only, so all processes' states are gathered: {"per_process": [state of process 0, ...]}."""
        state = self.iterator.get_state()
        if "grain" not in state:
            return state
        return {"per_process": distributed.allgather_json(state)}

    def close(self) -> None:
        self.runner.close()
        self.iterator.close()
        self.checkpointer.close()
        if self.writer is not None:
            self.writer.close()


def _evaluate(eval_fn, params, config, phase: Phase, mesh, batches=None) -> dict[str, float]:
    """`evaluation.pooled` metrics of `eval_fn` over `batches` (local batches, e.g. `evaluation.HeldOut`'s), or
    when None over the first config.eval_batches batches of config.eval_data_dir's static instances in order."""
    from bert_jax.data.pretraining import loader

    it = None
    if batches is None:
        batches = it = loader.make_pretraining_iterator(config.eval_data_dir, global_batch_size=phase.batch_size,
                                                          shuffle=False, num_epochs=1)
    try:
        return evaluation.pooled(eval_fn, params, batches, lambda local: global_batch(local, mesh), config.eval_batches)
    finally:
        if it is not None:
            it.close()


def main(argv):
    from absl import app, flags, logging

    from bert_jax import configs

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
    f = flags.FLAGS
    try:
        distributed.initialize_from_flags(command="train")
        metrics = train_and_evaluate(configs.mark_explicit_model_fields(f.config), f.workdir, max_steps=f.max_steps)
    except errors.USER_ERRORS as e:
        error = errors.exit_with("train", e)
        watchdog.exit_on_error(error.code)  # several processes: a lost peer's line wins; never returns there
        raise error from None
    watchdog.stop()
    if jax.process_index() == 0:
        print(json.dumps(metrics))
    return 0


def _define_flags():
    from absl import flags
    from bert_jax import configs

    configs.define_flag("Pre-training config file, e.g. pretrain:tiny (a recipe name, or a config file path).")
    flags.DEFINE_string("workdir", None, "Run directory: checkpoints and TensorBoard summaries.")
    flags.DEFINE_integer("max_steps", None, "Stop after this step (default: config.total_steps).")
    distributed.define_flags()
    flags.mark_flags_as_required(["config", "workdir"])


if __name__ == "__main__":
    from bert_jax import console

    console.install()
    _define_flags()
    errors.run(main, "train")
