"""Launch scripts: the TPU VM pod launcher's --dry_run, and the laptop launcher's error path."""

import subprocess

from conftest import ROOT

POD = [str(ROOT / "launch" / "tpu_vm_pod.sh")]


def test_tpu_vm_pod_dry_run_prints_every_command():
    result = subprocess.run(POD + ["--name", "bert-base", "--zone", "europe-west4-a", "--accelerator_type", "v3-32",
                                   "--workdir", "gs://bucket/run", "--dry_run", "--delete", "--",
                                   "--config", "pretrain:base", "--config.model.dtype=bfloat16"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert len(lines) == 7
    create, pack, scp, install, start, follow, delete = lines
    assert "tpu-vm create bert-base --zone europe-west4-a --accelerator-type v3-32" in create
    assert "tar" in pack and "--exclude=.venv" in pack
    assert "tpu-vm scp" in scp and "--worker=all" in scp
    assert "--worker=all" in install and "pip" in install and "tpu" in install
    assert "--worker=all" in start and "bert_jax.train" in start and "--jax_distributed" in start
    assert "gs://bucket/run" in start and "pretrain.py:base" in start and "bfloat16" in start
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
    assert (tmp_path / "calls").read_text().split() == ["create", "tar", "scp", "delete"]
    assert result.returncode == 3, result.stderr


def test_tpu_vm_pod_requires_its_flags():
    result = subprocess.run(POD + ["--name", "x", "--zone", "z", "--workdir", "gs://b", "--dry_run"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.strip() == "tpu_vm_pod.sh: --accelerator_type is required"
    result = subprocess.run(POD + ["--bogus"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown option --bogus" in result.stderr


def test_local_cpu_launcher_runs_the_entry_point_with_8_devices(tmp_path):
    result = subprocess.run([str(ROOT / "launch" / "local_cpu.sh"), "--config", "pretrain:tiny",
                             "--workdir", str(tmp_path), "--config.mesh.data=8", "--config.mesh.tensor=1",
                             "--config.phases[0].data_dir=/nonexistent"],
                            capture_output=True, text=True, timeout=300)
    # The entry point ran, a mesh of exactly 8 devices was built (else "needs 8 devices"), and it stopped
    # on the missing data.
    assert result.returncode != 0
    assert "train: config.phases[0].data_dir='/nonexistent': no metadata.json" in result.stderr
