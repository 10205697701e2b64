"""The channels-last tensor-core path (raw_kernels/implicit_gemm.cu, section "forward and input gradient,
channels-last": conv_fwd_igemm and channels_last_copy; cupyconv/ops/implicit_gemm.py's section of that name)
against the CPU path in float64, on the emulator.

The emulator runs cp.async with the hardware's rules (data lands only at the wait that retires its group, the
destination holds poison before, zero-fill honoured) and ldmatrix with the PTX ISA's lane distribution, so a
missing wait, a wrong swizzle on one side, a fragment in the wrong register or an unmasked edge fails here.
Problems are small and odd: rows (pixels) never a multiple of the tile, K chunks that straddle taps (channels
per group 16, 24, 40 against chunks of 32 halves or 16 floats), padding per side, stride and dilation differing
per axis, groups, several column tiles, the epilogue's vector and scalar stores.
"""
import dataclasses

import numpy
import pytest
from optional_deps import BFLOAT16, Dtypes

import cupyconv
from cupyconv import _device, _kernels, settings
from cupyconv._spec import ceil_div, transposed_spec
from cupyconv.ops import implicit_gemm as igemm
import bug_classes
from bug_classes import Recorder
from emulator import EmulatedDevice, assert_clean_under_asan, pytest_under_asan
from reference import ConvCase

C = ConvCase
DTYPES = Dtypes({"float16": numpy.float16, "bfloat16": BFLOAT16, "float32": numpy.float32})
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-3}   # as tests/test_tensor_core_kernels.py

CASES = [
    # M 126 (not a tile multiple), N 20, K (9 taps x 16 channels): two taps per chunk of 32 halves; 63 pixels per
    # image: the epilogue's scalar stores
    C("ig_plain", (2, 16, 9, 7), (20, 16, 3, 3), padding=1),
    # 24 channels per group: chunks straddle taps mid-way; stride and dilation differ per axis, groups 2,
    # each side padded differently
    C("ig_groups_stride_dilation", (1, 48, 11, 10), (24, 24, 3, 2), stride=(2, 1), padding=((2, 0), (1, 3)),
      dilation=(1, 2), groups=2),
    # 8 x 8 output pixels per image: the 16-byte vector stores; 40 channels, no bias
    C("ig_vector_stores", (2, 40, 8, 8), (36, 40, 3, 3), padding=1, bias=False),
    # 1 x 1, 72 output channels: two 64-column tiles per group
    C("ig_pointwise_two_column_tiles", (3, 16, 6, 7), (72, 16, 1, 1)),
]
CASE_BY_NAME = {case.name: case for case in CASES}


def run(device, fn, *args, **kwargs):
    with _device.use_device(device), settings.allow_tf32(True):
        return fn(*args, **kwargs)


def as64(*arrays):
    return [None if a is None else numpy.asarray(a, numpy.float64) for a in arrays]


def assert_close(got, want, dtype, what=""):
    got = numpy.asarray(got, numpy.float64)
    scale = max(float(numpy.abs(want).max(initial=0.0)), 1e-30)
    err = float(numpy.abs(got - want).max(initial=0.0))   # NaN (never written) fails too
    assert err <= TOLERANCE[dtype] * scale, f"{what}: max error {err:.3g} vs max |value| {scale:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_matches_cpu_path(case, dtype):
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(0), DTYPES[dtype])
    device = Recorder("reverse" if case.name.endswith("stores") else "forward")
    out = run(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    assert device.count("conv_fwd_igemm") == 1 and device.count("conv_fwd_tc") == 0, device.launches
    assert out.dtype == x.dtype and out.shape == case.output_shape
    assert_close(out, cupyconv.conv2d(*as64(x, weight, bias), **case.kwargs), dtype, case.name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [CASE_BY_NAME["ig_plain"], C("ig_dilated_cropped", (1, 16, 9, 8), (24, 16, 3, 2),
                                                                padding=((0, 2), (3, 0)), dilation=(2, 3))],
                         ids=str)
def test_input_gradient_at_stride_1_runs_the_forward_kernel(case, dtype):
    """grad_input at stride 1 is conv_fwd_igemm over the transposed window (padding that crops included) with the
    weight arranged as (C, flipped taps, D / G); D / G = 20 or 24 (multiples of 4 and 8)."""
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(1), DTYPES[dtype])
    device = Recorder()
    got = run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm", needs=("input",),
              **case.kwargs)[0]
    if dtype != "float32" and case.weight[0] % 8:   # D / G = 20: no whole 16-byte vectors of halves
        assert device.count("conv_bwd_input_tc") == 1, device.launches
    else:
        assert device.count("conv_fwd_igemm") == 1 and device.count("conv_bwd_input_tc") == 0, device.launches
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **case.kwargs)[0]
    assert_close(got, want, dtype, case.name)


def test_input_gradient_at_stride_2_stays_on_the_gather_without_whole_vectors():
    """D / G = 12 halves: no whole 16-byte vectors, so no phases (tests/test_igemm_phases.py) but the gather."""
    case = CASE_BY_NAME["ig_groups_stride_dilation"]
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(2), numpy.float16)
    device = Recorder()
    got = run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm", needs=("input",),
              **case.kwargs)[0]
    assert device.launches and all(name.startswith("conv_bwd_input_tc<") for name in device.launches)
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **case.kwargs)[0]
    assert_close(got, want, "float16")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("columns", [136, 40])
def test_every_tile(dtype, columns, monkeypatch):
    """IG_WAVE_BLOCKS 1: the planner takes the largest tile (for 136 columns, two column tiles: 128 x 128 with 4
    stages and 64 KiB of opted-in dynamic shared memory for 16-bit types, 128 x 64 for float32; for 40 columns the
    largest of at most 64 columns: 256 x 64, warps of 64 x 64 stacked 4 x 1, 80 KiB); for no tile: the smallest."""
    case = C("ig_tiles", (2, 32, 7, 9), (columns, 32, 3, 3), padding=((1, 0), (0, 1)))
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(3), DTYPES[dtype])
    want = cupyconv.conv2d(*as64(x, weight, bias), **case.kwargs)
    largest = next(t for t in igemm.IG_TILES[dtype] if columns > 64 or t[1] <= 64)
    for wave, tile in ((1, largest), (10**9, igemm.IG_TILES[dtype][-1])):
        monkeypatch.setattr(igemm, "IG_WAVE_BLOCKS", wave)
        device = Recorder()
        out = run(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
        launched = [name for name in device.launches if name.startswith("conv_fwd_igemm<")]
        assert launched == [_kernels.kernel_name("conv_fwd_igemm", dtype, "int", *tile)], device.launches
        assert_close(out, want, dtype, str(tile))


def nhwc(a):
    """a (n, C, H, W) with the same values in channels-last memory, as torch's channels_last tensors lie."""
    return numpy.moveaxis(numpy.ascontiguousarray(numpy.moveaxis(a, 1, -1)), -1, 1)


# channels-last output: every case (D / G = 20, 12, 36, 72: whole 16-byte vectors of float32, of 16-bit types only
# for 72; a partial second column tile), groups with D / G = 16, the largest tiles (IG_WAVE_BLOCKS 1: 128 x 128,
# 256 x 64, float's 128 x 64) and split-K
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case, wave, split", [(case, None, None) for case in CASES] + [
    (C("ig_groups_cl", (1, 48, 11, 10), (32, 24, 3, 2), stride=(2, 1), padding=((2, 0), (1, 3)), dilation=(1, 2),
       groups=2), None, None),
    (C("ig_tiles_cl", (2, 32, 7, 9), (136, 32, 3, 3), padding=((1, 0), (0, 1))), 1, None),
    (C("ig_tiles_cl", (2, 32, 7, 9), (40, 32, 3, 3), padding=((1, 0), (0, 1))), 1, None),
    (C("ig_split_cl", (2, 48, 5, 6), (48, 24, 3, 3), padding=1, groups=2), None, 3)], ids=str)
