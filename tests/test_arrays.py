"""Dispatch and bridging: NumPy in gives NumPy out (the CPU path); torch CPU tensors in give torch tensors out on
the same device with the same dtype, bridged by DLPack without a copy; mixed kinds and dtypes and non-float
dtypes raise TypeError naming what is wrong; CuPy arrays go to the GPU path (GPU only)."""
import re
import sys

import numpy
import pytest

import cupyconv as cc
from cupyconv._arrays import Call

import reference as ref

#: Every public op as (name, call, shapes of its array arguments in order); results are arrays or tuples.
OPS = [
    ("conv2d", lambda x, w, b: cc.conv2d(x, w, b, padding=1, groups=2), [(2, 4, 5, 5), (6, 2, 3, 3), (6,)]),
    ("conv2d_backward", lambda gy, x, w: cc.conv2d_backward(gy, x, w, padding=1, groups=2),
     [(2, 6, 5, 5), (2, 4, 5, 5), (6, 2, 3, 3)]),
    ("conv2d_groups_C", lambda x, w, b: cc.conv2d(x, w, b, stride=2, groups=4), [(2, 4, 5, 5), (8, 1, 3, 3), (8,)]),
    ("depthwise_conv2d", lambda x, w, b: cc.depthwise_conv2d(x, w, b, padding="same"),
     [(2, 3, 5, 4), (6, 1, 3, 3), (6,)]),
    ("depthwise_conv2d_backward", lambda gy, x, w: cc.depthwise_conv2d_backward(gy, x, w, padding="same"),
     [(2, 6, 5, 4), (2, 3, 5, 4), (6, 1, 3, 3)]),
    ("patch_conv2d", lambda x, w, b: cc.patch_conv2d(x, w, b, padding=1), [(2, 3, 2, 4, 4), (3, 2, 3, 3), (3,)]),
    ("patch_conv2d_backward", lambda gy, x, w: cc.patch_conv2d_backward(gy, x, w, padding=1),
     [(2, 3, 3, 4, 4), (2, 3, 2, 4, 4), (3, 2, 3, 3)]),
    ("unfold", lambda x: cc.unfold(x, 3, padding=1), [(2, 2, 5, 4)]),
    ("fold", lambda cols: cc.fold(cols, (5, 4), 3, padding=1), [(2, 18, 20)]),
    ("unfold_backward", lambda g: cc.unfold_backward(g, (5, 4), 3, padding=1), [(2, 18, 20)]),
    ("fold_backward", lambda g: cc.fold_backward(g, 3, padding=1), [(2, 2, 5, 4)]),
]
OP_IDS = [name for name, _, _ in OPS]


def results(out):
    """An op's result as a list of arrays."""
    return list(out) if isinstance(out, tuple) else [out]


def numpy_inputs(shapes, dtype, seed=0):
    rng = numpy.random.default_rng(seed)
    return [ref.random(rng, shape, dtype) for shape in shapes]


# ---------------------------------------------------------------------------------------------------------
# NumPy


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("name, op, shapes", OPS, ids=OP_IDS)
def test_numpy_in_numpy_out(name, op, shapes, dtype):
    out = results(op(*numpy_inputs(shapes, dtype)))
    assert out and all(isinstance(r, numpy.ndarray) and r.dtype == numpy.dtype(dtype) for r in out), name


def test_numpy_runs_on_the_cpu_path():
    assert Call("conv2d", x=numpy.ones((1, 1, 2, 2))).device is None


# ---------------------------------------------------------------------------------------------------------
# torch


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("name, op, shapes", OPS, ids=OP_IDS)
def test_torch_in_torch_out(name, op, shapes, dtype):
    """Same kind, device and dtype out; the values are the NumPy path's (for bfloat16: the float32 path's,
    rounded)."""
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    tensors = [torch.from_numpy(a).to(tdtype) for a in numpy_inputs(shapes, "float32")]
    out = results(op(*tensors))
    if dtype == "bfloat16":
        expected = results(op(*(t.float().numpy() for t in tensors)))
    else:
        expected = results(op(*(t.numpy() for t in tensors)))
    assert len(out) == len(expected)
    for got, want in zip(out, expected):
        assert isinstance(got, torch.Tensor) and got.device.type == "cpu" and got.dtype == tdtype, name
        if dtype == "bfloat16":
            assert torch.equal(got, torch.from_numpy(want).to(torch.bfloat16)), name
        else:
            numpy.testing.assert_array_equal(got.numpy(), want, err_msg=name)


