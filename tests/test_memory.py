"""Memory: sizes are checked before anything is allocated, and the workspace limit bounds the column matrices (and
depth windows, padded copies, col2im buffers) alive at once, down to bands of one image's output rows; peaks are
measured with tracemalloc on the CPU path, buffer sizes recorded on the emulated kernel path.

An output that cannot fit (2^48 elements here) raises MemoryError naming the op, the shapes and the bytes, on the
CPU path and on the emulated kernel path, before the first allocation: nothing is allocated, so these tests are
cheap.  The check counts the results and one image's least workspace (its padded copy on the CPU path, its depth
windows in 3-D), which the tests pin down exactly with a machine of a few hundred bytes (`host_memory` patched).
"""
import re
import tracemalloc
import weakref

import numpy
import pytest

import cupyconv as cc
import reference as ref
from cupyconv import _device
from cupyconv._spec import ConvSpec
from cupyconv.ops import conv, lift, patch
from emulator import EmulatedDevice

F32 = numpy.float32
ONE = numpy.ones((1, 1, 1, 1), F32)
BIG = 2**23          # padding that makes a 1x1 input a (2^24 + 1)^2 output: 2^48 elements and more
HUGE = (2**24 + 1,) * 2

#: (op, call, shape of the result that cannot fit)
HUGE_CALLS = [
    ("conv2d", lambda: cc.conv2d(ONE, ONE, padding=BIG), (1, 1, *HUGE)),
    ("conv1d", lambda: cc.conv1d(ONE[0], ONE[0], padding=2**47), (1, 1, 2**48 + 1)),
    ("conv3d", lambda: cc.conv3d(ONE[..., None], ONE[..., None], padding=2**16), (1, 1, *(2**17 + 1,) * 3)),
    ("depthwise_conv2d", lambda: cc.depthwise_conv2d(ONE, ONE, padding=BIG), (1, 1, *HUGE)),
    ("patch_conv2d", lambda: cc.patch_conv2d(ONE[None], ONE, padding=BIG), (1, 1, 1, *HUGE)),
    ("unfold", lambda: cc.unfold(ONE, 1, padding=BIG), (1, 1, HUGE[0] ** 2)),
    ("fold", lambda: cc.fold(numpy.ones((1, 1, 2**16), F32), (2**24, 2**24), 1, stride=2**16), (1, 1, 2**24, 2**24)),
    ("conv_transpose2d", lambda: cc.conv_transpose2d(ONE, numpy.ones((1, 1, 2, 2), F32), dilation=2**24),
     (1, 1, *HUGE)),
    # grad_x of an input of 2^48 elements that takes no memory (a broadcast view)
    ("conv2d_backward", lambda: cc.conv2d_backward(numpy.broadcast_to(F32(1), (1, 1, *HUGE)),
                                                   numpy.broadcast_to(F32(1), (1, 1, *HUGE)), ONE, needs="input"),
     (1, 1, *HUGE)),
]


def on(device, fn, *args, **kwargs):
    if device is None:
        return fn(*args, **kwargs)
    with _device.use_device(device):
        return fn(*args, **kwargs)


