"""The convolution functions of the former ``cupy.cudnn`` / ``cupyx.cudnn`` module, on top of cupyconv.

CuPy 14 removed its cuDNN bindings.  Code that called ``cupy.cudnn.convolution_forward`` and friends (sigpy, for
one) switches with one line::

    from cupyconv import cudnn        # was: from cupy import cudnn

and keeps its calls unchanged: same names, argument order, keywords, layout constants, and outputs written in
place into preallocated arrays.  CuPy arrays run on cupyconv's CUDA kernels; NumPy arrays run on its CPU path,
so the module also works (and is tested) without a GPU.  CuPy is never imported by this module.

The functions below keep the old signatures: ``pad``, ``stride`` and ``dilation`` are tuples with one entry per
spatial dimension, 1, 2 or 3 (``dilation=None`` means all ones); the data layout ``d_layout`` and the filter layout
``w_layout`` are independent.  ``set_max_workspace_size`` / ``get_max_workspace_size`` are cupyconv's workspace
limit, the bytes an im2col buffer may take before an op splits the batch.

What is read in place and what is copied
    Inputs are never copied by this module.  x, W, gy (and, in backward_data, the gradient x) are handed to
    cupyconv as they are for NCHW, and as transposed *views* for NHWC: ``(N, *spatial, C)`` becomes
    ``(N, C, *spatial)`` by swapping strides, no bytes move.  Non-contiguous inputs (a flipped filter, the real part
    of a complex array) are accepted and passed on as views too.  Inside cupyconv, the GPU kernels read the data input x
    through its strides where they can (the direct and tensor-core kernels, 1-D and 2-D); what they cannot
    read that way (the weight, the output gradients, the depth windows of a 3-D input) cupyconv stages itself,
    as it does for any caller.  The CPU path reads the views through NumPy.
    The outputs y and gW must be C-contiguous arrays of exactly the right shape and dtype, and are overwritten
    (never accumulated into).  cupyconv computes each result into a fresh NCHW array, which is then copied
    once into y or gW; for NHWC that one copy is also the transposition back to channels-last.  A bias b of any
    shape with one entry per channel is read as b.reshape(-1) (a view when b is contiguous).

Flags
    ``auto_tune`` sets `cupyconv.settings.autotune` for the call, either way (True: time the candidate GPU
    algorithms on the first call of each geometry and keep the fastest; False: choose by heuristics).
    ``deterministic=True`` sets `cupyconv.settings.deterministic` for the call, which, as in the old module,
    turns auto_tune off, so the algorithm depends on the shapes alone.  False leaves the setting as it is;
    every cupyconv kernel is run-to-run deterministic for a given algorithm (no float atomics) anyway.
    ``tensor_core`` decides TF32 for float32: 'always' runs the call under `cupyconv.settings.allow_tf32(True)`
    (float32 products on TF32 tensor cores where a kernel can use them, about 10 mantissa bits), 'never' under
    ``allow_tf32(False)`` (strict IEEE float32), 'auto' keeps `cupyconv.settings.get_allow_tf32()`, which is
    False unless you changed it.  float16 and bfloat16 may use tensor cores in any mode (they accumulate in
    float32 either way), float64 never does.  The old module, by contrast, switched tensor-core math on only for
    float16 on compute capability 7.0, and left float32 to cuDNN's default math mode.

Differences from the old module
    * 1-D convolutions (x of 3 dims) work; cuDNN needed them padded to 2-D.
    * ``d_layout=CUDNN_TENSOR_NHWC`` means channels-last for 1-D, 2-D and 3-D alike; the old module honoured it
      for 4-dimensional arrays (2-D convolutions) only.
    * dtypes: float16, float32, float64 and (where the array library has it) bfloat16; all arrays of a call
      share one dtype.  NumPy and CuPy arrays cannot be mixed, and CuPy arrays must be on one device.
    * Bad arguments raise ValueError/TypeError naming the function, the argument and the shapes, where cuDNN
      raised CuDNNError (or wrote garbage, for a non-contiguous output).
    * ``auto_tune``, ``tensor_core`` and ``deterministic`` have defaults (the old module required them).
    * The workspace limit bounds cupyconv's im2col buffers, not cuDNN's algorithm choice, and its default is
      `cupyconv.settings.DEFAULT_WORKSPACE_LIMIT`, not 8 MiB.
"""
from __future__ import annotations

