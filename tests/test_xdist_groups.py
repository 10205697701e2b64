"""tests/conftest.py's scheduler under README.md's `--dist loadgroup`: the tests of an xdist_group run on one worker
and the groups start first, the costliest first.  Run on a small generated suite with this conftest, in a
subprocess with two workers (what CI runs: pytest-xdist with pytest 9, where xdist's own loadgroup groups nothing)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

# Three groups of three tests in collection order cheap, middle, dear (pytest-xdist alone would start the first two
# it meets), and singletons; each test writes "<test> <worker>" as it starts.
SUITE = '''
import os
import pytest


def started(name):
    with open(os.environ["GROUPS_LOG"], "a") as log:
        log.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.parametrize("group", [pytest.param(g, marks=pytest.mark.xdist_group(g, cost=c))
                                   for g, c in [("cheap", 1), ("middle", 5), ("dear", 9)]])
@pytest.mark.parametrize("i", range(3))
def test_grouped(group, i):
    started(group)


@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    started("alone")
'''


def test_groups_run_on_one_worker_costliest_first(tmp_path):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "started.log"
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q",
                           "-p", "no:cacheprovider", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "GROUPS_LOG": str(log)})
    assert done.returncode == 0, done.stdout + done.stderr
    started = [line.split() for line in log.read_text().splitlines()]
    assert len(started) == 15, started
    for group in ("cheap", "middle", "dear"):
        workers = {worker for name, worker in started if name == group}
        assert len(workers) == 1, f"the tests of group {group} ran on workers {workers}"
    firsts = {}
    for name, worker in started:
        firsts.setdefault(worker, name)
    assert sorted(firsts.values()) == ["dear", "middle"], f"the first test of each worker: {firsts}"
