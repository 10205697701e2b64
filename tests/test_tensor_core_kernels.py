"""The tensor-core implicit GEMMs (raw_kernels/implicit_gemm.cu conv_fwd_tc, conv_bwd_input_tc and conv_bwd_weight_tc,
mma.sync through raw_kernels/mma.cuh) against the CPU path: conv2d and patch_conv2d, forward and backward, in
float16, bfloat16 and float32 as TF32.

The emulator runs mma.sync as a warp collective in the documented fragment layouts (tests/emulator), so a
fragment in the wrong register, a missing barrier between the two stages, or an unmasked tile edge fails here.
Problems are odd on purpose: rows, columns and K of every GEMM are never multiples of the block tiles, several
blocks run along each of them, and every tile of TC_TILES and the weight gradient's split reduction run.

Every problem here runs on the generic kernels (the `generic_path` fixture refuses the channels-last fast path,
which tests/test_igemm_kernels.py covers).

The bug classes of issue 12 (each side's padding alone and the last row and column, 16-bit accumulation, loops
over several blocks, 64-bit indices past 2^31) are covered on purpose for every kernel here: the table in
tests/emulator/README.md ("Bug classes the kernel tests cover on purpose") names the test of each.
"""
import numpy
import pytest
from optional_deps import BFLOAT16, Dtypes

import cupyconv
from cupyconv import _device, _kernels, settings
from cupyconv.ops import conv as conv_op
from cupyconv.ops import implicit_gemm as igemm
import bug_classes
from bug_classes import Recorder
from emulator import EmulatedDevice, assert_clean_under_asan, pytest_under_asan
from reference import ConvCase

C = ConvCase
DTYPES = Dtypes({"float16": numpy.float16, "bfloat16": BFLOAT16, "float32": numpy.float32})
#: Largest |tensor cores - CPU path| relative to the largest |CPU path| value: one rounding of the float32 sum to
#: the 16-bit output (float16, bfloat16), or TF32 operands (10 mantissa bits) for float32.
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-3}

CASES = [
    C("tc_plain", (2, 16, 9, 7), (20, 16, 3, 3), padding=1),                        # M 126, N 20, K 144
    C("tc_groups2_stride2_asymmetric", (1, 32, 11, 10), (24, 16, 3, 2), stride=2, padding=((2, 0), (0, 3)),
      dilation=(1, 2), groups=2),
    C("tc_pointwise_many_tiles", (3, 16, 12, 11), (70, 16, 1, 1), bias=False),     # M 396, N 70 (two N tiles)
    C("tc_long_k_last_row_and_column", (1, 40, 6, 5), (9, 40, 5, 5), padding=((0, 4), (4, 0))),  # K 1000
    # stride (2, 3): input rows and columns that no window reads (grad_input 0 there), taps that land between
    # output pixels; 40 input channels: the input gradient's 64-column tile
    C("tc_strided_uncovered_rows", (2, 40, 12, 13), (36, 40, 3, 3), stride=(2, 3), padding=((1, 0), (0, 2))),
]
CASE_BY_NAME = {case.name: case for case in CASES}


@pytest.fixture(autouse=True)
def generic_path(monkeypatch):
    """These tests are the generic kernels' (conv_fwd_tc, conv_bwd_input_tc): the channels-last fast path, which
    takes most of their problems otherwise, is refused here (its own tests: tests/test_igemm_kernels.py)."""
    monkeypatch.setattr(igemm, "igemm_refusal", lambda *args: "the generic path is under test")


def on_emulator(device, fn, *args, **kwargs):
    with _device.use_device(device), settings.allow_tf32(True):
        return fn(*args, **kwargs)


def expected_forward(x, weight, bias, **kwargs):
    """The CPU path in float64 on the same (already rounded) inputs."""
    as64 = [None if a is None else a.astype(numpy.float64) for a in (x, weight, bias)]
    return cupyconv.conv2d(*as64, **kwargs)


