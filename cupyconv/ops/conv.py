"""conv2d with groups: im2col + GEMM, forward and backward.

CPU path: the im2col matrix of a chunk of the batch (chunked to the workspace limit) is multiplied by the
weight in one batched matmul over (sample, group); groups = C (depthwise) is routed to the depthwise op.
"""
from __future__ import annotations

import numpy

from .._arrays import Call, compute_dtype
from .._spec import ConvSpec
from .._workspace import batch_chunks
from .unfold import col2im_cpu, pad_cpu, windows_cpu

NEEDS = ("input", "weight", "bias")


def check_needs(op: str, needs) -> frozenset:
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


# ---------------------------------------------------------------------------------------------------------
# CPU path over a flat batch: x (n, C, H, W), weight (D, C // G, kH, kW)


def _columns(x, spec: ConvSpec, dtype):
    """im2col of x (n, C, H, W) as a contiguous (n, G, C // G * kH * kW, L) array."""
    n, g = x.shape[0], spec.groups
    win = windows_cpu(pad_cpu(x, spec, dtype), spec)
    return win.reshape(n, g, spec.channels_per_group * spec.taps, spec.out_pixels)


def _col_bytes(spec: ConvSpec, dtype) -> int:
    return spec.in_channels * spec.taps * spec.out_pixels * numpy.dtype(dtype).itemsize


def conv2d_cpu(x, weight, bias, spec: ConvSpec):
    ct = compute_dtype(x.dtype)
    n, g = spec.n, spec.groups
    x = x.reshape(n, *spec.input_shape[-3:])
    w = weight.reshape(g, spec.outputs_per_group, -1).astype(ct, copy=False)
    out = numpy.empty((n, g, spec.outputs_per_group, spec.out_pixels), dtype=ct)
    for chunk in batch_chunks(n, _col_bytes(spec, ct)):
        numpy.matmul(w, _columns(x[chunk], spec, ct), out=out[chunk])
    out = out.reshape(n, spec.out_channels, *spec.out_size)
    if bias is not None:
        out += bias.astype(ct, copy=False)[:, None, None]
    return out.astype(x.dtype, copy=False).reshape(spec.output_shape)


def conv2d_backward_cpu(grad_output, x, weight, spec: ConvSpec, needs: frozenset):
    ct = compute_dtype(x.dtype)
    n, g, dg = spec.n, spec.groups, spec.outputs_per_group
    gy = grad_output.reshape(n, g, dg, spec.out_pixels).astype(ct, copy=False)
    grad_x = grad_w = grad_b = None
    if "input" in needs:
        w = weight.reshape(g, dg, -1).astype(ct, copy=False)
        wt = numpy.ascontiguousarray(w.transpose(0, 2, 1))
        grad_x = numpy.empty((n, *spec.input_shape[-3:]), dtype=ct)
        for chunk in batch_chunks(n, _col_bytes(spec, ct)):
            cols = numpy.matmul(wt, gy[chunk])
            cols = cols.reshape(cols.shape[0], spec.in_channels, *spec.kernel, *spec.out_size)
            grad_x[chunk] = col2im_cpu(cols, spec, ct)
        grad_x = grad_x.astype(x.dtype, copy=False).reshape(spec.input_shape)
    if "weight" in needs:
        xf = x.reshape(n, *spec.input_shape[-3:])
        acc = numpy.zeros((g, dg, spec.channels_per_group * spec.taps), dtype=ct)
        for chunk in batch_chunks(n, _col_bytes(spec, ct)):
            cols = _columns(xf[chunk], spec, ct)
            acc += numpy.matmul(gy[chunk], cols.transpose(0, 1, 3, 2)).sum(axis=0)
        grad_w = acc.reshape(spec.weight_shape).astype(weight.dtype, copy=False)
    if "bias" in needs:
        grad_b = gy.sum(axis=(0, 3)).reshape(spec.out_channels).astype(x.dtype, copy=False)
    return grad_x, grad_w, grad_b


# ---------------------------------------------------------------------------------------------------------
# Kernel path


def instantiations():
    return []


def _routes_to_depthwise(spec: ConvSpec) -> bool:
    return spec.groups == spec.in_channels and spec.groups > 1


# ---------------------------------------------------------------------------------------------------------
# Public API


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution (cross-correlation, like torch) of x (N, C, H, W) with weight (D, C // groups, kH, kW).

    bias: (D,) or None.  padding: int, (pH, pW), ((top, bottom), (left, right)), 'valid' or 'same' (any
    stride: output = ceil(in / stride)).  Returns (N, D, oH, oW) of the caller's array kind.
    """
    call = Call("conv2d", x=x, weight=weight, bias=bias)
    spec = ConvSpec.for_conv("conv2d", call.x, call.weight, call.bias, stride, padding, dilation, groups)
    if _routes_to_depthwise(spec):
        from .depthwise import depthwise_forward
        return call.wrap(depthwise_forward(call, spec))
    if call.device is not None:
        raise NotImplementedError("conv2d: no GPU kernel yet; pass NumPy arrays or CPU tensors for the CPU path")
    return call.wrap(conv2d_cpu(call.x, call.weight, call.bias, spec))


def conv2d_backward(grad_output, x, weight, *, stride=1, padding=0, dilation=1, groups=1, needs=NEEDS):
    """Gradients of conv2d: (grad_x, grad_weight, grad_bias), each None unless named in `needs`."""
    call = Call("conv2d_backward", grad_output=grad_output, x=x, weight=weight)
    spec = ConvSpec.for_conv("conv2d_backward", call.x, call.weight, None, stride, padding, dilation, groups)
    check_grad_output("conv2d_backward", call.grad_output, spec)
    needs = check_needs("conv2d_backward", needs)
    if _routes_to_depthwise(spec):
        from .depthwise import depthwise_backward
        return call.wrap(depthwise_backward(call, spec, needs))
    if call.device is not None:
        raise NotImplementedError("conv2d_backward: no GPU kernel yet; pass NumPy arrays or CPU tensors")
    return call.wrap(conv2d_backward_cpu(call.grad_output, call.x, call.weight, spec, needs))