def test_channels_last_input_gives_channels_last_output(case, wave, split, dtype, monkeypatch):
    """x in channels-last memory: out is channels-last too (written so by conv_fwd_igemm's epilogue, no copy, x
    read in place) where a group's output channels are whole 16-byte vectors, else NCHW; equal to the CPU path;
    an NCHW x still gets a C-contiguous out."""
    if wave is not None:
        monkeypatch.setattr(igemm, "IG_WAVE_BLOCKS", wave)
    if split is not None:
        monkeypatch.setattr(igemm, "IG_SPLIT_CHUNKS", split)
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(7), DTYPES[dtype])
    want = cupyconv.conv2d(*as64(x, weight, bias), **case.kwargs)
    for order in ("forward", "reverse"):
        device = Recorder(order)
        out = run(device, cupyconv.conv2d, nhwc(x), weight, bias, algorithm="implicit_gemm", **case.kwargs)
        whole_vectors = case.weight[0] // case.kwargs.get("groups", 1) % igemm.vector_elements(DTYPES[dtype]) == 0
        assert igemm.is_channels_last(out) == whole_vectors and out.shape == case.output_shape, out.strides
        assert device.count("conv_fwd_igemm") == 1, device.launches
        # x in place (float32: rounded to tf32 in the copy); the weight's copy, a view for 1 x 1 16-bit
        copies = (dtype == "float32") + (dtype == "float32" or case.weight[2:] != (1, 1))
        assert device.copies() == [[], ["channels_last_copy"], ["channels_last_copies"]][copies], device.launches
        assert split is None or device.count("conv_bwd_weight_igemm_finish") == 1, device.launches
        assert_close(out, want, dtype, f"{case.name} {order}")
    out = run(Recorder(), cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    assert out.flags.c_contiguous


# ---------------------------------------------------------------------------------------------------------
# narrow tiles (IG_NARROW_TILES): groups of at most 32 columns

NARROW_CASES = [
    # 4 groups of 16 channels in and out: a 32-column tile, its last 16 columns past the group; 126 rows (partial)
    C("ig_narrow_16", (2, 64, 9, 7), (64, 16, 3, 3), padding=1, groups=4),
    # 2 groups of 32 channels: the whole tile; stride and dilation per axis, padding per side
    C("ig_narrow_32", (1, 64, 12, 11), (64, 32, 3, 2), stride=(1, 2), padding=((2, 0), (1, 1)), dilation=(2, 1),
      groups=2),
    # 3 groups of 24 output channels from 16: 8 columns past the group
    C("ig_narrow_partial_24", (2, 48, 8, 8), (72, 16, 3, 3), padding=1, groups=3),
    # 12 output channels per group from 16, no bias
    C("ig_narrow_partial_12", (1, 32, 10, 13), (24, 16, 1, 3), padding=(0, 1), groups=2, bias=False),
]


def narrow_tile(wave, monkeypatch):
    """IG_WAVE_BLOCKS 1: every grid fills a wave, the planner takes the largest narrow tile (256 x 32, 72 KiB of
    opted-in shared memory for float32); 10^9: none does, the smallest (128 x 32)."""
    monkeypatch.setattr(igemm, "IG_WAVE_BLOCKS", wave)
    monkeypatch.setattr(igemm, "IG_SPLIT_CHUNKS", 10**6)   # the split has its own tests
    # groups of 16 or 32 channels in and out run several a block by default (tests/test_igemm_groups.py)
    monkeypatch.setattr(igemm, "groups_igemm_refusal", lambda spec, dtype, *table: "the narrow tiles under test")
    return igemm.IG_NARROW_TILES[0 if wave == 1 else -1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("wave", [1, 10**9])
@pytest.mark.parametrize("case", NARROW_CASES, ids=str)
def test_narrow_tiles_forward(case, wave, dtype, monkeypatch):
    """Groups of 12-32 output channels take a 32-column tile (never a 64-column one), bias included, against the
    CPU path; blocks in reverse order for the partial cases."""
    tile = narrow_tile(wave, monkeypatch)
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(11), DTYPES[dtype])
    device = Recorder("reverse" if "partial" in case.name else "forward")
    out = run(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    launched = [name for name in device.launches if name.startswith("conv_fwd_igemm<")]
    assert launched == [_kernels.kernel_name("conv_fwd_igemm", dtype, "int", *tile)], device.launches
    assert_close(out, cupyconv.conv2d(*as64(x, weight, bias), **case.kwargs), dtype, case.name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("wave", [1, 10**9])
@pytest.mark.parametrize("case", NARROW_CASES[:2], ids=str)
def test_narrow_tiles_input_gradient(case, wave, dtype, monkeypatch):
    """The stride-1 input gradient's columns are C / G (16, 32): the narrow tiles on the transposed problem."""
    tile = narrow_tile(wave, monkeypatch)
    case = dataclasses.replace(case, stride=1)
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(12), DTYPES[dtype])
    device = Recorder("reverse")
    got = run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm", needs=("input",),
              **case.kwargs)[0]
    launched = [name for name in device.launches if name.startswith("conv_fwd_igemm<")]
    assert launched == [_kernels.kernel_name("conv_fwd_igemm", dtype, "int", *tile)], device.launches
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **case.kwargs)[0]
    assert_close(got, want, dtype, case.name)


def test_narrow_tiles_are_planned_by_columns_only():
    """Groups of at most 32 columns: 256 x 32 where it gives IG_WAVE_BLOCKS blocks, else 128 x 32 (split-K as
    any small grid); more columns: the IG_TILES choice, as before."""
    def plan(columns, groups=1, pixels=64, channels=32, images=32):
        spec = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty((images, channels * groups, pixels, pixels)),
                                                   numpy.empty((columns * groups, channels, 3, 3)), None, stride=1,
                                                   padding=1, dilation=1, groups=groups)
        return igemm.plan_igemm(spec, numpy.float16)
    assert [plan(c).tile for c in (4, 16, 32)] == [(256, 32, 4)] * 3   # 512 blocks of 256 rows
    assert plan(16, images=8).tile == (128, 32, 4)   # 128 blocks of 256 rows, 256 of 128: neither fills a wave
    assert plan(16, groups=32, pixels=14, images=32).grid == (25, 32, 1)   # rx-512: 6272 rows, 800 blocks
    assert plan(32, groups=32, pixels=7, images=32).grid == (13, 32, 1)    # rx-1024: 224 at 256 rows; 416 at 128
    assert plan(33).tile[1] == 64 and plan(256).tile[1] == 128
    small = plan(32, pixels=4, channels=256, images=8)   # 128 rows, 1 block; K = 9 x 256 in 72 chunks of 32: 4 splits
    assert small.tile == (128, 32, 4) and small.grid == (1, 1, 4) and small.chunks_per_split == 18, small   # of 18


