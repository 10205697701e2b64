"""cupyconv.torch: custom ops, autograd, torch.compile, autocast, and (GPU) streams and memory.

CPU tests run everywhere: gradcheck in float64 for the 2-D ops and unfold/fold, torch.library.opcheck of every
custom op, one torch.compile(fullgraph=True) forward + backward with inductor (marked slow: a few seconds),
autocast bfloat16 and float16.  The GPU tests (marked gpu) check stream ordering and memory accounting on a real
device.  Every convolution to the second order: test_torch_convolutions.py; the modules: test_torch_modules.py.
"""
import gc
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import cupyconv  # noqa: E402
import cupyconv.torch as cct  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_path")    # every test on both CPU paths (conftest.py)
import reference as ref  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
F64 = dict(dtype=torch.float64)


def _rand(*shape, dtype=torch.float64, requires_grad=True, seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    return torch.randn(*shape, dtype=dtype).requires_grad_(requires_grad)


# ---------------------------------------------------------------------------------------------------------
# Problems as data: (name, shapes, arguments)

CONV_CASES = [
    ref.ConvCase("groups2_per_side", (2, 4, 6, 5), (6, 2, 3, 2), stride=(1, 2), padding=((1, 0), (2, 1)),
                 dilation=(1, 2), groups=2),
    ref.ConvCase("same_stride2_no_bias", (1, 3, 7, 6), (4, 3, 3, 3), stride=2, padding="same", bias=False),
    ref.ConvCase("groups_C_valid", (2, 3, 5, 5), (6, 1, 2, 3), padding="valid", groups=3),
]
DEPTHWISE_CASES = [
    ref.ConvCase("multiplier2_same_stride2", (2, 3, 7, 6), (6, 1, 3, 3), stride=2, padding="same"),
    ref.ConvCase("per_side_dilation2_no_bias", (1, 4, 6, 7), (4, 1, 3, 2), padding=((2, 0), (1, 1)), dilation=2,
                 bias=False),
]
PATCH_CASES = [
    ref.ConvCase("patches_b2p3", (2, 3, 4, 4, 4), (5, 4, 3, 3), padding=1),
    ref.ConvCase("groups2_unbatched", (4, 5, 4), (6, 2, 2, 3), padding=((0, 1), (1, 1)), groups=2, bias=False),
]
UNFOLD_CASES = [  # (name, x shape, kernel_size, dilation, padding, stride)
    ("per_side_stride", (2, 3, 6, 5), (2, 3), 1, ((1, 0), (0, 1)), (1, 2)),
    ("leading_dims_dilation", (2, 1, 2, 5, 6), 2, 2, 1, 1),
]


def _conv_args(case):
    torch.manual_seed(0)
    x, w = _rand(*case.x), _rand(*case.weight)
    b = _rand(case.weight[0]) if case.bias else None
    return x, w, b


def _window(case):
    return (case.stride, case.padding, case.dilation)


# ---------------------------------------------------------------------------------------------------------
# gradcheck (float64, CPU) and agreement with torch for every op


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv2d_gradcheck_and_torch(case):
    x, w, b = _conv_args(case)
    inputs = (x, w) if b is None else (x, w, b)
    fn = lambda x, w, b=None: cct.conv2d(x, w, b, *_window(case), case.groups)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)
    torch.testing.assert_close(fn(*inputs), ref.torch_conv2d(x, w, b, *_window(case), case.groups))


def test_conv2d_gradcheck_full_jacobian():
    """One small case with the full (slow-mode) Jacobian, not only random projections of it."""
    x, w, b = _rand(1, 2, 4, 3, seed=1), _rand(2, 1, 2, 2), _rand(2)
    assert torch.autograd.gradcheck(lambda x, w, b: cct.conv2d(x, w, b, 1, ((1, 0), (0, 1)), 1, 2), (x, w, b))


