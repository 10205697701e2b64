"""The convolutions over 1 or 3 spatial dims (and `conv_nd` over 1, 2 or 3): conv, depthwise and patch.

Each is its 2-D op run through ops/lift.py: 1-D with a unit height, 3-D folded by its depth taps into a 2-D
problem (the module docstring there has the algebra and what it costs).  Arguments, semantics and errors are
the 2-D op's, with one entry per spatial dim: padding an int, one int per dim, one (low, high) pair per dim,
'same' or 'valid'; stride, dilation an int or one int per dim.
"""
from __future__ import annotations

from .._arrays import Call
from .._spec import NEEDS, ConvSpec, check_algorithm, check_grad_output, check_needs, weight_spatial_dims
from . import lift
from .conv import ALGORITHMS, conv2d_backward_run, conv2d_run, workspace_scope
from .depthwise import depthwise_conv2d_backward_run, depthwise_conv2d_run
from .patch import ALGORITHMS as PATCH_ALGORITHMS, patch_conv2d_backward_run, patch_conv2d_run


def _conv(op, nd, x, weight, bias, stride, padding, dilation, groups, algorithm, workspace_limit):
    call = Call(op, x=x, weight=weight, bias=bias)
    nd = nd or weight_spatial_dims(op, call.weight.shape)
    spec = ConvSpec.for_conv(op, call.x, call.weight, call.bias, stride, padding, dilation, groups, nd=nd)
    check_algorithm(op, algorithm, ALGORITHMS)
    with workspace_scope(workspace_limit):
        return call.wrap(lift.forward(conv2d_run, call.device, call.x, call.weight, call.bias, spec, algorithm))


def _conv_backward(op, nd, grad_output, x, weight, stride, padding, dilation, groups, needs, algorithm,
                   workspace_limit):
    call = Call(op, grad_output=grad_output, x=x, weight=weight)
    nd = nd or weight_spatial_dims(op, call.weight.shape)
    spec = ConvSpec.for_conv(op, call.x, call.weight, None, stride, padding, dilation, groups, nd=nd)
    check_grad_output(op, call.grad_output, spec)
    needs = check_needs(op, needs)
    check_algorithm(op, algorithm, ALGORITHMS)
    with workspace_scope(workspace_limit):
        return call.wrap(lift.backward(conv2d_backward_run, call.device, call.grad_output, call.x, call.weight, spec,
                                       needs, algorithm))


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, algorithm="auto",
           workspace_limit=None):
    """1-D convolution (cross-correlation, like torch.nn.functional.conv1d) of x (N, C, L) with weight
    (D, C // groups, k): (N, D, oL).  Runs conv2d's kernels over a unit height; arguments as `conv2d`."""
    return _conv("conv1d", 1, x, weight, bias, stride, padding, dilation, groups, algorithm, workspace_limit)


def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, algorithm="auto",
           workspace_limit=None):
    """3-D convolution (like torch.nn.functional.conv3d) of x (N, C, D, H, W) with weight
    (O, C // groups, kD, kH, kW): (N, O, oD, oH, oW).  Runs conv2d's kernels on the depth windows of x, in
    chunks of the batch within the workspace limit; arguments as `conv2d`."""
    return _conv("conv3d", 3, x, weight, bias, stride, padding, dilation, groups, algorithm, workspace_limit)


def conv_nd(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, algorithm="auto",
            workspace_limit=None):
    """`conv1d`, `conv2d` or `conv3d`, by the number of spatial dims of weight (weight.ndim - 2)."""
    return _conv("conv_nd", None, x, weight, bias, stride, padding, dilation, groups, algorithm, workspace_limit)


def conv1d_backward(grad_output, x, weight, *, stride=1, padding=0, dilation=1, groups=1, needs=NEEDS,
                    algorithm="auto", workspace_limit=None):
    """Gradients of conv1d: (grad_x, grad_weight, grad_bias), each None unless named in `needs`."""
    return _conv_backward("conv1d_backward", 1, grad_output, x, weight, stride, padding, dilation, groups, needs,
                          algorithm, workspace_limit)


def conv3d_backward(grad_output, x, weight, *, stride=1, padding=0, dilation=1, groups=1, needs=NEEDS,
                    algorithm="auto", workspace_limit=None):
    """Gradients of conv3d: (grad_x, grad_weight, grad_bias), each None unless named in `needs`.  With several
    workspace chunks, grad_weight and grad_bias are summed over the chunks in order (in float32 for 16-bit)."""
    return _conv_backward("conv3d_backward", 3, grad_output, x, weight, stride, padding, dilation, groups, needs,
                          algorithm, workspace_limit)


def conv_nd_backward(grad_output, x, weight, *, stride=1, padding=0, dilation=1, groups=1, needs=NEEDS,
                     algorithm="auto", workspace_limit=None):
    """Gradients of conv_nd.  The values of x are not read unless needs has "weight", nor those of weight
    unless it has "input"."""
    return _conv_backward("conv_nd_backward", None, grad_output, x, weight, stride, padding, dilation, groups,
                          needs, algorithm, workspace_limit)


