"""cupyconv.torch's layers are torch's layers: each against its torch.nn counterpart on the CPU.

Same class (isinstance), constructor, random initialisation, state_dict (both ways), repr, outputs and gradients
for every padding_mode; cupyconv's padding extensions on torch's state; unbatched and channels-last inputs;
fuse_conv_bn_eval; algorithm and workspace_limit per module; meta tensors; torch.jit (script refused, trace
works); torch.compile(fullgraph=True) and torch.export of a model with every layer.
"""
import io

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils.fusion import fuse_conv_bn_eval  # noqa: E402

import cupyconv  # noqa: E402
import cupyconv.torch as cct  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_path")    # every test on both CPU paths (conftest.py)
from test_torch_convolutions import spy_on  # noqa: E402

F64 = dict(dtype=torch.float64)


class TorchSeparable(nn.Module):
    """The torch layout DepthwiseSeparableConv2d's state_dict is documented to match."""

    def __init__(self, c, out, k, stride=1, padding=0, dilation=1, bias=True, m=1, depthwise_bias=False):
        super().__init__()
        self.depthwise = nn.Conv2d(c, c * m, k, stride, padding, dilation, groups=c, bias=depthwise_bias)
        self.pointwise = nn.Conv2d(c * m, out, 1, bias=bias)

    def forward(self, x):
        return self.pointwise(self.depthwise(x))


MODULE_CASES = [  # (name, cupyconv constructor, torch constructor, input shape)
    ("conv2d", lambda: cct.Conv2d(4, 6, 3, stride=2, padding=1, groups=2),
     lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 7, 6)),
    ("conv2d_same_dilation_no_bias", lambda: cct.Conv2d(3, 4, (3, 2), padding="same", dilation=(2, 1), bias=False),
     lambda: nn.Conv2d(3, 4, (3, 2), padding="same", dilation=(2, 1), bias=False), (1, 3, 6, 5)),
    ("conv2d_reflect", lambda: cct.Conv2d(3, 4, 3, padding=(1, 2), padding_mode="reflect"),
     lambda: nn.Conv2d(3, 4, 3, padding=(1, 2), padding_mode="reflect"), (2, 3, 5, 6)),
    ("conv2d_circular_strided", lambda: cct.Conv2d(2, 3, 3, stride=2, padding=1, padding_mode="circular"),
     lambda: nn.Conv2d(2, 3, 3, stride=2, padding=1, padding_mode="circular"), (1, 2, 6, 7)),
    ("conv1d_replicate_dilated", lambda: cct.Conv1d(4, 6, 3, 2, 2, 2, groups=2, padding_mode="replicate"),
     lambda: nn.Conv1d(4, 6, 3, 2, 2, 2, groups=2, padding_mode="replicate"), (2, 4, 11)),
    ("conv1d_same", lambda: cct.Conv1d(3, 2, 4, padding="same", bias=False),
     lambda: nn.Conv1d(3, 2, 4, padding="same", bias=False), (2, 3, 9)),
    ("conv3d_circular_groups", lambda: cct.Conv3d(4, 2, (2, 3, 2), (1, 2, 1), 1, groups=2, padding_mode="circular"),
     lambda: nn.Conv3d(4, 2, (2, 3, 2), (1, 2, 1), 1, groups=2, padding_mode="circular"), (1, 4, 4, 6, 5)),
    ("conv3d_reflect", lambda: cct.Conv3d(2, 3, 3, padding=(1, 0, 1), dilation=(1, 2, 1), padding_mode="reflect"),
     lambda: nn.Conv3d(2, 3, 3, padding=(1, 0, 1), dilation=(1, 2, 1), padding_mode="reflect"), (2, 2, 4, 6, 4)),
    ("conv_transpose1d", lambda: cct.ConvTranspose1d(4, 6, 3, 2, 1, 1, groups=2, dilation=2),
     lambda: nn.ConvTranspose1d(4, 6, 3, 2, 1, 1, groups=2, dilation=2), (2, 4, 5)),
    ("conv_transpose2d", lambda: cct.ConvTranspose2d(4, 3, (3, 2), (2, 1), (1, 0), (1, 0), bias=False),
     lambda: nn.ConvTranspose2d(4, 3, (3, 2), (2, 1), (1, 0), (1, 0), bias=False), (2, 4, 4, 5)),
    ("conv_transpose3d", lambda: cct.ConvTranspose3d(2, 4, 2, (2, 1, 1), 1, (1, 0, 0), groups=2),
     lambda: nn.ConvTranspose3d(2, 4, 2, (2, 1, 1), 1, (1, 0, 0), groups=2), (1, 2, 3, 4, 3)),
    ("depthwise_multiplier2", lambda: cct.DepthwiseConv2d(3, 6, 3, padding=1),
     lambda: nn.Conv2d(3, 6, 3, padding=1, groups=3), (2, 3, 6, 5)),
    ("depthwise_stride2_replicate", lambda: cct.DepthwiseConv2d(4, 4, 3, 2, 1, groups=4, padding_mode="replicate"),
     lambda: nn.Conv2d(4, 4, 3, 2, 1, groups=4, padding_mode="replicate"), (1, 4, 7, 7)),
    ("patch", lambda: cct.PatchConv2d(3, 5, 3, padding=1), lambda: nn.Conv2d(3, 5, 3, padding=1), (2, 4, 3, 4, 4)),
    ("patch_reflect_groups", lambda: cct.PatchConv2d(4, 2, 2, padding=1, groups=2, padding_mode="reflect"),
     lambda: nn.Conv2d(4, 2, 2, padding=1, groups=2, padding_mode="reflect"), (3, 4, 4, 4)),
    ("separable", lambda: cct.DepthwiseSeparableConv2d(3, 5, 3, stride=2, padding=1),
     lambda: TorchSeparable(3, 5, 3, stride=2, padding=1), (2, 3, 7, 6)),
    ("separable_multiplier_biases", lambda: cct.DepthwiseSeparableConv2d(2, 3, 3, padding="same",
                                                                          depth_multiplier=2, depthwise_bias=True),
     lambda: TorchSeparable(2, 3, 3, padding="same", m=2, depthwise_bias=True), (1, 2, 5, 5)),
]
LAYER_CASES = [c for c in MODULE_CASES if not c[0].startswith(("patch", "separable"))]  # torch takes their input


