"""PyTorch integration: custom ops, autograd Functions, functional wrappers and `nn.Module` layers.

This is the only module of cupyconv that imports torch; `import cupyconv` works without it.

Layers of this module, from the bottom up:

* `cuda_context(device)`: while it is active, CuPy launches its kernels and cuBLAS calls on torch's current
  stream and takes its memory from torch's caching allocator.  Every op below runs inside it for CUDA tensors.
* Custom ops `torch.ops.cupyconv.<op>` (`torch.library.custom_op`), one per forward op and one per manual
  backward: `conv2d`, `conv2d_backward`, `depthwise_conv2d`, `depthwise_conv2d_backward`, `patch_conv2d`,
  `patch_conv2d_backward`, `unfold`, `unfold_backward`, `fold`, `fold_backward`.  Each has a fake (meta)
  implementation, so `torch.compile(model, fullgraph=True)` traces them without a graph break; padding is
  passed normalised as [top, bottom, left, right].
* One `torch.autograd.Function` per forward op (`Conv2dFunction`, ...), whose `backward` calls the matching
  backward op (that is, cupyconv's manual `*_backward`) for only the gradients `ctx.needs_input_grad` asks for.
  Its `setup_context`/`backward` are also the autograd formula registered on the custom op.
* Functional wrappers `conv2d`, `depthwise_conv2d`, `patch_conv2d`, `unfold`, `fold` with torch's signatures,
  which normalise and validate the arguments with `ConvSpec` and call the custom op.
* Modules `Conv2d`, `DepthwiseConv2d`, `PatchConv2d`, `DepthwiseSeparableConv2d`, with `torch.nn.Conv2d`'s
  constructor arguments, parameter names, initialisation and `state_dict` layout.

Autocast: under `torch.autocast(device_type, dtype=...)` the three convolutions cast their floating-point
inputs (float64 excepted, as torch does for its own convolutions) to the autocast dtype of that device and
return that dtype; `unfold` and `fold` run in their input's dtype (as `torch.nn.functional.unfold` does).
On the CPU, bfloat16 is computed in float32 and rounded (NumPy has no bfloat16), float16 is computed in float32.

Double backward: `unfold` and `fold` (linear) support it; the convolutions' backward ops do not.
"""
import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

import cupyconv

from ._spec import ConvSpec

if not (hasattr(torch.library, "custom_op") and hasattr(torch, "get_autocast_dtype")):
    raise ImportError(f"cupyconv.torch needs torch >= 2.4 (torch.library.custom_op, torch.get_autocast_dtype); "
                      f"found torch {torch.__version__}")

__all__ = [
    "conv2d", "depthwise_conv2d", "patch_conv2d", "unfold", "fold",
    "Conv2dFunction", "DepthwiseConv2dFunction", "PatchConv2dFunction",
    "UnfoldFunction", "UnfoldBackwardFunction", "FoldFunction", "FoldBackwardFunction",
    "Conv2d", "DepthwiseConv2d", "PatchConv2d", "DepthwiseSeparableConv2d",
    "cuda_context",
]


# ---------------------------------------------------------------------------------------------------------
# CUDA tensors: torch's current stream and torch's caching allocator


class _StreamProtocol:
    """A torch stream through the CUDA stream protocol, which `cupy.cuda.Stream.from_external` reads."""

    def __init__(self, stream):
        self.stream = stream

    def __cuda_stream__(self):
        return (0, self.stream.cuda_stream)


def _cupy_stream(cupy, stream):
    """A CuPy stream object over torch `stream` (must be created with its device current)."""
    if hasattr(cupy.cuda.Stream, "from_external"):  # CuPy >= 14; ExternalStream is deprecated there
        return cupy.cuda.Stream.from_external(_StreamProtocol(stream))
    return cupy.cuda.ExternalStream(stream.cuda_stream, stream.device_index)


