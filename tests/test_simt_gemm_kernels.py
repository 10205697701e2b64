"""The strict float32 implicit GEMMs on the FMA units (raw_kernels/simt_gemm.cu simt_fwd and simt_bwd_weight, planned
by cupyconv/ops/simt_gemm.py) against the CPU path in float64: conv2d forward, stride-1 input gradient (simt_fwd on
the transposed problem) and weight gradient (split reduction), with TF32 off.

Problems are odd on purpose: rows, columns and K of every GEMM are never multiples of the block tiles (128 x 64, 96 x 64,
192 x 64, 128 x 128, 128 x 32, 64 x 32, K chunks of 8), several blocks run along each, planes smaller than a chunk make the weight gradient's
pixel cursor carry over several images per chunk, and each side's padding, stride and dilation differ per axis.
The bug classes of issue 12 (per-side padding and the last row and column, loops over several blocks, 64-bit
indices past 2^31 on the sparse-memory device) are covered for both kernels.
"""
import numpy
import pytest

import cupyconv
from cupyconv import _device, _kernels, settings
from cupyconv.ops import conv as conv_op
from cupyconv.ops import simt_gemm
import bug_classes
from bug_classes import Recorder
from emulator import EmulatedDevice
from reference import ConvCase

C = ConvCase
#: Largest |FMA kernels - CPU path in float64| relative to the largest |value|: float32 sums of a few hundred
#: terms; TF32 operands (10 mantissa bits) would miss this by 100x.
TOLERANCE = 2e-6

CASES = [
    C("plain", (2, 16, 9, 7), (20, 16, 3, 3), padding=1),                              # M 126, N 20, K 144
    # 15 channels a group: K 90 (72 for the input gradient), not a whole chunk of 16, so the second group's B
    # starts past the first's zero-padded rows (simt_fwd's weight_t, `simt_weight_t`)
    C("groups2_stride_dilation_per_axis", (1, 30, 11, 10), (24, 15, 3, 2), stride=(2, 1),
      padding=((2, 0), (0, 3)), dilation=(1, 2), groups=2),
    C("wide_tile_many_row_blocks", (3, 5, 13, 12), (70, 5, 3, 3), padding=((0, 2), (1, 0)), bias=False),  # N 70
    C("long_k_last_row_and_column", (1, 40, 6, 5), (9, 40, 5, 5), padding=((0, 4), (4, 0))),   # K 1000
    C("tiny_planes_carry", (5, 24, 2, 3), (66, 24, 2, 2)),                              # 2 pixels an image
    C("strided_uncovered_rows", (2, 12, 12, 13), (36, 12, 3, 3), stride=(2, 3), padding=((1, 0), (0, 2))),
    C("weight_96_row_tiles", (3, 30, 7, 6), (40, 30, 3, 3), padding=((1, 0), (0, 1))),  # 270 of 288 rows, 40 of 64
    # 378 rows: two 192-row tiles where the pixels split into enough blocks (test_weight_192_row_tiles), else four
    # of 96 (378 of 384), 40 of 64 columns
    C("weight_192_row_tiles", (2, 42, 6, 7), (40, 42, 3, 3), padding=((0, 1), (1, 0))),
    C("pointwise_taps_1", (2, 19, 5, 6), (13, 19, 1, 1), stride=(1, 2)),              # a k slot: channels only
    C("mask_bits_31", (1, 2, 9, 11), (5, 2, 15, 16), padding=((7, 6), (9, 5)), dilation=(1, 1)),  # kH + kW = 31
    # the forward's float4 epilogue: planes of 48 pixels, M 144 over 128-row tiles, N 70 over 128 columns
    C("rows_in_fours_forward", (3, 6, 8, 6), (70, 6, 3, 3), padding=1),
    # windows wholly in the padding (top, bottom, left, right) and wider than the plane (kW 3 over 2 columns: both
    # ends of a window outside): simt_fwd's masks of dilation 1 (`simt_inside_run`) at every clip
    C("windows_in_padding", (2, 34, 3, 2), (37, 34, 2, 3), padding=((3, 4), (5, 2))),
    # 136 columns: two 128-column tiles (n0 = 128 for the second) in the forward and the weight gradient
    C("two_column_tiles", (2, 3, 5, 4), (136, 3, 3, 3), padding=((1, 0), (0, 1))),
]
CASE_BY_NAME = {case.name: case for case in CASES}


def expected_tile(rows: int, columns: int, weight: bool = False) -> str:
    """The tile plan_simt should take for one group's GEMM (rows C / G x taps for the weight gradient: its bias is
    no GEMM row), written out independently of simt_gemm.simt_tile (small problems: never the tall tile; the
    forward's 33-64 columns two 128 x 32 tiles, not one 128 x 64: a block or two an SM either way, and the busiest
    SM's 32 columns x 1.06 loop cost are less than 64)."""
    if columns > 64:
        return "128, 128, 16"
    if columns <= 32:
        return "64, 32, 8" if weight and -(-rows // 64) * 64 < -(-rows // 128) * 128 else "128, 32, 8"
    if not weight:
        return "128, 32, 8"
    # (192 x 64 x 12 for pairs of 96-row tiles only where the pixels split into a wave of it: never here)
    return "96, 64, 12" if -(-rows // 96) * 96 <= -(-rows // 128) * 128 else "128, 64, 8"


def tiles_of(case):
    """(forward, input gradient, weight gradient) tiles of a case, by `expected_tile`."""
    d, c, kh, kw = case.weight
    cg, dg = c, d // case.groups
    return expected_tile(0, dg), expected_tile(0, cg), expected_tile(cg * kh * kw, dg, weight=True)


def on_emulator(device, fn, *args, **kwargs):
    with _device.use_device(device), settings.allow_tf32(False):
        return fn(*args, **kwargs)


def expected_forward(x, weight, bias, **kwargs):
    as64 = [None if a is None else numpy.asarray(a, numpy.float64) for a in (x, weight, bias)]
    return cupyconv.conv2d(*as64, **kwargs)


def expected_backward(grad_output, x, weight, **kwargs):
    return cupyconv.conv2d_backward(*(numpy.asarray(a, numpy.float64) for a in (grad_output, x, weight)), **kwargs)


def assert_close(got, want, what=""):
    got = numpy.asarray(got, numpy.float64)
    scale = float(numpy.abs(want).max())
    err = float(numpy.abs(got - want).max())
    assert err <= TOLERANCE * scale, f"{what}: max error {err:.3g} vs max |value| {scale:.3g}"


def inputs(case, seed):
    return case.inputs(numpy.random.default_rng(seed), numpy.float32)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_matches_cpu_path(case):
    x, weight, bias, _ = inputs(case, 0)
    device = Recorder()
    out = on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    assert out.dtype == x.dtype and out.shape == case.output_shape
    assert device.launches == [f"simt_fwd<float, int, {tiles_of(case)[0]}>"], device.launches
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), case.name)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_backward_matches_cpu_path(case):
    x, weight, _, grad_output = inputs(case, 1)
    device = Recorder("reverse")
    got = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                      **case.kwargs)
    stride1 = conv_op.ConvSpec.for_conv("t", x, weight, None, **case.kwargs).stride == (1, 1)
    _, input_tile, weight_tile = tiles_of(case)
    assert device.launches.count(f"simt_fwd<float, int, {input_tile}>") == stride1, device.launches  # else col2im
    assert device.launches.count(f"simt_bwd_weight<float, int, {weight_tile}>") == 1, device.launches
    assert device.count("conv_bgrad") == 0, device.launches   # grad_bias: the weight gradient's column sums
    want = expected_backward(grad_output, x, weight, **case.kwargs)
    for name, g, w in zip(("grad_input", "grad_weight", "grad_bias"), got, want):
        assert g.dtype == x.dtype and g.shape == w.shape, name
        assert_close(g, w, f"{case.name} {name}")