def traced_peak(fn):
    """(fn's result, the peak bytes allocated while it ran beyond what was allocated before: NumPy's arrays are
    traced)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("device", [None, EmulatedDevice()], ids=["cpu", "emulated"])
@pytest.mark.parametrize("op, call, shape", HUGE_CALLS, ids=[op for op, _, _ in HUGE_CALLS])
def test_results_that_cannot_fit_raise_before_anything_is_allocated(op, call, shape, device):
    where = "this machine \\(the CPU path\\)" if device is None else "the emulated device"
    pattern = (rf"^{op}: float32 arrays need \d+ bytes: a result {re.escape(str(shape))} of {4 * numpy.prod(shape)} "
               rf"bytes.*; more than the \d+ bytes of memory of {where}$")
    with pytest.raises(MemoryError, match=pattern):
        traced_peak(lambda: on(device, call))
    tracemalloc.start()
    with pytest.raises(MemoryError):
        on(device, call)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated before the error"


def test_the_check_counts_the_results_and_one_padded_image(monkeypatch):
    """x (2, 3, 8, 8), weight (4, 3, 3, 3), padding 1, float32: the output (2, 4, 8, 8) takes 2048 bytes, one image's
    padded copy (3, 10, 10) 1200 and one output row's columns (27, 8) 864 (the CPU path chunks its columns no
    finer); the kernels read x in place, so the emulated path needs the output only.  At exactly the bytes needed
    the call runs."""
    rng = numpy.random.default_rng(0)
    x, w = ref.random(rng, (2, 3, 8, 8), F32), ref.random(rng, (4, 3, 3, 3), F32)
    need = 2048 + 1200 + 864
    monkeypatch.setattr(_device, "host_memory", lambda: need - 1)
    with pytest.raises(MemoryError, match=rf"^conv2d: float32 arrays need {need} bytes: a result \(2, 4, 8, 8\) of "
                                          r"2048 bytes and one image's padded copy \(3, 10, 10\) of 1200 bytes and one "
                                          r"output row's columns \(27, 8\) of 864 bytes; more than the 4111 bytes of "
                                          r"memory of this machine \(the CPU path\)$"):
        cc.conv2d(x, w, padding=1)
    monkeypatch.setattr(_device, "host_memory", lambda: need)
    want = cc.conv2d(x, w, padding=1)
    ref.assert_close(want, ref.conv2d(x, w, padding=1), "float32")
    monkeypatch.setattr(_device, "host_memory", lambda: 2048)
    ref.assert_close(on(EmulatedDevice(), cc.conv2d, x, w, padding=1, algorithm="direct"), want, "float32")
    monkeypatch.setattr(_device, "host_memory", lambda: 2047)
    with pytest.raises(MemoryError, match=r"^conv2d: float32 arrays need 2048 bytes: a result \(2, 4, 8, 8\) of 2048 "
                                          r"bytes; more than the 2047 bytes of memory of the emulated device$"):
        on(EmulatedDevice(), cc.conv2d, x, w, padding=1, algorithm="direct")


def test_backward_counts_the_gradients_it_is_asked_for(monkeypatch):
    """grad_x (2, 3, 8, 8): 1536 bytes, grad_weight (4, 3, 3, 3): 432, grad_bias (4,): 16, padded image 1200, one
    output row's columns 864."""
    rng = numpy.random.default_rng(1)
    x, w, gy = (ref.random(rng, shape, F32) for shape in ((2, 3, 8, 8), (4, 3, 3, 3), (2, 4, 8, 8)))
    monkeypatch.setattr(_device, "host_memory", lambda: 1536 + 1200 + 864)
    assert cc.conv2d_backward(gy, x, w, padding=1, needs="input")[0].shape == x.shape
    with pytest.raises(MemoryError, match=r"^conv2d_backward: float32 arrays need 4048 bytes: a result \(2, 3, 8, 8\) "
                                          r"of 1536 bytes and a result \(4, 3, 3, 3\) of 432 bytes and a result \(4,\) "
                                          r"of 16 bytes and one image's padded copy \(3, 10, 10\) of 1200 bytes"):
        cc.conv2d_backward(gy, x, w, padding=1)


def test_no_check_where_the_memory_is_unknown(monkeypatch):
    monkeypatch.setattr(_device, "host_memory", lambda: None)
    assert cc.unfold(ONE, 1, padding=1).shape == (1, 1, 9)


@pytest.mark.gpu
def test_results_that_cannot_fit_the_gpu_raise():
    cupy = pytest.importorskip("cupy")
    one = cupy.ones((1, 1, 1, 1), cupy.float32)
    with pytest.raises(MemoryError, match=r"^conv2d: float32 arrays need \d+ bytes: a result \(1, 1, 16777217, "
                                          r"16777217\) .* bytes of memory of the cuda device$"):
        cc.conv2d(one, one, padding=BIG)


# ---------------------------------------------------------------------------------------------------------
# The workspace limit: one chunk's column matrices (depth windows) at a time


class Live:
    """Wraps a function that returns a new array and counts how many of its results were alive at once."""

    def __init__(self, fn):
        self.fn, self.alive, self.calls, self.most = fn, [], 0, 0

    def __call__(self, *args, **kwargs):
        result = self.fn(*args, **kwargs)
        self.alive = [r for r in self.alive if r() is not None] + [weakref.ref(result)]
        self.calls, self.most = self.calls + 1, max(self.most, len(self.alive))
        return result


