"""Transposed convolution over 1, 2 or 3 spatial dims, torch's semantics, forward and backward.

conv_transpose(x, w) is the input gradient of the convolution conv(z, w) whose output has x's shape: z has
the transposed convolution's output shape, C_out channels, and w (C_in, C_out / groups, k...) is that
convolution's weight as it stands.  So every pass is a pass of conv (ops/conv.py through ops/lift.py), run with
the call's `algorithm` (conv's) and within its `workspace_limit`, and each is a gather, deterministic, with no
atomics:

    forward       conv's input gradient of grad_output = x        (+ bias per output channel)
    grad_input    conv's forward of grad_output
    grad_weight   conv's weight gradient, input grad_output and output gradient x
    grad_bias     the sum of grad_output over the batch and the spatial dims

Output size per dim: (in - 1) * stride - pad_low - pad_high + dilation * (k - 1) + output_padding + 1, with
output_padding < max(stride, dilation) as torch requires.  When output_padding >= stride (possible when the
dilation is larger) the convolution of the output has in + output_padding // stride positions per dim; x is
then zero-extended to that size (the extra output rows receive nothing but the bias, as in torch).
"""
from __future__ import annotations

from .._arrays import Call, compute_dtype, on_arrays_device
from .._docs import GRADIENTS, SAME_KIND, numpy_doc
from .._spec import (KERNEL_LAYOUTS, LAYOUTS, NEEDS, SPATIAL, ConvSpec, _padding, _shape, _tuple, check_algorithm,
                     check_groups, check_needs, weight_spatial_dims)
from .._typing import ArrayT, Gradients, IntOrTuple, Needs, Padding
from . import lift
from .conv import ALGORITHM_DOC, ALGORITHMS, conv2d_backward_run, conv2d_run, native_3d, workspace_scope


