"""patch_conv2d's GPU path (raw_kernels/patch.cu and its orchestration in cupyconv/ops/patch.py) against the
NumPy CPU path: under the CPU emulator here, and the same matrix on a real GPU with CuPy under `pytest -m gpu`.

Cases are data (CASES); every case runs forward and backward with both algorithms ('fused' and 'im2col_gemm'),
and the launches are recorded to check which kernel ran and that a strided view of the input is read in place.

The bug classes of issue 12 (each side's padding alone and the last row and column, 16-bit accumulation, loops
over several blocks, 64-bit indices past 2^31) are covered on purpose for every kernel here: the table in
tests/emulator/README.md ("Bug classes the kernel tests cover on purpose") names the test of each.
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass

import numpy
import pytest

import cupyconv
from cupyconv import _device, _kernels
from cupyconv.ops import patch
from cupyconv._spec import NEEDS
import bug_classes
from emulator import EmulatedDevice, assert_clean_under_asan, pytest_under_asan
from reference import ConvCase, cuda_torch

ALGORITHMS = ("fused", "im2col_gemm")
# Largest error allowed, relative to the largest magnitude of the expected result.  The half types are compared
# with the CPU path, which also accumulates in float32 and rounds once; im2col_gemm rounds the GEMM's output
# to the half type before the bias is added, hence the margin.
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}


@dataclass(frozen=True)
class Case(ConvCase):
    """One problem: a reference.ConvCase whose x is the shape of the array drawn; `view` makes the array the op
    is called with from it: "swap12" swaps axes 1 and 2 ((B, C, N, H, W) -> (B, N, C, H, W)), "strided3" takes
    every other index of leading dims 1 and 2 (a batch of three leading dims that no two strides describe).
    `inputs` takes grad_output's shape from the op on the view (ConvCase.output_shape would read x)."""
    view: str | None = None
    sizes: tuple = patch.GENERIC  # the specialisation the fused kernels must pick

    def make_view(self, a):
        if self.view == "swap12":
            return a.swapaxes(1, 2)
        if self.view == "strided3":
            return a[:, ::2, ::2]
        return a

    def inputs(self, rng, dtype):
        """(x base, weight, bias or None, grad_output) as NumPy arrays of dtype; call make_view on x."""
        x = rng.standard_normal(self.x).astype(dtype)
        weight = rng.standard_normal(self.weight).astype(dtype)
        bias = rng.standard_normal(self.weight[0]).astype(dtype) if self.bias else None
        out = cupyconv.patch_conv2d(self.make_view(x.astype(numpy.float64)), weight.astype(numpy.float64),
                                    None, **self.kwargs)
        grad_output = rng.standard_normal(out.shape).astype(dtype)
        return x, weight, bias, grad_output


SPEC4, SPEC8 = (4, 4, 3, 3), (8, 8, 3, 3)
CASES = [
    Case("seed_like_4x4_k3_p1_odd_n", (7, 5, 4, 4), (6, 5, 3, 3), padding=1, sizes=SPEC4),
    Case("8x8_k3_p1", (3, 3, 8, 8), (5, 3, 3, 3), padding=1, sizes=SPEC8),
    Case("4x4_k3_valid_no_bias", (2, 3, 3, 4, 4), (4, 3, 3, 3), padding=0, bias=False, sizes=SPEC4),
    Case("4x4_k3_stride2_groups2", (5, 4, 4, 4), (6, 2, 3, 3), stride=2, padding=1, groups=2, sizes=SPEC4),
    Case("3x5_same_kernel_2x3", (5, 3, 3, 5), (4, 3, 2, 3), padding="same"),
    Case("stride2_odd", (2, 3, 3, 5, 6), (4, 3, 3, 3), stride=2, padding=1),
    Case("dilation2", (3, 2, 6, 5), (3, 2, 3, 3), padding=2, dilation=2),
    Case("groups2_per_side_padding", (2, 3, 4, 5, 4), (6, 2, 2, 3), stride=(1, 2), padding=((1, 0), (2, 1)),
         groups=2),
    Case("kernel_larger_than_patch", (3, 2, 2, 2), (3, 2, 3, 3), padding=1),
    Case("no_leading_dims", (3, 5, 4), (2, 3, 3, 3), padding=1),
    Case("transposed_view", (2, 3, 5, 4, 4), (6, 3, 3, 3), padding=1, view="swap12", sizes=SPEC4),
    Case("transposed_view_B1", (1, 3, 5, 4, 4), (6, 3, 3, 3), padding=1, view="swap12", sizes=SPEC4),
    Case("three_strided_leading_dims", (2, 3, 3, 3, 4, 4), (4, 3, 3, 3), padding=1, view="strided3",
         sizes=SPEC4),
]
CASE_BY_NAME = {case.name: case for case in CASES}


