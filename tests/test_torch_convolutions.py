"""cupyconv.torch's functional convolutions against torch.nn.functional, to the second order.

Every convolution (conv1d/2d/3d, patch_conv2d, depthwise_conv2d, conv_transpose1d/2d/3d) on a small problem with
stride, dilation, asymmetric (per-side) padding and groups, in float64 on the CPU: values and first-order
gradients against torch, `gradcheck`, `gradgradcheck`, and the double-backward values against torch's double
backward.  Then torch's conventions (unbatched input, channels_last in -> channels_last out), `algorithm` and
`workspace_limit` reaching the forward and backward calls, argument errors, and meta tensors.

torch has no per-side padding: the references pad with `F.pad` first (conv) or crop the unpadded output
(transposed conv), both linear maps whose derivatives torch knows to any order.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import cupyconv  # noqa: E402
import cupyconv.torch as cct  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_path")    # every test on both CPU paths (conftest.py)

F64 = dict(dtype=torch.float64)
TORCH_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TORCH_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def torch_conv(x, weight, bias, stride, sides, dilation, groups):
    """F.conv{n}d with per-side padding (F.pad first), over any leading dims of x (rolled into the batch)."""
    nd = weight.dim() - 2
    flat = x.reshape(-1, *x.shape[-nd - 1:])
    padded = F.pad(flat, [p for side in reversed(sides) for p in side])
    y = TORCH_CONV[nd](padded, weight, bias, stride, 0, dilation, groups)
    return y.reshape(*x.shape[:-nd - 1], *y.shape[1:])


def torch_conv_transpose(x, weight, bias, stride, sides, output_padding, groups, dilation):
    """F.conv_transpose{n}d with per-side padding: the unpadded output with (low, high) cropped per dim."""
    nd = weight.dim() - 2
    full = TORCH_TRANSPOSE[nd](x, weight, bias, stride, 0, output_padding, groups, dilation)
    return full[(..., *(slice(lo, n - hi) for (lo, hi), n in zip(sides, full.shape[-nd:])))]


@dataclass
class Case:
    """One convolution problem: cct.<op>(x, weight, bias, ...) and its torch reference."""
    op: str
    x: tuple
    weight: tuple
    stride: tuple
    padding: tuple                    # per side: one (low, high) pair per spatial dim
    dilation: tuple
    groups: int = 1
    output_padding: tuple = field(default=())
    bias: bool = True

    def __str__(self) -> str:
        return f"{self.op}_x{'x'.join(map(str, self.x))}"

    @property
    def nd(self) -> int:
        return len(self.weight) - 2

    def ours(self, x, weight, bias=None, **options):
        fn = getattr(cct, self.op)
        if self.op.startswith("conv_transpose"):
            return fn(x, weight, bias, self.stride, self.padding, self.output_padding, self.groups, self.dilation,
                      **options)
        if self.op == "depthwise_conv2d":
            return fn(x, weight, bias, self.stride, self.padding, self.dilation)
        return fn(x, weight, bias, self.stride, self.padding, self.dilation, self.groups, **options)

    def reference(self, x, weight, bias=None):
        if self.op.startswith("conv_transpose"):
            return torch_conv_transpose(x, weight, bias, self.stride, self.padding, self.output_padding, self.groups,
                                        self.dilation)
        groups = x.shape[-self.nd - 1] if self.op == "depthwise_conv2d" else self.groups
        return torch_conv(x, weight, bias, self.stride, self.padding, self.dilation, groups)

    def plain_torch(self, x, weight):
        """torch's own op without padding or stride: the memory format torch gives its output."""
        groups = x.shape[-self.nd - 1] if self.op == "depthwise_conv2d" else self.groups
        table = TORCH_TRANSPOSE if self.op.startswith("conv_transpose") else TORCH_CONV
        return table[self.nd](x, weight, groups=groups)

    def inputs(self, seed=0, dtype=torch.float64, device="cpu"):
        """Fresh random (x, weight[, bias]) leaves that require grad."""
        generator = torch.Generator().manual_seed(seed)
        channels = self.weight[1] * self.groups if self.op.startswith("conv_transpose") else self.weight[0]
        shapes = (self.x, self.weight) + (((channels,),) if self.bias else ())
        return tuple(torch.randn(s, generator=generator, dtype=dtype).to(device).requires_grad_() for s in shapes)