TALL_CASES = {"256, 64, 16": C("tall", (2, 36, 9, 7), (40, 36, 3, 3), padding=1),
              "256, 32, 16": C("tall_narrow", (2, 20, 9, 7), (27, 20, 3, 3), padding=((0, 1), (2, 1))),
              "256, 128, 16": C("tall_wide", (2, 66, 9, 7), (70, 66, 3, 3), padding=((1, 0), (2, 1))),
              # 9 x 12 planes (float4 epilogue): 324 rows, 192 + 132; the input gradient's 360, 192 + 168
              "192, 64, 12": C("tall_fit", (3, 36, 10, 12), (50, 36, 3, 3), padding=((1, 0), (0, 2)))}


@pytest.mark.parametrize("tile, order, index", [("256, 64, 16", "forward", "int"), ("256, 64, 16", "reverse", "int"),
                                                ("192, 64, 12", "forward", "int"),
                                                ("192, 64, 12", "reverse", "long long"),
                                                ("256, 128, 16", "forward", "long long"),
                                                ("256, 128, 16", "reverse", "int"),
                                                ("256, 32, 16", "reverse", "int"),
                                                ("256, 32, 16", "forward", "long long")])
def test_tall_tile(tile, order, index, monkeypatch):
    """SIMT_TALL_ROWS 1: the forward and the stride-1 input gradient take the tall tiles, 16 rows per thread (its
    four row groups 64 apart), on 126 rows (and 124 for the input gradient): 256 x 64 with 40 or 36 columns (33 to
    64: fewer take the 32-column tile), 256 x 128 with 70 or 66 (all 256 threads, one k slot of A a thread),
    256 x 32 with 27 or 20 (64 threads: four k slots of A a thread); 192 x 64 x 12 (three row groups, two k slots
    of 16 a chunk of 16, 50 or 36 columns) where SIMT_TALL_FIT_COST makes it the cheaper (0: always; 9: never)."""
    monkeypatch.setattr(simt_gemm, "SIMT_TALL_ROWS", 1)
    monkeypatch.setattr(simt_gemm, "SIMT_TALL_FIT_COST", 0.0 if tile == "192, 64, 12" else 9.0)
    monkeypatch.setattr(simt_gemm, "SIMT_NARROW_FIT_COST", 9.0)   # 256 x 32 x 16, not 128 x 32 x 8's one block
    if index == "long long":
        monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    case = TALL_CASES[tile]
    x, weight, bias, grad_output = inputs(case, 3)
    device = Recorder(order)
    out = on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    grad_x, _, _ = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                               needs="input", **case.kwargs)
    assert device.launches == [f"simt_fwd<float, {index}, {tile}>"] * 2, device.launches
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), "forward")
    assert_close(grad_x, expected_backward(grad_output, x, weight, **case.kwargs)[0], "grad_input")


@pytest.mark.parametrize("case, constant, tiles", [
    ("192, 64, 12", "SIMT_TALL_FIT_COST", ("192, 64, 12", "256, 64, 16")),
    ("256, 32, 16", "SIMT_NARROW_FIT_COST", ("128, 32, 8", "256, 32, 16"))])
def test_tall_tiles_give_the_same_bits(case, constant, tiles, monkeypatch):
    """simt_tall_rows may pick 192 x 64 x 12 or 256 x 64 x 16 (at most 32 columns: 128 x 32 x 8 or 256 x 32 x 16,
    chunks of 16 and 8) by the waves they make: both sum each output over k in the same order (chunks in turn, k in
    order within one), so the result is the same to the bit either way."""
    monkeypatch.setattr(simt_gemm, "SIMT_TALL_ROWS", 1)
    case = TALL_CASES[case]
    x, weight, bias, _ = inputs(case, 5)
    outs = []
    for cost, tile in zip((0.0, 9.0), tiles):
        monkeypatch.setattr(simt_gemm, constant, cost)
        device = Recorder("forward")
        outs.append(numpy.asarray(on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm",
                                              **case.kwargs)))
        assert device.launches == [f"simt_fwd<float, int, {tile}>"], device.launches
    assert outs[0].tobytes() == outs[1].tobytes()


@pytest.mark.parametrize("order, index", [("forward", "int"), ("reverse", "long long")])
def test_64_columns_on_one_tile_or_two(order, index, monkeypatch):
    """33-64 columns below SIMT_TALL_ROWS rows take 128 x 64 x 8 or two column tiles of 128 x 32 x 8 (simt_fwd_tile
    by the busiest SM's work; SIMT_SPLIT_COST 9: never split, 0: always): the forward (44 columns: the second tile's
    n0 = 32, 12 of its 32 columns past N) and the stride-1 input gradient (36) match the CPU path on both, 168 and
    189 rows in two row tiles, and the two give the same bits (each output summed over k in the same order: chunks
    of 8 in three stages, or of 16 in two)."""
    if index == "long long":
        monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    case = C("split_columns", (3, 36, 9, 7), (44, 36, 3, 3), padding=((1, 0), (0, 2)))
    x, weight, bias, grad_output = inputs(case, 6)
    want = expected_forward(x, weight, bias, **case.kwargs), expected_backward(grad_output, x, weight,
                                                                               **case.kwargs)[0]
    outs = []
    for cost, tile in ((9.0, "128, 64, 8"), (0.0, "128, 32, 8")):
        monkeypatch.setattr(simt_gemm, "SIMT_SPLIT_COST", cost)
        device = Recorder(order)
        out = on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
        grad_x, _, _ = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight,
                                   algorithm="implicit_gemm", needs="input", **case.kwargs)
        assert device.launches == [f"simt_fwd<float, {index}, {tile}>"] * 2, device.launches
        for got, expected, what in zip((out, grad_x), want, ("forward", "grad_input")):
            assert_close(got, expected, f"{tile} {what}")
        outs.append(numpy.asarray(out).tobytes() + numpy.asarray(grad_x).tobytes())
    assert outs[0] == outs[1]


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_both_thread_orders(order):
    """A missing barrier between the two stages reads the other stage's chunk (or poison) in one of the orders."""
    case = CASE_BY_NAME["long_k_last_row_and_column"]
    x, weight, bias, grad_output = inputs(case, 2)
    out = on_emulator(EmulatedDevice(order), cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm",
                      **case.kwargs)
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), order)
    _, grad_w, _ = on_emulator(EmulatedDevice(order), cupyconv.conv2d_backward, grad_output, x, weight,
                               algorithm="implicit_gemm", needs="weight", **case.kwargs)
    assert_close(grad_w, expected_backward(grad_output, x, weight, **case.kwargs)[1], order)


