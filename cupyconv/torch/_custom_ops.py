"""The custom ops `torch.ops.cupyconv.<op>`, their fake (meta) implementations and their autocast kernels.

Importing this module registers them.  Their autograd formulas are registered by `cupyconv.torch.autograd`.

Every convolution is one template (`_define_convolution`): a forward op
`cupyconv::<name>(Tensor x, Tensor weight, Tensor? bias, <options>) -> Tensor` and a backward op
`cupyconv::<name>_backward(Tensor grad_output, Tensor x, Tensor weight, bool[3] needs, <options>)
-> (Tensor, Tensor, Tensor)`, which call the cupyconv functions of those names.  The options are the op's
geometry with padding flat as [low, high] per spatial dim ([top, bottom, left, right] in 2-D), then
`algorithm` where the op has a choice, then `workspace_limit` where it builds a workspace (run inside
`cupyconv.settings.workspace_limit`).  The backward op's `needs` comes before the options, so the options
of either op are passed on as they came, with the schema's defaults.  On CPU tensors the convolution ops
compute with torch's own CPU convolutions unless `cupyconv.torch.cpu`'s numpy_cpu_path is on.
"""
import ast
import contextlib
import functools
import math
import threading
import weakref

import torch

import cupyconv

from .._replay import collecting_offers
from ..ops.conv import workspace_scope
from . import cpu
from . import cuda
from .cuda import _run
from .functional import output_format

# CUDA graphs (torch.compile(mode="reduce-overhead"), CUDA graph trees) cannot capture cupyconv: CuPy 14's cuBLAS
# binding raises while a stream captures, and cupyconv refuses to start under capture (`_device.CAPTURE_REFUSAL`).
# Tagged cudagraph_unsafe (torch >= 2.8), the ops run between the captured partitions of a compiled graph.
_GRAPH_TAGS = {"tags": (torch.Tag.cudagraph_unsafe,)} if hasattr(torch.Tag, "cudagraph_unsafe") else {}

#: {op name: its implementation}: the function each custom op `torch.ops.cupyconv.<name>` runs on real tensors,
#: which `call` runs directly where torch's dispatcher would add nothing but its own host time.
BODIES: dict = {}


def _custom_op(name: str, body, schema: str):
    """`torch.ops.cupyconv.<name>` with implementation body (kept in BODIES)."""
    BODIES[name] = body
    return torch.library.custom_op(f"cupyconv::{name}", body, mutates_args=(), **_GRAPH_TAGS, schema=schema)

# ---------------------------------------------------------------------------------------------------------
# Geometry helpers (plain ints on the eager path, SymInts in fake implementations)


def _per_side(padding):
    """[low, high, low, high, ...] -> ((low, high), ...), one pair per spatial dim: cupyconv's per-side form."""
    return tuple(zip(padding[0::2], padding[1::2]))


def _out_size(in_size, kernel, stride, padding, dilation):
    """Output sizes of a window op; padding flat as [low, high] per dim."""
    return tuple((n + lo + hi - d * (k - 1) - 1) // s + 1
                 for n, k, s, lo, hi, d in zip(in_size, kernel, stride, padding[0::2], padding[1::2], dilation))


def _empty(like):
    """The placeholder a backward op returns for a gradient it was not asked for."""
    return like.new_empty((0,))


def _names(needs) -> tuple:
    return tuple(name for name, need in zip(("input", "weight", "bias"), needs) if need)


def _fill_missing(grads, like):
    """The backward ops return three tensors: an empty one stands for a gradient not asked for."""
    return tuple(g if g is not None else _empty(like) for g in grads)


# ---------------------------------------------------------------------------------------------------------
# The convolutions: one template for the forward op, the backward op and their fake implementations


def _conv_shape(x, weight, stride, padding, dilation, **_):
    """(..., D, out...) of a convolution of x (..., C, in...) with weight (D, C // groups, k...)."""
    nd = weight.dim() - 2
    out = _out_size(x.shape[-nd:], weight.shape[2:], stride, padding, dilation)
    return (*x.shape[:-nd - 1], weight.shape[0], *out)


def _transpose_shape(x, weight, stride, padding, output_padding, groups, dilation, **_):
    """(N, C_out, out...) of a transposed convolution of x (N, C_in, in...) with weight
    (C_in, C_out // groups, k...)."""
    nd = weight.dim() - 2
    out = tuple((n - 1) * s - lo - hi + d * (k - 1) + extra + 1
                for n, s, lo, hi, d, k, extra in zip(x.shape[-nd:], stride, padding[0::2], padding[1::2], dilation,
                                                     weight.shape[2:], output_padding))
    return (*x.shape[:-nd - 1], weight.shape[1] * groups, *out)