def _built(case):
    """(ours, theirs) built from the same seed: the same random draws if the initialisation is torch's."""
    _, make_ours, make_torch, _ = case
    torch.manual_seed(7)
    ours = make_ours()
    torch.manual_seed(7)
    return ours, make_torch()


def _torch_apply(module, x, nd=2):
    """torch's layer over any leading dims (patches rolled into the batch)."""
    flat = module(x.reshape(-1, *x.shape[-nd - 1:]))
    return flat.reshape(*x.shape[:-nd - 1], *flat.shape[1:])


def _assert_same_function(ours, theirs, x, apply=_torch_apply):
    """Same outputs and same gradients w.r.t. x and every parameter, for a random cotangent."""
    y_ours, y_torch = ours(x), apply(theirs, x)
    torch.testing.assert_close(y_ours, y_torch)
    g = torch.randn_like(y_torch)
    grads_ours = torch.autograd.grad(y_ours, [x, *ours.parameters()], g)
    grads_torch = torch.autograd.grad(y_torch, [x, *theirs.parameters()], g)
    for a, b in zip(grads_ours, grads_torch):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("case", MODULE_CASES, ids=lambda c: c[0])
def test_module_equivalence(case):
    ours, theirs = _built(case)
    if not isinstance(theirs, TorchSeparable):
        assert isinstance(ours, type(theirs))
    assert [m.extra_repr() for m in ours.modules()] == [m.extra_repr() for m in theirs.modules()]
    # the same initialisation: same parameter names, shapes and random draws
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for (key, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert torch.equal(a, b), key
    x = torch.randn(*case[3], requires_grad=True)
    nd = theirs.weight.dim() - 2 if hasattr(theirs, "weight") else 2
    _assert_same_function(ours, theirs, x, lambda m, x: _torch_apply(m, x, nd))
    # state_dict round trip, both ways, strict
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.25)
    ours.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours(x), _torch_apply(theirs, x, nd))
    with torch.no_grad():
        for p in ours.parameters():
            p.mul_(-1.5)
    theirs.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(x), _torch_apply(theirs, x, nd))


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "circular"])
def test_padding_extensions_on_torch_state(padding_mode):
    """Per-side padding and strided 'same' (which torch's constructor rejects) keep torch's parameters, random
    draws and repr; the result is torch's layer without padding on the input padded per side."""
    for padding, sides in ((((1, 0), (2, 1)), ((1, 0), (2, 1))),   # 'same' on 7x8 with stride 2: 1 + 1, 0 + 1
                           ("same", ((1, 1), (0, 1)))):
        torch.manual_seed(8)
        ours = cct.Conv2d(3, 4, 3, stride=2, padding=padding, padding_mode=padding_mode, **F64)
        torch.manual_seed(8)
        theirs = nn.Conv2d(3, 4, 3, stride=2, **F64)
        assert isinstance(ours, nn.Conv2d) and ours.padding == padding
        for (key, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
            assert torch.equal(a, b), key
        mode_shown = "" if padding_mode == "zeros" else f", padding_mode={padding_mode}"      # torch's format
        assert repr(ours) == f"{repr(theirs)[:-1]}, padding={padding}{mode_shown})"
        x = torch.randn(2, 3, 7, 8, **F64, requires_grad=True)
        flat_sides = [p for side in reversed(sides) for p in side]
        mode = "constant" if padding_mode == "zeros" else padding_mode
        _assert_same_function(ours, theirs, x, lambda m, x: m(F.pad(x, flat_sides, mode=mode)))


@pytest.mark.parametrize("case", LAYER_CASES, ids=lambda c: c[0])
def test_unbatched_input_as_torch(case):
    ours, theirs = _built(case)
    x = torch.randn(*case[3][1:], requires_grad=True)
    _assert_same_function(ours, theirs, x, lambda m, x: m(x))
    assert ours(x).dim() == x.dim()


@pytest.mark.parametrize("case", [c for c in LAYER_CASES if len(c[3]) > 3], ids=lambda c: c[0])
@pytest.mark.parametrize("convert", ["input", "model"])
def test_channels_last_as_torch(case, convert):
    """A channels-last input (or a model converted with .to(memory_format=...), whose weights then are) gives
    the output in the format torch's layer gives it, with torch's values.  float32: torch's float64 3-D CPU
    kernels and its CPU conv_transpose3d return contiguous outputs."""
    ours, theirs = _built(case)
    fmt = torch.channels_last if len(case[3]) == 4 else torch.channels_last_3d
    x = torch.randn(*case[3]).contiguous(memory_format=fmt).requires_grad_()
    if convert == "model":
        ours, theirs = ours.to(memory_format=fmt), theirs.to(memory_format=fmt)
        x = x.detach().contiguous().requires_grad_()
    y, expected = ours(x), theirs(x)
    if not isinstance(theirs, nn.ConvTranspose3d):
        assert (y.is_contiguous(), y.is_contiguous(memory_format=fmt)) == \
            (expected.is_contiguous(), expected.is_contiguous(memory_format=fmt))
    if convert == "input" and ours.padding_mode in ("zeros", "reflect"):
        assert y.is_contiguous(memory_format=fmt) and not y.is_contiguous()
    _assert_same_function(ours, theirs, x, lambda m, x: m(x))


# ---------------------------------------------------------------------------------------------------------
# Tools that read torch's classes: fuse_conv_bn_eval, init loops


FUSE_CASES = [  # (cupyconv layer, BatchNorm class, input shape, transposed)
    (lambda: cct.Conv1d(3, 4, 3, padding=1), nn.BatchNorm1d, (2, 3, 7), False),
    (lambda: cct.Conv2d(3, 4, 3, stride=2, padding=((1, 0), (0, 1))), nn.BatchNorm2d, (2, 3, 6, 7), False),
    (lambda: cct.Conv3d(2, 4, 2, padding_mode="reflect", padding=1), nn.BatchNorm3d, (1, 2, 4, 5, 4), False),
    (lambda: cct.DepthwiseConv2d(3, 6, 3, padding="same"), nn.BatchNorm2d, (2, 3, 5, 5), False),
    (lambda: cct.ConvTranspose2d(3, 4, 3, stride=2, groups=1), nn.BatchNorm2d, (2, 3, 4, 5), True),
]


@pytest.mark.parametrize("case", FUSE_CASES, ids=lambda c: c[1].__name__ + ("_transposed" if c[3] else ""))
def test_fuse_conv_bn_eval(case):
    make, batch_norm, shape, transposed = case
    torch.manual_seed(9)
    conv = make().double().eval()
    bn = batch_norm(conv.out_channels, **F64).eval()
    with torch.no_grad():
        for tensor in (bn.running_mean, bn.weight, bn.bias):
            tensor.copy_(torch.randn_like(tensor))
        bn.running_var.copy_(torch.rand_like(bn.running_var) + 0.5)
    fused = fuse_conv_bn_eval(conv, bn, transpose=transposed)
    assert type(fused) is type(conv) and fused.padding == conv.padding
    x = torch.randn(*shape, **F64)
    torch.testing.assert_close(fused(x), bn(conv(x)))


def test_init_loops_over_torch_classes_reach_our_layers():
    model = nn.Sequential(cct.Conv2d(3, 4, 3), cct.DepthwiseSeparableConv2d(4, 4, 3), cct.ConvTranspose2d(4, 2, 2))
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.zeros_(m.weight)
    assert all(not p.any() for name, p in model.named_parameters() if name.endswith("weight"))


# ---------------------------------------------------------------------------------------------------------
# Constructor arguments: errors, algorithm and workspace_limit


def test_module_constructor_errors_name_the_layer():
    with pytest.raises(ValueError, match=r"Conv2d: in_channels must be divisible by groups \(in_channels=3, "
                                         r"out_channels=4, groups=2\)"):
        cct.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="Conv1d: padding_mode must be one of"):
        cct.Conv1d(3, 4, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="DepthwiseConv2d: out_channels=5 must be a positive multiple of "
                                         "in_channels=2"):
        cct.DepthwiseConv2d(2, 5, 3)
    with pytest.raises(ValueError, match="DepthwiseConv2d: in_channels must be a positive int, got 0"):
        cct.DepthwiseConv2d(0, 0, 3)
    with pytest.raises(ValueError, match="DepthwiseConv2d: groups must equal in_channels=4"):
        cct.DepthwiseConv2d(4, 4, 3, groups=2)
    with pytest.raises(ValueError, match="Conv2d: padding must be"):
        cct.Conv2d(3, 4, 3, padding="full")
    for spelling in ("SAME", "Same", "VALID"):     # torch's layers refuse these spellings too
        with pytest.raises(ValueError, match=f"Conv2d: padding strings are 'same' and 'valid' in lower case, as "
                                             f"torch spells them, got '{spelling}'"):
            cct.Conv2d(3, 4, 3, padding=spelling)
        with pytest.raises(ValueError, match=f"^conv2d: padding strings .* got '{spelling}'"):
            cct.conv2d(torch.ones(1, 3, 5, 5), torch.ones(4, 3, 3, 3), padding=spelling)
        with pytest.raises(ValueError):
            nn.Conv2d(3, 4, 3, padding=spelling)
    with pytest.raises(ValueError, match="^conv_transpose2d: padding strings .* got 'Same'"):
        cct.conv_transpose2d(torch.ones(1, 3, 5, 5), torch.ones(3, 4, 3, 3), padding="Same")
    with pytest.raises(TypeError, match=r"Conv3d: padding must be an int, a tuple of 3 ints"):
        cct.Conv3d(3, 4, 3, padding=(1, 1))
    with pytest.raises(ValueError, match="Conv2d: stride must be >= 1"):
        cct.Conv2d(3, 4, 3, stride=0)
    with pytest.raises(ValueError, match="ConvTranspose2d: Only \"zeros\" padding mode is supported"):
        cct.ConvTranspose2d(3, 4, 3, padding_mode="reflect")
    with pytest.raises(TypeError, match="ConvTranspose2d: padding must be an int or a pair of ints"):
        cct.ConvTranspose2d(3, 4, 3, padding=((1, 0), (0, 1)))
    with pytest.raises(ValueError, match="Conv2d: algorithm must be one of"):
        cct.Conv2d(3, 4, 3, algorithm="winograd")
    with pytest.raises(ValueError, match="PatchConv2d: algorithm must be one of"):
        cct.PatchConv2d(3, 4, 3, algorithm="direct")
    with pytest.raises(ValueError, match=r"ConvTranspose2d: algorithm must be one of .*, got 'fused'"):
        cct.ConvTranspose2d(3, 4, 3, algorithm="fused")
    with pytest.raises(ValueError, match="ConvTranspose1d: workspace_limit must be a positive number of bytes"):
        cct.ConvTranspose1d(3, 4, 3, workspace_limit=-1)
    with pytest.raises(TypeError, match="Conv2d: workspace_limit must be None or an int"):
        cct.Conv2d(3, 4, 3, workspace_limit=2.0**20)
    with pytest.raises(TypeError, match="unexpected keyword argument 'algorithm'"):
        cct.DepthwiseConv2d(3, 3, 3, algorithm="direct")