def _torch_allocator(cupy, stream):
    """A CuPy allocator drawing from torch's caching allocator, stream-ordered on `stream`."""

    def malloc(size, device_id):
        return torch.cuda.caching_allocator_alloc(size, device_id, stream)

    def free(ptr, device_id):
        torch.cuda.caching_allocator_delete(ptr)

    return cupy.cuda.PythonFunctionAllocator(malloc, free).malloc


@contextlib.contextmanager
def cuda_context(device):
    """Run the CuPy work inside on torch's terms for `device` (a torch.device, or a tensor on it).

    For a CUDA device: that device is CuPy's current device, torch's current stream is CuPy's current stream
    (so every kernel and cuBLAS call is ordered with torch's work, and DLPack hand-overs need no
    synchronisation), and CuPy allocates from torch's caching allocator on that stream (so memory is reused
    stream-safely and counted by `torch.cuda.memory_allocated`).  For any other device it does nothing.

    Memory that outlives the block (results handed to torch) stays owned by the stream that was current when
    it was allocated; use it on another stream only after synchronising, as for any torch tensor.
    """
    if isinstance(device, torch.Tensor):
        device = device.device
    device = torch.device(device)
    if device.type != "cuda":
        yield
        return
    import cupy
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(index)
    with cupy.cuda.Device(index), cupy.cuda.using_allocator(_torch_allocator(cupy, stream)), \
            _cupy_stream(cupy, stream):
        yield


def _run(fn, like, *args, **kwargs):
    """fn(*args, **kwargs) in `like`'s device context; tensor results made contiguous, as the fake ops promise."""
    if like.device.type not in ("cpu", "cuda"):
        raise TypeError(f"cupyconv: tensors on {like.device} are not supported; use CPU or CUDA tensors")
    with cuda_context(like.device):
        result = fn(*args, **kwargs)
        if isinstance(result, tuple):
            return tuple(r if r is None else r.contiguous() for r in result)
        return result.contiguous()


# ---------------------------------------------------------------------------------------------------------
# Geometry helpers (plain ints on the eager path, SymInts in fake implementations)


def _per_side(padding):
    """[top, bottom, left, right] -> ((top, bottom), (left, right)), the per-side form of cupyconv."""
    top, bottom, left, right = padding
    return ((top, bottom), (left, right))


def _flat_padding(spec: ConvSpec) -> list:
    (top, bottom), (left, right) = spec.padding
    return [top, bottom, left, right]


def _out_size(in_size, kernel, stride, padding, dilation):
    """Output (oH, oW) of a window op; padding as [top, bottom, left, right]."""
    return tuple((n + lo + hi - d * (k - 1) - 1) // s + 1
                 for n, k, s, lo, hi, d in zip(in_size, kernel, stride, padding[0::2], padding[1::2], dilation))


def _empty(like):
    """The placeholder a backward op returns for a gradient it was not asked for."""
    return like.new_empty((0,))


def _needed(grads, needs):
    return tuple(g if need else None for g, need in zip(grads, needs))


def _needs(ctx, has_bias: bool) -> list:
    want_x, want_w, want_b = ctx.needs_input_grad[:3]
    return [bool(want_x), bool(want_w), bool(want_b and has_bias)]


def _names(needs) -> tuple:
    return tuple(name for name, need in zip(("input", "weight", "bias"), needs) if need)


def _fake_conv_backward(grad_output, x, weight, needs):
    return (x.new_empty(x.shape) if needs[0] else _empty(x),
            weight.new_empty(weight.shape) if needs[1] else _empty(x),
            weight.new_empty((weight.shape[0],)) if needs[2] else _empty(x))


def _fill_missing(grads, like):
    """The backward ops return three tensors: an empty one stands for a gradient not asked for."""
    return tuple(g if g is not None else _empty(like) for g in grads)


