"""Benchmark cases as data, and the contenders that run them.

A `Case` is one problem (op, shape, dtype, device).  Every case is timed for the forward pass and for forward +
backward, and for each pass every contender that applies to the op and device runs the same inputs: cupyconv
and the alternatives a user would otherwise pick.  The first alternative listed for an op is its baseline,
the one the case's target ratio (cupyconv time / baseline time) refers to.

To add GPU cases, append `Case(..., device="gpu", dtype="float16")` entries to CASES: the contenders below
already handle CuPy arrays and torch CUDA tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy


@dataclass(frozen=True)
class Case:
    label: str            # short id used on the command line (--cases) and in RESULTS.md
    op: str               # "conv2d" | "depthwise" | "patch" | "unfold"
    dims: dict            # named sizes: N, C, D, H, W, k, p, (stride s, groups g, multiplier m, patch B)
    device: str = "cpu"   # "cpu" | "gpu"
    dtype: str = "float32"
    target: float | None = None   # cupyconv / baseline time ratio to reach (forward and forward + backward)
    note: str = ""

    @property
    def name(self) -> str:
        d = self.dims
        if self.op == "patch":
            shape = f"B{d['B']} N{d['N']} C{d['C']} D{d['D']} {d['H']}x{d['W']}"
        elif self.op == "unfold":
            shape = f"N{d['N']} C{d['C']} {d['H']}x{d['W']}"
        elif self.op == "depthwise":
            shape = f"N{d['N']} C{d['C']} m{d.get('m', 1)} {d['H']}x{d['W']}"
        else:
            shape = f"N{d['N']} C{d['C']} D{d['D']} g{d.get('g', 1)} {d['H']}x{d['W']}"
        return f"{self.op} {shape} k{d['k']} p{d['p']} s{d.get('s', 1)} {self.dtype} {self.device}"


def _cpu_and_gpu(label, op, dims, target):
    return [
        Case(label, op, dims, "cpu", "float32", target),
        Case(f"{label}-gpu32", op, dims, "gpu", "float32", None, "TF32 off: strict fp32"),
        Case(f"{label}-gpu16", op, dims, "gpu", "float16", None),
    ]


PATCH_I = dict(B=1, N=2048, C=32, D=64, H=4, W=4, k=3, p=1)
CONV_II = dict(N=8, C=64, D=64, H=56, W=56, k=3, p=1)
DEPTHWISE_III = dict(N=8, C=64, m=1, H=56, W=56, k=3, p=1)
UNFOLD_IV = dict(N=8, C=64, H=56, W=56, k=3, p=1)

CASES: list[Case] = [
    *_cpu_and_gpu("i", "patch", PATCH_I, 1.5),
    *_cpu_and_gpu("ii", "conv2d", CONV_II, 3.0),
    *_cpu_and_gpu("iii", "depthwise", DEPTHWISE_III, 10.0),
    *_cpu_and_gpu("iv", "unfold", UNFOLD_IV, 1.0),
]


# conv2d on the GPU (issue 4), N = 32, 3x3 pad 1, strict fp32 (TF32 off on both sides) and fp16: ResNet-50's 3x3
# layers, ResNeXt-50 32x4d's grouped 3x3 layers (groups 32: 4, 8, 16, 32 channels per group), and groups 2, 8 and
# C/4 at 256 channels 28x28.  Targets against cuDNN (torch F.conv2d, cudnn.benchmark): groups >= 8 at most 1.0x,
# dense (and groups 2) at most 1.3x.
def _gpu_conv(label, C, H, g, target):
    dims = dict(N=32, C=C, D=C, H=H, W=H, k=3, p=1, g=g)
    return [Case(f"{label}-gpu32", "conv2d", dims, "gpu", "float32", target, "TF32 off: strict fp32"),
            Case(f"{label}-gpu16", "conv2d", dims, "gpu", "float16", target)]


CASES += [
    *_gpu_conv("r50-64", 64, 56, 1, 1.3), *_gpu_conv("r50-128", 128, 28, 1, 1.3),
    *_gpu_conv("r50-256", 256, 14, 1, 1.3), *_gpu_conv("r50-512", 512, 7, 1, 1.3),
    *_gpu_conv("rx-128", 128, 56, 32, 1.0), *_gpu_conv("rx-256", 256, 28, 32, 1.0),
    *_gpu_conv("rx-512", 512, 14, 32, 1.0), *_gpu_conv("rx-1024", 1024, 7, 32, 1.0),
    *_gpu_conv("g2-256", 256, 28, 2, 1.3), *_gpu_conv("g8-256", 256, 28, 8, 1.0),
    *_gpu_conv("g64-256", 256, 28, 64, 1.0),
]

# depthwise on the GPU (issue 6), NCHW, strict fp32 and fp16, 'same'-style padding (k - 1) // 2: the MobileNetV2 /
# EfficientNet-B0 depthwise layers at N = 64, C = 256 56x56, a 31x31 kernel (RepLKNet-style) and the tiny-plane
# case N = 2048 C = 1024 4x4 k4 (padding 1: 3x3 outputs).  Target against torch F.conv2d(groups=C) with
# cudnn.benchmark: at most 1 / 1.2 of its time, forward and forward + backward.  (The issue also asks for the
# input and weight gradients separately, >= 2x on the tiny-plane weight gradient and >= 70% of the copy bandwidth
# at 56x56; this harness times forward and forward + backward only.)
def _gpu_depthwise(label, N, C, H, k, s=1, target=1 / 1.2):
    dims = dict(N=N, C=C, m=1, H=H, W=H, k=k, p=(k - 1) // 2, s=s)
    return [Case(f"{label}-gpu32", "depthwise", dims, "gpu", "float32", target, "TF32 off: strict fp32"),
            Case(f"{label}-gpu16", "depthwise", dims, "gpu", "float16", target)]


CASES += [
    *_gpu_depthwise("dw-32-112", 64, 32, 112, 3), *_gpu_depthwise("dw-96-112s2", 64, 96, 112, 3, s=2),
    *_gpu_depthwise("dw-144-56", 64, 144, 56, 3), *_gpu_depthwise("dw-240-28k5", 64, 240, 28, 5),
    *_gpu_depthwise("dw-480-14", 64, 480, 14, 3), *_gpu_depthwise("dw-480-14k5", 64, 480, 14, 5),
    *_gpu_depthwise("dw-672-14k5", 64, 672, 14, 5), *_gpu_depthwise("dw-1152-7k5", 64, 1152, 7, 5),
    *_gpu_depthwise("dw-256-56", 64, 256, 56, 3), *_gpu_depthwise("dw-384-14k31", 32, 384, 14, 31),
    *_gpu_depthwise("dw-tiny-4x4k4", 2048, 1024, 4, 4),
]

# patch_conv2d on the GPU (issue 5): B = 1, C = 32, D = 64, 3x3 pad 1 over the seed shape N = 20480 4x4, the same with
# 8x8 patches, and N = 1280 4x4; strict fp32 (TF32 off on both sides) and fp16.  Targets against the best torch
# alternative (F.conv2d on the rolled batch with cudnn.benchmark, unfold+matmul+fold): forward at most 1 / 1.3 of its
# time, forward + backward at most 1.0x (the harness checks the first); strict-fp32 forward within 2x of the FP32
# FMA roofline (seed shape: 12.1 GFLOP, 180 us on an H100).  The issue also compares with our own im2col path
# (patch_conv2d(..., algorithm="im2col_gemm")), which needs a contender of its own.
def _gpu_patch(label, N, H):
    dims = dict(B=1, N=N, C=32, D=64, H=H, W=H, k=3, p=1)
    note = "forward target; forward + backward: 1.0x"
    return [Case(f"{label}-gpu32", "patch", dims, "gpu", "float32", 1 / 1.3, f"TF32 off: strict fp32; {note}"),
            Case(f"{label}-gpu16", "patch", dims, "gpu", "float16", 1 / 1.3, note)]


CASES += [*_gpu_patch("p-seed", 20480, 4), *_gpu_patch("p-8x8", 20480, 8), *_gpu_patch("p-1280", 1280, 4)]

# Tiny versions of every case for `--smoke` (CI checks that the harness runs, not how fast anything is).
SMOKE_DIMS = {
    "patch": dict(B=2, N=8, C=4, D=6, H=4, W=4, k=3, p=1),
    "conv2d": dict(N=2, C=4, D=6, H=9, W=9, k=3, p=1),
    "depthwise": dict(N=2, C=4, m=2, H=9, W=9, k=3, p=1),
    "unfold": dict(N=2, C=4, H=9, W=9, k=3, p=1),
}


def smoke(case: Case) -> Case:
    return Case(case.label, case.op, SMOKE_DIMS[case.op], case.device, case.dtype, None, "smoke: no target")


# ---------------------------------------------------------------------------------------------------------
# Inputs


def out_size(d: dict) -> tuple[int, int]:
    s = d.get("s", 1)
    return ((d["H"] + 2 * d["p"] - d["k"]) // s + 1, (d["W"] + 2 * d["p"] - d["k"]) // s + 1)


def make_inputs(case: Case, seed: int = 0) -> dict:
    """NumPy inputs of the case in its dtype: x, weight w, bias b, and gy, a gradient of the forward output."""
    d, rng = case.dims, numpy.random.default_rng(seed)
    oh, ow = out_size(d)
    k = d["k"]
    if case.op == "patch":
        x = (d["B"], d["N"], d["C"], d["H"], d["W"])
        w, b, y = (d["D"], d["C"] // d.get("g", 1), k, k), (d["D"],), (d["B"], d["N"], d["D"], oh, ow)
    elif case.op == "conv2d":
        x = (d["N"], d["C"], d["H"], d["W"])
        w, b, y = (d["D"], d["C"] // d.get("g", 1), k, k), (d["D"],), (d["N"], d["D"], oh, ow)
    elif case.op == "depthwise":
        cm = d["C"] * d.get("m", 1)
        x = (d["N"], d["C"], d["H"], d["W"])
        w, b, y = (cm, 1, k, k), (cm,), (d["N"], cm, oh, ow)
    elif case.op == "unfold":
        x = (d["N"], d["C"], d["H"], d["W"])
        w = b = None
        y = (d["N"], d["C"] * k * k, oh * ow)
    else:
        raise ValueError(f"unknown op {case.op!r}")

    def draw(shape, scale=1.0):
        return None if shape is None else (rng.standard_normal(shape, dtype=numpy.float32) * scale)

    fan_in = (d["C"] // d.get("g", 1) if case.op in ("conv2d", "patch") else 1) * k * k
    arrays = {"x": draw(x), "w": draw(w, fan_in ** -0.5), "b": draw(b, 0.1), "gy": draw(y)}
    return {name: None if a is None else a.astype(case.dtype) for name, a in arrays.items()}


# ---------------------------------------------------------------------------------------------------------
# Contenders: build(case, inputs, backward) -> a function of no arguments returning its outputs (a tuple)


@dataclass(frozen=True)
class Contender:
    name: str
    ops: tuple            # ops it runs
    devices: tuple        # "cpu", "gpu"
    library: str          # whose current stream it launches on (GPU timing): "cupy" or "torch"
    build: object = field(repr=False)
    ours: bool = False    # a cupyconv contender (the numerator of the ratios)


def _to_torch(a, device: str):
    import torch
    if a is None:
        return None
    t = torch.from_numpy(numpy.ascontiguousarray(a))
    return t.to("cuda") if device == "gpu" else t


def _to_cupy(a):
    import cupy
    return None if a is None else cupy.asarray(a)


def _cupyconv_call(case: Case, a: dict, backward: bool):
    """The cupyconv calls of a case on arrays a (NumPy, CuPy or torch), as a function of no arguments."""
    import cupyconv as cc
    d = case.dims
    k, p, s = d["k"], d["p"], d.get("s", 1)
    x, w, b, gy = a["x"], a["w"], a["b"], a["gy"]
    if case.op == "unfold":
        size = (d["H"], d["W"])

        def run():
            cols = cc.unfold(x, k, padding=p, stride=s)
            if not backward:
                return (cols,)
            return cols, cc.unfold_backward(gy, size, k, padding=p, stride=s)
        return run
    if case.op == "depthwise":
        fwd, bwd, extra = cc.depthwise_conv2d, cc.depthwise_conv2d_backward, {}
    elif case.op == "patch":
        fwd, bwd, extra = cc.patch_conv2d, cc.patch_conv2d_backward, {"groups": d.get("g", 1)}
    else:
        fwd, bwd, extra = cc.conv2d, cc.conv2d_backward, {"groups": d.get("g", 1)}

    def run():
        y = fwd(x, w, b, stride=s, padding=p, **extra)
        if not backward:
            return (y,)
        return (y, *bwd(gy, x, w, stride=s, padding=p, **extra))
    return run


def build_cupyconv(case: Case, inputs: dict, backward: bool):
    arrays = inputs if case.device == "cpu" else {n: _to_cupy(a) for n, a in inputs.items()}
    return _cupyconv_call(case, arrays, backward)


def build_cupyconv_torch(case: Case, inputs: dict, backward: bool):
    """What a torch user runs: cupyconv.torch's functional ops on torch tensors, gradients by torch.autograd
    (which calls cupyconv's manual backward); CUDA work goes to torch's current stream and allocator."""
    import cupyconv.torch as cct
    d = case.dims
    k, p, s = d["k"], d["p"], d.get("s", 1)
    t = _torch_leaves(case, inputs, backward)

    def forward(t):
        if case.op == "unfold":
            return cct.unfold(t["x"], k, padding=p, stride=s)
        if case.op == "depthwise":
            return cct.depthwise_conv2d(t["x"], t["w"], t["b"], stride=s, padding=p)
        op = cct.patch_conv2d if case.op == "patch" else cct.conv2d
        return op(t["x"], t["w"], t["b"], stride=s, padding=p, groups=d.get("g", 1))
    return _torch_autograd(forward, t, backward)


def _torch_leaves(case: Case, inputs: dict, backward: bool):
    t = {n: _to_torch(a, case.device) for n, a in inputs.items()}
    for name in ("x", "w", "b"):
        if t[name] is not None and backward:
            t[name].requires_grad_(True)
    return t


def _torch_autograd(forward, t: dict, backward: bool):
    """Run forward(t) and, for backward, torch.autograd.grad of its output against gy for x, w, b."""
    import torch
    leaves = [t[n] for n in ("x", "w", "b") if t[n] is not None]

    def run():
        if not backward:
            with torch.no_grad():
                return (forward(t),)
        y = forward(t)
        return (y.detach(), *torch.autograd.grad(y, leaves, t["gy"]))
    return run


def build_torch_conv(case: Case, inputs: dict, backward: bool):
    """torch.nn.functional.conv2d (depthwise: groups = C); patches rolled into the batch dim; F.unfold."""
    import torch.nn.functional as F
    d = case.dims
    k, p, s = d["k"], d["p"], d.get("s", 1)
    t = _torch_leaves(case, inputs, backward)
    if case.op == "unfold":
        return _torch_autograd(lambda t: F.unfold(t["x"], k, padding=p, stride=s), t, backward)
    groups = d["C"] if case.op == "depthwise" else d.get("g", 1)

    def forward(t):
        x = t["x"]
        if case.op == "patch":
            y = F.conv2d(x.reshape(-1, *x.shape[-3:]), t["w"], t["b"], stride=s, padding=p, groups=groups)
            return y.reshape(*x.shape[:-3], *y.shape[1:])
        return F.conv2d(x, t["w"], t["b"], stride=s, padding=p, groups=groups)
    return _torch_autograd(forward, t, backward)


def build_torch_unfold_matmul(case: Case, inputs: dict, backward: bool):
    """F.unfold + matmul (depthwise: + a per-channel einsum); autograd's backward is a matmul + F.fold."""
    import torch
    import torch.nn.functional as F
    d = case.dims
    k, p, s = d["k"], d["p"], d.get("s", 1)
    oh, ow = out_size(d)
    t = _torch_leaves(case, inputs, backward)

    def forward(t):
        x, w, b = t["x"], t["w"], t["b"]
        lead = x.shape[:-3]
        xf = x.reshape(-1, *x.shape[-3:])
        n, c = xf.shape[:2]
        cols = F.unfold(xf, k, padding=p, stride=s)                      # (n, C*k*k, L)
        if case.op == "depthwise":
            m = w.shape[0] // c
            cols = cols.reshape(n, c, k * k, oh * ow)
            y = torch.einsum("nctl,cmt->ncml", cols, w.reshape(c, m, k * k)).reshape(n, c * m, oh * ow)
        else:
            g = d.get("g", 1)
            cols = cols.reshape(n, g, c // g * k * k, oh * ow)
            y = torch.matmul(w.reshape(g, w.shape[0] // g, -1), cols).reshape(n, w.shape[0], oh * ow)
        y = y + b[:, None]
        return y.reshape(*lead, -1, oh, ow)
    return _torch_autograd(forward, t, backward)


CONTENDERS = [
    Contender("cupyconv", ("patch", "conv2d", "depthwise", "unfold"), ("cpu", "gpu"), "cupy", build_cupyconv,
              ours=True),
    Contender("cupyconv.torch (autograd)", ("patch", "conv2d", "depthwise", "unfold"), ("gpu",), "torch",
              build_cupyconv_torch, ours=True),
    # The first non-cupyconv contender of an op is its baseline (the target ratio refers to it).
    Contender("torch F.conv2d", ("conv2d", "depthwise"), ("cpu", "gpu"), "torch", build_torch_conv),
    Contender("torch F.conv2d, patches rolled into batch", ("patch",), ("cpu", "gpu"), "torch", build_torch_conv),
    Contender("torch F.unfold", ("unfold",), ("cpu", "gpu"), "torch", build_torch_conv),
    Contender("torch unfold+matmul+fold", ("patch", "conv2d", "depthwise"), ("cpu", "gpu"), "torch",
              build_torch_unfold_matmul),
]


def contenders_for(case: Case) -> list[Contender]:
    return [c for c in CONTENDERS if case.op in c.ops and case.device in c.devices]


def baseline_for(case: Case) -> Contender:
    return next(c for c in contenders_for(case) if not c.ours)


def to_numpy(a):
    """A float64 NumPy copy of a NumPy/CuPy array or torch tensor, for the correctness check."""
    if a is None:
        return None
    if type(a).__module__.startswith("torch"):
        return a.detach().float().cpu().numpy().astype(numpy.float64)
    if type(a).__module__.startswith("cupy"):
        a = a.get()
    return numpy.asarray(a, dtype=numpy.float64)