@pytest.mark.numpy_cpu_path     # watches the plain cupyconv functions, which the torch CPU path does not call
@pytest.mark.parametrize("make,op,algorithm", [
    (lambda **kw: cct.Conv2d(3, 4, 3, **kw), "conv2d", "implicit_gemm"),
    (lambda **kw: cct.Conv1d(3, 4, 3, **kw), "conv1d", "im2col_gemm"),
    (lambda **kw: cct.Conv3d(3, 4, 1, **kw), "conv3d", "direct"),
    (lambda **kw: cct.PatchConv2d(3, 4, 3, **kw), "patch_conv2d", "fused"),
    (lambda **kw: cct.ConvTranspose2d(3, 4, 3, **kw), "conv_transpose2d", "im2col_gemm"),
    (lambda **kw: cct.ConvTranspose3d(3, 4, 1, **kw), "conv_transpose3d", "implicit_gemm"),
    (lambda **kw: cct.DepthwiseSeparableConv2d(3, 4, 3, **kw).pointwise, "conv2d", "direct"),
], ids=["conv2d", "conv1d", "conv3d", "patch", "transposed", "transposed3d", "separable"])
def test_algorithm_and_workspace_limit_per_module(make, op, algorithm, monkeypatch):
    """The keywords are stored, shown by repr, validated, and reach the forward and backward calls; setting the
    attribute changes them."""
    options = {"algorithm": algorithm, "workspace_limit": 4096}
    layer = make(**options)
    assert all(getattr(layer, k) == v for k, v in options.items())
    assert repr(layer).endswith(", ".join(f"{k}={v!r}" for k, v in options.items()) + ")")
    x = torch.randn(2, 3, *(5,) * (layer.weight.dim() - 2), requires_grad=True)
    seen = []
    spy_on(monkeypatch, op, seen)
    spy_on(monkeypatch, f"{op}_backward", seen)
    layer(x).sum().backward()
    assert seen == [(op, algorithm, 4096), (f"{op}_backward", algorithm, 4096)]
    layer.workspace_limit = None
    seen.clear()
    layer(x)
    assert seen == [(op, algorithm, cupyconv.DEFAULT_WORKSPACE_LIMIT)]