_WINDOW = ("int[] stride", "int[] padding", "int[] dilation")
_CONV_OPTIONS = (*_WINDOW, "int groups", 'str algorithm="auto"', "int? workspace_limit=None")
_TRANSPOSE_OPTIONS = ("int[] stride", "int[] padding", "int[] output_padding", "int groups", "int[] dilation",
                      'str algorithm="auto"', "int? workspace_limit=None")


def _keywords(options: tuple, values: tuple) -> dict:
    """The option values of one call by name: those given, then the schema's defaults (a caller may leave
    trailing options with defaults out, and the op then receives fewer values)."""
    names, defaults = _parsed(options)
    return {name: values[i] if i < len(values) else defaults[i] for i, name in enumerate(names)}


@functools.cache
def _parsed(options: tuple) -> tuple[tuple, tuple]:
    """(names, defaults) of a schema's options, parsed once: every call of an op needs them."""
    parts = [option.split()[1].partition("=") for option in options]
    return (tuple(name for name, _, _ in parts),
            tuple(ast.literal_eval(default) if default else None for _, _, default in parts))


def _cupyconv_keywords(kw: dict) -> dict:
    """The keywords of the cupyconv function: padding per side, sizes as tuples, workspace_limit left out (the
    caller runs the function inside `workspace_scope`)."""
    out = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in kw.items() if k != "workspace_limit"}
    out["padding"] = _per_side(kw["padding"])
    return out


# One channels-last copy of x per training step: the forward of these ops (x straight to the 2-D run) hands the
# copy its channels-last kernel made of a 16-bit x (offered: `_replay.collecting_offers`; x's values exactly) to
# autograd, which saves it in place of x (`saved_x`), so the weight gradient reads it in place instead of copying
# x again, and the memory saved for the backward does not grow.  Only for an x that does not require grad: the copy
# has no grad_fn, and saved in place of an x that does, it would cut off x a gradient taken with create_graph (d/dx
# of an expression of the weight gradient: silently None).  The hand-over is a one-slot, per-thread holder
# (the output, weakly, and the copy): autograd's setup_context runs right after the op returns, in the same
# thread, and empties it; without autograd (no_grad, a frozen weight) the slot is emptied by the next forward.
KEEPS_X_COPY = ("conv1d", "conv2d")
_LAST_X_COPY = threading.local()


def _keep_x_copy(y, x, copy) -> None:
    """Hold the channels-last copy (n, H, W, C) of x, as a tensor of x's shape (channels-last strides), for y."""
    t = torch.from_dlpack(copy)
    if t.numel() == x.numel() and t.shape[0] == x.shape[0] and t.shape[-1] == x.shape[1]:
        _LAST_X_COPY.slot = (weakref.ref(y), t.reshape(x.shape[0], *x.shape[2:], x.shape[1]).movedim(-1, 1))


def saved_x(x, output):
    """What a forward's autograd saves for x: the channels-last copy of x that the forward which returned output
    kept (taken out of the holder), else x itself."""
    slot, _LAST_X_COPY.slot = getattr(_LAST_X_COPY, "slot", None), None
    if slot is None or slot[0]() is not output or slot[1].shape != x.shape or slot[1].dtype != x.dtype:
        return x
    return slot[1]


