"""depthwise_conv2d and its backward against the naive float64 reference, torch CPU (F.conv2d with groups=C)
and finite differences, plus its agreement with conv2d(groups=C).

Cases are data (`CASES`, ...): x (N, C, H, W), weight (C * m, 1, kH, kW), and `groups` = C is what the torch
oracle and the reference are given.  The check functions take the op callables.
"""
import numpy
import pytest
from hypothesis import given, settings, strategies as st

import cupyconv
import reference as ref
from reference import NEEDS, NEEDS_SUBSETS, ConvCase


def D(name, x, multiplier, kernel, **window):
    """A depthwise case: weight (C * multiplier, 1, *kernel), groups = C."""
    c = x[1]
    return ConvCase(name, x, (c * multiplier, 1, *kernel), groups=c, **window)


CASES = [
    D("plain", (2, 3, 7, 6), 1, (3, 3)),
    D("multiplier2", (2, 4, 6, 7), 2, (3, 3), padding=1),
    D("multiplier3_rect_kernel", (1, 2, 7, 5), 3, (2, 3), stride=(2, 1)),
    D("one_channel", (3, 1, 5, 5), 2, (3, 3), padding=1),
    D("stride2_odd", (2, 3, 9, 7), 1, (3, 3), stride=2, padding=1),
    D("dilation2", (1, 2, 9, 8), 2, (3, 3), padding=2, dilation=2),
    D("asymmetric_padding", (2, 3, 6, 5), 1, (3, 2), padding=((0, 2), (1, 0))),
    D("same_stride2", (2, 3, 9, 8), 2, (3, 3), stride=2, padding="same"),
    D("same_even_kernel_stride3", (1, 2, 10, 7), 1, (4, 2), stride=3, padding="same", dilation=(1, 2)),
    D("valid_5x5", (1, 4, 7, 8), 1, (5, 5), padding="valid"),
    D("kernel1x1", (2, 5, 4, 3), 2, (1, 1)),
    D("kernel_larger_than_input", (1, 2, 3, 3), 1, (5, 5), padding=1),
    D("no_bias", (2, 3, 5, 6), 2, (3, 3), padding=(1, 0), bias=False),
]
CASE_BY_NAME = {case.name: case for case in CASES}
HALF_CASES = [CASE_BY_NAME[name] for name in ("plain", "multiplier2", "same_stride2")]
FINITE_DIFFERENCE_CASES = [
    D("fd_multiplier2", (1, 2, 4, 5), 2, (2, 3), stride=(2, 1), padding=((1, 0), (0, 1))),
    D("fd_dilated", (2, 2, 5, 4), 1, (2, 2), padding=1, dilation=2),
]


# ---------------------------------------------------------------------------------------------------------
# Comparisons, as functions of the op callables


def check_forward(depthwise_conv2d, case, dtype="float64", seed=0):
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(seed), dtype)
    out = depthwise_conv2d(x, weight, bias, **case.window)
    assert isinstance(out, numpy.ndarray)
    assert out.dtype == numpy.dtype(dtype) and out.shape == case.output_shape
    ref.assert_close(out, ref.depthwise_conv2d(x, weight, bias, **case.window), dtype, err_msg=case.name)


def check_backward(depthwise_conv2d_backward, case, dtype="float64", seed=0):
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(seed), dtype)
    grads = depthwise_conv2d_backward(grad_output, x, weight, **case.window)
    expected = ref.depthwise_conv2d_grads(grad_output, x, weight, **case.window)
    for name, got, want, shape in zip(NEEDS, grads, expected, (case.x, case.weight, case.weight[:1])):
        assert got.dtype == numpy.dtype(dtype) and got.shape == shape, name
        ref.assert_close(got, want, dtype, err_msg=f"{case.name}: grad {name}")


