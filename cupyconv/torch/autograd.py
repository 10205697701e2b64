"""Autograd formulas of the custom ops, and the `torch.autograd.Function` classes that expose some of them.

Every convolution y = B(x, w) + b (B bilinear: conv, patch, depthwise, transposed) has two custom ops: the
forward `op(x, w, b, *options)` and `backward_op(grad_output, x, w, needs, *options) -> (gx, gw, gb)`.
Both get an autograd formula here, written with the same two ops, so gradients of any order exist:

* forward: gx, gw, gb = backward_op(grad_output, x, w, needs), for what `ctx.needs_input_grad` asks.
* backward (double backward): with ggx, ggw, ggb the gradients arriving at gx, gw, gb,
  d/d grad_output = op(ggx, w, ggb) + op(x, ggw)  (the adjoint of each map from grad_output),
  d/dx = backward_op(grad_output, x, ggw, [input])   (gw = dB(x, .)* grad_output, linear in x),
  d/dw = backward_op(grad_output, ggx, w, [weight])  (gx = dB(., w)* grad_output, linear in w).
"""
import functools

import torch

from ._custom_ops import BODIES, CONVOLUTIONS, EAGER_FUNCTIONS, call, saved_x


def _needed(grads, needs):
    return tuple(g if need else None for g, need in zip(grads, needs))


def _needs(ctx, has_bias: bool) -> list:
    want_x, want_w, want_b = ctx.needs_input_grad[:3]
    return [bool(want_x), bool(want_w), bool(want_b and has_bias)]


def _forward_formula(backward_op):
    """(setup_context, backward) of a convolution's forward op `op(x, weight, bias, *options)`.

    x and weight are saved, and backward calls `backward_op(grad_output, x, weight, needs, *options)` for only
    the gradients `ctx.needs_input_grad` asks for (None for the options).
    """

    def setup_context(ctx, inputs, output):
        x, weight, bias, *options = inputs
        ctx.save_for_backward(saved_x(x, output), weight)   # the forward's channels-last copy of x, if it kept one
        ctx.options = tuple(options)
        ctx.has_bias = bias is not None

    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        needs = _needs(ctx, ctx.has_bias)
        grads = backward_op(grad_output.to(x.dtype), x, weight, needs, *ctx.options)
        return (*_needed(grads, needs), *(None for _ in ctx.options))

    return setup_context, backward


def _backward_formula(op, backward_op):
    """(setup_context, backward) of `backward_op(grad_output, x, weight, needs, *options)`: the double backward
    of the convolution, through `op` and `backward_op` themselves (see the module docstring)."""

    def setup_context(ctx, inputs, output):
        grad_output, x, weight, needs, *options = inputs
        ctx.save_for_backward(grad_output, x, weight)
        ctx.needs, ctx.options = tuple(needs), tuple(options)
        ctx.set_materialize_grads(False)        # None, not zeros, for the outputs nothing depends on

    def backward(ctx, *grads):
        grad_output, x, weight = ctx.saved_tensors
        ggx, ggw, ggb = (g if need else None for g, need in zip(grads, ctx.needs))  # placeholders stay None
        want_go, want_x, want_w = ctx.needs_input_grad[:3]
        g_go = g_x = g_w = None
        if want_go:
            terms = []
            if ggx is not None:
                terms.append(op(ggx, weight, ggb, *ctx.options))
                ggb = None
            if ggw is not None:
                terms.append(op(x, ggw, ggb, *ctx.options))
                ggb = None
            if ggb is not None:
                terms.append(ggb.reshape(-1, *(1,) * (weight.dim() - 2)).expand(grad_output.shape))
            g_go = sum(terms[1:], terms[0]) if terms else None
        if want_x and ggw is not None:
            g_x = backward_op(grad_output, x, ggw, [True, False, False], *ctx.options)[0]
        if want_w and ggx is not None:
            g_w = backward_op(grad_output, ggx, weight, [False, True, False], *ctx.options)[1]
        return g_go, g_x, g_w, None, *(None for _ in ctx.options)

    return setup_context, backward


