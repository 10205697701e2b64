"""Small groups, several a block (raw_kernels/implicit_gemm.cu conv_fwd_igemm_groups and, for the weight gradient,
conv_bwd_weight_igemm_groups; cupyconv/ops/implicit_gemm.py `groups_igemm_refusal`, `plan_igemm_groups`,
`plan_weight_igemm_groups`) against the CPU path in float64, on the emulator.

A block covers 64 channels: 4 groups of 16 or 2 of 32 (in = out), one K chunk per tap, warp w on its group's
columns.  The emulator runs cp.async and ldmatrix with the hardware's rules (data lands at the wait, poison before;
16-byte alignment; whole warps) and fills every output with NaN before the kernel runs, so an unwritten element, a
swizzle that differs between the two sides, a warp on the wrong group's columns or an unmasked edge fails here.
float32 runs as TF32, 2 groups of 16 a block (32 floats); its groups of 32 stay on conv_fwd_igemm.
Problems are small and odd: group counts that do not fill the last block (5 of 16, 3 of 32), pixel counts that
are not a multiple of the 128-row tile nor of a vector (the NCHW epilogue's scalar stores) or are (its vector
stores), padding per side, stride and dilation per axis, 1 x 1 (fewer taps than pipeline stages), NCHW and
channels-last x (channels-last out).
"""
import numpy
import pytest
from optional_deps import BFLOAT16, Dtypes

import cupyconv
from cupyconv import _kernels
from cupyconv.ops import implicit_gemm as igemm
import bug_classes
from bug_classes import Recorder
from emulator import EmulatedDevice
from reference import ConvCase
from test_igemm_kernels import as64, assert_close, run   # the same checks as conv_fwd_igemm's tests

C = ConvCase
DTYPES = Dtypes({"float16": numpy.float16, "bfloat16": BFLOAT16, "float32": numpy.float32})

CASES = [
    # 5 groups of 16: two blocks, the second with one group (48 channels past the end); 2 x 9 x 7 = 126 pixels (a
    # partial tile; 63 an image: scalar stores); padding per side, stride and dilation per axis
    C("igg_16_partial_block", (2, 80, 11, 13), (80, 16, 3, 3), stride=(1, 2), padding=((2, 0), (1, 2)),
      dilation=(2, 1), groups=5),
    # 3 groups of 32: the second block half filled; stride (2, 1), dilation (1, 2), a 2 x 3 kernel
    C("igg_32_partial_block", (1, 96, 12, 9), (96, 32, 2, 3), stride=(2, 1), padding=((0, 1), (2, 2)),
      dilation=(1, 2), groups=3),
    # 4 groups of 16, 8 x 8 pixels an image: the NCHW vector stores; 3 images: 192 pixels, two row tiles; no bias
    C("igg_16_vector_stores", (3, 64, 8, 8), (64, 16, 3, 3), padding=1, groups=4, bias=False),
    # 2 groups of 32, 1 x 1: one tap, fewer than the pipeline's stages; 3 x 10 x 9 = 270 pixels, three row tiles
    C("igg_32_pointwise", (3, 64, 10, 9), (64, 32, 1, 1), groups=2),
    # 6 groups of 32 (three full blocks), 1 x 3
    C("igg_32_three_blocks", (1, 192, 5, 7), (192, 32, 1, 3), padding=(0, 1), groups=6),
]
# 8 channels a group (16-bit only; forward and stride-1 input gradient, the weight gradient stays on the direct
# kernel): 8 groups a block, a K chunk of two taps, each warp on two groups' columns.  Odd tap counts leave the
# last chunk's second tap past the end (zeros in A and B); groups that leave the last block part empty
CASES8 = [
    # 11 groups of 8: the second block with 3 of 8 groups; 3 x 3 (9 taps: 5 chunks, the last half zeros);
    # 2 x 9 x 7 = 126 pixels (a partial tile, scalar stores); padding per side, stride and dilation per axis
    C("igg_8_partial_block", (2, 88, 11, 13), (88, 8, 3, 3), stride=(1, 2), padding=((2, 0), (1, 2)),
      dilation=(2, 1), groups=11),
    # 8 groups of 8, 2 x 3 (6 taps: 3 whole chunks), stride (2, 1), dilation (1, 2); no bias
    C("igg_8_even_taps", (1, 64, 12, 9), (64, 8, 2, 3), stride=(2, 1), padding=((0, 1), (2, 2)),
      dilation=(1, 2), groups=8, bias=False),
    # 16 groups of 8, 8 x 8 pixels an image: the NCHW vector stores; 3 images: 192 pixels, two row tiles
    C("igg_8_vector_stores", (3, 128, 8, 8), (128, 8, 3, 3), padding=1, groups=16),
    # 3 groups of 8, 1 x 1: one chunk, its second tap past the end; 3 x 10 x 9 = 270 pixels, three row tiles
    C("igg_8_pointwise", (3, 24, 10, 9), (24, 8, 1, 1), groups=3),
]
CASE_BY_NAME = {case.name: case for case in CASES + CASES8}


