"""patch_bwd_weight_igemm (raw_kernels/implicit_gemm.cu, "Whole patches a block, the weight gradient"; planned by
ops/implicit_gemm.py `plan_patch_weight`, routed by ops/patch.py `_whole_patches_weight`) under the CPU emulator
against the float64 CPU path and torch CPU autograd: fresh random inputs, poisoned outputs (the emulator's empty
fills partial sums and results with NaN), patches of 3..8 pixels a side, padding 0, 1, 2 and per side, kernels 1, 3
and 5, channels 16..128 in and out (one and two d tiles, tiles of several channel slices), patch counts that leave
a short last group, blocks that loop over several groups, both 16-bit types, bias on and off; the same bits in
either block order; and what it refuses (conv_bwd_weight_igemm then runs)."""
from __future__ import annotations

import dataclasses

import numpy
import pytest

import cupyconv
from cupyconv import _device
from cupyconv._spec import ConvSpec
from cupyconv.ops import implicit_gemm as igemm
from bug_classes import Recorder
from emulator import assert_clean_under_asan, pytest_under_asan
# the forward's cases (a case's `blocks` is PW_BLOCKS here), dtypes and tolerance check: one rounding of a float sum
from test_patch_igemm import DTYPES, Case, assert_close


@pytest.fixture(autouse=True)
def small_problems_take_it(monkeypatch):
    """The cases here are small: the kernel runs them all the same (ops/patch.py routes it from PW_MIN_GROUPS
    groups of patches on; `test_few_groups_take_the_old_path` checks that rule)."""
    monkeypatch.setattr(igemm, "PW_MIN_GROUPS", 1)


CASES = [
    Case("seed-like-odd-n", (11, 32, 4, 4), 64),                           # 8 patches a group: 11 = 8 + 3
    Case("3x3-no-padding", (13, 16, 3, 3), 32, padding=0, bias=False),    # 1 output pixel: 13 of 16 K rows
    Case("5x5-kernel-5", (2, 5, 16, 5, 5), 48, kernel=(5, 5), padding=2),  # 25 units: 5 tiles of 5; D < 64
    Case("6x6-kernel-1", (7, 128, 6, 6), 16, kernel=(1, 1), padding=0),    # 8 channel slices: 2 tiles of 4
    Case("7x7-d-two-tiles", (5, 32, 7, 7), 80, bias=False),                # 49 pixels: 2 patches; d tiles 64 + 16
    Case("8x8-wide", (3, 48, 8, 8), 128, kernel=(5, 5), padding=2),        # 75 units over 13 tiles; 2 d tiles
    Case("padding-per-side", (5, 16, 4, 6), 32, padding=((0, 2), (2, 1)), blocks=2),  # 5 x 7 outputs: 3 patches
    # a group (105 K rows), each block both groups: the short one's 70 rows leave 10 of its last step to zeros
    Case("grid-loops", (37, 16, 4, 4), 32, blocks=2),                      # 5 groups on 1 split, the last short
    # 2 x 4 outputs: one chunk of 8 pixels a patch (oc = 1), 16 patches a group; 21 = 16 + 5 leaves an odd chunk
    # row in the short group's last step
    Case("one-chunk-odd-rows", (21, 32, 2, 4), 16),
]


def inputs(case, dtype, seed=0):
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(case.x).astype(DTYPES[dtype])
    weight = rng.standard_normal((case.out_channels, case.x[-3], *case.kernel)).astype(DTYPES[dtype])
    spec = ConvSpec.for_conv("patch_conv2d", x, weight, None, 1, case.padding, 1, 1, leading_dims=True)
    gy = rng.standard_normal((*case.x[:-3], case.out_channels, *spec.out_size)).astype(DTYPES[dtype])
    return x, weight, gy


def run_backward(case, dtype, monkeypatch, device=None, seed=0):
    x, weight, gy = inputs(case, dtype, seed)
    if case.blocks:
        monkeypatch.setattr(igemm, "PW_BLOCKS", case.blocks)
    needs = ("weight", "bias") if case.bias else ("weight",)
    device = device or Recorder()
    with _device.use_device(device):
        got = cupyconv.patch_conv2d_backward(gy, x, weight, padding=case.padding, needs=needs)
    want = cupyconv.patch_conv2d_backward(*(numpy.asarray(a, numpy.float64) for a in (gy, x, weight)),
                                          padding=case.padding, needs=needs)
    return device, got, want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_weight_grad_matches_cpu_path(case, dtype, monkeypatch):
    device, got, want = run_backward(case, dtype, monkeypatch)
    assert device.count("patch_bwd_weight_igemm") == 1 and device.count("conv_bwd_weight_igemm_finish") == 1
    assert not [n for n in device.launches if n.startswith(("conv_bwd_weight_igemm<", "channels_last"))], \
        device.launches   # x and grad_output read as they lie: no copy of either
    assert got[0] is None and got[1].dtype == DTYPES[dtype]
    assert_close(got[1], want[1], dtype, f"{case.name} grad_weight")
    if case.bias:
        assert got[2].dtype == DTYPES[dtype]
        assert_close(got[2], want[2], dtype, f"{case.name} grad_bias")
    else:
        assert got[2] is None


