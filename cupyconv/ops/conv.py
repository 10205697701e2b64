"""conv2d with groups: im2col + GEMM and a direct kernel, forward and backward.

CPU path: the im2col matrix of a chunk of the batch (chunked to the workspace limit) is multiplied by the
weight in one batched matmul over (sample, group).
GPU path: the algorithms are described at the top of its section below.
groups = C (depthwise) is routed to the depthwise op on both paths.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools

import numpy

from .. import _autotune, settings
from .._arrays import Call, compute_dtype, on_arrays_device
from .._device import DEFAULT_SHARED_LIMIT
from .._kernels import (INDEX_TYPES, KERNEL_DTYPES, MAX_GRID, KernelFile, batch_view, capped_grid, elementwise_launch,
                        extent, index_type, kernel_name, stride_args)
from .._spec import (NEEDS, ConvSpec, batch_chunks, ceil_div, check_algorithm, check_grad_output, check_needs,
                     check_workspace_limit, row_bands, transposed_spec, weight_spatial_dims)
from .._docs import GRADIENTS, SAME_KIND, numpy_doc
from .._typing import ArrayT, Gradients, IntOrTuple, Needs, Padding
from . import lift
from .depthwise import (depthwise_conv2d_backward_cpu, depthwise_conv2d_backward_gpu, depthwise_conv2d_cpu,
                        depthwise_conv2d_gpu)
from .implicit_gemm import (TC_MIN_CHANNELS, few_channels_preferred, forward_output, igemm_3d_refusal,
                            implicit_gemm_3d, implicit_gemm_gpu, implicit_gemm_grad_input, implicit_gemm_grad_input_3d,
                            implicit_gemm_grad_weight, sharing_channels_last, stage_backward_copies,
                            tensor_core_refusal)
from .simt_gemm import simt_gemm_gpu, simt_gemm_grad_input, simt_gemm_grad_weight, simt_preferred, simt_runs
from .unfold import col2im_cpu, fold_gpu, pad_cpu, unfold_gpu, windows_cpu

# ---------------------------------------------------------------------------------------------------------
# CPU path over a flat batch: x (n, C, H, W), weight (D, C // G, kH, kW)


BATCH_LAST_PIXELS = 1024


def _batch_last(spec: ConvSpec) -> bool:
    """Whether the CPU path lays the batch out innermost: for small planes, where a row of pixels is too short
    for fast copies and a GEMM per image too small; then each group is one GEMM over (pixel, image)."""
    return spec.out_pixels < BATCH_LAST_PIXELS and spec.n > 1


def _columns(x, spec: ConvSpec, dtype, batch_last: bool):
    """im2col of x (m, C, H, W): contiguous (m, G, K, L), or with batch_last (G, K, L * m); K = C // G * kH * kW."""
    m, g, k = x.shape[0], spec.groups, spec.channels_per_group * spec.taps
    win = windows_cpu(pad_cpu(x, spec, dtype, batch_last), spec)  # (m, C, kH, kW, oH, oW)
    if batch_last:
        return win.transpose(1, 2, 3, 4, 5, 0).reshape(g, k, spec.out_pixels * m)
    return win.reshape(m, g, k, spec.out_pixels)


def _grad_columns(gy, spec: ConvSpec, batch_last: bool):
    """grad_output (m, G, Dg, L) in the layout of _columns: as it is, or with batch_last (G, Dg, L * m)."""
    if batch_last:
        m, g, dg, pixels = gy.shape
        return gy.transpose(1, 2, 3, 0).reshape(g, dg, pixels * m)
    return gy


def _image_workspace(spec: ConvSpec, itemsize: int, out_channels: int = 0):
    """(bytes of one image's CPU workspace, its part that does not grow with the output rows, its bytes per output
    row): the columns, the padded copy (or col2im buffer; none for a pointwise conv, whose columns are x or
    grad_x) and out_channels values per output pixel (a product or a grad_output copy)."""
    (hp, wp), ow = spec.padded_size, spec.out_size[1]
    row = (spec.in_channels * spec.taps + out_channels) * ow * itemsize
    padded_row = 0 if _is_pointwise(spec) else spec.in_channels * wp * itemsize
    extent = spec.dilation[0] * (spec.kernel_size[0] - 1) + 1
    fixed = max(extent - spec.stride[0], 0) * padded_row     # a band's halo rows
    return row * spec.out_size[0] + padded_row * hp, fixed, row + spec.stride[0] * padded_row


def work_pieces(spec: ConvSpec, image_bytes: int, fixed_bytes: int, row_bytes: int):
    """The pieces of a batch whose workspace stays within the limit: chunks of whole images while one image's
    (`image_bytes`) fits, else bands of one image's output rows (`row_bands`: fixed_bytes + row_bytes a row).
    Yields (images, output pixels, input rows, the piece's spec): the piece is x[images, :, rows], its output
    [images, ..., pixels].  Both paths' im2col GEMMs (and patch's) run on these."""
    every = slice(None)
    if image_bytes <= settings.get_workspace_limit():
        for chunk in batch_chunks(spec.n, image_bytes):
            yield chunk, every, every, spec.with_batch(chunk.stop - chunk.start)
        return
    ow = spec.out_size[1]
    for i in range(spec.n):
        for out_rows, in_rows, band in row_bands(spec, fixed_bytes, row_bytes):
            yield slice(i, i + 1), slice(out_rows.start * ow, out_rows.stop * ow), in_rows, band


def _pieces(spec: ConvSpec, itemsize: int, out_channels: int = 0):
    """The CPU path's pieces (`work_pieces`), its workspace per image `_image_workspace`."""
    return work_pieces(spec, *_image_workspace(spec, itemsize, out_channels))


def conv2d_cpu(x, weight, bias, spec: ConvSpec):
    ct = compute_dtype(x.dtype)
    n, g, dg, pixels = spec.n, spec.groups, spec.outputs_per_group, spec.out_pixels
    x = x.reshape(n, *spec.input_shape[-3:])
    w = weight.reshape(g, dg, -1).astype(ct, copy=False)
    out = numpy.empty((n, g, dg, pixels), dtype=ct)
    for chunk, pix, rows, piece in _pieces(spec, ct.itemsize, spec.out_channels if _batch_last(spec) else 0):
        # The columns are a temporary of the product, gone before the next piece's: one piece's at a time.
        batch_last = _batch_last(piece)
        cols = _columns(x[chunk, :, rows], piece, ct, batch_last)
        if batch_last:
            out[chunk] = numpy.matmul(w, cols).reshape(g, dg, pixels, -1).transpose(3, 0, 1, 2)
        elif pix == slice(None):
            numpy.matmul(w, cols, out=out[chunk])
        else:
            out[chunk, :, :, pix] = numpy.matmul(w, cols)
        del cols
    out = out.reshape(n, spec.out_channels, *spec.out_size)
    if bias is not None:
        out += bias.astype(ct, copy=False)[:, None, None]
    return out.astype(x.dtype, copy=False).reshape(spec.output_shape)


