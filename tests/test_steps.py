"""The one step machinery: aot compiles the program train runs, the step compiles once per phase, the
mesh presets reach fine-tuning, the generic step accumulates any loss to the whole batch's gradient,
the update shared by every batch shape takes the same steps, and the timer leaves pauses out."""

import time

import flax.traverse_util
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax.training import aot, losses, pretraining, sharding, steps
from bert_jax.model import heads, modeling
from bert_jax.checkpoints import weights
from bert_jax.tasks import finetune
from bert_jax.configs import glue as glue_config
from bert_jax.configs import pretrain
from conftest import SMALL_VOCAB_SIZE


@pytest.fixture(scope="module")
def two_phase_run(small_instances, tmp_path_factory):
    """A 4-step, two-phase run of the tiny config with grad_accum_steps=2 on 8 devices (batches of 16: one
    row per device in each micro-batch) but the second phase's own grad_accum_steps=1, the Program `train` built
    for it captured."""
    config = pretrain.get_config("tiny")
    config.model.vocab_size = SMALL_VOCAB_SIZE
    config.phases[0].data_dir, config.phases[1].data_dir = str(small_instances / "p1"), str(small_instances / "p2")
    config.phases[0].batch_size = config.phases[1].batch_size = 16
    config.phases[0].fraction = config.phases[1].fraction = 0.5
    config.total_steps, config.warmup_steps, config.grad_accum_steps = 4, 2, 2
    config.phases[1].grad_accum_steps = 1
    config.log_every, config.checkpoint_every = 2, 100
    built = []
    original = pretraining.build
    pretraining.build = lambda *args: built.append(original(*args)) or built[-1]
    try:
        metrics = pretraining.train_and_evaluate(config, str(tmp_path_factory.mktemp("two_phase")))
    finally:
        pretraining.build = original
    assert metrics["step"] == 4 and metrics["phase"] == 1 and len(built) == 1
    return config, built[0]


@pytest.mark.slow
def test_train_step_compiles_once_per_phase(two_phase_run):
    _, program = two_phase_run
    # phase 1 (length 64, 2 micro-batches: config.grad_accum_steps) and phase 2 (length 128, its own 1), 2 steps each
    assert program.train_steps.keys() == {1, 2} and program.train_steps[2] is program.train_step
    assert program.train_steps[2]._cache_size() == 1 and program.train_steps[1]._cache_size() == 1


def test_aot_lowers_the_program_train_runs(two_phase_run):
    """The step aot compiles (here for the CPU devices) and the step the run above dispatched lower to the same
    StableHLO, for each phase with its own number of micro-batches (2, then 1), from a real batch and the real state's
    shardings."""
    config, program = two_phase_run
    mesh = steps.make_mesh(config.mesh)
    state = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                   program.abstract, program.shardings)
    texts = []
    for phase in pretraining.resolve_phases(config):
        it = pretraining.iterator(phase, config, None)
        batch = pretraining.global_batch(next(it), mesh)
        it.close()
        with jax.set_mesh(mesh):
            ran = program.step_for(phase).lower(state, batch).as_text()
        lowered, aot_mesh = aot.lower_phase(config, jax.devices(), phase)
        assert aot_mesh.devices.tolist() == mesh.devices.tolist()
        compiled = lowered.as_text()
        # phase 0's input_ids as 2 micro-batches of 8 rows (`steps._accumulate`); phase 1's whole batch of 16
        assert (f"tensor<2x8x{phase.max_seq_length}xi32>" in compiled) == (phase.index == 0)
        assert compiled == ran, f"phase {phase.index}: aot's program differs from the one train runs"
        texts.append(ran)
    # Without accumulation the program is a different one: the comparison above can fail.
    config = config.copy_and_resolve_references()
    config.grad_accum_steps = 1
    assert aot.lower_phase(config, jax.devices(), pretraining.resolve_phases(config)[0])[0].as_text() != texts[0]


def test_mesh_from_a_fine_tuning_config_takes_presets():
    config = glue_config.get_config("mrpc")
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
    assert dict(steps.make_mesh(config.mesh).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    config.mesh.preset = "cpu"  # (-1, 1, 1): the preset wins over the sizes
    assert dict(steps.make_mesh(config.mesh).shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    config.mesh.preset = "v9-1"
    with pytest.raises(ValueError, match=r"^mesh preset 'v9-1' is not one of"):
        steps.make_mesh(config.mesh)
    with pytest.raises(ValueError, match=r"^config.mesh.num_devices=9 is not in \[0, 8\]"):
        steps.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, num_devices=9)))


