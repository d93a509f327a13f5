"""The TPU path as the guides give it (README.md's quick path, docs/tpu-pods.md): the `bert_jax.aot` check compiles
the program the launch command trains (same --config and --config.* overrides, the same `pretraining.build` program), the
launcher picks the TPU VM image for the slice and names it as bert_jax.aot does, `--no_create` refuses a slice that
is gone, and every documented command reads the same in bash and zsh."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

POD = str(ROOT / "launch" / "tpu_vm_pod.sh")
GUIDES = ("README.md", "docs/tpu-pods.md")  # the pages with the TPU path: an aot check and its launch
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))


def bash_blocks(page: str) -> list[str]:
    """The text of every ```bash block of `page` (run or not), as tests/test_docs.py reads them."""
    from test_docs import read_blocks

    return [block.text for block in read_blocks(page) if block.language == "bash"]


def documented_commands(page: str) -> list[list[str]]:
    """`page`'s bash commands as argv lists (continuations joined, comments dropped, shell quoting undone)."""
    return [shlex.split(line, comments=True) for block in bash_blocks(page)
            for line in block.replace("\\\n", " ").splitlines() if shlex.split(line, comments=True)]


def config_args(args: list[str]) -> list[str]:
    """The --config arguments of an entry point's argv: the recipe (`--config NAME` or `--config=NAME`) and every
    `--config.*` override, in order (what bert_jax.train and bert_jax.aot both parse into the config)."""
    out, take_next = [], False
    for arg in args:
        if take_next or arg == "--config" or arg.startswith(("--config=", "--config.")):
            out.append(arg)
        take_next = arg == "--config"
    return out


def flag(args: list[str], name: str) -> str:
    """The value of `--name VALUE` or `--name=VALUE` in `args`; KeyError when absent."""
    for k, arg in enumerate(args):
        if arg == name:
            return args[k + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise KeyError(name)


def tpu_path(page: str) -> tuple[list[str], list[str]]:
    """(aot argv, launcher argv) of `page`'s TPU path: its launch command and the aot command for the same slice."""
    from bert_jax.training.compiled import targets

    commands = documented_commands(page)
    launches = [c for c in commands if c[0] == "launch/tpu_vm_pod.sh" and "--" in c]
    assert len(launches) == 1, f"{page}: {len(launches)} launch commands"
    launch = launches[0]
    slice_ = targets.topology_for(flag(launch, "--accelerator_type"))
    checks = [c for c in commands if c[:3] == ["python", "-m", "bert_jax.aot"]
              and targets.topology_for(flag(c, "--topology")) == slice_]
    assert len(checks) == 1, f"{page}: {len(checks)} bert_jax.aot commands for the launch's slice {slice_}"
    return checks[0], launch


def small(args: list[str]) -> list[str]:
    """Config arguments at a CPU test's size: the tiny model, one layer, a 4,096-piece vocabulary, batch 16."""
    out = [re.sub(r"^pretrain:(base|large)$", "pretrain:tiny", a) for a in args]
    return out + ["--config.model.num_hidden_layers=1", "--config.model.vocab_size=4096",
                  "--config.phases[0].batch_size=16", "--config.phases[1].batch_size=16"]


def run_pod(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The launcher with `args`; the archive a --dry_run builds is removed."""
    result = subprocess.run([POD, *args], capture_output=True, text=True, timeout=60, env=env)
    for archive in re.findall(r"^archive: (\S+)$", result.stdout, flags=re.M):
        pathlib.Path(archive).unlink(missing_ok=True)
    return result


def dry_run_lines(result: subprocess.CompletedProcess, prefix: str) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith(prefix)]


# ----------------------------------------------------------------------------- the guides' check and launch


@pytest.mark.parametrize("page", GUIDES)
def test_the_aot_check_carries_the_launchs_config(page):
    """The documented aot check and launch: the same slice, the same recipe and overrides in the same order."""
    check, launch = tpu_path(page)
    entry = launch[launch.index("--") + 1:]
    assert config_args(check[3:]) == config_args(entry), page
    assert set(check[3:]) - set(config_args(check[3:])) == {"--topology", flag(check, "--topology")}, check
    assert any("packing=True" in a for a in config_args(entry)), "the guide's launch packs: the check must too"
    assert "--delete" in launch  # the preemption story the pages tell is the --delete one (next test)


def test_the_guides_tell_one_preemption_story():
    """The launch deletes its slice (--delete), so no page resumes it with --no_create; the way back is the same
    command, and --no_create is for a slice that is still up."""
    for page in GUIDES:
        text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        assert "After a preemption, run the launcher again with `--no_create`" not in text
        assert re.search(r"preempt\w*[^.]*\bsame command\b", text), page
        for sentence in re.split(r"(?<=[.:])\s", text):
            if "--no_create" in sentence:
                assert re.search(r"without `--(delete|no_create)`|never|still up|READY|is for", sentence, re.I), \
                    f"{page}: {sentence}"
    pods = (ROOT / "docs" / "tpu-pods.md").read_text(encoding="utf-8")
    assert "## Preemption and resuming" in pods


@pytest.mark.integration
def test_the_launcher_prints_the_guides_aot_check():
    """--dry_run prints the aot command of the run's own --config arguments and slice: the guide's check."""
    for page in GUIDES:
        check, launch = tpu_path(page)
        result = run_pod(*launch[1:launch.index("--")], "--dry_run", *launch[launch.index("--"):])
        assert result.returncode == 0, result.stderr
        (line,) = dry_run_lines(result, "aot check (any machine with libtpu): ")
        printed = shlex.split(line.split(": ", 1)[1])
        assert printed[:3] == ["python", "-m", "bert_jax.aot"]
        assert flag(printed, "--topology") == flag(launch, "--accelerator_type")
        assert config_args(printed[3:]) == config_args(check[3:])


_PARSE = r"""
import dataclasses, hashlib, json, sys
import jax
from absl import flags
from bert_jax import configs
from bert_jax.checkpoints import sources
from bert_jax.model import bert_config
from bert_jax.training import aot, pretraining
side, workdir, argv = sys.argv[1], sys.argv[2], sys.argv[3:]

out = {}
if side == "aot":
    aot.define_flags()
    flags.FLAGS(["aot"] + argv)
    config = flags.FLAGS.config
    phases = pretraining.resolve_phases(config)
    texts = [aot.lower_phase(config, jax.devices(), p)[0].as_text() for p in phases]
    config.model.dtype = bert_config.resolve_dtype(config.model.dtype, "cpu")  # as train records it on these devices
else:  # train's own path to its program (train_and_evaluate up to the first step): no data, nothing run
    pretraining._define_flags()
    flags.FLAGS(["train", "--workdir", workdir] + argv)
    built = {}
    pretraining.validate = lambda config, mesh, **kw: pretraining.resolve_phases(config)  # the data checks only
    sources.data_vocabulary = lambda config, init: (None, True)
    sources.write_run_files = lambda *a, **kw: None
    class Captured(Exception):
        pass
    def capture(config, workdir, mesh, phases, program, *a):
        built.update(config=config, mesh=mesh, phases=phases, program=program)
        raise Captured
    pretraining._Run = capture
    try:
        pretraining.train_and_evaluate(configs.mark_explicit_model_fields(flags.FLAGS.config), workdir)
    except Captured:
        pass
    config, phases = built["config"], built["phases"]
    texts = [pretraining.lower_step(built["program"], built["mesh"], p).as_text() for p in phases]
print("RESULT " + json.dumps({"phases": [dataclasses.asdict(p) for p in phases],
                              "model": config.model.to_dict(), "mesh": config.mesh.to_dict(),
                              "programs": [hashlib.sha256(t.encode()).hexdigest() for t in texts]}))
"""


@pytest.mark.integration
def test_aot_builds_the_program_train_runs(tmp_path):
    """README.md's check and launch at a CPU test's size: bert_jax.aot's phases and lowered train steps (on the
    host's 8 CPU devices) equal those bert_jax.train builds from the launch's arguments, packed phases included."""
    check, launch = tpu_path("README.md")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    sides = {
        "aot": ["--topology", flag(check, "--topology"), *small(config_args(check[3:]))],
        "train": small(config_args(launch[launch.index("--") + 1:])),
    }
    procs = {side: subprocess.Popen([sys.executable, "-c", _PARSE, side, str(tmp_path / "run"), *args], cwd=ROOT,
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for side, args in sides.items()}
    results = {}
    for side, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{side}: {stderr[-3000:]}"
        results[side] = json.loads(next(line[7:] for line in stdout.splitlines() if line.startswith("RESULT ")))
    assert results["aot"]["phases"] == results["train"]["phases"]
    assert [p["packing"] for p in results["aot"]["phases"]] == [True, True]
    assert results["aot"]["model"] == {k: v for k, v in results["train"]["model"].items()
                                       if k in results["aot"]["model"]}
    assert results["aot"]["programs"] == results["train"]["programs"]


@pytest.mark.slow  # two TPU compiles of the tiny model: ~30 s on 2 cores
@pytest.mark.integration
def test_aot_takes_the_launchers_accelerator_type():
    """The launcher's printed check, for a v5e slice (gcloud: v5litepod-16), run at a small size in zsh (bash
    without zsh): bert_jax.aot compiles it for v5e-16, both phases packed and fitting."""
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install -e '.[tpu]')")
    _, launch = tpu_path("README.md")
    args = launch[1:launch.index("--")]
    args[args.index("--accelerator_type") + 1] = "v5litepod-16"
    result = run_pod(*args, "--dry_run", *launch[launch.index("--"):])
    assert result.returncode == 0, result.stderr
    (line,) = dry_run_lines(result, "aot check (any machine with libtpu): ")
    command = line.split(": ", 1)[1].replace("pretrain:base", "pretrain:tiny")
    command += " " + " ".join(shlex.quote(a) for a in small([])[:2]) + \
        " '--config.phases[0].batch_size=16' '--config.phases[1].batch_size=16'"
    shell = [shutil.which("zsh"), "-f", "-c"] if shutil.which("zsh") else ["bash", "-c"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(shell + [command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("v5e-16: 16 devices, mesh {'data': 16, 'fsdp': 1, 'tensor': 1}, model dtype bfloat16")
    phases = [line for line in lines if line.strip().startswith("phase")]
    assert len(phases) == 2 and all(", packed," in p and "(fits)" in p for p in phases), out.stdout


# ----------------------------------------------------------------------------- slice names and images


def test_one_mapping_from_gcloud_names_to_topologies():
    from bert_jax.training.compiled import targets

    assert {t: targets.topology_for(t) for t in ("v3-32", "v4-32", "v5litepod-16", "v5litepod-64", "v5p-32", "v6e-16",
                                             "v5e-16")} == {
        "v3-32": "v3-32", "v4-32": "v4-32", "v5litepod-16": "v5e-16", "v5litepod-64": "v5e-64", "v5p-32": "v5p-32",
        "v6e-16": "v6e-16", "v5e-16": "v5e-16"}
    assert all(targets.topology_for(targets.accelerator_type_of(t)) == t for t in targets.TOPOLOGIES)
    for bad in ("v5litepod-7", "v5p-16", "v9-8", "v5e", ""):
        with pytest.raises(ValueError, match=r"^--topology .* is not one of \[.*\] \(or gcloud's accelerator type "
                                             r"of one: .*v5litepod-16.*\), nor a GPU machine"):
            targets.topology_for(bad)
    pods = (ROOT / "docs" / "tpu-pods.md").read_text(encoding="utf-8")
    for topology in targets.TOPOLOGIES:  # the page's table names every slice both ways
        assert re.search(rf"^\| `{targets.accelerator_type_of(topology)}` \| `{topology}` \|", pods, re.M), topology


@pytest.mark.integration
def test_aot_refuses_an_unknown_slice_in_one_line():
    result = subprocess.run([sys.executable, "-m", "bert_jax.aot", "--config", "pretrain:tiny", "--topology",
                             "v5litepod-7"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("aot: --topology 'v5litepod-7' is not one of [") and "v5litepod-16" in last


# Google Cloud's TPU software versions for JAX (https://cloud.google.com/tpu/docs/runtimes#pytorch_and_jax).
IMAGES = {"v3-8": "tpu-ubuntu2204-base", "v3-32": "tpu-ubuntu2204-base", "v4-32": "tpu-ubuntu2204-base",
          "v5litepod-16": "v2-alpha-tpuv5-lite", "v5p-32": "v2-alpha-tpuv5", "v6e-16": "v2-alpha-tpuv6e"}


@pytest.mark.integration
@pytest.mark.parametrize("accelerator", sorted(IMAGES))
def test_the_launcher_picks_the_image_of_the_slice(accelerator):
    common = ["--name", "n", "--zone", "z", "--accelerator_type", accelerator, "--workdir", "gs://b/run", "--dry_run"]
    result = run_pod(*common)
    assert result.returncode == 0, result.stderr
    assert dry_run_lines(result, "runtime image: ") == [
        f"runtime image: {IMAGES[accelerator]} (for {accelerator}; --runtime_version overrides)"]
    (create,) = dry_run_lines(result, "+ gcloud compute tpus tpu-vm create ")
    assert f"--accelerator-type {accelerator} --version {IMAGES[accelerator]}" in create
    if accelerator == "v5litepod-16":  # queued resources take the same image; --runtime_version overrides it
        queued = run_pod(*common, "--queued")
        assert f"--runtime-version {IMAGES[accelerator]}" in dry_run_lines(queued, "+ gcloud")[0]
        own = run_pod(*common, "--runtime_version", "v2-alpha-tpuv5-lite-custom")
        assert "--version v2-alpha-tpuv5-lite-custom" in dry_run_lines(own, "+ gcloud compute tpus tpu-vm create")[0]


@pytest.mark.integration
def test_the_launcher_refuses_a_slice_it_has_no_image_for_in_one_line():
    common = ["--name", "n", "--zone", "z", "--workdir", "gs://b/run", "--dry_run"]
    for accelerator, message in (
            ("v5e-16", "tpu_vm_pod.sh: --accelerator_type v5e-16 is bert_jax.aot's name: gcloud's is v5litepod-16"),
            ("v9-8", "tpu_vm_pod.sh: --accelerator_type v9-8 is not one of v3-N, v4-N, v5litepod-N, v5p-N, "
                     "v6e-N (gcloud's names): give --runtime_version to use it as is")):
        result = run_pod("--accelerator_type", accelerator, *common)
        assert result.returncode == 2 and result.stdout == "" and result.stderr.strip() == message
    assert run_pod("--accelerator_type", "v9-8", "--runtime_version", "my-image", *common).returncode == 0


@pytest.mark.integration
@pytest.mark.parametrize("state", ["READY", "PREEMPTED", ""])
def test_no_create_needs_a_slice_that_is_up(tmp_path, state):
    """--no_create checks the slice first: a deleted (a --delete run's) or preempted slice is a one-line error
    that says to run the command without --no_create; a READY one gets the run."""
    calls = tmp_path / "calls"
    answer = f"echo {state}" if state else "exit 1"  # gcloud fails on a slice that does not exist
    (tmp_path / "gcloud").write_text(f'#!/bin/sh\necho "$4" >> {calls}\n[ "$4" = describe ] && {answer}\nexit 0\n')
    (tmp_path / "gcloud").chmod(0o755)
    result = run_pod("--name", "n", "--zone", "z", "--accelerator_type", "v3-8", "--workdir", "gs://b", "--no_create",
                     "--no_follow", env={**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"})
    if state == "READY":
        assert result.returncode == 0, result.stderr
        assert calls.read_text().split() == ["describe", "scp", "ssh", "ssh"]
        return
    assert result.returncode == 2 and calls.read_text().split() == ["describe"]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"tpu_vm_pod.sh: --no_create, but slice n in z is {state or 'not there'}")
    assert "without --no_create" in line


# ----------------------------------------------------------------------------- bash and zsh


_STUB = '#!/bin/sh\nprintf "<%s>" "${0##*/}" "$@"; echo\n'  # prints its argv, one <word> each
# Any other program (PATH holds none) prints its argv the same way, through each shell's not-found hook.
_NOT_FOUND = ('command_not_found_handle() { printf "<%s>" "$@"; echo; }\n'  # bash
              'command_not_found_handler() { printf "<%s>" "$@"; echo; }\n')  # zsh


def test_no_documented_command_has_an_unquoted_glob_bracket():
    """zsh stops at an unquoted `[...]` that matches no file ("no matches found"): `--config.phases[0]...` arguments
    are quoted in every bash block, and in prose too wherever a page gives one to copy."""
    for page in PAGES:
        for block in bash_blocks(page):
            for line in block.replace("\\\n", " ").splitlines():
                quote = None
                for k, c in enumerate(line):
                    if quote:
                        quote = None if c == quote else quote
                    elif c in "'\"":
                        quote = c
                    elif c == "#" and (k == 0 or line[k - 1].isspace()):
                        break
                    else:
                        assert c != "[", f"{page}: unquoted [ in: {line.strip()}"
        prose = re.sub(r"```text\n.*?```", "", (ROOT / page).read_text(encoding="utf-8"), flags=re.S)
        unquoted = re.findall(r"(?<!')--config\.[\w.]*\[\d+\][^\s`]*", prose)
        assert not unquoted, f"{page}: quote {unquoted}"


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_every_documented_command_reads_the_same_in_bash_and_zsh(tmp_path):
    """Each bash block of README.md and docs/*.md (run or not), with its programs replaced by stubs that print their
    argv, gives the same output in zsh as in bash, and no error (an unquoted `[...]` is zsh's "no matches found")."""
    (tmp_path / "bin").mkdir()
    for name in ("launch/tpu_vm_pod.sh", "benchmarks/device_check.sh"):  # programs by path: stubs
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(_STUB)
        (tmp_path / name).chmod(0o755)
    env = {"PATH": str(tmp_path / "bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    calls = 0
    for page in PAGES:
        for number, block in enumerate(bash_blocks(page)):
            outputs = {}
            for shell in (["/bin/bash", "--norc", "--noprofile", "-e", "-c"], [shutil.which("zsh"), "-f", "-e", "-c"]):
                result = subprocess.run(shell + [_NOT_FOUND + block], cwd=tmp_path, env=env, capture_output=True, text=True,
                                        timeout=60)
                assert result.returncode == 0 and not result.stderr, f"{page} block {number} in {shell[0]}: " \
                                                                     f"{result.stderr}\n{block}"
                outputs[shell[0]] = result.stdout
            bash_out, zsh_out = outputs.values()
            assert bash_out == zsh_out, f"{page} block {number}:\n{block}\nbash: {bash_out}\nzsh: {zsh_out}"
            calls += bash_out.count("\n")
    assert calls >= 40  # the stubs ran: every documented program call printed its argv