@pytest.mark.parametrize("name, op, shapes", OPS, ids=OP_IDS)
def test_torch_requires_grad_with_grad_mode_on_is_refused(name, op, shapes):
    """No silent loss of autograd: a tensor that requires grad, while grad mode is on, is refused with the
    differentiable op to use; the last argument alone (weight, or the only input) requiring grad is enough."""
    torch = pytest.importorskip("torch")
    tensors = [torch.from_numpy(a) for a in numpy_inputs(shapes, "float64")]
    tensors[-1].requires_grad_(True)
    op_name = "conv2d" if name == "conv2d_groups_C" else name
    twins = ("conv2d", "depthwise_conv2d", "patch_conv2d", "unfold", "fold")       # in cupyconv.torch
    use = f"cupyconv.torch.{op_name}" if op_name in twins else "cupyconv.torch's ops and layers"
    with pytest.raises(TypeError, match=rf"^{op_name}: \w+ requires grad, but the plain cupyconv functions are not "
                                        rf"recorded by autograd .*; use {re.escape(use)}, or call inside "
                                        rf"torch.no_grad\(\)"):
        op(*tensors)


@pytest.mark.parametrize("name, op, shapes", OPS, ids=OP_IDS)
def test_torch_requires_grad_inputs_under_no_grad_give_plain_results(name, op, shapes):
    torch = pytest.importorskip("torch")
    arrays = numpy_inputs(shapes, "float64")
    tensors = [torch.from_numpy(a.copy()).requires_grad_(True) for a in arrays]
    with torch.no_grad():
        out = results(op(*tensors))
    for got, want in zip(out, results(op(*arrays))):
        assert isinstance(got, torch.Tensor) and not got.requires_grad, name
        numpy.testing.assert_array_equal(got.numpy(), want, err_msg=name)


@pytest.mark.parametrize("name, op, shapes", OPS, ids=OP_IDS)
def test_torch_non_contiguous_inputs(name, op, shapes):
    """Transposed tensors (read through their strides by DLPack) give the contiguous copies' results."""
    torch = pytest.importorskip("torch")
    arrays = numpy_inputs(shapes, "float64")
    tensors = [torch.from_numpy(numpy.ascontiguousarray(a.swapaxes(-1, -2))).transpose(-1, -2)
               if a.ndim >= 2 else torch.from_numpy(a) for a in arrays]
    assert any(not t.is_contiguous() for t in tensors)
    for got, want in zip(results(op(*tensors)), results(op(*arrays))):
        ref.assert_close(got, want)


def test_torch_bridge_is_zero_copy():
    """A CPU tensor is seen by the NumPy path in place (same memory, same strides), and a NumPy result is
    handed back as a tensor over the same memory."""
    torch = pytest.importorskip("torch")
    base = torch.randn(2, 3, 6, 5, dtype=torch.float64)
    for t in (base, base.transpose(-1, -2), base[:, 1:]):
        call = Call("unfold", x=t)
        assert isinstance(call.x, numpy.ndarray)
        assert call.x.__array_interface__["data"][0] == t.data_ptr()
        assert call.x.strides == tuple(s * t.element_size() for s in t.stride())
    result = numpy.arange(12.0).reshape(3, 4)
    wrapped = Call("unfold", x=base).wrap(result)
    assert isinstance(wrapped, torch.Tensor) and wrapped.data_ptr() == result.__array_interface__["data"][0]
    wrapped_tuple = Call("conv2d_backward", grad_output=base, x=base, weight=base).wrap((result, None, result))
    assert wrapped_tuple[1] is None and all(isinstance(w, torch.Tensor) for w in wrapped_tuple[::2])


def test_torch_results_are_independent_of_the_inputs():
    """Outputs never alias an input: writing into unfold's or fold_backward's result leaves x alone."""
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    before = x.clone()
    for out in (cc.unfold(x, 1), cc.fold_backward(x, 1), cc.unfold(x, 4)):
        assert isinstance(out, torch.Tensor)
        out.zero_()
        assert torch.equal(x, before)


def test_torch_empty_batch():
    torch = pytest.importorskip("torch")
    out = cc.conv2d(torch.empty(0, 2, 4, 4), torch.randn(3, 2, 3, 3), padding=1)
    assert isinstance(out, torch.Tensor) and out.shape == (0, 3, 4, 4) and out.dtype == torch.float32
    cols = cc.unfold(torch.empty(3, 0, 2, 4, 4, dtype=torch.float16), 2)
    assert isinstance(cols, torch.Tensor) and cols.shape == (3, 0, 8, 9) and cols.dtype == torch.float16


def negative_bit_view(torch, t):
    """A tensor equal to t with its negative bit set (a lazily negated view): the imaginary part of the conjugate
    of 0 - i t, as `.conj().imag` of a complex tensor gives."""
    view = torch.complex(torch.zeros_like(t), -t).conj().imag
    assert view.is_neg() and torch.equal(view, t)
    return view


