"""unfold, fold, unfold_backward and fold_backward against the naive float64 reference, torch CPU (F.unfold,
F.fold, torch.autograd.grad) and finite differences; fold's overlap sum and the adjointness of the pair.

Cases are data (`CASES`, ...): x (..., C, H, W) and the window; fold works on the matching cols
(..., C * kH * kW, L) with output_size (H, W).  The check functions take the op callables.
"""
from dataclasses import dataclass

import numpy
import pytest
from optional_deps import given, settings, strategies as st

import cupyconv
import reference as ref


@dataclass(frozen=True)
class WindowCase:
    name: str
    x: tuple                  # (..., C, H, W); also fold's output shape
    kernel_size: object
    dilation: object = 1
    padding: object = 0
    stride: object = 1

    def __str__(self) -> str:
        return self.name

    @property
    def kwargs(self) -> dict:
        return dict(kernel_size=self.kernel_size, dilation=self.dilation, padding=self.padding,
                    stride=self.stride)

    @property
    def output_size(self) -> tuple:
        return tuple(self.x[-2:])

    @property
    def cols(self) -> tuple:
        """The shape of unfold(x): (..., C * kH * kW, L)."""
        kh, kw = ref.as_pair(self.kernel_size)
        oh, ow = ref.output_size(self.x[-2:], self.kernel_size, self.stride, self.padding, self.dilation)
        return (*self.x[:-3], self.x[-3] * kh * kw, oh * ow)

    def inputs(self, rng, dtype=numpy.float64):
        """Fresh random (x, cols) of dtype."""
        return ref.random(rng, self.x, dtype), ref.random(rng, self.cols, dtype)


W = WindowCase

CASES = [
    W("plain", (2, 3, 6, 5), 3),
    W("padded", (2, 2, 5, 6), 3, padding=1),
    W("rect_kernel_stride", (1, 3, 7, 8), (2, 3), stride=(2, 1)),
    W("stride2_odd", (2, 2, 9, 7), 3, padding=1, stride=2),
    W("stride3_kernel2_gaps", (1, 2, 8, 10), 2, stride=3),
    W("dilation2", (1, 2, 9, 8), 3, dilation=2, padding=2),
    W("dilation_2_1", (2, 1, 8, 6), (3, 2), dilation=(2, 1), padding=(1, 0)),
    W("asymmetric_padding", (2, 2, 6, 5), (3, 2), padding=((0, 2), (1, 0))),
    W("same_stride2", (2, 3, 9, 8), 3, padding="same", stride=2),
    W("same_even_kernel_dilated", (1, 2, 7, 6), (4, 2), dilation=(1, 2), padding="same", stride=(1, 3)),
    W("valid", (2, 3, 5, 7), 2, padding="valid"),
    W("kernel1x1", (2, 5, 4, 3), 1),
    W("kernel_covers_input", (2, 2, 3, 4), (3, 4)),
    W("kernel_larger_than_input", (1, 2, 2, 3), 4, padding=(1, 2)),
    W("no_leading_dims", (3, 5, 5), 2, padding=1, stride=2),
    W("two_leading_dims", (2, 3, 2, 4, 4), 3, padding=1),
    W("three_leading_dims", (2, 1, 2, 1, 5, 4), 2, stride=(1, 2), padding=((1, 0), (0, 1))),
]
CASE_BY_NAME = {case.name: case for case in CASES}
HALF_CASES = [CASE_BY_NAME[name] for name in ("padded", "stride2_odd", "same_stride2", "two_leading_dims")]
FINITE_DIFFERENCE_CASES = [
    W("fd_padded_stride2", (1, 2, 4, 5), (2, 3), padding=((1, 0), (0, 1)), stride=(2, 1)),
    W("fd_dilated_leading", (2, 1, 1, 4, 4), 2, dilation=2, padding=1),
]


# ---------------------------------------------------------------------------------------------------------
# Comparisons, as functions of the op callables


def check_unfold(unfold, case, dtype="float64", seed=0):
    """unfold only copies values: the result equals the reference exactly, in any dtype."""
    x, _ = case.inputs(numpy.random.default_rng(seed), dtype)
    cols = unfold(x, **case.kwargs)
    assert isinstance(cols, numpy.ndarray)
    assert cols.dtype == numpy.dtype(dtype) and cols.shape == case.cols
    numpy.testing.assert_array_equal(cols, ref.unfold(x, **case.kwargs).astype(dtype), err_msg=case.name)


