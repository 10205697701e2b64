"""The wheel ships raw_kernels/, the license and py.typed, and an installed cupyconv finds its kernel sources;
README and CI agree.

The wheel test builds from a copy of the checkout (so a stale build/ directory can never hide a missing file),
installs the wheel into a fresh virtual environment and imports it from a directory outside the checkout.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# One worker runs the module: its `wheel` (pip building the project) is built once.
pytestmark = pytest.mark.xdist_group("module:test_packaging")
KERNELS = sorted(p.name for p in (ROOT / "raw_kernels").iterdir() if p.suffix in (".cu", ".cuh"))


def _run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {result.returncode}\n"
                    f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}")
    return result


def _clean_env() -> dict:
    """The environment without anything that would put the checkout on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _can_build_without_isolation() -> bool:
    """setuptools >= 77 (pyproject.toml's build requirement: SPDX `license`) in this environment lets pip build
    the wheel offline, without a build environment."""
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("cupyconv", "raw_kernels"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(dist)]
    if _can_build_without_isolation():
        cmd.append("--no-build-isolation")
    _run(cmd, env=_clean_env(), cwd=src)
    wheels = list(dist.glob("cupyconv-0.1.0-*.whl"))
    assert len(wheels) == 1, f"expected one cupyconv 0.1.0 wheel in {dist}, found {os.listdir(dist)}"
    return wheels[0]


@pytest.mark.slow
def test_wheel_contains_every_kernel_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "cupyconv/raw_kernels/common.cuh" in names
    missing = [k for k in KERNELS if f"cupyconv/raw_kernels/{k}" not in names]
    assert not missing, f"kernel sources missing from {wheel.name}: {missing}"
    assert "cupyconv/ops/conv.py" in names and "cupyconv/_device.py" in names
    stray = [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/", "raw_kernels/"))]
    assert not stray, f"files outside the package in the wheel: {stray}"
    metadata = zipfile.ZipFile(wheel).read("cupyconv-0.1.0.dist-info/METADATA").decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    hard = [r for r in requires if "extra ==" not in r]
    assert hard == ["Requires-Dist: numpy"], f"the only hard dependency must be numpy, got {hard}"
    for extra, cupy in (("cuda12", "cupy-cuda12x"), ("cuda13", "cupy-cuda13x")):   # as pip reads the extras
        assert f'Requires-Dist: {cupy}[ctk]>=14.2; extra == "{extra}"' in requires, requires
        assert f'Requires-Dist: ml_dtypes>=0.5; extra == "{extra}"' in requires, requires


@pytest.mark.slow
def test_wheel_carries_the_license_and_py_typed(wheel):
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    assert "cupyconv/py.typed" in names, "without py.typed, type checkers ignore cupyconv's annotations (PEP 561)"
    license_path = "cupyconv-0.1.0.dist-info/licenses/LICENSE"
    assert license_path in names, sorted(n for n in names if "dist-info" in n)
    assert archive.read(license_path) == (ROOT / "LICENSE").read_bytes()
    metadata = archive.read("cupyconv-0.1.0.dist-info/METADATA").decode().splitlines()
    assert "License-Expression: MIT" in metadata and "License-File: LICENSE" in metadata
    assert "Classifier: Typing :: Typed" in metadata


@pytest.mark.slow
def test_installed_wheel_finds_its_kernels(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    import numpy
    # This environment's pip installs into the new one (pip >= 22.3); numpy comes from pip's cache or the index.
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(wheel),
          f"numpy=={numpy.__version__}"], env=_clean_env())
    probe = textwrap.dedent("""
        import json, sysconfig
        import numpy
        import cupyconv, cupyconv._device as d
        x = numpy.arange(2 * 3 * 5 * 4, dtype=numpy.float32).reshape(2, 3, 5, 4) / 10
        w = numpy.linspace(-1, 1, 4 * 3 * 3 * 3, dtype=numpy.float32).reshape(4, 3, 3, 3)
        y = cupyconv.conv2d(x, w, padding=1)
        sources = {name: len(d.kernel_source(name)) for name in sorted(p.name for p in d.kernel_dir().iterdir()
                                                                      if p.suffix in (".cu", ".cuh"))}
        print(json.dumps({
            "package": cupyconv.__file__,
            "kernel_dir": str(d.kernel_dir()),
            "purelib": sysconfig.get_paths()["purelib"],
            "sources": sources,
            "y_shape": list(y.shape),
            "y_sum": float(y.astype(numpy.float64).sum()),
        }))
    """)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    info = json.loads(_run([str(python), "-c", probe], cwd=outside, env=_clean_env()).stdout)

    site = Path(info["purelib"]).resolve()
    assert Path(info["package"]).resolve().is_relative_to(site), info
    kernel_dir = Path(info["kernel_dir"]).resolve()
    assert kernel_dir == site / "cupyconv" / "raw_kernels", info
    assert sorted(info["sources"]) == KERNELS
    assert all(n > 0 for n in info["sources"].values()), info["sources"]
    for name in KERNELS:
        assert (kernel_dir / name).read_bytes() == (ROOT / "raw_kernels" / name).read_bytes(), name

    # The tiny conv2d matches a float64 reference computed here.
    x = numpy.arange(2 * 3 * 5 * 4, dtype=numpy.float64).reshape(2, 3, 5, 4) / 10
    w = numpy.linspace(-1, 1, 4 * 3 * 3 * 3, dtype=numpy.float32).reshape(4, 3, 3, 3).astype(numpy.float64)
    xp = numpy.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = sum(numpy.einsum("nchw,dc->ndhw", xp[:, :, i:i + 5, j:j + 4], w[:, :, i, j])
              for i in range(3) for j in range(3))
    assert info["y_shape"] == [2, 4, 5, 4]
    assert info["y_sum"] == pytest.approx(float(ref.sum()), rel=1e-5, abs=1e-4)


