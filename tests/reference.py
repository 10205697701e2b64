"""Independent oracles for the test suite.

Part 1 is a naive float64 reference written straight from the definitions, with plain loops over output
pixels: it shares no code with cupyconv and does not use torch, so a bug in cupyconv's geometry or im2col
cannot hide in both.  It is slow by design; use it on small shapes only.

Part 2 wraps torch CPU (`F.conv2d`, `F.unfold`, `F.fold`, `torch.autograd.grad`) behind the same argument
conventions as cupyconv.  torch has no per-side or strided 'same' padding, so the inputs are pre-padded with
`F.pad` using `explicit_padding`, which is also computed here from first principles.

Part 3 holds the small pieces every test module shares: random data, per-dtype tolerances, comparisons.
Part 4 builds hypothesis strategies of random specs; Part 5 (`ConvChecks`) holds the checks test_conv,
test_depthwise and test_patch run on their op.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy

# ---------------------------------------------------------------------------------------------------------
# Part 1: argument normalisation and the naive float64 reference


def as_pair(value) -> tuple[int, int]:
    """An int or a pair of ints as a pair."""
    if isinstance(value, (tuple, list)):
        assert len(value) == 2
        return int(value[0]), int(value[1])
    return int(value), int(value)


def explicit_padding(padding, in_size, kernel_size, stride=1, dilation=1):
    """Any cupyconv padding (int, pair, per-side, 'same', 'valid') as ((top, bottom), (left, right)).

    'same' is the JAX rule for any stride: out = ceil(in / stride), total = max((out - 1) * s + d * (k - 1) + 1
    - in, 0), top = total // 2, bottom = total - top (the odd pixel goes to the bottom/right).
    """
    kernel, stride, dilation = as_pair(kernel_size), as_pair(stride), as_pair(dilation)
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0), (0, 0)
        assert padding == "same", padding
        sides = []
        for size, k, s, d in zip(in_size, kernel, stride, dilation):
            out = math.ceil(size / s)
            total = max((out - 1) * s + d * (k - 1) + 1 - size, 0)
            sides.append((total // 2, total - total // 2))
        return tuple(sides)
    if isinstance(padding, (tuple, list)) and isinstance(padding[0], (tuple, list)):
        return as_pair(padding[0]), as_pair(padding[1])
    ph, pw = as_pair(padding)
    return (ph, ph), (pw, pw)


def output_size(in_size, kernel_size, stride=1, padding=0, dilation=1) -> tuple[int, int]:
    """(oH, oW) of a sliding window: floor((in + lo + hi - d * (k - 1) - 1) / s) + 1 per dimension."""
    kernel, stride, dilation = as_pair(kernel_size), as_pair(stride), as_pair(dilation)
    pad = explicit_padding(padding, in_size, kernel, stride, dilation)
    return tuple((n + lo + hi - d * (k - 1) - 1) // s + 1
                 for n, (lo, hi), k, s, d in zip(in_size, pad, kernel, stride, dilation))


def _zero_pad(x, pad):
    """x (N, C, H, W) in float64 with zeros around: (N, C, H + top + bottom, W + left + right)."""
    (top, bottom), (left, right) = pad
    n, c, h, w = x.shape
    out = numpy.zeros((n, c, h + top + bottom, w + left + right))
    out[:, :, top:top + h, left:left + w] = x
    return out


class _Geometry:
    """Where the window of output pixel (i, j) reads, tap by tap."""

    def __init__(self, in_size, kernel_size, stride, padding, dilation):
        self.kernel = as_pair(kernel_size)
        self.stride = as_pair(stride)
        self.dilation = as_pair(dilation)
        self.pad = explicit_padding(padding, in_size, self.kernel, self.stride, self.dilation)
        self.out = output_size(in_size, self.kernel, self.stride, self.pad, self.dilation)
        assert min(self.out) >= 1, "the reference needs a non-empty output"

    def window(self, i: int, j: int):
        """Index expressions into the padded input for output pixel (i, j): rows and columns of the taps."""
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.stride, self.dilation
        return (slice(i * sh, i * sh + dh * (kh - 1) + 1, dh), slice(j * sw, j * sw + dw * (kw - 1) + 1, dw))

    def pixels(self):
        for i in range(self.out[0]):
            for j in range(self.out[1]):
                yield i, j

    def crop(self, padded, in_size):
        (top, _), (left, _) = self.pad
        return padded[..., top:top + in_size[0], left:left + in_size[1]]


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """out[n, d, i, j] = bias[d] + sum over c, p, q of xpad[n, g*Cg + c, i*sh + p*dh, j*sw + q*dw] * w[d, c, p, q]
    with g = d // (D / groups) and Cg = C / groups.  x (N, C, H, W), weight (D, Cg, kH, kW)."""
    x, weight = numpy.asarray(x, numpy.float64), numpy.asarray(weight, numpy.float64)
    n, c, h, w = x.shape
    d_out, cg, kh, kw = weight.shape
    assert c == cg * groups and d_out % groups == 0
    geo = _Geometry((h, w), (kh, kw), stride, padding, dilation)
    xp = _zero_pad(x, geo.pad)
    dg = d_out // groups
    out = numpy.zeros((n, d_out, *geo.out))
    for b in range(n):
        for d in range(d_out):
            g = d // dg
            for i, j in geo.pixels():
                rows, cols = geo.window(i, j)
                out[b, d, i, j] = numpy.sum(xp[b, g * cg:(g + 1) * cg, rows, cols] * weight[d])
    if bias is not None:
        out += numpy.asarray(bias, numpy.float64)[:, None, None]
    return out