CASES = [
    Case("conv1d", (2, 4, 9), (6, 2, 3), (2,), ((2, 1),), (2,), groups=2),
    Case("conv2d", (2, 4, 7, 6), (6, 2, 3, 2), (2, 1), ((1, 0), (2, 1)), (1, 2), groups=2),
    Case("conv3d", (1, 4, 5, 6, 5), (4, 2, 2, 3, 2), (1, 2, 1), ((1, 0), (0, 1), (1, 1)), (2, 1, 1), groups=2),
    Case("patch_conv2d", (2, 3, 4, 5, 5), (6, 2, 3, 3), (2, 1), ((1, 0), (0, 1)), (1, 2), groups=2),
    Case("depthwise_conv2d", (2, 3, 7, 6), (6, 1, 3, 2), (2, 1), ((1, 0), (2, 1)), (1, 2), bias=False),
    Case("conv_transpose1d", (2, 4, 5), (4, 3, 3), (2,), ((1, 0),), (2,), groups=2, output_padding=(1,)),
    Case("conv_transpose2d", (2, 4, 4, 5), (4, 2, 3, 2), (2, 1), ((1, 0), (0, 1)), (1, 2), groups=2,
         output_padding=(1, 0)),
    Case("conv_transpose3d", (1, 2, 3, 4, 3), (2, 2, 2, 2, 3), (2, 1, 1), ((1, 0), (0, 0), (1, 1)), (1, 2, 1),
         output_padding=(1, 0, 0), bias=False),
]
BATCHED = [c for c in CASES if len(c.x) == c.nd + 2]           # every case but the patches


def _second_order(fn, inputs, seed):
    """The gradient, w.r.t. the inputs and the cotangent, of <grad fn(inputs) . v> for random cotangent and v:
    every term of the double backward."""
    y = fn(*inputs)
    generator = torch.Generator().manual_seed(seed)
    grad_output = torch.randn(y.shape, generator=generator, **F64).requires_grad_()
    grads = torch.autograd.grad(y, inputs, grad_output, create_graph=True)
    directions = [torch.randn(g.shape, generator=generator, **F64) for g in grads]
    total = sum((g * v).sum() for g, v in zip(grads, directions))
    return torch.autograd.grad(total, (*inputs, grad_output), allow_unused=True, materialize_grads=True)


# ---------------------------------------------------------------------------------------------------------
# First and second order against torch


@pytest.mark.parametrize("case", CASES, ids=str)
def test_values_and_gradients_match_torch_and_gradcheck(case):
    inputs = case.inputs(seed=1)
    y, expected = case.ours(*inputs), case.reference(*inputs)
    torch.testing.assert_close(y, expected)
    grad_output = torch.randn_like(expected)
    for got, want in zip(torch.autograd.grad(y, inputs, grad_output),
                         torch.autograd.grad(expected, inputs, grad_output)):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(case.ours, inputs, fast_mode=True)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradgradcheck(case):
    assert torch.autograd.gradgradcheck(case.ours, case.inputs(seed=2), fast_mode=True)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_double_backward_matches_torch(case):
    inputs = case.inputs(seed=3)
    for got, want in zip(_second_order(case.ours, inputs, seed=4), _second_order(case.reference, inputs, seed=4)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("case", [CASES[1], CASES[6]], ids=str)
@pytest.mark.parametrize("picked", [(0,), (1,), (2,), (1, 2), (0, 2)], ids=lambda p: "+".join("xwb"[i] for i in p))
def test_double_backward_through_some_gradients(case, picked):
    """Second derivatives through only some of grad_x, grad_weight, grad_bias: the backward op's formula gets
    None for the others (materialize_grads off) and each term must still be torch's."""
    inputs = case.inputs(seed=5)
    results = []
    for fn in (case.ours, case.reference):
        grads = torch.autograd.grad(fn(*inputs).square().sum(), inputs, create_graph=True)
        total = sum(grads[i].sin().sum() for i in picked)
        results.append(torch.autograd.grad(total, inputs, allow_unused=True, materialize_grads=True))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want)


