"""Functional API: torch's signatures and conventions, cupyconv's padding forms; validate, call the custom op.

As `torch.nn.functional`:

* an unbatched input (no N dim: (C, L), (C, H, W), (C, D, H, W)) gives an unbatched output;
* an input or weight in `torch.channels_last` (`torch.channels_last_3d` for 3-D) memory format gives the
  output in that format (torch's rule, read from the strides: `_memory_format`, `output_format`).  The forward
  custom ops return their output in that format (as their fake implementations promise): the GPU path's
  channels-last kernel writes it so in place, any other path costs one copy; its gradient reaches the backward
  op as a channels-last grad_output, which the GPU path copies once.  The
  input itself is read in place on the GPU path by conv's kernels (`conv1d`, `conv2d` but for groups == C,
  `patch_conv2d`) and copied once by the depthwise kernels, the 3-D ops (depth windows) and the transposed
  convolutions (which read it as conv's grad_output): see "Channels-last and strided inputs" in docs/guide.md.

`algorithm` and `workspace_limit` (the ops that have them) apply to the call and to its backward: see
`cupyconv.conv2d` and `cupyconv.settings.workspace_limit`.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from .._arrays import _describe
from .._spec import (KERNEL_LAYOUTS, LAYOUTS, ConvSpec, _padding, _tuple, check_algorithm, check_groups,
                     check_workspace_limit)
from ..ops.conv import ALGORITHMS
from ..ops.patch import ALGORITHMS as PATCH_ALGORITHMS

# The wrappers call the custom ops through `_custom_ops.call` (torch's dispatcher skipped where it adds nothing).
# _custom_ops imports this module (output_format) and this one imports it back: the package imports _custom_ops
# first, so here it is still partly initialised, and `call` is read when a wrapper runs.
from . import _custom_ops  # noqa: E402  (isort: after the modules it needs)

__all__ = ["conv1d", "conv2d", "conv3d", "depthwise_conv2d", "patch_conv2d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "unfold", "fold"]

Size = Union[int, tuple[int, ...]]
Padding = Union[str, int, tuple]


def _flat(sides) -> list:
    """Per-side padding ((low, high), ...) as the custom ops take it: [low, high, low, high, ...]."""
    return [p for side in sides for p in side]


def _tensors(op: str, **arrays) -> None:
    """The arrays (None for an absent bias) must be tensors: NumPy, CuPy and dask arrays go to cupyconv's own
    functions, which take every kind (here they would fail inside torch, far from the call)."""
    for name, a in arrays.items():
        if a is not None and not isinstance(a, Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {_describe(a)}; cupyconv.torch takes tensors, "
                            f"cupyconv.{op} takes NumPy, CuPy and dask arrays as well")


def _batched(op: str, input: Tensor, nd: int) -> tuple[Tensor, bool]:
    """input with its batch dim (added when it is unbatched, as torch allows), and whether it was added."""
    if input.dim() == nd + 1:
        return input.unsqueeze(0), True
    if input.dim() != nd + 2:
        raise ValueError(f"{op}: input must have {nd + 2} dimensions {LAYOUTS[nd]} or {nd + 1} without the batch "
                         f"dim, got shape {tuple(input.shape)}")
    return input, False


class _Leading:
    """Stands for a tensor in ConvSpec's checks while torch.compile or torch.export traces with symbolic sizes
    (see `_checked_shape`)."""

    def __init__(self, shape):
        self.shape = shape


def _size_dependent(padding, stride) -> bool:
    """Whether the padding depends on the input's size: 'same' with a stride (the odd pixels of ceil(n / s))."""
    strides = stride if isinstance(stride, (tuple, list)) else (stride,)
    return isinstance(padding, str) and padding == "same" and any(s != 1 for s in strides)


def _example(n):
    """A symbolic size as the example's value without a guard (so a trace does not specialise it); an int as
    itself."""
    if isinstance(n, torch.SymInt):
        hint = getattr(n.node, "hint", None)
        return int(hint) if isinstance(hint, int) else int(n)       # no hint (unbacked): read it, specialising
    return int(n)


