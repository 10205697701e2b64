"""A performance model of every GPU benchmark case: predicted time ranges without a GPU.  PREDICTIONS, not measurements.

    python -m benchmarks.predict                                  # every GPU case, H100 SXM
    python -m benchmarks.predict --cases r50-64-gpu16,issue13 --gpu h200 --json predict.json
    python -m benchmarks.predict --quick                          # no emulator counter runs (analytic access model)

For each GPU case of benchmarks/cases.py (the N-d cases included) and pass ("fwd", "fwd+bwd"):

1. the kernels and cuBLAS GEMMs the planners launch, recorded by running the case's real GPU path on a recording
   Device (`benchmarks.launches`), with the 'auto' choices (autotuning off);
2. per kernel, its SASS (`benchmarks.sass`: registers, shared memory, the main loop's instruction mix,
   occupancy) and its memory accesses: the emulator's counters (`emulated_counters`, the one adapter to
   tests/emulator's `EmulatedDevice(counters=True, blocks=spread_blocks(COUNTER_BLOCKS))`: a few blocks run over
   the recorded arguments, their counts scaled to the grid) -- global sectors and lines per request, sector
   efficiency, shared wavefronts per request -- which set the shared-memory/L1 and L2 terms; else (--quick, or
   where the run fails: "why" in the output) an analytic access model from the SASS main loop and the assumed
   ranges of `ASSUMPTIONS`.  Each kernel's "counters" says which ("source": "emulator" or "analytic");
   the instructions it executes (`benchmarks.executed`: the SASS's basic blocks, counted by the same counter run's
   per-site warp requests, for the instruction-issue and latency terms), or where that cannot be counted
   (tensor-core kernels, no counters, `--instructions static`) the static main loop per trip (the work's
   "instructions_source" says which);
3. per kernel, the time each resource needs -- tensor pipe, FMA pipe, instruction issue, shared memory/L1
   wavefronts, L2, DRAM, and latency when too few warps are resident -- as a [low, high] range; the kernel
   takes the largest of them (its binding resource; a one-pass kernel's high end the SM's and memory's times in
   sequence, `in_sequence_high`, and the SIMT weight gradient's its issue and shared-memory wavefronts in
   sequence, `simt_in_sequence_high`) plus a fixed time of its own (`kernel_us`, what a CUPTI trace times),
   and its launch adds a launch overhead (`predicted_us`); a case-pass is the sum of its kernels, GEMMs (cuBLAS
   modelled at a stated fraction of peak) and array-library operations (CuPy's copies, fills and sums between
   launches: their DRAM bytes at `array_work_efficiency`);
4. the case's floor (`cases.roofline` over the data-sheet peaks of `GPUS`) and the prediction as a multiple of it;
5. the host's time per call (`host_us`: the Python glue and CuPy's launches, which bound every forward on the H200),
   from `benchmarks.host_overhead.counts` on this CPU -- Python calls, launches, allocations and the scalar
   arguments CuPy wraps per call -- and constants fitted to each GPU machine's measured host times (`HOST_MODELS`,
   `HOST_PAIRS`, `HOST_PAIRS_H100`, `fit_host`), and the wall time of calls queued back to back, `wall_us` =
   max(GPU, host) ("host_bound" where the host's low end is above the GPU's high).

Every constant is in `GPUS` and `SOURCES` (one table, each with its source); every modelling assumption is in
`ASSUMPTIONS`.  Both are written into the JSON's "meta".  Nothing here is measured: `benchmarks.gpu_check`
records measured next to predicted on the first GPU run and writes the model's error into its summary.md.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import inspect
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy

from cupyconv.ops.depthwise import FINISH_ROWS
from cupyconv.ops.implicit_gemm import PT_COLS, PT_ROWS, PT_STEP, PW_ROWS, weight_finish_splits
from cupyconv.ops.simt_gemm import SIMT_CHUNK, simt_fwd_chunk

from . import _emulator
from . import cases as cases_mod
from . import launches as launches_mod

ROOT = Path(__file__).resolve().parents[1]
# The predictions of record, one file per GPU (`--brief`), which benchmarks.gpu_check compares its measurements with.
PREDICTIONS = {gpu: ROOT / "benchmarks" / "results" / f"predict-{gpu}.json" for gpu in ("h100", "h200")}

# ---------------------------------------------------------------------------------------------------------
# Constants: one table per GPU, each entry's source in SOURCES

GPUS = {
    "h100": {
        "name": "NVIDIA H100 SXM5 80GB",
        "sms": 132,
        "clock_ghz": (1.755, 1.98),           # sustained under load .. maximum boost
        "tensor_tflops": {"float16": 989.4, "bfloat16": 989.4, "tf32": 494.7},   # dense, no sparsity
        "fp32_tflops": 66.9,
        "fp64_tflops": 33.5,
        "hbm_tbs": 3.35,
        "l2_tbs": (5.5, 7.5),
        "l2_mib": 50,
        "schedulers_per_sm": 4,
        "fp32_lanes_per_sm": 128,
    },
}
GPUS["h200"] = {**GPUS["h100"], "name": "NVIDIA H200 SXM 141GB", "hbm_tbs": 4.8}

SOURCES = {
    "sms, schedulers_per_sm, fp32_lanes_per_sm, l2_mib":
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): H100 SXM5 has 132 SMs, each with 4 warp "
        "schedulers (one warp instruction per clock each) and 128 FP32 lanes; 50 MB L2; 256 KB L1/shared per SM",
    "tensor_tflops, fp32_tflops, fp64_tflops":
        "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): FP16/BF16 tensor 1,979 TFLOPS and TF32 989 TFLOPS "
        "with sparsity, i.e. 989.4 and 494.7 dense; FP32 67 TFLOPS; FP64 34 TFLOPS (33.5 non-tensor). NVIDIA H200 "
        "datasheet: the same compute figures",
    "hbm_tbs":
        "NVIDIA H100 datasheet: HBM3 3.35 TB/s (H100 SXM); NVIDIA H200 datasheet: HBM3e 4.8 TB/s, 141 GB",
    "clock_ghz":
        "989.4 TFLOPS = 132 SMs x 1024 dense FP16 FMA per clock x 2 at 1.83 GHz, and 66.9 TFLOPS FP32 = 132 x 128 x 2 "
        "at 1.98 GHz (the datasheet's maximum boost); 1.755 GHz is taken as the sustained clock under a long "
        "tensor-core load (an assumption: H100 SXM throttles below maximum boost at 700 W)",
    "l2_tbs":
        "ASSUMPTION, not a data-sheet figure: NVIDIA publishes no L2 bandwidth for H100; published microbenchmarks "
        "(Luo et al., 'Benchmarking and Dissecting the Nvidia Hopper GPU Architecture', 2024, and 'Dissecting the "
        "NVIDIA Hopper Architecture through Microbenchmarking and Multiple Level Analysis', 2025) report Hopper's "
        "L2 throughput at roughly 2x its HBM3 bandwidth; the range 5.5-7.5 TB/s stands for that",
    "shared memory / L1":
        "CUDA C Programming Guide, 'Shared Memory' (compute capability 9.0): 32 banks of 4 bytes; a warp request is "
        "served in wavefronts of at most one word per bank; Jia et al., 'Dissecting the NVIDIA Volta GPU "
        "Architecture via Microbenchmarking' (2018) and 'Dissecting the NVidia Turing T4 GPU via Microbenchmarking' "
        "(2019) measure shared-memory bandwidth at close to 32 banks x 4 B per clock per SM: one wavefront per clock "
        "per SM, shared by the L1 data path of global loads",
    "cycles_between_independent_fma":
        "NVIDIA Volta and Turing Tuning Guides (section 'Instruction Scheduling'): FMA dependent-issue latency 4 "
        "cycles, 'the schedulers can issue independent instructions every cycle', hidden by 4 warps per SM with "
        "4-way ILP; CUDA C++ Programming Guide, 'Multiprocessor Level': 'multiple independent instructions from a "
        "single warp can be issued back to back'; Abdelkhalik et al., 'Demystifying the Nvidia Ampere Architecture "
        "through Microbenchmarking' (arXiv 2208.11174): A100 f32 add 4 cycles dependent, 2 cycles a instruction "
        "independent (16 FP32 lanes a scheduler; H100 has 32); maxas SGEMM (NervanaSystems/maxas wiki 'SGEMM'): "
        "FFMA issued 1 cycle apart, 96-98% of the FP32 peak on Maxwell at 2-4 warps a scheduler",
    "mma_sync_fraction":
        "Shah et al., 'FlashAttention-3' (2024): on H100, mma.sync reaches about 2/3 of the tensor cores' peak, "
        "which needs wgmma; Luo et al., 'Benchmarking and Dissecting the Nvidia Hopper GPU Architecture' (2024) "
        "compare mma and wgmma throughput on Hopper; the range 0.5-0.67 of the dense peak is taken for mma.sync",
    "wgmma_fraction":
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): the dense FP16/BF16 peak is the warpgroup MMA's "
        "(wgmma, 'asynchronous' tensor cores reading shared memory); Shah et al., 'FlashAttention-3' (2024): about "
        "75% of that peak in attention's GEMMs on wgmma; CUTLASS 3.x's Hopper GEMM figures (NVIDIA developer blog "
        "'CUTLASS 3.x', 2023) put large fp16 GEMMs at 80-90% of it.  A model parameter, not a measurement: the "
        "range 0.6-0.85 of the dense peak is taken for conv_fwd_wgmma's m64nNk16 with cp.async operands.  TF32 "
        "(m64nNk8 .tf32, the same 32 bytes of K an instruction): the same range of the TF32 dense peak (494.7 "
        "TFLOPS: the datasheet's 989 with sparsity, 'tensor_tflops'), the whitepaper giving TF32 half the FP16 "
        "rate on the same warpgroup MMA; no published TF32 wgmma efficiency was found, so this is an assumption",
}

# Modelling assumptions (ranges: the first value gives the low time, the second the high time).
ASSUMPTIONS = {
    "mma_sync_fraction": ((0.67, 0.5), "fraction of the dense tensor peak mma.sync (HMMA) can reach on sm_90"),
    "wgmma_fraction": ((0.85, 0.6), "fraction of the dense tensor peak (the dtype's: TF32's for float) wgmma "
                                    "(HGMMA, sm_90a) can reach: conv_fwd_wgmma"),
    "issue_efficiency": ((1.0, 0.7), "fraction of cycles each scheduler issues an instruction when enough warps "
                                     "are resident (1.0: never stalls)"),
    "cycles_between_instructions": ((4, 8), "average cycles between two instructions of one warp running alone "
                                            "(dependent ALU ~4-6 cycles, shared-memory loads ~25-30, overlapped by "
                                            "the loop's independent instructions): a warp's main loop (or, counted "
                                            "by benchmarks.executed, everything it executes) takes at least its "
                                            "instructions times this (the 'latency' bound)"),
    "cycles_between_independent_fma": ((1, 2), "the same for a register-blocked FMA GEMM loop (simt_fwd, "
                                               "simt_bwd_weight: 64-128 independent accumulators a thread, far above "
                                               "the 4-way ILP that hides a dependent FFMA): a warp issues its "
                                               "independent instructions back to back, 1 cycle apart, 2 allowing "
                                               "for register-bank conflicts and operand-reuse misses"),
    "global_load_latency_cycles": ((300, 700), "a global load's latency (an L2 hit ~260-300 cycles, DRAM ~500-700 "
                                               "under load), exposed once per trip of a SIMT or elementwise main "
                                               "loop that loads from global memory, or, counted by "
                                               "benchmarks.executed, once per run of a load that its own basic block "
                                               "uses"),
    "l2_bytes_per_sm_clock": ((64, 32), "bytes one SM draws from L2 per clock while few SMs load (the split-K "
                                        "weight gradients' last blocks, `finish_tail`): its 64-byte L1 fill path at "
                                        "best; at worst its share of the whole L2's bandwidth at full load "
                                        "(5.5-7.5 TB/s over 132 SMs at 1.6-2.0 GHz: 21-35 bytes a clock)"),
    "dram_efficiency": ((0.92, 0.8), "fraction of the HBM peak a streaming kernel reaches (a copy: ~85-92%)"),
    "dram_reread": ((1.0, 1.25), "DRAM bytes over the kernel's compulsory bytes (every argument read or written "
                                 "once; more when L2 misses re-read an operand)"),
    "l1_hit_bytes": ((1.0, 0.0), "analytic model: share of the L1 requests' bytes beyond the compulsory bytes that "
                                 "L1 serves (1.0: only compulsory bytes reach L2; 0.0: every requested sector "
                                 "does)"),
    "sector_efficiency": ((1.0, 0.6), "analytic model: useful bytes / bytes moved of global requests (the review "
                                      "found 60-69% for the tensor-core activation gathers)"),
    "global_wavefronts_per_request": ((1.0, 3.0), "analytic model: L1 wavefronts per global request of up to 128 "
                                                  "bytes (1: one line; scattered 2-byte gathers touch 1-3)"),
    "shared_conflict_factor": ((1.0, 4.0), "analytic model: wavefronts per shared request of 32-bit or narrower "
                                           "stores over the conflict-free count (the review found 4-way conflicts "
                                           "on the 2-byte stores; loads are taken at 1.0-2.0)"),
    "non_loop_instructions": ((0.5, 1.0), "share of a kernel's static instructions outside its main loop (up to "
                                          "its last EXIT: cold subroutines after it are left out) that each warp "
                                          "executes once (set-up, epilogue)"),
    "simt_lane_efficiency": ((1.0, 0.75), "active lanes per SIMT main-loop instruction (edge tiles, predication)"),
    # Measured on the H200 (2026-11-26, benchmarks.calibrate): the three smallest kernels, whose work the model
    # puts at 0.03-0.5 us (depthwise_bwd_reduce over 20 and 150 blocks, a CuPy copy of 147 kB), took 1.2, 1.4 and
    # 2.0 us of GPU time in torch.profiler's CUPTI trace, which times a kernel from its start to its end on the GPU:
    # a fixed cost inside every kernel's own duration.  The 1.5-4 us per launch assumed before is split into that
    # (kernel_fixed_us, compared with CUPTI) and the rest (launch_overhead_us, between kernels), same total.
    "kernel_fixed_us": ((1.0, 2.0), "GPU time of every kernel beyond its work, inside its own (CUPTI) duration: "
                                    "dispatching its first blocks, the wait for its last and the flush at its end "
                                    "(measured on the H200: 1.2-2.0 us for the smallest kernels)"),
    "launch_overhead_us": ((0.5, 2.0), "per kernel launch and per cuBLAS call on one stream, between kernels, "
                                       "outside their own durations (launch latency, the drain and fill between "
                                       "dependent kernels); with kernel_fixed_us, 1.5-4 us per launch"),
    "cublas_fraction": ((0.75, 0.5), "fraction of the dense peak cuBLAS reaches on a GEMM that fills every SM "
                                     "(fp16/bf16/TF32 on tensor cores; strict fp32 on the FMA pipe: 0.85-0.6); a GEMM "
                                     "with fewer 128x128 output tiles (times K splits of 1024, split-K) than SMs gets "
                                     "that share of it"),
    "array_work_efficiency": ((0.92, 0.6), "fraction of the HBM peak CuPy's own copies, fills, casts and sums reach "
                                           "(the low end a streaming copy's, on compulsory bytes; the high end on "
                                           "the sectors the operands' strides touch)"),
    "not_modelled": (None, launches_mod.UNRECORDED + "; L2 residency between kernels (but the written bytes "
                                                     "that fit in L2 leave DRAM's low end: `dram_low_bytes`); "
                                                     "clock throttling beyond the clock range; autotuning "
                                                     "(benchmarks.run turns it on, this model takes the 'auto' "
                                                     "heuristic's choice)"),
}
CUBLAS_FP32_FRACTION = (0.85, 0.6)


def assumption(name: str) -> tuple:
    return ASSUMPTIONS[name][0]


# ---------------------------------------------------------------------------------------------------------
# Host time: the Python glue and CuPy calls of one call, which bound every forward on the H200
#
# Calls enqueued back to back run at max(GPU time, host time) each.  The host's share is predicted from what
# `benchmarks.host_overhead.counts` finds on the CPU for the case on the current code -- Python function calls
# per call and launches per call (raw kernels, cuBLAS GEMMs, CuPy's array work), both deterministic -- as
# host_us = per_call_us * calls + per_launch_us * launches (+ per_allocation_us * allocations on the H100), the
# constants fitted per GPU (least squares on the relative error) to that machine's measured pairs below: the
# host is another CPU on each; the range is that point times the fit's spread (the lowest and highest measured
# / fitted of the pairs).  The per-launch term holds what the CPU instrument stubs out: CuPy's launch, its
# array work's own Python and, on the H200, its allocations (one to three per launch there: too collinear with
# launches for a constant of their own -- fitted together they came out at -3.7 us each).

# (case, pass, MEASURED H200 host us per call, the algorithms that run's autotuning chose where the 'auto'
#  heuristic chooses others, host_overhead.counts at that code: calls, launches).  The host us are
# benchmarks/results/gpu-2026-11-26/after-fixes/host_profile.json (commit 21e92e1, autotune on, 20 calls enqueued
# with no synchronisation); the counts were taken at 9148501, whose CuPy path is 21e92e1's.
HOST_PAIRS = (
    ("r50-64-gpu16", "fwd", 138.7, {}, 199.1, 3),
    ("r50-64-gpu16", "fwd+bwd", 460.7, {}, 476.1, 9),
    ("p-seed-gpu16", "fwd", 149.4, {}, 198.1, 3),
    ("p-seed-gpu16", "fwd+bwd", 410.5, {}, 474.1, 9),
    ("iii-gpu32", "fwd", 79.1, {}, 156.1, 1),
    ("iii-gpu32", "fwd+bwd", 219.8, {}, 359.1, 4),
    ("dw-480-14-gpu16", "fwd", 107.1, {}, 156.1, 1),
    ("dw-480-14-gpu16", "fwd+bwd", 227.3, {}, 359.1, 4),
    ("iv-gpu16", "fwd", 66.2, {}, 125.1, 1),
    ("iv-gpu16", "fwd+bwd", 135.0, {}, 265.1, 2),
    ("r50-64-gpu32", "fwd", 185.6, {"forward": "im2col_gemm", "grad_input": "im2col_gemm"}, 316.1, 3),
    ("r50-64-gpu32", "fwd+bwd", 640.2, {"forward": "im2col_gemm", "grad_input": "im2col_gemm"}, 694.1, 9),
)

# The H100's pairs (case, pass, MEASURED H100 host us per call, choices, host_overhead.counts of the code measured,
# 98b8efe: calls, launches, allocations, scalars): benchmarks/results/gpu-2026-11-26-h100/bench.json["profile"]
# (autotune off -- the model's plan --, 10 calls enqueued with no synchronisation, best of 3) and the second run of
# the same tool in extra/host_profile-p8x8-c3d-r50.json, whose r50-64-gpu16 repeats the first run's: 101.4 us
# forward against 129.8 (the spread below holds both).  Calls and launches alone fit badly (0.75-1.88x): the
# tensor-core passes took 1.3-1.7x the depthwise, unfold and simt ones at the same counts.  What they have more of
# is scalar kernel arguments, which CuPy's launch wraps one by one on every call (a `CScalar`, cupy/cuda/function.pyx
# `_pointer`, v14.2.0; about 0.56 us each timed on this project's CPU): 75 a r50-64/p-seed fp16 forward against 15
# a depthwise one -- and allocations (5 against 1), collinear with them.  Fitted with both, a scalar costs 0.57 us
# (what the CPU timing says) and an allocation 2.9; the per-call constant came out negative (-0.01: 50-230 calls a
# call here do not pin it, where the H200's 125-700 did) and is left out, its cost in the launches'.  Spreads on
# these pairs: calls + launches 0.75-1.88, + allocations 0.82-1.58, + scalars 0.86-1.50, all four 0.84-1.52 (0.84-1.53 at the rounded constants).  Since
# 98b8efe a replay's launches are prepared (`_device.CudaDevice.launch_prepare`: scalars wrapped once), so
# host_overhead counts no scalars for a repeated call; the scalar counts below are the launches' scalar arguments
# (host_overhead with CUPYCONV_REPLAY=0), what 98b8efe's fast path wrapped on every call.  The widest miss is
# c3d-mri fwd+bwd (565.6 us, 1.53x its point: the 3-D weight gradient's lift, a CuPy copy among its 8 launches).
HOST_PAIRS_H100 = (
    ("r50-64-gpu16", "fwd", 129.8, {}, 80.1, 2, 5, 75),
    ("r50-64-gpu16", "fwd+bwd", 253.9, {}, 205.1, 5, 15, 169),
    ("p-seed-gpu16", "fwd", 101.3, {}, 80.1, 2, 5, 75),
    ("p-seed-gpu16", "fwd+bwd", 263.4, {}, 211.1, 6, 15, 179),
    ("iii-gpu32", "fwd", 36.7, {}, 55.1, 1, 1, 15),
    ("iii-gpu32", "fwd+bwd", 125.8, {}, 140.1, 4, 4, 47),
    ("dw-480-14-gpu16", "fwd", 35.9, {}, 55.1, 1, 1, 15),
    ("dw-480-14-gpu16", "fwd+bwd", 122.0, {}, 140.1, 4, 4, 47),
    ("iv-gpu16", "fwd", 34.3, {}, 49.1, 1, 1, 23),
    ("iv-gpu16", "fwd+bwd", 74.9, {}, 99.1, 2, 2, 41),
    ("r50-64-gpu32", "fwd", 73.0, {}, 61.1, 2, 2, 23),
    ("r50-64-gpu32", "fwd+bwd", 276.4, {}, 170.1, 8, 8, 70),
    ("dw-1152-7k5-gpu16", "fwd", 34.8, {}, 55.1, 1, 1, 15),
    ("dw-1152-7k5-gpu16", "fwd+bwd", 113.2, {}, 140.1, 4, 4, 47),
    ("dw-672-14k5-gpu32", "fwd", 36.6, {}, 55.1, 1, 1, 15),
    ("dw-672-14k5-gpu32", "fwd+bwd", 120.1, {}, 140.1, 4, 4, 47),
    ("p-8x8-gpu16", "fwd", 94.8, {}, 80.1, 2, 5, 75),             # extra/: the second run
    ("p-8x8-gpu16", "fwd+bwd", 237.8, {}, 211.1, 6, 15, 179),
    ("c3d-mri-gpu16", "fwd", 108.8, {}, 79.1, 2, 5, 77),
    ("c3d-mri-gpu16", "fwd+bwd", 565.6, {}, 234.1, 8, 18, 244),
    ("r50-64-gpu16", "fwd", 101.4, {}, 80.1, 2, 5, 75),
    ("r50-64-gpu16", "fwd+bwd", 257.1, {}, 205.1, 5, 15, 169),
)

# A model's constants, each times one of host_overhead.counts' figures; a pair gives as many as it has counts
HOST_TERMS = (("per_call_us", "calls"), ("per_launch_us", "launches"), ("per_allocation_us", "allocations"),
              ("per_scalar_us", "scalars"))


def fit_host(pairs=HOST_PAIRS) -> dict:
    """The host model's constants from measured pairs: one per count the pairs give (calls, launches, and
    allocations and scalars where given), minimising the relative error, and the spread (lowest, highest measured
    / fitted), rounded outward.  A constant that comes out negative is one the pairs cannot tell from the others:
    it is left out and the rest fitted again."""
    measured = numpy.array([p[2] for p in pairs])
    counts = numpy.array([p[4:] for p in pairs], dtype=float)
    terms = list(range(counts.shape[1]))
    while True:
        constants, *_ = numpy.linalg.lstsq(counts[:, terms] / measured[:, None], numpy.ones(len(pairs)), rcond=None)
        if constants.min() >= 0:
            break
        del terms[int(constants.argmin())]
    model = {HOST_TERMS[t][0]: round(float(c), 3 if HOST_TERMS[t][0] in ("per_call_us", "per_scalar_us") else 1)
             for t, c in zip(terms, constants)}
    ratios = measured / (counts[:, terms] @ list(model.values()))   # of the rounded constants, as predictions use
    return {**model, "spread": (math.floor(ratios.min() * 100) / 100, math.ceil(ratios.max() * 100) / 100)}


# fit_host() of each GPU's pairs, written out so that a change to the pairs shows in review (tests/test_predict_host.py
# checks they agree).  The H200's host was slower (its pairs at an older commit, with more calls a launch); its two
# constants price a launch's scalars and allocations into the launch, so it cannot see prepared launches shed them.
HOST_MODELS = {
    "h200": {"per_call_us": 0.334, "per_launch_us": 28.6, "spread": (0.91, 1.33)},
    "h100": {"per_launch_us": 22.5, "per_allocation_us": 2.9, "per_scalar_us": 0.572, "spread": (0.84, 1.53)},
}


def host_point(model: dict, counts: dict) -> float:
    """The model's host us for host_overhead.counts' figures (no spread)."""
    return sum(model[name] * counts.get(key, 0) for name, key in HOST_TERMS if name in model)


def host_prediction(case: cases_mod.Case, backward: bool, choices: dict[str, str] | None = None,
                    gpu_key: str = "h100") -> dict:
    """{"host_us": [low, high], "host_counts": {calls, launches, allocations}} for one case-pass on the current
    code and gpu_key's host model, or {"host_us": None, "host_why": ...} where the CPU instrument cannot run it."""
    from . import host_overhead
    try:
        counts = host_overhead.counts(case, backward, choices)
    except Exception as e:   # the instrument needs tests/emulator; a prediction without it keeps the GPU figures
        return {"host_us": None, "host_why": f"{type(e).__name__}: {e}"}
    model = HOST_MODELS[gpu_key]
    point = host_point(model, counts)
    low, high = model["spread"]
    return {"host_us": [round(point * low, 1), round(point * high, 1)], "host_counts": counts}


