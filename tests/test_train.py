"""Pre-training: sharding rules on every state leaf, mesh equivalence, exact resume after SIGKILL
(also across the phase switch), SIGTERM, config errors, and learning on real data."""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import flax.linen as nn
from flax import traverse_util

from bert_jax.checkpoints import checkpointing
from bert_jax.training import optim, pretraining, sharding, steps, summaries
from bert_jax.model import flops
from bert_jax.data import corpus, tokenization
from bert_jax.data.pretraining import procedure
from bert_jax.configs import pretrain
from conftest import ROOT, SMALL_VOCAB_SIZE, optimized, xla_flags


STEPS = 20  # the in-process runs' steps


@pytest.fixture
def instances(small_instances):
    """This module trains on the sample text under the small vocabulary (`tests/conftest.py`)."""
    return small_instances


@pytest.fixture
def documents(small_documents):
    return small_documents


def _config(instances, **overrides):
    """The tiny config on the `instances` fixture, batches of 8 (one row per device on data=8), STEPS steps."""
    config = pretrain.get_config("tiny")
    config.model.vocab_size = SMALL_VOCAB_SIZE  # a multiple of 8, so tensor=8 can split it
    config.model.num_attention_heads = 8
    config.phases[0].data_dir = str(instances / "p1")
    config.phases[1].data_dir = str(instances / "p2")
    config.phases[0].batch_size = config.phases[1].batch_size = 8
    config.total_steps = STEPS
    config.warmup_steps = 5
    for k, v in overrides.items():
        config[k] = v
    return config


def _run_steps(config, mesh, num_steps):
    model = pretraining.create_model(config)
    tx, schedule = steps.create_optimizer(config)
    state, shardings = pretraining.create_train_state(model, tx, mesh, config.seed)
    step_fn, _ = pretraining.compile_steps(model, tx, schedule, mesh, shardings)
    phase = pretraining.resolve_phases(config)[0]
    it = pretraining.iterator(phase, config, None)
    losses = []
    with jax.set_mesh(mesh):
        for _ in range(num_steps):
            state, metrics = step_fn(state, pretraining.global_batch(next(it), mesh))
            losses.append(float(metrics["loss"]))
    return state, shardings, np.array(losses)


@pytest.fixture(scope="module")
def single_device_run(small_instances):
    config = _config(small_instances)
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    with optimized():
        return _run_steps(config, mesh, STEPS)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 1, 8), (8, 1, 1)], ids=["2x2x2", "tensor8", "data8"])
def test_meshes_match_a_single_device(shape, instances, single_device_run, optimized_programs):
    """STEPS steps on a mesh of every axis (data, fsdp and tensor 2 each), of tensor parallelism alone and of
    data parallelism alone (the launchers' default mesh, data = all 8 devices) give the single-device losses;
    the state is laid out as written by hand."""
    assert jax.device_count() == 8
    _, _, reference = single_device_run
    state, shardings, losses = _run_steps(_config(instances), sharding.make_mesh(*shape), STEPS)
    assert reference[-1] < reference[0]  # it trains
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    _assert_layout_by_hand(state)


@pytest.mark.slow
def test_reference_kernels_train_the_same_on_a_mesh_as_on_one_device(instances, single_device_run,
                                                                     optimized_programs):
    """kernels=reference (flax's Dropout on JAX's partitionable threefry PRNG, optax clipping): 20 steps
    on a 2x2x2 mesh give the single-device losses, which train, and follow the xla_cpu run's curve
    (different dropout masks: close, not equal)."""
    config = _config(instances)
    config.model.kernels = "reference"
    _, _, on_one = _run_steps(config, sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]), STEPS)
    _, _, on_mesh = _run_steps(config, sharding.make_mesh(2, 2, 2), STEPS)
    np.testing.assert_allclose(on_mesh, on_one, rtol=1e-5)
    assert on_one[-5:].mean() < on_one[:5].mean() - 0.5  # it trains
    _, _, xla_cpu_run = single_device_run
    assert not np.allclose(on_one, xla_cpu_run, rtol=1e-5)  # another dropout stream really ran
    assert abs(on_one[-5:].mean() - xla_cpu_run[-5:].mean()) < 0.25 * abs(xla_cpu_run[0] - xla_cpu_run[-1]) + 0.1


# Every parameter's layout written out by hand (Megatron-style tensor parallelism: column-split QKV,
# intermediate, pooler and MLM transform; row-split attention output and FFN output; vocabulary-split
# embedding table and MLM bias; FSDP over the model dimension), independently of the rules table.
_P = jax.sharding.PartitionSpec
_EXPECTED_LAYOUT = (
    (r"bert/embeddings/word_embeddings/embedding", _P("tensor", "fsdp")),
    (r"bert/embeddings/(position|token_type)_embeddings/embedding", _P(None, "fsdp")),
    (r".*LayerNorm/(scale|bias)", _P("fsdp")),
    (r"bert/encoder/layer_\d+/attention/(query|key|value)_kernel", _P("fsdp", "tensor", None)),
    (r"bert/encoder/layer_\d+/attention/(query|key|value)_bias", _P("tensor", None)),
    (r"bert/encoder/layer_\d+/attention/output_kernel", _P("tensor", None, "fsdp")),
    (r"bert/encoder/layer_\d+/(attention|output)/(output_)?bias", _P("fsdp")),
    (r"bert/encoder/layer_\d+/intermediate/kernel|bert/pooler/kernel|mlm_transform/kernel", _P("fsdp", "tensor")),
    (r"bert/encoder/layer_\d+/intermediate/bias|bert/pooler/bias|mlm_transform/bias|mlm_output_bias", _P("tensor")),
    (r"bert/encoder/layer_\d+/output/kernel", _P("tensor", "fsdp")),
    (r"nsp/kernel", _P("fsdp", None)),
    (r"nsp/bias", _P(None)),
)