def sizes_for_checks(sizes, padding, stride) -> tuple:
    """Spatial sizes for cupyconv's checks during a trace: the example's (no guard, the program stays valid for
    other sizes, which the op checks again when it runs), except where the padding depends on them ('same' with
    a stride), where they are read and the trace specialises them."""
    if _size_dependent(padding, stride):
        return tuple(int(n) for n in sizes)
    return tuple(_example(n) for n in sizes)


def _checked_shape(t: Tensor, core: int, padding=0, stride=1):
    """t for ConvSpec's checks: itself when its sizes are ints (eager: the messages show its real shape), else a
    stand-in whose leading dims (all but the last `core`) read as 1 and whose spatial sizes read as
    `sizes_for_checks` gives them: the checks need only the channels and the spatial sizes, and reading the batch
    or a spatial size as an int would make torch.compile or torch.export specialise it to the example's."""
    if not any(isinstance(n, torch.SymInt) for n in t.shape):
        return t
    spatial = sizes_for_checks(t.shape[-core + 1:], padding, stride)
    return _Leading((1,) * (t.dim() - core) + (t.shape[-core], *spatial))


_FORMATS: dict = {}   # {(sizes, strides): `_memory_format`'s answer}


def _memory_format(t: Tensor) -> torch.memory_format:
    """The memory format torch reads from t's strides (C++ `Tensor.suggest_memory_format`, which torch's
    convolutions follow): channels-last when, walking C, the spatial dims from the last, then N, no stride is
    smaller than the extent of the dims walked before.  An ambiguous layout reads as contiguous where torch's
    does (a zero C stride, (N, C, 1, 1) planes); a size-1 C with NHWC strides reads as channels-last."""
    try:   # every call of an op reads it twice (x, weight): kept per (sizes, strides) of int sizes
        key = (t.shape, t.stride())
        return _FORMATS[key]
    except KeyError:
        pass
    except TypeError:   # symbolic sizes (a trace) cannot be hashed: read them every time
        key = None
    fmt = _read_memory_format(t)
    if key is not None:
        if len(_FORMATS) >= 4096:
            _FORMATS.clear()
        _FORMATS[key] = fmt
    return fmt


def _read_memory_format(t: Tensor) -> torch.memory_format:
    channels_last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
    # Symbolic sizes stay symbolic (an int() would specialise them); traced ones (jit.trace) become ints.
    sizes = [n if isinstance(n, torch.SymInt) else int(n) for n in t.shape]
    strides = [n if isinstance(n, torch.SymInt) else int(n) for n in t.stride()]
    if channels_last is None or strides[1] == 0:
        return torch.contiguous_format
    extent = 0
    for d in (1, *range(t.dim() - 1, 1, -1), 0):
        if sizes[d] == 0 or strides[d] < extent or (d == 0 and extent == strides[1]):
            return torch.contiguous_format
        extent = strides[d] * sizes[d]
    return channels_last


def output_format(x: Tensor, weight: Tensor) -> torch.memory_format:
    """The memory format of a convolution's output for batched x: x's, else weight's (torch's rule); contiguous
    for patches with several leading dims (no memory format applies).  The forward custom ops promise it (their
    fake implementations) and return it: a channels-last result of the kernels (conv_fwd_igemm writes one for a
    channels-last x) is returned as it is, an NCHW one copied once."""
    if x.dim() != weight.dim():
        return torch.contiguous_format
    fmt = _memory_format(x)
    return _memory_format(weight) if fmt == torch.contiguous_format else fmt


def _as_torch_returns(y: Tensor, x: Tensor, weight: Tensor, unbatched: bool = False) -> Tensor:
    """The op's output y (already in `output_format`) as torch returns it for input x: unbatched or as it is."""
    return y.squeeze(0) if unbatched else y


