"""The convolutions over 1 or 3 spatial dims (and `conv_nd` over 1, 2 or 3): conv, depthwise and patch.

Each is its 2-D op run through ops/lift.py: 1-D with a unit height, 3-D folded by its depth taps into a 2-D
problem (the module docstring there has the algebra and what it costs).  Arguments, semantics and errors are
the 2-D op's, with one entry per spatial dim: padding an int, one int per dim, one (low, high) pair per dim,
'same' or 'valid'; stride, dilation an int or one int per dim.
"""
from __future__ import annotations

from .._arrays import Call, on_arrays_device
from .._docs import GRADIENTS, SAME_KIND, numpy_doc
from .._spec import NEEDS, ConvSpec, check_grad_output, check_needs
from .._typing import ArrayT, Gradients, IntOrTuple, Needs, Padding
from . import lift
from .conv import ALGORITHM_DOC, conv2d_backward_run, conv2d_run, convolve, convolve_backward
from .depthwise import depthwise_conv2d_backward_run, depthwise_conv2d_run
from .patch import ALGORITHM_DOC as PATCH_ALGORITHM_DOC, patch_convolve, patch_convolve_backward


# The docstrings' entries (cupyconv._docs) for x, weight and algorithm
CONV1D_DOCS = dict(x=("array (N, C, L)", "The input."), weight=("array (D, C // groups, k)", "The filters."),
                   algorithm=ALGORITHM_DOC)
CONV3D_DOCS = dict(x=("array (N, C, D, H, W)", "The input."),
                   weight=("array (O, C // groups, kD, kH, kW)", "The filters."), algorithm=ALGORITHM_DOC)
CONV_ND_DOCS = dict(x=("array ``(N, C, *spatial)``", "The input, with 1, 2 or 3 spatial dims."),
                    weight=("array ``(D, C // groups, *k)``", "The filters, with as many spatial dims as x."),
                    algorithm=ALGORITHM_DOC)


@numpy_doc(CONV1D_DOCS, returns=("array (N, D, oL)", SAME_KIND))
def conv1d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1, padding: Padding = 0,
           dilation: IntOrTuple = 1, groups: int = 1, *, algorithm: str = "auto",
           workspace_limit: int | None = None) -> ArrayT:
    """1-D convolution (cross-correlation, like `torch.nn.functional.conv1d`).

    Runs `conv2d`'s kernels over a unit height (a view of x, no copy).
    """
    return convolve("conv1d", 1, x, weight, bias, stride, padding, dilation, groups, algorithm, workspace_limit)


@numpy_doc(CONV3D_DOCS, returns=("array (N, O, oD, oH, oW)", SAME_KIND))
def conv3d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1, padding: Padding = 0,
           dilation: IntOrTuple = 1, groups: int = 1, *, algorithm: str = "auto",
           workspace_limit: int | None = None) -> ArrayT:
    """3-D convolution (cross-correlation, like `torch.nn.functional.conv3d`).

    On the tensor cores (float16, bfloat16, TF32; 'implicit_gemm', or 'auto' with autotune off) the forward runs
    natively in 3-D (conv_fwd_igemm_3d).  Otherwise it runs `conv2d`'s kernels on the depth windows of x: for each
    output depth, the kD input planes its windows read form a 2-D problem with C * kD channels.  The windows are
    built per chunk of the batch within the workspace limit.
    """
    return convolve("conv3d", 3, x, weight, bias, stride, padding, dilation, groups, algorithm, workspace_limit)


@numpy_doc(CONV_ND_DOCS, returns=("array ``(N, D, *out)``", SAME_KIND))
def conv_nd(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1, padding: Padding = 0,
            dilation: IntOrTuple = 1, groups: int = 1, *, algorithm: str = "auto",
            workspace_limit: int | None = None) -> ArrayT:
    """`conv1d`, `conv2d` or `conv3d`, by the number of spatial dims of weight (weight.ndim - 2)."""
    return convolve("conv_nd", None, x, weight, bias, stride, padding, dilation, groups, algorithm, workspace_limit)