@pytest.fixture(autouse=True)
def several_patches_per_block(monkeypatch):
    """The test batches are tiny: without this, MIN_BLOCKS would put one patch in every block."""
    monkeypatch.setattr(patch, "MIN_BLOCKS", 1)


def assert_matches(actual, expected, dtype, what=""):
    actual, expected = numpy.asarray(actual, numpy.float64), numpy.asarray(expected, numpy.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    scale = max(1.0, float(numpy.abs(expected).max(initial=0.0)))
    error = float(numpy.abs(actual - expected).max(initial=0.0))
    assert error <= TOLERANCE[numpy.dtype(dtype).name] * scale, f"{what}: max error {error} (scale {scale})"


def _dtype(name):
    if name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return numpy.dtype(ml_dtypes.bfloat16)
    return numpy.dtype(name)


class Recorder(_device.Device):
    """Wraps a Device and records every launch: (kernel name expression, arguments)."""

    def __init__(self, inner):
        self.inner, self.xp, self.launches = inner, inner.xp, []

    def launch(self, source, name, grid, block, args, shared_mem=0):
        self.launches.append((name, list(args)))
        self.inner.launch(source, name, grid, block, args, shared_mem)

    def empty(self, shape, dtype):
        return self.inner.empty(shape, dtype)

    def names(self):
        return [name for name, _ in self.launches]


def emulated(fn, *args, order="forward", instantiations=None, **kwargs):
    """fn on NumPy arrays through the emulated GPU path: (result, Recorder)."""
    device = Recorder(EmulatedDevice(order=order, instantiations=instantiations))
    with _device.use_device(device):
        return fn(*args, **kwargs), device


def _tile_name(kernel, dtype, sizes, index="int"):
    return _kernels.kernel_name(kernel, dtype, index, *sizes)


# ---------------------------------------------------------------------------------------------------------
# Emulated: every case, both algorithms, forward and backward


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward(case, algorithm):
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(1), numpy.float64)
    xv = case.make_view(x)
    expected = cupyconv.patch_conv2d(xv, weight, bias, **case.kwargs)
    out, device = emulated(cupyconv.patch_conv2d, xv, weight, bias, algorithm=algorithm, **case.kwargs)
    assert_matches(out, expected, numpy.float64, case.name)
    if algorithm == "fused":
        assert device.names() == [_tile_name("patch_fwd", numpy.float64, case.sizes)]
    else:
        assert [n for n in device.names() if n.startswith("patch")] == []
        assert any(n.startswith("unfold_im2col<double, int,") for n in device.names())


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_backward(case, algorithm):
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(2), numpy.float64)
    xv = case.make_view(x)
    expected = cupyconv.patch_conv2d_backward(grad_output, xv, weight, **case.kwargs)
    grads, device = emulated(cupyconv.patch_conv2d_backward, grad_output, xv, weight, algorithm=algorithm,
                             **case.kwargs)
    for name, got, want in zip(NEEDS, grads, expected):
        assert_matches(got, want, numpy.float64, f"{case.name}: grad {name}")
    if algorithm == "fused":
        assert device.names() == [_tile_name("patch_bwd_input", numpy.float64, case.sizes),
                                  "patch_bwd_weight<double, int>", "patch_reduce<double, int>"]


def test_auto_picks_fused_for_small_patches_and_im2col_gemm_for_large():
    rng = numpy.random.default_rng(3)
    small, weight = rng.standard_normal((3, 2, 16, 16)), rng.standard_normal((3, 2, 3, 3))
    large = rng.standard_normal((2, 2, 16, 17))  # 272 pixels > FUSED_MAX_PIXELS
    for x, kernel in ((small, "patch_fwd"), (large, "unfold_im2col")):
        out, device = emulated(cupyconv.patch_conv2d, x, weight, padding=1)
        assert_matches(out, cupyconv.patch_conv2d(x, weight, padding=1), numpy.float64, kernel)
        assert device.names()[0].startswith(kernel)
    forced, device = emulated(cupyconv.patch_conv2d, large, weight, padding=1, algorithm="fused")
    assert device.names()[0].startswith("patch_fwd")
    assert_matches(forced, cupyconv.patch_conv2d(large, weight, padding=1), numpy.float64, "forced fused")


@pytest.mark.parametrize("needs", [s for r in range(4) for s in itertools.combinations(NEEDS, r)],
                         ids=lambda s: "+".join(s) or "nothing")