def expected_backward(grad_output, x, weight, **kwargs):
    as64 = [a.astype(numpy.float64) for a in (grad_output, x, weight)]
    return cupyconv.conv2d_backward(*as64, **kwargs)


def assert_close(got, want, dtype, what=""):
    got = numpy.asarray(got, numpy.float64)
    scale = float(numpy.abs(want).max())
    err = float(numpy.abs(got - want).max())
    assert err <= TOLERANCE[dtype] * scale, f"{what}: max error {err:.3g} vs max |value| {scale:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_conv2d_forward_matches_cpu_path(case, dtype):
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(0), DTYPES[dtype])
    device = Recorder()
    out = on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    assert out.dtype == x.dtype and out.shape == case.output_shape
    assert device.count("conv_fwd_tc") == 1
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), dtype, case.name)


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_both_thread_orders(order):
    """A missing barrier between the stages reads the other stage's chunk (or poison) in one of the orders."""
    case = CASE_BY_NAME["tc_long_k_last_row_and_column"]
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(1), numpy.float16)
    out = on_emulator(EmulatedDevice(order), cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm",
                      **case.kwargs)
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), "float16")


def test_accumulates_in_float32():
    """One large term and 575 below half's resolution at that size: a half accumulator would lose them all."""
    x = numpy.full((1, 64, 3, 3), 0.25, numpy.float16)
    x[0, 0, 1, 1] = 1000.0
    weight = numpy.ones((16, 64, 3, 3), numpy.float16)
    out = on_emulator(EmulatedDevice(), cupyconv.conv2d, x, weight, padding=1, algorithm="implicit_gemm")
    # centre pixel: 1000 + 575 * 0.25 = 1143.75, which float16 rounds to 1144 (spacing 1 there)
    assert (out[0, :, 1, 1] == numpy.float16(1144.0)).all(), out[0, :, 1, 1]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_pass_accumulates_in_float32(dtype, monkeypatch):
    """Forward, input gradient and weight gradient on data whose float32 sums are exact: each result is the
    float64 one rounded once, which an accumulator rounded to 16 bits between mma steps misses (K = 144 for the
    forward, 108 for the input gradient, 128 pixels for the weight gradient), and so does a weight gradient
    whose float32 split sums (4 splits of a 32-pixel chunk each here) are rounded before they are added.
    Bit equality is the emulator's (emu_mma.h rounds each mma's sum once); on these terms (multiples of 2^-12 of
    at most 4, sums below 2^10) a GPU's narrower tensor-core adder, which keeps about float's precision below
    the largest term, would lose no bit either, so the check states no more than the hardware guarantees."""
    monkeypatch.setattr(igemm, "TC_SPLIT_BLOCKS", 10**6)
    monkeypatch.setattr(igemm, "TC_SPLIT_CHUNKS", 1)
    case = C("exact", (2, 32, 9, 9), (24, 16, 3, 3), padding=((1, 0), (0, 1)), groups=2)
    spec = conv_op.ConvSpec.for_conv("t", numpy.empty(case.x), numpy.empty(case.weight), None, **case.kwargs)
    assert igemm.plan_tensor_cores(spec, numpy.float16, "weight").splits == 4
    rng = numpy.random.default_rng(40)
    x, weight, bias = (bug_classes.exact_terms(rng, shape, dtype) for shape in (case.x, case.weight, case.weight[:1]))
    grad_output = bug_classes.exact_terms(rng, case.output_shape, dtype)
    device = Recorder()
    out = on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    grads = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                        needs=("input", "weight"), **case.kwargs)
    assert [name.split("<")[0] for name in device.launches] == ["conv_fwd_tc", "conv_bwd_input_tc",
                                                                "conv_bwd_weight_tc"]
    bug_classes.assert_rounded_once(out, expected_forward(x, weight, bias, **case.kwargs), dtype, "forward")
    for name, got, want in zip(("input", "weight"), grads, expected_backward(grad_output, x, weight, **case.kwargs)):
        bug_classes.assert_rounded_once(got, want, dtype, f"grad {name}")


