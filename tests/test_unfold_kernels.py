"""unfold/fold kernels (raw_kernels/unfold.cu) through the CPU emulator and, with -m gpu, on a real GPU.

The NumPy CPU path is the reference here; it is itself checked against torch and a naive loop in
tests/test_unfold.py.

The bug classes of issue 12 (each side's padding alone and the last row and column, 16-bit accumulation, loops
over several blocks, 64-bit indices past 2^31) are covered on purpose for every kernel here: the table in
tests/emulator/README.md ("Bug classes the kernel tests cover on purpose") names the test of each.
"""
import numpy
import pytest

import cupyconv
from cupyconv import _device, _kernels
import bug_classes
from emulator import EmulatedDevice, assert_clean_under_asan, run_under_asan

# (x shape, kernel_size, dilation, padding, stride): odd sizes, never multiples of the 256-thread block.
CASES = [
    ((2, 3, 7, 6), 3, 1, 1, 1),
    ((1, 5, 9, 11), (2, 3), (1, 2), ((1, 0), (2, 1)), (2, 1)),
    ((3, 2, 1, 4, 5), (3, 2), 2, (2, 1), (1, 2)),        # two leading dims, dilation larger than the plane
    ((2, 2, 5, 3), (5, 4), 1, ((2, 2), (3, 0)), 2),      # kernel larger than the plane, per-side padding
    ((1, 3, 8, 7), 3, 2, "same", 2),
    ((0, 3, 5, 5), 3, 1, 1, 1),                           # empty batch
]
IDS = [f"case{i}" for i in range(len(CASES))]


def _random(shape, dtype, seed=0):
    values = numpy.random.default_rng(seed).standard_normal(shape)
    return values.astype(dtype)


