"""The repeated-call fast path (cupyconv/_fastpath.py) through real CuPy arrays on the emulator (CupyHostDevice).

A repeat of a signature that succeeded skips `Call`, the spec parsing and the checks, and runs its recorded
program in the executor's scope.  Here: it is taken (no `Call` is built) and gives the CPU path's results on fresh
inputs; any changed argument, layout, dtype or setting goes the slow way first; bad input after a success still
raises the slow path's errors; the GPU scope is still entered (and can still refuse); NumPy arrays never take it.
"""
from __future__ import annotations

import numpy
import pytest

import cupyconv
import reference as ref
import test_cupy_arrays as tca
from cupyconv import _arrays, _device, _fastpath, _replay, settings
from emulator import CupyHostDevice


@pytest.fixture(scope="module")
def device():
    return CupyHostDevice()


@pytest.fixture
def slow_calls(monkeypatch):
    """[op of each `Call` built] from here on (a `Call` is the slow path), both caches emptied."""
    monkeypatch.setattr(_fastpath, "CACHE", {})
    monkeypatch.setattr(_replay, "CACHE", {})
    built: list = []
    init = _arrays.Call.__init__

    def counting_init(self, op, **arrays):
        built.append(op)
        init(self, op, **arrays)

    monkeypatch.setattr(_arrays.Call, "__init__", counting_init)
    return built


def run(device, fn, *arrays, **kwargs):
    """fn on the arrays as CuPy arrays of `device`; the results as NumPy copies."""
    with _device.use_device(device):
        result = fn(*[tca.to_device(device, a) for a in arrays], **kwargs)
    results = result if isinstance(result, tuple) else (result,)
    host = tuple(None if r is None else device.asnumpy(r) for r in results)
    return host if isinstance(result, tuple) else host[0]


def assert_same(got, want, dtype="float32"):
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if w is not None:
            ref.assert_close(g, w, dtype, "fast path")


def cases():
    """(name, fn, shapes of the array arguments, keyword arguments): one call of each kind of public entry point."""
    return [
        ("conv2d", cupyconv.conv2d, [(2, 4, 7, 6), (6, 2, 3, 3), (6,)], dict(padding=1, groups=2)),
        ("conv2d_backward", cupyconv.conv2d_backward, [(2, 6, 7, 6), (2, 4, 7, 6), (6, 2, 3, 3)],
         dict(padding=1, groups=2)),
        ("conv1d", cupyconv.conv1d, [(2, 4, 9), (4, 2, 3), (4,)], dict(stride=2, groups=2)),
        ("conv3d", cupyconv.conv3d, [(2, 2, 4, 3, 5), (3, 2, 2, 2, 2), None], dict(padding=1)),
        ("depthwise_conv2d", cupyconv.depthwise_conv2d, [(2, 3, 7, 5), (6, 1, 3, 3), (6,)], dict(stride=2)),
        ("depthwise_conv2d_backward", cupyconv.depthwise_conv2d_backward, [(2, 6, 7, 5), (2, 3, 7, 5),
                                                                           (6, 1, 3, 3)], dict(padding=1)),
        ("patch_conv2d", cupyconv.patch_conv2d, [(2, 3, 3, 5, 4), (4, 3, 3, 3), (4,)],
         dict(padding=1, algorithm="fused")),
        ("unfold", cupyconv.unfold, [(2, 3, 7, 6)], dict(kernel_size=3, padding=1, stride=2)),
        ("fold", cupyconv.fold, [(2, 27, 12)], dict(output_size=(7, 6), kernel_size=3, padding=1, stride=2)),
        # conv_transpose: x's zero extension (output_padding >= stride), the strided input gradient's phases and
        # the bias, all in the one program of `lift.one_program`
        ("conv_transpose2d", cupyconv.conv_transpose2d, [(2, 4, 4, 3), (4, 3, 3, 2), (3,)],
         dict(stride=(2, 3), padding=1, output_padding=(2, 0), dilation=(3, 1))),
        ("conv_transpose1d", cupyconv.conv_transpose1d, [(2, 4, 5), (4, 1, 3), (2,)], dict(stride=3, groups=2)),
        ("conv_transpose3d", cupyconv.conv_transpose3d, [(1, 2, 3, 2, 3), (2, 3, 2, 1, 2), (3,)],
         dict(stride=(1, 2, 2), output_padding=(0, 1, 0))),
        ("conv_transpose2d_backward", cupyconv.conv_transpose2d_backward, [(2, 3, 13, 6), (2, 4, 4, 3),
                                                                           (4, 3, 3, 2)],
         dict(stride=(2, 3), padding=1, output_padding=(2, 0), dilation=(3, 1))),
    ]


