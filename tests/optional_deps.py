"""Optional test dependencies (ml_dtypes, hypothesis): a missing one skips the tests that need it, never the
collection of a module (which would hide every other test in it, and abort `pytest -m gpu` on a bare GPU image).

- `BFLOAT16` stands for ml_dtypes' bfloat16 in module-level tables and parameter lists; `Dtypes` (a dict of dtype
  names) and `resolve` turn it into the dtype when a test reads it, and skip that test without ml_dtypes.
- `given`, `settings` and `strategies` are hypothesis's, or stand-ins: `given` then marks the test skipped, and
  strategies built at decoration time are inert placeholders.
"""
from __future__ import annotations

import pytest


class Lazy:
    """A value made when a test asks for it (`resolve`), so that making it may skip that test."""

    def __init__(self, make, name: str):
        self.make, self.name = make, name

    def __repr__(self) -> str:   # the test id
        return self.name


def bfloat16():
    """ml_dtypes.bfloat16; skips the calling test without ml_dtypes."""
    return pytest.importorskip("ml_dtypes", reason="needs ml_dtypes (NumPy's bfloat16)").bfloat16


BFLOAT16 = Lazy(bfloat16, "bfloat16")


def resolve(value):
    """value, or what a `Lazy` value makes."""
    return value.make() if isinstance(value, Lazy) else value


class Dtypes(dict):
    """{dtype name: NumPy dtype} whose lazy entries (`BFLOAT16`) are made when read: iterating gives every name, so
    parametrisations keep their bfloat16 cases, which skip one by one without ml_dtypes."""

    def __getitem__(self, name):
        return resolve(super().__getitem__(name))


try:
    from hypothesis import given, settings, strategies
except ImportError:
    class _Inert:
        """Whatever a strategy expression builds at decoration time: every attribute and call gives itself."""

        def __getattr__(self, name):
            return self

        def __call__(self, *args, **kwargs):
            return self

    strategies = _Inert()

    def settings(*args, **kwargs):
        return lambda test: test

    def given(*args, **kwargs):
        def skipped(test):
            def without_hypothesis(*a, **k):   # no parameters: pytest asks for no fixture hypothesis would fill
                pytest.skip("needs hypothesis")

            without_hypothesis.__name__ = test.__name__
            without_hypothesis.__qualname__ = test.__qualname__
            without_hypothesis.__doc__ = test.__doc__
            return pytest.mark.skip(reason="needs hypothesis")(without_hypothesis)

        return skipped
