"""Global behaviour of every op, in one place (in the spirit of `torch.backends.cudnn`).

Each setting has a getter, a setter and a context manager:

==================  ============================  =========================================================
setting             default                       what it decides
==================  ============================  =========================================================
``allow_tf32``      False                         float32 GEMMs may run on TF32 tensor cores (about 10
                                                  mantissa bits per product); off, float32 is IEEE float32
``autotune``        False                         ``algorithm='auto'`` times every candidate on the first
                                                  call of each problem and keeps the fastest (like
                                                  ``cudnn.benchmark``)
``deterministic``   False                         ``algorithm='auto'`` never autotunes, so the algorithm,
                                                  and with it every bit of the result, depends on the
                                                  shapes alone, in every process; kernels that would sum
                                                  with float atomics are refused (none exists today)
``workspace_limit`` DEFAULT_WORKSPACE_LIMIT bytes  how many bytes a temporary buffer (an im2col matrix) may
                                                  take before an op processes the batch in chunks
==================  ============================  =========================================================

``set_<name>(value)`` changes the default for every later call in every thread; ``with <name>(value):`` changes
it for the calls made inside the block, in this thread (or asyncio task) only, and restores it after.  The ops
read them through ``get_<name>()`` and never keep a copy.

Every kernel of cupyconv is deterministic for a given algorithm: reductions run in a fixed order without
atomics, so a call repeated with the same algorithm gives the same bits.  What ``deterministic`` adds is that
the algorithm itself cannot change from one process to the next with timing noise.
"""
from __future__ import annotations

import contextlib
import contextvars

DEFAULT_WORKSPACE_LIMIT = 256 * 2**20

__all__ = [
    "get_allow_tf32", "set_allow_tf32", "allow_tf32",
    "get_autotune", "set_autotune", "autotune",
    "get_deterministic", "set_deterministic", "deterministic",
    "get_workspace_limit", "set_workspace_limit", "workspace_limit", "DEFAULT_WORKSPACE_LIMIT",
]


class _Setting:
    """A process-wide default with a per-context override: contextvars make the override thread-safe."""

    def __init__(self, name: str, default, check):
        self.name = name
        self.check = check
        self.default = check(default)
        self.scoped = contextvars.ContextVar(f"cupyconv_{name}", default=None)

    def get(self):
        scoped = self.scoped.get()
        return self.default if scoped is None else scoped

    def set(self, value) -> None:
        self.default = self.check(value)

    @contextlib.contextmanager
    def scope(self, value):
        token = self.scoped.set(self.check(value))
        try:
            yield
        finally:
            self.scoped.reset(token)


def _positive_bytes(nbytes) -> int:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
        raise ValueError(f"workspace limit must be a positive number of bytes, got {nbytes!r}")
    return nbytes


_ALLOW_TF32 = _Setting("allow_tf32", False, bool)
_AUTOTUNE = _Setting("autotune", False, bool)
_DETERMINISTIC = _Setting("deterministic", False, bool)
_WORKSPACE_LIMIT = _Setting("workspace_limit", DEFAULT_WORKSPACE_LIMIT, _positive_bytes)


def get_allow_tf32() -> bool:
    """Whether float32 GEMMs may use TF32 tensor cores (Ampere and newer)."""
    return _ALLOW_TF32.get()


def set_allow_tf32(enabled: bool) -> None:
    """Let float32 GEMMs use TF32 tensor cores (about 10 mantissa bits per product, float32 accumulation).

    Off by default: float32 is strict IEEE float32.  Read by cupyconv's own GEMMs (the cuBLAS compute type,
    `cupyconv._device.gemm_compute`) and by the tensor-core kernel (`algorithm='implicit_gemm'`, which float32
    reaches only while this is on); the direct and fused kernels compute in float32 either way.
    """
    _ALLOW_TF32.set(enabled)


def allow_tf32(enabled: bool):
    """`with allow_tf32(True):` TF32 for the calls inside the block only."""
    return _ALLOW_TF32.scope(enabled)


def get_autotune() -> bool:
    """Whether algorithm='auto' measures the candidates (unless `deterministic` is on)."""
    return _AUTOTUNE.get()


def set_autotune(enabled: bool) -> None:
    """Like cudnn.benchmark: with algorithm='auto', time every candidate algorithm on the first call of each
    (pass, geometry, dtype, device) and use the fastest from then on.  Off by default: that first call runs
    each candidate twice (once to compile and warm up, once timed)."""
    _AUTOTUNE.set(enabled)


def autotune(enabled: bool):
    """`with autotune(True):` autotuning for the calls inside the block only."""
    return _AUTOTUNE.scope(enabled)


def get_deterministic() -> bool:
    return _DETERMINISTIC.get()


def set_deterministic(enabled: bool) -> None:
    """Choose algorithms by the shapes alone (no autotuning), so every process computes the same bits."""
    _DETERMINISTIC.set(enabled)


def deterministic(enabled: bool):
    """`with deterministic(True):` for the calls inside the block only."""
    return _DETERMINISTIC.scope(enabled)


def get_workspace_limit() -> int:
    return _WORKSPACE_LIMIT.get()


def set_workspace_limit(nbytes: int) -> None:
    """Set the default workspace budget in bytes for every later call."""
    _WORKSPACE_LIMIT.set(nbytes)


def workspace_limit(nbytes: int):
    """Use a workspace budget of nbytes for the calls made inside the block."""
    return _WORKSPACE_LIMIT.scope(nbytes)