@pytest.mark.parametrize("channels, kernel", [(1, 1), (8, 1), (9, 1), (17, 1), (24, 1), (1, 3), (2, 3)],
                         ids=["K1", "K8", "K9", "K17", "K24", "K9_3x3", "K18_3x3"])
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_forward_pipeline_chunk_counts(channels, kernel, order):
    """simt_fwd's cp.async pipeline (SIMT_ASYNC_STAGES stages, S - 1 chunks copied ahead) at the edges of its
    prologue and last chunks: K = C x taps of 1 (one partial chunk: the prologue's second group is empty), 8 (one
    whole chunk), 9 (a chunk and one k), 17 and 24 (three chunks: one issued in the loop), and 3x3 windows of 1
    and 2 channels (9 and 18: a chunk's k slots cross a channel).  Rows past M (2 x 7 x 5 = 70 of 128) and
    columns past N (11 of 32) are zero-filled and never stored."""
    case = C(f"chunks_{channels}_{kernel}", (2, channels, 7, 5), (11, channels, kernel, kernel),
             padding=kernel // 2)
    x, weight, bias, _ = inputs(case, 4)
    device = Recorder(order)
    out = on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    assert device.launches == ["simt_fwd<float, int, 128, 32, 8>"], device.launches
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), case.name)


def test_strict_float32_not_tf32():
    """Operands 1 + 3 * 2^-12 lose their low bits as TF32 (1 + 2^-10 each); float32 FMAs keep them."""
    value = numpy.float32(1 + 3 * 2.0**-12)
    x = numpy.full((1, 16, 4, 4), value, numpy.float32)
    weight = numpy.full((3, 16, 3, 3), value, numpy.float32)
    out = on_emulator(EmulatedDevice(), cupyconv.conv2d, x, weight, padding=1, algorithm="implicit_gemm")
    want = expected_forward(x, weight, None, padding=1)
    assert numpy.abs(out - want).max() <= 1e-6 * numpy.abs(want).max()


@pytest.mark.parametrize("stride", [1, 2])
def test_padding_per_side_and_last_row_and_column(stride):
    """Each side's padding differing alone, the last window ending on the last padded row and column."""
    for k, (side, padding) in enumerate(bug_classes.per_side_paddings(1)):
        size = tuple(bug_classes.touching_size(7, 3, stride, 1, pad) for pad in padding)
        case = C(side, (2, 6, *size), (20, 6, 3, 3), stride=stride, padding=padding)
        x, weight, bias, grad_output = inputs(case, 41 + k)
        device = Recorder("reverse" if k % 2 else "forward")
        out = on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
        grads = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                            needs=("input", "weight"), **case.kwargs)
        assert device.count("simt_fwd") == 1 + (stride == 1) and device.count("simt_bwd_weight") == 1
        assert_close(out, expected_forward(x, weight, bias, **case.kwargs), f"{side} forward")
        for name, g, w in zip(("input", "weight"), grads, expected_backward(grad_output, x, weight, **case.kwargs)):
            assert_close(g, w, f"{side} grad {name}")


def test_weight_gradient_splits_and_is_deterministic(monkeypatch):
    """SIMT_SPLIT_CHUNKS 1: the weight gradient splits its 19 chunks of 8 pixels (150 pixels) in 19, each a float32
    slice, its bias row included (the column sums of each split's grad_output), added up in order afterwards; two
    runs give the same bits."""
    monkeypatch.setattr(simt_gemm, "SIMT_SPLIT_CHUNKS", 1)
    case = CASE_BY_NAME["long_k_last_row_and_column"]
    x, _, _, grad_output = inputs(case, 12)
    weight = numpy.zeros(case.weight, numpy.float32)
    x, grad_output = numpy.concatenate([x] * 5), numpy.concatenate([grad_output] * 5)
    spec = conv_op.ConvSpec.for_conv("t", x, weight, None, **case.kwargs)
    assert simt_gemm.plan_simt(spec, "weight").splits == 19
    runs = [on_emulator(EmulatedDevice(order), cupyconv.conv2d_backward, grad_output, x, weight,
                        algorithm="implicit_gemm", needs=("weight", "bias"), **case.kwargs)[1:]
            for order in ("forward", "reverse")]
    want = expected_backward(grad_output, x, weight, needs=("weight", "bias"), **case.kwargs)
    assert_close(runs[0][0], want[1], "splits")
    assert_close(runs[0][1], want[2], "the splits' bias rows")
    assert all(a.tobytes() == b.tobytes() for a, b in zip(*runs))


def test_weight_gradient_splits_within_the_workspace_limit():
    spec = conv_op.ConvSpec.for_conv("t", numpy.empty((64, 64, 56, 56), numpy.float32),
                                     numpy.empty((64, 64, 3, 3), numpy.float32), None, 1, 1, 1, 1)
    plan = simt_gemm.plan_simt(spec, "weight")
    assert plan.splits > 1 and plan.splits * plan.chunks_per_split * simt_gemm.SIMT_CHUNK >= 64 * 56 * 56
    with settings.workspace_limit(3 * 64 * 577 * 4):   # room for three float32 slices of grad_weight and bias
        assert simt_gemm.plan_simt(spec, "weight").splits == 3


def test_weight_192_row_tiles_plan():
    """576 weight-gradient rows (64 channels, 3 x 3) take three 192 x 64 x 12 tiles (the pairs of six 96-row tiles)
    in SIMT_SPLIT_BLOCKS x 3 / 4 blocks of 128 threads, three an SM (r50-64: 128 splits); where SIMT_SPLIT_CHUNKS holds
    the splits below that (ii's 8 images: 98 at most, 294 blocks), six 96 x 64 x 12 tiles in 85 splits."""
    def plan(images):
        spec = conv_op.ConvSpec.for_conv("t", numpy.empty((images, 64, 56, 56), numpy.float32),
                                         numpy.empty((64, 64, 3, 3), numpy.float32), None, 1, 1, 1, 1)
        return simt_gemm.plan_simt(spec, "weight")
    r50 = plan(32)
    assert (r50.tile, r50.grid, r50.threads, r50.chunks_per_split) == ((192, 64, 12), (3, 1, 128), 128, 98)
    assert (plan(8).tile, plan(8).grid) == ((96, 64, 12), (6, 1, 85))


