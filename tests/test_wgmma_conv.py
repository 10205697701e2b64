"""conv_fwd_wgmma (raw_kernels/wgmma_conv.cu, cupyconv/ops/wgmma_gemm.py): the 16-bit and TF32 forward on wgmma, on the
emulator (its wgmma stand-in, tests/emulator/include/emu_wgmma.h, with the hardware's rules: a missing fence,
proxy fence or wait, an operand stage refilled while a wgmma reads it, a swizzle off its pattern fail the launch)
against NumPy in float64, and its routing.

The emulated device claims wgmma only where a test sets `device.wgmma` (every other test keeps the mma.sync
kernels it checks).  Each result must lie within one rounding of the exact convolution: |out - exact| at most
one unit in the last place of T at |exact| plus the float32 sums' own error bound (K roundings of float32 on the
sum of |products|), so a wrong tap, channel, row, column or bias fails, and so does a sum taken in T.  float32 runs
as TF32: exact is the convolution of x and the weight rounded to tf32 (nearest, ties away: the copy's one
rounding), so operands read unrounded or truncated fail too (their error is some 2^-11 of each product).
"""
import re

import numpy
import pytest
from optional_deps import BFLOAT16, Dtypes

import cupyconv
from bug_classes import Recorder
from cupyconv import _device, settings
from cupyconv._spec import ConvSpec
from cupyconv.ops import wgmma_gemm as wg
from reference import ConvCase
from test_igemm_kernels import tf32

C = ConvCase
DTYPES = Dtypes({"float16": numpy.float16, "bfloat16": BFLOAT16, "float32": numpy.float32})   # float32: TF32
MANTISSA = {"float16": 10, "bfloat16": 7, "float32": 23}

CASES = [
    # M = 126 (not a multiple of 128), K = 9 x 16 = 144 (chunks of 64 straddle taps), D 20 (a part column tile),
    # 63 pixels an image: the scalar stores
    C("wg_plain", (2, 16, 9, 7), (20, 16, 3, 3), padding=1),
    # 24 channels a group: chunks straddle taps mid-vector-row; stride and dilation per axis, each side padded
    # differently, groups 2
    C("wg_groups_stride_dilation", (1, 48, 11, 10), (24, 24, 3, 2), stride=(2, 1), padding=((2, 0), (1, 3)),
      dilation=(1, 2), groups=2),
    # 8 x 8 pixels an image: the 16-byte stores; 5 images: M = 320 (two row tiles of 256, the second a quarter
    # full: the second warpgroup's 128 pixels past M); no bias
    C("wg_vector_stores", (5, 40, 8, 8), (36, 40, 3, 3), padding=1, bias=False),
    # 136 output channels: the 128-column tile, two column tiles (the second 8 wide); 1 x 1, K = 72 (two chunks,
    # the second 8 wide); odd N H W = 3 x 5 x 11
    C("wg_wide_pointwise", (3, 72, 5, 11), (136, 72, 1, 1)),
    # a long K (5 x 5 x 64 = 1600: 25 chunks, every stage refilled several times), odd M = 7 x 9
    C("wg_long_k", (1, 64, 7, 9), (72, 64, 5, 5), padding=2),
]


def run(device, fn, *args, **kwargs):
    with _device.use_device(device), settings.allow_tf32(True):
        return fn(*args, **kwargs)


def wgmma_device(order="forward"):
    device = Recorder(order)
    device.wgmma = True
    return device


def ulp(values, dtype: str):
    """The spacing of dtype's numbers at |values| (normal range; the subnormal spacing below it)."""
    exponent = numpy.floor(numpy.log2(numpy.maximum(numpy.abs(values), 2.0**-14)))
    return 2.0 ** (exponent - MANTISSA[dtype])


