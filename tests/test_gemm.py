"""The GEMM call of the device interface: `Device.gemm_strided_batched` (cuBLAS's cublasGemmStridedBatchedEx,
column-major) in NumPy against numpy.matmul, every rejection of `gemm_arguments`, the row-major helper
`Device.matmul_strided`, and `CudaDevice.gemm_strided_batched`'s exact binding call run on host memory through
the emulator's `EmulatedCublas`."""
import itertools

import numpy
import pytest
from optional_deps import BFLOAT16, Dtypes

import cupyconv
from cupyconv import _device
from emulator import EmulatedDevice
from emulator._device import EmulatedCublas

DTYPES = Dtypes({"float16": numpy.float16, "bfloat16": BFLOAT16, "float32": numpy.float32,
          "float64": numpy.float64})
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-6, "float64": 1e-13}  # relative to max |C|
strided = numpy.lib.stride_tricks.as_strided


def stored(buffer, rows, cols, ld, stride, batch):
    """The column-major (batch, rows, cols) view of a 1-D buffer, as cuBLAS addresses it."""
    s = buffer.itemsize
    return strided(buffer, (batch, rows, cols), (stride * s, s, ld * s))


def operand(rng, dtype, trans, rows, cols, batch, pad=2, gap=3, stride=None):
    """(buffer, ld, stride, op(X) as float64) for op(X) of shape (batch, rows, cols), stored transposed for
    'T', with ld = stored rows + pad and `gap` unused elements between matrices (stride 0: one matrix)."""
    srows, scols = (rows, cols) if trans == "N" else (cols, rows)
    ld = srows + pad
    if stride is None:
        stride = ld * scols + gap
    size = (max(batch, 1) - 1) * stride + ld * max(scols, 1) + 5
    buffer = numpy.full(size, numpy.nan).astype(dtype)
    view = stored(buffer, srows, scols, ld, stride, batch)
    values = rng.standard_normal((1 if stride == 0 else batch, srows, scols))
    view[...] = values.astype(dtype) if stride else numpy.broadcast_to(values.astype(dtype), view.shape)
    exact = view.astype(numpy.float64)
    return buffer, ld, stride, (exact if trans == "N" else exact.transpose(0, 2, 1))


def assert_close(got, want, dtype):
    scale = max(float(numpy.abs(want).max(initial=0.0)), 1e-30)
    err = float(numpy.abs(numpy.asarray(got, numpy.float64) - want).max(initial=0.0))
    assert err <= TOLERANCE[dtype] * scale, f"max error {err:.3g} vs max |C| {scale:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transa, transb", list(itertools.product("NT", "NT")))
def test_matches_numpy_matmul(dtype, transa, transb):
    rng = numpy.random.default_rng(0)
    for (m, n, k, batch), broadcast_a, beta in itertools.product([(5, 3, 7, 3), (1, 9, 2, 2), (6, 1, 1, 1)],
                                                                 (False, True), (0.0, 1.0)):
        a, lda, stride_a, opa = operand(rng, DTYPES[dtype], transa, m, k, batch, stride=0 if broadcast_a else None)
        b, ldb, stride_b, opb = operand(rng, DTYPES[dtype], transb, k, n, batch, pad=0)
        c, ldc, stride_c, c0 = operand(rng, DTYPES[dtype], "N", m, n, batch, pad=1, gap=2)
        if beta == 0:  # beta = 0 never reads C: NaN there must not come through
            stored(c, m, n, ldc, stride_c, batch)[...] = numpy.nan
        before = c.copy()
        _device.Device().gemm_strided_batched(transa, transb, m, n, k, 1.5, a, lda, stride_a, b, ldb, stride_b, beta,
                                              c, ldc, stride_c, batch)
        want = 1.5 * numpy.matmul(opa, opb) + (beta * c0 if beta else 0)
        assert_close(stored(c, m, n, ldc, stride_c, batch), want, dtype)
        mask = numpy.ones(c.shape, bool)  # nothing outside the C matrices is written
        stored(mask, m, n, ldc, stride_c, batch)[...] = False
        numpy.testing.assert_array_equal(c[mask].view(numpy.uint8), before[mask].view(numpy.uint8))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_inputs_into_a_float32_accumulator(dtype):
    """A float32 C for 16-bit A and B (cuBLAS's CUBLAS_COMPUTE_32F table has it): beta = 1 accumulates."""
    rng = numpy.random.default_rng(1)
    a = rng.standard_normal((4, 6)).astype(DTYPES[dtype])   # column-major 4 x 6, ld 4
    b = rng.standard_normal((5, 6)).astype(DTYPES[dtype])   # column-major 6 x 5, ld 6
    c = numpy.ones(4 * 5, numpy.float32)
    _device.Device().gemm_strided_batched("N", "N", 4, 5, 6, 1.0, a, 4, 0, b, 6, 0, 1.0, c, 4, 0, 1)
    want = numpy.matmul(a.astype(numpy.float64).reshape(6, 4).T, b.astype(numpy.float64).reshape(5, 6).T) + 1
    numpy.testing.assert_allclose(c.reshape(5, 4).T, want, rtol=1e-5, atol=1e-5)


