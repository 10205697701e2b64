"""Memory: the workspace limit bounds the column matrices (and depth windows) alive at once."""
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
    """8 images in chunks of 2 (forward; 1 or 2 for the weight gradient, whose grad_output copy the kernel path
    counts too): each chunk's columns are freed before the next chunk's are built."""
    x, w, gy = conv_problem(numpy.random.default_rng(2))
    limit = 2 * 4 * 9 * 34 * 34 * 4
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
    limit = 2 * lift.depth_window_bytes(ConvSpec.for_conv("conv3d", x, w, None, 1, 1, 1, 1, nd=3), 4)
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
