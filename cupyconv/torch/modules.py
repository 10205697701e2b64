"""Layers that are torch's layers: each subclasses the matching `torch.nn` convolution and overrides only the
computation, so `isinstance(layer, torch.nn.Conv2d)`, `torch.nn.utils.fusion.fuse_conv_bn_eval`, `state_dict`,
`repr`, initialisation (the same random draws) and torch's `padding_mode` handling are torch's own.

What cupyconv adds to torch's constructor: padding per side (one (low, high) pair per spatial dim) and 'same'
for strided convolutions (torch's constructor rejects both, so it is given padding 0 and the layer stores its
own afterwards; `_reversed_padding_repeated_twice`, used only by torch's own computation, then stays zero), and
the keywords `algorithm` and `workspace_limit`, stored as attributes of the same names (set them on a layer to
change them), shown by `repr` when not the default.

`torch.jit.script` is refused with a clear error: TorchScript cannot call cupyconv's Python.  `torch.compile`,
`torch.export` and `torch.jit.trace` record the `torch.ops.cupyconv.*` custom ops; `torch.export` with a
`torch.export.Dim` on the batch and every spatial dim gives a program valid at other sizes (but for 'same'
padding with a stride, whose padding depends on the size: those sizes are specialised).

`torch.fx.symbolic_trace` records each layer as one `call_module` node, as torch.nn's layers (see `_FX_LEAF`),
so FX passes that look for convolution modules by `isinstance` find them.  Passes that match exact types, such
as `torch.fx.experimental.optimization.fuse` (conv + batch norm), leave our layers unfused:
`torch.nn.utils.fusion.fuse_conv_bn_eval` takes them directly, or run `convert(fuse(unconvert(model)))`.

`convert(model)` swaps a model's torch convolution layers for these, `unconvert(model)` swaps them back.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.conv import _ConvNd, _ConvTransposeNd

from .._spec import ConvSpec, _tuple, check_algorithm, check_workspace_limit
from ..ops.conv import ALGORITHMS
from ..ops.patch import ALGORITHMS as PATCH_ALGORITHMS
from . import functional

__all__ = ["Conv1d", "Conv2d", "Conv3d", "DepthwiseConv2d", "PatchConv2d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d", "DepthwiseSeparableConv2d", "convert", "unconvert"]

#: The keywords cupyconv's layers add to torch's, with their defaults (repr shows them when not the default).
_OPTIONS = (("algorithm", "auto"), ("workspace_limit", None))


# The layers' computation goes through two module-level functions that torch.fx records as calls (torch.fx.wrap)
# where a tracer traces through a layer (the default Tracer does not: the layers are leaves, see `_FX_LEAF`): the
# functional ops read shapes in Python (unbatched inputs, memory formats, 'same' padding), which a symbolic trace
# cannot follow.  Their arguments are tensors and plain values (the op's name, not the function), which is what an
# FX graph can hold.


def _layer_op(name: str, *args: Any, **kwargs: Any) -> Tensor:
    """cupyconv.torch.functional.<name>(*args, **kwargs)."""
    return getattr(functional, name)(*args, **kwargs)


def _layer_pad(input: Tensor, padding: Any, kernel_size: tuple, stride: tuple, dilation: tuple,
               padding_mode: str) -> Tensor:
    """input padded by `F.pad` in padding_mode with a layer's padding (for planes of input's size).  F.pad takes
    one batch dim or none: patches with more leading dims are padded as one batch (the input itself otherwise,
    so its memory format is kept)."""
    nd = len(kernel_size)
    sizes = functional.sizes_for_checks(input.shape[-nd:], padding, stride)     # no specialisation in a trace
    sides = _padding_sides("padding_mode", sizes, padding, kernel_size, stride, dilation)
    pad = [p for side in reversed(sides) for p in side]
    if input.dim() <= nd + 2:
        return F.pad(input, pad, mode=padding_mode)
    padded = F.pad(input.flatten(0, -nd - 2), pad, mode=padding_mode)
    return padded.reshape(*input.shape[:-nd], *padded.shape[-nd:])


def _padding_sides(op: str, in_size, padding, kernel_size, stride, dilation) -> tuple:
    """A layer's padding as one (low, high) pair per spatial dim for planes of size in_size."""
    return ConvSpec.geometry(op, (), 1, 1, 1, tuple(in_size), kernel_size, stride, padding, dilation).padding