def _conv_autograd(backward_op):
    """(setup_context, backward) of a convolution's autograd.Function, as staticmethods.

    The Function's inputs are (x, weight, bias, *geometry); x and weight are saved, and backward calls
    `backward_op(grad_output, x, weight, *geometry, needs)` for only the gradients `ctx.needs_input_grad` asks
    for (None for the geometry).  The same two functions are the autograd formula registered on the forward op.
    """

    def setup_context(ctx, inputs, output):
        x, weight, bias, *geometry = inputs
        ctx.save_for_backward(x, weight)
        ctx.geometry = tuple(geometry)
        ctx.has_bias = bias is not None

    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        needs = _needs(ctx, ctx.has_bias)
        grads = backward_op(grad_output.to(x.dtype), x, weight, *ctx.geometry, needs)
        return (*_needed(grads, needs), *(None for _ in ctx.geometry))

    return staticmethod(setup_context), staticmethod(backward)


# ---------------------------------------------------------------------------------------------------------
# Custom ops: conv2d and patch_conv2d (one schema: patch_conv2d is conv2d over any leading dims of x)


def _grouped_conv_ops(name):
    """Define the custom ops `cupyconv::<name>` and `cupyconv::<name>_backward` with their fake implementations,
    for the cupyconv functions of that name (looked up on every call); returns (op, backward op)."""

    @torch.library.custom_op(f"cupyconv::{name}", mutates_args=(), schema=(
            "(Tensor x, Tensor weight, Tensor? bias, int[2] stride, int[4] padding, int[2] dilation, int groups) "
            "-> Tensor"))
    def op(x, weight, bias, stride, padding, dilation, groups):
        return _run(getattr(cupyconv, name), x, x, weight, bias, tuple(stride), _per_side(padding),
                    tuple(dilation), groups)

    @op.register_fake
    def _(x, weight, bias, stride, padding, dilation, groups):
        out = _out_size(x.shape[-2:], weight.shape[-2:], stride, padding, dilation)
        return x.new_empty((*x.shape[:-3], weight.shape[0], *out))

    @torch.library.custom_op(f"cupyconv::{name}_backward", mutates_args=(), schema=(
            "(Tensor grad_output, Tensor x, Tensor weight, int[2] stride, int[4] padding, int[2] dilation, "
            "int groups, bool[3] needs) -> (Tensor, Tensor, Tensor)"))
    def backward_op(grad_output, x, weight, stride, padding, dilation, groups, needs):
        grads = _run(getattr(cupyconv, f"{name}_backward"), x, grad_output, x, weight, stride=tuple(stride),
                     padding=_per_side(padding), dilation=tuple(dilation), groups=groups, needs=_names(needs))
        return _fill_missing(grads, x)

    @backward_op.register_fake
    def _(grad_output, x, weight, stride, padding, dilation, groups, needs):
        return _fake_conv_backward(grad_output, x, weight, needs)

    return op, backward_op


_conv2d_op, _conv2d_backward_op = _grouped_conv_ops("conv2d")
_patch_op, _patch_backward_op = _grouped_conv_ops("patch_conv2d")


class Conv2dFunction(torch.autograd.Function):
    """cupyconv.conv2d with its manual backward; also the autograd formula of the op `cupyconv::conv2d`.

    `Conv2dFunction.apply(x, weight, bias, stride, padding, dilation, groups)` takes the op's normalised
    arguments (padding [top, bottom, left, right]); the functional `conv2d` is the friendlier entry point.
    """

    @staticmethod
    def forward(x, weight, bias, stride, padding, dilation, groups):
        return torch.ops.cupyconv.conv2d(x, weight, bias, stride, padding, dilation, groups)

    setup_context, backward = _conv_autograd(torch.ops.cupyconv.conv2d_backward)


class PatchConv2dFunction(torch.autograd.Function):
    """cupyconv.patch_conv2d over x (..., C, H, W) with its manual backward (see `Conv2dFunction`)."""

    @staticmethod
    def forward(x, weight, bias, stride, padding, dilation, groups):
        return torch.ops.cupyconv.patch_conv2d(x, weight, bias, stride, padding, dilation, groups)

    setup_context, backward = _conv_autograd(torch.ops.cupyconv.patch_conv2d_backward)