def _define_convolution(name: str, options: tuple, out_shape):
    """Define `cupyconv::<name>` and `cupyconv::<name>_backward` for the cupyconv functions of that name (looked
    up on every call, so a test can wrap them), with fake implementations; out_shape(x, weight, **options) is
    the forward output's shape."""
    schema = ", ".join(options)

    def forward(x, weight, bias, *values):
        kw = _keywords(options, values)
        if cpu.runs_on_torch(x, weight):
            return cpu.forward(name, x, weight, bias, kw).contiguous(memory_format=output_format(x, weight))
        # (grad mode is off in here either way; x.requires_grad: see KEEPS_X_COPY)
        keep = name in KEEPS_X_COPY and weight.requires_grad and not x.requires_grad
        _LAST_X_COPY.slot = None
        with workspace_scope(name, kw.get("workspace_limit")), \
                (collecting_offers() if keep else contextlib.nullcontext([])) as kept:
            y = _run(getattr(cupyconv, name), x, x, weight, bias, memory_format=output_format(x, weight),
                     **_cupyconv_keywords(kw))
        if kept:
            _keep_x_copy(y, x, kept[0])
        return y

    op = _custom_op(name, forward, f"(Tensor x, Tensor weight, Tensor? bias, {schema}) -> Tensor")

    @op.register_fake
    def _(x, weight, bias, *values):
        return torch.empty(out_shape(x, weight, **_keywords(options, values)), dtype=x.dtype, device=x.device,
                           memory_format=output_format(x, weight))

    def backward(grad_output, x, weight, needs, *values):
        kw = _keywords(options, values)
        if cpu.runs_on_torch(x, weight):
            return _fill_missing(cpu.backward(name, grad_output, x, weight, needs, kw), x)
        with workspace_scope(f"{name}_backward", kw.get("workspace_limit")):
            grads = _run(getattr(cupyconv, f"{name}_backward"), x, grad_output, x, weight, needs=_names(needs),
                         **_cupyconv_keywords(kw))
        return _fill_missing(grads, x)

    backward_op = _custom_op(f"{name}_backward", backward, (
        f"(Tensor grad_output, Tensor x, Tensor weight, bool[3] needs, {schema}) -> (Tensor, Tensor, Tensor)"))

    @backward_op.register_fake
    def _(grad_output, x, weight, needs, *values):
        channels = grad_output.shape[-(weight.dim() - 2) - 1]
        return (x.new_empty(x.shape) if needs[0] else _empty(x),
                weight.new_empty(weight.shape) if needs[1] else _empty(x),
                weight.new_empty((channels,)) if needs[2] else _empty(x))


#: The convolution ops, each with its cupyconv function, backward op and autograd formulas.
CONVOLUTIONS = ("conv1d", "conv2d", "conv3d", "patch_conv2d", "depthwise_conv2d",
                "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")

for _name in ("conv1d", "conv2d", "conv3d", "patch_conv2d"):
    _define_convolution(_name, _CONV_OPTIONS, _conv_shape)
_define_convolution("depthwise_conv2d", _WINDOW, _conv_shape)
for _name in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
    _define_convolution(_name, _TRANSPOSE_OPTIONS, _transpose_shape)


# ---------------------------------------------------------------------------------------------------------
# Custom ops: unfold and fold (linear, each other's adjoint: their backward ops have autograd too)


def _unfold(x, kernel_size, dilation, padding, stride):
    return _run(cupyconv.unfold, x, x, tuple(kernel_size), tuple(dilation), _per_side(padding), tuple(stride))


_unfold_op = _custom_op("unfold", _unfold, (
    "(Tensor x, int[2] kernel_size, int[2] dilation, int[4] padding, int[2] stride) -> Tensor"))


@_unfold_op.register_fake
def _(x, kernel_size, dilation, padding, stride):
    out = _out_size(x.shape[-2:], kernel_size, stride, padding, dilation)
    return x.new_empty((*x.shape[:-3], x.shape[-3] * math.prod(kernel_size), math.prod(out)))


def _unfold_backward(grad_output, input_size, kernel_size, dilation, padding, stride):
    return _run(cupyconv.unfold_backward, grad_output, grad_output, tuple(input_size), tuple(kernel_size),
                tuple(dilation), _per_side(padding), tuple(stride))


_unfold_backward_op = _custom_op("unfold_backward", _unfold_backward, (
    "(Tensor grad_output, SymInt[2] input_size, int[2] kernel_size, int[2] dilation, int[4] padding, "
    "int[2] stride) -> Tensor"))


@_unfold_backward_op.register_fake
def _(grad_output, input_size, kernel_size, dilation, padding, stride):
    channels = grad_output.shape[-2] // math.prod(kernel_size)
    return grad_output.new_empty((*grad_output.shape[:-2], channels, *input_size))


def _fold(cols, output_size, kernel_size, dilation, padding, stride):
    return _run(cupyconv.fold, cols, cols, tuple(output_size), tuple(kernel_size), tuple(dilation),
                _per_side(padding), tuple(stride))


_fold_op = _custom_op("fold", _fold, (
    "(Tensor cols, SymInt[2] output_size, int[2] kernel_size, int[2] dilation, int[4] padding, "
    "int[2] stride) -> Tensor"))