def _grad_input_chunk(wt, gyc, spec: ConvSpec, ct, batch_last: bool):
    """The input gradient of a chunk: its columns weight^T @ grad_output, summed back by col2im (for a pointwise
    conv the columns are the gradient)."""
    cols = numpy.matmul(wt, gyc)
    if batch_last:  # (G, K, L * m) -> (m, C, kH, kW, oH, oW), batch innermost in memory
        cols = cols.reshape(spec.in_channels, *spec.kernel_size, *spec.out_size, -1).transpose(5, 0, 1, 2, 3, 4)
    else:
        cols = cols.reshape(-1, spec.in_channels, *spec.kernel_size, *spec.out_size)
    if _is_pointwise(spec):
        return cols.reshape(-1, spec.in_channels, *spec.in_size)
    return col2im_cpu(cols, spec, ct, batch_last)


def _grad_weight_chunk(gyc, x, spec: ConvSpec, ct, batch_last: bool):
    """The weight gradient (G, D / G, K) of a chunk x: grad_output @ its columns^T, summed over its images."""
    cols = _columns(x, spec, ct, batch_last)
    if batch_last:
        return numpy.matmul(gyc, cols.transpose(0, 2, 1))
    return numpy.matmul(gyc, cols.transpose(0, 1, 3, 2)).sum(axis=0)


def conv2d_backward_cpu(grad_output, x, weight, spec: ConvSpec, needs: frozenset):
    ct = compute_dtype(x.dtype)
    n, g, dg, pixels = spec.n, spec.groups, spec.outputs_per_group, spec.out_pixels
    x = x.reshape(n, *spec.input_shape[-3:])
    gy = grad_output.reshape(n, g, dg, pixels).astype(ct, copy=False)
    grad_x = numpy.zeros(x.shape, dtype=ct) if "input" in needs else numpy.empty(0)
    acc = numpy.zeros((g, dg, spec.channels_per_group * spec.taps), dtype=ct) if "weight" in needs else numpy.empty(0)
    wt = numpy.ascontiguousarray(weight.reshape(g, dg, -1).astype(ct, copy=False).transpose(0, 2, 1))
    for name in [name for name in ("input", "weight") if name in needs]:
        # One gradient's pieces at a time, each piece's columns gone before the next's.
        extra = spec.out_channels if _batch_last(spec) or name == "weight" else 0
        for chunk, pix, rows, piece in _pieces(spec, ct.itemsize, extra):
            batch_last = _batch_last(piece)
            gyc = _grad_columns(gy[chunk, :, :, pix], piece, batch_last)
            if name == "weight":
                acc += _grad_weight_chunk(gyc, x[chunk, :, rows], piece, ct, batch_last)
                continue
            gx = _grad_input_chunk(wt, gyc, piece, ct, batch_last)
            if rows == slice(None):
                grad_x[chunk] = gx
            else:   # bands overlap where their windows do: their input rows add up
                grad_x[chunk, :, rows] += gx
            del gx
    grad_input = grad_w = grad_b = None
    if "input" in needs:
        grad_input = grad_x.astype(x.dtype, copy=False).reshape(spec.input_shape)
    if "weight" in needs:
        grad_w = acc.reshape(spec.weight_shape).astype(weight.dtype, copy=False)
    if "bias" in needs:
        grad_b = gy.sum(axis=(0, 3)).reshape(spec.out_channels).astype(x.dtype, copy=False)
    return grad_input, grad_w, grad_b


# ---------------------------------------------------------------------------------------------------------
# GPU path (CuPy on a GPU, or the test emulator): raw_kernels/conv.cu, unfold.cu and GEMMs through
# device.matmul_strided: cuBLAS strided-batched calls (`Device.gemm_strided_batched`), no pointer arrays; the
# largest of the (sample, group) batch dims is cuBLAS's batch (the weight at batch stride 0 when it is the
# samples), the other is looped over.
#
# Algorithms (`algorithm=`):
#   'im2col_gemm'  forward: per chunk of the batch (sized to the workspace budget) the unfold kernel writes
#                  cols (n_chunk, G, K, L), K = C / G * kH * kW, L = oH * oW, and the batched GEMM
#                  weight (G, D / G, K) @ cols -> (n_chunk, G, D / G, L) writes straight into the output, which is
#                  already (N, D, oH, oW); a 1x1 stride-1 unpadded conv skips im2col (x is its own cols).  Bias is
#                  one elementwise epilogue pass over the output.
#   'direct'       raw_kernels/conv.cu conv_fwd_direct (`plan_direct`): the group's input tile + halo staged once
#                  in shared memory (in slabs of channels where they do not all fit), DIRECT_ROWS output rows x up
#                  to 8 output channels per thread in registers (more channels: blocks of 8 over the same tile),
#                  fused bias; no workspace at all.  Bandwidth-bound layers with few channels per group
#                  (ResNeXt's 4 and 8) read x once and write y once.
#   'implicit_gemm' the tensor cores (mma.sync, sm_80+): raw_kernels/implicit_gemm.cu conv_fwd_tc,
#                  conv_bwd_input_tc and conv_bwd_weight_tc, one implicit GEMM per pass (the table in that file), tile
#                  and grid from `plan_tensor_cores` (ops/implicit_gemm.py); float16/bfloat16, float32 as TF32 when allowed, >= TC_MIN_CHANNELS
#                  channels per group (8 of a 16-bit type for the forward and stride-1 input gradient:
#                  conv_fwd_igemm_groups, `few_channels_groups`).  No workspace but the weight gradient's float32
#                  split sums.
#                  float32 with TF32 off: the FMA units instead (raw_kernels/simt_gemm.cu, ops/simt_gemm.py:
#                  `simt_runs`), strict IEEE float32, any channel count; the input gradient for stride 1 only
#                  (strided: im2col + GEMM + col2im).
#   'auto'         `choose_algorithm`: 'implicit_gemm' where the tensor cores can run (fewer than TC_MIN_CHANNELS
#                  channels a group: from IGG_FEW_MIN_MACS multiply-adds, `few_channels_preferred`), else 'direct'
#                  when both
#                  channels per group are <= DIRECT_MAX_CHANNELS, else the FMA implicit GEMM where it runs and
#                  the column matrix would cost cuBLAS more than the FMA GEMM's slower loop (`simt_preferred`, pass
#                  by pass), else 'im2col_gemm' (or the measured winner when autotuning is on:
#                  `settings.set_autotune`).
# Backward of 'direct' and 'im2col_gemm':
#   grad_input   'direct' with stride 1: the direct kernel run as the transposed convolution (flipped,
#                transposed weight, padding (k - 1) * d - pad), no workspace; otherwise per chunk
#                cols = weight^T @ grad_output (the batched GEMM reads weight^T in place) and the deterministic
#                gather col2im.
#   grad_weight  'direct': conv_bwd_weight_direct (`plan_weight_direct`), blocks of (split of the (image, tile)
#                units, group), each staging the group's x and grad_output tiles once per unit, a warp per
#                WGRAD_DPT x WGRAD_KT of the group's (D / G) x K weight gradient, the warps of column block 0
#                also summing grad_bias from the staged grad_output; conv_bgrad_sum then adds the splits of both
#                in order (deterministic); workspace: one float32/float64 weight and bias per split.  Where its
#                tiles do not fit in shared memory, as 'im2col_gemm':
#                per chunk ONE GEMM per group (one call batched over the groups), the reduction over n_chunk * L:
#                grad_output (G, D / G, n_chunk * L) @ cols^T (G, n_chunk * L, K) -> (G, D / G, K); im2col rows first
#                writes cols as (G, K, n_chunk * L) (read transposed in place) and grad_output (G, D / G, n_chunk * L)
#                is a transposed copy of the chunk (n_chunk * D * L elements).  Each chunk's GEMM adds its product
#                to one float32/float64 accumulator (beta = 1), chunks in order: same bits on every run.  (Per-sample
#                GEMMs would need n_chunk copies of grad_weight, Dg / L times the cols buffer -- 10x at 512@7x7 --
#                and a reduction of only L per GEMM.)
#   grad_bias    with the weight gradient where its kernel sums it (conv_bwd_weight_direct, the tensor cores' and
#                FMA implicit GEMMs); otherwise
#                conv_bgrad: blocks of (channel, split of its images and pixels), fixed-order tree reductions,
#                then conv_bgrad_sum adds each channel's splits in order (`bias_splits`).
# Workspace per sample (bytes, itemsize s) of 'im2col_gemm': forward C*kH*kW*L*s; grad_input (C*kH*kW*L + C*H*W)*s;
# grad_weight (C*kH*kW*L + D*L)*s.  'direct' needs none but its weight gradient's split sums (within the budget).
# Peak memory is inputs + outputs + the workspace budget (+ weight-sized temporaries).

