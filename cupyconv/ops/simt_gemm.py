"""The strict float32 implicit GEMMs of conv2d on the FMA units (raw_kernels/simt_gemm.cu): forward, stride-1 input
gradient (the forward of the transposed problem) and weight gradient, in IEEE float32 (no tensor cores, no TF32)
and without a column matrix.

Not an op of its own: ops/conv.py runs its 'implicit_gemm' passes here for float32 while TF32 is off (where the
tensor cores refuse), and its 'auto' picks them pass by pass over im2col + GEMM where the model ranks them ahead
(`simt_preferred`: the column matrix they never build costs cuBLAS more than their slower GEMM costs them).
The table of the GEMMs is at the top of simt_gemm.cu.
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy

from .. import settings
from .._kernels import (INDEX_TYPES, INT32_MAX, MAX_GRID, PLAN_SMS, KernelFile, batch_args, batch_view, extent,
                        index_type, kernel_name, split_reduction)
from .._device import _address
from .._spec import ConvSpec, ceil_div, transposed_spec

# Block tiles (rows, columns of C, rows per thread TM; each thread TM x 8 of C, so BM * BN / (8 TM) threads):
# 128 x 64 x 8 in general, 256 x 64 x 16 from SIMT_TALL_ROWS rows.  Over 64 columns (output channels; input
# channels for the input gradient) TM = 16, 128 x 128 x 16, or 256 x 128 x 16 from SIMT_TALL_ROWS rows; the
# weight gradient's 128 x 128 x 16.  TM = 16: every float read from shared memory feeds more FMAs (24 loads per
# 128 FMAs instead of 16 per 64) and the per-chunk decoding, loop and barrier are paid once per 1,024 FFMA of a
# thread, not 512: fewer loop instructions per FFMA, the binding resource by benchmarks.predict (sm_90: forward
# 1.29 -> 1.23 at 128 x 128, 1.19 at 256 x 128; weight gradient 1.45 -> 1.32).  The tall tiles need many rows
# to keep enough blocks.  Groups of at most SIMT_NARROW_COLUMNS take 128 x 32 x 8 (64 threads), so that no FMA is
# spent on padding columns (ResNeXt's and g8's groups of 32 took half their FMAs on a 64-column tile's padding);
# the weight gradient's 64 x 32 x 8 where 64-row tiles pad fewer rows than 128-row ones (288 = 32 x 9: 320 rows,
# not 384).  The weight gradient's 33-64 columns take 96 x 64 x 12 (TM = 12: 1.49 loop instructions a FFMA, not
# 1.55) unless 96-row tiles pad more rows than 128-row ones: 288 and 576 rows (32 and 64 channels x 3 x 3) fill
# 96-row tiles exactly, 128-row ones pad 33% and 11% (its bias gradient is no GEMM row, so rows are C / G x taps);
# where the 96-row tiles come in pairs (576 rows: r50-64, c3d-*) each pair is one 192 x 64 x 12 tile (128 threads,
# the forward's SIMT_TALL_FIT), if the pixels split into SIMT_FIT_WEIGHT_BLOCKS blocks an SM (`plan_simt`): every
# grad_out element a block loads feeds 192 rows, not 96, so it loads, sums and stores half the B elements a FFMA
# and reads half the 128-byte lines of grad_out, and at 168 registers (int; 201 for 96 x 64 x 12) an SM runs 12 of
# its warps, not 8, so a scheduler has a third warp to issue while two wait for the shared loads after a barrier.
# The forward weighs two tiles for at most 64 columns (`simt_fwd_tile`): below SIMT_TALL_ROWS rows 33-64 columns
# take 128 x 64 x 8 or two column tiles of 128 x 32 x 8; from SIMT_TALL_ROWS rows 256 x 64 x 16 or 192 x 64 x 12
# (SIMT_TALL_FIT), and at most 32 columns 256 x 32 x 16 (SIMT_TALL_NARROW) or 128 x 32 x 8.  The order of each tuple
# is the instantiations' and the tests', not a preference: `simt_tile` is the rule.
SIMT_TILE, SIMT_TALL, SIMT_WIDE, SIMT_TALL_WIDE = (128, 64, 8), (256, 64, 16), (128, 128, 16), (256, 128, 16)
SIMT_NARROW, SIMT_NARROW_SHORT, SIMT_SHORT, SIMT_TALL_NARROW = (128, 32, 8), (64, 32, 8), (96, 64, 12), (256, 32, 16)
SIMT_TALL_FIT = (192, 64, 12)
SIMT_TILES = {"forward": (SIMT_TILE, SIMT_TALL, SIMT_NARROW, SIMT_TALL_WIDE, SIMT_WIDE, SIMT_TALL_NARROW,
                          SIMT_TALL_FIT),
              "weight": (SIMT_TILE, SIMT_NARROW, SIMT_NARROW_SHORT, SIMT_WIDE, SIMT_SHORT, SIMT_TALL_FIT)}
# `simt_fwd_tile` weighs the forward's tiles that fit a GEMM's columns against each other by the busiest SM's work
# as benchmarks.predict times it (`simt_sm_work`): a partial last wave, or too few blocks for every SM, leaves SMs
# idle.  SIMT_SMS: a 132-SM H100 (or H200), a shape-only constant like SIMT_MIN_BLOCKS.  SIMT_BLOCKS_AN_SM: each
# tile's resident blocks an SM (sm_90, int; tests/test_sass.py holds them to the compiled occupancy): 256 x 64 x 16
# and 192 x 64 x 12 2 of 128 threads (251 and 209 registers), 128 x 64 x 8 4 of 128 (128), 256 x 32 x 16 and
# 128 x 32 x 8 4 of 64 (241 and 211).  The costs are a tile's main-loop instructions a FFMA (sm_90, NVRTC 13)
# relative to the other candidate's:
# - SIMT_TALL_FIT_COST: 192 x 64 x 12 1.213 to 256 x 64 x 16's 1.180.  r50-64's 100,352 rows make 392 blocks of 256:
#   1.48 waves, the second half empty (the model's tail 1.35); 523 blocks of 192 are 1.98 waves;
# - SIMT_NARROW_FIT_COST: 128 x 32 x 8 1.399 to 256 x 32 x 16's 1.315.  p-seed's input gradient (327,680 rows, 32
#   input channels) made 1,280 blocks of 256 rows: 2.42 waves, its last with 58% of the SMs idle; 2,560 of 128 are
#   4.85 waves;
# - SIMT_SPLIT_COST: 128 x 32 x 8 1.399 to 128 x 64 x 8's 1.320, for 33-64 columns in two column tiles of 32 below
#   SIMT_TALL_ROWS rows.  ii's 25,088 rows made 196 blocks of 128 x 64, two on 64 SMs and one on 68 (2 x 64 columns
#   on the busiest), 392 of 128 x 32 are 3 x 32 x 1.06; i's 256 blocks keep 128 x 64 (2 x 64 against 4 x 32 x 1.06).
# (Those counts are task simt32's. The tap table's next-entry cursor of the tiles of four warps or more, task
# simtfp, took them to 1.171 for 192 x 64 x 12, 1.157 for 256 x 64 x 16 and 1.285 for 128 x 64 x 8, and 128 x 32 x 8
# and 256 x 32 x 16 to 1.375 and 1.292: ratios of 1.01, 1.06 and 1.07, which pick the same tiles for every
# benchmark case; the constants are kept.)
SIMT_SMS = PLAN_SMS
SIMT_BLOCKS_AN_SM = {SIMT_TALL: 2, SIMT_TALL_FIT: 2, SIMT_TILE: 4, SIMT_TALL_NARROW: 4, SIMT_NARROW: 4}
SIMT_TALL_FIT_COST, SIMT_NARROW_FIT_COST, SIMT_SPLIT_COST = 1.03, 1.06, 1.06
SIMT_NARROW_COLUMNS = 32
SIMT_TALL_ROWS = 64 * 1024
SIMT_MAX_THREADS = 256     # simt_fwd's __launch_bounds__: its largest tile's threads (simt_bwd_weight's: 128)
SIMT_PASSES = {"forward": "simt_fwd", "weight": "simt_bwd_weight"}   # the input gradient runs simt_fwd
SIMT_CHUNK = 8             # simt_gemm.cu's SIMT_BK: the K (reduction) chunk
# simt_fwd's chunk on sm_80+ (its operands by cp.async), simt_gemm.cu simt_fwd_chunk: 16 for these tiles (the loop's
# per-chunk upkeep paid per 2,048 FFMA of a thread), SIMT_CHUNK for the others and on sm_70 (register-staged).
# SIMT_LONG_CHUNK is also simt_gemm.cu's SIMT_WEIGHT_K_ALIGN: `simt_weight_t` pads K to a multiple of every chunk.
SIMT_LONG_CHUNK, SIMT_LONG_CHUNK_TILES = 16, (SIMT_TALL, SIMT_NARROW, SIMT_TALL_FIT)
SIMT_MAX_REACH = 2**30     # rows past the end of C sit 2^30 pixels before the image (simt_fwd)
SIMT_MASK_BITS = 31        # simt_fwd's window masks: a bit per kernel row and column, one more for k past K
SIMT_SPLIT_BLOCKS = 512    # the weight gradient splits its pixels until about this many blocks run (a fixed
SIMT_SPLIT_CHUNKS = 32     # number, not the SM count, so the bits depend on the shapes only), each this many chunks
# 192 x 64 x 12's blocks an SM in the weight gradient (simt_gemm.cu simt_weight_min_blocks: 168 registers, int;
# `plan_simt` splits for them)
SIMT_FIT_WEIGHT_BLOCKS = 3
# 'auto' (`simt_preferred`): the forward and input gradient run here from SIMT_MIN_BLOCKS blocks with at most
# SIMT_MAX_COLUMNS columns a group; the weight gradient with at most SIMT_WEIGHT_MAX_COLUMNS, or where cuBLAS's GEMM
# would have fewer than SIMT_FEW_GEMM_TILES output tiles.  SIMT_MIN_BLOCKS is a shape-only constant: since the
# masked gather (2026-11-26) the model ranks the FMA GEMM 8% ahead of im2col + cuBLAS at 196 blocks (ii: r50-64's
# layer at batch 8; it was 3-5% behind), so the bound went from 264 (two waves of a 132-SM H100) to 192
# (benchmarks/results/auto-fp32-h100.json); r50-512's 52 blocks stay on cuBLAS
SIMT_MIN_BLOCKS, SIMT_MAX_COLUMNS, SIMT_FEW_GEMM_TILES = 192, 64, 10
# The weight gradient's column bound: the executed-instruction model (2026-11-26) ranks the FMA weight gradient level
# with cuBLAS at 128 columns a group (g2-256: 0.95 of cuBLAS's time), where the static count had it behind.
SIMT_WEIGHT_MAX_COLUMNS = 128
KERNELS = KernelFile("simt_gemm.cu", defines={"SIMT_MAX_THREADS": SIMT_MAX_THREADS})


def simt_fwd_chunk(tile: tuple[int, int, int]) -> int:
    """The K chunk of simt_fwd's `tile` (rows, columns, rows per thread) on sm_80 and newer."""
    return SIMT_LONG_CHUNK if tuple(tile) in SIMT_LONG_CHUNK_TILES else SIMT_CHUNK