# ---------------------------------------------------------------------------------------------------------
# Meta tensors, torch.jit, torch.compile and torch.export


@pytest.mark.parametrize("case", MODULE_CASES, ids=lambda c: c[0])
def test_meta_tensors_give_meta_outputs(case):
    ours, _ = _built(case)
    expected = ours(torch.randn(*case[3]))
    meta = ours.to("meta")
    x = torch.empty(*case[3], device="meta", requires_grad=True)
    y = meta(x)
    assert y.is_meta and y.shape == expected.shape
    y.sum().backward()
    assert x.grad.is_meta and x.grad.shape == x.shape and all(p.grad.is_meta for p in meta.parameters())


def test_jit_script_is_refused_clearly_and_trace_records_the_ops():
    layer = cct.Conv2d(3, 4, 3, padding=1)
    with pytest.raises(TypeError, match=r"cupyconv.torch.Conv2d cannot be compiled by torch.jit.script .* "
                                        r"torch.nn.Conv2d"):
        torch.jit.script(nn.Sequential(layer, nn.ReLU()))
    x = torch.randn(2, 3, 5, 5)
    traced = torch.jit.trace(layer, x)
    assert "cupyconv::conv2d" in str(traced.graph)
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    torch.testing.assert_close(torch.jit.load(buffer)(x), layer(x))