DIRECT_MAX_CHANNELS = 16        # 'auto' picks the direct kernel up to this many channels per group, in and out
# ... and its weight gradient up to this many input channels per group: PREDICTED (H100, executed-instruction
# model, task grpwgrad) conv_bwd_weight_direct ahead of the im2col and FMA-GEMM weight passes at 4 and 8 (rx-256
# fp16 fwd+bwd 258.5-670.8 -> see RESULTS.md's grpwgrad section), behind at 16 (rx-512 fp32: 16 a group make 4 x 9
# blocks of 144 columns whose x tile every warp rereads; the FMA GEMM keeps it)
DIRECT_WEIGHT_MAX_CHANNELS = 8
DIRECT_OUTPUTS = (2, 4, 8)      # conv_fwd_direct specialisations: output channels per thread (registers); more
                                # output channels a group take several blocks of 8 over the same staged tile
# Output rows per thread (registers): each staged weight feeds this many FMAs.  7, not 8: the planes of 224-pixel
# networks (112, 56, 28, 14, 7) are multiples of 7, so no thread computes rows past the output (8 rows left 4 of 32
# idle on 28 x 28 and 2 of 16 on 14 x 14: PREDICTED H100 rx-256 fp16 fwd 39.2-89.0 -> 35.4-80.5 us); a plane of
# 32 or 64 rows now pads 3 or 6 (9%).
DIRECT_ROWS = 7
DIRECT_SHARED_TARGET = 32 * 1024  # shared bytes per block we aim for (several blocks per SM)
DIRECT_THREADS = 256            # the most threads a conv_fwd_direct block has (its __launch_bounds__)
# conv_bwd_weight_direct: a warp sums WGRAD_DPT output channels x WGRAD_KT columns (input channel, tap: one
# channel's 3 x 3) of the weight gradient; a block is at most WGRAD_MAX_THREADS (its __launch_bounds__), its tiles
# at most WGRAD_ROWS output rows of 32 columns; about WGRAD_BLOCKS x 4 warps (a shape-only number: the bits do not
# depend on the GPU), in splits of the (image, tile) units that conv_bgrad_sum adds in order.
WGRAD_DPT, WGRAD_KT, WGRAD_MAX_THREADS, WGRAD_ROWS, WGRAD_BLOCKS = 4, 9, 512, 16, 1024
WGRAD_INFO = WGRAD_KT + 2       # ints of shared memory a warp keeps its output block in (column offsets, d0, k0)
KERNELS = KernelFile("conv.cu", defines={"DIRECT_ROWS": DIRECT_ROWS, "DIRECT_THREADS": DIRECT_THREADS,
                                         "WGRAD_DPT": WGRAD_DPT, "WGRAD_KT": WGRAD_KT,
                                         "WGRAD_MAX_THREADS": WGRAD_MAX_THREADS, "WGRAD_INFO": WGRAD_INFO})
ALGORITHMS = ("auto", "im2col_gemm", "direct", "implicit_gemm")
REDUCE_BLOCK = 256              # conv_bgrad block size (a power of two: fixed reduction tree)
BIAS_BLOCKS = 512               # conv_bgrad's grid aims at this many blocks (a few waves on any GPU); a constant,
                                # not the device's SM count, so that the bits are the same on every GPU


def instantiations():
    names = []
    for dtype, index in itertools.product(KERNEL_DTYPES, INDEX_TYPES):
        names += [kernel_name("conv_fwd_direct", dtype, index, dpt) for dpt in DIRECT_OUTPUTS]
        names += [kernel_name(k, dtype, index) for k in ("conv_fwd_bias", "conv_bgrad", "conv_bgrad_sum",
                                                         "conv_bwd_weight_direct")]
    return names


# --- plans ------------------------------------------------------------------------------------------------

def _routes_to_depthwise(spec: ConvSpec) -> bool:
    return spec.groups == spec.in_channels and spec.groups > 1


def _is_pointwise(spec: ConvSpec) -> bool:
    """1x1, stride 1, no padding: im2col is the identity, x (n, C, H, W) is already cols (n, C, L)."""
    return (spec.taps == 1 and spec.stride == (1, 1) and spec.padding == ((0, 0), (0, 0))
            and spec.out_size == spec.in_size)   # (a clamped spec has stride 1 along a dim of one output)


def _pow2_at_least(v: int) -> int:
    return 1 << max(v - 1, 0).bit_length()


def _direct_outputs(outputs_per_group: int) -> int:
    return next((d for d in DIRECT_OUTPUTS if d >= outputs_per_group), DIRECT_OUTPUTS[-1])


def _balanced(units: int, most: int) -> int:
    """The fewest parts of at most `most` that cover `units`, as equal as can be: the size of one.  56 output
    columns at up to 32 a block are 2 blocks of 28, not 32 + 24 with 8 idle threads in the second."""
    return ceil_div(units, ceil_div(units, most))


