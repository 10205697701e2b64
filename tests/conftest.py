"""Shared test configuration: the `gpu` marker runs only where CuPy sees a CUDA device; the `cpu_path` fixture
runs a torch test on both CPU paths of cupyconv.torch (torch's convolutions, the default, and cupyconv's NumPy
path), or on the NumPy path alone for a test marked `numpy_cpu_path` (one that watches the plain functions)."""
import pytest


def _gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


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
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