class _EveryLayer(nn.Module):
    """Every cupyconv layer, with the extensions, an output_size and a channels-last path."""

    def __init__(self):
        super().__init__()
        self.conv = cct.Conv2d(3, 4, 3, stride=2, padding="same", padding_mode="reflect", algorithm="direct")
        self.depthwise = cct.DepthwiseConv2d(4, 8, 3, padding=((1, 0), (0, 1)))
        self.patch = cct.PatchConv2d(8, 4, 3, padding=1, padding_mode="replicate")
        self.up = cct.ConvTranspose2d(4, 4, 3, stride=2, padding=1, workspace_limit=2**16)
        self.conv1d = cct.Conv1d(4, 4, 3, padding=1, padding_mode="circular")
        self.conv3d = cct.Conv3d(4, 2, (1, 3, 3), padding=(0, 1, 1))
        self.up3d = cct.ConvTranspose3d(2, 2, (1, 2, 2), stride=(1, 2, 2))
        self.separable = cct.DepthwiseSeparableConv2d(2, 3, 3, padding=1)

    def forward(self, x):
        h = self.depthwise(self.conv(x))                                       # (N, 8, 4, 4), channels-last
        h = self.patch(h[:, None])[:, 0]                                       # one patch per sample
        h = self.up(h, output_size=[2 * h.shape[-2], 2 * h.shape[-1]])         # (N, 4, 8, 8)
        n, c, height, width = h.shape
        h = self.conv1d(h.reshape(n, c, height * width)).reshape(n, c, 1, height, width)
        h = self.up3d(self.conv3d(h))[:, :, 0]                                 # (N, 2, 16, 16)
        return self.separable(h)


def _every_layer_and_input():
    torch.manual_seed(10)
    return _EveryLayer().double(), torch.randn(2, 3, 8, 7, **F64).contiguous(memory_format=torch.channels_last)


