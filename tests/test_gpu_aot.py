"""GPU programs compiled on this CPU (jax's CUDA plugin and a GPU target config, the `gpu-aot` extra): the targets,
the gpu kernel set's train step on an H100 (fused attention in every layer, no float32 dot in the encoder),
flash_gpu's kernels at every block size it admits, the report's one-line error where a program does not fit,
and a run whose second phase does not fit stopping before step 0. Also the kernel counter (`program_stats`)
against hand-counted programs."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.configs import pretrain
from bert_jax.model.kernels import flash_gpu, layer_norm_gpu
from bert_jax.training import aot, pretraining, sharding
from bert_jax.training.compiled import memory, program_stats, targets
from conftest import ROOT, SMALL_VOCAB_SIZE

pytest.importorskip("jax_plugins.xla_cuda13", reason="jax's CUDA plugin is not installed (pip install -e '.[gpu-aot]')")


def test_target_names():
    """GPU machines as users name them, TPU slices as before; anything else one line naming both."""
    t = targets.target("8xH100")
    assert (t.platform, t.hosts, t.per_host, t.gpu.description) == ("gpu", 1, 8, "NVIDIA H100 80GB HBM3")
    t = targets.target("2x8xa100-80gb")
    assert (t.hosts, t.per_host, t.num_devices, t.peak_flops) == (2, 8, 16, 312e12)
    assert targets.target("h200").hbm_bytes / targets.GIB == pytest.approx(141.0, abs=0.1)
    assert targets.target("v5litepod-16").chip is targets.TOPOLOGIES["v5e-16"]
    with pytest.raises(ValueError, match=r"^--topology 'rtx9' is not one of .* nor a GPU machine .*'h100-sxm'"):
        targets.target("rtx9")


def test_memory_budget_follows_jax_preallocation(monkeypatch):
    """A GPU program may use XLA_PYTHON_CLIENT_MEM_FRACTION (0.75 unless set) of the card's memory."""
    h100 = targets.target("h100")
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert h100.memory_budget()[0] == 0.75 * 84942979072
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".95")
    assert h100.memory_budget()[0] == 0.95 * 84942979072
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "2")
    with pytest.raises(ValueError, match="^XLA_PYTHON_CLIENT_MEM_FRACTION='2' is not a fraction in"):
        h100.memory_budget()


def test_compile_only_devices_are_the_named_gpus():
    devices = targets.target("2x4xh100-pcie").devices()
    assert len(devices) == 8 and {d.platform for d in devices} == {"gpu"}
    assert {d.device_kind for d in devices} == {"NVIDIA H100 PCIe"}
    assert sorted({d.process_index for d in devices}) == [0, 1]


def test_program_stats_counts_hand_computed_programs():
    """On this CPU's own compiler: y = 2x + 1 over f32[1024] is one kernel reading and writing 4 KiB; the same in
    a fori_loop of 5 trips runs its body's kernel 5 times; a gradient's kernel is attributed to the backward pass.
    A hand-written module: an operand given twice counts once, an aliased one as the output."""
    x = jnp.zeros(1024, jnp.float32)
    stats = program_stats.analyze(jax.jit(lambda x: 2 * x + 1).lower(x).compile().as_text())
    assert (stats.kernel_launches, stats.hbm_bytes) == (1, 8192)

    def loop(x):
        return jax.lax.fori_loop(0, 5, lambda i, x: jnp.sin(x) * 2 + i, x)

    stats = program_stats.analyze(jax.jit(loop).lower(x).compile().as_text())
    body = [k for k in stats.kernels if k.count == 5 and k.hbm_bytes >= 5 * 8192]
    assert body, [(k.name, k.kind, k.count, k.hbm_bytes) for k in stats.kernels]
    # A gradient's one fused kernel is the backward pass (JAX's transpose of its jvp).
    stats = program_stats.analyze(jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(x) ** 2))).lower(x).compile().as_text())
    assert stats.by("phase") == {"backward": (1, 8192)}
    assert program_stats.arrays("(bf16[8,128]{1,0}, f32[8]{0:S(1)})") == [
        program_stats.Array("bf16", (8, 128), 2048, 0), program_stats.Array("f32", (8,), 32, 1)]
    with pytest.raises(ValueError, match="no ENTRY computation"):
        program_stats.analyze("not hlo")
    # A Pallas call given one buffer twice reads it once; the operand its output aliases is the output, written.
    module = """HloModule m
ENTRY %main (p: f32[256], q: f32[256]) -> f32[256] {
  %p = f32[256]{0} parameter(0)
  %q = f32[256]{0} parameter(1)
  ROOT %c = f32[256]{0} custom-call(%p, %p, %q), custom_call_target="__gpu$xla.gpu.triton", output_to_operand_aliasing={{}: (2, {})}
}"""
    stats = program_stats.analyze(module)
    assert (stats.kernel_launches, stats.hbm_bytes, stats.count("pallas")) == (1, 2048, 1)