@pytest.mark.parametrize("order, index", [("forward", "int"), ("reverse", "int"), ("reverse", "long long")])
def test_weight_192_row_tiles(order, index, monkeypatch):
    """simt_bwd_weight<192, 64, 12> (128 threads, each loading one k of 12 rows of x and of 4 columns of grad_out a
    chunk; int: 168 registers, three blocks an SM) on 378 rows in two row tiles (378 of 384), 40 of 64 columns, its
    84 pixels split in 2 (SIMT_SPLIT_BLOCKS 4 and SIMT_SPLIT_CHUNKS 1 let so few split), with the bias gradient's
    column sums, against the CPU path in float64; both thread orders, and the 64-bit twin."""
    monkeypatch.setattr(simt_gemm, "SIMT_SPLIT_BLOCKS", 4)
    monkeypatch.setattr(simt_gemm, "SIMT_SPLIT_CHUNKS", 1)
    if index == "long long":
        monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    case = CASE_BY_NAME["weight_192_row_tiles"]
    x, weight, _, grad_output = inputs(case, 13)
    device = Recorder(order)
    got = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                      needs=("weight", "bias"), **case.kwargs)
    assert device.launches == [f"simt_bwd_weight<float, {index}, 192, 64, 12>"], device.launches
    spec = conv_op.ConvSpec.for_conv("t", x, weight, None, **case.kwargs)
    assert simt_gemm.plan_simt(spec, "weight").grid == (2, 1, 2)
    want = expected_backward(grad_output, x, weight, needs=("weight", "bias"), **case.kwargs)
    assert_close(got[1], want[1], "grad_weight")
    assert_close(got[2], want[2], "grad_bias")


def test_negative_strides():
    """x viewed with negative strides (flipped rows and columns, channels, images) reaches simt_fwd as it is: window
    origins and tap offsets are signed, so an origin below x's first element (a flipped axis) still adds up to the
    element's offset; forward and input and weight gradients against the CPU path in float64."""
    rng = numpy.random.default_rng(11)
    base = rng.standard_normal((3, 6, 9, 8)).astype(numpy.float32)
    weight = rng.standard_normal((10, 6, 3, 3)).astype(numpy.float32)
    grad = None
    for x in (base[:, :, ::-1, ::-1], base[:, ::-1], base[::-1]):
        kwargs = dict(padding=((2, 0), (1, 1)))
        want = expected_forward(x, weight, None, **kwargs)
        got = on_emulator(EmulatedDevice(), cupyconv.conv2d, x, weight, algorithm="implicit_gemm", **kwargs)
        assert_close(got, want, f"forward, strides {x.strides}")
        grad = rng.standard_normal(want.shape).astype(numpy.float32) if grad is None else grad
        want_b = expected_backward(grad, x, weight, **kwargs)
        got_b = on_emulator(EmulatedDevice(), cupyconv.conv2d_backward, grad, x, weight, algorithm="implicit_gemm",
                            **kwargs)
        for name, g, w in zip(("input", "weight"), got_b, want_b):
            assert_close(g, w, f"{name} gradient, strides {x.strides}")


def test_batch_view_read_in_place():
    """patch_conv2d-like (B, N, C, H, W) given as a transposed (B, C, N, H, W) array and every other column of a
    wider x: the batch view's two strides and x_stride_w = 2, read without a copy."""
    rng = numpy.random.default_rng(9)
    stored = rng.standard_normal((2, 6, 5, 7, 14)).astype(numpy.float32)      # (B, C, N, H, 2 W)
    x = stored.transpose(0, 2, 1, 3, 4)[..., ::2]                               # (B, N, C, H, W)
    weight = rng.standard_normal((20, 6, 3, 3)).astype(numpy.float32)
    spec = conv_op.ConvSpec.for_conv("t", x.reshape(-1, 6, 7, 7), weight, None, 1, 1, 1, 1)
    device = Recorder()
    xv = _kernels.batch_view(device, x)
    assert xv.base is not None and xv.shape == (2, 5, 6, 7, 7)
    out = device.empty(spec.output_shape, numpy.float32)
    with settings.allow_tf32(False):
        simt_gemm.simt_gemm_gpu(device, xv, weight, None, spec, out)
    assert_close(out, expected_forward(x.reshape(-1, 6, 7, 7), weight, None, padding=1), "batch view")
    grad_w, grad_b = simt_gemm.simt_gemm_grad_weight(device, xv, out.reshape(10, 20, 49), spec, bias=True)
    assert_close(grad_b, out.sum(axis=(0, 2, 3), dtype=numpy.float64), "batch view grad bias")
    assert_close(grad_w, expected_backward(out, x.reshape(-1, 6, 7, 7), weight, padding=1)[1], "batch view grad")


@pytest.mark.parametrize("name, tiles", [("strided_uncovered_rows", ("128, 32, 8", "128, 64, 8")),
                                         ("wide_tile_many_row_blocks", ("128, 128, 16",) * 2),
                                         ("groups2_stride_dilation_per_axis", ("128, 32, 8",) * 2),
                                         ("weight_96_row_tiles", ("128, 32, 8", "96, 64, 12")),
                                         ("plain", ("128, 32, 8", "64, 32, 8"))])
def test_64_bit_index_variant(name, tiles, monkeypatch):
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    case = CASE_BY_NAME[name]
    x, weight, bias, grad_output = inputs(case, 2)
    device = Recorder()
    out = on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    got = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                      needs="weight", **case.kwargs)
    assert device.launches == [f"{k}<float, long long, {t}>" for k, t in zip(("simt_fwd", "simt_bwd_weight"), tiles)]
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), "forward")
    assert_close(got[1], expected_backward(grad_output, x, weight, **case.kwargs)[1], "grad_weight")


#: 65535 groups (the most grid.y takes) of 64 -> 64 channels, 3 x 3: the last group's weights start past 2^31.
HUGE_GROUPS = 65535


