"""The GPU path with real CuPy arrays, on the CPU (issue 22): `CudaDevice` itself, through tests/emulator's
`CupyHostDevice` (cupy.ndarray objects over host memory, the kernels on the emulator, cuBLAS on its twin).

Every public op, forward and backward, every algorithm, 1-D/2-D/3-D, transposed, depthwise, patch, unfold/fold,
`cupyconv.cudnn` and dask with CuPy chunks runs here against the CPU path on small odd shapes, so every line of
the glue that touches a CuPy object runs in CI.  A CuPy call that the glue makes directly instead of through the
Device (a copy, fill, reduction or conversion: a CuPy kernel) fails here with CuPy's CUDARuntimeError, as a
launch from a CuPy array failed on `flags.writeable` before 2026-11-25.

Not covered here: torch CUDA tensors (torch is a CPU build in CI; `cupyconv.torch.cuda` needs a GPU), CuPy's
streams, allocators and device contexts (they need a driver), dask over spatial chunks of CuPy arrays (UNROUTED).
CudaDevice's driver queries (compute capability, device id, memory, events) run against a recorded fake.
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import uuid
from pathlib import Path

import numpy
import pytest

import cupy
import cupyconv
import reference as ref
from cupyconv import _device, cudnn, settings
from emulator import CupyHostDevice, EmulatedCublas

#: Places of the GPU path whose array work does not go through the Device, and why.  Should stay empty.
UNROUTED: dict[str, str] = {
    "cupyconv/_dask.py _forward": "dask.array.block, which assembles the output blocks of spatial chunks, joins "
                                  "their (empty) CuPy metas with cupy.concatenate",
}

#: The names of the xp (NumPy or CuPy) module the GPU path may call directly: views, which launch nothing.
XP_VIEWS = {"broadcast_to"}

GPU_PATH = ["cupyconv/ops/*.py", "cupyconv/_kernels.py", "cupyconv/_device.py", "cupyconv/_replay.py",
            "cupyconv/_fastpath.py", "cupyconv/cudnn.py", "cupyconv/_dask.py", "cupyconv/_arrays.py",
            "cupyconv/torch/*.py"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def device():
    return CupyHostDevice()


def to_device(device, a, strided=False):
    """a (NumPy) as a cupy.ndarray of `device`; strided: a view whose last two dims are swapped in memory."""
    if a is None:
        return None
    if strided and a.ndim >= 2:
        return device.asarray(numpy.ascontiguousarray(a.swapaxes(-1, -2))).swapaxes(-1, -2)
    return device.asarray(a)


def on_device(device, fn, *arrays, strided=(), **kwargs):
    """fn on the arrays as CuPy arrays of `device` (those at the positions in `strided` as strided views); the
    results, which must be cupy.ndarray objects, as NumPy copies."""
    args = [to_device(device, a, i in strided) for i, a in enumerate(arrays)]
    launches = len(device.launches)
    with _device.use_device(device):
        result = fn(*args, **kwargs)
    assert len(device.launches) > launches, f"{fn.__name__} launched no kernel"
    results = result if isinstance(result, tuple) else (result,)
    for r in results:
        assert r is None or isinstance(r, cupy.ndarray), f"{fn.__name__} returned {type(r)}"
    host = tuple(None if r is None else device.asnumpy(r) for r in results)
    return host if isinstance(result, tuple) else host[0]


def check(device, fn, *arrays, dtype="float32", strided=(0,), **kwargs):
    """fn through the device with CuPy arrays equals fn on the CPU path (NumPy)."""
    got = on_device(device, fn, *arrays, strided=strided, **kwargs)
    want = fn(*arrays, **kwargs)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None), f"{fn.__name__} result {i}"
        if w is not None:
            ref.assert_close(g, w, dtype, f"{fn.__name__} result {i}")


def inputs(seed, *shapes, dtype="float32"):
    rng = numpy.random.default_rng(seed)
    return [None if s is None else ref.random(rng, s, numpy.dtype(dtype)) for s in shapes]


# ---------------------------------------------------------------------------------------------------------
# unfold and fold


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_unfold_fold(device, nd):
    spatial = {1: (9,), 2: (7, 6), 3: (4, 5, 3)}[nd]
    kw = dict(kernel_size=(3, 2, 2)[:nd], padding=1, stride=2 if nd < 3 else 1)
    (x,) = inputs(nd, (2, 1, 3, *spatial))
    check(device, cupyconv.unfold, x, **kw)
    cols = cupyconv.unfold(x, **kw)
    (c,) = inputs(nd + 10, cols.shape)
    check(device, cupyconv.fold, c, output_size=spatial, **kw)
    check(device, cupyconv.unfold_backward, c, input_size=spatial, **kw)
    check(device, cupyconv.fold_backward, x, **kw)


# ---------------------------------------------------------------------------------------------------------
# conv, every algorithm; conv1d/3d/nd


@pytest.mark.parametrize("algorithm", ["auto", "im2col_gemm", "direct"])
def test_conv2d(device, algorithm):
    x, w, b = inputs(1, (3, 4, 7, 6), (6, 2, 3, 3), (6,))
    kw = dict(padding=((1, 0), (2, 1)), groups=2, algorithm=algorithm)
    check(device, cupyconv.conv2d, x, w, b, stride=1, **kw)
    check(device, cupyconv.conv2d, x, w, None, stride=2, dilation=(1, 2), **kw)
    (gy,) = inputs(2, cupyconv.conv2d(x, w, stride=1, padding=kw["padding"], groups=2).shape)
    check(device, cupyconv.conv2d_backward, gy, x, w, strided=(0, 1), **kw)


def test_conv2d_small_groups(device):
    """Groups of 2 channels in, 3 out ('auto': the direct kernels in all three passes) on CuPy arrays."""
    start = len(device.launches)
    x, w, b = inputs(6, (2, 8, 9, 35), (12, 2, 3, 3), (12,))
    check(device, cupyconv.conv2d, x, w, b, padding=1, groups=4)
    (gy,) = inputs(7, (2, 12, 9, 35))
    check(device, cupyconv.conv2d_backward, gy, x, w, strided=(0, 1), padding=1, groups=4)
    names = {name.split("<")[0] for name in device.launches[start:]}
    assert {"conv_fwd_direct", "conv_bwd_weight_direct"} <= names and "unfold_im2col" not in names


def test_conv2d_pointwise_and_chunked(device):
    """The 1x1 GEMM without columns, and columns in chunks (workspace_limit)."""
    x, w, b = inputs(3, (3, 4, 5, 6), (5, 4, 1, 1), (5,))
    x = numpy.ascontiguousarray(x)
    check(device, cupyconv.conv2d, x, w, b, strided=(), algorithm="im2col_gemm")
    x, w = inputs(4, (3, 4, 5, 6), (5, 4, 3, 3))
    (gy,) = inputs(5, (3, 5, 3, 4))
    check(device, cupyconv.conv2d, x, w, None, algorithm="im2col_gemm", workspace_limit=800)
    check(device, cupyconv.conv2d_backward, gy, x, w, algorithm="im2col_gemm", workspace_limit=800)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_conv2d_implicit_gemm(device, dtype):
    """The tensor-core kernels (CupyHostDevice has compute capability 9.0), forward and backward, and float32
    as TF32 (the emulator computes TF32 exactly: the float32 tolerance holds)."""
    x, w, b = inputs(6, (2, 16, 5, 4), (8, 16, 3, 3), (8,), dtype=dtype)
    check(device, cupyconv.conv2d, x, w, b, dtype=dtype, padding=1, algorithm="implicit_gemm")
    (gy,) = inputs(7, (2, 8, 5, 4), dtype=dtype)
    check(device, cupyconv.conv2d_backward, gy, x, w, dtype=dtype, padding=1, algorithm="implicit_gemm")


def test_conv3d_natively_on_the_tensor_cores(device):
    """conv_fwd_igemm_3d's glue on CuPy arrays: the forward and the stride-1 input gradient (the weight flipped in
    three axes and merged by views), the weight gradient on the lift beside it; x channels-last 3-D too."""
    x, w, b = inputs(17, (2, 16, 4, 3, 5), (8, 16, 3, 2, 3), (8,), dtype="float16")
    kw = dict(padding=(1, 0, 1), algorithm="implicit_gemm")
    launches = len(device.launches)
    check(device, cupyconv.conv3d, x, w, b, dtype="float16", **kw)
    assert any("conv_fwd_igemm_3d<" in str(launch) for launch in device.launches[launches:]), device.launches[-3:]
    check(device, cupyconv.conv3d, numpy.moveaxis(numpy.moveaxis(x, 1, -1).copy(), -1, 1), w, b, dtype="float16",
          **kw)
    (gy,) = inputs(18, (2, 8, 4, 2, 5), dtype="float16")
    # against float64: the CPU path's float16 input gradient rounds each depth window's before the fold
    got = on_device(device, cupyconv.conv3d_backward, gy, x, w, **kw)
    want = cupyconv.conv3d_backward(*(a.astype(numpy.float64) for a in (gy, x, w)), **kw)
    for i, (g, expected) in enumerate(zip(got, want)):
        scale = float(numpy.abs(expected).max())
        assert float(numpy.abs(numpy.asarray(g, numpy.float64) - expected).max()) <= 2e-3 * scale, f"result {i}"


def test_conv2d_implicit_gemm_strict_float32(device):
    """float32 with TF32 off: 'implicit_gemm' runs the FMA kernels (simt_gemm.cu), forward and backward, grouped;
    the strided input gradient on im2col + GEMM + col2im."""
    x, w, b = inputs(16, (2, 6, 7, 5), (10, 3, 3, 3), (10,))
    kw = dict(padding=((1, 0), (0, 2)), groups=2, algorithm="implicit_gemm")
    for stride in (1, 2):
        check(device, cupyconv.conv2d, x, w, b, stride=stride, **kw)
        (gy,) = inputs(17, cupyconv.conv2d(x, w, stride=stride, padding=kw["padding"], groups=2).shape)
        check(device, cupyconv.conv2d_backward, gy, x, w, stride=stride, strided=(0, 1), **kw)
    names = [str(launch) for launch in device.launches]
    assert any("simt_fwd<" in n for n in names) and any("simt_bwd_weight<" in n for n in names), names


def test_conv2d_tf32(device):
    x, w = inputs(8, (2, 16, 4, 5), (4, 16, 3, 3))
    with settings.allow_tf32(True):
        got = on_device(device, cupyconv.conv2d, x, w, None, padding=1, algorithm="implicit_gemm")
        gemm = on_device(device, cupyconv.conv2d, x, w, None, padding=1, algorithm="im2col_gemm")
    assert device.blas.gemms[-1]["computeType"] == EmulatedCublas.CUBLAS_COMPUTE_32F_FAST_TF32
    want = cupyconv.conv2d(x, w, None, padding=1)
    # TF32 keeps 10 mantissa bits of each factor: a relative error of about 1e-3
    assert 0 < numpy.abs(got - want).max() <= 5e-3 * numpy.abs(want).max()
    ref.assert_close(gemm, want, "float32")  # the twin computes TF32's compute type strictly


@pytest.mark.parametrize("nd", [1, 3])
def test_conv1d_conv3d_conv_nd(device, nd):
    fn, backward = {1: (cupyconv.conv1d, cupyconv.conv1d_backward), 3: (cupyconv.conv3d, cupyconv.conv3d_backward)}[nd]
    spatial = {1: (11,), 3: (4, 5, 3)}[nd]
    x, w, b = inputs(9, (2, 4, *spatial), (4, 2, *(2,) * nd), (4,))
    kw = dict(padding=1, stride=2, groups=2)
    check(device, fn, x, w, b, **kw)
    check(device, cupyconv.conv_nd, x, w, b, **kw)
    (gy,) = inputs(10, fn(x, w, **kw).shape)
    check(device, backward, gy, x, w, strided=(0, 1), **kw)
    check(device, cupyconv.conv_nd_backward, gy, x, w, needs=("input", "weight"), **kw)


def test_conv3d_in_chunks(device):
    """The depth windows in several chunks: the weight and bias gradients summed over chunks."""
    x, w, b = inputs(11, (3, 2, 5, 4, 3), (3, 2, 3, 2, 2), (3,))
    (gy,) = inputs(12, cupyconv.conv3d(x, w, padding=1).shape)
    check(device, cupyconv.conv3d, x, w, b, padding=1, workspace_limit=300)
    check(device, cupyconv.conv3d_backward, gy, x, w, padding=1, workspace_limit=300)


# ---------------------------------------------------------------------------------------------------------
# transposed convolutions


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_conv_transpose(device, nd):
    fns = {1: (cupyconv.conv_transpose1d, cupyconv.conv_transpose1d_backward),
           2: (cupyconv.conv_transpose2d, cupyconv.conv_transpose2d_backward),
           3: (cupyconv.conv_transpose3d, cupyconv.conv_transpose3d_backward)}[nd]
    spatial = {1: (5,), 2: (4, 3), 3: (3, 2, 3)}[nd]
    x, w, b = inputs(13, (2, 4, *spatial), (4, 3, *(3,) * nd), (6,))
    # output_padding 2 >= stride 2 (dilation 3): x is zero-extended (conv_transpose's _extend)
    kw = dict(stride=2, padding=1, output_padding=2, dilation=3, groups=2)
    check(device, fns[0], x, w, b, **kw)
    check(device, cupyconv.conv_transpose_nd, x, w, b, **kw)
    (gy,) = inputs(14, fns[0](x, w, **kw).shape)
    check(device, fns[1], gy, x, w, strided=(0, 1), **kw)
    check(device, cupyconv.conv_transpose_nd_backward, gy, x, w, needs=("weight", "bias"), **kw)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_conv_transpose2d_phases_in_one_launch(device, dtype):
    """conv_transpose2d at strides (2, 3) with a (4, 6) kernel in 16-bit: its forward (conv's input gradient) runs
    every phase in one conv_fwd_igemm_phases launch, on a strided x, with a bias; a repeat with fresh values (the fast
    path: one recorded program) launches the same and still equals torch's float64 result; then the backward."""
    torch = pytest.importorskip("torch")
    kw = dict(stride=(2, 3), padding=(1, 2), output_padding=(1, 0), algorithm="implicit_gemm")
    for seed in (17, 18):
        x, w, b = inputs(seed, (2, 16, 4, 3), (16, 16, 4, 6), (16,), dtype=dtype)
        start = len(device.launches)
        got = on_device(device, cupyconv.conv_transpose2d, x, w, b, strided=(0,), **kw)
        names = [name.split("<")[0] for name in device.launches[start:]]
        assert names.count("conv_fwd_igemm_phases") == 1 and "conv_fwd_igemm" not in names, names
        assert "conv_bwd_input_tc" not in names, names
        want = torch.nn.functional.conv_transpose2d(*(torch.from_numpy(a.astype(numpy.float64)) for a in (x, w, b)),
                                                    stride=kw["stride"], padding=kw["padding"],
                                                    output_padding=kw["output_padding"]).numpy()
        ref.assert_close(got, want, dtype, "conv_transpose2d")
    (gy,) = inputs(19, got.shape, dtype=dtype)
    check(device, cupyconv.conv_transpose2d_backward, gy, x, w, dtype=dtype, strided=(0, 1), **kw)


# ---------------------------------------------------------------------------------------------------------
# depthwise and patch


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_depthwise(device, nd):
    fns = {1: (cupyconv.depthwise_conv1d, cupyconv.depthwise_conv1d_backward),
           2: (cupyconv.depthwise_conv2d, cupyconv.depthwise_conv2d_backward),
           3: (cupyconv.depthwise_conv3d, cupyconv.depthwise_conv3d_backward)}[nd]
    spatial = {1: (9,), 2: (7, 5), 3: (4, 3, 5)}[nd]
    x, w, b = inputs(15, (2, 3, *spatial), (6, 1, *(3,) * nd), (6,))
    kw = dict(padding=1, stride=1 if nd == 3 else 2)
    check(device, fns[0], x, w, b, **kw)
    (gy,) = inputs(16, fns[0](x, w, **kw).shape)
    check(device, fns[1], gy, x, w, strided=(0, 1), **kw)


@pytest.mark.parametrize("algorithm", ["fused", "im2col_gemm", "implicit_gemm"])
def test_patch_conv2d(device, algorithm):
    dtype = "float16" if algorithm == "implicit_gemm" else "float32"
    c = 16 if algorithm == "implicit_gemm" else 3
    x, w, b = inputs(17, (2, 3, c, 5, 4), (4, c, 3, 3), (4,), dtype=dtype)
    kw = dict(padding=1, algorithm=algorithm)
    check(device, cupyconv.patch_conv2d, x, w, b, dtype=dtype, **kw)
    (gy,) = inputs(18, (2, 3, 4, 5, 4), dtype=dtype)
    check(device, cupyconv.patch_conv2d_backward, gy, x, w, dtype=dtype, strided=(0, 1), **kw)


@pytest.mark.parametrize("nd", [1, 3])
def test_patch_conv1d_conv3d(device, nd):
    fns = {1: (cupyconv.patch_conv1d, cupyconv.patch_conv1d_backward),
           3: (cupyconv.patch_conv3d, cupyconv.patch_conv3d_backward)}[nd]
    spatial = {1: (7,), 3: (3, 4, 3)}[nd]
    x, w, b = inputs(19, (2, 2, 3, *spatial), (4, 3, *(2,) * nd), (4,))
    check(device, fns[0], x, w, b, padding=1)
    (gy,) = inputs(20, fns[0](x, w, padding=1).shape)
    check(device, fns[1], gy, x, w, strided=(0, 1), padding=1)


# ---------------------------------------------------------------------------------------------------------
# cupyconv.cudnn with CuPy arrays: outputs written in place


@pytest.mark.parametrize("layout", [cudnn.CUDNN_TENSOR_NCHW, cudnn.CUDNN_TENSOR_NHWC])
def test_cudnn(device, layout):
    def lay(a):   # (N, C, *s) -> the layout
        return a if layout == cudnn.CUDNN_TENSOR_NCHW else numpy.ascontiguousarray(numpy.moveaxis(a, 1, -1))

    x, w, b = inputs(21, (2, 4, 6, 5), (6, 2, 3, 3), (1, 6, 1, 1))
    y_shape = cupyconv.conv2d(x, w, stride=2, padding=1, groups=2).shape
    (gy,) = inputs(22, y_shape)
    geometry = dict(pad=(1, 1), stride=(2, 2), dilation=None, groups=2, d_layout=layout, w_layout=layout)

    def run(fn, arrays, out_shape, out_name):
        """fn with `arrays` (NumPy) and a poisoned output, on the CPU path and on the device; both outputs."""
        want = numpy.full(out_shape, numpy.nan, numpy.float32)
        fn(**arrays, **{out_name: want}, **geometry)
        out = device.empty(out_shape, numpy.float32)
        with _device.use_device(device):
            fn(**{k: to_device(device, v) for k, v in arrays.items()}, **{out_name: out}, **geometry)
        ref.assert_close(device.asnumpy(out), want, "float32", fn.__name__)

    run(cudnn.convolution_forward, dict(x=lay(x), W=lay(w), b=b), lay(numpy.empty(y_shape)).shape, "y")
    run(cudnn.convolution_backward_filter, dict(x=lay(x), gy=lay(gy)), lay(w).shape, "gW")
    run(cudnn.convolution_backward_data, dict(W=lay(w), x=lay(gy), b=b[0, :4, 0]), lay(x).shape, "y")


# ---------------------------------------------------------------------------------------------------------
# dask with CuPy chunks


def lazy(device, a, chunk: int):
    """a (NumPy) as a dask array of CuPy chunks of `device`, `chunk` images each (dask.array.from_array would copy
    them with CuPy's kernel)."""
    import dask.array as da
    parts = [to_device(device, a[i:i + chunk]) for i in range(0, a.shape[0], chunk)]
    name = f"cupy-host-{uuid.uuid4().hex}"
    graph = {(name, i, *(0,) * (a.ndim - 1)): p for i, p in enumerate(parts)}
    chunks = (tuple(p.shape[0] for p in parts), *((n,) for n in a.shape[1:]))
    return da.Array(graph, name, chunks, dtype=a.dtype, meta=parts[0][:0])


def compute_blocks(device, array):
    """Each block of a dask array computed through the device, joined on the host: dask itself joins CuPy
    chunks with cupy.concatenate, which needs a driver."""
    import dask
    with _device.use_device(device), dask.config.set(scheduler="synchronous"):
        blocks = dask.compute(*array.to_delayed().ravel())
    assert all(isinstance(b, cupy.ndarray) for b in blocks)
    return numpy.concatenate([device.asnumpy(b) for b in blocks])


def test_dask_with_cupy_chunks(device):
    """The blocks of a dask graph over CuPy chunks (along the batch) run the op through the device."""
    x, w, b = inputs(23, (4, 3, 6, 5), (4, 3, 3, 3), (4,))
    with _device.use_device(device):   # the in-memory weight and bias are copied into the graph by the device
        y = cupyconv.conv2d(lazy(device, x, 2), to_device(device, w), to_device(device, b), padding=1)
    assert isinstance(y._meta, cupy.ndarray)
    ref.assert_close(compute_blocks(device, y), cupyconv.conv2d(x, w, b, padding=1), "float32")
    (gy,) = inputs(24, (4, 4, 6, 5))
    grad_x, _, _ = cupyconv.conv2d_backward(lazy(device, gy, 2), lazy(device, x, 2), lazy(device, w, 4), padding=1,
                                            needs=("input",))
    ref.assert_close(compute_blocks(device, grad_x),
                     cupyconv.conv2d_backward(gy, x, w, padding=1, needs=("input",))[0], "float32")
    # the weight and bias gradients: one partial per block, summed by tasks on the device
    _, grad_w, grad_b = cupyconv.conv2d_backward(lazy(device, gy, 1), lazy(device, x, 1), lazy(device, w, 4),
                                                 padding=1, needs=("weight", "bias"))
    want = cupyconv.conv2d_backward(gy, x, w, padding=1, needs=("weight", "bias"))
    ref.assert_close(compute_blocks(device, grad_w), want[1], "float32")
    ref.assert_close(compute_blocks(device, grad_b), want[2], "float32")


# ---------------------------------------------------------------------------------------------------------
# The device itself


def test_the_device_is_cuda_device_with_real_cupy_arrays(device):
    """CudaDevice's launch, GEMM and matmul run unchanged; what it overrides is memory, kernels, cuBLAS, device
    properties, the per-call device scope and the stream key (CuPy's Device context, its current stream and the
    stream-capture query need a driver)."""
    own = {name for name in vars(CupyHostDevice) if not name.startswith("__")}
    assert own == {"name", "compute_capability", "empty", "asarray", "asnumpy", "host", "_source", "copyto", "add",
                   "sum", "function", "cublas", "total_memory", "timed", "key", "scope", "clock_rate", "stream_key"}
    for name in ("launch", "launch_prepare", "launch_run", "gemm_strided_batched", "matmul_strided"):
        assert getattr(CupyHostDevice, name) is getattr(_device.CudaDevice, name)
    a = device.empty((3, 4), numpy.float32)
    assert type(a) is cupy.ndarray and a.data.ptr % 256 == 0
    assert numpy.isnan(device.host(a)).all()   # poisoned
    with pytest.raises(TypeError, match="NumPy array on the GPU path"):
        device.host(numpy.ones(3))


def test_every_call_runs_in_the_scope_of_the_arrays_device(device):
    """_arrays.Call enters Device.scope(op, device id) once per public call, with the arrays' device (0 here)."""
    rng = numpy.random.default_rng(7)
    x = device.asarray(rng.standard_normal((1, 2, 5, 5)).astype(numpy.float32))
    w = device.asarray(rng.standard_normal((3, 2, 3, 3)).astype(numpy.float32))
    device.scopes.clear()   # the fixture's device is shared by the module's tests
    with _device.use_device(device):
        cupyconv.conv2d(x, w)
        cupyconv.unfold(x, 3)
    assert device.scopes == [("conv2d", 0), ("unfold", 0)]


def test_a_numpy_array_cannot_reach_a_kernel(device):
    """RawKernel takes CuPy arrays and scalars: a host array is refused, as CuPy's launch refuses it."""
    kernel = device.function("unfold.cu", "fold_col2im<float, int, 1, false>")
    with pytest.raises(TypeError, match="Unsupported type"):
        kernel((1,), (32,), (numpy.ones(3, numpy.float32),))
    with pytest.raises(TypeError, match="args must be a tuple"):
        kernel((1,), (32,), [])


def test_unrouted_cupy_work_fails_on_the_device(device):
    """What the layer catches: a CuPy copy made directly, not through the Device, needs a driver."""
    a = device.empty((2, 3), numpy.float32).T
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError):
        cupy.ascontiguousarray(a)
    assert device.ascontiguous(a).flags.c_contiguous