def check_negative_bit_in_every_position(torch, op, arrays, device="cpu"):
    """op on tensors of arrays (on device), once with each argument as a negative-bit view: the NumPy result.  On
    the CPU the two paths are bit-identical; the CUDA kernels sum in another order (the first GPU run, 2026-11-26,
    differed by 3e-14 relative in float64), so there the comparison allows float64 rounding -- a negative bit
    dropped flips signs, an error of order 1."""
    expected = results(op(*arrays))
    rtol = 0.0 if device == "cpu" else 1e-12
    for position in range(len(arrays)):
        tensors = [torch.from_numpy(a).to(device) for a in arrays]
        tensors[position] = negative_bit_view(torch, tensors[position])
        for got, want in zip(results(op(*tensors)), expected):
            numpy.testing.assert_allclose(got.cpu().numpy(), want, rtol=rtol, atol=rtol * numpy.abs(want).max(),
                                          err_msg=f"argument {position}")
        assert tensors[position].is_neg()   # the caller's view is left as it was


@pytest.mark.parametrize("name, op, shapes", OPS, ids=OP_IDS)
def test_torch_negative_bit_is_resolved(name, op, shapes):
    """numpy.from_dlpack ignores torch's negative bit: without resolving it, the op would compute with -x."""
    torch = pytest.importorskip("torch")
    check_negative_bit_in_every_position(torch, op, numpy_inputs(shapes, "float64"))


def test_torch_conjugate_bit_is_refused_as_complex():
    """Only complex tensors carry the conjugate bit, and complex dtypes are refused before any bridging."""
    torch = pytest.importorskip("torch")
    x = torch.randn(1, 2, 4, 4, dtype=torch.complex64).conj()
    assert x.is_conj()
    with pytest.raises(TypeError, match=r"^unfold: x has dtype complex64; supported"):
        cc.unfold(x, 2)


