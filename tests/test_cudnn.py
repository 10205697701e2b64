"""cupyconv.cudnn, the drop-in for the convolution functions of the removed cupy.cudnn, on the NumPy CPU path.

Every result is compared with torch CPU in float64 (F.conv*d and autograd, independent of cupyconv), on outputs
poisoned with NaN before the call so that an element left unwritten shows.  The grid is CuPy's former one
(tests/cupyx_tests/test_cudnn.py): dtypes float16/float32/float64, dilation 1/2, groups 1/2, bias or not,
NCHW/NHWC, auto_tune, tensor_core, deterministic, workspace sizes 0 and 2**22, here in 1-D, 2-D and 3-D; then
mixed strides, the calling convention of sigpy, and the errors.
"""
import itertools
import re
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

import cupyconv
from cupyconv import cudnn, settings

torch = pytest.importorskip("torch")
F = torch.nn.functional

NCHW, NHWC = cudnn.CUDNN_TENSOR_NCHW, cudnn.CUDNN_TENSOR_NHWC
DTYPES = (numpy.float16, numpy.float32, numpy.float64)
#: (rtol, atol) against float64 computed from the same (rounded) inputs; values are O(1), sums of <= 81 terms.
TOL = {numpy.float16: (2e-2, 6e-2), numpy.float32: (2e-5, 2e-5), numpy.float64: (1e-12, 1e-12)}
ROOT = Path(__file__).resolve().parent.parent


def rand(rng, shape, dtype):
    """Uniform in +-[0.25, 1): random, never zero, exactly representable after the cast (the reference reads the
    cast values)."""
    values = rng.uniform(0.25, 1.0, shape) * rng.choice((-1.0, 1.0), shape)
    return values.astype(dtype)


def poisoned(shape, dtype):
    return numpy.full(shape, numpy.nan, dtype=dtype)


def nhwc(a):
    """(N, C, *s) -> a C-contiguous (N, *s, C) copy."""
    return numpy.ascontiguousarray(numpy.moveaxis(a, 1, -1))


def nchw(a):
    return numpy.moveaxis(a, -1, 1)


def t64(a):
    return torch.from_numpy(numpy.array(a, dtype=numpy.float64))


def ref_forward(x, w, b, pad, stride, dilation, groups):
    conv = getattr(F, f"conv{x.ndim - 2}d")
    return conv(t64(x), t64(w), None if b is None else t64(b), stride, pad, dilation, groups).numpy()


def ref_grads(x, w, gy, pad, stride, dilation, groups):
    """(grad_x, grad_w) of the convolution of x with w for output gradient gy, by torch autograd in float64."""
    conv = getattr(F, f"conv{x.ndim - 2}d")
    xt, wt = t64(x).requires_grad_(), t64(w).requires_grad_()
    gx, gw = torch.autograd.grad(conv(xt, wt, None, stride, pad, dilation, groups), (xt, wt), t64(gy))
    return gx.numpy(), gw.numpy()


def assert_close(got, want, dtype):
    rtol, atol = TOL[dtype]
    assert got.dtype == numpy.dtype(dtype)
    assert not numpy.isnan(got).any(), "elements left unwritten (NaN poison)"
    numpy.testing.assert_allclose(got.astype(numpy.float64), want, rtol=rtol, atol=atol)


