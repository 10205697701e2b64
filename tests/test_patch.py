"""patch_conv2d and its backward: x (..., C, H, W) with any leading dims, padding inside every patch.

Against the naive reference applied patch by patch (a loop over the leading dims), torch CPU with the patches
rolled into the batch, finite differences, and direct checks that nothing is ever read across patches.
Cases are data (`CASES`, ...); the checks (`CHECKS.forward(patch_conv2d, case, dtype)`, ... from
`reference.ConvChecks`, and `check_patches_never_mix`) take the op callables.
"""
import numpy
import pytest
from optional_deps import given, settings, strategies as st

import cupyconv
import reference as ref
from reference import NEEDS, NEEDS_SUBSETS, ConvCase

C = ConvCase

CASES = [
    C("B2_N3", (2, 3, 2, 4, 4), (3, 2, 3, 3), padding=1),
    C("no_leading_dims", (3, 5, 4), (2, 3, 3, 3), padding=1),
    C("one_leading_dim", (5, 2, 4, 3), (4, 2, 2, 2), stride=(1, 2)),
    C("three_leading_dims", (1, 2, 2, 3, 5, 5), (2, 3, 3, 3), stride=2, padding=1),
    C("groups2", (2, 2, 4, 4, 5), (6, 2, 3, 3), padding=((1, 0), (0, 1)), groups=2),
    C("groups3_dilation2", (3, 2, 6, 5, 5), (3, 2, 2, 2), padding=2, dilation=2, groups=3),
    C("groups_C", (2, 2, 3, 4, 4), (6, 1, 3, 3), padding=1, groups=3),
    C("same_stride2", (2, 3, 2, 5, 4), (3, 2, 3, 3), stride=2, padding="same"),
    C("same_even_kernel", (4, 1, 3, 3), (2, 1, 2, 2), padding="same"),
    C("kernel_larger_than_patch", (2, 2, 1, 2, 2), (3, 1, 3, 3), padding=1, bias=False),
    C("patch_1x1", (3, 2, 4, 1, 1), (2, 4, 1, 1)),
]
CASE_BY_NAME = {case.name: case for case in CASES}
HALF_CASES = [CASE_BY_NAME[name] for name in ("B2_N3", "groups2", "same_stride2")]
FINITE_DIFFERENCE_CASES = [
    C("fd_B2_N2", (2, 2, 2, 3, 3), (2, 2, 2, 2), padding=((1, 0), (0, 1))),
    C("fd_grouped_stride2", (1, 3, 4, 3, 4), (2, 2, 3, 2), stride=2, padding="same", groups=2),
]


# ---------------------------------------------------------------------------------------------------------
# Comparisons, as functions of the op callables

#: Against ref.patch_conv2d and its gradients (the naive reference run patch by patch), F.conv2d with the leading
#: dims rolled into the batch and its autograd gradients, and finite differences.
CHECKS = ref.ConvChecks(ref.patch_conv2d, ref.patch_conv2d_grads)