# ---------------------------------------------------------------------------------------------------------
# The Function classes of the 2-D convolutions (the functional wrappers call the ops, whose registered
# formulas are the same)


class Conv2dFunction(torch.autograd.Function):
    """cupyconv.conv2d with its manual backward; also the autograd formula of the op `cupyconv::conv2d`.

    `Conv2dFunction.apply(x, weight, bias, stride, padding, dilation, groups[, algorithm, workspace_limit])`
    takes the op's normalised arguments (padding [top, bottom, left, right]); the functional `conv2d` is the
    friendlier entry point.
    """

    @staticmethod
    def forward(x, weight, bias, *options):
        return torch.ops.cupyconv.conv2d(x, weight, bias, *options)

    setup_context, backward = map(staticmethod, _forward_formula(torch.ops.cupyconv.conv2d_backward))


class PatchConv2dFunction(torch.autograd.Function):
    """cupyconv.patch_conv2d over x (..., C, H, W) with its manual backward (see `Conv2dFunction`)."""

    @staticmethod
    def forward(x, weight, bias, *options):
        return torch.ops.cupyconv.patch_conv2d(x, weight, bias, *options)

    setup_context, backward = map(staticmethod, _forward_formula(torch.ops.cupyconv.patch_conv2d_backward))


class DepthwiseConv2dFunction(torch.autograd.Function):
    """cupyconv.depthwise_conv2d with its manual backward (see `Conv2dFunction`); options (stride, padding,
    dilation)."""

    @staticmethod
    def forward(x, weight, bias, *options):
        return torch.ops.cupyconv.depthwise_conv2d(x, weight, bias, *options)

    setup_context, backward = map(staticmethod, _forward_formula(torch.ops.cupyconv.depthwise_conv2d_backward))


def _eager_function(name: str, setup_context, backward):
    """The Function `_custom_ops.call` applies for op `name` in plain eager mode: the op's implementation as its
    forward, the op's autograd formula.  setup_context runs inside forward, as in the Function torch generates for a
    custom op (a Function with a separate setup_context costs an inspect.signature per call)."""
    body = BODIES[name]

    def forward(ctx, *args):
        output = body(*args)
        setup_context(ctx, args, output)
        return output

    return type(f"Eager_{name}", (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                              "backward": staticmethod(backward)})


for _name in CONVOLUTIONS:
    _op, _backward_op = getattr(torch.ops.cupyconv, _name), getattr(torch.ops.cupyconv, f"{_name}_backward")
    # the backward op through `call`: its implementation directly where the dispatcher adds nothing (no create_graph)
    _setup, _backward = _forward_formula(functools.partial(call, f"{_name}_backward"))
    torch.library.register_autograd(f"cupyconv::{_name}", _backward, setup_context=_setup)
    EAGER_FUNCTIONS[_name] = _eager_function(_name, _setup, _backward)
    _setup, _backward = _backward_formula(_op, _backward_op)
    torch.library.register_autograd(f"cupyconv::{_name}_backward", _backward, setup_context=_setup)


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
        grad = call("unfold_backward", grad_output.to(ctx.dtype), list(ctx.input_size), *ctx.geometry)
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
        return call("fold_backward", grad_output.to(ctx.dtype), *ctx.geometry), None, None, None, None, None


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


for _name, _function in (("unfold", UnfoldFunction), ("unfold_backward", UnfoldBackwardFunction),
                         ("fold", FoldFunction), ("fold_backward", FoldBackwardFunction)):
    torch.library.register_autograd(f"cupyconv::{_name}", _function.backward, setup_context=_function.setup_context)
    EAGER_FUNCTIONS[_name] = _eager_function(_name, _function.setup_context, _function.backward)
