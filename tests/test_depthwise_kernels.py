"""Depthwise kernels (raw_kernels/depthwise.cu) through the CPU emulator and, with -m gpu, on a real GPU.

The NumPy CPU path is the reference here; it is itself checked against torch and a naive loop in
tests/test_depthwise.py.  Every case also names the kernels it must reach, so a planner change that silently
sends a shape to a fallback fails here instead of going untested.

The bug classes of issue 12 (each side's padding alone and the last row and column, 16-bit accumulation, loops
over several blocks, 64-bit indices past 2^31) are covered on purpose for every kernel here: the table in
tests/emulator/README.md ("Bug classes the kernel tests cover on purpose") names the test of each.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy
import pytest

import cupyconv
from cupyconv import _device, _kernels
from cupyconv._spec import ConvSpec
from cupyconv.ops import depthwise as depthwise_module
import bug_classes
import reference as ref
from emulator import EmulatedDevice, assert_clean_under_asan, pytest_under_asan

NEEDS = ("input", "weight", "bias")
NEEDS_SUBSETS = [("input",), ("weight",), ("bias",), ("weight", "bias"), ("input", "bias")]


@dataclass(frozen=True)
class Case:
    """x (N, C, H, W), weight (C * m, 1, *kernel); `kernels`: (forward, input grad, weight grad) kernels it uses,
    as name expressions without the element and index types."""
    name: str
    x: tuple
    m: int
    kernel: tuple
    kernels: tuple
    window: dict = field(default_factory=dict)
    bias: bool = True


def C(name, x, m, k, kernels, bias=True, **window):
    return Case(name, x, m, (k, k) if isinstance(k, int) else k, kernels, window, bias)


SPEC_3_1 = ("depthwise_fwd<3, 1>", "depthwise_bwd_input<3>", "depthwise_bwd_weight<3, 1>")
GENERIC_1 = ("depthwise_fwd_generic", "depthwise_bwd_input_generic", "depthwise_bwd_weight_generic")
GENERIC_S = ("depthwise_fwd_generic", "depthwise_bwd_input_strided", "depthwise_bwd_weight_generic")
PLANES_1 = ("depthwise_fwd_planes", "depthwise_bwd_input_planes", "depthwise_bwd_weight_generic")
PLANES_K4 = ("depthwise_fwd_planes<4>", "depthwise_bwd_input_planes<4>", "depthwise_bwd_weight_planes<4>")
LARGE_1 = ("depthwise_fwd_generic", "depthwise_bwd_input_generic", "depthwise_bwd_weight_large")
WIDE_1 = ("depthwise_fwd_large", "depthwise_bwd_input_large", "depthwise_bwd_weight_lanes")  # LARGE_MIN_K and up
DIRECT = ("depthwise_fwd_direct", "depthwise_bwd_input_strided", "depthwise_bwd_weight_direct")

# Odd sizes throughout (never multiples of a tile, a strip or a warp).
CASES = [
    # the specialisations, K x S
    C("k3s1_packed_images", (3, 3, 9, 11), 1, 3, SPEC_3_1, padding=1),
    C("k3s1_several_tiles", (1, 2, 37, 35), 1, 3, SPEC_3_1, padding=1),
    C("k3s2", (2, 3, 11, 13), 1, 3, ("depthwise_fwd<3, 2>", "depthwise_bwd_input_phased<3, 2>",
                                      "depthwise_bwd_weight<3, 2>"), stride=2, padding=1),
    C("k3s2_several_tiles", (1, 2, 37, 35), 1, 3, ("depthwise_fwd<3, 2>", "depthwise_bwd_input_phased<3, 2>",
                                                   "depthwise_bwd_weight<3, 2>"), stride=2, padding=1),
    # depthwise_bwd_input_phased's four phases (pad_top, pad_left mod 2): (0, 1) with 4-element row stores (20
    # columns), (1, 0) element by element
    C("k3s2_phase_columns", (2, 2, 13, 20), 1, 3, ("depthwise_fwd<3, 2>", "depthwise_bwd_input_phased<3, 2>",
                                                   "depthwise_bwd_weight<3, 2>"), stride=2, padding=((2, 0), (1, 1))),
    C("k7s2_phase_rows", (1, 2, 17, 14), 1, 7, ("depthwise_fwd<7, 2>", "depthwise_bwd_input_phased<7, 2>",
                                                "depthwise_bwd_weight<7, 2>"), stride=2, padding=((3, 2), (2, 5))),
    C("k5s1_multiplier2", (2, 2, 9, 10), 2, 5, ("depthwise_fwd<5, 1>", "depthwise_bwd_input<5>",
                                                "depthwise_bwd_weight<5, 1>"), padding=2),
    C("k5s2_per_side", (1, 3, 13, 11), 1, 5, ("depthwise_fwd<5, 2>", "depthwise_bwd_input_phased<5, 2>",
                                              "depthwise_bwd_weight<5, 2>"), stride=2, padding=((2, 1), (0, 3))),
    C("k7s1", (2, 2, 8, 9), 1, 7, ("depthwise_fwd<7, 1>", "depthwise_bwd_input<7>", "depthwise_bwd_weight<7, 1>"),
      padding=3),
    C("k7s2_multiplier2", (1, 2, 15, 13), 2, 7, ("depthwise_fwd<7, 2>", "depthwise_bwd_input_phased<7, 2>",
                                                 "depthwise_bwd_weight<7, 2>"), stride=2, padding=3),
    # planes smaller than the kernel, 1x1 and 4x4 planes
    C("k7_same_on_4x4", (5, 2, 4, 4), 1, 7, ("depthwise_fwd<7, 1>", "depthwise_bwd_input<7>",
                                             "depthwise_bwd_weight<7, 1>"), padding="same"),
    C("k3_plane_1x1", (3, 4, 1, 1), 1, 3, SPEC_3_1, padding=1),
    C("k5_larger_than_plane", (2, 2, 3, 3), 1, 5, ("depthwise_fwd<5, 1>", "depthwise_bwd_input<5>",
                                                   "depthwise_bwd_weight<5, 1>"), padding=1),
    C("tiny_4x4_k4_same", (9, 3, 4, 4), 1, 4, PLANES_K4, padding="same"),
    C("k9_on_4x4", (2, 2, 4, 4), 1, 9, PLANES_1[:2] + ("depthwise_bwd_weight_large",), padding=4),
    # tiny planes, one thread each: several units whose kernels wrap around the channels many times, a multiplier,
    # per-side padding; stride and dilation (the strided input gradient)
    C("planes_units_wrap_multiplier2", (45, 3, 4, 5), 2, (3, 4), PLANES_1, padding=((1, 2), (2, 0))),
    C("planes_dilation2_odd_padding", (3, 5, 5, 4), 1, 3, PLANES_1, padding=((3, 1), (1, 3)), dilation=2),
    # tiny planes with a <T, I, K> instantiation (TINY_KERNELS, zero-padded staging): per-side padding from 0 to
    # K - 1 (with a multiplier), odd planes over several units with kernels wrapping around the channels, planes
    # smaller than the kernel at the largest padding
    C("planes_k4_multiplier2_per_side", (7, 3, 4, 5), 2, 4, ("depthwise_fwd_planes<4>", PLANES_1[1], PLANES_K4[2]),
      padding=((0, 3), (3, 1))),  # the input gradient's two terms a plane: the runtime window
    C("planes_k4_per_side", (7, 5, 4, 5), 1, 4, PLANES_K4, padding=((3, 0), (1, 2))),
    C("planes_k4_units_wrap", (45, 3, 3, 5), 1, 4, PLANES_K4, bias=False, padding=((2, 1), (0, 2))),
    C("planes_k4_smaller_than_kernel", (3, 5, 2, 3), 1, 4, PLANES_K4, padding=3),
    C("planes_k4_padding_past_kernel", (3, 2, 3, 3), 1, 4, PLANES_1, padding=((4, 0), (0, 1))),  # runtime window
    C("planes_stride2_dilation2", (5, 7, 5, 6), 1, 3, ("depthwise_fwd_planes", "depthwise_bwd_input_strided",
                                                       "depthwise_bwd_weight_generic"), stride=2, padding=2, dilation=2),
    # the generic kernels: dilation, rectangles, strides, 'same', big kernels
    C("dilation2_multiplier2", (2, 3, 9, 11), 2, 3, GENERIC_1, padding=2, dilation=2),
    C("dilation2_stride2", (1, 2, 11, 9), 1, 3, GENERIC_S, stride=2, padding=2, dilation=2),
    C("rect_per_side_stride21", (2, 2, 9, 10), 1, (3, 5), GENERIC_S, stride=(2, 1), padding=((1, 0), (2, 1))),
    C("same_even_stride2", (2, 3, 10, 9), 1, 4, GENERIC_S, stride=2, padding="same"),
    C("k31", (1, 2, 9, 8), 1, 31, WIDE_1, padding=15),
    # depthwise_fwd_large / _bwd_input_large: the input gradient's two terms, per-side padding; a valid window (the
    # correlation padded past the kernel's edge); padding past the kernel (a negative correlation padding); a plane
    # wider than two chunks; 37 images (a full unit of LARGE_LANES and a short one); a rectangle
    C("k13_multiplier2_per_side", (3, 2, 14, 13), 2, 13, WIDE_1, padding=((6, 5), (3, 8))),
    C("k15x13_valid", (2, 3, 20, 19), 1, (15, 13), WIDE_1, bias=False),
    C("k13_padding_past_kernel", (1, 2, 9, 10), 1, 13, WIDE_1, padding=((14, 0), (1, 13))),
    C("k13_wide_plane", (2, 1, 5, 37), 1, 13, WIDE_1, padding=(6, 9)),
    C("k13_37_images", (37, 2, 9, 8), 1, (13, 14), WIDE_1, padding=(6, 7)),
    # depthwise_bwd_weight_lanes past LANES_THREADS: 85 items of a 33x33 kernel, 4 lanes each (352 threads), not 8
    C("k33_wide_lanes_threads", (8, 1, 9, 8), 1, 33, WIDE_1, padding=16),
    C("k13x9_generic", (2, 2, 9, 10), 1, (13, 9), LARGE_1, padding=(6, 4)),  # below LARGE_MIN_K on one side
    C("k7_dilation2_multiplier2", (2, 2, 9, 8), 2, 7, LARGE_1, padding=(5, 6), dilation=2),
    C("k6x9_stride2_dilation2", (3, 2, 11, 13), 1, (6, 9), ("depthwise_fwd_generic", "depthwise_bwd_input_strided",
                                                             "depthwise_bwd_weight_large"),
      stride=2, padding=((4, 3), (7, 9)), dilation=2),
    C("rect_stride1_multiplier3", (2, 2, 7, 6), 3, (2, 3), PLANES_1, padding=((0, 1), (1, 1))),
    C("rect_stride1_multiplier3_tiled", (2, 2, 9, 8), 3, (2, 3), GENERIC_1, padding=((0, 1), (1, 1))),
    # stride_h != stride_w where it matters: a tiled forward with two tiles along x (ox0 > 0), and the large-kernel
    # weight gradient with several output rows per tile (oy_l > 0)
    C("stride12_two_tiles_x", (1, 2, 7, 67), 1, 3, GENERIC_S, stride=(1, 2), padding=1),
    C("k6x9_stride21", (1, 2, 11, 13), 1, (6, 9), ("depthwise_fwd_generic", "depthwise_bwd_input_strided",
                                                    "depthwise_bwd_weight_large"), stride=(2, 1), padding=(2, 4)),
    # fallbacks: windows that do not overlap, tiles that cannot fit
    C("k1_multiplier3", (2, 3, 5, 6), 3, 1, DIRECT),
    C("k2_stride3", (1, 2, 10, 7), 1, 2, DIRECT, stride=3),
    C("k2_stride32", (1, 2, 11, 9), 1, 2, DIRECT, stride=(3, 2)),
    C("huge_dilation", (1, 2, 9, 9), 1, 3, ("depthwise_fwd_direct", "depthwise_bwd_input_gather",
                                            "depthwise_bwd_weight_direct"), dilation=60, padding=60),
    C("stride3_dilation2", (2, 2, 13, 11), 2, 3, GENERIC_S, stride=(3, 2), padding=((3, 1), (0, 2)),
      dilation=(2, 3)),
    # 16 columns: the 16-byte loads of every dtype; no bias
    C("aligned_rows_no_bias", (2, 2, 6, 16), 1, 3, SPEC_3_1, bias=False, padding=1),
    C("aligned_rows_stride2", (1, 2, 7, 16), 2, 5, ("depthwise_fwd<5, 2>", "depthwise_bwd_input_phased<5, 2>",
                                                    "depthwise_bwd_weight<5, 2>"), stride=2, padding=2),
]
CASE_BY_NAME = {case.name: case for case in CASES}


def short(name: str) -> str:
    """'depthwise_fwd<float, int, 3, 1>' -> 'depthwise_fwd<3, 1>'; 'depthwise_fwd_generic<float, int>' ->
    'depthwise_fwd_generic'."""
    return re.sub(r"<[^,<>]+, [^,<>]+(, )?", "<", name).replace("<>", "")


class Recorder(EmulatedDevice):
    """An EmulatedDevice that remembers every launch (name expression and arguments)."""

    def __init__(self, order="forward", **options):
        super().__init__(order, **options)
        self.launches, self.grids = [], []

    def launch(self, source, name, grid, block, args, shared_mem=0):
        self.launches.append((name, list(args)))
        self.grids.append((name, grid, list(args)))
        super().launch(source, name, grid, block, args, shared_mem)

    def kernels(self, pack=True):
        """The short names launched; pack=False drops the persistent kernels' PACK and SPREAD arguments (', true': the
        packed-channel instantiation of small planes; the weight gradient's SPREAD; ', false, true': the per-image
        SPREAD of narrow tiles), so that the tables below name a kernel whatever unit kind the planner picks
        (test_small_planes_pack_channels, test_weight_gradient_steps_through_its_units and
        test_narrow_tiles_spread_planes_against_bank_conflicts check that choice)."""
        names = [short(name) for name, _ in self.launches]
        return names if pack else [name.replace(", false, true>", ">").replace(", true>", ">") for name in names]


def _dtype(name):
    return pytest.importorskip("ml_dtypes").bfloat16 if name == "bfloat16" else numpy.dtype(name)


def make(case: Case, dtype="float64", seed=0):
    """x, weight, bias, grad_output of a case (N(0, 1) data in dtype)."""
    rng = numpy.random.default_rng(seed)
    n, c, h, w = case.x
    x = rng.standard_normal(case.x).astype(_dtype(dtype))
    weight = rng.standard_normal((c * case.m, 1, *case.kernel)).astype(x.dtype)
    bias = rng.standard_normal(c * case.m).astype(x.dtype) if case.bias else None
    out_shape = cupyconv.depthwise_conv2d(x[:1], weight, **case.window).shape[1:]
    grad_output = rng.standard_normal((n, *out_shape)).astype(x.dtype)
    return x, weight, bias, grad_output


# float64 at 1e-12 of the largest magnitude (the kernels sum in another order than NumPy); the half types are
# computed in float32 on both paths and rounded once, so they are about one rounding of the result apart.
TOLERANCE = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def assert_matches(actual, expected, dtype, what=""):
    assert actual is not None and expected is not None, what
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, \
        f"{what}: {actual.shape} {actual.dtype} != {expected.shape} {expected.dtype}"
    a, e = actual.astype(numpy.float64), expected.astype(numpy.float64)
    scale = max(float(numpy.abs(e).max(initial=0.0)), 1.0)
    tol = TOLERANCE[numpy.dtype(dtype).name if not isinstance(dtype, str) else dtype]
    numpy.testing.assert_allclose(a, e, rtol=tol, atol=tol * scale, err_msg=what)


def run_case(device, case: Case, dtype="float64", needs=NEEDS):
    """Forward and backward of `case` through `device` and through the CPU path; compares them."""
    x, weight, bias, grad_output = make(case, dtype)
    kw = case.window
    expected = cupyconv.depthwise_conv2d(x, weight, bias, **kw)
    grads_expected = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, needs=needs, **kw)
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, bias, **kw)
        grads = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, needs=needs, **kw)
    assert_matches(out, expected, dtype, f"{case.name} forward")
    for name, got, want in zip(NEEDS, grads, grads_expected):
        if name in needs:
            assert_matches(got, want, dtype, f"{case.name} grad {name}")
        else:
            assert got is None and want is None
    return out, grads


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_cpu_path(case, order):
    device = Recorder(order)
    run_case(device, case)
    used = device.kernels(pack=False)
    assert used[0] == case.kernels[0]
    assert set(case.kernels[1:]) == set(used[1:])


def test_every_specialisation_is_covered():
    used = {k for case in CASES for k in case.kernels}
    for k in depthwise_module.SPECIALISED_KERNELS:
        assert f"depthwise_bwd_input<{k}>" in used
        for s in depthwise_module.SPECIALISED_STRIDES:
            assert {f"depthwise_fwd<{k}, {s}>", f"depthwise_bwd_weight<{k}, {s}>"} <= used
    assert set(depthwise_module.GENERIC_KERNELS) - {"depthwise_bwd_bias"} <= used
    tiny = depthwise_module.TINY_KERNELS
    assert {f"{kernel}<{k}>" for kernel in depthwise_module.PLANE_KERNELS for k in tiny} <= used


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("name", ["k3s1_packed_images", "k5s2_per_side", "tiny_4x4_k4_same",
                                  "aligned_rows_no_bias", "k13_multiplier2_per_side"])
def test_dtypes(name, dtype):
    out, grads = run_case(EmulatedDevice(), CASE_BY_NAME[name], dtype)
    assert out.dtype == _dtype(dtype) and all(g.dtype == _dtype(dtype) for g in grads)


@pytest.mark.parametrize("needs", NEEDS_SUBSETS, ids=["+".join(n) for n in NEEDS_SUBSETS])
@pytest.mark.parametrize("name", ["k3s2", "tiny_4x4_k4_same", "k1_multiplier3"])
def test_needs_subsets(name, needs):
    device = Recorder()
    run_case(device, CASE_BY_NAME[name], needs=needs)
    used = set(device.kernels()[1:])
    assert ("depthwise_bwd_input" in " ".join(used)) == ("input" in needs)
    assert ("depthwise_bwd_weight" in " ".join(used)) == ("weight" in needs)
    # The bias alone has its own stage 1; with the weight it rides along in the weight kernel.
    assert ("depthwise_bwd_bias" in used) == (needs in (("bias",), ("input", "bias")))


@pytest.mark.parametrize("case", [C("tiles", (1, 2, 37, 35), 1, 3, SPEC_3_1, padding=1),
                                  C("tiny", (200, 3, 4, 4), 1, 4, GENERIC_1, padding=1),
                                  C("generic", (40, 2, 9, 11), 2, 3, GENERIC_1, padding=2, dilation=2),
                                  C("large", (5, 2, 9, 8), 1, (31, 9), LARGE_1, padding=(15, 4)),
                                  C("wide", (20, 2, 9, 8), 1, 31, WIDE_1, padding=15)],
                         ids=["tiles", "tiny", "generic", "large", "wide"])
def test_weight_gradient_is_deterministic(case):
    """Bits equal across runs and in reverse thread (and block) order; several partial rows and warps."""
    x, weight, _, grad_output = make(case, "float32")
    results = []
    for order in ("forward", "forward", "reverse"):
        device = Recorder(order)
        with _device.use_device(device):
            results.append(cupyconv.depthwise_conv2d_backward(grad_output, x, weight, needs=("weight", "bias"),
                                                              **case.window)[1:])
        launched = {short(name): args for name, args in device.launches}
        (partial,) = [args[2] for name, args in launched.items() if name.startswith("depthwise_bwd_weight")]
        assert partial.ndim == 2 and partial.shape[0] > 1, "the case should produce several partial rows"
        assert not device.arrival_counters(1).any(), "the counts are left at 0 for the next launch"
        stage1 = launched.get("depthwise_bwd_weight_generic", launched.get("depthwise_bwd_weight_planes<4>"))
        if stage1:  # its last argument, plane_channels: the tiny-plane units (> 0) or the tiled ones
            assert (stage1[-1] > 0) == (case.name == "tiny"), stage1
    for grad_w, grad_b in results[1:]:
        assert grad_w.tobytes() == results[0][0].tobytes() and grad_b.tobytes() == results[0][1].tobytes()
    expected = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, needs=("weight", "bias"), **case.window)
    assert_matches(results[0][0], expected[1], "float32")
    assert_matches(results[0][1], expected[2], "float32")


@pytest.mark.parametrize("planes_blocks, grid_cap, m, same", [(4, None, 1, True), (4, None, 2, True),
                                                             (2**20, 4, 1, False), (2**20, 4, 2, False)])
def test_tiny_kernel_planes_loop_over_units(monkeypatch, planes_blocks, grid_cap, m, same):
    """depthwise_fwd_planes<K> and depthwise_bwd_input_planes<K> (multiplier 1) with blocks that loop over several
    units: on a grid of whole images (PLANES_BLOCKS, `_planes_grid`), whose threads keep their kernel from unit to
    unit (loaded once), and on a capped grid that does not (loaded every unit).  1200 or 2400 planes of 6 or 12
    channels, 128 threads a block."""
    monkeypatch.setattr(depthwise_module, "PLANES_BLOCKS", planes_blocks)
    if grid_cap:
        monkeypatch.setattr(_kernels, "GRID_CAP", grid_cap)
    case = C("tiny_loop", (200, 6, 4, 4), m, 4, ("depthwise_fwd_planes<4>", "depthwise_bwd_input_planes<4>"
                                                  if m == 1 else "depthwise_bwd_input_planes",
                                                  "depthwise_bwd_weight_planes<4>"), padding=((1, 2), (2, 1)))
    grids = []

    class GridRecorder(Recorder):
        def launch(self, source, name, grid, block, args, shared_mem=0):
            grids.append((short(name), grid[0] * block[0]))
            super().launch(source, name, grid, block, args, shared_mem)

    run_case(GridRecorder("reverse"), case, "float32")
    dst_channels = {"depthwise_fwd_planes<4>": 6 * m, "depthwise_bwd_input_planes<4>": 6}
    steps = {name: step for name, step in grids if name in dst_channels}
    assert [name for name, _ in grids][:2] == list(case.kernels[:2]) and steps
    for name, step in steps.items():
        assert step < 200 * dst_channels[name], (name, step)  # the blocks loop
        assert (step % dst_channels[name] == 0) == same, (name, step)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape, m, padding", [
    ((37, 5, 4, 4), 1, 1),                   # the torch pathology's 4x4 planes padded by 1: 3x3 outputs
    ((9, 3, 4, 4), 2, ((0, 3), (2, 1))),     # a multiplier, per-side padding from 0 to K - 1
    ((11, 4, 3, 4), 1, ((3, 1), (0, 2))),    # 3x4 planes: in registers, not whole (staged flat)
])
def test_tiny_planes_in_registers_aligned_and_not(shape, m, padding, dtype):
    """Planes of at most 4x4 under a 4x4 window go to registers: whole 4x4 planes (and the kernels) in 16-byte loads
    where the tensor is 16-byte aligned, element by element where it is not, the others staged flat (16-byte copies
    where the run and its staging are aligned); every output, input gradient and weight and bias gradient matches
    the CPU path at both alignments (the offset copies hit the planes of a unit, the kernels and the g planes)."""
    case = C("in_registers", shape, m, 4, PLANES_K4 if m == 1 else
             ("depthwise_fwd_planes<4>", "depthwise_bwd_input_planes", "depthwise_bwd_weight_planes<4>"),
             padding=padding)
    x, weight, bias, grad_output = make(case, dtype, seed=7)
    expected = cupyconv.depthwise_conv2d(x, weight, bias, **case.window)
    grads_expected = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, **case.window)
    for offset in (0, x.itemsize):
        xs, ws, gs = (_misaligned(a, offset) for a in (x, weight, grad_output))
        assert (xs.ctypes.data % 16 == 0) == (offset == 0) and (ws.ctypes.data % 16 == 0) == (offset == 0)
        device = Recorder()
        with _device.use_device(device):
            out = cupyconv.depthwise_conv2d(xs, ws, bias, **case.window)
            grads = cupyconv.depthwise_conv2d_backward(gs, xs, ws, **case.window)
        assert device.kernels()[:3] == list(case.kernels[:1]) + list(case.kernels[1:3]), device.kernels()
        assert_matches(out, expected, dtype, f"offset {offset} forward")
        for name, got, want in zip(NEEDS, grads, grads_expected):
            assert_matches(got, want, dtype, f"offset {offset} grad {name}")


def test_tiny_planes_in_registers_past_2_31(monkeypatch):
    """The in-register 4x4 planes in the `long long` instantiations: two images of enough channels that the second
    image's planes (and the last kernels' weights, c * 16) start past 2^31 elements (sparse memory; only the last block
    of each launch runs: bug_classes.SparseDevice; one unit a block).  The last channel's output, input gradient and
    weight gradient match the CPU path on that channel alone."""
    bug_classes.lift_grid_cap(monkeypatch)
    monkeypatch.setattr(depthwise_module, "PLANES_BLOCKS", 2**40)  # a block a unit: the last block, the last planes
    rng, dtype = numpy.random.default_rng(62), numpy.float16
    channels = 2**31 // 16 + 64
    x = bug_classes.sparse_zeros((2, channels, 4, 4), dtype)
    x[:, -1] = rng.standard_normal((2, 4, 4))
    weight = bug_classes.sparse_zeros((channels, 1, 4, 4), dtype)
    weight[-1] = rng.standard_normal((1, 4, 4))
    grad_output = bug_classes.sparse_zeros((2, channels, 3, 3), dtype)
    grad_output[:, -1] = rng.standard_normal((2, 3, 3))
    device = bug_classes.SparseDevice()
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, padding=1)
        grad_x, grad_w, _ = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=1,
                                                               needs=("input", "weight"))
    assert [short(name.replace(", long long", ", int")) for name in device.launches][:3] == list(PLANES_K4)
    assert all(", long long" in name for name in device.launches[:3]), device.launches
    last = (x[:, -1:], numpy.array(weight[-1:]), grad_output[:, -1:])
    bug_classes.assert_tail_written(out, cupyconv.depthwise_conv2d(last[0], last[1], padding=1)[-1], dtype, 1,
                                    "forward, last plane")
    want = cupyconv.depthwise_conv2d_backward(last[2], last[0], last[1], padding=1, needs=("input", "weight"))
    bug_classes.assert_tail_written(grad_x, want[0][-1], dtype, 1, "input gradient, last plane")
    bug_classes.assert_tail_written(grad_w, want[1], dtype, 16, "weight gradient, last channel")


def test_tiny_plane_weight_gradient_spreads_over_blocks():
    """N=2048 C=1024 4x4 k4 (the torch pathology): the tiny-plane units of depthwise_bwd_weight_planes<4>, a lane per
    channel (32 consecutive channels: each warp reads runs of contiguous planes) and a few images per unit, every
    lane busy; every channel group is split over many blocks, so no block walks the batch (planning only)."""
    x = numpy.broadcast_to(numpy.float32(0), (2048, 1024, 4, 4))  # shapes without the memory
    weight = numpy.broadcast_to(numpy.float32(0), (1024, 1, 4, 4))
    spec = ConvSpec.for_depthwise("test", x, weight, None, 1, 1, 1)
    plan = depthwise_module.plan_weight_grad(spec, True, 4)
    tiling = plan.tiling
    q = tiling.plane_channels
    assert plan.kernel == "depthwise_bwd_weight_planes" and q == 32 and tiling.per_block * q == tiling.threads >= 64
    assert tiling.shared_mem <= depthwise_module.SMEM_SOFT
    rows, units_per_block = depthwise_module.stage1_rows(tiling.units(2048), 1024 // q)
    assert rows >= 32 and units_per_block * tiling.per_block <= 2048 // 32
    # channels fewer than a warp: a power of two of lanes per image, the others idle
    small = ConvSpec.for_depthwise("test", x[:, :3], weight[:3], None, 1, 1, 1)
    assert depthwise_module.plan_weight_grad(small, True, 4).tiling.plane_channels == 4


def test_conv2d_with_groups_c_runs_the_depthwise_kernels():
    case = CASE_BY_NAME["k5s1_multiplier2"]
    x, weight, bias, grad_output = make(case)
    c = x.shape[1]
    device = Recorder()
    with _device.use_device(device):
        out = cupyconv.conv2d(x, weight, bias, groups=c, **case.window)
        grads = cupyconv.conv2d_backward(grad_output, x, weight, groups=c, **case.window)
    assert_matches(out, cupyconv.conv2d(x, weight, bias, groups=c, **case.window), "float64")
    for got, want in zip(grads, cupyconv.conv2d_backward(grad_output, x, weight, groups=c, **case.window)):
        assert_matches(got, want, "float64")
    assert device.kernels(pack=False)[0] == "depthwise_fwd<5, 1>"


def test_non_contiguous_arrays():
    case = CASE_BY_NAME["k3s2"]
    x, weight, bias, grad_output = make(case, "float32")
    xs = numpy.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # same values, F-order planes
    gs = numpy.ascontiguousarray(grad_output[:, :, ::-1])[:, :, ::-1]
    ws = numpy.repeat(weight, 2, axis=-1)[..., ::2]
    with _device.use_device(EmulatedDevice()):
        out = cupyconv.depthwise_conv2d(xs, ws, bias, **case.window)
        grads = cupyconv.depthwise_conv2d_backward(gs, xs, ws, **case.window)
    assert_matches(out, cupyconv.depthwise_conv2d(x, weight, bias, **case.window), "float32")
    for got, want in zip(grads, cupyconv.depthwise_conv2d_backward(grad_output, x, weight, **case.window)):
        assert_matches(got, want, "float32")


def _misaligned(a, offset_bytes):
    """A copy of `a` whose data pointer is `offset_bytes` past a 16-byte boundary."""
    buffer = numpy.empty(a.nbytes + 32, numpy.uint8)
    start = (-buffer.ctypes.data) % 16 + offset_bytes
    out = buffer[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("padding", [1, ((1, 1), (0, 2))], ids=["pad1", "pad_left0"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_aligned_and_unaligned_rows(dtype, padding):
    """Rows of 16 elements: 16-byte loads when the base is aligned, element loads when it is not; same values."""
    case = CASE_BY_NAME["aligned_rows_no_bias"]
    x, weight, _, grad_output = make(case, dtype)
    expected = cupyconv.depthwise_conv2d(x, weight, padding=padding)
    grad_expected = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=padding, needs="input")[0]
    for offset in (0, x.itemsize):
        xs, gs = _misaligned(x, offset), _misaligned(grad_output, offset)
        assert (xs.ctypes.data % 16 == 0) == (offset == 0)
        with _device.use_device(EmulatedDevice()):
            out = cupyconv.depthwise_conv2d(xs, weight, padding=padding)
            grad_x = cupyconv.depthwise_conv2d_backward(gs, xs, weight, padding=padding, needs="input")[0]
        assert_matches(out, expected, dtype, f"offset {offset}")
        assert_matches(grad_x, grad_expected, dtype, f"offset {offset}")


def test_empty_batch():
    x = numpy.zeros((0, 3, 5, 5))
    weight = numpy.ones((6, 1, 3, 3))
    with _device.use_device(EmulatedDevice()):
        out = cupyconv.depthwise_conv2d(x, weight, numpy.ones(6), padding=1)
        grad_x, grad_w, grad_b = cupyconv.depthwise_conv2d_backward(numpy.zeros((0, 6, 5, 5)), x, weight,
                                                                    padding=1)
    assert out.shape == (0, 6, 5, 5) and grad_x.shape == x.shape
    assert not grad_w.any() and grad_w.shape == weight.shape and not grad_b.any() and grad_b.shape == (6,)


ONE_OF_EACH = ["k3s1_packed_images", "rect_per_side_stride21", "k7_dilation2_multiplier2", "k1_multiplier3",
               "huge_dilation", "planes_units_wrap_multiplier2", "planes_k4_multiplier2_per_side",
               "k7s1", "k5s1_multiplier2",  # small planes from 5x5 on: spread planes, staged weights (SPREAD_MIN_K)
               "k13_37_images"]  # the large kernels: two units a channel


def run_every_kernel(device):
    """Each depthwise.cu kernel family at least once (bias alone included); returns the kernels launched."""
    for name in ONE_OF_EACH:
        run_case(device, CASE_BY_NAME[name])
    run_case(device, CASE_BY_NAME["k3s2"], needs=("bias",))
    families = {short(name).split("<")[0] for name, _ in device.launches}
    assert families == {"depthwise_fwd", "depthwise_bwd_input", "depthwise_bwd_weight", "depthwise_bwd_weight_planes",
                        *depthwise_module.GENERIC_KERNELS}
    return device


def test_small_grids_loop_over_the_work(monkeypatch):
    """One block for all the work (grids are clipped like this on huge tensors): it takes every unit, partial row
    and element in turn."""
    monkeypatch.setattr(_kernels, "GRID_CAP", 1)
    monkeypatch.setattr(depthwise_module, "elementwise_launch", lambda total, block=256: ((1,), (64,)))
    run_every_kernel(Recorder("reverse"))


# depthwise_fwd<K, S> on a grid of FORWARD_BLOCKS blocks that step through the units (tile column, tile row, kernel
# of the channel, channel, image group) in mixed radix: (shape, multiplier, kernel, stride, padding, dtype).
PERSISTENT_CASES = [
    ((3, 3, 37, 35), 2, 3, 1, 1, "float32"),   # 2 x 2 tiles, 6 output channels, 3 images: 72 units
    ((40, 2, 7, 7), 2, 3, 1, 1, "float32"),    # whole planes: channels packed, 4 output channels per unit, 40 images
    ((2, 3, 20, 32), 1, 5, 2, 2, "float16"),   # 16-byte rows of halves, stride 2
    ((2, 2, 19, 24), 3, 7, 1, 3, "float32"),   # 7x7, multiplier 3, aligned rows with an unaligned halo
]


@pytest.mark.parametrize("blocks", [1, 5, 7, 13])
@pytest.mark.parametrize("shape, m, k, stride, padding, dtype", PERSISTENT_CASES)
def test_forward_blocks_loop_over_every_digit(monkeypatch, blocks, shape, m, k, stride, padding, dtype):
    """The persistent forward with fewer blocks than units, at steps that carry into every digit: a unit
    decoded or stepped wrongly (a wrong channel, tile or image group) leaves outputs unwritten (poisoned: NaN) or
    written from the wrong plane."""
    monkeypatch.setattr(depthwise_module, "FORWARD_BLOCKS", blocks)
    rng = numpy.random.default_rng(blocks)
    x = rng.standard_normal(shape).astype(dtype)
    weight = rng.standard_normal((shape[1] * m, 1, k, k)).astype(dtype)
    bias = rng.standard_normal(shape[1] * m).astype(dtype)
    device = Recorder("reverse")
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, bias, stride=stride, padding=padding)
    (name, args), = device.launches
    assert short(name).split(">")[0] in (f"depthwise_fwd<{k}, {stride}", f"depthwise_fwd<{k}, {stride}, true",
                                         f"depthwise_fwd<{k}, {stride}, false, true")  # (PACK, SPREAD)
    expected = ref.depthwise_conv2d(x.astype(numpy.float64), weight.astype(numpy.float64),
                                    bias.astype(numpy.float64), stride=stride, padding=padding)
    assert_matches(out, expected.astype(dtype), dtype, f"{blocks} blocks")


@pytest.mark.parametrize("blocks", [1, 5, 7, 13])
@pytest.mark.parametrize("shape, m, k, padding, dtype", [(s, m, k, p, d) for s, m, k, st, p, d in PERSISTENT_CASES
                                                         if st == 1])
def test_input_gradient_blocks_loop_over_every_digit(monkeypatch, blocks, shape, m, k, padding, dtype):
    """The persistent input gradient (stride 1: the forward's kernel over grad_output, m planes staged per unit,
    flipped kernels) on fewer blocks than units, as above."""
    monkeypatch.setattr(depthwise_module, "FORWARD_BLOCKS", blocks)
    rng = numpy.random.default_rng(blocks + 100)
    x = rng.standard_normal(shape).astype(dtype)
    weight = rng.standard_normal((shape[1] * m, 1, k, k)).astype(dtype)
    grad_output = rng.standard_normal((shape[0], shape[1] * m, *shape[2:])).astype(dtype)
    device = Recorder("reverse")
    with _device.use_device(device):
        grad_x = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=padding, needs="input")[0]
    (name, args), = device.launches
    assert short(name).split(">")[0] in (f"depthwise_bwd_input<{k}", f"depthwise_bwd_input<{k}, true",
                                         f"depthwise_bwd_input<{k}, false, true")
    assert args[-1] > 0  # per_block
    as64 = [a.astype(numpy.float64) for a in (grad_output, x, weight)]
    expected = cupyconv.depthwise_conv2d_backward(*as64, padding=padding, needs="input")[0]
    assert_matches(grad_x, expected.astype(dtype), dtype, f"{blocks} blocks")


# The 16-bit 3x3 stride-1 per-image units copy rows of whole aligned 4-element slots raw with stage_rows16 (one 8-byte
# cp.async a row a thread, slots outside the plane zero-filled), and the items read their halves x0 mod 4 =
# -pad_left mod 4 halves into a row (load_raw_row).  Left paddings 0..3 take every shift; widths of 56 two 28-wide
# tiles (SPREAD) and of 24, 36 one tile (the per-image instantiation without SPREAD); heights that leave a partial
# strip; images past a partial group (rows of no plane: zeros); the unaligned base takes the same slots by element
# loads (the same raw layout).  Multipliers 1 (the forward's ONE_TERM rows and the input gradient's) to 3; 3-high
# planes of 8 images (64 threads, 6 staged rows a plane) whose staging pass steps a whole plane, at multipliers 1
# and 2 (the pass's j and t from small_divmod; the taller cases' blocks pass less than a plane).  (Multiplier 2 on
# one-tile planes packs.)
ROWS16_CASES = [  # (shape, multiplier, padding)
    ((3, 2, 13, 56), 1, ((1, 1), (1, 1))),
    ((2, 3, 9, 24), 2, ((0, 2), (0, 0))),
    ((2, 2, 11, 36), 1, ((2, 0), (2, 1))),
    ((3, 1, 7, 56), 3, ((1, 2), (3, 3))),
    ((8, 2, 3, 56), 1, ((1, 1), (0, 2))),  # per-image input gradients whose pass steps a plane (pass_q = 1) ...
    ((8, 2, 3, 56), 2, ((1, 1), (0, 2))),  # ... multiplier 1 and 2 (small_divmod's digits, the t carry)
]


@pytest.mark.parametrize("blocks", [1, 3, 2048])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape, m, padding", ROWS16_CASES)
def test_16_bit_3x3_rows_staged_in_batches(monkeypatch, blocks, shape, m, padding, dtype):
    """The forward and input gradient against float64 references (outputs poisoned), on aligned and unaligned
    bases: halves read at the wrong shift, a slot outside the plane read or not zeroed, a row copied into the wrong
    cell or skipped, a copy read before its wait shows here."""
    monkeypatch.setattr(depthwise_module, "FORWARD_BLOCKS", blocks)
    rng = numpy.random.default_rng(blocks + shape[-1] + m)
    x = rng.standard_normal(shape).astype(_dtype(dtype))
    weight = rng.standard_normal((shape[1] * m, 1, 3, 3)).astype(x.dtype)
    bias = rng.standard_normal(shape[1] * m).astype(x.dtype)
    out_shape = ref.depthwise_conv2d(x[:1].astype(numpy.float64), weight.astype(numpy.float64),
                                     padding=padding).shape
    grad_output = rng.standard_normal((shape[0], *out_shape[1:])).astype(x.dtype)
    as64 = [a.astype(numpy.float64) for a in (x, weight, bias, grad_output)]
    expected = ref.depthwise_conv2d(*as64[:3], padding=padding).astype(x.dtype)
    grad_expected = cupyconv.depthwise_conv2d_backward(as64[3], as64[0], as64[1], padding=padding,
                                                       needs="input")[0].astype(x.dtype)
    for offset in (0, x.itemsize):
        xs, gs = _misaligned(x, offset), _misaligned(grad_output, offset)
        device = Recorder("reverse")
        with _device.use_device(device):
            out = cupyconv.depthwise_conv2d(xs, weight, bias, padding=padding)
            grad_x = cupyconv.depthwise_conv2d_backward(gs, xs, weight, padding=padding, needs="input")[0]
        assert device.kernels(pack=False) == ["depthwise_fwd<3, 1>", "depthwise_bwd_input<3>"], device.kernels()
        assert_matches(out, expected, dtype, f"forward, offset {offset}")
        assert_matches(grad_x, grad_expected, dtype, f"input gradient, offset {offset}")


# Small planes (one tile covers the plane): the persistent forward and stride-1 input gradient pack consecutive
# channels of one image per unit (pack_channels) and write the unit's planes as one run through shared memory.
# Channel counts that leave the last group of each image partial; multipliers whose groups straddle input
# channels; float16 runs whose starts are 16-byte aligned in some images and not in others; stride 2.
# (shape, multiplier, kernel, stride, padding, dtype).
PACKED_CASES = [
    ((3, 71, 7, 7), 1, 5, 1, 2, "float32"),    # 71 channels of 7x7 in groups of 24: 24, 24, 23
    ((2, 9, 9, 9), 3, 3, 1, 1, "float16"),     # multiplier 3: the input gradient packs 9 channels (27 planes),
                                               # the forward images (it packs only at multiplier 1)
    ((2, 37, 7, 7), 1, 5, 1, 2, "float16"),    # groups of 32 planes (16-byte runs in image 0 only) and 5
    ((2, 19, 14, 14), 1, 3, 2, 1, "bfloat16"),  # stride 2: 7x7 outputs
    ((2, 11, 6, 5), 2, 7, 1, 3, "float64"),    # 7x7 kernel on a plane smaller than it
    # 3x3 (FLAT: the src run staged flat, outputs a pair at a time where dst_w is even): the 14x14 planes of the
    # benchmarks; a padding past K - 1, whose input gradient stages grad_output planes (12x12) that run past their
    # tiles (8x8 outputs: 10 rows from row -1), where a row staged unchecked would land on the next plane's halo
    ((2, 37, 14, 14), 1, 3, 1, 1, "float16"),
    ((3, 21, 8, 8), 1, 3, 1, 3, "float32"),
    ((1, 5, 32, 30), 1, 3, 1, 1, "float32"),   # the largest plane one tile covers (TILE_MAX); 37x35: several tiles
]


def _packed_plan(plan):
    tiling = plan.tiling
    assert tiling.pack_channels and tiling.tiles_x == tiling.tiles_y == 1, plan
    return tiling


def test_packed_cases_have_partial_groups():
    """PACKED_CASES leave a partial last group of channels in the forward and in the input gradient."""
    partial = set()
    for shape, m, k, stride, padding, dtype in PACKED_CASES:
        x, w = numpy.zeros(shape, _dtype(dtype)), numpy.zeros((shape[1] * m, 1, k, k), _dtype(dtype))
        spec = ConvSpec.for_depthwise("test", x, w, None, stride, padding, 1)
        acc = 8 if dtype == "float64" else 4
        fwd = depthwise_module.plan_forward(spec, acc, x.dtype.itemsize).tiling
        if fwd.pack_channels and spec.out_channels % fwd.per_block:
            partial.add("forward")
        if stride == 1:
            grad = _packed_plan(depthwise_module.plan_input_grad(spec, acc, x.dtype.itemsize))
            if spec.in_channels % grad.per_block:
                partial.add("input")
    assert partial == {"forward", "input"}


@pytest.mark.parametrize("blocks", [2, 7, 2048])
@pytest.mark.parametrize("shape, m, k, stride, padding, dtype", PACKED_CASES)
def test_small_planes_pack_channels(monkeypatch, blocks, shape, m, k, stride, padding, dtype):
    """Forward and input gradient (stride 1) of the packed-channel units against float64 references, outputs
    poisoned, on grids smaller and larger than the units.  A group's channel mapped wrongly (staged plane, weights,
    bias or output run), its partial tail written past the image, or the run copied with a wrong length or
    alignment shows here."""
    monkeypatch.setattr(depthwise_module, "FORWARD_BLOCKS", blocks)
    rng = numpy.random.default_rng(blocks + 7 * k)
    x = rng.standard_normal(shape).astype(_dtype(dtype))
    weight = rng.standard_normal((shape[1] * m, 1, k, k)).astype(x.dtype)
    bias = rng.standard_normal(shape[1] * m).astype(x.dtype)
    spec = ConvSpec.for_depthwise("test", x, weight, bias, stride, padding, 1)
    itemsize = x.dtype.itemsize
    fwd = depthwise_module.plan_forward(spec, 8 if dtype == "float64" else 4, itemsize).tiling
    assert fwd.pack_channels == (m == 1)
    grad_output = rng.standard_normal((shape[0], *spec.output_shape[1:])).astype(x.dtype)
    device = Recorder("reverse")
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, bias, stride=stride, padding=padding)
        grad_x = None
        if stride == 1:
            grad_x = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=padding, needs="input")[0]
    launched = device.kernels()
    # the PACK instantiation; with a multiplier, per-image units (of narrow tiles: SPREAD, `_spread_planes`)
    assert launched[0] in ([f"depthwise_fwd<{k}, {stride}, true>"] if m == 1 else
                           [f"depthwise_fwd<{k}, {stride}>", f"depthwise_fwd<{k}, {stride}, false, true>"])
    x64, w64, b64, g64 = (a.astype(numpy.float64) for a in (x, weight, bias, grad_output))
    expected = ref.depthwise_conv2d(x64, w64, b64, stride=stride, padding=padding)
    assert_matches(out, expected.astype(x.dtype), dtype, "forward")
    if stride == 1:
        assert launched[1] == f"depthwise_bwd_input<{k}, true>"
        _packed_plan(depthwise_module.plan_input_grad(spec, 8 if dtype == "float64" else 4, itemsize))
        expected = ref.depthwise_conv2d_grads(g64, x64, w64, padding=padding)[0]
        assert_matches(grad_x, expected.astype(x.dtype), dtype, "input gradient")


# The packed 16-bit 5x5 units stage their src run by 16-byte chunks (stage_chunks: the elements before the run's first
# 16-byte boundary and after its last whole chunk one a lane, each chunk's elements walked to their cells) where every
# plane element lands inside the tiles, else by elements: (shape, multiplier, padding, dtype).
CHUNK_CASES = [
    ((3, 37, 7, 7), 1, 2, "float16"),     # dw-1152-7k5's kernel: groups of 32 and 5 planes, runs whose starts are
                                          # 16-byte aligned in image 0 only (37 x 49 elements an image: odd)
    ((2, 21, 14, 14), 1, 2, "bfloat16"),  # dw-480-14k5's kernel (one chunk a batch for bfloat16)
    ((2, 13, 9, 11), 2, 1, "float16"),    # multiplier 2: the input gradient's 2 planes a channel; a rectangle
    ((2, 11, 7, 7), 1, 5, "float16"),     # padding 5: the input gradient's correlation pads by -1, planes cut by
                                          # the staged rows and columns (by elements); the forward's are inside
    ((3, 9, 6, 5), 1, 0, "float16"),      # no padding: 30-element planes, a 4-element tail
    ((2, 7, 20, 20), 1, 2, "float16"),    # rows of whole 8-byte slots (by rows before: dw-240-28k5's kernel)
]


@pytest.mark.parametrize("blocks", [3, 2048])
@pytest.mark.parametrize("shape, m, padding, dtype", CHUNK_CASES)
def test_packed_16_bit_5x5_stages_chunks(monkeypatch, blocks, shape, m, padding, dtype):
    """depthwise_fwd<5, 1, true> and depthwise_bwd_input<5, true> in 16 bits against float64 references, outputs
    poisoned, on a grid smaller and one larger than the units: a chunk's element walked to a wrong cell (a row or
    plane carry), a head or tail element lost or doubled, or a chunk read past the run shows here."""
    monkeypatch.setattr(depthwise_module, "FORWARD_BLOCKS", blocks)
    rng = numpy.random.default_rng(blocks + 31 * padding)
    x = rng.standard_normal(shape).astype(_dtype(dtype))
    weight = rng.standard_normal((shape[1] * m, 1, 5, 5)).astype(x.dtype)
    bias = rng.standard_normal(shape[1] * m).astype(x.dtype)
    spec = ConvSpec.for_depthwise("test", x, weight, bias, 1, padding, 1)
    grad_output = rng.standard_normal((shape[0], *spec.output_shape[1:])).astype(x.dtype)
    device = Recorder("reverse")
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, bias, padding=padding)
        grad_x = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=padding, needs="input")[0]
    launched = device.kernels()
    assert launched[0] in (["depthwise_fwd<5, 1, true>"] if m == 1 else
                           ["depthwise_fwd<5, 1>", "depthwise_fwd<5, 1, false, true>"])
    assert launched[1] == "depthwise_bwd_input<5, true>"
    x64, w64, b64, g64 = (a.astype(numpy.float64) for a in (x, weight, bias, grad_output))
    expected = ref.depthwise_conv2d(x64, w64, b64, padding=padding)
    assert_matches(out, expected.astype(x.dtype), dtype, "forward")
    expected = ref.depthwise_conv2d_grads(g64, x64, w64, padding=padding)[0]
    assert_matches(grad_x, expected.astype(x.dtype), dtype, "input gradient")


# The packed forward (3x3 and 5x5, every dtype; float32 5x5 only where its rows are not whole 16-byte chunks) stages
# its src run by 16-byte chunks too (task dwsmall, 24th session): (shape, kernel, stride, padding, dtype, bytes x's
# data starts past a 16-byte boundary).
FORWARD_CHUNK_CASES = [
    ((2, 37, 14, 14), 5, 1, 2, "float32", 0),  # dw-480-14k5's kernel in float32: 56-byte rows, runs aligned or not
    ((3, 19, 7, 7), 5, 1, 2, "float32", 4),    # dw-1152-7k5's in float32, x misaligned: a head of 3
    ((2, 21, 14, 14), 3, 1, 1, "float16", 6),  # dw-480-14's 3x3 packed units, a head of 5
    ((3, 9, 5, 4), 3, 1, 1, "float32", 8),     # rows of a chunk each, cut by chunks that start mid-row (w = C)
    ((2, 11, 5, 8), 3, 1, 1, "bfloat16", 4),   # the same in 16 bits
    ((2, 13, 9, 11), 3, 2, 1, "float64", 8),   # stride 2, double (2 a chunk), a rectangle
    ((2, 7, 6, 5), 3, 1, 3, "float32", 0),     # padding 3: a halo wider than the kernel's
]


@pytest.mark.parametrize("blocks", [3, 2048])
@pytest.mark.parametrize("shape, k, stride, padding, dtype, offset", FORWARD_CHUNK_CASES)
def test_packed_forward_stages_chunks(monkeypatch, blocks, shape, k, stride, padding, dtype, offset):
    """depthwise_fwd<K, S, true> with its src run staged by chunks, against a float64 reference, outputs poisoned, on a
    grid smaller and one larger than the units: an element walked to a wrong cell, a head or tail element lost or
    doubled shows here."""
    monkeypatch.setattr(depthwise_module, "FORWARD_BLOCKS", blocks)
    rng = numpy.random.default_rng(blocks + 13 * offset + shape[1])
    x = _misaligned(rng.standard_normal(shape).astype(_dtype(dtype)), offset)
    weight = rng.standard_normal((shape[1], 1, k, k)).astype(x.dtype)
    bias = rng.standard_normal(shape[1]).astype(x.dtype)
    device = Recorder("reverse")
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, bias, stride=stride, padding=padding)
    assert device.kernels() == [f"depthwise_fwd<{k}, {stride}, true>"]
    x64, w64, b64 = (a.astype(numpy.float64) for a in (x, weight, bias))
    expected = ref.depthwise_conv2d(x64, w64, b64, stride=stride, padding=padding)
    assert_matches(out, expected.astype(x.dtype), dtype, "forward")


# The packed 3x3 input gradient stages its grad_out run by 16-byte chunks like the forward (task dw5, 25th session),
# where the correlation's padding (2 - the forward's) keeps every plane element inside the tiles, else by elements:
# (shape, multiplier, padding, dtype, bytes grad_output's data starts past a 16-byte boundary).
INPUT_GRAD_CHUNK_CASES = [
    ((2, 21, 14, 14), 1, 1, "float16", 6),   # dw-480-14's packed units, a head of 5
    ((3, 9, 5, 4), 1, 1, "float32", 8),      # rows of a chunk each, cut by chunks that start mid-row (w = C)
    ((2, 11, 5, 8), 1, 1, "bfloat16", 4),    # the same in 16 bits
    ((2, 13, 9, 11), 2, 1, "float64", 8),    # multiplier 2: 2 grad_out planes a channel; double; a rectangle
    ((2, 7, 6, 5), 1, 0, "float32", 0),      # no padding: the correlation pads by 2
    ((2, 7, 6, 5), 1, 3, "float32", 4),      # padding 3: the correlation pads by -1, planes cut (by elements)
]


@pytest.mark.parametrize("blocks", [3, 2048])
@pytest.mark.parametrize("shape, m, padding, dtype, offset", INPUT_GRAD_CHUNK_CASES)
def test_packed_3x3_input_gradient_stages_chunks(monkeypatch, blocks, shape, m, padding, dtype, offset):
    """depthwise_bwd_input<3, true> with its grad_out run staged by chunks."""
    _check_packed_input_gradient(monkeypatch, blocks, 3, shape, m, padding, dtype, offset)


def _check_packed_input_gradient(monkeypatch, blocks, k, shape, m, padding, dtype, offset):
    """depthwise_bwd_input<k, true> against a float64 reference, outputs poisoned, on a grid smaller and one larger
    than the units: an element walked to a wrong cell, a head or tail element lost or doubled, a plane of the
    multiplier's terms misplaced shows here."""
    monkeypatch.setattr(depthwise_module, "FORWARD_BLOCKS", blocks)
    rng = numpy.random.default_rng(blocks + 11 * offset + shape[1] + padding + k)
    x = rng.standard_normal(shape).astype(_dtype(dtype))
    weight = rng.standard_normal((shape[1] * m, 1, k, k)).astype(x.dtype)
    spec = ConvSpec.for_depthwise("test", x, weight, None, 1, padding, 1)
    grad_output = _misaligned(rng.standard_normal((shape[0], *spec.output_shape[1:])).astype(x.dtype), offset)
    device = Recorder("reverse")
    with _device.use_device(device):
        grad_x = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=padding, needs="input")[0]
    assert device.kernels() == [f"depthwise_bwd_input<{k}, true>"]
    x64, w64, g64 = (a.astype(numpy.float64) for a in (x, weight, grad_output))
    expected = ref.depthwise_conv2d_grads(g64, x64, w64, padding=padding)[0]
    assert_matches(grad_x, expected.astype(x.dtype), dtype, "input gradient")