@numpy_doc(CONV1D_DOCS, returns=GRADIENTS)
def conv1d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1, padding: Padding = 0,
                    dilation: IntOrTuple = 1, groups: int = 1, needs: Needs = NEEDS, algorithm: str = "auto",
                    workspace_limit: int | None = None) -> Gradients[ArrayT]:
    """The gradients of `conv1d`, computed by hand (no autograd)."""
    return convolve_backward("conv1d_backward", 1, grad_output, x, weight, stride, padding, dilation, groups, needs,
                             algorithm, workspace_limit)


@numpy_doc(CONV3D_DOCS, returns=GRADIENTS)
def conv3d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1, padding: Padding = 0,
                    dilation: IntOrTuple = 1, groups: int = 1, needs: Needs = NEEDS, algorithm: str = "auto",
                    workspace_limit: int | None = None) -> Gradients[ArrayT]:
    """The gradients of `conv3d`, computed by hand (no autograd).

    With several workspace chunks, grad_weight and grad_bias are summed over the chunks in order (in float32 for
    float16 and bfloat16).
    """
    return convolve_backward("conv3d_backward", 3, grad_output, x, weight, stride, padding, dilation, groups, needs,
                             algorithm, workspace_limit)


@numpy_doc(CONV_ND_DOCS, returns=GRADIENTS)
def conv_nd_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1, padding: Padding = 0,
                     dilation: IntOrTuple = 1, groups: int = 1, needs: Needs = NEEDS, algorithm: str = "auto",
                     workspace_limit: int | None = None) -> Gradients[ArrayT]:
    """The gradients of `conv_nd`, computed by hand (no autograd).

    The values of x are not read unless `needs` names "weight", nor those of weight unless it names "input".
    """
    return convolve_backward("conv_nd_backward", None, grad_output, x, weight, stride, padding, dilation, groups,
                             needs, algorithm, workspace_limit)


# ---------------------------------------------------------------------------------------------------------
# Depthwise: 1-D on the depthwise kernels; 3-D folds into a grouped 2-D conv (kD channels per group)


def _depthwise_runners(nd: int):
    if nd == 3:
        return conv2d_run, conv2d_backward_run
    return depthwise_conv2d_run, depthwise_conv2d_backward_run


@on_arrays_device
def _depthwise(op, nd, x, weight, bias, stride, padding, dilation):
    call = Call(op, x=x, weight=weight, bias=bias)
    spec = ConvSpec.for_depthwise(op, call.x, call.weight, call.bias, stride, padding, dilation, nd=nd)
    run, _ = _depthwise_runners(nd)
    return call.wrap(lift.forward(run, call.device, call.x, call.weight, call.bias, spec))


@on_arrays_device
def _depthwise_backward(op, nd, grad_output, x, weight, stride, padding, dilation, needs):
    call = Call(op, grad_output=grad_output, x=x, weight=weight)
    spec = ConvSpec.for_depthwise(op, call.x, call.weight, None, stride, padding, dilation, nd=nd)
    check_grad_output(op, call.grad_output, spec)
    _, run = _depthwise_runners(nd)
    return call.wrap(lift.backward(run, call.device, call.grad_output, call.x, call.weight, spec,
                                   check_needs(op, needs)))


DEPTHWISE1D_DOCS = dict(x=("array (N, C, L)", "The input."),
                        weight=("array (C * m, 1, k)", "The filters, m per channel."))
DEPTHWISE3D_DOCS = dict(x=("array (N, C, D, H, W)", "The input."),
                        weight=("array (C * m, 1, kD, kH, kW)", "The filters, m per channel."))


@numpy_doc(DEPTHWISE1D_DOCS, returns=("array (N, C * m, oL)", SAME_KIND))
def depthwise_conv1d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1,
                     padding: Padding = 0, dilation: IntOrTuple = 1) -> ArrayT:
    """Depthwise convolution over one spatial dim, channels as `depthwise_conv2d`; its kernels over a unit height."""
    return _depthwise("depthwise_conv1d", 1, x, weight, bias, stride, padding, dilation)