@pytest.mark.parametrize("case", DEPTHWISE_CASES, ids=str)
def test_depthwise_gradcheck_and_torch(case):
    x, w, b = _conv_args(case)
    inputs = (x, w) if b is None else (x, w, b)
    fn = lambda x, w, b=None: cct.depthwise_conv2d(x, w, b, *_window(case))  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)
    torch.testing.assert_close(fn(*inputs), ref.torch_conv2d(x, w, b, *_window(case), groups=case.x[1]))


@pytest.mark.parametrize("case", PATCH_CASES, ids=str)
def test_patch_gradcheck_and_torch(case):
    x, w, b = _conv_args(case)
    inputs = (x, w) if b is None else (x, w, b)
    fn = lambda x, w, b=None: cct.patch_conv2d(x, w, b, *_window(case), case.groups)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)
    torch.testing.assert_close(fn(*inputs), ref.torch_conv2d(x, w, b, *_window(case), case.groups))


@pytest.mark.parametrize("case", UNFOLD_CASES, ids=lambda c: c[0])
def test_unfold_fold_gradcheck_gradgradcheck_and_torch(case):
    _, shape, kernel, dilation, padding, stride = case
    x = _rand(*shape, seed=2)
    unfold = lambda x: cct.unfold(x, kernel, dilation, padding, stride)  # noqa: E731
    cols = unfold(x).detach().requires_grad_()
    fold = lambda c: cct.fold(c, shape[-2:], kernel, dilation, padding, stride)  # noqa: E731
    for fn, arg in ((unfold, x), (fold, cols)):
        assert torch.autograd.gradcheck(fn, (arg,), fast_mode=True)
        assert torch.autograd.gradgradcheck(fn, (arg,), fast_mode=True)
    torch.testing.assert_close(unfold(x), ref.torch_unfold(x, kernel, dilation, padding, stride))
    torch.testing.assert_close(fold(cols), ref.torch_fold(cols, shape[-2:], kernel, dilation, padding, stride))