# The packed float32 5x5 input gradient stages its grad_out run by 16-byte chunks too (task dwk5, 26th session; the
# 16-bit ones already did), held to 128 registers by its explicit specialisations: (shape, multiplier, padding, bytes
# grad_output's data starts past a 16-byte boundary).
FLOAT_5X5_INPUT_GRAD_CASES = [
    ((3, 19, 7, 7), 1, 2, 4),     # dw-1152-7k5's planes, a head of 3: groups of 16 and 3 planes (49 elements: odd)
    ((2, 37, 14, 14), 1, 2, 0),   # dw-480-14k5's: 56-byte rows, runs aligned or not
    ((2, 13, 9, 11), 2, 1, 8),    # multiplier 2: 2 grad_out planes a channel (the correlation pads by 3); a rectangle
    ((3, 9, 6, 5), 1, 0, 12),     # no padding (the correlation pads by 4): 30-element planes, a tail
    ((2, 11, 7, 7), 1, 5, 0),     # padding 5: the correlation pads by -1, planes cut (by elements)
    ((2, 7, 20, 20), 1, 2, 0),    # rows of whole 16-byte chunks: by rows (float32 only)
]


@pytest.mark.parametrize("blocks", [3, 2048])
@pytest.mark.parametrize("shape, m, padding, offset", FLOAT_5X5_INPUT_GRAD_CASES)
def test_packed_float32_5x5_input_gradient_stages_chunks(monkeypatch, blocks, shape, m, padding, offset):
    """depthwise_bwd_input<float, 5, true> (its int specialisation) with its grad_out run staged by chunks."""
    _check_packed_input_gradient(monkeypatch, blocks, 5, shape, m, padding, "float32", offset)


