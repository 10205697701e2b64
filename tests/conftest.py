"""Shared test configuration: the `gpu` marker runs only where CuPy sees a CUDA device."""
import pytest


def _gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: runs the GPU path on a real CUDA GPU with CuPy (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
