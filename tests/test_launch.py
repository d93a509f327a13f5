"""Launch scripts: the TPU VM pod launcher's --dry_run, and the laptop launcher's error path."""

import os
import re
import subprocess

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration  # every test runs commands in subprocesses

POD = [str(ROOT / "launch" / "tpu_vm_pod.sh")]


def _archive(stdout: str) -> str:
    """The path of the archive a --dry_run built (its "archive: PATH" line)."""
    return next(line.removeprefix("archive: ") for line in stdout.splitlines() if line.startswith("archive: "))


def test_tpu_vm_pod_dry_run_prints_every_command():
    result = subprocess.run(POD + ["--name", "bert-base", "--zone", "europe-west4-a", "--accelerator_type", "v3-32",
                                   "--workdir", "gs://bucket/run", "--dry_run", "--delete", "--",
                                   "--config", "pretrain:base", "--config.model.dtype=bfloat16"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    os.remove(_archive(result.stdout))
    lines = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert len(lines) == 7
    create, pack, scp, install, start, follow, delete = lines
    assert "tpu-vm create bert-base --zone europe-west4-a --accelerator-type v3-32" in create
    assert "git archive HEAD" in pack
    assert "tpu-vm scp" in scp and "--worker=all" in scp
    assert "--worker=all" in install and "pip" in install and "tpu" in install
    assert "--worker=all" in start and "bert_jax.train" in start and "--jax_distributed" in start
    assert "gs://bucket/run" in start and "pretrain:base" in start and "bfloat16" in start
    assert "--worker=0" in follow and "run.log" in follow
    # The log is followed only while worker 0's process runs, so the script reaches the deletion.
    start, follow = start.replace("\\", ""), follow.replace("\\", "")  # undo printf %q
    assert "& echo $! > run.pid" in start and "tail -n +1 -F --pid=$(cat run.pid) run.log" in follow
    assert "tpu-vm delete bert-base" in delete


def test_tpu_vm_pod_deletes_the_vm_when_the_script_fails(tmp_path):
    """With --delete the VM goes however the script ends: here the copy to the workers fails."""
    for name, script in (("gcloud", 'echo "$4" >> {calls}\n[ "$4" = scp ] && exit 3\nexit 0'),
                         ("tar", "echo tar >> {calls}")):  # fakes: nothing is created, packed or copied
        (tmp_path / name).write_text("#!/bin/sh\n" + script.format(calls=tmp_path / "calls") + "\n")
        (tmp_path / name).chmod(0o755)
    result = subprocess.run(POD + ["--name", "n", "--zone", "z", "--accelerator_type", "v3-8", "--workdir", "gs://b",
                                   "--delete"], capture_output=True, text=True, timeout=60,
                            env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert (tmp_path / "calls").read_text().split() == ["create", "scp", "delete"]
    assert result.returncode == 3, result.stderr


def test_tpu_vm_pod_ships_the_package_only(tmp_path):
    """From a checkout holding a 100 MB data/ folder (and a demo_run/ output), the archive the launcher ships
    is the package's sources: under 2 MB, no data."""
    import tarfile

    checkout = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(checkout)], check=True, timeout=120)
    (checkout / "data").mkdir()
    with open(checkout / "data" / "corpus.txt", "wb") as f:
        f.write(b"x" * (100 << 20))
    (checkout / "demo_run").mkdir()
    (checkout / "demo_run" / "summary.json").write_text("{}")
    result = subprocess.run([str(checkout / "launch" / "tpu_vm_pod.sh"), "--name", "n", "--zone", "z",
                             "--accelerator_type", "v3-8", "--workdir", "gs://b/run", "--dry_run"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    archive = _archive(result.stdout)
    try:
        assert os.path.getsize(archive) < 2 << 20
        with tarfile.open(archive) as tar:
            names = tar.getnames()
    finally:
        os.remove(archive)
    assert "bert_jax/training/pretraining.py" in names and "setup.cfg" in names and "bert_jax/configs/pretrain.py" in names
    assert not [n for n in names if n.startswith(("data", "demo_run", "tests", "benchmarks", ".git"))]


def test_tpu_vm_pod_help_lists_every_option():
    script = (ROOT / "launch" / "tpu_vm_pod.sh").read_text()
    options = set(re.findall(r"^\s+(--[a-z_]+)\)", script, re.M))
    assert {"--no_create", "--spot", "--queued", "--delete", "--dry_run"} <= options
    result = subprocess.run(POD + ["--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for option in options:
        assert re.search(rf"^  {option}\b", result.stdout, re.M), option
    assert "resume after a preemption" in result.stdout


def test_tpu_vm_pod_refuses_local_paths_on_a_multi_host_slice():
    for args, flag in ((["--workdir", "/tmp/run", "--"], "--workdir"),
                       (["--workdir", "gs://b/run", "--", "--config.phases[0].data_dir=data/docs"],
                        "--config.phases[0].data_dir")):
        result = subprocess.run(POD + ["--name", "n", "--zone", "z", "--accelerator_type", "v4-32", "--dry_run",
                                       *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.strip().splitlines() == [
            f"tpu_vm_pod.sh: {flag}={args[1] if flag == '--workdir' else 'data/docs'} is a local path, but v4-32 "
            "spans several hosts: use a gs:// URI"]
    single = subprocess.run(POD + ["--name", "n", "--zone", "z", "--accelerator_type", "v4-8", "--dry_run",
                                   "--workdir", "/tmp/run"], capture_output=True, text=True, timeout=60)
    assert single.returncode == 0, single.stderr
    os.remove(_archive(single.stdout))


def test_tpu_vm_pod_spot_and_queued_resources():
    result = subprocess.run(POD + ["--name", "n", "--zone", "z", "--accelerator_type", "v5litepod-16", "--workdir",
                                   "gs://b/run", "--spot", "--queued", "--delete", "--dry_run"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert "queued-resources create n --node-id n" in lines[0] and "--spot" in lines[0]
    assert "ACTIVE" in lines[1]
    assert "queued-resources delete n" in lines[-1] and "--force" in lines[-1]
    os.remove(_archive(result.stdout))


def test_tpu_vm_pod_requires_its_flags():
    result = subprocess.run(POD + ["--name", "x", "--zone", "z", "--workdir", "gs://b", "--dry_run"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.strip() == "tpu_vm_pod.sh: --accelerator_type is required"
    result = subprocess.run(POD + ["--bogus"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown option --bogus" in result.stderr


# What tests/conftest.py puts in this process's environment (8 simulated devices among them): a user's shell has none
# of it, so the launcher's own defaults are what its test runs with.
CONFTEST_VARIABLES = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                      "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def test_local_cpu_launcher_runs_the_entry_point_with_8_devices(tmp_path):
    """In a user's environment (no XLA_FLAGS: the 8 devices are the launcher's default, not the suite's)."""
    env = {k: v for k, v in os.environ.items() if k not in CONFTEST_VARIABLES}
    result = subprocess.run([str(ROOT / "launch" / "local_cpu.sh"), "--config", "pretrain:tiny",
                             "--workdir", str(tmp_path), "--config.mesh.data=8", "--config.mesh.tensor=1",
                             "--config.phases[0].data_dir=/nonexistent"],
                            capture_output=True, text=True, timeout=300, env=env)
    # The entry point ran, a mesh of exactly 8 devices was built (else "needs 8 devices, but 1 are available"),
    # and it stopped on the missing data.
    assert result.returncode != 0
    assert "needs 8 devices" not in result.stderr, result.stderr[-2000:]
    assert "train: config.phases[0].data_dir='/nonexistent': no metadata.json" in result.stderr, result.stderr[-2000:]