def _expected_spec(path):
    matches = [spec for pattern, spec in _EXPECTED_LAYOUT if re.fullmatch(pattern, path)]
    assert len(matches) == 1, f"{path}: {len(matches)} entries of the hand-written layout match"
    return matches[0]


def _assert_layout_by_hand(tree):
    """tree: a TrainState of arrays or of shardings; params and both Adam moments checked leaf by leaf."""
    sharding_of = lambda x: x.sharding if isinstance(x, jax.Array) else x
    adam = tree.opt_state[1][0]
    checked = 0
    for part in (tree.params, adam.mu, adam.nu):
        for path, leaf in traverse_util.flatten_dict(part, sep="/").items():
            assert sharding_of(leaf).spec == _expected_spec(path), path
            checked += 1
    assert checked == 3 * len(traverse_util.flatten_dict(tree.params))
    assert sharding_of(tree.step).spec == _P() and sharding_of(adam.count).spec == _P()


@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 2, 2), (1, 1, 8)], ids=["data8", "2x2x2", "tensor8"])
def test_rules_table_gives_the_hand_written_layout(shape, instances):
    config = _config(instances)
    model = pretraining.create_model(config)
    tx, _ = steps.create_optimizer(config)
    _, shardings = steps.state_shardings(pretraining.state_init(model, tx, 0), sharding.make_mesh(*shape))
    _assert_layout_by_hand(shardings)


def test_config_errors_before_compiling(instances, tmp_path):
    mesh = sharding.make_mesh(8, 1, 1)

    def error(config, kind=ValueError):
        with pytest.raises(kind) as info:
            pretraining.validate(config, mesh)
        message = str(info.value)
        assert "\n" not in message
        return message

    bad = _config(instances)
    bad.phases[0].batch_size = 12
    assert re.search(r"batch_size=12 is not divisible by data\*fsdp=8", error(bad))
    bad = _config(instances)
    bad.phases[1].max_seq_length = 1024
    assert "exceeds config.model.max_position_embeddings=512" in error(bad)
    bad = _config(instances)
    bad.phases[1].data_dir = "/nonexistent/p2"
    assert "config.phases[1].data_dir='/nonexistent/p2': no metadata.json" in error(bad, FileNotFoundError)
    bad = _config(instances)
    bad.phases[1].max_predictions_per_seq = 30
    assert "config.phases[1] wants length 128 / 30 predictions but" in error(bad) and "holds 128 / 20" in error(bad)
    bad = _config(instances)
    bad.model.vocab_size = 1000  # the instances hold ids of the SMALL_VOCAB_SIZE-token vocabulary
    assert f"vocabulary of {SMALL_VOCAB_SIZE} tokens exceeds config.model.vocab_size=1000" in error(bad)
    bad = _config(instances, grad_accum_steps=3)
    assert "does not split into grad_accum_steps=3 micro-batches" in error(bad)
    bad = _config(instances, grad_accum_steps=0)
    assert "config.grad_accum_steps=0 must be at least 1" in error(bad)
    bad = _config(instances)
    bad.phases[1].grad_accum_steps = 3  # a phase's own
    assert "config.phases[1].batch_size=8 does not split into grad_accum_steps=3 micro-batches" in error(bad)
    bad.phases[1].grad_accum_steps = -1
    assert "config.phases[1].grad_accum_steps=-1 must be >= 0 (0: config.grad_accum_steps)" in error(bad)
    bad = _config(instances, eval_data_dir="/nonexistent/eval")
    assert "config.eval_data_dir='/nonexistent/eval': no metadata.json" in error(bad, FileNotFoundError)
    for field in ("log_every", "checkpoint_every", "eval_every", "keep_checkpoints"):
        assert f"config.{field}=0 must be at least 1" in error(_config(instances, **{field: 0}))
    bad = _config(instances, eval_data_dir=str(instances / "p1"))
    bad.phases[1].batch_size = 8 * 100_000  # evaluation in phase 2 takes phase 2's batch
    assert re.search(r"holds \d+ instances, fewer than one batch of 800000", error(bad))
    shutil.copytree(instances / "p2", tmp_path / "p2")
    shard = sorted((tmp_path / "p2").glob("*.array_record"))[-1]
    shard.unlink()  # phase 2's data is read only at the switch: its loss must show now
    bad = _config(instances)
    bad.phases[1].data_dir = str(tmp_path / "p2")
    assert error(bad, FileNotFoundError) == f"{shard}: shard listed in metadata.json is missing"
    bad = _config(instances)
    bad.mesh.num_devices = 9
    with pytest.raises(ValueError, match=r"^config.mesh.num_devices=9 is not in \[0, 8\] \(0: every device\)$"):
        steps.make_mesh(bad.mesh)
    # Two pretend hosts of 4 devices: data=8 gives each 4 of 8 rows; tensor=8 would give both all 8.
    two_hosts = lambda d: d.id // 4  # noqa: E731
    assert sharding.rows_per_process(mesh, 8, two_hosts) == {0: 4, 1: 4}
    sharding.check_process_rows(mesh, 8, two_hosts)
    assert sharding.rows_per_process(sharding.make_mesh(1, 1, 8), 8, two_hosts) == {0: 8, 1: 8}
    with pytest.raises(ValueError, match=r"gives the 2 processes \[8\] batch rows each, not batch_size/2=4"):
        sharding.check_process_rows(sharding.make_mesh(1, 1, 8), 8, two_hosts)
    with pytest.raises(ValueError, match="needs 16 devices, but 8 are available"):
        sharding.make_mesh(4, 4, 1)
    config = _config(instances)
    config.model.vocab_size = SMALL_VOCAB_SIZE + 1
    model, (tx, _) = pretraining.create_model(config), steps.create_optimizer(config)
    abstract, shardings = steps.state_shardings(pretraining.state_init(model, tx, 0), sharding.make_mesh(1, 1, 8))
    with pytest.raises(ValueError, match=r"word_embeddings.*cannot be split 8 ways"):
        sharding.check_divisible(abstract, shardings)