def test_torch_meta_tensors_raise_without_importing_cupy(monkeypatch):
    """The plain functions compute; meta tensors (no data) belong to cupyconv.torch's ops, which have fake
    implementations.  No CuPy import is tried on the way (a None in sys.modules makes any import fail)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "cupy", None)
    x, w = torch.empty(2, 4, 8, 8, device="meta"), torch.empty(3, 4, 3, 3, device="meta")
    with pytest.raises(TypeError, match=r"^conv2d: x \(2, 4, 8, 8\) is a torch\.Tensor on meta: meta tensors have "
                                        r"no data to compute on; cupyconv\.torch's ops take them"):
        cc.conv2d(x, w)
    with pytest.raises(TypeError, match=r"^conv2d_backward: weight \(3, 4, 3, 3\) is a torch\.Tensor on meta"):
        cc.conv2d_backward(torch.zeros(2, 3, 6, 6), torch.zeros(2, 4, 8, 8), w)
    with pytest.raises(TypeError, match=r"^fold: cols \(2, 36, 4\) is a torch\.Tensor on meta"):
        cc.fold(torch.empty(2, 36, 4, device="meta"), (3, 3), 2)


def test_torch_devices_without_a_path_raise():
    """Any device but cpu and cuda (mps, xpu, ...): the reason names the devices that compute.  A fake tensor
    stands in for one, which a CPU build of torch cannot make."""
    torch = pytest.importorskip("torch")
    from cupyconv._arrays import _torch_refusal

    class OnMps:
        device, layout = torch.device("mps"), torch.strided
    assert _torch_refusal(OnMps()) == "the plain cupyconv functions compute on cpu and cuda tensors only"
    assert _torch_refusal(torch.zeros(1)) is None


def test_torch_sparse_tensors_raise():
    torch = pytest.importorskip("torch")
    x = torch.randn(1, 2, 4, 4).to_sparse()
    with pytest.raises(TypeError, match=r"^unfold: x \(1, 2, 4, 4\) is a torch\.Tensor on cpu: its layout is "
                                        r"torch\.sparse_coo; cupyconv takes dense \(torch\.strided\) tensors only"):
        cc.unfold(x, 2)


# ---------------------------------------------------------------------------------------------------------
# Mixed kinds, mixed dtypes, unsupported dtypes


def test_mixed_numpy_and_torch_raise_naming_both():
    torch = pytest.importorskip("torch")
    x, w, b = numpy_inputs([(2, 4, 5, 5), (6, 2, 3, 3), (6,)], "float32")
    with pytest.raises(TypeError, match=r"^conv2d: x is a numpy\.ndarray but weight is a torch\.Tensor on cpu"):
        cc.conv2d(x, torch.from_numpy(w), groups=2)
    with pytest.raises(TypeError, match=r"^conv2d: x is a torch\.Tensor on cpu but bias is a numpy\.ndarray"):
        cc.conv2d(torch.from_numpy(x), torch.from_numpy(w), b, groups=2)
    with pytest.raises(TypeError, match=r"^depthwise_conv2d_backward: grad_output is a torch\.Tensor on cpu but "
                                        r"x is a numpy\.ndarray"):
        cc.depthwise_conv2d_backward(torch.zeros(2, 4, 3, 3), x, numpy.ones((4, 1, 3, 3), numpy.float32))


def test_mixed_dtypes_raise_naming_both():
    x, w = numpy_inputs([(2, 4, 5, 5), (6, 2, 3, 3)], "float32")
    with pytest.raises(TypeError, match=r"^conv2d: x has dtype float32 but weight has dtype float16"):
        cc.conv2d(x, w.astype(numpy.float16), groups=2)
    with pytest.raises(TypeError, match=r"^patch_conv2d_backward: grad_output has dtype float64 but x has dtype "
                                        r"float32"):
        cc.patch_conv2d_backward(numpy.zeros((2, 6, 3, 3)), x, w, groups=2)


def test_mixed_torch_dtypes_raise_naming_both():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 4, 5, 5, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"^conv2d: x has dtype bfloat16 but weight has dtype float16"):
        cc.conv2d(x, torch.randn(6, 2, 3, 3, dtype=torch.float16), groups=2)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "complex64", "complex128", "bool"])
def test_numpy_non_float_dtypes_raise(dtype):
    x = numpy.ones((1, 2, 4, 4), dtype)
    with pytest.raises(TypeError, match=rf"^unfold: x has dtype {dtype}; supported dtypes are float16, bfloat16"):
        cc.unfold(x, 2)
    with pytest.raises(TypeError, match=rf"^conv2d: x has dtype {dtype}; supported"):
        cc.conv2d(x, numpy.ones((1, 2, 3, 3), dtype))


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "complex64", "bool"])
def test_torch_non_float_dtypes_raise(dtype):
    torch = pytest.importorskip("torch")
    x = torch.ones((1, 2, 4, 4), dtype=getattr(torch, dtype))
    with pytest.raises(TypeError, match=rf"^fold_backward: .*dtype {dtype}; supported|^unfold: x has dtype {dtype}"):
        cc.fold_backward(x, 2)
    with pytest.raises(TypeError, match=rf"^depthwise_conv2d: x has dtype {dtype}; supported"):
        cc.depthwise_conv2d(x, torch.ones((2, 1, 3, 3), dtype=getattr(torch, dtype)))


def test_non_arrays_raise():
    with pytest.raises(TypeError, match=r"^conv2d: x must be a numpy\.ndarray, cupy\.ndarray or torch\.Tensor, "
                                        r"got a builtins\.list"):
        cc.conv2d([[[[1.0]]]], numpy.ones((1, 1, 1, 1)))
    with pytest.raises(TypeError, match=r"^fold: cols must be a numpy\.ndarray.*got a builtins\.tuple"):
        cc.fold((1.0, 2.0), (1, 2), 1)


# ---------------------------------------------------------------------------------------------------------
# CuPy (a CUDA GPU only)


@pytest.mark.gpu
@pytest.mark.parametrize("name, op, shapes", OPS, ids=OP_IDS)
def test_cupy_in_cupy_out(name, op, shapes):
    """A CuPy array goes to the GPU path: CuPy out with the CPU path's values."""
    cupy = pytest.importorskip("cupy")
    arrays = numpy_inputs(shapes, "float32")
    out = results(op(*(cupy.asarray(a) for a in arrays)))
    for got, want in zip(out, results(op(*arrays))):
        assert isinstance(got, cupy.ndarray) and got.dtype == numpy.float32, name
        ref.assert_close(cupy.asnumpy(got), want, "float32", err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("name, op, shapes", OPS, ids=OP_IDS)
def test_torch_cuda_negative_bit_is_resolved(name, op, shapes):
    """cupy.from_dlpack ignores the negative bit as numpy.from_dlpack does."""
    check_negative_bit_in_every_position(ref.cuda_torch(), op, numpy_inputs(shapes, "float64"), "cuda")


@pytest.mark.gpu
def test_cupy_mixed_with_numpy_raises_naming_both():
    cupy = pytest.importorskip("cupy")
    with pytest.raises(TypeError, match=r"^conv2d: x is a cupy\.ndarray on cuda:\d+ but weight is a "
                                        r"numpy\.ndarray"):
        cc.conv2d(cupy.ones((1, 2, 4, 4), cupy.float32), numpy.ones((1, 2, 3, 3), numpy.float32))
