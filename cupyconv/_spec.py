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
Sizes = tuple[int, ...]   # one int per spatial dim (1, 2 or 3 of them)

#: The layout of x named in error messages, by the number of spatial dims.
LAYOUTS = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}
KERNEL_LAYOUTS = {1: "k", 2: "kH, kW", 3: "kD, kH, kW"}
SPATIAL = {1: "L", 2: "H, W", 3: "D, H, W"}

#: What a `*_backward` may be asked for, in the order of the tuple it returns.
NEEDS = ("input", "weight", "bias")


#: The largest stride `ConvSpec.clamped` leaves along a dim of one output: what a kernel's int parameter holds.
MAX_STRIDE = 2**31 - 1


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0."""
    return -(-a // b)


def round_up(a: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= a."""
    return ceil_div(a, multiple) * multiple


def _is_int(value) -> bool:
    # `type(value) is int` first: numbers.Integral is an ABC whose isinstance check costs several calls.
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def _tuple(op: str, name: str, value, minimum: int, nd: int = 2) -> Sizes:
    """An int or a tuple of nd ints (a pair for 2-D), each >= minimum."""
    if type(value) is int:   # the common cases first, without the calls of the general one
        sizes = (value,) * nd
    elif type(value) is tuple and len(value) == nd and {type(v) for v in value} == {int}:
        sizes = value
    elif _is_int(value):
        sizes = (int(value),) * nd
    elif isinstance(value, (tuple, list)) and len(value) == nd and all(_is_int(v) for v in value):
        sizes = tuple(int(v) for v in value)
    else:
        what = "a pair of ints" if nd == 2 else f"a tuple of {nd} int{'s' if nd > 1 else ''}"
        raise TypeError(f"{op}: {name} must be an int or {what}, got {value!r}")
    if min(sizes) < minimum:
        raise ValueError(f"{op}: {name} must be >= {minimum} in {'both dimensions' if nd == 2 else 'every dimension'}"
                         f", got {value!r}")
    return sizes


def _pair(op: str, name: str, value, minimum: int) -> Pair:
    return _tuple(op, name, value, minimum, 2)


def _padding_forms(nd: int) -> str:
    if nd == 2:
        return "an int, a pair, ((top, bottom), (left, right)), 'same' or 'valid'"
    return f"an int, a tuple of {nd} ints, a tuple of {nd} (low, high) pairs, 'same' or 'valid'"


