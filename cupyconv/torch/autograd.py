"""One `torch.autograd.Function` per forward op, each also registered as the autograd formula of its custom op."""
import torch

from ._custom_ops import (_conv2d_op, _depthwise_op, _fold_backward_op, _fold_op, _patch_op, _unfold_backward_op,
                          _unfold_op)


def _needed(grads, needs):
    return tuple(g if need else None for g, need in zip(grads, needs))


def _needs(ctx, has_bias: bool) -> list:
    want_x, want_w, want_b = ctx.needs_input_grad[:3]
    return [bool(want_x), bool(want_w), bool(want_b and has_bias)]


def _conv_autograd(backward_op):
    """(setup_context, backward) of a convolution's autograd.Function, as staticmethods.

    The Function's inputs are (x, weight, bias, *geometry); x and weight are saved, and backward calls
    `backward_op(grad_output, x, weight, *geometry, needs)` for only the gradients `ctx.needs_input_grad` asks
    for (None for the geometry).  The same two functions are the autograd formula registered on the forward op.
    """

    def setup_context(ctx, inputs, output):
        x, weight, bias, *geometry = inputs
        ctx.save_for_backward(x, weight)
        ctx.geometry = tuple(geometry)
        ctx.has_bias = bias is not None

    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        needs = _needs(ctx, ctx.has_bias)
        grads = backward_op(grad_output.to(x.dtype), x, weight, *ctx.geometry, needs)
        return (*_needed(grads, needs), *(None for _ in ctx.geometry))

    return staticmethod(setup_context), staticmethod(backward)


# ---------------------------------------------------------------------------------------------------------
# conv2d and patch_conv2d


class Conv2dFunction(torch.autograd.Function):
    """cupyconv.conv2d with its manual backward; also the autograd formula of the op `cupyconv::conv2d`.

    `Conv2dFunction.apply(x, weight, bias, stride, padding, dilation, groups)` takes the op's normalised
    arguments (padding [top, bottom, left, right]); the functional `conv2d` is the friendlier entry point.
    """

    @staticmethod
    def forward(x, weight, bias, stride, padding, dilation, groups):
        return torch.ops.cupyconv.conv2d(x, weight, bias, stride, padding, dilation, groups)

    setup_context, backward = _conv_autograd(torch.ops.cupyconv.conv2d_backward)


class PatchConv2dFunction(torch.autograd.Function):
    """cupyconv.patch_conv2d over x (..., C, H, W) with its manual backward (see `Conv2dFunction`)."""

    @staticmethod
    def forward(x, weight, bias, stride, padding, dilation, groups):
        return torch.ops.cupyconv.patch_conv2d(x, weight, bias, stride, padding, dilation, groups)

    setup_context, backward = _conv_autograd(torch.ops.cupyconv.patch_conv2d_backward)


_conv2d_op.register_autograd(Conv2dFunction.backward, setup_context=Conv2dFunction.setup_context)
_patch_op.register_autograd(PatchConv2dFunction.backward, setup_context=PatchConv2dFunction.setup_context)


# ---------------------------------------------------------------------------------------------------------
# depthwise_conv2d


class DepthwiseConv2dFunction(torch.autograd.Function):
    """cupyconv.depthwise_conv2d with its manual backward (see `Conv2dFunction`); no groups argument."""

    @staticmethod
    def forward(x, weight, bias, stride, padding, dilation):
        return torch.ops.cupyconv.depthwise_conv2d(x, weight, bias, stride, padding, dilation)

    setup_context, backward = _conv_autograd(torch.ops.cupyconv.depthwise_conv2d_backward)


_depthwise_op.register_autograd(DepthwiseConv2dFunction.backward,
                                setup_context=DepthwiseConv2dFunction.setup_context)


# ---------------------------------------------------------------------------------------------------------
# unfold and fold (linear, each other's adjoint: their backward ops have autograd too)


class _UnfoldLike(torch.autograd.Function):
    """An unfold of its first input (cupyconv.unfold, or fold_backward, which is the same map); its backward is
    a fold onto that input's size, itself differentiable."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, *geometry = inputs
        ctx.input_size = x.shape[-2:]
        ctx.dtype = x.dtype
        ctx.geometry = geometry

    @staticmethod
    def backward(ctx, grad_output):
        grad = torch.ops.cupyconv.unfold_backward(grad_output.to(ctx.dtype), list(ctx.input_size), *ctx.geometry)
        return grad, None, None, None, None


class _FoldLike(torch.autograd.Function):
    """A fold of its first input onto its second, a size (cupyconv.fold, or unfold_backward, which is the same
    map); its backward is an unfold, itself differentiable."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        cols, _, *geometry = inputs
        ctx.dtype = cols.dtype
        ctx.geometry = geometry

    @staticmethod
    def backward(ctx, grad_output):
        return torch.ops.cupyconv.fold_backward(grad_output.to(ctx.dtype), *ctx.geometry), None, None, None, None, None


class UnfoldFunction(_UnfoldLike):
    """cupyconv.unfold; backward is cupyconv.unfold_backward (a fold)."""

    @staticmethod
    def forward(x, kernel_size, dilation, padding, stride):
        return torch.ops.cupyconv.unfold(x, kernel_size, dilation, padding, stride)


class UnfoldBackwardFunction(_FoldLike):
    """cupyconv.unfold_backward (a fold); its backward is an unfold."""

    @staticmethod
    def forward(grad_output, input_size, kernel_size, dilation, padding, stride):
        return torch.ops.cupyconv.unfold_backward(grad_output, input_size, kernel_size, dilation, padding, stride)


class FoldFunction(_FoldLike):
    """cupyconv.fold; backward is cupyconv.fold_backward (an unfold)."""

    @staticmethod
    def forward(cols, output_size, kernel_size, dilation, padding, stride):
        return torch.ops.cupyconv.fold(cols, output_size, kernel_size, dilation, padding, stride)


class FoldBackwardFunction(_UnfoldLike):
    """cupyconv.fold_backward (an unfold); its backward is a fold onto the size of fold_backward's input."""

    @staticmethod
    def forward(grad_output, kernel_size, dilation, padding, stride):
        return torch.ops.cupyconv.fold_backward(grad_output, kernel_size, dilation, padding, stride)


for _op, _function in ((_unfold_op, UnfoldFunction), (_unfold_backward_op, UnfoldBackwardFunction),
                       (_fold_op, FoldFunction), (_fold_backward_op, FoldBackwardFunction)):
    _op.register_autograd(_function.backward, setup_context=_function.setup_context)