torch.fx.wrap("_layer_op")
torch.fx.wrap("_layer_pad")

#: Each layer's instance attribute `__module__` (its class keeps "cupyconv.torch.modules", which pickling and
#: repr read).  torch.fx's default Tracer records a module as a leaf, one `call_module` node, when
#: `module.__module__` starts with "torch.nn" (`Tracer.is_leaf_module`, read from the instance), so plain
#: `torch.fx.symbolic_trace` records our layers as it records torch.nn's, and FX passes that look for convolution
#: modules find them.  The character after "torch.nn" is not a dot, so torch.compile, which treats instances
#: whose `__module__` starts with "torch.nn." as torch's own layers (fewer guards), still treats ours as user code
#: (a changed `algorithm` recompiles).
_FX_LEAF = "torch.nn:cupyconv.torch.modules"


class _Layer(_ConvNd):
    """What every cupyconv layer adds to the torch class after it in the MRO (a `_ConvNd` subclass: deriving
    from `_ConvNd` too types the attributes torch's constructor sets)."""

    _algorithms: tuple = ALGORITHMS

    def _torch_init(self, **arguments: Any) -> None:
        """torch's constructor, with its ValueErrors naming this layer and showing its channels and groups."""
        try:
            super().__init__(**arguments)
        except ValueError as error:
            shown = ", ".join(f"{name}={arguments[name]!r}" for name in ("in_channels", "out_channels", "groups"))
            raise ValueError(f"{type(self).__name__}: {error} ({shown})") from None

    def _set_options(self, algorithm: str, workspace_limit: Optional[int]) -> None:
        """Check and store the keywords `_OPTIONS`; mark the layer a leaf for torch.fx (`_FX_LEAF`)."""
        check_algorithm(type(self).__name__, algorithm, self._algorithms)
        check_workspace_limit(type(self).__name__, workspace_limit)
        self.algorithm, self.workspace_limit = algorithm, workspace_limit
        self.__module__ = _FX_LEAF

    def extra_repr(self) -> str:
        text = super().extra_repr()
        for name, default in _OPTIONS:
            value = getattr(self, name, default)
            if value != default:
                text += f", {name}={value!r}"
        return text

    def __prepare_scriptable__(self):
        raise TypeError(f"cupyconv.torch.{type(self).__name__} cannot be compiled by torch.jit.script (TorchScript "
                        f"cannot call cupyconv's Python); use torch.compile, torch.export or torch.jit.trace, or "
                        f"load its state_dict into torch.nn.{type(self).__bases__[-1].__name__}")


def _extends_torch(padding) -> bool:
    """Whether padding is one of cupyconv's forms that torch's constructor rejects or misreads: a string
    ('same' with a stride; the layer checks every string itself) or per side."""
    return isinstance(padding, str) or (isinstance(padding, (tuple, list))
                                        and any(isinstance(side, (tuple, list)) for side in padding))