def test_schedule_and_weight_decay_mask():
    schedule = optim.learning_rate_schedule(1e-4, 10, 110)
    assert float(schedule(0)) == 0.0
    assert float(schedule(5)) == pytest.approx(5e-5)
    assert float(schedule(10)) == pytest.approx(1e-4)
    assert float(schedule(60)) == pytest.approx(5e-5)
    assert float(schedule(110)) == pytest.approx(0.0, abs=1e-12)
    mask = traverse_util.flatten_dict(optim.weight_decay_mask(
        {"bert": {"embeddings": {"LayerNorm": {"scale": 1, "bias": 1}, "word_embeddings": {"embedding": 1}},
                  "pooler": {"kernel": 1, "bias": 1}}, "mlm_output_bias": 1,
         "layer": {"attention": {"query_kernel": 1, "query_bias": 1}}}), sep="/")
    assert mask == {"bert/embeddings/LayerNorm/scale": False, "bert/embeddings/LayerNorm/bias": False,
                    "bert/embeddings/word_embeddings/embedding": True, "bert/pooler/kernel": True,
                    "bert/pooler/bias": False, "mlm_output_bias": False,
                    "layer/attention/query_kernel": True, "layer/attention/query_bias": False}


def test_clip_by_global_norm_hand_computed_and_against_optax():
    import jax.numpy as jnp
    import optax

    clip = optim.clip_by_global_norm(1.0)
    # Hand-computed: global norm of (3, 4) and (0,) is 5 -> scaled by 1/5.
    out, _ = clip.update({"a": jnp.array([3.0, 4.0]), "b": jnp.array([0.0])}, clip.init(None))
    np.testing.assert_allclose(out["a"], [0.6, 0.8], rtol=1e-6)
    # Under the threshold: returned unchanged, bit for bit.
    small = {"a": jnp.array([0.3, -0.4]), "b": jnp.array([0.1])}
    out, _ = clip.update(small, clip.init(None))
    assert all(np.array_equal(out[k], small[k]) for k in small)
    # Against optax's select-based version on random trees above and below the threshold.
    rng = np.random.default_rng(0)
    for scale in (1e-3, 10.0):
        tree = {"w": jnp.asarray(scale * rng.standard_normal((64, 48)), jnp.float32),
                "b": jnp.asarray(scale * rng.standard_normal((48,)), jnp.float32)}
        ours, _ = clip.update(tree, clip.init(None))
        ref, _ = optax.clip_by_global_norm(1.0).update(tree, optax.EmptyState())
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-7, atol=0), ours, ref)
    with pytest.raises(ValueError, match="max_norm=0 must be positive"):
        optim.clip_by_global_norm(0)


def test_peak_flops_of_known_devices():
    assert flops.peak_flops_per_device("TPU v3") == 61.5e12  # one TensorCore: half of a 123 TFLOP/s chip
    assert flops.peak_flops_per_device("TPU v4") == 275e12
    assert flops.peak_flops_per_device("TPU v5 lite") == 197e12
    assert flops.peak_flops_per_device(jax.devices()[0].device_kind) is None  # this CPU


@pytest.mark.slow
def test_weight_decay_spares_layernorm_and_biases_of_the_real_model(instances):
    """With zero gradients AdamW's update is -lr * wd * param exactly where decay applies, 0 elsewhere."""
    import jax.numpy as jnp

    config = _config(instances, warmup_steps=0, weight_decay=0.01, learning_rate=1e-3)
    model = pretraining.create_model(config)
    tx, _ = steps.create_optimizer(config)
    params = jax.jit(lambda: nn.unbox(pretraining.state_init(model, tx, 0)()).params)()
    params = jax.tree_util.tree_map(lambda p: p + 1.0, params)  # biases and LayerNorm betas start at 0
    updates, _ = jax.jit(lambda p: tx.update(jax.tree_util.tree_map(jnp.zeros_like, p), tx.init(p), p))(params)
    flat_p, flat_u = (traverse_util.flatten_dict(t, sep="/") for t in (params, updates))
    decayed = sorted(k for k in flat_p if not (k.endswith("bias") or "LayerNorm" in k))
    assert "bert/embeddings/word_embeddings/embedding" in decayed and "nsp/kernel" in decayed
    assert len(decayed) == len(flat_p) - sum(1 for k in flat_p if k.endswith("bias") or "LayerNorm" in k)
    for k, p in flat_p.items():
        expected = -1e-3 * 0.01 * np.asarray(p) if k in decayed else np.zeros_like(p)
        np.testing.assert_allclose(flat_u[k], expected, rtol=1e-6, atol=0, err_msg=k)
    lamb, _ = optim.create_optimizer(optimizer="lamb", learning_rate=0.1, warmup_steps=0, total_steps=10)
    grads = jax.tree_util.tree_map(lambda p: jnp.full_like(p, 0.5), params)
    u, _ = jax.jit(lambda g, p: lamb.update(g, lamb.init(p), p))(grads, params)
    # LAMB: each leaf's update norm is lr * ||p|| (trust ratio), Adam's first step being sign-like.
    for k, leaf in traverse_util.flatten_dict(u, sep="/").items():
        assert float(jnp.linalg.norm(leaf)) == pytest.approx(0.1 * float(jnp.linalg.norm(flat_p[k])), rel=1e-3), k
    with pytest.raises(ValueError, match="'sgd' is not 'adamw' or 'lamb'"):
        optim.create_optimizer(optimizer="sgd")