# ---------------------------------------------------------------------------------------------------------
# Kernel work: what one launch asks of each resource

# Kernels whose main loop holds a pass's multiply-adds (each does one whole pass of the convolution: forward,
# input gradient or weight gradient, all of equal MACs); every other kernel moves data (bias, reductions,
# im2col/col2im).
MAC_KERNELS = re.compile(r"^(conv_fwd_tc|conv_bwd_input_tc|conv_bwd_weight_tc|conv_fwd_igemm\w*|conv_bwd_weight_igemm|"
                         r"conv_bwd_weight_igemm_groups|conv_fwd_direct|conv_bwd_weight_direct|depthwise_fwd\w*|"
                         r"depthwise_bwd_input\w*|depthwise_bwd_weight\w*|patch_fwd|patch_bwd_input|"
                         r"patch_bwd_weight|patch_fwd_igemm|patch_bwd_weight_igemm|conv_fwd_wgmma|simt_fwd|simt_bwd_weight)$")
# The FMA implicit GEMM (simt_gemm.cu): its launches' multiply-adds come from their own arguments (`simt_macs`), not
# from a share of the pass: a 3-D backward interleaves its launches with others, and its tiles pad the GEMM.
SIMT_KERNELS = ("simt_fwd", "simt_bwd_weight")
TENSOR_CORE_KERNELS = ("conv_fwd_tc", "conv_bwd_input_tc", "conv_bwd_weight_tc", "conv_fwd_igemm",
                       "conv_fwd_igemm_groups", "conv_fwd_igemm_phases", "conv_fwd_igemm_3d", "conv_bwd_weight_igemm",
                       "conv_bwd_weight_igemm_groups", "patch_fwd_igemm", "patch_bwd_weight_igemm", "conv_fwd_wgmma")