def instantiations():
    return [kernel_name(kernel, "float32", index, *tile) for pass_, kernel in SIMT_PASSES.items()
            for index, tile in itertools.product(INDEX_TYPES, SIMT_TILES[pass_])]


# --- plans ------------------------------------------------------------------------------------------------

def simt_refusal(spec: ConvSpec, dtype, pass_: str = "forward") -> str | None:
    """Why the FMA implicit GEMMs cannot run this pass ('forward', 'input' or 'weight'), or None when they can."""
    name = numpy.dtype(dtype).name
    if name != "float32":
        return f"the FMA implicit GEMMs take float32, not {name}"
    if pass_ == "input" and spec.stride != (1, 1):
        return f"their input gradient is the stride-1 transposed convolution, and the stride is {spec.stride}"
    plane = max(spec.in_size[0] * spec.in_size[1], spec.out_pixels)
    if plane > INT32_MAX:
        return f"they index a plane's pixels in 32 bits, and this plane has {plane}"
    reach = max(d * (k - 1) for k, d in zip(spec.kernel_size, spec.dilation))
    if reach >= SIMT_MAX_REACH:
        return f"they take a kernel reach, dilation x (kernel size - 1), below 2^30 pixels, not {reach}"
    if pass_ != "weight" and sum(spec.kernel_size) > SIMT_MASK_BITS:
        return (f"their forward and input gradient take a kernel height + width of at most {SIMT_MASK_BITS} (a bit "
                f"per window row and column), not {sum(spec.kernel_size)}")
    reduction = max(spec.channels_per_group, spec.outputs_per_group) * spec.taps
    if reduction > INT32_MAX:
        return f"they index a weight row (channels per group x taps) in 32 bits, and it has {reduction}"
    columns = max(spec.channels_per_group, spec.outputs_per_group)
    if spec.groups * ceil_div(columns, 64) > MAX_GRID[1]:
        return f"they take at most {MAX_GRID[1]} groups x column tiles, not {spec.groups} groups of {columns}"
    return None


