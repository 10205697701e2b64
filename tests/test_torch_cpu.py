"""cupyconv.torch on CPU tensors: torch's own CPU convolutions by default, cupyconv's NumPy path on request.

The other torch test files run every test on both paths (the `cpu_path` fixture of conftest.py), against torch's
functional ops; here: which path runs, the switch itself, the half types, and cupyconv's errors on the torch path.
"""
import threading

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import cupyconv  # noqa: E402
import cupyconv.torch as cct  # noqa: E402
from test_torch_convolutions import spy_on  # noqa: E402


@pytest.mark.parametrize("op, weight", [("conv2d", (4, 3, 3, 3)), ("conv_transpose2d", (3, 4, 3, 3)),
                                        ("patch_conv2d", (4, 3, 3, 3))])
def test_default_path_is_torchs_and_the_switch_selects_numpy(op, weight, monkeypatch):
    seen: list = []
    spy_on(monkeypatch, op, seen)
    spy_on(monkeypatch, f"{op}_backward", seen)
    x = torch.randn(2, 3, 6, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(weight, dtype=torch.float64, requires_grad=True)
    y = getattr(cct, op)(x, w, padding=((1, 0), (0, 1)))
    y.sum().backward()
    assert seen == [] and not cct.get_numpy_cpu_path()
    with cct.numpy_cpu_path(True):
        y_numpy = getattr(cct, op)(x, w, padding=((1, 0), (0, 1)))
        y_numpy.sum().backward()
    assert [name for name, _, _ in seen] == [op, f"{op}_backward"]
    torch.testing.assert_close(y_numpy, y)


def test_the_switch_takes_bools_only_and_scopes_per_thread():
    for bad in ("False", 0, None):
        with pytest.raises(TypeError, match="numpy_cpu_path: enabled must be True or False"):
            cct.set_numpy_cpu_path(bad)
        with pytest.raises(TypeError, match="numpy_cpu_path: enabled must be True or False"):
            cct.numpy_cpu_path(bad).__enter__()
    seen_by_thread = []
    with cct.numpy_cpu_path(True):
        assert cct.get_numpy_cpu_path()
        thread = threading.Thread(target=lambda: seen_by_thread.append(cct.get_numpy_cpu_path()))
        thread.start()
        thread.join()
    assert seen_by_thread == [False] and not cct.get_numpy_cpu_path()
    cct.set_numpy_cpu_path(True)
    try:
        assert cct.get_numpy_cpu_path()
    finally:
        cct.set_numpy_cpu_path(False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_both_paths_agree_with_float64_within_the_dtypes_tolerance(dtype):
    torch.manual_seed(3)
    x, w, b = torch.randn(2, 4, 7, 6), torch.randn(6, 2, 3, 3), torch.randn(6)
    expected = F.conv2d(F.pad(x.double(), [0, 1, 1, 0]), w.double(), b.double(), 2, 0, 1, 2)
    tol = {torch.float16: 2e-2, torch.bfloat16: 8e-2, torch.float32: 1e-5}[dtype]
    for numpy_path in (False, True):
        with cct.numpy_cpu_path(numpy_path):
            y = cct.conv2d(x.to(dtype), w.to(dtype), b.to(dtype), 2, ((1, 0), (0, 1)), groups=2)
        assert y.dtype == dtype
        torch.testing.assert_close(y.double(), expected, rtol=tol, atol=tol)


def test_the_ops_raise_cupyconvs_errors_on_the_torch_path():
    x = torch.randn(1, 3, 5, 5)
    with pytest.raises(ValueError, match=r"^conv2d: weight .*\(2, 4, 3, 3\).* x .*\(1, 3, 5, 5\)"):
        torch.ops.cupyconv.conv2d(x, torch.randn(2, 4, 3, 3), None, [1, 1], [0, 0, 0, 0], [1, 1], 1)
    with pytest.raises(ValueError, match=r"^conv_transpose2d: output_padding"):
        torch.ops.cupyconv.conv_transpose2d(x, torch.randn(3, 2, 3, 3), None, [1, 1], [0, 0, 0, 0], [1, 1], 1,
                                            [1, 1])
    assert cupyconv.get_workspace_limit() == cupyconv.DEFAULT_WORKSPACE_LIMIT