def _spec(op: str, nd: int, x, weight, bias, stride, padding, output_padding, groups, dilation):
    """The spec of the convolution that conv_transpose transposes, and the zero extension of x per dim."""
    xs, ws = _shape(x), _shape(weight)
    if nd is None:
        nd = weight_spatial_dims(op, ws, "C_in, C_out // groups")
    if len(xs) != nd + 2:
        raise ValueError(f"{op}: x must have {nd + 2} dimensions {LAYOUTS[nd]}, got shape {xs}")
    if len(ws) != nd + 2:
        raise ValueError(f"{op}: weight must have {nd + 2} dimensions (C_in, C_out // groups, {KERNEL_LAYOUTS[nd]}), "
                         f"got shape {ws}")
    groups = check_groups(op, groups)
    c_in, c_out = xs[1], ws[1] * groups
    if ws[0] != c_in:
        raise ValueError(f"{op}: weight {ws} has {ws[0]} input channels (weight.shape[0]) but x {xs} has {c_in}")
    if c_in % groups:
        raise ValueError(f"{op}: groups={groups} does not divide the {c_in} input channels of x {xs}")
    if bias is not None and _shape(bias) != (c_out,):
        raise ValueError(f"{op}: bias must have shape ({c_out},) to match weight {ws} with groups={groups}, "
                         f"got {_shape(bias)}")
    kernel = _tuple(op, "kernel_size", ws[2:], 1, nd)
    stride = _tuple(op, "stride", stride, 1, nd)
    dilation = _tuple(op, "dilation", dilation, 1, nd)
    if padding == "same":
        raise ValueError(f"{op}: padding='same' is not defined for a transposed convolution; give the padding")
    sides = _padding(op, padding, (1,) * nd, kernel, stride, dilation)
    extra_padding = _tuple(op, "output_padding", output_padding, 0, nd)
    for op_, s, d in zip(extra_padding, stride, dilation):
        if op_ >= max(s, d):
            raise ValueError(f"{op}: output_padding {extra_padding} must be smaller than stride {stride} or "
                             f"dilation {dilation} in every dimension")
    out = tuple((n - 1) * s - lo - hi + d * (k - 1) + o + 1
                for n, s, (lo, hi), d, k, o in zip(xs[2:], stride, sides, dilation, kernel, extra_padding))
    if min(out) <= 0:
        raise ValueError(f"{op}: output size would be {'x'.join(map(str, out))} (input {xs}, weight {ws}, stride "
                         f"{stride}, padding {sides}, output_padding {extra_padding}, dilation {dilation}); it must "
                         f"be at least {'x'.join(['1'] * nd)}")
    spec = ConvSpec.geometry(op, xs[:1], c_out, c_in, groups, out, kernel, stride, sides, dilation)
    extension = tuple(o // s for o, s in zip(extra_padding, stride))
    return spec, extension


def _extend(device, x, extension):
    """x zero-extended at the high end of each spatial dim by `extension` (x itself when all are 0)."""
    if not any(extension):
        return x
    ops = lift.arrays(device)
    out = ops.zeros((*x.shape[:2], *(n + e for n, e in zip(x.shape[2:], extension))), x.dtype)
    ops.copyto(out[(slice(None), slice(None), *(slice(0, n) for n in x.shape[2:]))], x)
    return out


def _crop(a, shape):
    return a[tuple(slice(0, n) for n in shape)]


def _forward(device, x, weight, bias, spec: ConvSpec, extension: tuple, algorithm: str):
    """The forward on device (None: the CPU path): conv's input gradient of x (zero-extended), plus the bias (in
    the compute dtype, rounded once: by the tensor cores' epilogue where they run, `lift.backward`'s input_bias).
    The convolution's input, whose values an input gradient never reads, is a view of x's first element broadcast
    (no fill)."""
    gy = _extend(device, x, extension)
    z = lift.placeholder(device, spec.input_shape, x.dtype, like=x)
    out, _, _ = lift.backward(conv2d_backward_run, device, gy, z, weight, spec, frozenset({"input"}), algorithm,
                              native_3d, input_bias=bias)
    return out


def _backward(device, grad_output, x, weight, spec: ConvSpec, extension: tuple, needs: frozenset, algorithm: str):
    """The gradients `needs` on device (None: the CPU path): conv's forward of grad_output (cropped to x's
    shape), conv's weight gradient of x (zero-extended) against grad_output, the sum of grad_output."""
    ops = lift.arrays(device)
    grad_x = grad_w = grad_b = None
    if "input" in needs:
        grad_x = lift.forward(conv2d_run, device, grad_output, weight, None, spec, algorithm, native_3d)
        grad_x = ops.ascontiguous(_crop(grad_x, x.shape))
    if "weight" in needs:
        _, grad_w, _ = lift.backward(conv2d_backward_run, device, _extend(device, x, extension), grad_output,
                                     weight, spec, frozenset({"weight"}), algorithm)
    if "bias" in needs:
        axes = (0, *range(2, grad_output.ndim))
        grad_b = ops.astype(ops.sum(grad_output, axes, compute_dtype(grad_output.dtype)), grad_output.dtype)
    return grad_x, grad_w, grad_b


@on_arrays_device
def transpose(op, nd, x, weight, bias, stride, padding, output_padding, groups, dilation, algorithm,
               workspace_limit):
    call = Call(op, x=x, weight=weight, bias=bias)
    spec, extension = _spec(op, nd, call.x, call.weight, call.bias, stride, padding, output_padding, groups,
                            dilation)
    check_algorithm(op, algorithm, ALGORITHMS)   # one of conv's, which runs every pass
    with workspace_scope(op, workspace_limit):   # checks workspace_limit before anything is allocated
        # The output's size before the placeholder of that size (and x's zero extension) is made: NumPy refuses
        # some impossible shapes with its own errors, naming no op.
        lift.prepare(call.device, spec, call.x.dtype, [spec.input_shape])
        # All of it one program (extension, input gradient, bias): a repeat is one replay, on the fast path.
        out = lift.one_program(call.device, ("conv_transpose", spec, extension, algorithm),
                               (call.x, call.weight, call.bias),
                               lambda device: _forward(device, call.x, call.weight, call.bias, spec, extension,
                                                       algorithm))
    return call.wrap(out)


@on_arrays_device
def transpose_backward(op, nd, grad_output, x, weight, stride, padding, output_padding, groups, dilation, needs,
                        algorithm, workspace_limit):
    call = Call(op, grad_output=grad_output, x=x, weight=weight)
    spec, extension = _spec(op, nd, call.x, call.weight, None, stride, padding, output_padding, groups, dilation)
    if _shape(call.grad_output) != spec.input_shape:
        raise ValueError(f"{op}: grad_output has shape {_shape(call.grad_output)} but the forward output of x "
                         f"{_shape(call.x)} and weight {_shape(call.weight)} has shape {spec.input_shape}")
    needs = check_needs(op, needs)
    check_algorithm(op, algorithm, ALGORITHMS)
    shapes = [shape for name, shape in zip(NEEDS, (_shape(call.x), _shape(call.weight), spec.input_shape[1:2]))
              if name in needs]
    lift.prepare(call.device, spec, call.x.dtype, shapes)   # before _extend's copy
    with workspace_scope(op, workspace_limit):
        grads = lift.one_program(call.device, ("conv_transpose_backward", spec, extension, needs, algorithm),
                                 (call.grad_output, call.x, call.weight),
                                 lambda device: _backward(device, call.grad_output, call.x, call.weight, spec,
                                                          extension, needs, algorithm))
    return call.wrap(grads)


TRANSPOSE_DOCS = dict(
    stride=("int or tuple of int", "The stride of the convolution this transposes (the factor by which the output "
                                   "grows): one int for every spatial dim, or one per dim."),
    padding=("int, tuple or str", "Removed from the output's ends, as in torch: an int for every side; one int per "
                                  "dim, for both of its ends; one (low, high) pair per dim; or 'valid' (none).  Not "
                                  "'same'."),
    output_padding=("int or tuple of int", "Added to the high end of each output dim, to pick one of the output "
                                           "sizes that the convolution maps to x's size; smaller than max(stride, "
                                           "dilation) in every dim."),
    algorithm=(ALGORITHM_DOC[0], ALGORITHM_DOC[1] + "  It chooses the kernels of the convolution this transposes, "
               "in every pass (forward: its input gradient; grad_input: its forward; grad_weight: its weight "
               "gradient), so the channels above are that convolution's: C_out // groups input channels per group "
               "and C_in // groups output channels.  'direct' runs the forward at stride 1 only (im2col + GEMM "
               "otherwise); a depthwise one (groups == C_out > 1, in 1-D and 2-D) runs the depthwise kernels, which "
               "ignore it."))
OUTPUT_DOC = ("array ``(N, C_out, *out)``", "out = (in - 1) * stride - pad_low - pad_high + dilation * (k - 1) + "
                                        "output_padding + 1 per dim.  " + SAME_KIND)


def _shape_docs(nd: int | None) -> dict:
    """The docstring entries of x and weight over nd spatial dims (None: 1, 2 or 3), with TRANSPOSE_DOCS."""
    spatial, kernel = (SPATIAL[nd], KERNEL_LAYOUTS[nd]) if nd else ("*spatial", "*k")
    return dict(x=(f"array ``(N, C_in, {spatial})``", "The input."),
                weight=(f"array ``(C_in, C_out // groups, {kernel})``",
                        "The filters of the convolution this transposes."),
                **TRANSPOSE_DOCS)


@numpy_doc(_shape_docs(1), returns=OUTPUT_DOC)
def conv_transpose1d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1,
                     padding: Padding = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                     dilation: IntOrTuple = 1, *, algorithm: str = "auto",
                     workspace_limit: int | None = None) -> ArrayT:
    """Transposed 1-D convolution, like `torch.nn.functional.conv_transpose1d` (its argument order).

    The input gradient of `conv1d` with this weight, computed as a gather: deterministic, no atomics.
    """
    return transpose("conv_transpose1d", 1, x, weight, bias, stride, padding, output_padding, groups, dilation,
                      algorithm, workspace_limit)