def simt_runs(spec: ConvSpec, dtype, pass_: str = "forward") -> bool:
    """Whether 'implicit_gemm' runs this pass here: float32 with TF32 off (the tensor cores' case otherwise)."""
    return not settings.get_allow_tf32() and simt_refusal(spec, dtype, pass_) is None


def simt_preferred(spec: ConvSpec, dtype, pass_: str = "forward") -> bool:
    """The 'auto' rule between these kernels and im2col + cuBLAS (strict float32), from the performance model's
    ranking of the benchmark cases (`python -m benchmarks.auto_check`, PREDICTIONS; tests/test_auto_choice.py
    holds the rule to it).  cuBLAS's GEMM is faster than these (1.2-1.8 instructions an FFMA here), so they win
    where the column matrix, which they never build, costs cuBLAS more than that:
    - forward and input gradient: the columns would be larger than the input (a 3x3 stride-1 column matrix is 9x
      the input, written and read again; a pointwise conv has none), the GEMM has at most SIMT_MAX_COLUMNS
      columns a group (output channels; input channels for the input gradient: cuBLAS uses each column element
      that many times, so the matrix costs 8 / columns bytes a multiply-add, as much DRAM time as FMA time at 64
      on an H100, with its 10 multiply-adds a byte), and SIMT_MIN_BLOCKS blocks (no split of K here: r50-512's
      7x7 planes with 512 channels make 52 blocks and leave most SMs idle);
    - weight gradient: either the same column saving with at most SIMT_WEIGHT_MAX_COLUMNS columns (the 32-column tiles,
      or 96 x 64 x 12, whose bias gradient is no GEMM row: c3d-video's and c3d-mri's 64 columns are predicted
      8-10% ahead of cuBLAS since; at most 32 columns before), or a GEMM too small for cuBLAS to fill the GPU --
      under SIMT_FEW_GEMM_TILES output tiles of 128 x 128 over a long reduction (the weight's own size), which
      these split SIMT_SPLIT_BLOCKS ways.  The model ranked these ahead at 8 tiles (ct2d-k2s2: 256 x 512), level
      at 5-9 (r50-64, r50-128) and behind at 12-14 (c1d-audio; c3d-* before the 96-row tile), hence 10."""
    if not simt_runs(spec, dtype, pass_):
        return False
    columns_outgrow_input = spec.taps * spec.out_pixels > spec.in_size[0] * spec.in_size[1]
    if pass_ == "weight":
        rows, cols = spec.channels_per_group * spec.taps, spec.outputs_per_group
        gemm_tiles = spec.groups * ceil_div(rows, 128) * ceil_div(cols, 128)
        return (columns_outgrow_input and cols <= SIMT_WEIGHT_MAX_COLUMNS) or gemm_tiles < SIMT_FEW_GEMM_TILES
    # the forward of the transposed problem for the input gradient: rows are input pixels, columns C / G
    rows, cols, _ = simt_gemm_shape(transposed_spec(spec) if pass_ == "input" else spec, "forward")
    # Blocks of 128 rows a group (the count SIMT_MIN_BLOCKS was fitted to: the tile of every plan of at most 64
    # columns below SIMT_TALL_ROWS rows until `simt_fwd_tile` split 33-64 columns in two; from SIMT_TALL_ROWS rows
    # there are at least 256 blocks either way), so that the choice of tile does not move 'auto'.
    blocks = ceil_div(rows, SIMT_TILE[0]) * spec.groups
    return columns_outgrow_input and cols <= SIMT_MAX_COLUMNS and blocks >= SIMT_MIN_BLOCKS


