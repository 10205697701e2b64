"""The GPU test layer cannot pass by skipping: the probe says why it skipped, and collecting `-m gpu` survives an
environment without the optional test dependencies (each test that needs one skips by itself)."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import conftest

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("ml_dtypes", "hypothesis", "scipy", "dask", "distributed", "torch", "matplotlib")


@pytest.mark.parametrize("outcome, reason", [
    (RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected"),
     r"CuPy finds no usable CUDA device \(RuntimeError: cudaErrorNoDevice: no CUDA-capable device is detected\)"),
    (0, r"CuPy sees 0 CUDA devices"),
    (2, r"CuPy sees 2 CUDA device\(s\)"),
])
def test_probe_keeps_its_reason(monkeypatch, outcome, reason):
    """A FAKE `cupy.cuda.runtime.getDeviceCount` (monkeypatched) raising or answering a count."""
    cupy = pytest.importorskip("cupy")

    def fake_count():
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", fake_count)
    available, said = conftest.gpu_probe.__wrapped__()
    assert available == (outcome == 2) and re.fullmatch(reason, said), said


def test_probe_names_a_missing_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)   # `import cupy` raises ImportError
    available, said = conftest.gpu_probe.__wrapped__()
    assert not available and said.startswith("CuPy cannot be imported (ModuleNotFoundError"), said


def test_skipped_gpu_tests_show_the_probe_reason():
    if conftest.gpu_probe()[0]:
        pytest.skip("a GPU is here: nothing is skipped")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "gpu",
                             "tests/test_unfold_kernels.py::test_gpu_reads_strided_views_and_torch_tensors"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, env=_env())
    assert "needs CuPy and a CUDA GPU: " + conftest.gpu_probe()[1] in result.stdout, result.stdout[-3000:]


def _env(*extra_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *map(str, extra_path)])
    return env


def test_gpu_collection_survives_without_optional_test_dependencies(tmp_path):
    """`pytest --collect-only -m gpu` in an interpreter where ml_dtypes, hypothesis, scipy, dask, torch and
    matplotlib cannot be imported (a plugin whose import hook raises ModuleNotFoundError for them, as if they were
    not installed; plugin autoloading off, since their own pytest plugins would need them): no collection error,
    and every GPU test of the modules that use them but do not need them at import is still collected."""
    (tmp_path / "block_optional.py").write_text(textwrap.dedent(f"""
        import sys
        BLOCKED = {set(OPTIONAL)!r}

        class NotInstalled:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, NotInstalled())
    """))
    env = {**_env(tmp_path), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "block_optional", "-p", "no:cacheprovider",
                             "--collect-only", "-q", "-m", "gpu"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "error" not in output.lower(), output[-4000:]
    count = re.search(r"(\d+)/\d+ tests collected", output)
    assert count and int(count.group(1)) > 200, output[-2000:]
    for module in ("test_conv_kernels", "test_tensor_core_kernels"):   # GPU tests, bfloat16 among their dtypes
        assert f"tests/{module}.py::" in output, f"{module}'s GPU tests were not collected"
