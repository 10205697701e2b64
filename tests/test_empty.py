"""Empty problems: every public op with a zero batch (N = 0, or a zero leading patch dim), zero input channels
(C = 0), zero output channels (D = 0) or an input plane of size 0 that only the padding covers, on the CPU path
and on the emulated kernel path with every algorithm, forward and backward with every `needs`.

Both paths must give the same shapes and dtypes, and the values of the definitions, where a sum over nothing is 0
(`expected`): the output is the bias broadcast over it (zeros without a bias), grad_x and grad_weight are zeros,
and grad_bias is grad_output summed over everything but its channels.  The oracle itself is checked against the
naive float64 loops of tests/reference.py (2-D) and against torch.nn.functional where torch takes the problem
(it rejects D = 0 and empty planes, and returns an empty output for C = 0, dropping the bias).
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy
import pytest

import cupyconv as cc
import reference as ref
from cupyconv import _device
from cupyconv.ops import conv, patch
from emulator import EmulatedDevice

NEEDS = ("input", "weight", "bias")
NEEDS_CHOICES = (NEEDS, ("input",), ("weight",), ("bias",))
SPATIAL = {1: (7,), 2: (5, 6), 3: (3, 4, 5)}
KERNEL = {1: (3,), 2: (3, 2), 3: (2, 3, 2)}
DTYPE = numpy.float32

#: (forward, backward, algorithms) of each op family by spatial dims; None: over weight.ndim - 2 dims.
OPS = {
    ("conv", 1): (cc.conv1d, cc.conv1d_backward, conv.ALGORITHMS),
    ("conv", 2): (cc.conv2d, cc.conv2d_backward, conv.ALGORITHMS),
    ("conv", 3): (cc.conv3d, cc.conv3d_backward, conv.ALGORITHMS),
    ("conv", None): (cc.conv_nd, cc.conv_nd_backward, conv.ALGORITHMS),
    ("depthwise", 1): (cc.depthwise_conv1d, cc.depthwise_conv1d_backward, None),
    ("depthwise", 2): (cc.depthwise_conv2d, cc.depthwise_conv2d_backward, None),
    ("depthwise", 3): (cc.depthwise_conv3d, cc.depthwise_conv3d_backward, None),
    ("patch", 1): (cc.patch_conv1d, cc.patch_conv1d_backward, patch.ALGORITHMS),
    ("patch", 2): (cc.patch_conv2d, cc.patch_conv2d_backward, patch.ALGORITHMS),
    ("patch", 3): (cc.patch_conv3d, cc.patch_conv3d_backward, patch.ALGORITHMS),
    ("transpose", 1): (cc.conv_transpose1d, cc.conv_transpose1d_backward, conv.ALGORITHMS),
    ("transpose", 2): (cc.conv_transpose2d, cc.conv_transpose2d_backward, conv.ALGORITHMS),
    ("transpose", 3): (cc.conv_transpose3d, cc.conv_transpose3d_backward, conv.ALGORITHMS),
    ("transpose", None): (cc.conv_transpose_nd, cc.conv_transpose_nd_backward, conv.ALGORITHMS),
}


@dataclasses.dataclass(frozen=True)
class Problem:
    family: str            # conv, depthwise, patch, transpose
    nd: int                # spatial dims
    by_weight: bool        # conv_nd / conv_transpose_nd (spatial dims read from the weight)
    what: str              # which size is 0
    x: tuple
    weight: tuple
    kwargs: dict

    def __str__(self):
        return f"{self.family}{'_nd' if self.by_weight else ''}-{self.nd}d-{self.what}"

    @property
    def ops(self):
        return OPS[self.family, None if self.by_weight else self.nd]

    @property
    def channel_axis(self) -> int:
        return -self.nd - 1

    @property
    def out_channels(self) -> int:
        return self.weight[1] * self.kwargs.get("groups", 1) if self.family == "transpose" else self.weight[0]

    @property
    def output_shape(self) -> tuple:
        k, p, s = self.weight[2:], self.kwargs.get("padding", 0), self.kwargs.get("stride", 1)
        if self.family == "transpose":
            extra = self.kwargs.get("output_padding", 0)
            out = [(n - 1) * s - 2 * p + (kk - 1) + extra + 1 for n, kk in zip(self.x[2:], k)]
        else:
            out = [(n + 2 * p - (kk - 1) - 1) // s + 1 for n, kk in zip(self.x[-self.nd:], k)]
        return (*self.x[:self.channel_axis], self.out_channels, *out)


def _problems():
    problems = []

    def add(family, nd, what, x, weight, by_weight=False, **kwargs):
        problems.append(Problem(family, nd, by_weight, what, x, weight, kwargs))

    for nd in (1, 2, 3):
        s, k = SPATIAL[nd], KERNEL[nd]
        # A plane of size 0 along the first spatial dim, which the padding alone covers (kernel 1 along it).
        plane0, k1 = (0, *s[1:]), (1, *k[1:])
        for by_weight in ((False, True) if nd > 1 else (False,)):
            add("conv", nd, "N0", (0, 4, *s), (6, 2, *k), by_weight, stride=2, padding=1, groups=2)
            add("conv", nd, "C0", (2, 0, *s), (3, 0, *k), by_weight, padding=1)
            add("conv", nd, "C0-groups2", (2, 0, *s), (4, 0, *k), by_weight, groups=2)
            add("conv", nd, "D0", (2, 4, *s), (0, 4, *k), by_weight, stride=2)
            add("conv", nd, "plane0", (2, 3, *plane0), (4, 3, *k1), by_weight, padding=1)
            add("transpose", nd, "N0", (0, 4, *s), (4, 3, *k), by_weight, stride=2, padding=1, output_padding=1)
            add("transpose", nd, "Cin0", (2, 0, *s), (0, 3, *k), by_weight, stride=2)
            add("transpose", nd, "Cout0", (2, 4, *s), (4, 0, *k), by_weight, padding=1)
        add("depthwise", nd, "N0", (0, 3, *s), (6, 1, *k), padding=1)
        add("depthwise", nd, "plane0", (2, 3, *plane0), (3, 1, *k1), padding=1)
        add("patch", nd, "lead0", (2, 0, 4, *s), (6, 2, *k), padding=1, groups=2)
        add("patch", nd, "C0", (2, 3, 0, *s), (3, 0, *k), padding=1)
        add("patch", nd, "D0", (2, 3, 4, *s), (0, 4, *k))
        add("patch", nd, "plane0", (3, 2, *plane0), (4, 2, *k1), padding=1)
    return problems


PROBLEMS = _problems()


def inputs(problem: Problem, seed=0):
    """Fresh random x, weight, bias and grad_output (the empty ones have no values to draw)."""
    rng = numpy.random.default_rng(seed)
    return (ref.random(rng, problem.x, DTYPE), ref.random(rng, problem.weight, DTYPE),
            ref.random(rng, (problem.out_channels,), DTYPE), ref.random(rng, problem.output_shape, DTYPE))


def expected(problem: Problem, bias, grad_output):
    """The definitions' values: y = bias broadcast, grad_x = 0, grad_weight = 0, grad_bias = grad_output summed
    over all but the channel axis."""
    axis = problem.channel_axis
    y = numpy.zeros(problem.output_shape) + numpy.expand_dims(bias.astype(numpy.float64), tuple(range(axis + 1, 0)))
    grad_b = grad_output.astype(numpy.float64).sum(axis=tuple(a for a in range(-grad_output.ndim, 0) if a != axis))
    return y, (numpy.zeros(problem.x), numpy.zeros(problem.weight), grad_b)


def paths(algorithms):
    """(name, device, algorithm keyword) of the CPU path and of the emulated kernel path with each algorithm."""
    yield "cpu", None, {}
    for algorithm in algorithms or (None,):
        yield f"emulated-{algorithm}", EmulatedDevice(), {} if algorithm is None else {"algorithm": algorithm}


def on(device, fn, *args, **kwargs):
    if device is None:
        return fn(*args, **kwargs)
    with _device.use_device(device):
        return fn(*args, **kwargs)


def check(got, want, what):
    assert isinstance(got, numpy.ndarray) and got.dtype == DTYPE, f"{what}: {type(got)} {getattr(got, 'dtype', '')}"
    ref.assert_close(got, want, "float32", what)


@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_conv_ops_agree_on_empty_problems(problem):
    forward, backward, algorithms = problem.ops
    x, w, b, gy = inputs(problem)
    want_y, want_grads = expected(problem, b, gy)
    for path, device, algorithm in paths(algorithms):
        check(on(device, forward, x, w, b, **problem.kwargs, **algorithm), want_y, f"{problem} {path}: y")
        for needs in NEEDS_CHOICES:
            grads = on(device, backward, gy, x, w, needs=needs, **problem.kwargs, **algorithm)
            for name, got, want in zip(NEEDS, grads, want_grads):
                if name in needs:
                    check(got, want, f"{problem} {path} needs={needs}: grad_{name}")
                else:
                    assert got is None, f"{problem} {path} needs={needs}: grad_{name}"


# ---------------------------------------------------------------------------------------------------------
# unfold and fold (and their backward, the other one): N = 0, C = 0, a zero leading dim


WINDOW_PROBLEMS = [(nd, what, lead, c) for nd in (1, 2, 3)
                   for what, lead, c in (("N0", (0,), 2), ("C0", (2,), 0), ("lead0", (2, 0), 3), ("plane0", (2,), 3))]


@pytest.mark.parametrize("nd, what, lead, c", WINDOW_PROBLEMS, ids=[f"{nd}d-{w}" for nd, w, _, _ in WINDOW_PROBLEMS])
def test_unfold_and_fold_agree_on_empty_problems(nd, what, lead, c):
    size, kernel = SPATIAL[nd], KERNEL[nd]
    if what == "plane0":
        size, kernel = (0, *size[1:]), (1, *kernel[1:])
    blocks = numpy.prod([n + 2 - k + 1 for n, k in zip(size, kernel)])   # padding 1, stride 1
    rng = numpy.random.default_rng(1)
    x = ref.random(rng, (*lead, c, *size), DTYPE)
    cols = ref.random(rng, (*lead, c * numpy.prod(kernel), blocks), DTYPE)
    for path, device, _ in paths(None):
        calls = {"unfold": on(device, cc.unfold, x, kernel, padding=1),
                 "fold_backward": on(device, cc.fold_backward, x, kernel, padding=1),
                 "fold": on(device, cc.fold, cols, size, kernel, padding=1),
                 "unfold_backward": on(device, cc.unfold_backward, cols, size, kernel, padding=1)}
        for name, got in calls.items():
            want = cols if name in ("unfold", "fold_backward") else x
            check(got, numpy.zeros(want.shape), f"{nd}d-{what} {path}: {name}")
    if nd == 2 and what in ("N0", "lead0"):   # the oracle against the naive loops (which reshape by C * H * W)
        ref.assert_close(ref.unfold(x, kernel, padding=1), numpy.zeros(cols.shape))
        ref.assert_close(ref.fold(cols, size, kernel, padding=1), numpy.zeros(x.shape))


# ---------------------------------------------------------------------------------------------------------
# The oracle against independent references


@pytest.mark.parametrize("problem", [p for p in PROBLEMS if p.nd == 2 and p.family != "transpose"], ids=str)
def test_oracle_matches_the_naive_loops(problem):
    x, w, b, gy = inputs(problem)
    fn, grads_fn = {"conv": (ref.conv2d, ref.conv2d_grads), "patch": (ref.patch_conv2d, ref.patch_conv2d_grads),
                    "depthwise": (ref.depthwise_conv2d, ref.depthwise_conv2d_grads)}[problem.family]
    want_y, want_grads = expected(problem, b, gy)
    ref.assert_close(fn(x, w, b, **problem.kwargs), want_y)
    for got, want in zip(grads_fn(gy, x, w, **problem.kwargs), want_grads):
        ref.assert_close(got, want)


@pytest.mark.parametrize("problem", [p for p in PROBLEMS if p.what == "N0" and not p.by_weight], ids=str)
def test_oracle_matches_torch_for_an_empty_batch(problem):
    torch = pytest.importorskip("torch")
    fn = {("conv", 1): torch.nn.functional.conv1d, ("conv", 2): torch.nn.functional.conv2d,
          ("conv", 3): torch.nn.functional.conv3d, ("transpose", 1): torch.nn.functional.conv_transpose1d,
          ("transpose", 2): torch.nn.functional.conv_transpose2d,
          ("transpose", 3): torch.nn.functional.conv_transpose3d}.get((problem.family, problem.nd))
    kwargs = dict(problem.kwargs)
    if problem.family == "depthwise":
        fn, kwargs["groups"] = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d,
                                3: torch.nn.functional.conv3d}[problem.nd], problem.x[1]
    x, w, b, gy = (torch.tensor(a.astype(numpy.float64), requires_grad=True) for a in inputs(problem))
    y = fn(x, w, b, **kwargs)
    y.backward(gy)
    want_y, want_grads = expected(problem, b.detach().numpy(), gy.detach().numpy())
    ref.assert_close(y.detach(), want_y)
    for got, want in zip((x.grad, w.grad, b.grad), want_grads):
        ref.assert_close(got, want)


def test_torch_module_with_zero_output_channels():
    """cupyconv.torch.Conv2d(4, 0, 3) on the CPU: an empty output and empty parameter gradients, as on the GPU
    path (it raised NumPy's 'cannot reshape array of size 0' before)."""
    torch = pytest.importorskip("torch")
    import cupyconv.torch as ct
    with warnings.catch_warnings():   # torch's initialisers warn that a zero-element weight has nothing to set
        warnings.simplefilter("ignore")
        layer = ct.Conv2d(4, 0, 3)
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    y = layer(x)
    assert y.shape == (2, 0, 6, 6)
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x)) and layer.weight.grad.shape == (0, 4, 3, 3)