def check_fold(fold, case, dtype="float64", seed=0):
    _, cols = case.inputs(numpy.random.default_rng(seed), dtype)
    out = fold(cols, case.output_size, **case.kwargs)
    assert isinstance(out, numpy.ndarray)
    assert out.dtype == numpy.dtype(dtype) and out.shape == case.x
    ref.assert_close(out, ref.fold(cols, case.output_size, **case.kwargs), dtype, err_msg=case.name)


def check_backward(unfold_backward, fold_backward, case, dtype="float64", seed=0):
    """unfold_backward is a fold of the cols gradient, fold_backward an unfold of the image gradient."""
    grad_x, grad_cols = case.inputs(numpy.random.default_rng(seed), dtype)
    got = unfold_backward(grad_cols, case.output_size, **case.kwargs)
    assert got.dtype == numpy.dtype(dtype) and got.shape == case.x
    ref.assert_close(got, ref.fold(grad_cols, case.output_size, **case.kwargs), dtype, err_msg=case.name)
    got = fold_backward(grad_x, **case.kwargs)
    assert got.dtype == numpy.dtype(dtype) and got.shape == case.cols
    numpy.testing.assert_array_equal(got, ref.unfold(grad_x, **case.kwargs).astype(dtype), err_msg=case.name)


def check_against_torch(unfold, fold, unfold_backward, fold_backward, case, dtype="float32", seed=0):
    """Every op against F.unfold / F.fold and the gradients torch.autograd.grad gives for them."""
    torch = pytest.importorskip("torch")
    x, cols = case.inputs(numpy.random.default_rng(seed), dtype)
    tx, tcols = torch.from_numpy(x), torch.from_numpy(cols)
    kw, size = case.kwargs, case.output_size
    ref.assert_close(unfold(x, **kw), ref.torch_unfold(tx, **kw), dtype, case.name)
    ref.assert_close(fold(cols, size, **kw), ref.torch_fold(tcols, size, **kw), dtype, case.name)
    ref.assert_close(unfold_backward(cols, size, **kw),
                     ref.torch_vjp(lambda a: ref.torch_unfold(a, **kw), tx, tcols), dtype, case.name)
    ref.assert_close(fold_backward(x, **kw),
                     ref.torch_vjp(lambda a: ref.torch_fold(a, size, **kw), tcols, tx), dtype, case.name)


def check_adjoint(unfold, fold, case, seed=0):
    """<unfold(x), c> == <x, fold(c)> in float64."""
    x, cols = case.inputs(numpy.random.default_rng(seed))
    left = numpy.sum(unfold(x, **case.kwargs) * cols)
    right = numpy.sum(x * fold(cols, case.output_size, **case.kwargs))
    numpy.testing.assert_allclose(left, right, rtol=1e-12, atol=1e-12, err_msg=case.name)


def check_finite_differences(unfold, fold, unfold_backward, fold_backward, case, seed=0):
    """The backward ops against central differences of <unfold(x), r> and <fold(c), s> in float64."""
    x, cols = case.inputs(numpy.random.default_rng(seed))
    r, s = case.inputs(numpy.random.default_rng(seed + 1))[::-1]
    numerical = ref.numerical_gradient(lambda: float(numpy.sum(unfold(x, **case.kwargs) * r)), x)
    numpy.testing.assert_allclose(unfold_backward(r, case.output_size, **case.kwargs), numerical, rtol=1e-6,
                                  atol=1e-7)
    numerical = ref.numerical_gradient(lambda: float(numpy.sum(fold(cols, case.output_size, **case.kwargs) * s)),
                                       cols)
    numpy.testing.assert_allclose(fold_backward(s, **case.kwargs), numerical, rtol=1e-6, atol=1e-7)