@dataclasses.dataclass(frozen=True)
class SimtPlan:
    """One launch: the block tile (rows, columns of C, rows per thread), the grid (row tiles, groups x column
    tiles, splits) and, for the weight gradient, the pixels of each split in chunks of SIMT_CHUNK."""
    tile: tuple[int, int, int]
    grid: tuple[int, int, int]
    chunks_per_split: int = 0

    @property
    def threads(self) -> int:
        return self.tile[0] * self.tile[1] // (8 * self.tile[2])   # TM x 8 outputs per thread

    @property
    def splits(self) -> int:
        return self.grid[2]


def simt_gemm_shape(spec: ConvSpec, pass_: str) -> tuple[int, int, int]:
    """(rows M, columns N, reduction K) of one group's GEMM ('forward' or 'weight'; the input gradient is the
    forward of `conv.transposed_spec`)."""
    cg, dg, taps, out_pixels = spec.channels_per_group, spec.outputs_per_group, spec.taps, spec.n * spec.out_pixels
    return {"forward": (out_pixels, dg, cg * taps), "weight": (cg * taps, dg, out_pixels)}[pass_]


def simt_sm_work(tile: tuple[int, int, int], blocks: int, cost: float = 1.0) -> float:
    """The busiest SM's work in a launch of `blocks` blocks of `tile` (a forward tile of SIMT_BLOCKS_AN_SM), as
    benchmarks.predict times it: the blocks resident on an SM at once, times their waves counted whole (a partial
    last wave, like too few blocks for every SM, leaves SMs idle), times a block's rows x columns x `cost` (its
    loop's instructions a FFMA, relative)."""
    resident = min(SIMT_BLOCKS_AN_SM[tile], ceil_div(blocks, SIMT_SMS))
    return ceil_div(blocks, SIMT_SMS * resident) * resident * tile[0] * tile[1] * cost