@numpy_doc(_shape_docs(2), returns=OUTPUT_DOC)
def conv_transpose2d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1,
                     padding: Padding = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                     dilation: IntOrTuple = 1, *, algorithm: str = "auto",
                     workspace_limit: int | None = None) -> ArrayT:
    """Transposed 2-D convolution, like `torch.nn.functional.conv_transpose2d` (its argument order).

    The input gradient of `conv2d` with this weight, computed as a gather: deterministic, no atomics.
    """
    return transpose("conv_transpose2d", 2, x, weight, bias, stride, padding, output_padding, groups, dilation,
                      algorithm, workspace_limit)


@numpy_doc(_shape_docs(3), returns=OUTPUT_DOC)
def conv_transpose3d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1,
                     padding: Padding = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                     dilation: IntOrTuple = 1, *, algorithm: str = "auto",
                     workspace_limit: int | None = None) -> ArrayT:
    """Transposed 3-D convolution, like `torch.nn.functional.conv_transpose3d` (its argument order).

    The input gradient of `conv3d` with this weight, computed as a gather: deterministic, no atomics.
    """
    return transpose("conv_transpose3d", 3, x, weight, bias, stride, padding, output_padding, groups, dilation,
                      algorithm, workspace_limit)


@numpy_doc(_shape_docs(None), returns=OUTPUT_DOC)
def conv_transpose_nd(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1,
                      padding: Padding = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                      dilation: IntOrTuple = 1, *, algorithm: str = "auto",
                      workspace_limit: int | None = None) -> ArrayT:
    """The transposed convolution over weight.ndim - 2 spatial dims: `conv_transpose1d`, `2d` or `3d`."""
    return transpose("conv_transpose_nd", None, x, weight, bias, stride, padding, output_padding, groups, dilation,
                      algorithm, workspace_limit)