@pytest.mark.parametrize("stride", [1, 2])
def test_padding_per_side_and_last_row_and_column(stride):
    """The three passes with each side's padding differing alone, the last window ending on the last padded row
    and column: a pass that takes pad_left for pad_top (or reads past the last row) fails one of the four."""
    for k, (side, padding) in enumerate(bug_classes.per_side_paddings(1)):
        size = tuple(bug_classes.touching_size(7, 3, stride, 1, pad) for pad in padding)
        case = C(side, (2, 16, *size), (20, 16, 3, 3), stride=stride, padding=padding)
        x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(41 + k), numpy.float16)
        device = Recorder("reverse" if k % 2 else "forward")
        out = on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
        grads = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                            needs=("input", "weight"), **case.kwargs)
        assert len(device.launches) == 3 and all("_tc<" in name for name in device.launches), device.launches
        assert_close(out, expected_forward(x, weight, bias, **case.kwargs), "float16", f"{side} forward")
        for name, g, w in zip(("input", "weight"), grads, expected_backward(grad_output, x, weight, **case.kwargs)):
            assert_close(g, w, "float16", f"{side} grad {name}")


def test_float32_operands_are_rounded_to_tf32():
    """Every operand 1 + 3 * 2^-12: its 13 dropped bits are above half, so rounding to tf32 (what cuBLAS's TF32
    mode does) gives 1 + 2^-10, while operands passed unrounded are truncated to 1 by the tensor cores."""
    value = numpy.float32(1 + 3 * 2.0**-12)
    x = numpy.full((1, 16, 4, 4), value, numpy.float32)
    weight = numpy.full((3, 16, 1, 1), value, numpy.float32)
    out = on_emulator(EmulatedDevice(), cupyconv.conv2d, x, weight, algorithm="implicit_gemm")
    assert (out == numpy.float32(16 * (1 + 2.0**-10) ** 2)).all(), numpy.unique(out)


def test_64_bit_index_variant(monkeypatch):
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    case = CASE_BY_NAME["tc_groups2_stride2_asymmetric"]
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(2), numpy.float16)
    device = Recorder()
    out = on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    got = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                      needs=("input", "weight"), **case.kwargs)
    assert device.launches == [f"{k}<__half, long long, 64, 32>"
                               for k in ("conv_fwd_tc", "conv_bwd_input_tc", "conv_bwd_weight_tc")]
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), "float16")
    assert got[2] is None
    for g, w in zip(got[:2], expected_backward(grad_output, x, weight, **case.kwargs)):
        assert_close(g, w, "float16")


#: 65535 groups (the most grid.y takes) of 64 -> 64 channels, 3 x 3: the last group's weights start past 2^31
#: ((g * 64 + d) * 576 for the forward, ((g * 64 + d) * 64 + c) * 9 for the input gradient, g * 64 * 576 for the
#: weight gradient's rows).
HUGE_GROUPS = 65535