def _convolution(op: str, nd: int, input, weight, bias, stride, padding, dilation, groups, algorithm,
                 workspace_limit) -> Tensor:
    _tensors(op, input=input, weight=weight, bias=bias)
    check_algorithm(op, algorithm, ALGORITHMS)
    workspace_limit = check_workspace_limit(op, workspace_limit)
    x, unbatched = _batched(op, input, nd)
    spec = ConvSpec.for_conv(op, _checked_shape(x, nd + 1, padding, stride), weight, bias, stride, padding, dilation,
                             groups, nd=nd)
    y = _custom_ops.call(op, x, weight, bias, list(spec.stride), _flat(spec.padding), list(spec.dilation),
                         spec.groups, algorithm, workspace_limit)
    return _as_torch_returns(y, x, weight, unbatched)


_CONV_DOC = """{nd}-D convolution (cross-correlation) of input {layout} with weight (D, C // groups, {kernel}), as
    `torch.nn.functional.conv{nd}d`, computed by cupyconv.

    Parameters
    ----------
    input : Tensor
        {layout}, or unbatched without N.
    weight : Tensor
        (D, C // groups, {kernel}).
    bias : Tensor, optional
        (D,).
    stride, dilation : int or tuple of {nd} ints
    padding : int, tuple of {nd} ints, tuple of {nd} (low, high) pairs, 'valid' or 'same'
        Per side as well as torch's forms; 'same' for any stride (output = ceil(in / stride), the odd pixel of
        padding at the high end).
    groups : int
    algorithm : str
        The GPU kernels, forward and backward: 'auto', 'im2col_gemm', 'direct' or 'implicit_gemm' (see
        `cupyconv.conv2d`); the CPU path ignores it.
    workspace_limit : int, optional
        Bytes of im2col workspace for this call and its backward (None: `cupyconv.settings.workspace_limit`).

    Returns
    -------
    Tensor
        (N, D, {out}), unbatched for an unbatched input, channels-last for a channels-last input or weight.
    """


def conv1d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Size = 1, padding: Padding = 0,
           dilation: Size = 1, groups: int = 1, *, algorithm: str = "auto",
           workspace_limit: Optional[int] = None) -> Tensor:
    return _convolution("conv1d", 1, input, weight, bias, stride, padding, dilation, groups, algorithm,
                        workspace_limit)


def conv2d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Size = 1, padding: Padding = 0,
           dilation: Size = 1, groups: int = 1, *, algorithm: str = "auto",
           workspace_limit: Optional[int] = None) -> Tensor:
    return _convolution("conv2d", 2, input, weight, bias, stride, padding, dilation, groups, algorithm,
                        workspace_limit)


def conv3d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Size = 1, padding: Padding = 0,
           dilation: Size = 1, groups: int = 1, *, algorithm: str = "auto",
           workspace_limit: Optional[int] = None) -> Tensor:
    return _convolution("conv3d", 3, input, weight, bias, stride, padding, dilation, groups, algorithm,
                        workspace_limit)


for _nd, _conv in ((1, conv1d), (2, conv2d), (3, conv3d)):
    _conv.__doc__ = _CONV_DOC.format(nd=_nd, layout=LAYOUTS[_nd], kernel=KERNEL_LAYOUTS[_nd],
                                  out=KERNEL_LAYOUTS[_nd].replace("k", "o"))


