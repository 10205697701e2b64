"""The 3-D fold's kernels (raw_kernels/lift.cu: depth_windows, depth_fold) through the CPU emulator, against the CPU
path's array copies and adds (ops/lift.py), which tests/test_nd.py checks against torch and float64 loops.

A window is a copy and the fold sums its taps in the CPU path's order, so both must match it bit for bit.  The
bug classes: each side's depth padding alone, stride and dilation along depth, a kernel deeper than the input, a
chunk of output depths that does not start at 0, x through any strides (a depth-reversed view), every dtype,
planes and pixels looping over a small grid, both block orders, 64-bit indices (`long long`, and a window array
past 2^31 elements on the sparse device), poisoned outputs (the emulator's `empty`).
"""
import numpy
import pytest

import bug_classes
from cupyconv import _kernels
from cupyconv._arrays import compute_dtype
from cupyconv._spec import ConvSpec
from cupyconv.ops import lift
from emulator import EmulatedDevice, assert_clean_under_asan, run_under_asan

# (x shape (m, C, D, H, W), kernel depth, stride, dilation, (front, back) padding, output depths of the chunk)
CASES = [
    ((2, 3, 5, 4, 3), 3, 1, 1, (1, 1), None),
    ((1, 2, 7, 3, 5), 3, 2, 1, (1, 0), None),       # stride: the fold's taps skip depths
    ((2, 2, 6, 2, 3), 2, 1, 3, (0, 2), None),       # dilation, back padding only
    ((1, 3, 2, 3, 3), 5, 1, 1, (2, 2), None),       # kernel deeper than the input
    ((2, 2, 9, 3, 4), 3, 2, 2, (2, 1), range(1, 4)),  # a slab of output depths
    ((1, 2, 4, 3, 3), 2, 1, 1, (0, 3), None),       # back padding past the kernel's reach: tap 0 too reads it
]
IDS = [f"case{i}" for i in range(len(CASES))]


def spec_of(shape, kd, stride, dilation, padding):
    x, weight = numpy.broadcast_to(0.0, shape), numpy.empty((2, shape[1], kd, 1, 1))   # shapes only
    return ConvSpec.for_conv("conv3d", x, weight, None, stride, (padding, (0, 0), (0, 0)), dilation, 1, nd=3)


def random(shape, dtype, seed):
    return numpy.random.default_rng(seed).standard_normal(shape).astype(bug_classes.numpy_dtype(dtype))


def bits(a):
    return numpy.ascontiguousarray(a).view(numpy.uint8)


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_windows_and_fold_equal_the_cpu_path_bit_for_bit(case, order):
    shape, kd, stride, dilation, padding, depths = case
    spec = spec_of(shape, kd, stride, dilation, padding)
    depths = range(spec.out_size[0]) if depths is None else depths
    device = EmulatedDevice(order=order)
    # x through a negative depth stride, rows one element longer than W (no flat rows: each pixel split into row
    # and column)
    x = random((*shape[:-1], shape[-1] + 1), "float64", 1)[:, :, ::-1, :, 1:]
    windows = lift.depth_windows(device, x, spec, depths)
    expected = lift.depth_windows(None, x, spec, depths)
    assert windows.shape == expected.shape
    numpy.testing.assert_array_equal(bits(windows), bits(expected))
    g = random(expected.shape, "float64", 2)
    start = random(shape, "float64", 3)
    out, want = start.copy(), start.copy()
    lift.depth_fold_into(device, out, g, spec, depths)
    lift.depth_fold_into(None, want, g, spec, depths)
    numpy.testing.assert_array_equal(bits(out), bits(want))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_every_dtype_and_the_compute_dtype_sums(dtype):
    shape, kd, stride, dilation, padding, _ = CASES[1]
    spec, device = spec_of(shape, kd, stride, dilation, padding), EmulatedDevice()
    x = random(shape, dtype, 4)
    windows = lift.depth_windows(device, x, spec)
    assert windows.dtype == x.dtype
    numpy.testing.assert_array_equal(bits(windows), bits(lift.depth_windows(None, x, spec)))
    g = random(windows.shape, dtype, 5)
    out = random(shape, compute_dtype(x.dtype), 6)
    want = out.copy()
    lift.depth_fold_into(device, out, g, spec, range(spec.out_size[0]))
    lift.depth_fold_into(None, want, g, spec, range(spec.out_size[0]))
    numpy.testing.assert_array_equal(bits(out), bits(want))   # float sums of 16-bit terms, in tap order


def test_planes_and_pixels_loop_over_a_small_grid(monkeypatch):
    """One block of pixels a plane and two rows of planes: every block loops over planes and over passes of
    LIFT_RUN x 256 pixels."""
    monkeypatch.setattr(lift, "PLANE_BLOCKS", 1)
    monkeypatch.setattr(lift, "MAX_GRID", (2**31 - 1, 2, 65535))
    shape = (2, 3, 4, 47, 53)   # 2,491 pixels: more than one pass of 8 x 256
    spec, device = spec_of(shape, 3, 1, 1, (1, 1)), EmulatedDevice()
    x = random(shape, "float32", 7)
    numpy.testing.assert_array_equal(lift.depth_windows(device, x, spec), lift.depth_windows(None, x, spec))
    g = random((shape[0] * spec.out_size[0], shape[1] * 3, *shape[3:]), "float32", 8)
    out, want = numpy.zeros(shape, numpy.float32), numpy.zeros(shape, numpy.float32)
    lift.depth_fold_into(device, out, g, spec, range(spec.out_size[0]))
    lift.depth_fold_into(None, want, g, spec, range(spec.out_size[0]))
    numpy.testing.assert_array_equal(out, want)