# The packed 5x5 units stage their weights (one run, `terms` kernels a plane) by 16-byte chunks (stage_weight_chunks):
# the weights before the run's first 16-byte boundary and after its last whole chunk one a lane, each chunk stored by
# 16-byte shared stores where its place is 16-byte aligned, else by elements.  (shape, multiplier, dtype, bytes the
# weight's data starts past a 16-byte boundary.)
WEIGHT_CHUNK_CASES = [
    ((3, 37, 7, 7), 1, "float16", 0),    # groups of 32 and 5 planes: runs 1,600 and 250 bytes long, heads 0 and 3
    ((3, 37, 7, 7), 1, "float16", 2),    # odd heads (7): element stores; a 250-byte partial group's tail
    ((2, 21, 14, 14), 1, "bfloat16", 8),  # heads of 4: 16-byte stores after the head
    ((2, 19, 9, 11), 2, "float32", 4),   # multiplier 2 (the input gradient's 2 kernels a plane); heads 1-3
    ((3, 9, 6, 5), 1, "float32", 0),     # aligned float32: 16-byte stores throughout, a tail of 1-3
    ((2, 5, 7, 7), 1, "float64", 8),     # double: 2 a chunk, heads 0 and 1
    ((2, 11, 8, 8), 1, "bfloat16", 2),   # rows of a chunk each (stage_chunks' row ends one a chunk, at w = C)
]