def conv_problem(rng, n=8, nd=2):
    size = {2: (34, 34), 3: (4, 20, 20)}[nd]
    x, w = ref.random(rng, (n, 4, *size), F32), ref.random(rng, (8, 4, *(3,) * nd), F32)
    return x, w, ref.random(rng, (n, 8, *size), F32)   # grad_output of padding 1


@pytest.mark.parametrize("device", [None, EmulatedDevice()], ids=["cpu", "emulated"])
def test_one_chunk_of_columns_at_a_time(monkeypatch, device):
    """8 images in chunks of 2 (forward; 1 or 2 for the weight gradient, whose grad_output copy both paths count
    too): each chunk's columns are freed before the next chunk's are built.  Per image the kernel path counts its
    columns, the CPU path its columns and its padded copy."""
    x, w, gy = conv_problem(numpy.random.default_rng(2))
    limit = 2 * (4 * 9 * 34 * 34 + 4 * 36 * 36) * 4
    columns = Live(conv._columns if device is None else conv.unfold_gpu)
    monkeypatch.setattr(conv, "_columns" if device is None else "unfold_gpu", columns)
    algorithm = {} if device is None else {"algorithm": "im2col_gemm"}
    on(device, cc.conv2d, x, w, padding=1, workspace_limit=limit, **algorithm)
    assert (columns.calls, columns.most) == (4, 1)
    on(device, cc.conv2d_backward, gy, x, w, padding=1, workspace_limit=limit, needs="weight", **algorithm)
    assert columns.calls >= 8 and columns.most == 1


def test_patch_one_chunk_of_columns_at_a_time(monkeypatch):
    """(1, 8) patches in 4 chunks of 2, on the emulated im2col_gemm path."""
    x, w, _ = conv_problem(numpy.random.default_rng(3))
    columns = Live(patch.unfold_gpu)
    monkeypatch.setattr(patch, "unfold_gpu", columns)
    with cc.settings.workspace_limit(2 * 4 * 9 * 34 * 34 * 4):
        on(EmulatedDevice(), cc.patch_conv2d, x[None], w, padding=1, algorithm="im2col_gemm")
    assert (columns.calls, columns.most) == (4, 1)


@pytest.mark.parametrize("device", [None, EmulatedDevice()], ids=["cpu", "emulated"])
def test_3d_one_chunk_of_depth_windows_at_a_time(monkeypatch, device):
    x, w, gy = conv_problem(numpy.random.default_rng(4), nd=3)
    windows = Live(lift.depth_windows)
    monkeypatch.setattr(lift, "depth_windows", windows)
    # Chunks of 2: an image's windows and grad_output copy take half the limit, the 2-D run the other half.
    per_image = lift.depth_window_bytes(ConvSpec.for_conv("conv3d", x, w, None, 1, 1, 1, 1, nd=3), 4) + gy[0].nbytes
    limit = 2 * 2 * per_image
    on(device, cc.conv3d_backward, gy, x, w, padding=1, workspace_limit=limit, needs="weight")
    assert (windows.calls, windows.most) == (4, 1)


def test_cpu_peak_stays_near_the_workspace_limit():
    """The CPU conv's temporaries at their peak: one chunk's columns (the limit), its padded copy or col2im buffer
    (1/8 of them with a 3x3 kernel) and NumPy's ufunc buffers (numpy.getbufsize() elements for each of 3
    operands), not two chunks' columns (twice the limit)."""
    x, w, gy = conv_problem(numpy.random.default_rng(5))
    limit = 2 * 4 * 9 * 34 * 34 * 4
    bound = 1.2 * limit + 3 * numpy.getbufsize() * 4
    y, peak = traced_peak(lambda: cc.conv2d(x, w, padding=1, workspace_limit=limit))
    assert peak - y.nbytes < bound
    for needs in ("input", "weight"):
        (grad,), peak = traced_peak(lambda: [g for g in cc.conv2d_backward(gy, x, w, padding=1, needs=needs,
                                                                            workspace_limit=limit) if g is not None])
        assert peak - grad.nbytes < bound, needs


