"""conv2d and conv2d_backward against the naive float64 reference, torch CPU and finite differences.

The problems are declared as data (`CASES`, `HALF_CASES`, `FINITE_DIFFERENCE_CASES`) and every comparison is a
function of the op callables (`CHECKS.forward(conv2d, case, dtype)`, ... from `reference.ConvChecks`), so the
same cases can run through another executor, e.g. inside `cupyconv._device.use_device(...)`.
"""
import numpy
import pytest
from optional_deps import given, settings, strategies as st

import cupyconv
import reference as ref
from reference import NEEDS, NEEDS_SUBSETS, ConvCase

C = ConvCase

#: Small odd problems covering the geometry: groups 1/2/3/C, stride, dilation, every padding form.
CASES = [
    C("plain", (2, 3, 7, 6), (4, 3, 3, 3)),
    C("no_bias", (2, 3, 5, 6), (2, 3, 3, 2), padding=1, bias=False),
    C("groups2", (2, 4, 6, 7), (6, 2, 3, 3), padding=1, groups=2),
    C("groups3_rect_kernel", (1, 6, 7, 5), (3, 2, 2, 3), stride=(2, 1), groups=3),
    C("groups_C_routes_to_depthwise", (2, 4, 7, 6), (8, 1, 3, 3), padding=1, groups=4),
    C("groups_C_multiplier1_stride2", (2, 3, 6, 5), (3, 1, 3, 3), stride=2, groups=3),
    C("stride2_odd", (2, 3, 9, 7), (4, 3, 3, 3), stride=2, padding=1),
    C("stride3_kernel2", (1, 2, 8, 10), (3, 2, 2, 2), stride=3),
    C("dilation2", (1, 2, 9, 8), (3, 2, 3, 3), padding=2, dilation=2),
    C("dilation_2_1", (2, 2, 8, 6), (2, 2, 3, 3), padding=(2, 1), dilation=(2, 1)),
    C("asymmetric_padding", (2, 2, 6, 5), (3, 2, 3, 2), padding=((0, 2), (1, 0))),
    C("pair_padding", (1, 3, 5, 5), (2, 3, 3, 3), padding=(2, 1)),
    C("same_stride1", (1, 3, 6, 5), (2, 3, 3, 3), padding="same"),
    C("same_even_kernel", (2, 3, 5, 6), (2, 3, 4, 2), padding="same"),
    C("same_stride2", (2, 3, 9, 8), (4, 3, 3, 3), stride=2, padding="same"),
    C("same_stride3_dilation2", (1, 2, 10, 7), (3, 2, 3, 2), stride=3, padding="same", dilation=2),
    C("same_grouped_stride2", (1, 4, 7, 7), (4, 2, 4, 4), stride=2, padding="same", groups=2),
    C("valid", (2, 3, 6, 7), (2, 3, 3, 3), padding="valid"),
    C("kernel1x1", (2, 5, 4, 3), (3, 5, 1, 1)),
    C("kernel_larger_than_input", (1, 2, 3, 3), (2, 2, 5, 5), padding=1),
    C("input1x1", (3, 2, 1, 1), (2, 2, 3, 3), padding=1),
    C("everything", (2, 6, 8, 9), (4, 3, 3, 2), stride=(2, 3), padding=((1, 0), (2, 1)), dilation=(1, 2),
      groups=2),
]
CASE_BY_NAME = {case.name: case for case in CASES}

#: The cases also run in float16 (and bfloat16 through torch).
HALF_CASES = [CASE_BY_NAME[name] for name in ("plain", "groups2", "groups_C_routes_to_depthwise",
                                              "same_stride2", "everything")]

FINITE_DIFFERENCE_CASES = [
    C("fd_plain", (1, 2, 4, 5), (3, 2, 2, 3), stride=(2, 1), padding=((1, 0), (0, 1))),
    C("fd_grouped_dilated", (2, 4, 5, 4), (2, 2, 2, 2), padding=1, dilation=2, groups=2),
    C("fd_depthwise_route", (1, 2, 4, 4), (4, 1, 3, 3), stride=2, padding="same", groups=2),
]