def test_optimizer_from_pretraining_and_fine_tuning_configs():
    pre = pretrain.get_config("tiny")
    _, schedule = steps.create_optimizer(pre)
    assert float(schedule(pre.warmup_steps)) == pytest.approx(pre.learning_rate)
    assert float(schedule(pre.total_steps)) == pytest.approx(0.0, abs=1e-12)
    ft = glue_config.get_config("mrpc")  # warmup_proportion of the steps
    _, schedule = steps.create_optimizer(ft, 100)
    assert float(schedule(5)) == pytest.approx(0.5 * ft.learning_rate)
    assert float(schedule(10)) == pytest.approx(ft.learning_rate)
    pre.optimizer = "sgd"
    with pytest.raises(ValueError, match="'sgd' is not 'adamw' or 'lamb'"):
        steps.create_optimizer(pre)


def test_given_parameters_replace_the_initialised_ones_on_a_mesh():
    """`create_state(params=...)`: the given arrays in place, every other parameter and the optimizer state as
    the whole initialisation gives them, all in their shardings; a path the model lacks is a KeyError."""
    bert = modeling.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=32, max_position_embeddings=16)
    model = heads.BertForSequenceClassification(bert, num_labels=3)
    mesh = sharding.make_mesh(2, 2, 2)
    tx, _ = steps.create_optimizer(glue_config.get_config("mnli"), 10)
    ids = jnp.zeros((1, 7), jnp.int32)
    init = steps.state_init(model, tx, 0, ids, ids, ids)
    abstract, shardings = steps.state_shardings(init, mesh)
    whole = steps.create_state(init, mesh, shardings)
    flat_abstract = flax.traverse_util.flatten_dict(abstract.params, sep="/")
    flat_shardings = flax.traverse_util.flatten_dict(shardings.params, sep="/")
    rng = np.random.default_rng(0)
    values = {p: rng.standard_normal(flat_abstract[p].shape).astype(flat_abstract[p].dtype)
              for p in flat_abstract if p.startswith("bert/encoder/")}
    given = {p: jax.device_put(v, flat_shardings[p]) for p, v in values.items()}
    state = steps.create_state(init, mesh, shardings, params=given)
    got = flax.traverse_util.flatten_dict(state.params, sep="/")
    expected = flax.traverse_util.flatten_dict(whole.params, sep="/")
    assert got.keys() == expected.keys() and len(values) > 10
    for p in got:
        assert got[p].sharding == flat_shardings[p], p
        np.testing.assert_array_equal(np.asarray(got[p]), values[p] if p in values else np.asarray(expected[p]),
                                      err_msg=p)
    for a, b in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(whole.opt_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(KeyError, match="no parameter 'bert/nothing'"):
        steps.create_state(init, mesh, shardings, params={"bert/nothing": jnp.zeros(3)})


def test_init_params_of_some_paths_equal_the_whole_trees():
    """`weights.init_params(paths=...)` (the heads a converted encoder lacks) gives the whole tree's values."""
    bert = modeling.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=32, max_position_embeddings=16, scan_layers=False)
    whole = flax.traverse_util.flatten_dict(weights.init_params(bert, seed=5), sep="/")
    paths = ["nsp/kernel", "mlm_output_bias", "mlm_transform/kernel", "bert/encoder/layer_1/output/kernel"]
    some = weights.init_params(bert, seed=5, paths=paths)
    assert sorted(some) == sorted(paths)
    for p in paths:
        np.testing.assert_array_equal(np.asarray(some[p]), np.asarray(whole[p]), err_msg=p)
    assert float(np.abs(np.asarray(some["nsp/kernel"])).max()) > 0  # drawn, not zeros


def _classifier_on_one_device(bert: modeling.BertConfig, num_labels: int, task: str):
    """(model, mesh, tx, schedule, initial state on the host, state shardings) of a GLUE classifier over
    `bert` on one device, the GLUE task's optimizer over 10 steps. The state is built once (one init
    program); `jax.device_put(initial, shardings)` gives each run its own copy (steps donate theirs)."""
    model = heads.BertForSequenceClassification(bert, num_labels=num_labels)
    mesh = sharding.make_mesh(1, 1, 1, jax.devices()[:1])
    tx, schedule = steps.create_optimizer(glue_config.get_config(task), 10)
    ids = jnp.zeros((1, 7), jnp.int32)
    init = steps.state_init(model, tx, 0, ids, ids, ids)
    _, shardings = steps.state_shardings(init, mesh)
    return model, mesh, tx, schedule, jax.device_get(steps.create_state(init, mesh, shardings)), shardings


