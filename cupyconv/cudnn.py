"""The convolution functions of the former ``cupy.cudnn`` / ``cupyx.cudnn`` module, on top of cupyconv.

CuPy 14 removed its cuDNN bindings.  Code that called ``cupy.cudnn.convolution_forward`` and friends (sigpy, for
one) switches with one line::

    from cupyconv import cudnn        # was: from cupy import cudnn

and keeps its calls unchanged: same names, argument order, keywords, layout constants, and outputs written in
place into preallocated arrays.  CuPy arrays run on cupyconv's CUDA kernels; NumPy arrays run on its CPU path,
so the module also works (and is tested) without a GPU.  CuPy is imported only by `install`.

Code that cannot be edited (an installed library such as sigpy, which looks for ``cupy.cuda.cudnn`` when it is
imported) runs unchanged after one call, made before importing it::

    import cupyconv.cudnn
    cupyconv.cudnn.install()      # registers this module as cupy.cudnn, cupyx.cudnn and cupy.cuda.cudnn
    import sigpy

`install` refuses (RuntimeError) where CuPy has a real cuDNN binding under those names (CuPy <= 13 with cuDNN).

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
# Every name this module imports is private (an underscore alias), so that its namespace, `dir(cupyconv.cudnn)`,
# holds the API of the former cupy.cudnn module and nothing else.
import contextlib as _contextlib
import importlib.util as _importlib_util
import operator as _operator
import sys as _sys
import warnings as _warnings

import numpy as _numpy

from . import _device
from . import settings as _settings
from ._arrays import SUPPORTED_DTYPES as _SUPPORTED_DTYPES
from ._arrays import _describe, _kind
from ._docs import numpy_doc as _numpy_doc
from ._typing import Array as _Array
from ._typing import Ints as _Ints
from .ops import lift as _lift
from .ops.conv import convolve as _convolve
from .ops.conv import convolve_backward as _convolve_backward
from .ops.conv_transpose import transpose as _transpose

#: cuDNN's values of cudnnTensorFormat_t, as the old module exported them.
CUDNN_TENSOR_NCHW = 0
CUDNN_TENSOR_NHWC = 1

_TENSOR_CORE_MODES = ("auto", "always", "never")

__all__ = [
    "CUDNN_TENSOR_NCHW", "CUDNN_TENSOR_NHWC",
    "convolution_forward", "convolution_backward_filter", "convolution_backward_data",
    "get_max_workspace_size", "set_max_workspace_size",
    "install", "uninstall", "installed", "is_installed",
]

_LAYOUT_NAMES = {CUDNN_TENSOR_NCHW: "CUDNN_TENSOR_NCHW", CUDNN_TENSOR_NHWC: "CUDNN_TENSOR_NHWC"}


# ---------------------------------------------------------------------------------------------------------
# Workspace


@_numpy_doc(returns=("int", "Bytes."), raises=())
def get_max_workspace_size() -> int:
    """cupyconv's workspace limit: `cupyconv.settings.get_workspace_limit`."""
    return _settings.get_workspace_limit()


