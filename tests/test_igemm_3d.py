"""conv3d natively on the tensor cores: conv_fwd_igemm_3d (raw_kernels/implicit_gemm.cu, `ig_forward` with DEPTH)
and its section "3-D, natively" in cupyconv/ops/implicit_gemm.py, on the emulator, against the CPU path in float64
and torch's conv3d.

The forward and the stride-1 input gradient run it with no depth windows (ops/lift.py's `depth_windows` never
launched); the weight gradient and a strided input gradient stay on the lift.  Problems are small and odd: depth,
height and width never a tile multiple, padding, stride and dilation differing per axis (depth padding on one side
only, so a depth mask that is off or mirrored shows), K chunks straddling taps (channels per group 24), groups,
every tile and the split of K, channels-last 3-D in and out, and the 32-bit limit sending a problem to the lift.
"""
import numpy
import pytest
from optional_deps import BFLOAT16, Dtypes

import cupyconv
from cupyconv import _device, _kernels, settings
from cupyconv.ops import implicit_gemm as igemm
from bug_classes import Recorder

DTYPES = Dtypes({"float16": numpy.float16, "bfloat16": BFLOAT16, "float32": numpy.float32})
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-3}   # as tests/test_igemm_kernels.py

# (name, x shape, weight shape, keyword arguments)
CASES = [
    # depth padded in front only, stride 2 in H, dilation 2 in D; 5 x 6 x 7: no tile multiple, scalar stores
    ("plain", (2, 16, 5, 6, 7), (24, 16, 3, 2, 3), dict(padding=((1, 0), (0, 1), (1, 1)), stride=(1, 2, 1),
                                                         dilation=(2, 1, 1))),
    # groups 2 of 24 channels (chunks straddle taps), stride in depth, dilation in height, padding at the back
    # only, no bias
    ("groups", (1, 48, 7, 5, 4), (16, 24, 2, 3, 3), dict(padding=((0, 2), (1, 1), (2, 0)), stride=(2, 1, 1),
                                                         dilation=(1, 2, 1), groups=2, bias=False)),
    # 4 x 4 x 4 output pixels an image: the 16-byte vector stores; 72 output channels: two column tiles
    ("vectors", (2, 16, 4, 4, 4), (72, 16, 3, 3, 3), dict(padding=1)),
]


def problem(rng, dtype, x_shape, w_shape, bias=True):
    x = rng.standard_normal(x_shape).astype(dtype)
    w = (rng.standard_normal(w_shape) / numpy.sqrt(numpy.prod(w_shape[1:]))).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype) if bias else None
    return x, w, b


def as64(*arrays):
    return [None if a is None else numpy.asarray(a, numpy.float64) for a in arrays]


def run(device, fn, *args, **kwargs):
    with _device.use_device(device), settings.allow_tf32(True):
        return fn(*args, **kwargs)


def assert_close(got, want, dtype, what=""):
    got = numpy.asarray(got, numpy.float64)
    scale = max(float(numpy.abs(want).max(initial=0.0)), 1e-30)
    err = float(numpy.abs(got - want).max(initial=0.0))   # NaN (a poisoned output never written) fails too
    assert err <= TOLERANCE[dtype] * scale, f"{what}: max error {err:.3g} vs max |value| {scale:.3g}"


def kernels(device):
    return [name.partition("<")[0] for name in device.launches]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("algorithm", ["implicit_gemm", "auto"])
