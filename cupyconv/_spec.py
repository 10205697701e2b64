"""Argument normalisation, output shapes and the argument checks of every op.

Everything the ops need to know about the geometry of one call lives in a frozen `ConvSpec`, built once per
call from the user's arguments.  The checks every op shares (`needs`, `grad_output`, `algorithm`) are here too.
Errors name the op, the argument and the shapes involved.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

from . import settings

Pair = tuple[int, int]

#: What a `*_backward` may be asked for, in the order of the tuple it returns.
NEEDS = ("input", "weight", "bias")


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0."""
    return -(-a // b)


def round_up(a: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= a."""
    return ceil_div(a, multiple) * multiple


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _pair(op: str, name: str, value, minimum: int) -> Pair:
    """An int or a pair of ints, each >= minimum."""
    if _is_int(value):
        pair = (int(value), int(value))
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_int(v) for v in value):
        pair = (int(value[0]), int(value[1]))
    else:
        raise TypeError(f"{op}: {name} must be an int or a pair of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{op}: {name} must be >= {minimum} in both dimensions, got {value!r}")
    return pair


def _padding(op: str, padding, in_size: Pair, kernel: Pair, stride: Pair, dilation: Pair):
    """Padding as ((top, bottom), (left, right)).

    Accepts an int, a pair (symmetric per dimension), per-side ((top, bottom), (left, right)), 'valid', and
    'same'.  'same' follows JAX for any stride: output = ceil(in / stride), with the odd pixel of padding at
    the bottom/right (the same split torch uses for stride 1).
    """
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return ((0, 0), (0, 0))
        if mode == "same":
            sides = []
            for n, k, s, d in zip(in_size, kernel, stride, dilation):
                out = ceil_div(n, s)
                total = max((out - 1) * s + d * (k - 1) + 1 - n, 0)
                sides.append((total // 2, total - total // 2))
            return tuple(sides)
        raise ValueError(f"{op}: padding must be an int, a pair, ((top, bottom), (left, right)), "
                         f"'same' or 'valid', got {padding!r}")

    def is_pair(value) -> bool:
        return isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_int(v) for v in value)

    if _is_int(padding) or is_pair(padding):
        top_left = _pair(op, "padding", padding, 0)
        return ((top_left[0], top_left[0]), (top_left[1], top_left[1]))
    if isinstance(padding, (tuple, list)) and len(padding) == 2 and all(is_pair(p) for p in padding):
        sides = tuple((int(lo), int(hi)) for lo, hi in padding)
        if min(min(side) for side in sides) < 0:
            raise ValueError(f"{op}: padding must be >= 0 on every side, got {padding!r}")
        return sides
    raise TypeError(f"{op}: padding must be an int, a pair, ((top, bottom), (left, right)), 'same' or 'valid', "
                    f"got {padding!r}")


def _shape(a) -> tuple[int, ...]:
    return tuple(int(s) for s in a.shape)


@dataclass(frozen=True)
class ConvSpec:
    """Geometry of one 2-D sliding-window op over planes of size in_size.

    `batch` is the leading shape (every dimension before C, H, W); the ops treat it as one flat batch.
    """
    op: str
    batch: tuple[int, ...]
    in_channels: int
    out_channels: int
    groups: int
    in_size: Pair
    kernel_size: Pair
    stride: Pair
    dilation: Pair
    padding: tuple[Pair, Pair]
    out_size: Pair

    @property
    def n(self) -> int:
        return math.prod(self.batch)

    @property
    def taps(self) -> int:
        return self.kernel_size[0] * self.kernel_size[1]

    @property
    def out_pixels(self) -> int:
        return self.out_size[0] * self.out_size[1]

    @property
    def channels_per_group(self) -> int:
        return self.in_channels // self.groups

    @property
    def outputs_per_group(self) -> int:
        return self.out_channels // self.groups

    def cols_bytes(self, itemsize: int) -> int:
        """Bytes of one image's im2col matrix (C * kH * kW rows of oH * oW pixels): the workspace unit."""
        return self.in_channels * self.taps * self.out_pixels * itemsize

    @property
    def padded_size(self) -> Pair:
        (t, b), (l, r) = self.padding
        return (self.in_size[0] + t + b, self.in_size[1] + l + r)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (*self.batch, self.in_channels, *self.in_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (*self.batch, self.out_channels, *self.out_size)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        return (self.out_channels, self.channels_per_group, *self.kernel_size)

    def with_batch(self, n: int) -> "ConvSpec":
        """The same geometry over a flat batch of n images (a chunk of this call's batch)."""
        return dataclasses.replace(self, batch=(n,))

    def window_args(self) -> dict:
        """The window geometry under the parameter names every kernel uses for it (a kernel takes the ones
        it declares); the bottom and right padding are implied by the sizes."""
        (h, w), (oh, ow), (kh, kw) = self.in_size, self.out_size, self.kernel_size
        (sh, sw), (dh, dw), ((top, _), (left, _)) = self.stride, self.dilation, self.padding
        return dict(height=h, width=w, out_h=oh, out_w=ow, kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw,
                    dilation_h=dh, dilation_w=dw, pad_top=top, pad_left=left)

    @staticmethod
    def geometry(op: str, batch, in_channels: int, out_channels: int, groups: int, in_size: Pair,
                 kernel_size, stride, padding, dilation) -> "ConvSpec":
        """Normalise the window arguments and compute the output size; raises for an empty output."""
        kernel = _pair(op, "kernel_size", kernel_size, 1)
        stride = _pair(op, "stride", stride, 1)
        dilation = _pair(op, "dilation", dilation, 1)
        pad = _padding(op, padding, in_size, kernel, stride, dilation)
        out = []
        for n, (lo, hi), k, s, d in zip(in_size, pad, kernel, stride, dilation):
            out.append((n + lo + hi - d * (k - 1) - 1) // s + 1)
        if min(out) <= 0:
            raise ValueError(
                f"{op}: output size would be {out[0]}x{out[1]} (input {in_size[0]}x{in_size[1]}, "
                f"kernel {kernel[0]}x{kernel[1]}, stride {stride}, padding {pad}, dilation {dilation}); "
                f"it must be at least 1x1")
        return ConvSpec(op, tuple(batch), in_channels, out_channels, groups, tuple(in_size), kernel,
                        stride, dilation, pad, tuple(out))

    @staticmethod
    def for_conv(op: str, x, weight, bias, stride, padding, dilation, groups, *, min_ndim: int = 4,
                 max_ndim: int | None = 4) -> "ConvSpec":
        """Validate x (..., C, H, W), weight (D, C // groups, kH, kW) and bias (D,) for a convolution."""
        xs, ws = _shape(x), _shape(weight)
        if len(xs) < min_ndim or (max_ndim is not None and len(xs) > max_ndim):
            want = f"{min_ndim}" if max_ndim == min_ndim else f"at least {min_ndim}"
            layout = "(N, C, H, W)" if max_ndim == 4 else "(..., C, H, W)"
            raise ValueError(f"{op}: x must have {want} dimensions {layout}, got shape {xs}")
        if len(ws) != 4:
            raise ValueError(f"{op}: weight must have 4 dimensions (D, C // groups, kH, kW), got shape {ws}")
        if not _is_int(groups):
            raise TypeError(f"{op}: groups must be an int, got {groups!r}")
        if groups < 1:
            raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
        c, d = xs[-3], ws[0]
        if c % groups:
            raise ValueError(f"{op}: groups={groups} does not divide the {c} input channels of x {xs}")
        if d % groups:
            raise ValueError(f"{op}: groups={groups} does not divide the {d} output channels of weight {ws}")
        if ws[1] * groups != c:
            raise ValueError(f"{op}: weight {ws} has {ws[1]} input channels per group but x {xs} has "
                             f"{c} channels with groups={groups} (expected weight.shape[1] == {c // groups})")
        if bias is not None and _shape(bias) != (d,):
            raise ValueError(f"{op}: bias must have shape ({d},) to match weight {ws}, got {_shape(bias)}")
        return ConvSpec.geometry(op, xs[:-3], c, d, int(groups), xs[-2:], ws[2:], stride, padding, dilation)

    @staticmethod
    def for_unfold(op: str, x, kernel_size, dilation, padding, stride, *, name: str = "x") -> "ConvSpec":
        """x (..., C, H, W); `name` is what the error messages call it (fold_backward: grad_output)."""
        xs = _shape(x)
        if len(xs) < 3:
            raise ValueError(f"{op}: {name} must have at least 3 dimensions (..., C, H, W), got shape {xs}")
        c = xs[-3]
        spec = ConvSpec.geometry(op, xs[:-3], c, c, 1, xs[-2:], kernel_size, stride, padding, dilation)
        return spec

    @staticmethod
    def for_fold(op: str, cols, output_size, kernel_size, dilation, padding, stride, *, name: str = "cols",
                 size_name: str = "output_size") -> "ConvSpec":
        """cols (..., C * kH * kW, L) folded into (..., C, H, W) with (H, W) = output_size.

        `name` and `size_name` are what the error messages call cols and output_size (unfold_backward:
        grad_output and input_size)."""
        cs = _shape(cols)
        if len(cs) < 2:
            raise ValueError(f"{op}: {name} must have at least 2 dimensions (..., C * kH * kW, L), "
                             f"got shape {cs}")
        size = _pair(op, size_name, output_size, 1)
        kernel = _pair(op, "kernel_size", kernel_size, 1)
        taps = kernel[0] * kernel[1]
        if cs[-2] % taps:
            raise ValueError(f"{op}: {name} {cs} has {cs[-2]} rows, not a multiple of kernel_size "
                             f"{kernel[0]}x{kernel[1]} = {taps}")
        c = cs[-2] // taps
        spec = ConvSpec.geometry(op, cs[:-2], c, c, 1, size, kernel, stride, padding, dilation)
        if spec.out_pixels != cs[-1]:
            raise ValueError(f"{op}: {name} {cs} has {cs[-1]} blocks but {size_name} {size} with kernel_size "
                             f"{kernel}, stride {spec.stride}, padding {spec.padding} and dilation "
                             f"{spec.dilation} gives {spec.out_size[0]}x{spec.out_size[1]} = "
                             f"{spec.out_pixels} blocks")
        return spec

    @staticmethod
    def for_depthwise(op: str, x, weight, bias, stride, padding, dilation) -> "ConvSpec":
        xs, ws = _shape(x), _shape(weight)
        if len(xs) != 4:
            raise ValueError(f"{op}: x must have 4 dimensions (N, C, H, W), got shape {xs}")
        c = xs[1]
        if len(ws) != 4 or ws[1] != 1 or ws[0] % max(c, 1) or ws[0] == 0:
            raise ValueError(f"{op}: weight must have shape (C * m, 1, kH, kW) with C = {c} channels of "
                             f"x {xs} and channel multiplier m >= 1, got {ws}")
        return ConvSpec.for_conv(op, x, weight, bias, stride, padding, dilation, c)


def batch_chunks(n: int, bytes_per_item: int, limit: int | None = None) -> list[slice]:
    """Split range(n) into consecutive slices whose items take at most `limit` bytes of workspace (default:
    `settings.get_workspace_limit()`), at least one item each; `ConvSpec.with_batch` gives a slice's spec."""
    limit = settings.get_workspace_limit() if limit is None else limit
    step = max(1, limit // max(bytes_per_item, 1))
    return [slice(start, min(start + step, n)) for start in range(0, n, step)]


def check_needs(op: str, needs) -> frozenset:
    """`needs` of a `*_backward`: a name or an iterable of names from NEEDS."""
    if isinstance(needs, str):
        needs = (needs,)
    needs = frozenset(needs)
    unknown = needs - set(NEEDS)
    if unknown:
        raise ValueError(f"{op}: needs may contain only {NEEDS}, got {sorted(unknown, key=repr)}")
    return needs


def check_grad_output(op: str, grad_output, spec: ConvSpec) -> None:
    if tuple(grad_output.shape) != spec.output_shape:
        raise ValueError(f"{op}: grad_output has shape {tuple(grad_output.shape)} but the forward output of "
                         f"x {spec.input_shape} and weight {spec.weight_shape} has shape {spec.output_shape}")


def check_algorithm(op: str, algorithm, algorithms: tuple[str, ...]) -> None:
    if algorithm not in algorithms:
        raise ValueError(f"{op}: algorithm must be one of {algorithms}, got {algorithm!r}")