import contextlib
import operator

import numpy

from . import settings
from ._arrays import SUPPORTED_DTYPES, _describe, _kind
from ._docs import numpy_doc
from ._typing import Array, Ints
from .ops.conv import convolve, convolve_backward
from .ops.conv_transpose import transpose

#: cuDNN's values of cudnnTensorFormat_t, as the old module exported them.
CUDNN_TENSOR_NCHW = 0
CUDNN_TENSOR_NHWC = 1

TENSOR_CORE_MODES = ("auto", "always", "never")

__all__ = [
    "CUDNN_TENSOR_NCHW", "CUDNN_TENSOR_NHWC",
    "convolution_forward", "convolution_backward_filter", "convolution_backward_data",
    "get_max_workspace_size", "set_max_workspace_size",
]

_LAYOUT_NAMES = {CUDNN_TENSOR_NCHW: "CUDNN_TENSOR_NCHW", CUDNN_TENSOR_NHWC: "CUDNN_TENSOR_NHWC"}


# ---------------------------------------------------------------------------------------------------------
# Workspace


@numpy_doc(returns=("int", "Bytes."), raises=())
def get_max_workspace_size() -> int:
    """cupyconv's workspace limit: `cupyconv.settings.get_workspace_limit`."""
    return settings.get_workspace_limit()


@numpy_doc(size=("int", 'Bytes, at least 0; 0 (the old "no workspace") is stored as 1, which processes one output '
                           'row of one sample at a time.'),
           raises=(("TypeError", "size is not an int."), ("ValueError", "size is negative.")))
def set_max_workspace_size(size: int) -> None:
    """Set cupyconv's workspace limit for every later call: `cupyconv.settings.set_workspace_limit`."""
    try:
        nbytes = _int(size)
    except TypeError:
        raise TypeError(f"set_max_workspace_size: size must be an int number of bytes, got {size!r}") from None
    if nbytes < 0:
        raise ValueError(f"set_max_workspace_size: size must be >= 0 bytes, got {nbytes}")
    settings.set_workspace_limit(max(nbytes, 1))


# ---------------------------------------------------------------------------------------------------------
# Argument checks


def _int(value) -> int:
    """operator.index, refusing bools (which it takes as 0 and 1): True is no size, count or padding."""
    if isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"a bool is not an int: {value!r}")
    return operator.index(value)


def _shape(a) -> tuple:
    return tuple(int(s) for s in a.shape)


def _check_arrays(fn: str, arrays: dict, output: str) -> None:
    """All arrays of one kind (NumPy or CuPy) and device, one supported dtype; output writable."""
    for name, a in arrays.items():
        if a is None and name != "b":
            raise TypeError(f"{fn}: {name} must be a numpy.ndarray or cupy.ndarray, got None")
    present = {name: a for name, a in arrays.items() if a is not None}
    for name, a in present.items():
        if _kind(a) not in ("numpy", "cupy"):
            raise TypeError(f"{fn}: {name} must be a numpy.ndarray or cupy.ndarray, got {_describe(a)}")
    first_name, first = next(iter(present.items()))
    for name, a in present.items():
        if _describe(a) != _describe(first):
            raise TypeError(f"{fn}: {first_name} is {_describe(first)} but {name} is {_describe(a)}; all arrays "
                            f"of one call must be NumPy arrays, or CuPy arrays on one device")
    dtype = numpy.dtype(first.dtype)
    if dtype.name not in SUPPORTED_DTYPES:
        raise TypeError(f"{fn}: {first_name} has dtype {dtype.name}; supported dtypes are "
                        f"{', '.join(SUPPORTED_DTYPES)}")
    for name, a in present.items():
        if numpy.dtype(a.dtype) != dtype:
            raise TypeError(f"{fn}: {first_name} has dtype {dtype.name} but {name} has dtype "
                            f"{numpy.dtype(a.dtype).name}; all arrays of one call must have one dtype")
    out = arrays[output]
    flags = out.flags
    if not flags.c_contiguous:
        raise ValueError(f"{fn}: {output} must be C-contiguous (it is written in place), got shape "
                         f"{_shape(out)} with strides {tuple(out.strides)}")
    if _kind(out) == "numpy" and not flags.writeable:
        raise ValueError(f"{fn}: {output} {_shape(out)} is read-only; it must be writable (it is written in place)")