@pytest.mark.parametrize("blocks", [2, 2048])
@pytest.mark.parametrize("shape, m, dtype, offset", WEIGHT_CHUNK_CASES)
def test_packed_5x5_weights_by_chunks(monkeypatch, blocks, shape, m, dtype, offset):
    """depthwise_fwd<5, 1, true> and depthwise_bwd_input<5, true> with their weights staged by chunks, against
    float64 references, outputs poisoned: a weight lost, doubled or stored to the wrong place (head, tail, a chunk's
    16-byte store) shows in every output of its plane."""
    monkeypatch.setattr(depthwise_module, "FORWARD_BLOCKS", blocks)
    rng = numpy.random.default_rng(blocks + 7 * offset + shape[1])
    x = rng.standard_normal(shape).astype(_dtype(dtype))
    weight = _misaligned(rng.standard_normal((shape[1] * m, 1, 5, 5)).astype(x.dtype), offset)
    spec = ConvSpec.for_depthwise("test", x, weight, None, 1, 2, 1)
    grad_output = rng.standard_normal((shape[0], *spec.output_shape[1:])).astype(x.dtype)
    device = Recorder("reverse")
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, None, padding=2) if m == 1 else None
        grad_x = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=2, needs="input")[0]
    launched = device.kernels()
    assert launched[-1] == "depthwise_bwd_input<5, true>"
    x64, w64, g64 = (a.astype(numpy.float64) for a in (x, weight, grad_output))
    if m == 1:
        assert launched[0] == "depthwise_fwd<5, 1, true>"
        assert_matches(out, ref.depthwise_conv2d(x64, w64, None, padding=2).astype(x.dtype), dtype, "forward")
    expected = ref.depthwise_conv2d_grads(g64, x64, w64, padding=2)[0]
    assert_matches(grad_x, expected.astype(x.dtype), dtype, "input gradient")


@pytest.mark.parametrize("offset", [2, 10])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_packed_chunks_across_rows_of_a_chunk(monkeypatch, dtype, offset):
    """stage_chunks on rows of exactly one chunk (8 elements of 16 bits: w = C), its run starting `offset` bytes past
    a 16-byte boundary: every chunk then ends one row and starts the next (its elements after the row's last jump
    to the next row), which planes of whole chunks from an aligned run never do (their chunks are whole rows, whose
    row end is a chunk's last element).  Forward and input gradient against float64, outputs poisoned."""
    monkeypatch.setattr(depthwise_module, "FORWARD_BLOCKS", 3)
    rng = numpy.random.default_rng(offset)
    x = _misaligned(rng.standard_normal((2, 11, 8, 8)).astype(_dtype(dtype)), offset)
    weight = rng.standard_normal((11, 1, 5, 5)).astype(x.dtype)
    spec = ConvSpec.for_depthwise("test", x, weight, None, 1, 2, 1)
    grad_output = rng.standard_normal((2, *spec.output_shape[1:])).astype(x.dtype)
    device = Recorder("reverse")
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, None, padding=2)
        grad_x = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=2, needs="input")[0]
    assert device.kernels() == ["depthwise_fwd<5, 1, true>", "depthwise_bwd_input<5, true>"]
    x64, w64, g64 = (a.astype(numpy.float64) for a in (x, weight, grad_output))
    assert_matches(out, ref.depthwise_conv2d(x64, w64, None, padding=2).astype(x.dtype), dtype, "forward")
    expected = ref.depthwise_conv2d_grads(g64, x64, w64, padding=2)[0]
    assert_matches(grad_x, expected.astype(x.dtype), dtype, "input gradient")


def test_packed_chunks_past_2_31(monkeypatch):
    """stage_chunks' run in the `long long` instantiation: two 7x7 float16 images of enough channels that the second
    image's planes start past 2^31 elements (sparse memory; only the last block runs: bug_classes.SparseDevice).  The
    last channel's outputs match the CPU path on that channel alone."""
    bug_classes.lift_grid_cap(monkeypatch)
    rng = numpy.random.default_rng(62)
    channels = 2**31 // 49 + 64
    x = bug_classes.sparse_zeros((2, channels, 7, 7), numpy.float16)
    x[:, -1] = rng.standard_normal((2, 7, 7))
    weight = bug_classes.sparse_zeros((channels, 1, 5, 5), numpy.float16)
    weight[-1] = rng.standard_normal((1, 5, 5))
    device = bug_classes.SparseDevice()
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, None, padding=2)
    assert short(device.launches[0].replace(", long long", ", int")) == "depthwise_fwd<5, 1, true>"
    assert ", long long" in device.launches[0]
    want = cupyconv.depthwise_conv2d(numpy.array(x[:, -1:]), numpy.array(weight[-1:]), None, padding=2)
    bug_classes.assert_tail_written(out, want[1:], numpy.float16, 49, "forward, last channel of the last image")