def test_k_zero_scales_c_and_empty_problems_touch_nothing():
    device = _device.Device()
    c = numpy.arange(6.0)
    device.gemm_strided_batched("N", "N", 2, 3, 0, 1.0, numpy.empty(0), 2, 0, numpy.empty(0), 1, 0, 1.0, c, 2, 0, 1)
    numpy.testing.assert_array_equal(c, numpy.arange(6.0))
    device.gemm_strided_batched("N", "N", 2, 3, 0, 1.0, numpy.empty(0), 2, 0, numpy.empty(0), 1, 0, 0.0, c, 2, 0, 1)
    numpy.testing.assert_array_equal(c, numpy.zeros(6))
    c[...] = numpy.nan
    for m, n, batch in ((0, 3, 1), (2, 0, 1), (2, 3, 0)):
        device.gemm_strided_batched("N", "N", m, n, 4, 1.0, numpy.empty(0), 2, 0, numpy.empty(0), 4, 0, 0.0,
                                    numpy.empty(0), 2, 0, batch)


# ---------------------------------------------------------------------------------------------------------
# What cuBLAS would reject, or get wrong without an error


def call(**change):
    """A valid 2 x (3x4 @ 4x5) call, with `change` applied; returns what gemm_arguments says."""
    args = dict(transa="N", transb="N", m=3, n=5, k=4, a=numpy.ones(2 * 12), lda=3, stride_a=12,
                b=numpy.ones(2 * 20), ldb=4, stride_b=20, c=numpy.zeros(2 * 15), ldc=3, stride_c=15, batch=2)
    args.update(change)
    alpha_beta = dict(alpha=1.0, beta=0.0)
    _device.Device().gemm_strided_batched(**args, **alpha_beta)
    return args


BUFFER = numpy.zeros(60)
REJECTED = {
    "transa": dict(transa="C"),
    "transb": dict(transb="n"),
    "m = -1": dict(m=-1),
    "n = -1": dict(n=-1),
    "k = -1": dict(k=-1),
    "batch = -1": dict(batch=-1),
    "m must be an int": dict(m=3.0),
    "batch = 2147483648": dict(batch=2**31),
    "lda = 2 is less than max\\(1, 3\\)": dict(lda=2),
    "lda = 3 is less than max\\(1, 4\\)": dict(transa="T", lda=3),        # stored k x m
    "ldb = 3 is less than max\\(1, 4\\)": dict(ldb=3),
    "ldb = 4 is less than max\\(1, 5\\)": dict(transb="T", ldb=4),        # stored n x k
    "ldc = 2 is less than max\\(1, 3\\)": dict(ldc=2),
    "lda = 0 is less than max\\(1, 0\\)": dict(m=0, lda=0),                # cuBLAS checks even empty problems
    "stride_a = -12 reads before": dict(stride_a=-12),
    "b's dtype float32 differs from a's float64": dict(b=numpy.ones(40, numpy.float32)),
    "c's dtype float64 differs from a's and b's float32": dict(a=numpy.ones(24, numpy.float32),
                                                               b=numpy.ones(40, numpy.float32)),
    "c's dtype float64 differs from a's and b's float16": dict(a=numpy.ones(24, numpy.float16),
                                                               b=numpy.ones(40, numpy.float16)),
    "a's dtype int32 is not one of": dict(a=numpy.ones(24, numpy.int32), b=numpy.ones(40, numpy.int32),
                                          c=numpy.zeros(30, numpy.int32)),
    "a holds 23 elements": dict(a=numpy.ones(23)),
    "b holds 39 elements": dict(b=numpy.ones(40)[:-1]),
    "c holds 29 elements": dict(c=numpy.zeros(29)),
    "a holds 12 elements from its data pointer": dict(a=numpy.ones(24)[12:]),
    "c holds 30 elements .* ldc = 4": dict(ldc=4),                       # a larger ld reaches further
    "stride_c = 0 makes the batch's C matrices overlap": dict(stride_c=0, c=numpy.zeros(30)),
    "stride_c = 14 makes": dict(stride_c=14),
    "c's memory overlaps a's": dict(a=BUFFER[:24], c=BUFFER[20:50]),
}