def _check_layout(fn: str, name: str, layout) -> int:
    if isinstance(layout, bool) or not isinstance(layout, (int, numpy.integer)) or int(layout) not in _LAYOUT_NAMES:
        raise ValueError(f"{fn}: {name} must be CUDNN_TENSOR_NCHW ({CUDNN_TENSOR_NCHW}) or CUDNN_TENSOR_NHWC "
                         f"({CUDNN_TENSOR_NHWC}), got {layout!r}")
    return int(layout)


def _check_ndims(fn: str, arrays: dict) -> int:
    """The number of spatial dims, from the first array; every array must have that many + 2 dims."""
    first_name, first = next(iter(arrays.items()))
    if first.ndim not in (3, 4, 5):
        raise ValueError(f"{fn}: {first_name} must have 3, 4 or 5 dims (batch, channels and 1, 2 or 3 spatial "
                         f"dims), got shape {_shape(first)}")
    for name, a in arrays.items():
        if a.ndim != first.ndim:
            raise ValueError(f"{fn}: {first_name} {_shape(first)} has {first.ndim} dims but {name} {_shape(a)} "
                             f"has {a.ndim}; they must have the same number of dims")
    return first.ndim - 2


def _check_tuple(fn: str, name: str, value, nd: int, minimum: int) -> tuple:
    if name == "dilation" and value is None:
        return (1,) * nd
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{fn}: {name} must be a tuple with one int per spatial dim ({nd}), got {value!r}")
    if len(value) != nd:
        raise ValueError(f"{fn}: {name} must have one entry per spatial dim: {nd} for {nd + 2}-dim arrays, "
                         f"got {tuple(value)!r} of length {len(value)}")
    try:
        out = tuple(_int(v) for v in value)
    except TypeError:
        raise TypeError(f"{fn}: the entries of {name} must be ints, got {tuple(value)!r}") from None
    if any(v < minimum for v in out):
        raise ValueError(f"{fn}: every entry of {name} must be >= {minimum}, got {out!r}")
    return out


def _check_groups(fn: str, groups) -> int:
    try:
        groups = _int(groups)
    except TypeError:
        raise TypeError(f"{fn}: groups must be an int, got {groups!r}") from None
    if groups < 1:
        raise ValueError(f"{fn}: groups must be >= 1, got {groups}")
    return groups


def _check_flag(fn: str, name: str, value) -> bool:
    try:
        return settings.check_flag(name, value)
    except TypeError as error:
        raise TypeError(f"{fn}: {error}") from None


def _check_tensor_core(fn: str, tensor_core) -> None:
    if not isinstance(tensor_core, str) or tensor_core not in TENSOR_CORE_MODES:
        raise ValueError(f"{fn}: tensor_core must be 'auto', 'always' or 'never', got {tensor_core!r}")


def _channels_first(a, layout: int):
    """(N, *spatial, C) -> (N, C, *spatial) as a view for NHWC; a itself for NCHW."""
    if layout == CUDNN_TENSOR_NCHW:
        return a
    return a.transpose(0, a.ndim - 1, *range(1, a.ndim - 1))


def _in_layout(shape: tuple, layout: int) -> tuple:
    """A (N, C, *spatial) shape written in `layout`."""
    return shape if layout == CUDNN_TENSOR_NCHW else (shape[0], *shape[2:], shape[1])


def _out_size(size, k, pad, stride, dilation) -> tuple:
    return tuple((i + 2 * p - d * (kk - 1) - 1) // s + 1
                 for i, kk, p, s, d in zip(size, k, pad, stride, dilation))


