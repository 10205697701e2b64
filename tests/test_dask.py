"""Dask arrays as a fourth array kind (cupyconv/_dask.py): every public op and backward on dask arrays, chunked
along the batch, the patch dims and the spatial dims, computed by the threaded scheduler and by a two-process
distributed.LocalCluster, equals the in-memory call; graphs are lazy; bad input fails at the call."""
from __future__ import annotations

import os
import subprocess
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy
import pytest
from optional_deps import given, settings as hypothesis_settings, strategies as st

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

import cupyconv  # noqa: E402
from cupyconv import _dask  # noqa: E402
from cupyconv._spec import ConvSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# One worker runs the module: its `cluster_client` (a LocalCluster of two processes) starts once.
pytestmark = pytest.mark.xdist_group("module:test_dask")


@dataclass(frozen=True)
class Case:
    """One call: the op, its array arguments' shapes (the first is the chunked one), chunks of that array,
    other keyword arguments, the chunks of grad_output for the op's `*_backward` (None: not this case's), and
    how many leading (batch or patch) dims the first array has."""
    op: str
    shapes: dict
    chunks: tuple
    kwargs: dict = field(default_factory=dict)
    grad_chunks: tuple | None = None
    leading: int = 1

    @property
    def id(self):
        return f"{self.op}-{'x'.join(str(len(c) if isinstance(c, tuple) else c) for c in self.chunks)}"


CASES = [
    # batch only
    Case("conv2d", {"x": (5, 3, 9, 7), "weight": (4, 3, 3, 2), "bias": (4,)}, (2, 3, 9, 7), {"padding": 1},
         (3, 4, 9, 8)),
    # spatial: odd chunk sizes, stride, dilation, asymmetric padding, groups
    Case("conv2d", {"x": (3, 4, 13, 11), "weight": (6, 2, 3, 3), "bias": (6,)}, (2, 4, (4, 5, 4), (3, 1, 4, 3)),
         {"stride": (2, 3), "padding": ((2, 0), (1, 3)), "dilation": (2, 1), "groups": 2}, (1, 3, 2, 2)),
    Case("conv2d", {"x": (2, 3, 10, 9), "weight": (2, 3, 4, 3)}, (1, 3, 3, 2), {"stride": 2, "padding": "same"},
         (2, 2, 5, 5)),
    Case("conv1d", {"x": (4, 3, 17), "weight": (6, 3, 3), "bias": (6,)}, (3, 3, (5, 7, 5)),
         {"stride": 2, "padding": ((2, 1),), "dilation": 2}, (2, 6, 4)),
    Case("conv3d", {"x": (3, 2, 7, 6, 5), "weight": (4, 2, 2, 3, 2)}, (2, 2, 3, 4, 2),
         {"stride": (2, 1, 2), "padding": ((1, 0), (0, 2), (1, 1))}, (3, 4, 2, 3, 2)),
    Case("conv_nd", {"x": (3, 2, 8, 7), "weight": (3, 2, 3, 3), "bias": (3,)}, (2, 2, 5, 3), {"padding": (1, 0)},
         (3, 3, 3, 5)),
    Case("depthwise_conv2d", {"x": (3, 3, 9, 8), "weight": (6, 1, 3, 3), "bias": (6,)}, (2, 3, 4, 3),
         {"stride": 2, "padding": ((0, 1), (1, 1))}, (1, 6, 2, 4)),
    Case("depthwise_conv1d", {"x": (4, 2, 15), "weight": (2, 1, 3)}, (2, 2, (4, 4, 7)),
         {"padding": "same", "dilation": 3}, (4, 2, 6)),
    Case("depthwise_conv3d", {"x": (2, 2, 5, 6, 4), "weight": (4, 1, 3, 2, 2)}, (1, 2, 3, 3, 4), {"padding": 1},
         (2, 4, 5, 7, 5)),
    # patch dims (leading) only, then patches split spatially
    Case("patch_conv2d", {"x": (3, 6, 2, 4, 4), "weight": (3, 2, 3, 3), "bias": (3,)}, (2, 4, 2, 4, 4),
         {"padding": 1}, (3, 5, 3, 4, 4), leading=2),
    Case("patch_conv2d", {"x": (2, 3, 2, 6, 5), "weight": (4, 2, 3, 2)}, (1, 2, 2, 3, 2),
         {"stride": 2, "padding": ((1, 0), (0, 2))}, (2, 1, 4, 3, 3), leading=2),
    Case("patch_conv1d", {"x": (2, 5, 3, 6), "weight": (4, 3, 3)}, (1, (2, 3), 3, 6), {"padding": 1},
         (2, 5, 4, 6), leading=2),
    Case("patch_conv3d", {"x": (2, 3, 2, 4, 4, 3), "weight": (2, 2, 2, 3, 2)}, (1, 2, 2, 4, 2, 3), {"padding": 1},
         (2, 2, 2, 5, 4, 4), leading=2),
    # mapped over the batch, spatial dims rechunked to one chunk
    Case("conv_transpose2d", {"x": (4, 4, 5, 6), "weight": (4, 3, 3, 3), "bias": (6,)}, (3, 2, 2, 4),
         {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2}, (1, 6, 4, 5)),
    Case("conv_transpose1d", {"x": (3, 2, 7), "weight": (2, 3, 3)}, (2, 2, 3),
         {"stride": 2, "algorithm": "im2col_gemm", "workspace_limit": 1}, (2, 3, 5)),
    Case("conv_transpose3d", {"x": (2, 2, 3, 4, 3), "weight": (2, 2, 2, 2, 2)}, (1, 2, 2, 2, 3),
         {"stride": (1, 2, 1), "padding": ((1, 0), (0, 1), (1, 1))}, (2, 2, 2, 4, 2)),
    Case("conv_transpose_nd", {"x": (3, 2, 5, 4), "weight": (2, 2, 3, 2)}, (1, 2, 5, 4), {"dilation": 2},
         (2, 2, 4, 4)),
    # unfold and fold over (B, P, ...): two leading dims
    Case("unfold", {"x": (2, 3, 2, 7, 6)}, (1, 2, 1, 3, 3), {"kernel_size": (3, 2), "stride": 2, "padding": 1},
         leading=2),
    Case("fold_backward", {"grad_output": (2, 3, 2, 7, 6)}, (1, 2, 2, 7, 6),
         {"kernel_size": (3, 2), "stride": 2, "padding": 1}, leading=2),
    Case("fold", {"cols": (2, 3, 12, 16)}, (1, 2, 5, 7), {"output_size": (7, 6), "kernel_size": (3, 2),
                                                          "stride": 2, "padding": 1}, leading=2),
    Case("unfold_backward", {"grad_output": (2, 3, 12, 16)}, (2, 1, 12, 16),
         {"input_size": (7, 6), "kernel_size": (3, 2), "stride": 2, "padding": 1}, leading=2),
]