@pytest.mark.parametrize("name, fn, shapes, kwargs", cases(), ids=[c[0] for c in cases()])
def test_a_repeat_takes_the_fast_path_and_equals_the_cpu_path(device, slow_calls, name, fn, shapes, kwargs):
    for seed in (1, 2, 3):   # fresh values each time: a repeat that read the first call's buffers would show
        arrays = tca.inputs(seed, *shapes)
        assert_same(run(device, fn, *arrays, **kwargs), fn(*arrays, **kwargs))
    gpu_calls = [op for op in slow_calls if op == name]
    cpu_calls = 3
    assert len(gpu_calls) == 1 + cpu_calls, slow_calls   # the first GPU call only (and each CPU path call)
    assert len(_fastpath.CACHE) == 1


def test_a_changed_argument_never_hits_a_stale_entry(device, slow_calls):
    """Each variant differs from the remembered call in one thing: its first call is slow and right; its repeat is
    fast and right."""
    x, w, b = tca.inputs(4, (2, 4, 7, 6), (6, 2, 3, 3), (6,))
    base = dict(padding=1, groups=2)
    w1 = tca.inputs(5, (6, 4, 3, 3))[0]
    variants = [
        ("base", (x, w, b), base, None),
        ("shape", (x[:, :, :5], w, b), base, None),
        ("bias", (x, w, None), base, None),
        ("padding", (x, w, b), dict(base, padding=2), None),
        ("padding pair", (x, w, b), dict(base, padding=(1, 2)), None),
        ("stride", (x, w, b), dict(base, stride=2), None),
        ("dilation", (x, w, b), dict(base, dilation=2), None),
        ("groups", (x, w1, b), dict(base, groups=1), None),
        ("algorithm", (x, w, b), dict(base, algorithm="im2col_gemm"), None),
        ("workspace_limit", (x, w, b), dict(base, workspace_limit=800, algorithm="im2col_gemm"), None),
        ("dtype", tuple(a.astype(numpy.float64) for a in (x, w, b)), base, None),
        ("setting", (x, w, b), dict(base, algorithm="im2col_gemm"), 800),
    ]
    for label, arrays, kwargs, limit in variants:
        for repeat in range(2):
            before = len(slow_calls)
            with settings.workspace_limit(limit or settings.DEFAULT_WORKSPACE_LIMIT):
                got = run(device, cupyconv.conv2d, *arrays, **kwargs)
            want = cupyconv.conv2d(*arrays, **kwargs)
            assert_same(got, want, str(arrays[0].dtype))
            gpu_slow = len(slow_calls) - before - 1   # less the CPU path's call
            assert gpu_slow == (1 if repeat == 0 else 0), f"{label}, call {repeat + 1}: {gpu_slow} slow GPU calls"


def test_layout_and_alignment_are_part_of_the_signature(device, slow_calls):
    x, w = tca.inputs(6, (2, 4, 7, 6), (6, 4, 3, 3))
    xs = device.asarray(numpy.ascontiguousarray(x.swapaxes(-1, -2))).swapaxes(-1, -2)   # the same values, strided
    offset = device.asarray(numpy.concatenate([[0], x.ravel()]).astype(x.dtype))[1:].reshape(x.shape)
    want = cupyconv.conv2d(x, w, padding=1)
    built = len(slow_calls)
    with _device.use_device(device):
        for a in (device.asarray(x), xs, offset):
            for _ in range(2):
                assert_same(device.asnumpy(cupyconv.conv2d(a, device.asarray(w), padding=1)), want)
    assert len(slow_calls) - built == 3