# ---------------------------------------------------------------------------------------------------------
# Depthwise: 1-D on the depthwise kernels; 3-D folds into a grouped 2-D conv (kD channels per group)


def _depthwise_runners(nd: int):
    if nd == 3:
        return conv2d_run, conv2d_backward_run
    return depthwise_conv2d_run, depthwise_conv2d_backward_run


def _depthwise(op, nd, x, weight, bias, stride, padding, dilation):
    call = Call(op, x=x, weight=weight, bias=bias)
    spec = ConvSpec.for_depthwise(op, call.x, call.weight, call.bias, stride, padding, dilation, nd=nd)
    run, _ = _depthwise_runners(nd)
    return call.wrap(lift.forward(run, call.device, call.x, call.weight, call.bias, spec))


def _depthwise_backward(op, nd, grad_output, x, weight, stride, padding, dilation, needs):
    call = Call(op, grad_output=grad_output, x=x, weight=weight)
    spec = ConvSpec.for_depthwise(op, call.x, call.weight, None, stride, padding, dilation, nd=nd)
    check_grad_output(op, call.grad_output, spec)
    _, run = _depthwise_runners(nd)
    return call.wrap(lift.backward(run, call.device, call.grad_output, call.x, call.weight, spec,
                                   check_needs(op, needs)))


def depthwise_conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1):
    """Depthwise convolution of x (N, C, L) with weight (C * m, 1, k); channels as `depthwise_conv2d`."""
    return _depthwise("depthwise_conv1d", 1, x, weight, bias, stride, padding, dilation)


def depthwise_conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1):
    """Depthwise convolution of x (N, C, D, H, W) with weight (C * m, 1, kD, kH, kW)."""
    return _depthwise("depthwise_conv3d", 3, x, weight, bias, stride, padding, dilation)


def depthwise_conv1d_backward(grad_output, x, weight, *, stride=1, padding=0, dilation=1, needs=NEEDS):
    return _depthwise_backward("depthwise_conv1d_backward", 1, grad_output, x, weight, stride, padding, dilation,
                               needs)


def depthwise_conv3d_backward(grad_output, x, weight, *, stride=1, padding=0, dilation=1, needs=NEEDS):
    return _depthwise_backward("depthwise_conv3d_backward", 3, grad_output, x, weight, stride, padding, dilation,
                               needs)


# ---------------------------------------------------------------------------------------------------------
# Patch convolution over 1-D or 3-D patches: padding inside each patch, nothing read across patches


def _patch(op, nd, x, weight, bias, stride, padding, dilation, groups, algorithm):
    call = Call(op, x=x, weight=weight, bias=bias)
    spec = ConvSpec.for_conv(op, call.x, call.weight, call.bias, stride, padding, dilation, groups, nd=nd,
                             leading_dims=True)
    check_algorithm(op, algorithm, PATCH_ALGORITHMS)
    return call.wrap(lift.forward(patch_conv2d_run, call.device, call.x, call.weight, call.bias, spec, algorithm))


def _patch_backward(op, nd, grad_output, x, weight, stride, padding, dilation, groups, needs, algorithm):
    call = Call(op, grad_output=grad_output, x=x, weight=weight)
    spec = ConvSpec.for_conv(op, call.x, call.weight, None, stride, padding, dilation, groups, nd=nd,
                             leading_dims=True)
    check_grad_output(op, call.grad_output, spec)
    needs = check_needs(op, needs)
    check_algorithm(op, algorithm, PATCH_ALGORITHMS)
    return call.wrap(lift.backward(patch_conv2d_backward_run, call.device, call.grad_output, call.x, call.weight,
                                   spec, needs, algorithm))


def patch_conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, algorithm="auto"):
    """Convolve every patch of x (..., C, L) with weight (D, C // groups, k): (..., D, oL)."""
    return _patch("patch_conv1d", 1, x, weight, bias, stride, padding, dilation, groups, algorithm)


def patch_conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, algorithm="auto"):
    """Convolve every patch of x (..., C, D, H, W) with weight (O, C // groups, kD, kH, kW): (..., O, oD, oH, oW)."""
    return _patch("patch_conv3d", 3, x, weight, bias, stride, padding, dilation, groups, algorithm)


def patch_conv1d_backward(grad_output, x, weight, *, stride=1, padding=0, dilation=1, groups=1, needs=NEEDS,
                          algorithm="auto"):
    return _patch_backward("patch_conv1d_backward", 1, grad_output, x, weight, stride, padding, dilation, groups,
                           needs, algorithm)


def patch_conv3d_backward(grad_output, x, weight, *, stride=1, padding=0, dilation=1, groups=1, needs=NEEDS,
                          algorithm="auto"):
    return _patch_backward("patch_conv3d_backward", 3, grad_output, x, weight, stride, padding, dilation, groups,
                           needs, algorithm)