class _Convolution(_Layer):
    """The computation of the convolution layers: padding_mode by `F.pad` as torch does, then the functional
    op named `_op` (conv1d, conv2d, conv3d or patch_conv2d) with this layer's options."""

    _op = "conv2d"

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None, *,
                 algorithm: str = "auto", workspace_limit: Optional[int] = None) -> None:
        ours = _extends_torch(padding)
        self._torch_init(in_channels=in_channels, out_channels=out_channels, kernel_size=kernel_size, stride=stride,
                         padding=0 if ours else padding, dilation=dilation, groups=groups, bias=bias,
                         padding_mode=padding_mode, device=device, dtype=dtype)
        if ours:        # torch's attribute, with a form torch's own type does not cover
            extension: Any = padding if isinstance(padding, str) else tuple(tuple(side) for side in padding)
            self.padding = extension
        window = tuple(d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilation))
        # Check the padding now, on the smallest input the window accepts.
        _padding_sides(type(self).__name__, window, self.padding, self.kernel_size, self.stride, self.dilation)
        self._set_options(algorithm, workspace_limit)

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        padding: Any = self.padding
        if self.padding_mode != "zeros":
            input, padding = _layer_pad(input, padding, self.kernel_size, self.stride, self.dilation,
                                        self.padding_mode), 0
        return self._convolve(input, weight, bias, padding)

    def _convolve(self, input: Tensor, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
        return _layer_op(self._op, input, weight, bias, self.stride, padding, self.dilation, self.groups,
                                algorithm=self.algorithm, workspace_limit=self.workspace_limit)


_CONV_DOC = """`torch.nn.Conv{nd}d` computed by cupyconv: a subclass with the same constructor, parameters,
    initialisation, state_dict and repr.

    Input {layout} or unbatched; output (N, D, {out}) or unbatched, in channels-last memory format when the
    input or weight is (see `cupyconv.torch.functional`).

    Parameters
    ----------
    in_channels, out_channels, kernel_size, stride, dilation, groups, bias, padding_mode, device, dtype
        As `torch.nn.Conv{nd}d`; padding_mode 'reflect', 'replicate' or 'circular' pads with
        `torch.nn.functional.pad` first, as torch does.
    padding : int, tuple of {nd} ints, tuple of {nd} (low, high) pairs, 'valid' or 'same'
        torch's forms, per side, and 'same' for any stride (output = ceil(in / stride)).
    algorithm : str, keyword only
        The GPU kernels, forward and backward: 'auto', 'im2col_gemm', 'direct' or 'implicit_gemm'.
    workspace_limit : int, optional, keyword only
        Bytes of im2col workspace (None: `cupyconv.settings.workspace_limit`).
    """


class Conv1d(_Convolution, nn.Conv1d):
    __doc__ = _CONV_DOC.format(nd=1, layout="(N, C, L)", out="oL")
    _op = "conv1d"


class Conv2d(_Convolution, nn.Conv2d):
    __doc__ = _CONV_DOC.format(nd=2, layout="(N, C, H, W)", out="oH, oW")


class Conv3d(_Convolution, nn.Conv3d):
    __doc__ = _CONV_DOC.format(nd=3, layout="(N, C, D, H, W)", out="oD, oH, oW")
    _op = "conv3d"


class PatchConv2d(_Convolution, nn.Conv2d):
    """`torch.nn.Conv2d` applied to every patch of input (..., C, H, W) -> (..., D, oH, oW).

    Each patch is its own image: padding (and padding_mode) is applied inside every patch, so
    `PatchConv2d(...)(x)` equals `nn.Conv2d(...)(x.reshape(-1, C, H, W))` reshaped back, with the same weights.
    A subclass of `torch.nn.Conv2d` with its constructor, parameters, initialisation, state_dict and repr.

    Parameters
    ----------
    in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode, device, dtype
        As `Conv2d`.
    algorithm : str, keyword only
        'auto', 'fused', 'im2col_gemm' or 'implicit_gemm' (see `cupyconv.patch_conv2d`).
    workspace_limit : int, optional, keyword only
        As `Conv2d`.
    """

    _op = "patch_conv2d"
    _algorithms = PATCH_ALGORITHMS


class DepthwiseConv2d(_Convolution, nn.Conv2d):
    """Depthwise convolution layer: `torch.nn.Conv2d(in_channels, out_channels, kernel_size, ...,
    groups=in_channels)`, a subclass of it, computed by cupyconv's depthwise kernels.

    Parameters
    ----------
    in_channels : int
        C, at least 1.
    out_channels : int
        C * m for a channel multiplier m >= 1; weight is (C * m, 1, kH, kW) as in the torch layer.
    kernel_size, stride, padding, dilation, bias, padding_mode, device, dtype
        As `Conv2d`.
    groups : int, optional
        May be left out; if given it must equal in_channels.

    The depthwise kernels have one algorithm and no workspace, so there is no `algorithm` or `workspace_limit`
    keyword (the attributes stay 'auto' and None).
    """

    _algorithms = ("auto",)

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: Optional[int] = None, bias: bool = True, padding_mode: str = "zeros", device=None,
                 dtype=None) -> None:
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f"DepthwiseConv2d: in_channels must be a positive int, got {in_channels!r}")
        if groups is not None and groups != in_channels:
            raise ValueError(f"DepthwiseConv2d: groups must equal in_channels={in_channels}, got {groups}")
        if not isinstance(out_channels, int) or out_channels < 1 or out_channels % in_channels:
            raise ValueError(f"DepthwiseConv2d: out_channels={out_channels!r} must be a positive multiple of "
                             f"in_channels={in_channels}")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, in_channels, bias,
                         padding_mode, device, dtype)

    def _convolve(self, input: Tensor, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
        return _layer_op("depthwise_conv2d", input, weight, bias, self.stride, padding, self.dilation)


class _TransposedConvolution(_Layer, _ConvTransposeNd):
    """The computation of the transposed convolution layers: torch's `_output_padding` (for output_size), then
    the functional op named `_op`.  padding takes torch's forms only (padding_mode 'zeros' only, as torch)."""

    _op: str
    padding: tuple[int, ...]            # torch's forms only (checked by the constructor)

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None,
                 dtype=None, *, algorithm: str = "auto", workspace_limit: Optional[int] = None) -> None:
        self._torch_init(in_channels=in_channels, out_channels=out_channels, kernel_size=kernel_size, stride=stride,
                         padding=padding, output_padding=output_padding, groups=groups, bias=bias,
                         dilation=dilation, padding_mode=padding_mode, device=device, dtype=dtype)
        _tuple(type(self).__name__, "padding", padding, 0, len(self.kernel_size))
        self._set_options(algorithm, workspace_limit)

    def forward(self, input: Tensor, output_size: Optional[list[int]] = None) -> Tensor:
        """The transposed convolution of input (N, C_in, ...) or unbatched; output_size (the spatial sizes, with
        or without the leading dims) picks the output_padding, as in torch."""
        nd = len(self.kernel_size)
        output_padding = self._output_padding(input, output_size, list(self.stride), list(self.padding),
                                              list(self.kernel_size), nd, list(self.dilation))
        return _layer_op(self._op, input, self.weight, self.bias, self.stride, self.padding, output_padding,
                                self.groups, self.dilation, algorithm=self.algorithm,
                                workspace_limit=self.workspace_limit)