# Kernels on wgmma (HGMMA, sm_90a): the tensor pipe at `wgmma_fraction` of the dtype's dense peak (TF32's for
# float), one HGMMA a 32-byte k step (m64nNk16 of a 16-bit type, m64nNk8 of tf32)
WGMMA_KERNELS = ("conv_fwd_wgmma",)
WGMMA_CHUNK_BYTES = 128   # conv_fwd_wgmma's K chunk: 64 halves, 32 floats (wgmma_gemm.py WGC_ROW_BYTES)
IGEMM_GROUPS_ROW_BYTES = 128   # conv_fwd_igemm_groups: a block's channels in bytes (implicit_gemm.py IGG_ROW_BYTES)
TC_CHUNK = 32
IGEMM_CHUNK_BYTES = 64   # conv_fwd_igemm's K chunk: 64 bytes of channels (32 halves, 16 floats; IG_ROW_BYTES)
# conv_bwd_weight_igemm (implicit_gemm.py WG_CHUNK): pixels per K chunk by element type; a fifth of its main loop's
# HMMA are the bias gradient's (A times ones, in the first warp column of the first column tile only)
WG_CHUNK = {"float": 16, "__half": 32, "__nv_bfloat16": 32}
WG_GEMM_HMMA_SHARE = {"float": 2 / 3, "__half": 4 / 5, "__nv_bfloat16": 4 / 5}   # TF32: 2 bias HMMA
# conv_bwd_weight_igemm_groups: its loop's GEMM HMMA per K step and warp are, 16-bit, 4 (groups of 16: 2 taps x 2
# n tiles) or 8 (of 32: 1 tap x 2 m x 4 n), + 1 or 2 of the bias; TF32 2 (1 tap x 2 n) + 2 of the bias
WGG_GEMM_HMMA_SHARE = {"float": 1 / 2, "__half": 4 / 5, "__nv_bfloat16": 4 / 5}
BYTES = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}


def access_bytes(opcode: str) -> int:
    """Bytes per lane of a load/store opcode: 'LDG.E.U16.CONSTANT' -> 2, 'STS.128' -> 16, 'LDS' -> 4;
    ldmatrix 'LDSM.16.M88.4' -> 16 (4 matrices of 8 x 8 16-bit)."""
    parts = opcode.split(".")
    if parts[0] == "LDSM":
        return 4 * int(parts[-1]) if parts[-1].isdigit() else 4
    for part in parts[1:]:
        if part in BYTES:
            return BYTES[part]
    return 4


@dataclass
class Range:
    low: float
    high: float

    def __add__(self, other):
        return Range(self.low + other.low, self.high + other.high)

    def scale(self, a: float, b: float | None = None) -> Range:
        return Range(self.low * a, self.high * (a if b is None else b))

    @property
    def mid(self) -> float:
        return math.sqrt(max(self.low, 1e-12) * max(self.high, 1e-12))

    def to_list(self, digits: int = 2) -> list:
        return [round(self.low, digits), round(self.high, digits)]


@dataclass
class KernelModel:
    """One launch: its memory accesses (`counters`: the emulator's counts, or the analytic model's terms, "source"
    says which), the work the model takes from them and from the SASS, and the time of each resource (us)."""
    launch: launches_mod.Launch
    sass: dict | None
    counters: dict
    work: dict
    occupancy: dict | None
    times: dict = field(default_factory=dict)   # resource -> Range (us)
    time: Range = field(default_factory=lambda: Range(0, 0))           # what the launch adds to its call
    kernel_time: Range = field(default_factory=lambda: Range(0, 0))    # the kernel's own GPU time (as CUPTI times it)
    bound: str = ""

    def to_dict(self) -> dict:
        launch = self.launch
        return {"name": launch.name, "source": launch.source,
                "launch": {"grid": list(launch.grid), "block": list(launch.block), "shared_mem": launch.shared_mem},
                "sass": self.sass, "occupancy": self.occupancy, "counters": self.counters,
                "work": self.work, "resources_us": {k: v.to_list(3) for k, v in self.times.items()},
                "predicted_us": self.time.to_list(), "kernel_us": self.kernel_time.to_list(), "bound": self.bound}


def compulsory_bytes(launch: launches_mod.Launch) -> tuple[int, int]:
    """(bytes read, bytes written) if every array argument is read (const) or written once; an array passed twice
    (a bias placeholder) is counted once."""
    seen, read, written = set(), 0, 0
    for (name, value), raw in zip(launch.args.items(), launch.raw_args):
        if not isinstance(value, launches_mod.ArrayArg):
            continue
        key = (getattr(raw, "ctypes", None) and raw.ctypes.data, value.nbytes)
        if key in seen:
            continue
        seen.add(key)
        if value.read_only:
            read += value.nbytes
        else:
            written += round(value.nbytes * phase_share(launch, name))
    return read, written


def phase_share(launch: launches_mod.Launch, name: str) -> float:
    """The share of output array `name` a launch writes: a phase of the strided input gradient (conv_fwd_igemm's
    out, or its final pass's grad_weight, given the whole grad_input) writes only its pixels of each plane of
    out_plane; 1 for everything else."""
    a = launch.args
    if launch.kernel == "conv_fwd_igemm" and name == "out" and a["out_plane"]:
        return a["out_h"] * a["out_w"] / a["out_plane"]
    if launch.kernel == "conv_bwd_weight_igemm_finish" and name == "grad_weight" and a["phase_width"] > 0:
        return a["channels_per_group"] / a["out_plane"]
    return 1.0


def split_chunks(launch: launches_mod.Launch, total: int) -> float:
    """K chunks one block of a split weight-gradient launch reduces, of `total`: its chunks_per_split when the grid
    has one split, else the mean over the grid's splits (the last one may be short)."""
    return min(launch.args["chunks_per_split"], total) if launch.grid[2] == 1 else total / launch.grid[2]


def tensor_core_macs(launch: launches_mod.Launch) -> int:
    """Multiply-adds the tensor cores execute in a tensor-core launch, padding of partial tiles included: every
    block runs its tile (rows x columns) over its K chunks of TC_CHUNK."""
    a = launch.args
    if launch.kernel == "conv_bwd_weight_igemm_groups":   # each group's CG x CG per tap (no MMA on a missing tap)
        chunk = WG_CHUNK[launch.template_args[0]]
        chunks = split_chunks(launch, math.ceil(a["n"] * a["out_h"] * a["out_w"] / chunk))
        channels = IGEMM_GROUPS_ROW_BYTES // (4 if launch.template_args[0] == "float" else 2)
        taps = a["kernel_h"] * a["kernel_w"]
        return int(launch.grid[1] * launch.grid[2] * channels * int(launch.template_args[2]) * taps * chunks * chunk)
    if launch.kernel == "patch_fwd_igemm":   # every group of patches: PT_ROWS rows x passes of PT_COLS columns x K
        groups = math.ceil(a["n"] / a["patches"])
        # (a pass of at most PT_COLS / 2 columns splits K over its warps, each over PT_COLS / 2 columns)
        columns = sum(PT_COLS if a["out_channels"] - n0 > PT_COLS // 2 else PT_COLS // 2
                      for n0 in range(0, a["out_channels"], PT_COLS))
        padded = math.ceil(a["channels"] / PT_STEP) * PT_STEP   # a tap's channels, padded to its K step
        return int(groups * PT_ROWS * columns * a["kernel_h"] * a["kernel_w"] * padded)
    if launch.kernel == "patch_bwd_weight_igemm":   # every group, every d tile: PW_ROWS rows x every unit's 16
        # columns x the group's pixels in steps of 16, and the bias's HMMA (8 columns) in the first unit tile
        out_plane, full = a["out_h"] * a["out_w"], a["n"] // a["patches"]
        k = full * math.ceil(a["patches"] * out_plane / 16) * 16
        k += math.ceil((a["n"] - full * a["patches"]) * out_plane / 16) * 16
        columns = a["channels"] // 16 * a["kernel_h"] * a["kernel_w"] * 16 + (8 if a["has_bias"] else 0)
        return int(math.ceil(a["out_channels"] / PW_ROWS) * PW_ROWS * columns * k)
    rows, cols = launch.template_args[2:4]
    if launch.kernel in ("conv_fwd_igemm", "conv_fwd_igemm_phases", "conv_fwd_igemm_3d"):   # K = taps x channels
        # per group, in chunks of 64 bytes, split over z (conv_fwd_igemm_phases: z is splits x phases; every block
        # counted as a phase with taps and rows: an upper bound; conv_fwd_igemm_3d: kernel_d taps more)
        chunk = IGEMM_CHUNK_BYTES // (4 if launch.template_args[0] == "float" else 2)
        splits = launch.grid[2] // (a["phases_h"] * a["phases_w"] if "phases_h" in a else 1)
        taps = a["kernel_h"] * a["kernel_w"] * a.get("kernel_d", 1)
        chunks = math.ceil(a["channels_per_group"] * taps / chunk) / splits
        return int(launch.blocks * int(rows) * int(cols) * chunks * chunk)
    if launch.kernel in WGMMA_KERNELS:   # every block its tile over all of K in chunks of 128 bytes (no split)
        chunk = WGMMA_CHUNK_BYTES // (4 if launch.template_args[0] == "float" else 2)
        chunks = math.ceil(a["channels_per_group"] * a["kernel_h"] * a["kernel_w"] / chunk)
        return int(launch.blocks * int(rows) * int(cols) * chunks * chunk)
    if launch.kernel == "conv_fwd_igemm_groups":   # BM x 64 outputs, each over its group's CG channels per tap
        taps = a["kernel_h"] * a["kernel_w"]
        channels = IGEMM_GROUPS_ROW_BYTES // (4 if launch.template_args[0] == "float" else 2)
        return int(launch.blocks * int(rows) * channels * int(cols) * taps)
    if launch.kernel == "conv_bwd_weight_igemm":
        chunk = WG_CHUNK[launch.template_args[0]]
        total = math.ceil(a["n"] * a["out_h"] * a["out_w"] / chunk)
        chunks = split_chunks(launch, total)   # (a mean: round, not truncate, its product back to whole MACs)
        return round(launch.blocks * int(rows) * int(cols) * chunks * chunk)
    if launch.kernel == "conv_bwd_weight_tc":
        total = math.ceil(a["n"] * a["out_h"] * a["out_w"] / TC_CHUNK)
        chunks = split_chunks(launch, total)
    elif launch.kernel == "conv_fwd_tc":
        chunks = math.ceil(a["channels_per_group"] * a["kernel_h"] * a["kernel_w"] / TC_CHUNK)
    else:
        chunks = math.ceil(a["outputs_per_group"] * a["kernel_h"] * a["kernel_w"] / TC_CHUNK)
    return int(launch.blocks * int(rows) * int(cols) * chunks * TC_CHUNK)


def simt_macs(launch: launches_mod.Launch) -> float:
    """Multiply-adds the FMA units execute in a simt_fwd / simt_bwd_weight launch, padding of partial tiles
    included: every block runs its tile (rows x columns, template arguments 3 and 4) over its K chunks."""
    a = launch.args
    rows, cols = int(launch.template_args[2]), int(launch.template_args[3])
    if launch.kernel == "simt_fwd":   # K = channels per group x taps, one pass over z = 1 (sm_80+'s chunk)
        chunk = simt_fwd_chunk(tuple(int(t) for t in launch.template_args[2:5]))
        chunks = math.ceil(a["channels_per_group"] * a["kernel_h"] * a["kernel_w"] / chunk)
    else:                             # K = the output pixels, in splits of chunks_per_split chunks over z
        chunk = SIMT_CHUNK
        total = math.ceil(a["n"] * a["out_h"] * a["out_w"] / chunk)
        chunks = split_chunks(launch, total)
    return launch.blocks * rows * cols * chunks * chunk