def test_needs_subsets(needs):
    case = CASE_BY_NAME["4x4_k3_stride2_groups2"]
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(4), numpy.float64)
    expected = cupyconv.patch_conv2d_backward(grad_output, x, weight, needs=needs, **case.kwargs)
    grads, device = emulated(cupyconv.patch_conv2d_backward, grad_output, x, weight, needs=needs, **case.kwargs)
    for name, got, want in zip(NEEDS, grads, expected):
        assert (got is None) == (name not in needs), name
        if got is not None:
            assert_matches(got, want, numpy.float64, name)
    expected_kernels = {"patch_bwd_input"} if "input" in needs else set()
    if "weight" in needs:
        expected_kernels |= {"patch_bwd_weight", "patch_reduce"}
    assert {name.split("<")[0] for name in device.names()} == expected_kernels


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_transposed_view_is_read_without_a_copy(algorithm):
    case = CASE_BY_NAME["transposed_view"]
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(5), numpy.float64)
    xv = case.make_view(x)  # (B, N, C, H, W) view of a (B, C, N, H, W) array
    assert not xv.flags.c_contiguous
    _, device = emulated(cupyconv.patch_conv2d, xv, weight, bias, algorithm=algorithm, padding=1)
    _, backward = emulated(cupyconv.patch_conv2d_backward, grad_output, xv, weight, needs=("weight",),
                           algorithm=algorithm, padding=1)
    for name, args in device.launches + backward.launches:
        if name.startswith(("patch_fwd", "patch_bwd_weight", "unfold_im2col")):
            assert numpy.shares_memory(args[0], x), f"{name} was given a copy of x"


def test_grad_weight_is_bit_deterministic(monkeypatch):
    # Several slices of several batches each, so that patch_reduce adds up more than one partial sum.
    monkeypatch.setattr(patch, "WEIGHT_PIXELS", 16)
    monkeypatch.setattr(patch, "WEIGHT_BLOCKS", 3)
    case = CASE_BY_NAME["seed_like_4x4_k3_p1_odd_n"]
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(6), numpy.float32)
    plan = patch.plan_weight(_spec(x.shape, weight.shape), numpy.float32)
    assert plan.slices == 3 and plan.patches == 1
    runs = [emulated(cupyconv.patch_conv2d_backward, grad_output, x, weight, needs=("weight",), order=order,
                     **case.kwargs)[0][1] for order in ("forward", "forward", "reverse")]
    assert all(numpy.array_equal(r.view(numpy.uint32), runs[0].view(numpy.uint32)) for r in runs)
    expected = cupyconv.patch_conv2d_backward(grad_output, x, weight, needs=("weight",), **case.kwargs)[1]
    assert_matches(runs[0], expected, numpy.float32)


def test_small_blocks_tile_chunk_and_slice(monkeypatch):
    """Shrunk limits force every multi-step path: several output tiles, reduced-channel chunks and patch
    halving in the tile kernels; several d and k tiles, slices and batches per slice in the weight kernel."""
    monkeypatch.setattr(patch, "MAX_THREADS", 8)
    monkeypatch.setattr(patch, "TARGET_THREADS", 8)
    monkeypatch.setattr(patch, "WEIGHT_MAX_THREADS", 8)
    monkeypatch.setattr(patch, "DEFAULT_SHARED_LIMIT", 4096)
    monkeypatch.setattr(patch, "WEIGHT_BLOCKS", 108)
    monkeypatch.setattr(patch, "WEIGHT_PIXELS", 16)
    case = Case("many_channels", (5, 40, 4, 4), (36, 20, 3, 3), padding=1, groups=2)
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(7), numpy.float64)
    spec = patch.ConvSpec.for_conv("t", x, weight, None, 1, 1, 1, 2, leading_dims=True)  # groups 2
    for transposed in (False, True):
        plan = patch.plan_tile(spec, numpy.float64, transposed)
        assert plan.out_tiles > 1 and plan.chunk < 18 and plan.threads <= 8, plan
    wplan = patch.plan_weight(spec, numpy.float64)
    assert wplan.weight_tiles > 2 and wplan.slices == 3 and wplan.patches == 1, wplan
    out, _ = emulated(cupyconv.patch_conv2d, x, weight, bias, **case.kwargs)
    assert_matches(out, cupyconv.patch_conv2d(x, weight, bias, **case.kwargs), numpy.float64, "forward")
    grads, _ = emulated(cupyconv.patch_conv2d_backward, grad_output, x, weight, **case.kwargs)
    expected = cupyconv.patch_conv2d_backward(grad_output, x, weight, **case.kwargs)
    for name, got, want in zip(NEEDS, grads, expected):
        assert_matches(got, want, numpy.float64, name)