def check_patches_never_mix(patch_conv2d, patch_conv2d_backward, case, seed=0):
    """Each patch's output depends on that patch only, and each patch's input gradient on its own
    grad_output only: an all-zero patch gives exactly zero (no bias), changing one patch changes only its
    own output, and a grad_output non-zero in one patch gives a grad_x that is zero in every other patch."""
    rng = numpy.random.default_rng(seed)
    x, weight, _, grad_output = case.inputs(rng)
    lead = case.x[:-3]
    patches = list(numpy.ndindex(*lead))
    quiet = patches[len(patches) // 2]
    x[quiet] = 0.0
    out = patch_conv2d(x, weight, None, **case.kwargs)
    numpy.testing.assert_array_equal(out[quiet], 0.0)
    changed = x.copy()
    changed[quiet] = ref.random(rng, case.x[-3:])
    out_changed = patch_conv2d(changed, weight, None, **case.kwargs)
    for idx in patches:
        if idx != quiet:
            numpy.testing.assert_array_equal(out_changed[idx], out[idx], err_msg=str(idx))
    assert numpy.abs(out_changed[quiet]).max() > 0
    only_one = numpy.zeros_like(grad_output)
    only_one[quiet] = grad_output[quiet]
    grad_x, _, _ = patch_conv2d_backward(only_one, x, weight, **case.kwargs, needs=("input",))
    for idx in patches:
        if idx != quiet:
            numpy.testing.assert_array_equal(grad_x[idx], 0.0, err_msg=str(idx))
    assert numpy.abs(grad_x[quiet]).max() > 0


# ---------------------------------------------------------------------------------------------------------
# The CPU path


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_matches_per_patch_reference(case):
    CHECKS.forward(cupyconv.patch_conv2d, case)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_backward_matches_per_patch_reference(case):
    CHECKS.backward(cupyconv.patch_conv2d_backward, case)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_torch_rolled_into_batch(case, dtype):
    CHECKS.against_torch(cupyconv.patch_conv2d, cupyconv.patch_conv2d_backward, case, dtype)


@pytest.mark.parametrize("case", HALF_CASES, ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_low_precision_matches_reference(case, dtype):
    CHECKS.forward(cupyconv.patch_conv2d, case, dtype)
    CHECKS.backward(cupyconv.patch_conv2d_backward, case, dtype)


@pytest.mark.parametrize("case", HALF_CASES, ids=str)
def test_bfloat16_through_torch(case):
    CHECKS.bfloat16(cupyconv.patch_conv2d, cupyconv.patch_conv2d_backward, case)


@pytest.mark.parametrize("case", FINITE_DIFFERENCE_CASES, ids=str)
def test_gradients_match_finite_differences(case):
    CHECKS.finite_differences(cupyconv.patch_conv2d, cupyconv.patch_conv2d_backward, case)


@pytest.mark.parametrize("case", [c for c in CASES if len(c.x) > 4 or c.x[0] > 1], ids=str)
def test_patches_never_mix(case):
    check_patches_never_mix(cupyconv.patch_conv2d, cupyconv.patch_conv2d_backward, case)


def test_padding_is_inside_each_patch():
    """Neighbouring patches of ones: with padding 1 a 3x3 box filter sees 4 ones at a patch's corner (the
    rest is padding), never the 9 it would see if patches were tiled into one image."""
    x = numpy.ones((2, 3, 1, 4, 4))
    out = cupyconv.patch_conv2d(x, numpy.ones((1, 1, 3, 3)), padding=1)
    assert out.shape == (2, 3, 1, 4, 4)
    expected = numpy.array([[4, 6, 6, 4], [6, 9, 9, 6], [6, 9, 9, 6], [4, 6, 6, 4]], float)
    numpy.testing.assert_array_equal(out, numpy.broadcast_to(expected, out.shape))


def test_same_as_conv2d_for_4d_input():
    case = CASE_BY_NAME["one_leading_dim"]
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(6))
    ref.assert_close(cupyconv.patch_conv2d(x, weight, bias, **case.kwargs),
                     cupyconv.conv2d(x, weight, bias, **case.kwargs))
    for got, want in zip(cupyconv.patch_conv2d_backward(grad_output, x, weight, **case.kwargs),
                         cupyconv.conv2d_backward(grad_output, x, weight, **case.kwargs)):
        ref.assert_close(got, want)


@pytest.mark.parametrize("needs", NEEDS_SUBSETS + ["bias"], ids=repr)
def test_needs_returns_none_for_what_was_not_requested(needs):
    CHECKS.needs(cupyconv.patch_conv2d_backward, CASE_BY_NAME["groups2"], needs)


def test_non_contiguous_and_negative_strides():
    case = CASE_BY_NAME["groups2"]
    rng = numpy.random.default_rng(2)
    b, n, c, h, w = case.x
    inputs = [ref.random(rng, (n, b, c, w, h)).transpose(1, 0, 2, 4, 3),    # leading dims swapped too
              ref.random(rng, case.x)[::-1, :, :, ::-1]]
    weight = ref.random(rng, case.weight)[:, ::-1]
    bias = ref.random(rng, (case.weight[0], 2))[:, 1]
    grad_output = ref.random(rng, case.output_shape)[:, ::-1, :, ::-1]
    for x in inputs:
        assert not x.flags.c_contiguous
        CHECKS.matches_reference(cupyconv.patch_conv2d, cupyconv.patch_conv2d_backward, case, x, weight, bias,
                                 grad_output)


@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3), (1, 0, 2)], ids=str)
def test_empty_leading_dims(lead):
    x = numpy.empty((*lead, 4, 5, 5))
    weight = ref.random(numpy.random.default_rng(3), (6, 2, 3, 3))
    out = cupyconv.patch_conv2d(x, weight, numpy.ones(6), stride=2, padding=1, groups=2)
    assert out.shape == (*lead, 6, 3, 3) and out.dtype == x.dtype
    grad_x, grad_w, grad_b = cupyconv.patch_conv2d_backward(numpy.empty((*lead, 6, 3, 3)), x, weight, stride=2,
                                                            padding=1, groups=2)
    assert grad_x.shape == x.shape
    numpy.testing.assert_array_equal(grad_w, numpy.zeros(weight.shape))
    numpy.testing.assert_array_equal(grad_b, numpy.zeros(6))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_and_inf_propagate_like_torch():
    torch = pytest.importorskip("torch")
    rng = numpy.random.default_rng(4)
    x = ref.random(rng, (2, 3, 2, 4, 4))
    x[0, 1, 0, 2, 3], x[1, 2, 1, 0, 0] = numpy.nan, numpy.inf
    weight, bias = ref.random(rng, (3, 2, 3, 3)), ref.random(rng, (3,))
    grad_output = ref.random(rng, (2, 3, 3, 4, 4))
    grad_output[1, 0, 2, 3, 1] = numpy.nan
    t = torch.from_numpy
    out = cupyconv.patch_conv2d(x, weight, bias, padding=1)
    ref.assert_close(out, ref.torch_conv2d(t(x), t(weight), t(bias), padding=1))
    assert numpy.isfinite(out[0, 0]).all()          # the poisoned patches poison nothing else
    grads = cupyconv.patch_conv2d_backward(grad_output, x, weight, padding=1)
    for name, got, want in zip(NEEDS, grads, ref.torch_conv2d_grads(t(grad_output), t(x), t(weight), padding=1)):
        ref.assert_close(got, want, err_msg=f"grad {name}")


# ---------------------------------------------------------------------------------------------------------
# Property tests over random specs


@settings(**ref.PROPERTY_SETTINGS)
@given(case=ref.conv_cases(leading_dims=3), seed=st.integers(0, 2**32 - 1))
def test_property_matches_torch(case, seed):
    CHECKS.against_torch(cupyconv.patch_conv2d, cupyconv.patch_conv2d_backward, case, "float64", seed)