def _padding(op: str, padding, in_size: Sizes, kernel: Sizes, stride: Sizes, dilation: Sizes):
    """Padding as one (low, high) pair per spatial dim: ((top, bottom), (left, right)) in 2-D.

    Accepts an int, one int per dim (symmetric), per side (one (low, high) pair per dim), 'valid', and 'same'.
    'same' follows JAX for any stride: output = ceil(in / stride), with the odd pixel of padding at the high
    end (bottom/right; the same split torch uses for stride 1).
    """
    nd = len(in_size)
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * nd
        if padding == "same":
            sides = []
            for n, k, s, d in zip(in_size, kernel, stride, dilation):
                out = ceil_div(n, s)
                total = max((out - 1) * s + d * (k - 1) + 1 - n, 0)
                sides.append((total // 2, total - total // 2))
            return tuple(sides)
        if padding.lower() in ("same", "valid"):     # torch refuses other spellings; so do we, saying why
            raise ValueError(f"{op}: padding strings are 'same' and 'valid' in lower case, as torch spells them, "
                             f"got {padding!r}")
        raise ValueError(f"{op}: padding must be {_padding_forms(nd)}, got {padding!r}")

    def is_pair(value) -> bool:
        return isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_int(v) for v in value)

    if type(padding) is int and padding >= 0:   # the common case, without the calls of the general one
        return ((padding, padding),) * nd
    per_dim = isinstance(padding, (tuple, list)) and len(padding) == nd and all(_is_int(v) for v in padding)
    if _is_int(padding) or per_dim:
        low = _tuple(op, "padding", padding, 0, nd)
        return tuple((p, p) for p in low)
    if isinstance(padding, (tuple, list)) and len(padding) == nd and all(is_pair(p) for p in padding):
        sides = tuple((int(lo), int(hi)) for lo, hi in padding)
        if min(min(side) for side in sides) < 0:
            raise ValueError(f"{op}: padding must be >= 0 on every side, got {padding!r}")
        return sides
    raise TypeError(f"{op}: padding must be {_padding_forms(nd)}, got {padding!r}")


def spatial_dims(op: str, kernel_size, *, name: str = "kernel_size") -> int:
    """The number of spatial dims a window op works over, read from its kernel_size: an int is 2-D (as torch's
    unfold), a tuple has one entry per dim (1, 2 or 3)."""
    if isinstance(kernel_size, (tuple, list)):
        if len(kernel_size) not in (1, 2, 3):
            raise TypeError(f"{op}: {name} must be an int or a tuple of 1, 2 or 3 ints, got {kernel_size!r}")
        return len(kernel_size)
    return 2


def _shape(a) -> tuple[int, ...]:
    shape = a.shape
    return shape if type(shape) is tuple else tuple(int(s) for s in shape)   # NumPy's and CuPy's: ints already


@dataclass(frozen=True)
class ConvSpec:
    """Geometry of one sliding-window op over 1, 2 or 3 spatial dims (`nd`): planes of size in_size.

    `batch` is the leading shape (every dimension before C and the spatial dims); the ops treat it as one flat
    batch.  The kernels are 2-D: ops/nd.py maps 1-D and 3-D specs onto 2-D ones.
    """
    op: str
    batch: tuple[int, ...]
    in_channels: int
    out_channels: int
    groups: int
    in_size: Sizes
    kernel_size: Sizes
    stride: Sizes
    dilation: Sizes
    padding: tuple[Pair, ...]
    out_size: Sizes

    @property
    def nd(self) -> int:
        return len(self.in_size)

    @property
    def n(self) -> int:
        return math.prod(self.batch)

    @property
    def taps(self) -> int:
        return math.prod(self.kernel_size)

    @property
    def out_pixels(self) -> int:
        return math.prod(self.out_size)

    @property
    def channels_per_group(self) -> int:
        return self.in_channels // self.groups

    @property
    def outputs_per_group(self) -> int:
        return self.out_channels // self.groups

    @property
    def empty(self) -> bool:
        """Whether x or the weight has no elements (N, C or D is 0, or a plane that only the padding covers): then
        every window sums nothing but zeros, so the output is the bias (or zeros), the input and weight gradients
        are zeros and the bias gradient is grad_output's sum (ops/lift.py returns these without running a path)."""
        return math.prod(self.input_shape) == 0 or math.prod(self.weight_shape) == 0

    def cols_bytes(self, itemsize: int) -> int:
        """Bytes of one image's im2col matrix (C * taps rows of out_pixels pixels): the workspace unit."""
        return self.in_channels * self.taps * self.out_pixels * itemsize

    @property
    def padded_size(self) -> Sizes:
        return tuple(n + lo + hi for n, (lo, hi) in zip(self.in_size, self.padding))

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

    def clamped(self) -> "ConvSpec":
        """The same problem in a smaller geometry that reads the same positions: along a dim of one output a stride
        past 2^31 - 1 cut to the window's extent, along a dim of one tap dilation 1, and the high padding cut to
        what the last window reaches.

        Exact: output p, tap a reads p * stride + a * dilation - pad_low for p < out and a < k, which none of
        these changes, and the output size stays (the high padding only ever rounds it).  So a valid stride of
        2^62 (one output) never reaches NumPy's strides or a kernel's int parameter, and a padding larger than the
        windows reach costs no padded copy.  (Smaller strides stay: the kernels chosen for them do not change.)"""
        extents = [d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilation)]
        stride = tuple(e if o == 1 and s > MAX_STRIDE else s for o, s, e in zip(self.out_size, self.stride, extents))
        dilation = tuple(1 if k == 1 else d for k, d in zip(self.kernel_size, self.dilation))
        padding = tuple((lo, max(0, (o - 1) * s + d * (k - 1) + 1 - lo - n))
                        for n, (lo, _), o, s, d, k in zip(self.in_size, self.padding, self.out_size, stride,
                                                          dilation, self.kernel_size))
        if stride == self.stride and dilation == self.dilation and padding == self.padding:
            return self   # the common case: nothing to clamp, and no copy made
        return dataclasses.replace(self, stride=stride, dilation=dilation, padding=padding)

    def window_args(self) -> dict:
        """The window geometry under the parameter names every kernel uses for it (a kernel takes the ones
        it declares); the bottom and right padding are implied by the sizes.  2-D specs, and 3-D for the kernels
        that take a depth (conv_fwd_igemm_3d: `depth`, `out_d`, `kernel_d`, `stride_d`, `dilation_d`,
        `pad_front` besides the 2-D names for the last two dims)."""
        assert self.nd in (2, 3), "the kernels are 2-D (and conv_fwd_igemm_3d): map the spec with ops/nd.py first"
        (h, w), (oh, ow), (kh, kw) = self.in_size[-2:], self.out_size[-2:], self.kernel_size[-2:]
        (sh, sw), (dh, dw), ((top, _), (left, _)) = self.stride[-2:], self.dilation[-2:], self.padding[-2:]
        args = dict(height=h, width=w, out_h=oh, out_w=ow, kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw,
                    dilation_h=dh, dilation_w=dw, pad_top=top, pad_left=left)
        if self.nd == 3:
            args.update(depth=self.in_size[0], out_d=self.out_size[0], kernel_d=self.kernel_size[0],
                        stride_d=self.stride[0], dilation_d=self.dilation[0], pad_front=self.padding[0][0])
        return args

    @staticmethod
    def geometry(op: str, batch, in_channels: int, out_channels: int, groups: int, in_size: Sizes,
                 kernel_size, stride, padding, dilation) -> "ConvSpec":
        """Normalise the window arguments and compute the output size; raises for an empty output."""
        nd = len(in_size)
        kernel = _tuple(op, "kernel_size", kernel_size, 1, nd)
        stride = _tuple(op, "stride", stride, 1, nd)
        dilation = _tuple(op, "dilation", dilation, 1, nd)
        pad = _padding(op, padding, in_size, kernel, stride, dilation)
        out = []
        for n, (lo, hi), k, s, d in zip(in_size, pad, kernel, stride, dilation):
            out.append((n + lo + hi - d * (k - 1) - 1) // s + 1)
        if min(out) <= 0:
            x = "x".join
            raise ValueError(
                f"{op}: output size would be {x(map(str, out))} (input {x(map(str, in_size))}, "
                f"kernel {x(map(str, kernel))}, stride {stride}, padding {pad}, dilation {dilation}); "
                f"it must be at least {x(['1'] * nd)}")
        return ConvSpec(op, tuple(batch), in_channels, out_channels, groups, tuple(in_size), kernel,
                        stride, dilation, pad, tuple(out))

    @staticmethod
    def for_conv(op: str, x, weight, bias, stride, padding, dilation, groups, *, nd: int = 2,
                 leading_dims: bool = False) -> "ConvSpec":
        """Validate x (N, C, *spatial), weight (D, C // groups, *k) and bias (D,) for a convolution over nd
        spatial dims; with leading_dims x may have any number of leading dims (..., C, *spatial)."""
        xs, ws = _shape(x), _shape(weight)
        if len(xs) < nd + 1 or (not leading_dims and len(xs) != nd + 2):
            want = f"at least {nd + 1}" if leading_dims else f"{nd + 2}"
            layout = f"(..., C, {SPATIAL[nd]})" if leading_dims else LAYOUTS[nd]
            raise ValueError(f"{op}: x must have {want} dimensions {layout}, got shape {xs}")
        if len(ws) != nd + 2:
            raise ValueError(f"{op}: weight must have {nd + 2} dimensions (D, C // groups, {KERNEL_LAYOUTS[nd]}), "
                             f"got shape {ws}")
        groups = check_groups(op, groups)
        c, d = xs[-nd - 1], ws[0]
        if c % groups:
            raise ValueError(f"{op}: groups={groups} does not divide the {c} input channels of x {xs}")
        if d % groups:
            raise ValueError(f"{op}: groups={groups} does not divide the {d} output channels of weight {ws}")
        if ws[1] * groups != c:
            raise ValueError(f"{op}: weight {ws} has {ws[1]} input channels per group but x {xs} has "
                             f"{c} channels with groups={groups} (expected weight.shape[1] == {c // groups})")
        if bias is not None and _shape(bias) != (d,):
            raise ValueError(f"{op}: bias must have shape ({d},) to match weight {ws}, got {_shape(bias)}")
        return ConvSpec.geometry(op, xs[:-nd - 1], c, d, groups, xs[-nd:], ws[2:], stride, padding, dilation)

    @staticmethod
    def for_unfold(op: str, x, kernel_size, dilation, padding, stride, *, name: str = "x") -> "ConvSpec":
        """x (..., C, *spatial), spatial dims as many as kernel_size has entries (an int: 2);
        `name` is what the error messages call it (fold_backward: grad_output)."""
        nd = spatial_dims(op, kernel_size)
        xs = _shape(x)
        if len(xs) < nd + 1:
            raise ValueError(f"{op}: {name} must have at least {nd + 1} dimensions (..., C, {SPATIAL[nd]}), "
                             f"got shape {xs}")
        c = xs[-nd - 1]
        return ConvSpec.geometry(op, xs[:-nd - 1], c, c, 1, xs[-nd:], kernel_size, stride, padding, dilation)

    @staticmethod
    def for_fold(op: str, cols, output_size, kernel_size, dilation, padding, stride, *, name: str = "cols",
                 size_name: str = "output_size") -> "ConvSpec":
        """cols (..., C * taps, L) folded into (..., C, *output_size); the spatial dims are as many as
        kernel_size has entries (an int: as many as output_size has, 2 for an int).

        `name` and `size_name` are what the error messages call cols and output_size (unfold_backward:
        grad_output and input_size)."""
        cs = _shape(cols)
        if len(cs) < 2:
            raise ValueError(f"{op}: {name} must have at least 2 dimensions (..., C * kH * kW, L), "
                             f"got shape {cs}")
        if isinstance(kernel_size, (tuple, list)) or not isinstance(output_size, (tuple, list)):
            nd = spatial_dims(op, kernel_size)
        else:
            nd = spatial_dims(op, output_size, name=size_name)
        size = _tuple(op, size_name, output_size, 0, nd)   # 0 where the padding alone covers the plane, as for unfold
        kernel = _tuple(op, "kernel_size", kernel_size, 1, nd)
        taps = math.prod(kernel)
        if cs[-2] % taps:
            raise ValueError(f"{op}: {name} {cs} has {cs[-2]} rows, not a multiple of kernel_size "
                             f"{'x'.join(map(str, kernel))} = {taps}")
        c = cs[-2] // taps
        spec = ConvSpec.geometry(op, cs[:-2], c, c, 1, size, kernel, stride, padding, dilation)
        if spec.out_pixels != cs[-1]:
            raise ValueError(f"{op}: {name} {cs} has {cs[-1]} blocks but {size_name} {size} with kernel_size "
                             f"{kernel}, stride {spec.stride}, padding {spec.padding} and dilation "
                             f"{spec.dilation} gives {'x'.join(map(str, spec.out_size))} = "
                             f"{spec.out_pixels} blocks")
        return spec

    @staticmethod
    def for_depthwise(op: str, x, weight, bias, stride, padding, dilation, *, nd: int = 2) -> "ConvSpec":
        xs, ws = _shape(x), _shape(weight)
        if len(xs) != nd + 2:
            raise ValueError(f"{op}: x must have {nd + 2} dimensions {LAYOUTS[nd]}, got shape {xs}")
        c = xs[1]
        if c == 0:   # one group per channel, and torch refuses groups = 0 as well
            raise ValueError(f"{op}: x {xs} has 0 channels; a depthwise convolution convolves each channel with its "
                             f"own filters and needs at least 1")
        if len(ws) != nd + 2 or ws[1] != 1 or ws[0] % c or ws[0] == 0:
            raise ValueError(f"{op}: weight must have shape (C * m, 1, {KERNEL_LAYOUTS[nd]}) with C = {c} channels "
                             f"of x {xs} and channel multiplier m >= 1, got {ws}")
        return ConvSpec.for_conv(op, x, weight, bias, stride, padding, dilation, c, nd=nd)


def transposed_spec(spec: ConvSpec) -> ConvSpec:
    """The stride-1 convolution of grad_output (n, D, oH, oW) whose output is grad_input (n, C, H, W) (per spatial
    dim alike: 3-D too)."""
    pad = []
    for k, d, size, out, (low, _) in zip(spec.kernel_size, spec.dilation, spec.in_size, spec.out_size, spec.padding):
        low = d * (k - 1) - low   # may be negative: the kernel crops then
        pad.append((low, size - out + d * (k - 1) - low))
    return ConvSpec(spec.op, spec.batch, spec.out_channels, spec.in_channels, spec.groups, spec.out_size,
                    spec.kernel_size, (1,) * spec.nd, spec.dilation, tuple(pad), spec.in_size)


def weight_spatial_dims(op: str, weight_shape, channels: str = "D, C // groups") -> int:
    """The spatial dims of an N-d op given its weight (channels..., k...): weight.ndim - 2, which must be 1, 2
    or 3; `channels` names the weight's two leading dims in the error message."""
    nd = len(weight_shape) - 2
    if nd not in KERNEL_LAYOUTS:
        raise ValueError(f"{op}: weight must have 3, 4 or 5 dimensions ({channels}, k...) for 1, 2 or 3 spatial "
                         f"dims, got shape {tuple(weight_shape)}")
    return nd


def check_groups(op: str, groups) -> int:
    if not _is_int(groups):
        raise TypeError(f"{op}: groups must be an int, got {groups!r}")
    if groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    return int(groups)


def batch_chunks(n: int, bytes_per_item: int, limit: int | None = None) -> list[slice]:
    """Split range(n) into consecutive slices whose items take at most `limit` bytes of workspace (default:
    `settings.get_workspace_limit()`), at least one item each; `ConvSpec.with_batch` gives a slice's spec."""
    limit = settings.get_workspace_limit() if limit is None else limit
    step = max(1, limit // max(bytes_per_item, 1))
    return [slice(start, min(start + step, n)) for start in range(0, n, step)]


def row_bands(spec: ConvSpec, fixed_bytes: int, row_bytes: int, limit: int | None = None) -> list:
    """Bands of one image's output rows (2-D spec) whose workspace, fixed_bytes + rows * row_bytes, stays within
    `limit` (default: the workspace limit), one row at least: for a column matrix of one image larger than the
    limit.  Each band is (its output rows, the input rows it reads, its spec): one image, those input rows, and
    the padding of the band's windows past them (the op's at the borders, none inside), so running the spec on
    x[..., rows, :] gives exactly the band's output rows."""
    limit = settings.get_workspace_limit() if limit is None else limit
    step = max(1, (limit - fixed_bytes) // max(row_bytes, 1))
    (n, width), (o, ow) = spec.in_size, spec.out_size
    s, d, k, low = spec.stride[0], spec.dilation[0], spec.kernel_size[0], spec.padding[0][0]
    bands = []
    for p in range(0, o, step):
        q = min(p + step, o)
        first, end = p * s - low, (q - 1) * s - low + d * (k - 1) + 1   # the padded rows the windows read
        start, stop = min(max(first, 0), n), max(min(end, n), 0)
        pad = (start - first, end - stop) if stop > start else (end - first, 0)   # no input row: zeros only
        stop = max(stop, start)
        band = dataclasses.replace(spec, batch=(1,), in_size=(stop - start, width), padding=(pad, spec.padding[1]),
                                   out_size=(q - p, ow))
        bands.append((slice(p, q), slice(start, stop), band))
    return bands


def check_needs(op: str, needs) -> frozenset:
    """`needs` of a `*_backward`: a name or an iterable of names from NEEDS.  None is refused: it could mean all
    of them (the default) or none."""
    try:
        needs = frozenset((needs,) if isinstance(needs, str) else needs)
    except TypeError:   # None, a number, unhashable entries
        raise TypeError(f"{op}: needs must be a name from {NEEDS} or an iterable of them, e.g. needs={NEEDS} (the "
                        f"default, every gradient), needs=('input',) or needs='weight', got {needs!r}") from None
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


def check_workspace_limit(op: str, workspace_limit) -> int | None:
    """workspace_limit must be None (the setting in force) or a positive number of bytes (an int, NumPy's too, as
    for stride and groups; not a bool); returned as a Python int."""
    if workspace_limit is None:
        return None
    if not _is_int(workspace_limit):
        raise TypeError(f"{op}: workspace_limit must be None or an int number of bytes, got {workspace_limit!r}")
    if workspace_limit < 1:
        raise ValueError(f"{op}: workspace_limit must be a positive number of bytes, got {workspace_limit}")
    return int(workspace_limit)