@pytest.mark.parametrize("per_call", [False, True], ids=["setting", "keyword"])
def test_im2col_gemm_chunks_to_the_workspace(per_call):
    """The budget of the setting, or of the call's workspace_limit (forward and backward), chunks the columns."""
    case = CASE_BY_NAME["transposed_view"]
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(8), numpy.float64)
    xv = case.make_view(x)
    budget = 3 * 9 * 16 * 8 * 2  # two patches' columns per chunk
    keyword = {"workspace_limit": budget} if per_call else {}
    with contextlib.nullcontext() if per_call else cupyconv.workspace_limit(budget):
        out, device = emulated(cupyconv.patch_conv2d, xv, weight, bias, algorithm="im2col_gemm", **keyword,
                               **case.kwargs)
        grads, _ = emulated(cupyconv.patch_conv2d_backward, grad_output, xv, weight, algorithm="im2col_gemm",
                            **keyword, **case.kwargs)
    assert sum(n.startswith("unfold_im2col<double, int,") for n in device.names()) == 2 * 3  # B = 2 outer patches x 3 chunks of N = 5
    assert_matches(out, cupyconv.patch_conv2d(xv, weight, bias, **case.kwargs), numpy.float64, "forward")
    for name, got, want in zip(NEEDS, grads, cupyconv.patch_conv2d_backward(grad_output, xv, weight,
                                                                             **case.kwargs)):
        assert_matches(got, want, numpy.float64, name)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_dtypes(dtype, algorithm):
    case = CASE_BY_NAME["seed_like_4x4_k3_p1_odd_n"]
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(9), _dtype(dtype))
    out, device = emulated(cupyconv.patch_conv2d, x, weight, bias, algorithm=algorithm, **case.kwargs)
    assert out.dtype == x.dtype
    assert_matches(out, cupyconv.patch_conv2d(x, weight, bias, **case.kwargs), dtype, "forward")
    grads, _ = emulated(cupyconv.patch_conv2d_backward, grad_output, x, weight, algorithm=algorithm,
                        **case.kwargs)
    expected = cupyconv.patch_conv2d_backward(grad_output, x, weight, **case.kwargs)
    for name, got, want in zip(NEEDS, grads, expected):
        assert got.dtype == x.dtype, name
        assert_matches(got, want, dtype, name)


def test_64_bit_index_variants(monkeypatch):
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)  # every extent "passes 2^31": long long
    case = CASE_BY_NAME["transposed_view"]
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(10), numpy.float32)
    xv = case.make_view(x)
    out, forward = emulated(cupyconv.patch_conv2d, xv, weight, bias, **case.kwargs)
    grads, backward = emulated(cupyconv.patch_conv2d_backward, grad_output, xv, weight, **case.kwargs)
    assert forward.names() + backward.names() == [
        *(_tile_name(k, numpy.float32, SPEC4, "long long") for k in patch.TILE_KERNELS),
        "patch_bwd_weight<float, long long>", "patch_reduce<float, long long>"]
    assert_matches(out, cupyconv.patch_conv2d(xv, weight, bias, **case.kwargs), numpy.float32, "forward")
    for name, got, want in zip(NEEDS, grads, cupyconv.patch_conv2d_backward(grad_output, xv, weight,
                                                                             **case.kwargs)):
        assert_matches(got, want, numpy.float32, name)


# ---------------------------------------------------------------------------------------------------------
# Bug classes covered on purpose (issue 12; tests/bug_classes.py, table in tests/emulator/README.md)

#: The fused tile kernels' specialisations and a generic geometry: (patch size, weight shape, stride, groups).
FUSED_PATHS = [((4, 4), (6, 5, 3, 3), 1, 1), ((8, 8), (5, 4, 3, 3), 1, 1), ((5, 6), (6, 2, 3, 2), (2, 1), 2)]
FUSED_IDS = ["4x4_k3", "8x8_k3", "generic_5x6_k3x2_stride21_groups2"]


def fused_case(path, padding, name, n=5):
    size, weight, stride, groups = path
    strides = (stride, stride) if isinstance(stride, int) else stride
    if size not in ((4, 4), (8, 8)):  # the specialisations keep their size; stride 1 ends on the last row anyway
        size = tuple(bug_classes.touching_size(lo, k, s, 1, pad) for lo, k, s, pad in zip(size, weight[2:], strides,
                                                                                          padding))
    sizes = (*size, *weight[2:]) if (*size, *weight[2:]) in patch.SPECIALISATIONS else patch.GENERIC
    return Case(name, (n, weight[1] * groups, *size), weight, stride=stride, padding=padding, groups=groups,
                sizes=sizes)


