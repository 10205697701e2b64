"""depthwise_conv2d and its backward against the naive float64 reference, torch CPU (F.conv2d with groups=C)
and finite differences, plus its agreement with conv2d(groups=C).

Cases are data (`CASES`, ...): x (N, C, H, W), weight (C * m, 1, kH, kW), and `groups` = C is what the torch
oracle and the reference are given.  The checks (`CHECKS.forward(depthwise_conv2d, case, dtype)`, ... from
`reference.ConvChecks`, and `check_same_as_grouped_conv2d`) take the op callables.
"""
import numpy
import pytest
from optional_deps import given, settings, strategies as st

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

#: Against ref.depthwise_conv2d and its gradients (which take case.window, as the op does), F.conv2d with
#: groups = C (case.kwargs) and its autograd gradients, and finite differences.
CHECKS = ref.ConvChecks(ref.depthwise_conv2d, ref.depthwise_conv2d_grads, groups=False)


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
    CHECKS.forward(cupyconv.depthwise_conv2d, case)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_backward_matches_reference(case):
    CHECKS.backward(cupyconv.depthwise_conv2d_backward, case)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_torch_grouped_conv(case, dtype):
    CHECKS.against_torch(cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward, case, dtype)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_same_as_conv2d_with_groups_C(case):
    check_same_as_grouped_conv2d(cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward,
                                 cupyconv.conv2d, cupyconv.conv2d_backward, case)


@pytest.mark.parametrize("case", HALF_CASES, ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_low_precision_matches_reference(case, dtype):
    CHECKS.forward(cupyconv.depthwise_conv2d, case, dtype)
    CHECKS.backward(cupyconv.depthwise_conv2d_backward, case, dtype)


@pytest.mark.parametrize("case", HALF_CASES, ids=str)
def test_bfloat16_through_torch(case):
    CHECKS.bfloat16(cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward, case)


@pytest.mark.parametrize("case", FINITE_DIFFERENCE_CASES, ids=str)
def test_gradients_match_finite_differences(case):
    CHECKS.finite_differences(cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward, case)


def test_multiplier_order_is_channel_major():
    """Output channel c * m + k reads input channel c only (filter c * m + k)."""
    x = numpy.zeros((1, 3, 4, 4))
    x[0, 1] = 1.0                               # only channel 1 is non-zero
    weight = numpy.ones((6, 1, 1, 1))
    out = cupyconv.depthwise_conv2d(x, weight)
    numpy.testing.assert_array_equal(out[0, :, 0, 0], [0, 0, 1, 1, 0, 0])


@pytest.mark.parametrize("needs", NEEDS_SUBSETS + ["input"], ids=repr)
def test_needs_returns_none_for_what_was_not_requested(needs):
    CHECKS.needs(cupyconv.depthwise_conv2d_backward, CASE_BY_NAME["multiplier2"], needs)


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
        CHECKS.matches_reference(cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward, case, x, weight,
                                 bias, grad_output)


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
    CHECKS.against_torch(cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward, case, "float64", seed)