def check_against_torch(depthwise_conv2d, depthwise_conv2d_backward, case, dtype="float32", seed=0):
    """Against F.conv2d(groups=C) and its autograd gradients."""
    torch = pytest.importorskip("torch")
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(seed), dtype)
    t = {name: None if a is None else torch.from_numpy(a)
         for name, a in dict(x=x, weight=weight, bias=bias, grad_output=grad_output).items()}
    out = depthwise_conv2d(x, weight, bias, **case.window)
    ref.assert_close(out, ref.torch_conv2d(t["x"], t["weight"], t["bias"], **case.kwargs), dtype, case.name)
    grads = depthwise_conv2d_backward(grad_output, x, weight, **case.window)
    expected = ref.torch_conv2d_grads(t["grad_output"], t["x"], t["weight"], **case.kwargs)
    for name, got, want in zip(NEEDS, grads, expected):
        ref.assert_close(got, want, dtype, err_msg=f"{case.name}: grad {name}")


def check_bfloat16(depthwise_conv2d, depthwise_conv2d_backward, case, seed=0):
    torch = pytest.importorskip("torch")
    arrays = case.inputs(numpy.random.default_rng(seed), numpy.float32)
    x, weight, bias, grad_output = (None if a is None else torch.from_numpy(a).to(torch.bfloat16) for a in arrays)
    x64, w64, b64, gy64 = (None if a is None else ref.to_float64(a) for a in (x, weight, bias, grad_output))
    out = depthwise_conv2d(x, weight, bias, **case.window)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    ref.assert_close(out, ref.depthwise_conv2d(x64, w64, b64, **case.window), "bfloat16", case.name)
    grads = depthwise_conv2d_backward(grad_output, x, weight, **case.window)
    for name, got, want in zip(NEEDS, grads, ref.depthwise_conv2d_grads(gy64, x64, w64, **case.window)):
        assert got.dtype == torch.bfloat16, name
        ref.assert_close(got, want, "bfloat16", err_msg=f"{case.name}: grad {name}")


def check_finite_differences(depthwise_conv2d, depthwise_conv2d_backward, case, seed=0):
    x, weight, bias, r = case.inputs(numpy.random.default_rng(seed))

    def loss():
        return float(numpy.sum(depthwise_conv2d(x, weight, bias, **case.window) * r))

    grads = depthwise_conv2d_backward(r, x, weight, **case.window)
    for name, got, wrt in zip(NEEDS, grads, (x, weight, bias)):
        numpy.testing.assert_allclose(got, ref.numerical_gradient(loss, wrt), rtol=1e-6, atol=1e-7,
                                      err_msg=f"{case.name}: grad {name}")


def check_same_as_grouped_conv2d(depthwise_conv2d, depthwise_conv2d_backward, conv2d, conv2d_backward, case,
                                 seed=0):
    """depthwise_conv2d(x, w) == conv2d(x, w, groups=C), forward and backward."""
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(seed))
    ref.assert_close(depthwise_conv2d(x, weight, bias, **case.window), conv2d(x, weight, bias, **case.kwargs))
    for got, want in zip(depthwise_conv2d_backward(grad_output, x, weight, **case.window),
                         conv2d_backward(grad_output, x, weight, **case.kwargs)):
        ref.assert_close(got, want)


# ---------------------------------------------------------------------------------------------------------
# The CPU path


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_matches_reference(case):
    check_forward(cupyconv.depthwise_conv2d, case)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_backward_matches_reference(case):
    check_backward(cupyconv.depthwise_conv2d_backward, case)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_torch_grouped_conv(case, dtype):
    check_against_torch(cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward, case, dtype)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_same_as_conv2d_with_groups_C(case):
    check_same_as_grouped_conv2d(cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward,
                                 cupyconv.conv2d, cupyconv.conv2d_backward, case)