def test_functions_apply_matches_functional():
    """The autograd.Function classes are usable directly and give the functional wrappers' gradients."""
    x, w, b = _rand(2, 4, 5, 5, seed=3), _rand(4, 2, 3, 3), _rand(4)
    args = ([1, 1], [1, 0, 0, 1], [1, 1], 2)
    y = cct.Conv2dFunction.apply(x, w, b, *args)
    grads = torch.autograd.grad(y.square().sum(), (x, w, b))
    expected = torch.autograd.grad(cct.conv2d(x, w, b, 1, ((1, 0), (0, 1)), 1, 2).square().sum(), (x, w, b))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)
    cols = cct.UnfoldFunction.apply(x, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1])
    torch.testing.assert_close(cct.FoldFunction.apply(cols, [5, 5], [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
                               F.fold(F.unfold(x, 3, padding=1), (5, 5), 3, padding=1))


@pytest.mark.numpy_cpu_path     # watches the plain cupyconv functions, which the torch CPU path does not call
@pytest.mark.parametrize("op", ["conv2d", "depthwise_conv2d", "patch_conv2d"])
def test_backward_computes_only_what_autograd_needs(op, monkeypatch):
    """ctx.needs_input_grad reaches the manual backward as `needs`."""
    seen = []
    name = f"{op}_backward"
    original = getattr(cupyconv, name)

    def spy(*args, needs, **kwargs):
        seen.append(tuple(needs))
        return original(*args, needs=needs, **kwargs)

    monkeypatch.setattr(cupyconv, name, spy)
    fn = getattr(cct, op)
    x, w, b = _rand(2, 3, 5, 5, seed=4), _rand(3, 1, 3, 3), _rand(3)
    if op != "depthwise_conv2d":
        w = _rand(3, 3, 3, 3)
    x.requires_grad_(False)
    fn(x, w, b, padding=1).sum().backward()
    fn(x, w.detach(), b, padding=1).sum().backward()
    x.requires_grad_(True)
    fn(x, w.detach(), None, padding=1).sum().backward()
    assert seen == [("weight", "bias"), ("bias",), ("input",)]


# ---------------------------------------------------------------------------------------------------------
# The custom ops themselves: schema, fake implementations, autograd registration (torch.library.opcheck)


def _opcheck_cases():
    """(op name, arguments) for every custom op; backward ops get a grad_output of their forward's shape."""
    torch.manual_seed(5)
    x, w, b = torch.randn(2, 4, 6, 5), torch.randn(6, 2, 3, 2), torch.randn(6)
    xd, wd = x[:, :3], torch.randn(6, 1, 3, 3)                          # xd: a non-contiguous view
    xp, wp = torch.randn(2, 3, 4, 4, 4), torch.randn(5, 4, 3, 3)
    x1, w1, b1 = torch.randn(2, 4, 7), torch.randn(6, 2, 3), torch.randn(6)
    x3, w3 = torch.randn(1, 2, 4, 5, 4), torch.randn(3, 2, 2, 3, 2)
    pad, ops = [1, 0, 2, 1], torch.ops.cupyconv
    window = ([2, 3], [1, 1], pad, [1, 2])
    cols = ops.unfold(x, *window)

    def like(t):
        return torch.randn(t.shape)

    convolutions = [  # (op, forward arguments (trailing defaults may be left out), needs of its backward case)
        ("conv1d", (x1, w1, b1, [2], [1, 0], [2], 2, "auto", None), [True, True, True]),
        ("conv2d", (x, w, b, [1, 2], pad, [1, 2], 2, "direct", 2**20), [True, True, False]),
        # a channels-last x: the fake output is channels-last, as the op's
        ("conv2d", (x.contiguous(memory_format=torch.channels_last), w, b, [1, 1], pad, [1, 1], 2),
         [True, True, True]),
        ("conv3d", (x3, w3, None, [1, 2, 1], [1, 0, 0, 1, 1, 1], [2, 1, 1], 1), [True, False, False]),
        ("depthwise_conv2d", (xd, wd, None, [2, 1], pad, [1, 1]), [False, True, True]),
        ("patch_conv2d", (xp, wp, None, [1, 1], [1, 1, 1, 1], [1, 1], 1, "fused"), [True, False, True]),
        ("conv_transpose1d", (x1, torch.randn(4, 3, 3), None, [2], [1, 0], [1], 2, [1]), [True, True, False]),
        ("conv_transpose2d", (x, torch.randn(4, 3, 3, 2), b[:3], [2, 1], pad, [1, 0], 1, [1, 2], "im2col_gemm",
                              2**20), [False, True, True]),
        ("conv_transpose3d", (x3, w3[:2], None, [1, 2, 1], [0, 1, 1, 0, 1, 1], [0, 1, 0], 1, [1, 1, 2]),
         [True, False, False]),
    ]
    cases = []
    for name, args, needs in convolutions:
        cases += [(name, args),
                  (f"{name}_backward", (like(getattr(ops, name)(*args)), *args[:2], needs, *args[3:]))]
    return cases + [
        ("unfold", (x, *window)),
        ("unfold_backward", (like(cols), [6, 5], *window)),
        ("fold", (like(cols), [6, 5], *window)),
        ("fold_backward", (x, *window)),
    ]


OPCHECK_CASES = _opcheck_cases()


@pytest.mark.parametrize("name,args", OPCHECK_CASES, ids=[name for name, _ in OPCHECK_CASES])
def test_opcheck(name, args):
    """Schema, fake implementation (shapes, strides, no aliasing), autograd registration and tracing with AOT
    autograd and dynamic shapes of each op, with inputs that require grad (so the backward ops' own autograd
    formulas, the double backward, are traced too)."""
    args = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args)
    torch.library.opcheck(getattr(torch.ops.cupyconv, name).default, args)


# ---------------------------------------------------------------------------------------------------------
# Autocast


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_cpu(dtype):
    """Convolutions run in the autocast dtype (gradients reach the float32 leaves in float32); unfold keeps
    its input dtype; float64 inputs are not cast."""
    torch.manual_seed(8)
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    conv = cct.Conv2d(4, 4, 3, padding=1)
    depthwise = cct.DepthwiseConv2d(4, 8, 3, padding=1)
    patch = cct.PatchConv2d(8, 2, 3, padding=1)
    with torch.autocast("cpu", dtype=dtype):
        h = depthwise(conv(x))
        y = patch(h[:, None])                                       # (N, 1, 2, 6, 6): one patch each
        cols = cct.unfold(x, 2)
        y64 = cct.conv2d(x.double(), conv.weight.double())
    assert (h.dtype, y.dtype, cols.dtype, y64.dtype) == (dtype, dtype, torch.float32, torch.float64)
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and conv.weight.grad.dtype == torch.float32
    expected = patch(depthwise(conv(x))[:, None])
    torch.testing.assert_close(y.float(), expected, rtol=5e-2, atol=5e-2)


# ---------------------------------------------------------------------------------------------------------
# torch.compile (slow: one compile, ~10 s on 2 cores; it covers every op, forward and backward)


class _EveryOp(nn.Module):
    """Only cupyconv ops and views: inductor then generates no C++ of its own, which keeps a cold compile to
    seconds (one elementwise op in the graph costs ~30 s of g++ on 2 cores)."""

    def __init__(self):
        super().__init__()
        self.conv = cct.Conv2d(3, 4, 3, padding=((1, 0), (1, 1)))
        self.separable = cct.DepthwiseSeparableConv2d(4, 6, 3, stride=2, padding="same")
        self.patch = cct.PatchConv2d(6, 4, 3, padding=1)

    def forward(self, x):
        h = self.separable(self.conv(x))                             # (N, 6, 4, 4)
        p = self.patch(h.reshape(h.shape[0], 1, 6, 4, 4))            # one patch per sample
        cols = cct.unfold(p.flatten(0, 1), 2, padding=1)
        return cct.fold(cols, (4, 4), 2, padding=1)


@pytest.mark.slow
def test_torch_compile_fullgraph_forward_and_backward():
    torch._dynamo.reset()
    torch.manual_seed(9)
    model = _EveryOp()
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    leaves = [x, *model.parameters()]
    y = model(x)
    g = torch.randn_like(y)
    expected = torch.autograd.grad(y, leaves, g)
    compiled = torch.compile(model, fullgraph=True)                  # raises on any graph break
    y_compiled = compiled(x)
    grads = torch.autograd.grad(y_compiled, leaves, g)
    torch.testing.assert_close(y_compiled, y)
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------------------------------------------
# Packaging: torch stays optional


def test_import_cupyconv_does_not_import_torch():
    code = "import sys, cupyconv; assert 'torch' not in sys.modules, 'cupyconv imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_cuda_context_is_a_no_op_on_cpu():
    with cct.cuda_context(torch.device("cpu")):
        pass
    with cct.cuda_context(torch.zeros(1)):
        pass


def test_cuda_context_wiring_with_stand_ins(monkeypatch):
    """Without a GPU: cuda_context enters the device, then the allocator and torch's stream (created with the
    device current), and the allocator draws from torch's caching allocator on that stream (its handle)."""
    import types
    events, torch_stream = [], types.SimpleNamespace(cuda_stream=0xABC, device_index=1)

    class Context:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            events.append(f"enter {self.name}")

        def __exit__(self, *exc):
            events.append(f"exit {self.name}")

    class Allocator:
        def __init__(self, malloc, free):
            self.malloc_func, self.free_func = malloc, free

        def malloc(self, size):
            ptr = self.malloc_func(size, 1)
            self.free_func(ptr, 1)
            return ptr

    def using_allocator(malloc):
        assert malloc(64) == 0x1000
        return Context("allocator")

    def from_external(obj):
        assert events[-1] == "enter device 1"
        assert obj.__cuda_stream__() == (0, 0xABC)
        return Context("stream")

    cuda = types.SimpleNamespace(Device=lambda i: Context(f"device {i}"), using_allocator=using_allocator,
                                 PythonFunctionAllocator=Allocator,
                                 Stream=types.SimpleNamespace(from_external=from_external))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    from cupyconv.torch import cuda as torch_cuda
    monkeypatch.setattr(torch_cuda, "_raw_stream", None)   # torch.cuda.current_stream, faked below
    monkeypatch.setattr(torch_cuda, "_PER_STREAM", {})
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index: torch_stream if index == 1 else None)
    monkeypatch.setattr(torch.cuda, "caching_allocator_alloc",
                        lambda size, device, stream: events.append(("alloc", size, device, stream)) or 0x1000)
    monkeypatch.setattr(torch.cuda, "caching_allocator_delete", lambda ptr: events.append(("delete", ptr)))
    with cct.cuda_context(torch.device("cuda", 1)):
        events.append("body")
    assert events == ["enter device 1", ("alloc", 64, 1, torch_stream.cuda_stream), ("delete", 0x1000),
                      "enter allocator", "enter stream", "body", "exit stream", "exit allocator", "exit device 1"]
    # Nested on the same device and stream (a custom op's plain function entering it again): nothing is set up
    # again; on another stream, everything is.
    events.clear()
    with cct.cuda_context(torch.device("cuda", 1)):
        with cct.cuda_context(torch.device("cuda", 1)):
            events.append("inner")
        other = types.SimpleNamespace(cuda_stream=0xDEF, device_index=1)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda index: other)
        cuda.Stream = types.SimpleNamespace(from_external=lambda obj: obj.__cuda_stream__() == (0, 0xDEF)
                                            and Context("stream"))
        with cct.cuda_context(torch.device("cuda", 1)):
            events.append("other stream")
    entered = [e for e in events if isinstance(e, str)]
    assert entered == ["enter device 1", "enter allocator", "enter stream", "inner", "enter device 1",
                       "enter allocator", "enter stream", "other stream", "exit stream", "exit allocator",
                       "exit device 1", "exit stream", "exit allocator", "exit device 1"]