def out_size(size, k, p, s, d):
    return tuple((i + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for i, kk, pp, ss, dd in zip(size, k, p, s, d))


class Problem:
    """One convolution in NCHW terms (float64 values, exactly representable in dtype) and its tuples.

    CuPy's geometry: kernel 3, stride 2, pad = 3 // 2 * dilation, 3 input and 2 output channels per group."""

    def __init__(self, seed, nd, dtype, dilation=1, groups=1, size=5, ksize=3, stride=2, pad=None, bias=True,
                 batch=2, cin=3, cout=2):
        rng = numpy.random.default_rng(seed)
        self.nd, self.dtype, self.groups = nd, dtype, groups
        as_tuple = (lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd)
        self.k, self.stride, self.dilation = as_tuple(ksize), as_tuple(stride), as_tuple(dilation)
        self.pad = as_tuple(ksize // 2 * dilation if pad is None else pad)
        self.in_size = as_tuple(size)
        self.out = out_size(self.in_size, self.k, self.pad, self.stride, self.dilation)
        c, d = cin * groups, cout * groups
        self.x = rand(rng, (batch, c, *self.in_size), dtype)
        self.w = rand(rng, (d, cin, *self.k), dtype)
        self.b = rand(rng, (d,), dtype) if bias else None
        self.bx = rand(rng, (c,), dtype) if bias else None       # bias of backward_data (per input channel)
        self.gy = rand(rng, (batch, d, *self.out), dtype)
        self.args = (self.pad, self.stride, self.dilation, groups)

    def ref_forward(self):
        return ref_forward(self.x, self.w, self.b, *self.args)

    def ref_grad_w(self):
        return ref_grads(self.x, self.w, self.gy, *self.args)[1]

    def ref_grad_x(self):
        gx = ref_grads(self.x, self.w, self.gy, *self.args)[0]
        if self.bx is not None:
            gx = gx + self.bx.astype(numpy.float64).reshape(-1, *(1,) * self.nd)
        return gx


def layout(a, lay):
    return a if a is None or lay == NCHW else nhwc(a)


def run_forward(p, d_layout=NCHW, w_layout=NCHW, **flags):
    y = poisoned(layout(numpy.empty((p.x.shape[0], p.w.shape[0], *p.out)), d_layout).shape, p.dtype)
    cudnn.convolution_forward(layout(p.x, d_layout), layout(p.w, w_layout), p.b, y, *p.args,
                              d_layout=d_layout, w_layout=w_layout, **flags)
    return y if d_layout == NCHW else nchw(y)


def run_backward_filter(p, d_layout=NCHW, w_layout=NCHW, **flags):
    gw = poisoned(layout(p.w, w_layout).shape, p.dtype)
    cudnn.convolution_backward_filter(layout(p.x, d_layout), layout(p.gy, d_layout), gw, *p.args,
                                      d_layout=d_layout, w_layout=w_layout, **flags)
    return gw if w_layout == NCHW else nchw(gw)


def run_backward_data(p, d_layout=NCHW, w_layout=NCHW, **flags):
    gx = poisoned(layout(p.x, d_layout).shape, p.dtype)
    cudnn.convolution_backward_data(layout(p.w, w_layout), layout(p.gy, d_layout), p.bx, gx, *p.args,
                                    d_layout=d_layout, w_layout=w_layout, **flags)
    return gx if d_layout == NCHW else nchw(gx)


@pytest.fixture(autouse=True)
def _restore_settings():
    """Every test leaves the process-wide workspace limit as it found it."""
    limit = settings.get_workspace_limit()
    yield
    settings.set_workspace_limit(limit)


# ---------------------------------------------------------------------------------------------------------
# CuPy's former grid: dtype x dilation x groups x 1-D/2-D/3-D x layout x bias; the flags cycle over the cases
# (they do not change the CPU path's numbers; test_flags checks them all on one problem)

GRID = list(itertools.product(DTYPES, (1, 2), (1, 2), (1, 2, 3), (NCHW, NHWC), (True, False)))
FLAG_CYCLE = list(itertools.product((True, False), ("always", "auto", "never"), (True, False), (0, 2**22)))


def grid_id(case):
    dtype, dilation, groups, nd, lay, bias = case
    return (f"{numpy.dtype(dtype).name}-dil{dilation}-g{groups}-{nd}d-{'nhwc' if lay else 'nchw'}"
            f"-{'bias' if bias else 'nobias'}")


def grid_problem(index, case):
    dtype, dilation, groups, nd, lay, bias = case
    auto_tune, tensor_core, deterministic, workspace = FLAG_CYCLE[index % len(FLAG_CYCLE)]
    cudnn.set_max_workspace_size(workspace)
    return (Problem(index, nd, dtype, dilation, groups, bias=bias), lay,
            dict(auto_tune=auto_tune, tensor_core=tensor_core), deterministic)


@pytest.mark.parametrize("index, case", list(enumerate(GRID)), ids=[grid_id(c) for c in GRID])
def test_forward_grid(index, case):
    p, lay, flags, _ = grid_problem(index, case)
    assert_close(run_forward(p, lay, lay, **flags), p.ref_forward(), p.dtype)


@pytest.mark.parametrize("index, case", list(enumerate(GRID)), ids=[grid_id(c) for c in GRID])
def test_backward_filter_grid(index, case):
    p, lay, flags, deterministic = grid_problem(index, case)
    assert_close(run_backward_filter(p, lay, lay, deterministic=deterministic, **flags), p.ref_grad_w(), p.dtype)


@pytest.mark.parametrize("index, case", list(enumerate(GRID)), ids=[grid_id(c) for c in GRID])
def test_backward_data_grid(index, case):
    p, lay, flags, deterministic = grid_problem(index, case)
    assert_close(run_backward_data(p, lay, lay, deterministic=deterministic, **flags), p.ref_grad_x(), p.dtype)


@pytest.mark.parametrize("auto_tune, tensor_core, deterministic, workspace", FLAG_CYCLE)
def test_flags(auto_tune, tensor_core, deterministic, workspace):
    """Every combination of the flags and both of CuPy's workspace sizes, all three functions, float32 2-D."""
    cudnn.set_max_workspace_size(workspace)
    p = Problem(7, 2, numpy.float32, groups=2)
    flags = dict(auto_tune=auto_tune, tensor_core=tensor_core)
    assert_close(run_forward(p, **flags), p.ref_forward(), p.dtype)
    assert_close(run_backward_filter(p, deterministic=deterministic, **flags), p.ref_grad_w(), p.dtype)
    assert_close(run_backward_data(p, deterministic=deterministic, **flags), p.ref_grad_x(), p.dtype)


@pytest.mark.parametrize("d_layout, w_layout", [(NCHW, NHWC), (NHWC, NCHW)])
@pytest.mark.parametrize("nd", (1, 2, 3))
def test_mixed_layouts(nd, d_layout, w_layout):
    """The data and filter layouts are independent."""
    p = Problem(11 + nd, nd, numpy.float64, groups=2, dilation=2)
    assert_close(run_forward(p, d_layout, w_layout), p.ref_forward(), p.dtype)
    assert_close(run_backward_filter(p, d_layout, w_layout), p.ref_grad_w(), p.dtype)
    assert_close(run_backward_data(p, d_layout, w_layout), p.ref_grad_x(), p.dtype)


# ---------------------------------------------------------------------------------------------------------
# Geometry beyond CuPy's grid: strides, per-dim tuples, larger-than-minimal backward_data outputs

GEOMETRIES = [
    # nd, size, ksize, stride, pad, dilation, groups
    (1, 9, 4, 3, 2, 1, 1),
    (1, 8, 3, 1, 0, 3, 3),
    (2, (7, 6), (3, 2), (1, 3), (0, 2), (2, 1), 1),
    (2, (6, 8), (1, 1), (2, 2), (0, 0), (1, 1), 2),
    (2, (5, 5), (5, 5), (1, 1), (2, 2), (1, 1), 1),
    (3, (5, 6, 7), (2, 3, 3), (2, 1, 3), (1, 0, 2), (1, 2, 1), 2),
]


@pytest.mark.parametrize("lay", (NCHW, NHWC))
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_strides_and_per_dim_tuples(geometry, lay):
    nd, size, ksize, stride, pad, dilation, groups = geometry
    p = Problem(3, nd, numpy.float64, dilation, groups, size=size, ksize=ksize, stride=stride, pad=pad)
    assert_close(run_forward(p, lay, lay), p.ref_forward(), p.dtype)
    assert_close(run_backward_filter(p, lay, lay), p.ref_grad_w(), p.dtype)
    assert_close(run_backward_data(p, lay, lay), p.ref_grad_x(), p.dtype)


@pytest.mark.parametrize("lay", (NCHW, NHWC))
@pytest.mark.parametrize("nd", (1, 2, 3))
def test_backward_data_every_input_size_of_a_strided_convolution(nd, lay):
    """With stride 3, three input sizes give the same output size: y's shape picks the one written."""
    for extra in range(3):
        p = Problem(20 + extra, nd, numpy.float64, size=7 + extra, stride=3, pad=1, bias=extra != 1)
        assert p.out == (3,) * nd
        assert_close(run_backward_data(p, lay, lay), p.ref_grad_x(), p.dtype)


def test_dilation_none_means_ones():
    p = Problem(5, 2, numpy.float64)
    y = poisoned((2, 2, *p.out), p.dtype)
    cudnn.convolution_forward(p.x, p.w, p.b, y, p.pad, p.stride, None, 1)
    assert_close(y, p.ref_forward(), p.dtype)


def test_bias_of_any_shape_with_one_entry_per_channel():
    """CuPy reshaped b to (1, -1, 1, ...): any b with D entries was accepted."""
    p = Problem(6, 2, numpy.float64)
    y = poisoned((2, 2, *p.out), p.dtype)
    cudnn.convolution_forward(p.x, p.w, p.b.reshape(1, -1), y, *p.args)
    assert_close(y, p.ref_forward(), p.dtype)


def test_non_contiguous_inputs_are_read_as_they_are():
    """Flipped filters, strided channels and real parts of complex arrays (sigpy's idioms) are views."""
    p = Problem(9, 2, numpy.float64, groups=1, bias=False)
    rng = numpy.random.default_rng(0)
    x = (p.x + 1j * rand(rng, p.x.shape, numpy.float64)).real     # stride 16 bytes
    w = numpy.ascontiguousarray(p.w[:, :, ::-1, ::-1])[:, :, ::-1, ::-1]   # negative strides, values of p.w
    gy = numpy.ascontiguousarray(numpy.repeat(p.gy, 2, axis=1))[:, ::2]
    assert not (x.flags.c_contiguous or w.flags.c_contiguous or gy.flags.c_contiguous)
    y = poisoned((2, 2, *p.out), p.dtype)
    cudnn.convolution_forward(x, w, None, y, *p.args)
    assert_close(y, p.ref_forward(), p.dtype)
    gw = poisoned(p.w.shape, p.dtype)
    cudnn.convolution_backward_filter(x, gy, gw, *p.args)
    assert_close(gw, p.ref_grad_w(), p.dtype)
    gx = poisoned(p.x.shape, p.dtype)
    cudnn.convolution_backward_data(w, gy, None, gx, *p.args)
    assert_close(gx, p.ref_grad_x(), p.dtype)


def test_outputs_are_overwritten_not_accumulated():
    p = Problem(10, 2, numpy.float64)
    y = numpy.full((2, 2, *p.out), 7.0)
    cudnn.convolution_forward(p.x, p.w, p.b, y, *p.args)
    assert_close(y, p.ref_forward(), p.dtype)


# ---------------------------------------------------------------------------------------------------------
# sigpy's calling convention (sigpy/conv.py, _convolve_cuda and its adjoints), checked against numpy.convolve


def _sigpy_pads(mode, n):
    return tuple(k - 1 for k in n) if mode == "full" else (0,) * len(n)


@pytest.mark.parametrize("mode", ("full", "valid"))
@pytest.mark.parametrize("s", (1, 2))
def test_sigpy_convention(mode, s):
    """sigpy's 1-D path: data (B, c_i, m, 1), a flipped (negative-stride) filter (c_o, c_i, n, 1), an
    xp.empty output; keywords auto_tune=True, tensor_core='auto', deterministic=False.  Forward against
    numpy.convolve; the two adjoints by <A x, g> = <x, A^T g> and <A_x w, g> = <w, A_x^T g>."""
    rng = numpy.random.default_rng(s)
    B, c_i, c_o, m, n = 2, 2, 3, 9, 4
    strides, dilations, groups = (s, 1), (1, 1), 1
    pads = _sigpy_pads(mode, (n, 1))
    data = rand(rng, (B, c_i, m, 1), numpy.float64)
    filt = rand(rng, (c_o, c_i, n, 1), numpy.float64)
    p = ((m + n - 1 + s - 1) // s if mode == "full" else (m - n + 1 + s - 1) // s, 1)
    flipped = filt[:, :, ::-1, ::-1]
    output = numpy.empty((B, c_o) + p)
    cudnn.convolution_forward(data, flipped, None, output, pads, strides, dilations, groups, auto_tune=True,
                              tensor_core="auto")
    np_mode = "full" if mode == "full" else "valid"
    want = numpy.zeros((B, c_o, p[0]))
    for k, j, i in itertools.product(range(B), range(c_o), range(c_i)):
        want[k, j] += numpy.convolve(data[k, i, :, 0], filt[j, i, :, 0], mode=np_mode)[::s]
    numpy.testing.assert_allclose(output[..., 0], want, rtol=1e-12, atol=1e-12)

    g = rand(rng, output.shape, numpy.float64)
    adjoint = numpy.empty((B, c_i, m, 1))
    cudnn.convolution_backward_data(flipped, g, None, adjoint, pads, strides, dilations, groups,
                                    deterministic=False, auto_tune=True, tensor_core="auto")
    numpy.testing.assert_allclose(numpy.vdot(output, g), numpy.vdot(data, adjoint), rtol=1e-12)

    gfilt = numpy.empty((c_o, c_i, n, 1))
    cudnn.convolution_backward_filter(data, g, gfilt, pads, strides, dilations, groups, deterministic=False,
                                      auto_tune=True, tensor_core="auto")
    gfilt = gfilt[:, :, ::-1, ::-1]     # sigpy flips the filter gradient back
    numpy.testing.assert_allclose(numpy.vdot(output, g), numpy.vdot(filt, gfilt), rtol=1e-12)


# ---------------------------------------------------------------------------------------------------------
# Flags and workspace map onto cupyconv.settings, for the call only


def test_flags_map_onto_settings_for_the_call(monkeypatch):
    seen = []

    def record(*args, **kwargs):
        seen.append((settings.get_autotune(), settings.get_deterministic(), settings.get_allow_tf32()))
        return real(*args, **kwargs)

    real = cupyconv.cudnn._convolve
    monkeypatch.setattr(cupyconv.cudnn, "_convolve", record)
    p = Problem(1, 2, numpy.float32)
    y = poisoned((2, 2, *p.out), p.dtype)
    for auto_tune, tensor_core in itertools.product((True, False), ("auto", "always", "never")):
        cudnn.convolution_forward(p.x, p.w, p.b, y, *p.args, auto_tune=auto_tune, tensor_core=tensor_core)
    assert seen == [(True, False, False), (True, False, True), (True, False, False),
                    (False, False, False), (False, False, True), (False, False, False)]
    seen.clear()
    with settings.allow_tf32(True), settings.autotune(True):
        cudnn.convolution_forward(p.x, p.w, p.b, y, *p.args)                      # defaults
        cudnn.convolution_forward(p.x, p.w, p.b, y, *p.args, tensor_core="never")
    assert seen == [(False, False, True), (False, False, False)]
    assert (settings.get_autotune(), settings.get_deterministic(), settings.get_allow_tf32()) == (False,) * 3


def test_deterministic_maps_onto_settings_for_the_call(monkeypatch):
    seen = []

    def record(*args, **kwargs):
        seen.append(settings.get_deterministic())
        return real_backward(*args, **kwargs)

    real_backward = cupyconv.cudnn._convolve_backward
    monkeypatch.setattr(cupyconv.cudnn, "_convolve_backward", record)
    p = Problem(2, 1, numpy.float64)
    for deterministic in (True, False):
        run_backward_filter(p, deterministic=deterministic)
    assert seen == [True, False]
    assert settings.get_deterministic() is False


@pytest.mark.parametrize("flag", ["auto_tune", "deterministic"])
@pytest.mark.parametrize("bad", ["no", 1, None])
def test_flags_refuse_what_is_not_a_bool(flag, bad):
    p = Problem(2, 1, numpy.float64)
    with pytest.raises(TypeError, match=rf"^convolution_backward_filter: {flag} must be a bool \(True or False\), "
                                        rf"got {re.escape(repr(bad))}$"):
        run_backward_filter(p, **{flag: bad})
    assert (settings.get_autotune(), settings.get_deterministic()) == (False, False)
    if flag == "auto_tune":
        with pytest.raises(TypeError, match=r"^convolution_forward: auto_tune must be a bool"):
            cudnn.convolution_forward(p.x, p.w, p.b, poisoned((2, 2, *p.out), p.dtype), *p.args, auto_tune=bad)


def test_workspace_size_is_cupyconvs_workspace_limit():
    cudnn.set_max_workspace_size(2**22)
    assert settings.get_workspace_limit() == cudnn.get_max_workspace_size() == 2**22
    settings.set_workspace_limit(12345)
    assert cudnn.get_max_workspace_size() == 12345
    cudnn.set_max_workspace_size(0)          # CuPy's test grid uses 0: as small as cupyconv goes
    assert cudnn.get_max_workspace_size() == 1
    with pytest.raises(ValueError, match="set_max_workspace_size: size must be >= 0"):
        cudnn.set_max_workspace_size(-1)
    with pytest.raises(TypeError, match="set_max_workspace_size"):
        cudnn.set_max_workspace_size(1.5)
    for flag in (True, numpy.False_):
        with pytest.raises(TypeError, match="set_max_workspace_size: size must be an int number of bytes"):
            cudnn.set_max_workspace_size(flag)
    cudnn.set_max_workspace_size(numpy.int64(4096))
    assert cudnn.get_max_workspace_size() == 4096


def test_module_constants_and_names():
    assert (cudnn.CUDNN_TENSOR_NCHW, cudnn.CUDNN_TENSOR_NHWC) == (0, 1)
    for name in cudnn.__all__:
        assert hasattr(cudnn, name)


def test_import_and_numpy_calls_never_import_cupy():
    code = ("import sys; sys.modules['cupy'] = None\n"     # any `import cupy` now raises ImportError
            "import numpy\n"
            "from cupyconv import cudnn\n"
            "x = numpy.ones((1, 2, 4, 4)); w = numpy.ones((3, 2, 3, 3)); y = numpy.empty((1, 3, 2, 2))\n"
            "cudnn.convolution_forward(x, w, None, y, (0, 0), (1, 1), (1, 1), 1)\n"
            "assert (y == 18).all(), y\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------------------
# Errors: ValueError/TypeError naming the function, the argument and the shapes


def _forward_args(p, **changes):
    args = dict(x=p.x, W=p.w, b=p.b, y=poisoned((2, 2, *p.out), p.dtype), pad=p.pad, stride=p.stride,
                dilation=p.dilation, groups=p.groups)
    args.update(changes)
    return args


def _call_forward(args, **flags):
    cudnn.convolution_forward(args["x"], args["W"], args["b"], args["y"], args["pad"], args["stride"],
                              args["dilation"], args["groups"], **flags)


P = Problem(0, 2, numpy.float32)   # x (2, 3, 5, 5), W (2, 3, 3, 3), y (2, 2, 3, 3)

FORWARD_ERRORS = [
    ("y_not_contiguous", dict(y=poisoned((2, 3, 3, 2), numpy.float32).transpose(0, 1, 3, 2)[:, :2]), {},
     ValueError, r"convolution_forward: y must be C-contiguous.*\(2, 2, 2, 3\)"),
    ("y_transposed", dict(y=poisoned((2, 3, 3, 2), numpy.float32).transpose(0, 3, 1, 2)), {},
     ValueError, r"convolution_forward: y must be C-contiguous"),
    ("y_wrong_shape", dict(y=poisoned((2, 2, 4, 3), numpy.float32)), {},
     ValueError, r"convolution_forward: y has shape \(2, 2, 4, 3\) but the convolution of x \(2, 3, 5, 5\) with "
                 r"W \(2, 3, 3, 3\) gives \(2, 2, 3, 3\)"),
    ("y_wrong_channels", dict(y=poisoned((2, 3, 3, 3), numpy.float32)), {},
     ValueError, r"y has shape \(2, 3, 3, 3\).*gives \(2, 2, 3, 3\)"),
    ("y_wrong_dtype", dict(y=poisoned((2, 2, 3, 3), numpy.float64)), {},
     TypeError, r"convolution_forward: x has dtype float32 but y has dtype float64"),
    ("W_wrong_dtype", dict(W=P.w.astype(numpy.float16)), {},
     TypeError, r"convolution_forward: x has dtype float32 but W has dtype float16"),
    ("b_wrong_dtype", dict(b=P.b.astype(numpy.float64)), {}, TypeError, r"but b has dtype float64"),
    ("int_dtype", dict(x=P.x.astype(numpy.int32), W=P.w.astype(numpy.int32), b=None,
                       y=numpy.zeros((2, 2, 3, 3), numpy.int32)), {},
     TypeError, r"convolution_forward: x has dtype int32; supported dtypes are"),
    ("complex_dtype", dict(x=P.x.astype(numpy.complex64)), {}, TypeError, r"x has dtype complex64"),
    ("read_only_y", dict(y=numpy.lib.stride_tricks.as_strided(numpy.zeros((2, 2, 3, 3), numpy.float32),
                                                             writeable=False)), {},
     ValueError, r"convolution_forward: y \(2, 2, 3, 3\) is read-only"),
    ("pad_too_short", dict(pad=(1,)), {}, ValueError,
     r"convolution_forward: pad must have one entry per spatial dim: 2 for 4-dim arrays, got \(1,\) of length 1"),
    ("stride_too_long", dict(stride=(2, 2, 2)), {}, ValueError, r"convolution_forward: stride must have one entry"),
    ("dilation_too_short", dict(dilation=(1,)), {}, ValueError, r"convolution_forward: dilation must have one"),
    ("pad_int", dict(pad=1), {}, TypeError, r"convolution_forward: pad must be a tuple"),
    ("pad_negative", dict(pad=(1, -1)), {}, ValueError, r"every entry of pad must be >= 0"),
    ("stride_zero", dict(stride=(0, 1)), {}, ValueError, r"every entry of stride must be >= 1"),
    ("pad_float", dict(pad=(1.0, 1)), {}, TypeError, r"the entries of pad must be ints"),
    ("groups_zero", dict(groups=0), {}, ValueError, r"convolution_forward: groups must be >= 1"),
    ("pad_bools", dict(pad=(True, True)), {}, TypeError, r"convolution_forward: the entries of pad must be ints"),
    ("stride_bool", dict(stride=(numpy.True_, 1)), {}, TypeError, r"the entries of stride must be ints"),
    ("groups_bool", dict(groups=True), {}, TypeError, r"convolution_forward: groups must be an int, got True"),
    ("groups_not_dividing", dict(groups=2), {}, ValueError, r"x \(2, 3, 5, 5\) has 3 channels, not divisible"),
    ("W_channels", dict(W=P.w[:, :2].copy()), {}, ValueError,
     r"W \(2, 2, 3, 3\) has 2 input channels per group but x \(2, 3, 5, 5\) has 3 channels with groups=1"),
    ("W_ndim", dict(W=P.w[0].copy()), {}, ValueError,
     r"x \(2, 3, 5, 5\) has 4 dims but W \(3, 3, 3\) has 3"),
    ("x_ndim", dict(x=P.x[0, 0].copy()), {}, ValueError, r"x must have 3, 4 or 5 dims"),
    ("b_wrong_size", dict(b=numpy.ones(3, numpy.float32)), {}, ValueError,
     r"b \(3,\) must have one entry per channel of y \(2\)"),
    ("no_output_pixels", dict(x=P.x[:, :, :1, :1].copy(), pad=(0, 0)), {}, ValueError, r"has no output pixels"),
    ("y_none", dict(y=None), {}, TypeError, r"convolution_forward: y must be a numpy.ndarray or cupy.ndarray"),
    ("x_list", dict(x=P.x.tolist()), {}, TypeError, r"x must be a numpy.ndarray or cupy.ndarray, got a builtins"),
    ("bad_tensor_core", {}, dict(tensor_core="sometimes"), ValueError,
     r"convolution_forward: tensor_core must be 'auto', 'always' or 'never', got 'sometimes'"),
    ("bad_d_layout", {}, dict(d_layout=2), ValueError, r"convolution_forward: d_layout must be CUDNN_TENSOR_NCHW"),
    ("bad_w_layout", {}, dict(w_layout="NHWC"), ValueError, r"w_layout must be CUDNN_TENSOR_NCHW"),
]


@pytest.mark.parametrize("changes, flags, error, match", [e[1:] for e in FORWARD_ERRORS],
                         ids=[e[0] for e in FORWARD_ERRORS])
def test_forward_errors(changes, flags, error, match):
    args = _forward_args(P, **changes)
    with pytest.raises(error, match=match):
        _call_forward(args, **flags)


def test_torch_tensor_is_refused():
    y = poisoned((2, 2, *P.out), P.dtype)
    with pytest.raises(TypeError, match=r"convolution_forward: x must be a numpy.ndarray or cupy.ndarray, got a "
                                        r"torch.Tensor"):
        cudnn.convolution_forward(torch.from_numpy(P.x), P.w, P.b, y, *P.args)


class _FakeCupyArray:
    """Looks like a cupy.ndarray to cupyconv's kind check (its module is cupy's), without CuPy."""
    __module__ = "cupy._core.core"

    def __init__(self, a):
        self._a = a
        self.shape, self.ndim, self.dtype, self.size, self.flags = a.shape, a.ndim, a.dtype, a.size, a.flags
        self.device = type("Device", (), {"id": 0})()


def test_numpy_and_cupy_arrays_cannot_be_mixed():
    y = poisoned((2, 2, *P.out), P.dtype)
    with pytest.raises(TypeError, match=r"convolution_forward: x is a numpy.ndarray but y is a cupy.ndarray on "
                                        r"cuda:0; all arrays of one call must be NumPy arrays, or CuPy arrays"):
        cudnn.convolution_forward(P.x, P.w, P.b, _FakeCupyArray(y), *P.args)
    with pytest.raises(TypeError, match=r"convolution_backward_data: W is a cupy.ndarray on cuda:0 but x is a "
                                        r"numpy.ndarray"):
        cudnn.convolution_backward_data(_FakeCupyArray(P.w), P.gy, None, poisoned(P.x.shape, P.dtype), *P.args)


def test_nhwc_errors_show_the_callers_shapes():
    x = nhwc(P.x)                                   # (2, 5, 5, 3)
    y = poisoned((2, 3, 3, 3), P.dtype)             # channels-last would be (2, 3, 3, 2)
    with pytest.raises(ValueError, match=r"y has shape \(2, 3, 3, 3\) but the convolution of x \(2, 5, 5, 3\) "
                                         r"with W \(2, 3, 3, 3\) gives \(2, 3, 3, 2\).*CUDNN_TENSOR_NHWC"):
        cudnn.convolution_forward(x, P.w, P.b, y, *P.args, d_layout=NHWC, w_layout=NCHW)


def test_backward_filter_errors():
    f = cudnn.convolution_backward_filter
    gw = poisoned(P.w.shape, P.dtype)
    with pytest.raises(ValueError, match=r"convolution_backward_filter: gW must be C-contiguous"):
        f(P.x, P.gy, poisoned((2, 3, 3, 6), P.dtype)[..., ::2], *P.args)
    with pytest.raises(ValueError, match=r"convolution_backward_filter: gy has shape \(2, 2, 2, 3\) but the "
                                         r"convolution of x \(2, 3, 5, 5\) with a weight of gW's shape "
                                         r"\(2, 3, 3, 3\) gives \(2, 2, 3, 3\)"):
        f(P.x, P.gy[:, :, :2].copy(), gw, *P.args)
    with pytest.raises(ValueError, match=r"gy has shape .* gives \(2, 2, 2, 2\)"):     # gW's kernel size is wrong
        f(P.x, P.gy, poisoned((2, 3, 4, 4), P.dtype), *P.args)
    with pytest.raises(ValueError, match=r"gy \(2, 4, 3, 3\) has 4 channels but gW \(2, 3, 3, 3\) has 2 output"):
        f(P.x, numpy.concatenate([P.gy, P.gy], axis=1), gw, *P.args)
    with pytest.raises(TypeError, match=r"convolution_backward_filter: x has dtype float32 but gW has dtype "
                                        r"float16"):
        f(P.x, P.gy, gw.astype(numpy.float16), *P.args)
    with pytest.raises(ValueError, match=r"convolution_backward_filter: stride must have one entry"):
        f(P.x, P.gy, gw, P.pad, (2,), P.dilation, 1)
    with pytest.raises(ValueError, match=r"convolution_backward_filter: tensor_core"):
        f(P.x, P.gy, gw, *P.args, tensor_core=True)


def test_errors_from_cupyconv_name_the_cudnn_function(monkeypatch):
    """What cupyconv itself refuses (here a machine too small) names the function called, not an internal one."""
    monkeypatch.setattr(cupyconv._device, "host_memory", lambda: 64)
    for fn, run in [("convolution_forward", lambda: cudnn.convolution_forward(
                         P.x, P.w, P.b, poisoned((2, 2, *P.out), P.dtype), *P.args)),
                    ("convolution_backward_filter", lambda: run_backward_filter(P)),
                    ("convolution_backward_data", lambda: run_backward_data(P))]:
        with pytest.raises(MemoryError, match=rf"^{fn}: float32 arrays need"):
            run()


def test_backward_data_errors():
    f = cudnn.convolution_backward_data
    gx = poisoned(P.x.shape, P.dtype)
    with pytest.raises(ValueError, match=r"convolution_backward_data: y must be C-contiguous"):
        f(P.w, P.gy, None, poisoned((2, 3, 5, 10), P.dtype)[..., ::2], *P.args)
    with pytest.raises(ValueError, match=r"convolution_backward_data: x has shape \(2, 2, 3, 3\) but the "
                                         r"convolution of y \(2, 3, 7, 7\) with W \(2, 3, 3, 3\) gives "
                                         r"\(2, 2, 4, 4\)"):
        f(P.w, P.gy, None, poisoned((2, 3, 7, 7), P.dtype), *P.args)
    with pytest.raises(ValueError, match=r"W \(2, 3, 3, 3\) has 3 input channels per group but y \(2, 4, 5, 5\) "
                                         r"has 4 channels"):
        f(P.w, P.gy, None, poisoned((2, 4, 5, 5), P.dtype), *P.args)
    with pytest.raises(ValueError, match=r"b \(2,\) must have one entry per channel of y \(3\)"):
        f(P.w, P.gy, P.b, gx, *P.args)
    with pytest.raises(TypeError, match=r"convolution_backward_data: W has dtype float32 but y has dtype float64"):
        f(P.w, P.gy, None, gx.astype(numpy.float64), *P.args)
    with pytest.raises(ValueError, match=r"convolution_backward_data: pad must have one entry"):
        f(P.w, P.gy, None, gx, (1, 1, 1), P.stride, P.dilation, 1)