def test_the_gpu_path_calls_no_xp_function_but_views():
    """Every `xp.<name>` / `self.xp.<name>` / `device.xp.<name>` call of the GPU path is a view (XP_VIEWS) or in
    CudaDevice's own GPU-facing methods; array work goes through the Device's methods."""
    # Device.empty on CuPy; CudaDevice's events and device id; isinstance and the name in an error message
    allowed_in_cuda_device = {"cuda", "ndarray", "empty", "__name__"}
    found = []
    for pattern in GPU_PATH:
        for path in sorted(ROOT.glob(pattern)):
            text = path.read_text()
            for match in re.finditer(r"\bxp\.(\w+)", text):
                name = match.group(1)
                if name in XP_VIEWS or (path.name == "_device.py" and name in allowed_in_cuda_device):
                    continue
                if path.name == "_replay.py" and name == "ndarray":   # a view of a slot's memory; isinstance
                    continue
                found.append(f"{path.relative_to(ROOT)}: xp.{name}")
    assert found == []


def test_unrouted_places_are_listed():
    # Should end empty: dask's own reduction of CuPy chunks is the one place left (see UNROUTED).
    assert set(UNROUTED) <= {"cupyconv/_dask.py _forward"}


# ---------------------------------------------------------------------------------------------------------
# The CuPy API the glue touches, checked against the installed CuPy 14