def simt_fwd_tile(rows: int, cols: int, groups: int = 1) -> tuple[int, int, int]:
    """The forward's tile for `groups` GEMMs of `rows` x `cols`: over 64 columns 128 x 128 x 16 (256 x 128 x 16 from
    SIMT_TALL_ROWS rows); else of the two tiles that fit the columns, the one whose busiest SM works less
    (`simt_sm_work`; on a tie the first): at most 32 columns 128 x 32 x 8, from SIMT_TALL_ROWS rows 256 x 32 x 16 or
    128 x 32 x 8; 33-64 columns 128 x 64 x 8 or 128 x 32 x 8 in two column tiles, from SIMT_TALL_ROWS rows 256 x 64 x
    16 or 192 x 64 x 12.  Each output is summed over k in the same order on every tile: the same bits whichever."""
    tall = rows >= SIMT_TALL_ROWS
    if cols > 64:
        return SIMT_TALL_WIDE if tall else SIMT_WIDE
    if cols <= SIMT_NARROW_COLUMNS:
        choices = [(SIMT_TALL_NARROW, 1.0), (SIMT_NARROW, SIMT_NARROW_FIT_COST)] if tall else [(SIMT_NARROW, 1.0)]
    elif tall:
        choices = [(SIMT_TALL, 1.0), (SIMT_TALL_FIT, SIMT_TALL_FIT_COST)]
    else:   # two 32-column tiles a group only where grid.y takes them
        choices = [(SIMT_TILE, 1.0)] + ([(SIMT_NARROW, SIMT_SPLIT_COST)] if 2 * groups <= MAX_GRID[1] else [])
    return min(choices, key=lambda choice: simt_sm_work(
        choice[0], ceil_div(rows, choice[0][0]) * groups * ceil_div(cols, choice[0][1]), choice[1]))[0]