def test_bad_input_after_a_success_gets_the_slow_paths_errors(device, slow_calls):
    x, w, b = tca.inputs(7, (2, 4, 7, 6), (6, 2, 3, 3), (6,))
    arrays = [device.asarray(a) for a in (x, w, b)]
    with _device.use_device(device):
        for _ in range(2):
            cupyconv.conv2d(*arrays, padding=1, groups=2)
        for _ in range(2):   # errors are never remembered
            with pytest.raises(ValueError, match=r"^conv2d: weight \(6, 2, 3, 3\) has 2 input channels per "
                                                 r"group but x \(2, 4, 7, 6\) has 4 channels with groups=1"):
                cupyconv.conv2d(*arrays, padding=1, groups=1)
            with pytest.raises(TypeError, match="^conv2d: groups"):
                cupyconv.conv2d(*arrays, padding=1, groups=2.0)
            with pytest.raises(TypeError, match="^conv2d: x has dtype float32 but bias has dtype float64"):
                cupyconv.conv2d(*arrays[:2], device.asarray(b.astype(numpy.float64)), padding=1, groups=2)
            with pytest.raises(ValueError, match="^conv2d: algorithm"):
                cupyconv.conv2d(*arrays, padding=1, groups=2, algorithm="fastest")
            with pytest.raises(TypeError, match="^conv2d: x is a numpy.ndarray but weight is a cupy.ndarray"):
                cupyconv.conv2d(x, *arrays[1:], padding=1, groups=2)
    assert len(_fastpath.CACHE) == 1


def test_the_fast_path_enters_the_gpu_scope_which_can_still_refuse(device, slow_calls, monkeypatch):
    x, w = (device.asarray(a) for a in tca.inputs(8, (1, 2, 5, 5), (3, 2, 3, 3)))
    device.scopes.clear()
    with _device.use_device(device):
        for _ in range(3):
            cupyconv.conv2d(x, w)
        assert slow_calls == ["conv2d"]
        assert device.scopes == [("conv2d", 0)] * 3

        def refusing(op, device_id):
            raise RuntimeError(f"{op}: the current stream is capturing a CUDA graph")

        monkeypatch.setattr(device, "scope", refusing)
        with pytest.raises(RuntimeError, match="^conv2d: the current stream is capturing"):
            cupyconv.conv2d(x, w)
    assert slow_calls == ["conv2d"]   # refused on the fast path itself


def test_numpy_arrays_and_replay_off_take_the_slow_path(device, slow_calls, monkeypatch):
    x, w = tca.inputs(9, (1, 2, 5, 5), (3, 2, 3, 3))
    for _ in range(2):
        cupyconv.conv2d(x, w)   # the CPU path
    assert slow_calls == ["conv2d"] * 2 and not _fastpath.CACHE
    arrays = [device.asarray(a) for a in (x, w)]
    with _device.use_device(device):
        cupyconv.conv2d(*arrays)
        cupyconv.conv2d(*arrays)
        assert slow_calls == ["conv2d"] * 3
        monkeypatch.setenv("CUPYCONV_REPLAY", "0")
        assert_same(device.asnumpy(cupyconv.conv2d(*arrays)), cupyconv.conv2d(x, w))
    assert slow_calls == ["conv2d"] * 5


def test_a_call_whose_work_is_not_one_replay_is_not_remembered(device, slow_calls):
    """An entry point that adds a bias after its replayed pass: repeating the pass alone would drop it."""
    from cupyconv._spec import ConvSpec
    from cupyconv.ops import lift
    from cupyconv.ops.conv import conv2d_run

    @_arrays.on_arrays_device
    def outer(x, weight, bias):
        call = _arrays.Call("outer", x=x, weight=weight, bias=bias)
        spec = ConvSpec.for_conv("outer", call.x, call.weight, None, 1, 0, 1, 1, nd=2)
        y = lift.forward(conv2d_run, call.device, call.x, call.weight, None, spec, "auto")
        out = call.device.empty(y.shape, y.dtype)
        call.device.copyto(out, y)
        call.device.add(out, call.bias.reshape(-1, 1, 1))
        return out

    x, w, b = tca.inputs(10, (2, 4, 4, 3), (3, 4, 3, 3), (3,))
    arrays = [device.asarray(a) for a in (x, w, b)]
    with _device.use_device(device):
        for _ in range(2):
            assert_same(device.asnumpy(outer(*arrays)), cupyconv.conv2d(x, w, b))
    assert slow_calls.count("outer") == 2 and not _fastpath.CACHE


def test_an_emptied_replay_cache_is_a_miss(device, slow_calls, monkeypatch):
    x, w = tca.inputs(11, (1, 2, 5, 5), (3, 2, 3, 3))
    want = cupyconv.conv2d(x, w)
    arrays = [device.asarray(a) for a in (x, w)]
    with _device.use_device(device):
        for _ in range(2):
            assert_same(device.asnumpy(cupyconv.conv2d(*arrays)), want)
        monkeypatch.setattr(_replay, "CACHE", {})
        for _ in range(2):
            assert_same(device.asnumpy(cupyconv.conv2d(*arrays)), want)
    assert slow_calls == ["conv2d"] * 3   # (the CPU path's, then one slow GPU call per replay cache)