#: (module, attribute path) of every CuPy name the glue uses (cupyconv/_device.py, _arrays.py, torch/cuda.py).
CUPY_APIS = [
    ("cupy", "ndarray"), ("cupy", "RawModule"), ("cupy", "RawKernel.max_dynamic_shared_size_bytes"),
    ("cupy", "RawKernel.__call__"), ("cupy", "RawModule.get_function"), ("cupy", "from_dlpack"),
    # a replay's prepared launch (CudaDevice.launch_prepare): the per-device Function, the scalars wrapped once
    ("cupy", "RawKernel.kernel"), ("cupy.cuda.function", "Function.__call__"), ("cupy.cuda.function", "CPointer"),
    ("cupy._core._scalar", "CScalar"), ("cupy._core._scalar", "CScalar.value"),
    ("cupy._core._scalar", "CScalar.get_numpy_type"),
    ("cupy", "broadcast_to"), ("cupy", "empty"), ("cupy", "copyto"),
    ("cupy", "cuda.Device"), ("cupy", "cuda.Device.compute_capability"), ("cupy", "cuda.Device.id"),
    ("cupy", "cuda.Event"), ("cupy", "cuda.Event.record"), ("cupy", "cuda.Event.synchronize"),
    ("cupy", "cuda.Event.done"),
    ("cupy", "cuda.get_elapsed_time"), ("cupy", "cuda.Stream"), ("cupy", "cuda.Stream.from_external"),
    ("cupy", "cuda.ExternalStream"),
    ("cupy", "cuda.PythonFunctionAllocator"), ("cupy", "cuda.using_allocator"),
    ("cupy", "cuda.UnownedMemory"), ("cupy", "cuda.MemoryPointer"),
    # the repeated-call signature (cupyconv/_fastpath.py) and the replay's pointers (cupyconv/_replay.py)
    ("cupy", "cuda.MemoryPointer.device_id"), ("cupy", "cuda.MemoryPointer.ptr"),
    ("cupy.cuda.device", "get_cublas_handle"), ("cupy.cuda.device", "get_compute_capability"),
    ("cupy_backends.cuda.api.runtime", "CUDA_R_16F"), ("cupy_backends.cuda.api.runtime", "CUDA_R_16BF"),
    ("cupy_backends.cuda.api.runtime", "CUDA_R_32F"), ("cupy_backends.cuda.api.runtime", "CUDA_R_64F"),
    ("cupy_backends.cuda.api.runtime", "getDeviceProperties"),
    ("cupy_backends.cuda.api.runtime", "deviceGetAttribute"),
    ("cupy_backends.cuda.api.runtime", "cudaDevAttrClockRate"),
    # the device scope and stream-capture refusal, the toolkit check (cupyconv/_device.py)
    ("cupy", "__version__"), ("cupy", "cuda.get_current_stream"), ("cupy", "cuda.nvrtc.getVersion"),
    ("cupy", "cuda.runtime"), ("cupy", "cuda.runtime.getDeviceProperties"), ("cupy", "cuda.runtime.runtimeGetVersion"),
    ("cupy_backends.cuda.api.runtime", "CUDARuntimeError"), ("cupy_backends.cuda.api.runtime", "streamIsCapturing"),
]