class _Geometry:
    """The checked arguments of one call, in channels-first (N, C, *spatial) and (D, C // groups, *k) terms."""

    def __init__(self, fn, pad, stride, dilation, groups, d_layout, w_layout, nd):
        self.fn = fn
        self.d_layout = _check_layout(fn, "d_layout", d_layout)
        self.w_layout = _check_layout(fn, "w_layout", w_layout)
        self.pad = _check_tuple(fn, "pad", pad, nd, 0)
        self.stride = _check_tuple(fn, "stride", stride, nd, 1)
        self.dilation = _check_tuple(fn, "dilation", dilation, nd, 1)
        self.groups = _check_groups(fn, groups)

    def params(self) -> str:
        layouts = f"d_layout={_LAYOUT_NAMES[self.d_layout]}"
        if self.w_layout != self.d_layout:
            layouts += f", w_layout={_LAYOUT_NAMES[self.w_layout]}"
        return (f"pad={self.pad}, stride={self.stride}, dilation={self.dilation}, groups={self.groups}, "
                f"{layouts}")

    def check_channels(self, x_name, xv, x, w_name, wv, w, y_name=None, yv=None, y=None):
        """Channels of the convolution input x against the weight w (and of its output y against w)."""
        fn, g = self.fn, self.groups
        c, d, cg = xv.shape[1], wv.shape[0], wv.shape[1]
        if c % g:
            raise ValueError(f"{fn}: {x_name} {_shape(x)} has {c} channels, not divisible by groups={g}")
        if d % g:
            raise ValueError(f"{fn}: {w_name} {_shape(w)} has {d} output channels, not divisible by groups={g}")
        if cg * g != c:
            raise ValueError(f"{fn}: {w_name} {_shape(w)} has {cg} input channels per group but {x_name} "
                             f"{_shape(x)} has {c} channels with groups={g} (expected {c // g}; {self.params()})")
        if yv is not None and yv.shape[1] != d:
            raise ValueError(f"{fn}: {y_name} {_shape(y)} has {yv.shape[1]} channels but {w_name} {_shape(w)} "
                             f"has {d} output channels ({self.params()})")
        if yv is not None and yv.shape[0] != xv.shape[0]:
            raise ValueError(f"{fn}: {y_name} {_shape(y)} has batch size {yv.shape[0]} but {x_name} {_shape(x)} "
                             f"has {xv.shape[0]}")

    def output_spatial(self, x_name, xv, x, w_name, wv, w) -> tuple:
        """The convolution's output size over the spatial dims; ValueError if it would be empty."""
        size = _out_size(xv.shape[2:], wv.shape[2:], self.pad, self.stride, self.dilation)
        if min(size) < 1:
            raise ValueError(f"{self.fn}: the convolution of {x_name} {_shape(x)} with {w_name} {_shape(w)} "
                             f"has no output pixels ({self.params()}: output size {size})")
        return size

    def check_bias(self, b, channels: int, of: str):
        if b is None:
            return None
        if b.size != channels:
            raise ValueError(f"{self.fn}: b {_shape(b)} must have one entry per channel of {of} ({channels})")
        return b.reshape(-1)

    @contextlib.contextmanager
    def settings(self, auto_tune, tensor_core, deterministic=False):
        auto_tune = _check_flag(self.fn, "auto_tune", auto_tune)
        deterministic = _check_flag(self.fn, "deterministic", deterministic)
        with contextlib.ExitStack() as stack:
            stack.enter_context(settings.autotune(auto_tune))
            if deterministic:
                stack.enter_context(settings.deterministic(True))
            if tensor_core != "auto":
                stack.enter_context(settings.allow_tf32(tensor_core == "always"))
            yield


# ---------------------------------------------------------------------------------------------------------
# Public API