def test_a_call_that_makes_another_public_call_is_not_remembered(device, slow_calls):
    """An entry point whose slow path calls another public function besides its one replayed pass: a repeat of the
    pass alone would skip the inner call."""
    from cupyconv._spec import ConvSpec
    from cupyconv.ops import lift
    from cupyconv.ops.conv import conv2d_run
    inner: list = []

    @_arrays.on_arrays_device
    def outer(x, weight):
        call = _arrays.Call("outer", x=x, weight=weight)
        inner.append(cupyconv.unfold(call.x, 3))
        spec = ConvSpec.for_conv("outer", call.x, call.weight, None, 1, 0, 1, 1, nd=2)
        return lift.forward(conv2d_run, call.device, call.x, call.weight, None, spec, "auto")

    x, w = tca.inputs(12, (1, 2, 5, 5), (3, 2, 3, 3))
    arrays = [device.asarray(a) for a in (x, w)]
    with _device.use_device(device):
        for _ in range(2):
            assert_same(device.asnumpy(outer(*arrays)), cupyconv.conv2d(x, w))
    assert len(inner) == 2 and slow_calls.count("outer") == 2


# ---------------------------------------------------------------------------------------------------------
# torch CUDA tensors: cupyconv.torch's custom ops call the plain functions on them, once per op and call


@pytest.fixture
def torch_on_device(device, monkeypatch):
    """torch CPU tensors taken down the CUDA branch onto `device` (CupyHostDevice) by fakes at the device seams (as
    benchmarks.host_overhead --torch, but with real values): DLPack in copies a tensor into the device's memory,
    DLPack out copies an array back into a tensor; everything else is the real code."""
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    import contextlib as _contextlib
    from cupyconv.torch import cpu, cuda
    real_device_of = _arrays._device_of
    monkeypatch.setattr(cpu, "runs_on_torch", lambda x, weight: False)
    monkeypatch.setattr(_arrays, "_device_of", lambda a, kind=None: "cuda:0" if (kind or _arrays._kind(a)) == "torch"
                        else real_device_of(a, kind))
    monkeypatch.setattr(cuda, "DEVICE_TYPE", "cpu")
    monkeypatch.setattr(cuda, "_raw_stream", lambda index: 0x5EED)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cupy.cuda, "Device", lambda index: _contextlib.nullcontext())
    monkeypatch.setattr(cuda, "_cupy_stream", lambda cupy, stream: _contextlib.nullcontext())
    monkeypatch.setattr(cuda, "_PER_STREAM", {})
    monkeypatch.setattr(cupy, "from_dlpack", lambda t: device.asarray(t.numpy()))
    real_from_dlpack = torch.from_dlpack
    monkeypatch.setattr(torch, "from_dlpack", lambda a: torch.from_numpy(device.asnumpy(a))
                        if isinstance(a, cupy.ndarray) else real_from_dlpack(a))
    with _device.use_device(device):
        yield torch


def _aligned(torch, t):
    """A copy of tensor t in memory aligned to 256 bytes, as a GPU allocator gives it (an address's alignment is part
    of the signature; torch's CPU allocator aligns to 64 bytes only)."""
    nbytes = t.numel() * t.element_size()
    buffer = torch.empty(nbytes + 256, dtype=torch.uint8)
    start = -buffer.data_ptr() % 256
    out = buffer[start:start + nbytes].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


def _torch_conv_step(torch, x, w, b, **kwargs):
    """cupyconv.torch.conv2d forward and backward (autograd), and torch's own on the same values (the reference)."""
    import cupyconv.torch as cct
    import torch.nn.functional as F
    leaves = [_aligned(torch, t).requires_grad_(True) for t in (x, w, b)]
    y = cct.conv2d(*leaves, **kwargs)
    gy = _aligned(torch, torch.from_numpy(numpy.random.default_rng(int(x.sum() * 1000) % 997)
                                          .standard_normal(y.shape)).to(y.dtype))
    got = (y.detach(), *torch.autograd.grad(y, leaves, gy))
    refs = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]
    yr = F.conv2d(*refs, **kwargs)
    return got, (yr.detach(), *torch.autograd.grad(yr, refs, gy))