_TRANSPOSE_DOC = """`torch.nn.ConvTranspose{nd}d` computed by cupyconv: a subclass with the same constructor,
    parameters, initialisation, state_dict and repr; `forward(input, output_size=None)` as torch's.

    Input {layout} or unbatched; output in channels-last memory format when the input or weight is.

    Parameters
    ----------
    in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, bias, dilation, padding_mode
        As `torch.nn.ConvTranspose{nd}d` (padding an int or {nd} ints; padding_mode 'zeros').  Per-side padding
        is available from `cupyconv.torch.functional.conv_transpose{nd}d`.
    device, dtype
        Of the parameters, as torch's.
    algorithm : str, keyword only
        The GPU kernels of the convolution this transposes, forward and backward: 'auto', 'im2col_gemm', 'direct'
        or 'implicit_gemm' (see `cupyconv.conv_transpose{nd}d`).
    workspace_limit : int, optional, keyword only
        Bytes of workspace (None: `cupyconv.settings.workspace_limit`).
    """


class ConvTranspose1d(_TransposedConvolution, nn.ConvTranspose1d):
    __doc__ = _TRANSPOSE_DOC.format(nd=1, layout="(N, C_in, L)")
    _op = "conv_transpose1d"


class ConvTranspose2d(_TransposedConvolution, nn.ConvTranspose2d):
    __doc__ = _TRANSPOSE_DOC.format(nd=2, layout="(N, C_in, H, W)")
    _op = "conv_transpose2d"


class ConvTranspose3d(_TransposedConvolution, nn.ConvTranspose3d):
    __doc__ = _TRANSPOSE_DOC.format(nd=3, layout="(N, C_in, D, H, W)")
    _op = "conv_transpose3d"