#: The comparisons, as functions of the op callables, against ref.conv2d and ref.conv2d_grads.
CHECKS = ref.ConvChecks(ref.conv2d, ref.conv2d_grads)


# ---------------------------------------------------------------------------------------------------------
# The CPU path


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_matches_reference(case):
    CHECKS.forward(cupyconv.conv2d, case)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_backward_matches_reference(case):
    CHECKS.backward(cupyconv.conv2d_backward, case)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_torch(case, dtype):
    CHECKS.against_torch(cupyconv.conv2d, cupyconv.conv2d_backward, case, dtype)


@pytest.mark.parametrize("case", HALF_CASES, ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_low_precision_matches_reference(case, dtype):
    CHECKS.forward(cupyconv.conv2d, case, dtype)
    CHECKS.backward(cupyconv.conv2d_backward, case, dtype)


@pytest.mark.parametrize("case", HALF_CASES, ids=str)
def test_bfloat16_through_torch(case):
    CHECKS.bfloat16(cupyconv.conv2d, cupyconv.conv2d_backward, case)


@pytest.mark.parametrize("case", FINITE_DIFFERENCE_CASES, ids=str)
def test_gradients_match_finite_differences(case):
    CHECKS.finite_differences(cupyconv.conv2d, cupyconv.conv2d_backward, case)


def test_half_accumulates_in_float32():
    """A long float16 sum would lose the small terms if it were accumulated in float16."""
    x = numpy.full((1, 64, 4, 4), 1.0, numpy.float16)
    x[:, 1:] = 2.0 ** -11                   # half an ulp of 1.0: vanishes when added to 1.0 in float16
    weight = numpy.ones((1, 64, 1, 1), numpy.float16)
    out = cupyconv.conv2d(x, weight)
    assert out.dtype == numpy.float16
    numpy.testing.assert_array_equal(out, numpy.float16(1.0 + 63 * 2.0 ** -11))


@pytest.mark.parametrize("needs", NEEDS_SUBSETS + ["weight"], ids=repr)
def test_needs_returns_none_for_what_was_not_requested(needs):
    CHECKS.needs(cupyconv.conv2d_backward, CASE_BY_NAME["groups2"], needs)


@pytest.mark.parametrize("case", [CASE_BY_NAME["everything"], CASE_BY_NAME["groups_C_routes_to_depthwise"]],
                         ids=str)
def test_non_contiguous_and_negative_strides(case):
    """Transposed views, reversed views and every-other-element views give the reference's results."""
    rng = numpy.random.default_rng(2)
    n, c, h, w = case.x
    x = ref.random(rng, (n, c, w, h)).transpose(0, 1, 3, 2)
    weight = ref.random(rng, case.weight)[..., ::-1, :]
    bias = ref.random(rng, (2 * case.weight[0],))[::-2]
    grad_output = ref.random(rng, case.output_shape)[:, :, :, ::-1]
    reversed_x = ref.random(rng, case.x)[..., ::-1]
    assert not x.flags.c_contiguous and min(weight.strides) < 0 and min(grad_output.strides) < 0
    for xin in (x, reversed_x):
        CHECKS.matches_reference(cupyconv.conv2d, cupyconv.conv2d_backward, case, xin, weight, bias, grad_output)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_empty_batch(groups):
    """N = 0 gives an empty output of the right shape; the weight and bias gradients are zeros, like torch."""
    x = numpy.empty((0, 4, 6, 5))
    weight = ref.random(numpy.random.default_rng(3), (8, 4 // groups, 3, 3))
    out = cupyconv.conv2d(x, weight, numpy.ones(8), stride=2, padding=1, groups=groups)
    assert out.shape == (0, 8, 3, 3) and out.dtype == x.dtype
    grad_x, grad_w, grad_b = cupyconv.conv2d_backward(numpy.empty((0, 8, 3, 3)), x, weight, stride=2,
                                                      padding=1, groups=groups)
    assert grad_x.shape == x.shape
    numpy.testing.assert_array_equal(grad_w, numpy.zeros(weight.shape))
    numpy.testing.assert_array_equal(grad_b, numpy.zeros(8))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_and_inf_propagate_like_torch():
    torch = pytest.importorskip("torch")
    rng = numpy.random.default_rng(4)
    x = ref.random(rng, (2, 4, 6, 5))
    x[0, 1, 2, 3], x[1, 0, 0, 0], x[1, 3, 4, 4] = numpy.nan, numpy.inf, -numpy.inf
    grad_output = ref.random(rng, (2, 4, 6, 5))
    grad_output[1, 2, 3, 1] = numpy.nan
    grad_output[0, 0, 0, 4] = numpy.inf
    for groups in (1, 2, 4):
        weight = ref.random(rng, (4, 4 // groups, 3, 3))
        bias = ref.random(rng, (4,))
        out = cupyconv.conv2d(x, weight, bias, padding=1, groups=groups)
        expected = ref.torch_conv2d(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias),
                                    padding=1, groups=groups)
        assert numpy.isnan(out).any() and numpy.isinf(out).any()
        ref.assert_close(out, expected, err_msg=f"groups={groups}")
        grads = cupyconv.conv2d_backward(grad_output, x, weight, padding=1, groups=groups)
        torch_grads = ref.torch_conv2d_grads(torch.from_numpy(grad_output), torch.from_numpy(x),
                                             torch.from_numpy(weight), padding=1, groups=groups)
        for name, got, want in zip(NEEDS, grads, torch_grads):
            ref.assert_close(got, want, err_msg=f"groups={groups}: grad {name}")


@pytest.mark.parametrize("stride", [1, 2, 3, (2, 3)])
@pytest.mark.parametrize("kernel, dilation", [((3, 3), 1), ((4, 2), 1), ((2, 5), (2, 1)), ((1, 1), 1)])
def test_same_padding_output_is_ceil_of_input_over_stride(kernel, dilation, stride):
    """'same' keeps ceil(in / stride) pixels per dimension, as JAX does, for any stride."""
    rng = numpy.random.default_rng(8)
    x, weight = ref.random(rng, (1, 2, 7, 8)), ref.random(rng, (3, 2, *kernel))
    out = cupyconv.conv2d(x, weight, stride=stride, padding="same", dilation=dilation)
    sh, sw = ref.as_pair(stride)
    assert out.shape == (1, 3, -(-7 // sh), -(-8 // sw))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("kernel, dilation", [((3, 3), 1), ((4, 2), 1), ((2, 5), (2, 1)), ((4, 4), 2)])
def test_same_padding_at_stride_1_matches_torch_same(kernel, dilation):
    """At stride 1 'same' is torch's own padding='same' (odd pixel at the bottom/right), not only our
    explicit-padding oracle's reading of it."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    rng = numpy.random.default_rng(9)
    x, weight = ref.random(rng, (2, 2, 7, 6)), ref.random(rng, (3, 2, *kernel))
    expected = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), padding="same", dilation=dilation)
    ref.assert_close(cupyconv.conv2d(x, weight, padding="same", dilation=dilation), expected)


def test_reference_agrees_with_torch():
    """The oracles check each other on the hardest case, so neither can drift unnoticed."""
    torch = pytest.importorskip("torch")
    case = CASE_BY_NAME["everything"]
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(5))
    t = torch.from_numpy
    ref.assert_close(ref.conv2d(x, weight, bias, **case.kwargs),
                     ref.torch_conv2d(t(x), t(weight), t(bias), **case.kwargs))
    for got, want in zip(ref.conv2d_grads(grad_output, x, weight, **case.kwargs),
                         ref.torch_conv2d_grads(t(grad_output), t(x), t(weight), **case.kwargs)):
        ref.assert_close(got, want)


# ---------------------------------------------------------------------------------------------------------
# Property tests over random specs


@settings(**ref.PROPERTY_SETTINGS)
@given(case=ref.conv_cases(), seed=st.integers(0, 2**32 - 1))
def test_property_matches_torch(case, seed):
    CHECKS.against_torch(cupyconv.conv2d, cupyconv.conv2d_backward, case, "float64", seed)