def _assert_torch_close(got, want):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        ref.assert_close(g.numpy(), w.numpy(), str(w.dtype).replace("torch.", ""), "torch fast path")


def test_torch_tensors_repeat_on_the_fast_path_and_equal_torchs_own(torch_on_device, slow_calls):
    """cupyconv.torch.conv2d forward + backward on 'CUDA' tensors: the first step builds a Call for each op, the repeats
    (fresh values each time) none, and every step equals torch's own convolution and its gradients."""
    torch = torch_on_device
    for seed in (1, 2, 3):
        x, w, b = (torch.from_numpy(a) for a in tca.inputs(seed, (2, 4, 7, 6), (6, 2, 3, 3), (6,)))
        _assert_torch_close(*_torch_conv_step(torch, x, w, b, padding=1, groups=2))
    assert slow_calls == ["conv2d", "conv2d_backward"], slow_calls
    assert len(_fastpath.CACHE) == 2 and all(e.bridge is not None for e in _fastpath.CACHE.values())


def test_torch_tensors_never_hit_a_stale_entry(torch_on_device, slow_calls):
    """Each variant differs from the remembered call in one tensor fact or option: its first call is slow and right,
    its repeat fast and right."""
    torch = torch_on_device
    import cupyconv.torch as cct
    x, w, b = (torch.from_numpy(a) for a in tca.inputs(4, (2, 4, 7, 6), (6, 2, 3, 3), (6,)))
    x, w, b = (_aligned(torch, t) for t in (x, w, b))
    wide = _aligned(torch, torch.from_numpy(tca.inputs(5, (2, 4, 7, 9))[0]))
    variants = [
        ("base", (x, w, b), dict(padding=1, groups=2)),
        ("shape", (_aligned(torch, x[:, :, :5]), w, b), dict(padding=1, groups=2)),
        ("stride", (wide[..., :6], w, b), dict(padding=1, groups=2)),
        ("channels-last", (_aligned(torch, x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2), w, b),
         dict(padding=1, groups=2)),
        ("dtype", tuple(_aligned(torch, t.double()) for t in (x, w, b)), dict(padding=1, groups=2)),
        ("padding", (x, w, b), dict(padding=2, groups=2)),
        ("stride option", (x, w, b), dict(padding=1, groups=2, stride=2)),
        ("no bias", (x, w, None), dict(padding=1, groups=2)),
    ]
    for label, (xv, wv, bv), kwargs in variants:
        for repeat in range(2):
            before = len(slow_calls)
            with torch.no_grad():
                got = cct.conv2d(xv, wv, bv, **kwargs)
            want = torch.nn.functional.conv2d(xv, wv, bv, **kwargs)
            _assert_torch_close((got,), (want,))
            assert len(slow_calls) - before == (1 if repeat == 0 else 0), f"{label}, call {repeat + 1}"
    # requires_grad is part of the signature: the same tensors requiring grad (grad mode off) are a new signature
    before = len(slow_calls)
    with torch.no_grad():
        cct.conv2d(x.requires_grad_(True), w, b, padding=1, groups=2)
    assert len(slow_calls) - before == 1


def test_torch_tensors_requiring_grad_still_get_the_plain_functions_refusal(torch_on_device, slow_calls):
    """After a success under no_grad, the plain function on tensors that require grad with grad mode on is refused
    by the slow path every time (never answered from the entry)."""
    torch = torch_on_device
    x, w = (torch.from_numpy(a) for a in tca.inputs(6, (1, 2, 5, 5), (3, 2, 3, 3)))
    w.requires_grad_(True)
    with torch.no_grad():
        for _ in range(2):
            cupyconv.conv2d(x, w)
    assert slow_calls == ["conv2d"]
    for _ in range(2):
        with pytest.raises(TypeError, match="^conv2d: weight requires grad, but the plain cupyconv functions"):
            cupyconv.conv2d(x, w)
    assert slow_calls == ["conv2d"] * 3


def test_a_tensors_device_is_part_of_the_signature():
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    _fastpath.use_torch(torch)
    keys = {_fastpath.signature(cupyconv.conv2d, (torch.empty(2, 3, 4, 4, device=device),), {})
            for device in ("cpu", "meta")}
    assert len(keys) == 2 and None not in keys
    assert _fastpath.signature(cupyconv.conv2d, (torch.empty(2, 3).as_subclass(type("Sub", (torch.Tensor,), {})),),
                               {}) is None   # a subclass may compute otherwise: the slow path