def check_fold_sums_overlaps(fold):
    """Folding all-ones counts how many windows cover each pixel; an overwriting fold would give 1s."""
    cols = numpy.ones((2, 3 * 9, 25))
    out = fold(cols, (5, 5), 3, padding=1)
    edge = [4, 6, 6, 6, 4]
    inner = [6, 9, 9, 9, 6]
    counts = numpy.array([edge, inner, inner, inner, edge], float)
    numpy.testing.assert_array_equal(out, numpy.broadcast_to(counts, (2, 3, 5, 5)))
    # dilation 2, stride 1: a pixel is covered by windows whose taps land on it at distance 2
    out = fold(numpy.ones((1, 4, 9)), (4, 4), 2)
    numpy.testing.assert_array_equal(out[0, 0], [[1, 2, 2, 1], [2, 4, 4, 2], [2, 4, 4, 2], [1, 2, 2, 1]])
    # stride 2 with a 3x3 kernel: only the shared rows and columns are covered twice
    out = fold(numpy.ones((1, 9, 4)), (5, 5), 3, stride=2)
    line = [1, 1, 2, 1, 1]
    numpy.testing.assert_array_equal(out[0, 0], numpy.outer(line, line))
    # dilation 2 over a 4x4 plane with a 2x2 kernel: the taps of the 4 windows tile it, each pixel once
    out = fold(numpy.ones((1, 4, 4)), (4, 4), 2, dilation=2)
    numpy.testing.assert_array_equal(out[0, 0], numpy.ones((4, 4)))


# ---------------------------------------------------------------------------------------------------------
# The CPU path


@pytest.mark.parametrize("case", CASES, ids=str)
def test_unfold_matches_reference(case):
    check_unfold(cupyconv.unfold, case)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_fold_matches_reference(case):
    check_fold(cupyconv.fold, case)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_backward_matches_reference(case):
    check_backward(cupyconv.unfold_backward, cupyconv.fold_backward, case)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_torch(case, dtype):
    check_against_torch(cupyconv.unfold, cupyconv.fold, cupyconv.unfold_backward, cupyconv.fold_backward, case,
                        dtype)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_unfold_and_fold_are_adjoint(case):
    check_adjoint(cupyconv.unfold, cupyconv.fold, case)