def test_weight_t_padded_with_zeros_and_aligned():
    """simt_fwd's B copies are unpredicated 16-byte cp.async, so `simt_weight_t` must hand it weight_t padded with
    zeros to whole K chunks of 16 and column tiles, C-contiguous and 16-byte aligned: from a strided 5-D view (the
    input gradient's flipped weight), from a contiguous but misaligned array (a copy), and an aligned contiguous
    array as it is."""
    device, rng = _device.Device(), numpy.random.default_rng(5)
    flipped = rng.standard_normal((2, 5, 3, 3, 20)).astype(numpy.float32)[:, :, ::-1, ::-1]   # K 45, N 20
    got = simt_gemm.simt_weight_t(device, flipped, (128, 32, 8))
    want = numpy.zeros((2, 48, 32), numpy.float32)
    want[:, :45, :20] = flipped.reshape(2, 45, 20)
    assert got.flags.c_contiguous and _device._address(got) % 16 == 0
    numpy.testing.assert_array_equal(got, want)
    buffer = numpy.zeros(2 * 16 * 64 + 8, numpy.float32)
    start = -buffer.ctypes.data % 16 // 4   # an aligned first element, then one 4 bytes past it
    aligned = buffer[start:start + 2 * 16 * 64].reshape(2, 16, 64)
    aligned[...] = rng.standard_normal(aligned.shape)
    assert _device._address(simt_gemm.simt_weight_t(device, aligned, (256, 64, 16))) == _device._address(aligned)
    misaligned = buffer[start + 1:start + 1 + 2 * 16 * 64].reshape(2, 16, 64)
    got = simt_gemm.simt_weight_t(device, misaligned, (256, 64, 16))
    assert _device._address(got) % 16 == 0
    numpy.testing.assert_array_equal(got, misaligned)


def test_64_bit_indices_past_2_31():
    """The `long long` instantiations with a 2.4e9-element weight (sparse memory; only the last block of each
    launch runs: bug_classes.SparseDevice): every weight offset of the last group passes 2^31, so an `int` product
    there overflows (UBSan fails the launch); what the last block writes matches the CPU path on the last group."""
    rng = numpy.random.default_rng(17)
    g, c = HUGE_GROUPS, 64 * HUGE_GROUPS
    x = bug_classes.sparse_zeros((1, c, 1, 1), numpy.float32)
    x[:, -64:] = rng.standard_normal((1, 64, 1, 1))
    weight = bug_classes.sparse_zeros((c, 64, 3, 3), numpy.float32)
    weight[-64:] = rng.standard_normal((64, 64, 3, 3)) / 8
    grad_output = bug_classes.sparse_zeros((1, c, 1, 1), numpy.float32)
    grad_output[:, -64:] = rng.standard_normal((1, 64, 1, 1))
    last = [a[:, -64:] for a in (x, grad_output)] + [weight[-64:]]
    device = bug_classes.SparseDevice()
    # The launches as the launchers make them, without the whole-buffer work around them (transposing or
    # flipping 2.4e9 weights, adding the weight gradient's splits): weight_t (G, 64 * 9, 64) of the forward and of
    # the input gradient (the flipped weight), sparse but for the last group.
    spec = conv_op.ConvSpec.for_conv("t", x, weight, None, 1, 1, 1, g)
    weight_t = bug_classes.sparse_zeros((g, 576, 64), numpy.float32)
    weight_t[-1] = last[2].reshape(64, 576).T
    out = device.empty((1, c, 1, 1), numpy.float32)
    with settings.allow_tf32(False):
        simt_gemm.simt_fwd_launch(device, _kernels.batch_view(device, x), weight_t, None, spec, out)
    bug_classes.assert_tail_written(out, expected_forward(last[0], last[2], None, padding=1), numpy.float32, 64,
                                    "forward")
    want = expected_backward(last[1], last[0], last[2], padding=1)
    weight_t[-1] = last[2][:, :, ::-1, ::-1].transpose(0, 2, 3, 1).reshape(576, 64)
    grad_x = device.empty(x.shape, numpy.float32)
    with settings.allow_tf32(False):
        simt_gemm.simt_fwd_launch(device, _kernels.batch_view(device, grad_output), weight_t, None,
                                  conv_op.transposed_spec(spec), grad_x)
    bug_classes.assert_tail_written(grad_x, want[0], numpy.float32, 64, "grad_input")
    plan = simt_gemm.plan_simt(spec, "weight")
    partial = device.empty((plan.splits, c, 64 * 9), numpy.float32)
    xv = _kernels.batch_view(device, x)
    simt_gemm.KERNELS.launch(device, "simt_bwd_weight", plan.tile, dtype=x.dtype, index="long long",
                             grid=plan.grid, block=plan.threads, window=spec, x=xv,
                             grad_out=grad_output.reshape(1, c, 1), partial=partial, n=1,
                             **_kernels.batch_args("x", xv), groups=g, channels_per_group=64, outputs_per_group=64,
                             chunks_per_split=plan.chunks_per_split, bias_row=0)
    assert plan.splits == 1
    bug_classes.assert_tail_written(partial, want[1].reshape(-1)[-1024:], numpy.float32, 128, "grad_weight")
    assert [name.split(", ")[:2] for name in device.launches] == [
        [f"{kernel}<float", "long long"] for kernel in ("simt_fwd", "simt_fwd", "simt_bwd_weight")]


@pytest.mark.parametrize("fit_cost, forward_tile", [(9.0, "256, 64, 16"), (0.0, "192, 64, 12")])
def test_64_bit_channel_offsets_within_a_group(fit_cost, forward_tile, monkeypatch):
    """The other way past 2^31 (and 2^32): 32 channels of a 12000 x 12000 plane in one group, so a channel's offset
    in x passes 2^31 at c = 15 and the last pixels lie past 2^32: an `int` product of a channel and its stride, or
    an offset kept in 32 unsigned bits, reads the wrong place.  Only the last block of each launch runs (the last
    256 or 192 pixels of the last row: the forward's tall tiles, 40 columns, by SIMT_TALL_FIT_COST, and the input
    gradient's tall 32-column tile), and matches the CPU path on the 2 x 257 corner that feeds it."""
    monkeypatch.setattr(simt_gemm, "SIMT_TALL_FIT_COST", fit_cost)
    rng = numpy.random.default_rng(23)
    side = 12000
    x = bug_classes.sparse_zeros((1, 32, side, side), numpy.float32)
    x[:, :, -2:, -257:] = rng.standard_normal((1, 32, 2, 257))
    grad_output = bug_classes.sparse_zeros((1, 40, side, side), numpy.float32)
    grad_output[:, :, -2:, -257:] = rng.standard_normal((1, 40, 2, 257))
    weight = (rng.standard_normal((40, 32, 3, 3)) / 8).astype(numpy.float32)
    corner = [a[:, :, -2:, -257:] for a in (x, grad_output)]
    device = bug_classes.SparseDevice()
    out = on_emulator(device, cupyconv.conv2d, x, weight, padding=1, algorithm="implicit_gemm")
    want = expected_forward(corner[0], weight, None, padding=1)[0, -1, -1, 1:]
    bug_classes.assert_tail_written(out, want, numpy.float32, 64, "forward")
    (grad_x, _, _) = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, padding=1,
                                 needs="input", algorithm="implicit_gemm")
    want = expected_backward(corner[1], corner[0], weight, padding=1)[0][0, -1, -1, 1:]
    bug_classes.assert_tail_written(grad_x, want, numpy.float32, 64, "grad_input")
    assert device.launches == [f"simt_fwd<float, long long, {t}>" for t in (forward_tile, "256, 32, 16")], \
        device.launches


