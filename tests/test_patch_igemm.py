"""patch_fwd_igemm (raw_kernels/implicit_gemm.cu, "Whole patches a block"; planned by ops/implicit_gemm.py
`plan_patch_igemm`, routed by ops/patch.py `_whole_patches`) under the CPU emulator against the float64 CPU path:
fresh random inputs, poisoned outputs (the emulator's empty), patch counts that leave a partial last group, several
groups a persistent block, 1-D, 4x4 and 8x8 patches, each side's padding, output channels past one 64-channel
pass and not a multiple of it, bias on and off, both 16-bit types; and what it refuses (the old path then runs)."""
from __future__ import annotations

import dataclasses

import numpy
import pytest
from optional_deps import BFLOAT16, Dtypes

import cupyconv
from cupyconv import _device
from cupyconv._spec import ConvSpec
from cupyconv.ops import implicit_gemm as igemm
from bug_classes import Recorder
import reference
from emulator import assert_clean_under_asan, pytest_under_asan

DTYPES = Dtypes({"float16": numpy.float16, "bfloat16": BFLOAT16})
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2}   # as tests/test_igemm_kernels.py


@pytest.fixture(autouse=True)
def small_problems_take_it(monkeypatch):
    """The cases here are small: patch_fwd_igemm runs them all the same (ops/patch.py routes it from PT_MIN_GROUPS
    groups of patches on; `test_few_groups_take_the_old_path` checks that rule)."""
    monkeypatch.setattr(igemm, "PT_MIN_GROUPS", 1)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    x: tuple            # (..., C, H, W)
    out_channels: int
    kernel: tuple = (3, 3)
    padding: object = 1
    bias: bool = True
    blocks: int = 0     # PT_BLOCKS for the run (0: the planner's): fewer blocks, several groups each

    def __str__(self):
        return self.name


CASES = [
    Case("seed-like-odd-n", (11, 32, 4, 4), 64),                        # 8 patches a group: 11 = 8 + 3
    Case("8x8-no-bias", (2, 3, 32, 8, 8), 64, bias=False),              # 2 patches a group, 6 patches
    Case("1d-patches", (7, 16, 1, 24), 48, kernel=(1, 3), padding=(0, 1)),   # 5 patches of 24 a group
    Case("padding-per-side", (5, 16, 5, 6), 32, padding=((0, 2), (2, 1))),   # 5 x 7 outputs (odd): 3 a group
    Case("odd-pixels", (7, 48, 5, 5), 32),                               # 25 pixels in and out: 5 a group
    Case("d-past-one-pass", (9, 16, 4, 4), 80),                         # 80 channels: 64 + a pass of 16
    Case("grid-loops", (37, 16, 4, 4), 32, blocks=2),                   # 5 groups on 2 blocks, the last partial
    Case("no-padding", (6, 32, 6, 6), 16, padding=0, bias=False),        # 4 x 4 outputs of 6 x 6 patches
]


def misaligned(a):
    """a's values in a C-contiguous array 2 bytes past a 16-byte boundary: patch_fwd_igemm then stages the weight
    element by element instead of by 16-byte vectors."""
    buf = numpy.empty(a.size + 16, a.dtype)
    start = -buf.ctypes.data % 16 // a.itemsize + 1
    out = buf[start:start + a.size].reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % 16 == 2 and out.flags.c_contiguous
    return out


def run_forward(case, dtype, monkeypatch, seed=0, place=lambda weight: weight):
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(case.x).astype(DTYPES[dtype])
    weight = place(rng.standard_normal((case.out_channels, case.x[-3], *case.kernel)).astype(DTYPES[dtype]))
    bias = rng.standard_normal(case.out_channels).astype(DTYPES[dtype]) if case.bias else None
    if case.blocks:
        monkeypatch.setattr(igemm, "PT_BLOCKS", case.blocks)
    device = Recorder()
    with _device.use_device(device):
        out = cupyconv.patch_conv2d(x, weight, bias, padding=case.padding)
    want = cupyconv.patch_conv2d(*(None if a is None else numpy.asarray(a, numpy.float64) for a in (x, weight, bias)),
                                 padding=case.padding)
    return device, out, want


