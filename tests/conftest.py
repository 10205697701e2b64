"""Shared test configuration: the `gpu` marker runs only where CuPy sees a CUDA device.

Where it does not, every `gpu` test is skipped with the probe's reason (CuPy missing, no driver, no device, the
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