#: The Cython signatures of the cuBLAS binding functions the glue calls, as CuPy 14 declares them.
CUBLAS_SIGNATURES = {
    "gemmStridedBatchedEx": EmulatedCublas.SIGNATURE,
    "getPointerMode": "getPointerMode(intptr_t handle) -> int",
    "setPointerMode": "setPointerMode(intptr_t handle, int mode)",
    "getMathMode": "getMathMode(intptr_t handle) -> int",
}
CUBLAS_CONSTANTS = ["CUBLAS_OP_N", "CUBLAS_OP_T", "CUBLAS_POINTER_MODE_HOST", "CUBLAS_GEMM_DEFAULT",
                    "CUBLAS_COMPUTE_32F", "CUBLAS_COMPUTE_32F_FAST_TF32", "CUBLAS_COMPUTE_64F"]


@pytest.mark.parametrize("module, path", CUPY_APIS, ids=[f"{m}.{p}" for m, p in CUPY_APIS])
def test_cupy_api_exists(module, path):
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)


def test_cupy_signatures_the_glue_relies_on():
    """Keyword and positional arguments the glue passes, as CuPy 14 documents them (Cython embeds the signature
    in __doc__)."""
    assert cupy.__version__.split(".")[0] == "14"
    assert "name_expressions=None" in cupy.RawModule.__doc__.splitlines()[0]
    assert "options=()" in cupy.RawModule.__doc__.splitlines()[0]
    assert "shared_mem=0" in cupy.RawKernel.__call__.__doc__
    assert cupy.RawModule.get_function.__doc__.startswith("RawModule.get_function(self, str name)")
    assert cupy.cuda.UnownedMemory.__doc__.startswith("UnownedMemory(intptr_t ptr, size_t size, owner, int device_id")
    assert inspect.signature(cupy.cuda.Stream.from_external).parameters.keys() == {"obj"}
    assert cupy.cuda.device.get_cublas_handle.__doc__.startswith("get_cublas_handle() -> intptr_t")
    # _replay.Program: a view of recorded memory, and MemoryPointer arithmetic (a negative offset too)
    assert "memptr=None" in cupy.ndarray.__doc__ and "strides=None" in cupy.ndarray.__doc__
    assert hasattr(cupy.cuda.MemoryPointer, "__add__")


