"""Mutation score of the kernel tests: how many deliberately broken kernels do they catch?

    PYTHONPATH=. python tests/mutation_score.py [--only NAME ...] [--jobs N] [--list]

Each mutation below replaces one exact snippet of one raw_kernels/ file (or, named by its path from the root, of
one of the emulator's own headers, tests/emulator/include/, which its self-tests must then catch, or of a
module of cupyconv/ whose kernel orchestration the tests must check: the strided input gradient's phases).
A mutant is built in a scratch copy of the checkout (cupyconv/, tests/, raw_kernels/: cupyconv._device.kernel_dir()
finds the copy's raw_kernels/ next to the copy's package, so the emulator compiles the mutated source; the real
files are never edited) and the mutation's tests run there with `pytest -x`.  Killed: a test failed.  Survived:
every selected test passed.  Not run: every selected test was skipped (the mma.cuh mutants: the emulator replaces mma.cuh's instructions by
its own, tests/emulator/include/emu_mma.h, so only `-m gpu` on a GPU can run them).  The score is
killed / (killed + survived).

A snippet that no longer occurs exactly once is an error, not a silent skip: tests/test_mutation_list.py checks
that in CI, so editing a kernel means updating the list.  Not a test module itself (pytest collects test_*.py
only): the full run takes several minutes.
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "raw_kernels"
EMULATOR_INCLUDE = "tests/emulator/include"  # mutations of these files name them from the root
PACKAGE = "cupyconv"                         # ... and of these


class Mutation(NamedTuple):
    name: str
    file: str         # in raw_kernels/
    original: str     # must occur exactly once in the file
    replacement: str
    tests: str        # pytest arguments, run from the root of the copy
    kind: str


UNFOLD = "tests/test_unfold_kernels.py"
LIFT = "tests/test_lift_kernels.py"
CONV = "tests/test_conv_kernels.py"
CONV_WG = CONV + " -k 'small_groups_against or ragged_last_split or weight_gradient_64_bit'"   # conv_bwd_weight_direct
TC = "tests/test_tensor_core_kernels.py"
TC_SWEEP = "tests/test_tensor_core_sweep.py"
SIMT = "tests/test_simt_gemm_kernels.py"
SIMT_PY = "cupyconv/ops/simt_gemm.py"
SIMT_RULE = SIMT + " -k 'rule_of_the_shapes or tall_tile'"   # simt_tall_rows: 256 x 64 x 16 or 192 x 64 x 12
WG = "tests/test_weight_igemm.py"
IG = "tests/test_igemm_kernels.py"
IG_PHASES = "tests/test_igemm_phases.py"
IG_PAIRS = IG + " -k 'every_tile or split_k_matches or accumulates or forward_matches'"   # ig_forward's PAIRS
IG3D = "tests/test_igemm_3d.py"
IG_PACKED = IG + " -k 'halves or every_tile'"   # ig_forward's PACKED (the 256-row tiles' y, x in halves)
IG_PY = "cupyconv/ops/implicit_gemm.py"
IGG = "tests/test_igemm_groups.py"
WGG = IGG + " -k weight_gradient"
DEPTHWISE = "tests/test_depthwise_kernels.py"
# (DW_STRIDED: the strided input gradients' tests, depthwise_bwd_input_strided and depthwise_bwd_input_phased)
DW_STRIDED = DEPTHWISE + " -k 'strided_input_gradient_blocks or s2'"
DW_FWD = DEPTHWISE + (" -k 'every_digit or steps_through or matches_cpu or aligned or loops or padding_per_side or "
                      "pack_channels'")
DW_PACKED = DEPTHWISE + " -k 'pack_channels'"  # the packed channels of depthwise_persistent on small planes
DW_SPREAD = DEPTHWISE + " -k 'bank_conflicts or pack_channels or steps_through'"  # spread planes (small, narrow)
DW_PY = "cupyconv/ops/depthwise.py"
AT_PY = "cupyconv/_autotune.py"   # which candidate autotuning keeps (`keep`, `_preferred`)
AT = "tests/test_autotune.py"
DW_CHUNKS = DEPTHWISE + " -k 'packed_16_bit_5x5 or packed_chunks_past'"  # the packed 16-bit 5x5 by chunks (dwk5)
# the 16-bit 3x3 stride-1 per-image rows staged in batches (stage_rows16, task dw3s1)
DW_ROWS16 = DEPTHWISE + " -k 'rows_staged_in_batches and 2048'"
DW_PFLAT = DEPTHWISE + " -k 'pairs'"  # depthwise_bwd_weight's PAIRS instantiations, staged flat by pairs (dw16wg)
DW_WFLAT = DEPTHWISE + " -k 'flat or steps_through'"  # depthwise_bwd_weight's FLAT staging (task dwwg3)
DW_RAW = DEPTHWISE + " -k 'raw_16_bit or raw_weight'"  # depthwise_bwd_weight's RAW16 staging (task dwwg3, 21st)
DW_REDUCE = DEPTHWISE + " -k 'reduce_'"  # depthwise_bwd_reduce's two paths and the planner's grid (task dwwgt)
DW_SPLIT = DEPTHWISE + " -k 'split_rows'"  # the per-image stride-2 weight gradient's de-interleaved rows
DW_DIRECT = DEPTHWISE + " -k 'rows_directly or direct_past'"  # the per-image stride-2 forward's rows (direct_fma)
DW_STAGE1 = DEPTHWISE + " -k 'several_units or stage1_rows'"  # its split of the units over blocks
DW_PLANES = DEPTHWISE + " -k 'tiny or planes or rect_stride1_multiplier3'"  # depthwise_bwd_weight_generic's planes
DW_TINYK = DEPTHWISE + " -k 'planes_k4 or tiny_4x4 or tiny_kernel'"  # the planes kernels' <T, I, K> instantiations
DW_REGS = DEPTHWISE + " -k 'in_registers or planes_k4 or tiny_4x4'"  # ... their planes of at most K x K in registers
DW_LARGE = DEPTHWISE + " -k 'large or k31 or k7_dilation2 or k6x9 or k9_on'"  # depthwise_bwd_weight_large's cases
# depthwise_fwd_large, _bwd_input_large and depthwise_bwd_weight_lanes (task dwlarge)
DW_WIDE = DEPTHWISE + " -k 'k31 or k13 or k15 or wide or large_kernels or lanes_weight'"
# (DW_FWD: the tests of the persistent forward, input gradient and weight gradient)
PATCH = "tests/test_patch_kernels.py"
GPU_TC = "tests/test_tensor_core_kernels.py -m gpu"
EMU_ASYNC = "tests/emulator/include/emu_async_copy.h"
EMU_ASYNC_TESTS = "tests/test_emulator_async_copy.py"
EMU_RUNTIME = "tests/emulator/include/emu_runtime.h"
REPLAY = "tests/test_replay.py"
REPLAY_PY = "cupyconv/_replay.py"
REPLAY_SCRATCH = REPLAY + " -k 'scratch or rides'"
DEVICE_PY = "cupyconv/_device.py"
M = Mutation

MUTATIONS = [
    # -- cupyconv/_replay.py and _device.py: a replay's prepared launches and folded arguments (task hostcut) ------
    M("replay-empty-arg-per-replay", REPLAY_PY, "if type(t) is Ref and t.slot is None:",
      "if type(t) is Ref and t.slot is None and False:", REPLAY, "argument made per call"),
    M("replay-dead-empty-kept", REPLAY_PY, 'if not (step[0] == "empty" and step[2] not in read)]',
      'if True]', REPLAY, "allocation kept"),
    M("replay-dead-empty-read-dropped", REPLAY_PY, 'if not (step[0] == "empty" and step[2] not in read)]',
      'if not step[0] == "empty"]', REPLAY, "live allocation dropped"),
    M("launch-scalars-unwrapped", DEVICE_PY, "return tuple(wrap(a) if isinstance(a, _SCALARS) else a for a in args)",
      "return tuple(args)", REPLAY, "scalars wrapped per launch"),
    M("launch-prepare-no-opt-in", DEVICE_PY, """        if shared_mem > DEFAULT_SHARED_LIMIT:
            opt_in_shared_memory(kernel, shared_mem)
        return (kernel.kernel""", """        return (kernel.kernel""", REPLAY, "shared memory not opted in"),
    # a call's scratch arrays as parts of one allocation (`_replay._pooled`, task hostlaunch)
    M("replay-scratch-parts-unaligned", REPLAY_PY, "size += _nbytes(steps[i][1], rounded=True)",
      "size += _nbytes(steps[i][1])", REPLAY_SCRATCH, "part misaligned"),
    M("replay-scratch-parts-overlap", REPLAY_PY, "parts[i] = (slots, size)", "parts[i] = (slots, 0)", REPLAY_SCRATCH,
      "parts overlap"),
    M("replay-scratch-peak-ignored", REPLAY_PY, "if _peak(_arenas(steps, trial, slots)[0], keep) <= peak:",
      "if True:", REPLAY_SCRATCH, "memory held longer"),
    M("replay-scratch-results-pooled", REPLAY_PY, 'if method == "empty" and result not in keep and',
      'if method == "empty" and', REPLAY_SCRATCH, "result in an arena"),
    M("replay-switch-read-once", REPLAY_PY, "        return get(key) != off", "        return True", REPLAY + " -k switch",
      "setting ignored"),
    M("replay-results-share-unbounded", REPLAY_PY, "if budget[host] < nbytes:", "if False:", REPLAY_SCRATCH,
      "result carries too much"),
    # -- cupyconv/ops/implicit_gemm.py: a split grid's splits within its tile's wave (`wave_splits`, `ig_wave`) --
    M("ig512-splits-ceiling", IG_PY, "key=lambda s: (ceil_div(blocks * s, wave) * ceil_div(chunks, s), s))",
      "key=lambda s: (ceil_div(chunks, s) if blocks * (s - 1) < wave else 10**9, -s))", IG + " -k 'wave'",
      "plan: a partial second wave"),
    M("ig512-splits-tie-more", IG_PY, "key=lambda s: (ceil_div(blocks * s, wave) * ceil_div(chunks, s), s))",
      "key=lambda s: (ceil_div(blocks * s, wave) * ceil_div(chunks, s), -s))", IG + " -k 'wave'",
      "plan: needless splits"),
    M("ig512-wave-no-residency", IG_PY, "return max(1, IG_WAVE_BLOCKS * IG_BLOCKS_AN_SM[tile] // 2)",
      "return max(1, IG_WAVE_BLOCKS)", IG + " -k 'wave'", "plan: wrong wave"),
    M("ig512-fills-any", IG_PY, "fills = ((lambda p, b: b * (p[2] + 1) > ig_wave(p[0])) if table is None",
      "fills = ((lambda p, b: True) if table is None", IG + " -k 'wave'", "plan: wrong tile"),
    # -- cupyconv/ops/implicit_gemm.py: the strided input gradient's phases (`grad_input_phases`) ---------------
    M("phase-low-padding-off-by-one", IG_PY, "low = (len(taps) - 1) * phase_dilation - (first",
      "low = 1 + (len(taps) - 1) * phase_dilation - (first", IG_PHASES, "off-by-one"),
    M("phase-dilation-not-reduced", IG_PY, "phase_dilation = step * dilation // stride", "phase_dilation = dilation",
      IG_PHASES, "wrong dilation"),
    M("phase-taps-unflipped", IG_PY, "slice(k - 1 - p.taps[-1], k - p.taps[0], p.taps.step)",
      "slice(p.taps[0], p.taps[-1] + 1, p.taps.step)", IG_PHASES, "flipped taps"),
    M("phase-scatter-stride-swap", IG_PY, "phase[0].first::spec.stride[0], phase[1].first::spec.stride[1]",
      "phase[0].first::spec.stride[1], phase[1].first::spec.stride[0]", IG_PHASES, "swapped stride"),
    M("phase-pad-side", IG_PY, "for k, s, d, (pad, _), size, out in zip(", "for k, s, d, (_, pad), size, out in zip(",
      IG_PHASES, "wrong-side padding"),
    M("phase-empty-not-zeroed", IG_PY, "        device.copyto(pixels, 0 if bias is None else bias.reshape(-1, 1, 1))",
      "        pass", IG_PHASES, "unwritten output"),
    # where each phase's epilogue writes in grad_input (`PhasePlacement`), and when with 16-byte vectors
    M("phase-first-column-lost", IG_PY, "phase_first=fh * w + fw,", "phase_first=fh * w,", IG_PHASES,
      "phase: epilogue address"),
    M("phase-row-step-unstrided", IG_PY, "phase_row_step=sh * w,", "phase_row_step=w,", IG_PHASES,
      "phase: epilogue address"),
    M("phase-vector-strided-columns", IG_PY, 'return (arguments["phase_column_step"] == 1 and width % vector == 0',
      "return (width % vector == 0", IG_PHASES, "phase: epilogue address"),
    M("phase-vector-row-straddle", IG_PY, 'arguments["phase_column_step"] == 1 and width % vector == 0',
      'arguments["phase_column_step"] == 1', IG_PHASES, "phase: epilogue address"),
    # all the phases in one conv_fwd_igemm_phases launch (`_grad_input_one_launch`, `ig_axis_phase`)
    M("phase1-residue-unflipped", "implicit_gemm.cu", "phase.residue = step - 1 - i;", "phase.residue = i;",
      IG_PHASES, "phase: weight offset"),
    M("phase1-pad-off-by-one", "implicit_gemm.cu", "phase.pad = (taps - 1) * phase_dilation - reach / stride;",
      "phase.pad = taps * phase_dilation - reach / stride;", IG_PHASES, "off-by-one"),
    M("phase1-rows-floor", "implicit_gemm.cu", "{(size - first + stride - 1) / stride, 0, -1}",
      "{(size - first) / stride, 0, -1}", IG_PHASES, "off-by-one"),
    M("phase1-axis-swap", "implicit_gemm.cu", "fh = phase / phases_w, fw = phase % phases_w",
      "fh = phase / phases_h, fw = phase % phases_h", IG_PHASES, "swapped stride"),
    M("phase1-weight-offset-rows", "implicit_gemm.cu", "(ph.residue * grad_step_w + pw.residue)",
      "(ph.residue * grad_step_h + pw.residue)", IG_PHASES, "phase: weight offset"),
    M("phase1-tapless-reduces", "implicit_gemm.cu", "int K = has_taps ? kernel_h * kernel_w * cg : 0;",
      "int K = kernel_h * kernel_w * cg;", IG_PHASES, "phase: empty phase"),
    M("phase1-split-partial-phase-plane", "implicit_gemm.cu", "const I plane = PHASES ? out_plane : pixels;",
      "const I plane = pixels;", IG_PHASES + " -k split", "phase: split layout"),
    M("phase1-split-index", "implicit_gemm.cu", "    split /= phases;\n", "    split %= phases;\n",
      IG_PHASES + " -k split", "phase: split index"),
    M("phase1-weight-order", IG_PY, ".transpose(2, 4, 0, 1, 3, 5))", ".transpose(4, 2, 0, 1, 3, 5))", IG_PHASES,
      "phase: weight offset"),
    M("phase1-64-bit-accepted", IG_PY, ') != "int":', ') == "":', IG_PHASES + " -k 32_bits", "phase: refusal"),
    M("phase1-uneven-taps-accepted", IG_PY, "    if any(k % step for k, step in zip(spec.kernel_size, steps)):",
      "    if False:", IG_PHASES, "phase: refusal"),

    # -- common.cuh ------------------------------------------------------------------------------------------
    M("common-grid-start-thread-only", "common.cuh", "return (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;",
      "return (I)threadIdx.x;", UNFOLD, "grid-stride"),

    # -- unfold.cu -------------------------------------------------------------------------------------------
    M("unfold-im2col-col-bound", "unfold.cu", "row_inside && xx >= 0 && xx < width",
      "row_inside && xx >= 0 && xx <= width", UNFOLD, "off-by-one"),
    M("fold-last-row-bound", "unfold.cu", "oy >= out_h) continue;\n      const T* tap",
      "oy > out_h) continue;\n      const T* tap", UNFOLD, "off-by-one"),
    M("unfold-im2col-stride-swap", "unfold.cu", "const int x0 = ox * stride_w - pad_left;\n    int y = oy * stride_h",
      "const int x0 = ox * stride_w - pad_left;\n    int y = oy * stride_w", UNFOLD, "swapped stride"),
    M("fold-stride-swap", "unfold.cu", "by_stride_w.divmod(tx, rx)", "by_stride_h.divmod(tx, rx)", UNFOLD,
      "swapped stride"),
    M("unfold-im2col-pad-side", "unfold.cu", "const int x0 = ox * stride_w - pad_left;",
      "const int x0 = ox * stride_w - pad_top;", UNFOLD, "wrong-side padding"),
    M("fold-pad-side", "unfold.cu", "int ty = y + pad_top;  // = oy * stride_h for the window whose",
      "int ty = y + pad_left;  // = oy * stride_h for the window whose", UNFOLD, "wrong-side padding"),
    M("fold-half-sum", "unfold.cu", "acc_t<T> sum[FOLD_PLANES];", "T sum[FOLD_PLANES];", UNFOLD, "half accumulation"),
    M("unfold-int-pixels", "unfold.cu", "const I pixels = (I)out_h * out_w;\n  const I windows",
      "const I pixels = out_h * out_w;\n  const I windows", UNFOLD, "32-bit index"),
    M("unfold-im2col-tap-step", "unfold.cu", "const I tap_step = dilation_w * x_stride_w;",
      "const I tap_step = x_stride_w;", UNFOLD, "dropped dilation"),
    M("fold-plane-group", "unfold.cu", "index_divmod<I>(row, by_height, y) * FOLD_PLANES;",
      "index_divmod<I>(row, by_height, y) * (FOLD_PLANES - 1);", UNFOLD, "wrong unit split"),
    M("fold-plane-offset", "unfold.cu", "tap[p * cols_plane + ox]", "tap[p * pixels + ox]", UNFOLD,
      "wrong plane stride"),
    M("fold-last-group-count", "unfold.cu", "min(planes - first, (I)FOLD_PLANES)", "(I)FOLD_PLANES", UNFOLD,
      "off-by-one"),
    M("unfold-vec-window-word", "unfold.cu", "case 1: a[0] = lo.y;", "case 1: a[0] = lo.x;", UNFOLD,
      "wrong vector element"),
    M("unfold-vec-row-end", "unfold.cu", "start + (offset ? 2 * V : V) <= width", "start + V <= width", UNFOLD,
      "off-by-one"),
    M("unfold-vec-half-shift", "unfold.cu", "const unsigned shift = 8 * (bytes & 3);", "const unsigned shift = 0;",
      UNFOLD, "wrong vector element"),
    M("unfold-vec-pack-order", "unfold.cu", "(unsigned)e[2 * k] | ((unsigned)e[2 * k + 1] << 16)",
      "(unsigned)e[2 * k + 1] | ((unsigned)e[2 * k] << 16)", UNFOLD, "wrong vector element"),
    M("unfold-vec-left-bound", "unfold.cu", "e[k] = xx + k >= 0 && xx + k < width",
      "e[k] = xx + k > 0 && xx + k < width", UNFOLD, "off-by-one"),
    M("unfold-vec-pad-side", "unfold.cu", "int xx = ox0 - pad_left;", "int xx = ox0 - pad_top;", UNFOLD,
      "wrong-side padding"),
    M("unfold-vec-stride-swap", "unfold.cu", "+ ox0;\n    int y = oy * stride_h", "+ ox0;\n    int y = oy * dilation_h",
      UNFOLD, "swapped stride"),
    M("unfold-vec-load-in-row", "unfold.cu", "return start >= 0 && start + V <= width ?", "return start >= 0 ?",
      UNFOLD, "off-by-one"),
    # fold_col2im's vector instantiations (fold_runs, task foldcopy)
    M("fold-vec-last-row-bound", "unfold.cu", "oy >= out_h) continue;  // no window's",
      "oy > out_h) continue;  // no window's", UNFOLD, "off-by-one"),
    M("fold-vec-pad-side", "unfold.cu", "int tx = x0 + pad_left;", "int tx = x0 + pad_top;", UNFOLD,
      "wrong-side padding"),
    M("fold-vec-dilation", "unfold.cu", "tx -= dilation_w, tap_row += pixels", "tx -= 1, tap_row += pixels", UNFOLD,
      "dropped dilation"),
    M("fold-vec-hi-skipped", "unfold.cu", "hi[k] = offset[k] ? load_or_zero(tap_row, start + V, out_w) : lo[k];",
      "hi[k] = lo[k];", UNFOLD, "wrong vector element"),
    M("fold-vec-int-row", "unfold.cu", "(I)oy * out_w;  // tap (i, 0)'s", "oy * out_w;  // tap (i, 0)'s", UNFOLD,
      "32-bit index"),
    M("fold-vec-store-run", "unfold.cu", "+ row * width + x0) = packed", "+ row * width + run) = packed", UNFOLD,
      "wrong unit split"),
    M("fold-vec-plane-offset", "unfold.cu", "plane * taps * pixels;", "plane * pixels;", UNFOLD,
      "wrong plane stride"),
    M("fold-vec-tap-order", "unfold.cu", "for (int k = 0; k < FOLD_TAPS && j0 + k < kernel_w; ++k) {",
      "for (int k = FOLD_TAPS - 1; k >= 0; --k) if (j0 + k < kernel_w) {", UNFOLD, "summation order"),
    # conv_transpose's bias in the input gradient's kernels (task ctglue): fold_col2im's BIAS, the tensor cores'
    # epilogue through `lift.backward`'s input_bias, and the paths that add it after their kernels
    M("ctb-fold-bias-channel", "unfold.cu", "index_divmod<I>(first, by_channels, c);",
      "c = 0;", UNFOLD + " -k bias", "wrong channel"),
    M("ctb-fold-bias-wrap", "unfold.cu", "c = c + 1 == channels ? 0 : c + 1", "c = c + 1 == channels ? c : c + 1",
      UNFOLD + " -k bias", "wrong channel"),
    M("ctb-fold-vec-bias-channel", "unfold.cu",
      "      index_divmod<I>(plane, by_channels, c);\n      const acc_t<T> add",
      "      c = 0;\n      const acc_t<T> add", UNFOLD + " -k bias", "wrong channel"),
    M("ctb-fold-bias-dropped", "cupyconv/ops/unfold.py", '"fold_col2im", (run, bias is not None)',
      '"fold_col2im", (run, False)', UNFOLD + " -k bias", "dropped bias"),
    M("ctb-fold-chunk-bias-dropped", "cupyconv/ops/conv.py", "out=grad_x[chunk],\n                 bias=bias)",
      "out=grad_x[chunk],\n                 bias=None)", UNFOLD + " -k bias", "dropped bias"),
    M("ctb-fold-bands-bias-dropped", "cupyconv/ops/conv.py",
      "        return lift.add_channel_bias(device, grad_x, bias)", "        return grad_x", UNFOLD + " -k bias",
      "dropped bias"),
    M("ctb-phases-bias-dropped", IG_PY, "outputs_per_group=gemm.outputs_per_group, has_bias=bias is not None,",
      "outputs_per_group=gemm.outputs_per_group, has_bias=False,", IG_PHASES + " -k bias", "dropped bias"),
    M("ctb-empty-phase-bias-zero", IG_PY, "0 if bias is None else bias.reshape(-1, 1, 1)", "0",
      IG_PHASES + " -k bias", "dropped bias"),
    M("ctb-phased-bias-dropped", IG_PY, "flipped[1]]), bias,", "flipped[1]]), None,", IG_PHASES + " -k bias",
      "dropped bias"),
    M("ctb-stride-1-bias-dropped", IG_PY, "igemm_forward(device, gy_cl, arranged, bias, transposed_spec(spec), out)",
      "igemm_forward(device, gy_cl, arranged, None, transposed_spec(spec), out)", IG_PHASES + " -k bias",
      "dropped bias"),
    M("ctb-generic-bias-dropped", IG_PY, "return add_channel_bias(device, out, bias)", "return out",
      IG_PHASES + " -k bias", "dropped bias"),
    M("ctb-3d-bias-dropped", IG_PY, "igemm_forward_3d(device, gy_cl, wk, bias, transposed_spec(spec), out)",
      "igemm_forward_3d(device, gy_cl, wk, None, transposed_spec(spec), out)", "tests/test_igemm_3d.py -k bias",
      "dropped bias"),
    M("ctb-lifted-3d-bias-dropped", "cupyconv/ops/lift.py",
      "grad_x, grad_w, grad_b = _lifted_backward(run, device, grad_output, x, weight, spec, needs, algorithm)\n"
      "        if grad_x is not None:\n            grad_x = add_channel_bias(device, grad_x, input_bias)",
      "grad_x, grad_w, grad_b = _lifted_backward(run, device, grad_output, x, weight, spec, needs, algorithm)",
      "tests/test_igemm_3d.py -k bias", "dropped bias"),
    M("common-fast-divmod-host-shift", "common.cuh", "l(32 - __clz(divisor - 1))", "l(31 - __clz(divisor - 1))",
      UNFOLD, "off-by-one"),

    # -- conv.cu: direct kernel, bias, bias gradient ----------------------------------------------------------
    M("conv-direct-barrier-slab", "conv.cu", "__syncthreads();  // the previous slab's", "// the previous slab's",
      CONV, "removed barrier"),
    M("conv-direct-barrier-staged", "conv.cu", "__syncthreads();\n        // Rows past out_h",
      "// Rows past out_h", CONV, "removed barrier"),
    M("conv-bgrad-barrier", "conv.cu", "tree[threadIdx.x] = (sum[0] + sum[1]) + (sum[2] + sum[3]);\n  __syncthreads();",
      "tree[threadIdx.x] = (sum[0] + sum[1]) + (sum[2] + sum[3]);", CONV, "removed barrier"),
    M("conv-bgrad-split-bound", "conv.cu", "for (; p < p_end; p += step) sum[0]", "for (; p <= p_end; p += step) sum[0]",
      CONV, "off-by-one"),
    M("conv-bgrad-sum-half", "conv.cu", "    acc_t<T> sum = 0;\n    for (int s = 0; s < splits;",
      "    T sum = 0;\n    for (int s = 0; s < splits;", CONV, "half accumulation"),
    M("conv-direct-col-bound", "conv.cu", "(unsigned)(ix0 + x_at) < (unsigned)width ?",
      "(unsigned)(ix0 + x_at) <= (unsigned)width ?", CONV, "off-by-one"),
    M("conv-direct-pair-col-bound", "conv.cu", "(unsigned)(ix0 + x_at + 1) < (unsigned)width ?",
      "(unsigned)(ix0 + x_at + 1) <= (unsigned)width ?", CONV, "off-by-one"),
    M("conv-direct-pair-stride", "conv.cu", "to_acc(x_slab[at + x_stride_w])", "to_acc(x_slab[at + 1])", CONV,
      "dropped stride"),
    M("conv-direct-pair-even-width", "cupyconv/ops/conv.py",
      "DIRECT_ROWS - 1) * sh + (kh - 1) * dh + 1, tile_w + tile_w % 2)",
      "DIRECT_ROWS - 1) * sh + (kh - 1) * dh + 1, tile_w)", CONV, "odd pitch"),
    # conv_bwd_weight_direct's x staging by stage_pairs (task grpdir: the helper's own mutants above and below are
    # the forward's), its warps' info in shared memory (task grpwgrad)
    M("conv-wgrad-pair-even-width", "cupyconv/ops/conv.py",
      "(rows - 1) * sh + (kh - 1) * dh + 1, tile_w + tile_w % 2)",
      "(rows - 1) * sh + (kh - 1) * dh + 1, tile_w)", CONV_WG, "odd pitch"),
    M("conv-wgrad-stage-origin", "conv.cu", "channels_per_group, tile_in_h, tile_in_w, iy0, ix0, height, width,",
      "channels_per_group, tile_in_h, tile_in_w, ix0, iy0, height, width,", CONV_WG, "swapped origin"),
    M("conv-wgrad-stage-thread", "conv.cu", "thread, (int)blockDim.x, walk[1 + thread], walk[0]);",
      "thread, (int)blockDim.x, walk[1 + thread % 32], walk[0]);", CONV_WG, "wrong thread"),
    # conv_bwd_weight_direct's lane sums by halves (task grpdir)
    M("conv-wgrad-halves-first", "conv.cu", "first += h, held -= h;", "held -= h;", CONV_WG, "wrong output"),
    M("conv-wgrad-halves-held", "conv.cu", "held = min(held, h);", "held = held;", CONV_WG, "padding stored"),
    M("conv-wgrad-halves-sent", "conv.cu", "sent = upper ? v[i] : high;", "sent = upper ? high : v[i];", CONV_WG,
      "wrong half"),
    M("conv-wgrad-halves-steps", "conv.cu", "wgrad_lane_halves<h, STEP / 2>(v, lane, first, held);",
      "wgrad_lane_halves<h, STEP / 4>(v, lane, first, held);", CONV_WG, "dropped lanes"),
    M("conv-wgrad-grad-output-step", "conv.cu", "for (int step = warp; step < steps; step += warps) {",
      "for (int step = warp; step < steps; step += 2 * warps) {", CONV_WG, "skipped rows"),
    M("conv-wgrad-walk-step", "conv.cu", "walk[0] = pair_at(blockDim.x, tile_in_w, tile_in_h);",
      "walk[0] = pair_at(32, tile_in_w, tile_in_h);", CONV_WG, "wrong step"),
    M("conv-wgrad-walk-start", "conv.cu", "walk[1 + threadIdx.x] = pair_at(threadIdx.x, tile_in_w, tile_in_h);",
      "walk[1 + threadIdx.x] = pair_at(threadIdx.x % 32, tile_in_w, tile_in_h);", CONV_WG, "wrong start"),
    M("conv-wgrad-walk-shared", "cupyconv/ops/conv.py", "shared += (1 + warps * 32) * 3 * 4",
      "shared += 0", CONV + " -k asan", "shared memory overrun"),
    M("conv-wgrad-info-offsets", "conv.cu", "++kk) offset[kk] = warp_info[kk];", "++kk) offset[kk] = warp_info[0];",
      CONV_WG, "one column for all"),
    M("conv-wgrad-info-k0", "conv.cu", "info[warp * WGRAD_INFO + lane] = k0;", "info[warp * WGRAD_INFO + lane] = 0;",
      CONV_WG, "wrong block"),
    M("conv-wgrad-info-shared", "cupyconv/ops/conv.py", "shared += warps * WGRAD_INFO * 4",
      "shared += 0", CONV + " -k asan", "shared memory overrun"),   # ASan sees shared memory's end
    M("conv-wgrad-barrier-unit", "conv.cu", "__syncthreads();  // the previous unit's readers",
      "// the previous unit's readers", CONV, "removed barrier"),
    M("conv-wgrad-barrier-staged", "conv.cu", "    __syncthreads();\n    const int* warp_info = info + warp",
      "    const int* warp_info = info + warp", CONV, "removed barrier"),
    M("conv-wgrad-grad-output-bound", "conv.cu", "value[dd] = d < outputs_per_group && y < out_h && ox < out_w",
      "value[dd] = d < outputs_per_group && y <= out_h && ox < out_w", CONV, "off-by-one"),
    # conv_bwd_weight_direct's fused bias sums and conv_bgrad_sum's second output (task grpbias)
    M("conv-wgrad-bias-zero", "conv.cu", "if (with_bias) wgrad_bias_sums<A>(info, warps, threadIdx.x)[d] = 0;", "", CONV_WG, "uninitialised sum"),
    M("conv-wgrad-bias-steps", "conv.cu", "for (int step = 0; step < steps; ++step) {\n        const A* gy_step = static_cast<const A*>(__builtin_assume_aligned(gy_lane + step * 32 * WGRAD_DPT, 16));\n        A b[WGRAD_DPT];",
      "for (int step = 1; step < steps; ++step) {\n        const A* gy_step = static_cast<const A*>(__builtin_assume_aligned(gy_lane + step * 32 * WGRAD_DPT, 16));\n        A b[WGRAD_DPT];",
      CONV_WG, "dropped term"),
    M("conv-wgrad-bias-offset", "conv.cu", "A* bias_partial = partial + (I)groups * outputs_per_group * columns * splits;",
      "A* bias_partial = partial + (I)groups * outputs_per_group * columns;", CONV_WG, "wrong offset"),
    M("conv-wgrad-bias-slot", "conv.cu", "return reinterpret_cast<A*>(base + (end + 15) / 16 * 16) + thread * WGRAD_DPT;",
      "return reinterpret_cast<A*>(base + (end + 15) / 16 * 16) + thread % 32 * WGRAD_DPT;", CONV_WG, "shared slot"),
    M("conv-wgrad-bias-after-info", "conv.cu", "reinterpret_cast<char*>(info + warps * WGRAD_INFO) - base);",
      "reinterpret_cast<char*>(info) - base);", CONV_WG, "overlapping shared memory"),
    M("conv-wgrad-bias-lane-tree", "conv.cu", "const A v = warp_tree_sum(bias_sums[d]);", "const A v = bias_sums[d];",
      CONV_WG, "dropped lanes"),
    M("conv-bgrad-sum-after", "conv.cu", "grad_after[d - channels] = from_acc<T>(sum);",
      "grad_after[d - channels] = from_acc<T>(partial[(I)d * splits]);", CONV_WG, "dropped splits"),
    M("conv-wgrad-bias-shared", "cupyconv/ops/conv.py", "ceil_div(shared, 16) * 16 + warps * 32 * WGRAD_DPT * acc if",
      "ceil_div(shared, 16) * 16 if", CONV + " -k asan", "shared memory overrun"),
    # conv_fwd_direct's has_bias (the input gradient passes no zero-filled bias)
    M("conv-direct-has-bias", "conv.cu", "const A b = has_bias && d0 + d < d_end ?", "const A b = d0 + d < d_end ?",
      CONV_WG, "placeholder read"),
    M("conv-wgrad-split-end", "conv.cu", "const I unit_end = min(units, unit_begin + units_per_split);",
      "const I unit_end = unit_begin + units_per_split;", CONV + " -k 'ragged or asan'", "off-by-one"),
    M("conv-wgrad-lane-tree", "conv.cu", "for (int step = 16; step > 0; step /= 2)",
      "for (int step = 8; step > 0; step /= 2)", CONV, "dropped lanes"),
    M("conv-wgrad-row-stride", "conv.cu", "const A* x_row = x_lane + step * row_steps * stride_h * tile_in_w;",
      "const A* x_row = x_lane + step * row_steps * stride_w * tile_in_w;", CONV, "swapped stride"),
    M("conv-wgrad-lane-row", "conv.cu", "x_tile + lane_row * stride_h * tile_in_w + lane_column * stride_w;",
      "x_tile + lane_row * tile_in_w + lane_column * stride_w;", CONV, "dropped stride"),
    M("conv-wgrad-slide-shift", "conv.cu", "xv[0][j] = xv[1][j];", "xv[0][j] = xv[2][j];", CONV, "stale registers"),
    M("conv-wgrad-slide-stride", "conv.cu", "stride_h == dilation_h && lane_columns == 32",
      "lane_columns == 32", CONV, "dropped stride"),
    M("conv-wgrad-slide-first-rows", "conv.cu",
      "for (int i = 0; i < 2; ++i) {\n#pragma unroll\n        for (int j = 0; j < 3; ++j) xv[i][j]",
      "for (int i = 0; i < 1; ++i) {\n#pragma unroll\n        for (int j = 0; j < 3; ++j) xv[i][j]", CONV, "off-by-one"),
    M("conv-wgrad-half-sum", "conv.cu", "A sum[WGRAD_DPT][WGRAD_KT];", "T sum[WGRAD_DPT][WGRAD_KT];", CONV,
      "half accumulation"),
    M("conv-wgrad-int-pixel", "conv.cu", "gy_group[d * plane + (I)y * out_w + ox]",
      "gy_group[d * plane + y * out_w + ox]", CONV, "32-bit index"),
    M("conv-direct-store-bound", "conv.cu", "if (y >= out_h) break;", "if (y > out_h) break;", CONV, "off-by-one"),
    M("conv-direct-row-bound", "conv.cu", "(unsigned)(iy0 + y_at) < (unsigned)height",
      "(unsigned)(iy0 + y_at) <= (unsigned)height", CONV, "off-by-one"),
    M("conv-direct-walk-row-carry", "conv.cu", "if (x_at >= tile_in_w) x_at", "if (x_at > tile_in_w) x_at", CONV,
      "off-by-one"),
    M("conv-direct-walk-channel-carry", "conv.cu", "if (y_at >= tile_in_h) y_at", "if (y_at > tile_in_h) y_at",
      CONV, "off-by-one"),
    M("conv-direct-walk-row-carry-stride", "conv.cu", "row_carry = x_stride_h - (I)tile_in_w * x_stride_w;",
      "row_carry = x_stride_h - (I)tile_in_w;", CONV, "dropped stride"),
    M("conv-direct-walk-channel-carry-stride", "conv.cu", "channel_carry = x_stride_c - (I)tile_in_h * x_stride_h;",
      "channel_carry = x_stride_c - (I)tile_in_h * x_stride_w;", CONV, "swapped stride"),
    M("conv-direct-walk-step", "conv.cu", "return {e % pairs_w * 2,", "return {e % pairs_w,", CONV, "wrong step"),
    M("conv-direct-batch-stride", "conv.cu", "for (int e0 = tid; e0 < count; e0 += BATCH * threads)",
      "for (int e0 = tid; e0 < count; e0 += threads)", CONV, "wrong step"),
    M("conv-direct-batch-store-bound", "conv.cu", "if (e0 + b * threads < count) reinterpret_cast<DirectPair<A>*>(tile)[e0 + b * threads] = v[b];",
      "reinterpret_cast<DirectPair<A>*>(tile)[e0 + b * threads] = v[b];", CONV + " -k asan", "out of bounds"),
    M("conv-direct-weight-batch-bound", "conv.cu", "if (e0 + b * threads < w_count) wslab[e0 + b * threads] = v[b];",
      "wslab[e0 + b * threads] = v[b];", CONV + " -k 'slabs or small_groups'", "out of bounds"),
    M("conv-direct-staged-once-always", "conv.cu", "if (d0 == d_begin || slab < channels_per_group) {",
      "if (d0 == d_begin) {", CONV, "stale shared memory"),
    M("conv-direct-item-outputs-end", "conv.cu", "d_end = min(outputs_per_group, d_begin + outputs_per_item);",
      "d_end = d_begin + outputs_per_item;", CONV, "off-by-one"),
    M("conv-direct-weight-block", "conv.cu", "weight[(I)(g * outputs_per_group + d0 + d)",
      "weight[(I)(g * outputs_per_group + d)", CONV, "wrong output block"),
    M("conv-direct-row-step-stride", "conv.cu", "const int row_step = stride_h * tile_in_w;",
      "const int row_step = tile_in_w;", CONV, "swapped stride"),
    M("conv-direct-slide-last-row", "conv.cu", "for (int y = 0; y < DIRECT_ROWS + DIRECT_SLIDE_KH - 1; ++y)",
      "for (int y = 0; y < DIRECT_ROWS + DIRECT_SLIDE_KH - 2; ++y)", CONV, "off-by-one"),
    M("conv-direct-slide-dilation", "conv.cu", "stride_h == 1 && dilation_h == 1 && kernel_h == DIRECT_SLIDE_KH",
      "stride_h == 1 && kernel_h == DIRECT_SLIDE_KH", CONV, "dropped dilation"),
    M("conv-direct-slide-stride", "conv.cu", "stride_h == 1 && dilation_h == 1 && kernel_h == DIRECT_SLIDE_KH",
      "dilation_h == 1 && kernel_h == DIRECT_SLIDE_KH", CONV, "dropped stride"),
    M("conv-direct-stride-swap", "conv.cu", "const int ix0 = tile_x * bx * stride_w - pad_left;",
      "const int ix0 = tile_x * bx * stride_h - pad_left;", CONV, "swapped stride"),
    M("conv-direct-pad-side", "conv.cu", "const int iy0 = tile_y * tile_h * stride_h - pad_top;",
      "const int iy0 = tile_y * tile_h * stride_h - pad_left;", CONV, "wrong-side padding"),
    M("conv-direct-half-sum", "conv.cu", "A sum[DIRECT_ROWS][DPT];", "T sum[DIRECT_ROWS][DPT];", CONV,
      "half accumulation"),
    M("conv-bgrad-half-sum", "conv.cu", "A sum[4] = {0, 0, 0, 0};", "T sum[4] = {0, 0, 0, 0};", CONV,
      "half accumulation"),
    M("conv-direct-int-pixel", "conv.cu", "const I pixel = (I)y * out_w + ox;", "const I pixel = y * out_w + ox;",
      CONV, "32-bit index"),

    # -- implicit_gemm.cu: tensor-core implicit GEMMs (conv_fwd_tc, conv_bwd_input_tc, conv_bwd_weight_tc) ---------------
    M("tc-barrier-chunk", "implicit_gemm.cu", "if (t + 1 < chunks) store_chunk(stage ^ 1);  // the other stage: last read "
      "before the previous barrier\n    __syncthreads();", "if (t + 1 < chunks) store_chunk(stage ^ 1);", TC,
      "removed barrier"),
    M("tc-chunks-floor", "implicit_gemm.cu", "(k_end - k_begin + TC_BK - 1) / TC_BK : 0;", "(k_end - k_begin) / TC_BK : 0;",
      TC, "off-by-one"),
    M("tc-fwd-col-bound", "implicit_gemm.cu", "(unsigned)xx >= (unsigned)width) return S(0.0f);\n    return S(x[(I)(row_origin",
      "(unsigned)xx > (unsigned)width) return S(0.0f);\n    return S(x[(I)(row_origin", TC, "off-by-one"),
    M("tc-bwd-weight-rows-barrier", "implicit_gemm.cu", "__syncthreads();  // tc_block's first loads read the rows",
      "// tc_block's first loads read the rows", TC, "removed barrier"),
    M("tc-tap-int-channel", "gather.cuh", "return {(U)c * (U)stride_c +", "return {(U)(c * (int)stride_c) +", TC,
      "32-bit index"),
    M("tc-bwd-input-int-plane", "implicit_gemm.cu", "row_base[rs] + (I)column.d * out_pixels +",
      "row_base[rs] + (I)(column.d * (int)out_pixels) +", TC, "32-bit index"),
    M("tc-bwd-input-last-row", "implicit_gemm.cu", "oy >= out_h || ox >= out_w) return S(0.0f);",
      "oy > out_h || ox >= out_w) return S(0.0f);", TC, "off-by-one"),
    M("tc-fwd-stride-swap", "gather.cuh", "x = p % out_w * stride_w - pad_left;",
      "x = p % out_w * stride_h - pad_left;", TC, "swapped stride"),
    M("tc-bwd-weight-stride-swap", "implicit_gemm.cu", "const int x0 = ox * stride_w - pad_left;",
      "const int x0 = ox * stride_h - pad_left;", TC, "swapped stride"),
    M("tc-fwd-pad-side", "gather.cuh", "y = p / out_w * stride_h - pad_top,",
      "y = p / out_w * stride_h - pad_left,", TC, "wrong-side padding"),
    M("tc-bwd-input-pad-side", "implicit_gemm.cu", "f.row_x[r] = p % width + pad_left;", "f.row_x[r] = p % width + pad_top;",
      TC, "wrong-side padding"),
    M("tc-bwd-weight-pad-side", "implicit_gemm.cu", "y0 = oy * stride_h - pad_top;",
      "y0 = oy * stride_h - pad_left;", TC, "wrong-side padding"),
    M("tc-bwd-weight-half-partial", "implicit_gemm.cu", "partial[row + (I)n * M] = value;",
      "partial[row + (I)n * M] = to_acc(from_acc<T>(value));", TC, "half accumulation"),
    M("tc-fwd-int-pixels", "implicit_gemm.cu", "f.pixels = (I)out_h * out_w; f.M", "f.pixels = out_h * out_w; f.M", TC,
      "32-bit index"),
    M("tc-pitch-odd", "implicit_gemm.cu", "K_STEP = 16, PITCH = TC_BK + 8;", "K_STEP = 16, PITCH = TC_BK + 9;", TC,
      "misaligned pack"),
    M("tc-fragment-a-k-half", "implicit_gemm.cu", "8 * (r & 1)) * P + k0 + 2 * q + 8 * (r >> 1);",
      "8 * (r >> 1)) * P + k0 + 2 * q + 8 * (r & 1);", TC, "tc: fragment index"),
    M("tc-fragment-tf32-a", "implicit_gemm.cu", "a[mi][1] = to_tf32(p[8 * P]);\n    a[mi][2] = to_tf32(p[4]);",
      "a[mi][1] = to_tf32(p[4]);\n    a[mi][2] = to_tf32(p[8 * P]);", TC, "tc: fragment index"),

    # -- implicit_gemm.cu: channels-last forward and input gradient (conv_fwd_igemm, channels_last_copy) -----------
    M("ig-wait-too-weak", "implicit_gemm.cu", "cp_async_wait<STAGES / STEP - 2>();  // chunk t",
      "cp_async_wait<STAGES / STEP - 1>();  // chunk t", IG, "removed barrier"),
    M("ig-barrier-chunk", "implicit_gemm.cu", "    __syncthreads();                     // ... everyone's",
      "    // ... everyone's", IG, "removed barrier"),
    M("ig-swizzle-store-side", "implicit_gemm.cu", "const int store_offset = ig_swizzle(row0, v) + half",
      "const int store_offset = row0 * IG_ROW_BYTES + (v << 4) + half", IG, "tc: fragment index"),
    # ig_forward's PAIRS (two K chunks a load, 8 lanes a row): the second chunk's stage and columns, the step, the
    # rows, the quarter warps' rows (bank conflicts), a split's odd last chunk
    M("igp-half-stage", "implicit_gemm.cu", "ig_swizzle(row0, v) + half * STAGE_BYTES;", "ig_swizzle(row0, v);",
      IG_PAIRS, "tc: fragment index"),
    M("igp-half-column-a", "implicit_gemm.cu", "int c = v * VEC + half * BK, r = 0", "int c = v * VEC, r = 0", IG_PAIRS,
      "off-by-one"),
    M("igp-half-column-b", "implicit_gemm.cu", "int b_k = v * VEC + half * BK + chunk_begin * BK;",
      "int b_k = v * VEC + chunk_begin * BK;", IG_PAIRS, "off-by-one"),
    M("igp-step-b", "implicit_gemm.cu", "b_offset[i] += STEP * BK;", "b_offset[i] += BK;", IG_PAIRS, "off-by-one"),
    M("igp-rows-per-pass", "implicit_gemm.cu", "const I m = m0 + row0 + ROWS_PER_PASS * i;",
      "const I m = m0 + row0 + 32 * i;", IG_PAIRS, "off-by-one"),
    M("igp-odd-last-chunk", "implicit_gemm.cu", "      if (PAIRS && t + h >= chunks) break;\n", "", IG_PAIRS,
      "split reduction"),
    M("igp-off", "implicit_gemm.cu", "constexpr bool PAIRS = IG_PAIRS && !PHASES", "constexpr bool PAIRS = false && !PHASES",
      "tests/test_counters.py -k channels_last_forward", "performance"),
    M("igp-quarter-warp-rows", "implicit_gemm.cu",
      "half = PAIRS ? (tid >> 3) & 1 : 0;\n  const int row0 = PAIRS ? (tid >> 4) * 2 + ((tid >> 2) & 1)",
      "half = PAIRS ? (tid >> 2) & 1 : 0;\n  const int row0 = PAIRS ? (tid >> 4) * 2 + ((tid >> 3) & 1)",
      "tests/test_counters.py -k channels_last_forward", "bank conflicts"),
    # ig_forward's PACKED (the 256-row tiles' pairs: a row's y, x in 16-bit halves of one register): each half's
    # bounds test, the bias that keeps the low half from borrowing, the tap's offset, the rows past M, the planner
    M("igpk-x-bound", "implicit_gemm.cu", "(int)(0x80000000u + ((unsigned)width << 16))",
      "(int)(0x80000000u + ((unsigned)(width + 1) << 16))", IG_PACKED, "off-by-one"),
    M("igpk-y-bound", "implicit_gemm.cu", "yx < (unsigned)height << 16", "yx < (unsigned)(height + 1) << 16",
      IG_PACKED, "off-by-one"),
    M("igpk-low-bias", "implicit_gemm.cu", "(unsigned)(a_x[i] + 0x8000) : 0x80008000u",
      "(unsigned)a_x[i] : 0x80008000u", IG_PACKED, "tc: fragment index"),
    M("igpk-tap-halves", "implicit_gemm.cu", "const unsigned dyx = ((unsigned)dy << 16) + (unsigned)dx;",
      "const unsigned dyx = ((unsigned)dx << 16) + (unsigned)dy;", IG_PACKED, "tc: fragment index"),
    M("igpk-rows-past-m", "implicit_gemm.cu", ": 0x80008000u;", ": 0x8000u;",
      "tests/test_counters.py -k 256_rows", "performance"),
    M("igpk-planner-unguarded", IG_PY, "if table is None and not ig_fits_halves(spec):", "if False:",
      IG + " -k halves", "missing guard"),
    M("ig-fragment-b-order", "implicit_gemm.cu", "ig_swizzle(warp_n + (j >> 1) * 8 + jr, 2 * ks + (j & 1));",
      "ig_swizzle(warp_n + (j & 1) * 8 + jr, 2 * ks + (j >> 1));", IG, "tc: fragment index"),
    M("ig-carry-column", "implicit_gemm.cu", "        s = 0;\n        dx = 0;\n", "        s = 0;\n", IG, "off-by-one"),
    M("ig-zero-fill", "implicit_gemm.cu", "src, inside ? IG_VECTOR_BYTES : 0);", "src, IG_VECTOR_BYTES);", IG,
      "off-by-one"),
    M("ig-dilation-swap", "implicit_gemm.cu", "      dx += dilation_w;", "      dx += dilation_h;", IG, "swapped stride"),
    M("ig-pad-side", "implicit_gemm.cu", "a_x[i] = ox * stride_w - pad_left;", "a_x[i] = ox * stride_w - pad_top;", IG,
      "wrong-side padding"),
    M("ig-epilogue-half-bias", "implicit_gemm.cu", "from_acc<T>(acc[mi][ni][e] + add);",
      "from_acc<T>(to_acc(from_acc<T>(acc[mi][ni][e])) + add);", IG, "half accumulation"),
    M("ig-no-swizzle", "implicit_gemm.cu", "r * IG_ROW_BYTES + ((v ^ ((r >> 1) & 3)) << 4);", "r * IG_ROW_BYTES + (v << 4);",
      "tests/test_counters.py -k channels_last_forward", "bank conflicts"),
    M("ig-channels-last-no-tf32", "implicit_gemm.cu", "return round_tf32 ? __uint_as_float(to_tf32(value)) : value;",
      "return value;", IG, "tc: fragment index"),
    # channels_last_copy: flat (image, pixel) rows, 16-byte vectors of channels through a swizzled tile
    M("cl-swizzle-one-side", "implicit_gemm.cu",
      "const int read_slot = lane * CL_VECTORS + ((threadIdx.x / CL_ROWS) ^ (lane & 7));",
      "const int read_slot = lane * CL_VECTORS + threadIdx.x / CL_ROWS;", IG + " -k channels_last", "tc: fragment index"),
    M("cl-no-swizzle", "implicit_gemm.cu",
      "const int read_slot = lane * CL_VECTORS + ((threadIdx.x / CL_ROWS) ^ (lane & 7));\n"
      "  const int write_slot = write_row * CL_VECTORS + (write_v ^ (write_row & 7));",
      "const int read_slot = lane * CL_VECTORS + threadIdx.x / CL_ROWS;\n"
      "  const int write_slot = write_row * CL_VECTORS + write_v;",
      "tests/test_counters.py -k channels_last", "bank conflicts"),
    M("cl-swapped-plane-axes", "implicit_gemm.cu", "(I)y * x_stride_h + (I)xx * x_stride_w +",
      "(I)xx * x_stride_h + (I)y * x_stride_w +", IG + " -k channels_last", "swapped stride"),
    M("cl-batch-inner-only", "implicit_gemm.cu", "origin = outer * x_stride_outer + inner * x_stride_inner;",
      "origin = image * x_stride_inner;", IG + " -k channels_last", "wrong plane stride"),
    M("cl-channels-past-end", "implicit_gemm.cu", "if (WHOLE_VECTORS || read_c + e < channels) b[e] = *src;",
      "if (WHOLE_VECTORS || read_c < channels) b[e] = *src;", IG + " -k asan", "off-by-one"),
    M("cl-tile-stride", "implicit_gemm.cu", "t < row_tiles; t += tile_step) {", "t < row_tiles; t += tile_step + 1) {",
      IG + " -k channels_last", "grid-stride"),
    # channels_last_copies: two or three copies in one launch, each job its range of a 1-D grid
    M("clc-job-bound", "implicit_gemm.cu", "const int j = block < block_end0 ? 0 : block < block_end1 ? 1 : 2;",
      "const int j = block <= block_end0 ? 0 : block < block_end1 ? 1 : 2;", IG + " -k copies", "off-by-one"),
    M("clc-third-job-start", "implicit_gemm.cu", "begin = cl_pick<I>(j, 0, block_end0, block_end1)",
      "begin = cl_pick<I>(j, 0, block_end0, block_end0)", IG + " -k copies", "wrong offset"),
    M("clc-channel-block-skipped", "implicit_gemm.cu", "(CL_VECTORS * 16 / (int)sizeof(T)) >= channels) return;",
      "(CL_VECTORS * 16 / (int)sizeof(T)) >= channels / 2) return;", IG + " -k copies", "grid-stride"),
    # ... a job with fewer channel blocks than the grid's y runs lanes of them (y = lane * 2^shift + channel block)
    M("clc-lane-first-tile", "implicit_gemm.cu", "(block - begin) * lanes + lane,", "(block - begin) + lane,",
      IG + " -k lanes", "wrong offset"),
    M("clc-lane-tile-step", "implicit_gemm.cu", "(end - begin) * (I)lanes,", "(end - begin) * (I)(lanes + 1),",
      IG + " -k lanes", "grid-stride"),
    M("clc-lane-decode", "implicit_gemm.cu", "lane = blockIdx.y >> shift;",
      "lane = blockIdx.y >> shift + 1;", IG + " -k lanes", "wrong index"),
    M("clc-lane-channel-block", "implicit_gemm.cu", "channel_block = blockIdx.y & ((1 << shift) - 1);",
      "channel_block = blockIdx.y & (1 << shift);", IG + " -k lanes", "wrong index"),
    M("clc-lanes-incomplete", IG_PY, "lanes = ((channel_blocks - owns[k]) >> shift) + 1",
      "lanes = ceil_div(channel_blocks, 1 << shift)", IG + " -k lanes", "off-by-one"),
    # ... the decode compiled out (LANES false) where every job has one lane (task lanes2)
    M("clc-lanes-flag", IG_PY, 'some_lanes = any(args[f"lanes{j}"] > 1 for j in range(3))',
      'some_lanes = any(args[f"lanes{j}"] > 2 for j in range(3))', IG + " -k copies", "off-by-one"),
    # (the decode itself left in or out, `if constexpr (!LANES)`, keeps the bits: test_sass's
    # channels_last_copy_loop_is_lean checks LANES false is the shorter; this copy has no benchmarks/ to run it)
    M("clc-one-channel-block", IG_PY,
      "channel_blocks = max(owns)", "channel_blocks = 1", IG + " -k copies", "grid-stride"),
    M("clc-backward-rest-not-staged", IG_PY,
      'rest_of = gy4 if "bias" in needs and dtype == numpy.float32 else None', "rest_of = None",
      WG + " -k keep_the_bits", "wg: bias gradient"),
    M("cl-tile-reuse-barrier", "implicit_gemm.cu", "    __syncthreads();  // the tile is refilled for the next row tile\n",
      "", IG + " -k channels_last", "removed barrier"),
    M("cl-row-32-bit", "implicit_gemm.cu", "const I r = t * CL_ROWS + lane;", "const int r = t * CL_ROWS + lane;",
      IG + " -k rows_past_2_31", "32-bit index"),
    M("cl-vector-no-tf32", "implicit_gemm.cu", "*reinterpret_cast<uint4*>(to) = cl_round_vector<T>(v, round_tf32);",
      "*reinterpret_cast<uint4*>(to) = v;", IG + " -k channels_last", "tc: fragment index"),
    M("cl-no-vector-rest", "implicit_gemm.cu",
      "if (with_rest) *reinterpret_cast<uint4*>(rest + (to - out)) = cl_rest_vector(v);", "",
      WG + " -k 'tf32 or bits'", "wg: bias gradient"),
    # the narrow tiles of conv_fwd_igemm (IG_NARROW_TILES, groups of at most 32 columns): the columns past a group
    M("ig-narrow-columns-past-group", "implicit_gemm.cu", "    if (n >= dg) break;\n", "", IG + " -k narrow",
      "off-by-one"),
    # split-K of conv_fwd_igemm (grids under IG_WAVE_BLOCKS): each split's start in A and B, its slice, the bias once
    M("ig-split-a-start", "implicit_gemm.cu", "  tap_offset += (U)(chunk_begin * BK);\n", "", IG + " -k split",
      "tc: split range"),
    M("ig-split-channel-start", "implicit_gemm.cu", "  c += chunk_begin * BK;\n", "", IG + " -k split",
      "tc: split range"),
    M("ig-split-b-start", "implicit_gemm.cu", "half * BK + chunk_begin * BK : (I)0;", "half * BK : (I)0;",
      IG + " -k split", "tc: split range"),
    M("ig-split-same-slice", "implicit_gemm.cu", "partial + (I)split * (n * groups * dg) * plane;", "partial;",
      IG + " -k split", "tc: split range"),
    M("ig-split-bias-every-split", "implicit_gemm.cu", "has_bias && split == 0 ?", "has_bias ?",
      IG + " -k split", "tc: split range"),
    M("ig-split-rounds-each-split", "implicit_gemm.cu", "slice[row + (I)col * step] = acc[mi][ni][2 * h + e] + add;",
      "slice[row + (I)col * step] = to_acc(from_acc<T>(acc[mi][ni][2 * h + e] + add));", IG + " -k split",
      "half accumulation"),
    # the strided input gradient's phases written in place (ig_phase_pixel; the NCHW epilogue and the final pass)
    M("ig-phase-column-step", "implicit_gemm.cu", "(I)column * phase_column_step", "(I)column", IG_PHASES,
      "phase: epilogue address"),
    M("ig-phase-row-step", "implicit_gemm.cu", "(I)row * phase_row_step +", "(I)row * out_w +", IG_PHASES,
      "phase: epilogue address"),
    M("ig-phase-finish-column-step", "implicit_gemm.cu", "(p - row * width) * column_step;", "(p - row * width);",
      IG_PHASES + " -k split", "phase: epilogue address"),
    M("ig-phase-finish-row-step", "implicit_gemm.cu", "return first + row * row_step +",
      "return first + row * width +", IG_PHASES + " -k split", "phase: epilogue address"),
    M("ig-phase-own-plane", "implicit_gemm.cu", "(image * groups * dg + (I)g * dg) * out_plane + phase_first",
      "(image * groups * dg + (I)g * dg) * pixels + phase_first", IG_PHASES, "phase: epilogue address"),
    M("ig-phase-row-carry", "implicit_gemm.cu", "        if (++row == out_h) {\n          row = 0;\n          ++image;",
      "        if (++row == out_h) {\n          row = 0;", IG_PHASES, "phase: epilogue address"),
    M("ig-phase-channel-plane-scalar", "implicit_gemm.cu", "out[out_row[e] + (I)n * out_plane] = values[e];",
      "out[out_row[e] + (I)n * pixels] = values[e];", IG_PHASES, "phase: epilogue address"),
    M("ig-phase-channel-plane-vector", "implicit_gemm.cu", "out + out_row[0] + (I)n * out_plane)",
      "out + out_row[0] + (I)n * pixels)", IG_PHASES, "phase: epilogue address"),
    M("ig-phase-identity-test", "implicit_gemm.cu", "if (out_plane == pixels) {", "if (true) {", IG_PHASES,
      "phase: epilogue address"),
    M("ig-phase-finish-plane", "implicit_gemm.cu", "const I to = phase_width > 0 ? d * out_plane + ig_phase_pixel(",
      "const I to = phase_width > 0 ? d * N + ig_phase_pixel(", IG_PHASES + " -k split", "phase: epilogue address"),
    M("ig-phase-finish-in-place", "implicit_gemm.cu", "const I to = phase_width > 0 ?", "const I to = false ?",
      IG_PHASES + " -k split", "phase: epilogue address"),
    # the channels-last epilogue (x channels-last: out channels-last), ig_store_channels_last and its split slices
    M("ig-cl-group-offset", "implicit_gemm.cu", "T* dst = out + m * channels + (I)g * dg + n;",
      "T* dst = out + m * channels + n;", IG + " -k channels_last_input", "ig: channels-last epilogue"),
    M("ig-cl-bias-pair", "implicit_gemm.cu", "to_acc(bias[g * dg + n + 1]) : 0.0f;", "to_acc(bias[g * dg + n]) : 0.0f;",
      IG + " -k channels_last_input", "ig: channels-last epilogue"),
    M("ig-cl-barrier", "implicit_gemm.cu", "  __syncthreads();\n  // Thread: vector cv of rows", "  // Thread: vector cv of rows",
      IG + " -k channels_last_input", "ig: channels-last epilogue"),
    M("ig-cl-split-step", "implicit_gemm.cu", "const I step = channels_last_out ? (I)1 : plane;",
      "const I step = plane;", IG + " -k channels_last_input", "ig: channels-last epilogue"),
    # conv_fwd_igemm_3d (ig_forward's DEPTH): the depth carry, the depth padding's bits, the depth stride and window
    M("ig3d-carry-keeps-row", "implicit_gemm.cu", "if (r == kernel_h) {  // q + 1, r = 0\n            r = 0;\n",
      "if (r == kernel_h) {  // q + 1, r = 0\n", IG3D, "ig3d: depth carry"),
    M("ig3d-carry-step", "implicit_gemm.cu", "tap_offset += ((U)dilation_d * (U)height - (U)kernel_h * (U)dilation_h)",
      "tap_offset += ((U)dilation_d * (U)height - (U)kernel_h)", IG3D, "ig3d: depth carry"),
    M("ig3d-depth-mask-off", "implicit_gemm.cu", "tap_inside = d3.rows & 1u << i;", "tap_inside = true;", IG3D,
      "ig3d: depth padding"),
    M("ig3d-depth-bits-row", "implicit_gemm.cu", "d3.inside |= 1u << (t * A_ROWS + i);", "d3.inside |= 1u << (t * A_ROWS);",
      IG3D, "ig3d: depth padding"),
    M("ig3d-depth-bits-tap", "implicit_gemm.cu", "(d3.inside >> (d3.q * A_ROWS))", "(d3.inside >> d3.q)", IG3D,
      "ig3d: depth padding"),
    M("ig3d-depth-stride", "implicit_gemm.cu", "(((U)z * (U)height + (U)a_y[i]) * (U)width",
      "(((U)z * (U)width + (U)a_y[i]) * (U)width", IG3D, "ig3d: depth stride"),
    M("ig3d-stride-d", "implicit_gemm.cu", "z = oz * stride_d - pad_front;", "z = oz - pad_front;", IG3D,
      "ig3d: depth window"),
    M("ig3d-pad-front", "implicit_gemm.cu", "z = oz * stride_d - pad_front;", "z = oz * stride_d;", IG3D,
      "ig3d: depth padding"),
    M("ig3d-depth-bits-dilation", "implicit_gemm.cu", "if ((unsigned)(z + t * dilation_d) < (unsigned)depth)",
      "if ((unsigned)(z + t) < (unsigned)depth)", IG3D, "ig3d: depth padding"),
    M("ig3d-k-depth", "implicit_gemm.cu", "  if constexpr (DEPTH) K *= kernel_d;\n", "", IG3D, "ig3d: depth taps"),
    M("tc-split-range", "implicit_gemm.cu", "const I k_begin = (I)blockIdx.z * chunks_per_split * TC_BK;",
      "const I k_begin = (I)blockIdx.z * chunks_per_split;", TC, "tc: split range"),
    M("tc-transposed-divisibility", "implicit_gemm.cu", "|| ry != 0 || rx != 0 ||",
      "|| ry != 0 ||", TC, "tc: divisibility check"),
    M("tc-epilogue-row", "implicit_gemm.cu", "const I m = m0 + warp_m + mi * 16 + gq + 8 * half;",
      "const I m = m0 + warp_m + mi * 16 + gq + half;", TC, "tc: epilogue row"),
    # what tests/test_tensor_core_kernels.py let through (issue 24) and the randomized sweep catches
    M("tc-bwd-input-column-tile", "implicit_gemm.cu", "const int c = n0 + LoadB::row(rs);", "const int c = LoadB::row(rs);",
      TC_SWEEP, "tc: column tile"),
    M("tc-offset-32-bit-unsigned", "gather.cuh",
      "template <> struct Unsigned<long long> { typedef unsigned long long type; };",
      "template <> struct Unsigned<long long> { typedef unsigned type; };", TC_SWEEP, "32-bit index"),
    M("tc-bwd-weight-unit-column-stride", "implicit_gemm.cu", "(U)x0 * (U)x_stride_w, y0, x0, true};",
      "(U)x0, y0, x0, true};", TC_SWEEP, "tc: strided x"),

    # -- simt_gemm.cu: strict float32 implicit GEMMs on the FMA units (simt_fwd, simt_bwd_weight) -----------------
    M("simt-barrier-chunk", "simt_gemm.cu", "cp_async_wait<0>();\n      __syncthreads();\n    }\n  }",
      "cp_async_wait<0>();\n    }\n  }", SIMT, "removed barrier"),
    M("simt-async-barrier", "simt_gemm.cu", "__syncthreads();         // and every thread's;",
      "/* no barrier */         // and every thread's;", SIMT, "removed barrier"),
    M("simt-async-wait-off-by-one", "simt_gemm.cu", "cp_async_wait<S - 2>();  // chunk t's group",
      "cp_async_wait<S - 1>();  // chunk t's group", SIMT, "cp.async wait count"),
    M("simt-async-no-commit", "simt_gemm.cu", "if (t + S - 1 < chunks) issue_chunk(write);\n      cp_async_commit();",
      "if (t + S - 1 < chunks) issue_chunk(write);", SIMT, "cp.async commit missing"),
    M("simt-async-prologue-no-commit", "simt_gemm.cu", "if (s < chunks) issue_chunk(s);\n      cp_async_commit();",
      "if (s < chunks) issue_chunk(s);", SIMT, "cp.async commit missing"),
    M("simt-async-a-zero-fill-size", "simt_gemm.cu", "cp_async_ca_4(dst, at.x + row_origin[rs], inside ? 4 : 0);",
      "cp_async_ca_4(dst, at.x + row_origin[rs], 4);", SIMT, "cp.async zero-fill size"),
    M("simt-wg-async-wait-missing", "simt_gemm.cu", "      if constexpr (Gather::ASYNC_A) cp_async_wait<0>();\n"
      "      __syncthreads();", "      __syncthreads();", SIMT, "cp.async wait missing"),
    M("simt-wg-async-prologue-wait-missing", "simt_gemm.cu", "    if constexpr (Gather::ASYNC_A) cp_async_wait<0>();\n"
      "    __syncthreads();\n    for", "    __syncthreads();\n    for", SIMT, "cp.async wait missing"),
    M("simt-wg-async-zero-fill-size", "simt_gemm.cu", "cp_async_ca_4(dst, x + (I)(cursor.origin + rows[rs].offset), "
      "inside ? 4 : 0);", "cp_async_ca_4(dst, x + (I)(cursor.origin + rows[rs].offset), 4);", SIMT,
      "cp.async zero-fill size"),
    M("simt-wg-async-a-stage", "simt_gemm.cu", "if constexpr (Gather::ASYNC_A) copy_a_group(stage ^ 1);",
      "if constexpr (Gather::ASYNC_A) copy_a_group(stage);", SIMT, "stage rotation"),
    M("simt-async-stage-rotation", "simt_gemm.cu", "write = write == S - 1 ? 0 : write + 1;",
      "write = read;", SIMT, "stage rotation"),
    M("simt-async-last-chunk-skipped", "simt_gemm.cu", "if (t + S - 1 < chunks) issue_chunk(write);",
      "if (t + S < chunks) issue_chunk(write);", SIMT, "off-by-one"),
    M("simt-chunks-floor", "simt_gemm.cu", "(k_end - k_begin + BK - 1) / BK : 0;",
      "(k_end - k_begin) / BK : 0;", SIMT, "off-by-one"),
    M("simt-fwd-col-bound", "simt_gemm.cu", "inside |= (unsigned)(row.x + j * dilation_w) < (unsigned)width",
      "inside |= (unsigned)(row.x + j * dilation_w) <= (unsigned)width", SIMT, "off-by-one"),
    M("simt-fwd-row-bound", "simt_gemm.cu", "inside |= (unsigned)(row.y + i * dilation_h) < (unsigned)height",
      "inside |= (unsigned)(row.y + i * dilation_h) <= (unsigned)height", SIMT, "off-by-one"),
    M("simt-fwd-mask-row-bit", "simt_gemm.cu", "(unsigned)height ? 1u << (kernel_w + i) : 0u;",
      "(unsigned)height ? 1u << (kernel_w + i - 1) : 0u;", SIMT, "window mask"),
    M("simt-fwd-tap-row-bit", "simt_gemm.cu", "tap_table[t] = {offset, 1u << j | 1u << (kernel_w + i)};",
      "tap_table[t] = {offset, 1u << j | 1u << i};", SIMT, "window mask: a bit per row and per column"),
    M("simt-fwd-tap-dilation", "simt_gemm.cu", "(U)(j * dilation_w) * (U)x_stride_w;",
      "(U)j * (U)x_stride_w;", SIMT, "dilation per axis"),
    M("simt-fwd-past-k", "simt_gemm.cu", "at.bits = at.k < K ? tap.bits : SIMT_PAST_K;", "at.bits = tap.bits;", SIMT,
      "k past K read"),
    M("simt-fwd-tap-carry", "simt_gemm.cu", "at.tap -= taps;\n      at.channel += x_stride_c;", "at.tap -= taps;",
      SIMT, "carry"),
    M("simt-fwd-tap-step", "simt_gemm.cu", "f.tap_step = F::BK % taps;", "f.tap_step = F::BK % taps + 1;", SIMT,
      "carry"),
    M("simt-fwd-channel-step", "simt_gemm.cu", "f.channel_step = (U)(F::BK / taps) * (U)x_stride_c;",
      "f.channel_step = (U)(F::BK / taps);", SIMT, "carry: taps below the chunk"),
    M("simt-fwd-tap-offset", "simt_gemm.cu", "at.x = x + (I)(at.channel + tap.offset);", "at.x = x + (I)at.channel;",
      SIMT, "window taps"),
    M("simt-epilogue-col-bound", "simt_gemm.cu", "if (n < gather.N) gather.store(row, n, acc[4 * q + r][j] + add[j]);",
      "if (n <= gather.N) gather.store(row, n, acc[4 * q + r][j] + add[j]);", SIMT, "off-by-one"),
    M("simt-epilogue-float4-col-bound", "simt_gemm.cu", "if (n < gather.N) gather.store4(row, n, v);",
      "if (n <= gather.N) gather.store4(row, n, v);", SIMT, "off-by-one"),
    M("simt-epilogue-float4-order", "simt_gemm.cu", "acc[4 * q + 1][j] + add[j], acc[4 * q + 2][j] + add[j],",
      "acc[4 * q + 2][j] + add[j], acc[4 * q + 1][j] + add[j],", SIMT, "register tile"),
    M("simt-epilogue-float4-planes", "simt_gemm.cu", "f.rows_in_fours = f.pixels % 4 == 0",
      "f.rows_in_fours = f.pixels % 2 == 0", SIMT, "float4 across images"),
    M("simt-epilogue-scalar-rows", "simt_gemm.cu", "const I row = gather.out_row(m + r);",
      "const I row = gather.out_row(m) + r;", SIMT, "rows across images"),
    M("simt-fwd-pad-side", "gather.cuh", "y = p / out_w * stride_h - pad_top,",
      "y = p / out_w * stride_h - pad_left,", SIMT, "swapped padding"),
    M("simt-fwd-stride-swap", "gather.cuh", "x = p % out_w * stride_w - pad_left;",
      "x = p % out_w * stride_h - pad_left;", SIMT, "swapped stride"),
    M("simt-bwd-weight-pad-side", "simt_gemm.cu", "cursor.x0 = ox * stride_w - pad_left;",
      "cursor.x0 = ox * stride_w - pad_top;", SIMT, "swapped padding"),
    M("simt-pixel-carry-once", "simt_gemm.cu", "while (p >= pixels) {  // at most once", "if (p >= pixels) {  // at most once",
      SIMT, "carry"),
    M("simt-split-range", "simt_gemm.cu", "const I k_begin = (I)blockIdx.z * chunks_per_split * SIMT_BK;",
      "const I k_begin = (I)blockIdx.z * chunks_per_split;", SIMT, "split reduction"),
    M("simt-epilogue-row-group", "simt_gemm.cu", "const I m = m0 + 4 * tm + q * ROW_SPAN;",
      "const I m = m0 + 4 * tm + (q >> 1) * ROW_SPAN;", SIMT, "register tile"),
    M("simt-fragment-a-row-group", "simt_gemm.cu", "(a_stage + k * PA + q * ROW_SPAN);",
      "(a_stage + k * PA + (q & 1) * ROW_SPAN);", SIMT, "register tile"),
    M("simt-fragment-b-half", "simt_gemm.cu", "(b_stage + k * PB + BN / 2);", "(b_stage + k * PB + BN / 4);", SIMT,
      "register tile"),
    M("simt-fwd-int-weight-row", "simt_gemm.cu", "return {weight_t + ((I)g * K + k) * N + n0",
      "return {weight_t + (g * K + (int)k) * N + n0", SIMT, "32-bit index"),
    M("simt-bwd-weight-unit-column-stride", "simt_gemm.cu", "(U)cursor.y0 * (U)x_stride_h + (U)cursor.x0 * (U)x_stride_w;",
      "(U)cursor.y0 * (U)x_stride_h + (U)cursor.x0;", SIMT, "strided x"),
    M("simt-bias-sum-last-chunk-only", "simt_gemm.cu", "if constexpr (Gather::SUMS_B) b_sum[ks][rs] += b_next[ks][rs];",
      "if constexpr (Gather::SUMS_B) b_sum[ks][rs] = b_next[ks][rs];", SIMT, "bias gradient"),
    M("simt-bias-sum-slot-dropped", "simt_gemm.cu", "for (int k = 0; k < BK; ++k) sum += bs[k * BN + col];",
      "for (int k = 1; k < BK; ++k) sum += bs[k * BN + col];", SIMT, "bias gradient"),
    M("simt-bias-sum-row-off-by-one", "simt_gemm.cu", "store(out_row(M), n, sum); }",
      "store(out_row(M - 1), n, sum); }", SIMT, "off-by-one"),
    M("simt-bias-sum-no-row-tile", "simt_gemm.cu", "f.sums_b = bias_row && blockIdx.x == 0;",
      "f.sums_b = bias_row && blockIdx.x == 1;", SIMT, "bias gradient: one row tile"),
    M("simt-bias-sum-partial-stride", "simt_gemm.cu", "partial[row + (I)n * row_stride] = value;",
      "partial[row + (I)n * M] = value;", SIMT, "bias gradient: partial's layout"),
    M("simt-bias-sum-split-base", "simt_gemm.cu", "groups * outputs_per_group * f.row_stride;",
      "groups * outputs_per_group * f.M;", SIMT, "bias gradient: later splits' rows"),
    M("simt-load-k-slot-warps", "simt_gemm.cu", "return (threadIdx.x >> 5) + WARPS * ks;",
      "return (threadIdx.x >> 5) + 4 * ks;", SIMT, "register tile: the 2-warp 128 x 32 and 8-warp tiles"),
    M("simt-fwd-bias-dropped", "simt_gemm.cu", "return to_acc(bias[g * N + n]); }",
      "return to_acc(bias[n]); }", SIMT, "groups"),
    M("simt-fwd-bias-column", "simt_gemm.cu", "add[j] = gather.has_bias && n < gather.N ? gather.column_bias(n) : -0.0f;",
      "add[j] = gather.has_bias && n < gather.N ? gather.column_bias(n0) : -0.0f;", SIMT, "bias per column"),
    M("simt-wg-b-row-step", "simt_gemm.cu",
      "f.b_row_step = (typename F::U)F::LoadB::PER_PASS * (typename F::U)f.out_pixels;",
      "f.b_row_step = (typename F::U)f.out_pixels;", SIMT, "weight gradient: B's row slots"),
    M("simt-wg-b-place-on-advance", "simt_gemm.cu", "cursor.at.advance((int)out_pixels);\n    b_place(cursor);",
      "cursor.at.advance((int)out_pixels);", SIMT, "weight gradient: B's cursor"),
    M("simt-wg-b-place-group", "simt_gemm.cu", "cursor.row = grad_out + (I)(((U)cursor.at.image * (U)groups + (U)g)",
      "cursor.row = grad_out + (I)(((U)cursor.at.image * (U)groups)", SIMT, "weight gradient: B's group"),
    M("simt-wg-b-place-column", "simt_gemm.cu", "(U)(n0 + LoadB::row(0)) * (U)out_pixels",
      "(U)LoadB::row(0) * (U)out_pixels", SIMT, "weight gradient: B's column tile"),
    M("simt-tall-fit-waves-unrounded", SIMT_PY,
      "waves = ceil_div(ceil_div(rows, tile[0]) * column_blocks, wave_blocks)",
      "waves = ceil_div(rows, tile[0]) * column_blocks / wave_blocks", SIMT_RULE, "tile rule: waves"),
    M("simt-tall-fit-groups-dropped", SIMT_PY, "ceil_div(rows, tile[0]) * column_blocks,",
      "ceil_div(rows, tile[0]),", SIMT_RULE, "tile rule: groups"),
    M("simt-tall-fit-cost-dropped", SIMT_PY, "return fit if cost(fit, fit_cost) < cost(tall, 1.0) else tall",
      "return fit if cost(fit, 1.0) < cost(tall, 1.0) else tall", SIMT_RULE, "tile rule: loop cost"),
    M("simt-narrow-fit-never", SIMT_PY,
      "return simt_tall_rows(rows, groups, narrow=True) if rows >= SIMT_TALL_ROWS else SIMT_NARROW",
      "return SIMT_TALL_NARROW if rows >= SIMT_TALL_ROWS else SIMT_NARROW", SIMT_RULE, "narrow tile rule"),
    M("simt-narrow-groups-dropped", SIMT_PY, "return simt_tall_rows(rows, groups, narrow=True)",
      "return simt_tall_rows(rows, 1, narrow=True)", SIMT_RULE, "narrow tile rule: groups"),
    M("simt-narrow-wave-blocks", SIMT_PY, "SIMT_NARROW, SIMT_NARROW_WAVE_BLOCKS, SIMT_NARROW_FIT_COST)",
      "SIMT_NARROW, SIMT_TALL_WAVE_BLOCKS, SIMT_NARROW_FIT_COST)", SIMT_RULE, "narrow tile rule: 4 blocks an SM"),
    M("simt-narrow-fit-cost", SIMT_PY, "SIMT_NARROW, SIMT_NARROW_WAVE_BLOCKS, SIMT_NARROW_FIT_COST)",
      "SIMT_NARROW, SIMT_NARROW_WAVE_BLOCKS, 1.0)", SIMT_RULE, "narrow tile rule: loop cost"),
    M("simt-tall-fit-never", SIMT_PY, "return SIMT_TALL_WIDE if cols > 64 else simt_tall_rows(rows, groups * ",
      "return SIMT_TALL_WIDE if cols > 64 else SIMT_TALL or simt_tall_rows(rows, groups * ", SIMT_RULE,
      "tile rule"),

    # -- implicit_gemm.cu: the channels-last weight gradient (conv_bwd_weight_igemm and its final pass) ---------
    M("wg-swizzle-half", "implicit_gemm.cu", "return CH >= 8 ? c ^ (r & 7) : c ^ ((r >> 1) & 3);",
      "return CH >= 8 ? c ^ (r & 3) : c ^ ((r >> 1) & 3);", WG + " -k counters", "wg: bank conflicts"),
    M("wg-wait-one-short", "implicit_gemm.cu", "cp_async_wait<WG_STAGES - 2>();  // chunk t has landed",
      "cp_async_wait<WG_STAGES - 1>();  // chunk t has landed", WG, "wg: pipeline"),
    M("wg-stage-wrap", "implicit_gemm.cu", "read_stage = read_stage == WG_STAGES - 1 ? 0 : read_stage + 1;",
      "read_stage = read_stage == WG_STAGES - 2 ? 0 : read_stage + 1;", WG, "wg: pipeline"),
    M("wg-carry-x-late", "implicit_gemm.cu", "if (x >= s.x_limit) {", "if (x > s.x_limit) {", WG,
      "wg: pixel advance"),
    M("wg-carry-y-offset", "implicit_gemm.cu", "if (y >= s.y_limit) { y -= s.y_limit; offset += s.carry_y; }",
      "if (y >= s.y_limit) { y -= s.y_limit; }", WG, "wg: pixel advance"),
    M("wg-column-signed-bound", "implicit_gemm.cu", "(unsigned)(px.x + dx) < (unsigned)width;",
      "px.x + dx < width;", WG, "wg: padding"),
    M("wg-split-end", "implicit_gemm.cu", "b_inside && b_row + r * B_ROWS_PER_PASS < remaining &&",
      "b_inside &&", WG, "wg: split range"),
    M("wg-finish-permutation", "implicit_gemm.cu", ": d * N + (I)c * taps + tap;",
      ": d * N + (I)tap * channels_per_group + c;", WG + " -k 'long_last_read or many_splits'", "wg: weight layout"),
    M("wg-pass-decode", "implicit_gemm.cu", "tap = rest / channels_per_group, c = rest - tap * channels_per_group;",
      "tap = rest % taps, c = rest / taps;", WG + " -k 'long_last_read or many_splits'", "wg: weight layout"),
    M("wg-bias-tf32-no-remainder", "implicit_gemm.cu", "      mma_m16n8k8_tf32(bias_acc[mi], rest, ones);\n", "",
      WG + " -k tf32_bias", "wg: bias gradient"),
    # TF32 rounded once, by the channels-last copies: grad_output's remainder staged for the fused bias sum
    M("wg-tf32-rest-not-staged", "implicit_gemm.cu", "const bool stage_rest = sizeof(S) == 4 && has_bias && n0 == 0;",
      "const bool stage_rest = false;", WG + " -k 'tf32 or bits'", "wg: bias gradient"),
    M("wg-tf32-rest-stage", "implicit_gemm.cu", "const S* r_stage = rs + read_stage * R_STAGE;",
      "const S* r_stage = rs;", WG + " -k 'tf32 or bits'", "wg: bias gradient"),
    M("wg-tf32-rest-advance", "implicit_gemm.cu", "    r_src += BK * D;\n", "", WG + " -k 'tf32 or bits'",
      "wg: bias gradient"),
    M("cl-rest-not-written", "implicit_gemm.cu", "if (with_rest) rest[(to - out) + e] = cl_rest(values[e]);", "",
      IG + " -k rest", "wg: bias gradient"),
    M("wg-bias-tf32-one", "implicit_gemm.cu", "const unsigned ones[2] = {0x3f800000u, 0x3f800000u};",
      "const unsigned ones[2] = {0x3f000000u, 0x3f800000u};", WG, "wg: bias gradient"),
    M("wg-pipeline-barrier", "implicit_gemm.cu",
      "    __syncthreads();                 // ... everyone's, and stage (t - 1) % STAGES is no longer read\n", "",
      WG + " -k long_split", "wg: pipeline"),
    # the splits finished in the kernel by the last block of each tile (wg_last_arrival, issue 24 deliverable 5)
    M("wg-fence-removed", "implicit_gemm.cu", "  __threadfence();\n  __syncthreads();\n  if (threadIdx.x == 0) {",
      "  __syncthreads();\n  if (threadIdx.x == 0) {", WG + " -k finished_in_the_kernel", "wg: last block"),
    M("wg-count-not-reset", "implicit_gemm.cu", "      arrivals[tile] = 0;\n", "", WG + " -k arrival",
      "wg: last block"),
    M("wg-last-off-by-one", "implicit_gemm.cu", "atomicAdd(arrivals + tile, 1) == (int)gridDim.z - 1;",
      "atomicAdd(arrivals + tile, 1) == (int)gridDim.z - 2;", WG + " -k finished_in_the_kernel", "wg: last block"),
    M("wg-split-order", "implicit_gemm.cu", "const float* at = from + p * slice;",
      "const float* at = from + (P - 1 - p) * slice;", WG + " -k 'finished_in_the_kernel or short_last_trip'",
      "wg: last block"),
    M("wg-finish-trip-past-the-last", "implicit_gemm.cu", "v[p][e] = e < count && p < left ? __ldcg(at)",
      "v[p][e] = e < count ? __ldcg(at)", WG + " -k short_last_trip", "wg: last block"),
    # the final pass's whole trips of WG_PASS_SPLITS splits (task wgfin): a trip past the last split, a last trip
    # read whole, the splits of a trip read from the wrong slices (P 16: splits 0-7 twice)
    *(M(name, "implicit_gemm.cu", original, mutant, WG + " -k many_splits", "wg: final pass")
      for name, original, mutant in (
        ("wg-pass-whole-past-the-last", "if (WHOLE && z + P <= splits) {", "if (WHOLE && z < splits) {"),
        ("wg-pass-last-trip-whole", "wg_trip(v, from, step, slice, splits - z, count);",
         "wg_trip(v, from, step, slice, P, count);"),
        ("wg-pass-whole-trip-step", "for (int p = 0; p < P; ++p) {\n    const float* at = from + p * slice;",
         "for (int p = 0; p < P; ++p) {\n    const float* at = from + (p & 7) * slice;"))),
    # the split's float sums as 8-byte pairs (wg_store_sums, task wgfin): pair swapped, the groups kernel's column
    M("wg-sums-pair-swapped", "implicit_gemm.cu",
      "void wg_store_sums(float* at, float lo, float hi) {\n  *reinterpret_cast<float2*>(at) = make_float2(lo, hi);",
      "void wg_store_sums(float* at, float lo, float hi) {\n  *reinterpret_cast<float2*>(at) = make_float2(hi, lo);",
      WG + " -k 'matches_cpu_path and wg_tile_edges'", "wg: partial sums"),
    M("wg-sums-groups-column", "implicit_gemm.cu", "wg_store_sums(row + ni * 8 + 2 * q,", "wg_store_sums(row + ni * 8 + q,",
      WG + " -k 'finished_in_the_kernel and groups_of_16'", "wg: partial sums"),
    M("wg-finish-trip-step", "implicit_gemm.cu", "for (int z = 0; z < splits; z += P, from += P * slice) {",
      "for (int z = 0; z < splits; z += P, from += slice) {", WG + " -k short_last_trip", "wg: last block"),
    M("wg-finish-trip-count", "implicit_gemm.cu", "for (int z = 0; z < splits; z += P, from += P * slice) {",
      "for (int z = 0; z < splits; ++z, from += P * slice) {", WG + " -k short_last_trip", "wg: last block"),
    M("wg-finish-rows-past-m", "implicit_gemm.cu", "const int count = nn < N && rows > 0 ? min((rows + ROW_STEP - 1)",
      "const int count = nn < N && rows > 0 ? min((rows + ROW_STEP)", WG + " -k finished_in_the_kernel",
      "wg: last block"),
    M("wg-last-tile-index", "implicit_gemm.cu",
      "if (!wg_last_arrival(arrivals, blockIdx.x + gridDim.x * blockIdx.y, reinterpret_cast<int*>(bs))) return;\n"
      "  constexpr int ROW_STEP = THREADS / BN",
      "if (!wg_last_arrival(arrivals, blockIdx.y, reinterpret_cast<int*>(bs))) return;\n"
      "  constexpr int ROW_STEP = THREADS / BN", WG + " -k finished_in_the_kernel", "wg: last block"),
    M("wg-finish-bias-tile", "implicit_gemm.cu", "  if (has_bias && n0 == 0 && tid < BM) {", "  if (has_bias && n0 == 64 && tid < BM) {",
      WG + " -k finished_in_the_kernel", "wg: last block"),
    M("wgg-finish-layout", "implicit_gemm.cu", "grad_weight + first + (I)cc * taps + tap, (I)ROWS_APART * N,",
      "grad_weight + first + (I)tap * CG + cc, (I)ROWS_APART * N,", WGG, "wgg: last block"),
    M("wgg-finish-taps-past-the-last", "implicit_gemm.cu", "const int count = tap < taps && rows > 0 ?",
      "const int count = rows > 0 ?", WGG, "wgg: last block"),
    M("emu-fence-ignored", EMU_RUNTIME, "void threadfence() { engine.current->fenced_at = engine.current->barriers; }",
      "void threadfence() {}", "tests/test_emulator.py -k 'last_block or unfenced'", "emulator: fences"),
    M("emu-fence-epoch", EMU_RUNTIME, "if (g->fenced_at < f->barriers - 1) {", "if (g->fenced_at < f->barriers - 2) {",
      "tests/test_emulator.py -k 'last_block or unfenced'", "emulator: fences"),

    # -- mma.cuh: compiled for a GPU only (the emulator has its own mma.sync) -------------------------------------
    M("mma-a-registers-swapped", "mma.cuh", '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])',
      '"r"(a[0]), "r"(a[2]), "r"(a[1]), "r"(a[3])', GPU_TC, "mma: fragment registers"),
    M("mma-b-registers-swapped", "mma.cuh", '"r"(b[0]), "r"(b[1])', '"r"(b[1]), "r"(b[0])', GPU_TC,
      "mma: fragment registers"),

    # -- the emulator's cp.async and ldmatrix (emu_async_copy.h): its self-tests must catch each broken rule -----
    M("emu-async-lands-at-issue", EMU_ASYNC, "std::memset(dst, 0xFF, size);  // what the destination holds",
      "std::memcpy(dst, c.data, size);  // what the destination holds", EMU_ASYNC_TESTS, "emulator: async copy"),
    M("emu-async-wait-one-group-early", EMU_ASYNC, "const long long landed_below = t.open_group - N;",
      "const long long landed_below = t.open_group - N + 1;", EMU_ASYNC_TESTS, "emulator: async copy"),
    M("emu-async-zero-fill-ignored", EMU_ASYNC, "} else if (src_bytes > 0) {\n    std::memcpy(c.data, gmem, src_bytes);",
      "} else {\n    std::memcpy(c.data, gmem, size);", EMU_ASYNC_TESTS, "emulator: async copy"),
    M("emu-async-overlap-unchecked", EMU_ASYNC,
      "if (const AsyncCopy* c = async_copy_in_flight(dst, size, &owner, &at))",
      "if (const AsyncCopy* c = (owner = 0, at = nullptr, nullptr))", EMU_ASYNC_TESTS, "emulator: async copy"),
    M("emu-async-alignment-4", EMU_ASYNC, "if ((uintptr_t)smem % size || (uintptr_t)gmem % size)",
      "if ((uintptr_t)smem % 4 || (uintptr_t)gmem % 4)", EMU_ASYNC_TESTS, "emulator: async copy"),
    M("emu-async-src-size-bound-16", EMU_ASYNC, "if (src_bytes < 0 || src_bytes > size)",
      "if (src_bytes < 0 || src_bytes > 16)", EMU_ASYNC_TESTS, "emulator: async copy"),
    M("emu-async-lands-first-word", EMU_ASYNC, "        std::memcpy(c.dst, c.data, 8);\n      } else {",
      "        std::memcpy(c.dst, c.data, 4);\n      } else {", EMU_ASYNC_TESTS, "emulator: async copy"),
    M("emu-async-map-first-word", EMU_ASYNC, "for (int w = 0; w < c.size; w += kAsyncWord) *in_flight_entry",
      "for (int w = 0; w < kAsyncWord; w += kAsyncWord) *in_flight_entry", EMU_ASYNC_TESTS, "emulator: async copy"),
    M("emu-ldmatrix-alignment-4", EMU_ASYNC, "if ((uintptr_t)row % 16)", "if ((uintptr_t)row % 4)", EMU_ASYNC_TESTS,
      "emulator: ldmatrix"),
    M("emu-ldmatrix-trans-rows-swapped", EMU_ASYNC, "std::memcpy(&lo, p0 + 2 * g, 2);\n      std::memcpy(&hi, p1",
      "std::memcpy(&lo, p1 + 2 * g, 2);\n      std::memcpy(&hi, p0", EMU_ASYNC_TESTS, "emulator: ldmatrix"),
    M("emu-ldmatrix-partial-warp", EMU_ASYNC, "if (rank - lane + 32 > threads)", "if (rank - lane + 16 > threads)",
      EMU_ASYNC_TESTS, "emulator: ldmatrix"),
    M("emu-ldmatrix-in-flight-unchecked", EMU_ASYNC,
      "if (const AsyncCopy* c = async_copy_in_flight(row, 16, &owner, &at))",
      "if (const AsyncCopy* c = true ? nullptr : async_copy_in_flight(row, 16, &owner, &at))",
      EMU_ASYNC_TESTS, "emulator: ldmatrix"),

    # -- depthwise.cu -----------------------------------------------------------------------------------------
    M("dw-tiled-barrier-staged", "depthwise.cu", "__syncthreads();\n\n    const I n = image0 + p;\n    const int ox",
      "\n    const I n = image0 + p;\n    const int ox", DEPTHWISE, "removed barrier"),
    M("dw-reduce-barrier", "depthwise.cu", "slice_sums[threadIdx.x] = sum;\n    __syncthreads();",
      "slice_sums[threadIdx.x] = sum;", DEPTHWISE, "removed barrier"),
    M("dw-block-reduce-barrier", "depthwise.cu", "__syncthreads();\n  for (int i = threadIdx.x; i < R;",
      "for (int i = threadIdx.x; i < R;", DEPTHWISE, "removed barrier"),
    M("dw-tap-range-last", "depthwise.cu", "min(k, after / dilation + 1);", "min(k, after / dilation);", DEPTHWISE,
      "off-by-one"),
    M("dw-tap-range-first", "depthwise.cu", "(before + dilation - 1) / dilation;", "before / dilation;", DEPTHWISE,
      "off-by-one"),
    M("dw-planes-kernel-wrap", "depthwise.cu", "if (g >= weights) g %= weights;", "if (g >= weights) g -= weights;",
      DEPTHWISE, "wrong index"),
    M("dw-planes-flip", "depthwise.cu", "acc += wt[TRANSPOSED ? taps - 1 - tap : tap]", "acc += wt[tap]", DEPTHWISE,
      "wrong index"),
    M("dw-planes-barrier", "depthwise.cu",
      "ys[j * dst_pitch + oy * dst_w + ox] = acc;\n          }\n        }\n      }\n    }\n    __syncthreads();",
      "ys[j * dst_pitch + oy * dst_w + ox] = acc;\n          }\n        }\n      }\n    }", DEPTHWISE,
      "removed barrier"),
    M("dw-tiled-store-bound", "depthwise.cu", "if (oy < dst_h) out[(I)oy * dst_w]", "if (oy <= dst_h) out[(I)oy * dst_w]",
      DEPTHWISE, "off-by-one"),
    M("dw-strided-last-row", "depthwise.cu", "if (y >= height) break;", "if (y > height) break;", DEPTHWISE,
      "off-by-one"),
    M("dw-direct-last-row", "depthwise.cu", "if (yy < 0 || yy >= height) continue;",
      "if (yy < 0 || yy > height) continue;", DEPTHWISE, "off-by-one"),
    M("dw-weight-direct-last-row", "depthwise.cu", "if (!is_bias && (yy < 0 || yy >= height)) continue;",
      "if (!is_bias && (yy < 0 || yy > height)) continue;", DEPTHWISE, "off-by-one"),
    M("dw-tiled-stride-swap", "depthwise.cu", "oy0 * stride_h - pad_top, ox0 * stride_w - pad_left, src_h,",
      "oy0 * stride_h - pad_top, ox0 * stride_h - pad_left, src_h,", DEPTHWISE, "swapped stride"),
    M("dw-strided-stride-swap", "depthwise.cu", "const int col_hi = floor_div(x_l + pad_left, stride_w) - first_x;",
      "const int col_hi = floor_div(x_l + pad_left, stride_h) - first_x;", DEPTHWISE, "swapped stride"),
    M("dw-direct-stride-swap", "depthwise.cu", "const int xx = ox * stride_w - pad_left + j * dilation_w;",
      "const int xx = ox * stride_h - pad_left + j * dilation_w;", DEPTHWISE, "swapped stride"),
    M("dw-weight-large-stride-swap", "depthwise.cu", "(p * in_h + oy_l * stride_h + i * dilation_h) * in_w;",
      "(p * in_h + oy_l * stride_w + i * dilation_h) * in_w;", DEPTHWISE, "swapped stride"),
    # depthwise_bwd_weight_large: the output rows each tap row reaches, tap rows from the middle out (issue 25)
    M("dw-weight-large-last-row", "depthwise.cu", "floor_div(height - 1 - reach, stride_h) + 1 - oy0);",
      "floor_div(height - 1 - reach, stride_h) - oy0);", DW_LARGE, "off-by-one"),
    M("dw-weight-large-first-row", "depthwise.cu", "max(0, ceil_div(-reach, stride_h) - oy0);",
      "max(0, ceil_div(-reach, stride_h) - oy0 + 1);", DW_LARGE, "off-by-one"),
    M("dw-weight-large-middle-out", "depthwise.cu", "(k & 1 ? -((k + 1) >> 1) : (k + 1) >> 1);",
      "(k & 1 ? -(k >> 1) : (k + 1) >> 1);", DW_LARGE, "wrong tap"),
    M("dw-weight-large-row-image", "depthwise.cu", "const int p = row / span, oy_l", "const int p = row / tile_h, oy_l",
      DW_LARGE, "wrong index"),
    M("dw-weight-large-bias-rows", "depthwise.cu", "for (int row = slice; row < per_block * tile_h; row += slices)\n",
      "for (int row = slice; row < count * span; row += slices)\n", DW_LARGE, "wrong index"),
    # depthwise_bwd_weight_generic's tiny-plane units: the box of outputs of each tap, channels over the lanes (issue 25)
    M("dw-weight-planes-box-last", "depthwise.cu", "floor_div(height - 1 - dy, stride_h) + 1));",
      "floor_div(height - 1 - dy, stride_h)));", DW_PLANES, "off-by-one"),
    M("dw-weight-planes-box-first", "depthwise.cu", "max(0, ceil_div(-dx, stride_w)));",
      "max(0, ceil_div(-dx, stride_w) + 1));", DW_PLANES, "off-by-one"),
    M("dw-weight-planes-x-plane", "depthwise.cu", "(s * Q + (co0 + q) / multiplier - c0) * x_pitch;",
      "(s * Q + q) * x_pitch;", DW_PLANES, "wrong index"),
    M("dw-weight-planes-stride-swap", "depthwise.cu", "sum += g_row[ox] * x_row[ox * stride_w];",
      "sum += g_row[ox] * x_row[ox * stride_h];", DW_PLANES, "swapped stride"),
    M("dw-weight-planes-barrier", "depthwise.cu", "__syncthreads();\n        if (q < count && n0 + s < images) {",
      "if (q < count && n0 + s < images) {", DW_PLANES, "removed barrier"),
    M("dw-weight-planes-unit-barrier", "depthwise.cu",
      "__syncthreads();  // the next unit overwrites the planes; after the last", "// after the last", DW_PLANES,
      "removed barrier"),
    M("dw-weight-planes-slots", "depthwise.cu", "for (int slot = 0; slot < S; ++slot) total += sums",
      "for (int slot = 1; slot < S; ++slot) total += sums", DW_PLANES, "off-by-one"),
    M("dw-fwd-pad-side", "depthwise.cu", "oy0 * stride_h - pad_top, ox0 * stride_w - pad_left, src_h,",
      "oy0 * stride_h - pad_left, ox0 * stride_w - pad_left, src_h,", DEPTHWISE, "wrong-side padding"),
    M("dw-bwd-input-spec-pad-side", "depthwise.cu", "const int top = K - 1 - pad_top, left = K - 1 - pad_left;",
      "const int top = K - 1 - pad_left, left = K - 1 - pad_left;", DEPTHWISE, "wrong-side padding"),
    M("dw-bwd-input-generic-pad-side", "depthwise.cu", "(kernel_h - 1) * dilation_h - pad_top, (kernel_w",
      "(kernel_h - 1) * dilation_h - pad_left, (kernel_w", DEPTHWISE, "wrong-side padding"),
    # the planes kernels' <T, I, K> instantiations (TINY_KERNELS: zero-padded staging, kernels in registers)
    M("dw-tinyk-pad-side", "depthwise.cu", "(e / src_w + pad_top) * pad_w + e % src_w + pad_left;",
      "(e / src_w + pad_top) * pad_w + e % src_w + pad_top;", DW_TINYK, "wrong-side padding"),
    M("dw-tinyk-window-row", "depthwise.cu", "acc += w[i * K + jj] * window[i * pad_w + jj];",
      "acc += w[i * K + jj] * window[i * dst_w + jj];", DW_TINYK, "wrong index"),
    M("dw-tinyk-flip", "depthwise.cu", "w[tap] = k[TRANSPOSED ? K * K - 1 - tap : tap];", "w[tap] = k[tap];",
      DW_TINYK, "wrong index"),
    M("dw-tinyk-same-kernel", "depthwise.cu", "step % dst_channels == 0 || step >= planes;",
      "step % dst_channels == 0 || step > 0;", DW_TINYK, "wrong condition"),
    M("dw-tinyk-zero-padding", "depthwise.cu", "e < per_block * src_pitch; e += per_block) xs[e] = A(0);",
      "e < per_block * src_pitch; e += per_block) xs[e] = xs[e];", DW_TINYK, "missing initialisation"),
    M("dw-tinyk-batch-step", "depthwise.cu", "e0 += PLANE_BATCH * step) {", "e0 += step) {", DW_TINYK,
      "wrong stride"),
    M("dw-tinyk-batch-bound", "depthwise.cu", "if (e0 + b * step < n) dst[at.q * pitch",
      "if (e0 + b * step <= n) dst[at.q * pitch", DW_TINYK, "off-by-one"),
    M("dw-tinyk-weight-window", "depthwise.cu", "acc[i * K + jj] += g * window[i * pad_w + jj];",
      "acc[i * K + jj] += g * window[i * out_w + jj];", DW_TINYK, "wrong index"),
    M("dw-tinyk-weight-zero", "depthwise.cu", "e < S * Q * x_pitch; e += blockDim.x) xs[e] = A(0);",
      "e < S * Q * x_pitch; e += blockDim.x) xs[e] = xs[e];", DW_TINYK, "missing initialisation"),
    M("dw-tinyk-weight-bias", "depthwise.cu", "                  acc[K * K] += g;",
      "                  acc[K * K] += g * g;", DW_TINYK, "bias gradient"),
    M("dw-tinyk-unit-kernel", "depthwise.cu", "load_kernel<T, I, K, TRANSPOSED>(w, weight, (p0 + threadIdx.x)",
      "load_kernel<T, I, K, TRANSPOSED>(w, weight, (blockIdx.x + threadIdx.x)", DW_TINYK, "wrong index"),
    # ... their src planes of at most K x K in registers (task dwtiny2): whole aligned planes in 16-byte loads, the
    # others staged flat; only the taps inside the plane
    M("dw-regs-index", "depthwise.cu", "tap(i * K + j, (u + i) * K + v + j);", "tap(i * K + j, (v + i) * K + u + j);",
      DW_REGS, "wrong index"),
    M("dw-regs-first-tap", "depthwise.cu", "for (int j = v < 0 ? -v : 0; j < (v > 0 ? K - v : K); ++j) tap(",
      "for (int j = 0; j < (v > 0 ? K - v : K); ++j) tap(", DW_REGS, "off-by-one"),
    M("dw-regs-row-side", "depthwise.cu", "if (oy < 0 || oy >= out_h) continue;",
      "if (oy < 0 || oy >= out_w) continue;", DW_REGS, "wrong-side padding"),
    M("dw-regs-whole-size", "depthwise.cu", "whole = h == K && w == K &&", "whole = h <= K && w == K &&", DW_REGS,
      "wrong condition"),
    M("dw-regs-whole-aligned", "depthwise.cu", "reinterpret_cast<size_t>(src) % 16 == 0;", "true;", DW_REGS,
      "misaligned access"),
    M("dw-regs-kernel-aligned", "depthwise.cu", "reinterpret_cast<size_t>(weight) % 16 == 0);", "true);", DW_REGS,
      "misaligned access"),
    M("dw-regs-flat-tail", "depthwise.cu", "e < n; e += blockDim.x) dst[e] = run[e];",
      "e < n - 1; e += blockDim.x) dst[e] = run[e];", DW_REGS, "off-by-one"),
    M("dw-regs-barrier", "depthwise.cu", "    if (!whole) __syncthreads();\n", "\n", DW_REGS, "removed barrier"),
    M("dw-regs-weight-g-slot", "depthwise.cu", "reinterpret_cast<T*>(gs) + slot * Q * g_size",
      "reinterpret_cast<T*>(gs) + slot * g_size", DW_REGS, "wrong index"),
    M("dw-regs-weight-x-plane", "depthwise.cu", "c0 + xq - s * Q) * (I)x_size", "c0 + xq) * (I)x_size", DW_REGS,
      "wrong index"),
    M("dw-regs-weight-bias", "depthwise.cu", "    acc[K * K] += g;\n  });", "    acc[K * K] += g * g;\n  });",
      DW_REGS, "bias gradient"),
    M("dw-tinyk-grid-whole", DW_PY, "whole = dst_channels // math.gcd(dst_channels, threads)",
      "whole = max(1, dst_channels // threads)", DW_TINYK, "wrong arithmetic"),
    M("dw-tinyk-pad-range", DW_PY, "all(0 <= p < kh for pair", "all(0 <= p <= kh for pair", DW_TINYK,
      "off-by-one"),
    M("dw-bwd-input-planes-pad-side", "depthwise.cu", "(kernel_h - 1) * dilation_h - pad_top, left",
      "(kernel_h - 1) * dilation_h - pad_left, left", DEPTHWISE, "wrong-side padding"),
    M("dw-strided-pad-side", "depthwise.cu", "const int first_x = ceil_div(pad_left - ",
      "const int first_x = ceil_div(pad_top - ", DEPTHWISE, "wrong-side padding"),
    M("dw-direct-pad-side", "depthwise.cu", "const int yy = oy * stride_h - pad_top + i * dilation_h;",
      "const int yy = oy * stride_h - pad_left + i * dilation_h;", DEPTHWISE, "wrong-side padding"),
    M("dw-gather-pad-side", "depthwise.cu", "const int tx = (int)(index % width) + pad_left;",
      "const int tx = (int)(index % width) + pad_top;", DEPTHWISE, "wrong-side padding"),
    M("dw-weight-direct-pad-side", "depthwise.cu", "dx = tap % kernel_w * dilation_w - pad_left;",
      "dx = tap % kernel_w * dilation_w - pad_top;", DEPTHWISE, "wrong-side padding"),
    M("dw-strided-half-acc", "depthwise.cu", "A acc = A(0);", "T acc = A(0);", DEPTHWISE, "half accumulation"),
    # depthwise_bwd_input_strided / _phased: persistent digits and the phase-fixed taps
    M("dw-strided-channel-digit", "depthwise.cu", "next_digit(c, c_step, channels, carry);",
      "next_digit(c, c_step, tiles_y, carry);", DW_STRIDED, "persistent loop"),
    M("dw-strided-row-digit", "depthwise.cu", "next_digit(ty, ty_step, tiles_y, carry);",
      "next_digit(ty, tx_step, tiles_y, carry);", DW_STRIDED, "persistent loop"),
    M("dw-strided-pixel-rows", "depthwise.cu", "const int q_rows = pitch_y / stride_h;",
      "const int q_rows = pitch_y;", DW_STRIDED, "swapped stride"),
    # depthwise_bwd_input_phased's blocks of B x B pixels (phased_block, its phases and its row stores)
    M("dw-phased-tap-phase", "depthwise.cu", "for (int kx = (c + OX) % S; kx < K; kx += S)",
      "for (int kx = (c + OY) % S; kx < K; kx += S)", DW_STRIDED, "swapped sides"),
    M("dw-phased-window-column", "depthwise.cu", "[(c + OX - kx) / S - LO_X]", "[(c + OX - kx) / S]", DW_STRIDED,
      "wrong tap"),
    M("dw-phased-phase-cases", "depthwise.cu", "case 1: PHASED_CASE(1);", "case 1: PHASED_CASE(2);", DW_STRIDED,
      "swapped sides"),
    M("dw-phased-phase-side", "depthwise.cu", "switch (pad_top % S * 2 + pad_left % S)",
      "switch (pad_top % S * 2 + pad_top % S)", DW_STRIDED, "wrong-side padding"),
    M("dw-phased-term-kernel", "depthwise.cu", "wshared[k * (K * K) + i]", "wshared[i]", DW_STRIDED,
      "persistent loop"),
    M("dw-phased-window-row", "depthwise.cu", "* in_h + y_l / S) * in_w + x_l / S;", "* in_h + y_l) * in_w + x_l / S;",
      DW_STRIDED, "swapped stride"),
    M("dw-phased-last-row", "depthwise.cu", "if (y0 + r >= height) break;", "if (y0 + r > height) break;",
      DW_STRIDED, "off-by-one"),
    M("dw-phased-last-column", "depthwise.cu", "if (x + col < width) row[col]", "if (x + col <= width) row[col]",
      DW_STRIDED, "off-by-one"),
    M("dw-phased-plan-columns", "cupyconv/ops/depthwise.py", "strip=side, columns=side,", "strip=side, columns=1,",
      DEPTHWISE + " -k phased_items", "planner mirror"),
    M("dw-phased-row-store", "depthwise.cu", "const bool out_aligned = width % B == 0 && ",
      "const bool out_aligned = ", DW_STRIDED, "vector width"),
    M("dw-direct-half-sum", "depthwise.cu", "acc_t<T> sum = has_bias ? to_acc(bias[co]) : acc_t<T>(0);",
      "T sum = has_bias ? to_acc(bias[co]) : acc_t<T>(0);", DEPTHWISE, "half accumulation"),
    M("dw-reduce-half-sum", "depthwise.cu", "A sum = A(0);\n    if (e < elements)",
      "T sum = A(0);\n    if (e < elements)", DEPTHWISE, "half accumulation"),
    M("dw-direct-int-pixel", "depthwise.cu", "to_acc(w[i * kernel_w + j]) * to_acc(src[(I)yy * width + xx])",
      "to_acc(w[i * kernel_w + j]) * to_acc(src[yy * width + xx])",
      DEPTHWISE, "32-bit index"),
    M("dw-tiled-int-row", "depthwise.cu", "out[(I)oy * dst_w] =", "out[oy * dst_w] =", DEPTHWISE, "32-bit index"),
    M("dw-pack-unaligned-slots", "depthwise.cu", "const int shift = N == 1 ? 0 : ((x0 % N) + N) % N;",
      "const int shift = 0;", DEPTHWISE, "misaligned pack"),
    M("dw-pack-pointer-unchecked", "depthwise.cu",
      "if (width % PACK == 0 && (reinterpret_cast<unsigned long long>(src) & 15) == 0)", "if (width % PACK == 0)",
      DEPTHWISE, "misaligned pack"),
    M("dw-direct-grid-start", "depthwise.cu", "for (I index = grid_start<I>(); index < total; index += "
      "grid_stride<I>()) {\n    const int ox = (int)(index % out_w);", "for (I index = threadIdx.x; index < total; "
      "index += grid_stride<I>()) {\n    const int ox = (int)(index % out_w);", DEPTHWISE, "grid-stride"),
    # depthwise_persistent (the forward and the stride-1 input gradient) and AlignedStaging (issue 25)
    M("dw-fwd-barrier-staged", "depthwise.cu",
      "load_kernel<K, TRANSPOSED>(weight + (I)kernel0 * (K * K), w);\n    }\n    if (!direct) __syncthreads();",
      "load_kernel<K, TRANSPOSED>(weight + (I)kernel0 * (K * K), w);\n    }", DW_FWD, "removed barrier"),
    M("dw-fwd-barrier-next-unit", "depthwise.cu", "__syncthreads();  // the next unit overwrites the tile\n\n",
      "// the next unit overwrites the tile\n\n", DW_FWD, "removed barrier"),
    M("dw-fwd-last-row", "depthwise.cu", "if (oy + v >= dst_h) break;", "if (oy + v > dst_h) break;", DW_FWD,
      "off-by-one"),
    M("dw-fwd-last-column", "depthwise.cu", "if (ox + u < dst_w) out[u]", "if (ox + u <= dst_w) out[u]", DW_FWD,
      "off-by-one"),
    M("dw-fwd-staged-chunks", "depthwise.cu", "chunks = SPLIT ? (in_w + C - 1) / C : pitch / C;",
      "chunks = SPLIT ? (in_w + C - 1) / C : in_w / C;", DW_FWD, "tile bound"),
    M("dw-fwd-rows-unchecked", "depthwise.cu", "rows_aligned = width % C == 0 && ", "rows_aligned = ", DW_FWD,
      "misaligned pack"),
    M("dw-fwd-slot-past-row", "depthwise.cu", "slot + C >= 0 && slot + C < width)", "slot + C >= 0 && slot + C <= width)",
      DW_FWD, "tile bound"),
    M("dw-fwd-slot-before-row", "depthwise.cu", "row != nullptr && slot >= 0 && slot < width)",
      "row != nullptr && slot >= -C && slot < width)", DW_FWD, "tile bound"),
    M("dw-fwd-slots-unaligned", "depthwise.cu", "const int shift = x0 & (C - 1);", "const int shift = 0;", DW_FWD,
      "misaligned pack"),
    M("dw-fwd-chunk-shift", "depthwise.cu", "t[e] = e + m < C ? a.v[e + m] : b.v[e + m - C];",
      "t[e] = e + m < C ? a.v[e + m] : b.v[e];", DW_FWD, "tile bound"),
    M("dw-fwd-unaligned-row-short", "depthwise.cu", "for (int i = chunk0; i < in_w; i += lanes) {",
      "for (int i = chunk0; i < in_w - 1; i += lanes) {", DW_FWD, "tile bound"),
    M("dw-fwd-stores-unchecked", "depthwise.cu", "const bool out_aligned = dst_w % U == 0 && ",
      "const bool out_aligned = ", DW_FWD, "misaligned pack"),
    M("dw-fwd-unit-channel", "depthwise.cu", "? c * per_block : c * kernels + k;", "? c * per_block : c * kernels;",
      DW_FWD, "persistent loop"),
    M("dw-fwd-channel-digit", "depthwise.cu", "(dst_channels + per_block - 1) / per_block : channels;",
      "(dst_channels + per_block - 1) / per_block : kernels;", DW_FWD, "persistent loop"),
    M("dw-fwd-staged-plane", "depthwise.cu", "const I base = image0 * src_channels + first;",
      "const I base = image0 * src_channels;", DW_FWD, "persistent loop"),
    M("dw-bwd-input-unflipped", "depthwise.cu", "wk[FLIPPED ? K * K - 1 - (i * K + j) : i * K + j]",
      "wk[i * K + j]", DW_FWD, "flipped kernel"),
    M("dw-bwd-input-first-kernel", "depthwise.cu", "const int kernel0 = TRANSPOSED ? d * terms : d;",
      "const int kernel0 = TRANSPOSED ? d : d;", DW_FWD, "persistent loop"),
    # depthwise_persistent's packed channels on small planes (pack_channels) and store_run (issue 25)
    M("dw-packed-staged-term", "depthwise.cu", "const int first = (pack_channels ? d0 : c) * terms;",
      "const int first = pack_channels ? d0 : c * terms;", DW_PACKED, "persistent loop"),
    M("dw-packed-staged-stride", "depthwise.cu", "const int stride = pack_channels ? terms : src_channels;",
      "const int stride = pack_channels ? 1 : src_channels;", DW_PACKED, "persistent loop"),
    M("dw-packed-group-radix", "depthwise.cu", "? (dst_channels + per_block - 1) / per_block :",
      "? dst_channels / per_block :", DW_PACKED, "persistent loop"),
    M("dw-packed-partial-run", "depthwise.cu", "tile, valid * (int)dst_plane);",
      "tile, per_block * (int)dst_plane);", DW_PACKED, "tile bound"),
    M("dw-packed-barrier-staged-out", "depthwise.cu", "    __syncthreads();\n      store_run<T, I>(",
      "    store_run<T, I>(", DW_PACKED, "removed barrier"),
    M("dw-packed-barrier-before-out", "depthwise.cu", "__syncthreads();\n      A* staged_out",
      "A* staged_out", DW_PACKED, "removed barrier"),
    M("dw-packed-run-unchecked", "depthwise.cu", "if ((reinterpret_cast<unsigned long long>(dst) & 15) == 0) {\n"
      "    vector_end", "if (true) {\n    vector_end", DW_PACKED, "misaligned pack"),
    M("dw-packed-run-tail", "depthwise.cu", "e < count; e += (int)blockDim.x) dst[e]",
      "e < count - 1; e += (int)blockDim.x) dst[e]", DW_PACKED, "off-by-one"),
    M("dw-packed-item-channel", "depthwise.cu", "const int d = pack_channels ? min(d0 + p, dst_channels - 1) : d0;",
      "const int d = pack_channels ? d0 : d0;", DW_PACKED, "persistent loop"),
    M("dw-bwd-input-term-plane", "depthwise.cu", "block_fma<A, K, S, V, U>(tile + staging.offset(p * terms + t,",
      "block_fma<A, K, S, V, U>(tile + staging.offset(p + t,",
      DW_FWD, "persistent loop"),
    # small planes: the PACK kernels' staged weights, the spread planes and thread layout of AlignedStaging<SPREAD>
    # and ItemLayout<true> (issue 25, shared-memory wavefronts)
    M("dw-packed-kernels-item", "depthwise.cu", "kernels_staged + (p * terms + t) * (K * K)",
      "kernels_staged + (p + t) * (K * K)", DW_PACKED, "persistent loop"),
    M("dw-packed-kernels-run", "depthwise.cu", "const T* run = weight + (I)d0 * terms * (K * K);",
      "const T* run = weight + (I)d0 * (K * K);", DW_PACKED, "persistent loop"),
    M("dw-packed-kernels-count", "depthwise.cu", "const int count = valid * terms * (K * K);",
      "const int count = valid * (K * K);", DW_PACKED, "tile bound"),
    # the 3x3 packed kernels' flat staging (RunWalk) and paired output stores (issue 25, small planes)
    M("dw-flat-row-skip", "depthwise.cu", "if (x >= w) x -= w, ++y, cell += pitch - w;", "if (x >= w) x -= w, ++y;",
      DW_PACKED, "wrong index"),
    M("dw-flat-plane-skip", "depthwise.cu", "if (y >= h) y -= h, ++q, cell += plane - h * pitch;",
      "if (y >= h) y -= h, ++q;",
      DW_PACKED, "wrong plane stride"),
    M("dw-flat-zero-barrier", "depthwise.cu", "staging.plane);  // in_h * pitch is a multiple of 16 bytes\n"
      "      __syncthreads();", "staging.plane);", DW_PACKED,
      "removed barrier"),
    M("dw-flat-tile-bounds", "depthwise.cu",
      "inside = e < count && row >= 0 && row < in_h && col >= 0 && col + E - 1 < in_w;",
      "inside = e < count && row < in_h && col + E - 1 < in_w;", DW_PACKED, "tile bound"),
    M("dw-flat-pair-order", "depthwise.cu", "pair.v[0] = acc[v][u], pair.v[1] = acc[v][u + 1];",
      "pair.v[0] = acc[v][u + 1], pair.v[1] = acc[v][u];", DW_PACKED, "wrong vector element"),
    M("dw-flat-pairs-odd-width", "depthwise.cu", "const bool pairs = flat && !SPREAD && dst_w % 2 == 0;",
      "const bool pairs = flat && !SPREAD;", DW_PACKED, "misaligned pack"),
    # the packed kernels' batched flat staging, every PACK instantiation (issue 25, latency: loads before stores)
    M("dw-flat-batch-skipped", "depthwise.cu", "if (cell[b] >= 0) tile[cell[b]] = to_acc(v[b]);",
      "tile[max(cell[b], 0)] = to_acc(v[b]);", DW_PACKED, "tile bound"),
    M("dw-flat-batch-walk", "depthwise.cu", "++b, e += (int)blockDim.x, at.next(w, h, pitch, plane)) {",
      "++b, e += (int)blockDim.x) {", DW_PACKED, "wrong index"),
    M("dw-flat-batch-inside", "depthwise.cu", "cell[b] = inside ? at.cell + (E - 1) * at.x : -1;",
      "cell[b] = at.cell + (E - 1) * at.x;", DW_PACKED, "tile bound"),
    # depthwise_bwd_weight's FLAT staging of whole small planes, 32- and 64-bit data (task dwwg3, issue 25: waits)
    M("dw-large-plane-pitch", "depthwise.cu", "return size + ((C - size) % BANK_ROW + BANK_ROW) % BANK_ROW;",
      "return size;", DW_WIDE, "bank conflict"),
    M("dw-large-rows-above", "depthwise.cu", "i_lo = max(0, pad_top - oy0 - Q + 1)", "i_lo = max(0, pad_top - oy0)",
      DW_WIDE, "tap range"),
    M("dw-large-columns-right", "depthwise.cu", "x_hi = min(src_w, ox0 + R - 1 - pad_left + kernel_w)",
      "x_hi = min(src_w, ox0 - pad_left + kernel_w)", DW_WIDE, "tap range"),
    M("dw-large-row-outside", "depthwise.cu", "if ((unsigned)(y0 + v) < (unsigned)rows)", "if (y0 + v < rows)",
      DW_WIDE, "tile bound"),
    M("dw-large-row-zeros", "depthwise.cu", "to[x] = row != nullptr && x < src_w ?", "to[x] = row != nullptr ?",
      DW_WIDE, "tile bound"),
    M("dw-large-flip", "depthwise.cu", "(kernel_h - 1 - i) * kernel_w + kernel_w - 1 - j",
      "(kernel_h - 1 - i) * kernel_w + j", DW_WIDE, "wrong index"),
    M("dw-large-weights-64bit", "depthwise.cu", "const T* wk = weight + ((I)kernel0 + k) * taps;",
      "const T* wk = weight + (kernel0 + k) * taps;", DW_WIDE, "int overflow"),
    M("dw-large-unit-images", "depthwise.cu", "const I image = image0 + q / terms;", "const I image = image0 + q;",
      DW_WIDE, "wrong index"),
    M("dw-lanes-butterfly", "depthwise.cu", "for (int offset = per_block / 2; offset > 0; offset /= 2) {",
      "for (int offset = per_block / 4; offset > 0; offset /= 2) {", DW_WIDE, "missing sum"),
    M("dw-lanes-rows-above", "depthwise.cu", "oy_lo = max(0, pad_top - i0 - Q + 1)", "oy_lo = max(0, pad_top - i0)",
      DW_WIDE, "tap range"),
    M("dw-lanes-g-zeros", "depthwise.cu", "row != nullptr && ox >= 0 && ox < out_w ?", "row != nullptr && ox >= 0 ?",
      DW_WIDE, "tile bound"),
    M("dw-lanes-units", "depthwise.cu", "const I image0 = unit * per_block;", "const I image0 = unit;", DW_WIDE,
      "wrong index"),
    M("dw-lanes-bias-item", "depthwise.cu", "if (has_bias && item == 0) {  // lane p sums",
      "if (has_bias && item == 1) {  // lane p sums", DW_WIDE, "wrong index"),
    M("dw-lanes-partial-64bit", "depthwise.cu", "row[(I)co * taps + (i0 + v) * kernel_w + j0 + u] = acc[v][u];",
      "row[co * taps + (i0 + v) * kernel_w + j0 + u] = acc[v][u];", DW_WIDE, "int overflow"),
    M("dw-lanes-barrier", "depthwise.cu", "__syncthreads();  // the next unit overwrites the planes\n    }\n    // The",
      "}\n    // The", DW_WIDE, "removed barrier"),
    # depthwise_bwd_reduce's few-row path and its grid, the lanes kernel's block bound (task dwwgt)
    M("dw-reduce-few-last-row", "depthwise.cu", "v[r] = r < rows ? partial[r * elements + e] : A(0);",
      "v[r] = r + 1 < rows ? partial[r * elements + e] : A(0);", DW_REDUCE, "missing sum"),
    M("dw-reduce-few-order", "depthwise.cu", "for (int r = 0; r < SLICES - 1; ++r) total += v[r];",
      "for (int r = SLICES - 2; r >= 0; --r) total += v[r];", DW_REDUCE, "summation order"),
    M("dw-reduce-few-threshold", "depthwise.cu", "if (rows < SLICES) {", "if (rows <= SLICES) {", DW_REDUCE,
      "off-by-one"),
    M("dw-reduce-grid", DW_PY, "per_block = REDUCE_THREADS if rows < REDUCE_THREADS // 32 else 32",
      "per_block = 32", DW_REDUCE, "grid"),
    M("dw-lanes-threads", DW_PY, "while per > 1 and (per * items > LANES_THREADS",
      "while per > 1 and (per * items > 2 * LANES_THREADS", DW_WIDE, "launch bound"),
    M("dw-wflat-plane-carry", "depthwise.cu", "if (y >= h) y -= h, ++q, cell", "if (y >= h) y -= h, cell", DW_WFLAT,
      "wrong plane stride"),
    M("dw-wflat-plane-step", "depthwise.cu", "plane_step = channels * plane_size;", "plane_step = plane_size;",
      DW_WFLAT, "wrong plane stride"),
    M("dw-wflat-channel", "depthwise.cu", "x + (image0 * channels + c) * plane_size;",
      "x + (image0 * channels) * plane_size;", DW_WFLAT, "wrong index"),
    M("dw-wflat-row", "depthwise.cu", "first_plane[at.q * plane_step + at.y * width + at.x]",
      "first_plane[at.q * plane_step + at.y * pitch + at.x]", DW_WFLAT, "wrong index"),
    M("dw-wflat-zero-barrier", "depthwise.cu", "zero_tiles(tile, per_block * staging.plane);\n    __syncthreads();",
      "zero_tiles(tile, per_block * staging.plane);", DW_WFLAT, "removed barrier"),
    M("dw-wflat-zero-count", "depthwise.cu", "zero_tiles(tile, per_block * staging.plane);",
      "zero_tiles(tile, (per_block - 1) * staging.plane);", DW_WFLAT, "tile bound"),
    M("dw-wflat-one-tile", "depthwise.cu", "const bool flat_run = FLAT && tiles == 1 &&",
      "const bool flat_run = FLAT &&", DW_WFLAT, "wrong index"),
    M("dw-wflat-64bit", "depthwise.cu", "const I plane_size = (I)height * width,",
      "const int plane_size = height * width,", DW_WFLAT, "int overflow"),
    M("dw-spread-plane", "depthwise.cu", "(span - in_h * pitch) & (BANK_ROW - 1)",
      "(span - in_h * pitch + C) & (BANK_ROW - 1)", DW_SPREAD, "bank conflict"),
    M("dw-spread-layout", "depthwise.cu", "p = (int)threadIdx.x / groups_x % per_block;\n      s = (int)threadIdx.x / "
      "(groups_x * per_block);", "s = (int)threadIdx.x / groups_x % strips;\n      p = (int)threadIdx.x / "
      "(groups_x * strips);", DW_SPREAD, "bank conflict"),
    # the per-image SPREAD instantiations of narrow tiles (issue 25): the planner's choice, the kernel's layout
    M("dw-spread-narrow-choice", DW_PY, "span >= 128 or span <= next_strip <= 128 - span:",
      "span >= 128 or True:", DW_SPREAD, "bank conflict"),
    # AlignedStaging's PAIRS (task dwwgrad): depthwise_bwd_weight's even 16-bit rows staged by 2-element slots
    # AlignedStaging's SPLIT and block_fma's (task dws2): the per-image stride-2 forward's de-interleaved rows
    M("dw-split-odd-half", "depthwise.cu", "odd0 = SPLIT ? ((in_w + 1) / 2 + C - 1) / C * C : 0;",
      "odd0 = SPLIT ? (in_w / 2 + C - 1) / C * C : 0;", DW_SPLIT, "tile bound"),
    M("dw-split-element", "depthwise.cu", "dst[SPLIT ? (i & 1 ? odd0 : 0) + (i >> 1) : i] = v;",
      "dst[SPLIT ? (i & 1 ? odd0 : 0) + ((i + 1) >> 1) : i] = v;", DW_SPLIT, "off-by-one"),
    M("dw-split-chunk-odd", "depthwise.cu", "odd.v[e] = to_acc(t[2 * e + 1]);", "odd.v[e] = to_acc(t[2 * e]);",
      DW_SPLIT, "wrong index"),
    M("dw-split-fma-odd", "depthwise.cu", "load_row<A, L / 2>(src + odd0, odd);",
      "load_row<A, L / 2>(src + odd0 + 4, odd);", DW_SPLIT, "wrong index"),
    M("dw-split-fma-order", "depthwise.cu", "row[e] = e % 2 == 0 ? even[e / 2] : odd[e / 2];",
      "row[e] = e % 2 == 0 ? even[e / 2] : odd[e / 2 - (e > 2)];", DW_SPLIT, "wrong index"),
    M("dw-split-weight-skew-rows", "depthwise.cu", "base + rr * pitch + rr / SPLIT * staging.skew",
      "base + rr * pitch + rr / V * staging.skew", DW_SPLIT, "wrong index"),
    M("dw-split-weight-columns", "depthwise.cu", "+ ox_l * (SPLIT ? 1 : S);", "+ ox_l * S;", DW_SPLIT, "wrong index"),
    M("dw-split-weight-planner", "cupyconv/ops/depthwise.py", "split = spec.stride[0] == 2 and not spread  #",
      "split = False  #", DW_SPLIT, "planner mirror"),
    M("dw-split-skew", "depthwise.cu", "skew = SPLIT ? (span / 2) & (BANK_ROW - 1) : 0;", "skew = 0;", DW_SPLIT,
      "bank conflict"),
    # direct_fma (task dws2f): the per-image stride-2 forward's rows from global memory, halos by shuffles
    M("dw-direct-planner", DW_PY, "direct = spec.stride[0] == 2 and not (spread or packed)", "direct = False",
      DW_DIRECT, "planner mirror"),
    M("dw-direct-fast-pad", "depthwise.cu", "const bool fast = direct && pad_left == (K - 1) / 2 &&",
      "const bool fast = direct &&", DW_DIRECT, "wrong index"),
    M("dw-direct-chunk-bound", "depthwise.cu", "if (row != nullptr && ix0 + H + c < width) p =",
      "if (row != nullptr && ix0 + H + c <= width) p =", DW_DIRECT, "tile bound"),
    M("dw-direct-batch-row", "depthwise.cu", "const int iy = iy0 + r0 + b;", "const int iy = iy0 + b;", DW_DIRECT,
      "wrong index"),
    M("dw-direct-halo-left", "depthwise.cu", "__shfl_up_sync(0xffffffffu, row[2 * U + e], 1)",
      "__shfl_up_sync(0xffffffffu, row[2 * U + e - 1], 1)", DW_DIRECT, "wrong index"),
    M("dw-direct-halo-right", "depthwise.cu", "__shfl_down_sync(0xffffffffu, row[H + e], 1)",
      "__shfl_down_sync(0xffffffffu, row[H + e + 1], 1)", DW_DIRECT, "wrong index"),
    M("dw-direct-left-lane", "depthwise.cu", "const bool left = lane > 0 && ox_l > 0,", "const bool left = ox_l > 0,",
      DW_DIRECT, "warp edge"),
    M("dw-direct-right-item", "depthwise.cu", "right = lane < 31 && ox_l + U < tile_w;", "right = lane < 31;",
      DW_DIRECT, "tile bound"),
    M("dw-direct-past-items", "depthwise.cu", "const T* plane = item.valid && n < images ?",
      "const T* plane = active ?", DW_DIRECT, "tile bound"),
    M("dw-direct-store-active", "depthwise.cu", "if (!PACK && (!direct || active)) {", "if (!PACK) {", DW_DIRECT,
      "tile bound"),
    # depthwise_bwd_weight's PAIRS staged flat by pairs (task dw16wg); stage_run's E-element loads
    M("dw-pflat-cell", "depthwise.cu", "cell[b] = inside ? at.cell + (E - 1) * at.x : -1;",
      "cell[b] = inside ? at.cell : -1;", DW_PFLAT, "wrong index"),
    M("dw-pflat-second", "depthwise.cu", "for (int k = 0; k < E; ++k) tile[cell[b] + k]",
      "for (int k = 0; k < 1; ++k) tile[cell[b] + k]", DW_PFLAT, "tile bound"),
    M("dw-pflat-walk", "depthwise.cu", "const RunWalk walk(w / E, height,", "const RunWalk walk(w, height,",
      DW_PFLAT, "wrong index"),
    M("dw-pflat-count", "depthwise.cu", "valid * (int)plane_size / E, width / E,",
      "valid * (int)plane_size / E - 1, width / E,", DW_PFLAT, "tile bound"),
    M("dw-pflat-source", "depthwise.cu", "at.y * width + E * at.x);", "at.y * width + at.x);", DW_PFLAT,
      "wrong index"),
    # the packed 16-bit 5x5 forward and input gradient stage by 16-byte chunks (stage_chunks, task dwk5)
    M("dw-chunks-head", "depthwise.cu", "(16 - (reinterpret_cast<unsigned long long>(run) & 15)) & 15) / (int)sizeof(T)",
      "0) / (int)sizeof(T)", DW_CHUNKS, "alignment"),
    M("dw-chunks-tail", "depthwise.cu", "const int e = t < head ? t : tail0 + t - head,",
      "const int e = t < head ? t : tail0 + t - head - 1,", DW_CHUNKS, "off-by-one"),
    M("dw-chunks-row-carry", "depthwise.cu", "x = 0, ++y, cell += pitch - w;", "x = 0, ++y, cell += pitch;", DW_CHUNKS,
      "wrong index"),
    M("dw-chunks-plane-carry", "depthwise.cu", "if (y == h) y = 0, cell += plane - h * pitch;",
      "if (y == h) y = 0, cell += plane - (h - 1) * pitch;", DW_CHUNKS, "wrong index"),
    M("dw-chunks-step", "depthwise.cu", "head + t * C, (int)blockDim.x * C);", "head + t * C, (int)blockDim.x);",
      DW_CHUNKS, "wrong index"),
    M("dw-chunks-inside", "depthwise.cu", "chunks && pad_top >= 0 && pad_left >= 0 && ", "chunks && ", DW_CHUNKS,
      "tile bound"),
    M("dw-rows16-high", "depthwise.cu", "const bool high = shift >= 2;", "const bool high = shift > 2;", DW_ROWS16,
      "wrong index"),
    M("dw-rows16-bits", "depthwise.cu", "const int bits = shift & 1 ? 16 : 0;", "const int bits = shift & 2 ? 16 : 0;",
      DW_ROWS16, "wrong index"),
    M("dw-rows16-b-in", "depthwise.cu", "b_in = slot + 4 >= 0 && slot + 4 < width;",
      "b_in = slot + 4 >= 0 && slot + 4 <= width;", DW_ROWS16, "off-by-one"),
    M("dw-rows16-carry", "depthwise.cu", "++q, ++t, at_src += src_carry;", "++q, ++t;", DW_ROWS16, "wrong index"),
    M("dw-rows16-wrap", "depthwise.cu", "++j, at_src += src_wrap;", "++j;", DW_ROWS16, "wrong index"),
    M("dw-rows16-height", "depthwise.cu", "yy >= 0 && yy < height && (ONE_TERM ? q : j) < valid;",
      "yy >= 0 && yy <= height && (ONE_TERM ? q : j) < valid;", DW_ROWS16, "off-by-one"),
    # stage_rows16's digits without a division a unit, the forward's rows stepped without t (task dwbin, 22nd)
    M("dw-rows16-divmod-one", "depthwise.cu", "j = d == 1 ? q : 0, t = d == 1 ? 0 : q;",
      "j = d == 1 ? q : 0, t = q;", DW_ROWS16, "wrong index"),
    M("dw-rows16-one-carry", "depthwise.cu", "++q, at_src += src_carry + src_wrap;", "++q, at_src += src_carry;",
      DW_ROWS16, "wrong index"),
    M("dw-weights-batch", "depthwise.cu", "kernels_staged[e + b * (int)blockDim.x] = to_acc(v[b]);",
      "kernels_staged[e + b] = to_acc(v[b]);", DW_CHUNKS, "wrong index"),
    # depthwise_bwd_weight's RAW16: 16-bit 3x3 rows copied raw by cp.async, read `shift` halves in (task dwwg3, 21st)
    M("dw-raw-shift", "depthwise.cu", "shift = -pad_left & (SLOT - 1);", "shift = pad_left & (SLOT - 1);", DW_RAW,
      "wrong index"),
    M("dw-raw-odd", "depthwise.cu", "raw.shift & 1 ? 0x5432u : 0x3210u", "0x3210u", DW_RAW, "wrong index"),
    M("dw-raw-zero-fill", "depthwise.cu", "inside ? row + yy * (I)width + col : any, inside ? 8 : 0);",
      "inside ? row + yy * (I)width + col : any, 8);", DW_RAW, "tile bound"),
    M("dw-raw-left-edge", "depthwise.cu", "row != nullptr && col >= 0 && col < width;",
      "row != nullptr && col < width;", DW_RAW, "tile bound"),
    M("dw-raw-wait", "depthwise.cu", "if (raw_run) cp_async_wait<0>();", "if (!raw_run) cp_async_wait<0>();", DW_RAW,
      "removed barrier"),
    M("dw-raw-row", "depthwise.cu", "T* dst = tile + q * plane + r * pitch;", "T* dst = tile + q * plane + r * slots;",
      DW_RAW, "wrong index"),
    M("dw-raw-pair", "depthwise.cu", "__byte_perm(w[k], w[k + 1 < WORDS ? k + 1 : k], odd);",
      "__byte_perm(w[k], w[k], odd);", DW_RAW, "wrong index"),
    M("dw-raw-stride", "depthwise.cu", "s * V * S * raw.pitch + ox_l * S;", "s * V * S * raw.pitch + ox_l;", DW_RAW,
      "wrong index"),
    M("dw-wgrad-rows", "depthwise.cu", "(inside ? gp + v * out_w : grad_out);", "(inside ? gp + v * U : grad_out);",
      DW_FWD, "wrong index"),
    M("dw-wgrad-past", "depthwise.cu", "for (int u = 0; u < U; ++u) gv[v][u] = active && oy + v < out_h ? to_acc(",
      "for (int u = 0; u < U; ++u) gv[v][u] = active ? to_acc(", DW_FWD, "tile bound"),
    # depthwise_bwd_weight<K, S>: at least STAGE1_MIN_UNITS units a block (task dwwgrad): the planner's split
    M("dw-stage1-min-units", DW_PY, "fewer = max(1, units // least)", "fewer = max(1, units)",
      DW_STAGE1, "wrong unit split"),
    M("dw-stage1-fill", DW_PY, "fewer * channels >= STAGE1_FILL_BLOCKS:", "fewer * channels > STAGE1_FILL_BLOCKS:",
      DW_STAGE1, "off-by-one"),
    M("dw-stage1-min-units-kernel", DW_PY, 'least = STAGE1_MIN_UNITS if plan.kernel == "depthwise_bwd_weight" else 1',
      "least = 1", DW_STAGE1, "wrong unit split"),
    M("dw-spread-narrow-layout", "depthwise.cu", "constexpr bool spread = SPREAD, stage_weights",
      "constexpr bool spread = PACK && SPREAD, stage_weights", DW_SPREAD, "bank conflict"),
    M("dw-spread-narrow-weights", "depthwise.cu", "stage_weights = PACK && SPREAD;", "stage_weights = SPREAD;",
      DW_SPREAD, "persistent loop"),
    M("dw-bwd-input-term-kernel", "depthwise.cu", "weight + ((I)kernel0 + t) * (K * K), w);",
      "weight + (I)kernel0 * (K * K), w);  ", DW_FWD, "persistent loop"),
    # depthwise_bwd_weight<T, I, K, S> (issue 25)
    M("dw-wgrad-barrier-staged", "depthwise.cu", "      __syncthreads();\n      if (active) {",
      "      if (active) {", DW_FWD, "removed barrier"),
    M("dw-wgrad-barrier-next-unit", "depthwise.cu", "__syncthreads();  // the next unit overwrites the tile\n      if",
      "// the next unit overwrites the tile\n      if", DW_FWD, "removed barrier"),
    M("dw-wgrad-image-group-carry", "depthwise.cu", "if (++ty == tiles_y) ty = 0, ++g;",
      "if (++ty == tiles_y) ty = 0;", DW_FWD, "persistent loop"),
    M("dw-wgrad-first-unit", "depthwise.cu", "int tx = (int)(first % tiles), ty = tx / tiles_x;",
      "int tx = 0, ty = 0;", DW_FWD, "persistent loop"),
    M("dw-wgrad-last-column", "depthwise.cu", "if (active && oy + v < out_h && ox + u < out_w) raw[v][u] = gp[u];",
      "if (active && oy + v < out_h && ox + u <= out_w) raw[v][u] = gp[u];", DW_FWD, "off-by-one"),
    M("dw-wgrad-last-row", "depthwise.cu", "const bool inside = active && oy + v < out_h;",
      "const bool inside = active;", DW_FWD, "tile bound"),
    M("dw-wgrad-loads-unchecked", "depthwise.cu", "const bool rows_aligned = out_w % U == 0 &&\n",
      "const bool rows_aligned =\n", DW_FWD, "misaligned pack"),
    M("dw-wgrad-bias-column", "depthwise.cu", "for (int u = 0; u < U; ++u) acc[R] += gv[v][u];",
      "for (int u = 1; u < U; ++u) acc[R] += gv[v][u];", DW_FWD, "off-by-one"),

    # -- lift.cu: the 3-D fold's depth windows and the fold of their gradient ---------------------------------------
    M("lift-windows-depth-bound", "lift.cu", "const bool inside = d >= 0 && d < depth;",
      "const bool inside = d >= 0 && d <= depth - 1 + (a == 0);", LIFT, "off-by-one"),
    M("lift-windows-rows-flat", "lift.cu", "} else if (flat_rows) {", "} else if (true) {", LIFT,
      "wrong pixel split"),
    M("lift-windows-32bit-pixel", "lift.cu", "dst[p] = src[(I)y * x_stride_h + (I)xx * x_stride_w];",
      "dst[p] = src[(int)(y * x_stride_h + xx * x_stride_w)];", LIFT, "32-bit overflow"),
    M("lift-windows-32bit-flat", "lift.cu", "const T* from = src + (I)base * x_stride_w;",
      "const T* from = src + (int)(base * x_stride_w);", LIFT, "32-bit overflow"),
    M("lift-windows-flat-step", "lift.cu", "const I step = (I)LIFT_THREADS * x_stride_w;",
      "const I step = (I)LIFT_THREADS;", LIFT, "wrong stride"),
    M("lift-fold-stride-rest", "lift.cu", "if (rest != 0 || z >= out_depths) continue;",
      "if (z >= out_depths) continue;", LIFT, "missing stride test"),
    M("lift-fold-tap-order", "lift.cu", "for (int a = 0; a < taps; ++a) {", "for (int a = taps - 1; a >= 0; --a) {",
      LIFT, "summation order"),
    M("lift-fold-32bit-image", "lift.cu",
      "const T* image = g + (m * out_depths * channels + c) * taps * (I)pixels;",
      "const T* image = g + (int)((m * out_depths * channels + c) * taps * (I)pixels);", LIFT, "32-bit overflow"),
    M("lift-fold-drops-start", "lift.cu", "sum[k] = p < pixels ? dst[p] : acc_t<T>(0);", "sum[k] = acc_t<T>(0);",
      LIFT, "lost accumulation"),
    M("lift-fold-plane-loop", "lift.cu", "for (I plane = blockIdx.y; plane < planes; plane += gridDim.y) {\n    int d, c;",
      "for (I plane = blockIdx.y; plane < planes; plane += 1) {\n    int d, c;", LIFT, "grid-stride loop"),
    # -- patch.cu ---------------------------------------------------------------------------------------------
    M("patch-tile-barrier-chunk", "patch.cu", "__syncthreads();  // the previous chunk", "// the previous chunk", PATCH,
      "removed barrier"),
    M("patch-tile-barrier-staged", "patch.cu", "__syncthreads();\n\n    const A* tile = tiles + p * patch_stride;",
      "\n    const A* tile = tiles + p * patch_stride;", PATCH, "removed barrier"),
    M("patch-weight-barrier-staged", "patch.cu", "__syncthreads();\n\n    for (int q = 0; q < bp; ++q) {",
      "\n    for (int q = 0; q < bp; ++q) {", PATCH, "removed barrier"),
    M("patch-reduce-last-slice", "patch.cu", "for (I s = 0; s < slices; ++s)", "for (I s = 0; s < slices - 1; ++s)",
      PATCH, "off-by-one"),
    M("patch-tile-store-bound", "patch.cu", "if (m < pixels) dst[(I)oo * pixels + m]",
      "if (m <= pixels) dst[(I)oo * pixels + m]", PATCH, "off-by-one"),
    M("patch-fwd-stride-swap", "patch.cu", "step_x = TRANSPOSED ? 1 : stride_w;", "step_x = TRANSPOSED ? 1 : stride_h;",
      PATCH, "swapped stride"),
    M("patch-bwd-input-stride-swap", "patch.cu", "insert_x = TRANSPOSED ? stride_w : 1;",
      "insert_x = TRANSPOSED ? stride_h : 1;", PATCH, "swapped stride"),
    M("patch-weight-stride-swap", "patch.cu", "+ ox * stride_w, koff,", "+ ox * stride_h, koff,", PATCH,
      "swapped stride"),
    M("patch-fwd-pad-side", "patch.cu", "(kw - 1) * dilation_w - pad_left : pad_left;",
      "(kw - 1) * dilation_w - pad_left : pad_top;", PATCH, "wrong-side padding"),
    M("patch-bwd-input-pad-side", "patch.cu", "(kw - 1) * dilation_w - pad_left : pad_left;",
      "(kw - 1) * dilation_w - pad_top : pad_left;", PATCH, "wrong-side padding"),
    M("patch-weight-pad-side", "patch.cu", "b = xx + pad_left;", "b = xx + pad_top;", PATCH, "wrong-side padding"),
    M("patch-reduce-half-sum", "patch.cu", "acc_t<T> sum = 0;\n    for (I s = 0;", "T sum = 0;\n    for (I s = 0;",
      PATCH, "half accumulation"),
    M("patch-weight-int-index", "patch.cu", "dst[(I)(g * O + dd) * K + k]", "dst[(g * O + dd) * K + k]", PATCH,
      "32-bit index"),
    M("patch-pack-odd-offset", "patch.cu", "A* wtile = reinterpret_cast<A*>(patch_shared);  // [chunk]",
      "A* wtile = reinterpret_cast<A*>(patch_shared) + 1;  // [chunk]", PATCH, "misaligned pack"),

    # -- implicit_gemm.cu: small groups, several a block (conv_fwd_igemm_groups) ----------------------------------
    M("igg-warps-on-group-0", "implicit_gemm.cu", "first_vector = block_group * CG / VEC;", "first_vector = 0;", IGG,
      "tc: fragment index"),
    M("igg-swizzle-store-side", "implicit_gemm.cu", "const int store_offset = igg_swizzle(row0, v);",
      "const int store_offset = row0 * IGG_ROW_BYTES + (v << 4);", IGG, "tc: fragment index"),
    M("igg-weight-group", "implicit_gemm.cu", "group_first = c0 + v * VEC / CG * CG;", "group_first = c0;", IGG,
      "tc: fragment index"),
    M("igg-weight-tap-step", "implicit_gemm.cu", "      b_offset[i] += CG;\n", "      b_offset[i] += VEC;\n", IGG,
      "off-by-one"),
    M("igg-wait-too-weak", "implicit_gemm.cu", "cp_async_wait<STAGES - 2>();  // tap t",
      "cp_async_wait<STAGES - 1>();  // tap t", IGG, "removed barrier"),
    M("igg-barrier-tap", "implicit_gemm.cu", "    __syncthreads();              // ... every thread's",
      "    // ... every thread's", IGG, "removed barrier"),
    M("igg-zero-fill", "implicit_gemm.cu", "const int bytes = inside ? IG_VECTOR_BYTES : 0;",
      "const int bytes = IG_VECTOR_BYTES;", IGG, "off-by-one"),
    M("igg-tap-row-step", "implicit_gemm.cu", "      dy += dilation_h;\n      tap_offset += step_r;\n",
      "      dy += dilation_h;\n", IGG, "off-by-one"),
    M("igg-dilation-swap", "implicit_gemm.cu", "      dy += dilation_h;\n      tap_offset",
      "      dy += dilation_w;\n      tap_offset", IGG, "swapped stride"),
    M("igg-pad-side", "implicit_gemm.cu", "a_x[i] = -pad_left + ox * stride_w;", "a_x[i] = -pad_top + ox * stride_w;",
      IGG, "wrong-side padding"),
    M("igg-bias-channel", "implicit_gemm.cu", "c0 + col < channels ? to_acc(bias[c0 + col])",
      "c0 + col < channels ? to_acc(bias[col])", IGG, "off-by-one"),
    M("igg-channels-last-past-groups", "implicit_gemm.cu", "    if (!v_inside) return;\n", "", IGG,
      "off-by-one"),
    M("igg-scalar-store-image", "implicit_gemm.cu",
      "      T* at = out + (image * channels + c0) * pixels + (m - image * pixels);",
      "      T* at = out + c0 * pixels + m;", IGG, "wrong plane stride"),
    M("igg-32-bit-offsets", "implicit_gemm.cu",
      "  typedef typename Unsigned<I>::type U;\n  constexpr int VEC = IG_VECTOR_BYTES / (int)sizeof(T);\n  constexpr int CHANNELS",
      "  typedef unsigned U;\n  constexpr int VEC = IG_VECTOR_BYTES / (int)sizeof(T);\n  constexpr int CHANNELS",
      IGG + " -k past_2_32", "32-bit index"),
    M("igg-planner-blocks", IG_PY, "ceil_div(spec.in_channels, channels), 1)",
      "spec.in_channels // channels, 1)", IGG, "off-by-one"),

    # -- implicit_gemm.cu: the weight gradient of small groups (conv_bwd_weight_igemm_groups) --------------------
    M("wgg-warps-on-group-0", "implicit_gemm.cu", "first_tap = warp / GROUPS, col = block_group * CG;",
      "first_tap = warp / GROUPS, col = 0;", WGG, "tc: fragment index"),
    M("wgg-swizzle-store-side", "implicit_gemm.cu", "b_store[r] = SB::at(row0 + r * ROW_STEP, v * E);",
      "b_store[r] = (row0 + r * ROW_STEP) * WGG_TAPS * CHANNELS + v * E;", WGG, "tc: fragment index"),
    M("wgg-warp-taps", "implicit_gemm.cu", "const int tap_col = (first_tap + k * WARPS_PER_GROUP) * CHANNELS + col;",
      "const int tap_col = first_tap * CHANNELS + col;", WGG, "tc: fragment index"),
    M("wgg-zero-fill", "implicit_gemm.cu", "x_cl + (b_inside ? (I)(px.offset + b_column[t]) : (I)0), b_inside ? 16 : 0);",
      "x_cl + (b_inside ? (I)(px.offset + b_column[t]) : (I)0), 16);", WGG, "off-by-one"),
    M("wgg-taps-past-the-last", "implicit_gemm.cu", "warp_tap[k] = tap0 + first_tap + k * WARPS_PER_GROUP < taps;",
      "warp_tap[k] = true;", WGG, "off-by-one"),
    M("wgg-pixels-past-the-split", "implicit_gemm.cu", "const bool inside = v_inside && row0 + r * ROW_STEP < remaining;",
      "const bool inside = v_inside;", WGG, "off-by-one"),
    M("wgg-dilation-swap", "implicit_gemm.cu", "dy[t] = tap0 + t < taps ? tap / kernel_w * dilation_h - pad_top",
      "dy[t] = tap0 + t < taps ? tap / kernel_w * dilation_w - pad_top", WGG, "swapped stride"),
    M("wgg-pad-side", "implicit_gemm.cu", "dx[t] = tap % kernel_w * dilation_w - pad_left;",
      "dx[t] = tap % kernel_w * dilation_w - pad_top;", WGG, "wrong-side padding"),
    M("wgg-tf32-bias-rest", "implicit_gemm.cu", "    ig_mma<float>(bias[mi], rest, ones);\n", "", WGG,
      "tf32 rounding"),
    M("wgg-tf32-rest-blocks", "implicit_gemm.cu", "stage_rest = sizeof(S) == 4 && has_bias && blockIdx.x == 0;",
      "stage_rest = sizeof(S) == 4 && has_bias && blockIdx.x == 1;", WGG, "tf32 rounding"),
    M("wgg-bias-split", "implicit_gemm.cu", "bias_partial[(I)blockIdx.z * C + g * CG + d]", "bias_partial[g * CG + d]",
      WGG, "wrong plane stride"),
    M("wgg-split-slice", "implicit_gemm.cu", "float* out = partial + ((I)blockIdx.z * C + g * CG) * (I)N;",
      "float* out = partial + ((I)g * CG) * (I)N;", WGG, "wrong plane stride"),
    M("wgg-32-bit-offsets", "implicit_gemm.cu",
      "  typedef typename Unsigned<I>::type U;\n  constexpr int CHANNELS = IGG_ROW_BYTES / (int)sizeof(T), GROUPS",
      "  typedef unsigned U;\n  constexpr int CHANNELS = IGG_ROW_BYTES / (int)sizeof(T), GROUPS",
      IGG + " -k weight_gradient_offsets_past_2_32", "32-bit index"),
    M("wgg-planner-blocks", IG_PY, "ceil_div(spec.in_channels, igemm_groups_channels(dtype)))",
      "spec.in_channels // igemm_groups_channels(dtype))", WGG, "off-by-one"),

    # -- timing.cu: autotuning's spin, which must last its cycles -----------------------------------------------
    M("timing-spin-too-short", "timing.cu", "while (clock64() - start < cycles)",
      "while (clock64() - start < cycles / 64)", "tests/test_autotune.py -k emulator", "short spin"),
    # -- cupyconv/_autotune.py: the heuristic's pick kept on ties and near-ties, timed first ----------------------
    M("autotune-no-margin", AT_PY, "seconds[fastest] < (1 - TIE_MARGIN) * seconds[preferred]",
      "seconds[fastest] < seconds[preferred]", AT, "wrong margin"),
    M("autotune-margin-sign", AT_PY, "(1 - TIE_MARGIN) * seconds[preferred]", "(1 + TIE_MARGIN) * seconds[preferred]",
      AT, "wrong margin"),
    M("autotune-heuristic-not-first", AT_PY, "for candidate in (preferred, *[c for c in candidates if c != preferred]):",
      "for candidate in candidates:", AT, "wrong order"),
    M("autotune-no-second-timing", AT_PY, "    if again[0] < timings[preferred][0]:", "    if False:", AT,
      "wrong choice"),
    M("autotune-preferred-first-candidate", AT_PY, "return heuristic if heuristic in candidates else candidates[0]",
      "return candidates[0]", AT, "wrong choice"),
]


def source_path(file: str, root: Path, kernel_dir: Path) -> Path:
    """Where a mutation's file lies: an emulator header or a package module by its path from the root, a kernel in
    kernel_dir."""
    return root / file if file.startswith((EMULATOR_INCLUDE + "/", PACKAGE + "/")) else kernel_dir / file


def problems(mutations=MUTATIONS, kernel_dir: Path = KERNELS) -> list[str]:
    """Why each broken record cannot be applied: a snippet not found exactly once, a no-op, a repeated name."""
    found, seen = [], set()
    for m in mutations:
        path = source_path(m.file, ROOT, kernel_dir)
        count = path.read_text().count(m.original) if path.is_file() else 0
        if count != 1:
            found.append(f"{m.name}: the snippet occurs {count} times in {m.file} (must be exactly once): "
                         f"{m.original!r}")
        if m.original == m.replacement:
            found.append(f"{m.name}: the replacement is the original")
        if m.name in seen:
            found.append(f"{m.name}: the name is used twice")
        seen.add(m.name)
    return found


def make_copy(root: Path) -> Path:
    """A copy of what the kernel tests need, with its own raw_kernels/."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for part in ("cupyconv", "tests", "raw_kernels"):
        shutil.copytree(ROOT / part, root / part, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def run_one(m: Mutation, copy: Path, cache: Path, timeout: float) -> tuple[str, str]:
    """(outcome, detail) of one mutant, built in `copy`."""
    kernels = copy / "raw_kernels"
    shutil.rmtree(kernels)
    shutil.copytree(KERNELS, kernels)
    for part in (EMULATOR_INCLUDE, PACKAGE):   # fresh: the previous mutant may have edited them
        shutil.rmtree(copy / part)
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    path = source_path(m.file, copy, kernels)
    path.write_text(path.read_text().replace(m.original, m.replacement, 1))
    env = dict(os.environ, PYTHONPATH=str(copy), CUPYCONV_EMULATOR_CACHE=str(cache))
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", *shlex.split(m.tests)]
    try:
        result = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed", f"timed out after {timeout:.0f} s"
    output = result.stdout + result.stderr
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    if "BuildError" in output or "g++ failed" in output:
        return "error", "the mutant does not compile"
    if result.returncode == 1:
        failed = re.search(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.M)
        return "killed", failed.group(1) if failed else summary
    if result.returncode < 0:  # the test process died (a wild write, most often): CI fails as well
        return "killed", f"pytest crashed (signal {-result.returncode})"
    if result.returncode == 0:
        return ("survived" if re.search(r"\d+ passed", summary) else "not run"), summary
    return "error", f"pytest exit {result.returncode}: {summary}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only these mutations (names or shell patterns, repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutant (a hang counts as killed)")
    parser.add_argument("--list", action="store_true", help="print the mutations and exit")
    args = parser.parse_args(argv)

    chosen = [m for m in MUTATIONS if not args.only or any(fnmatch.fnmatch(m.name, p) for p in args.only)]
    if args.list:
        for m in chosen:
            print(f"{m.name:34} {m.kind:24} {m.file:13} {m.tests}")
        return 0
    broken = problems()
    for line in broken:
        print(f"error: {line}")
    bad_names = {line.split(":")[0] for line in broken}
    chosen = [m for m in chosen if m.name not in bad_names]
    if not chosen:
        print("no mutation to run")
        return 2

    start, results, lock = time.monotonic(), {}, threading.Lock()
    with tempfile.TemporaryDirectory(prefix="cupyconv-mutants-") as scratch:
        scratch = Path(scratch)
        copies = queue.Queue()
        for i in range(max(1, args.jobs)):
            copies.put(make_copy(scratch / f"copy{i}"))
        cache = scratch / "emulator-cache"

        def job(m: Mutation):
            copy = copies.get()
            try:
                t0 = time.monotonic()
                outcome, detail = run_one(m, copy, cache, args.timeout)
            finally:
                copies.put(copy)
            with lock:
                results[m.name] = outcome
                print(f"{outcome:9} {m.name:34} {m.kind:24} {time.monotonic() - t0:6.1f} s  {detail}", flush=True)

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            list(pool.map(job, chosen))

    counts = {k: sum(v == k for v in results.values()) for k in ("killed", "survived", "not run", "error")}
    scored = counts["killed"] + counts["survived"]
    print(f"\nkilled {counts['killed']}, survived {counts['survived']}, not run {counts['not run']}, "
          f"errors {counts['error'] + len(broken)}; score {counts['killed']}/{scored}"
          f" = {100 * counts['killed'] / max(scored, 1):.0f}% in {time.monotonic() - start:.0f} s")
    for kind in ("survived", "not run", "error"):
        names = [m.name for m in chosen if results.get(m.name) == kind]
        if names:
            print(f"{kind}: {', '.join(names)}")
    return 1 if broken or counts["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