# ---------------------------------------------------------------------------------------------------------
# torch's conventions: unbatched input, channels_last


@pytest.mark.parametrize("case", BATCHED, ids=str)
def test_unbatched_input_gives_unbatched_output(case):
    x, *params = case.inputs(seed=6)
    y = case.ours(x[0], *params)
    assert y.shape == case.reference(x[:1], *params).shape[1:]
    torch.testing.assert_close(y, case.reference(x[:1], *params)[0])
    grad = torch.autograd.grad(y.sum(), x)[0]
    torch.testing.assert_close(grad, torch.autograd.grad(case.reference(x[:1], *params).sum(), x)[0])


CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


@pytest.mark.parametrize("case", [c for c in BATCHED if c.nd > 1], ids=str)
@pytest.mark.parametrize("which", ["input", "weight"])
def test_channels_last_in_channels_last_out(case, which):
    """As torch: a channels-last input or weight gives a channels-last output, with the same values."""
    inputs = list(case.inputs(seed=7))
    index = 0 if which == "input" else 1
    fmt = CHANNELS_LAST[len(case.x)]
    inputs[index] = inputs[index].detach().contiguous(memory_format=fmt).requires_grad_()
    y, expected = case.ours(*inputs), case.reference(*inputs)
    if case.op != "conv_transpose3d":   # torch's CPU kernel returns it contiguous (cuDNN keeps channels_last_3d)
        # torch's float32 kernels (float64 3-D convolutions on the CPU return contiguous outputs)
        torch_y = case.plain_torch(*(t.detach().float() for t in inputs[:2]))
        assert (y.is_contiguous(), y.is_contiguous(memory_format=fmt)) == \
            (torch_y.is_contiguous(), torch_y.is_contiguous(memory_format=fmt))
    if which == "input" or case.op != "depthwise_conv2d":       # a (C * m, 1, k...) weight stays contiguous
        assert y.is_contiguous(memory_format=fmt) and not y.is_contiguous()
    torch.testing.assert_close(y, expected)
    grad_output = torch.randn_like(expected)
    for got, want in zip(torch.autograd.grad(y, inputs, grad_output),
                         torch.autograd.grad(expected, inputs, grad_output)):
        torch.testing.assert_close(got, want)


def test_memory_format_reads_strides_as_torch_does():
    """The format the functional ops give their output follows torch's reading of the strides
    (`Tensor.suggest_memory_format`, whose Python twin is `torch._prims_common.suggest_memory_format`), also for
    the ambiguous layouts of size-1 and size-0 dims, transposed and expanded views."""
    from torch._prims_common import suggest_memory_format
    from cupyconv.torch.functional import _memory_format
    for shape in itertools.product(*[(0, 1, 2, 3)] * 4 + [(1, 2)]):
        for dims in (4, 5):
            for fmt in (torch.contiguous_format, CHANNELS_LAST[dims]):
                t = torch.empty(shape[:dims]).contiguous(memory_format=fmt)
                for view in (t, t.transpose(-1, -2), t[..., :1], t[:, :1].expand(t.shape)):
                    assert _memory_format(view) == suggest_memory_format(view), (view.shape, view.stride())


def test_patches_keep_their_layout():
    """patch_conv2d with several leading dims has no channels-last format to keep; with one it does."""
    case = CASES[3]
    x, w, b = case.inputs(seed=8)
    assert case.ours(x, w, b).is_contiguous()
    x4 = x[0].detach().contiguous(memory_format=torch.channels_last)
    y = case.ours(x4, w, b)
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, case.reference(x4, w, b))


# ---------------------------------------------------------------------------------------------------------
# algorithm and workspace_limit, per call, forward and backward


def spy_on(monkeypatch, name, seen):
    """Replace cupyconv.<name> by a wrapper recording (name, algorithm, workspace limit in force)."""
    original = getattr(cupyconv, name)

    def spy(*args, **kwargs):
        seen.append((name, kwargs.get("algorithm"), cupyconv.get_workspace_limit()))
        return original(*args, **kwargs)

    monkeypatch.setattr(cupyconv, name, spy)