@pytest.mark.parametrize("message", REJECTED)
def test_rejects(message):
    with pytest.raises(ValueError, match=message):
        call(**REJECTED[message])


def test_rejects_c_aliasing_b_and_accepts_what_is_valid():
    buffer = numpy.zeros(100)
    with pytest.raises(ValueError, match="c's memory overlaps b's"):
        call(b=buffer[:40], c=buffer[30:60])
    call(b=buffer[:40], c=buffer[40:70])                        # adjacent, not overlapping
    call(stride_a=0, a=numpy.ones(12))                          # the broadcast weight
    call(c=numpy.zeros(6 * 15)[::3])                            # any strides: only the span counts
    call(stride_c=3, ldc=6, c=numpy.zeros(30))                  # interleaved columns of two C's: disjoint
    call(a=numpy.ones(24, numpy.float16), b=numpy.ones(40, numpy.float16), c=numpy.zeros(30, numpy.float32))
    call(m=0, k=0, a=numpy.empty(0), b=numpy.empty(0), c=numpy.empty(0))   # nothing touched, no bounds


# ---------------------------------------------------------------------------------------------------------
# The row-major helper


class Counting(_device.Device):
    def __init__(self):
        self.calls = []

    def gemm_strided_batched(self, *args):
        self.calls.append(args)
        super().gemm_strided_batched(*args)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_strided_matches_numpy(dtype):
    rng = numpy.random.default_rng(2)
    t = DTYPES[dtype]
    w = rng.standard_normal((3, 5, 7)).astype(t)                     # (G, M, K): broadcast over the samples
    x = rng.standard_normal((4, 3, 7, 6)).astype(t)                  # (n, G, K, N)
    device = Counting()
    out = numpy.full((4, 3, 5, 6), numpy.nan, t)
    assert device.matmul_strided(w, x, out) is out
    want = numpy.matmul(w.astype(numpy.float64), x.astype(numpy.float64))
    assert_close(out, want, dtype)
    assert len(device.calls) == 3 and all(c[-1] == 4 and c[11] == 0 for c in device.calls)  # batch n, weight stride 0

    device.calls.clear()   # transposed views are read in place ('T'); beta = 1 adds into a float32/64 out
    acc = numpy.ones((3, 6, 5), numpy.float64 if dtype == "float64" else numpy.float32)
    xt, wt = x[1].transpose(0, 2, 1), w.transpose(0, 2, 1)
    device.matmul_strided(xt, wt, acc, beta=1.0)
    assert_close(acc, numpy.matmul(xt.astype(numpy.float64), wt.astype(numpy.float64)) + 1, dtype)
    assert [c[:2] for c in device.calls] == [("T", "T")] and device.calls[0][-1] == 3

    device.calls.clear()   # no unit stride in a matrix: copied; a reversed batch: copied
    a = rng.standard_normal((5, 14)).astype(t)[:, ::2]
    b = rng.standard_normal((2, 7, 6)).astype(t)[::-1]
    out = numpy.empty((2, 5, 6), t)
    device.matmul_strided(a, b, out)
    assert_close(out, numpy.matmul(a.astype(numpy.float64), b.astype(numpy.float64)), dtype)


def test_matmul_strided_edges():
    device = Counting()
    out = numpy.full((2, 3), 7.0)
    device.matmul_strided(numpy.ones((2, 0)), numpy.ones((0, 3)), out, beta=1.0)   # K = 0: C = beta * C
    numpy.testing.assert_array_equal(out, numpy.full((2, 3), 7.0))
    device.matmul_strided(numpy.ones((2, 0)), numpy.ones((0, 3)), out)
    numpy.testing.assert_array_equal(out, numpy.zeros((2, 3)))
    device.matmul_strided(numpy.ones((0, 2, 4)), numpy.ones((4, 3)), numpy.empty((0, 2, 3)))
    assert device.calls == []
    with pytest.raises(ValueError, match="unit stride"):
        device.matmul_strided(numpy.ones((2, 4)), numpy.ones((4, 3)), numpy.empty((3, 2)).T)
    with pytest.raises(ValueError, match="does not give"):
        device.matmul_strided(numpy.ones((2, 4)), numpy.ones((5, 3)), numpy.empty((2, 3)))


# ---------------------------------------------------------------------------------------------------------
# CudaDevice's binding call, on host memory