# The strided input gradients (depthwise_bwd_input_phased<K, 2>, depthwise_bwd_input_strided) on fewer blocks
# than units: (shape, multiplier, kernel, stride, dilation, padding, dtype, kernel launched).
STRIDED_UNIT_CASES = [
    ((3, 3, 37, 35), 2, 3, 2, 1, 1, "float32", "depthwise_bwd_input_phased<3, 2>"),  # 2 x 2 tiles, 3 channels
    ((2, 3, 20, 32), 1, 5, 2, 1, 2, "float16", "depthwise_bwd_input_phased<5, 2>"),
    ((2, 2, 19, 24), 3, 7, 2, 1, 3, "float32", "depthwise_bwd_input_phased<7, 2>"),   # multiplier 3
    ((40, 2, 9, 7), 1, (3, 4), 2, 1, 1, "float32", "depthwise_bwd_input_strided"),  # packed images
    ((3, 3, 37, 35), 1, 3, (2, 3), 2, 2, "float32", "depthwise_bwd_input_strided"),
]


@pytest.mark.parametrize("blocks", [1, 5, 7, 13])
@pytest.mark.parametrize("shape, m, k, stride, dilation, padding, dtype, kernel", STRIDED_UNIT_CASES)
def test_strided_input_gradient_blocks_loop_over_every_digit(monkeypatch, blocks, shape, m, k, stride, dilation,
                                                             padding, dtype, kernel):
    """The persistent strided input gradients on fewer blocks than units, at steps that carry into every digit
    (tile column, tile row, channel, image group): a unit stepped wrongly leaves pixels poisoned or wrong."""
    monkeypatch.setattr(depthwise_module, "FORWARD_BLOCKS", blocks)
    rng = numpy.random.default_rng(blocks + 200)
    kh, kw = (k, k) if isinstance(k, int) else k
    x = rng.standard_normal(shape).astype(dtype)
    weight = rng.standard_normal((shape[1] * m, 1, kh, kw)).astype(dtype)
    window = dict(stride=stride, padding=padding, dilation=dilation)
    out_shape = ref.depthwise_conv2d(x[:1, :1].astype(numpy.float64), weight[:1].astype(numpy.float64), None,
                                     **window).shape[2:]
    grad_output = rng.standard_normal((shape[0], shape[1] * m, *out_shape)).astype(dtype)
    device = Recorder("reverse")
    with _device.use_device(device):
        grad_x = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, needs="input", **window)[0]
    (name, args), = device.launches
    assert short(name) == kernel
    expected = ref.depthwise_conv2d_grads(*(a.astype(numpy.float64) for a in (grad_output, x, weight)), **window)[0]
    assert_matches(grad_x, expected.astype(dtype), dtype, f"{blocks} blocks")


@pytest.mark.parametrize("shape, k, padding", [((64, 96, 112, 112), 3, 1), ((3, 5, 37, 35), 5, 2),
                                               ((2, 3, 19, 24), 7, 3)])
def test_phased_items_cover_the_tile(shape, k, padding):
    """depthwise_bwd_input_phased's plan (the kernel's items: blocks of B x B pixels, B = 2 * PHASED_CELLS): tiles
    of whole blocks, and a thread for each block of the unit's images, no more than a warp of them idle
    (planning only)."""
    x = numpy.broadcast_to(numpy.float32(0), shape)
    weight = numpy.broadcast_to(numpy.float32(0), (shape[1], 1, k, k))
    spec = ConvSpec.for_depthwise("test", x, weight, None, 2, padding, 1)
    plan = depthwise_module.plan_input_grad(spec, 4, 4)
    t, side = plan.tiling, 2 * depthwise_module.PHASED_CELLS
    assert plan.kernel == "depthwise_bwd_input_phased" and t.tile_h % side == 0 and t.tile_w % side == 0
    items = t.per_block * (t.tile_h // side) * (t.tile_w // side)
    assert items <= t.threads < items + 32


# depthwise_bwd_weight<K, S[, SPREAD]>'s blocks over several consecutive units: (shape, multiplier, kernel, stride,
# padding, dtype, SPREAD: the whole-plane instantiation, and narrow tiles' (`_spread_planes`)) with (tile columns x
# rows x image groups) units per channel.
WEIGHT_UNIT_CASES = [
    ((23, 2, 37, 35), 1, 3, 1, 1, "float32", True),    # 2 x 2 x 3 (10 images per unit, the last group short), 20 wide
    ((3, 2, 70, 70), 1, 5, 2, 2, "float16", False),    # 2 x 2 x 1, stride 2
    ((9, 2, 40, 36), 2, 7, 1, 3, "float32", True),     # 2 x 2 x 1, multiplier 2, 20-wide tiles
    ((20, 2, 30, 30), 1, 3, 2, 1, "bfloat16", False),  # 1 x 1 x 2, packed images (3x3: not SPREAD)
    ((106, 2, 7, 7), 1, 5, 1, 2, "float16", True),     # 7x7 planes (8x8 tiles, padded planes): 35, 35, 35, 1 images
    ((11, 2, 13, 14), 2, 7, 1, 3, "float64", True),    # double: a bank row of 16 elements; multiplier 2
    # 14-wide rows, not whole 16-byte slots: x staged element by element, WEIGHT_ROW_BATCH rows' loads at a time
    # (stage_elements; ~20 rows a thread, the last batch partial), the H200's dw-480-14 fp16 kernel; 4 x 16 + 6 images
    ((70, 2, 14, 14), 1, 3, 1, 1, "float16", False),
    ((50, 2, 14, 14), 2, 3, 1, 1, "float32", False),   # multiplier 2 (two output channels read one x plane); 3 x 16 + 2
]


@pytest.mark.parametrize("stage1_blocks", [1, 3, 5])
@pytest.mark.parametrize("shape, m, k, stride, padding, dtype, spread", WEIGHT_UNIT_CASES)
def test_weight_gradient_steps_through_its_units(monkeypatch, stage1_blocks, shape, m, k, stride, padding, dtype,
                                                 spread):
    """depthwise_bwd_weight<K, S> with few partial rows, so a block walks many consecutive units and its unit
    digits (tile column, tile row, image group) carry into each other: a unit stepped wrongly sums the wrong
    tile or misses one.  Small planes take the SPREAD instantiation (planes first in the thread layout, staged
    planes padded): an item mapped to the wrong plane or strip, or a plane staged at the wrong offset, shows too."""
    monkeypatch.setattr(depthwise_module, "STAGE1_BLOCKS", stage1_blocks)
    device = _weight_gradients_match(numpy.random.default_rng(stage1_blocks + 200), shape, m, k, stride, padding, dtype)
    name = short(device.launches[0][0]).replace(", false, true>", ">").replace(", true, true>", ", true>")  # PAIRS
    assert name == f"depthwise_bwd_weight<{k}, {stride}{', true' if spread else ''}>"
    assert device.launches[0][1][-2] > 1, "units per block"


def _weight_gradients_match(rng, shape, m, k, stride, padding, dtype) -> Recorder:
    """The weight and bias gradients of fresh N(0, 1) data (blocks run in reverse) against the float64 CPU path;
    returns the device, whose launches the caller checks."""
    x = rng.standard_normal(shape).astype(dtype)
    weight = rng.standard_normal((shape[1] * m, 1, k, k)).astype(dtype)
    out_shape = cupyconv.depthwise_conv2d(x, weight, stride=stride, padding=padding).shape
    grad_output = rng.standard_normal(out_shape).astype(dtype)
    device = Recorder("reverse")
    with _device.use_device(device):
        _, grad_w, grad_b = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, stride=stride, padding=padding,
                                                               needs=("weight", "bias"))
    as64 = [a.astype(numpy.float64) for a in (grad_output, x, weight)]
    _, want_w, want_b = cupyconv.depthwise_conv2d_backward(*as64, stride=stride, padding=padding,
                                                           needs=("weight", "bias"))
    assert_matches(grad_w, want_w.astype(dtype), dtype, "weight")
    assert_matches(grad_b, want_b.astype(dtype), dtype, "bias")
    return device


@pytest.mark.parametrize("shape, k, padding, dtype, units", [
    ((64, 3, 14, 14), 3, 1, "float16", 4),   # dw-480-14's units: 16 images each, 4 a channel
    ((61, 2, 14, 14), 3, 1, "float32", 4),   # the last unit short (13 images)
    ((70, 2, 7, 7), 5, 2, "float32", 2),     # 7x7 planes, 5x5 (SPREAD): 35 images a unit, fewer than the minimum
])
def test_weight_gradient_blocks_take_several_units(monkeypatch, shape, k, padding, dtype, units):
    """depthwise_bwd_weight<K, S> on small planes, which have a few units a channel: a block takes at least
    STAGE1_MIN_UNITS of them (all, where the channel has fewer), so every channel is one partial row and each block
    reduces once over all its units, not once a unit (STAGE1_BLOCKS alone gave a block each); the sums match.  (Here
    with STAGE1_FILL_BLOCKS 1: a few channels, not the hundreds that fill a GPU.)"""
    assert depthwise_module.STAGE1_MIN_UNITS >= units
    monkeypatch.setattr(depthwise_module, "STAGE1_FILL_BLOCKS", 1)
    rng = numpy.random.default_rng(units + 300)
    x = rng.standard_normal(shape).astype(dtype)
    weight = rng.standard_normal((shape[1], 1, k, k)).astype(dtype)
    grad_output = rng.standard_normal(shape).astype(dtype)
    device = Recorder("reverse")
    with _device.use_device(device):
        _, grad_w, grad_b = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=padding,
                                                               needs=("weight", "bias"))
    (stage1, args), = device.launches  # no second launch: one row, written straight to the gradients
    assert short(stage1).startswith(f"depthwise_bwd_weight<{k}, 1")
    assert args[-2] == units, "units per block"
    assert args[2].shape == (1,), "one partial row: no partial buffer"
    as64 = [a.astype(numpy.float64) for a in (grad_output, x, weight)]
    _, want_w, want_b = cupyconv.depthwise_conv2d_backward(*as64, padding=padding, needs=("weight", "bias"))
    assert_matches(grad_w, want_w.astype(dtype), dtype, "weight")
    assert_matches(grad_b, want_b.astype(dtype), dtype, "bias")


@pytest.mark.parametrize("images, rows", [(37, 2), (37, 5), (3, 1)])
def test_lanes_weight_gradient_blocks_take_several_units(monkeypatch, images, rows):
    """depthwise_bwd_weight_lanes with several units (8 images each) a block: a thread keeps its item's sums over the
    block's units (the planes restaged between them), then the lanes add them; 37 images (a short last unit) in 2 or 5
    partial rows, and 3 images (4 lanes an item, one image past the batch).  Bits equal in reverse block order."""
    monkeypatch.setattr(depthwise_module, "STAGE1_BLOCKS", rows * 3)  # 3 channels: `rows` partial rows
    case = C("lanes_units", (images, 3, 9, 8), 1, (13, 15), WIDE_1, padding=((6, 5), (8, 7)))
    x, weight, _, grad_output = make(case, "float32", seed=images + rows)
    results = []
    for order in ("forward", "reverse"):
        device = Recorder(order)
        with _device.use_device(device):
            results.append(cupyconv.depthwise_conv2d_backward(grad_output, x, weight, needs=("weight", "bias"),
                                                              **case.window))
        (stage1, args), = device.launches
        assert short(stage1) == "depthwise_bwd_weight_lanes" and len(args[2]) == rows, (stage1, args[2].shape)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(results[0][1:], results[1][1:]))
    expected = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, needs=("weight", "bias"), **case.window)
    assert_matches(results[0][1], expected[1], "float32", "weight")
    assert_matches(results[0][2], expected[2], "float32", "bias")


@pytest.mark.parametrize("rows", [1, 4, 8, 13, 17])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_finish_sums_rows_in_order(monkeypatch, rows, dtype, order):
    """The last block of a channel to arrive (depthwise.cu's finish_rows) adds its `rows` partial rows in row order,
    FINISH_ROWS loads at a time, whichever block arrives last: the bias gradient alone with an image a row, each
    image's plane one value of mixed magnitude (its block sum exact), so the result is the bits of numpy's float32
    sum of the rows from 0 in order (another order rounds differently); one row: written straight, converted."""
    monkeypatch.setattr(depthwise_module, "STAGE1_BLOCKS", rows * 3)  # 3 channels: an image a row
    rng = numpy.random.default_rng(rows)
    values = (rng.standard_normal((rows, 3)) * 10.0 ** rng.integers(-4, 5, (rows, 3))).astype("float16")
    grad_output = numpy.zeros((rows, 3, 5, 4), dtype)
    grad_output[:, :, 2, 1] = values
    want = numpy.zeros(3, "float32")
    for r in range(rows):
        want += values[r].astype("float32")
    device = Recorder(order)
    x, weight = numpy.zeros((rows, 3, 5, 4), dtype), numpy.zeros((3, 1, 3, 3), dtype)
    for _ in range(2):  # the second launch counts from the counts the first left (0)
        with _device.use_device(device):
            _, _, got = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=1, needs="bias")
        assert got.tobytes() == want.astype(dtype).tobytes()
    assert [len(args[1]) for _, args in device.launches] == [rows] * 2, "partial rows"
    assert not device.arrival_counters(3).any(), "the counts are left at 0"


@pytest.mark.parametrize("shape, k, padding, dtype, kernel", [
    ((40, 2, 14, 14), 3, 1, "float16", "depthwise_bwd_weight<3, 1, false, true>"),  # from column -1: odd
    ((40, 2, 14, 14), 5, 2, "bfloat16", "depthwise_bwd_weight<5, 1, true, true>"),  # from column -2: even
    ((9, 2, 10, 6), 5, 1, "float16", "depthwise_bwd_weight<5, 1, true, true>"),     # rectangular, 6 wide, 2 units
    ((40, 2, 14, 14), 5, 2, "float32", "depthwise_bwd_weight<5, 1, true>"),         # 32-bit: no pairs
    ((40, 2, 7, 7), 3, 1, "float16", "depthwise_bwd_weight<3, 1>"),                 # odd width: no pairs
])
def test_weight_gradient_stages_even_rows_by_pairs(shape, k, padding, dtype, kernel):
    """depthwise_bwd_weight's PAIRS instantiations (16-bit, whole-plane tiles, even rows that are not whole 16-byte
    chunks): x staged by 2-element slots aligned in memory, from an odd or an even column; against float64."""
    rng = numpy.random.default_rng(shape[0] + k)
    x = rng.standard_normal(shape).astype(_dtype(dtype))
    weight = rng.standard_normal((shape[1], 1, k, k)).astype(_dtype(dtype))
    out_shape = cupyconv.depthwise_conv2d(x, weight, padding=padding).shape
    grad_output = rng.standard_normal(out_shape).astype(_dtype(dtype))
    device = Recorder("reverse")
    with _device.use_device(device):
        _, grad_w, grad_b = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=padding,
                                                               needs=("weight", "bias"))
    assert short(device.launches[0][0]) == kernel
    as64 = [a.astype(numpy.float64) for a in (grad_output, x, weight)]
    _, want_w, want_b = cupyconv.depthwise_conv2d_backward(*as64, padding=padding, needs=("weight", "bias"))
    assert_matches(grad_w, want_w.astype(_dtype(dtype)), dtype, "weight")
    assert_matches(grad_b, want_b.astype(_dtype(dtype)), dtype, "bias")