# ---------------------------------------------------------------------------------------------------------
# split-K (grids under IG_WAVE_BLOCKS)

# 24 channels per group, 2 groups, 3 x 3: K = 216, 7 chunks of 32 halves (the last 24 long) or 14 of 16 floats;
# with IG_SPLIT_CHUNKS 3, splits of 4 chunks: 4 + 3 (16-bit) or 4 + 4 + 4 + 2 (float32), the later ones starting
# mid-tap (chunk 4 = tap 5, channel 8 for halves)
SPLIT_CASE = C("ig_split", (2, 48, 5, 6), (40, 24, 3, 3), padding=1, groups=2)


def split_forward(device, case, x, weight, bias, **kwargs):
    out = run(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs, **kwargs)
    return numpy.asarray(out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_k_matches_cpu_path_and_is_bit_identical(dtype, monkeypatch):
    """Several splits, the last K range short, groups and bias (added once, by the first split): against the
    CPU path in float64; then the same bits again with the blocks (and threads) in reverse order, and on a
    second run with fresh buffers."""
    monkeypatch.setattr(igemm, "IG_SPLIT_CHUNKS", 3)
    case = SPLIT_CASE
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(7), DTYPES[dtype])
    bias = (numpy.asarray(bias, numpy.float64) * 4).astype(DTYPES[dtype])   # a bias added twice shows
    plan = igemm.plan_igemm(cupyconv.ops.conv.ConvSpec.for_conv("t", x, weight, bias, groups=2, stride=1,
                                                                padding=1, dilation=1), DTYPES[dtype])
    chunks = ceil_div(9 * 24, igemm.IG_ROW_BYTES // numpy.dtype(DTYPES[dtype]).itemsize)
    assert plan.splits >= 2 and chunks % plan.chunks_per_split, plan   # the last split is short
    device = Recorder()
    out = split_forward(device, case, x, weight, bias)
    assert device.count("conv_fwd_igemm") == 1 and device.count("conv_bwd_weight_igemm_finish") == 1, device.launches
    assert_close(out, cupyconv.conv2d(*as64(x, weight, bias), **case.kwargs), dtype, "split")
    for again in (EmulatedDevice("reverse"), EmulatedDevice("forward")):
        numpy.testing.assert_array_equal(split_forward(again, case, x, weight, bias).view(numpy.uint8),
                                         out.view(numpy.uint8))


# The input gradient at stride 1 is conv_fwd_igemm on the transposed convolution (`implicit_gemm_grad_input`), so
# `plan_igemm` of the transposed spec splits its K = taps x D / G exactly as the forward's: here D / G = 24, 9 taps,
# K = 216 in 7 chunks of 32 halves or 14 of 16 floats; with IG_SPLIT_CHUNKS 3 splits of 4 chunks, 4 + 3 (16-bit)
# or 4 + 4 + 4 + 2 (float32), later ones starting mid-tap; groups 2, dilation and padding differing per axis.
SPLIT_INPUT_CASE = C("ig_split_input", (2, 32, 5, 6), (48, 16, 3, 3), padding=((1, 1), (2, 1)), dilation=(1, 2),
                     groups=2)


def split_input_gradient(device, case, grad_output, x, weight):
    return numpy.asarray(run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                             needs=("input",), **case.kwargs)[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_k_input_gradient(dtype, monkeypatch):
    """The stride-1 input gradient of a small grid splits K with the forward's plan (the transposed spec's): the
    last split short, against the CPU path in float64 (outputs poisoned by the emulator), then the same bits
    with the blocks and threads in reverse order and on a second run."""
    monkeypatch.setattr(igemm, "IG_SPLIT_CHUNKS", 3)
    case = SPLIT_INPUT_CASE
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(8), DTYPES[dtype])
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", x, weight, None, groups=2, stride=1, padding=((1, 1), (2, 1)),
                                               dilation=(1, 2))
    plan = igemm.plan_igemm(transposed_spec(spec), DTYPES[dtype])
    chunks = ceil_div(9 * 24, igemm.IG_ROW_BYTES // numpy.dtype(DTYPES[dtype]).itemsize)
    assert plan.splits >= 2 and chunks % plan.chunks_per_split, plan   # the last split is short
    device = Recorder("reverse")
    got = split_input_gradient(device, case, grad_output, x, weight)
    assert device.count("conv_fwd_igemm") == 1 and device.count("conv_bwd_weight_igemm_finish") == 1, device.launches
    assert device.count("conv_bwd_input_tc") == 0, device.launches
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **case.kwargs)[0]
    assert_close(got, want, dtype, case.name)
    for again in (EmulatedDevice("forward"), EmulatedDevice("reverse")):
        numpy.testing.assert_array_equal(split_input_gradient(again, case, grad_output, x, weight).view(numpy.uint8),
                                         got.view(numpy.uint8))


def test_no_split_for_large_grids_or_without_workspace(monkeypatch):
    """The split is a shape-only choice: none at IG_WAVE_BLOCKS blocks or more, none when the splits' float sums
    pass the workspace limit (one launch, as before); else as many as bring the grid to IG_WAVE_BLOCKS."""
    monkeypatch.setattr(igemm, "IG_SPLIT_CHUNKS", 3)
    case = SPLIT_CASE
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(9), numpy.float16)
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", x, weight, bias, groups=2, stride=1, padding=1, dilation=1)
    assert igemm.plan_igemm(spec, numpy.float16).splits == 2
    with settings.workspace_limit(2 * 4 * x.shape[0] * 40 * 30 - 1):   # just below two splits of float sums
        assert igemm.plan_igemm(spec, numpy.float16).splits == 1
        device = Recorder()
        out = split_forward(device, case, x, weight, bias)
        assert [name.split("<")[0] for name in device.launches][-1] == "conv_fwd_igemm", device.launches
        assert_close(out, cupyconv.conv2d(*as64(x, weight, bias), **case.kwargs), "float16", "no split")
    monkeypatch.setattr(igemm, "IG_WAVE_BLOCKS", 2)   # the grid (1 x 2 blocks of 64 x 64) is a wave already
    assert igemm.plan_igemm(spec, numpy.float16).splits == 1