# ----------------------------------------------------------------------------- subprocess runs


def _cmd(instances, workdir, total_steps=16, extra=(), phase1_data=None):
    return [sys.executable, "-m", "bert_jax.train", "--config", "pretrain:tiny", "--workdir", str(workdir),
            f"--config.phases[0].data_dir={phase1_data or instances / 'p1'}", f"--config.phases[1].data_dir={instances / 'p2'}",
            f"--config.total_steps={total_steps}", "--config.warmup_steps=4", "--config.phases[0].fraction=0.5",
            "--config.phases[1].fraction=0.5", "--config.phases[0].batch_size=8", "--config.phases[1].batch_size=8",
            "--config.checkpoint_every=3", "--config.log_every=4", "--config.keep_checkpoints=50",
            f"--config.model.vocab_size={SMALL_VOCAB_SIZE}", *extra]


def _env():
    return dict(os.environ, XLA_FLAGS=xla_flags(4), PYTHONPATH=str(ROOT))


def _steps(workdir):
    d = workdir / "checkpoints"
    return sorted(int(p) for p in os.listdir(d) if p.isdigit()) if d.is_dir() else []


def _final_params(workdir, step):
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(str(workdir / "checkpoints"), item_names=("state", "data", "config"),
                               options=ocp.CheckpointManagerOptions(read_only=True)) as m:
        restored = m.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return traverse_util.flatten_dict(jax.device_get(restored["state"]["params"]), sep="/")


PACKED = ("--config.phases[0].packing=True", "--config.phases[1].packing=True")


