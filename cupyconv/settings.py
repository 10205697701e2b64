"""Global behaviour of every op, in one place (in the spirit of `torch.backends.cudnn`).

Each setting has a getter, a setter and a context manager:

====================  ==============================  =========================================================
setting               default                         what it decides
====================  ==============================  =========================================================
``allow_tf32``        False                           float32 GEMMs may run on TF32 tensor cores (about 10
                                                      mantissa bits per product); off, float32 is IEEE float32
``autotune``          False                           ``algorithm='auto'`` times every candidate on the first
                                                      call of each problem and keeps the fastest (like
                                                      ``cudnn.benchmark``)
``deterministic``     False                           ``algorithm='auto'`` never autotunes, so the algorithm,
                                                      and with it every bit of the result, depends on the
                                                      shapes alone, in every process; kernels that would sum
                                                      with float atomics are refused (none exists today)
``workspace_limit``   DEFAULT_WORKSPACE_LIMIT bytes   how many bytes the temporary buffers (im2col matrices,
                                                      padded copies) may take before an op processes the batch
                                                      in chunks, down to bands of one image's output rows
====================  ==============================  =========================================================

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

import numpy

from ._docs import numpy_doc

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
    """An int >= 1 (NumPy's ints too, not bools), as a Python int."""
    if isinstance(nbytes, (bool, numpy.bool_)) or not isinstance(nbytes, (int, numpy.integer)) or nbytes < 1:
        raise ValueError(f"workspace limit must be a positive number of bytes, got {nbytes!r}")
    return int(nbytes)


def check_flag(name: str, value) -> bool:
    """A switch must be a bool (Python's or NumPy's), as torch.backends.cudnn's are: bool() would read 'False', 'no'
    or 0.5 as True.  (torch refuses numpy.bool_ too; we take it, as the ops take NumPy ints for ints.)"""
    if isinstance(value, (bool, numpy.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool (True or False), got {value!r}")


def _flag(name: str) -> _Setting:
    return _Setting(name, False, lambda value: check_flag(name, value))


_ALLOW_TF32 = _flag("allow_tf32")
_AUTOTUNE = _flag("autotune")
_DETERMINISTIC = _flag("deterministic")
_WORKSPACE_LIMIT = _Setting("workspace_limit", DEFAULT_WORKSPACE_LIMIT, _positive_bytes)


def snapshot() -> tuple:
    """Every setting in force here, as one tuple (what a call's GPU work may depend on: `_replay`'s and
    `_fastpath`'s keys); not public API.  One function, no getter calls: it runs on every public GPU call."""
    return (_ALLOW_TF32.scoped.get(), _ALLOW_TF32.default, _AUTOTUNE.scoped.get(), _AUTOTUNE.default,
            _DETERMINISTIC.scoped.get(), _DETERMINISTIC.default, _WORKSPACE_LIMIT.scoped.get(),
            _WORKSPACE_LIMIT.default)


# The docstring entries the getters, setters and context managers share (cupyconv._docs)
_IN_FORCE = "The value in force here: that of the innermost ``with`` block of this thread or task, else the global one."
_SCOPE = ("context manager", "Sets the value for the calls made inside the ``with`` block, in this thread or asyncio "
                            "task only, and restores the previous one on exit.")
_NBYTES = ("int", "A number of bytes, at least 1.")
_NOT_BYTES = (("ValueError", "nbytes is not a positive int."),)
_NOT_BOOL = (("TypeError", "enabled is not a bool."),)


@numpy_doc(returns=("bool", _IN_FORCE), raises=())
def get_allow_tf32() -> bool:
    """Whether float32 GEMMs may use TF32 tensor cores (Ampere and newer)."""
    return _ALLOW_TF32.get()


@numpy_doc(enabled=("bool", "True allows TF32; False (the default) keeps float32 strict."), raises=_NOT_BOOL)
def set_allow_tf32(enabled: bool) -> None:
    """Let float32 GEMMs use TF32 tensor cores (about 10 mantissa bits per product, float32 accumulation).

    Off by default: float32 is strict IEEE float32.  Read by cupyconv's own GEMMs (the cuBLAS compute type,
    `cupyconv._device.gemm_compute`) and by the tensor-core kernel (`algorithm='implicit_gemm'`, which float32
    reaches only while this is on); the direct and fused kernels compute in float32 either way.  For every later
    call, in every thread.
    """
    _ALLOW_TF32.set(enabled)


@numpy_doc(returns=_SCOPE, enabled=("bool", "Whether TF32 is allowed inside the block."), raises=_NOT_BOOL)
def allow_tf32(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """``with allow_tf32(True):`` TF32 for the calls inside the block only (see `set_allow_tf32`)."""
    return _ALLOW_TF32.scope(enabled)


@numpy_doc(returns=("bool", _IN_FORCE), raises=())
def get_autotune() -> bool:
    """Whether algorithm='auto' measures the candidates (unless `deterministic` is on)."""
    return _AUTOTUNE.get()


@numpy_doc(enabled=("bool", "True measures; False (the default) chooses by the shapes."), raises=_NOT_BOOL)
def set_autotune(enabled: bool) -> None:
    """Like cudnn.benchmark: with algorithm='auto', time every candidate algorithm on the first call of each
    (pass, geometry, dtype, device) and use the fastest from then on.

    Off by default: that first call runs each candidate several times (once to compile and warm up, then on a
    GPU once more to size a spin kernel and three times timed).  A GPU's candidates are compared by the GPU's
    time for their work alone, not by the host's time to enqueue it.  For every later call, in every thread;
    `deterministic` overrides it.
    """
    _AUTOTUNE.set(enabled)


@numpy_doc(returns=_SCOPE, enabled=("bool", "Whether to autotune inside the block."), raises=_NOT_BOOL)
def autotune(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """``with autotune(True):`` autotuning for the calls inside the block only (see `set_autotune`)."""
    return _AUTOTUNE.scope(enabled)


@numpy_doc(returns=("bool", _IN_FORCE), raises=())
def get_deterministic() -> bool:
    """Whether algorithm='auto' chooses by the shapes alone, never by measurement."""
    return _DETERMINISTIC.get()


@numpy_doc(enabled=("bool", "True turns autotuning off; False (the default) leaves it to `set_autotune`."),
           raises=_NOT_BOOL)
def set_deterministic(enabled: bool) -> None:
    """Choose algorithms by the shapes alone (no autotuning), so every process computes the same bits.

    For every later call, in every thread.
    """
    _DETERMINISTIC.set(enabled)


@numpy_doc(returns=_SCOPE, enabled=("bool", "Whether to choose by the shapes alone inside the block."),
           raises=_NOT_BOOL)
def deterministic(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """``with deterministic(True):`` for the calls inside the block only (see `set_deterministic`)."""
    return _DETERMINISTIC.scope(enabled)


@numpy_doc(returns=("int", _IN_FORCE), raises=())
def get_workspace_limit() -> int:
    """The bytes an op's temporary buffer (an im2col matrix) may take before it splits the batch into chunks."""
    return _WORKSPACE_LIMIT.get()


@numpy_doc(nbytes=_NBYTES, raises=_NOT_BYTES)
def set_workspace_limit(nbytes: int) -> None:
    """Set the workspace limit for every later call, in every thread (default: DEFAULT_WORKSPACE_LIMIT, 256 MiB)."""
    _WORKSPACE_LIMIT.set(nbytes)


@numpy_doc(returns=_SCOPE, nbytes=_NBYTES, raises=_NOT_BYTES)
def workspace_limit(nbytes: int) -> contextlib.AbstractContextManager[None]:
    """``with workspace_limit(nbytes):`` that limit for the calls made inside the block only."""
    return _WORKSPACE_LIMIT.scope(nbytes)
