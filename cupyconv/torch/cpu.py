"""CPU tensors: torch's own CPU convolutions by default, cupyconv's NumPy path on request.

cupyconv's value is its GPU kernels.  On CPU tensors (tests, laptops, CPU inference of a model built with
cupyconv's layers) the custom ops `torch.ops.cupyconv.<conv>` and `<conv>_backward` compute with
`torch.ops.aten.convolution` and `convolution_backward`, torch's own CPU kernels (oneDNN), which are several times
faster than the NumPy path (im2col and one BLAS GEMM per chunk).  The semantics are cupyconv's: padding per side
(the asymmetric part padded explicitly, with zeros, or cropped from a transposed convolution's output), patches
with any leading dims (rolled into the batch), depthwise as groups = C.  The graph is unchanged:
`torch.compile`, `torch.export` and `torch.jit.trace` still record the cupyconv ops, and their autograd formulas
(gradients of any order) are the same; only the kernel behind a CPU op changes.  `workspace_limit` and
`algorithm` do not apply to torch's kernels.

`set_numpy_cpu_path(True)` (or ``with numpy_cpu_path(True):``) makes the CPU ops run cupyconv's NumPy path
instead, as before: the tests use it to keep that path covered, and it gives the NumPy path's numbers (float16 and
bfloat16 computed in float32) where they must agree bit for bit with `cupyconv.conv2d` on NumPy arrays.  CUDA
tensors always run cupyconv's kernels; unfold and fold always run cupyconv's code.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor

from .._docs import numpy_doc
from .._spec import ConvSpec
from ..ops.conv_transpose import _spec as transposed_spec
from ..settings import _Setting


def _strict_bool(value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"numpy_cpu_path: enabled must be True or False, got {value!r}")
    return value


_NUMPY_CPU_PATH = _Setting("numpy_cpu_path", False, _strict_bool)


@numpy_doc(returns=("bool", "The value in force here: that of the innermost ``with`` block of this thread or task, "
                            "else the global one."), raises=())
def get_numpy_cpu_path() -> bool:
    """Whether cupyconv.torch's convolutions on CPU tensors run cupyconv's NumPy path (True) or torch's own CPU
    convolutions (False, the default)."""
    return _NUMPY_CPU_PATH.get()


@numpy_doc(enabled=("bool", "True: cupyconv's NumPy path; False (the default): torch's CPU convolutions."),
           raises=(("TypeError", "enabled is not a bool."),))
def set_numpy_cpu_path(enabled: bool) -> None:
    """Choose what computes cupyconv.torch's convolutions on CPU tensors, for every later call in every thread
    (see `cupyconv.torch.cpu`).  CUDA tensors always run cupyconv's kernels."""
    _NUMPY_CPU_PATH.set(enabled)


@numpy_doc(returns=("context manager", "Sets the value for the calls made inside the ``with`` block, in this thread "
                                       "or asyncio task only, and restores the previous one on exit."),
           enabled=("bool", "Whether the CPU ops run cupyconv's NumPy path inside the block."),
           raises=(("TypeError", "enabled is not a bool."),))