def conv_spec(images, channels, outputs, size, kernel=3, groups=1, stride=1):
    return cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty((images, channels, size, size)),
                                               numpy.empty((outputs, channels // groups, kernel, kernel)), None,
                                               stride=stride, padding=kernel // 2, dilation=1, groups=groups)


def test_a_grid_under_a_wave_splits_the_largest_tile_its_splits_fill():
    """`plan_igemm` on the benchmark shapes: a tile that fills IG_WAVE_BLOCKS unsplit wins as before; under a wave,
    the largest tile whose splits of K (at least IG_SPLIT_CHUNKS chunks each) fill its own wave (`ig_wave`: 264
    blocks of 128 x 128, 528 of float's 128 x 64) and stop short of a second, not the smallest tile split; a K too
    short to split leaves the smallest tile unsplit."""
    r50_512 = conv_spec(32, 512, 512, 7)   # 1568 rows, K = 9 x 512: 144 chunks of 32 halves, 288 of 16 floats
    plan = igemm.plan_igemm(r50_512, numpy.float16)   # 128 x 128: 13 x 4 blocks, 5 splits of 29 chunks (260
    assert (plan.tile, plan.grid, plan.chunks_per_split) == ((128, 128, 4), (13, 4, 5), 29), plan   # blocks, not 312)
    assert igemm.plan_igemm(r50_512, DTYPES["bfloat16"]).grid == (13, 4, 5)
    plan = igemm.plan_igemm(r50_512, numpy.float32)   # 128 x 64: 13 x 8 blocks, 5 splits of 58 chunks (520)
    assert (plan.tile, plan.grid, plan.chunks_per_split) == ((128, 64, 3), (13, 8, 5), 58), plan
    # the smallest tile's split (the rule before: 25 x 8 blocks of 64 x 64, 2 splits) only where the workspace
    # holds two splits' sums and no more, which bring no larger tile to the wave
    with settings.workspace_limit(2 * 4 * 32 * 512 * 49):
        plan = igemm.plan_igemm(r50_512, numpy.float16)
    assert (plan.tile, plan.grid) == ((64, 64, 4), (25, 8, 2)), plan
    # the input gradient of p-1280 (1280 patches of 4 x 4, D / G = 64: K = 18 chunks): too short to split
    patches = igemm.plan_igemm(transposed_spec(conv_spec(1280, 32, 64, 4)), numpy.float16)
    assert (patches.tile, patches.grid) == ((128, 32, 4), (160, 1, 1)), patches
    # r50-256: 64 x 64 fills a wave unsplit (98 x 4 blocks); 128 x 128 (49 x 2) split 3 ways would too, but a tile
    # that fills the wave unsplit comes first
    assert igemm.plan_igemm(conv_spec(32, 256, 256, 14), numpy.float16).grid == (98, 4, 1)


def test_wave_splits_stop_short_of_a_second_wave():
    """`wave_splits`: the fewest waves x chunks a split, the fewer splits on a tie, within IG_SPLIT_CHUNKS chunks a
    split and the workspace: 52 blocks in a wave of 264 take 5 splits of 144 chunks (6 would be 312 blocks: two
    waves), not 6; 104 in 528 likewise; a wave one block past the grid gains nothing from a split (each is a wave
    of its own), nor two grids a wave from a second split of 64 chunks (2 waves x 32): ties keep fewer splits."""
    assert igemm.wave_splits(144, 52, 264, 4) == (5, 29)
    assert igemm.wave_splits(144, 104, 528, 4) == (5, 29)
    assert igemm.wave_splits(144, 52, 53, 4) == (1, 144)
    assert igemm.wave_splits(64, 100, 100, 4) == (1, 64)
    with settings.workspace_limit(2 * 4):   # two splits' sums of 4 bytes
        assert igemm.wave_splits(144, 52, 264, 4) == (2, 72)
    assert igemm.wave_splits(20, 52, 264, 4) == (1, 20)   # under 2 x IG_SPLIT_CHUNKS: no split


@pytest.mark.parametrize("tile", sorted(igemm.IG_BLOCKS_AN_SM))
def test_every_2d_tile_has_its_blocks_an_sm(tile):
    """The planner's residency table covers exactly the 2-D tiles (IG_TILES and IG_NARROW_TILES): a tile added
    without its entry would fail at plan time; test_sass checks the counts against the compiled registers."""
    tiles = {t for tiles in igemm.IG_TILES.values() for t in tiles} | set(igemm.IG_NARROW_TILES)
    assert tiles == set(igemm.IG_BLOCKS_AN_SM)
    assert igemm.ig_wave(tile) == igemm.IG_WAVE_BLOCKS * igemm.IG_BLOCKS_AN_SM[tile] // 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_k_on_the_largest_tile(dtype, monkeypatch):
    """The split r50-512 takes (`plan_igemm`: the largest tile, K in several splits of several chunks, the last
    short) at a small shape, IG_WAVE_BLOCKS 8 and IG_SPLIT_CHUNKS 3, where the smaller tiles stay under the wave:
    126 rows, 136 columns, K = 9 x 72 in 21 chunks of 32 halves (128 x 128: 2 blocks in a wave of 8, 4 splits of
    6 + 6 + 6 + 3) or 41 of 16 floats (128 x 64: 3 blocks in a wave of 16, 5 splits of 9, the last 5); its input
    gradient (stride 1: 126 rows, 72 columns, K = 9 x 136) likewise, 128 x 128 in 8 splits of 5 (the last 4) or
    128 x 64 in 8 of 10 (the last 7).  Against the CPU path in float64, the bias added once; then the same bits with
    the blocks in reverse order."""
    monkeypatch.setattr(igemm, "IG_WAVE_BLOCKS", 8)
    monkeypatch.setattr(igemm, "IG_SPLIT_CHUNKS", 3)
    case = C("ig_split_largest", (2, 72, 7, 9), (136, 72, 3, 3), padding=1)
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(11), DTYPES[dtype])
    bias = (numpy.asarray(bias, numpy.float64) * 4).astype(DTYPES[dtype])   # a bias added twice shows
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", x, weight, bias, groups=1, stride=1, padding=1, dilation=1)
    largest = igemm.IG_TILES[dtype][0]
    launches = [_kernels.kernel_name("conv_fwd_igemm", dtype, "int", *largest),
                _kernels.kernel_name("conv_bwd_weight_igemm_finish", dtype, "int")]
    tf32 = dtype == "float32"
    for transposed, want in ((False, ((1, 3, 5), 9) if tf32 else ((1, 2, 4), 6)),
                             (True, ((1, 2, 8), 10) if tf32 else ((1, 1, 8), 5))):
        plan = igemm.plan_igemm(transposed_spec(spec) if transposed else spec, DTYPES[dtype])
        assert (plan.tile, (plan.grid, plan.chunks_per_split)) == (largest, want), plan
    device = Recorder()
    out = split_forward(device, case, x, weight, bias)
    assert device.launches[-2:] == launches, device.launches
    assert_close(out, cupyconv.conv2d(*as64(x, weight, bias), **case.kwargs), dtype, "split on the largest tile")
    numpy.testing.assert_array_equal(split_forward(EmulatedDevice("reverse"), case, x, weight, bias).view(numpy.uint8),
                                     out.view(numpy.uint8))
    device = Recorder("reverse")
    got = split_input_gradient(device, case, grad_output, x, weight)
    assert device.launches[-2:] == launches, device.launches
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **case.kwargs)[0]
    assert_close(got, want, dtype, "input gradient split on the largest tile")


def window_spec(size, kernel, padding=0, dilation=1, stride=1, channels=16, outputs=40):
    return cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty((1, channels, *size)),
                                               numpy.empty((outputs, channels, *kernel)), None, stride=stride,
                                               padding=padding, dilation=dilation, groups=1)