def test_eager_calls_give_the_custom_ops_results_and_gradients_of_any_order(torch_on_device, monkeypatch):
    """On (faked) CUDA tensors cupyconv.torch skips torch's dispatcher (`_custom_ops.call`: the op's implementation,
    in an autograd.Function with the op's formula when a gradient is needed).  The same step through the custom ops
    (the eager path turned off) gives the same forward, gradients and double-backward gradients, on fresh inputs; and
    the eager path did run (its Function is the output's grad_fn)."""
    torch = torch_on_device
    import cupyconv.torch as cct
    from cupyconv.torch import _custom_ops

    def step(seed):
        x, w, b = (_aligned(torch, torch.from_numpy(a)).requires_grad_(True)
                   for a in tca.inputs(seed, (2, 4, 7, 6), (6, 2, 3, 3), (6,)))
        y = cct.conv2d(x, w, b, padding=1, groups=2)
        gy = _aligned(torch, torch.from_numpy(tca.inputs(seed + 100, tuple(y.shape))[0]))
        gx, gw, gb = torch.autograd.grad(y, (x, w, b), gy, create_graph=True)
        second = torch.autograd.grad((gx * gx).sum() + (gw * gw).sum(), (x, w))
        return type(y.grad_fn).__name__, [t.detach() for t in (y, gx, gw, gb, *second)]

    for seed in (1, 2):
        name, eager = step(seed)
        assert name.startswith("Eager_conv2d"), name
        with monkeypatch.context() as m:
            m.setattr(_custom_ops, "_plain_eager", lambda tensors: False)
            name, dispatched = step(seed)
            assert not name.startswith("Eager"), name
        _assert_torch_close(eager, dispatched)


def test_eager_unfold_and_fold_match_torch(torch_on_device):
    torch = torch_on_device
    import cupyconv.torch as cct
    import torch.nn.functional as F
    x = _aligned(torch, torch.from_numpy(tca.inputs(3, (2, 3, 7, 6))[0])).requires_grad_(True)
    for _ in range(2):
        cols = cct.unfold(x, 3, padding=1, stride=2)
        assert type(cols.grad_fn).__name__.startswith("Eager_unfold")
        out = cct.fold(cols, (7, 6), 3, padding=1, stride=2)
        (g,) = torch.autograd.grad(out, x, torch.ones_like(out))
        xr = x.detach().clone().requires_grad_(True)
        ref_out = F.fold(F.unfold(xr, 3, padding=1, stride=2), (7, 6), 3, padding=1, stride=2)
        (gr,) = torch.autograd.grad(ref_out, xr, torch.ones_like(ref_out))
        _assert_torch_close((cols.detach(), out.detach(), g), (F.unfold(xr, 3, padding=1, stride=2).detach(),
                                                              ref_out.detach(), gr))


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast path", "replay only"])
def test_every_training_step_saves_the_forwards_copy_of_x(torch_on_device, slow_calls, monkeypatch, fast_path):
    """cupyconv.torch.conv2d, float16, implicit_gemm, x not requiring grad and the weight requiring it: autograd saves
    the forward's channels-last copy of x in place of x (`_custom_ops.saved_x`) on every step, not only the first,
    each step's own copy (x's values: a replay offers the slot its program copied x into), and the weight gradient
    read from it is torch's."""
    torch = torch_on_device
    import cupyconv.torch as cct
    if not fast_path:
        monkeypatch.setattr(_fastpath, "lookup", lambda key, args, kwargs: _fastpath.MISS)
    saved = []
    for seed in (1, 2, 3):
        x, w = (_aligned(torch, torch.from_numpy(a))
                for a in tca.inputs(seed, (2, 24, 9, 11), (40, 24, 3, 3), dtype="float16"))
        with settings.allow_tf32(True):
            y = cct.conv2d(x, w.requires_grad_(True), algorithm="implicit_gemm", padding=1)
        copy = y.grad_fn.saved_tensors[0]
        saved.append(copy.data_ptr() != x.data_ptr())
        assert torch.equal(copy, x)
        gy = torch.from_numpy(tca.inputs(seed + 10, tuple(y.shape), dtype="float16")[0])
        y.backward(gy)
        expected = torch.nn.grad.conv2d_weight(x.double(), w.shape, gy.double(), padding=1)
        numpy.testing.assert_allclose(w.grad.double().numpy(), expected.numpy(), rtol=2e-2, atol=2e-2)
    assert saved == [True, True, True]