def numpy_cpu_path(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """``with numpy_cpu_path(True):`` cupyconv's NumPy path for the CPU ops inside the block only."""
    return _NUMPY_CPU_PATH.scope(enabled)


def runs_on_torch(x: Tensor, weight: Tensor) -> bool:
    """Whether the op on x runs torch's CPU convolution: a CPU tensor, the NumPy path not asked for, and no empty
    operand (torch's convolutions refuse a weight without output channels; cupyconv's NumPy path gives the empty
    results, tests/test_empty.py)."""
    return x.device.type == "cpu" and not _NUMPY_CPU_PATH.get() and x.numel() > 0 and weight.numel() > 0


# ---------------------------------------------------------------------------------------------------------
# The convolutions through aten.convolution: padding per side as torch's symmetric padding plus the rest


def _split(padding) -> tuple[list, list, list]:
    """Flat per-side padding [lo, hi, ...] -> (symmetric per dim, extra low, extra high)."""
    low, high = padding[0::2], padding[1::2]
    symmetric = [min(lo, hi) for lo, hi in zip(low, high)]
    return symmetric, [lo - p for lo, p in zip(low, symmetric)], [hi - p for hi, p in zip(high, symmetric)]


def _pad_list(low, high) -> list:
    """F.pad's argument (last dim first) for these extra paddings; negative values crop."""
    return [p for lo, hi in zip(reversed(low), reversed(high)) for p in (lo, hi)]


def _rolled(name: str, x: Tensor, weight: Tensor) -> Tensor:
    """x as a batch of images: a patch convolution's leading dims rolled into one."""
    nd = weight.dim() - 2
    return x.reshape(-1, *x.shape[-nd - 1:]) if name == "patch_conv2d" else x


def _geometry(name: str, x: Tensor, kw: dict) -> tuple:
    """(transposed, output_padding, groups) of the aten call."""
    nd = len(kw["stride"])
    transposed = name.startswith("conv_transpose")
    groups = x.shape[1] if name == "depthwise_conv2d" else kw["groups"]
    return transposed, list(kw.get("output_padding", [0] * nd)), groups


def _check(name: str, x: Tensor, weight: Tensor, bias: Tensor | None, kw: dict) -> None:
    """cupyconv's argument checks, so that a bad call raises cupyconv's error (naming the op and the shapes) on
    either path, not aten's."""
    nd, sides = weight.dim() - 2, tuple(zip(kw["padding"][0::2], kw["padding"][1::2]))
    window = (kw["stride"], sides, kw["dilation"])
    if name.startswith("conv_transpose"):
        transposed_spec(name, nd, x, weight, bias, kw["stride"], sides, kw["output_padding"], kw["groups"],
                        kw["dilation"])
    elif name == "depthwise_conv2d":
        ConvSpec.for_depthwise(name, x, weight, bias, *window)
    else:
        ConvSpec.for_conv(name, x, weight, bias, *window, kw["groups"], nd=nd, leading_dims=name == "patch_conv2d")


def forward(name: str, x: Tensor, weight: Tensor, bias: Tensor | None, kw: dict) -> Tensor:
    """The op `name` (cupyconv's geometry in kw, padding flat per side) by torch's CPU convolution, in the layout
    aten gives it (the custom op makes that its promised memory format)."""
    _check(name, x, weight, bias, kw)
    xb = _rolled(name, x, weight)
    transposed, output_padding, groups = _geometry(name, xb, kw)
    symmetric, low, high = _split(kw["padding"])
    if any(low) or any(high):
        if transposed:      # the rest of the padding crops the output
            y = torch.ops.aten.convolution(xb, weight, bias, kw["stride"], symmetric, kw["dilation"], True,
                                           output_padding, groups)
            y = F.pad(y, _pad_list([-p for p in low], [-p for p in high]))
        else:
            y = torch.ops.aten.convolution(F.pad(xb, _pad_list(low, high)), weight, bias, kw["stride"], symmetric,
                                           kw["dilation"], False, output_padding, groups)
    else:
        y = torch.ops.aten.convolution(xb, weight, bias, kw["stride"], symmetric, kw["dilation"], transposed,
                                       output_padding, groups)
    if xb is not x:
        y = y.reshape(*x.shape[:-weight.dim() + 1], *y.shape[1:])
    return y


def backward(name: str, grad_output: Tensor, x: Tensor, weight: Tensor, needs, kw: dict) -> tuple:
    """(grad_x, grad_weight, grad_bias) of `forward`, None where not needed, by torch's convolution_backward."""
    xb, gy = _rolled(name, x, weight), _rolled(name, grad_output, weight)
    transposed, output_padding, groups = _geometry(name, xb, kw)
    symmetric, low, high = _split(kw["padding"])
    extra = any(low) or any(high)
    if extra and transposed:        # the forward cropped its output: its gradient is zero there
        gy = F.pad(gy, _pad_list(low, high))
    if extra and not transposed:    # the forward padded its input: its gradient is cropped
        xb = F.pad(xb, _pad_list(low, high))
    channels = weight.shape[1] * groups if transposed else weight.shape[0]
    gx, gw, gb = torch.ops.aten.convolution_backward(
        gy.contiguous(), xb, weight, [channels], kw["stride"], symmetric, kw["dilation"], transposed,
        output_padding, groups, [bool(needs[0]), bool(needs[1]), bool(needs[2])])
    if gx is not None and extra and not transposed:
        gx = F.pad(gx, _pad_list([-p for p in low], [-p for p in high]))
    if gx is not None and name == "patch_conv2d":
        gx = gx.reshape(x.shape)
    # aten's kernels may return a gradient the mask did not ask for: the fake implementation promises none
    return tuple(g.contiguous() if need and g is not None else None for g, need in zip((gx, gw, gb), needs))