@_fold_op.register_fake
def _(cols, output_size, kernel_size, dilation, padding, stride):
    channels = cols.shape[-2] // math.prod(kernel_size)
    return cols.new_empty((*cols.shape[:-2], channels, *output_size))


def _fold_backward(grad_output, kernel_size, dilation, padding, stride):
    return _run(cupyconv.fold_backward, grad_output, grad_output, tuple(kernel_size), tuple(dilation),
                _per_side(padding), tuple(stride))


_fold_backward_op = _custom_op("fold_backward", _fold_backward, (
    "(Tensor grad_output, int[2] kernel_size, int[2] dilation, int[4] padding, int[2] stride) -> Tensor"))


@_fold_backward_op.register_fake
def _(grad_output, kernel_size, dilation, padding, stride):
    out = _out_size(grad_output.shape[-2:], kernel_size, stride, padding, dilation)
    c = grad_output.shape[-3]
    return grad_output.new_empty((*grad_output.shape[:-3], c * math.prod(kernel_size), math.prod(out)))


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


for _name in CONVOLUTIONS:
    for _device_type, _key in _AUTOCAST_KEYS.items():
        if torch.amp.is_autocast_available(_device_type):
            _LIBRARY.impl(_name, _autocast_kernel(getattr(torch.ops.cupyconv, _name).default, _device_type), _key)


# ---------------------------------------------------------------------------------------------------------
# Eager calls: the ops without torch's dispatcher where it would only add host time
#
# Measured on this CPU (benchmarks/RESULTS.md "Host cost of the torch path"): a call of torch.ops.cupyconv.conv2d
# costs ~150 us of torch's custom-op machinery before the op's own code runs (the dispatcher's Python kernels,
# autograd's generated Function, the dynamo guard around the implementation, the aliasing check), more than the
# whole plain cupyconv call.  On plain CUDA tensors in plain eager mode nothing of it does anything, so `call`
# runs the implementation directly, inside an autograd.Function with the op's own formula where a gradient will
# be needed.  Anything else -- torch.compile, export and jit tracing, a dispatch or torch-function mode (fake
# tensors, make_fx, functionalization), functorch transforms, autocast, the profiler, a tensor subclass, a
# non-CUDA tensor, an op without an eager Function that needs a gradient -- goes through the custom op as before.

#: {op name: a torch.autograd.Function whose forward is BODIES[name] and whose formula is the op's}, registered by
#: cupyconv.torch.autograd for the ops whose formulas it defines.
EAGER_FUNCTIONS: dict = {}
_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
_C = torch._C
_any_autocast = getattr(_C, "_is_any_autocast_enabled", None)
# The mode queries `_plain_eager` asks, looked up once: private torch functions (those torch's own Python calls), so
# a torch release without one of them keeps every call on the custom op instead of failing it.
_MODE_QUERIES = tuple(getattr(owner, name, None) for owner, name in (
    (torch.compiler, "is_compiling"), (_C, "_is_tracing"), (_C, "_len_torch_dispatch_stack"),
    (_C, "_is_torch_function_mode_enabled"), (_C, "_are_functorch_transforms_active"),
    (getattr(_C, "_autograd", None), "_profiler_enabled")))
_EAGER_AVAILABLE = all(q is not None for q in _MODE_QUERIES)


def _plain_eager(tensors) -> bool:
    """Whether torch's dispatcher would do nothing for a call on these tensors but run the op's implementation."""
    if not _EAGER_AVAILABLE:
        return False
    if torch.compiler.is_compiling():   # first: dynamo reads it as True and never traces the private queries below
        return False
    if (_C._is_tracing() or _C._len_torch_dispatch_stack() or _C._is_torch_function_mode_enabled()
            or _C._are_functorch_transforms_active() or _C._autograd._profiler_enabled()
            or (_any_autocast() if _any_autocast is not None else torch.is_autocast_enabled())):
        return False
    for t in tensors:   # (after the modes: a torch-function mode would see the .device read)
        if type(t) not in _PLAIN_TENSORS or t.device.type != cuda.DEVICE_TYPE:
            return False
    return True


def call(name: str, *args):
    """torch.ops.cupyconv.<name>(*args), with torch's dispatcher skipped where it would only cost time (above)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if _plain_eager(tensors):
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
            return BODIES[name](*args)
        function = EAGER_FUNCTIONS.get(name)
        if function is not None:
            return function.apply(*args)
    return getattr(torch.ops.cupyconv, name)(*args)