def _readme_commands() -> list[str]:
    """The fenced shell code blocks of README.md, in order."""
    text = (ROOT / "README.md").read_text()
    return [b.strip() for b in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)]


def test_readme_starts_with_exactly_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    first_api_heading = text.index("\n## ", text.index("```"))
    head = text[:first_api_heading]
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", head, re.S | re.M)
    assert len(blocks) == 2, f"README must open with exactly two set-up commands, found {blocks}"
    example, tests = (b.strip() for b in blocks)
    assert "\n" not in example and "\n" not in tests, "each set-up command is one line"
    assert "pip install" in example and "examples/patch_convolution.py" in example
    assert "pip install" in tests and ".[test" in tests and "pytest" in tests


def test_ci_runs_the_readme_test_command():
    result = _run(["bash", str(ROOT / ".ci" / "run"), "--print-test-command"], cwd=ROOT)
    assert result.stdout.strip() == _readme_commands()[1]


def _extras() -> dict:
    """{extra: [Requirement]} of pyproject.toml's optional dependencies, as pip reads them (no download)."""
    tomllib = pytest.importorskip("tomllib")   # Python >= 3.11
    requirements = pytest.importorskip("packaging.requirements")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {extra: [requirements.Requirement(r) for r in reqs]
            for extra, reqs in project["optional-dependencies"].items()}


@pytest.mark.parametrize("extra, cupy", [("cuda12", "cupy-cuda12x"), ("cuda13", "cupy-cuda13x")])
def test_cuda_extras_bring_cupy_with_its_toolkit_and_ml_dtypes(extra, cupy):
    """A GPU machine needs only its driver: CuPy's `ctk` extra brings cuBLAS, NVRTC and the headers of CuPy's own
    CUDA major release, ml_dtypes the bfloat16 dtype; nothing of another CUDA release."""
    reqs = {r.name: r for r in _extras()[extra]}
    assert set(reqs) == {cupy, "ml-dtypes"} or set(reqs) == {cupy, "ml_dtypes"}, reqs
    assert reqs[cupy].extras == {"ctk"}, f"{extra}: {reqs[cupy]} must ask for CuPy's [ctk] extra"
    assert reqs[cupy].specifier.contains("14.2") and not reqs[cupy].specifier.contains("13.6"), reqs[cupy]


def test_installed_cupy_offers_the_ctk_extra():
    """The extra name `ctk` is CuPy 14's own (its METADATA, read from the installed wheel: nothing downloaded)."""
    metadata = pytest.importorskip("importlib.metadata")
    for name in ("cupy-cuda12x", "cupy-cuda13x"):
        try:
            provided = metadata.metadata(name).get_all("Provides-Extra") or []
        except metadata.PackageNotFoundError:
            continue
        assert "ctk" in provided, f"{name} {metadata.version(name)} has no ctk extra: {provided}"
        return
    pytest.skip("no CuPy wheel installed")


def test_test_extra_cannot_shadow_cupys_toolkit():
    """CuPy 14 finds NVRTC and the CUDA headers through cuda-pathfinder, which looks in nvidia/cu13 first: the
    compile check's CUDA toolkit wheels live in their own extra, never in `test` or a CUDA extra, so
    `.[cuda12,test]` on a GPU machine compiles with CUDA 12's NVRTC and headers."""
    extras = _extras()
    toolkit = {r.name for r in extras["compile-check"]}
    assert {"nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc-cu12"} <= toolkit, toolkit
    for extra in ("test", "cuda12", "cuda13"):
        nvidia = [str(r) for r in extras[extra] if r.name.startswith("nvidia-")]
        assert not nvidia, f"the {extra} extra installs CUDA toolkit wheels {nvidia}"
    assert "compile-check" in _readme_commands()[1], "CI (the README test command) runs the compile check"