@pytest.mark.parametrize("axis", [0, 1])
def test_256_rows_only_for_windows_in_16_bit_halves(axis, monkeypatch):
    """conv_fwd_igemm's 256-row tiles pack a row's y, x in 16-bit halves (ig_forward's PACKED): the planner takes
    them only where on each axis the image, the padding before it, stride x (out - 1) and dilation x (kernel - 1)
    stay below 2^14 (`ig_fits_halves`), else 128 rows (the 3-D kernel, unpacked, keeps its 256)."""
    monkeypatch.setattr(igemm, "IG_WAVE_BLOCKS", 1)   # the largest tile wherever it may run

    def along(value, other=3):
        return (value, other) if axis == 0 else (other, value)

    def rows(spec):
        assert igemm.ig_fits_halves(spec) == (igemm.plan_igemm(spec, numpy.float16).tile[0] == 256)
        return igemm.plan_igemm(spec, numpy.float16).tile[0]

    limit = igemm.IG_HALF_LIMIT
    assert rows(window_spec(along(limit - 1), (3, 3), padding=1)) == 256
    assert rows(window_spec(along(limit), (3, 3), padding=1)) == 128            # the image
    # the padding before (the window's reach brings the outputs back under the limit)
    assert rows(window_spec(along(8), along(2, 1), dilation=along(limit - 1, 1),
                            padding=along((limit - 1, 0), (0, 0)))) == 256
    assert rows(window_spec(along(8), along(2, 1), dilation=along(limit - 1, 1),
                            padding=along((limit, 0), (0, 0)))) == 128
    assert rows(window_spec(along(8), along(3, 1), dilation=along(limit // 2, 1),   # the kernel's reach
                            padding=along((limit // 2, limit // 2), (0, 0)))) == 128
    assert rows(window_spec(along(8), along(3, 1), dilation=along(limit // 2 - 1, 1),
                            padding=along((limit // 2, limit // 2), (0, 0)))) == 256
    # the outputs' reach (past the image on the padding after it)
    assert rows(window_spec(along(8), along(1, 1), padding=along((0, limit - 7), (0, 0)))) == 128
    assert rows(window_spec(along(8), along(1, 1), padding=along((0, limit - 8), (0, 0)))) == 256
    assert rows(window_spec(along(limit), (3, 3), padding=1, outputs=16)) == 128   # the narrow 256 x 32 too
    assert rows(window_spec(along(limit - 1), (3, 3), padding=1, outputs=16)) == 256
    # the 3-D kernel's 256 x 64 unpacked: unaffected
    spec3 = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty((1, 16, 2, 3, 2 * limit)),
                                                numpy.empty((40, 16, 1, 3, 3)), None, stride=1, padding=1,
                                                dilation=1, groups=1, nd=3)
    assert igemm.plan_igemm_3d(spec3, numpy.float16).tile[0] == 256


@pytest.mark.parametrize("outputs", [40, 16], ids=["256x64", "256x32"])
def test_256_rows_at_the_edge_of_the_halves(outputs, monkeypatch):
    """An image 2^14 - 1 pixels wide on the 256-row tiles (PACKED halves at their widest: x + dx reaches
    2^14 on the right padding): the first, a middle and the last block (its rows partly past M) against float64;
    the other blocks are not run."""
    monkeypatch.setattr(igemm, "IG_WAVE_BLOCKS", 1)
    width = igemm.IG_HALF_LIMIT - 1
    rng = numpy.random.default_rng(11)
    x = rng.standard_normal((1, 16, 3, width)).astype(numpy.float16)
    weight = (rng.standard_normal((outputs, 16, 3, 3)) / 12).astype(numpy.float16)
    bias = rng.standard_normal(outputs).astype(numpy.float16)
    blocks_m = ceil_div(3 * width, 256)   # 192, the last with 253 rows
    chosen = (0, blocks_m // 3, blocks_m - 1)

    def blocks(grid):   # the GEMM's chosen blocks, every block of the copies
        if tuple(grid) == (blocks_m, 1, 1):
            return [(b, 0, 0) for b in chosen]
        return [(bx, by, bz) for bx in range(grid[0]) for by in range(grid[1]) for bz in range(grid[2])]

    device = Recorder(blocks=blocks)
    out = run(device, cupyconv.conv2d, x, weight, bias, padding=1, algorithm="implicit_gemm")
    assert _kernels.kernel_name("conv_fwd_igemm", "float16", "int", 256, 64 if outputs > 32 else 32, 4) in \
        device.launches, device.launches
    want = cupyconv.conv2d(*as64(x, weight, bias), padding=1).reshape(outputs, -1)
    got = numpy.asarray(out, numpy.float64).reshape(outputs, -1)
    for b in chosen:
        rows = slice(256 * b, min(256 * (b + 1), 3 * width))
        assert_close(got[:, rows], want[:, rows], "float16", f"block {b}")


def test_64_bit_index_variant(monkeypatch):
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    case = CASE_BY_NAME["ig_groups_stride_dilation"]
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(4), numpy.float16)
    device = Recorder()
    out = run(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    assert device.launches[-1] == "conv_fwd_igemm<__half, long long, 128, 32, 4>", device.launches
    assert_close(out, cupyconv.conv2d(*as64(x, weight, bias), **case.kwargs), "float16")


@pytest.mark.parametrize("split_chunks", [10**9, 4], ids=["no_split", "split"])
def test_accumulates_in_float32_and_rounds_once(split_chunks, monkeypatch):
    """One large term and 575 below half's resolution at that size: a half accumulator would lose them all.  The
    bias joins the float sum before the one rounding: 1143.75 + 0.625 = 1144.375 -> 1144, where a rounding of the
    sum first (1144) and of the biased value after (1144.625) gives 1145."""
    x = numpy.full((1, 64, 3, 3), 0.25, numpy.float16)
    x[0, 0, 1, 1] = 1000.0
    weight = numpy.ones((16, 64, 3, 3), numpy.float16)
    monkeypatch.setattr(igemm, "IG_SPLIT_CHUNKS", split_chunks)   # 4: K = 576 in 18 chunks, 4 splits
    out = run(EmulatedDevice(), cupyconv.conv2d, x, weight, padding=1, algorithm="implicit_gemm")
    assert (out[0, :, 1, 1] == numpy.float16(1144.0)).all(), out[0, :, 1, 1]   # 1143.75 rounded once
    bias = numpy.full(16, 0.625, numpy.float16)
    out = run(EmulatedDevice(), cupyconv.conv2d, x, weight, bias, padding=1, algorithm="implicit_gemm")
    assert (out[0, :, 1, 1] == numpy.float16(1144.0)).all(), out[0, :, 1, 1]


def test_float32_operands_are_rounded_to_tf32():
    """As the generic path's test: operands 1 + 3 * 2^-12 rounded (not truncated) to tf32 once, by the copy."""
    value = numpy.float32(1 + 3 * 2.0**-12)
    x = numpy.full((1, 16, 4, 4), value, numpy.float32)
    weight = numpy.full((3, 16, 1, 1), value, numpy.float32)
    device = Recorder()
    out = run(device, cupyconv.conv2d, x, weight, algorithm="implicit_gemm")
    assert device.count("conv_fwd_igemm") == 1
    assert (out == numpy.float32(16 * (1 + 2.0**-10) ** 2)).all(), numpy.unique(out)


# ---------------------------------------------------------------------------------------------------------
# channels_last


def layouts(rng, values):
    """values (n, C, H, W) in several memory layouts, each a view whose other elements are random."""
    n, c, h, w = values.shape
    cl = numpy.moveaxis(rng.standard_normal((n, h, w, c)).astype(values.dtype), -1, 1)
    strided = rng.standard_normal((n, c + 1, h, 2 * w + 1)).astype(values.dtype)[:, 1:, :, 1::2]
    negative = rng.standard_normal((n, c, h, w)).astype(values.dtype)[:, ::-1, :, ::-1]
    batch = rng.standard_normal((2 * n + 1, c, h, w)).astype(values.dtype)[1::2]
    views = {"contiguous": values.copy(), "channels_last": cl, "strided": strided, "negative": negative,
             "batch_strided": batch}
    for view in views.values():
        view[...] = values
    return views


@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_in_every_layout(dtype):
    rng = numpy.random.default_rng(5)
    values = rng.standard_normal((3, 37, 5, 9)).astype(DTYPES[dtype])   # 37 channels, 45 pixels: partial tiles
    want = numpy.moveaxis(values, 1, -1)
    if dtype == "float32":   # rounded to tf32 (nearest, ties away), the tensor cores' operand
        bits = want.view(numpy.uint32).astype(numpy.uint64)
        want = ((bits + 0x1000) & 0xFFFFE000).astype(numpy.uint32).view(numpy.float32)
    for layout, x in layouts(rng, values).items():
        device = Recorder("reverse")
        got = run(device, igemm.channels_last, device, x)
        assert got.shape == (3, 5, 9, 37) and got.flags.c_contiguous
        copied = device.count("channels_last_copy") == 1
        assert copied == (layout != "channels_last" or dtype == "float32"), (layout, device.launches)
        if not copied:
            assert numpy.shares_memory(got, x)   # read in place
        numpy.testing.assert_array_equal(numpy.asarray(got, numpy.float64), numpy.asarray(want, numpy.float64),
                                         err_msg=layout)


def test_channels_last_of_a_patch_batch_view():
    """(B, N, C, H, W) patches transposed (N, B) in memory: one copy, images in (B, N) order."""
    rng = numpy.random.default_rng(6)
    values = rng.standard_normal((4, 3, 16, 5, 6)).astype(numpy.float16)
    x = numpy.swapaxes(numpy.swapaxes(values, 0, 1).copy(), 0, 1)
    device = Recorder()
    got = run(device, igemm.channels_last, device, x)
    assert device.count("channels_last_copy") == 1
    numpy.testing.assert_array_equal(got, numpy.moveaxis(values, 2, -1).reshape(12, 5, 6, 16))


def tf32(a):
    """float32 a rounded to tf32 as cvt.rna does (nearest, ties away from zero; finite values)."""
    bits = numpy.asarray(a, numpy.float32).view(numpy.uint32).astype(numpy.uint64)
    return ((bits + 0x1000) & 0xFFFFE000).astype(numpy.uint32).view(numpy.float32)


# (n, C, H, W) for channels_last_copy: 1 x 1, 2 x 3 and 4 x 4 planes (a row tile of 32 pixels spans up to 32
# images), channel counts that are not whole vectors (3, 13, 20 halves; 3, 13 floats) and more than one channel
# tile (72 halves, 40 floats), rows that are no multiple of the tile.
COPY_SHAPES = [(70, 3, 1, 1), (37, 13, 2, 3), (33, 64, 4, 4), (5, 72, 4, 4), (3, 20, 5, 9), (9, 40, 3, 3)]


@pytest.mark.parametrize("shape", COPY_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_copy_of_small_planes(dtype, shape, monkeypatch):
    """channels_last_copy against NumPy's transpose in every layout plus one of odd strides (every third column of
    every other row), on outputs poisoned with NaN, its blocks each looping over several row tiles (a grid of 2
    blocks along the rows); its whole-vector instantiation where the channels come in 16-byte vectors, else the
    element-wise one; float32 rounded to tf32."""
    monkeypatch.setattr(_kernels, "GRID_CAP", 2)
    rng = numpy.random.default_rng(sum(shape))
    values = rng.standard_normal(shape).astype(DTYPES[dtype])
    n, c, h, w = shape
    views = layouts(rng, values)
    views["odd_strides"] = rng.standard_normal((n, c + 2, 2 * h + 1, 3 * w)).astype(values.dtype)[:, 2:, 1::2, ::3]
    views["odd_strides"][...] = values
    want = numpy.moveaxis(values, 1, -1)
    if dtype == "float32":
        want = tf32(want)
    whole = "true" if c % igemm.vector_elements(values.dtype) == 0 else "false"
    for layout, x in views.items():
        device = Recorder("reverse")
        got = run(device, igemm.channels_last, device, x)
        assert device.launches in ([], [f"channels_last_copy<{_kernels.c_type(values.dtype)}, int, {whole}>"]), (
            layout, device.launches)
        assert got.shape == (n, h, w, c) and got.flags.c_contiguous
        numpy.testing.assert_array_equal(numpy.asarray(got, numpy.float64), numpy.asarray(want, numpy.float64),
                                         err_msg=layout)


@pytest.mark.parametrize("c", [16, 13])
def test_channels_last_with_rest_keeps_float_bits(c, monkeypatch):
    """float32 through channels_last_with_rest: the operand tf32(x) and the remainder tf32(x - tf32(x)), bit for
    bit, from one launch (whole vectors and element-wise), on a batch view with a negative stride; their sum is x
    to 22 bits or better."""
    monkeypatch.setattr(_kernels, "GRID_CAP", 2)
    rng = numpy.random.default_rng(c)
    values = rng.standard_normal((2 * 21 + 1, c, 2, 3)).astype(numpy.float32)
    x = values[::-2]
    device = Recorder("reverse")
    got, rest = run(device, igemm.channels_last_with_rest, device, x)
    assert device.count("channels_last_copy") == 1
    want = numpy.moveaxis(x, 1, -1)
    numpy.testing.assert_array_equal(got, tf32(want))
    numpy.testing.assert_array_equal(rest, tf32(want - tf32(want)))
    numpy.testing.assert_allclose(got.astype(numpy.float64) + rest, want, rtol=2.0**-21, atol=0)


def copies_jobs(rng, dtype):
    """Arrays that one channels_last_copies launch copies together, each with whole 16-byte vectors of channels:
    an x-like (3, 24, 5, 9) in a strided view, a conv weight (48, 24 / 2, 3, 2) as the input gradient arranges it
    (`weight_view`: groups x channels-in x channels-out with the taps flipped, negative strides) and a batch view
    (2, 3, 72, 2, 3) with a negative batch stride and more than one channel block (72 channels)."""
    values = rng.standard_normal((3, 24, 5, 9)).astype(dtype)
    x = layouts(rng, values)["strided"]
    weight = rng.standard_normal((48, 12, 3, 2)).astype(dtype)
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty((1, 24, 5, 5)), weight, None, stride=1, padding=1,
                                               dilation=1, groups=2)
    flipped = igemm.weight_view(EmulatedDevice(), weight, spec, "input")
    batch = rng.standard_normal((5, 3, 72, 2, 3)).astype(dtype)[::-2]
    return [x, flipped, batch]


@pytest.mark.parametrize("jobs", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_copies_match_separate_copies(dtype, jobs, monkeypatch):
    """channels_last_all: two or three copies (a strided x, the input gradient's flipped weight view, a negative
    batch view with two channel blocks) by ONE channels_last_copies launch, bit for bit what channels_last makes of
    each alone (float32: rounded to tf32), on poisoned outputs, every job's blocks looping over several row tiles (a
    grid cap of 2); an array read in place (channels-last 16-bit) or given twice adds no job."""
    monkeypatch.setattr(_kernels, "GRID_CAP", 2)
    rng = numpy.random.default_rng(31 + jobs)
    arrays = copies_jobs(rng, DTYPES[dtype])[:jobs]
    # 16-bit: a channels-last array read in place (float32 would copy it: a fourth job)
    extra = [] if dtype == "float32" else [nhwc(rng.standard_normal((2, 16, 3, 3)).astype(DTYPES[dtype]))]
    want = []
    for a in extra + arrays:
        alone = Recorder("reverse")
        want.append(run(alone, igemm.channels_last, alone, a))
    for order in ("forward", "reverse"):
        device = Recorder(order)
        got = run(device, igemm.channels_last_all, device, [*extra, *arrays, arrays[0]])
        lanes = "true" if jobs == 3 else "false"   # (three: 72 channels, 2-3 blocks, beside 24: lanes of them)
        assert device.launches == [f"channels_last_copies<{_kernels.c_type(DTYPES[dtype])}, int, {lanes}>"], \
            device.launches
        assert got[-1] is got[len(extra)] and all(numpy.shares_memory(g, a) for g, a in zip(got, extra))
        for a, g, w in zip(extra + arrays, got, want):
            assert g.shape == w.shape and g.flags.c_contiguous
            numpy.testing.assert_array_equal(g.view(numpy.uint8), w.view(numpy.uint8), err_msg=f"{a.shape} {order}")


class GridRecorder(Recorder):
    """A Recorder that also keeps each launch's grid."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.grids = []

    def launch(self, source, name, grid, *args, **kwargs):
        self.grids.append(tuple(grid))
        super().launch(source, name, grid, *args, **kwargs)


# Jobs of channels_last_copies by channel blocks (CL_CHANNEL_BYTES each: 64 halves, 32 floats), as (n, channels in
# blocks plus vectors, H, W), with the grid expected: the widest job's channel blocks along y; a narrower job padded
# to 2^shift channel blocks runs ceil(y / 2^shift) lanes of them, its row-tile blocks along x shared among its lanes;
# and the instantiation: LANES true where some job has two lanes or more.
LANES_JOBS = {
    # 16 channel blocks (30 rows: one partial tile) beside 1 (2,000 rows, its last tile of 16, a negative batch
    # stride: 16 lanes) and 3 padded to 4 (105 rows, the last channel block one vector: 4 lanes, every fourth y idle)
    "16-1-3": ([(2, (16, 0), 3, 5), (125, (0, 1), 4, 4), (5, (2, 1), 7, 3)], (1 + 2 + 1, 16), True),
    # 3 channel blocks (96 rows: whole tiles) beside 1 (1,085 rows: 3 lanes) and 2 (63 rows: 1 lane, y = 2 idle:
    # a second lane would have no channel block 1)
    "3-1-2": ([(3, (3, 0), 4, 8), (31, (0, 1), 5, 7), (7, (1, 1), 3, 3)], (2 + 6 + 1, 3), True),
    # 5 channel blocks (30 rows) beside 3 (270 rows, the last block one vector) and 4 (64 rows), each padded to 4:
    # one lane each (LANES false: y is the channel block), y = 3 and 4 idle for the 3, y = 4 for the 4
    "5-3-4": ([(2, (5, 0), 3, 5), (9, (2, 1), 6, 5), (4, (3, 1), 4, 4)], (1 + 5 + 1, 5), False),
}


@pytest.mark.parametrize("cap", [None, 1])
@pytest.mark.parametrize("jobs", LANES_JOBS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_copies_lanes_of_narrow_jobs(dtype, jobs, cap, monkeypatch):
    """Jobs with fewer channel blocks than the launch's y (a grouped layer's weight beside x) run lanes of them, each
    its share of the row tiles: bit for bit channels_last of each alone, on poisoned outputs, with odd planes,
    partial last tiles and channel blocks, lanes without a tile, and (cap 1) one block a job looping over its lane's
    tiles; jobs of one lane each (5-3-4) on the instantiation without the lanes' decode."""
    dtype = DTYPES[dtype]
    if cap is not None:
        monkeypatch.setattr(_kernels, "GRID_CAP", cap)
    rng = numpy.random.default_rng(37)
    per_block, vector = igemm.vector_elements(dtype) * igemm.CL_VECTORS, igemm.vector_elements(dtype)
    shapes, grid, lanes = LANES_JOBS[jobs]
    arrays = [rng.standard_normal((n, blocks * per_block + vectors * vector, h, w)).astype(dtype)
              for n, (blocks, vectors), h, w in shapes]
    arrays[1] = arrays[1][::-1]
    want = []
    for a in arrays:
        alone = Recorder("reverse")
        want.append(run(alone, igemm.channels_last, alone, a))
    device = GridRecorder("reverse")
    got = run(device, igemm.channels_last_all, device, arrays)
    assert device.launches == [f"channels_last_copies<{_kernels.c_type(dtype)}, int, {str(lanes).lower()}>"], \
        device.launches
    assert device.grids == [grid if cap is None else (len(arrays), grid[1])], device.grids
    for a, g, w in zip(arrays, got, want):
        assert g.shape == w.shape and g.flags.c_contiguous
        numpy.testing.assert_array_equal(g.view(numpy.uint8), w.view(numpy.uint8), err_msg=f"{a.shape}")


def test_channels_last_copies_with_rest_and_odd_channels(monkeypatch):
    """float32: a job with its TF32 remainder (`channels_last_with_rest`'s, bit for bit) beside one without, in one
    launch; an array whose channels are no whole vectors (13) is copied alone by channels_last_copy's element-wise
    instantiation, its bits channels_last's.  Within `sharing_channels_last` the copies are kept: channels_last and
    channels_last_with_rest of the same arrays launch nothing more."""
    monkeypatch.setattr(_kernels, "GRID_CAP", 2)
    rng = numpy.random.default_rng(33)
    x, flipped, _ = copies_jobs(rng, numpy.float32)
    odd = rng.standard_normal((7, 13, 2, 3)).astype(numpy.float32)[::-1]
    alone = Recorder()
    want_x, want_rest = run(alone, igemm.channels_last_with_rest, alone, x)
    want_flipped, want_odd = (run(alone, igemm.channels_last, alone, a) for a in (flipped, odd))
    device = Recorder("reverse")
    with igemm.sharing_channels_last():
        (got_flipped, got_x, got_odd), rest = run(device, igemm._channels_last_all, device, [flipped, x, odd], True, x)
        assert device.launches == ["channels_last_copy<float, int, false>", "channels_last_copies<float, int, false>"]
        again, (again_x, again_rest) = (run(device, f, device, a) for f, a in ((igemm.channels_last, flipped),
                                                                              (igemm.channels_last_with_rest, x)))
        assert len(device.launches) == 2 and again is got_flipped and again_x is got_x and again_rest is rest
    for got, want in ((got_x, want_x), (rest, want_rest), (got_flipped, want_flipped), (got_odd, want_odd)):
        numpy.testing.assert_array_equal(got.view(numpy.uint32), want.view(numpy.uint32))


def test_channels_last_copies_leave_a_64_bit_copy_alone(monkeypatch):
    """A copy whose indices pass 32 bits (2^28 + 8 images of 8 halves, batch stride negative, sparse memory) runs
    on channels_last_copy's long long instantiation, apart from the 32-bit one beside it (channels_last_copies is
    instantiated for int only); the last block of each writes its last rows."""
    bug_classes.lift_grid_cap(monkeypatch)
    n, c = 2**28 + 8, 8
    big = bug_classes.sparse_zeros((n, c, 1, 1), numpy.float16)[::-1]
    big[-32:] = numpy.random.default_rng(42).standard_normal((32, c, 1, 1))
    small = numpy.random.default_rng(43).standard_normal((40, c, 1, 1)).astype(numpy.float16)[::-1]
    device = bug_classes.SparseDevice()
    got_big, got_small = run(device, igemm.channels_last_all, device, [big, small])
    assert device.launches == ["channels_last_copy<__half, long long, true>", "channels_last_copy<__half, int, true>"]
    bug_classes.assert_tail_written(got_big, numpy.moveaxis(numpy.asarray(big[-8:]), 1, -1).reshape(-1),
                                    numpy.float16, 8 * c, "the 64-bit copy")   # (its last row tile: 8 rows)
    bug_classes.assert_tail_written(got_small, numpy.moveaxis(small[-8:], 1, -1).reshape(-1), numpy.float16,
                                    8 * c, "the 32-bit copy")


def test_channels_last_copy_rows_past_2_31(monkeypatch):
    """2^31 + 64 images of one pixel and 3 channels, batch stride negative, over sparse memory: the row index
    (image, pixel) passes 2^31, so the row decode takes the 64-bit path (`long long`); the last block, which owns
    the last row tile (the grid cap lifted), writes the last 32 rows, which match x's last images."""
    bug_classes.lift_grid_cap(monkeypatch)
    n, c = 2**31 + 64, 3
    base = bug_classes.sparse_zeros((n, c, 1, 1), numpy.float16)
    x = base[::-1]
    x[-64:] = numpy.random.default_rng(41).standard_normal((64, c, 1, 1))
    device = bug_classes.SparseDevice()
    got = run(device, igemm.channels_last, device, x)
    assert device.launches == ["channels_last_copy<__half, long long, false>"]
    want = numpy.moveaxis(numpy.asarray(x[-32:]), 1, -1)
    bug_classes.assert_tail_written(got, want.reshape(-1), numpy.float16, 32 * c, "channels_last")


def test_channels_last_refuses_planes_past_2_31():
    x = numpy.broadcast_to(numpy.zeros((), numpy.float32), (1, 2, 2**16, 2**15))   # 2^31 pixels, no memory
    with pytest.raises(ValueError, match=r"channels_last: x \(1, 2, 65536, 32768\) has planes of 65536 x 32768"):
        run(EmulatedDevice(), igemm.channels_last, EmulatedDevice(), x)


def test_fast_path_eligibility():
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty((1, 20, 5, 5)), numpy.empty((16, 20, 3, 3)), None,
                                               stride=2, padding=0, dilation=1, groups=1)
    assert "multiples of 8" in igemm.igemm_refusal(spec, numpy.float16, "forward")
    assert igemm.igemm_refusal(spec, numpy.float32, "forward") is None          # 20 = 5 vectors of 4 floats
    for dtype in (numpy.float16, numpy.float32):   # D = 16 in whole vectors; stride 2 runs by phases
        assert igemm.igemm_refusal(spec, dtype, "input") is None


def test_clean_under_asan():
    """A cp.async or a transpose read outside x, the arranged weight or out (a wrong row base, a padding vector not
    zero-filled, a channel past the group), or a split's write outside its workspace, aborts the ASan build."""
    assert_clean_under_asan(pytest_under_asan(*(f"{__file__}::{name}" for name in (
        "test_forward_matches_cpu_path", "test_input_gradient_at_stride_1_runs_the_forward_kernel",
        "test_channels_last_in_every_layout", "test_split_k_matches_cpu_path_and_is_bit_identical",
        "test_narrow_tiles_forward"))))


@pytest.mark.parametrize("op, x_shape, w_shape, stride", [
    ("conv2d", (2, 16, 7, 6), (24, 16, 3, 3), 1),   # input gradient: the transposed forward
    ("conv2d", (2, 16, 9, 8), (24, 16, 3, 3), 2),   # input gradient by phases
    ("patch_conv2d", (2, 3, 16, 5, 4), (16, 16, 3, 3), 1)])
def test_backward_copies_grad_output_once(op, x_shape, w_shape, stride, monkeypatch):
    """A backward of every gradient on the tensor cores makes one channels-last copy of grad_output, read by the
    input and the weight gradients (`sharing_channels_last`), and no array twice; the gradients equal the CPU
    path's; one launch makes every copy.  Without the sharing scope (conv2d_backward_gpu called directly), grad_output
    is copied twice."""
    rng = numpy.random.default_rng(11)
    x = rng.standard_normal(x_shape).astype(numpy.float16)
    weight = (rng.standard_normal(w_shape) / 8).astype(numpy.float16)
    kwargs = dict(stride=stride, padding=1)
    forward, backward = getattr(cupyconv, op), getattr(cupyconv, f"{op}_backward")
    gy = rng.standard_normal(forward(*as64(x, weight), **kwargs).shape).astype(numpy.float16)
    copied = []
    make_copies = igemm._channels_last_copies

    def recording_copies(device, jobs):
        copied.extend((_device._address(a), a.shape, a.strides) for a, _, _ in jobs)
        return make_copies(device, jobs)
    monkeypatch.setattr(igemm, "_channels_last_copies", recording_copies)
    device = Recorder()
    got = run(device, backward, gy, x, weight, algorithm="implicit_gemm", **kwargs)
    assert device.copies() == ["channels_last_copies"], device.launches
    of_gy = [key for key in copied if key[0] == _device._address(gy)]
    assert len(of_gy) == 1 and len(set(copied)) == len(copied), copied
    for g, w, what in zip(got, backward(*as64(gy, x, weight), **kwargs), ("grad_x", "grad_weight", "grad_bias")):
        assert_close(g, w, "float16", f"{op} {what}")
    if op == "conv2d":
        copied.clear()
        spec = cupyconv.ops.conv.ConvSpec.for_conv("t", x, weight, None, groups=1, dilation=1, **kwargs)
        device = Recorder()
        run(device, cupyconv.ops.conv.conv2d_backward_gpu, device, gy, x, weight, spec,
            frozenset({"input", "weight", "bias"}), "implicit_gemm")
        assert [key[0] for key in copied].count(_device._address(gy)) == 2, copied