def simt_tile(pass_: str, rows: int, cols: int, groups: int = 1) -> tuple[int, int, int]:
    """The block tile of a GEMM of `rows` x `cols` per group, `groups` of them ('forward' or 'weight'): a plain
    rule of the shapes (see SIMT_TILES)."""
    if pass_ != "weight":
        return simt_fwd_tile(rows, cols, groups)
    if cols > 64:
        return SIMT_WIDE
    if cols <= SIMT_NARROW_COLUMNS:
        return SIMT_NARROW_SHORT if ceil_div(rows, 64) * 64 < ceil_div(rows, 128) * 128 else SIMT_NARROW
    if ceil_div(rows, 96) * 96 > ceil_div(rows, 128) * 128:
        return SIMT_TILE
    return SIMT_TALL_FIT if ceil_div(rows, 96) % 2 == 0 else SIMT_SHORT


def plan_simt(spec: ConvSpec, pass_: str) -> SimtPlan:
    """The tile and grid of simt_fwd ('forward') or simt_bwd_weight ('weight').  The weight gradient's few output
    tiles share its long reduction in splits (each written to its own float32 slice of a workspace within the
    workspace limit, added up in order afterwards) until about SIMT_SPLIT_BLOCKS blocks run; 192 x 64 x 12 until
    SIMT_FIT_WEIGHT_BLOCKS / 4 of them (three blocks an SM where the others run four), and only where they do: its 12
    warps an SM need that many blocks, and fewer leave its busiest SMs more work than the 96-row tiles' (ii: 294
    blocks, the splits held to SIMT_SPLIT_CHUNKS chunks), which the GEMM takes instead."""
    rows, cols, reduction = simt_gemm_shape(spec, pass_)
    tile = simt_tile(pass_, rows, cols, spec.groups)
    blocks = (ceil_div(rows, tile[0]), spec.groups * ceil_div(cols, tile[1]))
    if pass_ != "weight":
        return SimtPlan(tile, (*blocks, 1))
    chunks, split_bytes = max(1, ceil_div(reduction, SIMT_CHUNK)), spec.out_channels * (rows + 1) * 4
    if tile == SIMT_TALL_FIT:
        target = SIMT_SPLIT_BLOCKS * SIMT_FIT_WEIGHT_BLOCKS // 4
        splits, per_split = split_reduction(chunks, blocks[0] * blocks[1], target, SIMT_SPLIT_CHUNKS, split_bytes)
        if splits * blocks[0] * blocks[1] >= target:
            return SimtPlan(tile, (*blocks, splits), per_split)
        tile, blocks = SIMT_SHORT, (ceil_div(rows, SIMT_SHORT[0]), blocks[1])
    splits, per_split = split_reduction(chunks, blocks[0] * blocks[1], SIMT_SPLIT_BLOCKS, SIMT_SPLIT_CHUNKS,
                                        split_bytes)
    return SimtPlan(tile, (*blocks, splits), per_split)


# --- launches ---------------------------------------------------------------------------------------------

def _check(spec: ConvSpec, dtype, pass_: str):
    refusal = simt_refusal(spec, dtype, pass_)
    if refusal:
        raise ValueError(f"{spec.op}: algorithm='implicit_gemm' cannot run in strict float32: {refusal}")


def simt_gemm_gpu(device, xv, weight, bias, spec: ConvSpec, out):
    """simt_fwd: out (n, D, oH, oW) contiguous from xv, a batch view (outer, inner, C, H, W) of x
    (`_kernels.batch_view`), weight (D, C / G, kH, kW), bias (D,) or None."""
    g, dg = spec.groups, spec.outputs_per_group
    weight_t = weight.reshape(g, dg, -1).transpose(0, 2, 1)   # (G, C / G * taps, D / G), a view
    return simt_fwd_launch(device, xv, weight_t, bias, spec, out)


def simt_weight_t(device, weight_t, tile: tuple[int, int, int]):
    """B of simt_fwd from weight_t (G, K..., N), any strides, K the product of the middle axes: C-contiguous
    (G, K, N) zero-padded to K rounded up to SIMT_LONG_CHUNK and N to whole column tiles of `tile`, 16-byte
    aligned, so that its copies need no predicate and go 16 bytes at a time (simt_gemm.cu SIMT_WEIGHT_K_ALIGN,
    `SimtForward::b_copy_chunk`).  One copy, as before, where nothing is padded (the benchmark cases' weights); a
    fill and a copy where something is."""
    g, n, k = weight_t.shape[0], weight_t.shape[-1], weight_t.size // max(1, weight_t.shape[0] * weight_t.shape[-1])
    rows, cols = ceil_div(k, SIMT_LONG_CHUNK) * SIMT_LONG_CHUNK, ceil_div(n, tile[1]) * tile[1]
    if (rows, cols) == (k, n):
        out = device.ascontiguous(weight_t).reshape(g, k, n)
        if _address(out) % 16 == 0:
            return out
    out = device.zeros((g, rows, cols), weight_t.dtype) if (rows, cols) != (k, n) else device.empty((g, k, n),
                                                                                                     weight_t.dtype)
    device.copyto(out[:, :k, :n].reshape(weight_t.shape), weight_t)
    return out