def test_64_bit_indices_past_2_31(monkeypatch):
    """The three passes' `long long` instantiations with a 2.4e9-element weight (sparse memory; only the last
    block of each launch runs: bug_classes.SparseDevice).  Every weight offset of the last group passes 2^31, so
    an `int` product there overflows, which UBSan turns into a failed launch; what the last block writes matches
    the CPU path on the last group alone."""
    rng = numpy.random.default_rng(17)
    g, c = HUGE_GROUPS, 64 * HUGE_GROUPS
    x = bug_classes.sparse_zeros((1, c, 1, 1), numpy.float16)
    x[:, -64:] = rng.standard_normal((1, 64, 1, 1))
    weight = bug_classes.sparse_zeros((c, 64, 3, 3), numpy.float16)
    weight[-64:] = rng.standard_normal((64, 64, 3, 3)) / 8
    grad_output = bug_classes.sparse_zeros((1, c, 1, 1), numpy.float16)
    grad_output[:, -64:] = rng.standard_normal((1, 64, 1, 1))
    last = [a[:, -64:] for a in (x, grad_output)] + [weight[-64:]]
    device = bug_classes.SparseDevice()
    out = on_emulator(device, cupyconv.conv2d, x, weight, padding=1, groups=g, algorithm="implicit_gemm")
    bug_classes.assert_tail_written(out, expected_forward(last[0], last[2], None, padding=1), numpy.float16, 64,
                                    "forward")
    (grad_x, _, _) = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, padding=1, groups=g,
                                 needs="input", algorithm="implicit_gemm")
    want = expected_backward(last[1], last[0], last[2], padding=1)
    bug_classes.assert_tail_written(grad_x, want[0], numpy.float16, 64, "grad_input")
    # The weight gradient's launch as implicit_gemm_grad_weight makes it, without the float32 sum of its splits
    # and the rounding to float16 afterwards, which would read the whole 2.4e9-element buffer.
    spec = conv_op.ConvSpec.for_conv("t", x, weight, None, 1, 1, 1, g)
    plan = igemm.plan_tensor_cores(spec, x.dtype, "weight")
    partial = device.empty((plan.splits, c, 64 * 9), numpy.float32)
    xv = _kernels.batch_view(_device.Device(), x)
    with settings.allow_tf32(True):
        igemm.KERNELS.launch(device, "conv_bwd_weight_tc", plan.tile, dtype=x.dtype, index="long long",
                               grid=plan.grid, block=plan.threads, window=spec, x=xv,
                               grad_out=grad_output.reshape(1, c, 1), partial=partial, n=1,
                               **_kernels.batch_args("x", xv), groups=g, channels_per_group=64, outputs_per_group=64,
                               chunks_per_split=plan.chunks_per_split)
    assert plan.splits == 1 and _kernels.index_type(partial.size) == "long long"
    bug_classes.assert_tail_written(partial, want[1].reshape(-1)[-1024:], numpy.float16, 128, "grad_weight")
    assert [name.split(", ")[:2] for name in device.launches] == [
        [f"{kernel}<__half", "long long"] for kernel in ("conv_fwd_tc", "conv_bwd_input_tc", "conv_bwd_weight_tc")]


def test_64_bit_channel_offsets_within_a_group(monkeypatch):
    """The other way past 2^31: 16 channels of a 12000 x 12000 plane, one group, so a channel's offset in x (and
    in grad_output) passes 2^31 at c = 15 (15 * 1.44e8); an `int` product of a channel and its stride in the
    forward's or the input gradient's gather overflows (UBSan fails the launch).  Only the last block of each launch
    runs (the last 64 pixels of the last row, every channel): they match the CPU path on the 2 x 65 corner that
    feeds them, whose first row and column only pad."""
    rng = numpy.random.default_rng(23)
    side = 12000
    x = bug_classes.sparse_zeros((1, 16, side, side), numpy.float16)
    x[:, :, -2:, -65:] = rng.standard_normal((1, 16, 2, 65))
    grad_output = bug_classes.sparse_zeros((1, 16, side, side), numpy.float16)
    grad_output[:, :, -2:, -65:] = rng.standard_normal((1, 16, 2, 65))
    weight = (rng.standard_normal((16, 16, 3, 3)) / 8).astype(numpy.float16)
    corner = [a[:, :, -2:, -65:] for a in (x, grad_output)]
    device = bug_classes.SparseDevice()
    out = on_emulator(device, cupyconv.conv2d, x, weight, padding=1, algorithm="implicit_gemm")
    want = expected_forward(corner[0], weight, None, padding=1)[0, -1, -1, 1:]
    bug_classes.assert_tail_written(out, want, numpy.float16, 64, "forward")
    (grad_x, _, _) = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, padding=1,
                                 needs="input", algorithm="implicit_gemm")
    want = expected_backward(corner[1], corner[0], weight, padding=1)[0][0, -1, -1, 1:]
    bug_classes.assert_tail_written(grad_x, want, numpy.float16, 64, "grad_input")
    assert [name.split(", ")[:2] for name in device.launches] == [
        [f"{kernel}<__half", "long long"] for kernel in ("conv_fwd_tc", "conv_bwd_input_tc")]