@pytest.mark.parametrize("case", [CASES[0], CASES[5]], ids=str)
def test_weight_grad_matches_torch_autograd(case, monkeypatch):
    """An independent reference: torch's autograd of F.conv2d over the patches as a batch (float64, CPU)."""
    torch = pytest.importorskip("torch")
    x, weight, gy = inputs(case, "float16", seed=3)
    _, got, _ = run_backward(case, "float16", monkeypatch, seed=3)
    (top, bottom), (left, right) = ConvSpec.for_conv("patch_conv2d", x, weight, None, 1, case.padding, 1, 1,
                                                     leading_dims=True).padding
    xt = torch.tensor(x.reshape(-1, *x.shape[-3:]), dtype=torch.float64)
    wt = torch.tensor(weight, dtype=torch.float64, requires_grad=True)
    bt = torch.zeros(weight.shape[0], dtype=torch.float64, requires_grad=True)
    out = torch.nn.functional.conv2d(torch.nn.functional.pad(xt, (left, right, top, bottom)), wt, bt)
    out.backward(torch.tensor(gy.reshape(out.shape), dtype=torch.float64))
    assert_close(got[1], wt.grad.numpy(), "float16", "torch grad_weight")
    assert_close(got[2], bt.grad.numpy(), "float16", "torch grad_bias")


def test_same_bits_in_either_block_order(monkeypatch):
    """The split is the shapes' alone and the splits are added in order: the same bits whichever block runs first
    (and on every run)."""
    case = CASES[6]
    runs = [run_backward(case, "float16", monkeypatch, device=Recorder(order))[1] for order in
            ("forward", "reverse", "forward")]
    for run in runs[1:]:
        for i in (1, 2):   # grad_weight, grad_bias
            assert numpy.asarray(run[i]).tobytes() == numpy.asarray(runs[0][i]).tobytes()


def test_short_group_meets_no_stale_chunk(monkeypatch):
    """grad_output copied straight to the dy tile (oH oW whole chunks): the short last group's last K step reads a
    chunk row past its pixels, which still holds a patch of the group two before (the same buffer).  Those rows
    multiply zero rows of x, so only a non-finite stale value shows: an inf there would make inf x 0 = NaN in
    grad_weight, where the sums are +inf (x positive, 1x1 kernel: no padding)."""
    case = Case("stale", (37, 16, 2, 4), 16, kernel=(1, 1), padding=0, bias=False, blocks=1)  # 3 groups of 16
    x, weight, gy = inputs(case, "float16")
    x = (numpy.abs(x) + 1).astype(numpy.float16)
    gy[5, 0, 0, 0] = numpy.inf   # the first group's patch 5: chunk row 5 of buffer 0, the third group's (5 patches)
    monkeypatch.setattr(igemm, "PW_BLOCKS", 1)
    device = Recorder()
    with _device.use_device(device):
        got = cupyconv.patch_conv2d_backward(gy, x, weight, padding=0, needs=("weight",))[1]
    assert device.count("patch_bwd_weight_igemm") == 1, device.launches
    got = numpy.asarray(got, numpy.float64)
    assert numpy.all(got[0] == numpy.inf), got[0]
    want = cupyconv.patch_conv2d_backward(*(numpy.asarray(a, numpy.float64) for a in (gy, x, weight)), padding=0,
                                          needs=("weight",))[1]
    assert_close(got[1:], want[1:], "float16", "finite channels")


