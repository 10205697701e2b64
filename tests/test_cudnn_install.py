"""cupyconv.cudnn.install(): code written for CuPy <= 13's cuDNN module runs unchanged on CuPy 14.

sigpy (BSD-3, installed by the test extra, not edited) looks for ``cupy.cuda.cudnn`` when it is imported and
then calls ``cupy.cudnn.convolution_*`` from its GPU branch.  Here sigpy is imported after `install`, and its
public functions `convolve`, `convolve_data_adjoint` and `convolve_filter_adjoint` are made to take that GPU
branch with NumPy arrays (its array-module lookup answers with a stand-in for numpy that is not numpy), so
sigpy's own calling code runs through cupyconv: on the NumPy CPU path, and on the GPU orchestration under the
kernel emulator.  The reference is sigpy's NumPy branch (scipy.signal), independent of cupyconv.
"""
import importlib.util
import itertools
import sys
import types
import warnings

import numpy
import pytest

from cupyconv import _device, cudnn
from emulator import EmulatedDevice

pytest.importorskip("cupy")          # the names install() registers are CuPy's (installed without a GPU is enough)
pytest.importorskip("sigpy")

FORMER_NAMES = ("cupy.cudnn", "cupyx.cudnn", "cupy.cuda.cudnn")


def _forget_sigpy():
    for name in [m for m in sys.modules if m == "sigpy" or m.startswith("sigpy.")]:
        del sys.modules[name]


@pytest.fixture
def sigpy_on_cupyconv():
    """sigpy imported anew (it looks for cuDNN at import) inside `cudnn.installed()`, forgotten afterwards."""
    _forget_sigpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # CuPy without a GPU warns about its missing libraries
        with cudnn.installed():
            import sigpy
            import sigpy.conv
            yield sigpy
    _forget_sigpy()


class _NotNumpy(types.ModuleType):
    """numpy under another identity: sigpy's `xp == np` test fails, so it takes its GPU (cuDNN) branch, whose
    array calls (xp.empty, xp.real, ...) then reach numpy."""

    def __getattr__(self, name):
        return getattr(numpy, name)


def _through_the_gpu_branch(sigpy, monkeypatch):
    monkeypatch.setattr(sigpy.backend, "get_array_module", lambda *arrays: _NotNumpy("not_numpy"))


def _problems(small):
    """(D, mode, strides, multi_channel, dtype): every combination, or a few for the (slow) emulator."""
    grid = itertools.product((1, 2, 3), ("full", "valid"), (False, True), (False, True),
                             (numpy.float32, numpy.float64, numpy.complex64))
    problems = [(d, mode, strided, multi, dtype) for d, mode, strided, multi, dtype in grid]
    if small:
        problems = [p for i, p in enumerate(problems) if i % 9 == 0]
    return problems


def _arrays(rng, d, mode, strided, multi, dtype):
    """data, filter, strides and the output's shape (from sigpy's NumPy forward) of one problem."""
    m, n = (5, 4, 3)[:d], (3, 2, 2)[:d]
    batch, c_i, c_o = (2,), 2, 3
    data_shape = batch + ((c_i,) if multi else ()) + m
    filt_shape = ((c_o, c_i) if multi else ()) + n

    def rand(shape):
        a = rng.standard_normal(shape)
        if numpy.dtype(dtype).kind == "c":
            a = a + 1j * rng.standard_normal(shape)
        return a.astype(dtype)

    strides = (2, 1, 2)[:d] if strided else None
    return rand(data_shape), rand(filt_shape), strides


def _compare(sigpy, monkeypatch, rng, problem):
    d, mode, strided, multi, dtype = problem
    data, filt, strides = _arrays(rng, d, mode, strided, multi, dtype)
    kw = dict(mode=mode, strides=strides, multi_channel=multi)
    expected = sigpy.convolve(data, filt, **kw)                       # sigpy's NumPy branch
    out = rng.standard_normal(expected.shape).astype(dtype)
    expected_data = sigpy.convolve_data_adjoint(out, filt, data.shape, **kw)
    expected_filt = sigpy.convolve_filter_adjoint(out, data, filt.shape, **kw)
    with monkeypatch.context() as patch:
        _through_the_gpu_branch(sigpy, patch)
        got = sigpy.convolve(data, filt, **kw)
        got_data = sigpy.convolve_data_adjoint(out, filt, data.shape, **kw)
        got_filt = sigpy.convolve_filter_adjoint(out, data, filt.shape, **kw)
    single = numpy.finfo(dtype).dtype == numpy.float32          # float32 and complex64
    tol = dict(rtol=1e-4, atol=1e-4) if single else dict(rtol=1e-10, atol=1e-10)
    for name, a, b in (("convolve", got, expected), ("data adjoint", got_data, expected_data),
                       ("filter adjoint", got_filt, expected_filt)):
        assert a.shape == b.shape, (name, problem)
        numpy.testing.assert_allclose(a, b, **tol, err_msg=f"{name} {problem}")


