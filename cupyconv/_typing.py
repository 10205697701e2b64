"""The types of the public API's arguments, written once; every public module imports them from here.

cupyconv takes NumPy arrays, CuPy arrays and torch tensors and returns the kind it was given, so the ops are
generic in `ArrayT`: NumPy arrays in, a NumPy array out.  Neither CuPy nor torch is imported to say so: `Array` is
the little all three have in common.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, Protocol, TypeVar


class Array(Protocol):
    """An array argument: a ``numpy.ndarray``, a ``cupy.ndarray`` or a ``torch.Tensor``."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> Any: ...


#: The caller's array kind: every array argument of one call and its results share it.
ArrayT = TypeVar("ArrayT", bound=Array)

#: A tuple or list with one int per spatial dim.
Ints = tuple[int, ...] | list[int]

#: One int for every spatial dim, or one per dim.
IntOrTuple = int | Ints

#: An int or one int per dim (both sides), one (low, high) pair per dim, ``'same'`` or ``'valid'``.
Padding = IntOrTuple | tuple[tuple[int, int], ...] | Literal["same", "valid"]

#: Which gradients a ``*_backward`` computes: names from ``("input", "weight", "bias")``, or one name.
Needs = str | Iterable[str]

#: What a ``*_backward`` returns: (grad_x, grad_weight, grad_bias), None for each gradient not asked for.
Gradients = tuple[ArrayT | None, ArrayT | None, ArrayT | None]