def test_torch_compile_fullgraph_every_layer():
    """aot_eager runs the graph autograd traces (the fake implementations, the autograd formulas) without
    inductor's code generation, which would cost minutes of g++ on 2 cores."""
    torch._dynamo.reset()
    model, x = _every_layer_and_input()
    x.requires_grad_()
    leaves = [x, *model.parameters()]
    y = model(x)
    g = torch.randn_like(y)
    expected = torch.autograd.grad(y, leaves, g)
    y_compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(y_compiled, y)
    for a, b in zip(torch.autograd.grad(y_compiled, leaves, g), expected):
        torch.testing.assert_close(a, b)


def test_torch_export_every_layer():
    model, x = _every_layer_and_input()
    program = torch.export.export(model, (x,))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert {"cupyconv.conv2d.default", "cupyconv.conv_transpose3d.default"} <= targets
    torch.testing.assert_close(program.module()(x), model(x))


def test_torch_export_with_a_symbolic_batch_size():
    """The layers read their shapes as ints only where the export may specialise them: a program exported with a
    dynamic batch runs at other batch sizes, as one with torch.nn's layers does (this failed with a guard on the
    example's batch of 2)."""
    model, x = _every_layer_and_input()
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
    x5 = torch.randn(5, *x.shape[1:], **F64).contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(program.module()(x5), model(x5))


def test_torch_export_patches_with_symbolic_leading_dims():
    torch.manual_seed(11)
    layer = cct.PatchConv2d(3, 4, 3, padding=1).double()
    dims = {0: torch.export.Dim("batch", min=2, max=64), 1: torch.export.Dim("patches", min=2, max=4096)}
    program = torch.export.export(layer, (torch.randn(2, 5, 3, 4, 4, **F64),), dynamic_shapes={"input": dims})
    x = torch.randn(3, 7, 3, 4, 4, **F64)
    torch.testing.assert_close(program.module()(x), layer(x))


class _Traceable(nn.Module):
    """Every kind of layer, with padding modes, as torch.fx.symbolic_trace can follow a model of torch's layers."""

    def __init__(self):
        super().__init__()
        self.conv = cct.Conv2d(3, 8, 3, stride=2, padding="same", padding_mode="reflect")
        self.depthwise = cct.DepthwiseConv2d(8, 8, 3, padding=1, padding_mode="replicate")
        self.up = cct.ConvTranspose2d(8, 4, 3, stride=2)
        self.conv1d = cct.Conv1d(4, 2, 3)
        self.conv3d = cct.Conv3d(3, 2, (1, 3, 3), padding=(0, 1, 1))
        self.patches = cct.PatchConv2d(3, 2, 3, padding=1, padding_mode="circular")
        self.separable = cct.DepthwiseSeparableConv2d(3, 4, 3, padding=1)

    def forward(self, x):
        h = self.up(torch.relu(self.depthwise(self.conv(x))))
        return (self.conv1d(h.flatten(2)), self.conv3d(x.unsqueeze(2)), self.patches(x.unsqueeze(1)),
                self.separable(x))


def test_fx_symbolic_trace_records_the_layers_as_module_calls():
    """Plain torch.fx.symbolic_trace records each layer as one call_module node, as torch.nn's layers (a
    DepthwiseSeparableConv2d as its two layers), so an FX pass looking for convolution modules finds them; the
    traced module computes the same values and gradients."""
    torch.manual_seed(12)
    model = _Traceable().double()
    traced = torch.fx.symbolic_trace(model)
    modules = dict(traced.named_modules())
    calls = [node.target for node in traced.graph.nodes if node.op == "call_module"]
    assert calls == ["conv", "depthwise", "up", "conv1d", "conv3d", "patches", "separable.depthwise",
                     "separable.pointwise"]
    assert all(isinstance(modules[name], (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d)) for name in calls)
    assert not any("_layer" in str(node.target) for node in traced.graph.nodes)
    x = torch.randn(2, 3, 8, 7, **F64, requires_grad=True)
    expected, got = model(x), traced(x)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    gx, = torch.autograd.grad(sum(y.sum() for y in got), x)
    torch.testing.assert_close(gx, torch.autograd.grad(sum(y.sum() for y in expected), x)[0])


