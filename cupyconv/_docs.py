"""The Parameters, Returns and Raises sections of the public docstrings (NumPy style), each text written once.

A public function's own docstring says what it does; the `numpy_doc` decorator appends the sections.  It takes
the parameters from the signature, in order, so none is left out, and describes each by the (type, description)
the function passes for it, or else by the shared entry of that name in `PARAMETERS`.
"""
from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import TypeVar

Function = TypeVar("Function", bound=Callable)
Entry = tuple[str, str]  # (type, description)

WIDTH = 112

#: The parameters many functions share, by name.
PARAMETERS: dict[str, Entry] = {
    "bias": ("array or None", "One value per output channel, added to that channel; None (the default) adds none."),
    "stride": ("int or tuple of int", "The step between windows: one int for every spatial dim, or one per dim."),
    "padding": ("int, tuple or str",
                "Zeros around the input's spatial dims: an int for every side; one int per dim, for both of its "
                "sides; one (low, high) pair per dim, e.g. ((top, bottom), (left, right)) in 2-D; 'valid' (none); or "
                "'same', for any stride as JAX defines it: output size ceil(in / stride), the odd pixel of padding at "
                "the high end (bottom, right)."),
    "dilation": ("int or tuple of int",
                 "The spacing between kernel taps: one int for every spatial dim, or one per dim."),
    "groups": ("int",
               "The number of channel groups: output channel group g sees input channel group g only; it divides "
               "the input and the output channels."),
    "workspace_limit": ("int or None",
                        "The bytes an im2col buffer may take in this call (None: `cupyconv.settings` workspace_limit)"
                        "; the batch is processed in chunks that fit."),
    "grad_output": ("array", "The gradient of a loss with respect to the forward output; the output's shape."),
    "needs": ("str or iterable of str",
              'The gradients to compute: names from ("input", "weight", "bias"), all three by default, or one name.'),
    "kernel_size": ("int or tuple of int",
                    "The window: one int per spatial dim, 1, 2 or 3 of them, which sets how many spatial dims the op "
                    "works over; or an int for every dim of a 2-D window (or of as many dims as fold's output_size "
                    "has)."),
}

#: What every forward op returns, after its shape.
SAME_KIND = "Of the inputs' kind (NumPy, CuPy or torch), device and dtype."

#: What every `*_backward` of a convolution returns.
GRADIENTS: Entry = ("tuple of 3 arrays or None",
                    "(grad_x, grad_weight, grad_bias): the gradients with respect to x, weight and bias, shaped like "
                    "them (grad_bias: one entry per output channel) and of the inputs' kind and dtype; None for each "
                    "one that `needs` does not name.")

#: What every op raises for bad arguments.
RAISES: tuple[Entry, ...] = (
    ("TypeError", "An argument of the wrong type; arrays of different kinds (NumPy, CuPy, torch), devices or dtypes; "
                  "a dtype other than float16, bfloat16, float32 and float64."),
    ("ValueError", "Shapes that do not fit together (channels, groups, bias, grad_output), an empty output, a "
                   "value out of range or an unknown name; the message names the function, the argument and the "
                   "shapes."),
)


def _section(title: str, entries) -> str:
    lines = [title, "-" * len(title)]
    for head, text in entries:
        lines.append(head)
        lines.append(textwrap.fill(text, WIDTH, initial_indent="    ", subsequent_indent="    "))
    return "\n".join(lines)


def numpy_doc(*families: dict[str, Entry], returns: Entry | None = None, raises: tuple[Entry, ...] = RAISES,
              **parameters: Entry) -> Callable[[Function], Function]:
    """Decorator: append Parameters, Returns (unless `returns` is None) and Raises (unless `raises` is empty) to
    the function's docstring.  `families` (entries that several functions share) and `parameters` describe the
    parameters that `PARAMETERS` does not, or differently; the last word wins."""
    def decorate(function: Function) -> Function:
        names = list(inspect.signature(function).parameters)
        described = {**PARAMETERS, **{k: v for family in families for k, v in family.items()}, **parameters}
        unknown = set(described) - set(PARAMETERS) - set(names)
        undescribed = [name for name in names if name not in described]
        if unknown or undescribed:
            raise TypeError(f"numpy_doc: {function.__name__} has no parameter {sorted(unknown)}, or no description "
                            f"of {undescribed}")
        sections = [inspect.cleandoc(function.__doc__ or "")]
        if names:
            sections.append(_section("Parameters", [(f"{name} : {described[name][0]}", described[name][1])
                                                    for name in names]))
        if returns is not None:
            sections.append(_section("Returns", [returns]))
        if raises:
            sections.append(_section("Raises", raises))
        function.__doc__ = "\n\n".join(sections) + "\n"
        return function
    return decorate