# depthwise_bwd_weight's FLAT staging (SPREAD, 32- and 64-bit data, whole-plane tiles whose rows are not whole
# 16-byte chunks; 16-bit data at stride 1 from SPREAD_MIN_K on planes of odd width, FLAT16): (shape, multiplier,
# kernel, stride, padding, dtype), each with a short last image group.
FLAT_WEIGHT_CASES = [
    ((70, 2, 14, 14), 1, 5, 1, 2, "float32"),   # dw-672-14k5's launch: 8 images a unit, 8 x 8 + 6
    ((37, 3, 7, 7), 2, 5, 1, 2, "float32"),     # 7x7 planes, multiplier 2 (two output channels read one x plane)
    ((23, 2, 13, 14), 1, 5, 1, 0, "float32"),   # no padding, rectangular: the plane's last rows past the outputs'
    ((21, 2, 14, 14), 1, 5, 2, 2, "float32"),   # stride 2
    ((19, 2, 13, 14), 2, 7, 1, 3, "float64"),   # 7x7 kernel, double
    ((29, 2, 7, 7), 1, 5, 1, 4, "float32"),     # padding 4: staged rows and columns past the plane on both sides
    ((70, 2, 7, 7), 1, 5, 1, 2, "float16"),     # FLAT16: dw-1152-7k5's planes, several units a channel
    ((37, 3, 7, 7), 2, 5, 1, 4, "bfloat16"),    # FLAT16, multiplier 2, padding 4 (past the plane on both sides)
    ((23, 2, 9, 7), 1, 7, 1, 3, "float16"),     # FLAT16: 7x7 kernel, rectangular plane of odd width
]


@pytest.mark.parametrize("stage1_blocks", [1, 4096])
@pytest.mark.parametrize("shape, m, k, stride, padding, dtype", FLAT_WEIGHT_CASES)
def test_weight_gradient_stages_small_planes_flat(monkeypatch, stage1_blocks, shape, m, k, stride, padding, dtype):
    """depthwise_bwd_weight<K, S, true> on whole-plane tiles of 7- and 14-wide rows stages a unit's planes flat, the
    halo zeroed once a block: a block of several units (STAGE1_BLOCKS 1: every unit of a channel; the last one
    short, its planes past the batch stale from the unit before) or of one, against float64."""
    monkeypatch.setattr(depthwise_module, "STAGE1_BLOCKS", stage1_blocks)
    monkeypatch.setattr(depthwise_module, "STAGE1_FILL_BLOCKS", 1)
    rng = numpy.random.default_rng(stage1_blocks + shape[0])
    (stage1, args), = _weight_gradients_match(rng, shape, m, k, stride, padding, dtype).launches
    assert short(stage1) == f"depthwise_bwd_weight<{k}, {stride}, true>"
    assert list(args[-5:-3]) == [1, 1], "one tile a plane"


@pytest.mark.parametrize("dtype, k, padding, kernel", [
    (numpy.float32, 5, 2, "depthwise_bwd_weight<5, 1, true>"),          # FLAT
    (numpy.float16, 3, 1, "depthwise_bwd_weight<3, 1, false, true>"),   # PAIRS, flat by pairs
])
def test_flat_weight_gradient_past_2_31(monkeypatch, dtype, k, padding, kernel):
    """The FLAT staging's plane offsets in the `long long` instantiation: two 14x14 images of enough channels that
    the second image's planes start past 2^31 (sparse memory; only the last block runs: bug_classes.SparseDevice).
    The last channel's weight gradient matches the CPU path on that channel alone."""
    bug_classes.lift_grid_cap(monkeypatch)
    rng = numpy.random.default_rng(61)
    channels = 2**31 // 196 + 64
    x = bug_classes.sparse_zeros((2, channels, 14, 14), dtype)
    x[:, -1] = rng.standard_normal((2, 14, 14))
    weight = bug_classes.sparse_zeros((channels, 1, k, k), dtype)
    grad_output = bug_classes.sparse_zeros((2, channels, 14, 14), dtype)
    grad_output[:, -1] = rng.standard_normal((2, 14, 14))
    device = bug_classes.SparseDevice()
    with _device.use_device(device):
        grad_w = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=padding, needs="weight")[1]
    assert short(device.launches[0].replace(", long long", ", int")) == kernel
    assert ", long long" in device.launches[0]
    want = cupyconv.depthwise_conv2d_backward(grad_output[:, -1:], x[:, -1:], numpy.array(weight[-1:]),
                                              padding=padding, needs="weight")[1]
    bug_classes.assert_tail_written(grad_w, want, dtype, k * k, "weight gradient, last channel")


# depthwise_bwd_weight's PAIRS instantiations staged flat by pairs (16-bit, whole-plane tiles, even rows that are not
# whole 16-byte chunks): (shape, multiplier, kernel, padding, dtype), each with a short last image group.
FLAT_PAIR_CASES = [
    ((70, 2, 14, 14), 1, 5, 2, "float16"),    # dw-672-14k5's launch: 8 images a unit, 8 x 8 + 6
    ((37, 2, 14, 14), 1, 3, 1, "bfloat16"),   # dw-480-14's kernel: pairs from column -1 (odd cells)
    ((23, 3, 13, 10), 2, 5, 0, "float16"),    # no padding, rectangular, multiplier 2
    ((29, 2, 14, 14), 1, 3, 2, "float16"),    # padding 2 (outputs past the 3x3 window): pairs from column -2
    ((19, 2, 10, 14), 1, 5, 3, "bfloat16"),   # padding 3 (outputs past the 5x5 window): pairs from column -3
]


@pytest.mark.parametrize("stage1_blocks", [1, 4096])
@pytest.mark.parametrize("shape, m, k, padding, dtype", FLAT_PAIR_CASES)
def test_weight_gradient_stages_pairs_flat(monkeypatch, stage1_blocks, shape, m, k, padding, dtype):
    """depthwise_bwd_weight<K, 1, SPREAD, true> stages a unit's planes flat, two elements a 4-byte load, the halo
    zeroed once a block: a block of several units (STAGE1_BLOCKS 1: every unit of a channel; the last one short, its
    planes past the batch stale from the unit before) or of one, against float64."""
    monkeypatch.setattr(depthwise_module, "STAGE1_BLOCKS", stage1_blocks)
    monkeypatch.setattr(depthwise_module, "STAGE1_FILL_BLOCKS", 1)
    rng = numpy.random.default_rng(stage1_blocks + shape[0] + 7)
    (stage1, args), = _weight_gradients_match(rng, shape, m, k, 1, padding, dtype).launches
    assert short(stage1) == f"depthwise_bwd_weight<{k}, 1, {'true' if k >= 5 else 'false'}, true>"
    assert list(args[-5:-3]) == [1, 1], "one tile a plane"



# depthwise_bwd_weight<3, S[, true]>'s RAW16 staging (16-bit, rows of whole 8-byte slots: x copied raw by cp.async, read
# `shift` = -pad_left mod 4 halves into its staged rows): (shape, multiplier, stride, padding, dtype), every shift at
# both strides, tiles several a plane and whole-plane ones, short last image groups.
RAW_WEIGHT_CASES = [
    ((9, 2, 56, 56), 1, 1, 1, "float16"),           # dw-256-56's tiles (28 x 28, 5 images a unit): shift 3
    ((7, 2, 37, 36), 1, 1, 0, "bfloat16"),          # no padding: shift 0; 37 rows (the last tile row short)
    ((5, 3, 20, 44), 2, 1, 2, "float16"),           # padding 2: shift 2, multiplier 2, 44 = 11 slots a row
    ((6, 2, 12, 12), 1, 1, 3, "float16"),           # padding 3: shift 1, outputs past the 3x3 window, whole planes
    ((4, 2, 30, 40), 1, 1, ((2, 1), (1, 2)), "bfloat16"),  # per side: the right padding past the last slot
    ((3, 2, 112, 112), 1, 2, 1, "float16"),         # dw-96-112s2's tiles (28 x 28 outputs, 57 x 57 staged): shift 3
    ((2, 3, 45, 68), 2, 2, 0, "bfloat16"),          # stride 2, no padding: shift 0, odd rows, multiplier 2
    ((3, 2, 24, 36), 1, 2, ((1, 2), (2, 3)), "float16"),  # stride 2, per side: shift 2
]


@pytest.mark.parametrize("stage1_blocks", [1, 4096])
@pytest.mark.parametrize("shape, m, stride, padding, dtype", RAW_WEIGHT_CASES)
def test_weight_gradient_stages_raw_16_bit_rows(monkeypatch, stage1_blocks, shape, m, stride, padding, dtype):
    """depthwise_bwd_weight<3, S[, true]> on 16-bit planes whose rows are whole 8-byte slots stages x as it is in
    memory (RAW16: 8-byte cp.async copies, slots outside the plane zero-filled) and reads each item's halves from
    `shift` halves in; a block of several units (STAGE1_BLOCKS 1) or of one, blocks in reverse, against float64."""
    monkeypatch.setattr(depthwise_module, "STAGE1_BLOCKS", stage1_blocks)
    monkeypatch.setattr(depthwise_module, "STAGE1_FILL_BLOCKS", 1)
    rng = numpy.random.default_rng(stage1_blocks + shape[0] + 11)
    (stage1, _), = _weight_gradients_match(rng, shape, m, 3, stride, padding, dtype).launches
    assert short(stage1).startswith(f"depthwise_bwd_weight<3, {stride}") and "false, true" not in stage1, stage1


def test_raw_weight_gradient_past_2_31(monkeypatch):
    """RAW16's plane offsets in the `long long` instantiation: two 56x56 float16 images of enough channels that the
    second image's planes start past 2^31 (sparse memory; only the last block runs); the last channel matches."""
    bug_classes.lift_grid_cap(monkeypatch)
    rng = numpy.random.default_rng(67)
    channels = 2**31 // (56 * 56) + 64
    x = bug_classes.sparse_zeros((2, channels, 56, 56), numpy.float16)
    x[:, -1] = rng.standard_normal((2, 56, 56))
    weight = bug_classes.sparse_zeros((channels, 1, 3, 3), numpy.float16)
    grad_output = bug_classes.sparse_zeros((2, channels, 56, 56), numpy.float16)
    grad_output[:, -1] = rng.standard_normal((2, 56, 56))
    device = bug_classes.SparseDevice()
    with _device.use_device(device):
        grad_w = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=1, needs="weight")[1]
    assert short(device.launches[0].replace(", long long", ", int")).startswith("depthwise_bwd_weight<3, 1")
    assert ", long long" in device.launches[0]
    want = cupyconv.depthwise_conv2d_backward(grad_output[:, -1:], x[:, -1:], numpy.array(weight[-1:]),
                                              padding=1, needs="weight")[1]
    bug_classes.assert_tail_written(grad_w, want, numpy.float16, 9, "weight gradient, last channel")

# The kernels the two memory-counter tests below launch (float32, 32-bit indices).  Their profile build (every access
# instrumented, -g) compiles these alone, not the file's 432 instantiations (~45 s of g++ on CI's two cores, of work
# no other test needed); the counters and the kernels are the same, and a launch outside the list fails loudly
# ("missing from its op's instantiations"), so the list cannot hide a change of kernel.
COUNTED = [("depthwise.cu", f"{name}>") for name in (
    "depthwise_fwd<float, int, 5, 1, true", "depthwise_bwd_input<float, int, 5, true",
    "depthwise_bwd_weight<float, int, 5, 1, true", "depthwise_fwd<float, int, 3, 1, false, true",
    "depthwise_fwd<float, int, 3, 1", "depthwise_bwd_input<float, int, 3, false, true",
    "depthwise_bwd_input<float, int, 3", "depthwise_bwd_weight<float, int, 3, 1, true",
    "depthwise_bwd_weight<float, int, 3, 1", "depthwise_fwd_large<float, int",
    "depthwise_bwd_input_large<float, int", "depthwise_bwd_weight_lanes<float, int")]


def counting_device(blocks) -> EmulatedDevice:
    return EmulatedDevice(counters=True, blocks=blocks, instantiations=COUNTED)


def shared_loads(pass_, kernel, x, w, blocks, padding):
    """The shared-memory load sites of `kernel` when one pass ("forward", "input", "weight") runs counted on `blocks`
    (grad_output: x, same-size planes)."""
    device = counting_device(blocks)
    with _device.use_device(device):
        if pass_ == "forward":
            cupyconv.depthwise_conv2d(x, w, padding=padding)
        else:
            cupyconv.depthwise_conv2d_backward(x, x, w, padding=padding, needs=pass_)
    profile = next(p for p in device.profile if p.name == kernel)
    return [s for s in profile.sites if s.kind == "shared_load"]


def test_stage1_rows_keep_enough_blocks():
    """The split of stage 1 (planning only): STAGE1_MIN_UNITS units a block where that leaves STAGE1_FILL_BLOCKS blocks
    or more, else STAGE1_BLOCKS' split; the kernels without the minimum (least 1) keep STAGE1_BLOCKS' split."""
    least = depthwise_module.STAGE1_MIN_UNITS
    assert least == 4 and depthwise_module.STAGE1_FILL_BLOCKS == 384
    assert depthwise_module.stage1_rows(4, 480, least) == (1, 4)     # dw-480-14: 480 blocks of 4 units
    assert depthwise_module.stage1_rows(2, 1152, least) == (1, 2)    # dw-1152-7k5: fewer units than the minimum
    assert depthwise_module.stage1_rows(52, 144, least) == (13, 4)   # dw-144-56: 1,872 blocks, not 3,744
    assert depthwise_module.stage1_rows(8, 64, least) == (8, 1)      # iii: 128 blocks would leave SMs idle
    assert depthwise_module.stage1_rows(8, 192, least) == (2, 4)     # 2 rows x 192 channels: 384 blocks, enough
    assert depthwise_module.stage1_rows(8, 191, least) == (8, 1)     # 382: too few
    assert depthwise_module.stage1_rows(4, 480) == (4, 1)            # least 1: STAGE1_BLOCKS' split


@pytest.mark.parametrize("pass_", ["forward", "input", "weight"])
def test_small_planes_read_shared_memory_without_bank_conflicts(pass_):
    """The 5x5 kernels on 14x14 planes (the PACK forward and input gradient, the SPREAD weight gradient): every
    16-byte shared load of the sliding window takes 4 wavefronts a warp, the fewest (quarter warps over the 32 banks),
    where the next strip of a plane, 8 rows of a 16-byte pitch down, used to land on the same banks (8); and the
    packed kernels read their weights from shared memory, one wavefront a load (channels an odd 25 words apart)."""
    rng = numpy.random.default_rng(41)
    x = rng.standard_normal((2, 24, 14, 14)).astype(numpy.float32)
    w = rng.standard_normal((24, 1, 5, 5)).astype(numpy.float32)
    expected = {"forward": "depthwise_fwd<float, int, 5, 1, true>", "input": "depthwise_bwd_input<float, int, 5, true>",
                "weight": "depthwise_bwd_weight<float, int, 5, 1, true>"}[pass_]
    loads = shared_loads(pass_, expected, x, w, lambda grid: [(0, 0, 0), (1, 0, 0)], 2)
    assert any(s.width == 16 for s in loads), loads
    for s in loads:  # (at most: the copy-out of a partial warp takes fewer)
        assert s.wavefronts_per_request <= (4.0 if s.width == 16 else 1.0), s