def conv2d_grads(grad_output, x, weight, stride=1, padding=0, dilation=1, groups=1):
    """(grad_x, grad_weight, grad_bias) of conv2d by the chain rule on the sum above, output pixel by pixel:
    each out[n, d, i, j] spreads grad * w[d] onto its window of x and grad * window onto w[d]."""
    gy = numpy.asarray(grad_output, numpy.float64)
    x, weight = numpy.asarray(x, numpy.float64), numpy.asarray(weight, numpy.float64)
    n, c, h, w = x.shape
    d_out, cg, kh, kw = weight.shape
    geo = _Geometry((h, w), (kh, kw), stride, padding, dilation)
    assert gy.shape == (n, d_out, *geo.out)
    xp = _zero_pad(x, geo.pad)
    grad_xp = numpy.zeros_like(xp)
    grad_w = numpy.zeros_like(weight)
    dg = d_out // groups
    for b in range(n):
        for d in range(d_out):
            g = d // dg
            for i, j in geo.pixels():
                rows, cols = geo.window(i, j)
                grad_xp[b, g * cg:(g + 1) * cg, rows, cols] += gy[b, d, i, j] * weight[d]
                grad_w[d] += gy[b, d, i, j] * xp[b, g * cg:(g + 1) * cg, rows, cols]
    grad_b = gy.sum(axis=(0, 2, 3))
    return geo.crop(grad_xp, (h, w)), grad_w, grad_b


def depthwise_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1):
    """Depthwise is conv2d with groups = C and weight (C * m, 1, kH, kW)."""
    return conv2d(x, weight, bias, stride, padding, dilation, groups=numpy.shape(x)[1])


def depthwise_conv2d_grads(grad_output, x, weight, stride=1, padding=0, dilation=1):
    return conv2d_grads(grad_output, x, weight, stride, padding, dilation, groups=numpy.shape(x)[1])


def patch_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """conv2d applied to every patch x[idx] (C, H, W) on its own, idx over the leading dims."""
    x = numpy.asarray(x, numpy.float64)
    lead = x.shape[:-3]
    results = {}
    for idx in numpy.ndindex(*lead):
        results[idx] = conv2d(x[idx][None], weight, bias, stride, padding, dilation, groups)[0]
    size = output_size(x.shape[-2:], numpy.shape(weight)[2:], stride, padding, dilation)
    out = numpy.zeros((*lead, numpy.shape(weight)[0], *size))
    for idx, value in results.items():
        out[idx] = value
    return out


def patch_conv2d_grads(grad_output, x, weight, stride=1, padding=0, dilation=1, groups=1):
    """Patch by patch conv2d_grads; the weight and bias gradients are summed over patches."""
    x, gy = numpy.asarray(x, numpy.float64), numpy.asarray(grad_output, numpy.float64)
    grad_x = numpy.zeros(x.shape)
    grad_w = numpy.zeros(numpy.shape(weight))
    grad_b = numpy.zeros(numpy.shape(weight)[0])
    for idx in numpy.ndindex(*x.shape[:-3]):
        gx, gw, gb = conv2d_grads(gy[idx][None], x[idx][None], weight, stride, padding, dilation, groups)
        grad_x[idx] = gx[0]
        grad_w += gw
        grad_b += gb
    return grad_x, grad_w, grad_b