# The generic tiled depthwise kernels (depthwise.cu's depthwise_tiled) skip the taps that read outside the plane, per
# thread item: their launches count the multiply-adds they execute (`depthwise_clipped_macs`), not a share of the
# pass's (which counts every tap: a 31x31 kernel padded 15 on a 14x14 plane runs at most 17 x 14 of its 961).
TAP_CLIPPED_KERNELS = ("depthwise_fwd_generic", "depthwise_bwd_input_generic", "depthwise_fwd_planes",
                       "depthwise_bwd_input_planes")


def _tap_range(first: int, last: int, stride: int, pad: int, dilation: int, size: int, k: int) -> int:
    """How many taps of one kernel dimension read inside the plane for outputs first .. last (depthwise.cu's
    tap_range)."""
    before, after = pad - last * stride, size - 1 + pad - first * stride
    lo = 0 if before <= 0 else -(-before // dilation)
    hi = 0 if after < 0 else min(k, after // dilation + 1)
    return max(0, hi - lo)


def depthwise_clipped_macs(launch: launches_mod.Launch) -> float:
    """Multiply-adds of a TAP_CLIPPED_KERNELS launch: each thread item (GENERIC_STRIP rows of one column, all of its
    rows computed; one output in the _planes kernels) runs the taps of the union of its rows' ranges times its
    column's range, once per term."""
    from cupyconv.ops.depthwise import GENERIC_STRIP
    a = launch.args
    V = 1 if launch.kernel.endswith("_planes") else GENERIC_STRIP
    planes = a["channels"] * a["multiplier"]   # forward: C * m planes of one term; input gradient: C of m terms
    if launch.kernel.startswith("depthwise_fwd"):  # src = x, dst = y
        src, dst, stride = (a["height"], a["width"]), (a["out_h"], a["out_w"]), (a["stride_h"], a["stride_w"])
        pad = (a["pad_top"], a["pad_left"])
    else:  # stride 1: src = grad_out, dst = grad_x, the equivalent correlation's padding
        src, dst, stride = (a["out_h"], a["out_w"]), (a["height"], a["width"]), (1, 1)
        pad = ((a["kernel_h"] - 1) * a["dilation_h"] - a["pad_top"],
               (a["kernel_w"] - 1) * a["dilation_w"] - a["pad_left"])
    rows = sum(V * _tap_range(oy, min(oy + V, dst[0]) - 1, stride[0], pad[0], a["dilation_h"], src[0], a["kernel_h"])
               for oy in range(0, dst[0], V))
    cols = sum(_tap_range(ox, ox, stride[1], pad[1], a["dilation_w"], src[1], a["kernel_w"]) for ox in range(dst[1]))
    return float(a["images"] * planes * rows * cols)


# The weight gradients that skip taps outside the plane count what they execute as well (`depthwise_weight_macs`):
# depthwise_bwd_weight_large runs each tap row over the output rows it reaches, a warp as long as its longest lane,
# and depthwise_bwd_weight_generic's tiny-plane units (plane_channels > 0) run each tap over its box of outputs.
WEIGHT_CLIPPED_KERNELS = ("depthwise_bwd_weight_large", "depthwise_bwd_weight_generic")


def _outputs_inside(offset: int, stride: int, size: int, out: int, first: int = 0) -> int:
    """How many outputs o of first .. out - 1 read inside a plane of `size` at o * stride + offset."""
    lo = max(first, -(offset // stride))   # ceil(-offset / stride)
    hi = min(out, (size - 1 - offset) // stride + 1)
    return max(0, hi - lo)


def depthwise_weight_macs(launch: launches_mod.Launch) -> float | None:
    """Multiply-adds (lane slots) of a WEIGHT_CLIPPED_KERNELS launch; None for depthwise_bwd_weight_generic's tiled
    units, which run every tap (the pass's share counts them)."""
    from cupyconv.ops.depthwise import LARGE_RUN
    a = launch.args
    planes = a["channels"] * a["multiplier"]
    kh, kw = a["kernel_h"], a["kernel_w"]
    dy = [i * a["dilation_h"] - a["pad_top"] for i in range(kh)]
    if launch.kernel == "depthwise_bwd_weight_generic":
        if not a.get("plane_channels"):
            return None
        rows = sum(_outputs_inside(d, a["stride_h"], a["height"], a["out_h"]) for d in dy)
        cols = sum(_outputs_inside(j * a["dilation_w"] - a["pad_left"], a["stride_w"], a["width"], a["out_w"])
                   for j in range(kw))
        return float(a["images"] * planes * rows * cols)
    runs = math.ceil(kw / LARGE_RUN)
    tasks = kh * runs
    slices = launch.threads // tasks
    per_block, tile_h, tile_w = a["per_block"], a["tile_h"], a["tile_w"]
    total = 0
    for ty in range(a["tiles_y"]):
        oy0 = ty * tile_h
        lane_rows = []
        for t in range(launch.threads):
            task, slice_ = t % tasks, t // tasks
            k = task // runs
            i = kh // 2 + (-((k + 1) >> 1) if k & 1 else (k + 1) >> 1)
            span = _outputs_inside(dy[i] + oy0 * a["stride_h"], a["stride_h"], a["height"],
                                   min(tile_h, a["out_h"] - oy0))
            lane_rows.append(len(range(slice_, per_block * span, slices)) if slice_ < slices else 0)
        total += sum(32 * max(lane_rows[w:w + 32]) for w in range(0, launch.threads, 32))
    units = math.ceil(a["images"] / per_block) * a["tiles_x"]
    return float(total * units * planes * LARGE_RUN * tile_w)


def hmma_macs(launch: launches_mod.Launch) -> int:
    """MACs of one HMMA: m16n8k16 for 16-bit inputs, m16n8k8 for TF32; of one HGMMA, m64nNk16 or, TF32, m64nNk8
    (`wgmma_n`)."""
    k = 8 if launch.template_args[0] == "float" else 16
    if launch.kernel in WGMMA_KERNELS:   # each of the warpgroup's 4 warps issues it: a quarter each
        return 64 * wgmma_n(launch) * k // 4
    return 16 * 8 * k


def pass_macs(steps: list, case: cases_mod.Case) -> dict[int, float]:
    """{index of a MAC kernel's launch in steps: its multiply-adds}.  Each run of consecutive launches of one
    MAC kernel is one pass of the convolution (forward MACs: the input and weight gradients cost the same),
    shared by blocks; the FMA GEMM's and the tap-clipped depthwise kernels' launches count their own (`simt_macs`,
    `depthwise_clipped_macs`)."""
    total = cases_mod.flops(case) / 2
    result, i = {}, 0
    while i < len(steps):
        step = steps[i]
        if isinstance(step, launches_mod.Launch) and step.kernel in SIMT_KERNELS:
            result[i] = simt_macs(step)
            i += 1
        elif isinstance(step, launches_mod.Launch) and step.kernel in TAP_CLIPPED_KERNELS:
            result[i] = depthwise_clipped_macs(step)
            i += 1
        elif isinstance(step, launches_mod.Launch) and step.kernel in WEIGHT_CLIPPED_KERNELS and \
                (clipped := depthwise_weight_macs(step)) is not None:
            result[i] = clipped
            i += 1
        elif isinstance(step, launches_mod.Launch) and MAC_KERNELS.match(step.kernel):
            j = i
            while j + 1 < len(steps) and isinstance(steps[j + 1], launches_mod.Launch) and \
                    steps[j + 1].name == step.name:
                j += 1
            blocks = sum(steps[k].blocks for k in range(i, j + 1))
            for k in range(i, j + 1):
                result[k] = total * steps[k].blocks / blocks
            i = j + 1
        else:
            i += 1
    return result


def matrix_opcode(launch: launches_mod.Launch) -> str:
    return "HGMMA" if launch.kernel in WGMMA_KERNELS else "HMMA"


def wgmma_n(launch: launches_mod.Launch) -> int:
    """N of conv_fwd_wgmma's HGMMA: its block's rows x columns over its two warpgroups' 64 rows of M each (the
    channels: raw_kernels/wgmma_conv.cu), 128 for either tile."""
    return int(launch.template_args[2]) * int(launch.template_args[3]) // (2 * 64)


def wgmma_operand_wavefronts(launch: launches_mod.Launch, hgmma: float) -> float:
    """Shared-memory wavefronts of the operands wgmma reads by descriptor (no LDSM, and the emulator's counters do
    not see them): A 64 rows and B N rows of a 32-byte k step an HGMMA (16 elements of 2 bytes, 8 of tf32's 4; a
    warp's quarter of the warpgroup's), 128 bytes a wavefront."""
    return hgmma * (64 + wgmma_n(launch)) * 32 / 4 / 128


def analytic_counters(launch: launches_mod.Launch, sass: dict | None, macs: float) -> dict:
    """The work of one launch from its SASS main loop (`sass`, a KernelSass dict; None: no SASS) and its
    multiply-adds: warp instructions, HMMA and FMA instructions, global and shared requests, bytes and wavefronts,
    each a (low, high) pair where the access model is uncertain.  Labelled "analytic"."""
    read, written = compulsory_bytes(launch)
    warps = launch.blocks * math.ceil(launch.threads / 32)
    out = {"source": "analytic", "compulsory_bytes": read + written, "read_bytes": read, "written_bytes": written,
           "macs": macs}
    if launch.kernel in TENSOR_CORE_KERNELS:
        out["tensor_macs"] = tensor_core_macs(launch)
    if sass is None or not sass.get("loop"):
        # No SASS (tools missing) or no loop: a rough per-warp count, stated as such.
        out["note"] = "no SASS main loop: instructions guessed per warp (set-up + one element per lane)"
        static = sass["instructions"] if sass else 300
        out["warp_instructions"] = (warps * static * 0.5, warps * static * 2.0)
        out["fma_instructions"] = macs / 32
        out["hmma"] = out.get("tensor_macs", 0) / hmma_macs(launch) if "tensor_macs" in out else 0
        out["global_requests"] = (read + written) / 128
        out["global_bytes_requested"] = read + written
        out["shared_wavefronts"] = (0.0, 0.0)
        return out
    loop, memory = sass["loop"], sass["loop_memory"]
    rule = sass["loop_rule"]
    if rule == "matrix":
        share = {"conv_bwd_weight_igemm": WG_GEMM_HMMA_SHARE,
                 "conv_bwd_weight_igemm_groups": WGG_GEMM_HMMA_SHARE}.get(launch.kernel)
        gemm_hmma = loop.get(matrix_opcode(launch), 1) * (share[launch.template_args[0]] if share else 1)
        trips = out["tensor_macs"] / hmma_macs(launch) / gemm_hmma
    elif rule == "fma" and macs:
        lane_macs = loop.get("FFMA", 0) + loop.get("DFMA", 0) + 2 * loop.get("HFMA2", 0)
        trips = macs / 32 / lane_macs
    else:   # a data-movement kernel (an FMA in its loop is a bias add or a scale, not a convolution's MACs)
        per_trip = sum(access_bytes(op) * 32 * n for op, n in memory.items() if op.startswith(("LDG", "STG")))
        trips = (read + written) / per_trip if per_trip else warps
    lanes = assumption("simt_lane_efficiency") if rule != "matrix" else (1.0, 1.0)
    trips_range = (trips / lanes[0], trips / lanes[1])
    outside = max(0, sass["body_instructions"] - sum(loop.values()))
    share = assumption("non_loop_instructions")
    loop_instructions = sum(loop.values())
    out["loop_trips"] = trips_range
    out["loop_instructions"] = loop_instructions
    out["loop_waits_on_global"] = rule != "matrix" and any(op.startswith("LDG") for op in memory)
    out["warp_instructions"] = tuple(t * loop_instructions + warps * outside * s for t, s in zip(trips_range, share))
    out["hmma"] = trips * loop.get(matrix_opcode(launch), 0)
    out["fma_instructions"] = trips * (loop.get("FFMA", 0) + loop.get("HFMA2", 0))
    out["dfma_instructions"] = trips * loop.get("DFMA", 0)
    global_ops = {op: n for op, n in memory.items() if op.startswith(("LDG", "STG", "RED", "ATOM", "LDGSTS"))}
    shared_ops = {op: n for op, n in memory.items() if op.startswith(("LDS", "STS", "LDSM", "LDGSTS"))}
    out["global_requests"] = trips * sum(global_ops.values())
    out["global_bytes_requested"] = trips * sum(access_bytes(op) * 32 * n for op, n in global_ops.items())
    base = [0.0, 0.0]
    conflicts = assumption("shared_conflict_factor")
    for op, n in shared_ops.items():
        width = access_bytes(op)
        wavefronts = max(1.0, width * 32 / 128)
        narrow_store = op.startswith("STS") and width < 4
        high = conflicts[1] if narrow_store else (2.0 if width <= 4 else 1.0)
        base[0] += trips * n * wavefronts
        base[1] += trips * n * wavefronts * high
    out["shared_wavefronts"] = tuple(base)
    return out


# ---------------------------------------------------------------------------------------------------------
# The emulator's counters (tests/emulator), through one adapter


COUNTER_BLOCKS = 4   # blocks per launch the counters run, spread over the grid (first, interior, last)
# The counters' cost: the emulator runs some 25,000-150,000 warp instructions a second (the model's high estimate of
# them) on this project's busy 2-core machine.  A launch whose sample the model estimates above this many runs
# fewer blocks (down to 2), and one whose 2 blocks exceed it keeps the analytic model, labelled so (at this budget
# one kernel: p-8x8's fp32 weight gradient, ~3 million per block).  `--counter-budget`.
COUNTER_BUDGET = 2_500_000
COUNTED = ("requests", "lane_accesses", "sectors", "lines", "useful_bytes", "moved_bytes", "wavefronts")
ACCESS_KINDS = ("global_load", "global_store", "shared_load", "shared_store")


def launch_key(launch: launches_mod.Launch) -> tuple:
    """What a launch's counters depend on: the kernel, its configuration, its scalar arguments and each array's
    shape, strides, dtype and offset in its allocation (sectors count from an allocation's start); never the
    arrays' values.  Equal keys (the forward of a case's fwd and fwd+bwd passes) are counted once."""
    args = []
    for value in launch.raw_args:
        if isinstance(value, numpy.ndarray):
            root = value
            while isinstance(root.base, numpy.ndarray):
                root = root.base
            args.append((value.shape, value.strides, value.dtype.str, value.ctypes.data - root.ctypes.data))
        else:
            args.append(repr(value))
    return (launch.source, launch.name, launch.grid, launch.block, launch.shared_mem, tuple(args))


_COUNTER_CACHE: dict = {}


@functools.lru_cache(maxsize=None)
def counter_cache_file() -> Path:
    """Where counter runs are kept between commands (the h200 prediction reuses the h100 one's), named by a hash
    of what decides the counts: the kernels as compiled, the emulator's sources and this adapter."""
    emulator_dir = _emulator.TESTS / "emulator"
    adapter = "".join(inspect.getsource(f) for f in (emulated_counters, arrival_strata, arrivals_at, finish_splits))
    text = kernels_hash() + adapter + "".join(
        p.read_text(errors="replace") for p in sorted(emulator_dir.rglob("*")) if p.suffix in (".py", ".h", ".cpp"))
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    return _emulator.emulator().cache_root() / "predict-counters" / f"{key}.json"


def cached_counters(launch: launches_mod.Launch, blocks: int) -> dict:
    """`emulated_counters` through a cache in memory and on disk (`counter_cache_file`); failures are not kept."""
    key = repr((launch_key(launch), blocks))
    if not _COUNTER_CACHE:
        try:
            _COUNTER_CACHE.update(json.loads(counter_cache_file().read_text()))
        except (OSError, ValueError, ImportError):
            pass
    if key not in _COUNTER_CACHE:
        result = emulated_counters(launch, blocks)
        if "error" in result:
            return result
        _COUNTER_CACHE[key] = result
        try:
            path = counter_cache_file()
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps(_COUNTER_CACHE))
            partial.replace(path)
        except (OSError, ImportError):
            pass
    return _COUNTER_CACHE[key]


def counter_blocks(launch: launches_mod.Launch, work: dict, budget: int) -> tuple[int, str | None]:
    """(blocks to count, None), or (0, why not) when even 2 blocks are over `budget` warp instructions by the
    analytic model's (high) estimate of a block's; budget 0: no limit."""
    wanted = min(COUNTER_BLOCKS, launch.blocks)
    if not budget:
        return wanted, None
    per_block = work["warp_instructions"][1] / launch.blocks
    blocks = min(wanted, int(budget // per_block))
    if blocks < min(2, wanted):
        return 0, (f"too costly to emulate: ~{per_block:,.0f} warp instructions per block (the model's estimate), "
                   f"over the counter budget of {budget:,} for {min(2, wanted)} blocks (--counter-budget)")
    return blocks, None


def emulated_counters(launch: launches_mod.Launch, blocks: int = COUNTER_BLOCKS, device_factory=None) -> dict:
    """The emulator's memory counters of one launch: `blocks` blocks spread over the grid run on
    tests/emulator's `EmulatedDevice(counters=True, blocks=spread_blocks(blocks))` over the recorded arguments,
    and the LaunchProfile's sites are summed per kind and scaled to the whole grid by blocks / blocks_run.

    The one place that knows the counters' API.  Returns {"source": "emulator", "blocks_run", "grid_blocks",
    "scale", "kinds": {kind: totals over the grid and per-request ratios}, "sites": the sampled blocks' sites
    (not scaled)}, or {"error": why} where the emulator cannot be imported or the run fails.  Cached per
    device_factory: for tests, a callable (counters=, blocks=) -> device."""
    try:
        package = _emulator.emulator()
    except Exception as e:
        return {"error": f"tests/emulator cannot be imported: {type(e).__name__}: {str(e)[:200]}"}
    try:
        profiles = []   # (a stratum's profile, the stratum's blocks)
        for columns in counter_strata(launch):
            for arrived, share in arrival_strata(launch):
                device = (device_factory or package.EmulatedDevice)(counters=True,
                                                                    blocks=stratum_blocks(columns, blocks, package))
                device.launch(launch.source, launch.name, launch.grid, launch.block, arrivals_at(launch, arrived),
                              launch.shared_mem)
                profiles.append((device.profile[-1], len(columns) * math.prod(launch.grid[1:]) * share))
        profile = profiles[0][0] if len(profiles) == 1 else merged_profile(profiles, launch.blocks)
    except Exception as e:   # a counter run that fails leaves the analytic model in place, and says why
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    scale = launch.blocks / max(1, profile.blocks_run)
    kinds = {}
    for kind in ACCESS_KINDS:
        total = profile.total(kind)
        if not total.requests:
            continue
        entry = {name: getattr(total, name) * scale for name in COUNTED}
        entry.update(sectors_per_request=total.sectors_per_request, lines_per_request=total.lines_per_request,
                     wavefronts_per_request=total.wavefronts_per_request, sector_efficiency=total.sector_efficiency)
        if kind.startswith("shared"):
            for name in ("sectors", "lines", "moved_bytes", "sectors_per_request", "lines_per_request",
                         "sector_efficiency"):
                del entry[name]
        else:
            del entry["wavefronts"], entry["wavefronts_per_request"]
        kinds[kind] = entry
    return {"source": "emulator", "blocks_run": profile.blocks_run, "grid_blocks": launch.blocks, "scale": scale,
            "kinds": kinds, "sites": [site.to_dict() for site in profile.sites]}


def counter_strata(launch: launches_mod.Launch) -> list[range]:
    """The blockIdx.x ranges of a launch whose blocks differ in kind and work, each sampled and scaled on its own
    (an even spread over the whole grid would take the first and last blocks of channels_last_copies, often a small
    job's, for a quarter of the launch each): its jobs' [0, block_end0), [block_end0, block_end1), [block_end1, x);
    one range, the whole grid, for every other kernel."""
    if launch.kernel != "channels_last_copies":
        return [range(launch.grid[0])]
    ends = (0, int(launch.args["block_end0"]), int(launch.args["block_end1"]), launch.grid[0])
    return [range(a, b) for a, b in zip(ends, ends[1:]) if b > a]


# The split-K weight gradients finish their splits in the kernel (implicit_gemm.cu's wg_last_arrival, issue 24
# deliverable 5): the last block of each output tile to arrive reads every split's sums of the tile and writes the
# weight.  A sample of a few blocks never sees a tile's count reach its splits, so the counters run each launch
# twice: with every count at 0 (the blocks that arrive before the last: all but one split of each tile) and with
# every count at splits - 1 (each sampled block is its tile's last: the main loop and the tail), weighted by the
# share of the grid's blocks each stands for.
# So do the depthwise weight and bias gradients (depthwise.cu's finish_rows, task dwwg): their splits are the partial
# rows (`partial`'s first dimension; a one-element placeholder where there is one row, written straight), the tiles
# the channels (the tiny-plane units': groups of plane_channels) whose last block adds them, FINISH_ROWS rows a trip.
FINISHING_KERNELS = ("conv_bwd_weight_igemm", "conv_bwd_weight_igemm_groups")
DEPTHWISE_FINISHING = ("depthwise_bwd_weight", "depthwise_bwd_weight_generic", "depthwise_bwd_weight_planes",
                       "depthwise_bwd_weight_large", "depthwise_bwd_weight_lanes", "depthwise_bwd_bias")


def finish_splits(launch: launches_mod.Launch) -> tuple[int, int] | None:
    """(splits, tiles) of a launch whose last blocks finish its splits in the kernel (several splits), else None."""
    args = launch.args
    if launch.kernel in FINISHING_KERNELS:
        return (launch.grid[2], launch.grid[0] * launch.grid[1]) if launch.grid[2] > 1 and args.get("finish") else None
    if (launch.kernel not in DEPTHWISE_FINISHING or "arrivals" not in args   # (records from before: a reduce launch)
            or len(args["partial"].shape) < 2 or args["partial"].shape[0] < 2):
        return None
    channels = args["out_channels"] if "out_channels" in args else args["channels"] * args["multiplier"]
    group = args.get("plane_channels", 0)
    return args["partial"].shape[0], -(-channels // group) if group > 0 else channels


def finishes_in_kernel(launch: launches_mod.Launch) -> bool:
    """Whether the launch is a weight gradient's whose splits its last blocks finish (`finish_splits`)."""
    return finish_splits(launch) is not None


def arrival_strata(launch: launches_mod.Launch) -> list[tuple[int | None, float]]:
    """[(the arrival counts a counter run starts from (None: as recorded), the share of the blocks it stands for)]:
    for a finishing kernel with splits, (0, (splits - 1) / splits) and (splits - 1, 1 / splits)."""
    finishing = finish_splits(launch)
    if finishing is None:
        return [(None, 1.0)]
    splits = finishing[0]
    return [(0, (splits - 1) / splits), (splits - 1, 1 / splits)]


def arrivals_at(launch: launches_mod.Launch, arrived: int | None) -> list:
    """The launch's arguments with its arrival counts (the `arrivals` argument) all set to `arrived` (None: the
    arguments as recorded)."""
    if arrived is None:
        return launch.raw_args
    args = list(launch.raw_args)
    i = list(launch.args).index("arrivals")
    args[i] = numpy.full(args[i].shape, arrived, numpy.int32)
    return args


def finish_tail(launch: launches_mod.Launch, gpu: dict, splits_a_trip: int = 1, resident: int = 1) -> Range | None:
    """The time a finishing launch (`finishes_in_kernel`) spends after its main loops: the last block of
    each tile reads its splits' sums of the tile (`wg_finish`: a split after the other, every element's load of a
    split in flight at once) and writes the tile.  The grid runs in linear order, the last split's blocks last, so
    these tails follow the last wave, one SM per tile (more tiles than SMs: in turns), and add to the kernel's
    time in sequence: per tile the larger of a global load's latency per trip of `splits_a_trip` splits (the
    work's "finish_splits_a_trip", `weight_finish_splits`; 1 in work recorded before wg_finish read several) and
    its bytes at one SM's share of L2 (`l2_bytes_per_sm_clock`).  `resident`: the last blocks an SM runs at once
    whose tails overlap (the depthwise gradients' small blocks, a channel's last row each: `timed` passes their
    blocks an SM).  None for other launches."""
    finishing = finish_splits(launch)
    if finishing is None:
        return None
    splits, tiles = finishing
    tile_bytes = launch.args["partial"].nbytes / tiles   # every split's sums of one tile (on average)
    turns = math.ceil(tiles / (gpu["sms"] * max(1, resident)))
    trips = math.ceil(splits / splits_a_trip)
    latency, per_clock = assumption("global_load_latency_cycles"), assumption("l2_bytes_per_sm_clock")
    cycles = [max(trips * m, tile_bytes / b) * turns for m, b in zip(latency, per_clock)]
    return Range(cycles[0] / (gpu["clock_ghz"][1] * 1e9), cycles[1] / (gpu["clock_ghz"][0] * 1e9)).scale(1e6)


def stratum_blocks(columns: range, count: int, package):
    """The `blocks=` of an EmulatedDevice that runs `count` blocks spread over the blocks whose x is in columns
    (every y and z), in the linear order of `package.spread_blocks`."""
    spread = package.spread_blocks(count)

    def blocks(grid):
        _, y, z = (*grid, 1, 1)[:3]
        return [(columns[x], y, z) for x, y, z in spread((len(columns), y, z))]
    return blocks


def merged_profile(profiles: list, grid_blocks: int):
    """One profile of the strata's (`counter_strata`): each site's counts weighted by its stratum's blocks per
    block run, over the grid's blocks per block run in all, so that scaling the merged sample to the grid scales
    each stratum by its own blocks."""
    package = _emulator.emulator()
    blocks_run = sum(p.blocks_run for p, _ in profiles)
    merged: dict = {}
    for p, blocks in profiles:
        weight = (blocks / max(1, p.blocks_run)) / (grid_blocks / max(1, blocks_run))
        for site in p.sites:
            into = merged.setdefault((site.site, site.kind, site.width),
                                     package.SiteCounters(site.site, site.kind, site.width))
            for name in COUNTED:
                setattr(into, name, getattr(into, name) + getattr(site, name) * weight)
    first = profiles[0][0]
    return replace(first, blocks_run=blocks_run, sites=sorted(merged.values(), key=lambda s: (s.site, s.kind)))


def apply_counters(work: dict, counters: dict) -> dict:
    """The analytic work with its memory terms replaced by the emulator's counts, summed over the grid
    (instructions, HMMA and FMA stay the SASS model's)."""
    kinds = counters["kinds"]

    def total(kind: str, name: str) -> float:
        return kinds.get(kind, {}).get(name, 0)
    sectors = total("global_load", "sectors") + total("global_store", "sectors")
    useful = total("global_load", "useful_bytes") + total("global_store", "useful_bytes")
    return {**work, "source": "emulator",
            "global_requests": total("global_load", "requests") + total("global_store", "requests"),
            "global_lines": total("global_load", "lines") + total("global_store", "lines"),
            "global_sectors": sectors, "global_store_sectors": total("global_store", "sectors"),
            "global_bytes_requested": useful, "sector_efficiency": useful / (32 * sectors) if sectors else None,
            "shared_wavefronts": (total("shared_load", "wavefronts") + total("shared_store", "wavefronts"),) * 2}


# Where a launch's instruction count comes from (`--instructions`): "executed", what its sampled blocks ran
# (`benchmarks.executed`: the SASS's basic blocks with source lines, counted by the emulator's per-site warp
# requests), where the counters ran and the SASS has a line table, else the static main loop; "static": the
# static main loop always (`analytic_counters`).
INSTRUCTIONS = "executed"


def apply_executed(work: dict, sass: dict | None, counters: dict, launch: launches_mod.Launch) -> dict:
    """The work with its instruction terms replaced by `benchmarks.executed`'s estimate of what the launch runs,
    scaled from the sampled blocks to the grid: warp instructions (a point, no longer a range), FMA instructions,
    and per warp the instructions and global-load waits of its chain (the latency term).  Kept static, and says
    why, for kernels without the emulator's counts or a line table, and for the tensor-core kernels, whose
    main-loop trips are exact from their MACs and whose operands move by cp.async and ldmatrix, which anchor
    nothing (`executed.ANCHOR_KIND`)."""
    from . import executed
    why = ("no emulator counters" if counters.get("source") != "emulator" else
           "no SASS line table" if not (sass and sass.get("code")) else
           "tensor-core kernel (trips exact from its MACs)" if sass.get("loop_rule") == "matrix" else None)
    estimate = None
    if why is None:
        warps = counters["blocks_run"] * math.ceil(launch.threads / 32)
        estimate = executed.estimate(sass["code"], counters["sites"], warps)
        why = None if estimate else "no counted access site in its code"
    if estimate is None:
        return {**work, "instructions_source": "static", "instructions_why": why}
    scale = counters["scale"]
    total = estimate["instructions"] * scale
    fma = estimate["fma"]
    return {**work, "instructions_source": "executed", "warp_instructions": (total, total),
            "static_warp_instructions": work["warp_instructions"],
            "fma_instructions": (fma.get("FFMA", 0) + fma.get("HFMA2", 0)) * scale,
            "dfma_instructions": fma.get("DFMA", 0) * scale,
            "executed": {"per_warp": estimate["instructions"] / warps,
                         "global_waits_per_warp": estimate["global_waits"] / warps,
                         "anchored": estimate["anchored"]}}


def analytic_access_summary(work: dict, why: str) -> dict:
    """The `counters` of a kernel the emulator did not count: the analytic access model's terms and its assumed
    ranges, and why the emulator's counts are missing."""
    return {"source": "analytic", "why": why, "global_requests": work["global_requests"],
            "global_bytes_requested": work["global_bytes_requested"],
            "shared_wavefronts": list(work["shared_wavefronts"]),
            **({} if work.get("note") else {name: assumption(name) for name in (
                "sector_efficiency", "global_wavefronts_per_request", "shared_conflict_factor")})}


# ---------------------------------------------------------------------------------------------------------
# Times


def l1_wavefronts(work: dict) -> tuple[float, float]:
    """(low, high) wavefronts of the shared memory/L1 data path: the shared accesses' and, counted, one per 128-byte
    line each global request touches (else the assumed wavefronts per request)."""
    if work.get("source") == "emulator":
        global_wavefronts = (work["global_lines"], work["global_lines"])
    else:
        per_request = assumption("global_wavefronts_per_request")
        global_wavefronts = (work["global_requests"] * per_request[0], work["global_requests"] * per_request[1])
    shared = work["shared_wavefronts"]
    return shared[0] + global_wavefronts[0], shared[1] + global_wavefronts[1]


def kernel_times(work: dict, launch: launches_mod.Launch, occ, gpu: dict) -> dict[str, Range]:
    """{resource: Range of microseconds} of one launch's work on gpu (occ: its sass.Occupancy, or None)."""
    sms, sched = gpu["sms"], gpu["schedulers_per_sm"]
    clock_hi, clock_lo = gpu["clock_ghz"][1] * 1e9, gpu["clock_ghz"][0] * 1e9   # low time at the high clock
    us = 1e6
    times = {}
    warps_per_block = math.ceil(launch.threads / 32)
    # Blocks resident on a busy SM, and the waves of them: a partial last wave, or fewer blocks than SMs, leaves SMs
    # idle (the SM-throughput terms are scaled by `tail`).
    resident = min(occ.blocks_per_sm if occ else 1, math.ceil(launch.blocks / sms))
    waves = launch.blocks / (sms * resident)
    tail = math.ceil(waves) / waves if waves > 0 else 1.0
    if "tensor_macs" in work:
        dtype = {"__half": "float16", "__nv_bfloat16": "bfloat16", "float": "tf32"}[launch.template_args[0]]
        peak = gpu["tensor_tflops"][dtype] * 1e12
        fraction = assumption("wgmma_fraction" if launch.kernel in WGMMA_KERNELS else "mma_sync_fraction")
        flops = 2 * work["tensor_macs"]
        times["tensor pipe"] = Range(flops / (peak * fraction[0]), flops / (peak * fraction[1])).scale(us * tail)
    fma = work.get("fma_instructions", 0)
    dfma = work.get("dfma_instructions", 0)
    if fma or dfma:
        lanes = gpu["fp32_lanes_per_sm"]
        per_clock = sms * lanes / 32          # FFMA/HFMA2 warp instructions per clock, GPU-wide
        cycles = fma / per_clock + dfma / (per_clock / 2)
        times["FMA pipe"] = Range(cycles / clock_hi, cycles / clock_lo).scale(us * tail)
    instructions = work["warp_instructions"]
    efficiency = assumption("issue_efficiency")
    per_clock = sms * sched
    times["instruction issue"] = Range(instructions[0] / (per_clock * clock_hi * efficiency[0]),
                                       instructions[1] / (per_clock * clock_lo * efficiency[1])).scale(us * tail)
    # Latency: every warp runs its trips of the main loop one after another, each trip at least its instructions
    # times the cycles between two dependent instructions of one warp -- or, in a SIMT or elementwise loop that
    # loads from global memory, a global load's latency (the tensor-core loops prefetch their operands a chunk
    # ahead) -- and the waves of blocks run one after another.
    gap = assumption("cycles_between_independent_fma" if launch.kernel in SIMT_KERNELS
                     else "cycles_between_instructions")
    memory = assumption("global_load_latency_cycles")
    # A warp of one trip (one_pass), or one that waits for its own loads in every trip (in_turns), has no next
    # trip's loads in flight during this one: its loads' latency comes before the instructions that use them
    # (load, barrier, compute, store), not beside them.
    combine = (lambda a, b: a + b) if in_turns(work, launch) else max
    if work.get("executed"):
        # The executed count (`apply_executed`): each warp runs its own instructions one after another and waits a
        # global load's latency at each of its waits (a block that loads and uses the load), combined as above.
        executed = work["executed"]
        cycles = [combine(executed["per_warp"] * g, executed["global_waits_per_warp"] * m) * math.ceil(waves)
                  for g, m in zip(gap, memory)]
        times["latency"] = Range(cycles[0] / clock_hi, cycles[1] / clock_lo).scale(us)
    elif work.get("loop_trips") and work.get("loop_instructions"):
        warps = launch.blocks * warps_per_block
        trips = (work["loop_trips"][0] / warps, work["loop_trips"][1] / warps)
        waits = work.get("loop_waits_on_global", False)
        cycles = [t * combine(work["loop_instructions"] * g, m if waits else 0) * math.ceil(waves)
                  for t, g, m in zip(trips, gap, memory)]
        times["latency"] = Range(cycles[0] / clock_hi, cycles[1] / clock_lo).scale(us)
    # Shared memory and the L1 data path: one wavefront per clock per SM, shared by shared and global accesses
    # (counted: a global request takes one wavefront per 128-byte line it touches).
    l1 = l1_wavefronts(work)
    if l1[1]:
        times["shared memory/L1 wavefronts"] = Range(l1[0] / (sms * clock_hi), l1[1] / (sms * clock_lo)).scale(
            us * tail)
    # L2: low = only the compulsory bytes pass it; high = every requested sector misses L1.  Counted: L1 does not
    # keep stores (write-through), so every stored sector reaches L2 even at the low end.
    compulsory = work["compulsory_bytes"]
    if work.get("source") == "emulator":
        l2_low = max(compulsory, work["read_bytes"] + 32 * work["global_store_sectors"])
        l2_high = max(l2_low, 32 * work["global_sectors"])
    else:
        efficiency_low = assumption("sector_efficiency")[1]
        l2_low, l2_high = compulsory, max(compulsory, work["global_bytes_requested"] / efficiency_low)
    l2_bw = gpu["l2_tbs"]
    times["L2"] = Range(l2_low / (l2_bw[1] * 1e12), l2_high / (l2_bw[0] * 1e12)).scale(us)
    # DRAM: the compulsory bytes, re-read in part when L2 misses (the counters model no cache, so they cannot say
    # which); counted, never more than the sectors requested from L2.
    dram_eff, reread = assumption("dram_efficiency"), assumption("dram_reread")
    dram_high = compulsory * reread[1]
    if work.get("source") == "emulator":
        dram_high = max(compulsory, min(dram_high, l2_high))
    dram_low = dram_low_bytes(work, gpu)
    bw = gpu["hbm_tbs"] * 1e12
    times["DRAM"] = Range(dram_low * reread[0] / (bw * dram_eff[0]), dram_high / (bw * dram_eff[1])).scale(us)
    return times


def dram_low_bytes(work: dict, gpu: dict) -> float:
    """The bytes that must cross DRAM before the kernel ends, at the low end: its compulsory bytes, less the
    written bytes that fit in L2.  L2 is write-back, so those are written back during the kernels after it.
    MEASURED on the H100 (2026-11-26): iv fp16's unfold_im2col read 3.2 MB and wrote 28.9 MB in 9.9 us (8-9
    without the fixed time), 3.6-4.1 TB/s, above the HBM's 3.35: the writes did not all cross DRAM inside it."""
    written = work.get("written_bytes", 0)
    return work["compulsory_bytes"] - written + max(0, written - gpu["l2_mib"] * 2**20)


ONE_PASS_TRIPS = 2   # fewer main-loop trips per warp than this: its load, compute and store phases run once


def one_pass(work: dict, launch: launches_mod.Launch) -> bool:
    """Whether each warp runs its main loop fewer than ONE_PASS_TRIPS times (the depthwise kernels, the copies,
    unfold: 0.7-1.5 trips a warp), so that nothing of its own overlaps one phase with the next."""
    trips = work.get("loop_trips")
    warps = launch.blocks * math.ceil(launch.threads / 32)
    return bool(trips) and trips[0] / warps < ONE_PASS_TRIPS


def in_turns(work: dict, launch: launches_mod.Launch) -> bool:
    """Whether each warp's loads and compute take turns: a one-pass warp (`one_pass`), or one that waits for a
    global load of its own (`benchmarks.executed`'s waits: a load its own basic block uses) at least once in
    every trip of its main loop, so that no trip's loads were issued during the previous trip's compute.  The
    depthwise kernels that walk several units a block (stage the unit's tiles, barrier, compute, barrier, the
    next unit) are such: MEASURED on the H100 (2026-11-26), `depthwise_bwd_weight` of dw-672-14k5 fp32 (3-4
    units a warp) took 216.5 us and dw-480-14 fp16 44.9 us, 1.78x and 1.52x the high end of a model that let
    each warp's waits hide under its instructions.  Such a warp's waits and instructions add up (the latency
    term, `kernel_times`), and the SMs and memory take turns as in a one-pass kernel (`in_sequence_high`)."""
    if one_pass(work, launch):
        return True
    trips, executed = work.get("loop_trips"), work.get("executed")
    if not (trips and executed):
        return False
    warps = launch.blocks * math.ceil(launch.threads / 32)
    return executed["global_waits_per_warp"] >= trips[1] / warps


SIMT_FEW_WARPS = 2   # warps a scheduler at most, for `simt_in_sequence_high`
# The FMA GEMMs whose high end is `simt_in_sequence_high`: the weight gradient's, measured above its issue high end.
# simt_fwd's two H100 measurements sat inside it (r50-64-gpu32 243.7 us, 0.83 of 294.7; g8-256-gpu32's wall 134.9,
# 0.92 of 146.2), so it keeps that high end until one does not.
SIMT_SEQUENCE_KERNELS = ("simt_bwd_weight",)


def simt_in_sequence_high(work: dict, launch: launches_mod.Launch, gpu: dict) -> float:
    """The high end (us) of simt_bwd_weight, a register-blocked FMA GEMM whose registers leave SIMT_FEW_WARPS
    warps a scheduler (all its tiles): its busiest SM's instruction issue at full efficiency plus its shared
    memory/L1 wavefronts, in sequence, at the low clock.  Its loop meets a barrier every 8 k (2 stages, the B
    operand through registers and stored to shared memory after the FMAs), after which its warps run the next K
    step's float4 shared loads (20 wavefronts a warp at 96 x 64) in step: the SM's one wavefront a clock serves them
    in a burst while the FMAs that need them wait, with no third warp to issue.  MEASURED on the H100 (98b8efe,
    r50-64-gpu32): simt_bwd_weight <96, 64, 12> 263.9 us, 0.83 of this (issue 156 us + L1 163 us) and 1.17x its
    issue at 0.7 efficiency, the high end before.  The busiest SM runs ceil(blocks / SMs) blocks."""
    per_sm = math.ceil(launch.blocks / gpu["sms"]) / launch.blocks
    cycles = per_sm * (work["warp_instructions"][1] / gpu["schedulers_per_sm"] + l1_wavefronts(work)[1])
    return cycles / (gpu["clock_ghz"][0] * 1e9) * 1e6


SM_RESOURCES = ("tensor pipe", "FMA pipe", "instruction issue", "shared memory/L1 wavefronts", "latency")
MEMORY_RESOURCES = ("L2", "DRAM")


def in_lockstep(work: dict, launch: launches_mod.Launch, occ, gpu: dict) -> bool:
    """Whether every block of the launch runs at once (one wave) and its warps wait for their loads: at a barrier
    after staging them in shared memory (the kernel has shared wavefronts), or on a load of their own at least
    once (`benchmarks.executed`'s waits).  Then every warp of the GPU loads, waits and computes at about the same
    time, and nothing of another wave fills the SMs' waits or the memory's idle time (`in_sequence_high`)."""
    one_wave = launch.blocks <= gpu["sms"] * (occ.blocks_per_sm if occ else 1)
    waits = (work.get("executed") or {}).get("global_waits_per_warp", 0)
    return one_wave and (work["shared_wavefronts"][1] > 0 or waits >= 1)


def in_sequence_high(times: dict[str, Range], lockstep: bool = False) -> float:
    """The high end of a one-pass kernel (`one_pass`) whose SMs are busier than its memory: its busiest SM
    resource's time plus its busiest memory level's.  Every warp loads its tile, then computes, then stores, once;
    when the compute is the long phase, it cannot start before the loads and the stores wait for it, so the SMs
    and the memory take turns instead of working side by side.  Measured on the H200 (2026-11-26): every such
    depthwise kernel took 1.0-1.7x the larger high end (iii fp32 forward 10.9 us: issue 2.6-6.5, DRAM 2.9-4.2).
    A memory-bound one-pass kernel (unfold, the channels-last copy: 0.6-0.8x of the larger high end) keeps the
    larger time: the memory streams the warps' data in turn and each warp's short compute hides behind the
    others' loads.  Not so a kernel in lockstep (`in_lockstep`: one wave, its warps waiting for their loads),
    even when memory is its larger time: every warp loads at once, waits, then computes at once, and the SMs and
    the memory take turns either way (with later waves, a block's compute overlaps the loads of blocks that
    started later, as in the stream).  MEASURED on the H100 (2026-11-26): iii fp32's `depthwise_bwd_input`
    (512 blocks in one wave, staged) took 12.1 us where its issue (5.8 us) was just under its DRAM time (6.0)
    and the larger, 8.0 with the fixed cost, was predicted (`depthwise_fwd`, the same staging with its issue
    just over, 6.7, took 11.1 of its 14.7); iv fp16's `fold_col2im` (one wave, 9 loads in turn a warp, each
    waited for) took 23.1 us against its DRAM time's 17.0.  The low end keeps full overlap in both."""
    sm = max((times[k].high for k in SM_RESOURCES if k in times), default=0.0)
    memory = max((times[k].high for k in MEMORY_RESOURCES if k in times), default=0.0)
    return sm + memory if sm >= memory or lockstep else memory


def gemm_times(gemm: launches_mod.Gemm, gpu: dict) -> dict[str, Range]:
    """{resource: Range of us} of one cuBLAS call: its FLOPs at a fraction of the peak of its compute type,
    reduced for a GEMM with fewer 128 x 128 output tiles than SMs, or its compulsory bytes from DRAM."""
    if gemm.compute == "CUBLAS_COMPUTE_32F_FAST_TF32":
        peak, fraction, pipe = gpu["tensor_tflops"]["tf32"], assumption("cublas_fraction"), "tensor pipe (cuBLAS)"
    elif gemm.dtype in ("float16", "bfloat16"):
        peak, fraction, pipe = gpu["tensor_tflops"][gemm.dtype], assumption("cublas_fraction"), "tensor pipe (cuBLAS)"
    elif gemm.dtype == "float64":
        peak, fraction, pipe = gpu["fp64_tflops"], CUBLAS_FP32_FRACTION, "FMA pipe (cuBLAS)"
    else:
        peak, fraction, pipe = gpu["fp32_tflops"], CUBLAS_FP32_FRACTION, "FMA pipe (cuBLAS)"
    tiles = math.ceil(gemm.m / 128) * math.ceil(gemm.n / 128) * gemm.batch
    if tiles < gpu["sms"]:   # cuBLAS splits a long K over more blocks (split-K) when the output tiles are few
        tiles *= min(math.ceil(gemm.k / 1024), math.ceil(gpu["sms"] / tiles))
    fill = min(1.0, tiles / gpu["sms"])
    flops = gemm.flops
    times = {pipe: Range(flops / (peak * 1e12 * fraction[0] * fill), flops / (peak * 1e12 * fraction[1] * fill)
                         ).scale(1e6)}
    dram_eff = assumption("dram_efficiency")
    bw = gpu["hbm_tbs"] * 1e12
    times["DRAM"] = Range(gemm.bytes() / (bw * dram_eff[0]), gemm.bytes() / (bw * dram_eff[1])).scale(1e6)
    return times


def array_work_times(work: launches_mod.ArrayWork, gpu: dict) -> dict[str, Range]:
    """{resource: Range of us} of one array-library operation: its bytes from DRAM, compulsory at a streaming
    kernel's efficiency for the low end, the sectors its strides touch at `array_work_efficiency`'s high end."""
    eff, bw = assumption("array_work_efficiency"), gpu["hbm_tbs"] * 1e12
    return {"DRAM": Range(work.compulsory_bytes / (bw * eff[0]), work.moved_bytes / (bw * eff[1])).scale(1e6)}


TIE = 0.85   # resources within this factor of the binding one are named with it ("latency ~ issue")


def binding(times: dict[str, Range]) -> tuple[str, Range]:
    """(the resource that binds, the time range): each end is the largest of the resources' ends; the binding
    resource is the one with the largest geometric-mean time, followed by any within TIE of it (joined by ' ~ ',
    largest first): the model cannot tell those apart."""
    ranked = sorted(times, key=lambda k: times[k].mid, reverse=True)
    close = [k for k in ranked if times[k].mid >= TIE * times[ranked[0]].mid]
    return " ~ ".join(close), Range(max(t.low for t in times.values()), max(t.high for t in times.values()))


# ---------------------------------------------------------------------------------------------------------
# A case


class SassSource:
    """The SASS of the launched instantiations (`benchmarks.sass.analyse`, cached on disk), or None for every
    kernel where the tools are missing (`error` says why)."""

    def __init__(self, arch: str = "sm_90", enabled: bool = True):
        self.arch, self.enabled, self.error = arch, enabled, None if enabled else "disabled (--no-sass)"
        self.cache: dict = {}

    def prefetch(self, launches) -> None:
        """Compile every missing instantiation of each file in one program (far quicker than one at a time)."""
        if not self.enabled:
            return
        from . import sass
        by_file: dict = {}
        for launch in launches:
            if (launch.source, launch.name) not in self.cache:
                by_file.setdefault(launch.source, set()).add(launch.name)
        for filename, names in by_file.items():
            try:
                found = sass.analyse(filename, names, self.arch)
            except sass.ToolMissing as e:
                self.enabled, self.error = False, str(e)
                return
            for name, k in found.items():
                self.cache[filename, name] = k

    def get(self, launch):
        return self.cache.get((launch.source, launch.name))


def model_launch(launch, macs: float, sass_source: SassSource, gpu: dict, counters: bool,
                 counter_budget: int = COUNTER_BUDGET, instructions: str = INSTRUCTIONS) -> KernelModel:
    from . import sass as sass_mod
    k = sass_source.get(launch)
    sass = k.to_dict() if k is not None else None
    occ = None
    if k is not None:
        try:
            occ = sass_mod.occupancy(k.registers, launch.threads, k.static_shared + launch.shared_mem,
                                     sass_source.arch)
        except ValueError:
            occ = None
    work = analytic_counters(launch, sass, macs)
    blocks, too_costly = counter_blocks(launch, work, counter_budget)
    emulated = ({"error": "counters off (--quick or --counters off)"} if not counters else
                {"error": too_costly} if too_costly else cached_counters(launch, blocks))
    if "error" in emulated:
        accesses = analytic_access_summary(work, emulated["error"])
    else:
        work, accesses = apply_counters(work, emulated), emulated
    if launch.kernel in WGMMA_KERNELS:
        extra = wgmma_operand_wavefronts(launch, work["hmma"])
        work = {**work, "shared_wavefronts": tuple(w + extra for w in work["shared_wavefronts"])}
    work = apply_executed(work, sass, accesses, launch) if instructions == "executed" else \
        {**work, "instructions_source": "static", "instructions_why": "--instructions static"}
    if finishes_in_kernel(launch):   # the source's splits a trip of `wg_finish` (recorded: a re-timing keeps it)
        work = {**work, "finish_splits_a_trip": FINISH_ROWS if launch.kernel in DEPTHWISE_FINISHING else
                weight_finish_splits(launch.kernel, launch.template_args, launch.threads)}
    model = KernelModel(launch, sass, accesses, work, None if occ is None else {
        "blocks_per_sm": occ.blocks_per_sm, "warps_per_sm": occ.warps_per_sm, "limited_by": occ.limited_by,
        "fraction": round(occ.fraction, 3)})
    return timed(model, occ, gpu)


TIMED_KEYS = ("one_pass", "in_turns", "finish_tail_us")   # what `timed` adds to a launch's work


def timed(model: KernelModel, occ, gpu: dict) -> KernelModel:
    """The model with its times, bound and kernel time set from its launch and work (occ: anything with
    `blocks_per_sm`, or None): every rule of the model that turns counts into time, and nothing that counts (the
    SASS, the emulator), so that `benchmarks.calibrate`'s check can re-time recorded work quickly."""
    launch, work = model.launch, model.work
    model.times = kernel_times(work, launch, occ, gpu)
    model.bound, body = binding(model.times)
    if in_turns(work, launch):
        body = Range(body.low, max(body.high, in_sequence_high(model.times, in_lockstep(work, launch, occ, gpu))))
        # its high end: the SM's and memory's times in sequence
        model.work = {**work, **({"one_pass": True} if one_pass(work, launch) else {"in_turns": True})}
    elif (launch.kernel in SIMT_SEQUENCE_KERNELS and occ
          and occ.warps_per_sm <= SIMT_FEW_WARPS * gpu["schedulers_per_sm"]):
        # its high end: issue and shared-memory bursts in sequence
        sequence = simt_in_sequence_high(work, launch, gpu)
        body = Range(body.low, max(body.high, sequence))
        model.work = {**work, "simt_in_sequence_us": round(sequence, 2)}
    resident = occ.blocks_per_sm if occ and launch.kernel in DEPTHWISE_FINISHING else 1
    tail = finish_tail(launch, gpu, work.get("finish_splits_a_trip", 1), resident)
    if tail is not None:   # after the last wave (`finish_tail`): in sequence with the body
        body = body + tail
        model.work = {**model.work, "finish_tail_us": tail.to_list()}
    fixed, overhead = assumption("kernel_fixed_us"), assumption("launch_overhead_us")
    model.kernel_time = body + Range(*fixed)
    model.time = model.kernel_time + Range(*overhead)
    if model.time.mid > 0 and fixed[0] + overhead[0] > max(t.low for t in model.times.values()):
        model.bound = "launch overhead"
    return model


def floor_us(case: cases_mod.Case, backward: bool, gpu: dict) -> tuple[float, str]:
    """The case's floor on gpu's data-sheet figures (`cases.roofline`): max(FLOPs / peak, floor bytes / HBM)."""
    if case.tensor_cores:
        peak = gpu["tensor_tflops"]["tf32" if case.tf32 else case.dtype]
    else:
        peak = gpu["fp32_tflops"] if case.dtype == "float32" else gpu["fp64_tflops"]
    r = cases_mod.roofline(case, backward, None, peak * 1e12, gpu["hbm_tbs"] * 1e12)
    return r["floor_ms"] * 1e3, r["floor_bound"]


def predict_case(case: cases_mod.Case, backward: bool, gpu_key: str, sass_source: SassSource,
                 counters: bool, counter_budget: int = COUNTER_BUDGET, choices: dict[str, str] | None = None,
                 instructions: str = INSTRUCTIONS, inputs: list | None = None) -> dict:
    """The prediction of one case-pass; `inputs`, where given, receives per kernel what `timed` re-times it from
    (`benchmarks.calibrate.model_inputs`)."""
    gpu = GPUS[gpu_key]
    recording = launches_mod.record(case, backward, choices=choices)
    sass_source.prefetch(recording.launches)
    macs = pass_macs(recording.steps, case)
    kernels, total = [], Range(0, 0)
    for i, step in enumerate(recording.steps):
        if isinstance(step, (launches_mod.Gemm, launches_mod.ArrayWork)):
            gemm = isinstance(step, launches_mod.Gemm)
            times = gemm_times(step, gpu) if gemm else array_work_times(step, gpu)
            bound, body = binding(times)
            kernel_time = body + Range(*assumption("kernel_fixed_us"))
            time = kernel_time + Range(*assumption("launch_overhead_us"))
            entry = {"name": "cuBLAS gemmStridedBatchedEx" if gemm else f"CuPy {step.kind}", "launch": step.to_dict(),
                     "counters": None, "resources_us": {k: v.to_list(3) for k, v in times.items()},
                     "predicted_us": time.to_list(), "kernel_us": kernel_time.to_list(), "bound": bound}
        else:
            model = model_launch(step, macs.get(i, 0.0), sass_source, gpu, counters, counter_budget, instructions)
            time, entry = model.time, model.to_dict()
        if inputs is not None:
            inputs.append(entry if "launch" not in entry or "work" not in entry else
                          {"name": entry["name"], "launch": step.to_dict(), "occupancy": entry["occupancy"],
                           "work": {k: v for k, v in entry["work"].items() if k not in TIMED_KEYS}})
        kernels.append(entry)
        total = total + time
    floor, floor_bound = floor_us(case, backward, gpu)
    host = host_prediction(case, backward, choices, gpu_key)
    wall = ([round(max(g, h), 2) for g, h in zip(total.to_list(), host["host_us"])] if host["host_us"] else
            total.to_list())
    heaviest = max(kernels, key=lambda k: math.sqrt(k["predicted_us"][0] * k["predicted_us"][1]), default=None)
    return {"case": case.label, "pass": recording.pass_, "op": case.op, "dtype": case.precision, "gpu": gpu_key,
            "kernels": kernels, "predicted_us": total.to_list(), **host, "wall_us": wall,
            "host_bound": bool(host["host_us"]) and host["host_us"][0] > total.high, "floor_us": round(floor, 2),
            "floor_bound": floor_bound,
            "bound": f"{heaviest['bound']} ({heaviest['name'].split('<')[0]})" if heaviest else None,
            "x_floor": [round(total.low / floor, 2), round(total.high / floor, 2)] if floor else None,
            "accesses": sorted({k["counters"]["source"] for k in kernels if k.get("counters")}),
            "prediction": True}


def kernels_hash() -> str:
    """A hash of every raw_kernels/ source as compiled (headers inlined): a prediction made at another hash
    describes other kernels."""
    from cupyconv import _device
    text = "".join(_device.kernel_source(f) for f in sorted(_device.kernel_files()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def meta(gpu_key: str, counters: bool, sass_source: SassSource, counter_budget: int = COUNTER_BUDGET) -> dict:
    return {"prediction": "PREDICTION: no GPU measurement", "gpu": gpu_key, "gpu_constants": GPUS[gpu_key],
            "git_commit": git_commit(), "kernels_sha": kernels_hash(),
            "sources": SOURCES, "assumptions": {k: {"range_low_time_high_time": v[0], "what": v[1]}
                                                for k, v in ASSUMPTIONS.items()},
            "cublas_fp32_fraction": CUBLAS_FP32_FRACTION, "counters": "emulator where available" if counters else
            "analytic access model only", "counter_blocks": f"up to {COUNTER_BLOCKS} blocks per launch spread over the grid "
            "(emulator.spread_blocks), totals scaled by grid blocks / blocks run; fewer, or the analytic model, where "
            f"the sample would exceed the counter budget of {counter_budget:,} warp instructions" if counters else None, "sass": sass_source.error or f"NVRTC 13 SASS for {sass_source.arch}",
            "command": "python -m benchmarks.predict " + " ".join(sys.argv[1:])}


BRIEF_SITE = {"global": ("site", "kind", "width", "requests", "sectors_per_request", "sector_efficiency"),
              "shared": ("site", "kind", "width", "requests", "wavefronts_per_request")}


def brief_counters(counters: dict | None) -> dict:
    """A kernel's counters, shorter: the emulator's totals and per-request ratios per access kind and each site's
    ratios (requests of the sampled blocks), or the analytic model's source and why the emulator's counts are
    missing."""
    if not counters:
        return {"source": "cuBLAS model"}
    if counters["source"] != "emulator":
        return {"source": counters["source"], "why": counters.get("why")}
    sites = [{k: round(v, 3) if isinstance(v, float) else v for k, v in site.items()
              if k in BRIEF_SITE[site["kind"].split("_")[0]]} for site in counters["sites"]]
    kinds = {kind: {k: round(v, 3) if isinstance(v, float) else v for k, v in entry.items()}
             for kind, entry in counters["kinds"].items()}
    return {**counters, "kinds": kinds, "sites": sites}


def brief(result: dict) -> dict:
    """A result without the per-kernel SASS, work and resource times, and with its counters in short
    (`brief_counters`): what RESULTS.md and gpu_check need."""
    kernels = [{"name": k["name"], "launch": k["launch"], "counters": brief_counters(k.get("counters")),
                "bound": k["bound"], "predicted_us": k["predicted_us"],
                **({"kernel_us": k["kernel_us"]} if "kernel_us" in k else {}),
                **({"one_pass": True} if (k.get("work") or {}).get("one_pass") else {})} for k in result["kernels"]]
    return {**result, "kernels": kernels}


# ---------------------------------------------------------------------------------------------------------
# Calibration: measured against predicted


def gpu_of(name: str | None) -> str | None:
    """The model's GPU key for a device name ("NVIDIA H100 80GB HBM3" -> "h100"), None for one it does not model."""
    name = (name or "").upper()
    return next((key for key in ("h200", "h100") if key.upper() in name), None)


def calibration(bench: dict, predictions: dict) -> list[dict]:
    """Per case-pass that benchmarks.run measured (`bench`, its JSON) and the model predicted (`predictions`, a
    --json file): cupyconv's measured median next to the predicted range, and the model's error, measured /
    predicted low and high ("inside" when the measurement falls within the range), and the same against the
    predicted wall time, max(GPU, host) ("wall_us", "measured_over_wall", "inside_wall"; the GPU range again
    where the predictions have no host model).  A case label with a suffix
    ("p-seed-gpubf16@cpu", a smoke run on the CPU) is matched by the label before it."""
    predicted = {(r["case"], r["pass"]): r for r in predictions.get("results", [])}
    rows = []
    for r in bench.get("results", []):
        ours = r.get("contenders", {}).get("cupyconv", {})
        p = predicted.get((r["case"].split("@")[0], r["pass"]))
        if p is None or ours.get("status") != "ok" or not ours.get("median_ms"):
            continue
        measured = ours["median_ms"] * 1e3
        low, high = p["predicted_us"]
        wall_low, wall_high = p.get("wall_us") or (low, high)   # predictions made before the host model: the GPU's
        rows.append({"case": r["case"], "pass": r["pass"], "measured_us": round(measured, 2),
                     "predicted_us": [low, high], "host_us": p.get("host_us"), "wall_us": [wall_low, wall_high],
                     "bound": "host" if p.get("host_bound") else p["bound"], "floor_us": p["floor_us"],
                     "measured_over_predicted": [round(measured / low, 3), round(measured / high, 3)],
                     "inside": low <= measured <= high,
                     "measured_over_wall": [round(measured / wall_low, 3), round(measured / wall_high, 3)],
                     "inside_wall": wall_low <= measured <= wall_high})
    return rows


def _span(values: list | None, digits: int = 1) -> str:
    return "-".join(f"{v:.{digits}f}" for v in values) if values else "n/a"


def table(results: list[dict]) -> str:
    lines = [f"{'case':<18} {'pass':<8} {'dtype':<13} {'GPU us':>17} {'host us':>13} {'wall us':>17} {'floor us':>9} "
             f"{'x floor':>13}  bound (kernel)"]
    for r in results:
        xl, xh = r["x_floor"] or (float("nan"), float("nan"))
        lines.append(f"{r['case']:<18} {r['pass']:<8} {r['dtype']:<13} {_span(r['predicted_us']):>17} "
                     f"{_span(r.get('host_us'), 0):>13} {_span(r.get('wall_us')):>17} {r['floor_us']:>9.1f} "
                     f"{xl:>6.1f}-{xh:<6.1f}  {'host' if r.get('host_bound') else r['bound']}")
    return "\n".join(lines)


def markdown(results: list[dict]) -> str:
    """The table as Markdown, for benchmarks/RESULTS.md."""
    lines = ["| case | pass | dtype | predicted GPU us | predicted host us | predicted wall us | floor us | x floor | "
             "binding resource (kernel) | kernels |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        xl, xh = r["x_floor"]
        names = ", ".join(k["name"].split("<")[0].replace("cuBLAS gemmStridedBatchedEx", "GEMM") for k in r["kernels"])
        lines.append(f"| {r['case']} | {r['pass']} | {r['dtype']} | {_span(r['predicted_us'], 0)} | "
                     f"{_span(r.get('host_us'), 0)} | {_span(r.get('wall_us'), 0)}{' (host)' if r.get('host_bound') else ''} | "
                     f"{r['floor_us']:.1f} | {xl:.1f}-{xh:.1f} | {r['bound']} | {names} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated GPU case labels or tags (default: all)")
    parser.add_argument("--pass", dest="passes", choices=("fwd", "fwd+bwd", "both"), default="both")
    parser.add_argument("--gpu", choices=sorted(GPUS), default="h100")
    parser.add_argument("--json", type=Path, help="write {meta, results} here")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (for RESULTS.md)")
    parser.add_argument("--quick", action="store_true", help="no emulator counter runs: the analytic access model")
    parser.add_argument("--counters", choices=("auto", "off"), default="auto",
                        help="auto: the emulator's counters where tests/emulator has them (slow: it runs sampled "
                             "blocks of every kernel); off: the analytic access model")
    parser.add_argument("--counter-budget", type=int, default=COUNTER_BUDGET, metavar="N",
                        help="the most warp instructions (the model's estimate) a launch's counted blocks may run; "
                             f"costlier launches keep the analytic model; 0: no limit (default {COUNTER_BUDGET:,})")
    parser.add_argument("--no-sass", action="store_true", help="do not compile the kernels (no instruction mix)")
    parser.add_argument("--instructions", choices=("executed", "static"), default=INSTRUCTIONS,
                        help="executed: each launch's instructions as its counted blocks ran them (benchmarks.executed; "
                             "static where it cannot); static: the SASS main loop's static count per trip "
                             f"(default {INSTRUCTIONS})")
    parser.add_argument("--choices", default="", metavar="PASS=ALGO,...",
                        help="model these algorithms instead of the 'auto' heuristic's, where they are candidates "
                             "(PASS: forward, grad_input, grad_weight), e.g. an autotuned GPU run's plan: "
                             "--choices forward=direct,grad_weight=im2col_gemm")
    parser.add_argument("--brief", action="store_true", help="JSON without per-kernel SASS, counters and resource "
                                                             "times (the form of benchmarks/results/predict-*.json)")
    args = parser.parse_args(argv)
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    selected = cases_mod.select(wanted, ("gpu",))
    if not selected:
        parser.error(f"no GPU case matches --cases {args.cases!r}; see python -m benchmarks.run --list")
    counters = args.counters == "auto" and not args.quick
    sass_source = SassSource(enabled=not args.no_sass)
    passes = {"fwd": (False,), "fwd+bwd": (True,), "both": (False, True)}[args.passes]
    try:
        choices = dict(item.split("=", 1) for item in args.choices.split(",") if item)
    except ValueError:
        parser.error(f"--choices takes PASS=ALGORITHM pairs separated by commas, not {args.choices!r}")
    results = [predict_case(case, backward, args.gpu, sass_source, counters, args.counter_budget, choices,
                            args.instructions) for case in selected for backward in passes]
    info = meta(args.gpu, counters, sass_source, args.counter_budget)
    info["instructions"] = args.instructions
    used = sorted({source for r in results for source in r["accesses"]})
    info["counters"] = ("emulator counters" if used == ["emulator"] else
                        "analytic access model (no emulator counters)" if "emulator" not in used else
                        "emulator counters where they ran, else the analytic access model")
    print(f"PREDICTION (no GPU measurement) for {GPUS[args.gpu]['name']}; SASS: {info['sass']}; accesses: "
          f"{info['counters']}")
    print(markdown(results) if args.markdown else table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        written = [brief(r) for r in results] if args.brief else results
        args.json.write_text(json.dumps({"meta": info, "results": written}, indent=None if args.brief else 1,
                                        default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