_conv2d_op.register_autograd(Conv2dFunction.backward, setup_context=Conv2dFunction.setup_context)
_patch_op.register_autograd(PatchConv2dFunction.backward, setup_context=PatchConv2dFunction.setup_context)


# ---------------------------------------------------------------------------------------------------------
# Custom ops: depthwise_conv2d


@torch.library.custom_op("cupyconv::depthwise_conv2d", mutates_args=(), schema=(
        "(Tensor x, Tensor weight, Tensor? bias, int[2] stride, int[4] padding, int[2] dilation) -> Tensor"))
def _depthwise_op(x, weight, bias, stride, padding, dilation):
    return _run(cupyconv.depthwise_conv2d, x, x, weight, bias, tuple(stride), _per_side(padding),
                tuple(dilation))


@_depthwise_op.register_fake
def _(x, weight, bias, stride, padding, dilation):
    out = _out_size(x.shape[-2:], weight.shape[-2:], stride, padding, dilation)
    return x.new_empty((x.shape[0], weight.shape[0], *out))


@torch.library.custom_op("cupyconv::depthwise_conv2d_backward", mutates_args=(), schema=(
        "(Tensor grad_output, Tensor x, Tensor weight, int[2] stride, int[4] padding, int[2] dilation, "
        "bool[3] needs) -> (Tensor, Tensor, Tensor)"))
def _depthwise_backward_op(grad_output, x, weight, stride, padding, dilation, needs):
    grads = _run(cupyconv.depthwise_conv2d_backward, x, grad_output, x, weight, stride=tuple(stride),
                 padding=_per_side(padding), dilation=tuple(dilation), needs=_names(needs))
    return _fill_missing(grads, x)


@_depthwise_backward_op.register_fake
def _(grad_output, x, weight, stride, padding, dilation, needs):
    return _fake_conv_backward(grad_output, x, weight, needs)


class DepthwiseConv2dFunction(torch.autograd.Function):
    """cupyconv.depthwise_conv2d with its manual backward (see `Conv2dFunction`); no groups argument."""

    @staticmethod
    def forward(x, weight, bias, stride, padding, dilation):
        return torch.ops.cupyconv.depthwise_conv2d(x, weight, bias, stride, padding, dilation)

    setup_context, backward = _conv_autograd(torch.ops.cupyconv.depthwise_conv2d_backward)


_depthwise_op.register_autograd(DepthwiseConv2dFunction.backward,
                                setup_context=DepthwiseConv2dFunction.setup_context)


# ---------------------------------------------------------------------------------------------------------
# Custom ops: unfold and fold (linear, each other's adjoint: their backward ops have autograd too)


@torch.library.custom_op("cupyconv::unfold", mutates_args=(), schema=(
        "(Tensor x, int[2] kernel_size, int[2] dilation, int[4] padding, int[2] stride) -> Tensor"))
def _unfold_op(x, kernel_size, dilation, padding, stride):
    return _run(cupyconv.unfold, x, x, tuple(kernel_size), tuple(dilation), _per_side(padding), tuple(stride))


@_unfold_op.register_fake
def _(x, kernel_size, dilation, padding, stride):
    oh, ow = _out_size(x.shape[-2:], kernel_size, stride, padding, dilation)
    return x.new_empty((*x.shape[:-3], x.shape[-3] * kernel_size[0] * kernel_size[1], oh * ow))


@torch.library.custom_op("cupyconv::unfold_backward", mutates_args=(), schema=(
        "(Tensor grad_output, SymInt[2] input_size, int[2] kernel_size, int[2] dilation, int[4] padding, "
        "int[2] stride) -> Tensor"))
