"""Running emulated kernels under AddressSanitizer.

An ASan-instrumented library can only be loaded into a process whose first library is libasan, so ASan runs
happen in a child interpreter started with LD_PRELOAD=libasan.  In that child, EmulatedDevice() defaults to
the ASan build (CUPYCONV_EMULATOR_ASAN=1).  An out-of-bounds access aborts the child with ASan's (or, for a
static __shared__ array, UBSan's bounds) report on stderr; the helpers turn that into a test failure.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

_TESTS_DIR = Path(__file__).resolve().parent.parent
_REPO_ROOT = _TESTS_DIR.parent
REPORT_MARKERS = ("ERROR: AddressSanitizer", "runtime error:")


def asan_preloaded() -> bool:
    return "libasan" in os.environ.get("LD_PRELOAD", "")


@functools.lru_cache(maxsize=None)
def libasan_path() -> str | None:
    """The libasan that g++ links against, or None where there is none."""
    try:
        path = subprocess.run([os.environ.get("CXX", "g++"), "-print-file-name=libasan.so"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return path if os.path.isabs(path) and os.path.exists(path) else None


def asan_environment() -> dict:
    """The environment of a child interpreter that runs emulated kernels under ASan."""
    library = libasan_path()
    if library is None:
        raise RuntimeError("emulator: g++ has no libasan (install the compiler's libasan package)")
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=library,
        # Python frees little at exit; ASan's own report is the one thing wanted.  exitcode is distinctive so
        # that a sanitizer abort cannot pass for an ordinary failure.
        ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:exitcode=86:detect_odr_violation=0",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87",
        CUPYCONV_EMULATOR_ASAN="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(_REPO_ROOT), str(_TESTS_DIR), env.get("PYTHONPATH")) if p),
    )
    return env


def run_under_asan(code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run Python `code` in a child interpreter with libasan preloaded; returns the finished process."""
    return subprocess.run([sys.executable, "-c", code], cwd=_REPO_ROOT, env=asan_environment(), text=True,
                          capture_output=True, timeout=timeout)


def pytest_under_asan(*node_ids: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run pytest on `node_ids` (e.g. "tests/test_unfold.py::test_emulated") with every EmulatedDevice in ASan
    mode; returns the finished process."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *node_ids]
    return subprocess.run(command, cwd=_REPO_ROOT, env=asan_environment(), text=True, capture_output=True,
                          timeout=timeout)


def sanitizer_report(process: subprocess.CompletedProcess) -> str | None:
    """ASan's or UBSan's report in the child's stderr, or None."""
    for marker in REPORT_MARKERS:
        at = process.stderr.find(marker)
        if at >= 0:
            return process.stderr[max(0, process.stderr.rfind("\n", 0, at)):][:8000]
    return None


def assert_clean_under_asan(process: subprocess.CompletedProcess) -> None:
    """Fail (AssertionError) if the child reported a sanitizer error or exited non-zero."""
    report = sanitizer_report(process)
    if report is not None:
        raise AssertionError(f"sanitizer error in the emulated kernel:\n{report}")
    if process.returncode != 0:
        raise AssertionError(f"child exited with {process.returncode}:\n{process.stdout[-4000:]}\n"
                             f"{process.stderr[-4000:]}")
