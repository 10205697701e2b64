"""Shared test configuration: the `gpu` marker runs only where CuPy sees a CUDA device; the `cpu_path` fixture
runs a torch test on both CPU paths of cupyconv.torch (torch's convolutions, the default, and cupyconv's NumPy
path), or on the NumPy path alone for a test marked `numpy_cpu_path` (one that watches the plain functions).

Where no GPU is seen, every `gpu` test is skipped with the probe's reason (CuPy missing, no driver, no device, the
exception CuPy raised), so a skipped GPU run says why; benchmarks/gpu_check.py fails its pytest step when a
machine with a GPU runs fewer GPU tests than it collected.
"""
import functools

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


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return   # no GPU test selected: no need to import CuPy
    available, reason = gpu_probe()
    if available:
        return
    skip = pytest.mark.skip(reason=f"needs CuPy and a CUDA GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