@numpy_doc(_shape_docs(1), returns=GRADIENTS)
def conv_transpose1d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1,
                              padding: Padding = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                              dilation: IntOrTuple = 1, needs: Needs = NEEDS, algorithm: str = "auto",
                              workspace_limit: int | None = None) -> Gradients[ArrayT]:
    """The gradients of `conv_transpose1d`, computed by hand (no autograd)."""
    return transpose_backward("conv_transpose1d_backward", 1, grad_output, x, weight, stride, padding,
                               output_padding, groups, dilation, needs, algorithm, workspace_limit)


@numpy_doc(_shape_docs(2), returns=GRADIENTS)
def conv_transpose2d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1,
                              padding: Padding = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                              dilation: IntOrTuple = 1, needs: Needs = NEEDS, algorithm: str = "auto",
                              workspace_limit: int | None = None) -> Gradients[ArrayT]:
    """The gradients of `conv_transpose2d`, computed by hand (no autograd)."""
    return transpose_backward("conv_transpose2d_backward", 2, grad_output, x, weight, stride, padding,
                               output_padding, groups, dilation, needs, algorithm, workspace_limit)


@numpy_doc(_shape_docs(3), returns=GRADIENTS)
def conv_transpose3d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1,
                              padding: Padding = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                              dilation: IntOrTuple = 1, needs: Needs = NEEDS, algorithm: str = "auto",
                              workspace_limit: int | None = None) -> Gradients[ArrayT]:
    """The gradients of `conv_transpose3d`, computed by hand (no autograd)."""
    return transpose_backward("conv_transpose3d_backward", 3, grad_output, x, weight, stride, padding,
                               output_padding, groups, dilation, needs, algorithm, workspace_limit)


@numpy_doc(_shape_docs(None), returns=GRADIENTS)
def conv_transpose_nd_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1,
                               padding: Padding = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                               dilation: IntOrTuple = 1, needs: Needs = NEEDS, algorithm: str = "auto",
                               workspace_limit: int | None = None) -> Gradients[ArrayT]:
    """The gradients of `conv_transpose_nd`, computed by hand (no autograd)."""
    return transpose_backward("conv_transpose_nd_backward", None, grad_output, x, weight, stride, padding,
                               output_padding, groups, dilation, needs, algorithm, workspace_limit)