# ---------------------------------------------------------------------------------------------------------
# GPU: torch's stream and torch's allocator (skipped without CuPy and a CUDA device)

GPU_OPS = [  # (name, call(x) on a (N, C, H, W) CUDA tensor, torch reference)
    ("unfold", lambda x: cct.unfold(x, 3, padding=1, stride=2), lambda x: F.unfold(x, 3, padding=1, stride=2)),
    ("conv2d", lambda x: cct.conv2d(x, _gpu_weight(x, 16, 16)), lambda x: F.conv2d(x, _gpu_weight(x, 16, 16))),
    ("depthwise_conv2d", lambda x: cct.depthwise_conv2d(x, _gpu_weight(x, 16, 1), padding=1),
     lambda x: F.conv2d(x, _gpu_weight(x, 16, 1), padding=1, groups=16)),
    ("patch_conv2d", lambda x: cct.patch_conv2d(x[:, None], _gpu_weight(x, 16, 16), padding=1)[:, 0],
     lambda x: F.conv2d(x, _gpu_weight(x, 16, 16), padding=1)),
]


def _gpu_weight(x, d, c):
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(d, c, 3, 3, generator=generator) / 12).to(x.device)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_OPS, ids=lambda c: c[0])
def test_gpu_non_default_stream_without_synchronisation(case):
    """Inputs produced on a side stream by a long kernel and consumed there at once: a kernel of ours on any
    other stream would read them before they are written."""
    _, ours, theirs = case
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        seed = torch.randn(64, 16, 64, 64, device="cuda")
        x = seed
        for _ in range(20):                                          # keep the stream busy
            x = torch.tanh(x @ torch.eye(64, device="cuda"))
        import cupy
        with cct.cuda_context(x):
            assert cupy.cuda.get_current_stream().ptr == side.cuda_stream
        y = ours(x)
        expected = theirs(x)
        same = torch.allclose(y, expected, rtol=1e-4, atol=1e-4)     # ordered on `side` too
    side.synchronize()
    assert same


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_OPS, ids=lambda c: c[0])
def test_gpu_memory_comes_from_and_returns_to_torch(case):
    import cupy
    _, ours, _ = case
    x = torch.randn(8, 16, 32, 32, device="cuda", requires_grad=True)
    ours(x.detach())  # compile and warm up outside the count
    torch.cuda.synchronize()
    gc.collect()
    baseline = torch.cuda.memory_allocated()
    pool_before = cupy.get_default_memory_pool().used_bytes()
    y = ours(x)
    assert torch.cuda.memory_allocated() >= baseline + y.numel() * y.element_size()   # the output is torch's
    y.sum().backward()
    del y
    x.grad = None
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == baseline
    assert cupy.get_default_memory_pool().used_bytes() == pool_before  # nothing went through CuPy's pool


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_OPS, ids=lambda c: c[0])
def test_gpu_eager_calls_equal_the_custom_ops(case, monkeypatch):
    """On CUDA tensors in plain eager mode cupyconv.torch runs its ops without torch's dispatcher (`_custom_ops.call`)
    and repeats on the fast path for torch tensors; the same step through the custom ops gives the same forward,
    gradients and double-backward gradients.  The weight is a leaf that needs a gradient: a convolution's gx does
    not depend on x (torch too finds x unused in it), so only with gw = dB(x, .)* in the graph does a second
    derivative reach x, and one through gx reach the weight."""
    from cupyconv import _fastpath
    from cupyconv.torch import _custom_ops
    name = case[0]
    with_weight = {"conv2d": (16, lambda x, w: cct.conv2d(x, w)),
                   "depthwise_conv2d": (1, lambda x, w: cct.depthwise_conv2d(x, w, padding=1)),
                   "patch_conv2d": (16, lambda x, w: cct.patch_conv2d(x[:, None], w, padding=1)[:, 0])}

    def step():
        x = (torch.randn(4, 16, 20, 20, generator=torch.Generator().manual_seed(1)) / 4).cuda().requires_grad_(True)
        if name not in with_weight:
            y = case[1](x)
            return [t.detach() for t in (y, *torch.autograd.grad(y, x, torch.ones_like(y)))]
        channels, call = with_weight[name]
        w = _gpu_weight(x, 16, channels).requires_grad_(True)
        y = call(x, w)
        gx, gw = torch.autograd.grad(y, (x, w), torch.ones_like(y), create_graph=True)
        ggx, ggw = torch.autograd.grad((gx * gx).sum() + (gw * gw).sum(), (x, w))
        return [t.detach() for t in (y, gx, gw, ggx, ggw)]

    for _ in range(2):
        eager = step()
    assert any(e.bridge is not None for e in _fastpath.CACHE.values())
    monkeypatch.setattr(_custom_ops, "_plain_eager", lambda tensors: False)
    dispatched = step()
    for a, b in zip(eager, dispatched):
        assert a.abs().sum() > 0   # (a zero second derivative would compare equal whatever the paths did)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_arrays_that_are_not_tensors_are_refused_naming_the_op():
    """NumPy (or dask) arrays go to cupyconv's own functions; cupyconv.torch says so instead of failing in torch."""
    x, w = numpy.ones((1, 2, 4, 4), numpy.float32), numpy.ones((3, 2, 2, 2), numpy.float32)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    calls = [("conv2d", "input", lambda: cct.conv2d(x, tw)), ("conv2d", "weight", lambda: cct.conv2d(tx, w)),
             ("conv2d", "bias", lambda: cct.conv2d(tx, tw, numpy.ones(3, numpy.float32))),
             ("depthwise_conv2d", "input", lambda: cct.depthwise_conv2d(x, tw[:2, :1])),
             ("patch_conv2d", "input", lambda: cct.patch_conv2d(x, tw)),
             ("conv_transpose2d", "weight", lambda: cct.conv_transpose2d(tx, w.swapaxes(0, 1))),
             ("unfold", "input", lambda: cct.unfold(x, 2)),
             ("fold", "input", lambda: cct.fold(x[0, :1], (3, 3), 2))]
    dask_array = pytest.importorskip("dask.array")
    calls.append(("conv2d", "input", lambda: cct.conv2d(dask_array.from_array(x), tw)))
    for op, name, call in calls:
        with pytest.raises(TypeError, match=rf"^{op}: {name} must be a torch.Tensor, got a (numpy.ndarray|dask)"):
            call()


