"""Every script in examples/ runs to completion with --small (what CI runs), each in a fresh interpreter, and all
share one command line (examples/_cli.py): --device cpu|gpu, --small, and a one-line message where the GPU is
missing."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_DIR = ROOT / "examples"
EXAMPLES = sorted(p for p in EXAMPLES_DIR.glob("*.py") if not p.name.startswith("_"))  # _cli.py: their helper
EXPECTED = {"patch_convolution.py", "depthwise_separable_training.py", "cupy_pipeline.py", "numpy_pipeline.py",
            "sigpy_convolve.py"}
NEEDS_TORCH = {"depthwise_separable_training.py"}


def _cli():
    spec = importlib.util.spec_from_file_location("examples_cli", EXAMPLES_DIR / "_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(path, *args, pythonpath=()):
    if path.name in NEEDS_TORCH:
        pytest.importorskip("torch")
    paths = [*map(str, pythonpath), str(ROOT), os.environ.get("PYTHONPATH")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)), MPLBACKEND="Agg")
    return subprocess.run([sys.executable, str(path), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_documented_examples_exist():
    assert EXPECTED <= {path.name for path in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_small(path):
    result = _run(path, "--small", "--device", "cpu")
    assert result.returncode == 0, (f"{path.name} --small --device cpu exited with {result.returncode}\n"
                                    f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_help_lists_the_shared_flags(path):
    result = _run(path, "--help")
    assert result.returncode == 0, result.stderr
    assert "--device {cpu,gpu}" in result.stdout and "--small" in result.stdout


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_refuses_other_devices_like_argparse(path):
    result = _run(path, "--small", "--device", "cuda")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "argument --device: invalid choice: 'cuda'" in result.stderr


def _assert_clean_exit(result, name, reason):
    assert result.returncode == 1, f"{name} --device gpu exited with {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr and not result.stdout, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"{name}: --device gpu: "), result.stderr
    assert reason in result.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_on_a_missing_gpu_says_so_in_one_line(path):
    missing = _cli().gpu_missing()
    if missing is None:
        pytest.skip("this machine has a GPU that CuPy sees")
    _assert_clean_exit(_run(path, "--small", "--device", "gpu"), path.name, missing)


def test_torch_example_needs_cuda_torch_as_well(tmp_path):
    """The reported failure: on a CPU-only torch, asking for the GPU ended in a traceback.  A stand-in CuPy that
    sees one device leaves torch's missing CUDA as the only reason left."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text(
        "class cuda:\n    class runtime:\n        getDeviceCount = staticmethod(lambda: 1)\n")
    name = "depthwise_separable_training.py"
    result = _run(EXAMPLES_DIR / name, "--small", "--device", "gpu", pythonpath=[tmp_path])
    _assert_clean_exit(result, name, f"torch {torch.__version__} has no CUDA")


HIDE_TORCH = """
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'torch':
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
sys.meta_path.insert(0, _NoTorch())
"""


@pytest.mark.parametrize("name", ["patch_convolution.py", "numpy_pipeline.py", "cupy_pipeline.py",
                                  "sigpy_convolve.py"])
def test_example_runs_without_torch(name):
    """The README's main example, the array pipelines and the sigpy example need only NumPy: torch is made
    unimportable as an absent install is, by a finder that raises ModuleNotFoundError.  (`sys.modules['torch'] =
    None` is not what a user without torch has: libraries that look torch up in sys.modules, as SciPy's array
    API helpers do, then fail with an AttributeError on None.)"""
    path = EXAMPLES_DIR / name
    code = (f"import runpy, sys\n{HIDE_TORCH}\nsys.path.insert(0, {str(EXAMPLES_DIR)!r})\n"
            f"sys.argv = [{str(path)!r}, '--small']\nrunpy.run_path({str(path)!r}, run_name='__main__')\n"
            f"assert 'torch' not in sys.modules\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
    if name == "patch_convolution.py":
        assert "cupyconv.conv2d on the rolled batch" in result.stdout
    if name == "sigpy_convolve.py":
        assert "dot-product test, complex128" in result.stdout and "all checks passed" in result.stdout
