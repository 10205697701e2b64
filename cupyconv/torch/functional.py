"""Functional API (torch signatures, cupyconv's padding forms): validate with `ConvSpec`, call the custom op."""
import torch

from .._spec import ConvSpec


def _flat_padding(spec: ConvSpec) -> list:
    (top, bottom), (left, right) = spec.padding
    return [top, bottom, left, right]


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
                             leading_dims=True)
    return torch.ops.cupyconv.patch_conv2d(input, weight, bias, list(spec.stride), _flat_padding(spec),
                                           list(spec.dilation), spec.groups)


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """Sliding blocks of input (..., C, H, W): (..., C * kH * kW, L), as `torch.nn.functional.unfold`."""
    spec = ConvSpec.for_unfold("unfold", input, kernel_size, dilation, padding, stride)
    return torch.ops.cupyconv.unfold(input, list(spec.kernel_size), list(spec.dilation), _flat_padding(spec),
                                     list(spec.stride))


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """Sum blocks input (..., C * kH * kW, L) back into (..., C, H, W), as `torch.nn.functional.fold`."""
    spec = ConvSpec.for_fold("fold", input, output_size, kernel_size, dilation, padding, stride)
    return torch.ops.cupyconv.fold(input, list(spec.in_size), list(spec.kernel_size), list(spec.dilation),
                                   _flat_padding(spec), list(spec.stride))