def nhwc(a):
    """a (n, C, H, W) with the same values in channels-last memory, as torch's channels_last tensors lie."""
    return numpy.moveaxis(numpy.ascontiguousarray(numpy.moveaxis(a, 1, -1)), -1, 1)


def groups_kernel(case, dtype, index="int"):
    """The kernel the case's forward runs: conv_fwd_igemm_groups, or (float32 with groups of 32: one group would
    fill a block of 32 floats) conv_fwd_igemm's narrow tile, named up to its tile."""
    cg = case.weight[1]
    if cg not in igemm.IGG_FORWARD_CHANNELS[dtype]:
        return "conv_fwd_igemm<"
    return _kernels.kernel_name("conv_fwd_igemm_groups", dtype, index, *igemm.igemm_groups_tile(cg))


def launched(device):
    """The forward kernels launched, conv_fwd_igemm's cut to its prefix (its tile is not under test here)."""
    return [name if name.startswith("conv_fwd_igemm_groups<") else "conv_fwd_igemm<"
            for name in device.launches if name.startswith("conv_fwd_igemm")]


def forward_cases():
    """(case, dtype) of the forward tests: every case in every dtype, those of 8 channels a group in 16 bits."""
    return [(case, dtype) for case in CASES for dtype in DTYPES] + [
        (case, dtype) for case in CASES8 for dtype in DTYPES if dtype != "float32"]


@pytest.mark.parametrize("case, dtype", forward_cases(), ids=str)
def test_forward_matches_cpu_path(case, dtype):
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(0), DTYPES[dtype])
    want = cupyconv.conv2d(*as64(x, weight, bias), **case.kwargs)
    for order in ("forward", "reverse"):
        device = Recorder(order)
        out = run(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
        assert launched(device) == [groups_kernel(case, dtype)], device.launches
        assert out.dtype == x.dtype and out.shape == case.output_shape and out.flags.c_contiguous
        assert_close(out, want, dtype, f"{case.name} {order}")


@pytest.mark.parametrize("case, dtype", forward_cases(), ids=str)
def test_channels_last_input_gives_channels_last_output(case, dtype):
    """x in channels-last memory, read in place: out channels-last too, a pixel's 64 channels of a block written as
    8 vectors (the last block's past the end not at all)."""
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(1), DTYPES[dtype])
    want = cupyconv.conv2d(*as64(x, weight, bias), **case.kwargs)
    for order in ("forward", "reverse"):
        device = Recorder(order)
        out = run(device, cupyconv.conv2d, nhwc(x), weight, bias, algorithm="implicit_gemm", **case.kwargs)
        assert igemm.is_channels_last(out) and out.shape == case.output_shape, out.strides
        assert launched(device) == [groups_kernel(case, dtype)], device.launches
        # the weight's (a view for 1 x 1 16-bit); x in place (float32: rounded to tf32 in a copy, the weight too)
        copies = 2 if dtype == "float32" else int(case.weight[2:] != (1, 1))
        assert device.copies() == [[], ["channels_last_copy"], ["channels_last_copies"]][copies], device.launches
        assert_close(out, want, dtype, f"{case.name} {order}")