def _both_paths(fn, device):
    expected = fn()
    with _device.use_device(device):
        actual = fn()
    return actual, expected


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_unfold_and_fold_match_cpu_path(case, order):
    shape, kernel, dilation, padding, stride = case
    x = _random(shape, numpy.float64)
    kw = dict(dilation=dilation, padding=padding, stride=stride)
    cols, cols_ref = _both_paths(lambda: cupyconv.unfold(x, kernel, **kw), EmulatedDevice(order=order))
    assert cols.shape == cols_ref.shape
    numpy.testing.assert_array_equal(cols, cols_ref)  # a pure copy: bit-identical
    c = _random(cols_ref.shape, numpy.float64, seed=1)
    out, out_ref = _both_paths(lambda: cupyconv.fold(c, shape[-2:], kernel, **kw), EmulatedDevice(order=order))
    assert out.shape == out_ref.shape == shape
    numpy.testing.assert_allclose(out, out_ref, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_every_dtype(dtype):
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    shape, kernel, dilation, padding, stride = CASES[1]
    kw = dict(dilation=dilation, padding=padding, stride=stride)
    x = _random(shape, dtype)
    cols, cols_ref = _both_paths(lambda: cupyconv.unfold(x, kernel, **kw), EmulatedDevice())
    assert cols.dtype == x.dtype
    numpy.testing.assert_array_equal(cols.astype(numpy.float64), cols_ref.astype(numpy.float64))
    out, out_ref = _both_paths(lambda: cupyconv.fold(cols_ref, shape[-2:], kernel, **kw), EmulatedDevice())
    assert out.dtype == x.dtype
    # Both sum in float32 (half types) or the dtype itself, possibly in another order: one rounding apart.
    tol = 1e-2 if numpy.dtype(dtype).itemsize == 2 else 1e-5
    numpy.testing.assert_allclose(out.astype(numpy.float64), out_ref.astype(numpy.float64), rtol=tol, atol=tol)


class RecordingDevice(EmulatedDevice):
    """An EmulatedDevice that remembers the arguments of every launch."""

    def __init__(self, **options):
        super().__init__(**options)
        self.launches = []

    def launch(self, source, name, grid, block, args, shared_mem=0):
        self.launches.append((name, list(args)))
        super().launch(source, name, grid, block, args, shared_mem)


@pytest.mark.parametrize("view", ["transposed", "negative_strides", "channel_slice"])
def test_strided_input_is_read_in_place(view):
    base = _random((3, 4, 6, 9), numpy.float32)
    x = {"transposed": base.transpose(1, 0, 3, 2),
         "negative_strides": base[:, ::-1, :, ::-2],
         "channel_slice": base[:, 1:3]}[view]
    device = RecordingDevice()
    with _device.use_device(device):
        cols = cupyconv.unfold(x, (2, 3), padding=1, stride=(1, 2))
    numpy.testing.assert_array_equal(cols, cupyconv.unfold(numpy.ascontiguousarray(x), (2, 3), padding=1,
                                                           stride=(1, 2)))
    (name, args), = device.launches
    assert name.startswith("unfold_im2col<float,")
    assert numpy.shares_memory(args[0], base), "the kernel should read the strided view, not a copy"


#: (kernel, dilation, padding, stride) of the vector path's cases, on 16 x 16 planes whose output rows are 16 wide
#: (a multiple of every dtype's V = 16 / itemsize): the left padding puts each tap at another offset into the
#: aligned vectors (0 .. V - 1, and whole vectors of padding), and the lanes at both ends of a row copy element by
#: element; per-side padding, dilation and a vertical stride as in CASES.
VECTOR_WINDOWS = [
    (3, 1, 1, 1),
    ((2, 3), (1, 2), ((1, 0), (3, 1)), (2, 1)),
    ((3, 5), (2, 1), ((2, 2), (0, 4)), 1),
    (1, 1, 0, 1),
    ((3, 9), 1, ((1, 1), (8, 0)), 1),
    (3, 3, "same", (3, 1)),
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_vector_path_matches_cpu_path(dtype):
    """unfold_im2col's vector instantiation (RUN = 16 / itemsize: 16-byte loads and stores) copies every window bit
    for bit, in every dtype, forward and reverse order; the launches show it ran, not the scalar one."""
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    for k, (kernel, dilation, padding, stride) in enumerate(VECTOR_WINDOWS):
        x = _random((2, 3, 16, 16), dtype, seed=k)
        kw = dict(dilation=dilation, padding=padding, stride=stride)
        device = RecordingDevice(order="reverse" if k % 2 else "forward")
        cols, cols_ref = _both_paths(lambda: cupyconv.unfold(x, kernel, **kw), device)
        run = 16 // numpy.dtype(dtype).itemsize
        assert [name for name, _ in device.launches] == [_kernels.kernel_name("unfold_im2col", dtype, "int", run)]
        numpy.testing.assert_array_equal(cols.view(numpy.uint8), cols_ref.view(numpy.uint8), err_msg=str(kernel))
    # Rows of 13 and of 5 pixels in rows of 16 (aligned): the vectors across the row's end hold pixels past it that
    # must read as padding; those lanes copy element by element (from pixel 0 on, for the rows of 5).
    wide = _random((2, 3, 16, 16), dtype, seed=9)
    for width, padding in ((13, ((1, 1), (2, 3))), (5, ((1, 1), (6, 7)))):
        x = wide[..., :width]
        device = RecordingDevice()
        cols, cols_ref = _both_paths(lambda: cupyconv.unfold(x, 3, padding=padding), device)
        assert cols.shape[-1] == 16 * 16 and device.launches[0][0].endswith(f", {run}>")
        numpy.testing.assert_array_equal(cols.view(numpy.uint8), cols_ref.view(numpy.uint8), err_msg=str(width))


#: fold's vector path (16 x 16 planes, stride 1 along x): VECTOR_WINDOWS, and output rows wider than the plane
#: (24 and 32 pixels from padding: every run's taps read whole vectors of padding on both sides) or as wide through a
#: 9-wide kernel.
FOLD_VECTOR_WINDOWS = VECTOR_WINDOWS + [((1, 1), 1, ((0, 1), (4, 4)), 1), ((3, 1), (1, 1), ((1, 1), (0, 16)), 1)]


def _fold_scalar(monkeypatch, c, size, kernel, kw):
    """fold of c through fold_col2im<T, I, 1> (one thread per position), the vector path's reference."""
    from cupyconv.ops import unfold
    device = RecordingDevice()
    with monkeypatch.context() as m:
        m.setattr(unfold, "fold_run", lambda dtype: 1)
        with _device.use_device(device):
            out = cupyconv.fold(c, size, kernel, **kw)
    assert device.launches[-1][0].endswith(", 1, false>")
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fold_vector_path_matches_scalar_kernel(dtype, monkeypatch):
    """fold_col2im's vector instantiation (RUN = 8 in the 16-bit types: 16-byte loads and stores, the loads of 3
    taps issued before their adds) gives the one-position-a-thread kernel's bits, in both types, forward and reverse
    order, on fresh random cols into poisoned outputs, and the CPU path's sums within one rounding; the launches
    show it ran."""
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    run = 8
    for k, (kernel, dilation, padding, stride) in enumerate(FOLD_VECTOR_WINDOWS):
        kw = dict(dilation=dilation, padding=padding, stride=stride)
        cols_shape = cupyconv.unfold(numpy.zeros((2, 3, 16, 16), numpy.float32), kernel, **kw).shape
        c = _random(cols_shape, dtype, seed=20 + k)
        device = RecordingDevice(order="reverse" if k % 2 else "forward")
        with _device.use_device(device):
            out = cupyconv.fold(c, (16, 16), kernel, **kw)
        assert [name for name, _ in device.launches] == [_kernels.kernel_name("fold_col2im", dtype, "int", run, False)]
        expected = _fold_scalar(monkeypatch, c, (16, 16), kernel, kw)
        numpy.testing.assert_array_equal(out.view(numpy.uint8), expected.view(numpy.uint8), err_msg=str(kernel))
        exact = cupyconv.fold(c.astype(numpy.float64), (16, 16), kernel, **kw)
        numpy.testing.assert_allclose(out.astype(numpy.float64), exact, rtol=1e-2, atol=1e-2, err_msg=str(kernel))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fold_vector_path_adds_taps_in_order(dtype, monkeypatch):
    """Each position sums its taps in the order (i, j), as the gather does: with a 1 x 3 kernel whose taps hold 2048,
    -2048 and 2^-14 everywhere, float32 keeps 2^-14 only where the first two cancel first ((c + b) + a is 0)."""
    cols = numpy.empty((2, 3 * 3, 16 * 16), numpy.float32)
    cols[:, 0::3], cols[:, 1::3], cols[:, 2::3] = 2048.0, -2048.0, 2.0**-14
    c = cols.astype(dtype)
    device = RecordingDevice()
    with _device.use_device(device):
        out = cupyconv.fold(c, (16, 16), (1, 3), padding=(0, 1))
    assert device.launches[-1][0].endswith(", 8, false>")
    numpy.testing.assert_array_equal(out[..., 1:-1].astype(numpy.float64), 2.0**-14)   # every tap read: all three
    expected = _fold_scalar(monkeypatch, c, (16, 16), (1, 3), dict(padding=(0, 1)))
    numpy.testing.assert_array_equal(out.view(numpy.uint8), expected.view(numpy.uint8))


def test_fold_vector_path_needs_alignment(monkeypatch):
    """float16: planes 14 wide, output rows of 14 from planes of 16, a stride of 2 along x, cols one element into its
    buffer take the scalar kernel, with the same result, and so do float32's (no vector fold); 64-bit indices take
    the vector one too."""
    def fold(c, size, kernel, **kw):
        device = RecordingDevice()
        with _device.use_device(device):
            out = cupyconv.fold(c, size, kernel, **kw)
        numpy.testing.assert_allclose(out, cupyconv.fold(c, size, kernel, **kw), rtol=1e-2, atol=1e-2)
        return [name for name, _ in device.launches]

    c = _random((2, 27, 16 * 14), numpy.float16)
    assert fold(c, (16, 14), 3, padding=1) == ["fold_col2im<__half, int, 1, false>"]
    assert fold(c, (16, 16), 3, padding=((1, 1), (0, 0))) == ["fold_col2im<__half, int, 1, false>"]
    c = _random((2, 27, 16 * 8), numpy.float16)
    assert fold(c, (16, 16), 3, padding=1, stride=(1, 2)) == ["fold_col2im<__half, int, 1, false>"]
    c = _random((2, 27, 16 * 16), numpy.float16)
    shifted = _random((c.size + 1,), numpy.float16)[1:].reshape(c.shape)
    assert fold(shifted, (16, 16), 3, padding=1) == ["fold_col2im<__half, int, 1, false>"]
    assert fold(c, (16, 16), 3, padding=1) == ["fold_col2im<__half, int, 8, false>"]
    assert fold(c.astype(numpy.float32), (16, 16), 3, padding=1) == ["fold_col2im<float, int, 1, false>"]
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)
    assert fold(c, (16, 16), 3, padding=1) == ["fold_col2im<__half, long long, 8, false>"]
    assert fold(shifted, (16, 16), 3, padding=1) == ["fold_col2im<__half, long long, 1, false>"]


def test_vector_path_needs_alignment():
    """A view that starts one element into its buffer (every stride a multiple of 4 floats), rows of 17, or output
    rows of 13 take the scalar kernel (a 16-byte access there faults on a GPU, and fails the emulator's alignment
    check), with the same result."""
    base = _random((2, 3, 16, 17), numpy.float32)
    shifted = _random((2 * 3 * 16 * 16 + 1,), numpy.float32)[1:].reshape(2, 3, 16, 16)
    assert shifted.ctypes.data % 16 == 4
    for x in (shifted, base[..., :16], numpy.ascontiguousarray(base[..., :13])):
        device = RecordingDevice()
        cols, cols_ref = _both_paths(lambda: cupyconv.unfold(x, 3, padding=1), device)
        assert [name for name, _ in device.launches] == ["unfold_im2col<float, int, 1>"]
        numpy.testing.assert_array_equal(cols, cols_ref)
    aligned = numpy.ascontiguousarray(base[..., :16])
    device = RecordingDevice()
    with _device.use_device(device):
        cupyconv.unfold(aligned, 3, padding=1)
    assert [name for name, _ in device.launches] == ["unfold_im2col<float, int, 4>"]


def test_fold_accepts_non_contiguous_cols():
    shape, kernel, dilation, padding, stride = CASES[0]
    cols = cupyconv.unfold(_random(shape, numpy.float64), kernel, dilation=dilation, padding=padding,
                           stride=stride)
    wide = numpy.concatenate([cols, cols], axis=-1)[..., ::2]  # same shape, every other element
    expected = cupyconv.fold(numpy.ascontiguousarray(wide), shape[-2:], kernel, padding=padding)
    with _device.use_device(EmulatedDevice()):
        out = cupyconv.fold(wide, shape[-2:], kernel, padding=padding)
    numpy.testing.assert_allclose(out, expected, rtol=1e-13, atol=1e-13)


def test_64_bit_index_variants(monkeypatch):
    """Force the `long long` instantiations (chosen by extents above 2^31) so the emulator executes them."""
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)  # every extent "passes 2^31": long long
    device = RecordingDevice()
    shape, kernel, dilation, padding, stride = CASES[2]
    x = _random(shape, numpy.float64)
    kw = dict(dilation=dilation, padding=padding, stride=stride)
    with _device.use_device(device):
        cols = cupyconv.unfold(x, kernel, **kw)
        out = cupyconv.fold(cols, shape[-2:], kernel, **kw)
    assert [name for name, _ in device.launches] == ["unfold_im2col<double, long long, 1>",
                                                     "fold_col2im<double, long long, 1, false>"]
    numpy.testing.assert_array_equal(cols, cupyconv.unfold(x, kernel, **kw))
    numpy.testing.assert_allclose(out, cupyconv.fold(cols, shape[-2:], kernel, **kw), rtol=1e-13)


