"""1-D and 3-D convolutions, transposed convolutions and N-d unfold/fold (issue 13).

References are independent of cupyconv: torch.nn.functional on the CPU in float64 (conv1d, conv3d,
conv_transpose*d, unfold), a naive window loop for 3-D unfold, central finite differences.  Per-side padding,
which torch lacks, is checked against torch on a pre-padded input (convolution) or on a cropped full output
(transposed convolution).  The kernel path runs through the CPU emulator (poisoned outputs), float64 against
the CPU path, and float16/float32 on the tensor cores where they apply; `-m gpu` runs the same on CuPy.
"""
import math

import numpy
import pytest

import cupyconv
import reference as ref
from cupyconv import _device
from cupyconv._spec import ConvSpec
from cupyconv.ops import lift
from emulator import EmulatedDevice

torch = pytest.importorskip("torch")
F = torch.nn.functional

TORCH_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TORCH_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
CONV = {1: cupyconv.conv1d, 2: cupyconv.conv2d, 3: cupyconv.conv3d}
CONV_BACKWARD = {1: cupyconv.conv1d_backward, 2: cupyconv.conv2d_backward, 3: cupyconv.conv3d_backward}
TRANSPOSE = {1: cupyconv.conv_transpose1d, 2: cupyconv.conv_transpose2d, 3: cupyconv.conv_transpose3d}
TRANSPOSE_BACKWARD = {1: cupyconv.conv_transpose1d_backward, 2: cupyconv.conv_transpose2d_backward,
                      3: cupyconv.conv_transpose3d_backward}
NEEDS = ("input", "weight", "bias")


def t(a, grad=False):
    return torch.tensor(numpy.asarray(a, numpy.float64), requires_grad=grad)


def sides(padding, nd):
    """Per-side padding as F.pad's flat list (last dim first)."""
    if isinstance(padding, int):
        padding = (padding,) * nd
    pairs = [p if isinstance(p, (tuple, list)) else (p, p) for p in padding]
    return [v for pair in reversed(pairs) for v in pair]


def torch_conv(nd, x, w, b, stride, padding, dilation, groups, grad_output=None):
    """torch's output (and gradients when grad_output is given), per-side padding through F.pad."""
    xt, wt = t(x, True), t(w, True)
    bt = None if b is None else t(b, True)
    y = TORCH_CONV[nd](F.pad(xt, sides(padding, nd)), wt, bt, stride, 0, dilation, groups)
    if grad_output is None:
        return y.detach().numpy()
    y.backward(t(grad_output))
    return y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy(), None if b is None else bt.grad.numpy()


# (x shape, weight shape, stride, padding (per-dim ints or per-side pairs), dilation, groups)
CONV_CASES = {
    "1d-plain": ((2, 3, 13), (4, 3, 3), 1, 1, 1, 1),
    "1d-strided-dilated-groups": ((2, 6, 17), (4, 3, 3), 2, ((2, 1),), 2, 2),
    "1d-kernel-wider-than-input": ((1, 2, 4), (3, 2, 6), 1, ((2, 1),), 1, 1),
    "3d-plain": ((2, 3, 5, 6, 7), (4, 3, 3, 3, 3), 1, 1, 1, 1),
    "3d-everything": ((2, 6, 7, 8, 9), (4, 3, 3, 2, 3), (2, 1, 2), ((1, 2), (0, 1), (2, 0)), (2, 1, 1), 2),
    "3d-depth-stride-over-kernel": ((1, 2, 9, 5, 4), (3, 2, 2, 3, 1), (3, 1, 2), ((0, 2), (1, 1), (0, 0)), 1, 1),
    "3d-depth-dilation-pad-over-input": ((1, 4, 3, 4, 5), (2, 2, 3, 2, 2), 1, ((3, 2), (0, 0), (1, 0)), (2, 1, 2),
                                         2),
    "3d-pointwise": ((2, 5, 3, 4, 2), (3, 5, 1, 1, 1), 1, 0, 1, 1),
}


def conv_inputs(case, seed=0, dtype=numpy.float64):
    xs, ws, stride, padding, dilation, groups = CONV_CASES[case]
    rng = numpy.random.default_rng(seed)
    x, w, b = ref.random(rng, xs, dtype), ref.random(rng, ws, dtype), ref.random(rng, (ws[0],), dtype)
    kwargs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    y = torch_conv(len(xs) - 2, x, w, b, **kwargs)
    return x, w, b, ref.random(rng, y.shape, dtype), kwargs


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_matches_torch(case):
    x, w, b, gy, kwargs = conv_inputs(case)
    nd = x.ndim - 2
    want, gx, gw, gb = torch_conv(nd, x, w, b, grad_output=gy, **kwargs)
    ref.assert_close(CONV[nd](x, w, b, **kwargs), want)
    ref.assert_close(cupyconv.conv_nd(x, w, b, **kwargs), want)
    for got, expected in zip(CONV_BACKWARD[nd](gy, x, w, **kwargs), (gx, gw, gb)):
        ref.assert_close(got, expected)
    got = cupyconv.conv_nd_backward(gy, x, w, needs="weight", **kwargs)
    assert got[0] is None and got[2] is None
    ref.assert_close(got[1], gw)