def _unfold_backward_op(grad_output, input_size, kernel_size, dilation, padding, stride):
    return _run(cupyconv.unfold_backward, grad_output, grad_output, tuple(input_size), tuple(kernel_size),
                tuple(dilation), _per_side(padding), tuple(stride))


@_unfold_backward_op.register_fake
def _(grad_output, input_size, kernel_size, dilation, padding, stride):
    channels = grad_output.shape[-2] // (kernel_size[0] * kernel_size[1])
    return grad_output.new_empty((*grad_output.shape[:-2], channels, *input_size))


@torch.library.custom_op("cupyconv::fold", mutates_args=(), schema=(
        "(Tensor cols, SymInt[2] output_size, int[2] kernel_size, int[2] dilation, int[4] padding, "
        "int[2] stride) -> Tensor"))
def _fold_op(cols, output_size, kernel_size, dilation, padding, stride):
    return _run(cupyconv.fold, cols, cols, tuple(output_size), tuple(kernel_size), tuple(dilation),
                _per_side(padding), tuple(stride))


@_fold_op.register_fake
def _(cols, output_size, kernel_size, dilation, padding, stride):
    channels = cols.shape[-2] // (kernel_size[0] * kernel_size[1])
    return cols.new_empty((*cols.shape[:-2], channels, *output_size))


@torch.library.custom_op("cupyconv::fold_backward", mutates_args=(), schema=(
        "(Tensor grad_output, int[2] kernel_size, int[2] dilation, int[4] padding, int[2] stride) -> Tensor"))
def _fold_backward_op(grad_output, kernel_size, dilation, padding, stride):
    return _run(cupyconv.fold_backward, grad_output, grad_output, tuple(kernel_size), tuple(dilation),
                _per_side(padding), tuple(stride))


@_fold_backward_op.register_fake
def _(grad_output, kernel_size, dilation, padding, stride):
    oh, ow = _out_size(grad_output.shape[-2:], kernel_size, stride, padding, dilation)
    c = grad_output.shape[-3]
    return grad_output.new_empty((*grad_output.shape[:-3], c * kernel_size[0] * kernel_size[1], oh * ow))


class UnfoldFunction(torch.autograd.Function):
    """cupyconv.unfold; backward is cupyconv.unfold_backward (a fold), itself differentiable."""

    @staticmethod
    def forward(x, kernel_size, dilation, padding, stride):
        return torch.ops.cupyconv.unfold(x, kernel_size, dilation, padding, stride)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, *geometry = inputs
        ctx.input_size = x.shape[-2:]
        ctx.dtype = x.dtype
        ctx.geometry = geometry

    @staticmethod
    def backward(ctx, grad_output):
        grad = torch.ops.cupyconv.unfold_backward(grad_output.to(ctx.dtype), list(ctx.input_size), *ctx.geometry)
        return grad, None, None, None, None


class UnfoldBackwardFunction(torch.autograd.Function):
    """cupyconv.unfold_backward; its backward is an unfold."""

    @staticmethod
    def forward(grad_output, input_size, kernel_size, dilation, padding, stride):
        return torch.ops.cupyconv.unfold_backward(grad_output, input_size, kernel_size, dilation, padding, stride)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, _, *geometry = inputs
        ctx.geometry = geometry

    @staticmethod
    def backward(ctx, grad):
        return torch.ops.cupyconv.unfold(grad, *ctx.geometry), None, None, None, None, None


class FoldFunction(torch.autograd.Function):
    """cupyconv.fold; backward is cupyconv.fold_backward (an unfold), itself differentiable."""

    @staticmethod
    def forward(cols, output_size, kernel_size, dilation, padding, stride):
        return torch.ops.cupyconv.fold(cols, output_size, kernel_size, dilation, padding, stride)

    @staticmethod
    def setup_context(ctx, inputs, output):
        cols, _, *geometry = inputs
        ctx.dtype = cols.dtype
        ctx.geometry = geometry

    @staticmethod
    def backward(ctx, grad_output):
        return torch.ops.cupyconv.fold_backward(grad_output.to(ctx.dtype), *ctx.geometry), None, None, None, None, None