def _peaks(x, w, limit, **kwargs):
    """The traced peak of conv2d and of each gradient, beyond its result."""
    y, peak = traced_peak(lambda: cc.conv2d(x, w, workspace_limit=limit, **kwargs))
    peaks = {"forward": peak - y.nbytes}
    gy = numpy.ones_like(y)
    for needs in ("input", "weight"):
        (grad,), peak = traced_peak(lambda: [g for g in cc.conv2d_backward(gy, x, w, needs=needs, workspace_limit=limit,
                                                                            **kwargs) if g is not None])
        peaks[needs] = peak - grad.nbytes
    return peaks


@pytest.mark.parametrize("kwargs", [dict(), dict(stride=2, padding=1), dict(dilation=(2, 1), padding=(3, 0))],
                         ids=["plain", "strided", "dilated"])
def test_cpu_peak_holds_below_one_image(kwargs):
    """One image's columns (4.6 MiB here) above a 1 MiB limit: the CPU path computes bands of output rows, so the
    peak stays near the limit, with the same results as in one piece."""
    rng = numpy.random.default_rng(6)
    x, w = ref.random(rng, (1, 8, 130, 130), F32), ref.random(rng, (8, 8, 3, 3), F32)
    limit = 2**20
    assert ConvSpec.for_conv("conv2d", x, w, None, 1, 0, 1, 1).cols_bytes(4) > 4 * limit
    for name, peak in _peaks(x, w, limit, **kwargs).items():
        assert peak < 1.2 * limit + 3 * numpy.getbufsize() * 4, (name, peak)
    whole = cc.conv2d_backward(numpy.ones_like(cc.conv2d(x, w, **kwargs)), x, w, **kwargs)
    banded = cc.conv2d_backward(numpy.ones_like(whole[0], shape=cc.conv2d(x, w, **kwargs).shape), x, w,
                                workspace_limit=limit, **kwargs)
    for a, b in zip(banded, whole):
        ref.assert_close(a, b, "float32")
    ref.assert_close(cc.conv2d(x, w, workspace_limit=limit, **kwargs), cc.conv2d(x, w, **kwargs), "float32")


def test_cpu_pointwise_input_gradient_stays_within_the_limit():
    """A 1x1 conv's input gradient is its columns: no col2im buffer beside them (it doubled the peak)."""
    rng = numpy.random.default_rng(7)
    x, w = ref.random(rng, (8, 16, 34, 34), F32), ref.random(rng, (16, 16, 1, 1), F32)
    limit = 2 * 16 * 34 * 34 * 4
    peaks = _peaks(x, w, limit)
    assert peaks["input"] < 1.2 * limit + 3 * numpy.getbufsize() * 4, peaks


def _bound(limit):
    """The peak allowed beyond the results: the limit, a fifth more (the pieces are sized from estimates), and
    NumPy's ufunc buffers (numpy.getbufsize() elements for each of 3 operands)."""
    return 1.2 * limit + 3 * numpy.getbufsize() * 4


def _traced_peaks(forward, backward, gy):
    y, peak = traced_peak(forward)
    peaks = {"forward": peak - y.nbytes}
    for needs in ("input", "weight"):
        (grad,), peak = traced_peak(lambda: [g for g in backward(gy, needs) if g is not None])
        peaks[needs] = peak - grad.nbytes
    return peaks


def test_3d_peak_stays_within_the_limit():
    """The 3-D drivers give half the limit to the depth windows (and the grad_output copy, the windows' gradient and
    its fold) and the rest to the 2-D run inside: not the windows, their gradient and the inner columns each at
    the limit (3.2x it before)."""
    rng = numpy.random.default_rng(8)
    x, w = ref.random(rng, (8, 4, 6, 24, 24), F32), ref.random(rng, (8, 4, 3, 3, 3), F32)
    spec = ConvSpec.for_conv("conv3d", x, w, None, 1, 1, 1, 1, nd=3)
    limit = 2 * lift.depth_window_bytes(spec, 4)
    gy = numpy.ones(spec.output_shape, F32)
    peaks = _traced_peaks(lambda: cc.conv3d(x, w, padding=1, workspace_limit=limit),
                          lambda gy, needs: cc.conv3d_backward(gy, x, w, padding=1, needs=needs,
                                                               workspace_limit=limit), gy)
    assert all(peak < _bound(limit) for peak in peaks.values()), peaks