def plan_direct(spec: ConvSpec, dtype):
    """(block, slab, (tile_in_h, tile_in_w), shared bytes, output channels per item) of conv_fwd_direct for spec,
    or None if even one input channel's tile does not fit in shared memory (huge kernel * dilation).  The block covers up to 32
    output columns (a warp's coalesced row) and DIRECT_ROWS output rows per row of threads, its sizes balanced
    over the output; the slab holds every input channel of the group when they fit DIRECT_SHARED_TARGET (x is
    then staged once per tile for all the group's outputs), else as many as fit.  An item is all the group's
    output channels, or, where a block is one warp or less (a small plane: rx-512's 14 x 14), one thread's DPT of
    them: more blocks, each staging the tile again (from L2), where one warp a block would leave the SMs idle."""
    (oh, ow), (kh, kw), (sh, sw), (dh, dw) = spec.out_size, spec.kernel_size, spec.stride, spec.dilation
    bx = 32 if ow > 16 else _pow2_at_least(ow)   # a warp on one row: conflict-free shared reads
    by = _balanced(ceil_div(oh, DIRECT_ROWS), max(1, DIRECT_THREADS // bx))
    tile_w = (bx - 1) * sw + (kw - 1) * dw + 1
    tile_in = ((by * DIRECT_ROWS - 1) * sh + (kh - 1) * dh + 1, tile_w + tile_w % 2)   # even: staged by pairs
    acc_bytes = compute_dtype(dtype).itemsize
    per_channel = (tile_in[0] * tile_in[1] + spec.taps * _direct_outputs(spec.outputs_per_group)) * acc_bytes
    if per_channel > DEFAULT_SHARED_LIMIT:
        return None
    # The shared-memory target scales with the block's warps, so that small blocks do not cap an SM's warps.
    target = DIRECT_SHARED_TARGET * ceil_div(bx * by, 32) // ceil_div(DIRECT_THREADS, 32)
    slab = max(1, min(spec.channels_per_group, target // per_channel))
    dpt = _direct_outputs(spec.outputs_per_group)
    per_item = dpt if bx * by <= 32 else ceil_div(spec.outputs_per_group, dpt) * dpt
    return (bx, by), slab, tile_in, slab * per_channel, per_item


@dataclasses.dataclass(frozen=True)
class WeightDirectPlan:
    """conv_bwd_weight_direct's launch: threads (a warp per output block), grid (splits, groups x chunks of output
    blocks), tile rows and columns (lanes a row: 32, or 16 or 8 for narrow outputs) and the x tile with halo,
    shared bytes, (image, tile) units per split."""
    threads: int
    grid: tuple[int, int]
    tile_rows: int
    lane_columns: int
    tile_in: tuple[int, int]
    shared: int
    units_per_split: int

    @property
    def splits(self) -> int:
        return self.grid[0]


def plan_weight_direct(spec: ConvSpec, dtype, bias: bool = False) -> WeightDirectPlan | None:
    """The direct weight gradient's launch, or None where its tiles do not fit in shared memory with a single
    output row (the group's channels and halo: im2col + GEMM then), or its grid or partial sums do not fit.
    With `bias`, the kernel also sums grad_bias: each thread's WGRAD_DPT bias sums in shared memory too, and a
    split's partial sums D more.
    Tiles are WGRAD_ROWS output rows (fewer for short outputs or where they would not fit DEFAULT_SHARED_LIMIT;
    a multiple of the rows a warp covers at once) of 32 columns, or 16 or 8 where the output is that narrow (a
    warp then covers 2 or 4 rows at once); the units are split until about WGRAD_BLOCKS x 4 warps run, within the
    workspace limit.  A block is a warp per output block, up to WGRAD_MAX_THREADS, fewer where their shared memory
    (info, the staging walk, bias sums: some per thread) would leave no room for the tiles."""
    out_blocks = ceil_div(spec.outputs_per_group, WGRAD_DPT) * ceil_div(spec.channels_per_group * spec.taps, WGRAD_KT)
    for most in (WGRAD_MAX_THREADS // 32, 8, 4, 2, 1):
        plan = _plan_weight_direct(spec, dtype, bias, min(out_blocks, most), out_blocks)
        if plan is not None:
            return plan
    return None


def _plan_weight_direct(spec: ConvSpec, dtype, bias: bool, warps: int, out_blocks: int) -> WeightDirectPlan | None:
    (oh, ow), (kh, kw), (sh, sw), (dh, dw) = spec.out_size, spec.kernel_size, spec.stride, spec.dilation
    cg, dg, acc = spec.channels_per_group, spec.outputs_per_group, compute_dtype(dtype).itemsize
    chunks = ceil_div(out_blocks, warps)

    columns = 32 if ow > 16 else 16 if ow > 8 else 8
    step = 32 // columns     # rows a warp covers at once

    def tiles(rows):
        tile_w = (columns - 1) * sw + (kw - 1) * dw + 1
        tile_in = ((rows - 1) * sh + (kh - 1) * dh + 1, tile_w + tile_w % 2)   # even: staged by pairs
        shared = (ceil_div(dg, WGRAD_DPT) * WGRAD_DPT * rows * columns + cg * tile_in[0] * tile_in[1]) * acc
        shared += warps * WGRAD_INFO * 4
        shared += (1 + warps * 32) * 3 * 4   # the x staging walk's step and each thread's start (3 ints each)
        # the bias sums at the next 16 bytes (conv_shared is 16-byte aligned)
        return tile_in, ceil_div(shared, 16) * 16 + warps * 32 * WGRAD_DPT * acc if bias else shared
    # balanced over the output (56 rows: 4 tiles of 14, not 16 + 16 + 16 + 8 whose last 8 rows are zeros summed)
    rows = ceil_div(_balanced(oh, WGRAD_ROWS), step) * step
    while rows > step and tiles(rows)[1] > DEFAULT_SHARED_LIMIT:
        rows -= step
    tile_in, shared = tiles(rows)
    if shared > DEFAULT_SHARED_LIMIT or spec.groups * chunks > MAX_GRID[1]:
        return None
    units = spec.n * ceil_div(oh, rows) * ceil_div(ow, columns)
    weight_sums = spec.out_channels * (cg * spec.taps + bias) * acc     # the partial sums of one split
    # WGRAD_BLOCKS blocks of up to 4 warps, fewer of more: WGRAD_BLOCKS * 4 warps in all (PREDICTED H100 rx-256
    # fp16, 16 warps a block: 256 blocks of 8 units fwd+bwd 119.9-241.3 us, 512 of 4 124.7-249.5, 128 of 16
    # 117.7-268.9 latency-bound)
    blocks = WGRAD_BLOCKS * 4 // max(warps, 4)
    splits = max(1, min(ceil_div(blocks, spec.groups * chunks), units,
                        settings.get_workspace_limit() // weight_sums, MAX_GRID[0]))
    per_split = ceil_div(units, splits)
    return WeightDirectPlan(warps * 32, (ceil_div(units, per_split), spec.groups * chunks), rows, columns, tile_in,
                            shared, per_split)


def choose_algorithm(spec: ConvSpec, dtype, device=None, pass_: str = "forward") -> str:
    """The 'auto' heuristic of every pass: the tensor-core implicit GEMMs where they can run (device given);
    else 'direct' when at most DIRECT_MAX_CHANNELS channels per group go in and out (the weight gradient: at most
    DIRECT_WEIGHT_MAX_CHANNELS in)
    (the GEMMs would be thin -- K = C / G * kH * kW, M = D / G -- and the im2col buffer costs kH * kW times the
    input in traffic, while the direct kernels read x once where the group's channels fit in shared memory: the
    weight gradient too, with conv_bwd_weight_direct where `plan_weight_direct` fits) and its tile fits in shared
    memory; then the strict float32 FMA implicit GEMM where the column matrix, written and read again
    (9x the input for 3x3 stride 1), would cost cuBLAS more than the FMA GEMM's slower loop costs it
    (`simt_preferred`: few columns a group, or a weight gradient too small for cuBLAS to fill the GPU); otherwise
    'im2col_gemm' (cuBLAS at full speed on large per-group GEMMs).  `pass_` ('forward', 'input', 'weight')
    matters to the FMA rule and to 8 channels a group (the tensor cores for the forward and the stride-1 input
    gradient, from IGG_FEW_MIN_MACS multiply-adds: `few_channels_preferred`): each pass is ranked on its own."""
    if device is not None and tensor_core_refusal(spec, dtype, device, pass_) is None and (
            spec.channels_per_group >= TC_MIN_CHANNELS or few_channels_preferred(spec)):
        return "implicit_gemm"   # (fewer channels a group: conv_fwd_igemm_groups, where it outweighs its copy)
    if (spec.channels_per_group <= DIRECT_MAX_CHANNELS and spec.outputs_per_group <= DIRECT_MAX_CHANNELS
            and plan_direct(spec, dtype) is not None
            and (pass_ != "weight" or spec.channels_per_group <= DIRECT_WEIGHT_MAX_CHANNELS)):
        return "direct"
    return "implicit_gemm" if simt_preferred(spec, dtype, pass_) else "im2col_gemm"


def _implicit_gemm_runs(spec: ConvSpec, dtype, device, pass_: str) -> bool:
    """Whether 'implicit_gemm' can run this pass: on the tensor cores, or in strict float32 on the FMA units."""
    return tensor_core_refusal(spec, dtype, device, pass_) is None or simt_runs(spec, dtype, pass_)


def forward_candidates(spec: ConvSpec, dtype, device) -> tuple[str, ...]:
    candidates = ("im2col_gemm", "direct") if plan_direct(spec, dtype) is not None else ("im2col_gemm",)
    return candidates + (("implicit_gemm",) if _implicit_gemm_runs(spec, dtype, device, "forward") else ())


def grad_input_candidates(spec: ConvSpec, dtype, device) -> tuple[str, ...]:
    """The direct kernel computes grad_input only for stride 1 (as a stride-1 transposed convolution)."""
    candidates: tuple[str, ...] = ("im2col_gemm",)
    if spec.stride == (1, 1) and plan_direct(transposed_spec(spec), dtype) is not None:
        candidates += ("direct",)
    return candidates + (("implicit_gemm",) if _implicit_gemm_runs(spec, dtype, device, "input") else ())


def grad_weight_candidates(spec: ConvSpec, dtype, device) -> tuple[str, ...]:
    candidates = ("im2col_gemm", "direct") if plan_weight_direct(spec, dtype) is not None else ("im2col_gemm",)
    return candidates + (("implicit_gemm",) if _implicit_gemm_runs(spec, dtype, device, "weight") else ())


# --- launches ---------------------------------------------------------------------------------------------

def _direct(device, x, weight, bias, spec: ConvSpec):
    """conv_fwd_direct: x (n, C, H, W) any strides, weight (D, C / G, kH, kW), bias (D,) or None (the kernel then
    reads none: it is passed the weight, no zero-filled array)."""
    dtype = x.dtype
    plan = plan_direct(spec, dtype)
    if plan is None:
        raise ValueError(f"{spec.op}: algorithm='direct' cannot stage a {spec.kernel_size} kernel with dilation "
                         f"{spec.dilation} and stride {spec.stride} in shared memory; use 'im2col_gemm'")
    (bx, by), slab, (tile_h, tile_w), shared, per_item = plan
    n, g, dg = spec.n, spec.groups, spec.outputs_per_group
    out = device.empty((n, spec.out_channels, *spec.out_size), dtype)
    weight = device.ascontiguous(weight)
    has_bias = bias is not None
    bias = device.ascontiguous(bias) if has_bias else weight
    dpt = _direct_outputs(dg)
    (oh, ow) = spec.out_size
    items = n * g * ceil_div(dg, per_item) * ceil_div(oh, by * DIRECT_ROWS) * ceil_div(ow, bx)
    KERNELS.launch(device, "conv_fwd_direct", (dpt,), dtype=dtype, index=index_type(out.size, extent(x), weight.size),
                   grid=capped_grid(items), block=(bx, by), shared_mem=shared, window=spec, x=x, weight=weight,
                   bias=bias, out=out, n=n, **stride_args("x", x, "nchw"), groups=g,
                   channels_per_group=spec.channels_per_group, outputs_per_group=dg, outputs_per_item=per_item,
                   slab=slab, tile_in_h=tile_h, tile_in_w=tile_w, has_bias=int(has_bias))
    return out


def _direct_grad_input(device, gy, weight, spec: ConvSpec):
    """grad_input of a stride-1 conv with the direct kernel: weight flipped and transposed per group."""
    g, dg, cg, (kh, kw) = spec.groups, spec.outputs_per_group, spec.channels_per_group, spec.kernel_size
    wt = weight.reshape(g, dg, cg, kh, kw).transpose(0, 2, 1, 3, 4)[:, :, :, ::-1, ::-1]
    wt = device.ascontiguous(wt).reshape(spec.in_channels, dg, kh, kw)
    return _direct(device, gy, wt, None, transposed_spec(spec))


def _direct_grad_weight(device, x, gy, spec: ConvSpec, plan: WeightDirectPlan, bias: bool = False):
    """(grad_weight (D, C / G, kH, kW), grad_bias (D,) where `bias` (plan made with it), else None) in x's dtype by
    conv_bwd_weight_direct's splits and conv_bgrad_sum's in-order sum of them, both in one pass: x (n, C, H, W)
    any strides, gy (n, D, oH, oW) contiguous."""
    dtype = x.dtype
    weight_size = spec.out_channels * spec.channels_per_group * spec.taps
    bias_size = spec.out_channels if bias else 0
    partial = device.empty((weight_size + bias_size, plan.splits), compute_dtype(dtype))
    index = index_type(extent(x), gy.size, partial.size)
    KERNELS.launch(device, "conv_bwd_weight_direct", dtype=dtype, index=index, grid=plan.grid, block=plan.threads,
                   shared_mem=plan.shared, window=spec, x=x, grad_output=gy, partial=partial, n=spec.n,
                   **stride_args("x", x, "nchw"), groups=spec.groups, channels_per_group=spec.channels_per_group,
                   outputs_per_group=spec.outputs_per_group, tile_rows=plan.tile_rows,
                   lane_columns=plan.lane_columns, tile_in_h=plan.tile_in[0],
                   tile_in_w=plan.tile_in[1], units_per_split=plan.units_per_split, with_bias=int(bias))
    grad_w = device.empty(spec.weight_shape, dtype)
    grad_b = device.empty((spec.out_channels,), dtype) if bias else grad_w
    KERNELS.launch(device, "conv_bgrad_sum", dtype=dtype, index=index,
                   grid=ceil_div(weight_size + bias_size, REDUCE_BLOCK), block=REDUCE_BLOCK, partial=partial,
                   grad_bias=grad_w, channels=weight_size, grad_after=grad_b, channels_after=bias_size,
                   splits=plan.splits)
    return grad_w, grad_b if bias else None


def _gemm_forward(device, x, weight, bias, spec: ConvSpec):
    n, g, dg, k = spec.n, spec.groups, spec.outputs_per_group, spec.channels_per_group * spec.taps
    out = device.empty((n, g, dg, spec.out_pixels), x.dtype)
    w = weight.reshape(g, dg, k)
    isz, ow = x.dtype.itemsize, spec.out_size[1]
    if _is_pointwise(spec) and x.flags.c_contiguous:
        device.matmul_strided(w, x.reshape(n, g, k, spec.out_pixels), out)
    else:
        row = (k * g + spec.out_channels) * ow * isz   # a band's columns and its product
        for images, pixels, rows, piece in work_pieces(spec, spec.cols_bytes(isz), 0, row):
            cols = unfold_gpu(device, x[images, :, rows], piece).reshape(-1, g, k, piece.out_pixels)
            if pixels == slice(None):
                device.matmul_strided(w, cols, out[images])
            else:   # a band of one image's output rows: a band-sized product, copied into place
                product = device.empty((1, g, dg, piece.out_pixels), x.dtype)
                device.copyto(out[images, :, :, pixels], device.matmul_strided(w, cols, product))
                del product
            del cols   # before the next piece's are allocated: one piece's columns at a time
    if bias is not None:
        grid, block = elementwise_launch(out.size)
        KERNELS.launch(device, "conv_fwd_bias", dtype=x.dtype, index=index_type(out.size), grid=grid, block=block,
                       out=out, bias=device.ascontiguous(bias), total=out.size,
                       channels=spec.out_channels, pixels=spec.out_pixels)
    return out.reshape(n, spec.out_channels, *spec.out_size)


def grad_input_bytes(spec: ConvSpec, itemsize: int) -> tuple[int, int, int]:
    """The GEMM input gradient's workspace (its columns and their fold) for `work_pieces`: per image, and for a
    band of output rows the part that does not grow with them (the halo rows) and the bytes per row."""
    (h, w), ow, c = spec.in_size, spec.out_size[1], spec.in_channels
    stride, extent = spec.stride[0], spec.dilation[0] * (spec.kernel_size[0] - 1) + 1
    return (spec.cols_bytes(itemsize) + c * h * w * itemsize, max(extent - stride, 0) * c * w * itemsize,
            (c * spec.taps * ow + stride * c * w) * itemsize)


def _gemm_grad_input(device, gy, weight, spec: ConvSpec, bias=None):
    """gy (n, G, D / G, L) contiguous -> grad_input (n, C, H, W): cols = weight^T @ gy, then col2im, which adds
    bias (C,) where given (conv_transpose's forward; after the GEMM where there is no col2im, or several bands)."""
    n, g, dg, k, L = spec.n, spec.groups, spec.outputs_per_group, spec.channels_per_group * spec.taps, spec.out_pixels
    wt = weight.reshape(g, dg, k).transpose(0, 2, 1)  # a view: the GEMM reads it transposed ('T'), no copy
    if _is_pointwise(spec):  # col2im is the identity: the GEMM writes grad_input itself
        grad_x = device.empty((n, g, k, L), gy.dtype)
        return lift.add_channel_bias(device, device.matmul_strided(wt, gy, grad_x).reshape(n, *spec.input_shape[1:]),
                                     bias)
    per_sample, fixed, row = grad_input_bytes(spec, gy.itemsize)
    if per_sample > settings.get_workspace_limit():   # bands of one image's output rows: their columns and the
        grad_x = device.zeros((n, *spec.input_shape[1:]), gy.dtype)   # gradient of the input rows they read
        for images, pixels, rows, piece in work_pieces(spec, per_sample, fixed, row):
            cols = device.matmul_strided(wt, gy[images, :, :, pixels], device.empty((1, g, k, piece.out_pixels),
                                                                                        gy.dtype))
            device.add(grad_x[images, :, rows], fold_gpu(device, cols, piece))   # bands overlap where their windows do
            del cols
        return lift.add_channel_bias(device, grad_x, bias)
    chunks = batch_chunks(n, per_sample)
    cols = device.empty((max((c.stop - c.start for c in chunks), default=0), g, k, L), gy.dtype)  # reused
    if len(chunks) == 1:  # the common case: col2im's output is grad_input, no copy
        return fold_gpu(device, device.matmul_strided(wt, gy, cols), spec, bias=bias)
    grad_x = device.empty((n, *spec.input_shape[1:]), gy.dtype)
    for chunk in chunks:
        m = chunk.stop - chunk.start
        fold_gpu(device, device.matmul_strided(wt, gy[chunk], cols[:m]), spec.with_batch(m), out=grad_x[chunk],
                 bias=bias)
    return grad_x


def weight_grad_bytes(spec: ConvSpec, itemsize: int) -> int:
    """Workspace per image of `gemm_weight_grad`: its columns and its copy of grad_output."""
    return spec.cols_bytes(itemsize) + spec.out_channels * spec.out_pixels * itemsize


def gemm_weight_grad(device, pieces, spec: ConvSpec, dtype):
    """grad_weight (D, C / G, kH, kW) in the compute dtype of dtype, from pieces (x (m, C, H, W) any strides,
    grad_output (m, G, D / G, L), their spec) of the batch, each within the workspace budget (`work_pieces`):
    per piece one GEMM batched over the groups with the reduction over m * L, accumulated by cuBLAS (beta = 1)
    into one float32/float64 buffer in piece order, so the bits are the same on every run.  Also patch's."""
    g, dg = spec.groups, spec.outputs_per_group
    k = spec.channels_per_group * spec.taps
    acc = device.empty((g, dg, k), compute_dtype(dtype))  # the weight's layout: no transpose at the end
    beta = 0.0  # the first piece overwrites acc, the others add to it
    for x_part, gy_part, piece in pieces:
        m, L = x_part.shape[0], piece.out_pixels
        cols = unfold_gpu(device, x_part, piece, rows_first=True).reshape(g, k, m * L)
        gyc = device.ascontiguous(gy_part.transpose(1, 2, 0, 3)).reshape(g, dg, m * L)
        device.matmul_strided(gyc, cols.transpose(0, 2, 1), acc, beta=beta)  # (G, D / G, K) += gy @ cols^T
        del cols, gyc   # before the next chunk's are allocated: one chunk's columns at a time
        beta = 1.0
    return acc.reshape(spec.weight_shape)


def bias_splits(n: int, channels: int, pixels: int) -> tuple[int, int]:
    """(image_splits, pixel_splits) of conv_bgrad's grid for grad_output (n, channels, pixels): about BIAS_BLOCKS
    blocks, split by images first, then by pixels while each split keeps a block's worth of pixels or more."""
    wanted = max(1, BIAS_BLOCKS // max(channels, 1))
    image_splits = min(wanted, max(n, 1))
    pixel_splits = max(1, min(ceil_div(wanted, image_splits), pixels // REDUCE_BLOCK))
    return image_splits, pixel_splits


def _grad_bias(device, gy, spec: ConvSpec):
    """gy (n, D, L) contiguous -> (D,) by conv_bgrad's split fixed-order reduction and conv_bgrad_sum."""
    d, n, pixels = spec.out_channels, spec.n, spec.out_pixels
    image_splits, pixel_splits = bias_splits(n, d, pixels)
    splits = image_splits * pixel_splits
    partial = device.empty((d, splits), compute_dtype(gy.dtype))
    index = index_type(gy.size, partial.size)
    KERNELS.launch(device, "conv_bgrad", dtype=gy.dtype, index=index, grid=(d, splits), block=REDUCE_BLOCK,
                   shared_mem=REDUCE_BLOCK * compute_dtype(gy.dtype).itemsize, grad_output=gy, partial=partial,
                   n=n, channels=d, pixels=pixels, image_splits=image_splits, pixel_splits=pixel_splits)
    grad_b = device.empty((d,), gy.dtype)
    KERNELS.launch(device, "conv_bgrad_sum", dtype=gy.dtype, index=index, grid=ceil_div(d, REDUCE_BLOCK),
                   block=REDUCE_BLOCK, partial=partial, grad_bias=grad_b, channels=d, grad_after=grad_b,
                   channels_after=0, splits=splits)
    return grad_b


def conv2d_gpu(device, x, weight, bias, spec: ConvSpec, algorithm: str = "auto"):
    """Forward on the GPU path: x (N, C, H, W), weight (D, C / G, kH, kW), bias (D,) or None."""
    def run(algo):
        if algo == "implicit_gemm" and simt_runs(spec, x.dtype):
            return simt_gemm_gpu(device, batch_view(device, x), weight, bias, spec,
                                 device.empty(spec.output_shape, x.dtype))
        if algo == "implicit_gemm":   # channels-last x: channels-last out, where conv_fwd_igemm runs
            out = forward_output(device, x, weight, spec)
            return implicit_gemm_gpu(device, batch_view(device, x), weight, bias, spec, out)
        if algo == "direct":
            return _direct(device, x, weight, bias, spec)
        return _gemm_forward(device, x, weight, bias, spec)
    return _autotune.resolve(device, _autotune.tune_key("forward", spec, x.dtype, bias is not None), algorithm,
                             forward_candidates(spec, x.dtype, device), choose_algorithm(spec, x.dtype, device), run)


def conv2d_backward_gpu(device, grad_output, x, weight, spec: ConvSpec, needs: frozenset, algorithm: str = "auto",
                        input_bias=None):
    """Backward on the GPU path.  grad_input: any algorithm ('direct' for stride 1 only, else im2col + GEMM), plus
    input_bias (C,) per channel where given (conv_transpose's forward: the tensor cores' epilogue adds it, the
    other algorithms after their kernels); grad_weight: 'implicit_gemm' or im2col + GEMM (what 'direct' runs there
    too)."""
    n, g, dg, L = spec.n, spec.groups, spec.outputs_per_group, spec.out_pixels
    # The tensor cores take grad_output in its own layout (their channels-last copy reads any strides, and a
    # channels-last grad_output -- the forward's output for channels-last x -- is a view there, not a copy back
    # and forth); every other path takes it contiguous, made once on first use.
    contiguous = functools.cache(lambda: device.ascontiguous(grad_output).reshape(n, g, dg, L))
    weight = device.ascontiguous(weight)
    heuristic = choose_algorithm(spec, x.dtype, device, "input")
    grad_x = grad_w = grad_b = None
    # each needed pass's candidates, tune key and 'auto' heuristic, once: for the staging below and for resolving it
    candidates = grad_input_candidates(spec, x.dtype, device) if "input" in needs else ()
    input_key = _autotune.tune_key("grad_input", spec, x.dtype) if "input" in needs else ()
    weight_candidates = grad_weight_candidates(spec, x.dtype, device) if "weight" in needs else ()
    weight_key = _autotune.tune_key("grad_weight", spec, x.dtype) if "weight" in needs else ()
    weight_heuristic = choose_algorithm(spec, x.dtype, device, "weight") if "weight" in needs else ""
    # the passes whose algorithm is known before they run and is the tensor cores': their copies made in one launch
    staged: set = set()
    if "input" in needs and not simt_runs(spec, x.dtype, "input") and not simt_runs(spec, x.dtype) and (
            _autotune.chosen(device, input_key, algorithm, candidates, heuristic) == "implicit_gemm"):
        staged.add("input")
    if "weight" in needs and not simt_runs(spec, x.dtype, "weight") and _autotune.chosen(
            device, weight_key, algorithm, weight_candidates, weight_heuristic) == "implicit_gemm":
        staged |= {"weight"} | ({"bias"} & needs)
    if staged:
        stage_backward_copies(device, grad_output, batch_view(device, x), weight, spec, frozenset(staged))
    if "input" in needs:

        def grad_input(algo):
            if algo == "implicit_gemm" and simt_runs(spec, x.dtype, "input"):
                out = device.empty(spec.input_shape, x.dtype)
                return lift.add_channel_bias(device, simt_gemm_grad_input(device, contiguous(), weight, spec,
                                                                          transposed_spec(spec), out), input_bias)
            if algo == "implicit_gemm" and not simt_runs(spec, x.dtype):
                out = device.empty(spec.input_shape, x.dtype)
                return implicit_gemm_grad_input(device, grad_output, weight, spec, out, input_bias)
            if algo == "direct" and "direct" in candidates:
                gy4 = contiguous().reshape(n, spec.out_channels, *spec.out_size)
                return lift.add_channel_bias(device, _direct_grad_input(device, gy4, weight, spec), input_bias)
            return _gemm_grad_input(device, contiguous(), weight, spec, input_bias)
        grad_x = _autotune.resolve(device, input_key, algorithm, candidates, heuristic, grad_input)
    fused_bias: dict = {}   # a grad_bias summed by a weight-gradient kernel, with the grad_weight it came with
    if "weight" in needs:
        def grad_weight(algo):
            if algo == "implicit_gemm" and simt_runs(spec, x.dtype, "weight"):
                fused_bias["weight"], fused_bias["bias"] = simt_gemm_grad_weight(
                    device, batch_view(device, x), contiguous().reshape(n, spec.out_channels, L), spec,
                    bias="bias" in needs)
                return fused_bias["weight"]
            if algo == "implicit_gemm":
                fused_bias["weight"], fused_bias["bias"] = implicit_gemm_grad_weight(
                    device, batch_view(device, x), grad_output, spec, "bias" in needs)
                return fused_bias["weight"]
            with_bias = "bias" in needs and algo == "direct"
            direct = plan_weight_direct(spec, x.dtype, with_bias) if algo == "direct" else None
            if direct is None and with_bias:   # the bias sums do not fit: the weight alone, the bias by conv_bgrad
                with_bias, direct = False, plan_weight_direct(spec, x.dtype)
            if direct is not None:
                gy4 = contiguous().reshape(n, spec.out_channels, *spec.out_size)
                fused_bias["weight"], fused_bias["bias"] = _direct_grad_weight(device, x, gy4, spec, direct,
                                                                               with_bias)
                return fused_bias["weight"]
            row = (spec.in_channels * spec.taps + spec.out_channels) * spec.out_size[1] * x.dtype.itemsize
            gy = contiguous()
            pieces = ((x[images, :, rows], gy[images, :, :, pixels], piece) for images, pixels, rows, piece
                      in work_pieces(spec, weight_grad_bytes(spec, x.dtype.itemsize), 0, row))
            return device.astype(gemm_weight_grad(device, pieces, spec, x.dtype), weight.dtype)
        grad_w = _autotune.resolve(device, weight_key, algorithm, weight_candidates, weight_heuristic, grad_weight)
    if ("bias" in needs and grad_w is not None and fused_bias.get("weight") is grad_w
            and fused_bias["bias"] is not None):
        grad_b = fused_bias["bias"]   # summed with grad_weight by the run whose grad_weight is returned
    elif "bias" in needs:
        grad_b = _grad_bias(device, contiguous().reshape(n, spec.out_channels, L), spec)
    return grad_x, grad_w, grad_b



# ---------------------------------------------------------------------------------------------------------
# Public API


def workspace_scope(op: str, nbytes):
    """The per-call workspace budget of op (checked: None or a positive int), or the global/scoped one when None."""
    nbytes = check_workspace_limit(op, nbytes)
    return contextlib.nullcontext() if nbytes is None else settings.workspace_limit(nbytes)


def conv2d_run(device, x, weight, bias, spec: ConvSpec, algorithm: str = "auto"):
    """conv2d of a checked 2-D spec on the CPU path (device None) or the kernels; groups = C goes to the
    depthwise op (algorithm is ignored there).  The N-d ops (ops/lift.py) run this too."""
    if _routes_to_depthwise(spec):
        if device is None:
            return depthwise_conv2d_cpu(x, weight, bias, spec)
        return depthwise_conv2d_gpu(device, x, weight, bias, spec)
    if device is None:
        return conv2d_cpu(x, weight, bias, spec)
    return conv2d_gpu(device, x, weight, bias, spec, algorithm)


def native_3d(pass_: str, device, spec: ConvSpec, dtype, algorithm: str):
    """The runner of conv3d's pass_ ('forward', or 'input': the input gradient) that takes the 3-D spec as is, or
    None where ops/lift.py's depth windows run it: the tensor cores' conv_fwd_igemm_3d ('implicit_gemm', or 'auto'
    while autotune is off: the autotune's candidates are the lifted 2-D problem's) where `igemm_3d_refusal` allows
    (the input gradient at stride 1 only).  The one place conv3d chooses between the two."""
    if device is None or algorithm not in ("auto", "implicit_gemm"):
        return None
    if algorithm == "auto" and settings.get_autotune():
        return None
    if igemm_3d_refusal(spec, dtype, device, pass_) is not None:
        return None
    return implicit_gemm_3d if pass_ == "forward" else implicit_gemm_grad_input_3d


def conv2d_backward_run(device, grad_output, x, weight, spec: ConvSpec, needs: frozenset, algorithm: str = "auto",
                        input_bias=None):
    """The gradients of `conv2d_run`; input_bias (C,) or None added per channel to the input gradient
    (conv_transpose's forward: in the compute dtype, rounded once; in the tensor cores' epilogue where they run)."""
    arrays = (grad_output, x, weight, spec, needs)
    if device is not None and not _routes_to_depthwise(spec):
        with sharing_channels_last():   # both gradients read one channels-last copy of grad_output
            return conv2d_backward_gpu(device, *arrays, algorithm, input_bias)
    if _routes_to_depthwise(spec):
        grads = (depthwise_conv2d_backward_cpu(*arrays) if device is None
                 else depthwise_conv2d_backward_gpu(device, *arrays))
    else:
        grads = conv2d_backward_cpu(*arrays)
    if input_bias is None or grads[0] is None:
        return grads
    return (lift.add_channel_bias(device, grads[0], input_bias), *grads[1:])


ALGORITHM_DOC = ("str", "The GPU algorithm, for CuPy arrays and CUDA tensors (the CPU path always runs im2col + GEMM): "
                 "'im2col_gemm'; 'direct' (direct kernels for few channels per group: forward, weight gradient, "
                 "and the input gradient at stride 1); 'implicit_gemm', the tensor cores (compute capability 8.0 "
                 "and newer; float16, bfloat16, and float32 as TF32 while `cupyconv.settings` allow_tf32 is on; at least "
                 f"{TC_MIN_CHANNELS} input channels per group, or 8 in and out in 16 bits for the forward and "
                 "the stride-1 input gradient), and for float32 with TF32 off strict float32 on the "
                 "FMA units; or 'auto' (the default): 'implicit_gemm' where the tensor cores can run, else 'direct' "
                 f"with at most {DIRECT_MAX_CHANNELS} channels per group in and out, else the float32 FMA "
                 "'implicit_gemm' where the column matrix it saves costs more than its slower loop (few channels a "
                 "group, or a weight gradient too small for cuBLAS), else 'im2col_gemm'; with `cupyconv.settings` "
                 "autotune on, the fastest of them on the first call of each problem.")
X_DOC, WEIGHT_DOC = ("array (N, C, H, W)", "The input."), ("array (D, C // groups, kH, kW)", "The filters.")


@on_arrays_device
def convolve(op: str, nd: int | None, x, weight, bias, stride, padding, dilation, groups, algorithm,
             workspace_limit):
    """The public convolution `op` over nd spatial dims (None: weight.ndim - 2): checked, run through
    `lift.forward` with conv2d's run entry, wrapped back.  conv2d, conv1d, conv3d and conv_nd are this."""
    call = Call(op, x=x, weight=weight, bias=bias)
    nd = nd or weight_spatial_dims(op, call.weight.shape)
    spec = ConvSpec.for_conv(op, call.x, call.weight, call.bias, stride, padding, dilation, groups, nd=nd)
    check_algorithm(op, algorithm, ALGORITHMS)
    with workspace_scope(op, workspace_limit):
        return call.wrap(lift.forward(conv2d_run, call.device, call.x, call.weight, call.bias, spec, algorithm,
                                      native_3d))


@on_arrays_device
def convolve_backward(op: str, nd: int | None, grad_output, x, weight, stride, padding, dilation, groups, needs,
                      algorithm, workspace_limit):
    """The gradients of the public convolution `op` (see `convolve`), through `lift.backward`."""
    call = Call(op, grad_output=grad_output, x=x, weight=weight)
    nd = nd or weight_spatial_dims(op, call.weight.shape)
    spec = ConvSpec.for_conv(op, call.x, call.weight, None, stride, padding, dilation, groups, nd=nd)
    check_grad_output(op, call.grad_output, spec)
    needs = check_needs(op, needs)
    check_algorithm(op, algorithm, ALGORITHMS)
    with workspace_scope(op, workspace_limit):
        return call.wrap(lift.backward(conv2d_backward_run, call.device, call.grad_output, call.x, call.weight, spec,
                                       needs, algorithm, native_3d))


@numpy_doc(returns=("array (N, D, oH, oW)", SAME_KIND), x=X_DOC, weight=WEIGHT_DOC, algorithm=ALGORITHM_DOC)
def conv2d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1, padding: Padding = 0,
           dilation: IntOrTuple = 1, groups: int = 1, *, algorithm: str = "auto",
           workspace_limit: int | None = None) -> ArrayT:
    """2-D convolution (cross-correlation, like `torch.nn.functional.conv2d`).

    oH = (H + pad_top + pad_bottom - dilation_h * (kH - 1) - 1) // stride_h + 1, and likewise oW.  With
    ``groups == C > 1`` it runs `depthwise_conv2d`'s kernels, which ignore `algorithm`.  float32 is strict IEEE
    float32 unless `cupyconv.settings.set_allow_tf32` allows TF32; float16 and bfloat16 accumulate in float32.
    """
    return convolve("conv2d", 2, x, weight, bias, stride, padding, dilation, groups, algorithm, workspace_limit)


@numpy_doc(returns=GRADIENTS, x=X_DOC, weight=WEIGHT_DOC, algorithm=ALGORITHM_DOC)
def conv2d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1, padding: Padding = 0,
                    dilation: IntOrTuple = 1, groups: int = 1, needs: Needs = NEEDS, algorithm: str = "auto",
                    workspace_limit: int | None = None) -> Gradients[ArrayT]:
    """The gradients of `conv2d`, computed by hand (no autograd).

    grad_weight and grad_bias are bit-identical from run to run (fixed reduction orders, no atomics).  With
    'implicit_gemm', grad_x and grad_weight run on the tensor cores (grad_weight in splits of the pixels, summed in
    a fixed order); with 'direct', grad_x runs on the direct kernel when the stride is 1 (im2col + GEMM + col2im
    otherwise) and grad_weight on the direct weight-gradient kernel (in splits of the images and pixels, summed in
    a fixed order; by one GEMM per group and chunk of the batch, as with 'im2col_gemm', where its tiles do not fit
    in shared memory).
    """
    return convolve_backward("conv2d_backward", 2, grad_output, x, weight, stride, padding, dilation, groups, needs,
                             algorithm, workspace_limit)