@pytest.mark.parametrize("pass_", ["forward", "input", "weight"])
def test_large_kernels_read_shared_memory_without_bank_conflicts(pass_):
    """depthwise_fwd_large / _bwd_input_large on dw-384-14k31's planes (31x31 padded 15 on 14x14, 32 images a unit):
    a warp's lanes are 32 images, whose 16-byte loads of their own planes take 4 wavefronts (the planes pitched 16
    bytes past a bank row: large_plane) and whose weight loads are one broadcast address (4, 2 and 1 wavefronts for
    16, 8 and 4 bytes).  depthwise_bwd_weight_lanes: a quarter warp is the 8 images of one item, every 16-byte load 4
    wavefronts (its narrower loads serve two or four items, whose grad_out columns are 8 apart: up to 3 a pair)."""
    rng = numpy.random.default_rng(42)
    x = rng.standard_normal((32, 2, 14, 14)).astype(numpy.float32)
    w = rng.standard_normal((2, 1, 31, 31)).astype(numpy.float32)
    name = {"forward": "depthwise_fwd_large", "input": "depthwise_bwd_input_large",
            "weight": "depthwise_bwd_weight_lanes"}[pass_] + "<float, int>"
    loads = shared_loads(pass_, name, x, w, lambda grid: [(0, 0, 0)], 15)
    assert {s.width for s in loads} == {4, 8, 16}, loads
    for s in loads:
        assert s.wavefronts_per_request <= (s.width / 4 if pass_ != "weight" or s.width == 16 else 3), s


@pytest.mark.parametrize("pass_", ["forward", "input", "weight"])
def test_narrow_tiles_spread_planes_against_bank_conflicts(pass_, monkeypatch):
    """Per-image units of 28-wide tiles (here 8x56 planes, two tiles a row; 56x56 and 112x112 in the benchmarks): a row
    of 7 thread items spans 112 of a bank row's 128 bytes and the next strip (4 rows of a 128-byte pitch down) starts
    on the same banks, so the planner takes the SPREAD instantiation (_spread_planes: planes first, planes padded to
    follow each other on the banks).  Its 16-byte shared loads take fewer wavefronts than the same launch without it
    (the strip-first layout, monkeypatched back), and both match the float64 CPU path."""
    rng = numpy.random.default_rng(43)
    x = rng.standard_normal((2, 1, 8, 56)).astype(numpy.float32)
    w = rng.standard_normal((1, 1, 3, 3)).astype(numpy.float32)
    gy = rng.standard_normal((2, 1, 8, 56)).astype(numpy.float32)
    as64 = [a.astype(numpy.float64) for a in (gy, x, w)]
    if pass_ == "forward":
        want = cupyconv.depthwise_conv2d(as64[1], as64[2], padding=1)
    else:
        want = cupyconv.depthwise_conv2d_backward(*as64, padding=1, needs=pass_)[0 if pass_ == "input" else 1]
    kernel = {"forward": "depthwise_fwd<float, int, 3, 1", "input": "depthwise_bwd_input<float, int, 3",
              "weight": "depthwise_bwd_weight<float, int, 3, 1"}[pass_]
    wavefronts = {}
    for spread in (True, False):
        if not spread:
            monkeypatch.setattr(depthwise_module, "_spread_planes", lambda tiling, *args: (tiling, ()))
        device = counting_device(lambda grid: [(b, 0, 0) for b in range(min(2, grid[0]))])
        with _device.use_device(device):
            if pass_ == "forward":
                got = cupyconv.depthwise_conv2d(x, w, padding=1)
            else:
                got = cupyconv.depthwise_conv2d_backward(gy, x, w, padding=1, needs=pass_)[0 if pass_ == "input" else 1]
        assert_matches(got, want.astype(numpy.float32), "float32", f"{pass_} spread={spread}")
        name = kernel + (", false, true>" if pass_ != "weight" else ", true>") if spread else kernel + ">"
        profile = next(p for p in device.profile if p.name == name)
        loads = [s for s in profile.sites if s.kind == "shared_load" and s.width == 16]
        wavefronts[spread] = sum(s.wavefronts for s in loads) / sum(s.requests for s in loads)
    assert wavefronts[True] < 0.8 * wavefronts[False], wavefronts


# The per-image stride-2 forward (depthwise_fwd<K, 2>, neither PACK nor SPREAD) reads its rows straight from global
# memory (direct_fma): (shape, multiplier, kernel, padding, dtype).  FAST rows (pad_left = (K - 1) / 2, rows whole
# 16-byte chunks) in every element size and K; element loads for other left paddings (0, 2, and 1 for 5x5) and odd
# widths; a right padding that puts outputs' own columns past the row; multipliers; several tiles and images.
DIRECT_CASES = [
    ((2, 2, 75, 72), 1, 3, 1, "float32"),    # FAST: 38x36 outputs on 2 x 2 tiles, 2-chunk rows, 1 halo column
    ((3, 1, 66, 68), 2, 3, 2, "float32"),    # element loads (pad_left 2), multiplier 2
    ((1, 3, 71, 69), 1, 3, 0, "float16"),    # element loads: odd width, pad_left 0
    ((2, 2, 76, 80), 1, 3, 1, "float16"),    # FAST 16-bit: one 16-byte chunk a row
    ((1, 2, 45, 48), 2, 5, 2, "float64"),    # FAST, 4 chunks a row, halo 2 + 1, multiplier 2
    ((1, 2, 21, 40), 2, 7, 3, "bfloat16"),   # FAST 7x7, halo 3 + 2
    ((2, 1, 39, 37), 3, 5, (1, 2), "float32"),  # element loads: odd width, multiplier 3, rectangular padding
    ((2, 1, 33, 32), 2, 5, ((2, 1), (1, 1)), "float16"),  # 5x5 at pad_left 1: element loads, 16-bit
    ((1, 2, 19, 24), 2, 3, ((1, 1), (1, 9)), "float16"),  # FAST, right padding 9: outputs whose columns are past
    ((1, 2, 23, 74), 1, 5, ((2, 2), (2, 0)), "float64"),  # FAST 5x5, 36 columns on 2 tiles of 20: the item past
                                                          # dst_w holds column 72, its left neighbour's right halo
]


@pytest.mark.parametrize("shape, m, k, padding, dtype", DIRECT_CASES)
def test_stride2_forward_reads_rows_directly(shape, m, k, padding, dtype):
    """Every output of the direct stride-2 forward against the float64 CPU path (outputs poisoned: one left unwritten,
    or a halo or chunk column taken from the wrong place, fails); no shared memory."""
    rng = numpy.random.default_rng(sum(shape) + k)
    x = rng.standard_normal(shape).astype(_dtype(dtype))
    weight = rng.standard_normal((shape[1] * m, 1, k, k)).astype(x.dtype)
    bias = rng.standard_normal(shape[1] * m).astype(x.dtype)
    sizes = []

    class SizeRecorder(Recorder):
        def launch(self, source, name, grid, block, args, shared_mem=0):
            sizes.append(shared_mem)
            super().launch(source, name, grid, block, args, shared_mem)

    device = SizeRecorder("reverse")
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, bias, stride=2, padding=padding)
    (name, args), = device.launches
    assert short(name) == f"depthwise_fwd<{k}, 2>", name
    assert sizes == [0], sizes
    expected = ref.depthwise_conv2d(x.astype(numpy.float64), weight.astype(numpy.float64),
                                    bias.astype(numpy.float64), stride=2, padding=padding)
    assert_matches(out, expected.astype(x.dtype), dtype, str(shape))


def test_stride2_forward_direct_past_2_31(monkeypatch):
    """direct_fma's rows in the `long long` instantiation: two 40x40 float16 images of enough channels (multiplier 2:
    per-image units; 20-wide tiles, not SPREAD) that the second image's planes start past 2^31 elements (sparse
    memory; only the last block runs: bug_classes.SparseDevice).  The last dst channel's outputs match the CPU path
    on that channel alone."""
    bug_classes.lift_grid_cap(monkeypatch)
    rng = numpy.random.default_rng(63)
    channels = 2**31 // 1600 + 64
    x = bug_classes.sparse_zeros((2, channels, 40, 40), numpy.float16)
    x[:, -1] = rng.standard_normal((2, 40, 40))
    weight = bug_classes.sparse_zeros((2 * channels, 1, 3, 3), numpy.float16)
    weight[-2:] = rng.standard_normal((2, 1, 3, 3))
    device = bug_classes.SparseDevice()
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, None, stride=2, padding=1)
    assert short(device.launches[0].replace(", long long", ", int")) == "depthwise_fwd<3, 2>"
    assert ", long long" in device.launches[0]
    want = cupyconv.depthwise_conv2d(numpy.array(x[:, -1:]), numpy.array(weight[-2:]), None, stride=2, padding=1)
    bug_classes.assert_tail_written(out, want[1:, 1:], numpy.float16, 400, "forward, last channel of the last image")


# The weight gradient's per-image tiles at stride 2 stage their rows de-interleaved (AlignedStaging's SPLIT,
# load_split_row), as the forward did: (shape, multiplier, kernel, padding, dtype).  Aligned rows by chunks with x0
# odd (pad 1) and even (pad 0, 2), 16-bit aligned rows, rows of an odd width element by element, 2-element chunks
# (float64), every K, multipliers.
SPLIT_CASES = DIRECT_CASES[:7]


@pytest.mark.parametrize("shape, m, k, padding, dtype", SPLIT_CASES)
def test_stride2_weight_gradient_stages_split_rows(shape, m, k, padding, dtype):
    """The same de-interleaved staging in the per-image stride-2 weight gradient (depthwise_bwd_weight<K, 2>, its
    SPLIT): every tap against the float64 CPU path, the launch's shared memory the kernel's layout plus the block
    reduction's scratch, and the 3x3 one's 16-byte shared loads at one wavefront a quarter warp."""
    rng = numpy.random.default_rng(sum(shape) + k + 1)
    x = rng.standard_normal(shape).astype(_dtype(dtype))
    weight = rng.standard_normal((shape[1] * m, 1, k, k)).astype(x.dtype)
    out_shape = ref.depthwise_conv2d(x[:1, :1].astype(numpy.float64), weight[:1].astype(numpy.float64), None,
                                     stride=2, padding=padding).shape[2:]
    gy = rng.standard_normal((shape[0], shape[1] * m, *out_shape)).astype(x.dtype)
    sizes = []

    class SizeRecorder(Recorder):
        def launch(self, source, name, grid, block, args, shared_mem=0):
            sizes.append((block[0], shared_mem))
            super().launch(source, name, grid, block, args, shared_mem)

    device = SizeRecorder("reverse")
    with _device.use_device(device):
        got = cupyconv.depthwise_conv2d_backward(gy, x, weight, stride=2, padding=padding, needs="weight")[1]
    (name, args), = device.launches
    expected = ref.depthwise_conv2d_grads(*(a.astype(numpy.float64) for a in (gy, x, weight)), stride=2,
                                          padding=padding)[1]
    assert_matches(got, expected.astype(x.dtype), dtype, str(shape))
    if list(args[-5:-3]) == [1, 1] and k >= depthwise_module.SPREAD_MIN_K:  # one tile: the SPREAD instantiation
        assert short(name) == f"depthwise_bwd_weight<{k}, 2, true>", name
        return
    assert short(name) == f"depthwise_bwd_weight<{k}, 2>", name
    acc = 8 if dtype == "float64" else 4
    (tile_h, tile_w), per_block, chunk = args[-7:-5], args[-3], 16 // acc
    in_h, in_w = 2 * tile_h - 2 + k, 2 * tile_w - 2 + k
    pitch = -(-(in_w + 1) // 2 // chunk) * chunk + -(-(in_w // 2) // chunk) * chunk
    skews = in_h // (2 * depthwise_module.STRIP_ROWS[k]) * (tile_w % (128 // acc))
    threads = sizes[0][0]
    assert sizes[0][1] == (per_block * (in_h * pitch + skews) + threads // 32 * (k * k + 1)) * acc, sizes
    if dtype == "float32" and k == 3:
        first_two = lambda grid: [(b, 0, 0) for b in range(min(2, grid[0]))]  # noqa: E731
        device = EmulatedDevice(counters=True, asan=False, blocks=first_two,
                                instantiations=[("depthwise.cu", name)])
        with _device.use_device(device):  # (the profile build: not under ASan)
            cupyconv.depthwise_conv2d_backward(gy, x, weight, stride=2, padding=padding, needs="weight")
        profile = next(p for p in device.profile if p.name == name)
        loads = [s for s in profile.sites if s.kind == "shared_load" and s.width == 16]
        assert loads and sum(s.wavefronts for s in loads) <= 4 * sum(s.requests for s in loads), loads


def test_64_bit_index_variants(monkeypatch):
    """Force the `long long` instantiations (chosen by extents above 2^31) so that each is executed once."""
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)  # every extent "passes 2^31": long long
    device = run_every_kernel(Recorder("reverse"))
    assert all(", long long" in name for name, _ in device.launches)


def test_every_kernel_once():
    """Runs under AddressSanitizer through the test below (and on its own as one more comparison)."""
    run_every_kernel(Recorder())


def test_every_kernel_clean_under_asan():
    assert_clean_under_asan(pytest_under_asan(f"{__file__}::test_every_kernel_once"))


# ---------------------------------------------------------------------------------------------------------
# Bug classes covered on purpose, every kernel (issue 12; tests/bug_classes.py, table in tests/emulator/README.md)

#: Every depthwise kernel path: (name, kernel, stride, dilation, multiplier, padding on each side, the kernels of
#: its forward, input gradient and weight gradient).
PATHS = [
    ("k3s1", 3, 1, 1, 1, 1, SPEC_3_1),
    ("k3s2", 3, 2, 1, 1, 1, ("depthwise_fwd<3, 2>", "depthwise_bwd_input_phased<3, 2>",
                           "depthwise_bwd_weight<3, 2>")),
    ("k5s1", 5, 1, 1, 2, 2, ("depthwise_fwd<5, 1>", "depthwise_bwd_input<5>", "depthwise_bwd_weight<5, 1>")),
    ("k5s2", 5, 2, 1, 1, 2, ("depthwise_fwd<5, 2>", "depthwise_bwd_input_phased<5, 2>",
                           "depthwise_bwd_weight<5, 2>")),
    ("k7s1", 7, 1, 1, 1, 3, ("depthwise_fwd<7, 1>", "depthwise_bwd_input<7>", "depthwise_bwd_weight<7, 1>")),
    ("k7s2", 7, 2, 1, 2, 3, ("depthwise_fwd<7, 2>", "depthwise_bwd_input_phased<7, 2>",
                           "depthwise_bwd_weight<7, 2>")),
    ("generic_dilation2", 3, 1, 2, 2, 2, GENERIC_1),
    ("generic_rect_stride2", (3, 4), 2, 1, 1, 1, GENERIC_S),
    ("large", (6, 9), 1, 1, 1, 3, LARGE_1),
    ("direct", 2, 3, 1, 2, 1, DIRECT),
    ("gather", 3, 1, 30, 8, 30, ("depthwise_fwd_generic", "depthwise_bwd_input_gather",
                                 "depthwise_bwd_weight_generic")),  # 8 kernels: 8 terms per input pixel
    ("planes", 3, 1, 2, 2, 2, PLANES_1),
    ("planes_k4", 4, 1, 1, 1, 2, PLANES_K4),
    ("wide", 13, 1, 1, 2, 6, WIDE_1),
]
PATH_IDS = [p[0] for p in PATHS]


def route_planes(monkeypatch, path):
    """The planes path takes the tiny-plane kernels on every plane whose unit fits in shared memory, and no other path
    takes them, whatever its plane sizes here: each path keeps its own kernels."""
    monkeypatch.setattr(depthwise_module, "PLANE_MAX", 2**62 if path[0].startswith("planes") else 0)


def path_case(path, padding, low=(7, 6), images=2, channels=2, name=""):
    """The path's Case on planes whose last window ends on the last padded row and column."""
    label, k, s, d, m, _, kernels = path
    kh, kw = (k, k) if isinstance(k, int) else k
    size = (bug_classes.touching_size(low[0], kh, s, d, padding[0]), bug_classes.touching_size(low[1], kw, s, d,
                                                                                            padding[1]))
    return C(f"{label}_{name}", (images, channels, *size), m, (kh, kw), kernels, stride=s, dilation=d,
             padding=padding)


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
def test_padding_per_side_and_last_row_and_column(path, monkeypatch):
    """Each side's padding differs alone (a kernel that reads pad_top for pad_left, or the bottom for the top,
    fails one of the four); every case's last window ends on the last padded row and column, so windows read
    the last input row and column and, where that side is padded, the zeros past them."""
    route_planes(monkeypatch, path)
    for k, (side, padding) in enumerate(bug_classes.per_side_paddings(path[5])):
        case = path_case(path, padding, name=side)
        device = Recorder("reverse" if k % 2 else "forward")
        # planes_k4 in float32: the float64 weight-gradient unit of these planes (padded to 12 x 10) does not fit
        run_case(device, case, "float32" if path[0] == "planes_k4" else "float64")
        used = device.kernels(pack=False)
        assert used[0] == case.kernels[0] and set(case.kernels[1:]) == set(used[1:]), \
            (case.name, used)


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
def test_accumulates_in_float32(path, monkeypatch):
    """Forward, input gradient, weight and bias gradients (and the bias alone) in float16 and bfloat16 on data
    whose float32 sums are exact: every result must be the float64 one rounded once (a 16-bit accumulator
    misses it on about half the outputs)."""
    route_planes(monkeypatch, path)
    case = path_case(path, ((path[5],) * 2,) * 2, low=(9, 8), images=3)
    for dtype in ("float16", "bfloat16"):
        rng = numpy.random.default_rng(20)
        x = bug_classes.exact_terms(rng, case.x, dtype)
        weight = bug_classes.exact_terms(rng, (case.x[1] * case.m, 1, *case.kernel), dtype)
        bias = bug_classes.exact_terms(rng, (case.x[1] * case.m,), dtype)
        grad_output = bug_classes.exact_terms(rng, cupyconv.depthwise_conv2d(x, weight, **case.window).shape, dtype)
        as64 = [a.astype(numpy.float64) for a in (x, weight, bias, grad_output)]
        device = Recorder()
        with _device.use_device(device):
            out = cupyconv.depthwise_conv2d(x, weight, bias, **case.window)
            grads = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, **case.window)
            (bias_alone,) = [g for g in cupyconv.depthwise_conv2d_backward(grad_output, x, weight, needs="bias",
                                                                           **case.window) if g is not None]
        assert device.kernels(pack=False)[:3] == list(case.kernels[:3]), device.kernels()
        assert "depthwise_bwd_bias" in device.kernels()
        bug_classes.assert_rounded_once(out, cupyconv.depthwise_conv2d(*as64[:3], **case.window), dtype, "forward")
        expected = cupyconv.depthwise_conv2d_backward(as64[3], *as64[:2], **case.window)
        for name, got, want in zip(NEEDS, grads, expected):
            bug_classes.assert_rounded_once(got, want, dtype, f"{dtype} grad {name}")
        bug_classes.assert_rounded_once(bias_alone, expected[2], dtype, f"{dtype} grad bias alone")