def assert_one_rounding(got, x, weight, bias, case, dtype):
    if dtype == "float32":   # the tensor cores' operands: rounded to tf32 once
        x, weight = tf32(x), tf32(weight)
    x64, w64 = numpy.asarray(x, numpy.float64), numpy.asarray(weight, numpy.float64)
    b64 = None if bias is None else numpy.asarray(bias, numpy.float64)
    exact = numpy.asarray(cupyconv.conv2d(x64, w64, b64, **case.kwargs))
    magnitude = numpy.asarray(cupyconv.conv2d(numpy.abs(x64), numpy.abs(w64), None if b64 is None else
                                              numpy.abs(b64), **case.kwargs))
    k = w64[0].size
    bound = ulp(exact, dtype) + (k + 1) * 2.0**-24 * magnitude
    err = numpy.abs(numpy.asarray(got, numpy.float64) - exact)   # NaN (never written, poison) fails too
    assert (err <= bound).all(), f"{case.name}: {int((~(err <= bound)).sum())} of {err.size} off, max {err.max():.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_within_one_rounding(case, dtype):
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(1), DTYPES[dtype])
    device = wgmma_device("reverse" if case.name.endswith("stores") else "forward")
    spec = ConvSpec.for_conv("conv2d", x, weight, bias, **case.kwargs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wg, "wgmma_preferred", lambda spec, dtype: True)   # the small problems: on wgmma all the same
        out = run(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
        tile = wg.wgmma_tile(spec, x.dtype)
    assert device.count("conv_fwd_wgmma") == 1 and device.count("conv_fwd_igemm") == 0, device.launches
    wide = spec.outputs_per_group > 64 and dtype != "float32"   # (TF32: the 64-column tile only)
    assert device.launches[-1].endswith(f", {tile[1]}, 4>") and (tile[1] == 128) == wide
    assert out.dtype == x.dtype and out.shape == case.output_shape
    assert_one_rounding(out, x, weight, bias, case, dtype)


@pytest.mark.parametrize("dtype", ("float16", "float32"))
def test_input_gradient_at_stride_1_runs_it(dtype):
    """grad_input at stride 1 is the forward of the transposed window (ops/implicit_gemm.py): on wgmma too."""
    case = C("wg_grad_input", (2, 24, 9, 8), (16, 24, 3, 3), padding=1)
    x, weight, _, grad_output = case.inputs(numpy.random.default_rng(2), DTYPES[dtype])
    device = wgmma_device()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wg, "wgmma_preferred", lambda spec, dtype: True)
        got = run(device, cupyconv.conv2d_backward, grad_output, x, weight, algorithm="implicit_gemm",
                  needs=("input",), **case.kwargs)[0]
    assert device.count("conv_fwd_wgmma") == 1 and device.count("conv_fwd_igemm") == 0, device.launches
    # the transposed window's forward: weight (C, flipped taps, D), grad_output its input
    flipped = numpy.ascontiguousarray(weight.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
    assert_one_rounding(got, grad_output, flipped, None, C("t", grad_output.shape, flipped.shape, padding=1),
                        dtype)


def test_float32_operands_are_rounded_to_tf32():
    """conv_implicit_gemm's test on wgmma: operands 1 + 3 * 2^-12, rounded (not truncated) to tf32 once by the
    copy, read whole by the tensor cores: 16 (1 + 2^-10)^2 (truncated: 16)."""
    value = numpy.float32(1 + 3 * 2.0**-12)
    x = numpy.full((1, 16, 4, 4), value, numpy.float32)
    weight = numpy.full((3, 16, 1, 1), value, numpy.float32)
    device = wgmma_device()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wg, "wgmma_preferred", lambda spec, dtype: True)
        out = run(device, cupyconv.conv2d, x, weight, algorithm="implicit_gemm")
    assert device.count("conv_fwd_wgmma") == 1
    assert (out == numpy.float32(16 * (1 + 2.0**-10) ** 2)).all(), numpy.unique(out)


# ---------------------------------------------------------------------------------------------------------
# Routing


