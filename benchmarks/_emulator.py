"""The kernel emulator of tests/emulator for the benchmark tools that run kernels without a GPU (`gpu_check
--dry-run`, `predict`'s counters): the one place that puts the repository's tests/ folder on sys.path."""
from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def emulator():
    """The `emulator` package of tests/ (ImportError where it cannot be imported).  It is imported under the name
    the tests use, so its compiled libraries are shared with them in one process."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import emulator as package
    return package