@pytest.mark.parametrize("path", FUSED_PATHS, ids=FUSED_IDS)
def test_padding_per_side_and_last_row_and_column(path):
    """The fused kernels (forward, input and weight gradients) with each side's padding differing alone; the last
    window of every case ends on the last padded row and column."""
    for k, (side, padding) in enumerate(bug_classes.per_side_paddings(1)):
        case = fused_case(path, padding, side)
        x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(50 + k), numpy.float64)
        order = "reverse" if k % 2 else "forward"
        out, forward = emulated(cupyconv.patch_conv2d, x, weight, bias, algorithm="fused", order=order,
                                **case.kwargs)
        assert_matches(out, cupyconv.patch_conv2d(x, weight, bias, **case.kwargs), numpy.float64, f"{side} forward")
        grads, backward = emulated(cupyconv.patch_conv2d_backward, grad_output, x, weight, algorithm="fused",
                                   order=order, **case.kwargs)
        for name, got, want in zip(NEEDS, grads, cupyconv.patch_conv2d_backward(grad_output, x, weight,
                                                                                 **case.kwargs)):
            assert_matches(got, want, numpy.float64, f"{side} grad {name}")
        assert forward.names() + backward.names()[:1] == [_tile_name(kernel, numpy.float64, case.sizes)
                                                          for kernel in patch.TILE_KERNELS]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("path", FUSED_PATHS, ids=FUSED_IDS)
def test_accumulates_in_float32(path, dtype, monkeypatch):
    """The fused kernels and patch_reduce (several slices) on data whose float32 sums are exact: every result is the
    float64 one rounded once, which a 16-bit accumulator misses."""
    monkeypatch.setattr(patch, "WEIGHT_BLOCKS", 4)
    monkeypatch.setattr(patch, "WEIGHT_PIXELS", 16)
    case = fused_case(path, ((1, 0), (0, 1)), "exact")
    rng = numpy.random.default_rng(51)
    x, weight, bias = (bug_classes.exact_terms(rng, shape, dtype) for shape in (case.x, case.weight, case.weight[:1]))
    grad_output = bug_classes.exact_terms(rng, cupyconv.patch_conv2d(x, weight, **case.kwargs).shape, dtype)
    as64 = [a.astype(numpy.float64) for a in (x, weight, bias, grad_output)]
    out, forward = emulated(cupyconv.patch_conv2d, x, weight, bias, algorithm="fused", **case.kwargs)
    grads, backward = emulated(cupyconv.patch_conv2d_backward, grad_output, x, weight, algorithm="fused",
                               needs=("input", "weight"), **case.kwargs)
    assert [name.split("<")[0] for name in forward.names() + backward.names()] == [
        "patch_fwd", "patch_bwd_input", "patch_bwd_weight", "patch_reduce"]
    assert backward.launches[1][1][2].shape[0] >= 2, "slices for patch_reduce to add"
    bug_classes.assert_rounded_once(out, cupyconv.patch_conv2d(*as64[:3], **case.kwargs), dtype, "forward")
    for name, got, want in zip(NEEDS, grads, cupyconv.patch_conv2d_backward(as64[3], *as64[:2], **case.kwargs)):
        if got is not None:
            bug_classes.assert_rounded_once(got, want, dtype, f"grad {name}")


def test_grid_loops_with_several_blocks(monkeypatch):
    """patch_reduce's grid-stride loop on three blocks of 32 threads for 6 blocks' worth of weights, and
    patch_bwd_weight's slices (blockIdx.x) walking 5 batches in 2 slices: a loop that starts at threadIdx.x or
    at batch 0, or does not stride, loses or repeats sums."""
    loops = bug_classes.GridLoops(monkeypatch, cap=3)
    monkeypatch.setattr(patch, "WEIGHT_BLOCKS", 2)
    monkeypatch.setattr(patch, "WEIGHT_PIXELS", 16)
    case = fused_case(FUSED_PATHS[0], ((1, 1), (1, 1)), "loops")
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(52), numpy.float64)
    plan = patch.plan_weight(_spec(x.shape, weight.shape), numpy.float64)
    assert plan.slices == 2 and plan.patches == 1 and weight.size > 3 * 32, plan
    device = Recorder(loops.device(EmulatedDevice("reverse")))
    with _device.use_device(device):
        got = cupyconv.patch_conv2d_backward(grad_output, x, weight, needs="weight", **case.kwargs)[1]
    assert_matches(got, cupyconv.patch_conv2d_backward(grad_output, x, weight, needs="weight", **case.kwargs)[1],
                   numpy.float64)
    assert loops.looped() == loops.capped() == {"patch_reduce"}, loops.launches