class FoldBackwardFunction(torch.autograd.Function):
    """cupyconv.fold_backward; its backward is a fold onto the size of fold_backward's input."""

    @staticmethod
    def forward(grad_output, kernel_size, dilation, padding, stride):
        return torch.ops.cupyconv.fold_backward(grad_output, kernel_size, dilation, padding, stride)

    @staticmethod
    def setup_context(ctx, inputs, output):
        grad_output, *geometry = inputs
        ctx.size = grad_output.shape[-2:]
        ctx.geometry = geometry

    @staticmethod
    def backward(ctx, grad):
        return torch.ops.cupyconv.fold(grad, list(ctx.size), *ctx.geometry), None, None, None, None


for _op, _function in ((_unfold_op, UnfoldFunction), (_unfold_backward_op, UnfoldBackwardFunction),
                       (_fold_op, FoldFunction), (_fold_backward_op, FoldBackwardFunction)):
    _op.register_autograd(_function.backward, setup_context=_function.setup_context)


# ---------------------------------------------------------------------------------------------------------
# Autocast: the convolutions run in the autocast dtype in effect (not a dtype fixed at registration)

_AUTOCAST_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}
_LIBRARY = torch.library.Library("cupyconv", "FRAGMENT")


def _autocast_kernel(op, device_type):
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype(device_type)

        def cast(a):
            eligible = (isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float64
                        and a.device.type == device_type)
            return a.to(dtype) if eligible else a

        args = [cast(a) for a in args]
        kwargs = {k: cast(a) for k, a in kwargs.items()}
        with torch.autocast(device_type, enabled=False):
            return op(*args, **kwargs)

    return kernel


for _name in ("conv2d", "depthwise_conv2d", "patch_conv2d"):
    for _device_type, _key in _AUTOCAST_KEYS.items():
        if torch.amp.is_autocast_available(_device_type):
            _LIBRARY.impl(_name, _autocast_kernel(getattr(torch.ops.cupyconv, _name).default, _device_type), _key)