def test_same_padding_3d_any_stride():
    """'same' in 3-D: output ceil(in / stride) per dim, the odd pixel of padding at the high end (JAX's rule)."""
    rng = numpy.random.default_rng(3)
    x, w = ref.random(rng, (1, 2, 7, 6, 5)), ref.random(rng, (3, 2, 4, 3, 2))
    for stride in (1, (2, 3, 1)):
        got = cupyconv.conv3d(x, w, padding="same", stride=stride)
        s = (stride,) * 3 if isinstance(stride, int) else stride
        assert got.shape[2:] == tuple(math.ceil(n / k) for n, k in zip(x.shape[2:], s))
        pads = []
        for n, k, st in zip(x.shape[2:], w.shape[2:], s):
            total = max((math.ceil(n / st) - 1) * st + k - n, 0)
            pads.append((total // 2, total - total // 2))
        ref.assert_close(got, torch_conv(3, x, w, None, s, pads, 1, 1))


def test_several_workspace_chunks_3d():
    """A workspace of one image's depth windows: the batch runs in chunks; the parameter gradients are summed
    over them."""
    x, w, b, gy, kwargs = conv_inputs("3d-everything")
    want = torch_conv(3, x, w, b, grad_output=gy, **kwargs)
    one_image = 7 * 6 * 3 * 8 * 9 * 8   # oD * C * kD * H * W * itemsize: under two images' worth
    ref.assert_close(cupyconv.conv3d(x, w, b, workspace_limit=one_image, **kwargs), want[0])
    for got, expected in zip(cupyconv.conv3d_backward(gy, x, w, workspace_limit=one_image, **kwargs), want[1:]):
        ref.assert_close(got, expected)


@pytest.mark.parametrize("case", ["3d-everything", "3d-depth-stride-over-kernel", "3d-depth-dilation-pad-over-input"])
@pytest.mark.parametrize("images", [1, 3])
def test_slabs_of_output_depths_3d(monkeypatch, case, images):
    """A limit of one or three images' depth windows: an image's backward (its windows, their gradient, its
    grad_output copy) passes half of it, so it runs in slabs of its output depths (one or more each, uneven where
    they do not divide); at three, where one output depth's take under half the limit, each 2-D run inside keeps
    half the limit or more (not 1 byte).  torch's output and gradients: the slabs' input gradients summed onto
    shared input depths, the parameter gradients over the slabs; float16 sums its input gradient in float32 across
    its slabs."""
    x, w, b, gy, kwargs = conv_inputs(case, seed=images)
    want = torch_conv(3, x, w, b, grad_output=gy, **kwargs)
    spec = ConvSpec.for_conv("conv3d", x, w, b, kwargs["stride"], kwargs["padding"], kwargs["dilation"],
                             kwargs["groups"], nd=3)
    limit = images * lift.depth_window_bytes(spec, 8)
    chunks, inner_limits, chunks_of = [], [], lift._depth_chunks

    def recorded(*args):
        for images_, depths, inner in chunks_of(*args):
            chunks.append((images_, depths))
            inner_limits.append(inner)
            yield images_, depths, inner
    monkeypatch.setattr(lift, "_depth_chunks", recorded)
    ref.assert_close(cupyconv.conv3d(x, w, b, workspace_limit=limit, **kwargs), want[0])
    for got, expected in zip(cupyconv.conv3d_backward(gy, x, w, workspace_limit=limit, **kwargs), want[1:]):
        ref.assert_close(got, expected)
    assert any(len(depths) < spec.out_size[0] for _, depths in chunks)
    assert images == 1 or min(inner_limits) >= limit // 2, inner_limits
    half = [a.astype(numpy.float16) for a in (x, w, b, gy)]
    want16 = torch_conv(3, *half[:3], grad_output=half[3], **kwargs)
    got16 = cupyconv.conv3d_backward(half[3], *half[:2], workspace_limit=limit // 4, **kwargs)
    for got, expected in zip(got16, want16[1:]):
        assert got.dtype == numpy.float16
        assert_close_to_scale(got, expected, 4e-3)


@pytest.mark.parametrize("nd", [1, 3])
def test_depthwise_with_multiplier(nd):
    rng = numpy.random.default_rng(nd)
    size = (11,) if nd == 1 else (4, 5, 6)
    x, w, b = ref.random(rng, (2, 3, *size)), ref.random(rng, (6, 1, *(3,) * nd)), ref.random(rng, (6,))
    fn = {1: (cupyconv.depthwise_conv1d, cupyconv.depthwise_conv1d_backward),
          3: (cupyconv.depthwise_conv3d, cupyconv.depthwise_conv3d_backward)}[nd]
    want = torch_conv(nd, x, w, b, 2, 1, 1, 3, grad_output=None)
    gy = ref.random(rng, want.shape)
    want, *grads = torch_conv(nd, x, w, b, 2, 1, 1, 3, grad_output=gy)
    ref.assert_close(fn[0](x, w, b, stride=2, padding=1), want)
    for got, expected in zip(fn[1](gy, x, w, stride=2, padding=1), grads):
        ref.assert_close(got, expected)


@pytest.mark.parametrize("nd", [1, 3])
def test_patch_conv_reads_inside_each_patch(nd):
    """(B, P, C, *patch): the same as convolving each patch alone; the padding lies inside every patch."""
    rng = numpy.random.default_rng(10 + nd)
    size = (6,) if nd == 1 else (3, 4, 4)
    x, w, b = ref.random(rng, (2, 3, 4, *size)), ref.random(rng, (6, 2, *(3,) * nd)), ref.random(rng, (6,))
    fn, bwd = {1: (cupyconv.patch_conv1d, cupyconv.patch_conv1d_backward),
               3: (cupyconv.patch_conv3d, cupyconv.patch_conv3d_backward)}[nd]
    flat = x.reshape(6, 4, *size)
    want = torch_conv(nd, flat, w, b, 1, 1, 1, 2)
    gy = ref.random(rng, want.shape)
    want, *grads = torch_conv(nd, flat, w, b, 1, 1, 1, 2, grad_output=gy)
    ref.assert_close(fn(x, w, b, padding=1, groups=2), want.reshape(2, 3, *want.shape[1:]))
    got = bwd(gy.reshape(2, 3, *gy.shape[1:]), x, w, padding=1, groups=2)
    ref.assert_close(got[0], grads[0].reshape(x.shape))
    ref.assert_close(got[1], grads[1])
    ref.assert_close(got[2], grads[2])


# ---------------------------------------------------------------------------------------------------------
# Transposed convolution

# (x shape, weight shape (C_in, C_out / groups, k...), stride, padding, output_padding, groups, dilation)
TRANSPOSE_CASES = {
    "t-1d-plain": ((2, 4, 7), (4, 3, 3), 1, 0, 0, 1, 1),
    "t-1d-upsample": ((2, 4, 7), (4, 3, 4), 2, 1, 1, 2, 1),
    "t-2d-decoder": ((2, 6, 5, 4), (6, 2, 4, 4), 2, 1, 0, 1, 1),
    "t-2d-everything": ((1, 6, 4, 5), (6, 2, 3, 2), (2, 3), (1, 0), (1, 2), 3, (1, 2)),
    "t-2d-output-padding-from-dilation": ((2, 4, 5, 5), (4, 3, 3, 3), 1, 1, 1, 2, 2),
    "t-2d-depthwise": ((2, 4, 5, 6), (4, 1, 3, 3), 2, 1, 1, 4, 1),
    "t-3d-plain": ((1, 4, 3, 4, 5), (4, 2, 3, 3, 3), 1, 1, 0, 1, 1),
    "t-3d-everything": ((2, 4, 3, 4, 3), (4, 3, 2, 3, 3), (2, 1, 3), (0, 1, 2), (1, 0, 2), 2, (1, 2, 1)),
}


def transpose_inputs(case, seed=0, dtype=numpy.float64):
    xs, ws, stride, padding, output_padding, groups, dilation = TRANSPOSE_CASES[case]
    rng = numpy.random.default_rng(seed)
    x, w, b = ref.random(rng, xs, dtype), ref.random(rng, ws, dtype), ref.random(rng, (ws[1] * groups,), dtype)
    kwargs = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
    return x, w, b, kwargs


def torch_transpose(x, w, b, grad_output=None, **kwargs):
    xt, wt, bt = t(x, True), t(w, True), t(b, True)
    y = TORCH_TRANSPOSE[x.ndim - 2](xt, wt, bt, **kwargs)
    if grad_output is None:
        return y.detach().numpy()
    y.backward(t(grad_output))
    return y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy()


def transpose_problem(case, dtype=numpy.float64):
    """A case's inputs, a random grad_output and torch's results: (x, w, b, gy, kwargs, output, gradients)."""
    x, w, b, kwargs = transpose_inputs(case, dtype=dtype)
    gy = ref.random(numpy.random.default_rng(1), torch_transpose(x, w, b, **kwargs).shape, dtype)
    want, *grads = torch_transpose(x, w, b, gy, **kwargs)
    return x, w, b, gy, kwargs, want, grads


@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_transpose_matches_torch(case):
    x, w, b, gy, kwargs, want, grads = transpose_problem(case)
    nd = x.ndim - 2
    ref.assert_close(TRANSPOSE[nd](x, w, b, **kwargs), want)
    ref.assert_close(cupyconv.conv_transpose_nd(x, w, b, **kwargs), want)
    for got, expected in zip(TRANSPOSE_BACKWARD[nd](gy, x, w, **kwargs), grads):
        ref.assert_close(got, expected)
    got = cupyconv.conv_transpose_nd_backward(gy, x, w, needs=("input",), **kwargs)
    assert got[1] is None and got[2] is None
    ref.assert_close(got[0], grads[0])


def test_transpose_per_side_padding_crops_the_full_output():
    """Padding (low, high) per side removes low rows at the start and high at the end of the unpadded output."""
    rng = numpy.random.default_rng(5)
    x, w, b = ref.random(rng, (2, 3, 4, 5)), ref.random(rng, (3, 2, 3, 3)), ref.random(rng, (2,))
    full = torch_transpose(x, w, b, stride=2)
    got = cupyconv.conv_transpose2d(x, w, b, stride=2, padding=((2, 0), (1, 3)))
    ref.assert_close(got, full[:, :, 2:, 1:full.shape[3] - 3])


def test_transpose_is_the_adjoint_of_conv():
    """<conv(z), x> == <z, conv_transpose(x)> with the same weight, for every geometry of a case."""
    rng = numpy.random.default_rng(6)
    for case in TRANSPOSE_CASES:
        x, w, _, kwargs = transpose_inputs(case, seed=7)
        y = cupyconv.conv_transpose_nd(x, w, **kwargs)
        z = ref.random(rng, y.shape)
        conv_kwargs = {k: v for k, v in kwargs.items() if k != "output_padding"}
        conv_z = cupyconv.conv_nd(z, w, **conv_kwargs)
        conv_z = conv_z[(slice(None), slice(None), *(slice(0, n) for n in x.shape[2:]))]
        assert numpy.isclose((conv_z * x).sum(), (z * y).sum(), rtol=1e-10), case


def test_finite_differences():
    """The hand-written backward of conv3d and conv_transpose1d against central differences."""
    rng = numpy.random.default_rng(8)
    x, w, b = ref.random(rng, (1, 2, 4, 3, 3)), ref.random(rng, (2, 1, 2, 2, 2)), ref.random(rng, (2,))
    kwargs = dict(stride=(2, 1, 1), padding=((1, 0), (0, 1), (1, 1)), groups=2)
    gy = ref.random(rng, cupyconv.conv3d(x, w, b, **kwargs).shape)
    grads = cupyconv.conv3d_backward(gy, x, w, **kwargs)
    for got, arg in zip(grads, (x, w, b)):
        f = lambda: (cupyconv.conv3d(x, w, b, **kwargs) * gy).sum()  # noqa: E731
        ref.assert_close(got, ref.numerical_gradient(f, arg), "float32")   # differences carry ~1e-9 of error
    x, w, b = ref.random(rng, (2, 2, 5)), ref.random(rng, (2, 3, 3)), ref.random(rng, (3,))
    kwargs = dict(stride=2, padding=1, output_padding=1, dilation=2)
    gy = ref.random(rng, cupyconv.conv_transpose1d(x, w, b, **kwargs).shape)
    grads = cupyconv.conv_transpose1d_backward(gy, x, w, **kwargs)
    for got, arg in zip(grads, (x, w, b)):
        f = lambda: (cupyconv.conv_transpose1d(x, w, b, **kwargs) * gy).sum()  # noqa: E731
        ref.assert_close(got, ref.numerical_gradient(f, arg), "float32")


# ---------------------------------------------------------------------------------------------------------
# unfold / fold over 1 and 3 spatial dims


def naive_unfold_3d(x, k, stride, pads, dilation):
    """Window by window, straight from the definition: rows (c, a, i, j), columns (z, y, x)."""
    n, c = x.shape[:2]
    xp = numpy.pad(x, ((0, 0), (0, 0), *pads))
    out = [(x.shape[2 + i] + sum(pads[i]) - dilation[i] * (k[i] - 1) - 1) // stride[i] + 1 for i in range(3)]
    cols = numpy.zeros((n, c, *k, *out))
    for z, y, xx in numpy.ndindex(*out):
        for a, i, j in numpy.ndindex(*k):
            cols[:, :, a, i, j, z, y, xx] = xp[:, :, z * stride[0] + a * dilation[0], y * stride[1] + i * dilation[1],
                                               xx * stride[2] + j * dilation[2]]
    return cols.reshape(n, c * math.prod(k), math.prod(out))


def test_unfold_fold_3d():
    rng = numpy.random.default_rng(9)
    x = ref.random(rng, (2, 3, 5, 6, 7))
    k, stride, pads, dilation = (2, 3, 2), (2, 1, 2), ((1, 0), (1, 1), (0, 2)), (1, 2, 1)
    cols = cupyconv.unfold(x, k, dilation, pads, stride)
    ref.assert_close(cols, naive_unfold_3d(x, k, stride, pads, dilation))
    c = ref.random(rng, cols.shape)
    folded = cupyconv.fold(c, (5, 6, 7), k, dilation, pads, stride)
    assert numpy.isclose((cols * c).sum(), (x * folded).sum(), rtol=1e-12)   # fold is unfold's adjoint
    ref.assert_close(cupyconv.unfold_backward(c, (5, 6, 7), k, dilation, pads, stride), folded)


def test_unfold_fold_1d_match_torch_with_a_unit_height():
    rng = numpy.random.default_rng(10)
    x = ref.random(rng, (2, 3, 11))
    cols = cupyconv.unfold(x, (3,), 2, 1, 2)
    ref.assert_close(cols, F.unfold(t(x)[:, :, None], (1, 3), (1, 2), (0, 1), (1, 2)).numpy())
    c = ref.random(rng, cols.shape)
    ref.assert_close(cupyconv.fold(c, (11,), (3,), 2, 1, 2),
                     F.fold(t(c), (1, 11), (1, 3), (1, 2), (0, 1), (1, 2)).numpy()[:, :, 0])


# ---------------------------------------------------------------------------------------------------------
# Errors name the op, the argument and the shapes


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: cupyconv.conv1d(numpy.ones((2, 3, 5, 5)), numpy.ones((4, 3, 3))), ValueError,
     r"^conv1d: x must have 3 dimensions \(N, C, L\), got shape \(2, 3, 5, 5\)"),
    (lambda: cupyconv.conv3d(numpy.ones((2, 3, 5, 5, 5)), numpy.ones((4, 3, 3, 3))), ValueError,
     r"^conv3d: weight must have 5 dimensions \(D, C // groups, kD, kH, kW\), got shape \(4, 3, 3, 3\)"),
    (lambda: cupyconv.conv3d(numpy.ones((1, 2, 4, 4, 4)), numpy.ones((2, 2, 3, 3, 3)), stride=(1, 2)), TypeError,
     r"^conv3d: stride must be an int or a tuple of 3 ints, got \(1, 2\)"),
    (lambda: cupyconv.conv3d(numpy.ones((1, 2, 4, 4, 4)), numpy.ones((2, 2, 3, 3, 3)), padding=((1, 1), 1, 1)),
     TypeError, r"^conv3d: padding must be an int, a tuple of 3 ints, a tuple of 3 \(low, high\) pairs"),
    (lambda: cupyconv.conv3d(numpy.ones((1, 2, 2, 4, 4)), numpy.ones((2, 2, 3, 3, 3))), ValueError,
     r"^conv3d: output size would be 0x2x2 \(input 2x4x4, kernel 3x3x3"),
    (lambda: cupyconv.conv_nd(numpy.ones((1, 2, 4)), numpy.ones((2, 2, 3, 3, 3, 3))), ValueError,
     r"^conv_nd: weight must have 3, 4 or 5 dimensions"),
    (lambda: cupyconv.conv_transpose2d(numpy.ones((1, 4, 5, 5)), numpy.ones((3, 2, 3, 3))), ValueError,
     r"^conv_transpose2d: weight \(3, 2, 3, 3\) has 3 input channels \(weight.shape\[0\]\) but x \(1, 4, 5, 5\) "
     r"has 4"),
    (lambda: cupyconv.conv_transpose2d(numpy.ones((1, 4, 5, 5)), numpy.ones((4, 2, 3, 3)), stride=2,
                                       output_padding=2), ValueError,
     r"^conv_transpose2d: output_padding \(2, 2\) must be smaller than stride \(2, 2\) or dilation"),
    (lambda: cupyconv.conv_transpose1d(numpy.ones((1, 4, 5)), numpy.ones((4, 2, 3)), padding="same"), ValueError,
     r"^conv_transpose1d: padding='same' is not defined"),
    (lambda: cupyconv.conv_transpose1d(numpy.ones((1, 4, 2)), numpy.ones((4, 2, 1)), padding=1), ValueError,
     r"^conv_transpose1d: output size would be 0"),
    (lambda: cupyconv.conv_transpose2d_backward(numpy.ones((1, 2, 6, 6)), numpy.ones((1, 4, 5, 5)),
                                                numpy.ones((4, 2, 3, 3))), ValueError,
     r"^conv_transpose2d_backward: grad_output has shape \(1, 2, 6, 6\) but the forward output .* \(1, 2, 7, 7\)"),
    (lambda: cupyconv.conv_transpose2d(numpy.ones((1, 4, 5, 5)), numpy.ones((4, 2, 3, 3)), algorithm="winograd"),
     ValueError, r"^conv_transpose2d: algorithm must be one of \('auto', 'im2col_gemm', 'direct', 'implicit_gemm'\), "
                 r"got 'winograd'"),
    (lambda: cupyconv.conv_transpose_nd_backward(numpy.ones((1, 2, 7)), numpy.ones((1, 4, 5)), numpy.ones((4, 2, 3)),
                                                 algorithm="fused"), ValueError,
     r"^conv_transpose_nd_backward: algorithm must be one of .*, got 'fused'"),
    (lambda: cupyconv.conv_transpose1d(numpy.ones((1, 4, 5)), numpy.ones((4, 2, 3)), workspace_limit=0), ValueError,
     r"^conv_transpose1d: workspace_limit must be a positive number of bytes, got 0"),
    (lambda: cupyconv.conv_transpose3d_backward(numpy.ones((1, 2, 3, 3, 3)), numpy.ones((1, 4, 1, 1, 1)),
                                                numpy.ones((4, 2, 3, 3, 3)), workspace_limit=2.0**20), TypeError,
     r"^conv_transpose3d_backward: workspace_limit must be None or an int number of bytes, got 1048576.0"),
    (lambda: cupyconv.depthwise_conv3d(numpy.ones((1, 3, 4, 4, 4)), numpy.ones((4, 1, 3, 3, 3))), ValueError,
     r"^depthwise_conv3d: weight must have shape \(C \* m, 1, kD, kH, kW\) with C = 3"),
    (lambda: cupyconv.unfold(numpy.ones((2, 3, 4)), (2, 2, 2, 2)), TypeError,
     r"^unfold: kernel_size must be an int or a tuple of 1, 2 or 3 ints"),
    (lambda: cupyconv.unfold(numpy.ones((3, 4)), (2, 2, 2)), ValueError,
     r"^unfold: x must have at least 4 dimensions \(\.\.\., C, D, H, W\), got shape \(3, 4\)"),
    (lambda: cupyconv.fold(numpy.ones((2, 16, 8)), (4, 4), (2, 2, 2)), TypeError,
     r"^fold: output_size must be an int or a tuple of 3 ints, got \(4, 4\)"),
])
def test_errors(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_torch_tensors_in_and_out():
    x, w, b, _, kwargs = conv_inputs("3d-everything")
    out = cupyconv.conv3d(torch.tensor(x), torch.tensor(w), torch.tensor(b), **kwargs)
    assert isinstance(out, torch.Tensor)
    ref.assert_close(out, cupyconv.conv3d(x, w, b, **kwargs))


# ---------------------------------------------------------------------------------------------------------
# The kernel path: the emulator (poisoned outputs) against the CPU path; CuPy with -m gpu


def kernel_path(device, fn, *args, **kwargs):
    """fn on the emulated kernels (device), or as it is (device None: CuPy arrays go to the GPU)."""
    if device is None:
        return fn(*args, **kwargs)
    with _device.use_device(device):
        return fn(*args, **kwargs)


def assert_close_to_scale(got, want, tolerance, what=""):
    """|got - want| at most `tolerance` times the largest |want|: for results of other summation orders, or with
    16-bit intermediates (the GEMM's columns), whose small entries carry the rounding of the large ones."""
    got, want = ref.to_float64(got), ref.to_float64(want)
    assert got.shape == want.shape, what
    assert numpy.abs(got - want).max() <= tolerance * max(numpy.abs(want).max(), 1e-30), what


def check_kernel_path(device, case, dtype, algorithm, tolerance, to_device=lambda a: a, back=numpy.asarray):
    """conv_nd and its backward for a conv case, or conv_transpose_nd for a transpose case, with `algorithm`."""
    if case in TRANSPOSE_CASES:
        x, w, b, kwargs = transpose_inputs(case, dtype=dtype)
        fwd, bwd = cupyconv.conv_transpose_nd, cupyconv.conv_transpose_nd_backward
    else:
        x, w, b, _, kwargs = conv_inputs(case, dtype=dtype)
        fwd, bwd = cupyconv.conv_nd, cupyconv.conv_nd_backward
    kwargs["algorithm"] = algorithm
    want = fwd(x, w, b, **kwargs)
    gy = ref.random(numpy.random.default_rng(4), want.shape, dtype)
    want_grads = bwd(gy, x, w, **kwargs)
    dev = [to_device(a) for a in (x, w, b, gy)]
    got = kernel_path(device, fwd, *dev[:3], **kwargs)
    grads = kernel_path(device, bwd, dev[3], *dev[:2], **kwargs)
    for name, g, e in zip(("forward", *NEEDS), (got, *grads), (want, *want_grads)):
        assert_close_to_scale(back(g), e, tolerance, f"{case} {dtype} {algorithm}: {name}")


EMULATED = [("1d-strided-dilated-groups", "im2col_gemm"), ("1d-plain", "direct"),
            ("3d-everything", "im2col_gemm"), ("3d-depth-dilation-pad-over-input", "direct"),
            ("t-1d-upsample", "im2col_gemm"), ("t-2d-everything", "direct"), ("t-2d-depthwise", "auto"),
            ("t-3d-everything", "im2col_gemm")]


@pytest.mark.parametrize("case, algorithm", EMULATED, ids=lambda v: str(v))
def test_emulated_kernels_match_cpu_path(case, algorithm):
    check_kernel_path(EmulatedDevice("reverse"), case, numpy.float64, algorithm, 1e-12)


def test_emulated_slabs_of_output_depths_3d():
    """float32 on the emulated kernels under a limit of three images' depth windows: slabs of output depths (their
    input gradients summed in grad_x itself), against torch."""
    x, w, b, gy, kwargs = conv_inputs("3d-everything", seed=5, dtype=numpy.float32)
    want = torch_conv(3, x, w, b, grad_output=gy, **kwargs)
    spec = ConvSpec.for_conv("conv3d", x, w, b, kwargs["stride"], kwargs["padding"], kwargs["dilation"],
                             kwargs["groups"], nd=3)
    options = dict(kwargs, workspace_limit=3 * lift.depth_window_bytes(spec, 4), algorithm="im2col_gemm")
    assert_close_to_scale(kernel_path(EmulatedDevice(), cupyconv.conv3d, x, w, b, **options), want[0], 1e-5)
    got = kernel_path(EmulatedDevice("reverse"), cupyconv.conv3d_backward, gy, x, w, **options)
    for g, expected in zip(got, want[1:]):
        assert_close_to_scale(g, expected, 1e-5)


@pytest.mark.parametrize("op", ["depthwise_conv1d", "depthwise_conv3d", "patch_conv1d", "patch_conv3d"])
def test_emulated_depthwise_and_patch(op):
    """depthwise 1-D on the depthwise kernels (1 x k), 3-D on conv's grouped kernels; patch 1-D/3-D on the patch
    kernels; forward and every gradient against the CPU path."""
    rng = numpy.random.default_rng(14)
    nd = int(op[-2])
    size = (13,) if nd == 1 else (4, 5, 3)
    if op.startswith("depthwise"):
        x, w = ref.random(rng, (2, 3, *size)), ref.random(rng, (6, 1, *(3,) * nd))
        kwargs = dict(stride=2, padding=1)
    else:
        x, w = ref.random(rng, (2, 3, 4, *size)), ref.random(rng, (6, 2, *(3,) * nd))
        kwargs = dict(padding=1, groups=2)
    b = ref.random(rng, (6,))
    fwd, bwd = getattr(cupyconv, op), getattr(cupyconv, op + "_backward")
    want = fwd(x, w, b, **kwargs)
    gy = ref.random(rng, want.shape)
    ref.assert_close(kernel_path(EmulatedDevice("reverse"), fwd, x, w, b, **kwargs), want)
    for got, expected in zip(kernel_path(EmulatedDevice("reverse"), bwd, gy, x, w, **kwargs), bwd(gy, x, w, **kwargs)):
        ref.assert_close(got, expected)


def test_emulated_tensor_cores_3d():
    """float16 3-D on the tensor cores: the depth fold makes C * kD = 16 channels per group."""
    device = EmulatedDevice()
    rng = numpy.random.default_rng(12)
    x, w = ref.random(rng, (1, 8, 4, 5, 6), numpy.float16), ref.random(rng, (16, 8, 2, 3, 3), numpy.float16)
    want = cupyconv.conv3d(x, w, padding=1)
    got = kernel_path(device, cupyconv.conv3d, x, w, padding=1, algorithm="implicit_gemm")
    ref.assert_close(got, want, "float16")


def test_emulated_unfold_fold_3d():
    rng = numpy.random.default_rng(13)
    x = ref.random(rng, (2, 3, 4, 5, 6))
    args = ((2, 3, 2), (1, 2, 1), ((1, 0), (1, 1), (0, 2)), (2, 1, 2))
    cols = kernel_path(EmulatedDevice(), cupyconv.unfold, x, *args)
    ref.assert_close(cols, cupyconv.unfold(x, *args))
    c = ref.random(rng, cols.shape)
    ref.assert_close(kernel_path(EmulatedDevice(), cupyconv.fold, c, (4, 5, 6), *args),
                     cupyconv.fold(c, (4, 5, 6), *args))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("case", ["1d-strided-dilated-groups", "3d-everything", "t-2d-everything", "t-3d-everything"])
def test_gpu_matches_cpu_path(case, dtype):
    import cupy
    tolerance = 1e-12 if dtype == numpy.float64 else 2e-6
    for algorithm in ("auto", "im2col_gemm"):
        check_kernel_path(None, case, dtype, algorithm, tolerance, to_device=cupy.asarray, back=cupy.asnumpy)


class Recorder(EmulatedDevice):
    """Keeps the kernels launched (names without their template arguments) and the arrays each launch receives,
    to see which kernels ran and which inputs they read in place."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.launches, self.arrays = [], []

    def launch(self, source, name, grid, block, args, shared_mem=0):
        self.launches.append(name.partition("<")[0])
        self.arrays += [(name, a) for a in args if isinstance(a, numpy.ndarray)]
        super().launch(source, name, grid, block, args, shared_mem)

    def reads_in_place(self, x) -> bool:
        return any(numpy.shares_memory(a, x) for _, a in self.arrays)


@pytest.mark.parametrize("algorithm", ["im2col_gemm", "direct", "implicit_gemm"])
@pytest.mark.parametrize("nd", [1, 2])
def test_channels_last_inputs_are_read_in_place(nd, algorithm):
    """A channels-last x (an (N, *spatial, C) array viewed as (N, C, *spatial)) reaches conv's kernels uncopied,
    in 1-D (the unit-height view) and 2-D; the result matches the contiguous input's."""
    rng = numpy.random.default_rng(20)
    size = (9,) if nd == 1 else (7, 6)
    dtype = numpy.float16 if algorithm == "implicit_gemm" else numpy.float64
    x = ref.random(rng, (2, *size, 16), dtype)
    view = numpy.moveaxis(x, -1, 1)
    w = ref.random(rng, (16, 16, *(3,) * nd), dtype)
    device = Recorder()
    got = kernel_path(device, cupyconv.conv_nd, view, w, padding=1, algorithm=algorithm)
    assert device.reads_in_place(x), [name for name, _ in device.arrays]
    ref.assert_close(got, cupyconv.conv_nd(numpy.ascontiguousarray(view), w, padding=1), numpy.dtype(dtype).name)


# ---------------------------------------------------------------------------------------------------------
# The transposed convolutions' algorithm and workspace_limit: conv's kernels, in every pass

#: The kernel each algorithm runs in the passes of a transposed convolution (forward: conv's input gradient;
#: grad_input: conv's forward; grad_weight: conv's weight gradient) where every algorithm can run: 'direct' at
#: stride 1 (its weight gradient conv_bwd_weight_direct), 'implicit_gemm' (and so 'auto') in float16 with 16 output
#: channels (conv's input channels); there conv's input gradient and forward both run the channels-last kernel (8
#: and 16 channels: whole 16-byte vectors), and so does the weight gradient (conv_bwd_weight_igemm).
PASS_KERNELS = {"auto": ("conv_fwd_igemm", "conv_fwd_igemm", "conv_bwd_weight_igemm"),
                "im2col_gemm": ("fold_col2im", "unfold_im2col", "unfold_im2col"),
                "direct": ("conv_fwd_direct", "conv_fwd_direct", "conv_bwd_weight_direct"),
                "implicit_gemm": ("conv_fwd_igemm", "conv_fwd_igemm", "conv_bwd_weight_igemm")}


@pytest.mark.parametrize("algorithm", PASS_KERNELS)
def test_transpose_algorithm_chooses_conv_kernels_in_every_pass(algorithm):
    """Each pass runs the algorithm's kernels and matches torch (float16: to 4e-3 of the largest value, as conv's
    kernel tests).  'auto' picks the tensor cores here, so an algorithm dropped on the way to any pass would show
    as their kernel."""
    rng = numpy.random.default_rng(21)
    x, w = ref.random(rng, (2, 8, 5, 6), numpy.float16), ref.random(rng, (8, 16, 3, 3), numpy.float16)
    b = ref.random(rng, (16,), numpy.float16)
    gy = ref.random(rng, (2, 16, 5, 6), numpy.float16)
    want, *grads = torch_transpose(x, w, b, gy, padding=1)
    kernels = {name for names in PASS_KERNELS.values() for name in names}
    device = Recorder()
    assert_close_to_scale(kernel_path(device, cupyconv.conv_transpose2d, x, w, b, padding=1, algorithm=algorithm),
                          want, 4e-3, "forward")
    ran = [set(device.launches) & kernels]
    for i, need in enumerate(("input", "weight")):
        device = Recorder()
        got = kernel_path(device, cupyconv.conv_transpose2d_backward, gy, x, w, padding=1, needs=need,
                          algorithm=algorithm)
        assert_close_to_scale(got[i], grads[i], 4e-3, f"grad {need}")
        ran.append(set(device.launches) & kernels)
    assert ran == [{name} for name in PASS_KERNELS[algorithm]]


@pytest.mark.parametrize("algorithm", ["auto", "im2col_gemm", "direct"])
@pytest.mark.parametrize("case", ["t-1d-plain", "t-2d-everything", "t-2d-output-padding-from-dilation",
                                  "t-3d-everything"])
def test_emulated_transpose_algorithms_match_torch(case, algorithm):
    """float64 on the kernels, strided or not (where 'direct' runs the forward's GEMMs), grouped, 1-D to 3-D."""
    x, w, b, gy, kwargs, want, grads = transpose_problem(case)
    device = EmulatedDevice("reverse")
    ref.assert_close(kernel_path(device, cupyconv.conv_transpose_nd, x, w, b, algorithm=algorithm, **kwargs), want)
    got = kernel_path(device, cupyconv.conv_transpose_nd_backward, gy, x, w, algorithm=algorithm, **kwargs)
    for g, expected in zip(got, grads):
        ref.assert_close(g, expected)


@pytest.mark.parametrize("case", ["t-1d-upsample", "t-2d-decoder", "t-3d-everything"])
def test_transpose_workspace_limit_chunks_every_pass(case):
    """workspace_limit=1 byte: one 2-D image per chunk (N of them, times x's depth in 3-D, whose depth windows are
    the images) in every pass on the kernels, and below one image one band of a single output row per piece -- a
    col2im per piece forward, an im2col per piece for grad_input and for grad_weight -- against one piece without
    it; torch's values on the kernels and the CPU path; the setting in force is untouched."""
    x, w, b, gy, kwargs, want, grads = transpose_problem(case)
    images = x.shape[0] * (x.shape[2] if x.ndim == 5 else 1)
    rows = x.shape[-2] if x.ndim > 3 else 1    # of the convolution that the transposed one transposes
    for limit, chunks in ((None, 1), (1, images)):
        device = Recorder()
        options = dict(kwargs, algorithm="im2col_gemm", workspace_limit=limit)
        ref.assert_close(kernel_path(device, cupyconv.conv_transpose_nd, x, w, b, **options), want)
        assert device.launches.count("fold_col2im") == chunks * (rows if limit else 1)
        device = Recorder()
        got = kernel_path(device, cupyconv.conv_transpose_nd_backward, gy, x, w, **options)
        assert device.launches.count("unfold_im2col") == 2 * chunks * (rows if limit else 1)
        for g, expected in zip(got, grads):
            ref.assert_close(g, expected)
    ref.assert_close(cupyconv.conv_transpose_nd(x, w, b, workspace_limit=1, **kwargs), want)
    for g, expected in zip(cupyconv.conv_transpose_nd_backward(gy, x, w, workspace_limit=1, **kwargs), grads):
        ref.assert_close(g, expected)
    assert cupyconv.get_workspace_limit() == cupyconv.DEFAULT_WORKSPACE_LIMIT