def test_fast_divmod_magic_divides_exactly():
    """The host's FastDivmod multiplier (the kernels take it as an argument) gives n / d by common.cuh's formula,
    (umulhi(m, n) + n) >> ceil(log2 d), for every n below 2^31: checked at the ends and at random, against //."""
    rng = numpy.random.default_rng(5)
    divisors = [1, 2, 3, 7, 56, 3136, 65535, 2**29 + 256, 2**31 - 1, *rng.integers(1, 2**31 - 1, 40).tolist()]
    for d in divisors:
        m, shift = _kernels.fast_divmod_magic(d), (d - 1).bit_length()
        assert 0 < m < 2**32
        n = numpy.array([0, 1, d - 1, d, d + 1, 2**31 - 1, *rng.integers(0, 2**31, 200).tolist()], dtype=numpy.uint64)
        q = (((n * numpy.uint64(m)) >> numpy.uint64(32)) + n) >> numpy.uint64(shift)
        numpy.testing.assert_array_equal(q, n // numpy.uint64(d), err_msg=f"divisor {d}")
    with pytest.raises(ValueError, match="fast_divmod_magic"):
        _kernels.fast_divmod_magic(0)


def test_grids_stop_at_unfold_blocks():
    """Large problems launch UNFOLD_BLOCKS blocks whose threads loop, small ones a block per 256 units."""
    from cupyconv.ops import unfold
    assert unfold._launch(10**9) == ((unfold.UNFOLD_BLOCKS,), (256,))
    assert unfold._launch(1000) == ((4,), (256,))


def test_index_type_switches_at_2_to_the_31():
    assert _kernels.index_type(2**31 - 1) == "int"
    assert _kernels.index_type(10, 2**31) == "long long"


def test_backward_functions_are_the_adjoint_ops():
    shape, kernel, dilation, padding, stride = CASES[1]
    kw = dict(dilation=dilation, padding=padding, stride=stride)
    x = _random(shape, numpy.float64)
    with _device.use_device(EmulatedDevice()):
        cols = cupyconv.unfold(x, kernel, **kw)
        c = _random(cols.shape, numpy.float64, seed=2)
        grad_x = cupyconv.unfold_backward(c, shape[-2:], kernel, **kw)
        grad_cols = cupyconv.fold_backward(x, kernel, **kw)
    # <unfold(x), c> == <x, unfold_backward(c)> and fold_backward is unfold.
    numpy.testing.assert_allclose(numpy.vdot(cols, c), numpy.vdot(x, grad_x), rtol=1e-12)
    numpy.testing.assert_array_equal(grad_cols, cols)


def test_kernels_are_clean_under_address_sanitizer():
    """One shape per kernel with libasan preloaded: any out-of-bounds read or write aborts the child."""
    process = run_under_asan(
        "import numpy, cupyconv\n"
        "from cupyconv import _device\n"
        "from emulator import EmulatedDevice\n"
        "x = numpy.random.default_rng(0).standard_normal((2, 3, 5, 7))[:, :, ::-1]\n"
        "kw = dict(dilation=(2, 1), padding=((2, 0), (1, 3)), stride=(1, 2))\n"
        "with _device.use_device(EmulatedDevice()):\n"
        "    cols = cupyconv.unfold(x, (2, 3), **kw)\n"
        "    out = cupyconv.fold(cols, (5, 7), (2, 3), **kw)\n"
        "    v = numpy.random.default_rng(1).standard_normal((2, 3, 5, 16)).astype(numpy.float16)\n"
        "    cols_v = cupyconv.unfold(v, (2, 3), padding=((1, 0), (1, 1)))\n"   # the vector kernel, both row ends
        "    out_v = cupyconv.fold(cols_v, (5, 16), (2, 3), padding=((1, 0), (1, 1)))\n"   # the vector fold
        "assert numpy.allclose(out_v, cupyconv.fold(cols_v, (5, 16), (2, 3), padding=((1, 0), (1, 1))), atol=1e-2)\n"
        "assert numpy.array_equal(cols_v, cupyconv.unfold(v, (2, 3), padding=((1, 0), (1, 1))))\n"
        "assert numpy.array_equal(cols, cupyconv.unfold(x, (2, 3), **kw))\n"
        "assert numpy.allclose(out, cupyconv.fold(cols, (5, 7), (2, 3), **kw))\n"
        "print('ok')\n")
    assert_clean_under_asan(process)
    assert "ok" in process.stdout


# ---------------------------------------------------------------------------------------------------------
# Bug classes covered on purpose (issue 12; tests/bug_classes.py, table in tests/emulator/README.md)

#: (kernel, stride, dilation) of the windows tried with each side's padding alone.
WINDOWS = [(3, 1, 1), ((2, 3), (2, 1), (1, 2)), (3, 2, 2)]


def _pair(v):
    return (v, v) if isinstance(v, int) else v


@pytest.mark.parametrize("window", WINDOWS, ids=["k3", "k2x3_stride21_dilation12", "k3_stride2_dilation2"])
def test_padding_per_side_and_last_row_and_column(window):
    """unfold and fold with each side's padding differing alone, on planes whose last window ends on the last
    padded row and column (it reads the last input row and column, and the padding past them where there is)."""
    kernel, stride, dilation = (_pair(v) for v in window)
    for k, (side, padding) in enumerate(bug_classes.per_side_paddings(1)):
        size = tuple(bug_classes.touching_size(5, *args) for args in zip(kernel, stride, dilation, padding))
        x = _random((2, 3, *size), numpy.float64, seed=k)
        kw = dict(dilation=dilation, padding=padding, stride=stride)
        order = "reverse" if k % 2 else "forward"
        cols, cols_ref = _both_paths(lambda: cupyconv.unfold(x, kernel, **kw), EmulatedDevice(order))
        numpy.testing.assert_array_equal(cols, cols_ref, err_msg=side)
        c = _random(cols_ref.shape, numpy.float64, seed=10 + k)
        out, out_ref = _both_paths(lambda: cupyconv.fold(c, size, kernel, **kw), EmulatedDevice(order))
        numpy.testing.assert_allclose(out, out_ref, rtol=1e-13, atol=1e-13, err_msg=side)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fold_accumulates_in_float32(dtype):
    """fold's sum of overlapping windows (up to 9 per pixel) on values a 16-bit running sum rounds: every pixel
    must be the float64 sum rounded once."""
    shape, kernel, kw = (2, 3, 7, 6), 3, dict(padding=((1, 0), (0, 1)))
    cols_shape = cupyconv.unfold(numpy.zeros(shape), kernel, **kw).shape
    cols = bug_classes.sum_terms(numpy.random.default_rng(3), cols_shape, dtype)
    with _device.use_device(EmulatedDevice()):
        out = cupyconv.fold(cols, shape[-2:], kernel, **kw)
    bug_classes.assert_rounded_once(out, cupyconv.fold(cols.astype(numpy.float64), shape[-2:], kernel, **kw), dtype)


def test_grid_loops_with_several_blocks(monkeypatch):
    """Three blocks of 32 threads for 8 or more blocks' worth of windows or pixels: a grid-stride loop that
    starts at threadIdx.x, or does not stride, leaves columns or pixels unwritten (NaN)."""
    loops = bug_classes.GridLoops(monkeypatch, cap=3)
    shape, kernel, dilation, padding, stride = CASES[1]
    kw = dict(dilation=dilation, padding=padding, stride=stride)
    x = _random(shape, numpy.float64)
    cols, cols_ref = _both_paths(lambda: cupyconv.unfold(x, kernel, **kw), loops.device(EmulatedDevice("reverse")))
    numpy.testing.assert_array_equal(cols, cols_ref)
    out, out_ref = _both_paths(lambda: cupyconv.fold(cols_ref, shape[-2:], kernel, **kw),
                               loops.device(EmulatedDevice()))
    numpy.testing.assert_allclose(out, out_ref, rtol=1e-13, atol=1e-13)
    assert loops.looped() == loops.capped() == {"unfold_im2col", "fold_col2im"}, loops.launches
    x = _random((2, 3, 16, 16), numpy.float64)   # the vector instantiation: 2 x 3 x 16 x 8 runs of 2 pixels
    device = RecordingDevice(order="reverse")
    cols, cols_ref = _both_paths(lambda: cupyconv.unfold(x, 3, padding=1), loops.device(device))
    numpy.testing.assert_array_equal(cols, cols_ref)
    (name, _), (_, blocks, units) = device.launches[-1], loops.launches[-1]
    assert name == "unfold_im2col<double, int, 2>" and 1 < blocks < units, loops.launches
    device = RecordingDevice()   # the vector fold: 2 x 3 x 16 x 2 runs of 8 positions
    c = cols_ref.astype(numpy.float16)
    out, out_ref = _both_paths(lambda: cupyconv.fold(c, (16, 16), 3, padding=1), loops.device(device))
    numpy.testing.assert_allclose(out.astype(numpy.float64), out_ref.astype(numpy.float64), rtol=1e-2, atol=1e-2)
    (name, _), (_, blocks, units) = device.launches[-1], loops.launches[-1]
    assert name == "fold_col2im<__half, int, 8, false>" and 1 < blocks < units, loops.launches


#: A plane whose last rows start past 2^31 ((H - 1) * W > 2^31), and a channel count whose last channel's cols rows
#: do (c * kH * kW past 2^31 for the 2 x 2 kernel).
HUGE_PLANE, HUGE_CHANNELS = (40000, 60000), 2**29 + 256


def test_64_bit_indices_past_2_31(monkeypatch):
    """unfold and fold take their `long long` instantiations on a 2.4e9-pixel plane and on 2^29 channels (sparse
    memory; only the last block of each launch runs: bug_classes.SparseDevice).  Every product of their index
    arithmetic passes 2^31 there, so one computed in `int` overflows, which the emulator's UBSan check turns
    into a failed launch; the columns and pixels the last block writes match the CPU path on a crop."""
    bug_classes.lift_grid_cap(monkeypatch)
    rng = numpy.random.default_rng(7)
    kernel, kw, rows = 2, dict(padding=((1, 0), (0, 1))), 4
    h, w = HUGE_PLANE
    x = bug_classes.sparse_zeros((1, 1, h, w), numpy.float16)
    x[..., -rows:, :] = _random((rows, w), numpy.float16)
    device = bug_classes.SparseDevice(tail=1024)
    with _device.use_device(device):
        cols = cupyconv.unfold(x, kernel, **kw)  # (1, 4, H * W): the flat tail is the last tap's row
    # output row oy reads input rows oy - 1 and oy: the crop's windows are the last ones of the whole plane
    crop = dict(padding=((0, 0), (0, 1)))
    bug_classes.assert_tail_written(cols, cupyconv.unfold(x[..., -rows:, :], kernel, **crop)[0, -1, -1024:],
                                    numpy.float16, 256, "unfold, plane")
    with _device.use_device(device):
        cols = cupyconv.unfold(x, kernel, padding=((1, 0), (0, 0)))  # rows of 59999 windows: one thread per window
    # the last block holds the last 40000 * 59999 % 256 = 192 windows
    bug_classes.assert_tail_written(cols, cupyconv.unfold(x[..., -rows:, :], kernel)[0, -1, -1024:], numpy.float16,
                                    192, "unfold, plane, scalar")
    cols = bug_classes.sparse_zeros((1, 4, h * w), numpy.float16)
    cols[..., -rows * w:] = _random((4, rows * w), numpy.float16, seed=8)
    with _device.use_device(device):
        out = cupyconv.fold(cols, (h, w), kernel, **kw)
    expected = cupyconv.fold(cols[..., -(rows - 1) * w:], (rows, w), kernel, **crop)  # windows of the last rows
    bug_classes.assert_tail_written(out, expected[..., -1, -1024:], numpy.float16, 256, "fold, plane")

    x = bug_classes.sparse_zeros((1, HUGE_CHANNELS, 1, 1), numpy.float16)
    x[:, -256:] = rng.standard_normal((1, 256, 1, 1))
    with _device.use_device(device):
        cols = cupyconv.unfold(x, kernel, **kw)  # (1, 4 C, 1)
    bug_classes.assert_tail_written(cols, cupyconv.unfold(x[:, -256:], kernel, **kw), numpy.float16, 256,
                                    "unfold, channels")
    cols = bug_classes.sparse_zeros((1, 4 * HUGE_CHANNELS, 1), numpy.float16)
    cols[:, -1024:] = rng.standard_normal((1, 1024, 1))
    with _device.use_device(device):
        out = cupyconv.fold(cols, (1, 1), kernel, **kw)
    bug_classes.assert_tail_written(out, cupyconv.fold(cols[:, -1024:], (1, 1), kernel, **kw), numpy.float16, 256,
                                    "fold, channels")
    # output rows of 60000 pixels (16-byte aligned) take the vector instantiations, of 59999 and 1 pixels the scalar
    # ones
    assert device.launches == ["unfold_im2col<__half, long long, 8>", "unfold_im2col<__half, long long, 1>",
                               "fold_col2im<__half, long long, 8, false>", "unfold_im2col<__half, long long, 1>",
                               "fold_col2im<__half, long long, 1, false>"]


def test_64_bit_case_catches_an_int_product(monkeypatch):
    """The proof that the cases above can fail: unfold.cu with one (I) cast taken out of its channel offset,
    `c * kernel_h * kernel_w * cols_stride_row`, fails the launch on 2^29 channels with UBSan's report.  The copy
    lives under the emulator's cache, one instantiation of it, so it compiles once per machine."""
    from emulator import KernelFailure, cache_root
    from cupyconv.ops import unfold
    bug_classes.lift_grid_cap(monkeypatch)
    mutant = cache_root() / "mutants" / "unfold-int-channel-offset"
    mutant.mkdir(parents=True, exist_ok=True)
    source = (_device.kernel_dir() / "unfold.cu").read_text()
    cast = "(I)c * kernel_h * kernel_w * cols_stride_row"
    assert source.count(cast) == 2   # unfold_windows and unfold_runs
    for name, text in (("common.cuh", (_device.kernel_dir() / "common.cuh").read_text()),
                       # a kernel_dir of its own gets no -D options: the file's constant goes in its text
                       ("unfold.cu", f"#define FOLD_PLANES {unfold.FOLD_PLANES}\n" + source.replace(cast, cast[3:]))):
        if not (mutant / name).is_file() or (mutant / name).read_text() != text:
            (mutant / name).write_text(text)
    x = bug_classes.sparse_zeros((1, HUGE_CHANNELS, 1, 1), numpy.float16)
    device = bug_classes.SparseDevice(kernel_dir=mutant,
                                      instantiations=[("unfold.cu", "unfold_im2col<__half, long long, 1>")])
    overflow = r"signed integer overflow: 2 \* 1073741\d+ in type 'int' at .*unfold.cu:\d+"
    with pytest.raises(KernelFailure, match=overflow):
        with _device.use_device(device):
            cupyconv.unfold(x, 2, padding=((1, 0), (0, 1)))


# ---------------------------------------------------------------------------------------------------------
# The same cases on a real GPU (pytest -m gpu)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gpu_matches_cpu_path(case, dtype):
    cupy = pytest.importorskip("cupy")
    shape, kernel, dilation, padding, stride = case
    kw = dict(dilation=dilation, padding=padding, stride=stride)
    x = _random(shape, dtype)
    cols = cupyconv.unfold(cupy.asarray(x), kernel, **kw)
    assert isinstance(cols, cupy.ndarray)
    numpy.testing.assert_array_equal(cols.get(), cupyconv.unfold(x, kernel, **kw))
    c = _random(cols.shape, dtype, seed=1)
    out = cupyconv.fold(cupy.asarray(c), shape[-2:], kernel, **kw)
    tol = 1e-2 if numpy.dtype(dtype).itemsize == 2 else 1e-5
    numpy.testing.assert_allclose(out.get().astype(numpy.float64),
                                  cupyconv.fold(c, shape[-2:], kernel, **kw).astype(numpy.float64),
                                  rtol=tol, atol=tol)


@pytest.mark.gpu
def test_gpu_reads_strided_views_and_torch_tensors():
    cupy = pytest.importorskip("cupy")
    base = cupy.asarray(_random((3, 4, 6, 9), numpy.float32))
    x = base.transpose(1, 0, 3, 2)[:, :, ::-1]
    numpy.testing.assert_array_equal(cupyconv.unfold(x, 3, padding=1).get(),
                                     cupyconv.unfold(x.get(), 3, padding=1))
    torch = pytest.importorskip("torch")
    t = torch.randn(2, 3, 8, 8, device="cuda")
    got = cupyconv.unfold(t, 3, padding=1)
    assert isinstance(got, torch.Tensor) and got.device == t.device
    torch.testing.assert_close(got, torch.nn.functional.unfold(t, 3, padding=1))


@pytest.mark.parametrize("dtype, x_shape, kwargs, run", [
    # float32: the gather, 3 channels, so that a thread's 8 planes wrap across channels and images (planes 9)
    ("float32", (3, 5, 4, 3), dict(stride=2, padding=1, output_padding=1), 1),
    # float16, 16 x 16 planes from 16 x 16 at stride 1: the vector fold (runs of 8), 3 channels
    ("float16", (2, 5, 16, 16), dict(padding=1), 8),
    # float16, planes 15 wide: the gather in a 16-bit type
    ("float16", (2, 5, 7, 7), dict(stride=2, padding=1), 1),
], ids=["gather_float32", "vector_float16", "gather_float16"])
def test_fold_adds_conv_transpose_bias(dtype, x_shape, kwargs, run):
    """conv_transpose2d through the GEMM and fold_col2im: the fold (BIAS true) adds the bias to each position's sum
    before its rounding, plane p's channel p % C, in both instantiations; no array work adds it after.  In float32
    the bits are those of the fold without bias plus the bias (one float32 add, as before it was fused); in float16
    within a rounding of torch in float64.  Outputs poisoned."""
    rng = numpy.random.default_rng(31)
    x = rng.standard_normal(x_shape).astype(dtype)
    weight = (rng.standard_normal((x_shape[1], 3, 3, 3)) / 4).astype(dtype)
    bias = (rng.standard_normal(3) * 4).astype(dtype)
    outs = []
    for b in (bias, None):
        device = RecordingDevice(order="reverse")
        device.add = lambda dst, src: pytest.fail("the bias was added after the fold")
        with _device.use_device(device):
            outs.append(cupyconv.conv_transpose2d(x, weight, b, algorithm="im2col_gemm", **kwargs))
        folds = [name for name, _ in device.launches if name.startswith("fold_col2im")]
        # BIAS a template flag: the unbiased fold is the instantiation every backward runs, its code as before the bias
        assert folds == [_kernels.kernel_name("fold_col2im", dtype, "int", run, b is not None)], device.launches
    got, plain = outs
    assert numpy.isfinite(got.astype(numpy.float64)).all()
    if dtype == "float32":
        numpy.testing.assert_array_equal(got, plain + bias[:, None, None])
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.conv_transpose2d(*(torch.from_numpy(a.astype(numpy.float64)) for a in (x, weight, bias)),
                                                **kwargs).numpy()
    numpy.testing.assert_allclose(got.astype(numpy.float64), want, rtol=2e-3, atol=2e-3 * numpy.abs(want).max())


def test_fold_bias_in_batch_chunks_and_bands():
    """The GEMM input gradient in batch chunks (each fold writes its images of the output, with the bias) and in
    bands of output rows (summed after the folds: the bias added once, after them), float32 bits as unfused."""
    from cupyconv import settings
    rng = numpy.random.default_rng(32)
    x = rng.standard_normal((3, 4, 6, 5)).astype(numpy.float32)
    weight = (rng.standard_normal((4, 3, 3, 3)) / 4).astype(numpy.float32)
    bias = (rng.standard_normal(3) * 4).astype(numpy.float32)
    for limit, adds in ((9000, 0), (400, 1)):   # two images' workspace per chunk; less than one image's: bands
        added, outs = [], []
        for b in (bias, None):
            device = RecordingDevice()
            added.append(0)
            device.add = lambda dst, src, device=device: (added.__setitem__(-1, added[-1] + 1),
                                                          EmulatedDevice.add(device, dst, src))
            with _device.use_device(device), settings.workspace_limit(limit):
                outs.append(cupyconv.conv_transpose2d(x, weight, b, stride=2, padding=1, algorithm="im2col_gemm"))
            assert sum(name.startswith("fold_col2im") for name, _ in device.launches) > 1, device.launches
        assert added[0] - added[1] == adds and (added[1] == 0) == (adds == 0), (limit, added)   # bands: summed
        numpy.testing.assert_array_equal(outs[0], outs[1] + bias[:, None, None])