def test_cpu_depthwise_peak_stays_within_the_limit():
    """The CPU depthwise op pads (and sums its input gradient into) chunks of images, not the whole batch."""
    rng = numpy.random.default_rng(9)
    x, w = ref.random(rng, (8, 16, 64, 64), F32), ref.random(rng, (32, 1, 3, 3), F32)
    limit = 2 * 16 * (66 * 66 + 2 * 64 * 64) * 4          # two images' padded planes and products
    gy = numpy.ones((8, 32, 64, 64), F32)
    peaks = _traced_peaks(lambda: cc.conv2d(x, w, padding=1, groups=16, workspace_limit=limit),
                          lambda gy, needs: cc.conv2d_backward(gy, x, w, padding=1, groups=16, needs=needs,
                                                               workspace_limit=limit), gy)
    assert all(peak < _bound(limit) for peak in peaks.values()), peaks
    with cc.settings.workspace_limit(limit):
        _, peak = traced_peak(lambda: cc.depthwise_conv2d(x, w, padding=1))
    assert peak - 8 * 32 * 64 * 64 * 4 < _bound(limit)


class Sized:
    """Wraps a function that returns a new array and records the bytes of each of its results."""

    def __init__(self, fn):
        self.fn, self.sizes = fn, []

    def __call__(self, *args, **kwargs):
        result = self.fn(*args, **kwargs)
        self.sizes.append(result.nbytes)
        return result


def recorded_matmul(sized, device_type):
    """Device.matmul_strided, recording the bytes of the product (the input gradient's columns) in `sized`."""
    real = device_type.matmul_strided

    def matmul_strided(self, a, b, out, **kwargs):
        sized.sizes.append(out.nbytes)
        return real(self, a, b, out, **kwargs)
    return matmul_strided


def test_gpu_columns_stay_below_the_limit_within_one_image(monkeypatch):
    """im2col_gemm forward and gradients of conv2d and patch_conv2d on the emulated device:
    one image's columns (4 * 9 * 18 * 18 * 4 bytes) over a limit of a fifth of them are built band by band, none
    above the limit (the GEMM products recorded too: the input gradient's columns, each piece's product), and the
    results are torch's."""
    rng = numpy.random.default_rng(10)
    x, w = ref.random(rng, (2, 4, 20, 20), F32), ref.random(rng, (6, 4, 3, 3), F32)
    gy = ref.random(rng, (2, 6, 18, 18), F32)
    limit = 4 * 9 * 18 * 18 * 4 // 5
    columns = Sized(conv.unfold_gpu)
    monkeypatch.setattr(conv, "unfold_gpu", columns)
    monkeypatch.setattr(EmulatedDevice, "matmul_strided", recorded_matmul(columns, EmulatedDevice))
    patch_columns = Sized(patch.unfold_gpu)
    monkeypatch.setattr(patch, "unfold_gpu", patch_columns)
    device, algorithm = EmulatedDevice(), dict(algorithm="im2col_gemm")
    runs = [(lambda **kw: on(device, cc.conv2d, x, w, **algorithm, **kw), ref.conv2d(x, w)),
            (lambda **kw: on(device, cc.conv2d_backward, gy, x, w, needs="weight", **algorithm, **kw)[1],
             ref.conv2d_grads(gy, x, w)[1]),
            (lambda **kw: on(device, cc.conv2d_backward, gy, x, w, needs="input", **algorithm, **kw)[0],
             ref.conv2d_grads(gy, x, w)[0]),
            (lambda **kw: on(device, cc.patch_conv2d, x[None], w, **algorithm, **kw), ref.conv2d(x, w)[None]),
            (lambda **kw: on(device, cc.patch_conv2d_backward, gy[None], x[None], w, needs="weight", **algorithm,
                             **kw)[1], ref.conv2d_grads(gy, x, w)[1]),
            (lambda **kw: on(device, cc.patch_conv2d_backward, gy[None], x[None], w, needs="input", **algorithm,
                             **kw)[0], ref.conv2d_grads(gy, x, w)[0][None])]
    for run, want in runs:
        columns.sizes.clear()
        patch_columns.sizes.clear()
        ref.assert_close(run(workspace_limit=limit), want, "float32")
        sizes = columns.sizes + patch_columns.sizes
        assert len(sizes) > 2 * 2 and max(sizes) <= limit, sizes