def test_planes_of_2_31_pixels_are_refused():
    """The kernels keep a plane's pixel index in int (`p` in conv_fwd_tc and conv_bwd_input_tc, TcWeightGrad::a,
    TcInputGrad::a's `oy * out_w + ox`): a 46341 x 46341 plane (2^31 + 4634 pixels) would give wrong results
    without an error, so the tensor cores refuse it and 'auto' picks another algorithm."""
    x = bug_classes.sparse_zeros((1, 16, 46341, 46341), numpy.float16)
    spec = conv_op.ConvSpec.for_conv("conv2d", x, numpy.empty((16, 16, 3, 3), numpy.float16), None, 1, 1, 1, 1)
    refusal = igemm.tensor_core_refusal(spec, numpy.float16, EmulatedDevice())
    assert refusal and "2147488281" in refusal
    assert conv_op.choose_algorithm(spec, numpy.float16, EmulatedDevice()) != "implicit_gemm"
    with pytest.raises(ValueError, match="conv2d: algorithm='implicit_gemm' cannot run: .*32 bits"):
        on_emulator(bug_classes.SparseDevice(), cupyconv.conv2d, x, numpy.ones((16, 16, 3, 3), numpy.float16),
                    padding=1, algorithm="implicit_gemm")


def test_kernel_reach_of_2_30_is_refused():
    """Rows past the end of C sit 2^30 pixels before the image, so that no tap reaches the image from there; a
    dilation that reaches that far (here 2^30 x 1 with as much padding: a legal one-pixel output) would make
    the forward read outside x for those rows and the input gradient's row arithmetic overflow.  The tensor
    cores refuse it, 'auto' picks another algorithm, and one pixel less reach runs on them."""
    rng = numpy.random.default_rng(29)
    x = rng.standard_normal((1, 16, 1, 1)).astype(numpy.float16)
    weight = rng.standard_normal((16, 16, 2, 1)).astype(numpy.float16)
    for reach, refused in ((2**30, True), (2**30 - 1, False)):
        kwargs = dict(padding=((reach, 0), (0, 0)), dilation=(reach, 1))
        spec = conv_op.ConvSpec.for_conv("conv2d", x, weight, None, 1, kwargs["padding"], (reach, 1), 1)
        assert (igemm.tensor_core_refusal(spec, numpy.float16, EmulatedDevice()) is not None) == refused
        # only tap (1, 0) lands on the image (y = (i - 1) * reach): the CPU path would pad 2^30 rows
        want = numpy.einsum("dc,nc->nd", weight[:, :, 1, 0].astype(numpy.float64),
                            x[:, :, 0, 0].astype(numpy.float64))[:, :, None, None]
        if refused:
            with pytest.raises(ValueError, match=r"implicit_gemm' cannot run: .*kernel reach.*1073741824"):
                on_emulator(EmulatedDevice(), cupyconv.conv2d, x, weight, algorithm="implicit_gemm", **kwargs)
        else:
            assert_close(on_emulator(EmulatedDevice(), cupyconv.conv2d, x, weight, algorithm="implicit_gemm",
                                     **kwargs), want, "float16")
        assert_close(on_emulator(EmulatedDevice(), cupyconv.conv2d, x, weight, **kwargs), want, "float16")


