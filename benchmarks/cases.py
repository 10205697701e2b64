"""Benchmark cases as data, and the contenders that run them.

A `Case` is one problem (op, shape, dtype, device).  Every case is timed for the forward pass and for forward +
backward, and for each pass every contender that applies to the op and device runs the same inputs: cupyconv
and the alternatives a user would otherwise pick.  The first alternative listed for an op is its baseline,
the one the case's target ratio (cupyconv time / baseline time) refers to.

To add GPU cases, append `Case(..., device="gpu", dtype="float16")` entries to CASES: the contenders below
already handle CuPy arrays and torch CUDA tensors (float16, bfloat16 through ml_dtypes, float32 strict or as TF32
with `tf32=True`).  The 1-D, 3-D and transposed convolutions (ND_OPS) are in ND_CASES; `ALL_CASES` is both lists,
and everything that selects, lists or checks cases uses it.

Each case also has a roofline (`roofline`): its FLOPs (2 * images * D * oH * oW * C/G * kH * kW for the forward,
3x that for forward + backward; the same product over 1 or 3 spatial dims, and over the input pixels for a
transposed convolution) and the bytes of its floor (every input, weight and output read or written once); run.py
divides them by the GEMM peak and copy bandwidth it measures in the same process.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy


@dataclass(frozen=True)
class Case:
    label: str            # short id used on the command line (--cases) and in RESULTS.md
    op: str               # "conv2d" | "depthwise" | "patch" | "unfold" | one of ND_OPS
    dims: dict            # named sizes: N, C, D, H, W, k, p, (stride s, groups g, multiplier m, patch B);
                          # conv1d: L instead of H, W; conv3d: T (depth), H, W; conv_transpose2d: H, W are the
                          # input's (the output is (H - 1) s - 2 p + k)
    device: str = "cpu"   # "cpu" | "gpu"
    dtype: str = "float32"   # "float16" | "bfloat16" | "float32" | "float64"
    target: float | None = None   # cupyconv / alternative time ratio to reach (forward; also forward + backward
                                  # unless target_bwd is given)
    note: str = ""
    tf32: bool = False    # float32 with TF32 allowed on both sides: cupyconv.settings.allow_tf32,
                          # torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32 (run.py
                          # turns them on for this case only and back to strict fp32 after)
    target_bwd: float | None = None   # the forward + backward target where it differs from the forward's
    target_vs: str = "baseline"       # what the target ratio divides by: "baseline" (the op's first alternative)
                                      # or "best" (the fastest alternative of the same run)
    tags: tuple = ()      # group names --cases also accepts (e.g. "issue11")

    def __post_init__(self):
        if self.tf32 and self.dtype != "float32":
            raise ValueError(f"case {self.label}: tf32 applies to float32 only, not {self.dtype}")
        if self.target_vs not in ("baseline", "best"):
            raise ValueError(f"case {self.label}: target_vs must be 'baseline' or 'best'")

    @property
    def precision(self) -> str:
        """The dtype, with "+tf32" where float32 may run on TF32 tensor cores."""
        return f"{self.dtype}+tf32" if self.tf32 else self.dtype

    @property
    def tensor_cores(self) -> bool:
        """A case whose convolutions may run on tensor cores (float16, bfloat16, TF32)."""
        return self.dtype in ("float16", "bfloat16") or self.tf32

    def target_for(self, backward: bool) -> float | None:
        return self.target_bwd if backward and self.target_bwd is not None else self.target

    @property
    def name(self) -> str:
        d = self.dims
        if self.op == "patch":
            shape = f"B{d['B']} N{d['N']} C{d['C']} D{d['D']} {d['H']}x{d['W']}"
        elif self.op == "unfold":
            shape = f"N{d['N']} C{d['C']} {d['H']}x{d['W']}"
        elif self.op == "depthwise":
            shape = f"N{d['N']} C{d['C']} m{d.get('m', 1)} {d['H']}x{d['W']}"
        elif self.op in ND_OPS:
            shape = f"N{d['N']} C{d['C']} D{d['D']} g{d.get('g', 1)} " + "x".join(map(str, in_sizes(self.op, d)))
            if self.op in TRANSPOSED_OPS:
                shape += "->" + "x".join(map(str, out_sizes(self.op, d)))
        else:
            shape = f"N{d['N']} C{d['C']} D{d['D']} g{d.get('g', 1)} {d['H']}x{d['W']}"
        return f"{self.op} {shape} k{d['k']} p{d['p']} s{d.get('s', 1)} {self.precision} {self.device}"


STRICT = "TF32 off: strict fp32"
TF32 = "TF32 on in cupyconv and torch (cudnn and cuda.matmul)"


def _cpu_and_gpu(label, op, dims, target):
    return [
        Case(label, op, dims, "cpu", "float32", target),
        Case(f"{label}-gpu32", op, dims, "gpu", "float32", None, STRICT),
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
#
# Tensor cores (issue 11): the layers marked tc=True also get bfloat16 (same target as float16: issue 11 asks
# <= 1.3x cuDNN for fp16/bf16, the stricter issue-4 target stays where it was) and TF32 cases (float32 with TF32
# allowed on both sides; no ratio target stated), tagged "issue11".  ResNet-50's four 3x3 layers, and of the
# ResNeXt layers rx-512 (16 channels per group): rx-128 and rx-256 have 4 and 8 channels per group, under
# cupyconv's tensor-core minimum of 16 (ops/conv.py TC_MIN_CHANNELS), so 'auto' never runs the tensor-core kernel
# on them.  Every fp16/bf16/TF32 case is also timed against cuDNN on channels_last tensors.
def _gpu_conv(label, C, H, g, target, tc=False):
    dims = dict(N=32, C=C, D=C, H=H, W=H, k=3, p=1, g=g)
    tags = ("issue11",) if tc else ()
    cases = [Case(f"{label}-gpu32", "conv2d", dims, "gpu", "float32", target, STRICT),
             Case(f"{label}-gpu16", "conv2d", dims, "gpu", "float16", target, tags=tags)]
    if tc:
        cases += [Case(f"{label}-gpubf16", "conv2d", dims, "gpu", "bfloat16", target, tags=tags),
                  Case(f"{label}-gputf32", "conv2d", dims, "gpu", "float32", None, TF32, tf32=True, tags=tags)]
    return cases


CASES += [
    *_gpu_conv("r50-64", 64, 56, 1, 1.3, tc=True), *_gpu_conv("r50-128", 128, 28, 1, 1.3, tc=True),
    *_gpu_conv("r50-256", 256, 14, 1, 1.3, tc=True), *_gpu_conv("r50-512", 512, 7, 1, 1.3, tc=True),
    *_gpu_conv("rx-128", 128, 56, 32, 1.0), *_gpu_conv("rx-256", 256, 28, 32, 1.0),
    *_gpu_conv("rx-512", 512, 14, 32, 1.0, tc=True), *_gpu_conv("rx-1024", 1024, 7, 32, 1.0),
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
# alternative (the fastest of F.conv2d on the rolled batch with cudnn.benchmark, NCHW or channels_last, and
# unfold+matmul+fold): forward at most 1 / 1.3 of its time, forward + backward at most 1.0x; strict-fp32 forward
# within 2x of the FP32 FMA roofline (seed shape: 12.1 GFLOP, 180 us on an H100).  The issue also compares with our
# own im2col path (patch_conv2d(..., algorithm="im2col_gemm")), which needs a contender of its own.
#
# Tensor cores (issue 11), p-seed and p-8x8 (tagged "issue11"): float16 and bfloat16, forward at most 0.8x the best
# alternative (issue 11) -- float16 keeps issue 5's stricter 1 / 1.3 = 0.77x -- and forward + backward at most 1.0x;
# TF32 (no ratio target stated).
def _gpu_patch(label, N, H, tc=False):
    dims = dict(B=1, N=N, C=32, D=64, H=H, W=H, k=3, p=1)
    note = "targets vs the best alternative"
    tags = ("issue11",) if tc else ()
    half = dict(target_bwd=1.0, target_vs="best", tags=tags)
    cases = [Case(f"{label}-gpu32", "patch", dims, "gpu", "float32", 1 / 1.3, f"{STRICT}; {note}", target_bwd=1.0,
                  target_vs="best"),
             Case(f"{label}-gpu16", "patch", dims, "gpu", "float16", 1 / 1.3, note, **half)]
    if tc:
        cases += [Case(f"{label}-gpubf16", "patch", dims, "gpu", "bfloat16", 0.8, note, **half),
                  Case(f"{label}-gputf32", "patch", dims, "gpu", "float32", None, TF32, tf32=True, tags=tags)]
    return cases


CASES += [*_gpu_patch("p-seed", 20480, 4, tc=True), *_gpu_patch("p-8x8", 20480, 8, tc=True),
          *_gpu_patch("p-1280", 1280, 4)]

# 1-D, 3-D and transposed 2-D convolutions on the GPU (issue 13), tagged "issue13" (`--cases issue13`), strict
# fp32 (TF32 off on both sides) and fp16, against torch F.conv1d / F.conv3d / F.conv_transpose2d (cuDNN with
# cudnn.benchmark) in the same run; the fp16 conv3d and conv_transpose2d cases are also timed against cuDNN on
# channels_last tensors.  No ratio target is stated for them: the figures are what is owed.
#   c1d-audio   audio-like long sequences: N = 8, 256 -> 256 channels, L = 16384, k 3 pad 1
#   c3d-video   video clips: N = 2, 64 -> 64 channels, 16 frames of 56x56, k 3 pad 1
#   c3d-mri     MRI-like volumes: N = 2, 64 -> 64 channels, 32x64x64, k 3 pad 1
#   ct2d-k4s2   decoder upsampling (DCGAN-style): N = 8, 256 -> 128 channels, 28x28 -> 56x56, k 4 stride 2 pad 1
#   ct2d-k2s2   decoder upsampling (U-Net-style): N = 8, 256 -> 128 channels, 28x28 -> 56x56, k 2 stride 2
# They are kept out of CASES: tests/test_sass.py records the launches of CASES' GPU problems through the 2-D ops
# only (its OPS table), so it would fail on these; ALL_CASES holds both lists.
ND_OPS = ("conv1d", "conv3d", "conv_transpose2d")
TRANSPOSED_OPS = ("conv_transpose2d",)


def _gpu_nd(label, op, dims):
    tags = ("issue13",)
    return [Case(f"{label}-gpu32", op, dims, "gpu", "float32", None, STRICT, tags=tags),
            Case(f"{label}-gpu16", op, dims, "gpu", "float16", None, tags=tags)]


ND_CASES: list[Case] = [
    *_gpu_nd("c1d-audio", "conv1d", dict(N=8, C=256, D=256, L=16384, k=3, p=1)),
    *_gpu_nd("c3d-video", "conv3d", dict(N=2, C=64, D=64, T=16, H=56, W=56, k=3, p=1)),
    *_gpu_nd("c3d-mri", "conv3d", dict(N=2, C=64, D=64, T=32, H=64, W=64, k=3, p=1)),
    *_gpu_nd("ct2d-k4s2", "conv_transpose2d", dict(N=8, C=256, D=128, H=28, W=28, k=4, p=1, s=2)),
    *_gpu_nd("ct2d-k2s2", "conv_transpose2d", dict(N=8, C=256, D=128, H=28, W=28, k=2, p=0, s=2)),
]
ALL_CASES: list[Case] = CASES + ND_CASES

# Issue 11's compute-bound target: cupyconv at >= this fraction of the GEMM peak measured in the same process, on
# tensor-core cases (float16, bfloat16, TF32) of conv2d and patch whose FLOP floor is above their byte floor.
PEAK_TARGET = 0.5
PEAK_TARGET_OPS = ("conv2d", "patch")

# Tiny versions of every case for `--smoke` (CI checks that the harness runs, not how fast anything is).
SMOKE_DIMS = {
    "patch": dict(B=2, N=8, C=4, D=6, H=4, W=4, k=3, p=1),
    "conv2d": dict(N=2, C=4, D=6, H=9, W=9, k=3, p=1),
    "depthwise": dict(N=2, C=4, m=2, H=9, W=9, k=3, p=1),
    "unfold": dict(N=2, C=4, H=9, W=9, k=3, p=1),
    "conv1d": dict(N=2, C=4, D=6, L=17, k=3, p=1),
    "conv3d": dict(N=2, C=4, D=6, T=5, H=6, W=7, k=3, p=1),
    "conv_transpose2d": dict(N=2, C=4, D=6, H=5, W=6, k=4, p=1, s=2),
}


def smoke(case: Case) -> Case:
    return Case(case.label, case.op, SMOKE_DIMS[case.op], case.device, case.dtype, None, "smoke: no target",
                tf32=case.tf32, tags=case.tags)


# GPU cases whose smoke versions `--device cpu --smoke` also runs on the CPU (NumPy and torch CPU): the bfloat16
# inputs, the TF32 switching and the channels_last contender get exercised where CI has no GPU, and each N-d op's
# calls, in float16.
SMOKE_ON_CPU = ("p-seed-gpubf16", "r50-64-gpubf16", "r50-64-gputf32", "c1d-audio-gpu16", "c3d-video-gpu16",
                "ct2d-k4s2-gpu16")


def smoke_on_cpu(case: Case) -> Case:
    return Case(f"{case.label}@cpu", case.op, SMOKE_DIMS[case.op], "cpu", case.dtype, None,
                "smoke: a GPU case's dtype and switches on the CPU, no target", tf32=case.tf32, tags=case.tags)


def select(labels, devices: tuple) -> list[Case]:
    """The cases on these devices whose label or one of whose tags is in labels (all of them, in table order, when
    it is empty), in the order of labels (a tag's cases in table order), each once."""
    pool = [c for c in ALL_CASES if c.device in devices]
    if not labels:
        return pool
    chosen = {}
    for name in labels:
        for c in pool:
            if c.label == name or name in c.tags:
                chosen.setdefault(c.label, c)
    return list(chosen.values())


def check_table() -> list[str]:
    """Problems with ALL_CASES (empty when none): duplicate labels, tensor-core siblings missing, targets unset,
    N-d cases outside ND_CASES or without their strict-fp32 sibling."""
    problems, seen = [], set()
    for c in ALL_CASES:
        if c.label in seen:
            problems.append(f"duplicate label {c.label}")
        seen.add(c.label)
        if c.op not in SMOKE_DIMS:
            problems.append(f"{c.label}: unknown op {c.op}")
    labels = {c.label: c for c in ALL_CASES}
    for c in CASES:
        if c.op in ND_OPS:
            problems.append(f"{c.label}: a {c.op} case in CASES (tests/test_sass.py cannot run it): put it in ND_CASES")
    for c in ND_CASES:
        if "issue13" in c.tags and c.label.endswith("-gpu16"):
            sibling = labels.get(c.label[: -len("-gpu16")] + "-gpu32")
            if sibling is None or sibling.dims != c.dims or sibling.dtype != "float32" or sibling.tf32:
                problems.append(f"{c.label}: no strict-fp32 -gpu32 case of the same problem")
    for c in CASES:
        if "issue11" in c.tags and c.label.endswith("-gpu16"):
            stem = c.label[: -len("-gpu16")]
            for suffix, want in (("-gpubf16", "bfloat16"), ("-gputf32", "float32")):
                sibling = labels.get(stem + suffix)
                if sibling is None or sibling.dtype != want or sibling.dims != c.dims:
                    problems.append(f"{c.label}: no {stem + suffix} case of the same problem in {want}")
                elif suffix == "-gputf32" and not sibling.tf32:
                    problems.append(f"{stem + suffix}: tf32 is not set")
            if c.target is None:
                problems.append(f"{c.label}: an issue-11 fp16 case without a target")
    for label in SMOKE_ON_CPU:
        if label not in labels:
            problems.append(f"SMOKE_ON_CPU names {label}, which is not a case")
    return problems


# ---------------------------------------------------------------------------------------------------------
# Inputs


def out_size(d: dict) -> tuple[int, int]:
    s = d.get("s", 1)
    return ((d["H"] + 2 * d["p"] - d["k"]) // s + 1, (d["W"] + 2 * d["p"] - d["k"]) // s + 1)


def in_sizes(op: str, d: dict) -> tuple:
    """The spatial sizes of an op's input: (L,) for conv1d, (T, H, W) for conv3d, (H, W) otherwise."""
    if op == "conv1d":
        return (d["L"],)
    if op == "conv3d":
        return (d["T"], d["H"], d["W"])
    return (d["H"], d["W"])


def out_sizes(op: str, d: dict) -> tuple:
    """The spatial sizes of an op's output (same k, p, s in every dim): a convolution's (i + 2p - k) // s + 1, a
    transposed convolution's (i - 1) s - 2p + k."""
    k, p, s = d["k"], d["p"], d.get("s", 1)
    if op in TRANSPOSED_OPS:
        return tuple((i - 1) * s - 2 * p + k for i in in_sizes(op, d))
    return tuple((i + 2 * p - k) // s + 1 for i in in_sizes(op, d))


def numpy_dtype(name: str) -> numpy.dtype:
    """The NumPy dtype of a case dtype name; bfloat16 is ml_dtypes' (CuPy >= 14 takes it too)."""
    if name == "bfloat16":
        import ml_dtypes
        return numpy.dtype(ml_dtypes.bfloat16)
    return numpy.dtype(name)


def shapes(case: Case) -> dict:
    """The shapes of the case's arrays: x, weight w, bias b (None for unfold) and the output y."""
    d = case.dims
    if case.op not in ND_OPS:
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
    elif case.op in ND_OPS:
        spatial, g = in_sizes(case.op, d), d.get("g", 1)
        taps = (k,) * len(spatial)
        x, b, y = (d["N"], d["C"], *spatial), (d["D"],), (d["N"], d["D"], *out_sizes(case.op, d))
        # torch's layouts: (out, in / groups, k...) for a convolution, (in, out / groups, k...) transposed.
        w = (d["C"], d["D"] // g, *taps) if case.op in TRANSPOSED_OPS else (d["D"], d["C"] // g, *taps)
    else:
        raise ValueError(f"unknown op {case.op!r}")
    return {"x": x, "w": w, "b": b, "y": y}


def make_inputs(case: Case, seed: int = 0) -> dict:
    """NumPy inputs of the case in its dtype: x, weight w, bias b, and gy, a gradient of the forward output."""
    d, rng = case.dims, numpy.random.default_rng(seed)
    s = shapes(case)

    def draw(shape, scale=1.0):
        return None if shape is None else (rng.standard_normal(shape, dtype=numpy.float32) * scale)

    if case.op in ND_OPS:
        fan_in = d["C"] // d.get("g", 1) * d["k"] ** len(in_sizes(case.op, d))
    else:
        fan_in = (d["C"] // d.get("g", 1) if case.op in ("conv2d", "patch") else 1) * d["k"] * d["k"]
    arrays = {"x": draw(s["x"]), "w": draw(s["w"], fan_in ** -0.5), "b": draw(s["b"], 0.1), "gy": draw(s["y"])}
    dtype = numpy_dtype(case.dtype)
    return {name: None if a is None else a.astype(dtype) for name, a in arrays.items()}


# ---------------------------------------------------------------------------------------------------------
# Roofline: FLOPs and floor bytes of a case and pass (pure arithmetic, checked on the CPU by `--smoke`)


def flops(case: Case, backward: bool = False) -> int:
    """Multiply-adds x 2 of the convolution: 2 * images * D * oH * oW * C/G * kH * kW for the forward (depthwise:
    C/G = 1, D = C * m; unfold: 0), and 3x that for forward + backward (grad input and grad weight each cost one
    forward).  conv1d / conv3d: the same product over 1 or 3 spatial dims.  A transposed convolution:
    2 * N * C * (input pixels) * D/G * k^dims, every input pixel times every tap, the taps that land in the
    cropped padding included (the count of the convolution it is the input gradient of).  The bias is not
    counted."""
    d = case.dims
    if case.op == "unfold":
        return 0
    if case.op in ND_OPS:
        taps = d["k"] ** len(in_sizes(case.op, d))
        pixels = math.prod(in_sizes(case.op, d) if case.op in TRANSPOSED_OPS else out_sizes(case.op, d))
        channels = d["C"] * (d["D"] // d.get("g", 1))       # (C/G) * D = C * (D/G)
        forward = 2 * d["N"] * pixels * channels * taps
        return 3 * forward if backward else forward
    oh, ow = out_size(d)
    images = d["N"] * d.get("B", 1)
    if case.op == "depthwise":
        outputs, per_output = d["C"] * d.get("m", 1), d["k"] * d["k"]
    else:
        outputs, per_output = d["D"], d["C"] // d.get("g", 1) * d["k"] * d["k"]
    forward = 2 * images * outputs * oh * ow * per_output
    return 3 * forward if backward else forward


def floor_bytes(case: Case, backward: bool = False) -> int:
    """Bytes of the memory floor: every input, weight and output read or written exactly once, in the case's
    dtype.  Forward: x, w, b read, y written.  Forward + backward adds gy read and grad x, grad w, grad b written
    (the floor of a fused forward + backward: x, w and b are counted once, not once per pass)."""
    s = shapes(case)
    item = numpy_dtype(case.dtype).itemsize

    def size(shape):
        return 0 if shape is None else int(numpy.prod(shape))

    forward = size(s["x"]) + size(s["w"]) + size(s["b"]) + size(s["y"])
    if not backward:
        return forward * item
    return (forward + size(s["y"]) + size(s["x"]) + size(s["w"]) + size(s["b"])) * item


def peak_key(case: Case) -> str:
    """Which measured GEMM peak a case is held against: its dtype, or "tf32" for float32 with TF32 allowed."""
    return "tf32" if case.tf32 else case.dtype


def roofline(case: Case, backward: bool, seconds: float | None = None, peak_flops: float | None = None,
             bandwidth: float | None = None) -> dict:
    """FLOPs, floor bytes and, given a time, what they imply: achieved TFLOP/s and, given the GEMM peak (FLOP/s)
    and the copy bandwidth (bytes/s, read + write), the fraction of the peak, the floor time
    max(FLOPs / peak, bytes / bandwidth), which of the two bounds it and the time as a multiple of the floor."""
    f, b = flops(case, backward), floor_bytes(case, backward)
    out = {"flops": f, "bytes": b, "intensity_flop_per_byte": f / b if b else None}
    if seconds:
        out["tflops"] = f / seconds / 1e12 if f else None
        out["gbs"] = b / seconds / 1e9
    if peak_flops and bandwidth:
        compute_s, memory_s = f / peak_flops, b / bandwidth
        out["floor_ms"] = max(compute_s, memory_s) * 1e3
        out["floor_bound"] = "compute" if compute_s >= memory_s else "memory"
        if seconds:
            out["peak_fraction"] = (f / seconds) / peak_flops if f else None
            out["x_floor"] = seconds * 1e3 / out["floor_ms"] if out["floor_ms"] else None
    return out


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
    applies: object = field(default=None, repr=False)   # case -> bool, beyond ops and devices (None: always)


def _to_torch(a, device: str):
    """A torch tensor with a's values bit for bit (bfloat16: ml_dtypes' bits reinterpreted as torch.bfloat16)."""
    import torch
    if a is None:
        return None
    a = numpy.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":  # torch.from_numpy does not know ml_dtypes; the bits are the same format
        t = torch.from_numpy(a.view(numpy.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a)
    return t.to("cuda") if device == "gpu" else t


def _to_cupy(a):
    import cupy
    if a is None:
        return None
    try:
        return cupy.asarray(a)
    except Exception as e:
        if a.dtype.name == "bfloat16":
            raise RuntimeError(f"CuPy {cupy.__version__} cannot hold bfloat16 arrays (CuPy >= 14 with ml_dtypes "
                               f"can): {type(e).__name__}: {e}") from e
        raise


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
    elif case.op in ND_OPS:   # cupyconv.conv1d / conv3d / conv_transpose2d and their *_backward
        fwd, bwd, extra = getattr(cc, case.op), getattr(cc, f"{case.op}_backward"), {"groups": d.get("g", 1)}
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


AUTOTUNE = "cupyconv (autotune)"


def autotuned(run):
    """run() with cupyconv's autotuning on for the calls (this thread only: `settings.autotune`)."""
    import cupyconv as cc

    def tuned():
        with cc.settings.autotune(True):
            return run()
    return tuned


def build_cupyconv_autotune(case: Case, inputs: dict, backward: bool):
    """The "cupyconv" contender's calls with autotuning on, cupyconv's counterpart of cudnn.benchmark: its first
    call times every candidate of each pass (`cupyconv._autotune`), the later ones run the kept one."""
    return autotuned(build_cupyconv(case, inputs, backward))


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
        if case.op in ND_OPS:   # cupyconv.torch.conv1d / conv3d / conv_transpose2d
            op = getattr(cct, case.op)
        else:
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


def build_torch_conv_channels_last(case: Case, inputs: dict, backward: bool):
    """torch F.conv2d (cuDNN with cudnn.benchmark on the GPU) on x and weight in torch.channels_last memory format,
    and gy too, so the whole pass runs NHWC (patches: rolled into the batch first).  The conversions are made once
    here, untimed: this is a model that keeps its activations channels_last throughout."""
    import torch
    import torch.nn.functional as F
    d = case.dims
    k, p, s = d["k"], d["p"], d.get("s", 1)
    cl = torch.channels_last
    t = {n: _to_torch(a, case.device) for n, a in inputs.items()}
    lead = t["x"].shape[:-3]                          # patch: (B, N); conv2d: (N,)
    x4 = t["x"].reshape(-1, *t["x"].shape[-3:]).contiguous(memory_format=cl)
    gy4 = t["gy"].reshape(-1, *t["gy"].shape[-3:]).contiguous(memory_format=cl)
    w = t["w"].contiguous(memory_format=cl)
    b = t["b"]
    leaves = [x4, w] + ([b] if b is not None else [])
    if backward:
        for leaf in leaves:
            leaf.requires_grad_(True)
    gy = gy4.reshape(*lead, *gy4.shape[1:])           # a view: splitting the batch dim keeps channels_last strides
    groups = d.get("g", 1)

    def forward():
        y = F.conv2d(x4, w, b, stride=s, padding=p, groups=groups)
        return y.reshape(*lead, *y.shape[1:])

    def run():
        if not backward:
            with torch.no_grad():
                return (forward(),)
        y = forward()
        grads = torch.autograd.grad(y, leaves, gy)
        return (y.detach(), grads[0].reshape(*lead, *grads[0].shape[1:]), *grads[1:])
    return run


def build_torch_nd(case: Case, inputs: dict, backward: bool):
    """torch.nn.functional.conv1d / conv3d / conv_transpose2d (cuDNN with cudnn.benchmark on the GPU)."""
    import torch.nn.functional as F
    d = case.dims
    op = getattr(F, case.op)
    kwargs = dict(stride=d.get("s", 1), padding=d["p"], groups=d.get("g", 1))
    t = _torch_leaves(case, inputs, backward)
    return _torch_autograd(lambda t: op(t["x"], t["w"], t["b"], **kwargs), t, backward)


def build_torch_nd_channels_last(case: Case, inputs: dict, backward: bool):
    """torch F.conv3d / F.conv_transpose2d on x, weight and gy in channels_last (4-D) or channels_last_3d (5-D)
    memory format, converted once here, untimed: a model that keeps its activations channels-last."""
    import torch
    import torch.nn.functional as F
    d = case.dims
    op = getattr(F, case.op)
    kwargs = dict(stride=d.get("s", 1), padding=d["p"], groups=d.get("g", 1))
    t = {n: _to_torch(a, case.device) for n, a in inputs.items()}
    fmt = torch.channels_last_3d if t["x"].dim() == 5 else torch.channels_last
    for name in ("x", "w", "gy"):
        t[name] = t[name].contiguous(memory_format=fmt)
    if backward:
        for name in ("x", "w", "b"):
            t[name].requires_grad_(True)
    return _torch_autograd(lambda t: op(t["x"], t["w"], t["b"], **kwargs), t, backward)


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
    Contender("cupyconv", ("patch", "conv2d", "depthwise", "unfold", *ND_OPS), ("cpu", "gpu"), "cupy",
              build_cupyconv, ours=True),
    Contender("cupyconv.torch (autograd)", ("patch", "conv2d", "depthwise", "unfold"), ("gpu",), "torch",
              build_cupyconv_torch, ours=True),
    # "cupyconv" runs as it comes (autotuning off: the heuristic's plan, what benchmarks.predict models); this one
    # with autotuning on, for the ops whose 'auto' autotunes (conv2d's passes, and the N-d ops' lifted ones)
    Contender(AUTOTUNE, ("conv2d", *ND_OPS), ("gpu",), "cupy", build_cupyconv_autotune, ours=True),
    # The first non-cupyconv contender of an op is its baseline (the target ratio refers to it).
    Contender("torch F.conv2d", ("conv2d", "depthwise"), ("cpu", "gpu"), "torch", build_torch_conv),
    Contender("torch F.conv2d, patches rolled into batch", ("patch",), ("cpu", "gpu"), "torch", build_torch_conv),
    Contender("torch F.unfold", ("unfold",), ("cpu", "gpu"), "torch", build_torch_conv),
    Contender("torch unfold+matmul+fold", ("patch", "conv2d", "depthwise"), ("cpu", "gpu"), "torch",
              build_torch_unfold_matmul),
    # cuDNN NHWC beside NCHW for the tensor-core cases (cupyconv itself takes NCHW).
    Contender("torch F.conv2d, channels_last", ("patch", "conv2d"), ("cpu", "gpu"), "torch",
              build_torch_conv_channels_last, applies=lambda case: case.tensor_cores),
    # Issue 13: the N-d and transposed ops against their torch functions (the baselines), and cuDNN channels-last
    # for the tensor-core cases of conv3d and conv_transpose2d (a 3-D tensor has no channels-last format).
    Contender("torch F.conv1d", ("conv1d",), ("cpu", "gpu"), "torch", build_torch_nd),
    Contender("torch F.conv3d", ("conv3d",), ("cpu", "gpu"), "torch", build_torch_nd),
    Contender("torch F.conv_transpose2d", ("conv_transpose2d",), ("cpu", "gpu"), "torch", build_torch_nd),
    Contender("torch F.conv3d, channels_last_3d", ("conv3d",), ("cpu", "gpu"), "torch",
              build_torch_nd_channels_last, applies=lambda case: case.tensor_cores),
    Contender("torch F.conv_transpose2d, channels_last", ("conv_transpose2d",), ("cpu", "gpu"), "torch",
              build_torch_nd_channels_last, applies=lambda case: case.tensor_cores),
]


def contenders_for(case: Case) -> list[Contender]:
    return [c for c in CONTENDERS if case.op in c.ops and case.device in c.devices
            and (c.applies is None or c.applies(case))]


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
