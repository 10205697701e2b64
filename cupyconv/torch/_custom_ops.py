"""The custom ops `torch.ops.cupyconv.<op>`, their fake (meta) implementations and their autocast kernels.

Importing this module registers them.  Their autograd formulas are registered by `cupyconv.torch.autograd`.
"""
import torch

import cupyconv

from .cuda import _run


# ---------------------------------------------------------------------------------------------------------
# Geometry helpers (plain ints on the eager path, SymInts in fake implementations)


def _per_side(padding):
    """[top, bottom, left, right] -> ((top, bottom), (left, right)), the per-side form of cupyconv."""
    top, bottom, left, right = padding
    return ((top, bottom), (left, right))


def _out_size(in_size, kernel, stride, padding, dilation):
    """Output (oH, oW) of a window op; padding as [top, bottom, left, right]."""
    return tuple((n + lo + hi - d * (k - 1) - 1) // s + 1
                 for n, k, s, lo, hi, d in zip(in_size, kernel, stride, padding[0::2], padding[1::2], dilation))


def _empty(like):
    """The placeholder a backward op returns for a gradient it was not asked for."""
    return like.new_empty((0,))


def _names(needs) -> tuple:
    return tuple(name for name, need in zip(("input", "weight", "bias"), needs) if need)


def _fake_conv_backward(grad_output, x, weight, needs):
    return (x.new_empty(x.shape) if needs[0] else _empty(x),
            weight.new_empty(weight.shape) if needs[1] else _empty(x),
            weight.new_empty((weight.shape[0],)) if needs[2] else _empty(x))


def _fill_missing(grads, like):
    """The backward ops return three tensors: an empty one stands for a gradient not asked for."""
    return tuple(g if g is not None else _empty(like) for g in grads)


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
