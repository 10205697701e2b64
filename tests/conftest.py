"""Shared test configuration: the `gpu` marker runs only where CuPy sees a CUDA device; the `cpu_path` fixture
runs a torch test on both CPU paths of cupyconv.torch (torch's convolutions, the default, and cupyconv's NumPy
path), or on the NumPy path alone for a test marked `numpy_cpu_path` (one that watches the plain functions).

Where no GPU is seen, every `gpu` test is skipped with the probe's reason (CuPy missing, no driver, no device, the
exception CuPy raised), so a skipped GPU run says why; benchmarks/gpu_check.py fails its pytest step when a
machine with a GPU runs fewer GPU tests than it collected.

Under `--dist loadgroup` (README.md's test command) the tests of one `xdist_group` run on one worker, the groups
first, costliest first (`GroupScheduling`).
"""
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest


@functools.lru_cache(maxsize=None)
def gpu_probe() -> tuple[bool, str]:
    """(whether CuPy sees a CUDA device, what it saw): never raises, and keeps the reason."""
    try:
        import cupy
    except Exception as error:   # ImportError, or a broken install failing at import
        return False, f"CuPy cannot be imported ({type(error).__name__}: {error})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:   # CUDARuntimeError: no driver, a driver too old for CuPy's CUDA, no device node
        return False, f"CuPy finds no usable CUDA device ({type(error).__name__}: {error})"
    if count < 1:
        return False, "CuPy sees 0 CUDA devices"
    return True, f"CuPy sees {count} CUDA device(s)"


def pytest_configure(config):
    if config.getoption("dist", None) == "loadgroup" and not hasattr(config, "workerinput"):
        os.environ[GROUPS_DIR] = tempfile.mkdtemp(prefix="cupyconv-xdist-groups-")   # the workers inherit it
    config.addinivalue_line("markers", "gpu: runs the GPU path on a real CUDA GPU with CuPy (skipped without one)")
    config.addinivalue_line("markers", "numpy_cpu_path: a torch test that runs on cupyconv's NumPy CPU path only")


CPU_PATHS = ("torch_cpu", "numpy_cpu")


def pytest_generate_tests(metafunc):
    if "cpu_path" in metafunc.fixturenames:
        numpy_only = metafunc.definition.get_closest_marker("numpy_cpu_path") is not None
        metafunc.parametrize("cpu_path", CPU_PATHS[1:] if numpy_only else CPU_PATHS, indirect=True)


@pytest.fixture
def cpu_path(request):
    """The test runs with cupyconv.torch's CPU ops on this path ('torch_cpu' or 'numpy_cpu')."""
    import cupyconv.torch as cct
    with cct.numpy_cpu_path(request.param == "numpy_cpu"):
        yield request.param


def pytest_unconfigure(config):
    if config.getoption("dist", None) == "loadgroup" and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop(GROUPS_DIR, ""), ignore_errors=True)


# pytest-xdist's loadgroup tells the controller a test's group by appending "@group" to its node id on the workers
# (item._nodeid); pytest 9 keeps node ids elsewhere, so there (xdist 3.8, the newest) every test became a unit of its
# own: the tests of one NVRTC program ran on both workers, one waiting on the other's compile, and the longest
# compile (depthwise.cu for sm_90) started last.  So the workers write {node id: [group, cost]} to a file at
# collection (`record_groups`), and the controller's scheduler reads it: the groups go first, by descending cost (the
# `cost` of an xdist_group mark: test_nvrtc.on_program gives a program's instantiations), then every other test in
# collection order, each a unit of its own as before.
GROUPS_DIR = "CUPYCONV_XDIST_GROUPS"


@pytest.hookimpl(trylast=True)   # after xdist's own hook, so that a node id here is the one the controller sees
def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput") and os.environ.get(GROUPS_DIR):
        record_groups(Path(os.environ[GROUPS_DIR]) / f"{config.workerinput['workerid']}.json", items)
    skip_gpu_tests_without_a_gpu(items)


def record_groups(path: Path, items) -> None:
    groups = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = [str(mark.args[0] if mark.args else mark.kwargs.get("name", "default")),
                                   mark.kwargs.get("cost", 0)]
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(groups))
    partial.replace(path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist", None) == "loadgroup":
        return group_scheduling()(config, log)
    return None


@functools.lru_cache(maxsize=None)
def group_scheduling():
    """The class, made on first use: pytest-xdist is imported only where it runs."""
    from xdist.scheduler import LoadGroupScheduling

    class GroupScheduling(LoadGroupScheduling):
        """LoadGroupScheduling with the groups the workers recorded (`record_groups`) and the costliest started
        first.  A node id without a record keeps LoadGroupScheduling's reading ("@group" where xdist appended it)."""

        groups: dict | None = None

        def _split_scope(self, nodeid):
            if self.groups is None:
                self.groups = read_groups(Path(os.environ.get(GROUPS_DIR, "")))
            return self.groups[nodeid][0] if nodeid in self.groups else super()._split_scope(nodeid)

        def _assign_work_unit(self, node):
            # The first assignment finds the whole queue built (in collection order, or by size): order it by cost,
            # stably, so the tests outside groups keep their order behind them.
            if not getattr(self, "ordered", False):
                cost = {group: c for group, c in (self.groups or {}).values()}
                self.workqueue = type(self.workqueue)(sorted(self.workqueue.items(),
                                                             key=lambda unit: -cost.get(unit[0], 0)))
                self.ordered = True
            super()._assign_work_unit(node)

    return GroupScheduling


def read_groups(directory: Path) -> dict:
    """{node id: [group, cost]} of every worker's record (they collect the same tests); {} without any."""
    groups: dict = {}
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        groups.update(json.loads(path.read_text()))
    return groups


def skip_gpu_tests_without_a_gpu(items):
    if not any("gpu" in item.keywords for item in items):
        return   # no GPU test selected: no need to import CuPy
    available, reason = gpu_probe()
    if available:
        return
    skip = pytest.mark.skip(reason=f"needs CuPy and a CUDA GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