def unfold(x, kernel_size, dilation=1, padding=0, stride=1):
    """cols[..., (c * kH + p) * kW + q, i * oW + j] = xpad[..., c, i*sh + p*dh, j*sw + q*dw]."""
    x = numpy.asarray(x, numpy.float64)
    lead, (c, h, w) = x.shape[:-3], x.shape[-3:]
    geo = _Geometry((h, w), kernel_size, stride, padding, dilation)
    (kh, kw), ow = geo.kernel, geo.out[1]
    xp = _zero_pad(x.reshape(-1, c, h, w), geo.pad)
    cols = numpy.zeros((xp.shape[0], c, kh, kw, geo.out[0] * ow))
    for i, j in geo.pixels():
        rows, columns = geo.window(i, j)
        cols[..., i * ow + j] = xp[:, :, rows, columns]
    return cols.reshape(*lead, c * kh * kw, geo.out[0] * ow)


def fold(cols, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """The sum of every column entry onto the input pixel unfold read it from: cols (..., C*kH*kW, L) ->
    (..., C, H, W); overlapping windows add up, entries that fall into the padding are dropped."""
    cols = numpy.asarray(cols, numpy.float64)
    size = as_pair(output_size)
    geo = _Geometry(size, kernel_size, stride, padding, dilation)
    (kh, kw), ow = geo.kernel, geo.out[1]
    lead, (rows_total, blocks) = cols.shape[:-2], cols.shape[-2:]
    c = rows_total // (kh * kw)
    assert c * kh * kw == rows_total and blocks == geo.out[0] * ow
    flat = cols.reshape(-1, c, kh, kw, blocks)
    (top, bottom), (left, right) = geo.pad
    xp = numpy.zeros((flat.shape[0], c, size[0] + top + bottom, size[1] + left + right))
    for i, j in geo.pixels():
        rows, columns = geo.window(i, j)
        xp[:, :, rows, columns] += flat[..., i * ow + j]
    return geo.crop(xp, size).reshape(*lead, c, *size)


# ---------------------------------------------------------------------------------------------------------
# Part 2: torch CPU oracles with cupyconv's argument conventions (import torch lazily)


def _torch():
    import torch
    return torch


def torch_pad(x, padding, kernel_size, stride=1, dilation=1):
    """x (..., C, H, W) zero-padded per side for `padding` in cupyconv's conventions."""
    import torch.nn.functional as F
    (top, bottom), (left, right) = explicit_padding(padding, tuple(x.shape[-2:]), kernel_size, stride, dilation)
    return F.pad(x, (left, right, top, bottom))


def torch_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """F.conv2d over any leading dims (rolled into the batch) with any cupyconv padding."""
    import torch.nn.functional as F
    lead = x.shape[:-3]
    flat = x.reshape(-1, *x.shape[-3:])
    padded = torch_pad(flat, padding, tuple(weight.shape[-2:]), stride, dilation)
    out = F.conv2d(padded, weight, bias, stride=as_pair(stride), padding=0, dilation=as_pair(dilation),
                   groups=groups)
    return out.reshape(*lead, *out.shape[1:])


def torch_conv2d_grads(grad_output, x, weight, stride=1, padding=0, dilation=1, groups=1, with_bias=True):
    """(grad_x, grad_weight, grad_bias) of torch_conv2d by torch.autograd.grad (grad_bias None without bias)."""
    torch = _torch()
    x = x.detach().clone().requires_grad_(True)
    weight = weight.detach().clone().requires_grad_(True)
    inputs = [x, weight]
    bias = None
    if with_bias:
        bias = torch.zeros(weight.shape[0], dtype=weight.dtype, requires_grad=True)
        inputs.append(bias)
    out = torch_conv2d(x, weight, bias, stride, padding, dilation, groups)
    grads = torch.autograd.grad(out, inputs, grad_output)
    return tuple(grads) if with_bias else (*grads, None)


def torch_unfold(x, kernel_size, dilation=1, padding=0, stride=1):
    """F.unfold over any leading dims with any cupyconv padding."""
    import torch.nn.functional as F
    lead = x.shape[:-3]
    flat = x.reshape(-1, *x.shape[-3:])
    padded = torch_pad(flat, padding, as_pair(kernel_size), stride, dilation)
    out = F.unfold(padded, as_pair(kernel_size), dilation=as_pair(dilation), padding=0, stride=as_pair(stride))
    return out.reshape(*lead, *out.shape[1:])


def torch_fold(cols, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """F.fold over any leading dims with any cupyconv padding: fold onto the padded plane, then crop."""
    import torch.nn.functional as F
    size = as_pair(output_size)
    (top, bottom), (left, right) = explicit_padding(padding, size, kernel_size, stride, dilation)
    lead = cols.shape[:-2]
    flat = cols.reshape(-1, *cols.shape[-2:])
    padded_size = (size[0] + top + bottom, size[1] + left + right)
    out = F.fold(flat, padded_size, as_pair(kernel_size), dilation=as_pair(dilation), padding=0,
                 stride=as_pair(stride))
    out = out[..., top:top + size[0], left:left + size[1]]
    return out.reshape(*lead, *out.shape[1:])


def torch_vjp(fn, primal, cotangent):
    """The gradient of <fn(primal), cotangent> with respect to primal, by torch.autograd.grad."""
    torch = _torch()
    primal = primal.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(primal), primal, cotangent)
    return grad


# ---------------------------------------------------------------------------------------------------------
# Part 3: data, tolerances and comparisons shared by the test modules

#: (rtol, atol) for comparing a result in the given dtype with the float64 reference on N(0, 1) data and
#: sums of at most a few hundred products.  Half types are computed in float32 and rounded once.
TOLERANCE = {
    "float64": (1e-10, 1e-10),
    "float32": (2e-5, 1e-4),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
}


def random(rng, shape, dtype=numpy.float64):
    """Fresh N(0, 1) data (never zeros), in dtype."""
    return rng.standard_normal(shape).astype(dtype)


def assert_close(actual, expected, dtype="float64", err_msg=""):
    """Compare with the per-dtype tolerance, NaN and inf positions included."""
    name = dtype if isinstance(dtype, str) else numpy.dtype(dtype).name
    rtol, atol = TOLERANCE[name]
    actual, expected = to_float64(actual), to_float64(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape} {err_msg}"
    numpy.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=err_msg)


