"""Depthwise convolution (groups = C, channel multiplier m), forward and backward.

CPU path: one vectorised multiply-add per kernel tap over the whole batch, no im2col matrix.
"""
from __future__ import annotations

import numpy

from .._arrays import Call, compute_dtype
from .._spec import ConvSpec
from .conv import NEEDS, check_grad_output, check_needs
from .unfold import pad_cpu


def _tap(padded, spec: ConvSpec, i: int, j: int):
    """The strided (n, C, oH, oW) view of a padded input read by kernel tap (i, j)."""
    (sh, sw), (dh, dw), (oh, ow) = spec.stride, spec.dilation, spec.out_size
    return padded[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]


def _multiplier(spec: ConvSpec) -> int:
    return spec.out_channels // spec.in_channels


def depthwise_cpu(x, weight, bias, spec: ConvSpec):
    ct = compute_dtype(x.dtype)
    n, c, m = x.shape[0], spec.in_channels, _multiplier(spec)
    padded = pad_cpu(x, spec, ct)
    w = weight.astype(ct, copy=False).reshape(c, m, *spec.kernel)
    out = numpy.zeros((n, c, m, *spec.out_size), dtype=ct)
    for i in range(spec.kernel[0]):
        for j in range(spec.kernel[1]):
            out += _tap(padded, spec, i, j)[:, :, None] * w[:, :, i, j, None, None]
    out = out.reshape(n, c * m, *spec.out_size)
    if bias is not None:
        out += bias.astype(ct, copy=False)[:, None, None]
    return out.astype(x.dtype, copy=False)


def depthwise_backward_cpu(grad_output, x, weight, spec: ConvSpec, needs: frozenset):
    ct = compute_dtype(x.dtype)
    n, c, m = x.shape[0], spec.in_channels, _multiplier(spec)
    (kh, kw), (oh, ow) = spec.kernel, spec.out_size
    gy = grad_output.astype(ct, copy=False).reshape(n, c, m, oh, ow)
    grad_x = grad_w = grad_b = None
    if "input" in needs:
        w = weight.astype(ct, copy=False).reshape(c, m, kh, kw)
        padded = numpy.zeros((n, c, *spec.padded_size), dtype=ct)
        for i in range(kh):
            for j in range(kw):
                _tap(padded, spec, i, j)[...] += numpy.einsum("ncmhw,cm->nchw", gy, w[:, :, i, j])
        (top, _), (left, _) = spec.padding
        h, wd = spec.in_size
        grad_x = padded[:, :, top:top + h, left:left + wd].astype(x.dtype)
    if "weight" in needs:
        padded = pad_cpu(x, spec, ct)
        grad_w = numpy.empty((c, m, kh, kw), dtype=ct)
        for i in range(kh):
            for j in range(kw):
                grad_w[:, :, i, j] = numpy.einsum("ncmhw,nchw->cm", gy, _tap(padded, spec, i, j))
        grad_w = grad_w.reshape(spec.weight_shape).astype(weight.dtype, copy=False)
    if "bias" in needs:
        grad_b = gy.sum(axis=(0, 3, 4)).reshape(c * m).astype(x.dtype, copy=False)
    return grad_x, grad_w, grad_b


# ---------------------------------------------------------------------------------------------------------
# Kernel path


def instantiations():
    return []


def depthwise_forward(call: Call, spec: ConvSpec):
    """Forward for a validated call (also reached from conv2d with groups = C)."""
    if call.device is not None:
        raise NotImplementedError(f"{call.op}: no GPU depthwise kernel yet; pass NumPy arrays or CPU tensors")
    return depthwise_cpu(call.x, call.weight, call.bias, spec)


def depthwise_backward(call: Call, spec: ConvSpec, needs: frozenset):
    if call.device is not None:
        raise NotImplementedError(f"{call.op}: no GPU depthwise kernel yet; pass NumPy arrays or CPU tensors")
    return depthwise_backward_cpu(call.grad_output, call.x, call.weight, spec, needs)


# ---------------------------------------------------------------------------------------------------------
# Public API


def depthwise_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1):
    """Depthwise convolution of x (N, C, H, W) with weight (C * m, 1, kH, kW): output channel c * m + k
    is input channel c convolved with filter c * m + k.  Returns (N, C * m, oH, oW)."""
    call = Call("depthwise_conv2d", x=x, weight=weight, bias=bias)
    spec = ConvSpec.for_depthwise("depthwise_conv2d", call.x, call.weight, call.bias, stride, padding, dilation)
    return call.wrap(depthwise_forward(call, spec))


def depthwise_conv2d_backward(grad_output, x, weight, *, stride=1, padding=0, dilation=1, needs=NEEDS):
    """Gradients of depthwise_conv2d: (grad_x, grad_weight, grad_bias), None unless named in `needs`."""
    op = "depthwise_conv2d_backward"
    call = Call(op, grad_output=grad_output, x=x, weight=weight)
    spec = ConvSpec.for_depthwise(op, call.x, call.weight, None, stride, padding, dilation)
    check_grad_output(op, call.grad_output, spec)
    return call.wrap(depthwise_backward(call, spec, check_needs(op, needs)))
