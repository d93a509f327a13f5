"""The suite's own scheduling (tests/conftest.py): under `make test`'s `-n 2 --dist loadgroup`, the tests of a
module that share a module-scoped fixture run on one worker, so the fixture is built once."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration

PROBE = '''
import os

import pytest


@pytest.fixture(scope="module")
def shared():
    with open(os.environ["PROBE_LOG"], "a") as f:
        f.write(f"setup {os.getpid()}\\n")


@pytest.mark.slow
def test_a(shared):
    pass


@pytest.mark.parametrize("i", range(6))
def test_b(shared, i):
    pass


def test_alone(i=0):  # no shared fixture: scheduled freely
    pass
'''


def test_a_modules_shared_fixture_is_built_once_on_two_workers(tmp_path):
    shutil.copyfile(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(PROBE)
    for k in range(4):  # other work for the second worker
        (tmp_path / f"test_other_{k}.py").write_text("def test_other():\n    pass\n")
    log = tmp_path / "setups.txt"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                             "no:cacheprovider", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, PROBE_LOG=str(log),
                                                  PYTHONPATH=str(ROOT / "benchmarks")))  # conftest's shared_data
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "12 passed" in result.stdout, result.stdout[-3000:]
    assert len(log.read_text().splitlines()) == 1, log.read_text()