#: 65535 groups (the most grid.y takes) of 64 -> 64 channels (80 for kernels of fewer than 9 taps): the last
#: group's weights start past 2^31 (((g * 64 + r) * 64 + o) * taps).
HUGE_GROUPS = 65535


@pytest.mark.parametrize("path", FUSED_PATHS, ids=FUSED_IDS)
def test_64_bit_indices_past_2_31(path, monkeypatch):
    """patch_fwd and patch_bwd_input, each specialisation, in their `long long` instantiations with a
    2.4e9-element weight (sparse memory; only the last block of each launch runs: bug_classes.SparseDevice).
    Every weight offset of the last group passes 2^31, so an `int` product there overflows, which UBSan turns
    into a failed launch; what the last block writes matches the CPU path on the last group alone.
    (patch_bwd_weight cannot get there: a weight of 2^31 elements needs more blocks along grid.y than CUDA's
    65535, which its planner refuses.)"""
    size, (_, _, kh, kw), stride, _ = path
    case = fused_case(path, ((1, 1), (1, 0)), "huge", n=1)
    q = 64 if kh * kw >= 9 else 80  # channels per group, in and out: q * q * taps * 65535 past 2^31
    g, c = HUGE_GROUPS, q * HUGE_GROUPS
    rng = numpy.random.default_rng(53)
    x = bug_classes.sparse_zeros((1, c, *case.x[2:]), numpy.float16)
    x[:, -q:] = rng.standard_normal((1, q, *case.x[2:]))
    weight = bug_classes.sparse_zeros((c, q, kh, kw), numpy.float16)
    weight[-q:] = rng.standard_normal((q, q, kh, kw)) / 8
    kwargs = dict(stride=case.stride, padding=case.padding, groups=g)
    last = dict(stride=case.stride, padding=case.padding)
    out_shape = cupyconv.patch_conv2d(x[:, :q], weight[:q], **last).shape
    grad_output = bug_classes.sparse_zeros((1, c, *out_shape[2:]), numpy.float16)
    grad_output[:, -q:] = rng.standard_normal((1, q, *out_shape[2:]))
    device = bug_classes.SparseDevice()
    with _device.use_device(device):
        out = cupyconv.patch_conv2d(x, weight, algorithm="fused", **kwargs)
        grad_x = cupyconv.patch_conv2d_backward(grad_output, x, weight, needs="input", algorithm="fused",
                                                **kwargs)[0]
    want = cupyconv.patch_conv2d(x[:, -q:], weight[-q:], **last)
    bug_classes.assert_tail_written(out, want.reshape(-1)[-1024:], numpy.float16, 64, "forward")
    want = cupyconv.patch_conv2d_backward(grad_output[:, -q:], x[:, -q:], weight[-q:], needs="input", **last)[0]
    bug_classes.assert_tail_written(grad_x, want.reshape(-1)[-1024:], numpy.float16, 64, "grad_input")
    assert device.launches == [_tile_name(kernel, numpy.float16, case.sizes, "long long")
                               for kernel in patch.TILE_KERNELS]


def test_empty_batch():
    x, weight = numpy.zeros((0, 3, 3, 4, 4)), numpy.ones((2, 3, 3, 3))
    out, device = emulated(cupyconv.patch_conv2d, x, weight, padding=1)
    assert out.shape == (0, 3, 2, 4, 4) and device.launches == []
    grads, _ = emulated(cupyconv.patch_conv2d_backward, numpy.zeros(out.shape), x, weight, padding=1)
    assert grads[0].shape == x.shape and not grads[1].any() and not grads[2].any()


def test_algorithm_errors(monkeypatch):
    x, weight = numpy.ones((2, 3, 4, 4)), numpy.ones((2, 3, 3, 3))
    with pytest.raises(ValueError, match="algorithm must be one of"):
        cupyconv.patch_conv2d(x, weight, algorithm="winograd")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        emulated(cupyconv.patch_conv2d_backward, numpy.ones((2, 2, 2, 2)), x, weight, algorithm="")
    monkeypatch.setattr(patch, "DEFAULT_SHARED_LIMIT", 64)
    with pytest.raises(ValueError, match="algorithm='fused' has no block that fits"):
        emulated(cupyconv.patch_conv2d, x, weight, algorithm="fused")
    out, device = emulated(cupyconv.patch_conv2d, x, weight)  # 'auto' falls back to im2col_gemm
    assert any(n.startswith("unfold_im2col<double, int,") for n in device.names())
    assert_matches(out, cupyconv.patch_conv2d(x, weight), numpy.float64)