class CudaLike(_device.Device):
    """CudaDevice's GEMM on NumPy arrays (xp = numpy: host addresses go to EmulatedCublas)."""

    gemm_strided_batched = _device.CudaDevice.gemm_strided_batched
    cublas = _device.CudaDevice.cublas
    gemm_prepare = _device.CudaDevice.gemm_prepare
    gemm_run = _device.CudaDevice.gemm_run
    compute_capability = 80


@pytest.fixture
def cublas(monkeypatch):
    fake = EmulatedCublas()
    monkeypatch.setattr(_device, "_cublas", lambda: (fake.get_cublas_handle(), fake))
    monkeypatch.setattr(_device, "_cuda_runtime", lambda: fake)
    return fake


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_binding_call_computes_what_the_twin_does(cublas, dtype):
    rng = numpy.random.default_rng(3)
    for transa, transb in itertools.product("NT", "NT"):
        a, lda, stride_a, _ = operand(rng, DTYPES[dtype], transa, 5, 7, 3, stride=0)
        b, ldb, stride_b, _ = operand(rng, DTYPES[dtype], transb, 7, 4, 3)
        c, ldc, stride_c, _ = operand(rng, DTYPES[dtype], "N", 5, 4, 3, pad=1)
        args = (transa, transb, 5, 4, 7, 0.5, a, lda, stride_a, b, ldb, stride_b, 1.0)
        want = c.copy()
        _device.Device().gemm_strided_batched(*args, want, ldc, stride_c, 3)
        CudaLike().gemm_strided_batched(*args, c, ldc, stride_c, 3)
        numpy.testing.assert_array_equal(c.view(numpy.uint8), want.view(numpy.uint8))
    assert [(g["alpha"], g["beta"]) for g in cublas.gemms] == [(0.5, 1.0)] * 4


@pytest.mark.parametrize("allow", [False, True])
def test_cuda_compute_type_selects_tf32(cublas, allow):
    """TF32 by the compute type alone: float32 with allow_tf32 only, never float64 or the 16-bit types; the
    handle's math mode is never touched; a device pointer mode is switched to host for the call and back."""
    expected = {"float16": 68, "bfloat16": 68, "float32": 77 if allow else 68, "float64": 70}
    cublas.pointer_mode = cublas.CUBLAS_POINTER_MODE_DEVICE
    with cupyconv.settings.allow_tf32(allow):
        for dtype in DTYPES:
            one = numpy.ones(4, DTYPES[dtype])
            CudaLike().gemm_strided_batched("N", "N", 2, 2, 2, 1.0, one, 2, 0, one.copy(), 2, 0, 0.0, one.copy(),
                                            2, 0, 1)
    assert [g["computeType"] for g in cublas.gemms] == list(expected.values())
    assert all(g["pointer_mode"] == cublas.CUBLAS_POINTER_MODE_HOST and g["math_mode"] == 0 for g in cublas.gemms)
    assert cublas.pointer_mode == cublas.CUBLAS_POINTER_MODE_DEVICE and cublas.mode == cublas.CUBLAS_DEFAULT_MATH


def test_cuda_no_tf32_below_compute_capability_8(cublas, monkeypatch):
    monkeypatch.setattr(CudaLike, "compute_capability", 75)
    one = numpy.ones(4, numpy.float32)
    with cupyconv.settings.allow_tf32(True):
        CudaLike().gemm_strided_batched("N", "N", 2, 2, 2, 1.0, one, 2, 0, one.copy(), 2, 0, 0.0, one.copy(), 2, 0, 1)
    assert [g["computeType"] for g in cublas.gemms] == [cublas.CUBLAS_COMPUTE_32F]


def test_cuda_rejects_before_calling_cublas(cublas):
    with pytest.raises(ValueError, match="lda"):
        CudaLike().gemm_strided_batched("N", "N", 3, 2, 2, 1.0, numpy.ones(6), 2, 0, numpy.ones(4), 2, 0, 0.0,
                                        numpy.ones(6), 3, 0, 1)
    with pytest.raises(TypeError, match="numpy arrays"):
        CudaLike().gemm_strided_batched("N", "N", 1, 1, 1, 1.0, [1.0], 1, 0, numpy.ones(1), 1, 0, 0.0,
                                        numpy.ones(1), 1, 0, 1)
    CudaLike().gemm_strided_batched("N", "N", 0, 2, 2, 1.0, numpy.ones(4), 1, 0, numpy.ones(4), 2, 0, 0.0,
                                    numpy.ones(4), 1, 0, 1)   # empty: no call at all
    assert cublas.gemms == []


def test_the_emulator_runs_the_same_gemm_as_the_base_device():
    assert EmulatedDevice.gemm_strided_batched is _device.Device.gemm_strided_batched
    assert EmulatedDevice.matmul_strided is _device.Device.matmul_strided