class DepthwiseSeparableConv2d(nn.Module):
    """A depthwise convolution followed by a 1x1 pointwise convolution (no activation between them).

    Submodules `depthwise` (a `DepthwiseConv2d`, weight (C * m, 1, kH, kW)) and `pointwise` (a `Conv2d`, weight
    (out_channels, C * m, 1, 1)) are `torch.nn.Conv2d`s: the state_dict keys are `depthwise.weight`,
    [`depthwise.bias`,] `pointwise.weight`, [`pointwise.bias`], and load into (or from) any torch module with
    `depthwise = nn.Conv2d(C, C * m, k, groups=C, ...)` and `pointwise = nn.Conv2d(C * m, out_channels, 1)`.
    Unbatched and channels-last inputs behave as in `Conv2d`.

    Parameters
    ----------
    in_channels, out_channels : int
        Channels of the input and of the output.
    kernel_size, stride, padding, dilation, padding_mode
        Of the depthwise convolution (as `Conv2d`).
    bias : bool
        Whether the pointwise convolution has a bias (default True).
    depth_multiplier : int
        m, the depthwise convolution's output channels per input channel (default 1).
    depthwise_bias : bool
        Whether the depthwise convolution has a bias too (default False: followed directly by a linear pointwise
        convolution, its bias would only shift the pointwise bias).
    device, dtype
        Of the parameters.
    algorithm : str, keyword only
        The pointwise convolution's (as `Conv2d`; the depthwise kernels have one algorithm).
    workspace_limit : int, optional, keyword only
        The pointwise convolution's (as `Conv2d`).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 bias: bool = True, padding_mode: str = "zeros", depth_multiplier: int = 1,
                 depthwise_bias: bool = False, device=None, dtype=None, *, algorithm: str = "auto",
                 workspace_limit: Optional[int] = None) -> None:
        super().__init__()
        if isinstance(depth_multiplier, bool) or not isinstance(depth_multiplier, int) or depth_multiplier < 1:
            raise ValueError(f"DepthwiseSeparableConv2d: depth_multiplier must be a positive int, "
                             f"got {depth_multiplier!r}")
        middle = in_channels * depth_multiplier
        self.depthwise = DepthwiseConv2d(in_channels, middle, kernel_size, stride, padding, dilation,
                                         bias=depthwise_bias, padding_mode=padding_mode, device=device,
                                         dtype=dtype)
        self.pointwise = Conv2d(middle, out_channels, 1, bias=bias, device=device, dtype=dtype,
                                algorithm=algorithm, workspace_limit=workspace_limit)

    def forward(self, input: Tensor) -> Tensor:
        return self.pointwise(self.depthwise(input))


# ---------------------------------------------------------------------------------------------------------
# Swapping torch's layers for ours in a model, and back

#: torch's convolution layers and ours, one to one (exact types: a subclass of torch's is someone else's layer).
_TORCH_TO_OURS: dict[type[nn.Module], type[_Layer]] = {nn.Conv1d: Conv1d, nn.Conv2d: Conv2d, nn.Conv3d: Conv3d,
                                    nn.ConvTranspose1d: ConvTranspose1d, nn.ConvTranspose2d: ConvTranspose2d,
                                    nn.ConvTranspose3d: ConvTranspose3d}
_OURS_TO_TORCH: dict[type[nn.Module], type[nn.Module]] = {**{ours: theirs for theirs, ours in _TORCH_TO_OURS.items()},
                                    DepthwiseConv2d: nn.Conv2d}


def _recast(layer: nn.Module, cls: type[nn.Module]) -> nn.Module:
    """A layer of class cls with layer's state: the same parameters and buffers (the same tensor objects, so an
    optimizer holding them keeps working), hooks, training flag and attributes; the dicts that hold them are
    copied, so the two layers do not share later changes."""
    new: nn.Module = object.__new__(cls)       # no __init__: the state comes from layer
    new.__dict__.update({name: value.copy() if isinstance(value, dict) else value
                         for name, value in layer.__dict__.items()})
    return new


def _swap_tree(module: nn.Module, swap) -> nn.Module:
    """module with every submodule m (itself included) for which swap(m) is not None replaced by it, children
    in place; a submodule reached twice (shared) is replaced by one new layer."""
    done: dict[int, nn.Module] = {}

    def visit(m: nn.Module) -> nn.Module:
        if id(m) not in done:
            replaced = swap(m)
            done[id(m)] = replaced if replaced is not None else m
            for name, child in list(done[id(m)]._modules.items()):
                if child is not None:
                    done[id(m)]._modules[name] = visit(child)
        return done[id(m)]

    return visit(module)


def convert(module: nn.Module, *, algorithm: str = "auto", workspace_limit: Optional[int] = None) -> nn.Module:
    """The model with every `torch.nn.Conv1d/2d/3d` and `torch.nn.ConvTranspose1d/2d/3d` replaced by cupyconv's
    layer of the same name, as `torch.nn.SyncBatchNorm.convert_sync_batchnorm` does for batch norms.

    Each new layer keeps the old one's parameters and buffers (the same tensors: an optimizer built before the
    call keeps updating them), hooks, training flag, padding, padding_mode, device and dtype, so the
    state_dict and the outputs are unchanged.  Children are replaced in place; the returned module is `module`
    itself unless it is a convolution.  Only those exact types are converted: subclasses (cupyconv's layers,
    parametrized or quantization-aware layers) are left as they are.

    Parameters
    ----------
    module : torch.nn.Module
        The model (or a single layer).
    algorithm : str
        The `algorithm` of every new layer (see `Conv2d`).
    workspace_limit : int, optional
        The `workspace_limit` of every new layer (None: `cupyconv.settings.workspace_limit`).

    Returns
    -------
    torch.nn.Module
        The converted model.  `unconvert` gives torch's layers back.
    """
    check_algorithm("convert", algorithm, ALGORITHMS)
    check_workspace_limit("convert", workspace_limit)

    def swap(m: nn.Module) -> Optional[nn.Module]:
        cls = _TORCH_TO_OURS.get(type(m))
        if cls is None:
            return None
        new = _recast(m, cls)
        new._set_options(algorithm, workspace_limit)
        return new

    return _swap_tree(module, swap)


def unconvert(module: nn.Module) -> nn.Module:
    """The inverse of `convert`: every cupyconv `Conv1d/2d/3d`, `ConvTranspose1d/2d/3d` and `DepthwiseConv2d`
    replaced by the torch layer it subclasses (a `DepthwiseConv2d` by `torch.nn.Conv2d` with groups =
    in_channels), state kept as by `convert`.  `PatchConv2d` (which torch's layer cannot replace: it takes any
    leading dims) is left as it is.

    Parameters
    ----------
    module : torch.nn.Module
        The model (or a single layer).

    Returns
    -------
    torch.nn.Module
        The model with torch's layers.

    Raises
    ------
    ValueError
        A layer uses padding that torch's layer cannot express (per side, or 'same' with a stride); the message
        names it.
    """
    def swap(m: nn.Module) -> Optional[nn.Module]:
        cls = _OURS_TO_TORCH.get(type(m))
        if cls is None:
            return None
        padding = m.padding
        if _extends_torch(padding) and not (padding == "valid" or (padding == "same" and set(m.stride) == {1})):
            raise ValueError(f"unconvert: {type(m).__name__} has padding={padding!r} with stride={m.stride}, "
                             f"which torch.nn.{cls.__name__} cannot express")
        new = _recast(m, cls)
        for name in (*dict(_OPTIONS), "__module__"):
            new.__dict__.pop(name, None)
        # What torch's own computation pads with for padding_mode != 'zeros' (our constructor gave torch's 0 for a
        # string): torch's rule, the odd pixel of 'same' at the high end.
        if padding == "same":
            sides = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(m.kernel_size, m.dilation)]
        else:
            sides = [(p, p) for p in ((0,) * len(m.kernel_size) if padding == "valid" else padding)]
        new._reversed_padding_repeated_twice = [p for side in reversed(sides) for p in side]
        return new

    return _swap_tree(module, swap)