@pytest.mark.slow
def test_generic_step_accumulates_a_task_loss_to_the_whole_batch():
    """The fine-tuning loss through steps.train_step: 2 micro-batches (the whole batch's row count as
    denominator) give the one-batch update (no dropout)."""
    bert = modeling.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model, mesh, tx, schedule, initial, shardings = _classifier_on_one_device(bert, 3, "mrpc")
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(1, 99, (12, 7), dtype=np.int32), "token_type_ids": np.zeros((12, 7), np.int32),
             "attention_mask": np.ones((12, 7), np.int32), "labels": rng.integers(0, 3, (12,), dtype=np.int32)}
    loss_fn = lambda out, b: losses.classification_loss(out.logits, b["labels"])  # noqa: E731
    results = []
    for k in (1, 2):
        step = steps.jit_train_step(
            lambda *a: finetune.task_loss(*a, model=model, loss_fn=loss_fn), tx, schedule, mesh, shardings,
            grad_accum_steps=k,
            denominators=lambda b: jnp.asarray(b["labels"].shape[0], jnp.float32))
        state = jax.device_put(initial, shardings)
        with jax.set_mesh(mesh):
            state, metrics = step(state, steps.global_batch(batch, mesh))
        results.append((jax.device_get(state.params), jax.device_get(metrics)))
    (p1, m1), (p2, m2) = results
    assert float(m2["loss"]) == pytest.approx(float(m1["loss"]), rel=1e-6)
    assert float(m2["grad_norm"]) == pytest.approx(float(m1["grad_norm"]), rel=1e-5)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), p2, p1)
    with pytest.raises(ValueError, match="^grad_accum_steps=2 needs the whole batch's loss denominators$"):
        steps.train_step(state, steps.global_batch(batch, mesh), tx=tx, schedule=schedule, grad_accum_steps=2,
                          loss_fn=lambda *a: finetune.task_loss(*a, model=model, loss_fn=loss_fn))


@pytest.mark.slow
def test_shared_update_step_equals_the_one_program_step():
    """The update as one program for every batch shape (steps.SharedUpdateStep) takes the one-program
    step's steps: same parameters, optimizer state and metrics after steps at two lengths with dropout,
    called directly and through lower().compile(); one update program serves both lengths; the gradient
    program is the same for another learning rate."""
    bert = modeling.BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=37)
    model, mesh, tx, schedule, initial, shardings = _classifier_on_one_device(bert, 2, "sst2")
    rng = np.random.default_rng(0)
    batches = [{"input_ids": rng.integers(1, 99, (8, n), dtype=np.int32), "token_type_ids": np.zeros((8, n), np.int32),
                "attention_mask": np.ones((8, n), np.int32), "labels": rng.integers(0, 2, (8,), dtype=np.int32)}
               for n in (5, 9, 5)]
    loss_fn = lambda out, b: losses.classification_loss(out.logits, b["labels"])  # noqa: E731
    task = lambda *a: finetune.task_loss(*a, model=model, loss_fn=loss_fn)  # noqa: E731
    results = []
    for shared, ahead in ((False, False), (True, False), (True, True)):
        step = steps.jit_train_step(task, tx, schedule, mesh, shardings, shared_update=shared)
        assert isinstance(step, steps.SharedUpdateStep) == shared
        state, history = jax.device_put(initial, shardings), []
        with jax.set_mesh(mesh):
            batches_in = [steps.global_batch(b, mesh) for b in batches]
            programs = {b["input_ids"].shape: step.lower(state, b).compile() for b in batches_in} if ahead else {}
            for b in batches_in:
                state, metrics = programs.get(b["input_ids"].shape, step)(state, b)
                history.append(jax.device_get(metrics))
        assert int(state.step) == 3
        results.append((jax.device_get((state.params, state.opt_state)), history))
        if shared:
            assert step._cache_size() == (0 if ahead else 2)  # ahead: nothing compiled by the calls
    # the gradient program holds no learning rate: a sweep's runs share it, and only the update differs
    other_config = glue_config.get_config("sst2")
    other_config.learning_rate = 3e-4
    other_tx, other_schedule = steps.create_optimizer(other_config, 10)
    other = steps.jit_train_step(task, other_tx, other_schedule, mesh, shardings, shared_update=True)
    with jax.set_mesh(mesh):
        lowered = [x.gradients.lower(state, batches_in[0]).as_text() for x in (step, other)]
        grads, metrics = step.gradients(state, batches_in[0])
        updates = [x.update.lower(state, grads, metrics).as_text() for x in (step, other)]
    assert lowered[0] == lowered[1] and updates[0] != updates[1]
    (fused, fused_history), others = results[0], results[1:]
    assert fused_history[0]["loss"] != fused_history[2]["loss"]  # the steps moved the parameters
    for tree, history in others:
        for m, f in zip(history, fused_history):
            assert m.keys() == f.keys()
            for name in f:
                assert float(m[name]) == pytest.approx(float(f[name]), rel=1e-6), name
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8), tree, fused)


def test_chrono_leaves_pauses_out():
    chrono = steps.Chrono()
    time.sleep(0.05)
    chrono.tick()
    with chrono.paused():
        time.sleep(0.3)
    chrono.tick()
    lap = chrono.lap()
    assert lap.steps == 2 and 0.05 <= lap.seconds < 0.25
    assert lap.examples_per_second(8) == pytest.approx(16 / lap.seconds)
    assert lap.steps_per_second == pytest.approx(2 / lap.seconds)
    chrono.restart()
    assert chrono.lap().steps == 0
