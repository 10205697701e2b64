"""The workspace budget: how many bytes a temporary buffer (an im2col matrix) may take before ops chunk.

Set globally with `set_workspace_limit(nbytes)`, or for a block of code with `with workspace_limit(nbytes):`.
"""
from __future__ import annotations

import contextlib
import contextvars

DEFAULT_WORKSPACE_LIMIT = 256 * 2**20

_global_limit = DEFAULT_WORKSPACE_LIMIT
_scoped_limit: contextvars.ContextVar = contextvars.ContextVar("cupyconv_workspace_limit", default=None)


def set_workspace_limit(nbytes: int) -> None:
    """Set the default workspace budget in bytes for every later call."""
    global _global_limit
    _global_limit = _check(nbytes)


def get_workspace_limit() -> int:
    scoped = _scoped_limit.get()
    return _global_limit if scoped is None else scoped


@contextlib.contextmanager
def workspace_limit(nbytes: int):
    """Use a workspace budget of nbytes for the calls made inside the block."""
    token = _scoped_limit.set(_check(nbytes))
    try:
        yield
    finally:
        _scoped_limit.reset(token)


def _check(nbytes) -> int:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
        raise ValueError(f"workspace limit must be a positive number of bytes, got {nbytes!r}")
    return nbytes


def batch_chunks(n: int, bytes_per_item: int, limit: int | None = None):
    """Split range(n) into consecutive slices whose items take at most `limit` bytes (at least one item)."""
    limit = get_workspace_limit() if limit is None else limit
    step = max(1, limit // max(bytes_per_item, 1))
    return [slice(start, min(start + step, n)) for start in range(0, n, step)]