# The docstring entries the functions share (cupyconv._docs); NumPy or CuPy arrays, never mixed
_X_DOC = ("array ``(N, C, *s)`` or ``(N, *s, C)``", "The convolution's input, in d_layout.")
_W_DOC = ("array ``(D, C // groups, *k)`` or ``(D, *k, C // groups)``", "The convolution's filters, in w_layout.")
_GY_DOC = ("array ``(N, D, *o)`` or ``(N, *o, D)``", "The gradient of the convolution's output, in d_layout.")
_GEOMETRY_DOCS = dict(
    pad=("tuple of int", "Zeros on both sides of each spatial dim: one int per dim (1, 2 or 3)."),
    stride=("tuple of int", "One int per spatial dim."),
    dilation=("tuple of int or None", "One int per spatial dim; None means ones."),
    auto_tune=("bool", "Sets `cupyconv.settings` autotune for the call, either way: True times the candidate GPU "
                       "algorithms on the first call of each geometry and keeps the fastest, False chooses by "
                       "heuristics."),
    tensor_core=("str", "TF32 for float32: 'always' allows it for the call, 'never' forbids it, 'auto' (the "
                        "default) keeps `cupyconv.settings.get_allow_tf32`.  float16 and bfloat16 may use tensor "
                        "cores in any mode."),
    d_layout=("int", "CUDNN_TENSOR_NCHW (0, the default): data ``(N, C, *spatial)``; CUDNN_TENSOR_NHWC (1): "
                     "``(N, *spatial, C)``, in 1-D, 2-D and 3-D alike."),
    w_layout=("int", "CUDNN_TENSOR_NCHW (0, the default): filters ``(D, C // groups, *k)``; CUDNN_TENSOR_NHWC (1): "
                     "``(D, *k, C // groups)``."))
_DETERMINISTIC_DOC = ("bool", "True sets `cupyconv.settings` deterministic for the call, which turns auto_tune off; "
                              "False leaves it as it is (every cupyconv kernel is run-to-run deterministic for a "
                              "given algorithm anyway).")


@numpy_doc(_GEOMETRY_DOCS, x=_X_DOC, W=_W_DOC,
           b=("array or None", "D entries (any shape), added to output channel d; or None."),
           y=("array ``(N, D, *o)`` or ``(N, *o, D)``",
              "The output: C-contiguous, of exactly this shape and x's dtype; overwritten.  o = (s + 2 * pad - "
              "dilation * (k - 1) - 1) // stride + 1."))
def convolution_forward(x: Array, W: Array, b: Array | None, y: Array, pad: Ints, stride: Ints, dilation: Ints | None,
                        groups: int, *, auto_tune: bool = False, tensor_core: str = "auto",
                        d_layout: int = CUDNN_TENSOR_NCHW, w_layout: int = CUDNN_TENSOR_NCHW) -> None:
    """``y[...] =`` the cross-correlation of x with W, plus b per output channel."""
    fn = "convolution_forward"
    _check_tensor_core(fn, tensor_core)
    _check_arrays(fn, {"x": x, "W": W, "b": b, "y": y}, "y")
    nd = _check_ndims(fn, {"x": x, "W": W, "y": y})
    geo = _Geometry(fn, pad, stride, dilation, groups, d_layout, w_layout, nd)
    xv, wv, yv = _channels_first(x, geo.d_layout), _channels_first(W, geo.w_layout), _channels_first(y, geo.d_layout)
    geo.check_channels("x", xv, x, "W", wv, W)
    expected = _in_layout((xv.shape[0], wv.shape[0], *geo.output_spatial("x", xv, x, "W", wv, W)), geo.d_layout)
    if _shape(y) != expected:
        raise ValueError(f"{fn}: y has shape {_shape(y)} but the convolution of x {_shape(x)} with W {_shape(W)} "
                         f"gives {expected} ({geo.params()})")
    bias = geo.check_bias(b, wv.shape[0], "y")
    with geo.settings(auto_tune, tensor_core):
        # conv_nd's body, with errors that name this function
        result = convolve(fn, None, xv, wv, bias, geo.stride, geo.pad, geo.dilation, geo.groups, "auto", None)
    yv[...] = result


@numpy_doc(_GEOMETRY_DOCS, x=_X_DOC, gy=_GY_DOC,
           gW=("array ``(D, C // groups, *k)`` or ``(D, *k, C // groups)``",
               "The weight gradient: C-contiguous, of exactly the weight's shape, which gives the kernel size, and "
               "x's dtype; overwritten."),
           deterministic=_DETERMINISTIC_DOC)