def _rng(case: Case):
    return numpy.random.default_rng(zlib.crc32(repr(case).encode()))


def _arrays(case: Case, xp=numpy, dtype=numpy.float64):
    rng = _rng(case)
    return {name: xp.asarray(rng.standard_normal(shape).astype(dtype)) for name, shape in case.shapes.items()}


def _chunked(case: Case, arrays):
    """The first array as a dask array chunked as the case says; the others stay in memory."""
    first, *rest = arrays
    return {first: da.from_array(arrays[first], chunks=case.chunks), **{name: arrays[name] for name in rest}}


def _backward_arrays(case: Case, arrays, xp=numpy):
    """grad_output (fresh random values), x and weight for the case's `*_backward`."""
    out = getattr(cupyconv, case.op)(**arrays, **case.kwargs)
    grad_output = xp.asarray(_rng(case).standard_normal(out.shape).astype(arrays["x"].dtype))
    return {"grad_output": grad_output, "x": arrays["x"], "weight": arrays["weight"]}


def _leading_only(case: Case) -> bool:
    """Whether the case chunks only the leading dims."""
    shape = next(iter(case.shapes.values()))
    return all(c == n for c, n in zip(case.chunks[case.leading:], shape[case.leading:]))


def _compute(scheduler, *arrays):
    return dask.compute(*arrays, scheduler=scheduler)


# ---------------------------------------------------------------------------------------------------------
# The table and the dispatch


def test_every_public_op_is_in_the_table_and_in_these_cases():
    public = {name for name in cupyconv.__all__ if callable(getattr(cupyconv, name))
              and name not in cupyconv.settings.__all__ and name != "cudnn"}
    assert set(_dask.OPS) == public
    tested = {case.op for case in CASES} | {f"{case.op}_backward" for case in CASES if case.grad_chunks}
    assert tested == public