def depthwise_conv2d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Size = 1,
                     padding: Padding = 0, dilation: Size = 1) -> Tensor:
    """Depthwise convolution: `conv2d` with groups = C, on cupyconv's depthwise kernels.

    Parameters
    ----------
    input : Tensor
        (N, C, H, W), or unbatched (C, H, W).
    weight : Tensor
        (C * m, 1, kH, kW) for a channel multiplier m: output channel c * m + k is input channel c convolved
        with filter c * m + k.
    bias : Tensor, optional
        (C * m,).
    stride, padding, dilation
        As `conv2d`.  The depthwise kernels have one algorithm and no workspace: no `algorithm`,
        `workspace_limit`.

    Returns
    -------
    Tensor
        (N, C * m, oH, oW), unbatched or channels-last as `conv2d`.
    """
    _tensors("depthwise_conv2d", input=input, weight=weight, bias=bias)
    x, unbatched = _batched("depthwise_conv2d", input, 2)
    spec = ConvSpec.for_depthwise("depthwise_conv2d", _checked_shape(x, 3, padding, stride), weight, bias, stride,
                                  padding, dilation)
    y = _custom_ops.call("depthwise_conv2d", x, weight, bias, list(spec.stride), _flat(spec.padding),
                         list(spec.dilation))
    return _as_torch_returns(y, x, weight, unbatched)


def patch_conv2d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Size = 1,
                 padding: Padding = 0, dilation: Size = 1, groups: int = 1, *, algorithm: str = "auto",
                 workspace_limit: Optional[int] = None) -> Tensor:
    """The same filters over every patch of input (..., C, H, W), padding applied inside each patch.

    Parameters
    ----------
    input : Tensor
        (..., C, H, W) with any number of leading dims, e.g. (B, P, C, H, W) or (C, H, W).
    weight, bias, stride, padding, dilation, groups, workspace_limit
        As `conv2d`.
    algorithm : str
        'auto', 'fused', 'im2col_gemm' or 'implicit_gemm' (see `cupyconv.patch_conv2d`).

    Returns
    -------
    Tensor
        (..., D, oH, oW); channels-last for a 4-D channels-last input or weight.
    """
    op = "patch_conv2d"
    _tensors(op, input=input, weight=weight, bias=bias)
    check_algorithm(op, algorithm, PATCH_ALGORITHMS)
    workspace_limit = check_workspace_limit(op, workspace_limit)
    spec = ConvSpec.for_conv(op, _checked_shape(input, 3, padding, stride), weight, bias, stride, padding, dilation,
                             groups, leading_dims=True)
    y = _custom_ops.call(op, input, weight, bias, list(spec.stride), _flat(spec.padding), list(spec.dilation),
                         spec.groups, algorithm, workspace_limit)
    return _as_torch_returns(y, input, weight)


def _transposed(op: str, nd: int, input, weight, bias, stride, padding, output_padding, groups, dilation,
                algorithm, workspace_limit) -> Tensor:
    """Normalise the arguments to the custom op's; the op checks how they fit the shapes."""
    _tensors(op, input=input, weight=weight, bias=bias)
    check_algorithm(op, algorithm, ALGORITHMS)
    workspace_limit = check_workspace_limit(op, workspace_limit)
    x, unbatched = _batched(op, input, nd)
    if padding == "same":
        raise ValueError(f"{op}: padding='same' is not defined for a transposed convolution; give the padding")
    stride, dilation = _tuple(op, "stride", stride, 1, nd), _tuple(op, "dilation", dilation, 1, nd)
    sides = _padding(op, padding, (1,) * nd, (1,) * nd, stride, dilation)   # the sizes matter for 'same' only
    y = _custom_ops.call(op, x, weight, bias, list(stride), _flat(sides),
                         list(_tuple(op, "output_padding", output_padding, 0, nd)), check_groups(op, groups),
                         list(dilation), algorithm, workspace_limit)
    return _as_torch_returns(y, x, weight, unbatched)