def test_auto_picks_the_fma_gemm_where_columns_outgrow_the_input(monkeypatch):
    """TF32 off and float32: 3x3 stride 1 with over 16 channels (columns 9x the input) -> FMA GEMM, forward and
    input gradient and weight gradient (SIMT_MIN_BLOCKS 1: a problem this small has one or two blocks a pass);
    TF32 on -> the tensor cores; few channels (4) -> direct; pointwise -> im2col forward and input gradient, but the
    FMA weight gradient (a 20 x 24 weight: one GEMM tile cuBLAS cannot spread); float64 -> im2col."""
    monkeypatch.setattr(simt_gemm, "SIMT_MIN_BLOCKS", 1)
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal((2, 24, 9, 7)).astype(numpy.float32)
    weight = rng.standard_normal((20, 24, 3, 3)).astype(numpy.float32)
    for (xs, ws, kwargs), tf32, expected in (((x, weight, dict(padding=1)), False, (2, 1)),
                                             ((x, weight, dict(padding=1)), True, "tc"),
                                             ((x[:, :4], weight[:4, :4], dict(padding=1)), False, "direct"),   # (the weight too: 4 a group)
                                             ((x, weight[:, :, :1, :1], {}), False, (0, 1)),
                                             ((x.astype(numpy.float64), weight.astype(numpy.float64),
                                               dict(padding=1)), False, (0, 0))):
        device = Recorder()
        with _device.use_device(device), settings.allow_tf32(tf32):
            out = cupyconv.conv2d(xs, ws, **kwargs)
            cupyconv.conv2d_backward(out, xs, ws, **kwargs)
        simt = (device.count("simt_fwd"), device.count("simt_bwd_weight"))
        assert simt == (expected if isinstance(expected, tuple) else (0, 0)), (expected, device.launches)
        tensor_core_forwards = device.count("conv_fwd_tc") + device.count("conv_fwd_igemm")  # generic or channels-last
        assert (tensor_core_forwards >= 1) == (expected == "tc"), (expected, device.launches)
        assert (device.count("conv_fwd_direct") >= 1) == (expected == "direct"), (expected, device.launches)