def convolution_backward_filter(x: Array, gy: Array, gW: Array, pad: Ints, stride: Ints, dilation: Ints | None,
                                groups: int, *, deterministic: bool = False, auto_tune: bool = False,
                                tensor_core: str = "auto", d_layout: int = CUDNN_TENSOR_NCHW,
                                w_layout: int = CUDNN_TENSOR_NCHW) -> None:
    """``gW[...] =`` the weight gradient of the convolution of x, given its output gradient gy."""
    fn = "convolution_backward_filter"
    _check_tensor_core(fn, tensor_core)
    _check_arrays(fn, {"x": x, "gy": gy, "gW": gW}, "gW")
    nd = _check_ndims(fn, {"x": x, "gy": gy, "gW": gW})
    geo = _Geometry(fn, pad, stride, dilation, groups, d_layout, w_layout, nd)
    xv, gyv, gwv = (_channels_first(x, geo.d_layout), _channels_first(gy, geo.d_layout),
                    _channels_first(gW, geo.w_layout))
    geo.check_channels("x", xv, x, "gW", gwv, gW, "gy", gyv, gy)
    expected = _in_layout((xv.shape[0], gwv.shape[0], *geo.output_spatial("x", xv, x, "gW", gwv, gW)),
                          geo.d_layout)
    if _shape(gy) != expected:
        raise ValueError(f"{fn}: gy has shape {_shape(gy)} but the convolution of x {_shape(x)} with a weight "
                         f"of gW's shape {_shape(gW)} gives {expected} ({geo.params()})")
    with geo.settings(auto_tune, tensor_core, deterministic):
        # gW stands in for the weight: with needs=("weight",) only its shape and dtype are read.
        _, grad_w, _ = convolve_backward(fn, None, gyv, xv, gwv, geo.stride, geo.pad, geo.dilation, geo.groups,
                                         ("weight",), "auto", None)
    gwv[...] = grad_w


@numpy_doc(_GEOMETRY_DOCS, W=_W_DOC, x=_GY_DOC,
           b=("array or None", "C entries (any shape), added to channel c of y; or None."),
           y=("array ``(N, C, *s)`` or ``(N, *s, C)``",
              "The input gradient: C-contiguous, of x's dtype; overwritten.  Its shape picks the input size among "
              "those the convolution maps to x's size (up to stride - 1 larger than the smallest)."),
           deterministic=_DETERMINISTIC_DOC)
def convolution_backward_data(W: Array, x: Array, b: Array | None, y: Array, pad: Ints, stride: Ints,
                              dilation: Ints | None, groups: int, *, deterministic: bool = False,
                              auto_tune: bool = False, tensor_core: str = "auto", d_layout: int = CUDNN_TENSOR_NCHW,
                              w_layout: int = CUDNN_TENSOR_NCHW) -> None:
    """``y[...] =`` the input gradient of the convolution with W whose output gradient is x, plus b per channel.

    That is the transposed convolution of x.
    """
    fn = "convolution_backward_data"
    _check_tensor_core(fn, tensor_core)
    _check_arrays(fn, {"W": W, "x": x, "b": b, "y": y}, "y")
    nd = _check_ndims(fn, {"x": x, "W": W, "y": y})
    geo = _Geometry(fn, pad, stride, dilation, groups, d_layout, w_layout, nd)
    wv, xv, yv = _channels_first(W, geo.w_layout), _channels_first(x, geo.d_layout), _channels_first(y, geo.d_layout)
    # y is the convolution's input and x its output.
    geo.check_channels("y", yv, y, "W", wv, W, "x", xv, x)
    spatial = geo.output_spatial("y", yv, y, "W", wv, W)
    expected = _in_layout((yv.shape[0], wv.shape[0], *spatial), geo.d_layout)
    if _shape(x) != expected:
        raise ValueError(f"{fn}: x has shape {_shape(x)} but the convolution of y {_shape(y)} with W "
                         f"{_shape(W)} gives {expected}; y's shape must be one whose convolution has x's shape "
                         f"({geo.params()})")
    bias = geo.check_bias(b, yv.shape[1], "y")
    # The transposed convolution's smallest output, and how much larger y is (0 <= extra < stride by the check).
    smallest = [(o - 1) * s - 2 * p + d * (k - 1) + 1
                for o, s, p, d, k in zip(xv.shape[2:], geo.stride, geo.pad, geo.dilation, wv.shape[2:])]
    output_padding = tuple(int(i) - m for i, m in zip(yv.shape[2:], smallest))
    with geo.settings(auto_tune, tensor_core, deterministic):
        result = transpose(fn, None, xv, wv, bias, geo.stride, geo.pad, output_padding, geo.groups, geo.dilation,
                           "auto", None)
    yv[...] = result