def test_plans():
    """The seed shape's plan (8 patches a group, 18 units as 3 tiles of 6, 88 splits of 2,560 groups) and the
    loop case's (one split: each block takes every group)."""
    def spec_of(case):
        x, weight, _ = inputs(case, "float16")
        return ConvSpec.for_conv("patch_conv2d", x, weight, None, 1, case.padding, 1, 1, leading_dims=True)
    seed = dataclasses.replace(CASES[0], x=(1, 20480, 32, 4, 4))
    plan = igemm.plan_patch_weight(spec_of(seed))
    assert (plan.patches, plan.tile_units, plan.grid) == (8, 6, (88, 3)), plan
    assert plan.shared_mem == 67200   # rows table 4,608, x tile 10,880 (two slices: 32 channels), two dy tiles
                                      # 34,816 (16 chunk rows of 68 chunks), raw x 16,896: three blocks an SM fit
    wide = igemm.plan_patch_weight(spec_of(CASES[5]))
    assert (wide.patches, wide.tile_units, wide.grid) == (2, 6, (2, 26)), wide   # 75 units: 13 tiles, x 2 d tiles


@pytest.mark.parametrize("kwargs, why", [
    (dict(stride=2), "stride 1"), (dict(dilation=2), "dilation 1"), (dict(channels=24), "multiples of 16"),
    (dict(size=12), "at most 128 output pixels"), (dict(dtype=numpy.float32), "float16 and bfloat16"),
    (dict(size=11, channels=96, kernel=1, padding=0), "weight gradient's shared memory")])
def test_refusals(kwargs, why):
    c, size, dtype = kwargs.pop("channels", 16), kwargs.pop("size", 4), kwargs.pop("dtype", numpy.float16)
    k, padding = kwargs.pop("kernel", 3), kwargs.pop("padding", 1)
    spec = ConvSpec.for_conv("patch_conv2d", numpy.empty((3, c, size, size), dtype),
                             numpy.empty((32, c, k, k), dtype), None, kwargs.get("stride", 1), padding,
                             kwargs.get("dilation", 1), 1, leading_dims=True)
    assert why in igemm.patch_weight_refusal(spec, dtype)


def test_refuses_sums_past_32_bits():
    """264 splits of a 1024 x 1024 x 3 x 3 grad_weight (2.5 G floats) would overflow the kernel's int offsets."""
    spec = ConvSpec.for_conv("patch_conv2d", numpy.empty((3, 1024, 4, 4), numpy.float16),
                             numpy.empty((1024, 1024, 3, 3), numpy.float16), None, 1, 1, 1, 1, leading_dims=True)
    assert igemm.patch_igemm_refusal(spec, numpy.float16, shared=False) is None
    assert "32 bits" in igemm.patch_weight_refusal(spec, numpy.float16)


def test_a_transposed_view_takes_the_old_path():
    """x not C-contiguous: conv_bwd_weight_igemm on the channels-last copies, the same values."""
    rng = numpy.random.default_rng(1)
    x = rng.standard_normal((2, 16, 5, 4, 4)).astype(numpy.float16).swapaxes(1, 2)   # (2, 5, 16, 4, 4)
    weight = rng.standard_normal((32, 16, 3, 3)).astype(numpy.float16)
    gy = rng.standard_normal((2, 5, 32, 4, 4)).astype(numpy.float16)
    device = Recorder()
    with _device.use_device(device):
        got = cupyconv.patch_conv2d_backward(gy, x, weight, padding=1, needs=("weight",))
    assert not device.count("patch_bwd_weight_igemm") and device.count("conv_bwd_weight_igemm"), device.launches
    want = cupyconv.patch_conv2d_backward(*(numpy.asarray(a, numpy.float64) for a in (gy, x, weight)), padding=1,
                                          needs=("weight",))
    assert_close(got[1], want[1], "float16", "view")


def test_few_groups_take_the_old_path(monkeypatch):
    """Under PW_MIN_GROUPS groups of patches the weight gradient stays on conv_bwd_weight_igemm."""
    monkeypatch.setattr(igemm, "PW_MIN_GROUPS", 3)   # 11 patches: 2 groups of 8
    device, got, want = run_backward(CASES[0], "float16", monkeypatch)
    assert not device.count("patch_bwd_weight_igemm") and device.count("conv_bwd_weight_igemm"), device.launches
    assert_close(got[1], want[1], "float16", "few groups")
    monkeypatch.setattr(igemm, "PW_MIN_GROUPS", 2)
    device, got, want = run_backward(CASES[0], "float16", monkeypatch)
    assert device.count("patch_bwd_weight_igemm"), device.launches


def test_asan():
    """The short last group copies its own patches only (reading past x or grad_output would be an out-of-bounds
    read that no result shows: the rows of missing patches are zeros)."""
    assert_clean_under_asan(pytest_under_asan(
        "tests/test_patch_weight_igemm.py::test_weight_grad_matches_cpu_path[seed-like-odd-n-float16]"))