def _spec(x_shape, weight_shape, padding=1):
    x, weight = numpy.empty(x_shape, numpy.float32), numpy.empty(weight_shape, numpy.float32)
    return patch.ConvSpec.for_conv("t", x, weight, None, 1, padding, 1, 1, leading_dims=True)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("n, size", [(20480, 4), (20480, 8), (1280, 4)])
def test_plans_of_the_benchmark_shapes(monkeypatch, n, size, dtype):
    """The block shapes of the GPU benchmark's shapes (C = 32, D = 64, k3, p1): whole warps, within the limits,
    and enough blocks to spread over a large GPU."""
    monkeypatch.undo()  # the real MIN_BLOCKS
    spec = _spec((1, n, 32, size, size), (64, 32, 3, 3))
    for transposed in (False, True):
        plan = patch.plan_tile(spec, dtype, transposed)
        assert plan.threads % 32 == 0 and plan.threads <= patch.MAX_THREADS, plan
        assert plan.shared_mem <= patch.DEFAULT_SHARED_LIMIT, plan
        assert -(-n // plan.patches) * plan.out_tiles >= min(patch.MIN_BLOCKS, n), plan
    if (n, size, dtype) == (20480, 4, "float32"):  # the seed shape: 16 patches x 4 pixel groups x 4 lanes
        assert patch.plan_tile(spec, dtype, False) == patch.TilePlan(16, 64, 1, 8, 292, 256, 37120)
    wplan = patch.plan_weight(spec, dtype)
    assert wplan.threads <= patch.WEIGHT_MAX_THREADS and wplan.shared_mem <= patch.DEFAULT_SHARED_LIMIT, wplan
    assert wplan.slices * wplan.weight_tiles >= min(patch.WEIGHT_BLOCKS // 2, n), wplan


def test_every_instantiation_is_listed():
    names = set(patch.instantiations())
    for kernel in patch.TILE_KERNELS:
        for sizes in (*patch.SPECIALISATIONS, patch.GENERIC):
            assert _tile_name(kernel, numpy.float16, sizes, "long long") in names
    assert {"patch_bwd_weight<double, long long>", "patch_reduce<__nv_bfloat16, int>"} <= names


# ---------------------------------------------------------------------------------------------------------
# AddressSanitizer: every kernel once (the tile kernels specialised and generic), in a child process


def test_kernels_once():
    """Runs under ASan through test_asan; on its own, one more emulated comparison.  Only the kernels it
    launches are compiled (an ASan build of every instantiation takes most of a minute)."""
    kernels = [(patch.KERNELS.filename, name) for name in ["patch_bwd_weight<float, int>", "patch_reduce<float, int>", *(
        _tile_name(k, numpy.float32, sizes) for k in patch.TILE_KERNELS for sizes in (SPEC4, patch.GENERIC))]]
    for case in (CASE_BY_NAME["transposed_view"], CASE_BY_NAME["stride2_odd"]):
        x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(11), numpy.float32)
        xv = case.make_view(x)
        out, _ = emulated(cupyconv.patch_conv2d, xv, weight, bias, instantiations=kernels, **case.kwargs)
        assert_matches(out, cupyconv.patch_conv2d(xv, weight, bias, **case.kwargs), numpy.float32)
        grads, device = emulated(cupyconv.patch_conv2d_backward, grad_output, xv, weight, instantiations=kernels,
                                 **case.kwargs)
        assert len(device.launches) == 3
        for got, want in zip(grads, cupyconv.patch_conv2d_backward(grad_output, xv, weight, **case.kwargs)):
            assert_matches(got, want, numpy.float32)


def test_asan():
    assert_clean_under_asan(pytest_under_asan("tests/test_patch_kernels.py::test_kernels_once"))


# ---------------------------------------------------------------------------------------------------------
# The same on a real GPU with CuPy arrays (bfloat16 through ml_dtypes, as CuPy takes it)


def gpu(fn, *args, **kwargs):
    """fn with its NumPy arguments copied to the GPU (other arguments, e.g. GPU views, as they are)."""
    import cupy
    result = fn(*(cupy.asarray(a) if isinstance(a, numpy.ndarray) else a for a in args), **kwargs)
    if isinstance(result, tuple):
        return tuple(None if r is None else cupy.asnumpy(r) for r in result)
    return cupy.asnumpy(result)


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gpu_forward_backward(case, algorithm):
    import cupy
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(12), numpy.float32)
    xv = case.make_view(x)
    x_gpu = case.make_view(cupy.asarray(x))  # the view taken on the GPU, read in place there
    out = gpu(cupyconv.patch_conv2d, x_gpu, weight, bias, algorithm=algorithm, **case.kwargs)
    assert_matches(out, cupyconv.patch_conv2d(xv, weight, bias, **case.kwargs), numpy.float32, "forward")
    grads = gpu(cupyconv.patch_conv2d_backward, grad_output, x_gpu, weight, algorithm=algorithm, **case.kwargs)
    for name, got, want in zip(NEEDS, grads, cupyconv.patch_conv2d_backward(grad_output, xv, weight,
                                                                             **case.kwargs)):
        assert_matches(got, want, numpy.float32, name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("case", [CASE_BY_NAME["seed_like_4x4_k3_p1_odd_n"], CASE_BY_NAME["8x8_k3_p1"]], ids=str)
def test_gpu_dtypes(case, algorithm, dtype):
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(13), _dtype(dtype))
    out = gpu(cupyconv.patch_conv2d, x, weight, bias, algorithm=algorithm, **case.kwargs)
    assert out.dtype == x.dtype
    assert_matches(out, cupyconv.patch_conv2d(x, weight, bias, **case.kwargs), dtype, "forward")
    grads = gpu(cupyconv.patch_conv2d_backward, grad_output, x, weight, algorithm=algorithm, **case.kwargs)
    for name, got, want in zip(NEEDS, grads, cupyconv.patch_conv2d_backward(grad_output, x, weight,
                                                                             **case.kwargs)):
        assert_matches(got, want, dtype, name)