def test_strided_input_is_read_in_place():
    case = CASE_BY_NAME["tc_plain"]
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(3), numpy.float16)
    wide = numpy.random.default_rng(4).standard_normal((2, 16, 9, 14)).astype(numpy.float16)
    wide[..., ::2] = x
    strided = wide[..., ::2]  # every other column: x_stride_w = 2
    out = on_emulator(EmulatedDevice(), cupyconv.conv2d, strided, weight, bias, algorithm="implicit_gemm",
                      **case.kwargs)
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), "float16")


def weight_gradients(device) -> int:
    """Tensor-core weight gradients launched: conv_bwd_weight_tc, or conv_bwd_weight_igemm where a group's
    channels are whole 16-byte copies (float32 here: multiples of 4; tests/test_weight_igemm.py)."""
    return device.count("conv_bwd_weight_tc") + device.count("conv_bwd_weight_igemm")


def test_auto_picks_the_tensor_cores_where_they_apply():
    x, weight, bias, grad_output = CASE_BY_NAME["tc_plain"].inputs(numpy.random.default_rng(5), numpy.float16)
    for inputs, tf32, expected in (((x, weight, bias), False, True),
                                   ((x.astype(numpy.float32), weight.astype(numpy.float32), None), False, False),
                                   ((x.astype(numpy.float32), weight.astype(numpy.float32), None), True, True),
                                   ((x.astype(numpy.float64), weight.astype(numpy.float64), None), True, False),
                                   ((x[:, :8], weight[:, :8], None), False, False)):  # 8 channels: direct
        device = Recorder()
        with _device.use_device(device), settings.allow_tf32(tf32):
            cupyconv.conv2d(*inputs, padding=1)
            cupyconv.conv2d_backward(grad_output[:, :, :, :].astype(inputs[0].dtype), *inputs[:2], padding=1)
        for kernel in ("conv_fwd_tc", "conv_bwd_input_tc", "conv_bwd_weight"):
            count = weight_gradients(device) if kernel == "conv_bwd_weight" else device.count(kernel)
            assert (count == 1) == expected, (kernel, inputs[0].dtype, inputs[0].shape, tf32)


@pytest.mark.parametrize("dtype, channels, tf32, message", [
    (numpy.float64, 16, True, r"float16, bfloat16 and \(as TF32\) float32, not float64"),
    (numpy.float16, 8, False, "at least 16 input channels per group, not 8"),
])
def test_refusals_name_the_reason(dtype, channels, tf32, message):
    x = numpy.random.default_rng(6).standard_normal((1, channels, 5, 5)).astype(dtype)
    weight = numpy.random.default_rng(7).standard_normal((4, channels, 3, 3)).astype(dtype)
    with pytest.raises(ValueError, match=rf"conv2d: algorithm='implicit_gemm' cannot run: .*{message}"):
        with _device.use_device(EmulatedDevice()), settings.allow_tf32(tf32):
            cupyconv.conv2d(x, weight, algorithm="implicit_gemm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_conv2d_backward_matches_cpu_path(case, dtype):
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(8), DTYPES[dtype])
    device = Recorder()
    got = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                      **case.kwargs)
    assert device.count("conv_bwd_input_tc") == 1 and weight_gradients(device) == 1, device.launches
    want = expected_backward(grad_output, x, weight, **case.kwargs)
    for name, g, w in zip(("grad_input", "grad_weight", "grad_bias"), got, want):
        assert g.dtype == x.dtype and g.shape == w.shape, name
        assert_close(g, w, dtype, f"{case.name} {name}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_tile_and_split(dtype, monkeypatch):
    """TC_WIDE_ROWS 1: a 16-bit pass with over 32 columns takes the 128-row tile (float32 keeps 64 rows: its
    stages would not fit), one with at most 32 columns the 64 x 32 tile;
    TC_SPLIT_BLOCKS large and TC_SPLIT_CHUNKS 1: the weight gradient splits its 5 chunks of pixels in 5."""
    monkeypatch.setattr(igemm, "TC_WIDE_ROWS", 1)
    monkeypatch.setattr(igemm, "TC_SPLIT_BLOCKS", 10**6)
    monkeypatch.setattr(igemm, "TC_SPLIT_CHUNKS", 1)
    case = CASE_BY_NAME["tc_long_k_last_row_and_column"]   # 40 channels in and 9 out: 64- and 32-column tiles
    x, weight, bias, grad_output = case.inputs(numpy.random.default_rng(12), DTYPES[dtype])
    x, grad_output = numpy.concatenate([x] * 5), numpy.concatenate([grad_output] * 5)  # 150 pixels, 5 chunks
    device = Recorder()
    out = on_emulator(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    got = on_emulator(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                      **case.kwargs)
    rows = 64 if dtype == "float32" else 128
    tiles = [name.split(", ", 2)[2] for name in device.launches if "_tc<" in name]
    assert tiles == ["64, 32>", f"{rows}, 64>", "64, 32>"], device.launches
    assert igemm.plan_tensor_cores(conv_op.ConvSpec.for_conv("t", x, weight, None, **case.kwargs), x.dtype,
                                     "weight").splits == 5
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), dtype, "forward")
    for g, w in zip(got, expected_backward(grad_output, x, weight, **case.kwargs)):
        assert_close(g, w, dtype, "backward")