def test_bias_gradient_accumulates_in_float32():
    """depthwise_bwd_bias alone over planes of 1600 pixels: each of its 256 threads sums 6 or 7 of a plane
    (bug_classes.strided_sum_terms) before the block combines them."""
    for dtype in ("float16", "bfloat16"):
        x = numpy.zeros((1, 3, 40, 40), bug_classes.numpy_dtype(dtype))
        weight = numpy.zeros((3, 1, 3, 3), x.dtype)
        grad_output = numpy.stack([bug_classes.strided_sum_terms(1600, depthwise_module.BIAS_THREADS, dtype)
                                   .reshape(40, 40)] * 3)[None]
        device = Recorder()
        with _device.use_device(device):
            _, _, got = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, padding=1, needs="bias")
        (name, args), = device.launches
        assert short(name) == "depthwise_bwd_bias" and args[-1] == 1, "one image per block"
        bug_classes.assert_rounded_once(got, grad_output.astype(numpy.float64).sum(axis=(0, 2, 3)), dtype, dtype)


#: Cases with more units than LOOP_CAP blocks in every kernel they reach (every kernel family).
LOOP_CASES = [
    path_case(PATHS[0], ((1, 1), (1, 1)), low=(9, 11), images=5, channels=11, name="loops"),
    path_case(PATHS[3], ((2, 1), (0, 3)), low=(13, 11), channels=5, name="loops"),
    path_case(PATHS[7], ((1, 0), (2, 1)), low=(9, 10), channels=8, name="loops"),
    path_case(PATHS[8], ((3, 3), (4, 4)), low=(9, 8), channels=4, name="loops"),
    path_case(PATHS[9], ((0, 0), (0, 0)), low=(5, 6), channels=10, name="loops"),
    path_case(PATHS[10], ((30, 30), (30, 30)), low=(9, 9), channels=2, name="loops"),  # 81 pixels: not tiny planes
    path_case(PATHS[11], ((1, 2), (2, 0)), low=(5, 6), images=20, channels=7, name="loops"),
    path_case(PATHS[12], ((1, 2), (3, 0)), low=(5, 6), images=20, channels=7, name="loops"),
    path_case(PATHS[13], ((6, 5), (7, 6)), low=(9, 8), images=37, channels=3, name="loops"),
]


def test_grid_loops_with_several_blocks(monkeypatch):
    """Three blocks of every kernel, fewer than its units (elementwise: blocks of 32 threads, fewer than its
    items): a loop that starts at threadIdx.x instead of the block's first unit or the global index, or that
    does not stride, leaves outputs unwritten (NaN) or sums missing."""
    loops = bug_classes.GridLoops(monkeypatch, cap=3)
    device = loops.device(Recorder("reverse"))
    for case in LOOP_CASES:
        run_case(device, case)
    run_case(device, LOOP_CASES[1], needs=("bias",))
    assert loops.looped() == loops.capped(), loops.launches
    assert {short(name).split("<")[0] for name, _ in device.launches} == {
        "depthwise_fwd", "depthwise_bwd_input", "depthwise_bwd_weight", "depthwise_bwd_input_phased",
        "depthwise_bwd_weight_planes", *depthwise_module.GENERIC_KERNELS}


#: A plane whose last rows start past 2^31 ((H - 1) * W > 2^31).
HUGE_PLANE = (40000, 60000)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _huge_run(device, x, weight, bias, grad_output, window):
    with _device.use_device(device):
        out = cupyconv.depthwise_conv2d(x, weight, bias, **window)
        grads = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, **window)
    return out, grads


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
def test_64_bit_indices_past_2_31(path, monkeypatch):
    """Every kernel of the path in its `long long` instantiation past 2^31 (sparse memory; only the last block of
    each launch runs: bug_classes.SparseDevice), on a 2.4e9-pixel plane (row offsets past 2^31) and on enough
    channels that the last one's weights and partial sums start past 2^31 (c * m * taps).  An `int` product in
    the index arithmetic overflows there, which UBSan turns into a failed launch.  The outputs and input
    gradients the last block writes match the CPU path on a crop; on the channels, so does the last bias
    gradient."""
    bug_classes.lift_grid_cap(monkeypatch)
    route_planes(monkeypatch, path)
    monkeypatch.setattr(depthwise_module, "STAGE1_BLOCKS", 2**15)  # stage 1: ~70 units per block, not 600
    label, k, s, d, m, base, _ = path
    (kh, kw), rng = _pair(k), numpy.random.default_rng(60)
    if label == "direct":
        s = 3000  # windows apart, as on the small planes, but few outputs: the weight kernel walks all of them
    taps = kh * kw
    weight = (rng.standard_normal((m, 1, kh, kw)) / taps ** 0.5).astype(numpy.float16)
    pad = ((base, base), (base, base))
    window = dict(stride=s, dilation=d, padding=pad)
    h, w = (bug_classes.touching_size(size, k_, s, d, (base, base)) for size, k_ in zip(HUGE_PLANE, (kh, kw)))
    out_h, out_w = ref.output_size((h, w), (kh, kw), s, pad, d)
    # Data only in a crop of the last rows and columns, whose windows are on the whole plane's output grid: the
    # CPU path on the crop alone, with no padding above or left of it, gives the last outputs and input gradients.
    extent = ((kh - 1) * d + 1, (kw - 1) * d + 1)
    crop = [next(n for n in range(max(1, e - base, least), size + 1) if (size - n + base) % s == 0)
            for size, e, least in zip((h, w), extent, (1, min(1024 * s + extent[1], w - s)))]
    first_out = [(size - n + base) // s for size, n in zip((h, w), crop)]
    x = bug_classes.sparse_zeros((1, 1, h, w), numpy.float16)
    x[..., -crop[0]:, -crop[1]:] = rng.standard_normal(crop)
    grad_output = bug_classes.sparse_zeros((1, m, out_h, out_w), numpy.float16)
    grad_output[..., first_out[0]:, first_out[1]:] = rng.standard_normal((m, out_h - first_out[0],
                                                                          out_w - first_out[1]))
    device = bug_classes.SparseDevice()
    out, (grad_x, _, _) = _huge_run(device, x, weight, weight[:, 0, 0, 0], grad_output, window)
    on_crop = dict(window, padding=((0, base), (0, base)))
    crop_x, crop_g = x[..., -crop[0]:, -crop[1]:], grad_output[..., first_out[0]:, first_out[1]:]
    want = cupyconv.depthwise_conv2d(crop_x, weight, weight[:, 0, 0, 0], **on_crop)
    bug_classes.assert_tail_written(out, want[0, -1, -1, -min(want.shape[-1], 1024):], numpy.float16, 1,
                                    f"{label}: forward, plane")
    want = cupyconv.depthwise_conv2d_backward(crop_g, crop_x, weight, needs="input", **on_crop)[0]
    bug_classes.assert_tail_written(grad_x, want[0, 0, -1, -1024:], numpy.float16, 1, f"{label}: grad_input, plane")

    pad = tuple((p, p) for p in (max(base, (e - 1 + 1) // 2) for e in extent))  # one-pixel planes, one output
    window = dict(stride=s, dilation=d, padding=pad)
    channels = -(-(2**31 // taps + 64) // m)  # (c * m - 1) * taps past 2^31 for the last channels
    x = bug_classes.sparse_zeros((1, channels, 1, 1), numpy.float16)
    x[:, -1] = rng.standard_normal(1)
    weight = bug_classes.sparse_zeros((channels * m, 1, kh, kw), numpy.float16)
    weight[-m:] = rng.standard_normal((m, 1, kh, kw))
    bias = bug_classes.sparse_zeros((channels * m,), numpy.float16)
    bias[-m:] = rng.standard_normal(m)
    out_shape = (1, channels * m, *ref.output_size((1, 1), (kh, kw), s, pad, d))
    grad_output = bug_classes.sparse_zeros(out_shape, numpy.float16)
    grad_output[:, -m:] = rng.standard_normal((m, *out_shape[2:]))
    out, (grad_x, _, grad_b) = _huge_run(device, x, weight, bias, grad_output, window)
    last = (x[:, -1:], weight[-m:], grad_output[:, -m:])
    bug_classes.assert_tail_written(out, cupyconv.depthwise_conv2d(last[0], last[1], bias[-m:], **window),
                                    numpy.float16, 1, f"{label}: forward")
    want = cupyconv.depthwise_conv2d_backward(last[2], last[0], last[1], **window)
    bug_classes.assert_tail_written(grad_x, want[0], numpy.float16, 1, f"{label}: grad_input, channels")
    bug_classes.assert_tail_written(grad_b, want[2][-1:], numpy.float16, 1, f"{label}: grad_bias, channels")
    assert all(", long long" in name for name in device.launches), device.launches
    # Not depthwise_bwd_bias: every term of its index arithmetic is 64-bit, and a problem that selects its
    # `long long` instantiation has one of its blocks sum 2^31 elements (test_64_bit_index_variants forces it).
    # (', true>': the packed-channel instantiation, which the wide planes of channels select here; see Recorder.kernels)
    used = {short(name.replace(", long long", ", int")).replace(", true>", ">") for name in device.launches}
    kernels = path[6] if label != "direct" else (path[6][0], "depthwise_bwd_input_gather", path[6][2])  # no tile
    if label.startswith("planes"):  # the huge plane's unit cannot fit: the tiled generic kernels
        kernels = (*kernels, *GENERIC_1)
    if label == "wide":  # nor its whole plane (the one-pixel planes of the channels take the large kernels)
        kernels = (*kernels, *LARGE_1)
    assert used == {*kernels}, used


# ---------------------------------------------------------------------------------------------------------
# The same comparisons on a real GPU (pytest -m gpu): CuPy arrays through CudaDevice vs the NumPy CPU path.


def _gpu_run(case, dtype, needs=NEEDS):
    cupy = pytest.importorskip("cupy")
    x, weight, bias, grad_output = make(case, dtype)
    kw = case.window
    try:
        on_gpu = [None if a is None else cupy.asarray(a) for a in (x, weight, bias, grad_output)]
    except (TypeError, ValueError):
        if dtype != "bfloat16":
            raise
        pytest.skip("this CuPy has no bfloat16 arrays")
    out = cupyconv.depthwise_conv2d(*on_gpu[:3], **kw)
    assert isinstance(out, cupy.ndarray)
    assert_matches(out.get(), cupyconv.depthwise_conv2d(x, weight, bias, **kw), dtype, f"{case.name} forward")
    grads = cupyconv.depthwise_conv2d_backward(on_gpu[3], on_gpu[0], on_gpu[1], needs=needs, **kw)
    expected = cupyconv.depthwise_conv2d_backward(grad_output, x, weight, needs=needs, **kw)
    for name, got, want in zip(NEEDS, grads, expected):
        if name in needs:
            assert_matches(got.get(), want, dtype, f"{case.name} grad {name}")
        else:
            assert got is None
    return grads


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_gpu_matches_cpu_path(case, dtype):
    _gpu_run(case, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("needs", NEEDS_SUBSETS, ids=["+".join(n) for n in NEEDS_SUBSETS])
def test_gpu_needs_subsets(needs):
    _gpu_run(CASE_BY_NAME["tiny_4x4_k4_same"], "float32", needs)


@pytest.mark.gpu
def test_gpu_64_bit_index_variants(monkeypatch):
    monkeypatch.setattr(_kernels, "INT32_MAX", -1)  # every extent "passes 2^31": long long
    for name in ONE_OF_EACH:
        _gpu_run(CASE_BY_NAME[name], "float32")
    _gpu_run(CASE_BY_NAME["k3s2"], "float32", needs=("bias",))


@pytest.mark.gpu
def test_gpu_weight_gradient_is_deterministic():
    case = C("tiny", (200, 3, 4, 4), 1, 4, GENERIC_1, padding=1)
    first = _gpu_run(case, "float32", ("weight", "bias"))
    again = _gpu_run(case, "float32", ("weight", "bias"))
    assert all(a.get().tobytes() == b.get().tobytes() for a, b in zip(first[1:], again[1:]))


@pytest.mark.gpu
def test_gpu_torch_tensors_and_conv2d_groups():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 8, 15, 17, device="cuda")
    weight = torch.randn(16, 1, 3, 3, device="cuda")
    bias = torch.randn(16, device="cuda")
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # a strict fp32 reference
    try:
        expected = torch.nn.functional.conv2d(x, weight, bias, padding=1, groups=8)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    for got in (cupyconv.depthwise_conv2d(x, weight, bias, padding=1),
                cupyconv.conv2d(x, weight, bias, padding=1, groups=8)):
        assert isinstance(got, torch.Tensor) and got.device == x.device
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