def spec_of(n, c, d, hw, k=3, groups=1):
    x = numpy.empty((n, c, hw, hw))
    w = numpy.empty((d, c // groups, k, k))
    return ConvSpec.for_conv("conv2d", x, w, None, 1, k // 2, 1, groups)


def test_the_fewest_instantiations():
    assert wg.instantiations() == ["conv_fwd_wgmma<__half, int, 128, 128, 4>", "conv_fwd_wgmma<__half, int, 256, 64, 4>",
                                   "conv_fwd_wgmma<__nv_bfloat16, int, 128, 128, 4>",
                                   "conv_fwd_wgmma<__nv_bfloat16, int, 256, 64, 4>",
                                   "conv_fwd_wgmma<float, int, 256, 64, 4>"]


def test_refusals():
    spec = spec_of(2, 16, 16, 8)
    assert wg.wgmma_refusal(spec, numpy.float16, 10, 10, 10, False) is None
    assert wg.wgmma_refusal(spec, numpy.float32, 10, 10, 10, False) is None
    assert "float64" in wg.wgmma_refusal(spec, numpy.float64, 10, 10, 10, False)
    assert "multiples of 4" in wg.wgmma_refusal(spec_of(2, 6, 16, 8), numpy.float32, 10, 10, 10, False)
    assert wg.wgmma_refusal(spec_of(2, 12, 16, 8), numpy.float32, 10, 10, 10, False) is None
    assert "NCHW" in wg.wgmma_refusal(spec, numpy.float16, 10, 10, 10, True)
    assert "32-bit" in wg.wgmma_refusal(spec, numpy.float16, 2**31, 10, 10, False)
    assert "multiples of 8" in wg.wgmma_refusal(spec_of(2, 12, 16, 8), numpy.float16, 10, 10, 10, False)


def test_routing_where_the_model_ranks_it_faster():
    """The shapes of benchmarks/RESULTS.md's "conv_fwd_wgmma" and "TF32 on wgmma" (PREDICTED H100): r50-64 (392
    blocks of 256 x 64 since "The wgmma forward transposed", 16-bit and TF32) and g2-256 (two groups of 128, 16-bit) go to wgmma; r50-128 (196 blocks of
    128 x 128), r50-512 (13 x 4) and 32 channels a group (p-seed's input gradient: half a 64-column tile) stay on
    conv_fwd_igemm; TF32 has the 64-column tile only, so more than 64 channels a group stay there too."""
    f16, f32 = numpy.float16, numpy.float32
    for dtype in (f16, f32):
        assert wg.wgmma_preferred(spec_of(32, 64, 64, 56), dtype)
        assert not wg.wgmma_preferred(spec_of(32, 128, 128, 28), dtype)
        assert not wg.wgmma_preferred(spec_of(32, 512, 512, 7), dtype)
        assert not wg.wgmma_preferred(spec_of(256, 64, 32, 56), dtype)    # 32 output channels: half the tile
        assert wg.wgmma_preferred(spec_of(256, 64, 40, 56), dtype)
    assert wg.wgmma_preferred(spec_of(32, 256, 256, 28, groups=2), f16)
    assert wg.wgmma_tile(spec_of(32, 256, 256, 28, groups=2), f16)[1] == 128
    assert wg.wgmma_preferred(spec_of(64, 128, 128, 28), f16)      # 392 blocks of 128 x 128
    assert wg.wgmma_tile(spec_of(32, 256, 256, 28, groups=2), f32)[1] == 64
    assert not wg.wgmma_preferred(spec_of(32, 256, 256, 28, groups=2), f32)   # two 64-column tiles a group
    assert not wg.wgmma_preferred(spec_of(64, 128, 128, 28), f32)


def test_only_a_wgmma_device_takes_it():
    """A device without wgmma (the emulator by default, a GPU other than 9.0) keeps conv_fwd_igemm."""
    case = CASES[0]
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(0), numpy.float16)
    device = Recorder("forward")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wg, "wgmma_preferred", lambda spec, dtype: True)
        run(device, cupyconv.conv2d, x, weight, bias, algorithm="implicit_gemm", **case.kwargs)
    assert device.count("conv_fwd_wgmma") == 0 and device.count("conv_fwd_igemm") == 1


@pytest.mark.parametrize("opt_in, claims", [(None, False), ("0", False), ("1", True)])
def test_cuda_device_claims_wgmma_on_9_0_only_and_only_opted_in(monkeypatch, opt_in, claims):
    """sm_90a binaries run on compute capability 9.0 only (not 8.x, not 10.0 or 12.0); and until a GPU run has
    verified conv_fwd_wgmma, only with CUPYCONV_WGMMA=1 (which benchmarks.gpu_check sets for its steps)."""
    class Fake(_device.CudaDevice):
        def __init__(self, capability):
            self.capability = capability

        @property
        def compute_capability(self):
            return self.capability

    if opt_in is None:
        monkeypatch.delenv(_device.WGMMA_ENV, raising=False)
    else:
        monkeypatch.setenv(_device.WGMMA_ENV, opt_in)
    assert Fake(90).wgmma is claims and not any(Fake(c).wgmma for c in (80, 89, 100, 120))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gpu_forward_within_one_rounding(case, dtype):
    """On an H100/H200 (9.0): conv_fwd_wgmma itself, built for sm_90a, within one rounding of float64 -- the
    check of the emulator's reading of wgmma on this kernel, which nothing here can do."""
    import cupy
    if int(cupy.cuda.Device().compute_capability) != 90:
        pytest.skip("wgmma needs a compute capability 9.0 GPU (sm_90a)")
    x, weight, bias, _ = case.inputs(numpy.random.default_rng(4), DTYPES[dtype])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(_device.WGMMA_ENV, "1")   # opt-in until this test has passed on a GPU (CudaDevice.wgmma)
        patch.setattr(wg, "wgmma_preferred", lambda spec, dtype: True)
        with settings.allow_tf32(True):
            out = cupyconv.conv2d(*(None if a is None else cupy.asarray(a) for a in (x, weight, bias)),
                                  algorithm="implicit_gemm", **case.kwargs)
    assert_one_rounding(cupy.asnumpy(out), x, weight, bias, case, dtype)


# ---------------------------------------------------------------------------------------------------------
# Built for sm_90a as CuPy builds it on a 9.0 GPU (`compile_options(filename, 90)`)


@pytest.mark.parametrize("major", (12, 13))
def test_nvrtc_builds_hgmma_unserialised(major):
    """CUDA 12.9's NVRTC (cupy-cuda12x's) and 13's: no warning, no serialised wgmma (ptxas info C7520, which it
    gives where the accumulators are touched on a path the whole warpgroup does not take), 4 HGMMA a kernel (one a
    k16 step of a 64-element chunk), no spills (NVRTC 13, cuobjdump)."""
    sass = pytest.importorskip("benchmarks.sass")
    try:
        nvrtc = sass.nvrtc(major)
    except sass.ToolMissing as e:
        pytest.skip(str(e))
    options = [*_device.compile_options(wg.KERNELS.filename, 90), "--gpu-architecture=sm_90", f"-I{nvrtc.include}"]
    assert "-arch=sm_90a" in options
    program = nvrtc.compile(_device.kernel_source(wg.KERNELS.filename), wg.KERNELS.filename, wg.instantiations(),
                            options)
    assert program.ok and "C7520" not in program.log, program.log
    assert not re.sub(r"^ptxas info\s*: \(C7519\) .*$\n?", "", program.log, flags=re.M).strip(), program.log
    if major == 13:
        try:
            kernels = sass._disassemble_cubin(program.cubin)
            usage = sass.resource_usage(program, "sm_90")
        except sass.ToolMissing as e:
            pytest.skip(str(e))
        counts = [sum(i["opcode"].startswith("HGMMA") for i in code) for code in kernels.values()]
        assert counts == [4] * len(wg.instantiations()), counts
        assert all(u.local == 0 and u.registers * wg.WGC_THREADS <= 65536 for u in usage.values()), usage


def test_the_gpu_check_turns_wgmma_on_for_its_steps():
    from benchmarks import gpu_check
    assert gpu_check.WGMMA_ENV == _device.WGMMA_ENV