@pytest.mark.numpy_cpu_path     # watches the plain cupyconv functions, which the torch CPU path does not call
@pytest.mark.parametrize("case", CASES, ids=str)
def test_algorithm_and_workspace_limit_reach_forward_and_backward(case, monkeypatch):
    seen = []
    spy_on(monkeypatch, case.op, seen)
    spy_on(monkeypatch, f"{case.op}_backward", seen)
    options = {}
    if case.op.startswith(("conv1d", "conv2d", "conv3d", "conv_transpose")):
        options["algorithm"] = "direct"
    if case.op == "patch_conv2d":
        options["algorithm"] = "fused"
    if case.op != "depthwise_conv2d":
        options["workspace_limit"] = 12345
    inputs = case.inputs(seed=9)
    case.ours(*inputs, **options).sum().backward()
    algorithm, limit = options.get("algorithm"), options.get("workspace_limit", cupyconv.DEFAULT_WORKSPACE_LIMIT)
    assert seen == [(case.op, algorithm, limit), (f"{case.op}_backward", algorithm, limit)]
    assert cupyconv.get_workspace_limit() == cupyconv.DEFAULT_WORKSPACE_LIMIT


def test_option_and_shape_errors_name_the_op():
    x, w = torch.randn(1, 4, 6, 6), torch.randn(2, 4, 3, 3)
    with pytest.raises(ValueError, match=r"conv2d: algorithm must be one of .*'winograd'"):
        cct.conv2d(x, w, algorithm="winograd")
    with pytest.raises(ValueError, match="patch_conv2d: algorithm must be one of"):
        cct.patch_conv2d(x, w, algorithm="direct")
    with pytest.raises(ValueError, match="conv2d: workspace_limit must be a positive number of bytes, got 0"):
        cct.conv2d(x, w, workspace_limit=0)
    for bad in (1.5, True, "1MB"):
        with pytest.raises(TypeError, match="conv_transpose2d: workspace_limit must be None or an int"):
            cct.conv_transpose2d(x, w.transpose(0, 1), workspace_limit=bad)
    with pytest.raises(ValueError, match="conv_transpose3d: workspace_limit must be a positive number of bytes"):
        cct.conv_transpose3d(x[None], torch.randn(4, 2, 1, 1, 1), workspace_limit=0)
    with pytest.raises(ValueError, match=r"conv_transpose1d: algorithm must be one of .*'fused'"):
        cct.conv_transpose1d(x[0], w[..., 0].transpose(0, 1), algorithm="fused")
    with pytest.raises(ValueError, match=r"conv2d: input must have 4 dimensions \(N, C, H, W\) or 3 without the "
                                         r"batch dim, got shape \(6, 6\)"):
        cct.conv2d(x[0, 0], w)
    with pytest.raises(ValueError, match=r"conv1d: input must have 3 dimensions"):
        cct.conv1d(x, w[..., 0])
    with pytest.raises(ValueError, match="conv_transpose2d: padding='same' is not defined"):
        cct.conv_transpose2d(x, w.transpose(0, 1), padding="same")
    with pytest.raises(TypeError, match="conv_transpose3d: output_padding must be an int or a tuple of 3 ints"):
        cct.conv_transpose3d(x[None], torch.randn(4, 2, 1, 1, 1), output_padding=(1, 1))
    with pytest.raises(ValueError, match="conv_transpose2d: output_padding"):      # checked by the op itself
        cct.conv_transpose2d(x, w.transpose(0, 1), output_padding=1)


# ---------------------------------------------------------------------------------------------------------
# Meta tensors: shapes from the fake implementations, forward and backward


@pytest.mark.parametrize("case", CASES, ids=str)
def test_meta_tensors_give_meta_outputs(case):
    expected = case.ours(*case.inputs(seed=10))
    inputs = case.inputs(seed=10, device="meta")
    y = case.ours(*inputs)
    assert y.device.type == "meta" and y.shape == expected.shape and y.dtype == torch.float64
    grads = torch.autograd.grad(y, inputs, torch.empty_like(y))
    assert [g.shape for g in grads] == [t.shape for t in inputs] and all(g.is_meta for g in grads)