def assert_close(got, want, dtype, what):
    got = numpy.asarray(got, numpy.float64)
    scale = float(numpy.abs(want).max())
    err = float(numpy.abs(got - want).max())   # NaN (a poisoned element never written) fails too
    assert err <= TOLERANCE[dtype] * scale, f"{what}: max error {err:.3g} vs max |value| {scale:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_matches_cpu_path(case, dtype, monkeypatch):
    device, out, want = run_forward(case, dtype, monkeypatch)
    assert [name for name in device.launches if "patch_fwd_igemm" in name] and not [
        name for name in device.launches if "conv_fwd_igemm" in name or "channels_last" in name], device.launches
    assert out.dtype == DTYPES[dtype] and out.shape == want.shape
    assert_close(out, want, dtype, case.name)


@pytest.mark.parametrize("case", [CASES[0], CASES[3]], ids=str)
def test_forward_with_a_misaligned_weight(case, monkeypatch):
    """A weight off 16-byte alignment is staged by elements (C = 16 pads each tap's channels to 32 with zeros)."""
    device, out, want = run_forward(case, "float16", monkeypatch, place=misaligned)
    assert [name for name in device.launches if "patch_fwd_igemm" in name], device.launches
    assert_close(out, want, "float16", case.name)


def test_grid_loops_cover_every_group(monkeypatch):
    """The plan of the grid-loop case: fewer blocks than groups, so that blocks take several (the last partial)."""
    case = next(c for c in CASES if c.blocks)
    spec = ConvSpec.for_conv("patch_conv2d", numpy.empty(case.x, numpy.float16),
                             numpy.empty((case.out_channels, case.x[1], 3, 3), numpy.float16), None, 1, 1, 1, 1,
                             leading_dims=True)
    monkeypatch.setattr(igemm, "PT_BLOCKS", case.blocks)
    plan = igemm.plan_patch_igemm(spec)
    assert (plan.patches, plan.blocks) == (8, 2) and spec.n % plan.patches


@pytest.mark.parametrize("kwargs, why", [
    (dict(stride=2), "stride 1"), (dict(dilation=2), "dilation 1"), (dict(channels=24), "multiples of 16"),
    (dict(size=12), "at most 128 output pixels"), (dict(dtype=numpy.float32), "float16 and bfloat16")])
def test_refusals(kwargs, why):
    c, size, dtype = kwargs.pop("channels", 16), kwargs.pop("size", 4), kwargs.pop("dtype", numpy.float16)
    spec = ConvSpec.for_conv("patch_conv2d", numpy.empty((3, c, size, size), dtype),
                             numpy.empty((32, c, 3, 3), dtype), None, kwargs.get("stride", 1), 1,
                             kwargs.get("dilation", 1), 1, leading_dims=True)
    assert why in igemm.patch_igemm_refusal(spec, dtype)


def test_a_transposed_view_takes_the_old_path():
    """x not C-contiguous (read in place by the channels-last path): conv_fwd_igemm, the same values."""
    rng = numpy.random.default_rng(1)
    x = rng.standard_normal((2, 16, 5, 4, 4)).astype(numpy.float16).swapaxes(1, 2)   # (2, 5, 16, 4, 4)
    weight = rng.standard_normal((32, 16, 3, 3)).astype(numpy.float16)
    device = Recorder()
    with _device.use_device(device):
        out = cupyconv.patch_conv2d(x, weight, padding=1)
    assert not [n for n in device.launches if "patch_fwd_igemm" in n], device.launches
    want = cupyconv.patch_conv2d(numpy.asarray(x, numpy.float64), numpy.asarray(weight, numpy.float64), padding=1)
    assert_close(out, want, "float16", "view")


def test_a_gpu_without_mma_sync_never_launches_it(monkeypatch):
    """Before sm_80 the kernel is a trap: 'implicit_gemm' asked for is a ValueError naming why (as conv_fwd_igemm's
    path says), and 'auto' takes a path of its own."""
    rng = numpy.random.default_rng(2)
    x = rng.standard_normal((11, 32, 4, 4)).astype(numpy.float16)
    weight = rng.standard_normal((64, 32, 3, 3)).astype(numpy.float16)
    device = Recorder()
    monkeypatch.setattr(device, "tensor_cores", False, raising=False)
    with _device.use_device(device):
        with pytest.raises(ValueError, match=r"patch_conv2d: algorithm='implicit_gemm' cannot run: .*mma\.sync"):
            cupyconv.patch_conv2d(x, weight, padding=1, algorithm="implicit_gemm")
        out = cupyconv.patch_conv2d(x, weight, padding=1)
    assert not [n for n in device.launches if "igemm" in n], device.launches
    want = cupyconv.patch_conv2d(numpy.asarray(x, numpy.float64), numpy.asarray(weight, numpy.float64), padding=1)
    assert_close(out, want, "float16", "auto without tensor cores")