def test_long_long_instantiations(monkeypatch):
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)   # every extent "passes 2^31": long long
    shape, kd, stride, dilation, padding, depths = CASES[4]
    spec = spec_of(shape, kd, stride, dilation, padding)
    device = bug_classes.Recorder()
    x = random(shape, "float32", 9)
    windows = lift.depth_windows(device, x, spec, depths)
    numpy.testing.assert_array_equal(windows, lift.depth_windows(None, x, spec, depths))
    g = random(windows.shape, "float32", 10)
    out, want = numpy.zeros(shape, numpy.float32), numpy.zeros(shape, numpy.float32)
    lift.depth_fold_into(device, out, g, spec, depths)
    lift.depth_fold_into(None, want, g, spec, depths)
    numpy.testing.assert_array_equal(out, want)
    assert device.launches == ["depth_windows<float, long long>", "depth_fold<float, long long>"]


@pytest.mark.parametrize("flat", [True, False], ids=["flat rows", "rows apart"])
def test_windows_past_2_31_elements(flat):
    """Windows of 3 taps over planes of 2^30 pixels (6.4e9 elements), on the sparse device (the last block runs:
    the last LIFT_RUN runs of 256 pixels of every pass over the last plane), from every fourth column of x, whose
    rows follow one another (one pointer stepped over the plane) or lie four elements further apart (each pixel
    split into row and column), so that offsets within a plane pass 2^31: the last plane's last pixels hold x's
    values at the depth they read, through 64-bit offsets."""
    h, w = 2**15, 2**15
    shape = (1, 2, 3, h, w)
    spec = spec_of(shape, 3, 1, 1, (0, 0))
    x = bug_classes.sparse_zeros((*shape[:-1], 4 * w + (0 if flat else 4)), numpy.float32)[..., :4 * w:4]
    tail = random((1024,), "float32", 11)
    x[0, 1, 2, -1, -1024:] = tail                  # plane (c 1, tap 2) of the only output depth reads depth 2
    device = bug_classes.SparseDevice()
    windows = lift.depth_windows(device, x, spec)
    assert windows.size > 2**31 and device.launches == ["depth_windows<float, long long>"]
    bug_classes.assert_tail_written(windows, tail, "float32", least=1024, what="depth_windows")


def test_fold_past_2_31_elements():
    """The fold of a window gradient of 6.4e9 elements (3 taps over planes of 2^30 pixels) on the sparse
    device (the last block runs: the last LIFT_RUN runs of 256 pixels of each pass of PLANE_BLOCKS blocks over the
    last plane): depth 2 of channel 1 receives tap 2's plane, read at a 64-bit offset."""
    h, w = 2**15, 2**15
    shape, pixels = (1, 2, 3, h, w), h * w
    spec = spec_of(shape, 3, 1, 1, (0, 0))
    g = bug_classes.sparse_zeros((1, 6, h, w), numpy.float32)
    tail = random((1024,), "float32", 12)
    g[0, 5].reshape(-1)[-1024:] = tail             # plane (c 1, tap 2) of the only output depth: depth 2
    out = bug_classes.sparse_zeros(shape, numpy.float32)
    device = bug_classes.SparseDevice()
    lift.depth_fold_into(device, out, g, spec, range(1))
    assert device.launches == ["depth_fold<float, long long>"]
    per_block = lift.ELEMENTWISE_BLOCK * lift.LIFT_RUN
    run = per_block * lift.PLANE_BLOCKS
    last_block = numpy.arange(pixels - 1024, pixels) % run >= run - per_block
    assert last_block.sum() >= 256
    numpy.testing.assert_array_equal(out[0, 1, 2].reshape(-1)[-1024:], numpy.where(last_block, tail, 0))


def test_clean_under_asan():
    """conv3d's forward and backward on the emulator with libasan preloaded (both kernels, a depth-reversed x whose
    rows lie apart, padding on both sides, a stride): any out-of-bounds read or write aborts the child."""
    process = run_under_asan(
        "import numpy, cupyconv\n"
        "from cupyconv import _device\n"
        "from emulator import EmulatedDevice\n"
        "rng = numpy.random.default_rng(0)\n"
        "x = rng.standard_normal((2, 3, 6, 4, 6))[:, :, ::-1, :, 1:]\n"
        "w = rng.standard_normal((2, 3, 3, 2, 2))\n"
        "kw = dict(stride=(2, 1, 1), padding=((1, 2), (0, 0), (1, 0)))\n"
        "with _device.use_device(EmulatedDevice()):\n"
        "    y = cupyconv.conv3d(x, w, **kw)\n"
        "    gx, gw, _ = cupyconv.conv3d_backward(numpy.ones_like(y), x, w, **kw)\n"
        "assert numpy.allclose(y, cupyconv.conv3d(x, w, **kw))\n"
        "assert numpy.allclose(gx, cupyconv.conv3d_backward(numpy.ones_like(y), x, w, **kw)[0])\n")
    assert_clean_under_asan(process)