@pytest.fixture(scope="module")
def uninterrupted(small_instances, small_documents, tmp_path_factory):
    """The final parameters of a 16-step run uninterrupted: phase 1 packs dynamic instances drawn from tokenized
    documents, phase 2 packs static instances (`_cmd` with PACKED)."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    result = subprocess.run(_cmd(small_instances, workdir, extra=PACKED, phase1_data=small_documents), cwd=ROOT,
                            env=_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics["step"] == 16 and metrics["phase"] == 1
    assert 8 in _steps(workdir)  # the checkpoint at the phase switch (8 is no multiple of checkpoint_every)
    return _final_params(workdir, 16)


def _kill_at(instances, workdir, at_least, delay, extra=(), phase1_data=None) -> str:
    """Starts a run, SIGKILLs it `delay` seconds after its first checkpoint at a step >= at_least; its stderr."""
    proc = subprocess.Popen(_cmd(instances, workdir, extra=extra, phase1_data=phase1_data), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not [s for s in _steps(workdir) if s >= at_least]:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read()[-3000:])
        time.sleep(0.02)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    return proc.communicate()[1]


@pytest.mark.slow
@pytest.mark.integration
def test_sigkill_then_resume_is_bit_identical(instances, documents, uninterrupted, tmp_path):
    """Phase 1 draws dynamic instances from tokenized documents and packs them, phase 2 packs static instances
    (grain's states in the checkpoint). Killed at a random point inside phase 1, the resumed run crosses the
    switch; killed again at a random point inside phase 2, the run resumed from that checkpoint ends with the
    uninterrupted run's parameters, bit for bit (a difference at either resume would carry through to the end)."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    killed_at = None
    for at_least, phase_end in ((rng.randint(2, 5), 8), (rng.randint(9, 12), 16)):
        delay = rng.uniform(0.0, 0.1)
        print(f"\nseed {seed}: killed {delay:.2f} s after the first checkpoint at a step >= {at_least}")
        err = _kill_at(instances, tmp_path, at_least, delay, extra=PACKED, phase1_data=documents)
        if killed_at is not None:  # the second kill hit a run resumed from the first
            assert f"train: resumed from the checkpoint at step {killed_at}" in err, err[-3000:]
        killed_at = max(_steps(tmp_path))
        print(f"last checkpoint before the kill: step {killed_at}")
        assert killed_at < phase_end
    result = subprocess.run(_cmd(instances, tmp_path, extra=PACKED, phase1_data=documents), cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"train: resumed from the checkpoint at step {killed_at}" in result.stderr
    resumed = _final_params(tmp_path, 16)
    assert resumed.keys() == uninterrupted.keys()
    for k in resumed:
        np.testing.assert_array_equal(resumed[k], uninterrupted[k], err_msg=k)


@pytest.mark.slow
@pytest.mark.integration
def test_sigterm_saves_and_exits_cleanly(instances, tmp_path):
    proc = subprocess.Popen(_cmd(instances, tmp_path, total_steps=10_000, extra=["--config.checkpoint_every=1000"]),
                            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not (tmp_path / "tensorboard").is_dir():
        time.sleep(0.1)
    time.sleep(3.0)  # some steps in
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    stopped = json.loads(out.strip().splitlines()[-1])["step"]
    match = re.search(r"SIGTERM: checkpoint saved at step (\d+), exiting", err)
    assert match, err[-2000:]
    step = int(match.group(1))
    assert _steps(tmp_path) == [step] and 0 < step < 10_000
    assert stopped == step


@pytest.mark.integration
def test_config_error_is_one_line_from_the_cli(instances, tmp_path):
    cmd = _cmd(instances, tmp_path, extra=["--config.phases[1].data_dir=/nonexistent"])
    result = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "train: config.phases[1].data_dir='/nonexistent': no metadata.json" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.integration
def test_checkpoint_restores_onto_another_mesh(instances, uninterrupted, tmp_path_factory):
    # The uninterrupted run used 4 devices on `data`; restore its final state onto 8 devices as 2x2x2.
    workdir = next(p for p in tmp_path_factory.getbasetemp().iterdir() if re.fullmatch(r"uninterrupted\d+", p.name))
    config = pretrain.get_config("tiny")  # what the subprocess ran
    config.model.vocab_size = SMALL_VOCAB_SIZE
    model, (tx, _) = pretraining.create_model(config), steps.create_optimizer(config)
    mesh = sharding.make_mesh(2, 2, 2)
    abstract, shardings = steps.state_shardings(pretraining.state_init(model, tx, 0), mesh)
    checkpointer = pretraining.checkpointing.Checkpointer(str(workdir / "checkpoints"))
    state, data = checkpointer.restore(16, pretraining.checkpointing.abstract_like(abstract, shardings))
    checkpointer.close()
    assert data["phase"] == 1 and int(state.step) == 16
    word = state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert word.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
    restored = traverse_util.flatten_dict(jax.device_get(state.params), sep="/")
    for k, v in uninterrupted.items():
        np.testing.assert_array_equal(restored[k], v, err_msg=k)


@pytest.mark.slow
def test_non_finite_loss_stops_with_the_step_and_keeps_checkpoints(instances, tmp_path):
    config = _config(instances, checkpoint_every=2, log_every=100, keep_checkpoints=1)
    config.mesh.num_devices = 1
    pretraining.train_and_evaluate(config, str(tmp_path), max_steps=4)
    assert _steps(tmp_path) == [4]  # keep_checkpoints=1 removed the one at step 2
    config.learning_rate = 1e12  # diverges at once when resumed
    config.rollback.enabled = False  # stops at the bad step, as without rollbacks (tests/test_long_runs.py: with)
    with pytest.raises(FloatingPointError) as info:
        pretraining.train_and_evaluate(config, str(tmp_path))
    step = int(re.fullmatch(r"non-finite loss \S+ \(gradient norm \S+\) at step (\d+); the last checkpoint is kept",
                            str(info.value)).group(1))
    assert step in (4, 5)  # the resumed run's first or second step
    steps = _steps(tmp_path)
    assert steps[-1] == 4  # nothing saved after the bad step; the last good checkpoint intact
    good = _final_params(tmp_path, 4)
    assert all(np.isfinite(v).all() for v in good.values())


# The Gutenberg run's vocabulary: trained on the corpus itself (its first GUTENBERG_VOCAB_LINES lines). A fifth of
# Google's 30,522 tokens: the embedding table, the MLM output and their Adam moments dominate the tiny model's step.
GUTENBERG_VOCAB_SIZE, GUTENBERG_VOCAB_LINES = 4096, 20_000

# How far under the baselines that do not learn the held-out losses must end (nats per target / per sequence).
# MLM: a context-blind model reaches about the unigram cross-entropy; reshaping the unigram toward the held-out
# books (a temperature, another smoothing) gains at most 0.008 nats on these targets, and 0.02 is well past that.
# NSP: a label-blind model reaches at best the entropy of the held-out labels' own frequencies (had it known them);
# 0.01 nats under it is the smallest gain counted as the head reading the text.
MLM_MARGIN_NATS, NSP_MARGIN_NATS = 0.02, 0.01


def _no_learning_baselines(train_dir, eval_batches, vocab_size):
    """What a model that does not learn from the text scores on exactly the targets of `eval_batches`: the
    cross-entropy of the training instances' masked-target frequencies (add-one smoothed: the unigram a
    context-blind model learns), the accuracy of always naming the targets' own most frequent token, the entropy
    of the labels' own NotNext rate (the loss of a label-blind model that knew it) and the majority label's
    accuracy. Counted here, not by the library (`masked_token_log_prior` also starts the MLM bias)."""
    instances = list(procedure.iterate_instances(train_dir))
    counts = 1.0 + np.bincount(np.concatenate([i["masked_lm_ids"] for i in instances]), minlength=vocab_size,
                               weights=np.concatenate([i["masked_lm_weights"] for i in instances]))
    log_q = np.log(counts / counts.sum())
    ids = np.concatenate([b["masked_lm_ids"].ravel() for b in eval_batches])
    w = np.concatenate([b["masked_lm_weights"].ravel() for b in eval_batches])
    labels = np.concatenate([b["next_sentence_labels"] for b in eval_batches])
    p = labels.mean()
    return {"unigram_mlm_loss": float(-(w * log_q[ids]).sum() / w.sum()),
            "most_frequent_mlm_accuracy": float(np.bincount(ids, weights=w).max() / w.sum()),
            "nsp_prior_loss": float(-(p * np.log(p) + (1 - p) * np.log(1 - p))),
            "majority_nsp_accuracy": float(max(p, 1 - p)), "targets": float(w.sum()), "labels": len(labels)}


@pytest.mark.slow
def test_learns_on_real_gutenberg_data(data_dir, tmp_path, optimized_programs):
    """The tiny config with a GUTENBERG_VOCAB_SIZE-token vocabulary trained on the corpus and the recipes' MLM
    bias (the log unigram prior: the head starts at what a context-blind model reaches), 100 steps on five
    Gutenberg books, evaluated on two held-out books, compared on exactly the held-out targets with what does not
    learn (`_no_learning_baselines`): the held-out MLM loss ends MLM_MARGIN_NATS under the unigram cross-entropy
    and its accuracy above always naming the most frequent target; the held-out NSP loss ends NSP_MARGIN_NATS
    under the entropy of the held-out labels' prior.

    NSP *accuracy* is not claimed above the majority label's: the labels are not balanced (as in the original, a
    one-sentence chunk always gets a random next segment, and at length 64 many Gutenberg chunks are one
    sentence: about 60% NotNext), and 100 steps make the head better calibrated than the prior (the loss) before
    they make it right more often; that takes about 2,000 steps (`benchmarks/nsp_learning.py`)."""
    from bert_jax.data.pretraining import loader
    from bert_jax.data import vocab

    vocab.train_vocab([str(data_dir / "corpus" / "gutenberg-sentences.txt")], GUTENBERG_VOCAB_SIZE,
                      str(tmp_path / "vocab.txt"), max_sentences=GUTENBERG_VOCAB_LINES)
    tok = tokenization.Tokenizer(str(tmp_path / "vocab.txt"))
    books = list(corpus.read_sentence_documents([str(data_dir / "corpus" / "gutenberg-sentences.txt")],
                                                corpus.ReadStats()))
    assert len(books) >= 10
    options = procedure.InstanceOptions(max_seq_length=64, max_predictions_per_seq=10)
    # five books to train on (more instances than the run's 3,200), the last two held out
    for name, part in (("p1", books[:5]), ("eval", books[-2:])):
        procedure.create_pretraining_data(part, tok, str(tmp_path / name), options=options, dupe_factor=1,
                                            num_shards=1)
    config = pretrain.get_config("tiny")
    config.phases = [pretrain.phase(64, 10, 1.0, str(tmp_path / "p1"), 32)]
    config.model.vocab_size = GUTENBERG_VOCAB_SIZE
    config.mlm_bias_init = "log_prior"  # as pretrain:transfer and pretrain:demo
    config.total_steps, config.log_every, config.checkpoint_every = 100, 10, 100
    config.mesh.num_devices = 1  # a laptop-sized run: one device is faster than 8 simulated ones
    config.eval_data_dir, config.eval_every, config.eval_batches = str(tmp_path / "eval"), 50, 16
    config.peak_tflops_per_device = 2.0  # a CPU has no published peak: MFU only with one given
    history = []
    original_write, original_evaluate = summaries.write_scalars, pretraining._evaluate
    summaries.write_scalars = lambda writer, step, values, prefix: (history.append((step, prefix, values)),
                                                                    original_write(writer, step, values, prefix))
    # A slow evaluation (2 s, more than a 10-step window here) must not show in the throughput.
    pretraining._evaluate = lambda *args: (time.sleep(2), original_evaluate(*args))[1]
    try:
        final = pretraining.train_and_evaluate(config, str(tmp_path / "run"))
    finally:
        summaries.write_scalars, pretraining._evaluate = original_write, original_evaluate
    evals = [v for step, prefix, v in history if prefix == "eval"]
    train_logs = [v for step, prefix, v in history if prefix == "train"]
    assert len(evals) == 2  # eval_step at steps 50 and 100
    # the batches the evaluation read (`pretraining._evaluate`: in order, eval_batches of the phase's batch size)
    eval_batches = [b for b, _ in zip(loader.make_pretraining_iterator(
        str(tmp_path / "eval"), global_batch_size=32, shuffle=False, num_epochs=1), range(16))]
    base = _no_learning_baselines(tmp_path / "p1", eval_batches, GUTENBERG_VOCAB_SIZE)
    assert base["labels"] == 16 * 32 and base["targets"] == evals[1]["num_predictions"]
    last = train_logs[-1]
    print(f"\nheld-out at steps 50 / 100: MLM loss {evals[0]['mlm_loss']:.3f} / {evals[1]['mlm_loss']:.3f} against "
          f"{base['unigram_mlm_loss']:.3f} for the unigram, MLM accuracy {evals[0]['mlm_accuracy']:.3f} / "
          f"{evals[1]['mlm_accuracy']:.3f} against {base['most_frequent_mlm_accuracy']:.3f} for the most frequent "
          f"target, NSP loss {evals[0]['nsp_loss']:.3f} / {evals[1]['nsp_loss']:.3f} against "
          f"{base['nsp_prior_loss']:.3f} for the label prior, NSP accuracy {evals[1]['nsp_accuracy']:.3f} against "
          f"{base['majority_nsp_accuracy']:.3f} for the majority label")
    assert final["step"] == 100
    assert evals[1]["mlm_loss"] < base["unigram_mlm_loss"] - MLM_MARGIN_NATS, (evals, base)
    assert evals[1]["mlm_accuracy"] > base["most_frequent_mlm_accuracy"], (evals, base)
    assert evals[1]["mlm_loss"] < evals[0]["mlm_loss"], evals  # still learning between the evaluations
    assert evals[1]["nsp_loss"] < base["nsp_prior_loss"] - NSP_MARGIN_NATS, (evals, base)
    assert {"learning_rate", "grad_norm", "sequences_per_second", "tokens_per_second", "mfu"} <= last.keys()
    assert last["tokens_per_second"] == pytest.approx(64 * last["sequences_per_second"])
    rates = {step: v["sequences_per_second"] for step, prefix, v in history if prefix == "train"}
    typical = np.median(list(rates.values()))
    assert rates[60] > 0.6 * typical, (rates[60], typical)  # the window after the evaluation at step 50
    step_flops = 3 * 32 * flops.forward_flops_per_sequence(pretraining.create_model(config).config, 64, 10)
    assert last["mfu"] == pytest.approx(step_flops * last["sequences_per_second"] / 32 / 2e12, rel=1e-6)
    assert list((tmp_path / "run" / "tensorboard").iterdir())  # event files written


def test_evaluation_pools_predictions_over_batches(instances):
    """_evaluate's MLM figures are per prediction over all batches, NSP per sequence: checked with a
    stand-in eval step whose "loss" is the mean masked_lm_id (MLM) or label (NSP) of its batch, against
    the same means over every evaluated instance read directly."""
    config = _config(instances, eval_data_dir=str(instances / "p1"), eval_batches=3)
    phase = pretraining.resolve_phases(config)[0]
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])

    def fake_eval(params, batch):
        w = np.asarray(batch["masked_lm_weights"])
        ids, labels = np.asarray(batch["masked_lm_ids"]), np.asarray(batch["next_sentence_labels"])
        return {"mlm_loss": (ids * w).sum() / w.sum(), "mlm_accuracy": (w * (ids % 2)).sum() / w.sum(),
                "nsp_loss": labels.mean(), "nsp_accuracy": labels.mean(), "num_predictions": w.sum()}

    with jax.set_mesh(mesh):
        result = pretraining._evaluate(fake_eval, None, config, phase, mesh)
    rows = list(procedure.iterate_instances(str(instances / "p1")))[: 3 * phase.batch_size]
    assert len(rows) == 3 * phase.batch_size
    w = np.concatenate([r["masked_lm_weights"] for r in rows])
    ids = np.concatenate([r["masked_lm_ids"] for r in rows])
    labels = np.array([int(r["next_sentence_labels"]) for r in rows])
    counts = [sum(r["masked_lm_weights"].sum() for r in rows[i:i + phase.batch_size]) for i in range(0, len(rows), phase.batch_size)]
    assert len(set(counts)) > 1, counts  # batches of unequal prediction counts, or the test proves less
    assert result["mlm_loss"] == pytest.approx((ids * w).sum() / w.sum(), rel=1e-6)
    assert result["mlm_accuracy"] == pytest.approx((w * (ids % 2)).sum() / w.sum(), rel=1e-6)
    assert result["nsp_accuracy"] == pytest.approx(labels.mean(), rel=1e-6)
    assert result["num_predictions"] == w.sum()
    assert result["loss"] == pytest.approx(result["mlm_loss"] + result["nsp_loss"])


@pytest.fixture(scope="module")
def articles(data_dir, small_vocab, tmp_path_factory):
    """A small real corpus of many documents: the first 20 WikiText-2 valid articles, tokenized under the small
    vocabulary (`tests/conftest.py`)."""
    from bert_jax.data.pretraining import document_shards

    out = tmp_path_factory.mktemp("articles") / "docs"
    docs = list(corpus.read_wikitext_documents([str(data_dir / "corpus" / "wikitext-2" / "valid.txt")],
                                               corpus.ReadStats()))[:20]
    document_shards.tokenize_documents(iter(docs), tokenization.Tokenizer(str(small_vocab)), str(out), num_shards=2)
    return out


def _held_out_config(instances, articles, **overrides):
    """`_config` (its train step: one device) on one phase of `articles`' documents (length 64, whole-word
    masking), 20% of them held out, evaluated every step on 2 batches."""
    config = _config(instances, **{**dict(eval_fraction=0.2, eval_every=1, eval_batches=2, log_every=1), **overrides})
    config.phases = [pretrain.phase(64, 10, 1.0, str(articles), 8, do_whole_word_mask=True)]
    config.mesh.num_devices = 1
    return config


@pytest.mark.integration
def test_held_out_documents_give_eval_metrics(instances, articles, tmp_path):
    """config.eval_fraction: a run on tokenized documents evaluates on the documents it holds out: "eval" records
    with MLM and NSP accuracy in metrics.jsonl at every evaluation, on the same instances each time."""
    final = pretraining.train_and_evaluate(_held_out_config(instances, articles), str(tmp_path / "run"), max_steps=2)
    assert final["step"] == 2
    evals = summaries.read_metrics(str(tmp_path / "run"), "eval")
    assert [e["step"] for e in evals] == [1, 2]
    for e in evals:
        assert 0 <= e["mlm_accuracy"] <= 1 and 0 <= e["nsp_accuracy"] <= 1 and np.isfinite(e["loss"])
    assert evals[0]["num_predictions"] == evals[1]["num_predictions"] > 0  # the same held-out instances


def test_held_out_settings_are_one_line_errors_before_anything_is_written(instances, articles, documents, tmp_path):
    def error(config):
        with pytest.raises(ValueError) as info:
            pretraining.train_and_evaluate(config, str(tmp_path / "run"))
        assert not (tmp_path / "run").exists()
        message = str(info.value)
        assert "\n" not in message
        return message

    for share in (1.0, -0.1, 1.5):
        assert error(_held_out_config(instances, articles, eval_fraction=share)) == \
            f"config.eval_fraction={share} must be in (0, 1) (0: no held-out documents)"
    assert error(_held_out_config(instances, articles, eval_fraction=0.95)).startswith(
        "config.eval_fraction=0.95 holds out 19 of 20 documents, leaving 1 for training; it needs at least 2 "
        f"(config.phases[0].data_dir={str(articles)!r})")
    assert "holds out 1 of 20 documents; evaluation needs at least 2" in error(
        _held_out_config(instances, articles, eval_fraction=0.05))
    assert "are both set" in error(_held_out_config(instances, articles, eval_data_dir=str(documents)))
    static = _held_out_config(instances, articles)
    static.phases = [pretrain.phase(64, 10, 1.0, str(instances / "p1"), 8)]
    assert error(static).startswith(f"config.eval_fraction=0.2 holds out tokenized documents, but "
                                    f"config.phases[0].data_dir={str(instances / 'p1')!r} holds static instances")


def test_gradient_accumulation_keeps_rows_on_their_devices(instances):
    """On data=8, the accumulating step moves no batch rows between devices: its compiled program has
    the gradient all-reduce and nothing else (a contiguous micro-batch split adds an all-gather)."""
    config = _config(instances, grad_accum_steps=2)
    config.phases[0].batch_size = 16  # 2 micro-batches of one row per device
    mesh = sharding.make_mesh(8, 1, 1)
    model = pretraining.create_model(config)
    tx, schedule = steps.create_optimizer(config)
    abstract, shardings = steps.state_shardings(pretraining.state_init(model, tx, config.seed), mesh)
    abstract = checkpointing.abstract_like(abstract, shardings)
    batch = next(pretraining.iterator(pretraining.resolve_phases(config)[0], config, None))
    step_fn, _ = pretraining.compile_steps(model, tx, schedule, mesh, shardings, grad_accum_steps=2)
    with jax.set_mesh(mesh):
        hlo = step_fn.lower(abstract, pretraining.global_batch(batch, mesh)).compile().as_text()
    ops = {op for op in ("all-gather", "collective-permute", "all-to-all", "all-reduce") if f" {op}(" in hlo
           or f" {op}-start(" in hlo}
    assert ops == {"all-reduce"}, ops


@pytest.mark.slow
@pytest.mark.parametrize("kernel_set", ["reference", "xla_cpu"])
def test_gradient_accumulation_matches_one_big_batch(instances, kernel_set):
    """k micro-batches give the update of the whole batch (no dropout), though they hold different
    numbers of masked positions; with either kernel set."""
    config = _config(instances, warmup_steps=0)  # a non-zero learning rate at step 0
    config.phases[0].batch_size = 32  # micro-batches of 8 rows: their prediction counts differ
    config.model.kernels = kernel_set
    config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = 0.0
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model = pretraining.create_model(config)
    tx, schedule = steps.create_optimizer(config)
    batch = next(pretraining.iterator(pretraining.resolve_phases(config)[0], config, None))
    counts = batch["masked_lm_weights"].reshape(-1, 4, batch["masked_lm_weights"].shape[1]).sum(axis=(0, 2))
    assert len(set(counts.tolist())) > 1, counts  # the micro-batches differ, or the test proves less
    results = []
    fresh, shardings = pretraining.create_train_state(model, tx, mesh, 0)
    fresh = jax.device_get(fresh)
    initial = fresh.params
    for k in (1, 4):
        state = jax.device_put(fresh, shardings)  # the step donates its state: a copy for each k
        step_fn, _ = pretraining.compile_steps(model, tx, schedule, mesh, shardings, grad_accum_steps=k)
        with jax.set_mesh(mesh):
            state, metrics = step_fn(state, pretraining.global_batch(batch, mesh))
        results.append((jax.device_get(state.params), {k_: float(v) for k_, v in metrics.items()}))
    (p1, m1), (p4, m4) = results
    for name in ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy"):
        assert m4[name] == pytest.approx(m1[name], rel=1e-5), name
    assert m4["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)
    assert m4["num_predictions"] == m1["num_predictions"] == batch["masked_lm_weights"].sum()
    moved = jax.tree_util.tree_map(lambda a, b: float(np.abs(a - b).max()), p1, initial)
    assert min(jax.tree_util.tree_leaves(moved)) > 0  # the step changed every parameter
    # The same parameters, to within 1% of the largest change the step made: the accumulated gradient sums in
    # another order, and Adam's first step divides each gradient by its own magnitude, so the rounding of a
    # near-zero gradient (a rare token's embedding row) shows in full in its update.
    atol = 1e-2 * max(jax.tree_util.tree_leaves(moved))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=atol), p4, p1)