def test_few_groups_take_the_old_path(monkeypatch):
    """Under PT_MIN_GROUPS groups of patches the forward stays on conv_fwd_igemm (the weight staging would not pay)."""
    monkeypatch.setattr(igemm, "PT_MIN_GROUPS", 3)   # 11 patches: 2 groups of 8
    device, out, want = run_forward(CASES[0], "float16", monkeypatch)
    assert not [n for n in device.launches if "patch_fwd_igemm" in n], device.launches
    assert_close(out, want, "float16", "few groups")
    monkeypatch.setattr(igemm, "PT_MIN_GROUPS", 2)
    device, out, want = run_forward(CASES[0], "float16", monkeypatch)
    assert [n for n in device.launches if "patch_fwd_igemm" in n], device.launches


def test_asan():
    """The partial last group copies its own patches only (reading past x would be an out-of-bounds read that no
    output shows: the rows of missing patches are never stored)."""
    assert_clean_under_asan(pytest_under_asan(
        "tests/test_patch_igemm.py::test_forward_matches_cpu_path[seed-like-odd-n-float16]"))


def test_seed_shape_records_one_launch_and_its_macs():
    """p-seed fp16's forward is one patch_fwd_igemm launch (no copy): 264 persistent blocks over 2,560 groups of 8
    patches, whose MACs in benchmarks.predict are exactly the convolution's (C = 32 fills the 32-channel steps)."""
    from benchmarks import cases, launches, predict
    case = next(c for c in cases.CASES if c.label == "p-seed-gpu16")
    rec = launches.record(case, False)
    (launch,) = rec.steps
    assert launch.kernel == "patch_fwd_igemm" and launch.grid == (264,) and launch.args["patches"] == 8
    assert launch.shared_mem == 86656 and launch.block == (128,)   # weight 37,888, table 4,608, tile 10,880, raw
                                                                    # 16,896, out 16,384: two blocks an SM on sm_90
    assert predict.tensor_core_macs(launch) == 2560 * 128 * 64 * 9 * 32 == cases.flops(case) // 2


# --- the input gradient (task patchdx): patch_fwd_igemm on the transposed convolution, grad_output read as it
# lies, the weight transposed and flipped as the kernel stages it (ops/implicit_gemm.py `patch_igemm_grad_input`).
# Against the naive float64 loops of tests/reference.py (no cupyconv code).  The GEMM's K is D (grad_output's
# channels), its columns C: 32 or fewer columns split K over a warp row's two warps (even and odd steps, one step a
# tap's 32 channels), more take passes of 64.

INPUT_CASES = [
    Case("seed-like-odd-n", (11, 32, 4, 4), 64),                          # K 64 (2 steps a tap), 32 columns: split
    Case("8x8-c64", (2, 3, 64, 8, 8), 32),                               # K 32, 64 columns: one whole pass
    Case("3x3-k5-pad2", (7, 16, 3, 3), 48, kernel=(5, 5), padding=2),    # K 48 padded to 64, 16 columns: split
    Case("5x5-k1-c128", (9, 128, 5, 5), 16, kernel=(1, 1), padding=0),   # K 16 padded to 32, two passes of 64
    Case("6x6-k1-crop", (5, 32, 6, 6), 16, kernel=(1, 1), padding=1),    # padded -1 (crops); one step: odd warp idle
    Case("7x7-pad0-uneven-k", (6, 32, 7, 7), 80, padding=0),             # K 80: 3 steps a tap, 27 split 14 / 13
    Case("padding-per-side", (5, 16, 5, 6), 32, padding=((0, 2), (2, 1))),
    Case("1d-patches", (7, 16, 1, 24), 48, kernel=(1, 3), padding=(0, 1)),
    Case("grid-loops", (37, 16, 4, 4), 96, blocks=2),                    # 5 groups on 2 blocks, the last partial
    Case("c112-passes", (3, 112, 4, 4), 128, kernel=(1, 1), padding=0),  # 112 columns: 64 + 48 (not split)
    Case("8x8-pad3-forward-refused", (4, 16, 8, 8), 32, padding=3),      # out 12 x 12 > 128 pixels: input only
]


