"""Depthwise convolution (groups = C, channel multiplier m), forward and backward.

CPU path: one vectorised multiply-add per kernel tap over cache-sized blocks of planes, no im2col matrix.
GPU path: raw_kernels/depthwise.cu, tiled kernels planned per pass (`plan_forward`, `plan_input_grad`,
`plan_weight_grad`); the table at the top of its section says which kernel serves which window.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy

from .._arrays import Call, compute_dtype, on_arrays_device
from .._device import DEFAULT_SHARED_LIMIT
from .._kernels import (INDEX_TYPES, KERNEL_DTYPES, KernelFile, capped_grid, elementwise_launch, index_type,
                        kernel_name)
from .._spec import NEEDS, ConvSpec, batch_chunks, ceil_div, check_grad_output, check_needs, round_up
from .._docs import GRADIENTS, SAME_KIND, numpy_doc
from .._typing import ArrayT, Gradients, IntOrTuple, Needs, Padding
from . import lift
from .unfold import pad_cpu

# ---------------------------------------------------------------------------------------------------------
# CPU path over x (n, C, H, W)

CACHE_BLOCK_BYTES = 1 << 20


def _tap(padded, spec: ConvSpec, i: int, j: int):
    """The strided (..., oH, oW) view of padded planes (..., Hp, Wp) read by kernel tap (i, j)."""
    (sh, sw), (dh, dw), (oh, ow) = spec.stride, spec.dilation, spec.out_size
    return padded[..., i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]


def _multiplier(spec: ConvSpec) -> int:
    return spec.out_channels // spec.in_channels


def _plane_blocks(spec: ConvSpec, n: int, itemsize: int):
    """Blocks of the n * C (image, channel) planes, small enough that a block's padded input, output and
    product stay in cache across all the kernel taps: yields (slice of planes, channel of each plane)."""
    c, m = spec.in_channels, _multiplier(spec)
    hp, wp = spec.padded_size
    step = max(1, CACHE_BLOCK_BYTES // ((hp * wp + 2 * m * spec.out_pixels) * itemsize))
    for start in range(0, n * c, step):
        block = slice(start, min(start + step, n * c))
        yield block, numpy.arange(block.start, block.stop) % c


def _image_chunks(spec: ConvSpec, itemsize: int):
    """Chunks of the batch whose padded planes and products (the CPU path's workspace, in the compute dtype) take at
    most the workspace limit, one image at least."""
    hp, wp = spec.padded_size
    per_image = spec.in_channels * (hp * wp + _multiplier(spec) * spec.out_pixels) * itemsize
    return batch_chunks(spec.n, per_image)


def _forward_chunk(x, w, out, spec: ConvSpec, ct):
    """out (m * C, mult, oH, oW) of the images x (m, C, H, W); its padded copy and product are freed on return."""
    padded = pad_cpu(x, spec, ct).reshape(-1, *spec.padded_size)
    product = numpy.empty_like(out)
    for block, channels in _plane_blocks(spec, x.shape[0], ct.itemsize):
        o, p, w_block = out[block], product[block], w[channels]
        for i in range(spec.kernel_size[0]):
            for j in range(spec.kernel_size[1]):
                tap, w_tap = _tap(padded[block], spec, i, j)[:, None], w_block[:, :, i, j, None, None]
                if i == j == 0:
                    numpy.multiply(tap, w_tap, out=o)
                else:
                    numpy.multiply(tap, w_tap, out=p)
                    o += p


def _input_grad_chunk(gy, w, spec: ConvSpec, ct):
    """The input gradient (m, C, H, W) of grad_output gy (m, C, mult, oH, oW), summed into padded planes."""
    (kh, kw), (h, wd), (top, _), (left, _) = spec.kernel_size, spec.in_size, *spec.padding
    m = w.shape[1]
    gy_planes = gy.reshape(-1, m, *spec.out_size)
    padded = numpy.zeros((gy_planes.shape[0], *spec.padded_size), dtype=ct)
    product = numpy.empty(gy_planes.shape, dtype=ct)
    for block, channels in _plane_blocks(spec, gy.shape[0], ct.itemsize):
        p, w_block = product[block], w[channels]
        for i in range(kh):
            for j in range(kw):
                numpy.multiply(gy_planes[block], w_block[:, :, i, j, None, None], out=p)
                _tap(padded[block], spec, i, j)[...] += p[:, 0] if m == 1 else p.sum(axis=1)
    return padded[:, top:top + h, left:left + wd].reshape(gy.shape[0], -1, h, wd)


def depthwise_conv2d_cpu(x, weight, bias, spec: ConvSpec):
    ct = compute_dtype(x.dtype)
    n, c, m = x.shape[0], spec.in_channels, _multiplier(spec)
    w = weight.astype(ct, copy=False).reshape(c, m, *spec.kernel_size)
    out = numpy.empty((n * c, m, *spec.out_size), dtype=ct)
    for images in _image_chunks(spec, ct.itemsize):
        _forward_chunk(x[images], w, out[images.start * c:images.stop * c], spec, ct)
    out = out.reshape(n, c * m, *spec.out_size)
    if bias is not None:
        out += bias.astype(ct, copy=False)[:, None, None]
    return out.astype(x.dtype, copy=False)


def depthwise_conv2d_backward_cpu(grad_output, x, weight, spec: ConvSpec, needs: frozenset):
    ct = compute_dtype(x.dtype)
    n, c, m = x.shape[0], spec.in_channels, _multiplier(spec)
    (kh, kw), (oh, ow) = spec.kernel_size, spec.out_size
    gy = grad_output.astype(ct, copy=False).reshape(n, c, m, oh, ow)
    grad_x = grad_w = grad_b = None
    if "input" in needs:
        w = weight.astype(ct, copy=False).reshape(c, m, kh, kw)
        grad_x = numpy.empty(x.shape, dtype=x.dtype)
        for images in _image_chunks(spec, ct.itemsize):   # one chunk's padded sums at a time
            grad_x[images] = _input_grad_chunk(gy[images], w, spec, ct)
    if "weight" in needs:
        grad_w = numpy.zeros((c, m, kh, kw), dtype=ct)
        for images in _image_chunks(spec, ct.itemsize):
            padded = pad_cpu(x[images], spec, ct)
            for i in range(kh):
                for j in range(kw):
                    grad_w[:, :, i, j] += numpy.einsum("ncmhw,nchw->cm", gy[images], _tap(padded, spec, i, j))
            del padded
        grad_w = grad_w.reshape(spec.weight_shape).astype(weight.dtype, copy=False)
    if "bias" in needs:
        grad_b = gy.sum(axis=(0, 3, 4)).reshape(c * m).astype(x.dtype, copy=False)
    return grad_x, grad_w, grad_b


# ---------------------------------------------------------------------------------------------------------
# GPU path (CuPy on a GPU, or the test emulator): raw_kernels/depthwise.cu
#
# Algorithm selection (the kernels' comments say how each one works):
#   forward        square 3/5/7 kernel, stride 1 or 2 (both dims), dilation 1 -> depthwise_fwd<T, I, K, S>
#                  (<T, I, K, S, true> where one tile covers the plane, multiplier 1: channels packed, `_packed`)
#                  other windows that overlap (extent > stride): tiny planes     -> depthwise_fwd_planes
#                                                  (<T, I, K> for a TINY_KERNELS window: `_tiny_kernel`)
#                                  LARGE_MIN_K and larger a side, stride 1, dilation 1 -> depthwise_fwd_large
#                                                  (whole planes, `plan_large`)
#                                                                  others          -> depthwise_fwd_generic
#                  non-overlapping windows (1x1, stride >= extent) or a tile that cannot fit -> depthwise_fwd_direct
#   input grad     stride 1: the forward's tiled convolution of grad_output with the flipped kernel
#                  (depthwise_bwd_input<T, I, K[, true]> for square 3/5/7, dilation 1: the forward's persistent
#                  kernel on FORWARD_BLOCKS blocks; tiny planes: _planes, <T, I, K> as the forward's at
#                  multiplier 1; the forward's large windows: _large; else _generic);
#                  other strides, or no overlap                       -> depthwise_bwd_input_strided
#                  (square 3/5/7 at stride 2, dilation 1: depthwise_bwd_input_phased<T, I, K, S>, its taps
#                  unrolled; both persistent on FORWARD_BLOCKS blocks)
#                  no fit                                             -> depthwise_bwd_input_gather
#   weight grad    the forward's specialisations                      -> depthwise_bwd_weight<T, I, K, S>
#                  other overlapping windows, tiny planes             -> depthwise_bwd_weight_generic, a lane per
#                                                  channel (plan_weight_planes: its plane_channels > 0); with a
#                                                  TINY_KERNELS window depthwise_bwd_weight_planes<T, I, K>
#                  the forward's large windows (plan_weight_large)    -> depthwise_bwd_weight_lanes
#                  other overlapping windows, more than 32 taps       -> depthwise_bwd_weight_large
#                  other overlapping windows                          -> depthwise_bwd_weight_generic
#                  no overlap or no fit                               -> depthwise_bwd_weight_direct
#                  each (but _direct) writes partial rows, and the last block of a channel to arrive sums them in
#                  a fixed order (finish_rows, the same launch), the bias gradient's too; the bias alone goes
#                  through depthwise_bwd_bias, finished alike.
# The tile planner (`plan_tiling`) picks the output tile and the images per block for every tiled kernel.

SPECIALISED_KERNELS = (3, 5, 7)
SPECIALISED_STRIDES = (1, 2)
GENERIC_KERNELS = ("depthwise_fwd_generic", "depthwise_fwd_planes", "depthwise_fwd_large", "depthwise_fwd_direct",
                   "depthwise_bwd_input_generic", "depthwise_bwd_input_planes", "depthwise_bwd_input_large",
                   "depthwise_bwd_input_strided", "depthwise_bwd_input_gather", "depthwise_bwd_weight_generic",
                   "depthwise_bwd_weight_large", "depthwise_bwd_weight_lanes", "depthwise_bwd_weight_direct",
                   "depthwise_bwd_bias")
PLANE_KERNELS = ("depthwise_fwd_planes", "depthwise_bwd_input_planes")  # one thread per dst plane
LARGE_KERNELS = ("depthwise_fwd_large", "depthwise_bwd_input_large",  # whole planes, per_block images a unit
                 "depthwise_bwd_weight_lanes")

# Shared with depthwise.cu (compiled in through KERNELS.defines; the file says what each one does there).
STRIP_ROWS = {3: 4, 5: 8, 7: 8}  # output rows per thread item of the specialisations: 8 for 5x5 and 7x7, where
                                 # a longer strip cuts the shared loads per output from 10 to 7.5 (5x5) and 17.5
                                 # to 12.25 (7x7); 4 for 3x3, already at 4.5, where a shorter strip wastes fewer
                                 # lanes on planes whose height is not a multiple of it
FWD_COLUMNS = 4        # output columns per thread item of the specialised kernels (depthwise_fwd, depthwise_bwd_input
                       # and depthwise_bwd_weight with a K template): one 16-byte access of float32 per row
GENERIC_STRIP = 4      # the same for the generic kernels
TAP_CHUNK = 16         # taps per register pass of depthwise_bwd_weight_generic: 4x4 and smaller in one pass
LARGE_RUN = 8          # consecutive taps of a kernel row per thread of depthwise_bwd_weight_large
LARGE_ROWS = 2         # output rows per thread item of depthwise_fwd_large / _bwd_input_large (they share its weights)
LARGE_COLUMNS = 8      # its output columns: each chunk of 8 src values (two 16-byte shared loads of float32) feeds 64
                       # FMAs against 15 weights (4 broadcast loads, one per LARGE_ROWS rows): 31 wavefronts a warp
                       # per 128 FMAs, under the FMA pipe's 32 cycles; a multiple of 16 / sizeof(double)
LARGE_MIN_K = 13       # the smallest kernel side those take (stride 1, dilation 1): their chunks of LARGE_COLUMNS
                       # run ~kw + 2 * (LARGE_COLUMNS - 1) columns an output where kw count, so below ~13 the generic
                       # kernels' tap loops waste about as much
LARGE_LANES = 32       # images per unit of those at most: a warp's lanes are images, its weights one broadcast
LARGE_WEIGHT_LANES = 8  # images per unit of depthwise_bwd_weight_lanes at most (a power of two): the lanes of an item,
                        # whose staged x and grad_out planes (3.6 KB each on 14x14) must fit 8 to a block
LARGE_THREADS = 256    # their most threads a block (each takes the same number of the unit's items): blocks of ~64
                       # registers a thread, 4 to an H100 SM, so that 384 units (dw-384-14k31) run in one wave of 3
                       # a SM (448 threads: 2 a SM, a second wave for the last 120 of them)
LANES_THREADS = 512    # the most threads a block of depthwise_bwd_weight_lanes (its __launch_bounds__): 31x31's
                       # 64 items x 8 lanes.  With 2 such blocks an SM its float-accumulating instantiations (int
                       # indices) fit 64 registers, not 94: 32 warps an SM, not 16 (PREDICTED dw-384-14k31, RESULTS.md
                       # "dwwgt")
STRIDED_ROWS = 4       # input pixels per thread of depthwise_bwd_input_strided
PHASED_CELLS = 2       # cells of S x S input pixels per side of a thread item of depthwise_bwd_input_phased: 4 x 4
                       # pixels at stride 2, whose 3x3 taps read a 3 x 3 grad_output window (9 shared loads for 36
                       # FMAs; one cell a side: 2 x 2 loads for 9) and whose rows are one 4-element store each
BIAS_THREADS = 256     # the block of depthwise_bwd_bias
FINISH_ROWS = 8        # partial rows whose loads a thread of a weight or bias gradient's last block (finish_rows) has
                       # in flight at once: one round trip to L2 for the 2-8 rows of most channels
PAIRS_KERNELS = (3, 5)  # the K of depthwise_bwd_weight's PAIRS instantiations (16-bit, stride 1; plan_weight_grad)
SPREAD_MIN_K = 5       # the smallest K whose small-plane instantiations (the PACK forward and input gradient, the weight
                       # gradient's SPREAD) spread their staged planes over the shared-memory banks (AlignedStaging): 3x3
                       # items of 4 rows on 14x14 planes hit different banks without it (4 rows of a 20-element pitch
                       # are 16 banks apart), and its thread layout costs instructions
PLANE_BATCH = 8        # src elements a thread of the planes kernels' <T, I, K> instantiations (TINY_KERNELS) loads
                       # before it stores them to shared memory: one wait on global memory per batch
KERNELS = KernelFile("depthwise.cu", defines={
    **{f"STRIP_ROWS_{k}": rows for k, rows in STRIP_ROWS.items()}, "FWD_COLUMNS": FWD_COLUMNS,
    "GENERIC_STRIP": GENERIC_STRIP,
    "TAP_CHUNK": TAP_CHUNK, "LARGE_RUN": LARGE_RUN, "LARGE_ROWS": LARGE_ROWS, "LARGE_COLUMNS": LARGE_COLUMNS,
    "STRIDED_ROWS": STRIDED_ROWS, "PHASED_CELLS": PHASED_CELLS, "FINISH_ROWS": FINISH_ROWS,
    "SPREAD_MIN_K": SPREAD_MIN_K, "PLANE_BATCH": PLANE_BATCH, "LANES_THREADS": LANES_THREADS})

TILE_MAX = 32          # output tile side: 32 x 32 outputs (+ halo) per unit on large planes
BLOCK_ITEMS = 256      # thread items per block the planner aims for (small planes: images packed to reach it)
SMEM_SOFT = 24 * 1024  # preferred shared memory per block: 8 such blocks of 256 threads fill an H100 SM
FORWARD_BLOCKS = 2048  # the grid of depthwise_fwd<T, I, K, S>, depthwise_bwd_input<T, I, K> and of the strided input
                       # gradients (depthwise_bwd_input_strided, _phased), whose blocks loop
                       # over their units and pay their set-up once: about two waves of an H100 (132 SMs x 8-9
                       # resident blocks of ~224 threads), so an SM that finishes early takes the next block and the
                       # last wave's tail is short
PLANE_MAX = 64         # the largest src and dst planes (elements) of depthwise_fwd_planes / _bwd_input_planes: one
                       # thread per dst plane, so larger planes would leave too few threads and too long loops
TINY_KERNELS = (4,)    # K of the planes kernels' <T, I, K> instantiations (square K x K, stride 1, dilation 1, each
                       # padding in [0, K - 1], multiplier 1 for the input gradient: `_tiny_kernel`): their taps
                       # unrolled over zero-padded staged planes.  3, 5 and 7 take the packed depthwise_fwd /
                       # _bwd_input instead; 4x4 is the patch workload's (dw-tiny-4x4k4).  Each K adds 16
                       # instantiations (4 dtypes x 2 index types x 2 kernels)
PLANES_BLOCKS = 8192   # the most blocks of those instantiations (`_planes_grid`): enough for ~7 waves of an H100
                       # (132 SMs x ~9 blocks), few enough that a block runs several units with its kernels loaded once
STAGE1_BLOCKS = 4096   # blocks a weight-gradient stage 1 aims for.  A constant, not the SM count: the partial
                       # rows (hence the summation order and the bits) depend on the shapes alone.
STAGE1_MIN_UNITS = 4   # units a block of depthwise_bwd_weight<K, S> takes at least (where its channel has that many):
                       # small planes have 1-8 units a channel, which STAGE1_BLOCKS alone gave one block each, so
                       # every block paid its set-up, its block reduction of K * K + 1 sums and a partial row for
                       # one unit, and each warp ran its load-compute loop once (nothing of its own to overlap);
                       # PREDICTED dw-480-14 fp16 weight gradient 26.3-87.8 -> 15.6-40.3 us (RESULTS.md)
STAGE1_FILL_BLOCKS = 384  # ... unless that leaves fewer blocks than this (about 3 blocks of 256 threads an H100 SM):
                          # then the SMs would hold too few warps to hide their loads' latency (PREDICTED iii fp16,
                          # 64 channels of 8 units: 512 blocks of 1 unit 5.0-12.6 us, 128 of 4 5.7-14.5, 256 of 2
                          # 6.2-17.7), so STAGE1_BLOCKS' split stays


def instantiations():
    names = []
    for dtype, index in itertools.product(KERNEL_DTYPES, INDEX_TYPES):
        for k, s in itertools.product(SPECIALISED_KERNELS, SPECIALISED_STRIDES):
            names.append(kernel_name("depthwise_fwd", dtype, index, k, s))
            names.append(kernel_name("depthwise_bwd_weight", dtype, index, k, s))
            # SPREAD (`_spread_planes`; and the small planes' whole-plane tiles from SPREAD_MIN_K on)
            names.append(kernel_name("depthwise_bwd_weight", dtype, index, k, s, True))
            names.append(kernel_name("depthwise_fwd", dtype, index, k, s, False, True))
        if dtype in ("float16", "bfloat16"):  # PAIRS (plan_weight_grad): 3x3 per-image, 5x5 SPREAD
            names.extend(kernel_name("depthwise_bwd_weight", dtype, index, k, 1, k >= SPREAD_MIN_K, True)
                         for k in PAIRS_KERNELS)
        names.extend(kernel_name("depthwise_bwd_input", dtype, index, k) for k in SPECIALISED_KERNELS)
        names.extend(kernel_name("depthwise_bwd_input", dtype, index, k, False, True) for k in SPECIALISED_KERNELS)
        # the packed-channel instantiations of small planes (`_small_planes`), in both index types: no plan depends
        # on the index type (tests/test_sass.py relies on it)
        names.extend(kernel_name("depthwise_fwd", dtype, index, k, s, True)
                     for k, s in itertools.product(SPECIALISED_KERNELS, SPECIALISED_STRIDES))
        names.extend(kernel_name("depthwise_bwd_input", dtype, index, k, True) for k in SPECIALISED_KERNELS)
        names.extend(kernel_name("depthwise_bwd_input_phased", dtype, index, k, s)
                     for k, s in itertools.product(SPECIALISED_KERNELS, SPECIALISED_STRIDES) if s > 1)
        names.extend(kernel_name(kernel, dtype, index) for kernel in GENERIC_KERNELS)
        names.extend(kernel_name(kernel, dtype, index, k) for kernel in (*PLANE_KERNELS, "depthwise_bwd_weight_planes")
                     for k in TINY_KERNELS)
    return names


# --- plans ------------------------------------------------------------------------------------------------

def _specialised(spec: ConvSpec, stride_one: bool = False):
    """K when the window has a specialised kernel (square K x K, dilation 1, stride S in both dims), else None."""
    (kh, kw), (sh, sw), (dh, dw) = spec.kernel_size, spec.stride, spec.dilation
    strides = (1,) if stride_one else SPECIALISED_STRIDES
    if kh == kw and kh in SPECIALISED_KERNELS and sh == sw and sh in strides and dh == dw == 1:
        return kh
    return None


def _extent(spec: ConvSpec):
    """Rows and columns one window spans: (kH - 1) * dH + 1, (kW - 1) * dW + 1."""
    return tuple((k - 1) * d + 1 for k, d in zip(spec.kernel_size, spec.dilation))


def _overlaps(spec: ConvSpec) -> bool:
    """Whether neighbouring windows share input pixels, i.e. staging a tile in shared memory saves reads."""
    return any(e > s for e, s in zip(_extent(spec), spec.stride))


@dataclass(frozen=True)
class Tiling:
    """One unit of a tiled kernel: an output tile of tile_h x tile_w for per_block images of one channel."""
    tile_h: int
    tile_w: int
    tiles_y: int
    tiles_x: int
    per_block: int
    threads: int
    shared_mem: int
    items_per_plane: int = 1     # thread items per plane of a unit
    pack_channels: bool = False  # per_block consecutive channels of one image (whole planes), not images of one channel
    plane_channels: int = 0      # depthwise_bwd_weight_generic's tiny-plane units: per_block images x this many planes

    def args(self) -> dict:
        """The tiled kernels' arguments that describe the unit."""
        return dict(tile_h=self.tile_h, tile_w=self.tile_w, tiles_x=self.tiles_x, tiles_y=self.tiles_y,
                    per_block=self.per_block)

    def units(self, images: int) -> int:
        """Units per channel (not pack_channels)."""
        return ceil_div(images, self.per_block) * self.tiles_y * self.tiles_x

    def all_units(self, images: int, channels: int) -> int:
        """Units in all over `images` images of `channels` planes (the kernel's destination channels)."""
        if self.pack_channels:
            return images * ceil_div(channels, self.per_block)
        return self.units(images) * channels


@dataclass(frozen=True)
class Plan:
    """A pass's kernel: its name, template constants beyond <T, I>, and its tiling (None: untiled)."""
    kernel: str
    constants: tuple = ()
    tiling: Tiling | None = None


def plan_tiling(out_size, images: int, staged, acc_bytes: int, *, strip: int = 1, columns: int = 1, align=(1, 1),
                most=(TILE_MAX, TILE_MAX), extra_bytes=lambda threads: 0, threads: int | None = None):
    """Plan a tiled kernel's units, or None when not even a one-column tile fits in shared memory.

    out_size: the planes the kernel writes; staged(tile_h, tile_w): elements it stages per image; strip, columns:
    output rows and columns per thread item; align: what tile_h and tile_w must be multiples of; most: the largest tile;
    extra_bytes(threads): shared memory after the tiles (weights or reduction scratch); threads: a fixed block
    size (default: one thread per item).  Large planes get most-sized tiles (balanced, so 112 = 4 x 28 wastes
    no lanes); smaller planes are one tile, and then images of one channel are packed until a block has ~256
    items.  Shared memory is kept under 24 KiB (occupancy) by halving the images, then the tile, and only if
    that fails is up to 48 KiB allowed.
    """
    (oh, ow), (ah, aw) = out_size, align

    def balanced(n, largest, multiple):
        return round_up(ceil_div(n, ceil_div(n, largest)), multiple)

    def plan(th, tw, per):
        block = threads or round_up(per * (th // strip) * (tw // columns), 32)
        smem = per * staged(th, tw) * acc_bytes + extra_bytes(block)
        if block > 1024:  # a CUDA block's limit (only a huge stride can align a tile that large)
            smem = DEFAULT_SHARED_LIMIT + 1
        return Tiling(th, tw, ceil_div(oh, th), ceil_div(ow, tw), per, block, smem, (th // strip) * (tw // columns))

    tile_h, tile_w = balanced(oh, most[0], ah), balanced(ow, most[1], aw)
    per_block = max(1, min(images, BLOCK_ITEMS // (tile_h // strip * (tile_w // columns))))
    for limit, narrowest in ((SMEM_SOFT, min(tile_w, round_up(8, aw))), (DEFAULT_SHARED_LIMIT, aw)):
        th, tw, per = tile_h, tile_w, per_block
        while True:
            tiling = plan(th, tw, per)
            if tiling.shared_mem <= limit:
                return tiling
            if per > 1:
                per //= 2
            elif th > ah:
                th = round_up(th // 2, ah)
            elif tw > narrowest:
                tw = max(narrowest, round_up(tw // 2, aw))
            else:
                break
    return None


def _window_staging(extent, stride, planes: int = 1):
    """staged() of the convolution-like kernels: `planes` tiles of (tile - 1) * stride + extent per image."""
    return lambda th, tw: planes * ((th - 1) * stride[0] + extent[0]) * ((tw - 1) * stride[1] + extent[1])


def _strided_staging(spec: ConvSpec):
    """staged() of depthwise_bwd_input_strided (its first_y/in_h): the m grad_output tiles of the rows and
    columns that a tile of input pixels reads."""
    def side(t, pad, extent, stride):
        first = -((extent - 1 - pad) // stride)  # ceil((pad - (extent - 1)) / stride)
        return (t - 1 + pad) // stride - first + 1
    (top, _), (left, _) = spec.padding
    (eh, ew), (sh, sw) = _extent(spec), spec.stride
    return lambda th, tw: _multiplier(spec) * side(th, top, eh, sh) * side(tw, left, ew, sw)


def _forward_staging(k: int, stride: int, acc: int, spread: bool = False, split: bool = False):
    """staged() of depthwise_fwd<T, I, K, S>: in_h rows of in_w elements, the row pitch rounded up to 16 bytes
    (the kernel's `pitch`, so that its 16-byte shared loads are aligned); spread (the small-plane instantiations,
    AlignedStaging's SPREAD): the plane rounded up to be congruent to tw * stride modulo a 128-byte bank row, so that
    neighbouring lanes of a quarter warp in neighbouring planes read different banks; split (the per-image stride-2
    weight gradient, AlignedStaging's SPLIT; the forward there stages nothing): a row's even and odd columns each
    rounded up to 16 bytes, and each run of a strip's STRIP_ROWS[k] * stride rows tw (modulo a bank row) elements after
    the last."""
    n, bank_row = 16 // acc, 128 // acc

    def plane(th, tw):
        in_h, in_w = (th - 1) * stride + k, (tw - 1) * stride + k
        pitch = round_up((in_w + 1) // 2, n) + round_up(in_w // 2, n) if split else round_up(in_w, n)
        size = in_h * pitch + (in_h // (STRIP_ROWS[k] * stride) * (tw % bank_row) if split else 0)
        return size + ((tw * stride - size) % bank_row if spread else 0)
    return plane


def _packed(tiling: Tiling, planes: int, plane_bytes: int, kernel_bytes: int) -> Tiling:
    """A whole-plane tiling of the persistent kernels with its per_block planes taken as consecutive channels of one
    image (their pack_channels): as many per block, balanced over the `planes` channels (the last group of an image
    may be partial), rounded down to a multiple that makes whole 16-byte chunks of plane_bytes where that takes no
    more groups, so that the units' runs of output start 16-byte aligned.  Shared memory is the tiles (`tiling` has
    no extra bytes) and, after them, the kernels of each plane (kernel_bytes, staged by the kernel: its
    kernels_staged), so it scales with the planes."""
    groups = ceil_div(planes, tiling.per_block)
    per = ceil_div(planes, groups)
    multiple = 16 // math.gcd(plane_bytes, 16)
    if per >= multiple and ceil_div(planes, per // multiple * multiple) == groups:
        per = per // multiple * multiple
    return replace(tiling, per_block=per, pack_channels=True,
                   threads=round_up(per * tiling.items_per_plane, 32),
                   shared_mem=(tiling.shared_mem // tiling.per_block + kernel_bytes) * per)


def _small_planes(plan, images: int, planes: int, plane_bytes: int, kernel_bytes: int,
                  can_pack: bool = True) -> Tiling | None:
    """plan(count, packed) plans the persistent kernel with `count` planes to pack per block (packed: for the PACK
    instantiation, whose staging spreads its planes from SPREAD_MIN_K on, `_forward_staging`).  When one tile covers a whole plane (and can_pack), the block packs
    consecutive channels of one image (`_packed`; the kernel's PACK instantiation, `_packed_constant`; kernel_bytes:
    the weights of a plane), else images of one channel."""
    tiling = plan(planes, True) if can_pack else None
    if tiling and tiling.tiles_x == tiling.tiles_y == 1:
        return _packed(tiling, planes, plane_bytes, kernel_bytes)
    return plan(images, False)


def _staged_kernels(k: int, terms: int, acc: int) -> int:
    """Bytes of the kernels a packed plane of depthwise_persistent stages in shared memory (its kernels_staged: `terms`
    k x k kernels, from SPREAD_MIN_K on)."""
    return terms * k * k * acc if k >= SPREAD_MIN_K else 0


def _spread_planes(tiling: Tiling, k: int, stride: int, acc: int, replan) -> tuple[Tiling, tuple]:
    """A per-image tiling of the persistent kernels whose row of thread items spans less than a 128-byte bank row
    (tile_w * stride elements: 28-wide tiles of 56x56 and 112x112 planes) and whose next strip of a plane (STRIP_ROWS
    rows of the staged pitch down) lands on banks of that row (28-wide: the same banks) makes a quarter warp's
    16-byte loads take 2 wavefronts where 1 would do.  With several planes per block, the SPREAD instantiation
    (AlignedStaging<true>, ItemLayout<true>) puts the items of the next plane, not the next strip, after a row of items
    and pads the planes to follow it on the banks.  Returns replan(True) (its plane sizes, `_forward_staging` with
    spread) and the kernel's extra constants (PACK false, SPREAD true), or `tiling` and () where that does not apply
    or the padded planes would no longer fit two per block."""
    span = tiling.tile_w * stride * acc  # bytes
    pitch = round_up((tiling.tile_w - 1) * stride + k, 16 // acc) * acc
    next_strip = STRIP_ROWS[k] * stride * pitch % 128
    if tiling.pack_channels or tiling.per_block < 2 or span >= 128 or span <= next_strip <= 128 - span:
        return tiling, ()
    spread = replan(True)
    if spread is None or spread.per_block < 2:
        return tiling, ()
    return spread, (False, True)


def _packed_constant(tiling: Tiling) -> tuple:
    """The PACK template argument of the persistent kernels: only the packed instantiations name it (the others take
    its default, false, and keep their names)."""
    return (True,) if tiling.pack_channels else ()


def _tiny_kernel(spec: ConvSpec) -> int | None:
    """K when the planes kernels have a <T, I, K> instantiation for the window (TINY_KERNELS): square K x K, stride 1,
    dilation 1, and every side's padding in [0, K - 1], so that the input gradient's correlation padding, K - 1 - p,
    is too (depthwise_planes stages its src planes padded by it)."""
    (kh, kw), (dh, dw) = spec.kernel_size, spec.dilation
    if kh == kw and kh in TINY_KERNELS and spec.stride == (1, 1) and dh == dw == 1 and \
            all(0 <= p < kh for pair in spec.padding for p in pair):
        return kh
    return None


def plan_planes(kernel: str, spec: ConvSpec, src_size: int, dst_size: int, terms: int, acc: int) -> Plan | None:
    """depthwise_fwd_planes / _bwd_input_planes for planes of at most PLANE_MAX elements (src_size, dst_size), `terms`
    src planes and kernels per dst plane: the most threads (one per dst plane, 256 down to 32) whose unit, pitched as
    the kernel pitches it (odd), fits in SMEM_SOFT, else 32 within the default limit; None when the planes are larger
    or nothing fits.  With a `_tiny_kernel` K (and one src plane per dst plane), the <T, I, K> instantiation, whose
    staged src planes are zero-padded to the dst plane plus K - 1 rows and columns, with a table of src_size offsets
    per block, and no staged kernels."""
    if max(src_size, dst_size) > PLANE_MAX:
        return None
    k = _tiny_kernel(spec) if terms == 1 else None
    if k:  # the zero-padded src plane and the dst plane; the kernel in registers
        dst_sides = spec.out_size if kernel == PLANE_KERNELS[0] else spec.in_size
        per_plane, table = ((math.prod(d + k - 1 for d in dst_sides) | 1) + (dst_size | 1)) * acc, src_size * 4
    else:
        per_plane, table = (terms * (src_size | 1) + (terms * spec.taps | 1) + (dst_size | 1)) * acc, 0
    for threads, limit in ((256, SMEM_SOFT), (128, SMEM_SOFT), (64, SMEM_SOFT), (32, DEFAULT_SHARED_LIMIT)):
        if threads * per_plane + table <= limit:
            return Plan(kernel, (k,) if k else (), Tiling(1, 1, 1, 1, threads, threads, threads * per_plane + table))
    return None


def _large_plane(rows: int, pitch: int, acc: int) -> int:
    """Elements a staged plane of the large-window kernels takes (their large_plane): rows x pitch, rounded so the
    next plane starts 16 bytes past a multiple of 128 (a quarter warp's 16-byte loads in neighbouring planes land on
    different banks)."""
    c = 16 // acc
    return round_up(rows * pitch - c, 128 // acc) + c


def _large_applies(spec: ConvSpec) -> bool:
    """Whether the large-window kernels (LARGE_KERNELS) take spec: LARGE_MIN_K or more a side, stride 1, dilation 1."""
    return min(spec.kernel_size) >= LARGE_MIN_K and spec.stride == (1, 1) and spec.dilation == (1, 1)


def plan_large(kernel: str, spec: ConvSpec, src_size, dst_size, terms: int, acc: int) -> Plan | None:
    """depthwise_fwd_large / _bwd_input_large (LARGE_KERNELS) for windows of at least LARGE_MIN_K a side at stride 1,
    dilation 1, whole planes: `terms` src planes of src_size (H, W) a dst plane of dst_size, per_block images a unit
    (LARGE_LANES at most, halved until the unit fits in SMEM_SOFT, then in the default limit), a thread per item of
    LARGE_COLUMNS outputs; None where that does not apply.  Shared memory mirrors depthwise_large: the src planes,
    rows zero-padded to whole chunks and planes pitched to 16 bytes past a multiple of 128 (its large_plane), and the
    `terms` kernels, rows zero-padded by 2 * (LARGE_COLUMNS - 1) plus an alignment of their first read."""
    (kh, kw), r, c = spec.kernel_size, LARGE_COLUMNS, 16 // acc
    if not _large_applies(spec):
        return None
    plane = _large_plane(src_size[0], round_up(src_size[1], r), acc)
    left = spec.padding[1][0] if kernel == LARGE_KERNELS[0] else kw - 1 - spec.padding[1][0]  # the correlation's
    w_off = 2 * (r - 1) + (-(r - 1 + left)) % c
    weights = terms * kh * round_up(w_off + kw + 2 * (r - 1), c)
    items = ceil_div(dst_size[0], LARGE_ROWS) * ceil_div(dst_size[1], r)
    per = min(spec.n, LARGE_LANES)
    while per > 1 and (per * terms * plane + weights) * acc > DEFAULT_SHARED_LIMIT:
        per //= 2
    smem = (per * terms * plane + weights) * acc
    if smem > DEFAULT_SHARED_LIMIT:
        return None
    rounds = ceil_div(per * items, LARGE_THREADS)  # items a thread
    return Plan(kernel, (), Tiling(dst_size[0], dst_size[1], 1, 1, per, round_up(ceil_div(per * items, rounds), 32),
                                   smem))


def plan_forward(spec: ConvSpec, acc: int, itemsize: int | None = None) -> Plan:
    """The forward's kernel and tiling; acc, itemsize: bytes of the accumulation type and of the data type
    (default: acc)."""
    k = _specialised(spec)
    if k:
        def plan(count, spread, packed=False):
            # where it neither packs nor spreads, at stride 2, the kernel reads its rows from global memory and stages
            # nothing (its `direct`)
            direct = spec.stride[0] == 2 and not (spread or packed)
            staged = (lambda th, tw: 0) if direct else _forward_staging(k, spec.stride[0], acc, spread)
            return plan_tiling(spec.out_size, count, staged, acc,
                               strip=STRIP_ROWS[k], columns=FWD_COLUMNS, align=(STRIP_ROWS[k], FWD_COLUMNS))
        tiling = _small_planes(
            lambda count, packed: plan(count, packed and k >= SPREAD_MIN_K, packed),
            spec.n, spec.out_channels, spec.out_pixels * (itemsize or acc), _staged_kernels(k, 1, acc),
            # the kernel's packed staging reads src channel = dst channel
            can_pack=_multiplier(spec) == 1)
        if tiling:
            tiling, spread = _spread_planes(tiling, k, spec.stride[0], acc, lambda spread: plan(spec.n, spread))
            return Plan("depthwise_fwd", (k, spec.stride[0], *_packed_constant(tiling), *spread), tiling)
    if _overlaps(spec):
        planes = plan_planes("depthwise_fwd_planes", spec, math.prod(spec.in_size), spec.out_pixels, 1, acc) or \
            plan_large(LARGE_KERNELS[0], spec, spec.in_size, spec.out_size, 1, acc)
        if planes:
            return planes
        tiling = plan_tiling(spec.out_size, spec.n, _window_staging(_extent(spec), spec.stride), acc,
                             strip=GENERIC_STRIP, align=(GENERIC_STRIP, 1), extra_bytes=lambda threads: spec.taps * acc)
        if tiling:
            return Plan("depthwise_fwd_generic", (), tiling)
    return Plan("depthwise_fwd_direct")


def plan_input_grad(spec: ConvSpec, acc: int, itemsize: int | None = None) -> Plan:
    """The same for the input gradient.  At stride 1 it is grad_output correlated with the flipped kernels: the
    forward's tiling over the (H, W) planes it writes, the m grad_output tiles of a channel staged together.
    Otherwise a gather from the staged grad_output region of a tile of input pixels, 4 per thread."""
    m = _multiplier(spec)

    def weights(threads):
        return m * spec.taps * acc

    if spec.stride == (1, 1) and _overlaps(spec):
        k = _specialised(spec, stride_one=True)
        if k:
            def plan(count, spread):
                return plan_tiling(spec.in_size, count, lambda th, tw: m * _forward_staging(k, 1, acc, spread)(th, tw),
                                   acc, strip=STRIP_ROWS[k], columns=FWD_COLUMNS, align=(STRIP_ROWS[k], FWD_COLUMNS))
            tiling = _small_planes(
                lambda count, packed: plan(count, packed and k >= SPREAD_MIN_K),
                spec.n, spec.in_channels, spec.in_size[0] * spec.in_size[1] * (itemsize or acc),
                _staged_kernels(k, m, acc))
            if tiling:
                tiling, spread = _spread_planes(tiling, k, 1, acc, lambda spread: plan(spec.n, spread))
                return Plan("depthwise_bwd_input", (k, *_packed_constant(tiling), *spread), tiling)
        planes = plan_planes("depthwise_bwd_input_planes", spec, spec.out_pixels, math.prod(spec.in_size), m, acc) or \
            plan_large(LARGE_KERNELS[1], spec, spec.out_size, spec.in_size, m, acc)
        if planes:
            return planes
        tiling = plan_tiling(spec.in_size, spec.n, _window_staging(_extent(spec), (1, 1), m), acc,
                             strip=GENERIC_STRIP, align=(GENERIC_STRIP, 1), extra_bytes=weights)
        if tiling:
            return Plan("depthwise_bwd_input_generic", (), tiling)
    k = _specialised(spec)
    if k and spec.stride != (1, 1):  # items of B x B pixels (the kernel's phased_block)
        side = PHASED_CELLS * spec.stride[0]
        tiling = plan_tiling(spec.in_size, spec.n, _strided_staging(spec), acc, strip=side, columns=side,
                             align=(side, side), extra_bytes=weights)
        if tiling:
            return Plan("depthwise_bwd_input_phased", (k, spec.stride[0]), tiling)
    tiling = plan_tiling(spec.in_size, spec.n, _strided_staging(spec), acc, strip=STRIDED_ROWS,
                         align=(STRIDED_ROWS * spec.stride[0], spec.stride[1]), extra_bytes=weights)
    if tiling:
        return Plan("depthwise_bwd_input_strided", (), tiling)
    return Plan("depthwise_bwd_input_gather")


def plan_weight_grad(spec: ConvSpec, need_weight: bool, acc: int, itemsize: int | None = None) -> Plan:
    """The same for stage 1 of the weight (and bias) gradient, or of the bias alone.  PAIRS (the kernel's last
    constant: its planes staged flat by aligned pairs): whole-plane tiles of 16-bit data at stride 1 whose rows
    are even but not whole 16-byte chunks of the accumulation type (14x14), K in PAIRS_KERNELS."""
    if not need_weight:
        return Plan("depthwise_bwd_bias")
    k = _specialised(spec)
    width = spec.in_size[1]
    pairs = (itemsize == 2 and k in PAIRS_KERNELS and spec.stride == (1, 1) and width % 2 == 0
             and width % (16 // acc) != 0)
    if k:
        def plan(spread):
            split = spec.stride[0] == 2 and not spread  # the kernel's SPLIT
            return plan_tiling(spec.out_size, spec.n, _forward_staging(k, spec.stride[0], acc, spread, split), acc,
                               strip=STRIP_ROWS[k], columns=FWD_COLUMNS, align=(STRIP_ROWS[k], FWD_COLUMNS),
                               extra_bytes=lambda threads: threads // 32 * (k * k + 1) * acc)
        # whole-plane tiles (small planes): the SPREAD instantiation, its planes spread over the banks
        tiling = plan(True) if k >= SPREAD_MIN_K else None
        if tiling and tiling.tiles_x == tiling.tiles_y == 1:
            return Plan("depthwise_bwd_weight", (k, spec.stride[0], True, *((True,) if pairs else ())), tiling)
        tiling = plan(False)
        if tiling:
            tiling, spread = _spread_planes(tiling, k, spec.stride[0], acc, plan)
            if pairs and not spread and tiling.tiles_x == tiling.tiles_y == 1:
                spread = (False, False, True)  # SPREAD false, PAIRS
            return Plan("depthwise_bwd_weight", (k, spec.stride[0], *spread[1:]), tiling)
    if _overlaps(spec):
        planes = plan_weight_planes(spec, acc)
        if planes:
            return planes
        large = plan_weight_large(spec, acc)
        if large:
            return large
        tiling = None
        tasks = spec.kernel_size[0] * ceil_div(spec.kernel_size[1], LARGE_RUN)
        if spec.taps > 2 * TAP_CHUNK and tasks <= BLOCK_ITEMS:
            # Taps over the threads (depthwise_bwd_weight_large): blockDim // tasks slices of output rows, each
            # with its own sums of every tap; the unit stages x and grad_output tiles.
            window = _window_staging(_extent(spec), spec.stride)
            tiling = plan_tiling(spec.out_size, spec.n, lambda th, tw: window(th, tw) + th * tw, acc,
                                 threads=round_up(BLOCK_ITEMS // tasks * tasks, 32),
                                 extra_bytes=lambda threads: threads // tasks * (spec.taps + 1) * acc)
            kernel = "depthwise_bwd_weight_large"
        if tiling is None:
            tiling = plan_tiling(spec.out_size, spec.n, _window_staging(_extent(spec), spec.stride), acc,
                                 strip=GENERIC_STRIP, align=(GENERIC_STRIP, 1),
                                 extra_bytes=lambda threads: threads // 32 * (TAP_CHUNK + 1) * acc)
            kernel = "depthwise_bwd_weight_generic"
        if tiling:
            return Plan(kernel, (), tiling)
    return Plan("depthwise_bwd_weight_direct")


def plan_weight_large(spec: ConvSpec, acc: int) -> Plan | None:
    """depthwise_bwd_weight_lanes for the windows plan_large takes: per_block images a unit (the lanes of an item, a
    power of two up to LARGE_WEIGHT_LANES, halved until an item's lanes fit in a block of LANES_THREADS and the unit
    in the default limit), one thread per lane of an item (of LARGE_ROWS x LARGE_COLUMNS taps); None where that does not
    apply.  Shared memory mirrors the kernel: per image, its x plane and its grad_out plane, rows zero-padded as
    depthwise_large pads src rows and kernel rows, planes pitched by its large_plane."""
    (kh, kw), r, c = spec.kernel_size, LARGE_COLUMNS, 16 // acc
    if not _large_applies(spec):
        return None
    (h, w), (oh, ow) = spec.in_size, spec.out_size
    g_off = 2 * (r - 1) + (-(r - 1 + spec.padding[1][0])) % c
    per_image = (_large_plane(h, round_up(w, r), acc)
                 + _large_plane(oh, round_up(g_off + ow + 2 * (r - 1), c), acc))
    items = ceil_div(kh, LARGE_ROWS) * ceil_div(kw, r)
    per = min(LARGE_WEIGHT_LANES, 1 << (spec.n - 1).bit_length())
    while per > 1 and (per * items > LANES_THREADS or per * per_image * acc > DEFAULT_SHARED_LIMIT):
        per //= 2
    if per * items > LANES_THREADS or per * per_image * acc > DEFAULT_SHARED_LIMIT:
        return None
    return Plan("depthwise_bwd_weight_lanes", (), Tiling(kh, kw, 1, 1, per, round_up(per * items, 32),
                                                         per * per_image * acc))


def plan_weight_planes(spec: ConvSpec, acc: int) -> Plan | None:
    """depthwise_bwd_weight_generic's tiny-plane units (its plane_channels > 0) for planes of at most PLANE_MAX elements
    and kernels it takes in at most two passes: the tiling's plane_channels consecutive output channels (a power of
    two up to 32) of per_block images; the most threads (256 down to 32) whose staged planes (pitched odd), sums and
    per-pass tap boxes fit in SMEM_SOFT (else 32 within the default limit).  None where that does not apply."""
    x_size, g_size = math.prod(spec.in_size), spec.out_pixels
    if max(x_size, g_size) > PLANE_MAX or spec.taps > 2 * TAP_CHUNK:
        return None
    q = min(32, 1 << (spec.out_channels - 1).bit_length())
    out_h, out_w = spec.out_size
    k = _tiny_kernel(spec) if spec.taps <= TAP_CHUNK else None
    staged, table = x_size, 0
    if k:  # depthwise_bwd_weight_planes: x planes zero-padded as the forward's, a table of x_size offsets
        staged, table = (out_h + k - 1) * (out_w + k - 1), x_size * 4
    for threads, limit in ((256, SMEM_SOFT), (128, SMEM_SOFT), (64, SMEM_SOFT), (32, DEFAULT_SHARED_LIMIT)):
        # the boxes (3 ints a tap), each thread's sums (taps, bias), the planes
        smem = 3 * TAP_CHUNK * 4 + threads * (TAP_CHUNK + 1 + (staged | 1) + (g_size | 1)) * acc + table
        if smem <= limit:
            return Plan("depthwise_bwd_weight_planes" if k else "depthwise_bwd_weight_generic", (k,) if k else (),
                        Tiling(out_h, out_w, 1, 1, threads // q, threads, smem, plane_channels=q))
    return None


def stage1_rows(units: int, channels: int, least: int = 1):
    """(rows, units per block) for a stage 1 over `units` per channel: ~STAGE1_BLOCKS blocks in all, so even a
    few channels of many tiny images spread over the whole GPU, while the partial buffer stays small; but at
    least `least` units a block (all of them where the channel has fewer) where that leaves STAGE1_FILL_BLOCKS."""
    rows = min(units, max(1, ceil_div(STAGE1_BLOCKS, channels)))
    fewer = max(1, units // least)
    if fewer < rows and fewer * channels >= STAGE1_FILL_BLOCKS:
        rows = fewer
    per_block = ceil_div(units, rows)
    return ceil_div(units, per_block), per_block


# --- launches ---------------------------------------------------------------------------------------------

def _planes_grid(planes: int, dst_channels: int, threads: int, tiny: bool) -> int:
    """Blocks of a planes kernel over `planes` dst planes, `threads` a block.  The <T, I, K> instantiations (tiny) loop
    over their units on at most PLANES_BLOCKS blocks, a multiple of the blocks whose planes are whole images (where
    that multiple is not larger than the units), so that the grid's step keeps each thread on one dst channel: its
    kernel is loaded once (depthwise_planes)."""
    blocks = ceil_div(planes, threads)
    if tiny and blocks > PLANES_BLOCKS:
        whole = dst_channels // math.gcd(dst_channels, threads)  # blocks of whole images
        blocks = max(whole, PLANES_BLOCKS // whole * whole) if whole < blocks else blocks
    return capped_grid(blocks)


def _launch(device, plan: Plan, dtype, index: str, units: int, spec: ConvSpec, **args):
    """Launch a plan's kernel: tiled over `units` with its tiling, or untiled over `units` items."""
    if plan.tiling and plan.kernel in PLANE_KERNELS:  # units: dst planes, one per thread
        channels = spec.out_channels if plan.kernel == PLANE_KERNELS[0] else spec.in_channels
        grid = _planes_grid(units, channels, plan.tiling.threads, bool(plan.constants))
        block = plan.tiling.threads
    elif plan.tiling:
        grid, block = capped_grid(units), plan.tiling.threads
        args.update(dict(per_block=plan.tiling.per_block) if plan.kernel in LARGE_KERNELS else plan.tiling.args())
    else:
        (grid,), (block,) = elementwise_launch(units)
    KERNELS.launch(device, plan.kernel, plan.constants, dtype=dtype, index=index, grid=grid, block=block,
                   shared_mem=plan.tiling.shared_mem if plan.tiling else 0, window=spec, **args)


def depthwise_conv2d_gpu(device, x, weight, bias, spec: ConvSpec):
    y = device.empty(spec.output_shape, x.dtype)
    x, weight = device.ascontiguous(x), device.ascontiguous(weight)
    index = index_type(x.size, y.size, weight.size)
    plan = plan_forward(spec, compute_dtype(x.dtype).itemsize, x.dtype.itemsize)
    units = plan.tiling.all_units(spec.n, spec.out_channels) if plan.tiling else y.size
    if plan.kernel in PLANE_KERNELS:
        units = spec.n * spec.out_channels
    if plan.kernel == "depthwise_fwd":
        units = min(units, FORWARD_BLOCKS)  # a persistent kernel: blocks loop over the units
    _launch(device, plan, x.dtype, index, units, spec, x=x, weight=weight,
            bias=weight if bias is None else device.ascontiguous(bias),  # never read without a bias
            y=y, images=spec.n, channels=spec.in_channels, multiplier=_multiplier(spec), has_bias=bias is not None)
    return y


def _input_grad_gpu(device, grad_output, weight, spec: ConvSpec):
    grad_x = device.empty(spec.input_shape, grad_output.dtype)
    index = index_type(grad_output.size, grad_x.size, weight.size)
    plan = plan_input_grad(spec, compute_dtype(grad_output.dtype).itemsize, grad_output.dtype.itemsize)
    units = plan.tiling.all_units(spec.n, spec.in_channels) if plan.tiling else grad_x.size
    if plan.kernel in PLANE_KERNELS:
        units = spec.n * spec.in_channels
    if plan.kernel in ("depthwise_bwd_input", "depthwise_bwd_input_strided", "depthwise_bwd_input_phased"):
        units = min(units, FORWARD_BLOCKS)  # persistent kernels: blocks loop over the units
    _launch(device, plan, grad_output.dtype, index, units, spec, grad_out=grad_output, weight=weight, grad_x=grad_x,
            images=spec.n, channels=spec.in_channels, multiplier=_multiplier(spec))
    return grad_x


def _param_grads_gpu(device, grad_output, x, spec: ConvSpec, need_weight: bool, need_bias: bool):
    """(grad_weight, grad_bias) in one launch: its blocks write partial rows in the accumulation type, and the last
    block of each channel (group) to arrive sums that channel's rows in order (depthwise.cu's `finish_rows`, its
    counts in `Device.arrival_counters`); one row is written converted, straight to the result."""
    n, cm, taps = spec.n, spec.out_channels, spec.taps
    dtype, acc_dtype = grad_output.dtype, compute_dtype(grad_output.dtype)
    length = cm * (taps + need_bias) if need_weight else cm  # one partial row: weight taps, then biases
    plan = plan_weight_grad(spec, need_weight, acc_dtype.itemsize, dtype.itemsize)
    groups = cm  # channel groups of stage 1: a block per group and partial row
    if not need_weight:
        rows, step = stage1_rows(n, cm)  # step: images per block
    elif plan.tiling:
        if plan.tiling.plane_channels:  # tiny planes: a block per group of plane_channels channels and partial row
            groups = ceil_div(cm, plan.tiling.plane_channels)
        least = STAGE1_MIN_UNITS if plan.kernel == "depthwise_bwd_weight" else 1
        rows, step = stage1_rows(plan.tiling.units(n), groups, least)  # step: units per block
    else:
        rows, step = 1, 1
    out = device.empty((length,), dtype)
    # one row: written straight to out, the partial buffer a placeholder of one element; but
    # depthwise_bwd_weight_lanes stores even one row there and converts it (depthwise.cu's finish_rows, STORED)
    stored = rows > 1 or plan.kernel == "depthwise_bwd_weight_lanes"
    partial = device.empty((rows, length) if stored else (1,), acc_dtype)
    index = index_type(x.size, grad_output.size, rows * length)
    finish = dict(partial=partial, out=out, arrivals=device.arrival_counters(groups))
    if not need_weight:
        KERNELS.launch(device, plan.kernel, dtype=dtype, index=index, grid=capped_grid(rows * cm),
                       block=BIAS_THREADS, grad_out=grad_output, images=n, out_channels=cm,
                       pixels=spec.out_pixels, images_per_block=step, **finish)
    elif plan.tiling:
        extra = dict(units_per_block=step)
        if plan.kernel in ("depthwise_bwd_weight_generic", "depthwise_bwd_weight_planes"):
            extra["plane_channels"] = plan.tiling.plane_channels
        _launch(device, plan, dtype, index, rows * groups, spec, x=x, grad_out=grad_output, images=n,
                channels=spec.in_channels, multiplier=_multiplier(spec), has_bias=need_bias, **finish, **extra)
    else:  # depthwise_bwd_weight_direct: a thread an element, one row
        _launch(device, plan, dtype, index, length, spec, x=x, grad_out=grad_output, out=out, images=n,
                channels=spec.in_channels, multiplier=_multiplier(spec), has_bias=need_bias)
    if not need_weight:
        return None, out
    grad_w = out[:cm * taps].reshape(spec.weight_shape)
    return grad_w, (out[cm * taps:] if need_bias else None)


def depthwise_conv2d_backward_gpu(device, grad_output, x, weight, spec: ConvSpec, needs: frozenset):
    grad_output, weight = device.ascontiguous(grad_output), device.ascontiguous(weight)
    if "weight" in needs:  # x is read for nothing else (a transposed convolution passes a placeholder)
        x = device.ascontiguous(x)
    grad_x = grad_w = grad_b = None
    if "input" in needs:
        grad_x = _input_grad_gpu(device, grad_output, weight, spec)
    if "weight" in needs or "bias" in needs:
        grad_w, grad_b = _param_grads_gpu(device, grad_output, x, spec, "weight" in needs, "bias" in needs)
    return grad_x, grad_w, grad_b


def depthwise_conv2d_run(device, x, weight, bias, spec: ConvSpec, algorithm: str = "auto"):
    """depthwise_conv2d of a checked spec on the CPU path (device None) or the kernels; one algorithm."""
    if device is None:
        return depthwise_conv2d_cpu(x, weight, bias, spec)
    return depthwise_conv2d_gpu(device, x, weight, bias, spec)


def depthwise_conv2d_backward_run(device, grad_output, x, weight, spec: ConvSpec, needs: frozenset,
                                  algorithm: str = "auto"):
    if device is None:
        return depthwise_conv2d_backward_cpu(grad_output, x, weight, spec, needs)
    return depthwise_conv2d_backward_gpu(device, grad_output, x, weight, spec, needs)


# ---------------------------------------------------------------------------------------------------------
# Public API


X_DOC, WEIGHT_DOC = ("array (N, C, H, W)", "The input."), ("array (C * m, 1, kH, kW)", "The filters, m per channel.")


@numpy_doc(returns=("array (N, C * m, oH, oW)", SAME_KIND), x=X_DOC, weight=WEIGHT_DOC)
@on_arrays_device
def depthwise_conv2d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1,
                     padding: Padding = 0, dilation: IntOrTuple = 1) -> ArrayT:
    """Depthwise convolution: each input channel convolved with its own m filters (channel multiplier m).

    Output channel c * m + k is input channel c convolved with filter c * m + k: `conv2d` with groups = C, on
    kernels of its own.
    """
    call = Call("depthwise_conv2d", x=x, weight=weight, bias=bias)
    spec = ConvSpec.for_depthwise("depthwise_conv2d", call.x, call.weight, call.bias, stride, padding, dilation)
    return call.wrap(lift.forward(depthwise_conv2d_run, call.device, call.x, call.weight, call.bias, spec))


@numpy_doc(returns=GRADIENTS, x=X_DOC, weight=WEIGHT_DOC)
@on_arrays_device
def depthwise_conv2d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1,
                              padding: Padding = 0, dilation: IntOrTuple = 1,
                              needs: Needs = NEEDS) -> Gradients[ArrayT]:
    """The gradients of `depthwise_conv2d`, computed by hand (no autograd)."""
    op = "depthwise_conv2d_backward"
    call = Call(op, grad_output=grad_output, x=x, weight=weight)
    spec = ConvSpec.for_depthwise(op, call.x, call.weight, None, stride, padding, dilation)
    check_grad_output(op, call.grad_output, spec)
    return call.wrap(lift.backward(depthwise_conv2d_backward_run, call.device, call.grad_output, call.x, call.weight,
                                   spec, check_needs(op, needs)))