def simt_fwd_launch(device, xv, weight_t, bias, spec: ConvSpec, out):
    """simt_fwd with the weight transposed per group: weight_t (G, C / G * taps, D / G), the middle axis possibly
    split, any strides (`simt_weight_t` makes the kernel's B of it)."""
    _check(spec, xv.dtype, "forward")
    plan = plan_simt(spec, "forward")
    weight_t = simt_weight_t(device, weight_t, plan.tile)
    KERNELS.launch(device, "simt_fwd", plan.tile, dtype=xv.dtype,
                   index=index_type(extent(xv), out.size, weight_t.size), grid=plan.grid, block=plan.threads,
                   window=spec, x=xv, weight_t=weight_t,
                   bias=weight_t if bias is None else device.ascontiguous(bias),
                   out=out, n=spec.n, **batch_args("x", xv), groups=spec.groups,
                   channels_per_group=spec.channels_per_group, outputs_per_group=spec.outputs_per_group,
                   has_bias=bias is not None)
    return out


def simt_gemm_grad_input(device, gy, weight, spec: ConvSpec, transposed: ConvSpec, out):
    """grad_input of a stride-1 conv into out (n, C, H, W) contiguous: simt_fwd on `transposed` (the transposed
    problem, `conv.transposed_spec(spec)`) with gy (n, D, oH, oW) contiguous and the weight flipped: its B is
    weight[d][c][kH - 1 - i][kW - 1 - j] at k = (d, i, j), n = c, i.e. (G, D / G, kH, kW, C / G) in memory."""
    _check(spec, gy.dtype, "input")
    g, dg, cg, (kh, kw) = spec.groups, spec.outputs_per_group, spec.channels_per_group, spec.kernel_size
    flipped = weight.reshape(g, dg, cg, kh, kw)[:, :, :, ::-1, ::-1].transpose(0, 1, 3, 4, 2)
    gyv = batch_view(device, gy.reshape(spec.n, spec.out_channels, *spec.out_size))
    return simt_fwd_launch(device, gyv, flipped, None, transposed, out)


def simt_gemm_grad_weight(device, xv, gy, spec: ConvSpec, bias: bool = False):
    """simt_bwd_weight: (grad_weight (D, C / G, kH, kW), grad_bias (D,) when `bias`, else None), float32, from xv,
    a batch view of x, and gy (n, D, oH, oW) contiguous.  grad_bias is written by the kernel too, after each split's
    weight (the column sums of gy its first row tile loaded).  The splits' float32 sums are added in split order
    (the same bits on every run), and grad_weight and grad_bias are contiguous views of that sum: no copies."""
    _check(spec, xv.dtype, "weight")
    plan = plan_simt(spec, "weight")
    weight_size = spec.out_channels * spec.channels_per_group * spec.taps
    partial = device.empty((plan.splits, weight_size + bias * spec.out_channels), numpy.float32)
    KERNELS.launch(device, "simt_bwd_weight", plan.tile, dtype=xv.dtype,
                   index=index_type(extent(xv), gy.size, partial.size), grid=plan.grid, block=plan.threads,
                   window=spec, x=xv, grad_out=gy, partial=partial, n=spec.n, **batch_args("x", xv),
                   groups=spec.groups, channels_per_group=spec.channels_per_group,
                   outputs_per_group=spec.outputs_per_group, chunks_per_split=plan.chunks_per_split,
                   bias_row=int(bias))
    total = partial[0] if plan.splits == 1 else device.sum(partial, 0, numpy.float32)
    return total[:weight_size].reshape(spec.weight_shape), total[weight_size:] if bias else None
