"""Patch convolution: the same filters over many tiny patches x (..., C, H, W) -> (..., D, oH, oW).

Padding is applied inside each patch; nothing is read across patches.  On the CPU this is conv2d over the
flattened leading dims (each patch is its own image).
"""
from __future__ import annotations

from .._arrays import Call
from .._spec import ConvSpec
from .conv import NEEDS, check_grad_output, check_needs, conv2d_backward_cpu, conv2d_cpu


def instantiations():
    return []


def patch_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Convolve every patch of x (..., C, H, W) with weight (D, C // groups, kH, kW): (..., D, oH, oW)."""
    call = Call("patch_conv2d", x=x, weight=weight, bias=bias)
    spec = ConvSpec.for_conv("patch_conv2d", call.x, call.weight, call.bias, stride, padding, dilation, groups,
                             min_ndim=3, max_ndim=None)
    if call.device is not None:
        raise NotImplementedError("patch_conv2d: no GPU kernel yet; pass NumPy arrays or CPU tensors")
    return call.wrap(conv2d_cpu(call.x, call.weight, call.bias, spec))


def patch_conv2d_backward(grad_output, x, weight, *, stride=1, padding=0, dilation=1, groups=1, needs=NEEDS):
    """Gradients of patch_conv2d: (grad_x, grad_weight, grad_bias), None unless named in `needs`."""
    op = "patch_conv2d_backward"
    call = Call(op, grad_output=grad_output, x=x, weight=weight)
    spec = ConvSpec.for_conv(op, call.x, call.weight, None, stride, padding, dilation, groups,
                             min_ndim=3, max_ndim=None)
    check_grad_output(op, call.grad_output, spec)
    needs = check_needs(op, needs)
    if call.device is not None:
        raise NotImplementedError("patch_conv2d_backward: no GPU kernel yet; pass NumPy arrays or CPU tensors")
    return call.wrap(conv2d_backward_cpu(call.grad_output, call.x, call.weight, spec, needs))