def test_weight_gradient_splits_within_the_workspace_limit():
    spec = conv_op.ConvSpec.for_conv("t", numpy.empty((64, 32, 56, 56), numpy.float16),
                                     numpy.empty((64, 32, 3, 3), numpy.float16), None, 1, 1, 1, 1)
    plan = igemm.plan_tensor_cores(spec, numpy.float16, "weight")
    assert plan.splits > 1 and plan.splits * plan.chunks_per_split * igemm.TC_CHUNK >= 64 * 56 * 56
    with settings.workspace_limit(3 * 64 * 288 * 4):   # room for three float32 slices of grad_weight
        assert igemm.plan_tensor_cores(spec, numpy.float16, "weight").splits == 3


def test_empty_batch_gives_zero_weight_gradient():
    x = numpy.zeros((0, 16, 5, 5), numpy.float16)
    weight = numpy.random.default_rng(13).standard_normal((20, 16, 3, 3)).astype(numpy.float16)
    grad_x, grad_w, _ = on_emulator(EmulatedDevice(), cupyconv.conv2d_backward, numpy.zeros((0, 20, 3, 3),
                                    numpy.float16), x, weight, algorithm="implicit_gemm")
    assert grad_x.shape == x.shape and (grad_w == 0).all() and grad_w.shape == weight.shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_patch_conv2d_backward(dtype):
    """(B, N, C, H, W) patches read in place through a transposed (B, C, N, H, W) array, as in the forward."""
    rng = numpy.random.default_rng(14)
    x = rng.standard_normal((2, 16, 37, 4, 4)).astype(DTYPES[dtype]).transpose(0, 2, 1, 3, 4)
    weight = rng.standard_normal((24, 16, 3, 3)).astype(DTYPES[dtype])
    grad_output = rng.standard_normal((2, 37, 24, 4, 4)).astype(DTYPES[dtype])
    device = Recorder()
    got = on_emulator(device, cupyconv.patch_conv2d_backward, grad_output, x, weight, padding=1)  # 'auto'
    assert device.count("conv_bwd_input_tc") == 1 and weight_gradients(device) == 1, device.launches
    want = expected_backward(grad_output.reshape(-1, 24, 4, 4), x.reshape(-1, 16, 4, 4), weight, padding=1)
    for name, g, w in zip(("grad_input", "grad_weight", "grad_bias"), got, want):
        assert_close(g, w.reshape(g.shape), dtype, f"patch {name}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_patch_conv2d_reads_transposed_patches_in_place(dtype):
    """(B, N, C, H, W) patches given as a transposed (B, C, N, H, W) array: the batch view's two strides."""
    rng = numpy.random.default_rng(9)
    stored = rng.standard_normal((2, 16, 37, 4, 4)).astype(DTYPES[dtype])  # (B, C, N, H, W)
    x = stored.transpose(0, 2, 1, 3, 4)                                      # (B, N, C, H, W), not a copy
    weight = rng.standard_normal((24, 16, 3, 3)).astype(DTYPES[dtype])
    bias = rng.standard_normal((24,)).astype(DTYPES[dtype])
    device = Recorder()
    out = on_emulator(device, cupyconv.patch_conv2d, x, weight, bias, padding=1)  # 'auto': the tensor cores
    assert device.count("conv_fwd_tc") == 1 and out.shape == (2, 37, 24, 4, 4)
    flat = x.reshape(-1, 16, 4, 4)
    want = expected_forward(flat, weight, bias, padding=1).reshape(out.shape)
    assert_close(out, want, dtype, "patch")


def test_clean_under_asan():
    """Reads past the weight, x or out (a tile edge not masked) abort the ASan build: the last output channel's
    weight row ends the buffer, and the last group's channels end x."""
    assert_clean_under_asan(pytest_under_asan(f"{__file__}::test_conv2d_forward_matches_cpu_path"))


# ---------------------------------------------------------------------------------------------------------
# On a real GPU (sm_80+): the same kernels against the CPU path


def on_gpu(fn, *arrays, **kwargs):
    import cupy
    result = fn(*(None if a is None else cupy.asarray(a) for a in arrays), **kwargs)
    return cupy.asnumpy(result)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gpu_conv2d_forward(case, dtype):
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(10), DTYPES[dtype])
    with settings.allow_tf32(True):
        out = on_gpu(cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    assert_close(out, expected_forward(x, weight, bias, **case.kwargs), dtype, case.name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_patch_conv2d_seed_like(dtype):
    rng = numpy.random.default_rng(11)
    x = rng.standard_normal((1, 2048, 32, 4, 4)).astype(DTYPES[dtype])
    weight = rng.standard_normal((64, 32, 3, 3)).astype(DTYPES[dtype])
    with settings.allow_tf32(True):
        out = on_gpu(cupyconv.patch_conv2d, x, weight, None, padding=1, algorithm="implicit_gemm")
    want = expected_forward(x.reshape(-1, 32, 4, 4), weight, None, padding=1).reshape(out.shape)
    assert_close(out, want, dtype, "patch seed-like")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gpu_conv2d_backward(case, dtype):
    import cupy
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(15), DTYPES[dtype])
    with settings.allow_tf32(True):
        got = cupyconv.conv2d_backward(*map(cupy.asarray, (grad_output, x, weight)), algorithm="implicit_gemm",
                                       **case.kwargs)
    for name, g, w in zip(("grad_input", "grad_weight", "grad_bias"), got,
                          expected_backward(grad_output, x, weight, **case.kwargs)):
        assert_close(cupy.asnumpy(g), w, dtype, f"{case.name} {name}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_patch_conv2d_backward_seed_like(dtype):
    """Long reductions: the weight gradient sums 32768 pixels in splits."""
    import cupy
    rng = numpy.random.default_rng(16)
    x = rng.standard_normal((1, 2048, 32, 4, 4)).astype(DTYPES[dtype])
    weight = rng.standard_normal((64, 32, 3, 3)).astype(DTYPES[dtype])
    grad_output = rng.standard_normal((1, 2048, 64, 4, 4)).astype(DTYPES[dtype])
    with settings.allow_tf32(True):
        got = cupyconv.patch_conv2d_backward(*map(cupy.asarray, (grad_output, x, weight)), padding=1,
                                             algorithm="implicit_gemm")
    want = expected_backward(grad_output.reshape(-1, 64, 4, 4), x.reshape(-1, 32, 4, 4), weight, padding=1)
    for name, g, w in zip(("grad_input", "grad_weight", "grad_bias"), got, want):
        assert_close(cupy.asnumpy(g), w.reshape(g.shape), dtype, f"patch seed-like {name}")