@pytest.mark.parametrize("case, dtype", forward_cases(), ids=str)
def test_input_gradient_at_stride_1(case, dtype):
    """grad_input at stride 1 is the forward of the transposed problem (C / G and D / G swap: still equal), so it runs
    on the same kernel; dilation and padding that crops included."""
    case = C(case.name, case.x, case.weight, stride=1, padding=case.padding, dilation=case.dilation,
             groups=case.groups)
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(2), DTYPES[dtype])
    device = Recorder("reverse")
    got = run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm", needs=("input",),
              **case.kwargs)[0]
    assert launched(device) == [groups_kernel(case, dtype)], device.launches
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=("input",), **case.kwargs)[0]
    assert_close(got, want, dtype, case.name)


@pytest.mark.parametrize("name", ["igg_16_partial_block", "igg_8_partial_block"])
def test_64_bit_index_variant(monkeypatch, name):
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    case = CASE_BY_NAME[name]
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(3), numpy.float16)
    device = Recorder()
    out = run(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    assert device.launches[-1] == groups_kernel(case, "float16", "long long"), device.launches
    assert_close(out, cupyconv.conv2d(*as64(x, weight, bias), **case.kwargs), "float16")


@pytest.mark.parametrize("g", [4, 8])
def test_offsets_past_2_32(g):
    """Channels-last x (1, 8200, 8200, 64) over sparse memory: its last pixels lie 4.30e9 elements in, past 2^32
    (an unsigned 32-bit offset would wrap silently).  1 x 1 (the weight in place: the sparse device runs only the
    last block of every launch, and a weight copy would be left unwritten): the last block, 64 pixels (a partial
    tile) x the 64 channels of 4 groups of 16 (8 of 8), against the CPU path on those pixels."""
    rng = numpy.random.default_rng(5)
    side, c = 8200, 64
    x_cl = bug_classes.sparse_zeros((1, side, side, c), numpy.float16)
    x_cl[0, -1, -64:] = rng.standard_normal((64, c))
    x = x_cl.transpose(0, 3, 1, 2)
    weight = (rng.standard_normal((c, c // g, 1, 1)) / 4).astype(numpy.float16)
    bias = rng.standard_normal(c).astype(numpy.float16)
    device = bug_classes.SparseDevice(tail=64 * c)
    out = run(device, cupyconv.conv2d, x, weight, bias, groups=g, algorithm="implicit_gemm")
    assert device.launches == [f"conv_fwd_igemm_groups<__half, long long, 128, {c // g}, 3>"], device.launches
    corner = numpy.asarray(x[:, :, -1:, -64:], numpy.float64)
    want = cupyconv.conv2d(corner, *as64(weight, bias), groups=g)   # (1, 64, 1, 64)
    assert igemm.is_channels_last(out)
    bug_classes.assert_tail_written(out.transpose(0, 2, 3, 1), want.transpose(0, 2, 3, 1), numpy.float16, 64 * c,
                                    "forward")


@pytest.mark.parametrize("kernel", [(1, 1), (3, 3)])
def test_tap_past_the_last_reads_nothing(kernel):
    """8 channels a group, an odd tap count: the last chunk's second tap (one row below the last real tap: 1 x 1's
    tap 1, 3 x 3's tap 9) must be zeros in A as well as in B, or an inf there makes 0 x inf = NaN in outputs whose
    window never reaches it.  x is inf on its last row; the outputs whose window stays above it must be finite and
    match the CPU path."""
    rng = numpy.random.default_rng(7)
    pad = kernel[0] // 2
    x = rng.standard_normal((2, 64, 7, 9)).astype(numpy.float16)
    x[:, :, -1, :] = numpy.inf
    weight = (rng.standard_normal((64, 8, *kernel)) / 4).astype(numpy.float16)
    device = Recorder()
    out = run(device, cupyconv.conv2d, x, weight, None, padding=pad, groups=8, algorithm="implicit_gemm")
    assert launched(device) == [_kernels.kernel_name("conv_fwd_igemm_groups", "float16", "int", 128, 8, 3)]
    clean = 7 - 1 - (kernel[0] - 1 - pad)   # output rows whose window ends above the inf row
    want = cupyconv.conv2d(*as64(x[:, :, :-1], weight), padding=pad, groups=8)[:, :, :clean]
    assert numpy.isfinite(numpy.asarray(out[:, :, :clean], numpy.float64)).all()
    assert_close(out[:, :, :clean], want, "float16", f"{kernel} above the inf row")


def test_eligibility_and_plan():
    """Groups of 16 or 32 channels in and out (float32: 16), at least two groups; a grid of 128-pixel row tiles by
    blocks of 128 bytes of channels; no split of K."""
    def spec(channels, outputs, groups, size=14, images=32, kernel=3):
        return cupyconv.ops.conv.ConvSpec.for_conv(
            "t", numpy.empty((images, channels * groups, size, size)),
            numpy.empty((outputs * groups, channels, kernel, kernel)), None, stride=1, padding=1, dilation=1,
            groups=groups)
    assert igemm.groups_igemm_refusal(spec(16, 16, 32), numpy.float16) is None
    assert igemm.groups_igemm_refusal(spec(32, 32, 3), DTYPES["bfloat16"]) is None
    assert igemm.groups_igemm_refusal(spec(16, 16, 32), numpy.float32) is None
    assert "groups of 16 channels in float32" in igemm.groups_igemm_refusal(spec(32, 32, 4), numpy.float32)
    assert igemm.groups_igemm_refusal(spec(8, 8, 32, size=28), DTYPES["bfloat16"]) is None
    assert "groups of 16 channels in float32" in igemm.groups_igemm_refusal(spec(8, 8, 8), numpy.float32)
    for channels, outputs, groups in ((16, 16, 1), (24, 24, 4), (64, 64, 2), (4, 4, 8)):
        assert "groups of 8, 16 or 32" in igemm.groups_igemm_refusal(spec(channels, outputs, groups), numpy.float16)
    assert "as many output channels" in igemm.groups_igemm_refusal(spec(16, 32, 4), numpy.float16)
    assert "as many output channels" in igemm.groups_igemm_refusal(spec(8, 16, 4), numpy.float16)
    # the weight gradient's kernel: 16 or 32 only
    assert "groups of 16 or 32" in igemm.groups_igemm_refusal(spec(8, 8, 8), numpy.float16, igemm.IGG_GROUP_CHANNELS)
    rx256 = igemm.plan_igemm_groups(spec(8, 8, 32, size=28), numpy.float16)   # 25088 pixels, 256 channels
    # 3 stages of two taps of (128 + 8) rows; 9 taps in 5 chunks
    assert rx256.tile == (128, 8, 3) and rx256.grid == (196, 4, 1) and rx256.shared_mem == 3 * 2 * 136 * 128
    assert rx256.chunks_per_split == 5
    rx512 = igemm.plan_igemm_groups(spec(16, 16, 32), numpy.float16)   # 6272 pixels, 512 channels
    assert rx512.tile == (128, 16, 3) and rx512.grid == (49, 8, 1) and rx512.splits == 1
    rx1024 = igemm.plan_igemm_groups(spec(32, 32, 32, size=7), numpy.float16)   # 1568 pixels, 1024 channels
    assert rx1024.tile == (128, 32, 3) and rx1024.grid == (13, 16, 1)
    # 3 stages of (128 + 32) rows of 128 bytes; the epilogue's tiles (17 and 18 KiB) fit in them
    assert rx1024.shared_mem == 3 * 160 * 128 and rx512.shared_mem == 3 * 144 * 128
    assert rx512.chunks_per_split == 9   # a tap a chunk
    assert igemm.plan_igemm_groups(spec(16, 16, 5), numpy.float16).grid[1] == 2   # 80 channels: a partial block
    tf32 = igemm.plan_igemm_groups(spec(16, 16, 32), numpy.float32)   # 32 floats a block: 2 groups
    assert tf32.grid == (49, 16, 1) and tf32.shared_mem == 3 * 144 * 128


def test_few_channels_reach_the_tensor_cores_for_forward_and_stride_1_input_gradient():
    """8 channels a group of a 16-bit type in and out: 'implicit_gemm' runs conv_fwd_igemm_groups for the forward and
    the stride-1 input gradient, and 'auto' takes it from IGG_FEW_MIN_MACS multiply-adds (rx-256 from a batch of 77;
    at 32 the channels-last copy's launch costs more wall time than the kernel saves); the weight gradient, strided
    input gradients, float32, 4 channels a group, unequal groups and 3-D keep the old rule (at least
    TC_MIN_CHANNELS: the direct kernels or im2col)."""
    from cupyconv.ops import conv
    device = EmulatedDevice()

    def spec(channels, outputs, groups, stride=1, dims=2, batch=2, size=9):
        def shaped(*shape):   # (no memory: the spec reads shapes only)
            return numpy.broadcast_to(numpy.empty(1, numpy.float16), shape)
        return conv.ConvSpec.for_conv("t", shaped(batch, channels * groups, *(size,) * dims),
                                      shaped(outputs * groups, channels, *(3,) * dims), None, stride=stride,
                                      padding=1, dilation=1, groups=groups, nd=dims)
    fp16 = numpy.float16
    rx32, rx80 = spec(8, 8, 32, batch=32, size=28), spec(8, 8, 32, batch=80, size=28)
    assert igemm.few_channels_preferred(rx80) and not igemm.few_channels_preferred(rx32)
    assert not igemm.few_channels_preferred(spec(8, 8, 32, batch=76, size=28))
    for pass_ in ("forward", "input"):
        assert igemm.tensor_core_refusal(rx32, fp16, device, pass_) is None
        assert conv.choose_algorithm(rx32, fp16, device, pass_) == "direct"
        assert conv.choose_algorithm(rx80, fp16, device, pass_) == "implicit_gemm"
    assert "implicit_gemm" in conv.forward_candidates(rx32, fp16, device)   # (autotune may take it)
    assert conv.choose_algorithm(rx80, fp16, device, "weight") == "direct"
    assert "at least 16 input channels" in igemm.tensor_core_refusal(rx80, fp16, device)
    assert "at least 16 input channels" in igemm.tensor_core_refusal(rx80, fp16, device, "weight")
    strided = spec(8, 8, 32, stride=2)
    assert "at least 16 input channels" in igemm.tensor_core_refusal(strided, fp16, device, "input")
    assert igemm.tensor_core_refusal(strided, fp16, device, "forward") is None
    allow_tf32 = cupyconv.settings.get_allow_tf32()
    try:
        cupyconv.settings.set_allow_tf32(True)
        assert "at least 16" in igemm.tensor_core_refusal(rx80, numpy.float32, device, "forward")
    finally:
        cupyconv.settings.set_allow_tf32(allow_tf32)
    for refused in (spec(4, 4, 32), spec(8, 16, 8), spec(8, 8, 8, dims=3)):
        assert "at least 16 input channels" in igemm.tensor_core_refusal(refused, fp16, device, "forward")


# --- the weight gradient: conv_bwd_weight_igemm_groups ----------------------------------------------------------
# The same problems: tap counts odd and even (the second tap of a block past the last: 1 x 1, 1 x 3, 3 x 3) and 2 x 3,
# pixel counts that leave a chunk (32 pixels; TF32 16) short, groups past the end of a block, stride, dilation and
# padding per axis, NCHW and channels-last x, split in chunks of 1 or 2 (the last split short), blocks in both
# orders; partial sums poisoned by the emulator before the kernel runs (an unwritten one is NaN).

def weight_kernel(case, dtype, index="int"):
    """The kernel the case's weight gradient runs: conv_bwd_weight_igemm_groups, or (float32 with groups of 32)
    conv_bwd_weight_igemm, named up to its tile."""
    cg = case.weight[1]
    if cg not in igemm.IGG_GROUP_CHANNELS[dtype]:
        return "conv_bwd_weight_igemm<"
    return _kernels.kernel_name("conv_bwd_weight_igemm_groups", dtype, index, cg)


def weight_launched(device):
    return [name if name.startswith("conv_bwd_weight_igemm_groups<") else name.split("<")[0] + "<"
            for name in device.launches if name.startswith("conv_bwd_weight")]


def weight_backward(device, case, dtype, seed, x_layout="contiguous"):
    """(grad_weight, grad_bias) on device and the CPU path's in float64 (grad_bias None for a case without)."""
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(seed), DTYPES[dtype])
    if x_layout == "channels_last":
        x = nhwc(x)
    needs = ("weight", "bias") if case.bias else ("weight",)
    got = run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm", needs=needs,
              **case.kwargs)
    want = cupyconv.conv2d_backward(*as64(grad_output, x, weight), needs=needs, **case.kwargs)
    return got[1:], want[1:]


def split_chunks(monkeypatch, chunks):
    """The planner splits the pixels into `chunks` chunks each (the last split short)."""
    monkeypatch.setattr(igemm, "TC_SPLIT_BLOCKS", 10**6)
    monkeypatch.setattr(igemm, "TC_SPLIT_CHUNKS", chunks)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("x_layout, chunks", [("contiguous", 2), ("channels_last", 1)])
def test_weight_gradient_matches_cpu_path(monkeypatch, case, dtype, x_layout, chunks):
    split_chunks(monkeypatch, chunks)
    device = Recorder("reverse" if chunks == 1 else "forward")
    (grad_w, grad_b), (want_w, want_b) = weight_backward(device, case, dtype, seed=21, x_layout=x_layout)
    assert weight_launched(device) == [weight_kernel(case, dtype)], device.launches   # splits finished in it
    assert "conv_bgrad" not in "".join(device.launches)   # the bias came with the weight
    assert grad_w.dtype == x_dtype(dtype) and grad_w.shape == case.weight
    assert_close(grad_w, want_w, dtype, f"{case.name} grad_weight")
    if case.bias:
        assert_close(grad_b, want_b, dtype, f"{case.name} grad_bias")


def x_dtype(dtype):
    return numpy.dtype(DTYPES[dtype])


def weight_spec(case):
    return cupyconv.ops.conv.ConvSpec.for_conv("t", numpy.empty(case.x, numpy.float16), numpy.empty(case.weight),
                                               None, **case.kwargs)


def test_weight_gradient_splits():
    """The sweep's split counts are real: chunks of 32 pixels (TF32 16) split by 1 and 2 give several splits, the
    last chunk short; by default a problem this small is one split."""
    case = CASE_BY_NAME["igg_16_partial_block"]   # 126 pixels: 4 chunks of 32 (the last 30), 8 of 16
    spec = weight_spec(case)
    assert igemm.plan_weight_igemm_groups(spec, numpy.float16).grid == (5, 2, 1)   # 9 taps: 5 blocks of 2
    assert igemm.plan_weight_igemm_groups(spec, numpy.float32).grid == (5, 3, 1)   # 80 channels: 3 blocks of 32
    with pytest.MonkeyPatch.context() as m:
        split_chunks(m, 2)
        assert igemm.plan_weight_igemm_groups(spec, numpy.float16).grid[2] == 2
        assert igemm.plan_weight_igemm_groups(spec, numpy.float32).grid[2] == 4
        split_chunks(m, 3)   # 8 TF32 chunks: 2 splits of 4
        assert igemm.plan_weight_igemm_groups(spec, numpy.float32).chunks_per_split == 4


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_weight_gradient_bits_whatever_the_block_order(monkeypatch, dtype):
    """Several splits, blocks in forward and reverse order: the same grad_weight and grad_bias bits."""
    split_chunks(monkeypatch, 1)
    case = CASE_BY_NAME["igg_16_partial_block"]
    runs = []
    for order in ("forward", "reverse", "forward"):
        (gw, gb), _ = weight_backward(Recorder(order), case, dtype, seed=22)
        runs.append((gw.tobytes(), gb.tobytes()))
    assert runs[1] == runs[0] and runs[2] == runs[0]


def test_weight_gradient_64_bit_index_variant(monkeypatch):
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    split_chunks(monkeypatch, 1)
    case = CASE_BY_NAME["igg_32_partial_block"]
    device = Recorder()
    (grad_w, grad_b), (want_w, want_b) = weight_backward(device, case, "float16", seed=23)
    assert weight_kernel(case, "float16", "long long") in device.launches, device.launches
    assert_close(grad_w, want_w, "float16", "grad_weight")
    assert_close(grad_b, want_b, "float16", "grad_bias")


def test_weight_gradient_tf32_bias_keeps_float_precision():
    """TF32: the bias sums grad_output's tf32 part and its remainder's (staged beside it by the blocks of the first
    taps): about float's precision, where tf32 alone misses by ~1e-4 of the largest value."""
    case = CASE_BY_NAME["igg_16_partial_block"]
    (_, grad_b), (_, want_b) = weight_backward(Recorder(), case, "float32", seed=24)
    assert float(numpy.abs(numpy.asarray(grad_b, numpy.float64) - want_b).max()) <= 1e-6 * float(numpy.abs(want_b).max())


def test_weight_gradient_offsets_past_2_32(monkeypatch):
    """Channels-last x and grad_output (1, 8200, 8200, 64) over sparse memory, a 2 x 1 kernel padded 1 on top (taps
    dy = -1 and 0, one block of both), 4 groups of 16, no bias: the last pixels lie 4.30e9 elements in, past 2^32
    (an unsigned 32-bit offset would wrap silently, and a 32-bit tap offset of dy = -1 would add 2^32 - a row).
    Split into as many splits as the grid takes (63675 of 33 chunks): the sparse device runs the last block of each
    launch, the last split's, whose sums (its partial slice, the device's poisoned tail) the final pass's last block
    adds to the other splits' zeros: grad_weight's last 256 elements against float64 sums over that split's pixels."""
    monkeypatch.setattr(igemm, "TC_SPLIT_BLOCKS", 10**6)
    rng = numpy.random.default_rng(25)
    side, c, g, cg, run_ = 8200, 64, 4, 16, 2000
    x_cl = bug_classes.sparse_zeros((1, side, side, c), numpy.float16)
    gy_cl = bug_classes.sparse_zeros((1, side, side, c), numpy.float16)
    x_cl[0, -2:, -run_:] = rng.standard_normal((2, run_, c))   # the last two rows: the taps' rows of the last pixels
    gy_cl[0, -1, -run_:] = rng.standard_normal((run_, c)) / 8
    x, gy = x_cl.transpose(0, 3, 1, 2), gy_cl.transpose(0, 3, 1, 2)
    weight = numpy.zeros((c, cg, 2, 1), numpy.float16)
    kwargs = dict(stride=1, padding=((1, 0), (0, 0)), dilation=1, groups=g)
    spec = cupyconv.ops.conv.ConvSpec.for_conv("t", x, weight, None, **kwargs)
    with cupyconv.settings.workspace_limit(2**40):
        plan = igemm.plan_weight_igemm_groups(spec, numpy.float16)
        first = (plan.splits - 1) * plan.chunks_per_split * igemm.WG_CHUNK["float16"]   # the last split's pixel
        assert plan.grid[:2] == (1, 1) and plan.splits > 60000 and side * side - first < run_
        device = bug_classes.SparseDevice(tail=c * cg * 2)
        grad_w = run(device, cupyconv.conv2d_backward, gy, x, weight, algorithm="implicit_gemm", needs=("weight",),
                     **kwargs)[1]
    assert device.launches[0] == "conv_bwd_weight_igemm_groups<__half, long long, 16>", device.launches
    pixels = side * side - first   # all in the last row: tap ky reads row side - 2 + ky of x, the same columns
    gys = numpy.asarray(gy_cl[0, -1, -pixels:], numpy.float64).reshape(-1, g, cg)
    want = numpy.stack([numpy.einsum("pgd,pgc->gdc", gys, numpy.asarray(x_cl[0, row, -pixels:], numpy.float64)
                                     .reshape(-1, g, cg)) for row in (-2, -1)], axis=-1).reshape(c, cg, 2, 1)
    bug_classes.assert_tail_written(grad_w.reshape(-1), want.reshape(-1)[-256:], numpy.float16, 256, "grad_weight")