def _mini(batch_size: int):
    config = pretrain.get_config("mini")
    config.phases[0].batch_size = config.phases[1].batch_size = batch_size
    return config


@pytest.mark.slow
def test_mini_train_step_on_h100_holds_flash_attention_and_no_float32_dot():
    """`model.dtype=auto` compiles bfloat16 for a GPU; every layer's attention is flash_gpu (one forward, two
    backward Triton calls), its two residual LayerNorms layer_norm_gpu's kernels, and every matrix product of the
    encoder takes bfloat16 operands."""
    config = _mini(8)
    config.model.num_hidden_layers = 2
    devices = targets.target("h100").devices()
    phase = pretraining.resolve_phases(config)[0]
    compiled, _ = aot.compile_phase(config, devices, phase)
    stats = program_stats.analyze(compiled.as_text())
    layers = config.model.num_hidden_layers
    pallas = [k.op_name for k in stats.kernels if k.kind == "pallas"]
    assert sum("/flash_attention_" in name for name in pallas) == 3 * layers
    # Each layer's two LayerNorm(residual + dropout(x)): one fused kernel forward, one backward.
    assert sum("/dropout_add_layer_norm/" in name for name in pallas) == 2 * layers
    assert sum("/dropout_add_layer_norm_backward/" in name for name in pallas) == 2 * layers
    assert len(pallas) == 7 * layers, pallas
    encoder_dots = [k for k in stats.kernels if k.dot_dtypes and "/encoder/" in k.op_name]
    assert len(encoder_dots) >= 6 * layers  # four projections and two feed-forward matmuls a layer, forward alone
    assert [(k.op_name, k.dot_dtypes) for k in encoder_dots if set(k.dot_dtypes) != {"bf16"}] == []
    assert aot.resolved(config, "gpu").model.dtype == "bfloat16" and aot.resolved(config, "cpu").model.dtype == "float32"


@pytest.mark.slow
@pytest.mark.parametrize("length", [128, 512])
def test_flash_gpu_kernels_compile_for_sm90_at_every_block(length):
    """flash_gpu's forward and both backward kernels, with dropout, lower through Triton and compile for sm_90 at
    every block `check` admits on a GPU (powers of two from 16 dividing the length, up to 128), and in the packed
    layout with the projections' biases at the default block."""
    device = targets.target("h100").devices()[0]
    sharded = jax.sharding.SingleDeviceSharding(device)
    shape = (2, 2, length, 64)
    q = jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=sharded)
    seg = jax.ShapeDtypeStruct((2, length), jnp.int32, sharding=sharded)
    seed = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharded)
    blocks = [b for b in (16, 32, 64, 128)
              if flash_gpu.check(jnp.bfloat16, 64, length, 0.1, block_q=b, block_k=b) is None]
    assert blocks == [16, 32, 64, 128]
    for block in blocks:
        def loss(q, k, v, seg, seed):
            out = flash_gpu.attention(q, k, v, seg, dropout_rate=0.1, seed=seed, block_q=block, block_k=block)
            return jnp.sum(out.astype(jnp.float32))

        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, q, q, seg, seed).compile().as_text()
        assert program_stats.analyze(text).count("pallas") == 3, block
    # The packed projections with their biases (what the gpu set calls), the dk / dv kernel writing in place.
    packed = jax.ShapeDtypeStruct((2, length, 3, 2, 64), jnp.bfloat16, sharding=sharded)
    bias = jax.ShapeDtypeStruct((2, 64), jnp.float32, sharding=sharded)

    def packed_loss(packed, bq, bk, bv, seg, seed):
        out = flash_gpu.attention(packed, None, None, seg, dropout_rate=0.1, seed=seed, layout="BL3NH",
                                  bias=(bq, bk, bv), scale=0.125)
        return jnp.sum(out.astype(jnp.float32))

    text = jax.jit(jax.grad(packed_loss, argnums=(0, 1, 2, 3))).lower(packed, bias, bias, bias, seg, seed).compile()
    assert program_stats.analyze(text.as_text()).count("pallas") == 3