def test_fx_fuse_matches_exact_types_so_unconvert_fuse_convert():
    """torch.fx.experimental.optimization.fuse fuses (nn.Conv2d, nn.BatchNorm2d) pairs by exact type: our layers
    are left as they are (documented); fuse_conv_bn_eval takes them directly, or unconvert -> fuse -> convert."""
    from torch.fx.experimental.optimization import fuse
    torch.manual_seed(14)
    model = nn.Sequential(cct.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()).double().eval()
    model[1].running_mean.normal_()
    x = torch.randn(2, 3, 6, 5, **F64)
    assert any(isinstance(m, nn.BatchNorm2d) for m in fuse(model).modules())
    fused = cct.convert(fuse(cct.unconvert(model)))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fused.modules())
    assert any(type(m) is cct.Conv2d for m in fused.modules())
    torch.testing.assert_close(fused(x), model(x))


@pytest.mark.parametrize("layer, shape", [
    (lambda: cct.Conv1d(3, 4, 3, padding=1, padding_mode="circular"), (2, 3, 16)),
    (lambda: cct.Conv2d(3, 4, 3, padding="same", padding_mode="reflect", dilation=2), (2, 3, 16, 12)),
    (lambda: cct.Conv2d(3, 4, (3, 2), stride=2, padding=((1, 0), (0, 1))), (2, 3, 16, 12)),
    (lambda: cct.Conv3d(2, 4, 3, padding=1), (2, 2, 8, 6, 7)),
    (lambda: cct.DepthwiseConv2d(3, 6, 3, padding=1, padding_mode="replicate"), (2, 3, 10, 9)),
    (lambda: cct.ConvTranspose2d(3, 2, 3, stride=2, padding=1), (2, 3, 8, 7)),
    (lambda: cct.ConvTranspose3d(2, 2, 2, stride=2), (2, 2, 4, 5, 4)),
    (lambda: cct.PatchConv2d(3, 4, 3, padding=1), (2, 5, 3, 8, 6)),
], ids=["conv1d", "conv2d_same_reflect", "conv2d_per_side", "conv3d", "depthwise", "transposed2d", "transposed3d",
        "patch"])
def test_torch_export_with_dynamic_spatial_dims(layer, shape):
    """torch.export with a Dim on every spatial dim (and the batch) exports, and the program runs at other sizes,
    as torch.nn's layers do (this failed with 'specialized it to be a constant')."""
    torch.manual_seed(15)
    module = layer().double()
    nd = len(module.kernel_size)
    dims = {0: torch.export.Dim("batch", min=2, max=64),
            **{len(shape) - nd + i: torch.export.Dim(f"s{i}", min=4, max=64) for i in range(nd)}}
    program = torch.export.export(module, (torch.randn(*shape, **F64),), dynamic_shapes={"input": dims})
    other = list(shape)
    other[0] += 1
    for i in range(nd):
        other[len(shape) - nd + i] += 3 + i
    x = torch.randn(*other, **F64)
    torch.testing.assert_close(program.module()(x), module(x))


def test_torch_export_of_the_functional_ops_with_dynamic_spatial_dims():
    class Functional(nn.Module):
        def forward(self, x1, x2, x3, w1, w2, w3):
            return (cct.conv1d(x1, w1, padding="same"), cct.conv2d(x2, w2, stride=2, padding=((1, 0), (2, 1))),
                    cct.conv3d(x3, w3, padding=1), cct.conv_transpose2d(x2, w2.transpose(0, 1), stride=2),
                    cct.unfold(x2, 2, padding=1))

    torch.manual_seed(16)
    args = (torch.randn(2, 3, 12, **F64), torch.randn(2, 3, 10, 9, **F64), torch.randn(2, 3, 6, 5, 7, **F64),
            torch.randn(4, 3, 3, **F64), torch.randn(4, 3, 3, 2, **F64), torch.randn(4, 3, 2, 3, 2, **F64))
    dim = torch.export.Dim

    def spatial(name, nd):
        return {2 + i: dim(f"{name}{i}", min=4, max=64) for i in range(nd)}
    shapes = (spatial("l", 1), spatial("h", 2), spatial("d", 3), None, None, None)
    program = torch.export.export(Functional(), args, dynamic_shapes=shapes)
    other = (torch.randn(2, 3, 17, **F64), torch.randn(2, 3, 13, 11, **F64), torch.randn(2, 3, 7, 9, 8, **F64),
             *args[3:])
    for a, b in zip(program.module()(*other), Functional()(*other)):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------------------------------------------
# convert and unconvert