def test_importing_cupyconv_does_not_import_dask():
    code = "import sys, cupyconv; assert not [m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')]"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_public_functions_still_pickle_and_document_dask():
    import pickle
    assert pickle.loads(pickle.dumps(cupyconv.conv2d)) is cupyconv.conv2d
    assert "dask" in cupyconv.conv2d.__doc__ and "dask" in cupyconv.unfold_backward.__doc__


# ---------------------------------------------------------------------------------------------------------
# Results equal the in-memory call, through the threaded scheduler and through two worker processes


@pytest.fixture(scope="module")
def cluster_client():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) \
            as cluster, distributed.Client(cluster) as client:
        yield client


@pytest.fixture(params=["threads", "distributed"])
def scheduler(request):
    return "threads" if request.param == "threads" else request.getfixturevalue("cluster_client")


def _reference_by_blocks(fn, arrays, chunks, leading, kwargs):
    """fn on each block of the leading dims of the first array (the others whole), the results concatenated:
    exactly the computation the dask graph runs, block for block."""
    first = next(iter(arrays))
    bounds = [numpy.cumsum((0, *sizes)) for sizes in da.from_array(arrays[first], chunks=chunks).chunks[:leading]]

    def concatenate(prefix):
        axis = len(prefix)
        if axis == leading:
            blocks = {**arrays, first: arrays[first][tuple(prefix)]}
            return fn(**blocks, **kwargs)
        parts = [concatenate((*prefix, slice(a, b))) for a, b in zip(bounds[axis][:-1], bounds[axis][1:])]
        return numpy.concatenate(parts, axis=axis)
    return concatenate(())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_equals_the_in_memory_call(case, scheduler):
    arrays = _arrays(case)
    fn = getattr(cupyconv, case.op)
    lazy = fn(**_chunked(case, arrays), **case.kwargs)
    assert isinstance(lazy, da.Array) and type(lazy._meta) is numpy.ndarray
    (got,) = _compute(scheduler, lazy)
    expected = fn(**arrays, **case.kwargs)
    assert type(got) is numpy.ndarray and got.dtype == expected.dtype and got.shape == expected.shape
    numpy.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    first = _chunked(case, arrays)[next(iter(arrays))]
    assert lazy.chunks[:case.leading] == first.chunks[:case.leading]
    if _leading_only(case):   # block for block the same computation: the same bits
        numpy.testing.assert_array_equal(got, _reference_by_blocks(fn, arrays, case.chunks, case.leading,
                                                                   case.kwargs))