def run_input_grad(case, dtype, monkeypatch, seed=0, needs=("input",), place=lambda weight: weight):
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(case.x).astype(DTYPES[dtype])
    weight = place(rng.standard_normal((case.out_channels, case.x[-3], *case.kernel)).astype(DTYPES[dtype]))
    out_shape = cupyconv.patch_conv2d(numpy.zeros(case.x[-3:], numpy.float32), weight.astype(numpy.float32),
                                      padding=case.padding).shape
    grad_output = rng.standard_normal((*case.x[:-3], *out_shape)).astype(DTYPES[dtype])
    if case.blocks:
        monkeypatch.setattr(igemm, "PT_BLOCKS", case.blocks)
    device = Recorder()
    with _device.use_device(device):
        grads = cupyconv.patch_conv2d_backward(grad_output, x, weight, padding=case.padding, needs=needs)
    want = reference.patch_conv2d_grads(*(numpy.asarray(a, numpy.float64) for a in (grad_output, x, weight)),
                                        padding=case.padding)
    return device, grads, want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", INPUT_CASES, ids=str)
def test_input_grad_matches_reference(case, dtype, monkeypatch):
    device, (grad_x, _, _), (want, _, _) = run_input_grad(case, dtype, monkeypatch)
    assert [n for n in device.launches if "patch_fwd_igemm" in n] and not [
        n for n in device.launches if "conv_fwd_igemm" in n or "channels_last" in n], device.launches
    assert grad_x.dtype == DTYPES[dtype] and grad_x.shape == want.shape
    assert_close(grad_x, want, dtype, case.name)


@pytest.mark.parametrize("case", [INPUT_CASES[0], INPUT_CASES[2]], ids=str)
def test_input_grad_with_a_misaligned_weight(case, monkeypatch):
    """The transposed, flipped weight staged by elements where it is off 16-byte alignment."""
    device, (grad_x, _, _), (want, _, _) = run_input_grad(case, "float16", monkeypatch, place=misaligned)
    assert [n for n in device.launches if "patch_fwd_igemm" in n], device.launches
    assert_close(grad_x, want, "float16", case.name)


def test_input_grad_beside_the_weight_gradient(monkeypatch):
    """All three gradients: the input gradient's launch reads grad_output in place; the weight gradient keeps its
    own path (its channels-last copies no longer carry the input gradient's operands), every gradient right."""
    device, grads, wants = run_input_grad(INPUT_CASES[0], "float16", monkeypatch, seed=3,
                                          needs=("input", "weight", "bias"))
    assert len([n for n in device.launches if "patch_fwd_igemm" in n]) == 1, device.launches
    assert not [n for n in device.launches if "conv_fwd_igemm" in n], device.launches
    for got, want, what in zip(grads, wants, ("input", "weight", "bias")):
        assert_close(got, want, "float16", what)


@pytest.mark.parametrize("kwargs, why", [
    (dict(stride=2), "stride 1"), (dict(dilation=2), "dilation 1"), (dict(out_channels=24), "multiples of 16"),
    (dict(size=12), "at most 128 output pixels"), (dict(dtype=numpy.float32), "float16 and bfloat16")])
def test_input_refusals(kwargs, why):
    """What the input gradient refuses: judged on the transposed convolution (its output is the input's H x W, its
    reduction grad_output's D channels)."""
    d, size, dtype = kwargs.pop("out_channels", 32), kwargs.pop("size", 4), kwargs.pop("dtype", numpy.float16)
    spec = ConvSpec.for_conv("patch_conv2d", numpy.empty((3, 16, size, size), dtype),
                             numpy.empty((d, 16, 3, 3), dtype), None, kwargs.get("stride", 1), 1,
                             kwargs.get("dilation", 1), 1, leading_dims=True)
    assert why in igemm.patch_igemm_input_refusal(spec, dtype)


@pytest.mark.parametrize("case", [Case("12x12-too-many-pixels", (3, 16, 12, 12), 32),
                                  Case("stride-2", (5, 16, 4, 4), 32)], ids=str)