# ---------------------------------------------------------------------------------------------------------
# Eager calls (`_custom_ops.call`): torch's dispatcher is skipped only where it would do nothing but call the op


def test_eager_calls_only_in_plain_eager_mode(monkeypatch):
    """`_plain_eager` (whether `call` may skip the dispatcher) on tensors of the CUDA device type (CPU tensors here,
    cuda.DEVICE_TYPE faked): yes in plain eager mode; no for another device type, a subclass, under autocast, jit
    tracing, a dispatch mode (fake tensors), a torch-function mode, vmap, the profiler or torch.compile."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from cupyconv.torch import _custom_ops, cuda
    plain = _custom_ops._plain_eager
    x, w = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    assert not plain([x, w])   # CPU tensors: the custom op (torch's CPU convolutions behind it)
    monkeypatch.setattr(cuda, "DEVICE_TYPE", "cpu")
    assert plain([x, w]) and plain([x, nn.Parameter(w)])
    assert not plain([x.as_subclass(type("Sub", (torch.Tensor,), {})), w])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not plain([x, w])
    seen = []
    torch.jit.trace(lambda t: seen.append(plain([t])) or t * 2, (x,), check_trace=False)
    assert seen == [False]

    class Nothing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Nothing():
        assert not plain([x, w])
    class Passing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        assert not plain([x, w])
    seen.clear()
    torch.func.vmap(lambda t: seen.append(plain([t])) or t)(x)
    assert seen == [False]
    with torch.profiler.profile():
        assert not plain([x, w])
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not plain([x, w])
    monkeypatch.undo()
    monkeypatch.setattr(cuda, "DEVICE_TYPE", "cpu")
    assert plain([x, w])
    monkeypatch.setattr(_custom_ops, "_EAGER_AVAILABLE", False)   # a torch without one of the mode queries
    assert not plain([x, w])


def test_call_runs_the_implementation_or_the_custom_op(monkeypatch):
    """`call` in plain eager mode: the implementation when no gradient is needed, the op's eager Function when one is;
    otherwise (here: a tensor on another device) the custom op."""
    from cupyconv.torch import _custom_ops, cuda
    ran = []
    monkeypatch.setitem(_custom_ops.BODIES, "unfold", lambda *args: ran.append("body") or args[0] * 1)

    class Recorded(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *geometry):
            ran.append("function")
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return g, None, None, None, None

    monkeypatch.setitem(_custom_ops.EAGER_FUNCTIONS, "unfold", Recorded)
    args = ([3, 3], [1, 1], [0, 0, 0, 0], [1, 1])
    x = torch.randn(1, 2, 5, 5)
    monkeypatch.setattr(cuda, "DEVICE_TYPE", "cpu")
    _custom_ops.call("unfold", x, *args)
    with torch.no_grad():
        _custom_ops.call("unfold", x.requires_grad_(True), *args)
    _custom_ops.call("unfold", x, *args)
    assert ran == ["body", "body", "function"]
    monkeypatch.setattr(cuda, "DEVICE_TYPE", "cuda")
    assert _custom_ops.call("unfold", x.detach(), *args).shape == (1, 18, 9) and ran == ["body", "body", "function"]
