"""`nn.Module` layers with `torch.nn.Conv2d`'s constructor arguments, parameters, initialisation and state_dict."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from .._spec import ConvSpec
from .functional import conv2d, depthwise_conv2d, patch_conv2d

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