def test_cublas_binding_signatures():
    """The cuBLAS binding's functions take what CudaDevice passes and EmulatedCublas checks: read from the
    signatures Cython embedded in CuPy's compiled module (importing it needs libcublasLt, absent in CI)."""
    origin = importlib.util.find_spec("cupy_backends.cuda.libs.cublas").origin
    binary = Path(origin).read_bytes()
    for name, signature in CUBLAS_SIGNATURES.items():
        assert signature.encode() in binary, f"{name}: {signature}"
    for name in CUBLAS_CONSTANTS:
        assert re.search(rb"\x00" + name.encode() + rb"\x00", binary), name
    twin = inspect.signature(EmulatedCublas.gemmStridedBatchedEx).parameters
    declared = re.findall(r"(\w+)(?:,|\))", EmulatedCublas.SIGNATURE)
    assert list(twin)[1:] == declared   # self, then the 23 parameters in order
    try:
        from cupy_backends.cuda.libs import cublas
    except ImportError:
        return   # no cuBLAS library here: the names above are all that can be read
    for name in CUBLAS_CONSTANTS:
        assert getattr(cublas, name) == getattr(EmulatedCublas, name), name


def glue_names() -> set[tuple[str, str]]:
    """(module, attribute path) of every attribute chain of cupyconv's source rooted at a CuPy module: `cupy.`,
    `self.xp.` (CudaDevice), `cublas.`, `runtime.` and `cuda_device.` as _device.py names them."""
    roots = {"cupy": "cupy", "cublas": "cupy_backends.cuda.libs.cublas", "runtime": "cupy_backends.cuda.api.runtime",
             "cuda_device": "cupy.cuda.device"}
    found = set()
    for path in sorted((ROOT / "cupyconv").rglob("*.py")):
        tree = ast.parse(path.read_text())
        inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or id(node) in inner:
                continue
            parts = []
            while isinstance(node, ast.Attribute):
                parts.insert(0, node.attr)
                node = node.value
            if isinstance(node, ast.Name) and node.id == "self" and parts[0] == "xp" and len(parts) > 1 \
                    and path.name == "_device.py":
                found.add(("cupy", ".".join(parts[1:])))
            elif isinstance(node, ast.Name) and node.id in roots and parts:
                found.add((roots[node.id], ".".join(parts)))
    return found