@numpy_doc(DEPTHWISE3D_DOCS, returns=("array (N, C * m, oD, oH, oW)", SAME_KIND))
def depthwise_conv3d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1,
                     padding: Padding = 0, dilation: IntOrTuple = 1) -> ArrayT:
    """Depthwise convolution over three spatial dims, channels as `depthwise_conv2d`.

    Runs as a grouped 2-D convolution (`conv2d`'s kernels) of the depth windows, kD channels per group.
    """
    return _depthwise("depthwise_conv3d", 3, x, weight, bias, stride, padding, dilation)


@numpy_doc(DEPTHWISE1D_DOCS, returns=GRADIENTS)
def depthwise_conv1d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1,
                              padding: Padding = 0, dilation: IntOrTuple = 1,
                              needs: Needs = NEEDS) -> Gradients[ArrayT]:
    """The gradients of `depthwise_conv1d`, computed by hand (no autograd)."""
    return _depthwise_backward("depthwise_conv1d_backward", 1, grad_output, x, weight, stride, padding, dilation,
                               needs)


@numpy_doc(DEPTHWISE3D_DOCS, returns=GRADIENTS)
def depthwise_conv3d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1,
                              padding: Padding = 0, dilation: IntOrTuple = 1,
                              needs: Needs = NEEDS) -> Gradients[ArrayT]:
    """The gradients of `depthwise_conv3d`, computed by hand (no autograd)."""
    return _depthwise_backward("depthwise_conv3d_backward", 3, grad_output, x, weight, stride, padding, dilation,
                               needs)


# ---------------------------------------------------------------------------------------------------------
# Patch convolution over 1-D or 3-D patches: padding inside each patch, nothing read across patches


PATCH1D_DOCS = dict(x=("array (..., C, L)", "The patches."), weight=CONV1D_DOCS["weight"],
                    algorithm=PATCH_ALGORITHM_DOC)
PATCH3D_DOCS = dict(x=("array (..., C, D, H, W)", "The patches."), weight=CONV3D_DOCS["weight"],
                    algorithm=PATCH_ALGORITHM_DOC)


@numpy_doc(PATCH1D_DOCS, returns=("array (..., D, oL)", SAME_KIND))
def patch_conv1d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1, padding: Padding = 0,
                 dilation: IntOrTuple = 1, groups: int = 1, *, algorithm: str = "auto",
                 workspace_limit: int | None = None) -> ArrayT:
    """Convolve every 1-D patch with the same filters, as `patch_conv2d`: padding inside each patch."""
    return patch_convolve("patch_conv1d", 1, x, weight, bias, stride, padding, dilation, groups, algorithm,
                          workspace_limit)


@numpy_doc(PATCH3D_DOCS, returns=("array (..., O, oD, oH, oW)", SAME_KIND))
def patch_conv3d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1, padding: Padding = 0,
                 dilation: IntOrTuple = 1, groups: int = 1, *, algorithm: str = "auto",
                 workspace_limit: int | None = None) -> ArrayT:
    """Convolve every 3-D patch with the same filters, as `patch_conv2d`: padding inside each patch."""
    return patch_convolve("patch_conv3d", 3, x, weight, bias, stride, padding, dilation, groups, algorithm,
                          workspace_limit)


@numpy_doc(PATCH1D_DOCS, returns=GRADIENTS)
def patch_conv1d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1,
                          padding: Padding = 0, dilation: IntOrTuple = 1, groups: int = 1, needs: Needs = NEEDS,
                          algorithm: str = "auto", workspace_limit: int | None = None) -> Gradients[ArrayT]:
    """The gradients of `patch_conv1d`, computed by hand (no autograd)."""
    return patch_convolve_backward("patch_conv1d_backward", 1, grad_output, x, weight, stride, padding, dilation,
                                   groups, needs, algorithm, workspace_limit)


@numpy_doc(PATCH3D_DOCS, returns=GRADIENTS)
def patch_conv3d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1,
                          padding: Padding = 0, dilation: IntOrTuple = 1, groups: int = 1, needs: Needs = NEEDS,
                          algorithm: str = "auto", workspace_limit: int | None = None) -> Gradients[ArrayT]:
    """The gradients of `patch_conv3d`, computed by hand (no autograd)."""
    return patch_convolve_backward("patch_conv3d_backward", 3, grad_output, x, weight, stride, padding, dilation,
                                   groups, needs, algorithm, workspace_limit)