def test_sigpy_finds_cudnn_and_calls_cupyconv(sigpy_on_cupyconv):
    assert sigpy_on_cupyconv.config.cudnn_enabled
    assert sigpy_on_cupyconv.conv.cudnn is cudnn
    import cupy
    assert cupy.cudnn is cudnn and cupy.cuda.cudnn is cudnn and sys.modules["cupyx.cudnn"] is cudnn


def test_sigpy_without_install_finds_no_cudnn():
    """The control: on CuPy 14, sigpy's GPU convolutions are off unless install() ran (what the issue found)."""
    _forget_sigpy()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import sigpy.config
        assert not sigpy.config.cudnn_enabled
    finally:
        _forget_sigpy()


@pytest.mark.parametrize("problem", _problems(small=False), ids=str)
def test_sigpy_convolutions_on_the_cpu_path(sigpy_on_cupyconv, monkeypatch, problem):
    _compare(sigpy_on_cupyconv, monkeypatch, numpy.random.default_rng(0), problem)


@pytest.mark.parametrize("problem", _problems(small=True), ids=str)
def test_sigpy_convolutions_on_the_emulated_device(sigpy_on_cupyconv, monkeypatch, problem):
    with _device.use_device(EmulatedDevice()):
        _compare(sigpy_on_cupyconv, monkeypatch, numpy.random.default_rng(1), problem)


def test_install_is_idempotent_and_uninstall_restores(monkeypatch):
    import cupy
    cudnn.uninstall()
    assert not cudnn.is_installed() and not hasattr(cupy, "cudnn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cudnn.install()
        cudnn.install()
    try:
        assert cudnn.is_installed()
        assert all(sys.modules[name] is cudnn for name in FORMER_NAMES)
        assert importlib.util.find_spec("cupy.cuda.cudnn") is not None          # what sigpy tests
        with cudnn.installed():         # already installed: left installed after the block
            pass
        assert cudnn.is_installed()
    finally:
        cudnn.uninstall()
    assert not cudnn.is_installed() and not hasattr(cupy, "cudnn") and not hasattr(cupy.cuda, "cudnn")
    assert all(name not in sys.modules for name in FORMER_NAMES)
    assert importlib.util.find_spec("cupy.cuda.cudnn") is None


def test_install_refuses_a_real_cudnn_binding(monkeypatch):
    import cupy  # noqa: F401
    binding = types.ModuleType("cupy_backends.cuda.libs.cudnn")
    monkeypatch.setitem(sys.modules, "cupy.cuda.cudnn", binding)
    with pytest.raises(RuntimeError, match=r"^cupyconv.cudnn.install: cupy.cuda.cudnn exists in this CuPy .* "
                                           r"\(a real cuDNN binding\); it is left in place"):
        cudnn.install()
    assert sys.modules["cupy.cuda.cudnn"] is binding and "cupy.cudnn" not in sys.modules
    cudnn.uninstall()                                   # leaves what is not ours alone
    assert sys.modules["cupy.cuda.cudnn"] is binding


def test_install_without_cupy_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ModuleNotFoundError, match=r"^cupyconv.cudnn.install: CuPy is not installed"):
        cudnn.install()


def test_install_after_sigpy_was_imported_warns():
    _forget_sigpy()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import sigpy  # noqa: F401
        with pytest.warns(RuntimeWarning, match=r"sigpy was imported before install\(\)"):
            cudnn.install()
    finally:
        cudnn.uninstall()
        _forget_sigpy()


def test_namespace_holds_only_the_api():
    public = {name for name in dir(cudnn) if not name.startswith("_")}
    assert public == set(cudnn.__all__)
    assert not {"numpy", "contextlib", "operator", "settings", "annotations"} & public