@_numpy_doc(size=("int", 'Bytes, at least 0; 0 (the old "no workspace") is stored as 1, which processes one output '
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
    _settings.set_workspace_limit(max(nbytes, 1))


# ---------------------------------------------------------------------------------------------------------
# Argument checks


def _int(value) -> int:
    """operator.index, refusing bools (which it takes as 0 and 1): True is no size, count or padding."""
    if isinstance(value, (bool, _numpy.bool_)):
        raise TypeError(f"a bool is not an int: {value!r}")
    return _operator.index(value)


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
    dtype = _numpy.dtype(first.dtype)
    if dtype.name not in _SUPPORTED_DTYPES:
        raise TypeError(f"{fn}: {first_name} has dtype {dtype.name}; supported dtypes are "
                        f"{', '.join(_SUPPORTED_DTYPES)}")
    for name, a in present.items():
        if _numpy.dtype(a.dtype) != dtype:
            raise TypeError(f"{fn}: {first_name} has dtype {dtype.name} but {name} has dtype "
                            f"{_numpy.dtype(a.dtype).name}; all arrays of one call must have one dtype")
    out = arrays[output]
    flags = out.flags
    if not flags.c_contiguous:
        raise ValueError(f"{fn}: {output} must be C-contiguous (it is written in place), got shape "
                         f"{_shape(out)} with strides {tuple(out.strides)}")
    if _kind(out) == "numpy" and not flags.writeable:
        raise ValueError(f"{fn}: {output} {_shape(out)} is read-only; it must be writable (it is written in place)")


def _array_work(a):
    """Whose array methods copy into the outputs (`Device.copyto`): the CPU path's for NumPy arrays, the GPU path's
    device for CuPy arrays (a CuPy copy is a kernel launch)."""
    xp = _sys.modules["cupy"] if _kind(a) == "cupy" else _numpy
    return _lift.arrays(_device.executor_for(xp))


def _copy_into(out, out_view, result) -> None:
    """Copy result into out_view, the final copy into the caller's output: for CuPy arrays on the output's device, in
    the device's scope (`Device.scope`), as the op itself ran."""
    work = _array_work(out)
    scope = work.scope("cupyconv.cudnn", out.device.id) if _kind(out) == "cupy" else _contextlib.nullcontext()
    with scope:
        work.copyto(out_view, result)


def _check_layout(fn: str, name: str, layout) -> int:
    if isinstance(layout, bool) or not isinstance(layout, (int, _numpy.integer)) or int(layout) not in _LAYOUT_NAMES:
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
        return _settings.check_flag(name, value)
    except TypeError as error:
        raise TypeError(f"{fn}: {error}") from None


def _check_tensor_core(fn: str, tensor_core) -> None:
    if not isinstance(tensor_core, str) or tensor_core not in _TENSOR_CORE_MODES:
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
        return _array_work(b).reshape(b, (-1,))

    @_contextlib.contextmanager
    def settings(self, auto_tune, tensor_core, deterministic=False):
        auto_tune = _check_flag(self.fn, "auto_tune", auto_tune)
        deterministic = _check_flag(self.fn, "deterministic", deterministic)
        with _contextlib.ExitStack() as stack:
            stack.enter_context(_settings.autotune(auto_tune))
            if deterministic:
                stack.enter_context(_settings.deterministic(True))
            if tensor_core != "auto":
                stack.enter_context(_settings.allow_tf32(tensor_core == "always"))
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


@_numpy_doc(_GEOMETRY_DOCS, x=_X_DOC, W=_W_DOC,
           b=("array or None", "D entries (any shape), added to output channel d; or None."),
           y=("array ``(N, D, *o)`` or ``(N, *o, D)``",
              "The output: C-contiguous, of exactly this shape and x's dtype; overwritten.  o = (s + 2 * pad - "
              "dilation * (k - 1) - 1) // stride + 1."))
def convolution_forward(x: _Array, W: _Array, b: _Array | None, y: _Array, pad: _Ints, stride: _Ints,
                        dilation: _Ints | None, groups: int, *, auto_tune: bool = False, tensor_core: str = "auto",
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
        result = _convolve(fn, None, xv, wv, bias, geo.stride, geo.pad, geo.dilation, geo.groups, "auto", None)
    _copy_into(y, yv, result)


@_numpy_doc(_GEOMETRY_DOCS, x=_X_DOC, gy=_GY_DOC,
           gW=("array ``(D, C // groups, *k)`` or ``(D, *k, C // groups)``",
               "The weight gradient: C-contiguous, of exactly the weight's shape, which gives the kernel size, and "
               "x's dtype; overwritten."),
           deterministic=_DETERMINISTIC_DOC)
def convolution_backward_filter(x: _Array, gy: _Array, gW: _Array, pad: _Ints, stride: _Ints, dilation: _Ints | None,
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
        _, grad_w, _ = _convolve_backward(fn, None, gyv, xv, gwv, geo.stride, geo.pad, geo.dilation, geo.groups,
                                          ("weight",), "auto", None)
    _copy_into(gW, gwv, grad_w)


@_numpy_doc(_GEOMETRY_DOCS, W=_W_DOC, x=_GY_DOC,
           b=("array or None", "C entries (any shape), added to channel c of y; or None."),
           y=("array ``(N, C, *s)`` or ``(N, *s, C)``",
              "The input gradient: C-contiguous, of x's dtype; overwritten.  Its shape picks the input size among "
              "those the convolution maps to x's size (up to stride - 1 larger than the smallest)."),
           deterministic=_DETERMINISTIC_DOC)
def convolution_backward_data(W: _Array, x: _Array, b: _Array | None, y: _Array, pad: _Ints, stride: _Ints,
                              dilation: _Ints | None, groups: int, *, deterministic: bool = False,
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
        result = _transpose(fn, None, xv, wv, bias, geo.stride, geo.pad, output_padding, geo.groups, geo.dilation,
                            "auto", None)
    _copy_into(y, yv, result)


# ---------------------------------------------------------------------------------------------------------
# Installing under CuPy's former names, for code that cannot be edited

#: Where CuPy <= 13 exposed cuDNN: the high-level module (``cupy.cudnn``, also ``cupyx.cudnn``) and the binding
#: ``cupy.cuda.cudnn``, whose presence callers test for (sigpy: ``importlib.util.find_spec("cupy.cuda.cudnn")``,
#: then ``from cupy import cudnn``).  Registered as that module, this one offers what such callers use: the
#: three convolutions, the workspace functions and the layout constants ``CUDNN_TENSOR_NCHW``/``NHWC`` (not the
#: binding's descriptors or ``getVersion``).
_FORMER_NAMES = ("cupy.cudnn", "cupyx.cudnn", "cupy.cuda.cudnn")


def _this_module():
    return _sys.modules[__name__]


def _existing(name: str):
    """What `name` resolves to now without this module: a loaded module, else an importable one's spec, else
    None.  A finder that fails (a broken CuPy) counts as absent: there is nothing to shadow."""
    if name in _sys.modules:
        return _sys.modules[name]
    try:
        return _importlib_util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _set(name: str, module) -> None:
    """sys.modules[name] = module and the attribute on its parent package (None removes both)."""
    parent, _, child = name.rpartition(".")
    if module is None:
        _sys.modules.pop(name, None)
        if getattr(_sys.modules.get(parent), child, None) is _this_module():
            delattr(_sys.modules[parent], child)
    else:
        _sys.modules[name] = module
        setattr(_sys.modules[parent], child, module)


@_numpy_doc(raises=(("ModuleNotFoundError", "CuPy is not installed (there is nothing to register into)."),
                    ("RuntimeError", "This CuPy has a cuDNN binding of its own under one of the names (CuPy <= 13 "
                                     "built with cuDNN): it is left in place, and code that wants cupyconv's "
                                     "imports ``from cupyconv import cudnn`` instead.")))
def install() -> None:
    """Register this module as ``cupy.cudnn``, ``cupyx.cudnn`` and ``cupy.cuda.cudnn``, where CuPy <= 13 exposed
    cuDNN's convolutions, so that code written for them runs unchanged on CuPy 14::

        import cupyconv.cudnn
        cupyconv.cudnn.install()      # before importing the library that uses cupy.cudnn
        import sigpy                  # sigpy.config.cudnn_enabled is now True

    Call it before importing such a library: libraries that test for cuDNN at import (sigpy does) keep what they
    found (a RuntimeWarning says so for sigpy).  Calling it again does nothing; `uninstall` removes the names
    (`installed` does both around a block).
    """
    try:
        import cupy  # noqa: F401  (the parent packages of the names)
        import cupy.cuda  # noqa: F401
        import cupyx  # noqa: F401
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(f"cupyconv.cudnn.install: CuPy is not installed ({error}); the names it registers "
                                  f"are CuPy's (cupy.cudnn, cupyx.cudnn, cupy.cuda.cudnn)", name=error.name) from None
    ours = _this_module()
    for name in _FORMER_NAMES:
        found = _existing(name)
        if found is not None and found is not ours:
            raise RuntimeError(f"cupyconv.cudnn.install: {name} exists in this CuPy {cupy.__version__} (a real "
                               f"cuDNN binding); it is left in place.  Use `from cupyconv import cudnn` to call "
                               f"cupyconv's module explicitly")
    for name in _FORMER_NAMES:
        _set(name, ours)
    config = _sys.modules.get("sigpy.config")
    if config is not None and not getattr(config, "cudnn_enabled", True):
        _warnings.warn("cupyconv.cudnn.install: sigpy was imported before install() and found no cuDNN; its GPU "
                       "convolutions stay disabled in this process.  Call install() before `import sigpy`",
                       RuntimeWarning, stacklevel=2)


@_numpy_doc(raises=())
def uninstall() -> None:
    """Remove the names `install` registered (those that are this module; anything else is left alone)."""
    for name in _FORMER_NAMES:
        if _sys.modules.get(name) is _this_module():
            _set(name, None)


@_numpy_doc(returns=("bool", "True while all three names are this module."), raises=())
def is_installed() -> bool:
    """Whether `install` has registered this module under CuPy's former names."""
    return all(_sys.modules.get(name) is _this_module() for name in _FORMER_NAMES)


@_contextlib.contextmanager
def _installed_block():
    before = is_installed()
    install()
    try:
        yield
    finally:
        if not before:
            uninstall()


@_numpy_doc(returns=("context manager", "Installed inside the ``with`` block; uninstalled on exit unless it was "
                                        "installed before the block."),
            raises=(("ModuleNotFoundError", "As `install`."), ("RuntimeError", "As `install`.")))
def installed() -> _contextlib.AbstractContextManager[None]:
    """``with cupyconv.cudnn.installed():`` `install` for the block (tests use it), then `uninstall`."""
    return _installed_block()