@pytest.mark.parametrize("hidden", [768, 1024])
def test_layer_norm_gpu_kernels_compile_for_sm90(hidden):
    """layer_norm_gpu's forward and backward kernels, with dropout, lower through Triton and compile for sm_90 at
    BERT-Base's hidden size (768 in 1,024 masked lanes) and BERT-Large's, at the length 512."""
    device = targets.target("h100").devices()[0]
    sharded = jax.sharding.SingleDeviceSharding(device)
    x = jax.ShapeDtypeStruct((4, 512, hidden), jnp.bfloat16, sharding=sharded)
    vector = jax.ShapeDtypeStruct((hidden,), jnp.float32, sharding=sharded)
    seed = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharded)

    def loss(x, residual, scale, bias, seed):
        out = layer_norm_gpu.dropout_add_layer_norm(x, residual, scale, bias, epsilon=1e-12, dropout_rate=0.1,
                                                    seed=seed)
        return jnp.sum(out.astype(jnp.float32))

    text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3))).lower(x, x, vector, vector, seed).compile().as_text()
    assert program_stats.analyze(text).count("pallas") == 2


@pytest.mark.integration
def test_aot_report_of_a_program_that_does_not_fit_is_one_line():
    """With 0.05% of an A100's memory for jax (about 20 MiB), the one-layer tiny model's first phase does not fit:
    exit 1, the report printed (with the kernels XLA's rematerialisation recomputed trying), and the last line names
    the phase, its bytes against the budget, and what to change."""
    env = {**os.environ, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.0005"}
    result = subprocess.run([sys.executable, "-m", "bert_jax.aot", "--config", "pretrain:tiny", "--topology",
                             "a100-40gb", "--config.model.num_hidden_layers=1", "--config.phases[0].batch_size=512",
                             "--config.phases[1].batch_size=8"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "DOES NOT FIT" in result.stdout and "kernels per step" in result.stdout, result.stdout
    # XLA recomputed what it could before giving up: said, with the matrix multiplications among them.
    assert re.search(r"recomputed by XLA to fit the memory \(rematerialisation\): \d+ kernels, [1-9]\d* of them matrix "
                     r"multiplications", result.stdout), result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("aot: phase 0 (batch 512 x 64) needs ") and "GiB per device, more than the 0.02 GiB" in last
    assert "--config.model.remat_policy=dots" in last and "'--config.phases[0].batch_size'" in last, last


@pytest.mark.integration
def test_run_whose_second_phase_does_not_fit_stops_before_step_0(small_instances, tmp_path):
    """config.precompile=always on this CPU with a memory limit between what the two phases need: the run stops
    at its start with one line naming phase 1, before any step or checkpoint; above both, it trains through the
    switch on the steps compiled before step 0, its config recording model.dtype resolved."""
    config = pretrain.get_config("tiny")
    config.model.vocab_size = SMALL_VOCAB_SIZE
    config.phases[0].data_dir = str(small_instances / "p1")
    config.phases[1].data_dir = str(small_instances / "p2")
    config.phases[0].batch_size = 8
    config.phases[1].batch_size = 64
    config.total_steps, config.warmup_steps = 20, 2
    config.mesh.num_devices = 1
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    program = pretraining.build(config, mesh)
    needs = [memory.needed_bytes(pretraining.lower_step(program, mesh, p).compile())
             for p in pretraining.resolve_phases(config)]
    assert needs[1] > 2 * needs[0]
    limit = (needs[0] + needs[1]) / 2 / memory.GIB

    def train(workdir, limit_gib):
        return subprocess.run([sys.executable, "-m", "bert_jax.train", "--config", "pretrain:tiny", "--workdir",
                               str(workdir), f"--config.model.vocab_size={SMALL_VOCAB_SIZE}",
                               f"--config.phases[0].data_dir={small_instances / 'p1'}",
                               f"--config.phases[1].data_dir={small_instances / 'p2'}",
                               "--config.phases[0].batch_size=8", "--config.phases[1].batch_size=64",
                               "--config.total_steps=20", "--config.warmup_steps=2", "--config.mesh.num_devices=1",
                               "--config.precompile=always", f"--config.device_memory_gib={limit_gib}"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)

    workdir = tmp_path / "run"
    result = train(workdir, limit)
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("train: phase 1 (batch 64 x 128) needs ") and f"config.device_memory_gib={limit:g}" in last
    assert "Traceback" not in result.stderr
    assert not (workdir / "checkpoints").exists() or not any((workdir / "checkpoints").iterdir())
    assert not (workdir / "metrics.jsonl").exists()
    # The limit above both: the run trains through the switch on the steps compiled before step 0.
    result = train(tmp_path / "fits", 2 * needs[1] / memory.GIB)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics["step"] == 20 and metrics["phase"] == 1 and np.isfinite(metrics["loss"])
    # model.dtype=auto is recorded resolved: float32 on this CPU.
    from bert_jax.checkpoints import checkpointing

    checkpointer = checkpointing.Checkpointer(str(tmp_path / "fits" / "checkpoints"))
    try:
        assert checkpointer.restore_config(20)["model"]["dtype"] == "float32"
    finally:
        checkpointer.close()
