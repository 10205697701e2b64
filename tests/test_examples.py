"""Every script in examples/ runs to completion with --small (what CI runs), each in a fresh interpreter."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
EXPECTED = {"patch_convolution.py", "depthwise_separable_training.py", "cupy_pipeline.py", "numpy_pipeline.py",
            "sigpy_convolve.py"}
NEEDS_TORCH = {"depthwise_separable_training.py"}


def test_the_documented_examples_exist():
    assert EXPECTED <= {path.name for path in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_small(path):
    if path.name in NEEDS_TORCH:
        pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, str(path), "--small"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, (f"{path.name} --small exited with {result.returncode}\n"
                                    f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")


@pytest.mark.parametrize("name", ["patch_convolution.py", "numpy_pipeline.py", "cupy_pipeline.py",
                                  "sigpy_convolve.py"])
def test_example_runs_without_torch(name):
    """The README's main example, the array pipelines and the sigpy example need only NumPy: torch is made
    unimportable."""
    path = ROOT / "examples" / name
    code = ("import runpy, sys; sys.modules['torch'] = None; "
            f"sys.argv = [{str(path)!r}, '--small']; runpy.run_path({str(path)!r}, run_name='__main__')")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
    if name == "patch_convolution.py":
        assert "cupyconv.conv2d on the rolled batch" in result.stdout
    if name == "sigpy_convolve.py":
        assert "dot-product test, complex128" in result.stdout and "all checks passed" in result.stdout