_TRANSPOSE_DOC = """{nd}-D transposed convolution of input {layout} with weight (C_in, C_out // groups, {kernel}),
    as `torch.nn.functional.conv_transpose{nd}d` (same argument order), computed by cupyconv.

    Parameters
    ----------
    input : Tensor
        {layout} with C = C_in, or unbatched without N.
    weight : Tensor
        (C_in, C_out // groups, {kernel}).
    bias : Tensor, optional
        (C_out,).
    stride, output_padding, dilation : int or tuple of {nd} ints
        output_padding < max(stride, dilation) in every dim.
    padding : int, tuple of {nd} ints, tuple of {nd} (low, high) pairs, or 'valid'
    groups : int
    algorithm : str
        The GPU kernels of the convolution this transposes, in every pass (forward: its input gradient; backward:
        its forward and weight gradient): 'auto', 'im2col_gemm', 'direct' or 'implicit_gemm' (see
        `cupyconv.conv_transpose{nd}d`); the CPU path ignores it.
    workspace_limit : int, optional
        As `conv{nd}d`.

    Returns
    -------
    Tensor
        (N, C_out, out...), out = (in - 1) * stride - pad_low - pad_high + dilation * (k - 1) + output_padding + 1;
        unbatched or channels-last as `conv{nd}d`.
    """


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Size = 1,
                     padding: Padding = 0, output_padding: Size = 0, groups: int = 1, dilation: Size = 1, *,
                     algorithm: str = "auto", workspace_limit: Optional[int] = None) -> Tensor:
    return _transposed("conv_transpose1d", 1, input, weight, bias, stride, padding, output_padding, groups,
                       dilation, algorithm, workspace_limit)


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Size = 1,
                     padding: Padding = 0, output_padding: Size = 0, groups: int = 1, dilation: Size = 1, *,
                     algorithm: str = "auto", workspace_limit: Optional[int] = None) -> Tensor:
    return _transposed("conv_transpose2d", 2, input, weight, bias, stride, padding, output_padding, groups,
                       dilation, algorithm, workspace_limit)


def conv_transpose3d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Size = 1,
                     padding: Padding = 0, output_padding: Size = 0, groups: int = 1, dilation: Size = 1, *,
                     algorithm: str = "auto", workspace_limit: Optional[int] = None) -> Tensor:
    return _transposed("conv_transpose3d", 3, input, weight, bias, stride, padding, output_padding, groups,
                       dilation, algorithm, workspace_limit)


for _nd, _transpose in ((1, conv_transpose1d), (2, conv_transpose2d), (3, conv_transpose3d)):
    _transpose.__doc__ = _TRANSPOSE_DOC.format(nd=_nd, layout=LAYOUTS[_nd], kernel=KERNEL_LAYOUTS[_nd])


def unfold(input: Tensor, kernel_size: Size, dilation: Size = 1, padding: Padding = 0, stride: Size = 1) -> Tensor:
    """Sliding blocks of input (..., C, H, W), as `torch.nn.functional.unfold` (with any leading dims).

    Parameters
    ----------
    input : Tensor
        (..., C, H, W).
    kernel_size, dilation, stride : int or pair
    padding : int, pair, ((top, bottom), (left, right)), 'valid' or 'same'

    Returns
    -------
    Tensor
        (..., C * kH * kW, L), rows in (c, i, j) order, L = oH * oW.
    """
    _tensors("unfold", input=input)
    spec = ConvSpec.for_unfold("unfold", _checked_shape(input, 3, padding, stride), kernel_size, dilation, padding,
                               stride)
    return _custom_ops.call("unfold", input, list(spec.kernel_size), list(spec.dilation), _flat(spec.padding),
                            list(spec.stride))


def fold(input: Tensor, output_size: Size, kernel_size: Size, dilation: Size = 1, padding: Padding = 0,
         stride: Size = 1) -> Tensor:
    """Sum blocks back into planes, as `torch.nn.functional.fold` (with any leading dims).

    Parameters
    ----------
    input : Tensor
        (..., C * kH * kW, L).
    output_size : int or pair
        (H, W).
    kernel_size, dilation, padding, stride
        As `unfold`.

    Returns
    -------
    Tensor
        (..., C, H, W); overlapping entries are summed.
    """
    _tensors("fold", input=input)
    spec = ConvSpec.for_fold("fold", input, output_size, kernel_size, dilation, padding, stride)
    return _custom_ops.call("fold", input, list(spec.in_size), list(spec.kernel_size), list(spec.dilation),
                            _flat(spec.padding), list(spec.stride))