def to_float64(a):
    """A NumPy float64 copy of a NumPy array or a torch tensor (of any float dtype)."""
    if isinstance(a, numpy.ndarray):
        return a.astype(numpy.float64)
    if type(a).__module__.startswith("torch"):
        return a.detach().to(dtype=_torch().float64).cpu().numpy()
    return numpy.asarray(a, numpy.float64)


def cuda_torch():
    """torch, for a test that hands cupyconv CUDA tensors: the test is skipped where torch is missing or was built
    without CUDA."""
    import pytest
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


def numerical_gradient(f, x, eps=1e-6):
    """Central finite differences of the scalar f() with respect to every entry of the float64 array x (which
    f reads, and which is perturbed in place and restored)."""
    grad = numpy.zeros_like(x)
    for idx in numpy.ndindex(*x.shape):
        saved = x[idx]
        x[idx] = saved + eps
        plus = f()
        x[idx] = saved - eps
        minus = f()
        x[idx] = saved
        grad[idx] = (plus - minus) / (2 * eps)
    return grad


#: Settings for the hypothesis property tests: modest, no deadline (the machine is shared), no example
#: database written into the checkout.
PROPERTY_SETTINGS = dict(max_examples=40, deadline=None, database=None)

NEEDS = ("input", "weight", "bias")

#: Every subset of NEEDS, as tuples (the empty one included).
NEEDS_SUBSETS = [subset for r in range(4) for subset in itertools.combinations(NEEDS, r)]


@dataclass(frozen=True)
class ConvCase:
    """One convolution problem declared as data: shapes and window arguments in cupyconv's conventions.

    x is (..., C, H, W) (exactly 4-D for conv2d and depthwise), weight (D, C // groups, kH, kW).
    """
    name: str
    x: tuple
    weight: tuple
    stride: object = 1
    padding: object = 0
    dilation: object = 1
    groups: int = 1
    bias: bool = True

    def __str__(self) -> str:
        return self.name

    @property
    def window(self) -> dict:
        """stride, padding and dilation as keyword arguments."""
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation)

    @property
    def kwargs(self) -> dict:
        """The keyword arguments of conv2d / patch_conv2d (window and groups)."""
        return dict(self.window, groups=self.groups)

    @property
    def output_shape(self) -> tuple:
        size = output_size(self.x[-2:], self.weight[2:], self.stride, self.padding, self.dilation)
        return (*self.x[:-3], self.weight[0], *size)

    def inputs(self, rng, dtype=numpy.float64):
        """Fresh random (x, weight, bias or None, grad_output) as NumPy arrays of dtype."""
        x = random(rng, self.x, dtype)
        weight = random(rng, self.weight, dtype)
        bias = random(rng, self.weight[:1], dtype) if self.bias else None
        grad_output = random(rng, self.output_shape, dtype)
        return x, weight, bias, grad_output