def _r50(channels, size, groups=1, kernel=3, stride=1, padding=1, outputs=None):
    outputs = outputs or channels
    return conv_op.ConvSpec.for_conv("t", numpy.empty((32, channels, size, size), numpy.float32),
                                     numpy.empty((outputs, channels // groups, kernel, kernel), numpy.float32),
                                     None, stride, padding, 1, groups)


@pytest.mark.parametrize("spec, expected", [
    (_r50(64, 56), ["implicit_gemm"] * 3),                   # 64 columns, hundreds of blocks, a 5-tile weight
    (_r50(128, 28), ["im2col_gemm", "im2col_gemm", "implicit_gemm"]),   # 128 columns: cuBLAS; weight 9 tiles
    (_r50(256, 14), ["im2col_gemm"] * 3),                    # weight 36 tiles
    (_r50(512, 7), ["im2col_gemm"] * 3),                     # 13 x 4 blocks forward and input: too few
    (_r50(256, 28, groups=8), ["implicit_gemm"] * 3),         # 32 columns a group: the narrow tiles
    (_r50(512, 14, groups=16), ["implicit_gemm"] * 3),        # 49 blocks a group, 784 in all: SIMT_MIN_BLOCKS
    # 128 columns: cuBLAS forward and input; the weight (2 x 9 tiles) by the FMA GEMM (SIMT_WEIGHT_MAX_COLUMNS)
    (_r50(256, 28, groups=2), ["im2col_gemm", "im2col_gemm", "implicit_gemm"]),
    (_r50(64, 56, kernel=1, padding=0), ["im2col_gemm", "im2col_gemm", "implicit_gemm"]),   # pointwise
    # forward: 196 blocks, from SIMT_MIN_BLOCKS; input gradient: 256 columns; weight: 64 columns, 18 tiles
    (_r50(256, 28, outputs=64), ["implicit_gemm", "im2col_gemm", "implicit_gemm"]),
], ids=["r50-64", "r50-128", "r50-256", "r50-512", "g8-256", "g16-512", "g2-256", "pointwise", "256-to-64"])
def test_auto_rule(spec, expected):
    """'auto' for strict float32 (`simt_preferred`), pass by pass: the FMA GEMM for the forward and input gradient
    with at most 64 columns a group and SIMT_MIN_BLOCKS blocks where the columns outgrow the input; for the weight
    gradient with at most 128 columns where the columns outgrow the input, or where cuBLAS's GEMM would have fewer
    than 10 tiles of 128 x 128."""
    with settings.allow_tf32(False):
        assert [conv_op.choose_algorithm(spec, numpy.float32, None, p) for p in ("forward", "input", "weight")] == (
            expected)


def test_refusals_name_the_reason():
    spec = conv_op.ConvSpec.for_conv("conv2d", numpy.empty((1, 4, 5, 5)), numpy.empty((4, 4, 3, 3)), None, 2, 1, 1, 1)
    assert "float32, not float64" in simt_gemm.simt_refusal(spec, numpy.float64)
    assert "stride is (2, 2)" in simt_gemm.simt_refusal(spec, numpy.float32, "input")
    assert simt_gemm.simt_refusal(spec, numpy.float32, "weight") is None
    big = conv_op.ConvSpec.for_conv("conv2d", numpy.empty((1, 1, 40, 40)), numpy.empty((1, 1, 16, 16)), None, 1, 0, 1,
                                    1)
    assert "height + width of at most 31" in simt_gemm.simt_refusal(big, numpy.float32)
    assert simt_gemm.simt_refusal(big, numpy.float32, "weight") is None
    x = numpy.ones((1, 4, 5, 5), numpy.float64)
    with pytest.raises(ValueError, match="conv2d: algorithm='implicit_gemm' cannot run"):
        on_emulator(EmulatedDevice(), cupyconv.conv2d, x, numpy.ones((4, 4, 3, 3)), algorithm="implicit_gemm")


@pytest.mark.parametrize("stride", [1, 2])
def test_patch_conv2d_implicit_gemm_in_strict_float32(stride):
    """patch_conv2d's 'implicit_gemm' in float32 with TF32 off: the FMA kernels over (B, N, C, H, W) patches read
    in place through a transposed (B, C, N, H, W) array; the strided input gradient on the GEMM and col2im."""
    rng = numpy.random.default_rng(14)
    x = rng.standard_normal((2, 6, 37, 4, 4)).astype(numpy.float32).transpose(0, 2, 1, 3, 4)
    weight = rng.standard_normal((24, 6, 3, 3)).astype(numpy.float32)
    bias = rng.standard_normal((24,)).astype(numpy.float32)
    oh = 4 if stride == 1 else 2
    grad_output = rng.standard_normal((2, 37, 24, oh, oh)).astype(numpy.float32)
    kw = dict(padding=1, stride=stride, algorithm="implicit_gemm")
    device = Recorder()
    out = on_emulator(device, cupyconv.patch_conv2d, x, weight, bias, **kw)
    got = on_emulator(device, cupyconv.patch_conv2d_backward, grad_output, x, weight, **kw)
    assert device.count("simt_fwd") == 1 + (stride == 1) and device.count("simt_bwd_weight") == 1, device.launches
    flat = dict(padding=1, stride=stride)
    assert_close(out, expected_forward(x.reshape(-1, 6, 4, 4), weight, bias, **flat).reshape(out.shape), "forward")
    want = expected_backward(grad_output.reshape(-1, 24, oh, oh), x.reshape(-1, 6, 4, 4), weight, **flat)
    for name, g, w in zip(("grad_input", "grad_weight", "grad_bias"), got, want):
        assert_close(g, w.reshape(g.shape), f"patch {name}")


def test_patch_auto_picks_the_fma_gemm_outside_the_direct_range():
    """float32, TF32 off: 'auto' runs the FMA GEMM for 32 -> 40 channels (the model's ranking over the fused kernel
    on the patch cases) and keeps the fused kernel for 3 -> 4 channels (conv2d's direct range)."""
    rng = numpy.random.default_rng(15)
    for c, d, expected in ((32, 40, "simt_fwd"), (3, 4, "patch_fwd")):
        x = rng.standard_normal((2, 9, c, 4, 4)).astype(numpy.float32)
        weight = rng.standard_normal((d, c, 3, 3)).astype(numpy.float32)
        grad_output = rng.standard_normal((2, 9, d, 4, 4)).astype(numpy.float32)
        device = Recorder()
        out = on_emulator(device, cupyconv.patch_conv2d, x, weight, padding=1)
        got = on_emulator(device, cupyconv.patch_conv2d_backward, grad_output, x, weight, padding=1)
        assert device.count(expected) >= 1, (c, device.launches)
        assert (device.count("simt_bwd_weight") == 1) == (expected == "simt_fwd"), device.launches
        assert_close(out, expected_forward(x.reshape(-1, c, 4, 4), weight, None, padding=1).reshape(out.shape), "fwd")
        want = expected_backward(grad_output.reshape(-1, d, 4, 4), x.reshape(-1, c, 4, 4), weight, padding=1)
        for g, w in zip(got, want):
            assert_close(g, w.reshape(g.shape), f"patch {c} -> {d}")


def test_tiles_are_a_rule_of_the_shapes():
    """plan_simt's tile, pinned on the benchmark problems (N = 32, 3x3 pad 1): groups of at most 32 columns take the
    32-column tiles (no FMA on padding columns), the weight gradient's 288 rows (32 x 9; its bias is no GEMM row)
    64-row tiles (320 rows, not 384), with 33-64 columns 96-row ones where they pad no more rows than 128-row ones
    (576: 6 exactly, not 640); 64 columns the 128 x 64 tile, or two column tiles of 128 x 32 where the busiest SM
    works less (ii's 196 blocks of 128 x 64: 2 x 64 columns on the busiest SM, against 3 x 32 x 1.06 in 392 of 128 x
    32; i's 256: 2 x 64 against 4 x 32 x 1.06), from SIMT_TALL_ROWS rows 256 x 64 x 16, or 192 x 64 x 12 where its
    waves of 264 blocks pad less (r50-64's 392 blocks of 256 rows are 1.48 waves, 523 of 192 1.98); more the 128 x
    128 x 16 (256 x 128 x 16 from SIMT_TALL_ROWS rows)."""
    def plans(c, h, g):
        spec = conv_op.ConvSpec.for_conv("t", numpy.empty((32, c, h, h), numpy.float32),
                                         numpy.empty((c, c // g, 3, 3), numpy.float32), None, 1, 1, 1, g)
        return [(simt_gemm.plan_simt(s, p).tile, simt_gemm.plan_simt(s, p).grid[:2])
                for s, p in ((spec, "forward"), (conv_op.transposed_spec(spec), "forward"), (spec, "weight"))]
    narrow, short, tile, tall, wide = (128, 32, 8), (64, 32, 8), (128, 64, 8), (256, 64, 16), (128, 128, 16)
    tall_wide = (256, 128, 16)
    pixels = 32 * 28 * 28
    assert plans(256, 28, 8) == [(narrow, (pixels // 128, 8))] * 2 + [(short, (5, 8))]     # g8-256: 288 rows
    assert plans(1024, 7, 32) == [(narrow, (-(-32 * 49 // 128), 32))] * 2 + [(short, (5, 32))]   # rx-1024
    fit = (192, 64, 12)
    assert plans(64, 56, 1) == [(fit, (523, 1))] * 2 + [(fit, (3, 1))]   # r50-64: 576 rows
    assert plans(64, 64, 1)[0] == (tall, (512, 1))   # 2 waves of 256 rows, not 3 of 192
    assert plans(128, 56, 2)[0] == (tall, (392, 2))  # two groups: 784 blocks (2.97 waves), not 1046 (3.96)
    assert plans(64, 112, 1)[0] == (tall, (1568, 1))   # 6 waves of 256 rows, 8 of 192: the loop's cost decides
    assert plans(64, 160, 1)[0] == (tall, (3200, 1))   # 13 x 256 rows a slot against 17 x 192 (3,264 x 1.03)
    assert plans(128, 28, 1) == [(wide, (pixels // 128, 1))] * 2 + [(wide, (9, 1))]      # r50-128: 1152 rows
    # 64 per group, 1568 rows: not tall; 576 weight rows, but 6 splits of 32 chunks make 288 blocks of 192 x 64 x 12
    assert plans(1024, 7, 16) == [(tile, (13, 16))] * 2 + [((96, 64, 12), (6, 16))]
    assert plans(256, 64, 1) == [(tall_wide, (32 * 64 * 64 // 256, 2))] * 2 + [(wide, (18, 2))]  # 2304 rows
    assert plans(56, 28, 1)[2] == (tile, (4, 1))   # 504 rows: 576 in 96-row tiles, 512 in 128-row ones
    assert plans(512, 7, 32) == [(narrow, (13, 32))] * 2 + [(short, (3, 32))]   # 16 per group: 144 rows, 192
    assert simt_gemm.simt_tile("forward", 8 * 56 * 56, 64) == narrow         # ii: 196 blocks of 128 x 64
    assert simt_gemm.simt_tile("forward", 1280 * 16, 64) == narrow           # p-1280: 160 (2 x 64 against 3 x 32)
    assert simt_gemm.simt_tile("forward", 2048 * 16, 64) == tile             # i: 256 (2 x 64 against 4 x 32 x 1.06)
    assert simt_gemm.simt_tile("forward", 100 * 128, 40) == tile   # 100: 1 x 64 against 200 blocks, 2 x 32 x 1.06
    assert simt_gemm.simt_tile("forward", 60 * 128, 40) == narrow  # 60: 1 x 64 against 120 blocks, 1 x 32 x 1.06
    # 100 groups of 5,504 rows, 4,300 blocks: 9 waves x 4 x 64 against 17 x 4 x 32 x 1.06 (2,304 against 2,306.6):
    # the loop's cost decides
    assert simt_gemm.simt_tile("forward", 43 * 128, 64, groups=100) == tile


def test_two_column_tiles_only_within_grid_y(monkeypatch):
    """SIMT_SPLIT_COST 0 (two 128 x 32 tiles always cheaper): still 128 x 64 x 8 where groups x 2 column tiles would
    pass grid.y's 65,535 (simt_refusal admits groups x 64-column tiles up to it)."""
    monkeypatch.setattr(simt_gemm, "SIMT_SPLIT_COST", 0.0)
    assert simt_gemm.simt_tile("forward", 128, 64, groups=_kernels.MAX_GRID[1] // 2) == (128, 32, 8)
    assert simt_gemm.simt_tile("forward", 128, 64, groups=_kernels.MAX_GRID[1] // 2 + 1) == (128, 64, 8)


def test_narrow_tall_tile_by_its_waves():
    """Over SIMT_TALL_ROWS rows, at most 32 columns take 256 x 32 x 16 or 128 x 32 x 8 (both 4 blocks an SM: 528 at
    once) by their waves times rows and loop cost: the patch seed's input gradient (20,480 4x4 patches, 32 input
    channels: 327,680 rows) 2,560 blocks of 128 (4.85 waves) rather than 1,280 of 256 (2.42: 3 waves of 256 rows a
    slot against 5 of 128 x 1.06); p-8x8's 1,310,720 rows 10 waves of 256 against 20 of 128, and 1,126,400 rows 9
    against 17 x 1.06 (2,304 rows a slot against 2,306.6: the loop's cost decides); two groups of them
    twice the blocks (p-seed's rows: 4.85 waves of 256 rows against 9.70 of 128)."""
    tall_narrow, narrow = (256, 32, 16), (128, 32, 8)
    assert simt_gemm.simt_tile("forward", 20480 * 16, 32) == narrow
    assert simt_gemm.plan_simt(conv_op.transposed_spec(conv_op.ConvSpec.for_conv(
        "t", numpy.empty((20480, 32, 4, 4), numpy.float32), numpy.empty((64, 32, 3, 3), numpy.float32), None, 1, 1,
        1, 1)), "forward") == simt_gemm.SimtPlan(narrow, (2560, 1, 1))
    assert simt_gemm.simt_tile("forward", 20480 * 64, 32) == tall_narrow
    assert simt_gemm.simt_tile("forward", 4400 * 256, 32) == tall_narrow   # 9 waves of 256 rows, 17 of 128 x 1.06
    assert simt_gemm.simt_tile("forward", 20480 * 16, 32, groups=2) == tall_narrow
    assert simt_gemm.simt_tile("forward", 20480 * 16, 64) == (256, 64, 16)   # the 64-column rule is its own


def test_patch_backward_sums_the_bias_in_the_weight_gradient(monkeypatch):
    """patch_conv2d_backward on the FMA GEMM takes grad_bias from simt_bwd_weight's column sums, as conv2d's
    does: no array-library sum over grad_output (the patch seed's is 84 MB, p-8x8's 336 MB), and it equals the
    CPU path's; asked for alone, grad_bias is still that sum."""
    rng = numpy.random.default_rng(12)
    x = rng.standard_normal((2, 5, 17, 4, 4)).astype(numpy.float32)   # (B, N, C, H, W): 17 > the direct range
    weight = rng.standard_normal((20, 17, 3, 3)).astype(numpy.float32)
    grad_output = rng.standard_normal((2, 5, 20, 4, 4)).astype(numpy.float32)
    sums = []
    device = Recorder()
    monkeypatch.setattr(device, "sum", lambda a, axis, dtype: (sums.append(a.size), EmulatedDevice.sum(
        device, a, axis, dtype))[1])
    got = on_emulator(device, cupyconv.patch_conv2d_backward, grad_output, x, weight, padding=1)
    assert device.count("simt_bwd_weight") == 1 and grad_output.size not in sums, (device.launches, sums)
    want = cupyconv.patch_conv2d_backward(*(a.astype(numpy.float64) for a in (grad_output, x, weight)), padding=1)
    for g, w, name in zip(got, want, ("grad_x", "grad_weight", "grad_bias")):
        assert_close(g, w, name)
    _, _, grad_b = on_emulator(Recorder(), cupyconv.patch_conv2d_backward, grad_output, x, weight, padding=1,
                               needs=("bias",))
    assert_close(grad_b, want[2], "grad_bias alone")


# ---------------------------------------------------------------------------------------------------------
# The same cases on a real GPU: CuPy arrays against the CPU path in float64 (no GPU test ran the FMA kernels
# before the first H100 run; gpu_check's sanitizers run the first of these)


def on_gpu(fn, *arrays, **kwargs):
    """fn on CuPy copies of the NumPy arrays (None stays None) with TF32 off; results back as NumPy arrays."""
    import cupy
    with settings.allow_tf32(False):
        result = fn(*(None if a is None else cupy.asarray(a) for a in arrays), **kwargs)
    if isinstance(result, tuple):
        return tuple(None if r is None else cupy.asnumpy(r) for r in result)
    return cupy.asnumpy(result)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [*CASES, *TALL_CASES.values()], ids=str)
def test_gpu_matches_cpu_path(case):
    x, weight, bias, grad_output = inputs(case, 2)
    out = on_gpu(cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    assert out.dtype == x.dtype and out.shape == case.output_shape
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), f"{case.name} forward")
    got = on_gpu(cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm", **case.kwargs)
    want = expected_backward(grad_output, x, weight, **case.kwargs)
    for name, g, w in zip(("grad_input", "grad_weight", "grad_bias"), got, want):
        assert g.dtype == x.dtype and g.shape == w.shape, name
        assert_close(g, w, f"{case.name} {name}")