@pytest.mark.parametrize("case", HALF_CASES, ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_low_precision_matches_reference(case, dtype):
    check_unfold(cupyconv.unfold, case, dtype)
    check_fold(cupyconv.fold, case, dtype)
    check_backward(cupyconv.unfold_backward, cupyconv.fold_backward, case, dtype)


@pytest.mark.parametrize("case", HALF_CASES, ids=str)
def test_bfloat16_through_torch(case):
    torch = pytest.importorskip("torch")
    x, cols = (torch.from_numpy(a).to(torch.bfloat16)
               for a in case.inputs(numpy.random.default_rng(0), numpy.float32))
    got = cupyconv.unfold(x, **case.kwargs)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    assert torch.equal(got, ref.torch_unfold(x, **case.kwargs))
    got = cupyconv.fold(cols, case.output_size, **case.kwargs)
    assert got.dtype == torch.bfloat16
    ref.assert_close(got, ref.fold(ref.to_float64(cols), case.output_size, **case.kwargs), "bfloat16")


@pytest.mark.parametrize("case", FINITE_DIFFERENCE_CASES, ids=str)
def test_gradients_match_finite_differences(case):
    check_finite_differences(cupyconv.unfold, cupyconv.fold, cupyconv.unfold_backward, cupyconv.fold_backward,
                             case)


def test_fold_sums_overlapping_windows():
    check_fold_sums_overlaps(cupyconv.fold)


def test_fold_half_sums_in_float32():
    """Pixel (2, 2) sums nine float16 entries: 1.0 (added first, by tap (0, 0)) and eight of half an ulp of 1.0,
    which would all vanish one by one in a float16 sum."""
    cols = numpy.full((1, 9, 25), 2.0 ** -11, numpy.float16)
    cols[0, 0, 3 * 5 + 3] = 1.0          # tap (0, 0) of window (3, 3) reads pixel (2, 2) with padding 1
    out = cupyconv.fold(cols, (5, 5), 3, padding=1)
    assert out.dtype == numpy.float16 and out.shape == (1, 1, 5, 5)
    numpy.testing.assert_array_equal(out[0, 0, 2, 2], numpy.float16(1.0 + 8 * 2.0 ** -11))
    numpy.testing.assert_array_equal(out[0, 0, 1, 1], numpy.float16(9 * 2.0 ** -11))


def test_unfold_result_is_an_independent_writeable_array():
    """Writing into unfold's result must not be refused, nor change x or a later result."""
    x = ref.random(numpy.random.default_rng(7), (2, 3, 4, 4))
    for kwargs in (dict(kernel_size=1), dict(kernel_size=3), dict(kernel_size=4), dict(kernel_size=2, stride=2)):
        cols = cupyconv.unfold(x, **kwargs)
        before = x.copy()
        cols[...] = 0.0
        numpy.testing.assert_array_equal(x, before)
        assert not numpy.shares_memory(cols, x)


def test_non_contiguous_and_negative_strides():
    case = CASE_BY_NAME["two_leading_dims"]
    rng = numpy.random.default_rng(2)
    a, b, c, h, w = case.x
    images = [ref.random(rng, (b, a, c, w, h)).transpose(1, 0, 2, 4, 3), ref.random(rng, case.x)[:, ::-1, ..., ::-1]]
    cols_shape = case.cols
    columns = [ref.random(rng, (*cols_shape[:-2], cols_shape[-1], cols_shape[-2])).swapaxes(-1, -2),
               ref.random(rng, cols_shape)[::-1, :, ::-1]]
    for x in images:
        assert not x.flags.c_contiguous
        numpy.testing.assert_array_equal(cupyconv.unfold(x, **case.kwargs), ref.unfold(x, **case.kwargs))
        numpy.testing.assert_array_equal(cupyconv.fold_backward(x, **case.kwargs), ref.unfold(x, **case.kwargs))
    for cols in columns:
        assert not cols.flags.c_contiguous
        ref.assert_close(cupyconv.fold(cols, case.output_size, **case.kwargs),
                         ref.fold(cols, case.output_size, **case.kwargs))
        ref.assert_close(cupyconv.unfold_backward(cols, case.output_size, **case.kwargs),
                         ref.fold(cols, case.output_size, **case.kwargs))


@pytest.mark.parametrize("lead", [(0,), (3, 0), (0, 2, 1)], ids=str)
def test_empty_leading_dims(lead):
    x = numpy.empty((*lead, 2, 5, 5), numpy.float32)
    cols = cupyconv.unfold(x, 3, padding=1, stride=2)
    assert cols.shape == (*lead, 18, 9) and cols.dtype == numpy.float32
    out = cupyconv.fold(cols, (5, 5), 3, padding=1, stride=2)
    assert out.shape == x.shape and out.dtype == numpy.float32
    assert cupyconv.unfold_backward(cols, (5, 5), 3, padding=1, stride=2).shape == x.shape
    assert cupyconv.fold_backward(x, 3, padding=1, stride=2).shape == cols.shape


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_and_inf_propagate_like_torch():
    torch = pytest.importorskip("torch")
    case = CASE_BY_NAME["padded"]
    x, cols = case.inputs(numpy.random.default_rng(4))
    x[0, 1, 2, 3], x[1, 0, 0, 0] = numpy.nan, numpy.inf
    # row 13 is channel 1, centre tap: always inside the image (block 7 -> pixel (1, 1), 20 -> (3, 2))
    cols[0, 4, 7], cols[1, 13, 7], cols[1, 13, 20] = numpy.nan, numpy.inf, -numpy.inf
    got = cupyconv.unfold(x, **case.kwargs)
    assert numpy.isnan(got).sum() == 9 and numpy.isinf(got).sum() == 4     # every window that reads them
    ref.assert_close(got, ref.torch_unfold(torch.from_numpy(x), **case.kwargs))
    got = cupyconv.fold(cols, case.output_size, **case.kwargs)
    assert numpy.isnan(got).any() and numpy.isinf(got).any()
    ref.assert_close(got, ref.torch_fold(torch.from_numpy(cols), case.output_size, **case.kwargs))


# ---------------------------------------------------------------------------------------------------------
# Property tests over random specs


@st.composite
def window_cases(draw):
    kernel, stride, padding, dilation, size = draw(ref.window_specs())
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    return WindowCase("hypothesis", (*lead, draw(st.integers(1, 3)), *size), kernel, dilation, padding, stride)


@settings(**ref.PROPERTY_SETTINGS)
@given(case=window_cases(), seed=st.integers(0, 2**32 - 1))
def test_property_matches_torch(case, seed):
    check_against_torch(cupyconv.unfold, cupyconv.fold, cupyconv.unfold_backward, cupyconv.fold_backward, case,
                        "float64", seed)
    check_adjoint(cupyconv.unfold, cupyconv.fold, case, seed)