def test_the_api_list_names_everything_the_glue_touches():
    """CUPY_APIS and the cuBLAS lists cover every CuPy name in cupyconv's source (a new one must be added there,
    and so checked against CuPy 14)."""
    listed = set(CUPY_APIS) | {("cupy_backends.cuda.libs.cublas", name)
                               for name in [*CUBLAS_SIGNATURES, *CUBLAS_CONSTANTS]}
    missing = {(m, p) for m, p in glue_names() if (m, p) not in listed and p not in ("__name__",)}
    assert missing == set()


def test_cuda_device_properties_through_a_recorded_fake(monkeypatch):
    """What CudaDevice asks the driver (compute capability, device id, memory, clock rate, event timing) needs a
    GPU: checked here against a fake of CuPy's objects that records the calls (CupyHostDevice replaces these
    methods; tests/test_autotune.py runs the timing loop on a simulated stream)."""
    calls = []

    class FakeDevice:
        def __init__(self, *args):
            calls.append(("Device", args))
            self.id, self.compute_capability = 1, "75"

    class FakeEvent:
        def record(self):
            calls.append("record")

        @property
        def done(self):
            calls.append("done")
            return False   # still pending once the call is enqueued: the spin covered it

        def synchronize(self):
            calls.append("synchronize")

    class FakeRuntime:
        cudaDevAttrClockRate = 13

        @staticmethod
        def getDeviceProperties(device_id):
            calls.append(("getDeviceProperties", device_id))
            return {"totalGlobalMem": 12345}

        @staticmethod
        def deviceGetAttribute(attribute, device_id):
            calls.append(("deviceGetAttribute", attribute, device_id))
            return 1_410_000   # kHz

    class FakeSpin:
        max_dynamic_shared_size_bytes = _device.DEFAULT_SHARED_LIMIT

        def __call__(self, grid, block, args, shared_mem=0):
            calls.append(("spin", grid, block, args))

    monkeypatch.setattr(cupy.cuda, "Device", FakeDevice)
    monkeypatch.setattr(cupy.cuda, "Event", FakeEvent)
    monkeypatch.setattr(cupy.cuda, "get_elapsed_time", lambda start, stop: calls.append("elapsed") or 250.0)
    monkeypatch.setattr(_device, "_cuda_runtime", lambda: FakeRuntime)
    monkeypatch.setattr(_device, "_cuda_function", lambda source, name: calls.append((source, name)) or FakeSpin())
    _device._cuda_total_memory.cache_clear()
    _device._cuda_clock_rate.cache_clear()
    device = _device.CudaDevice()
    assert device.compute_capability == 75 and device.tensor_cores is False
    assert device.key() == ("cuda", 1)
    assert device.total_memory() == 12345
    assert device.clock_rate == 1_410_000_000
    assert ("getDeviceProperties", 1) in calls and ("deviceGetAttribute", 13, 1) in calls
    assert all(c == ("Device", ()) for c in calls if c[0] == "Device")
    del calls[:]
    assert device.timed(lambda: "result") == (0.25, "result")
    spin = ("spin", (1,), (1,), (numpy.int64(141_000),))   # the first spin: SPIN_MIN_S (100 us) at 1.41 GHz
    repetition = [("timing.cu", "timing_spin<float, int>"), spin, "record", "record", "done", "synchronize",
                  "elapsed"]
    assert [c for c in calls if c != ("Device", ())] == repetition * 3
    _device._cuda_total_memory.cache_clear()
    _device._cuda_clock_rate.cache_clear()