@pytest.mark.gpu
@pytest.mark.parametrize("needs", [("input",), ("weight",), ("bias",), ()], ids=lambda s: "+".join(s) or "none")
def test_gpu_needs(needs):
    case = CASE_BY_NAME["4x4_k3_stride2_groups2"]
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(14), numpy.float32)
    grads = gpu(cupyconv.patch_conv2d_backward, grad_output, x, weight, needs=needs, **case.kwargs)
    expected = cupyconv.patch_conv2d_backward(grad_output, x, weight, needs=needs, **case.kwargs)
    for name, got, want in zip(NEEDS, grads, expected):
        assert (got is None) == (want is None), name
        if got is not None:
            assert_matches(got, want, numpy.float32, name)


@pytest.mark.gpu
def test_gpu_seed_shape_and_determinism(monkeypatch):
    """The seed shape itself (B=1, N=20480, C=32, D=64, 4x4, k3, p1) in float32 with the real MIN_BLOCKS, and
    grad weight's bits on two runs."""
    monkeypatch.undo()
    rng = numpy.random.default_rng(15)
    x = rng.standard_normal((1, 20480, 32, 4, 4), dtype=numpy.float32)
    weight = (rng.standard_normal((64, 32, 3, 3)) / 17).astype(numpy.float32)
    bias = rng.standard_normal(64).astype(numpy.float32)
    grad_output = rng.standard_normal((1, 20480, 64, 4, 4), dtype=numpy.float32)
    out = gpu(cupyconv.patch_conv2d, x, weight, bias, padding=1)
    assert_matches(out, cupyconv.patch_conv2d(x, weight, bias, padding=1), numpy.float32, "forward")
    first = gpu(cupyconv.patch_conv2d_backward, grad_output, x, weight, padding=1)
    second = gpu(cupyconv.patch_conv2d_backward, grad_output, x, weight, padding=1, needs=("weight",))
    assert numpy.array_equal(first[1].view(numpy.uint32), second[1].view(numpy.uint32))
    for name, got, want in zip(NEEDS, first, cupyconv.patch_conv2d_backward(grad_output, x, weight, padding=1)):
        assert_matches(got, want, numpy.float32, name)


@pytest.mark.gpu
def test_gpu_torch_tensors_transposed_view():
    """torch CUDA tensors through DLPack, the (B, C, N, H, W) -> (B, N, C, H, W) view included."""
    torch = cuda_torch()
    case = CASE_BY_NAME["transposed_view"]
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(16), numpy.float32)
    xt = torch.from_numpy(x).cuda().transpose(1, 2)
    wt, bt, gt = (torch.from_numpy(a).cuda() for a in (weight, bias, grad_output))
    out = cupyconv.patch_conv2d(xt, wt, bt, **case.kwargs)
    assert isinstance(out, torch.Tensor) and out.is_cuda
    xv = case.make_view(x)
    assert_matches(out.cpu().numpy(), cupyconv.patch_conv2d(xv, weight, bias, **case.kwargs), numpy.float32)
    grads = cupyconv.patch_conv2d_backward(gt, xt, wt, **case.kwargs)
    for name, got, want in zip(NEEDS, grads, cupyconv.patch_conv2d_backward(grad_output, xv, weight,
                                                                             **case.kwargs)):
        assert_matches(got.cpu().numpy(), want, numpy.float32, name)