def test_refused_input_grads_take_the_old_path(case, monkeypatch):
    """Refused (a 144-pixel patch; stride 2): conv_fwd_igemm as before, the same values."""
    stride = 2 if "stride" in case.name else 1
    rng = numpy.random.default_rng(4)
    x = rng.standard_normal(case.x).astype(numpy.float16)
    weight = rng.standard_normal((case.out_channels, case.x[-3], 3, 3)).astype(numpy.float16)
    out = cupyconv.patch_conv2d(x.astype(numpy.float32), weight.astype(numpy.float32), padding=1, stride=stride)
    grad_output = rng.standard_normal(out.shape).astype(numpy.float16)
    device = Recorder()
    with _device.use_device(device):
        grad_x, _, _ = cupyconv.patch_conv2d_backward(grad_output, x, weight, padding=1, stride=stride,
                                                      needs="input")
    assert not [n for n in device.launches if "patch_fwd_igemm" in n] and [
        n for n in device.launches if "conv_fwd_igemm" in n], device.launches
    want = reference.patch_conv2d_grads(*(numpy.asarray(a, numpy.float64) for a in (grad_output, x, weight)),
                                        padding=1, stride=stride)[0]
    assert_close(grad_x, want, "float16", case.name)


def test_input_grad_with_few_groups_takes_the_old_path(monkeypatch):
    """Under PT_MIN_GROUPS groups of patches (of the transposed convolution) the input gradient stays on
    conv_fwd_igemm and its copies; from there on it takes the whole-patch kernel."""
    monkeypatch.setattr(igemm, "PT_MIN_GROUPS", 3)   # 11 patches: 2 groups of 8
    device, (grad_x, _, _), (want, _, _) = run_input_grad(INPUT_CASES[0], "float16", monkeypatch)
    assert not [n for n in device.launches if "patch_fwd_igemm" in n], device.launches
    assert_close(grad_x, want, "float16", "few groups")
    monkeypatch.setattr(igemm, "PT_MIN_GROUPS", 2)
    device, _, _ = run_input_grad(INPUT_CASES[0], "float16", monkeypatch)
    assert [n for n in device.launches if "patch_fwd_igemm" in n], device.launches


def test_input_grad_on_a_gpu_without_mma_sync(monkeypatch):
    """Before sm_80: 'implicit_gemm' is the ValueError of the tensor-core paths, 'auto' launches no tensor-core
    kernel and gives the same gradient."""
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal((11, 32, 4, 4)).astype(numpy.float16)
    weight = rng.standard_normal((64, 32, 3, 3)).astype(numpy.float16)
    grad_output = rng.standard_normal((11, 64, 4, 4)).astype(numpy.float16)
    device = Recorder()
    monkeypatch.setattr(device, "tensor_cores", False, raising=False)
    with _device.use_device(device):
        with pytest.raises(ValueError, match=r"patch_conv2d_backward: algorithm='implicit_gemm' cannot run: .*mma"):
            cupyconv.patch_conv2d_backward(grad_output, x, weight, padding=1, needs="input", algorithm="implicit_gemm")
        grad_x, _, _ = cupyconv.patch_conv2d_backward(grad_output, x, weight, padding=1, needs="input")
    assert not [n for n in device.launches if "igemm" in n], device.launches
    want = reference.patch_conv2d_grads(*(numpy.asarray(a, numpy.float64) for a in (grad_output, x, weight)),
                                        padding=1)[0]
    assert_close(grad_x, want, "float16", "auto without tensor cores")


def test_input_grad_asan():
    """The input gradient's split passes and partial last group stay within their arrays and shared memory."""
    assert_clean_under_asan(pytest_under_asan(
        "tests/test_patch_igemm.py::test_input_grad_matches_reference[7x7-pad0-uneven-k-float16]"))


def test_seed_input_grad_is_one_launch_and_its_macs():
    """p-seed fp16's input gradient is one patch_fwd_igemm launch (64 -> 32 channels: K split over the warp row,
    so benchmarks.predict's MACs are exactly the pass's, no padding columns), 8 patches a block within 96 KiB (its
    out tile in the group's raw buffer: 16 KiB more would leave 6)."""
    from benchmarks import cases, launches, predict
    case = next(c for c in cases.CASES if c.label == "p-seed-gpu16")
    rec = launches.record(case, True)
    (launch,) = [s for s in rec.steps if s.kernel == "patch_fwd_igemm" and s.args["flipped"]]
    assert launch.grid == (264,) and launch.args["patches"] == 8 and launch.args["channels"] == 64
    assert launch.shared_mem == 94848   # weight 37,376, table 4,608, tile 19,584, raw 33,280; out in the raw buffer
    assert predict.tensor_core_macs(launch) == 2560 * 128 * 32 * 9 * 64 == cases.flops(case) // 2