# ---------------------------------------------------------------------------------------------------------
# Functional API (torch signatures, cupyconv's padding forms)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution of input (N, C, H, W) with weight (D, C // groups, kH, kW) and bias (D,) or None.

    Same as `torch.nn.functional.conv2d`, with padding also per side ((top, bottom), (left, right)) and 'same'
    for any stride (output = ceil(in / stride), the odd pixel at the bottom/right).  Returns (N, D, oH, oW).
    """
    spec = ConvSpec.for_conv("conv2d", input, weight, bias, stride, padding, dilation, groups)
    return torch.ops.cupyconv.conv2d(input, weight, bias, list(spec.stride), _flat_padding(spec),
                                     list(spec.dilation), spec.groups)


def depthwise_conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1):
    """Depthwise convolution of input (N, C, H, W) with weight (C * m, 1, kH, kW): conv2d with groups = C."""
    spec = ConvSpec.for_depthwise("depthwise_conv2d", input, weight, bias, stride, padding, dilation)
    return torch.ops.cupyconv.depthwise_conv2d(input, weight, bias, list(spec.stride), _flat_padding(spec),
                                               list(spec.dilation))


def patch_conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """The same filters over every patch of input (..., C, H, W): (..., D, oH, oW), padding inside each patch."""
    spec = ConvSpec.for_conv("patch_conv2d", input, weight, bias, stride, padding, dilation, groups,
                             min_ndim=3, max_ndim=None)
    return torch.ops.cupyconv.patch_conv2d(input, weight, bias, list(spec.stride), _flat_padding(spec),
                                           list(spec.dilation), spec.groups)


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """Sliding blocks of input (..., C, H, W): (..., C * kH * kW, L), as `torch.nn.functional.unfold`."""
    spec = ConvSpec.for_unfold("unfold", input, kernel_size, dilation, padding, stride)
    return torch.ops.cupyconv.unfold(input, list(spec.kernel), list(spec.dilation), _flat_padding(spec),
                                     list(spec.stride))


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """Sum blocks input (..., C * kH * kW, L) back into (..., C, H, W), as `torch.nn.functional.fold`."""
    spec = ConvSpec.for_fold("fold", input, output_size, kernel_size, dilation, padding, stride)
    return torch.ops.cupyconv.fold(input, list(spec.in_size), list(spec.kernel), list(spec.dilation),
                                   _flat_padding(spec), list(spec.stride))


# ---------------------------------------------------------------------------------------------------------
# Modules

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _pair(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


class _Conv2dLayer(nn.Module):
    """What the convolution layers share with `torch.nn.Conv2d`: arguments, parameters, init, repr."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        name = type(self).__name__
        if not isinstance(groups, int) or groups < 1:
            raise ValueError(f"{name}: groups must be a positive int, got {groups!r}")
        if in_channels % groups:
            raise ValueError(f"{name}: in_channels={in_channels} must be divisible by groups={groups}")
        if out_channels % groups:
            raise ValueError(f"{name}: out_channels={out_channels} must be divisible by groups={groups}")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"{name}: padding_mode must be one of {_PADDING_MODES}, got {padding_mode!r}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.dilation = _pair(kernel_size), _pair(stride), _pair(dilation)
        self.padding = padding if isinstance(padding, str) else _normal_padding(padding)
        self.padding_mode = padding_mode
        # Check the padding form now, on the smallest input this window accepts with any padding.
        self._padding_sides(self._window(), name)
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty((out_channels, in_channels // groups, *self.kernel_size),
                                               **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def _window(self):
        return tuple(d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilation))

    def reset_parameters(self) -> None:
        """torch.nn.Conv2d's initialisation, drawing the same random numbers in the same order."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight.shape[1] * self.kernel_size[0] * self.kernel_size[1]
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                nn.init.uniform_(self.bias, -bound, bound)

    def _padding_sides(self, in_size, op=None):
        """This layer's padding as ((top, bottom), (left, right)) for planes of size in_size."""
        spec = ConvSpec.geometry(op or type(self).__name__, (), 1, 1, 1, tuple(in_size), self.kernel_size,
                                 self.stride, self.padding, self.dilation)
        return spec.padding

    def _explicit_padding(self, input):
        """input padded by F.pad in padding_mode (flattening leading dims), and the padding left to the op."""
        if self.padding_mode == "zeros":
            return input, self.padding
        (top, bottom), (left, right) = self._padding_sides(input.shape[-2:])
        planes = input.reshape(-1, *input.shape[-3:])
        padded = F.pad(planes, (left, right, top, bottom), mode=self.padding_mode)
        return padded.reshape(*input.shape[:-2], *padded.shape[-2:]), 0

    def forward(self, input):
        input, padding = self._explicit_padding(input)
        return self._convolve(input, padding)

    def _convolve(self, input, padding):
        return conv2d(input, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            text += f", padding={self.padding!r}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        if self.padding_mode != "zeros":
            text += f", padding_mode={self.padding_mode!r}"
        return text


def _normal_padding(padding):
    """An int becomes a pair (as torch stores it); pairs and per-side pairs of pairs are kept as tuples."""
    if isinstance(padding, (tuple, list)):
        return tuple(tuple(p) if isinstance(p, (tuple, list)) else p for p in padding)
    return (padding, padding)


class Conv2d(_Conv2dLayer):
    """Drop-in for `torch.nn.Conv2d` computed by cupyconv: same arguments, parameters, init and state_dict.

    Input (N, C, H, W).  padding: int, pair, per side ((top, bottom), (left, right)), 'valid' or 'same'
    ('same' also for stride > 1: output = ceil(in / stride)).  padding_mode 'reflect', 'replicate' and
    'circular' pad with `torch.nn.functional.pad` first, as torch does.
    """


class DepthwiseConv2d(_Conv2dLayer):
    """Depthwise convolution layer: `torch.nn.Conv2d(in_channels, out_channels, kernel_size, ...,
    groups=in_channels)` computed by cupyconv's depthwise kernels.

    out_channels must be a multiple m of in_channels (channel multiplier); weight is (C * m, 1, kH, kW), the
    same parameters and state_dict as the torch layer.  groups may be left out; if given it must equal
    in_channels.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=None,
                 bias=True, padding_mode="zeros", device=None, dtype=None):
        if groups is not None and groups != in_channels:
            raise ValueError(f"DepthwiseConv2d: groups must equal in_channels={in_channels}, got {groups}")
        if out_channels % in_channels:
            raise ValueError(f"DepthwiseConv2d: out_channels={out_channels} must be a multiple of "
                             f"in_channels={in_channels}")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, in_channels, bias,
                         padding_mode, device, dtype)

    def _convolve(self, input, padding):
        return depthwise_conv2d(input, self.weight, self.bias, self.stride, padding, self.dilation)


class PatchConv2d(_Conv2dLayer):
    """`torch.nn.Conv2d` applied to every patch of input (..., C, H, W) -> (..., D, oH, oW).

    Each patch is its own image: padding is applied inside every patch.  Same arguments, parameters, init and
    state_dict as `torch.nn.Conv2d`, so `PatchConv2d(...)(x)` equals `nn.Conv2d(...)(x.reshape(-1, C, H, W))`
    reshaped back, with the same weights.
    """

    def _convolve(self, input, padding):
        return patch_conv2d(input, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


class DepthwiseSeparableConv2d(nn.Module):
    """A depthwise convolution followed by a 1x1 pointwise convolution (no activation between them).

    Arguments:
        in_channels, out_channels: channels of the input and of the output.
        kernel_size, stride, padding, dilation, padding_mode: of the depthwise convolution (as `Conv2d`).
        bias: whether the pointwise convolution has a bias (default True).
        depth_multiplier: m, the depthwise convolution's output channels per input channel (default 1).
        depthwise_bias: whether the depthwise convolution has a bias too (default False: followed directly by
            a linear pointwise convolution, its bias would only shift the pointwise bias).
        device, dtype: of the parameters.

    Submodules `depthwise` (a `DepthwiseConv2d`, weight (C * m, 1, kH, kW)) and `pointwise` (a `Conv2d`, weight
    (out_channels, C * m, 1, 1)) have `torch.nn.Conv2d`'s state: the state_dict keys are `depthwise.weight`,
    [`depthwise.bias`,] `pointwise.weight`, [`pointwise.bias`], and load into (or from) any torch module with
    `depthwise = nn.Conv2d(C, C * m, k, groups=C, ...)` and `pointwise = nn.Conv2d(C * m, out_channels, 1)`.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, bias=True,
                 padding_mode="zeros", depth_multiplier=1, depthwise_bias=False, device=None, dtype=None):
        super().__init__()
        if not isinstance(depth_multiplier, int) or depth_multiplier < 1:
            raise ValueError(f"DepthwiseSeparableConv2d: depth_multiplier must be a positive int, "
                             f"got {depth_multiplier!r}")
        middle = in_channels * depth_multiplier
        self.depthwise = DepthwiseConv2d(in_channels, middle, kernel_size, stride, padding, dilation,
                                         bias=depthwise_bias, padding_mode=padding_mode, device=device,
                                         dtype=dtype)
        self.pointwise = Conv2d(middle, out_channels, 1, bias=bias, device=device, dtype=dtype)

    def forward(self, input):
        return self.pointwise(self.depthwise(input))
