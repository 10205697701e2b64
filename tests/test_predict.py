"""The performance model (benchmarks/predict.py), its launch recorder (benchmarks/launches.py) and the SASS
library's loop and occupancy rules (benchmarks/sass.py): the arithmetic against hand-computed values, and a smoke
run of `python -m benchmarks.predict` on a few cases.  Nothing here is a measurement."""
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` (not `python -m pytest`) leaves the checkout off the path
    sys.path.append(str(ROOT))

from benchmarks import _emulator, cases, launches, predict, sass  # noqa: E402
from cupyconv.ops import implicit_gemm, simt_gemm, wgmma_gemm  # noqa: E402

BY_LABEL = {c.label: c for c in cases.ALL_CASES}
CHANNELS_LAST_REFUSAL = implicit_gemm.igemm_refusal


@pytest.fixture(autouse=True)
def generic_tensor_core_path(monkeypatch):
    """The model's worked examples below are on the generic tensor-core kernels (conv_fwd_tc ...): the channels-last
    path, which takes their cases otherwise, is refused (`test_recording_of_the_r50_64_forward` checks both)."""
    monkeypatch.setattr(implicit_gemm, "igemm_refusal", lambda *args: "the generic kernels' worked examples")


# ---------------------------------------------------------------------------------------------------------
# Occupancy: the allocation rules on configurations worked out by hand


@pytest.mark.parametrize("registers, threads, shared, blocks, limit", [
    # conv_fwd_tc 128x64: 121 -> 128 registers, 4096 per warp, 4 warps per sub-partition = 16 warps = 2 blocks of 8;
    # shared 30 KiB + 1 KiB reserved would allow 7.
    (121, 256, 30720, 2, "registers"),
    # 64 registers x 1024 threads is exactly the register file: one block.
    (64, 1024, 0, 1, "registers"),
    # 40 registers: 1280 per warp, 12 warps per sub-partition (16384 / 1280 = 12.8), 48 warps: 24 blocks of 2 warps
    # (a pooled 64 Ki would give 25).
    (40, 64, 0, 24, "registers"),
    # 33 registers: 1056 rounds up to 1280 per warp (units of 256, not 128: 1152), 12 warps per sub-partition
    (33, 64, 0, 24, "registers"),
    # 100 KiB of shared memory + 1 KiB reserved per block: 2 blocks in 228 KiB.
    (32, 128, 100 * 1024, 2, "shared memory"),
    # small blocks: at most 32 blocks per SM
    (16, 32, 0, 32, "blocks"),
    # 255 registers -> 256: 8192 per warp, 2 warps per sub-partition, 8 warps: one block of 8.
    (255, 256, 0, 1, "registers"),
    # 1024-thread blocks of few registers: 64 warps per SM, so two blocks.
    (16, 1024, 0, 2, "warps"),
])
def test_occupancy_follows_the_allocation_rules(registers, threads, shared, blocks, limit):
    occ = sass.occupancy(registers, threads, shared, "sm_90")
    assert (occ.blocks_per_sm, occ.limited_by) == (blocks, limit)
    assert occ.warps_per_sm == blocks * math.ceil(threads / 32)


def test_occupancy_refuses_what_cannot_launch():
    with pytest.raises(ValueError):
        sass.occupancy(256, 128, 0)
    with pytest.raises(ValueError):
        sass.occupancy(32, 1056, 0)
    with pytest.raises(ValueError, match="shared memory"):
        sass.occupancy(32, 128, 228 * 1024)   # + 1 KiB reserved is over the SM's 228 KiB
    assert sass.occupancy(32, 128, 163 * 1024, "sm_80").blocks_per_sm == 1


# ---------------------------------------------------------------------------------------------------------
# The main loop and instruction mix


def _listing(opcodes_and_targets):
    """nvdisasm-like instructions: (opcode, branch target index or None)."""
    return [{"opcode": op, "operands": "" if target is None else f"`(.L_x_1), 0x{target * 16:x}"}
            for op, target in opcodes_and_targets]


def test_main_loop_rules():
    simt = _listing([("MOV", None),
                     ("LDG.E", None), *[("FFMA", None)] * 4,                          # 1-8: outer loop ...
                     ("LDS", None), ("FFMA", None), ("BRA", 6),                        # ... holding 6-8
                     ("BRA", 1),
                     ("IADD3", None), ("STG.E", None), ("BRA", 10), ("EXIT", None)])  # 10-12: a store loop
    rule, body = sass.main_loop(simt)
    # the outer loop has 4 FFMA of its own, the inner 1: the outer holds the main work
    assert rule == "fma" and body["FFMA"] == 5 and sum(body.values()) == 9
    # an FMA or two (a bias add, HFMA2 moving a constant) do not make a convolution loop: the memory rule
    bias = _listing([("HFMA2.MMA", None), ("LDG.E", None), ("FADD", None), ("STG.E", None), ("BRA", 0),
                     *[("LDG.E", None), ("FADD", None), ("STG.E", None)] * 4, ("BRA", 5), ("EXIT", None)])
    rule, body = sass.main_loop(bias)
    assert rule == "memory" and body["LDG"] == 4
    matrix = _listing([("LDG.E.U16", None), ("HMMA.16816.F32", None), ("LDS", None), ("BRA", 0),
                       ("FFMA", None), ("FFMA", None), ("BRA", 4)])
    rule, body = sass.main_loop(matrix, full=True)
    assert rule == "matrix" and body == {"LDG.E.U16": 1, "HMMA.16816.F32": 1, "LDS": 1, "BRA": 1}
    memory = _listing([("IADD3", None), ("BRA", 0), ("LDG.E", None), ("STG.E", None), ("BRA", 2)])
    assert sass.main_loop(memory)[0] == "memory" and sass.main_loop(memory)[1]["LDG"] == 1
    assert sass.main_loop(_listing([("FFMA", None), ("EXIT", None)])) is None
    assert sass.instruction_mix(sass.main_loop(matrix)[1]) == {"global_load": 1, "matrix": 1, "shared_load": 1,
                                                              "branch": 1}


@pytest.mark.parametrize("opcode, width", [("LDG.E.U16.CONSTANT", 2), ("STS.U16", 2), ("LDS", 4), ("LDS.64", 8),
                                           ("STS.128", 16), ("LDG.E.128", 16), ("LDSM.16.M88.4", 16),
                                           ("LDSM.16.M88.2", 8), ("STG.E.U8", 1)])
def test_access_widths(opcode, width):
    assert predict.access_bytes(opcode) == width


# ---------------------------------------------------------------------------------------------------------
# The recording device