@pytest.mark.parametrize("case", [c for c in CASES if c.grad_chunks], ids=lambda c: c.id)
def test_backward_equals_the_in_memory_call(case, scheduler):
    arrays = _backward_arrays(case, _arrays(case))
    fn = getattr(cupyconv, f"{case.op}_backward")
    expected = fn(**arrays, **case.kwargs)
    lazy_arrays = {**arrays, "grad_output": da.from_array(arrays["grad_output"], chunks=case.grad_chunks),
                   "x": da.from_array(arrays["x"], chunks=case.chunks)}
    lazy = fn(**lazy_arrays, **case.kwargs)
    assert all(isinstance(g, da.Array) for g in lazy)
    got = _compute(scheduler, *lazy)
    for name, g, e in zip(("grad_x", "grad_weight", "grad_bias"), got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, name
        numpy.testing.assert_allclose(g, e, rtol=1e-11, atol=1e-11, err_msg=name)
    # The weight gradient's partials are summed in a fixed order: the same bits again, on any scheduler.
    _, *again = fn(**lazy_arrays, **case.kwargs, needs=("weight", "bias"))
    for g, a in zip(got[1:], _compute("sync", *again)):
        numpy.testing.assert_array_equal(a, g)


def test_needs_and_a_dask_grad_output_with_in_memory_x():
    case = CASES[1]
    arrays = _backward_arrays(case, _arrays(case))
    lazy = cupyconv.conv2d_backward(da.from_array(arrays["grad_output"], chunks=(1, 6, 3, 2)), arrays["x"],
                                    arrays["weight"], needs="weight", **case.kwargs)
    assert lazy[0] is None and lazy[2] is None
    expected = cupyconv.conv2d_backward(**arrays, needs="weight", **case.kwargs)[1]
    numpy.testing.assert_allclose(lazy[1].compute(scheduler="threads"), expected, rtol=1e-11, atol=1e-11)


def test_a_dask_weight_and_bias_are_taken_as_one_chunk():
    case = CASES[1]
    arrays = _arrays(case)
    lazy = cupyconv.conv2d(da.from_array(arrays["x"], chunks=case.chunks), da.from_array(arrays["weight"], chunks=1),
                           da.from_array(arrays["bias"], chunks=2), **case.kwargs)
    numpy.testing.assert_allclose(lazy.compute(), cupyconv.conv2d(**arrays, **case.kwargs), rtol=1e-12, atol=1e-12)


def test_half_precision_weight_gradient_sums_in_float32():
    rng = numpy.random.default_rng(7)
    x = rng.standard_normal((8, 3, 6, 6)).astype(numpy.float16)
    w = rng.standard_normal((4, 3, 3, 3)).astype(numpy.float16)
    gy = rng.standard_normal((8, 4, 6, 6)).astype(numpy.float16)
    lazy_gy, lazy_x = da.from_array(gy, chunks=(1, 4, 6, 6)), da.from_array(x, chunks=(1, 3, 3, 6))
    _, gw, gb = cupyconv.conv2d_backward(lazy_gy, lazy_x, w, padding=1)
    assert gw.dtype == gb.dtype == numpy.float16
    exact = cupyconv.conv2d_backward(gy.astype(numpy.float64), x.astype(numpy.float64), w.astype(numpy.float64),
                                     padding=1)
    numpy.testing.assert_allclose(gw.compute(), exact[1], rtol=2e-3, atol=2e-2)
    numpy.testing.assert_allclose(gb.compute(), exact[2], rtol=2e-3, atol=2e-2)


# ---------------------------------------------------------------------------------------------------------
# Chunks of the result and the windows behind them


def test_spatial_chunks_carry_over_for_stride_one_same_padding():
    x = da.from_array(numpy.random.default_rng(0).standard_normal((4, 2, 11, 9)), chunks=(2, 2, (4, 3, 4), (5, 4)))
    y = cupyconv.conv2d(x, numpy.ones((3, 2, 3, 3)), padding="same")
    assert y.chunks == ((2, 2), (3,), (4, 3, 4), (5, 4))
    y2 = cupyconv.conv2d(x, numpy.ones((3, 2, 3, 3)), stride=2, padding=1)    # boundaries at ceil((b + 1) / 2)
    assert y2.chunks == ((2, 2), (3,), (2, 2, 2), (3, 2))


@hypothesis_settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 30), data=st.data())
def test_windows_partition_the_output_and_read_inside_x(n, data):
    k, s, d = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    low, high = data.draw(st.integers(0, 6)), data.draw(st.integers(0, 6))
    if n + low + high - d * (k - 1) - 1 < 0:
        return
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=6)) if n > 1 else [])
    chunks = tuple(b - a for a, b in zip([0, *cuts], [*cuts, n]))
    spec = ConvSpec.geometry("t", (1,), 1, 1, 1, (n,), (k,), (s,), ((low, high),), (d,))
    windows = _dask.dim_windows(chunks, spec, 0)
    assert windows[0].out[0] == 0 and windows[-1].out[1] == spec.out_size[0]
    extent = d * (k - 1) + 1
    for w, after in zip(windows, windows[1:] + [None]):
        assert w.out[0] < w.out[1] and (after is None or after.out[0] == w.out[1])
        (a, b), (pad_low, pad_high) = w.region, w.padding
        assert 0 <= a < b <= n or len(windows) == 1
        # The region and its padding are exactly the windows of the block's outputs.
        assert a - pad_low == w.out[0] * s - low and b + pad_high == (w.out[1] - 1) * s - low + extent or \
            len(windows) == 1
    if len(windows) > 1:
        assert all(pad_low <= low and pad_high <= high for pad_low, pad_high in (w.padding for w in windows))


# ---------------------------------------------------------------------------------------------------------
# Laziness