class _Nested(nn.Module):
    """torch's six convolution layers at several depths, a shared layer, hooks, a buffer and mixed train/eval."""

    def __init__(self):
        super().__init__()
        shared = nn.Conv2d(4, 4, 3, padding="same", padding_mode="reflect")
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                                  shared)
        self.branch = nn.ModuleDict({"again": shared, "up": nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1,
                                                                                 output_padding=1)})
        self.line = nn.Sequential(nn.Conv1d(2, 3, 3, padding=1, padding_mode="circular"),
                                  nn.ConvTranspose1d(3, 2, 2, stride=2))
        self.volume = nn.Sequential(nn.Conv3d(2, 2, (1, 3, 3), padding=(0, 1, 1), groups=2),
                                    nn.ConvTranspose3d(2, 1, (1, 2, 2), stride=(1, 2, 2)))
        self.line.eval()
        self.stem[1].eval()            # running statistics fixed: the state_dict compares equal after a call
        self.stem[0].register_buffer("calls", torch.zeros(()))
        self.stem[0].register_forward_hook(lambda m, args, out: out * 2)
        self.stem[0].register_forward_pre_hook(lambda m, args: m.calls.add_(1) and None)

    def forward(self, x):
        h = self.branch["up"](self.branch["again"](self.stem(x)))             # (N, 2, 2H', 2W')
        n, c, height, width = h.shape
        line = self.line(h.reshape(n, c, height * width))
        return line, self.volume(h.unsqueeze(2))


def test_convert_swaps_every_torch_convolution_keeping_its_state():
    torch.manual_seed(13)
    model = _Nested().double()
    x = torch.randn(2, 3, 8, 7, **F64)
    expected = model(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    parameters = list(model.parameters())
    converted = cct.convert(model, algorithm="im2col_gemm", workspace_limit=2**20)
    assert converted is model
    convolutions = [m for m in converted.modules() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d,
                                                                       nn.ConvTranspose1d, nn.ConvTranspose2d,
                                                                       nn.ConvTranspose3d))]
    assert len(convolutions) == 7 and all(type(m).__module__ == "cupyconv.torch.modules" for m in convolutions)
    assert all((m.algorithm, m.workspace_limit) == ("im2col_gemm", 2**20) for m in convolutions)
    assert converted.stem[3] is converted.branch["again"]                    # still one shared layer
    assert list(converted.parameters()) == parameters and all(a is b for a, b in zip(converted.parameters(),
                                                                                     parameters))
    assert not converted.line[0].training and converted.stem[0].training
    assert converted.stem[3].padding == "same" and converted.stem[3].padding_mode == "reflect"
    got = converted(x)                                                       # the hooks double and count
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    assert converted.stem[0].calls == 2
    state["stem.0.calls"] += 1
    assert converted.state_dict().keys() == state.keys()
    for k, v in converted.state_dict().items():
        torch.testing.assert_close(v, state[k])

    back = cct.unconvert(converted)
    assert {type(m) for m in back.modules()} >= {nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d,
                                                 nn.ConvTranspose2d, nn.ConvTranspose3d}
    assert not any(type(m).__module__.startswith("cupyconv") for m in back.modules())
    assert not hasattr(back.stem[0], "algorithm")
    for a, b in zip(back(x), expected):                 # torch's own computation, 'same' + reflect included
        torch.testing.assert_close(a, b)


def test_convert_a_single_layer_and_unconvert_refuses_what_torch_cannot_express():
    layer = nn.Conv2d(3, 4, 3)
    ours = cct.convert(layer)
    assert type(ours) is cct.Conv2d and ours.weight is layer.weight and type(layer) is nn.Conv2d
    depthwise = cct.unconvert(cct.DepthwiseConv2d(3, 6, 3, padding=1))
    assert type(depthwise) is nn.Conv2d and depthwise.groups == 3
    patches = cct.PatchConv2d(3, 4, 3)
    assert cct.unconvert(patches) is patches
    for padding in ("same", "valid", (1, 2)):   # built as ours: torch's own padding for padding_mode is recomputed
        ours = cct.Conv2d(3, 4, (3, 4), padding=padding, dilation=(2, 1), padding_mode="reflect").double()
        x = torch.randn(2, 3, 7, 8, **F64)
        expected = ours(x)
        torch.testing.assert_close(cct.unconvert(ours)(x), expected)
    with pytest.raises(ValueError, match=r"unconvert: Conv2d has padding=\(\(1, 0\), \(0, 1\)\) with stride=\(1, 1\)"
                                         r", which torch.nn.Conv2d cannot express"):
        cct.unconvert(nn.Sequential(cct.Conv2d(3, 4, 3, padding=((1, 0), (0, 1)))))
    with pytest.raises(ValueError, match=r"unconvert: Conv1d has padding='same' with stride=\(2,\)"):
        cct.unconvert(cct.Conv1d(3, 4, 3, stride=2, padding="same"))
    with pytest.raises(ValueError, match="convert: algorithm must be one of"):
        cct.convert(layer, algorithm="winograd")