def test_forward_runs_natively_and_matches_cpu_path(case, dtype, algorithm):
    name, x_shape, w_shape, kwargs = case
    kwargs = dict(kwargs)
    x, w, b = problem(numpy.random.default_rng(0), DTYPES[dtype], x_shape, w_shape, kwargs.pop("bias", True))
    device = Recorder("reverse" if name == "vectors" else "forward")
    got = run(device, cupyconv.conv3d, x, w, b, algorithm=algorithm, **kwargs)
    assert device.count("conv_fwd_igemm_3d") == 1 and "depth_windows" not in kernels(device), device.launches
    want = cupyconv.conv3d(*as64(x, w, b), **kwargs)
    assert got.dtype == x.dtype and got.shape == want.shape and got.flags.c_contiguous
    assert_close(got, want, dtype, name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("columns", [72, 40, 24])
def test_every_tile_and_the_split_of_k(dtype, columns, monkeypatch):
    """IG_WAVE_BLOCKS 1: the largest 3-D tile (128 rows; 72 and 40 columns: 64 wide, 24: the narrow 128 x 32);
    10^9 with splits of 2 chunks: the smallest tile with K split (27 taps x 32 channels), summed in order by
    conv_bwd_weight_igemm_finish."""
    x, w, b = problem(numpy.random.default_rng(1), DTYPES[dtype], (1, 32, 3, 4, 5), (columns, 32, 3, 3, 3))
    want = cupyconv.conv3d(*as64(x, w, b), padding=(1, 0, 1))
    tiles = igemm.IG_3D_NARROW if columns <= 32 else igemm.IG_3D_TILES[dtype]
    for wave, chunks, tile in ((1, 16, tiles[0]), (10**9, 2, tiles[-1])):
        monkeypatch.setattr(igemm, "IG_WAVE_BLOCKS", wave)
        monkeypatch.setattr(igemm, "IG_SPLIT_CHUNKS", chunks)
        device = Recorder()
        got = run(device, cupyconv.conv3d, x, w, b, padding=(1, 0, 1), algorithm="implicit_gemm")
        launched = [n for n in device.launches if n.startswith("conv_fwd_igemm_3d<")]
        assert launched == [_kernels.kernel_name("conv_fwd_igemm_3d", dtype, "int", *tile)], device.launches
        assert device.count("conv_bwd_weight_igemm_finish") == (wave > 1), device.launches
        assert_close(got, want, dtype, f"tile {tile}")


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_channels_last_in_and_out(dtype):
    """A channels-last 3-D x (an (N, D, H, W, C) array viewed as (N, C, D, H, W)) gives a channels-last output,
    written by the kernel's channels-last epilogue; the values are the contiguous input's."""
    x, w, b = problem(numpy.random.default_rng(2), DTYPES[dtype], (2, 5, 6, 3, 16), (16, 16, 3, 1, 2))
    view = numpy.moveaxis(x, -1, 1)
    device = Recorder()
    got = run(device, cupyconv.conv3d, view, w, b, padding=((2, 0), (0, 0), (1, 0)), algorithm="implicit_gemm")
    assert device.count("conv_fwd_igemm_3d") == 1, device.launches
    assert got.transpose(0, 2, 3, 4, 1).flags.c_contiguous and not got.flags.c_contiguous
    want = cupyconv.conv3d(*as64(numpy.ascontiguousarray(view), w, b), padding=((2, 0), (0, 0), (1, 0)))
    assert_close(got, want, dtype)


def torch_gradients(x, w, gy, **kwargs):
    torch = pytest.importorskip("torch")
    tx = torch.tensor(numpy.asarray(x, numpy.float64), requires_grad=True)
    tw = torch.tensor(numpy.asarray(w, numpy.float64), requires_grad=True)
    y = torch.nn.functional.conv3d(tx, tw, **kwargs)
    y.backward(torch.tensor(numpy.asarray(gy, numpy.float64)))
    return tx.grad.numpy(), tw.grad.numpy()


@pytest.mark.parametrize("dtype", DTYPES)
def test_input_gradient_at_stride_1_runs_natively(dtype):
    """grad_input at stride 1: conv_fwd_igemm_3d over the transposed window (dilation in depth, groups 2 of 16
    output channels) with the weight flipped in all three axes; the weight gradient still on the lift; both
    against torch's conv3d in float64."""
    x, w, _ = problem(numpy.random.default_rng(3), DTYPES[dtype], (2, 32, 5, 4, 6), (32, 16, 2, 3, 3), bias=False)
    kwargs = dict(padding=(1, 1, 0), dilation=(2, 1, 1), groups=2)
    gy = numpy.random.default_rng(4).standard_normal((2, 32, 5, 4, 4)).astype(DTYPES[dtype])
    want_x, want_w = torch_gradients(x, w, gy, **kwargs)
    device = Recorder()
    got_x, got_w, _ = run(device, cupyconv.conv3d_backward, gy, x, w, needs=("input", "weight"),
                          algorithm="implicit_gemm", **kwargs)
    assert device.count("conv_fwd_igemm_3d") == 1 and device.count("depth_fold") == 0, device.launches
    assert device.count("depth_windows") == 1, device.launches   # the weight gradient's
    assert_close(got_x, want_x, dtype, "grad_input")
    assert_close(got_w, want_w, dtype, "grad_weight")


def test_strided_input_gradient_stays_on_the_lift():
    x, w, _ = problem(numpy.random.default_rng(5), numpy.float16, (1, 16, 5, 5, 5), (16, 16, 3, 3, 3), bias=False)
    gy = numpy.random.default_rng(6).standard_normal((1, 16, 3, 3, 3)).astype(numpy.float16)
    device = Recorder()
    got = run(device, cupyconv.conv3d_backward, gy, x, w, stride=(2, 2, 2), padding=1, needs=("input",),
              algorithm="implicit_gemm")[0]
    assert device.count("conv_fwd_igemm_3d") == 0 and device.count("depth_fold") == 1, device.launches
    assert_close(got, torch_gradients(x, w, gy, stride=2, padding=1)[0], "float16")


def test_past_32_bit_indices_takes_the_lift(monkeypatch):
    """No 64-bit instantiation of conv_fwd_igemm_3d (CI time): a problem of 2^31 elements or more is refused
    (`igemm_3d_refusal`; here the limit lowered below this problem's size) and runs on the lift's depth windows,
    with the same values."""
    x, w, b = problem(numpy.random.default_rng(7), numpy.float16, (1, 16, 4, 5, 6), (16, 16, 3, 3, 3))
    monkeypatch.setattr(igemm, "INT32_MAX", x.size - 1)
    device = Recorder()
    got = run(device, cupyconv.conv3d, x, w, b, padding=1, algorithm="implicit_gemm")
    assert device.count("conv_fwd_igemm_3d") == 0 and device.count("depth_windows") == 1, device.launches
    assert_close(got, cupyconv.conv3d(*as64(x, w, b), padding=1), "float16")


def test_autotune_keeps_auto_on_the_lift():
    """With autotune on, 'auto' times the lifted 2-D problem's candidates: conv3d stays there."""
    x, w, b = problem(numpy.random.default_rng(8), numpy.float16, (1, 16, 3, 4, 5), (16, 16, 3, 3, 3))
    device = Recorder()
    with settings.autotune(True):
        run(device, cupyconv.conv3d, x, w, b, padding=1)
    assert device.count("conv_fwd_igemm_3d") == 0, device.launches


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_cudnn_drop_in_forward_3d(layout):
    """cupyconv.cudnn.convolution_forward on 3-D arrays (sigpy's path) runs conv_fwd_igemm_3d, in either layout."""
    from cupyconv import cudnn
    x, w, b = problem(numpy.random.default_rng(9), numpy.float16, (2, 16, 4, 5, 3), (16, 16, 3, 3, 3))
    want = cupyconv.conv3d(*as64(x, w, b), padding=1)
    d_layout = cudnn.CUDNN_TENSOR_NCHW if layout == "NCHW" else cudnn.CUDNN_TENSOR_NHWC
    xs, ys = (x, want) if layout == "NCHW" else (numpy.moveaxis(x, 1, -1).copy(), numpy.moveaxis(want, 1, -1))
    y = numpy.full(ys.shape, numpy.nan, numpy.float16)
    device = Recorder()
    run(device, cudnn.convolution_forward, xs, w, b, y, (1, 1, 1), (1, 1, 1), None, 1, d_layout=d_layout)
    assert device.count("conv_fwd_igemm_3d") == 1, device.launches
    assert_close(y, ys, "float16", layout)


@pytest.mark.parametrize("kernel_d, tile", [(4, (256, 64, 4)), (5, (128, 64, 4)), (9, (64, 64, 4)), (17, None)])
def test_depth_bits_pick_the_tile(kernel_d, tile, monkeypatch):
    """A thread's depth bits hold (its A rows) x kernel_d: 256 x 64 up to 4 depth taps, 128 x 64 up to 8, 64 x 64
    up to 16; past that the lift.  Depth padding of 3 in front and 4 behind, dilation 1: rows whose taps enter and
    leave the padding."""
    monkeypatch.setattr(igemm, "IG_WAVE_BLOCKS", 1)
    x, w, b = problem(numpy.random.default_rng(10), numpy.float16, (1, 16, 12, 3, 4), (40, 16, kernel_d, 1, 3))
    padding = ((3, 4), (0, 0), (1, 1))
    device = Recorder()
    got = run(device, cupyconv.conv3d, x, w, b, padding=padding, algorithm="implicit_gemm")
    launched = [n for n in device.launches if n.startswith("conv_fwd_igemm_3d<")]
    assert launched == ([_kernels.kernel_name("conv_fwd_igemm_3d", "float16", "int", *tile)] if tile else []), \
        device.launches
    assert_close(got, cupyconv.conv3d(*as64(x, w, b), padding=padding), "float16", f"kernel_d {kernel_d}")


def test_cudnn_drop_in_backward_data_3d():
    """cupyconv.cudnn.convolution_backward_data on 3-D arrays at stride 1: conv_fwd_igemm_3d on the transposed
    window, no depth fold; against torch's input gradient."""
    from cupyconv import cudnn
    x, w, _ = problem(numpy.random.default_rng(11), numpy.float16, (2, 16, 4, 5, 3), (24, 16, 3, 3, 3), bias=False)
    gy = numpy.random.default_rng(12).standard_normal((2, 24, 4, 5, 3)).astype(numpy.float16)
    gx = numpy.full(x.shape, numpy.nan, numpy.float16)
    device = Recorder()
    run(device, cudnn.convolution_backward_data, w, gy, None, gx, (1, 1, 1), (1, 1, 1), None, 1)
    assert device.count("conv_fwd_igemm_3d") == 1 and device.count("depth_fold") == 0, device.launches
    assert_close(gx, torch_gradients(x, w, gy, padding=1)[0], "float16")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_gpu_forward_and_gradients_match_cpu_path(case, dtype):
    """The native 3-D forward and stride-1 input gradient on a real GPU (CuPy arrays), against the CPU path in
    float64; the weight gradient rides along (the lift's)."""
    import cupy
    name, x_shape, w_shape, kwargs = case
    kwargs = dict(kwargs)
    x, w, b = problem(numpy.random.default_rng(5), DTYPES[dtype], x_shape, w_shape, kwargs.pop("bias", True))
    want = cupyconv.conv3d(*as64(x, w, b), **kwargs)
    gy = numpy.random.default_rng(6).standard_normal(want.shape).astype(DTYPES[dtype])
    with settings.allow_tf32(True):
        got = cupyconv.conv3d(*(None if a is None else cupy.asarray(a) for a in (x, w, b)),
                              algorithm="implicit_gemm", **kwargs)
        grads = cupyconv.conv3d_backward(cupy.asarray(gy), cupy.asarray(x), cupy.asarray(w),
                                         needs=("input", "weight"), algorithm="implicit_gemm", **kwargs)
    assert_close(cupy.asnumpy(got), want, dtype, f"{name} forward")
    want_grads = cupyconv.conv3d_backward(*as64(gy, x, w), needs=("input", "weight"), **kwargs)
    for what, g, wg in zip(("grad_input", "grad_weight"), grads, want_grads):
        assert_close(cupy.asnumpy(g), wg, dtype, f"{name} {what}")


@pytest.mark.parametrize("nd, stride, native", [(3, 1, True), (3, 2, False), (1, 2, False)],
                         ids=["3d_stride_1_native", "3d_strided_lifted", "1d_strided"])
def test_conv_transpose_bias_on_every_rank(nd, stride, native):
    """conv_transpose's bias (`lift.backward`'s input_bias) in 3-D and 1-D: conv_fwd_igemm_3d's epilogue adds it
    at stride 1 (no array work onto the output); the lifted 3-D input gradient gets it after the depth fold; 1-D
    runs the 2-D phases with it.  Against torch in float64; outputs poisoned."""
    rng = numpy.random.default_rng(24)
    x = rng.standard_normal((2, 32, *(4, 5, 3)[-nd:])).astype(numpy.float16)
    w = (rng.standard_normal((32, 16, *(2, 3, 4)[-nd:])) / 8).astype(numpy.float16)
    b = (rng.standard_normal(16) * 4).astype(numpy.float16)
    device = Recorder("reverse")
    adds = []
    device.add = lambda dst, src: (adds.append(dst.shape), Recorder.add(device, dst, src))
    fn = {1: cupyconv.conv_transpose1d, 3: cupyconv.conv_transpose3d}[nd]
    got = run(device, fn, x, w, b, stride=stride, padding=1, algorithm="implicit_gemm")
    assert (device.count("conv_fwd_igemm_3d") == 1) == native, device.launches
    assert (adds == []) == (nd == 1 or native), adds
    torch = pytest.importorskip("torch")
    tfn = {1: torch.nn.functional.conv_transpose1d, 3: torch.nn.functional.conv_transpose3d}[nd]
    want = tfn(*(torch.from_numpy(a) for a in as64(x, w, b)), stride=stride, padding=1).numpy()
    assert got.shape == want.shape and got.dtype == x.dtype
    assert_close(got, want, "float16", f"{nd}-D stride {stride}")