def _explode(block):
    raise AssertionError("a block was computed while the graph was built")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_building_the_graph_computes_nothing(case):
    arrays = _chunked(case, _arrays(case))
    first = next(iter(arrays))
    arrays[first] = arrays[first].map_blocks(_explode, dtype=arrays[first].dtype)
    lazy = getattr(cupyconv, case.op)(**arrays, **case.kwargs)
    if case.grad_chunks:
        grad_output = da.zeros(lazy.shape, chunks=case.grad_chunks).map_blocks(_explode, dtype=lazy.dtype)
        backward = getattr(cupyconv, f"{case.op}_backward")(grad_output, arrays["x"], arrays["weight"],
                                                            **case.kwargs)
        assert all(isinstance(g, da.Array) for g in backward)
    with pytest.raises(AssertionError, match="a block was computed"):   # the guard itself works
        lazy.compute(scheduler="sync")


# ---------------------------------------------------------------------------------------------------------
# Errors at the call, not at compute time


def test_mixed_kinds_raise_type_error():
    torch = pytest.importorskip("torch")
    x = da.zeros((2, 3, 5, 5), chunks=1)
    with pytest.raises(TypeError, match=r"conv2d: x is a dask array of numpy.ndarray chunks but weight is a "
                                        r"torch.Tensor on cpu"):
        cupyconv.conv2d(x, torch.zeros(4, 3, 3, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="conv2d: x has dtype float64 but weight has dtype float32"):
        cupyconv.conv2d(x, numpy.zeros((4, 3, 3, 3), numpy.float32))
    with pytest.raises(TypeError, match="unfold: x must be a dask.array.Array"):
        cupyconv.unfold(dask.delayed(numpy.zeros)((2, 3, 5, 5)), 3)


def test_bad_arguments_raise_at_the_call():
    x = da.zeros((2, 3, 5, 5), chunks=1)
    with pytest.raises(ValueError, match=r"conv2d: weight \(4, 2, 3, 3\) has 2 input channels per group but x "
                                         r"\(2, 3, 5, 5\) has 3"):
        cupyconv.conv2d(x, numpy.zeros((4, 2, 3, 3)))
    with pytest.raises(ValueError, match="patch_conv2d: algorithm must be one of"):
        cupyconv.patch_conv2d(x, numpy.zeros((4, 3, 3, 3)), algorithm="fast")
    with pytest.raises(ValueError, match=r"conv2d_backward: grad_output has shape \(2, 4, 5, 5\) but the forward "
                                         r"output .* has shape \(2, 4, 3, 3\)"):
        cupyconv.conv2d_backward(da.zeros((2, 4, 5, 5)), x, numpy.zeros((4, 3, 3, 3)))
    with pytest.raises(ValueError, match="conv_transpose2d: output_padding"):
        cupyconv.conv_transpose2d(x, numpy.zeros((3, 2, 3, 3)), stride=2, output_padding=2)
    with pytest.raises(ValueError, match="conv_transpose2d: algorithm must be one of"):
        cupyconv.conv_transpose2d(x, numpy.zeros((3, 2, 3, 3)), algorithm="fused")
    with pytest.raises(ValueError, match="conv_transpose_nd_backward: algorithm must be one of"):
        cupyconv.conv_transpose_nd_backward(da.zeros((2, 2, 7, 7)), x, numpy.zeros((3, 2, 3, 3)), algorithm="fast")
    with pytest.raises(ValueError, match="conv3d_backward: workspace_limit must be a positive number of bytes"):
        cupyconv.conv3d_backward(da.zeros((2, 4, 1, 3, 3)), x[:, :, None], numpy.zeros((4, 3, 1, 3, 3)),
                                 workspace_limit=0)
    with pytest.raises(ValueError, match="conv2d: x has unknown chunk sizes"):
        cupyconv.conv2d(x[x[:, 0, 0, 0] > 0], numpy.zeros((4, 3, 3, 3)))


# ---------------------------------------------------------------------------------------------------------
# Settings travel with the graph


def test_the_callers_settings_apply_to_the_blocks():
    def report(**_):
        return (cupyconv.get_deterministic(), cupyconv.get_workspace_limit())
    with cupyconv.settings.deterministic(True), cupyconv.workspace_limit(12345):
        captured = _dask._settings_now()
    assert _dask.run_block(report, {}, (), captured, None, None) == (True, 12345)
    assert (cupyconv.get_deterministic(), cupyconv.get_workspace_limit()) != (True, 12345)


# ---------------------------------------------------------------------------------------------------------
# CuPy chunks on a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cupy_chunks_on_the_gpu(case):
    import cupy
    arrays = _arrays(case, cupy, numpy.float32)
    fn = getattr(cupyconv, case.op)
    lazy = fn(**_chunked(case, arrays), **case.kwargs)
    assert type(lazy._meta) is cupy.ndarray
    got = lazy.compute(scheduler="threads")
    assert type(got) is cupy.ndarray
    cupy.testing.assert_allclose(got, fn(**arrays, **case.kwargs), rtol=1e-4, atol=1e-4)
    if case.grad_chunks:
        arrays = _backward_arrays(case, arrays, cupy)
        backward = getattr(cupyconv, f"{case.op}_backward")
        lazy = backward(da.from_array(arrays["grad_output"], chunks=case.grad_chunks),
                        da.from_array(arrays["x"], chunks=case.chunks), arrays["weight"], **case.kwargs)
        for g, e in zip(dask.compute(*lazy, scheduler="threads"), backward(**arrays, **case.kwargs)):
            assert type(g) is cupy.ndarray
            cupy.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------------------------------------------------
# The input gradient keeps the spatial chunks


INPUT_GRADIENT_CASES = [
    ("conv2d", (2, 4, 13, 11), (4, 4, 3, 3), (1, 2, (4, 5, 4), (3, 4, 4)), dict(padding=1)),
    ("conv2d", (2, 4, 13, 11), (6, 2, 3, 2), (2, 4, (5, 4, 4), (6, 5)),
     dict(stride=(2, 3), padding=((2, 0), (1, 3)), dilation=(2, 1), groups=2)),
    # stride 3 with a 1x1 kernel: some chunks hold no window's input (their gradient is zeros)
    ("conv2d", (1, 2, 12, 9), (3, 2, 1, 1), (1, 1, (4, 1, 1, 6), (4, 5)), dict(stride=3)),
    ("conv1d", (3, 2, 17), (3, 2, 4), (3, 2, (5, 6, 6)), dict(stride=2, padding="same")),
    ("depthwise_conv2d", (2, 3, 9, 8), (6, 1, 3, 3), (2, 3, (3, 3, 3), (4, 4)),
     dict(stride=2, padding=((0, 1), (1, 1)))),
    ("conv3d", (1, 2, 7, 6, 5), (3, 2, 2, 3, 2), (1, 2, (3, 4), (2, 4), (3, 2)), dict(stride=(2, 1, 2), padding=1)),
]


def _task_shapes(lazy):
    """The shapes of every task's result while `lazy` computes (the last task's, the assembled result, aside)."""
    from dask.callbacks import Callback
    shapes = []

    class Record(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            if not str(key).startswith("finalize"):
                shapes.append(getattr(result, "shape", None))

    with Record():
        got = lazy.compute(scheduler="sync")
    return got, shapes


@pytest.mark.parametrize("op, x_shape, w_shape, chunks, kwargs", INPUT_GRADIENT_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(INPUT_GRADIENT_CASES)])
def test_the_input_gradient_keeps_spatial_chunks(op, x_shape, w_shape, chunks, kwargs):
    """grad_x equals the in-memory one, and no task ever holds the whole of x's spatial extent (before, grad_output
    and x were rechunked to one spatial chunk for it)."""
    rng = numpy.random.default_rng(len(x_shape) * 100 + sum(x_shape))
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    fn = getattr(cupyconv, f"{op}_backward")
    gy = rng.standard_normal(getattr(cupyconv, op)(x, w, **kwargs).shape)
    expected = fn(gy, x, w, needs="input", **kwargs)[0]
    lazy = fn(da.from_array(gy, chunks=(1, *gy.shape[1:2], *(-1,) * (gy.ndim - 2))), da.from_array(x, chunks=chunks),
              w, needs="input", **kwargs)[0]
    assert lazy.chunks[2:] == da.from_array(x, chunks=chunks).chunks[2:]
    got, shapes = _task_shapes(lazy)
    numpy.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    spatial = x_shape[2:]
    whole = [s for s in shapes if s is not None and len(s) == len(x_shape) and tuple(s[2:]) == spatial]
    assert not whole, f"tasks with the full spatial extent {spatial}: {whole}"