def _launch_keys(recording):
    return [(s.name, s.grid, s.block, s.shared_mem,
             tuple((k, v) for k, v in s.args.items() if not isinstance(v, launches.ArrayArg)))
            if isinstance(s, launches.Launch) else s for s in recording.steps]


@pytest.mark.parametrize("label", ["p-seed-gpu16", "p-seed-gpu32", "r50-64-gpu32", "r50-64-gputf32", "rx-128-gpu16",
                                   "dw-256-56-gpu16", "dw-384-14k31-gpu32", "iv-gpu16", "c1d-audio-gpu16",
                                   "c3d-video-gpu32", "ct2d-k4s2-gpu16"])
def test_recording_reads_no_data(label):
    """The planners see shapes only: the smoke-size problem over NaN and over zeros launches the same kernels with
    the same grids, blocks, shared memory and scalar arguments, forward and backward."""
    case = cases.smoke(BY_LABEL[label])
    for backward in (False, True):
        runs = [launches.record(case, backward, launches.empty_inputs(case, fill)) for fill in (numpy.nan, 0.0)]
        assert runs[0].steps and _launch_keys(runs[0]) == _launch_keys(runs[1])


def test_recording_of_the_r50_64_forward(monkeypatch):
    """ResNet-50's 64-channel 3x3 layer in fp16: the channels-last path (x and the weight transposed by one launch,
    then one conv_fwd_igemm of the 256 x 64 tile); on the generic path, one conv_fwd_tc of the 128 x 64 tile over
    32 x 56 x 56 pixels.  The recorder claims wgmma as an H100 does (with CUPYCONV_WGMMA=1): there the same copy
    feeds one conv_fwd_wgmma of the 256 x 64 tile; without it (any GPU but a 9.0 one), conv_fwd_igemm."""
    case = BY_LABEL["r50-64-gpu16"]
    with monkeypatch.context() as patch:
        patch.setattr(implicit_gemm, "igemm_refusal", CHANNELS_LAST_REFUSAL)
        wgmma = launches.record(case, False)
        patch.setattr(wgmma_gemm, "wgmma_preferred", lambda spec, dtype: False)
        rec = launches.record(case, False)
    assert [launch.name for launch in wgmma.steps] == ["channels_last_copies<__half, int, false>",
                                                       "conv_fwd_wgmma<__half, int, 256, 64, 4>"]
    assert wgmma.steps[-1].grid == (32 * 56 * 56 // 256, 1, 1) and wgmma.steps[-1].block == (256,)
    assert predict.pass_macs(wgmma.steps, case) == {1: cases.flops(case) / 2}
    assert [launch.name for launch in rec.steps] == ["channels_last_copies<__half, int, false>",
                                                     "conv_fwd_igemm<__half, int, 256, 64, 4>"]
    assert rec.steps[-1].grid == (32 * 56 * 56 // 256, 1, 1) and rec.steps[-1].block == (128,)
    # it tiles exactly too: 392 blocks of 256 x 64 over 18 chunks of 32 halves = the useful MACs
    assert predict.tensor_core_macs(rec.steps[-1]) == 392 * 256 * 64 * 18 * 32 == cases.flops(case) // 2
    assert predict.pass_macs(rec.steps, case) == {1: cases.flops(case) / 2}
    rec = launches.record(BY_LABEL["r50-64-gpu16"], False)
    (launch,) = rec.steps
    assert launch.name == "conv_fwd_tc<__half, int, 128, 64>" and launch.grid == (32 * 56 * 56 // 128, 1, 1)
    assert launch.block == (256,) and launch.args["channels_per_group"] == 64
    assert launch.args["x"].read_only and not launch.args["out"].read_only
    # strict fp32 takes the FMA implicit GEMM: one simt_fwd of the 192 x 64 tile, 12 x 8 per thread, no GEMM
    # (r50-512's 7x7 planes, 52 blocks, keep im2col + cuBLAS: a GEMM m = 49, n = 512, k = 4608 per image, no TF32)
    rec = launches.record(BY_LABEL["r50-64-gpu32"], False)
    (launch,) = rec.launches
    assert [(w.kind, w.elements) for w in rec.steps[:1]] == [("copy", 64 * 64 * 9)]   # the weight, arranged
    assert launch.name == "simt_fwd<float, int, 192, 64, 12>" and launch.grid == (523, 1, 1)
    assert launch.block == (128,) and not rec.gemms
    gemms = launches.record(BY_LABEL["r50-512-gpu32"], False).gemms
    assert [(g.m, g.n, g.k, g.batch, g.compute) for g in gemms] == [(49, 512, 4608, 32, "CUBLAS_COMPUTE_32F")]


def test_recording_of_the_r50_64_tf32_forward_and_backward(monkeypatch):
    """TF32 r50-64 where the recorder claims wgmma (an H100 with CUPYCONV_WGMMA=1): the forward's copy (rounding x
    and the weight to tf32) feeds one conv_fwd_wgmma<float> of the 256 x 64 tile, and the backward's stride-1
    input gradient, the transposed window's forward, one more; each tiles the pass's MACs exactly (18 chunks of
    32 floats, 4 HGMMA.64x128x8 a warpgroup each)."""
    monkeypatch.setattr(implicit_gemm, "igemm_refusal", CHANNELS_LAST_REFUSAL)
    case = BY_LABEL["r50-64-gputf32"]
    name = "conv_fwd_wgmma<float, int, 256, 64, 4>"
    forward = launches.record(case, False)
    assert [launch.name for launch in forward.launches][-1] == name, [s.name for s in forward.launches]
    launch = forward.launches[-1]
    assert launch.grid == (32 * 56 * 56 // 256, 1, 1) and launch.block == (256,)
    assert predict.tensor_core_macs(launch) == 392 * 256 * 64 * 18 * 32 == cases.flops(case) // 2
    # HGMMA warp instructions: 2 warpgroups x 18 chunks x 4 k steps x 4 warps a block
    assert predict.tensor_core_macs(launch) / predict.hmma_macs(launch) == 392 * 2 * 18 * 4 * 4
    backward = launches.record(case, True)
    assert [launch.name for launch in backward.launches].count(name) == 2, [s.name for s in backward.launches]


def test_array_library_work_is_recorded_and_modelled(monkeypatch):
    """CuPy's own copies, fills, adds and sums between launches are steps too, with the bytes their operands'
    strides touch, and the model counts them: a copy into every other pixel of every other row (fp16: a write
    stride of 4 bytes moves twice the bytes written; what the phases of ct2d-k4s2's input gradient cost when each
    was scattered so), and each of a case's array operations at its bytes over HBM; ct2d-k4s2 has no copy into
    grad_input of its phases (their epilogues write it in place) and no bias pass (the epilogue adds it too: task
    ctglue, where it was a copy up to float32, an add and a copy down)."""
    phase = 8 * 128 * 28 * 28   # images x output channels x one phase's pixels
    pixels = numpy.empty((8, 128, 56, 56), numpy.float16)[:, :, 1::2, ::2]
    w = launches.ArrayWork.of("copy", pixels, numpy.empty(pixels.shape, numpy.float16))
    assert (w.elements, w.read_bytes, w.write_bytes, w.moved_bytes) == (phase, 2 * phase, 2 * phase, 6 * phase)
    up = launches.ArrayWork.of("copy", numpy.empty((8, 128, 56, 56), numpy.float16),
                               numpy.empty((8, 128, 56, 56), numpy.float32))   # 2 + 4 bytes an element
    out = 8 * 128 * 56 * 56
    bw = predict.GPUS["h100"]["hbm_tbs"] * 1e12
    low, high = predict.assumption("array_work_efficiency")
    assert predict.array_work_times(up, predict.GPUS["h100"])["DRAM"].to_list(3) == pytest.approx(
        [6 * out / (bw * low) * 1e6, 6 * out / (bw * high) * 1e6], abs=0.01)
    monkeypatch.setattr(implicit_gemm, "igemm_refusal", CHANNELS_LAST_REFUSAL)
    case = BY_LABEL["ct2d-k4s2-gpu16"]
    rec = launches.record(case, False)
    assert not [w for w in rec.array_work if w.elements == phase], [launches.describe(s) for s in rec.steps]
    assert rec.array_work and "add" not in [w.kind for w in rec.array_work]
    result = predict.predict_case(case, False, "h100", predict.SassSource(enabled=False), counters=False)
    entries = [k for k in result["kernels"] if k["name"].startswith("CuPy ")]
    assert len(entries) == len(rec.array_work) and all(k["bound"] == "DRAM" for k in entries)
    overhead = predict.assumption("launch_overhead_us")
    fixed = predict.assumption("kernel_fixed_us")
    for entry, work in zip(entries, rec.array_work):
        dram = predict.array_work_times(work, predict.GPUS["h100"])["DRAM"]
        assert entry["kernel_us"] == pytest.approx([dram.low + fixed[0], dram.high + fixed[1]], abs=0.01)
        assert entry["predicted_us"] == pytest.approx([entry["kernel_us"][0] + overhead[0],
                                                       entry["kernel_us"][1] + overhead[1]], abs=0.01)
    total = [sum(k["predicted_us"][i] for k in result["kernels"]) for i in (0, 1)]
    assert result["predicted_us"] == pytest.approx(total, abs=0.05)


def test_recording_of_the_c3d_mri_fp32_backward():
    """c3d-mri in strict fp32 under the default 256 MiB limit: an image's backward workspace (depth windows, their
    gradient, the grad_output copy: 224 MiB) passes half the limit, so the 3-D driver runs slabs of output depths
    (2 of 16 an image) whose 2-D runs keep the rest of the limit, and the FMA weight gradient splits each slab's
    pixels until SIMT_SPLIT_BLOCKS blocks of 64 threads run (29 splits of 9 output tiles of 192 x 64, 128 threads
    each).  Under the 1-byte limit that whole images left it (707d6e2) it could not split: 14 blocks, 2.7-8.0 ms a
    launch by the model instead of 0.09-0.27 (PREDICTIONS).  'auto' gives this weight gradient to the FMA kernel again (`simt_preferred`: 64
    columns, since the 96 x 64 x 12 tile) after a time with cuBLAS (14 GEMM tiles of 128 x 128)."""
    rec = launches.record(BY_LABEL["c3d-mri-gpu32"], True)
    weights = [s for s in rec.launches if s.kernel == "simt_bwd_weight"]
    assert len(weights) == 2 * 2
    assert all(s.grid[2] > 1 and math.prod(s.grid) * s.threads >= simt_gemm.SIMT_SPLIT_BLOCKS * 64
               for s in weights), weights


# ---------------------------------------------------------------------------------------------------------
# The model's arithmetic


def test_floor_by_hand():
    case = BY_LABEL["r50-64-gpu16"]
    flops = 2 * 32 * 64 * 56 * 56 * 64 * 9
    nbytes = 2 * (2 * 32 * 64 * 56 * 56 + 64 * 64 * 9 + 64)
    floor, bound = predict.floor_us(case, False, predict.GPUS["h100"])
    assert bound == "memory" and floor == pytest.approx(nbytes / 3.35e12 * 1e6)
    assert floor > flops / 989.4e12 * 1e6
    floor, bound = predict.floor_us(case, False, predict.GPUS["h200"])   # faster HBM: compute-bound
    assert bound == "compute" and floor == pytest.approx(flops / 989.4e12 * 1e6)


def test_tensor_core_work_and_pass_macs():
    case = BY_LABEL["r50-64-gpu16"]
    rec = launches.record(case, True)
    # the generic forward and input gradient (this file's fixture); the weight gradient on the channels-last kernel,
    # whose operand copies (channels_last_copies) carry no MACs; the bias gradient comes with the weight's
    forward, grad_input, grad_weight = [s for s in rec.steps if s.kernel in predict.TENSOR_CORE_KERNELS]
    last = rec.steps[-1]   # the weight gradient itself: its splits are finished in the kernel, no final pass
    # the forward tiles exactly: 784 blocks of 128 x 64 over 18 chunks of 32 = the useful MACs
    assert predict.tensor_core_macs(forward) == 784 * 128 * 64 * 18 * 32 == cases.flops(case) // 2
    assert predict.hmma_macs(forward) == 16 * 8 * 16
    macs = predict.pass_macs(rec.steps, case)
    assert sorted(macs.values()) == [cases.flops(case) / 2] * 3 and len(macs) == 3
    assert grad_weight.kernel == last.kernel == "conv_bwd_weight_igemm"
    assert predict.tensor_core_macs(grad_weight) >= cases.flops(case) // 2
    # 3136 chunks in 44 splits of 72 (the last of 40): every chunk once, over 9 column tiles of 64 x 64
    assert predict.tensor_core_macs(grad_weight) == 9 * 64 * 64 * 3136 * 32


def _in_plane_taps(first, last, stride, pad, dilation, size, k):
    """Taps of one kernel dimension that read inside the plane for some output first .. last, by brute force."""
    return sum(any(0 <= o * stride - pad + t * dilation < size for o in range(first, last + 1)) for t in range(k))


def test_tap_clipped_depthwise_macs(monkeypatch):
    """The generic depthwise forward and input gradient count the taps they run, against brute force: the union over
    a strip's rows (GENERIC_STRIP rows, all computed) times the column's taps; one output per item in the _planes
    kernels.  The 31x31 case runs about a quarter of its taps (on the generic kernels: the large ones off)."""
    from cupyconv.ops import depthwise
    from cupyconv.ops.depthwise import GENERIC_STRIP as V
    monkeypatch.setattr(depthwise, "LARGE_MIN_K", 10**9)
    case = BY_LABEL["dw-384-14k31-gpu32"]
    rec = launches.record(case, True)
    steps = {s.kernel: s for s in rec.steps if isinstance(s, launches.Launch)}
    forward, grad_input = steps["depthwise_fwd_generic"], steps["depthwise_bwd_input_generic"]
    rows = sum(V * _in_plane_taps(oy, min(oy + V, 14) - 1, 1, 15, 1, 14, 31) for oy in range(0, 14, V))
    cols = sum(_in_plane_taps(ox, ox, 1, 15, 1, 14, 31) for ox in range(14))
    assert predict.depthwise_clipped_macs(forward) == 32 * 384 * rows * cols
    assert predict.depthwise_clipped_macs(grad_input) == 32 * 384 * rows * cols   # 'same': the transpose is alike
    assert predict.depthwise_clipped_macs(forward) < cases.flops(case) / 2 / 3.5
    macs = predict.pass_macs(rec.steps, case)
    assert macs[rec.steps.index(forward)] == predict.depthwise_clipped_macs(forward)
    # tiny planes, stride 2 and dilation 2 with per-side padding: one output per item
    tiny = launches.Launch("depthwise.cu", "depthwise_fwd_planes<float, int>", (1,), (32,), 0, dict(
        images=3, channels=5, multiplier=2, height=5, width=4, out_h=3, out_w=2, kernel_h=3, kernel_w=2, stride_h=2,
        stride_w=2, dilation_h=2, dilation_w=3, pad_top=2, pad_left=1))
    expected = sum(_in_plane_taps(oy, oy, 2, 2, 2, 5, 3) * _in_plane_taps(ox, ox, 2, 1, 3, 4, 2)
                   for oy in range(3) for ox in range(2))
    assert predict.depthwise_clipped_macs(tiny) == 3 * 10 * expected


def test_tap_clipped_depthwise_weight_macs(monkeypatch):
    """The weight gradients that skip taps count what they run, against brute force: the tiny-plane units of
    depthwise_bwd_weight_generic each tap over the outputs that read inside the plane; depthwise_bwd_weight_large each
    warp as long as its longest lane (a tap row over the output rows it reaches, LARGE_RUN taps by a row's outputs),
    two thirds of the pass's MACs for 31x31 on 14x14 (and the tiled generic kernel none: the pass's share).  (The
    31x31 case with depthwise_bwd_weight_lanes off.)"""
    from cupyconv.ops import depthwise
    from cupyconv.ops.depthwise import LARGE_RUN
    monkeypatch.setattr(depthwise, "LARGE_MIN_K", 10**9)
    tiny = launches.Launch("depthwise.cu", "depthwise_bwd_weight_generic<float, int>", (1,), (64,), 0, dict(
        images=3, channels=5, multiplier=2, height=5, width=4, out_h=3, out_w=2, kernel_h=3, kernel_w=2, stride_h=2,
        stride_w=2, dilation_h=2, dilation_w=3, pad_top=2, pad_left=1, plane_channels=16))
    expected = sum(0 <= oy * 2 - 2 + i * 2 < 5 and 0 <= ox * 2 - 1 + j * 3 < 4
                   for oy in range(3) for ox in range(2) for i in range(3) for j in range(2))
    assert predict.depthwise_weight_macs(tiny) == 3 * 10 * expected
    assert predict.depthwise_weight_macs(replace(tiny, args={**tiny.args, "plane_channels": 0})) is None
    case = BY_LABEL["dw-384-14k31-gpu32"]
    rec = launches.record(case, True)
    (large,) = [s for s in rec.steps if isinstance(s, launches.Launch) and s.kernel == "depthwise_bwd_weight_large"]
    a = large.args
    assert (a["tile_h"], a["tiles_y"], a["per_block"]) == (14, 1, 1)
    runs, slices = 4, large.threads // (31 * 4)
    order = [15 + (-((k + 1) // 2) if k % 2 else (k + 1) // 2) for k in range(31)]  # tap rows from the middle out
    lanes = []
    for t in range(large.threads):
        i, slice_ = order[t % (31 * runs) // runs], t // (31 * runs)
        reached = sum(0 <= oy - 15 + i < 14 for oy in range(14))
        lanes.append(len(range(slice_, reached, slices)) if slice_ < slices else 0)
    per_unit = sum(32 * max(lanes[w:w + 32]) for w in range(0, large.threads, 32)) * LARGE_RUN * 14
    assert predict.depthwise_weight_macs(large) == per_unit * 32 * 384
    assert predict.depthwise_weight_macs(large) < cases.flops(case) / 2 * 0.7
    assert predict.pass_macs(rec.steps, case)[rec.steps.index(large)] == predict.depthwise_weight_macs(large)


def test_work_and_times_of_a_tensor_core_main_loop():
    """The r50-64 forward with the loop the SASS gives its instantiation (sm_90, NVRTC 13: 395 instructions, 16
    HMMA, 24 LDG.U16, 24 STS.U16, 32 LDS per warp and chunk), worked out by hand."""
    launch = launches.record(BY_LABEL["r50-64-gpu16"], False).steps[0]
    loop = {"HMMA": 16, "LDG": 24, "STS": 24, "LDS": 32, "IMAD": 299}
    kernel = {"instructions": 2500, "body_instructions": 2395, "loop_rule": "matrix", "loop": loop,
              "loop_memory": {"LDG.E.U16.CONSTANT": 24, "STS.U16": 24, "LDS": 32}}
    work = predict.analytic_counters(launch, kernel, cases.flops(BY_LABEL["r50-64-gpu16"]) / 2)
    trips = 784 * 8 * 18                      # blocks x warps x K chunks
    assert work["loop_trips"] == (trips, trips) and work["hmma"] == trips * 16
    assert work["warp_instructions"] == (trips * 395 + 784 * 8 * 2000 * 0.5, trips * 395 + 784 * 8 * 2000)
    assert work["global_requests"] == trips * 24 and work["global_bytes_requested"] == trips * 24 * 2 * 32
    # LDS.32 one wavefront each, conflict-free to 2-way; STS.U16 one, up to 4-way
    assert work["shared_wavefronts"] == (trips * 56, trips * (32 * 2 + 24 * 4))
    occ = sass.occupancy(121, 256, 30720)
    times = predict.kernel_times(work, launch, occ, predict.GPUS["h100"])
    waves = 784 / (132 * 2)
    tail = math.ceil(waves) / waves
    assert times["instruction issue"].low == pytest.approx(work["warp_instructions"][0] / (132 * 4 * 1.98e9) * 1e6
                                                           * tail)
    assert times["tensor pipe"].low == pytest.approx(2 * 784 * 128 * 64 * 576 / (989.4e12 * 0.67) * 1e6 * tail)
    # a warp runs its 18 chunks one after another, at least 395 x 4 cycles each, three waves of blocks
    assert times["latency"].low == pytest.approx(18 * 395 * 4 * 3 / 1.98e9 * 1e6)
    # DRAM's low end: the reads; the 12.9 MB written fit in L2 (write-back); the high end has them
    assert work["written_bytes"] < 50 * 2**20
    assert times["DRAM"].low == pytest.approx(work["read_bytes"] / (3.35e12 * 0.92) * 1e6)
    assert times["DRAM"].high == pytest.approx(work["compulsory_bytes"] * 1.25 / (3.35e12 * 0.8) * 1e6)


def test_ranges_and_binding():
    times = {"DRAM": predict.Range(10, 20), "L2": predict.Range(9, 19), "tensor pipe": predict.Range(1, 2)}
    bound, total = predict.binding(times)
    assert bound == "DRAM ~ L2" and (total.low, total.high) == (10, 20)
    gemm = launches.Gemm(4096, 4096, 4096, 1, "float16", "float16", "CUBLAS_COMPUTE_32F", 0.0)
    t = predict.gemm_times(gemm, predict.GPUS["h100"])["tensor pipe (cuBLAS)"]
    assert t.low == pytest.approx(2 * 4096**3 / (989.4e12 * 0.75) * 1e6)
    assert t.high == pytest.approx(2 * 4096**3 / (989.4e12 * 0.5) * 1e6)


class _FakeCounterDevice:
    """The counters' API (tests/emulator): `profile[-1]`, a LaunchProfile of SiteCounters, for made-up counts."""

    def __init__(self, counters, blocks):
        assert counters is True
        self.blocks, self.profile = blocks, []

    def launch(self, source, name, grid, block, args, shared_mem=0):
        emulator = _emulator.emulator()
        run = self.blocks(grid)
        sites = [emulator.SiteCounters("conv.cu:1", "global_load", 2, requests=10, lane_accesses=320, sectors=30,
                                       lines=20, useful_bytes=640, moved_bytes=960),
                 emulator.SiteCounters("conv.cu:2", "shared_store", 2, requests=10, lane_accesses=320,
                                       useful_bytes=640, wavefronts=40)]
        self.profile.append(emulator.LaunchProfile(source, name, grid, block, shared_mem, len(run), sites))


def test_counter_adapter_scales_the_sampled_blocks():
    launch = launches.record(BY_LABEL["r50-64-gpu16"], False).steps[0]
    counters = predict.emulated_counters(launch, device_factory=_FakeCounterDevice)
    assert counters["blocks_run"] == predict.COUNTER_BLOCKS == 4 and counters["scale"] == 784 / 4
    load, store = counters["kinds"]["global_load"], counters["kinds"]["shared_store"]
    assert load["sectors"] == 30 * 196 and load["sectors_per_request"] == 3.0
    assert load["sector_efficiency"] == pytest.approx(640 / 960)
    assert store["wavefronts"] == 40 * 196 and store["wavefronts_per_request"] == 4.0
    assert set(counters["kinds"]) == {"global_load", "shared_store"}
    work = predict.apply_counters({"source": "analytic", "compulsory_bytes": 1}, counters)
    assert work["source"] == "emulator" and work["shared_wavefronts"] == (40 * 196, 40 * 196)
    assert work["global_lines"] == 20 * 196 and work["sector_efficiency"] == pytest.approx(640 / 960)

    # The budget: 784 blocks of ~100,000 warp instructions each (the estimate's high end) -> 3 blocks fit 300,000;
    # at ~200,000 a block, 2 would not fit 300,000: the analytic model, saying why; 0 lifts the limit.
    assert predict.counter_blocks(launch, {"warp_instructions": (0, 784 * 100_000)}, 300_000) == (3, None)
    blocks, why = predict.counter_blocks(launch, {"warp_instructions": (0, 784 * 200_000)}, 300_000)
    assert blocks == 0 and "too costly" in why
    assert predict.counter_blocks(launch, {"warp_instructions": (0, 784 * 200_000)}, 0) == (4, None)

    class Broken(_FakeCounterDevice):
        def launch(self, *args, **kwargs):
            raise RuntimeError("no counters for this kernel")
    assert "RuntimeError" in predict.emulated_counters(launch, device_factory=Broken)["error"]


def test_real_counters_of_a_small_tensor_core_forward():
    """The adapter on the real emulator: r50-64's forward at N = 1 (conv_fwd_tc 64 x 64, 49 blocks), 2 blocks
    counted over the recorded (uninitialised) arguments.  An independent run -- cupyconv.conv2d on fresh random
    data on EmulatedDevice(counters=True) with the same blocks -- gives the same counts per site; the adapter's
    totals are those scaled to the grid, and the model's shared-memory/L1 and L2 terms are made from them."""
    import dataclasses

    import cupyconv
    from cupyconv import _device as cupyconv_device

    emulator = _emulator.emulator()
    case = dataclasses.replace(BY_LABEL["r50-64-gpu16"], dims={**BY_LABEL["r50-64-gpu16"].dims, "N": 1})
    (launch,) = launches.record(case, False).launches
    assert launch.name == "conv_fwd_tc<__half, int, 64, 64>" and launch.blocks == 49
    counters = predict.emulated_counters(launch, blocks=2)
    assert counters["source"] == "emulator", counters
    assert counters["blocks_run"] == 2 and counters["scale"] == 49 / 2

    rng = numpy.random.default_rng()
    x = rng.standard_normal((1, 64, 56, 56)).astype(numpy.float16)
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(numpy.float16)
    b = rng.standard_normal(64).astype(numpy.float16)
    device = emulator.EmulatedDevice(counters=True, blocks=emulator.spread_blocks(2))
    with cupyconv_device.use_device(device):
        cupyconv.conv2d(x, w, b, padding=1, algorithm="implicit_gemm")
    (profile,) = device.profile
    assert profile.name == launch.name and profile.blocks_run == 2
    assert counters["sites"] == [site.to_dict() for site in profile.sites]
    for kind, got in counters["kinds"].items():
        own = profile.total(kind)
        assert got["requests"] == own.requests * 49 / 2
        if kind.startswith("global"):
            assert got["sectors"] == own.sectors * 49 / 2 and got["sector_efficiency"] == own.sector_efficiency
        else:
            assert got["wavefronts"] == own.wavefronts * 49 / 2
            assert got["wavefronts_per_request"] == own.wavefronts_per_request
    # The review's findings are in the adapter's output: 4-way A stores, a 60-75% efficient activation gather.
    stores = sorted(s["wavefronts_per_request"] for s in counters["sites"] if s["kind"] == "shared_store")
    assert stores == [1.0, 4.0]
    loads = [s for s in counters["sites"] if s["kind"] == "global_load"]
    main_loop = [s for s in loads if 4 * s["requests"] >= max(s["requests"] for s in loads)]  # not the epilogue's
    assert sorted(round(s["sector_efficiency"], 1) for s in main_loop) == [0.7, 1.0]  # activation gather, weights

    # The model's terms from the counts: L1 wavefronts = shared wavefronts + global lines, L2 up to every sector.
    model = predict.model_launch(launch, cases.flops(case) / 2, predict.SassSource(enabled=False),
                                 predict.GPUS["h100"], counters=True)
    assert model.counters["source"] == "emulator" and model.work["source"] == "emulator"
    kinds, gpu = model.counters["kinds"], predict.GPUS["h100"]   # COUNTER_BLOCKS blocks, not 2
    wavefronts = (kinds["shared_load"]["wavefronts"] + kinds["shared_store"]["wavefronts"]
                  + kinds["global_load"]["lines"] + kinds["global_store"]["lines"])
    l1 = model.times["shared memory/L1 wavefronts"]
    tail = math.ceil(49 / 132) / (49 / 132)
    assert l1.low == pytest.approx(wavefronts / (132 * gpu["clock_ghz"][1] * 1e9) * 1e6 * tail)
    sectors = kinds["global_load"]["sectors"] + kinds["global_store"]["sectors"]
    assert model.times["L2"].high == pytest.approx(32 * sectors / (gpu["l2_tbs"][0] * 1e12) * 1e6)
    analytic = predict.model_launch(launch, cases.flops(case) / 2, predict.SassSource(enabled=False), gpu,
                                    counters=False)
    assert analytic.counters["source"] == "analytic" and "counters off" in analytic.counters["why"]


def test_every_gpu_case_gets_a_prediction():
    """Every GPU case of cases.ALL_CASES (the N-d ones included), both passes, without SASS (quick): a range,
    a floor and a binding resource each, and a host range (benchmarks.host_overhead's counts: a positive number of
    calls, at least one launch) whose larger with the GPU's is the wall range."""
    source = predict.SassSource(enabled=False)
    for case in cases.select([], ("gpu",)):
        for backward in (False, True):
            r = predict.predict_case(case, backward, "h100", source, counters=False)
            low, high = r["predicted_us"]
            assert 0 < low <= high and r["floor_us"] > 0 and r["bound"] and r["kernels"], (case.label, r)
            assert r["x_floor"] == pytest.approx([low / r["floor_us"], high / r["floor_us"]], rel=1e-2, abs=0.02)
            assert r["host_us"] is not None, (case.label, backward, r.get("host_why"))
            host_low, host_high = r["host_us"]
            assert 0 < host_low < host_high and r["host_counts"]["calls"] > 20 and r["host_counts"]["launches"] >= 1
            assert r["wall_us"] == [round(max(low, host_low), 2), round(max(high, host_high), 2)], (case.label, r)


def test_smoke_run_of_the_command(tmp_path):
    """`python -m benchmarks.predict` on a few cases (tensor cores, depthwise, cuBLAS, an N-d case) writes the
    JSON other tools read.  Compiles a few instantiations for their SASS where NVRTC is installed."""
    out = tmp_path / "predict.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "benchmarks.predict", "--cases",
                           "r50-64-gpu16,dw-256-56-gpu16,r50-64-gpu32,c1d-audio-gpu16", "--quick", "--json", out],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PREDICTION (no GPU measurement)" in done.stdout
    data = json.loads(out.read_text())
    assert data["meta"]["prediction"].startswith("PREDICTION") and data["meta"]["sources"]
    assert set(data["meta"]["assumptions"]) == set(predict.ASSUMPTIONS)
    assert [(r["case"], r["pass"]) for r in data["results"]] == [
        (c, p) for c in ("r50-64-gpu16", "dw-256-56-gpu16", "r50-64-gpu32", "c1d-audio-gpu16")
        for p in ("fwd", "fwd+bwd")]
    for r in data["results"]:
        assert {"case", "pass", "dtype", "gpu", "kernels", "predicted_us", "floor_us", "bound", "x_floor"} <= set(r)
        for k in r["kernels"]:
            assert {"name", "launch", "counters", "bound", "predicted_us"} <= set(k)


def test_one_pass_kernels_add_their_sm_and_memory_times_at_the_high_end():
    """A warp of fewer than 2 main-loop trips loads, computes and stores once: when SM-bound, its high end is its
    busiest SM resource plus its busiest memory level (the H200's depthwise kernels of 2026-11-26 took 1.0-1.7x
    the larger high end), the low end still the largest; its latency adds the global load's latency to the chain."""
    times = {"instruction issue": predict.Range(2.5, 6.5), "latency": predict.Range(1.0, 3.0),
             "DRAM": predict.Range(2.9, 4.2), "L2": predict.Range(1.9, 4.4)}
    assert predict.in_sequence_high(times) == pytest.approx(6.5 + 4.4)
    streaming = {**times, "DRAM": predict.Range(7.3, 10.5)}   # memory-bound: the compute hides behind the loads
    assert predict.in_sequence_high(streaming) == pytest.approx(10.5)
    launch = launches.Launch("k.cu", "k<float>", (512,), (256,), 0, {})
    warps = 512 * 8
    one = {"loop_trips": (warps * 0.8, warps * 1.0), "loop_instructions": 500, "loop_waits_on_global": True,
           "warp_instructions": (warps * 600, warps * 800), "shared_wavefronts": (0, 0), "compulsory_bytes": 1 << 20,
           "read_bytes": 1 << 19, "global_requests": 0, "global_bytes_requested": 1 << 20}
    many = {**one, "loop_trips": (warps * 8.0, warps * 10.0)}
    assert predict.one_pass(one, launch) and not predict.one_pass(many, launch)
    occ = sass.occupancy(64, 256, 0)
    gpu = predict.GPUS["h200"]
    lat_one = predict.kernel_times(one, launch, occ, gpu)["latency"]
    lat_many = predict.kernel_times(many, launch, occ, gpu)["latency"]
    gap, memory = predict.assumption("cycles_between_instructions"), predict.assumption("global_load_latency_cycles")
    assert lat_one.low == pytest.approx(0.8 * (500 * gap[0] + memory[0]) / 1.98e9 * 1e6)   # chain + load
    assert lat_many.low == pytest.approx(8.0 * max(500 * gap[0], memory[0]) / 1.98e9 * 1e6)  # overlapped



def test_warps_that_wait_for_their_loads_every_trip_add_waits_and_instructions():
    """A warp of several trips that waits for a load of its own at least once a trip (the depthwise kernels that
    walk several units a block: stage, barrier, compute, barrier) has no loads in flight during its compute: its
    executed instructions and waits add up, as a one-pass warp's do; one that waits less often than once a trip
    keeps the larger of the two."""
    launch = launches.Launch("k.cu", "k<float>", (512,), (256,), 0, {})
    warps = 512 * 8
    base = {"loop_trips": (warps * 3.0, warps * 4.0), "loop_instructions": 500, "loop_waits_on_global": True,
            "warp_instructions": (warps * 3000, warps * 3000), "shared_wavefronts": (0, 0),
            "compulsory_bytes": 1 << 20, "read_bytes": 1 << 19, "global_requests": 0,
            "global_bytes_requested": 1 << 20}
    waiting = {**base, "executed": {"per_warp": 3000.0, "global_waits_per_warp": 4.0, "anchored": 1.0}}
    hiding = {**base, "executed": {"per_warp": 3000.0, "global_waits_per_warp": 3.9, "anchored": 1.0}}
    assert not predict.one_pass(waiting, launch)
    assert predict.in_turns(waiting, launch) and not predict.in_turns(hiding, launch)
    assert not predict.in_turns(base, launch)   # no executed count: the static per-trip rule
    occ = sass.occupancy(64, 256, 0)
    gpu = predict.GPUS["h100"]
    gap, memory = predict.assumption("cycles_between_instructions"), predict.assumption("global_load_latency_cycles")
    lat = predict.kernel_times(waiting, launch, occ, gpu)["latency"]
    assert lat.high == pytest.approx((3000 * gap[1] + 4.0 * memory[1]) / (gpu["clock_ghz"][0] * 1e9) * 1e6)
    lat = predict.kernel_times(hiding, launch, occ, gpu)["latency"]
    assert lat.high == pytest.approx(max(3000 * gap[1], 3.9 * memory[1]) / (gpu["clock_ghz"][0] * 1e9) * 1e6)


def test_one_wave_of_waiting_warps_takes_turns_with_the_memory():
    """A launch whose blocks all run at once (one wave) and whose warps wait for their loads (a barrier after
    staging: shared wavefronts; or a load of their own) is in lockstep: its high end adds its SM and memory times
    even when the memory's is the larger; more blocks than a wave, or warps that never wait, stream."""
    gpu = predict.GPUS["h100"]
    occ = sass.occupancy(64, 256, 0)
    one_wave = launches.Launch("k.cu", "k<float>", (gpu["sms"] * occ.blocks_per_sm,), (256,), 0, {})
    two_waves = replace(one_wave, grid=(gpu["sms"] * occ.blocks_per_sm + 1,))
    staged = {"shared_wavefronts": (10, 10)}
    waiting = {"shared_wavefronts": (0, 0), "executed": {"per_warp": 100.0, "global_waits_per_warp": 1.0}}
    streaming = {"shared_wavefronts": (0, 0), "executed": {"per_warp": 100.0, "global_waits_per_warp": 0.5}}
    assert predict.in_lockstep(staged, one_wave, occ, gpu) and predict.in_lockstep(waiting, one_wave, occ, gpu)
    assert not predict.in_lockstep(streaming, one_wave, occ, gpu)
    assert not predict.in_lockstep(staged, two_waves, occ, gpu)
    times = {"instruction issue": predict.Range(2.0, 5.8), "DRAM": predict.Range(4.2, 6.0)}
    assert predict.in_sequence_high(times) == pytest.approx(6.0)
    assert predict.in_sequence_high(times, lockstep=True) == pytest.approx(5.8 + 6.0)


def test_written_bytes_that_fit_in_l2_leave_the_dram_low_end():
    """L2 is write-back: a kernel's DRAM low end counts its reads and only the writes beyond L2's size."""
    gpu = predict.GPUS["h100"]
    l2 = gpu["l2_mib"] * 2**20
    assert predict.dram_low_bytes({"compulsory_bytes": 32e6, "written_bytes": 28.9e6}, gpu) == pytest.approx(3.1e6)
    assert predict.dram_low_bytes({"compulsory_bytes": l2 + 5e6, "written_bytes": l2 + 1e6}, gpu) == \
        pytest.approx(5e6)
    assert predict.dram_low_bytes({"compulsory_bytes": 8e6}, gpu) == 8e6

def test_kernel_time_is_the_prediction_less_the_launch_overhead():
    """kernel_us (compared with CUPTI's kernel durations) = the binding resource + kernel_fixed_us (+ the finish's
    tail of a weight gradient that adds its partial rows in the launch: iii's depthwise_bwd_weight, `finish_tail`);
    predicted_us adds launch_overhead_us; together the 1.5-4 us a launch of the model before 2026-11-26."""
    fixed, overhead = predict.assumption("kernel_fixed_us"), predict.assumption("launch_overhead_us")
    assert (fixed[0] + overhead[0], fixed[1] + overhead[1]) == (1.5, 4.0)
    result = predict.predict_case(BY_LABEL["iii-gpu32"], True, "h200", predict.SassSource(enabled=False),
                                  counters=False)
    for k in result["kernels"]:
        assert k["predicted_us"] == pytest.approx([k["kernel_us"][0] + overhead[0], k["kernel_us"][1] + overhead[1]],
                                                  abs=0.02)
        busiest = max(low for low, _ in k["resources_us"].values())
        tail = k["work"].get("finish_tail_us", [0.0, 0.0])[0]
        assert k["kernel_us"][0] == pytest.approx(busiest + fixed[0] + tail, abs=0.02)


def test_depthwise_weight_gradient_finishes_in_its_launch():
    """iii's weight gradient adds its partial rows in its own launch (depthwise.cu's finish_rows, `finish_splits`):
    no second launch, a finish tail of FINISH_ROWS rows a trip after its last wave."""
    from cupyconv.ops.depthwise import FINISH_ROWS
    result = predict.predict_case(BY_LABEL["iii-gpu32"], True, "h100", predict.SassSource(enabled=False),
                                  counters=False)
    assert not any("reduce" in k["name"] for k in result["kernels"])
    (weight,) = [k for k in result["kernels"] if k["name"].startswith("depthwise_bwd_weight<")]
    assert weight["work"]["finish_splits_a_trip"] == FINISH_ROWS and weight["work"]["finish_tail_us"][0] > 0


def test_choices_record_an_autotuned_plan():
    """--choices: the r50-64 fp32 backward as the H200's autotuning ran it (im2col + cuBLAS weight gradient, then
    conv_bgrad and conv_bgrad_sum for the bias), the forward fp16 as conv_fwd_direct; a choice that is no candidate is ignored."""
    names = [getattr(s, "name", type(s).__name__) for s in
             launches.record(BY_LABEL["r50-64-gpu32"], True, choices={"grad_weight": "im2col_gemm"}).steps]
    assert [n.split("<")[0] for n in names] == ["ArrayWork", "simt_fwd", "ArrayWork", "simt_fwd", "unfold_im2col",
                                                "ArrayWork", "Gemm", "conv_bgrad", "conv_bgrad_sum"]
    assert [s.name for s in launches.record(BY_LABEL["r50-64-gpu16"], False, choices={"forward": "direct"}).steps] \
        == ["conv_fwd_direct<__half, int, 8>"]
    auto = launches.record(BY_LABEL["r50-64-gpu16"], False).steps
    assert [s.name for s in launches.record(BY_LABEL["r50-64-gpu16"], False, choices={"forward": "nope"}).steps] \
        == [s.name for s in auto]


def test_counters_of_copies_in_one_launch_are_sampled_per_job(monkeypatch):
    """channels_last_copies (r50-64's forward at N = 1: x's 1,568 row tiles and the weight's 18, two a block) is
    sampled per job (`counter_strata`: [0, block_end0) and the rest), each job's counts scaled by its own blocks:
    the totals are those of the two copies launched apart (channels_last_copy, each sampled alike) to 5%; an even
    spread over the whole launch would count the weight's last block as a quarter of the launch (global sectors
    +14% where per job they are +3%: the blocks sampled in the weight differ, a tile a block apart)."""
    import dataclasses

    monkeypatch.setattr(implicit_gemm, "igemm_refusal", CHANNELS_LAST_REFUSAL)   # (this file's fixture refuses it)
    case = dataclasses.replace(BY_LABEL["r50-64-gpu16"], dims={**BY_LABEL["r50-64-gpu16"].dims, "N": 1})
    combined = launches.record(case, False).launches[0]
    assert combined.kernel == "channels_last_copies"
    e0 = int(combined.args["block_end0"])
    assert [(s.start, s.stop) for s in predict.counter_strata(combined)] == [(0, e0), (e0, combined.grid[0])]
    monkeypatch.setattr(implicit_gemm, "_copies_launch", lambda device, jobs, rounds: [
        implicit_gemm._channels_last_copy(device, xv, out, rounds, rest, index) for _, out, rest, xv, index in jobs])
    apart = launches.record(case, False).launches[:2]
    assert [launch.kernel for launch in apart] == ["channels_last_copy"] * 2
    assert predict.counter_strata(apart[0]) == [range(apart[0].grid[0])]
    got = predict.emulated_counters(combined)["kinds"]
    want = [predict.emulated_counters(launch)["kinds"] for launch in apart]
    for kind in ("global_load", "global_store", "shared_load", "shared_store"):
        for name in ("requests", "useful_bytes", "sectors", "wavefronts"):
            if name in got[kind]:
                want_total = sum(w[kind][name] for w in want)
                assert got[kind][name] == pytest.approx(want_total, rel=0.05), (kind, name, got[kind][name])


def test_the_last_block_of_each_tile_is_counted_and_its_tail_timed():
    """conv_bwd_weight_igemm finishes its splits in the kernel (the last block of each tile to arrive reads every
    split's sums of the tile): the counters run its sample twice, every count at 0 (blocks that are not last) and at
    splits - 1 (each sampled block is its tile's last: main loop and tail), and weight them (splits - 1) / splits
    and 1 / splits, so the tail counts once per tile.  `finish_tail` times the tails after the last wave: per tile
    the larger of a load's latency per trip (two splits of the 64 x 64 tile's 32 elements a thread: 64 loads in
    flight, `weight_finish_splits`) and the tile's bytes at one SM's share of L2."""
    launch = next(s for s in launches.record(BY_LABEL["r50-64-gpu16"], True).steps
                  if getattr(s, "kernel", None) == "conv_bwd_weight_igemm")
    splits, tiles = launch.grid[2], launch.grid[0] * launch.grid[1]
    assert splits == 44 and tiles == 9
    assert predict.arrival_strata(launch) == [(0, 43 / 44), (43, 1 / 44)]
    seen = []

    class Tail(_FakeCounterDevice):   # 4 last blocks add 7 requests of 32 sectors to the same load site
        def launch(self, source, name, grid, block, args, shared_mem=0):
            super().launch(source, name, grid, block, args, shared_mem)
            arrivals = args[list(launch.args).index("arrivals")]
            seen.append(int(arrivals.max()))
            if arrivals.max() == splits - 1:
                self.profile[-1].sites[0].requests += 7
                self.profile[-1].sites[0].sectors += 7 * 32
    counters = predict.emulated_counters(launch, device_factory=Tail)
    assert seen == [0, splits - 1]
    load = counters["kinds"]["global_load"]
    per_block = predict.COUNTER_BLOCKS   # the fake's counts are the sample's, 4 blocks
    assert load["requests"] == pytest.approx((10 * launch.blocks + 7 * tiles) / per_block)
    assert load["sectors"] == pytest.approx((30 * launch.blocks + 7 * 32 * tiles) / per_block)
    # the tail: 44 splits of a 64 x 64 tile of float sums (720,896 bytes) on one SM, in 22 trips of two splits
    gpu = predict.GPUS["h100"]
    assert predict.weight_finish_splits(launch.kernel, launch.template_args, 128) == 2
    assert launch.block[0] == 128 and predict.finish_tail(launch, gpu).high > predict.finish_tail(launch, gpu, 2).high
    tail = predict.finish_tail(launch, gpu, 2)
    tile_bytes = 44 * 64 * 64 * 4
    assert launch.args["partial"].nbytes == tile_bytes * tiles
    low = max(22 * 300, tile_bytes / 64) / (gpu["clock_ghz"][1] * 1e9) * 1e6
    high = max(22 * 700, tile_bytes / 32) / (gpu["clock_ghz"][0] * 1e9) * 1e6
    assert (tail.low, tail.high) == (pytest.approx(low), pytest.approx(high))
    forward = launches.record(BY_LABEL["r50-64-gpu16"], False).steps[-1]
    assert predict.finish_tail(forward, gpu) is None and predict.arrival_strata(forward) == [(None, 1.0)]