# ---------------------------------------------------------------------------------------------------------
# Part 4: hypothesis strategies of random specs (hypothesis is imported only when one is built)


def window_specs():
    """(kernel_size, stride, padding, dilation, (H, W)) with a non-empty output; padding in every form."""
    from optional_deps import strategies as st   # inert without hypothesis: the test skips

    def int_or_pair(low, high):
        return st.one_of(st.integers(low, high), st.tuples(st.integers(low, high), st.integers(low, high)))

    side = st.integers(0, 2)
    paddings = st.one_of(side, st.tuples(side, side), st.tuples(st.tuples(side, side), st.tuples(side, side)),
                         st.sampled_from(["same", "valid"]))

    @st.composite
    def build(draw):
        kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
        stride, dilation, padding = draw(int_or_pair(1, 3)), draw(int_or_pair(1, 2)), draw(paddings)
        if padding == "same":
            smallest = (1, 1)
        else:
            pad = explicit_padding(padding, (1, 1), kernel, stride, dilation)
            smallest = tuple(max(1, d * (k - 1) + 1 - lo - hi)
                             for k, d, (lo, hi) in zip(kernel, as_pair(dilation), pad))
        size = tuple(draw(st.integers(low, low + 5)) for low in smallest)
        return kernel, stride, padding, dilation, size

    return build()


def conv_cases(*, leading_dims=None, depthwise=False):
    """ConvCases with random groups (1, 2, 3, and C when there is one channel per group), channels and window.

    leading_dims=None gives a 4-D x (N, C, H, W); an int k gives 0..k leading dims of 1..3 each (patch conv).
    depthwise=True gives groups = C and weight (C * m, 1, kH, kW) with a channel multiplier m of 1..3.
    """
    from optional_deps import strategies as st   # inert without hypothesis: the test skips

    @st.composite
    def build(draw):
        if depthwise:
            channels, multiplier = draw(st.integers(1, 4)), draw(st.integers(1, 3))
            groups, per_group, out_channels = channels, 1, channels * multiplier
        else:
            groups, per_group = draw(st.sampled_from([1, 2, 3])), draw(st.integers(1, 3))
            channels, out_channels = groups * per_group, groups * draw(st.integers(1, 3))
        kernel, stride, padding, dilation, size = draw(window_specs())
        if leading_dims is None:
            lead = (draw(st.integers(1, 2)),)
        else:
            lead = tuple(draw(st.lists(st.integers(1, 3), max_size=leading_dims)))
        return ConvCase("hypothesis", (*lead, channels, *size), (out_channels, per_group, *kernel), stride,
                        padding, dilation, groups, draw(st.booleans()))

    return build()


# ---------------------------------------------------------------------------------------------------------
# Part 5: the comparisons test_conv, test_depthwise and test_patch run on their op (pytest imported lazily)


