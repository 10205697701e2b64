"""`python -m cupyconv.precompile`: the dry run and the arguments for real (no GPU needed), the compile loop with a
RECORDED FAKE compiler and device (monkeypatched: no GPU here)."""
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cupyconv import _device, precompile

ROOT = Path(__file__).resolve().parents[1]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "cupyconv.precompile", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_dry_run_lists_every_instantiation_without_a_gpu():
    result = _run("--dry-run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    kernels = _device.all_instantiations()
    assert lines[:-1] == [f"{f} {n}" for f, n in kernels]
    files = sorted({f for f, _ in kernels})
    assert lines[-1].startswith(f"would compile {len(kernels)} kernel instantiations of {len(files)} files ("), lines[-1]


@pytest.mark.parametrize("args, message", [
    (["--jobs", "0"], "--jobs: must be at least 1, not 0"),
    (["--jobs", "many"], "--jobs: must be a whole number of threads, not 'many'"),
    (["--fast"], "unrecognized arguments: --fast"),
])
def test_bad_arguments_exit_2_with_a_message(args, message):
    result = _run(*args)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_without_a_gpu_it_fails_in_one_line():
    result = _run("--jobs", "1")
    assert result.returncode == 1 and result.stderr.startswith("cupyconv.precompile: "), result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_compiles_each_instantiation_once_on_the_threads_and_reports_failures(monkeypatch, capsys):
    """Fakes: the current device (id 3), the toolkit check and the compiler, which records (device, file, name,
    thread) and fails on one instantiation."""
    kernels = _device.all_instantiations()
    broken = kernels[len(kernels) // 2]
    calls, lock = [], threading.Lock()

    def fake_compile(device_id, filename, name):
        with lock:
            calls.append((device_id, filename, name, threading.get_ident()))
        if (filename, name) == broken:
            raise RuntimeError("nvrtc: error: something")

    monkeypatch.setattr(precompile, "current_device", lambda: (3, "Fake GPU, sm_90"))
    monkeypatch.setattr(precompile, "compile_one", fake_compile)
    monkeypatch.setattr(_device, "check_cupy_toolkit", lambda: None)
    assert precompile.main(["--jobs", "4"]) == 1
    out = capsys.readouterr().out
    assert sorted((f, n) for _, f, n, _ in calls) == sorted(kernels), "each instantiation exactly once"
    assert {d for d, *_ in calls} == {3}
    assert out.splitlines()[0] == f"compiling {len(kernels)} kernel instantiations for device 3 (Fake GPU, sm_90) on 4 thread(s)"
    assert f"[{len(kernels):4d}/{len(kernels)}]" in out, "the progress reaches the total"
    assert f"compiled {len(kernels) - 1} of {len(kernels)} kernel instantiations" in out and "; 1 failed" in out
    assert f"FAILED {broken[0]} {broken[1]}: RuntimeError: nvrtc: error: something" in out