@pytest.mark.parametrize("case", HALF_CASES, ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_low_precision_matches_reference(case, dtype):
    check_forward(cupyconv.depthwise_conv2d, case, dtype)
    check_backward(cupyconv.depthwise_conv2d_backward, case, dtype)


@pytest.mark.parametrize("case", HALF_CASES, ids=str)
def test_bfloat16_through_torch(case):
    check_bfloat16(cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward, case)


@pytest.mark.parametrize("case", FINITE_DIFFERENCE_CASES, ids=str)
def test_gradients_match_finite_differences(case):
    check_finite_differences(cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward, case)


def test_multiplier_order_is_channel_major():
    """Output channel c * m + k reads input channel c only (filter c * m + k)."""
    x = numpy.zeros((1, 3, 4, 4))
    x[0, 1] = 1.0                               # only channel 1 is non-zero
    weight = numpy.ones((6, 1, 1, 1))
    out = cupyconv.depthwise_conv2d(x, weight)
    numpy.testing.assert_array_equal(out[0, :, 0, 0], [0, 0, 1, 1, 0, 0])


@pytest.mark.parametrize("needs", NEEDS_SUBSETS + ["input"], ids=repr)
def test_needs_returns_none_for_what_was_not_requested(needs):
    case = CASE_BY_NAME["multiplier2"]
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(1))
    full = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, **case.window)
    part = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, needs=needs, **case.window)
    requested = (needs,) if isinstance(needs, str) else needs
    assert len(part) == 3
    for name, got, want in zip(NEEDS, part, full):
        if name in requested:
            numpy.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)
        else:
            assert got is None, name


def test_non_contiguous_and_negative_strides():
    case = CASE_BY_NAME["same_stride2"]
    rng = numpy.random.default_rng(2)
    n, c, h, w = case.x
    inputs = [ref.random(rng, (n, c, w, h)).transpose(0, 1, 3, 2), ref.random(rng, case.x)[:, ::-1, ::-1]]
    weight = ref.random(rng, case.weight)[::-1, :, :, ::-1]
    bias = ref.random(rng, (2 * case.weight[0],))[1::2]
    grad_output = ref.random(rng, case.output_shape)[..., ::-1]
    for x in inputs:
        assert not x.flags.c_contiguous
        ref.assert_close(cupyconv.depthwise_conv2d(x, weight, bias, **case.window),
                         ref.depthwise_conv2d(x, weight, bias, **case.window))
        grads = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, **case.window)
        for got, want in zip(grads, ref.depthwise_conv2d_grads(grad_output, x, weight, **case.window)):
            ref.assert_close(got, want)


def test_empty_batch():
    x = numpy.empty((0, 3, 6, 5), numpy.float32)
    weight = ref.random(numpy.random.default_rng(3), (6, 1, 3, 3), numpy.float32)
    out = cupyconv.depthwise_conv2d(x, weight, numpy.ones(6, numpy.float32), stride=2, padding="same")
    assert out.shape == (0, 6, 3, 3) and out.dtype == numpy.float32
    grad_x, grad_w, grad_b = cupyconv.depthwise_conv2d_backward(numpy.empty((0, 6, 3, 3), numpy.float32), x,
                                                                weight, stride=2, padding="same")
    assert grad_x.shape == x.shape
    numpy.testing.assert_array_equal(grad_w, numpy.zeros(weight.shape))
    numpy.testing.assert_array_equal(grad_b, numpy.zeros(6))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_and_inf_propagate_like_torch():
    torch = pytest.importorskip("torch")
    rng = numpy.random.default_rng(4)
    x = ref.random(rng, (2, 3, 6, 5))
    x[0, 1, 2, 3], x[1, 0, 0, 0], x[1, 2, 4, 4] = numpy.nan, numpy.inf, -numpy.inf
    weight, bias = ref.random(rng, (6, 1, 3, 3)), ref.random(rng, (6,))
    grad_output = ref.random(rng, (2, 6, 6, 5))
    grad_output[1, 2, 3, 1], grad_output[0, 5, 0, 4] = numpy.nan, -numpy.inf
    t = torch.from_numpy
    out = cupyconv.depthwise_conv2d(x, weight, bias, padding=1)
    assert numpy.isnan(out).any() and numpy.isinf(out).any()
    ref.assert_close(out, ref.torch_conv2d(t(x), t(weight), t(bias), padding=1, groups=3))
    grads = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=1)
    expected = ref.torch_conv2d_grads(t(grad_output), t(x), t(weight), padding=1, groups=3)
    for name, got, want in zip(NEEDS, grads, expected):
        ref.assert_close(got, want, err_msg=f"grad {name}")


# ---------------------------------------------------------------------------------------------------------
# Property tests over random specs


@settings(**ref.PROPERTY_SETTINGS)
@given(case=ref.conv_cases(depthwise=True), seed=st.integers(0, 2**32 - 1))
def test_property_matches_torch(case, seed):
    check_against_torch(cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward, case, "float64", seed)