class ConvChecks:
    """The checks of one convolution op (conv2d, depthwise_conv2d or patch_conv2d) against the oracles above.

    Each check is a function of the op callables (`CHECKS.forward(conv2d, case, dtype)`, ...), so the same cases
    can run through another executor, e.g. inside `cupyconv._device.use_device(...)`.  `reference` and
    `reference_grads` are the op's float64 oracles (`conv2d` and `conv2d_grads`, ...), called with the op's own
    arguments; the torch oracle is `torch_conv2d` with `case.kwargs` (groups included) for every op.
    `groups=False` is for an op without a groups argument (depthwise: groups = C), which takes `case.window`.
    """

    def __init__(self, reference, reference_grads, groups=True):
        self.reference, self.reference_grads, self.groups = reference, reference_grads, groups

    def args(self, case) -> dict:
        """The keyword arguments of the op (and of its float64 oracles) for case."""
        return case.kwargs if self.groups else case.window

    def forward(self, op, case, dtype="float64", seed=0):
        """op on NumPy arrays of dtype against the float64 reference on the same (rounded) inputs."""
        x, weight, bias, _ = case.inputs(numpy.random.default_rng(seed), dtype)
        out = op(x, weight, bias, **self.args(case))
        assert isinstance(out, numpy.ndarray)
        assert out.dtype == numpy.dtype(dtype) and out.shape == case.output_shape
        assert_close(out, self.reference(x, weight, bias, **self.args(case)), dtype, err_msg=case.name)

    def backward(self, op_backward, case, dtype="float64", seed=0):
        """Every gradient against the reference's, in dtype."""
        x, weight, _, grad_output = case.inputs(numpy.random.default_rng(seed), dtype)
        grads = op_backward(grad_output, x, weight, **self.args(case))
        expected = self.reference_grads(grad_output, x, weight, **self.args(case))
        shapes = (case.x, case.weight, case.weight[:1])
        for name, got, want, shape in zip(NEEDS, grads, expected, shapes):
            assert got.dtype == numpy.dtype(dtype) and got.shape == shape, name
            assert_close(got, want, dtype, err_msg=f"{case.name}: grad {name}")

    def against_torch(self, op, op_backward, case, dtype="float32", seed=0):
        """Forward and every gradient against F.conv2d (leading dims rolled into the batch) and
        torch.autograd.grad in the same dtype."""
        import pytest
        torch = pytest.importorskip("torch")
        x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(seed), dtype)
        t = {name: None if a is None else torch.from_numpy(a)
             for name, a in dict(x=x, weight=weight, bias=bias, grad_output=grad_output).items()}
        out = op(x, weight, bias, **self.args(case))
        assert_close(out, torch_conv2d(t["x"], t["weight"], t["bias"], **case.kwargs), dtype, case.name)
        grads = op_backward(grad_output, x, weight, **self.args(case))
        expected = torch_conv2d_grads(t["grad_output"], t["x"], t["weight"], **case.kwargs)
        for name, got, want in zip(NEEDS, grads, expected):
            assert_close(got, want, dtype, err_msg=f"{case.name}: grad {name}")

    def bfloat16(self, op, op_backward, case, seed=0):
        """bfloat16 torch tensors in, bfloat16 out, against the float64 reference on the bfloat16 values."""
        import pytest
        torch = pytest.importorskip("torch")
        arrays = case.inputs(numpy.random.default_rng(seed), numpy.float32)
        x, weight, bias, grad_output = (None if a is None else torch.from_numpy(a).to(torch.bfloat16)
                                        for a in arrays)
        x64, w64, b64, gy64 = (None if a is None else to_float64(a) for a in (x, weight, bias, grad_output))
        out = op(x, weight, bias, **self.args(case))
        assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
        assert_close(out, self.reference(x64, w64, b64, **self.args(case)), "bfloat16", case.name)
        grads = op_backward(grad_output, x, weight, **self.args(case))
        for name, got, want in zip(NEEDS, grads, self.reference_grads(gy64, x64, w64, **self.args(case))):
            assert got.dtype == torch.bfloat16, name
            assert_close(got, want, "bfloat16", err_msg=f"{case.name}: grad {name}")

    def finite_differences(self, op, op_backward, case, seed=0):
        """The manual backward against central differences of <op(x, w, b), r> in float64."""
        x, weight, bias, r = case.inputs(numpy.random.default_rng(seed))
        bias = bias if bias is not None else numpy.zeros(case.weight[0])

        def loss():
            return float(numpy.sum(op(x, weight, bias, **self.args(case)) * r))

        grads = op_backward(r, x, weight, **self.args(case))
        for name, got, wrt in zip(NEEDS, grads, (x, weight, bias)):
            numpy.testing.assert_allclose(got, numerical_gradient(loss, wrt), rtol=1e-6, atol=1e-7,
                                          err_msg=f"{case.name}: grad {name}")

    def needs(self, op_backward, case, needs, seed=1):
        """op_backward(..., needs=needs) returns exactly the full call's gradients that were requested (a name
        or a tuple of names from NEEDS) and None for the others, always three."""
        x, weight, _, grad_output = case.inputs(numpy.random.default_rng(seed))
        full = op_backward(grad_output, x, weight, **self.args(case))
        part = op_backward(grad_output, x, weight, needs=needs, **self.args(case))
        requested = (needs,) if isinstance(needs, str) else needs
        assert len(part) == 3
        for name, got, want in zip(NEEDS, part, full):
            if name in requested:
                numpy.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)
            else:
                assert got is None, name

    def matches_reference(self, op, op_backward, case, x, weight, bias, grad_output):
        """op and op_backward on these very arrays (views of any strides) against the float64 reference."""
        assert_close(op(x, weight, bias, **self.args(case)), self.reference(x, weight, bias, **self.args(case)))
        grads = op_backward(grad_output, x, weight, **self.args(case))
        for got, want in zip(grads, self.reference_grads(grad_output, x, weight, **self.args(case))):
            assert_close(got, want)
