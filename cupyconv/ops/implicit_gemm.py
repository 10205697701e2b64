"""The tensor-core implicit GEMMs of conv2d and patch_conv2d (raw_kernels/implicit_gemm.cu): forward, input
gradient and weight gradient, float16/bfloat16 and float32 as TF32, on mma.sync (sm_80+).

Not an op of its own: ops/conv.py ('implicit_gemm' and 'auto') and ops/patch.py plan and launch their tensor-core
passes through the functions here, so that the engine has one place (planner, launches, instantiations) next
to its kernel file.  The table of the three GEMMs is at the top of implicit_gemm.cu's tensor-core section.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import math
from collections.abc import Iterator
from typing import Any

import numpy

from .. import _replay, settings
from .._device import _address
from .._kernels import (INDEX_TYPES, INT32_MAX, MAX_GRID, PLAN_SMS, KernelFile, batch_args, batch_view, capped_grid,
                        extent, fast_divmod_magic, index_type, kernel_name, split_reduction)
from .._spec import ConvSpec, ceil_div, transposed_spec
from .lift import add_channel_bias
from . import wgmma_gemm

# Tensor-core block tiles (rows x columns of C, warps of 32 x 32; implicit_gemm.cu): 64 x 64 in
# general, 128 x 64 for 16-bit inputs with many rows (half the B traffic per row; its float stages would pass the
# 48 KiB of static shared memory), 64 x 32 when a group has at most 32 columns (output channels, or input
# channels for the input gradient), which 64 would half waste.
TC_TILES = {"float16": ((64, 64), (128, 64), (64, 32)), "bfloat16": ((64, 64), (128, 64), (64, 32)),
            "float32": ((64, 64), (64, 32))}  # the tensor-core instantiations; float32 runs as TF32, when allowed
TC_MAX_THREADS = 256   # their __launch_bounds__: the largest tile's 8 warps
TC_DTYPES = tuple(TC_TILES)
TC_PASSES = {"forward": "conv_fwd_tc", "input": "conv_bwd_input_tc", "weight": "conv_bwd_weight_tc"}
TC_CHUNK = 32          # implicit_gemm.cu's TC_BK: the K (reduction) chunk
# Rows past the end of C sit 2^30 pixels before the image (raw_kernels/implicit_gemm.cu), out of range for every tap only
# while the kernel reaches less far than that.
TC_MAX_REACH = 2**30
TC_WIDE_ROWS = 64 * 1024   # rows (pixels) from which 16-bit problems take the 128-row tile: 512+ blocks per group
TC_SPLIT_BLOCKS = 512  # the weight gradient splits its pixels until about this many blocks run (a fixed number,
TC_SPLIT_CHUNKS = 8    # not the SM count, so the bits depend on the shapes only), each at least this many chunks

TC_MIN_CHANNELS = 16   # the tensor-core kernels need this many channels per group (fewer: the direct kernel)
# channels_last_copy's tile: CL_ROWS rows (pixels) x CL_VECTORS 16-byte vectors of channels, a vector a thread.
CL_ROWS, CL_VECTORS = 32, 8
CL_THREADS, CL_CHANNEL_BYTES = CL_ROWS * CL_VECTORS, CL_VECTORS * 16
# channels_last_copies' blocks take this many row tiles each (at least): the pick of a block's job and its arguments
# (about 50 instructions a warp, once per block) is paid per two tiles, not per tile (one 16-byte vector a thread)
CL_COPIES_TILES = 2
# IG_PAIRS: conv_fwd_igemm's tiles load two K chunks at once, 128 bytes a row (ig_forward's PAIRS; 256 rows with
# 32-bit indices only, where the window fits 16-bit halves: `ig_fits_halves`)
KERNELS = KernelFile("implicit_gemm.cu", defines={"TC_MAX_THREADS": TC_MAX_THREADS, "IG_THREADS": 128,
                                                  "IG_ROW_BYTES": 64, "IG_PAIRS": 1, "CL_ROWS": CL_ROWS,
                                                  "CL_VECTORS": CL_VECTORS})


def instantiations():
    names = []
    for kernel, (dtype, tiles), index in itertools.product(TC_PASSES.values(), TC_TILES.items(), INDEX_TYPES):
        names += [kernel_name(kernel, dtype, index, *tile) for tile in tiles]
    for (dtype, tiles), index in itertools.product(IG_TILES.items(), INDEX_TYPES):
        names += [kernel_name("conv_fwd_igemm", dtype, index, *tile) for tile in tiles + IG_NARROW_TILES]
        if index == "int":   # `plan_phases` takes 32-bit indices only
            names += [kernel_name("conv_fwd_igemm_phases", dtype, index, *tile) for tile in tiles + IG_NARROW_TILES]
            # (channels_last_copies: its callers split a 64-bit job off)
            names += [kernel_name("channels_last_copies", dtype, index, lanes) for lanes in (True, False)]
        names += [kernel_name("channels_last_copy", dtype, index, whole) for whole in (True, False)]
    for dtype, tiles in IG_3D_TILES.items():   # 32-bit indices only: a larger 3-D problem takes the lift
        names += [kernel_name("conv_fwd_igemm_3d", dtype, "int", *tile) for tile in tiles + IG_3D_NARROW]
    for (dtype, channels), index in itertools.product(IGG_GROUP_CHANNELS.items(), INDEX_TYPES):
        names += [kernel_name("conv_fwd_igemm_groups", dtype, index, *igemm_groups_tile(cg))
                  for cg in IGG_FORWARD_CHANNELS[dtype]]
        names += [kernel_name("conv_bwd_weight_igemm_groups", dtype, index, cg) for cg in channels]
    names += [kernel_name(kernel, dtype, "int") for kernel in ("patch_fwd_igemm", "patch_bwd_weight_igemm")
              for dtype in PT_DTYPES]
    return names + weight_igemm_instantiations()


# --- plans ------------------------------------------------------------------------------------------------

def tensor_core_refusal(spec: ConvSpec, dtype, device, pass_: str | None = None) -> str | None:
    """Why the tensor-core implicit GEMMs cannot run this problem (any pass; pass_ 'forward' or 'input': that
    pass, which conv_fwd_igemm_groups also runs for 8 channels a group, `few_channels_groups`), or None when they
    can."""
    name = numpy.dtype(dtype).name
    if name not in TC_DTYPES:
        return f"the tensor cores take float16, bfloat16 and (as TF32) float32, not {name}"
    if name == "float32" and not settings.get_allow_tf32():
        return "float32 runs on the tensor cores only as TF32: cupyconv.settings.set_allow_tf32(True)"
    plane = max(spec.in_size[0] * spec.in_size[1], spec.out_pixels)
    if plane > INT32_MAX:
        return f"they index a plane's pixels in 32 bits, and this plane has {plane}"
    reach = max(d * (k - 1) for k, d in zip(spec.kernel_size, spec.dilation))
    if reach >= TC_MAX_REACH:
        return f"they take a kernel reach, dilation x (kernel size - 1), below 2^30 pixels, not {reach}"
    if spec.channels_per_group < TC_MIN_CHANNELS and not few_channels_groups(spec, dtype, pass_):
        return f"it needs at least {TC_MIN_CHANNELS} input channels per group, not {spec.channels_per_group}"
    if not device.tensor_cores:
        return "this GPU has no mma.sync (it needs compute capability 8.0 or newer)"
    return None


@dataclasses.dataclass(frozen=True)
class TensorCorePlan:
    """One tensor-core launch: the block tile (rows, columns of C; conv_bwd_weight_igemm_groups': (channels per
    group,)), the grid (row tiles, groups x column tiles, splits) and, for the weight gradient, the pixels of each
    split in chunks of TC_CHUNK."""
    tile: tuple[int, ...]
    grid: tuple[int, int, int]
    chunks_per_split: int = 0

    @property
    def threads(self) -> int:
        return self.tile[0] * self.tile[1] // 32   # a warp per 32 x 32 of the tile

    @property
    def splits(self) -> int:
        return self.grid[2]


def tensor_core_gemm(spec: ConvSpec, pass_: str) -> tuple[int, int, int]:
    """(rows M, columns N, reduction K) of one group's GEMM in a tensor-core pass (the table in implicit_gemm.cu)."""
    cg, dg, taps = spec.channels_per_group, spec.outputs_per_group, spec.taps
    out_pixels, in_pixels = spec.n * spec.out_pixels, spec.n * spec.in_size[0] * spec.in_size[1]
    return {"forward": (out_pixels, dg, cg * taps), "input": (in_pixels, cg, dg * taps),
            "weight": (cg * taps, dg, out_pixels)}[pass_]


def plan_tensor_cores(spec: ConvSpec, dtype, pass_: str) -> TensorCorePlan:
    """The tile and grid of one tensor-core pass ('forward', 'input' or 'weight' gradient).  The weight
    gradient's few output tiles share its long reduction in splits (each written to its own float32 slice of a
    workspace within the workspace limit, added up in order afterwards) until about TC_SPLIT_BLOCKS blocks run."""
    rows, cols, reduction = tensor_core_gemm(spec, pass_)
    tiles = TC_TILES[numpy.dtype(dtype).name]
    if cols <= 32:
        tile = (64, 32)
    elif (128, 64) in tiles and rows >= TC_WIDE_ROWS:
        tile = (128, 64)
    else:
        tile = (64, 64)
    blocks = (ceil_div(rows, tile[0]), spec.groups * ceil_div(cols, tile[1]))
    if pass_ != "weight":
        return TensorCorePlan(tile, (*blocks, 1))
    splits, per_split = split_reduction(max(1, ceil_div(reduction, TC_CHUNK)), blocks[0] * blocks[1],
                                        TC_SPLIT_BLOCKS, TC_SPLIT_CHUNKS, spec.out_channels * rows * 4)
    return TensorCorePlan(tile, (*blocks, splits), per_split)


# --- launches ---------------------------------------------------------------------------------------------

def _check_tensor_cores(spec: ConvSpec, dtype, device, pass_: str | None = None):
    refusal = tensor_core_refusal(spec, dtype, device, pass_)
    if refusal:
        raise ValueError(f"{spec.op}: algorithm='implicit_gemm' cannot run: {refusal}")


def implicit_gemm_gpu(device, xv, weight, bias, spec: ConvSpec, out):
    """conv_fwd_tc: out (n, D, oH, oW) contiguous from xv, a batch view (outer, inner, C, H, W) of x
    (`_kernels.batch_view`), weight (D, C / G, kH, kW) contiguous, bias (D,) or None.  Also patch_conv2d's."""
    _check_tensor_cores(spec, xv.dtype, device, "forward")
    if igemm_refusal(spec, xv.dtype, "forward") is None:
        xl, wk = channels_last_all(device, (xv, weight_view(device, weight, spec, "forward")))
        if xv.dtype != numpy.float32 and not _shares_memory(xl, xv):
            # (n, H, W, C) with exactly x's values (float32's is rounded to tf32, not x): a caller that saves it
            # in place of x for the backward (cupyconv.torch's autograd) has a weight gradient that reads it in
            # place, so a training step copies x once
            _replay.offer(xl)
        return igemm_forward(device, xl, wk, bias, spec, out)
    plan = plan_tensor_cores(spec, xv.dtype, "forward")
    weight = device.ascontiguous(weight)
    KERNELS.launch(device, "conv_fwd_tc", plan.tile, dtype=xv.dtype,
                   index=index_type(extent(xv), out.size, weight.size), grid=plan.grid, block=plan.threads,
                   window=spec, x=xv, weight=weight, bias=weight if bias is None else device.ascontiguous(bias),
                   out=out, n=spec.n, **batch_args("x", xv), groups=spec.groups,
                   channels_per_group=spec.channels_per_group, outputs_per_group=spec.outputs_per_group,
                   has_bias=bias is not None)
    return out


def stage_backward_copies(device, gy, xv, weight, spec: ConvSpec, needs: frozenset):
    """Within `sharing_channels_last`, ahead of `implicit_gemm_grad_input` (if "input" in needs) and
    `implicit_gemm_grad_weight` (if "weight"; with the bias gradient if "bias") on the same gy, xv and weight
    (contiguous): the channels-last copies they will ask for (grad_output, the weight arranged for the input
    gradient, x; grad_output's TF32 remainder for the fused bias sum), made by one launch instead of one each."""
    dtype = xv.dtype
    # (pass "input" alone: what conv_fwd_igemm_groups also takes at 8 channels a group, the weight gradient not)
    if _shared_copies.get() is None or tensor_core_refusal(
            spec, dtype, device, "input" if needs == {"input"} else None) is not None:
        return
    gy4 = device.reshape(gy, (spec.n, spec.out_channels, *spec.out_size))
    arrays = []
    if "input" in needs and igemm_refusal(spec, dtype, "input") is None:
        arrays += [gy4, weight_view(device, weight, spec, "input")]
    rest_of = None
    if "weight" in needs and weight_igemm_refusal(spec, dtype) is None:
        arrays += [xv, gy4]
        rest_of = gy4 if "bias" in needs and dtype == numpy.float32 else None
    _channels_last_all(device, arrays, True, rest_of)


def implicit_gemm_grad_input(device, gy, weight, spec: ConvSpec, out, bias=None):
    """grad_input into out (n, C, H, W) contiguous from gy (n, D, oH, oW), any strides, and weight (D, C / G, kH,
    kW) contiguous; a gather over the transposed window (no atomics).  Also patch's.  bias (C,) or None: added
    per channel (conv_transpose's forward), by conv_fwd_igemm's epilogue (one rounding), else after the kernel.
    With D / G a multiple of a vector (`igemm_refusal`) it is the channels-last forward kernel conv_fwd_igemm: at
    stride 1 on the transposed convolution, at larger strides on each phase's (`grad_input_phases`; a
    channels-last gy is read in place); else the generic conv_bwd_input_tc (gy made contiguous)."""
    _check_tensor_cores(spec, gy.dtype, device, "input")
    gy4 = device.reshape(gy, (spec.n, spec.out_channels, *spec.out_size))
    if igemm_refusal(spec, gy.dtype, "input") is None:
        # gy4 and the weight arranged (C, kH flipped, kW flipped, D / G) channels-last, copied by one launch
        gy_cl, arranged = channels_last_all(device, (gy4, weight_view(device, weight, spec, "input")))
        if spec.stride == (1, 1):
            return igemm_forward(device, gy_cl, arranged, bias, transposed_spec(spec), out)
        out4 = device.reshape(out, (spec.n, spec.in_channels, *spec.in_size))
        if not _grad_input_one_launch(device, gy_cl, arranged, spec, out4, bias):
            _grad_input_phased(device, gy_cl, arranged, spec, out4, bias)
        return out
    gy = device.ascontiguous(gy4)
    plan = plan_tensor_cores(spec, gy.dtype, "input")
    KERNELS.launch(device, "conv_bwd_input_tc", plan.tile, dtype=gy.dtype,
                   index=index_type(gy.size, out.size, weight.size), grid=plan.grid, block=plan.threads,
                   window=spec, grad_out=gy, weight=weight, grad_x=out, n=spec.n, groups=spec.groups,
                   channels_per_group=spec.channels_per_group, outputs_per_group=spec.outputs_per_group)
    return add_channel_bias(device, out, bias)   # (conv_bwd_input_tc has no bias)


# --- forward and input gradient, channels-last (the fast path) ----------------------------------------------
#
# conv_fwd_igemm (raw_kernels/implicit_gemm.cu, its section of that name): x channels-last, K ordered (tap,
# channel), 16-byte cp.async into a swizzled multistage pipeline, ldmatrix, the epilogue through shared memory.
# It runs the forward, and the input gradient as the forward of the transposed convolution (at stride > 1, one per
# phase: `grad_input_phases`), wherever `igemm_refusal` allows; everything else stays on the generic kernels above
# (conv_fwd_tc, conv_bwd_input_tc).

IG_THREADS = KERNELS.defines["IG_THREADS"]      # 4 warps, 2 x 2 warp tiles of (BM / 2) x (BN / 2)
IG_ROW_BYTES = KERNELS.defines["IG_ROW_BYTES"]  # a staged K chunk per row: 4 vectors of 16 bytes
IG_VECTOR_BYTES = 16                            # one cp.async: 8 channels of a 16-bit type, 4 floats
# (rows BM, columns BN, pipeline stages) of the instantiations, largest first.  128 x 128 and 256 x 64 (64 x 64
# warp tiles: the fewest ldmatrix per mma.sync) with 4 stages take 64 and 80 KiB of dynamic shared memory (opted
# in above 48 KiB); float32 keeps to 128 x 64 (its epilogue tile and registers would double).
IG_TILES = {"float16": ((128, 128, 4), (256, 64, 4), (128, 64, 4), (64, 64, 4)),
            "bfloat16": ((128, 128, 4), (256, 64, 4), (128, 64, 4), (64, 64, 4)),
            "float32": ((128, 64, 3), (64, 64, 4))}
# Groups of at most 32 columns (output channels; input channels for the input gradient), e.g. ResNeXt's 16 and
# 32 channels per group, would leave 1/2 to 3/4 of a 64-column tile's MMAs on padding: they take these 32-column
# tiles instead (every dtype, warps of (BM / 4) x 32 stacked 4 x 1), chosen by the same rule.  No 16-column
# tile: its 4 cp.async of A per 8 mma.sync a warp (17 SASS instructions per HMMA at 128 rows, 12 at 256, against
# 6.8 for 256 x 32) would cost more in issue than the halved MMAs of 16-channel groups save.
IG_NARROW_TILES = ((256, 32, 4), (128, 32, 4))
# The planner takes the largest tile that gives this many blocks (two waves of a 132-SM H100; a shape-only
# constant, so the plan never depends on the GPU), counting the splits of K that a grid under it may take: as many
# as bring it to IG_WAVE_BLOCKS blocks, each at least IG_SPLIT_CHUNKS chunks of K, within the workspace limit (float
# sums of out per split).  16 chunks: a shorter split's finish pass (a read of every split's sums) costs about
# what the split gains (benchmarks.predict: patch's input gradient, K = 18 chunks).
IG_WAVE_BLOCKS = 2 * PLAN_SMS
IG_SPLIT_CHUNKS = 16
# A split grid's splits fill its tile's own wave: IG_WAVE_BLOCKS / 2 SMs x the blocks of the tile an SM holds on
# sm_90 (NVRTC 13's registers with 32-bit indices; tests/test_sass.py checks them against the SASS).  Constants, so the
# plan stays shape-only.  A grid one split past its wave runs a second, mostly idle, wave: r50-512's 16-bit 13 x 4
# blocks of 128 x 128 in 6 splits are 312 blocks on 264 places, in 5 one wave (benchmarks/RESULTS.md, "ig512").
IG_BLOCKS_AN_SM = {(128, 128, 4): 2, (256, 64, 4): 2, (128, 64, 4): 3, (64, 64, 4): 5, (256, 32, 4): 3,
                   (128, 32, 4): 4, (128, 64, 3): 4}


def vector_elements(dtype) -> int:
    """Elements of dtype in one 16-byte cp.async: the granule the channels of the fast path come in."""
    return IG_VECTOR_BYTES // numpy.dtype(dtype).itemsize


def igemm_refusal(spec: ConvSpec, dtype, pass_: str) -> str | None:
    """Why the channels-last kernel cannot run pass_ ('forward' or 'input') of a problem the tensor cores take
    (`tensor_core_refusal` is None), or None when it can: the reduction's channels per group (C / G forward,
    D / G for the input gradient) must be whole 16-byte vectors.  (The input gradient at stride > 1 runs it once per
    phase: `grad_input_phases`.)"""
    vector = vector_elements(dtype)
    channels = spec.channels_per_group if pass_ == "forward" else spec.outputs_per_group
    if channels % vector:
        return f"its reduction needs channels per group in multiples of {vector}, not {channels}"
    return None


def channels_last(device, x, round_tf32: bool = True):
    """x (..., C, H, W), any strides (also patch's batch views), as an (n, H, W, C) C-contiguous array, n the
    product of the leading dims: a view when x is already laid out so (and 16-byte aligned), else a copy by
    channels_last_copy (a tiled transpose, coalesced on both sides).  float32 with round_tf32 is always copied,
    and rounded to tf32 on the way: the one rounding of the tensor cores' TF32 operands."""
    return channels_last_all(device, (x,), round_tf32)[0]


def channels_last_all(device, arrays, round_tf32: bool = True) -> list:
    """`channels_last` of each of arrays, the copies among them made together (`_channels_last_copies`: one launch
    for a tensor-core pass's operands)."""
    return _channels_last_all(device, arrays, round_tf32, None)[0]


def _channels_last_all(device, arrays, round_tf32: bool, rest_of) -> tuple[list, Any]:
    """(`channels_last_all` of arrays, the remainder of `channels_last_with_rest` of rest_of (float32, one of arrays)
    or None).  Within `sharing_channels_last` each copy (with its remainder, where made) is kept for later calls."""
    shared = _shared_copies.get()
    results: list = [None] * len(arrays)
    wanted: dict = {}   # key -> [the indices of arrays with that key, x, whether its remainder is wanted]
    rest = None
    for i, x in enumerate(arrays):
        *lead, c, h, w = x.shape
        rounds = round_tf32 and x.dtype == numpy.float32
        if not rounds:
            moved = x.transpose(*range(len(lead)), -2, -1, -3)
            if moved.flags.c_contiguous and _address(x) % IG_VECTOR_BYTES == 0:
                results[i] = moved.reshape(math.prod(lead), h, w, c)
                continue
        key = (_address(x), x.shape, x.strides, x.dtype.str, rounds)
        if shared is not None and key in shared and (x is not rest_of or shared[key][2] is not None):
            results[i] = shared[key][1]
            if x is rest_of:
                rest = shared[key][2]
            continue
        entry = wanted.setdefault(key, [[], x, False])
        entry[0].append(i)
        entry[2] = entry[2] or x is rest_of
    copies = _channels_last_copies(device, [(x, key[-1], with_rest) for key, (_, x, with_rest) in wanted.items()])
    for (key, (indices, x, with_rest)), (copy, its_rest) in zip(wanted.items(), copies):
        for i in indices:
            results[i] = copy
        if with_rest:
            rest = its_rest
        if shared is not None:   # x held with its copy: its memory cannot be reused by another array in the scope
            shared[key] = (x, copy, its_rest)
    return results, rest


_shared_copies: contextvars.ContextVar = contextvars.ContextVar("cupyconv_shared_channels_last", default=None)


@contextlib.contextmanager
def sharing_channels_last() -> Iterator[None]:
    """Within, `channels_last` copies each array (same memory, shape, strides, dtype and rounding) once: a
    backward's input and weight gradients read one channels-last copy of grad_output (r50-64 fp16 saves one
    grad_output-sized copy, about 10 us of 140, PREDICTED), made with the others together where
    `stage_backward_copies` ran.  Only for arrays nobody writes within the scope."""
    token = _shared_copies.set({})
    try:
        yield
    finally:
        _shared_copies.reset(token)


def _shares_memory(a, b) -> bool:
    return _address(a) == _address(b)   # a view of b in place (channels_last's), or a copy elsewhere


def channels_last_with_rest(device, x):
    """float32 x (..., C, H, W) as `channels_last` rounds it to tf32, and the tf32 of what that rounding left
    (tf32(x - tf32(x))), both (n, H, W, C), from one channels_last_copy: the operand and remainder of the
    TF32 weight gradient's fused bias sum, which adds the two to keep float's bits."""
    (copy,), rest = _channels_last_all(device, (x,), True, x)
    return copy, rest


def _channels_last_copies(device, jobs) -> list:
    """[(copy, rest or None)] of jobs [(x, rounds, with_rest)]: two or three (whole 16-byte vectors of channels,
    one rounding, 32-bit indices: the tensor-core passes' operands) a channels_last_copies launch, any other alone
    by channels_last_copy."""
    results: list = [None] * len(jobs)
    made = []   # (position, out, rest, x's batch view, index type)
    for i, (x, rounds, with_rest) in enumerate(jobs):
        *lead, c, h, w = x.shape
        if h * w > INT32_MAX:
            raise ValueError(f"channels_last: x {tuple(x.shape)} has planes of {h} x {w} pixels; channels_last_copy "
                             f"indexes a plane's pixels in 32 bits (at most 2^31 - 1)")
        out = device.empty((math.prod(lead), h, w, c), x.dtype)
        rest = device.empty(out.shape, x.dtype) if with_rest else None
        results[i] = (out, rest)
        if out.size:
            xv = batch_view(device, x)
            made.append((i, out, rest, xv, index_type(extent(xv), out.size)))
    together = [m for m in made if m[4] == "int" and m[1].shape[-1] % vector_elements(m[1].dtype) == 0
                and jobs[m[0]][1] == jobs[made[0][0]][1]]
    if len(together) < 2:
        together = []
    for i, out, rest, xv, index in made:
        if not any(m[0] == i for m in together):
            _channels_last_copy(device, xv, out, jobs[i][1], rest, index)
    for start in range(0, len(together), 3):
        _copies_launch(device, together[start:start + 3], jobs[together[start][0]][1])
    return results


def _copy_arguments(xv, out, rest) -> dict:
    """channels_last_copy's arguments of one copy (but rounding, index type and grid)."""
    n, h, w, c = out.shape
    inner = xv.shape[1]
    return dict(x=xv, out=out, rows=n * h * w, **batch_args("x", xv), channels=c, height=h, width=w,
                pixels_magic=fast_divmod_magic(h * w), width_magic=fast_divmod_magic(w),
                inner_magic=fast_divmod_magic(inner) if inner <= INT32_MAX else 0,
                rest=out if rest is None else rest, with_rest=rest is not None)


def _channels_last_copy(device, xv, out, rounds: bool, rest, index: str):
    """channels_last_copy of xv, a batch view, into out: the rows (image, pixel) of every image in one flat index,
    CL_ROWS a tile, each tile's channels CL_CHANNEL_BYTES at a time (blockIdx.y); its blocks loop over the row
    tiles."""
    args = _copy_arguments(xv, out, rest)
    row_tiles = ceil_div(args["rows"], CL_ROWS)
    KERNELS.launch(device, "channels_last_copy", (out.shape[-1] % vector_elements(out.dtype) == 0,), dtype=out.dtype,
                   index=index, grid=(capped_grid(row_tiles), ceil_div(out.shape[-1] * out.itemsize, CL_CHANNEL_BYTES)),
                   block=CL_THREADS, row_tiles=row_tiles, round_tf32=rounds, **args)


def _copies_launch(device, jobs, rounds: bool):
    """channels_last_copies of two or three jobs [(position, out, rest, batch view, "int")]: along y the channel
    blocks of the job with most; a job with cb channel blocks reads y as (lane, channel block) with cb padded to
    2^shift and runs the lanes whose cb channel blocks all lie in the grid; its blocks along x (after job j - 1's)
    are its row-tile blocks (capped, looping) shared among its lanes.  Where every job has one lane, the
    instantiation without the lanes' decode (LANES false)."""
    args: dict = {}
    ends: list[int] = []
    owns = [ceil_div(out.shape[-1] * out.itemsize, CL_CHANNEL_BYTES) for _, out, *_ in jobs]   # channel blocks
    channel_blocks = max(owns)
    for j in range(3):
        k = min(j, len(jobs) - 1)   # a third job of two repeats the second, with no blocks
        _, out, rest, xv, _ = jobs[k]
        one = _copy_arguments(xv, out, rest)
        shift = (owns[k] - 1).bit_length()   # its channel blocks padded to 2^shift: the whole lanes that fit in y
        lanes = ((channel_blocks - owns[k]) >> shift) + 1
        args.update({f"{name}{j}": value for name, value in {**one, "shift": shift, "lanes": lanes}.items()})
        blocks = capped_grid(ceil_div(ceil_div(one["rows"], CL_ROWS), CL_COPIES_TILES * lanes))
        ends.append((ends[-1] if ends else 0) + (blocks if j < len(jobs) else 0))
    some_lanes = any(args[f"lanes{j}"] > 1 for j in range(3))
    KERNELS.launch(device, "channels_last_copies", (some_lanes,), dtype=jobs[0][1].dtype, index="int",
                   grid=(ends[2], channel_blocks), block=CL_THREADS, block_end0=ends[0], block_end1=ends[1],
                   round_tf32=rounds, **args)


def is_channels_last(a) -> bool:
    """Whether a (n, C, H, W) lies in channels-last (NHWC) memory, the way torch's `channels_last` tensors and
    NumPy/CuPy transposes of (n, H, W, C) arrays do, and not also C-contiguous (C or H * W of 1: both read as
    NCHW, as torch's rule does)."""
    return a.ndim == 4 and not a.flags.c_contiguous and a.transpose(0, 2, 3, 1).flags.c_contiguous


def forward_output(device, x, weight, spec: ConvSpec):
    """The forward's out (n, D, oH, oW) for x: in channels-last memory (a view of an (n, oH, oW, D) array) when x
    is channels-last and conv_fwd_igemm runs (its epilogue writes either layout) with whole 16-byte vectors of
    output channels per group (its channels-last stores are 16 bytes only), as torch's convolutions answer
    channels-last inputs; else C-contiguous.  The other kernels and the CPU path write NCHW."""
    if (is_channels_last(x) and tensor_core_refusal(spec, x.dtype, device, "forward") is None
            and igemm_refusal(spec, x.dtype, "forward") is None
            and spec.outputs_per_group % vector_elements(x.dtype) == 0):
        out = device.empty((spec.n, *spec.out_size, spec.out_channels), x.dtype)
        if _address(out) % IG_VECTOR_BYTES == 0:
            return out.transpose(0, 3, 1, 2)
    return device.empty(spec.output_shape, x.dtype)


def weight_view(device, weight, spec: ConvSpec, pass_: str):
    """The view of the weight (D, C / G, kH, kW) whose `channels_last` copy is B in the order conv_fwd_igemm reads
    it: for the forward the weight itself, copied as (D, taps, C / G); for the input gradient (G, C / G, D / G, kH,
    kW) with the taps flipped (negative strides), copied as (C, flipped taps, D / G) per group (the transposed
    convolution's weight).  Copied with the pass's other operand, one launch (`channels_last_all`)."""
    if pass_ == "forward":
        return weight
    g, dg, cg = spec.groups, spec.outputs_per_group, spec.channels_per_group
    flipped = device.reshape(weight, (g, dg, cg, *spec.kernel_size))[..., ::-1, ::-1]
    return flipped.transpose(0, 2, 1, 3, 4)


# The input gradient at stride s > 1 ("strided dgrad"): input row y = s * q + r (phase r, 0 <= r < s) receives
# grad_output row o through tap i only where o * s - pad + i * d = y, i.e. (r + pad - i * d) % s == 0.  Those taps
# are every t-th, t = s / gcd(s, d), from the first such i0, and o = q + c0 - j * d' for the j-th of them, with c0 =
# (r + pad - i0 * d) / s and d' = d / gcd(s, d): phase r is a stride-1 convolution of grad_output by the phase's
# taps, flipped, at dilation d', padded (m - 1) * d' - c0 above (negative: it crops), over the phase's rows
# ceil((H - r) / s).  Per axis; a phase of the plane is one of each axis.  A phase without taps (k < s, or a
# dilation sharing a factor with s) receives nothing: zeros.


@dataclasses.dataclass(frozen=True)
class AxisPhase:
    """Phase `first` of one axis of a strided input gradient: its rows first, first + stride, ... of the input
    (`rows` of them), the original taps it takes (`taps`, empty: none), the stride-1 convolution's dilation and
    padding (low, high; negative crops)."""
    first: int
    rows: int
    taps: range
    dilation: int
    padding: tuple[int, int]


def axis_phases(kernel: int, stride: int, dilation: int, pad: int, size: int, out_size: int) -> list[AxisPhase]:
    """The phases of one axis with at least one input row (size rows of input, out_size of grad_output)."""
    phases = []
    step = stride // math.gcd(stride, dilation)
    for first in range(min(stride, size)):
        rows = ceil_div(size - first, stride)
        phase_dilation = step * dilation // stride
        i0 = next((i for i in range(min(kernel, step)) if (first + pad - i * dilation) % stride == 0), None)
        if i0 is None:   # no tap of this phase within the kernel
            phases.append(AxisPhase(first, rows, range(0), phase_dilation, (0, 0)))
            continue
        taps = range(i0, kernel, step)
        low = (len(taps) - 1) * phase_dilation - (first + pad - i0 * dilation) // stride
        high = rows - out_size + (len(taps) - 1) * phase_dilation - low
        phases.append(AxisPhase(first, rows, taps, phase_dilation, (low, high)))
    return phases


def grad_input_phases(spec: ConvSpec) -> list[tuple[AxisPhase, AxisPhase]]:
    """The (row, column) phases of spec's input gradient (2-D spec), row-major; stride 1 has one, the whole plane."""
    rows, columns = [axis_phases(k, s, d, pad, size, out)
                     for k, s, d, (pad, _), size, out in zip(spec.kernel_size, spec.stride, spec.dilation, spec.padding,
                                                             spec.in_size, spec.out_size)]
    return list(itertools.product(rows, columns))


def phase_spec(spec: ConvSpec, phase: tuple[AxisPhase, AxisPhase]) -> ConvSpec:
    """The stride-1 convolution of grad_output (n, D, oH, oW) whose output is the phase's pixels of grad_input
    (n, C, rows, columns): `transposed_spec` of the phase's taps."""
    return ConvSpec(spec.op, spec.batch, spec.out_channels, spec.in_channels, spec.groups, spec.out_size,
                    tuple(len(p.taps) for p in phase), (1, 1), tuple(p.dilation for p in phase),
                    tuple(p.padding for p in phase), tuple(p.rows for p in phase))


def phase_steps(spec: ConvSpec) -> tuple[int, ...]:
    """Per axis, the step between the taps of one phase: stride / gcd(stride, dilation)."""
    return tuple(s // math.gcd(s, d) for s, d in zip(spec.stride, spec.dilation))


@dataclasses.dataclass(frozen=True)
class PhasesPlan:
    """The one conv_fwd_igemm launch of all the phases of a strided input gradient (`plan_phases`): the stride-1
    GEMM every phase is (`gemm`: phase (0, 0)'s rows and columns, the most; each block sets its own phase's), its
    tile and split of K (`igemm`, planned for all the phases' rows together), the grid (phase (0, 0)'s row tiles,
    column tiles, splits x phases), and per axis the phases with rows (`counts`) and the step between a phase's
    taps (`steps`)."""
    gemm: ConvSpec
    igemm: IgemmPlan
    grid: tuple[int, int, int]
    counts: tuple[int, ...]
    steps: tuple[int, ...]


def plan_phases(spec: ConvSpec, dtype) -> PhasesPlan | None:
    """The plan of `_grad_input_one_launch` for spec's input gradient at stride > 1, or None where every phase with
    taps does not take the same taps per axis (the kernel not a multiple of `phase_steps`: k 3 at stride 2), the
    grid's z (splits x phases) would pass CUDA's limit, or an index would pass 32 bits (conv_fwd_igemm_phases is
    instantiated for int only): those run a launch of conv_fwd_igemm per phase."""
    steps = phase_steps(spec)
    if any(k % step for k, step in zip(spec.kernel_size, steps)):
        return None
    counts = tuple(min(s, size) for s, size in zip(spec.stride, spec.in_size))   # phases per axis with rows
    taps = tuple(k // step for k, step in zip(spec.kernel_size, steps))
    rows = tuple(ceil_div(size, s) for size, s in zip(spec.in_size, spec.stride))   # phase (0, 0)'s: the most
    gemm = ConvSpec(spec.op, spec.batch, spec.out_channels, spec.in_channels, spec.groups, spec.out_size, taps,
                    (1, 1), tuple(step * d // s for step, d, s in zip(steps, spec.dilation, spec.stride)),
                    ((0, 0), (0, 0)), rows)
    phases = math.prod(counts)
    plan = plan_igemm(dataclasses.replace(gemm, batch=(spec.n * phases,)), dtype)
    if plan.splits * phases > MAX_GRID[2]:
        return None
    grad_input = spec.n * spec.in_channels * math.prod(spec.in_size)   # the sizes `_grad_input_one_launch` indexes
    if index_type(spec.n * spec.out_channels * spec.out_pixels, grad_input * max(plan.splits, 1),
                  spec.out_channels * spec.channels_per_group * spec.taps) != "int":
        return None
    grid = (ceil_div(spec.n * math.prod(rows), plan.tile[0]), plan.grid[1], plan.splits * phases)
    return PhasesPlan(gemm, plan, grid, counts, steps)


def _grad_input_one_launch(device, gy_cl, arranged, spec: ConvSpec, out, bias=None) -> bool:
    """out (n, C, H, W) contiguous by ONE conv_fwd_igemm_phases over all the phases (`plan_phases`; blockIdx.z:
    split and phase, each block deriving its phase's padding, size, place in out and weight: `ig_axis_phase`), phases
    without taps included (their blocks reduce nothing and write zeros), from gy_cl, grad_output channels-last, and
    one phase-major weight (steps_h, steps_w, C, taps_h, taps_w, D / G); split sums (in out's layout) finished by
    one pass; bias (C,) or None added per channel before the one rounding, phases without taps included (their
    pixels are the bias alone).  False (nothing done) where `plan_phases` refuses, for `_grad_input_phased`."""
    phases_plan = plan_phases(spec, gy_cl.dtype)
    if phases_plan is None:
        return False
    gemm, plan, steps, counts = phases_plan.gemm, phases_plan.igemm, phases_plan.steps, phases_plan.counts
    taps = gemm.kernel_size
    vector = vector_elements(gy_cl.dtype)
    whole_vectors = all(PhasePlacement((ph.first, pw.first), spec.stride, spec.in_size).vector_store(pw.rows, vector)
                        for ph, pw in grad_input_phases(spec))
    # flipped tap j = t * step + (step - 1 - i0) for the t-th tap of the phase whose first original tap is i0
    c, dg = spec.in_channels, spec.outputs_per_group
    wk = device.ascontiguous(device.reshape(arranged, (c, taps[0], steps[0], taps[1], steps[1], dg))
                             .transpose(2, 4, 0, 1, 3, 5))
    partial = device.empty((plan.splits if plan.splits > 1 else 0, *out.shape), numpy.float32)
    index = index_type(gy_cl.size, out.size, wk.size, partial.size)   # "int" (`plan_phases`)
    placement = PhasePlacement((0, 0), spec.stride, spec.in_size).arguments()   # phase_first: per block
    (pad_top, _), (pad_left, _) = spec.padding
    KERNELS.launch(device, "conv_fwd_igemm_phases", plan.tile, dtype=gy_cl.dtype, index=index,
                   grid=phases_plan.grid,
                   block=IG_THREADS, shared_mem=plan.shared_mem, window=gemm, x=gy_cl, weight=wk,
                   bias=wk if bias is None else device.ascontiguous(bias), out=out,
                   n=spec.n, groups=spec.groups, channels_per_group=gemm.channels_per_group,
                   outputs_per_group=gemm.outputs_per_group, has_bias=bias is not None,
                   vector_store=whole_vectors and _address(out) % IG_VECTOR_BYTES == 0, channels_last_out=False,
                   partial=partial, chunks_per_split=plan.chunks_per_split, **placement, phases_h=counts[0],
                   phases_w=counts[1], grad_stride_h=spec.stride[0], grad_stride_w=spec.stride[1],
                   grad_dilation_h=spec.dilation[0], grad_dilation_w=spec.dilation[1], grad_pad_top=pad_top,
                   grad_pad_left=pad_left, grad_step_h=steps[0], grad_step_w=steps[1], grad_height=spec.in_size[0],
                   grad_width=spec.in_size[1], phase_weight_size=wk.size // (steps[0] * steps[1]))
    if plan.splits > 1:
        KERNELS.launch(device, "conv_bwd_weight_igemm_finish", dtype=gy_cl.dtype, index=index,
                       grid=capped_grid(ceil_div(out.size, WG_FINISH_BLOCK)), block=WG_FINISH_BLOCK, partial=partial,
                       bias_partial=partial, grad_weight=out, grad_bias=out, splits=plan.splits,
                       out_channels=spec.n * spec.in_channels, channels_per_group=math.prod(spec.in_size), taps=1,
                       has_bias=False, **IN_PLACE)
    return True


def _grad_input_phased(device, gy_cl, arranged, spec: ConvSpec, out, bias=None):
    """out (n, C, H, W) contiguous: each phase with taps by conv_fwd_igemm from gy_cl (grad_output channels-last) and
    its slice of the weight arranged once (flipped, so a phase's taps are every t-th from the far end), its
    epilogue (or its split sums' final pass) writing the phase's pixels of out in place (`PhasePlacement`: no
    buffer, no copy), with bias (C,) when given; phases without taps are filled with zeros (or the bias), after
    the launches."""
    empties = []
    for phase in grad_input_phases(spec):
        if not all(p.taps for p in phase):
            empties.append(out[:, :, phase[0].first::spec.stride[0], phase[1].first::spec.stride[1]])
            continue
        flipped = tuple(slice(k - 1 - p.taps[-1], k - p.taps[0], p.taps.step) for k, p in zip(spec.kernel_size, phase))
        placement = PhasePlacement((phase[0].first, phase[1].first), spec.stride, spec.in_size)
        igemm_forward(device, gy_cl, device.ascontiguous(arranged[:, flipped[0], flipped[1]]), bias,
                      phase_spec(spec, phase), out, placement)
    for pixels in empties:
        device.copyto(pixels, 0 if bias is None else bias.reshape(-1, 1, 1))


@dataclasses.dataclass(frozen=True)
class PhasePlacement:
    """Where a phase's output pixels (i, j) lie in the (H, W) planes of the NCHW grad_input it is written into:
    (first[0] + stride[0] * i, first[1] + stride[1] * j).  As the kernels take it (`ig_phase_pixel`): a plane of H
    * W elements, the phase's first pixel, the step to its next row and to its next column."""
    first: tuple[int, ...]
    stride: tuple[int, ...]
    size: tuple[int, ...]

    def arguments(self) -> dict[str, Any]:
        (h, w), (fh, fw), (sh, sw) = self.size, self.first, self.stride
        return dict(out_plane=h * w, phase_first=fh * w + fw, phase_row_step=sh * w, phase_column_step=sw)

    def vector_store(self, width: int, vector: int) -> bool:
        """Whether `vector` consecutive pixels of the phase (width columns), from a multiple of `vector`, are
        contiguous in grad_input and 16-byte aligned there (given grad_input aligned)."""
        arguments = self.arguments()
        return (arguments["phase_column_step"] == 1 and width % vector == 0
                and all(arguments[k] % vector == 0 for k in ("out_plane", "phase_first", "phase_row_step")))


# The final pass of the weight gradient (and of a whole-array forward's splits) writes in place: no phase.
IN_PLACE: dict[str, Any] = dict(out_plane=0, phase_first=0, phase_row_step=0, phase_column_step=0, phase_width=0)


@dataclasses.dataclass(frozen=True)
class IgemmPlan:
    """One conv_fwd_igemm launch: the tile (rows, columns, stages), grid (row tiles, groups x column tiles,
    splits of K), dynamic shared memory (the pipeline's stages, or the epilogue's tile where that is larger) and
    the chunks of K each split reduces (all of them when there is one split)."""
    tile: tuple[int, int, int]
    grid: tuple[int, int, int]
    shared_mem: int
    chunks_per_split: int

    @property
    def splits(self) -> int:
        return self.grid[2]


IG_HALF_LIMIT = 2**14   # `ig_fits_halves`


def ig_fits_halves(spec: ConvSpec) -> bool:
    """Whether conv_fwd_igemm's 256 x 64 tile (ig_forward's PACKED: a row's window origin y, x as the 16-bit
    halves of one register) can run spec's window: on each axis the image, the padding before it, the reach of the
    outputs (stride x (out - 1)) and of the kernel (dilation x (kernel - 1)) below 2^14, so that every y + dy and
    x + dx lies in (-2^14, 2^15) and the low half never carries into the high one.  Else the planner takes 128 rows."""
    return all(size < IG_HALF_LIMIT and pad[0] < IG_HALF_LIMIT and s * (out - 1) < IG_HALF_LIMIT and
               d * (k - 1) < IG_HALF_LIMIT
               for size, pad, s, out, d, k in zip(spec.in_size, spec.padding, spec.stride, spec.out_size, spec.dilation,
                                                  spec.kernel_size))


def ig_wave(tile: tuple[int, int, int]) -> int:
    """The blocks of a 2-D conv_fwd_igemm tile that run at once on IG_WAVE_BLOCKS / 2 SMs (`IG_BLOCKS_AN_SM`)."""
    return max(1, IG_WAVE_BLOCKS * IG_BLOCKS_AN_SM[tile] // 2)


def wave_splits(chunks: int, blocks: int, wave: int, split_bytes: int) -> tuple[int, int]:
    """(splits, chunks per split) of a grid of `blocks` under its wave: the count, within `split_reduction`'s
    limits (IG_SPLIT_CHUNKS chunks a split, the workspace), whose waves times chunks a split are fewest, the fewer
    splits on a tie (less to add after).  Never past the wave by a few blocks: those would run a wave of their own."""
    return fewest_wave_chunks(chunks, blocks, wave, split_reduction(chunks, 1, MAX_GRID[2], IG_SPLIT_CHUNKS,
                                                                    split_bytes)[0])


def fewest_wave_chunks(chunks: int, blocks: int, wave: int, most: int) -> tuple[int, int]:
    """(splits, chunks per split), at most `most` splits, of `chunks` over a grid of `blocks` a split whose waves
    (`wave` blocks each) times chunks a split are fewest; the fewer splits on a tie."""
    splits = min(range(1, most + 1), key=lambda s: (ceil_div(blocks * s, wave) * ceil_div(chunks, s), s))
    per_split = ceil_div(chunks, splits)
    return ceil_div(chunks, per_split), per_split


def plan_igemm(spec: ConvSpec, dtype, table: dict | None = None, narrow: tuple = IG_NARROW_TILES) -> IgemmPlan:
    """The tile and split of K of conv_fwd_igemm for spec (a forward; the input gradient plans its transposed
    spec), by the shapes only (never the SM count), from IG_TILES[dtype] (IG_NARROW_TILES for groups of at most 32
    columns; 128 columns only for groups of more than 64), largest first:
    - the largest tile that gives IG_WAVE_BLOCKS blocks, unsplit;
    - else (a grid under a wave) the largest tile whose splits of K fill its own wave (`ig_wave`: the blocks of
      that tile an SM holds, `IG_BLOCKS_AN_SM`, on IG_WAVE_BLOCKS / 2 SMs) so that one more split would pass it,
      else the smallest tile, each split by `wave_splits` (the fewest waves x chunks a split: never a few blocks
      into a second wave; splits of at least IG_SPLIT_CHUNKS chunks, their float32 sums of out within the
      workspace limit).  The 3-D tiles (table) keep the rule before: splits that bring the grid to IG_WAVE_BLOCKS.
    So a long K under a wave (few pixels, many channels) runs on the largest tile its splits fill (64 x 64 warp
    tiles for 16-bit types: half the ldmatrix per mma.sync of the 64 x 64 tile's 32 x 32) rather than on the
    smallest one, and a short K unsplit.  (table, narrow: the 3-D kernel's tiles, IG_3D_TILES and IG_3D_NARROW.)"""
    rows, cols = spec.n * spec.out_pixels, spec.outputs_per_group
    by_dtype = IG_TILES if table is None else table
    tiles = narrow if cols <= 32 else [t for t in by_dtype[numpy.dtype(dtype).name] if t[1] <= 64 or cols > 64]
    if table is None and not ig_fits_halves(spec):   # conv_fwd_igemm's 256 x 64 packs a row's y, x in halves
        tiles = [t for t in tiles if t[0] <= 128]
    itemsize = numpy.dtype(dtype).itemsize
    chunks = max(1, ceil_div(spec.taps * spec.channels_per_group, IG_ROW_BYTES // itemsize))
    split_bytes = spec.n * spec.out_channels * spec.out_pixels * 4
    plans = []   # (tile, grid, splits, chunks per split), largest tile first
    for tile in tiles:
        grid = (ceil_div(rows, tile[0]), spec.groups * ceil_div(cols, tile[1]))
        if table is None and grid[0] * grid[1] < IG_WAVE_BLOCKS:
            plans.append((tile, grid, *wave_splits(chunks, grid[0] * grid[1], ig_wave(tile), split_bytes)))
        else:
            plans.append((tile, grid, *split_reduction(chunks, grid[0] * grid[1], IG_WAVE_BLOCKS, IG_SPLIT_CHUNKS,
                                                       split_bytes)))
    blocks = [grid[0] * grid[1] for _, grid, _, _ in plans]
    fills = ((lambda p, b: b * (p[2] + 1) > ig_wave(p[0])) if table is None
             else (lambda p, b: b * p[2] >= IG_WAVE_BLOCKS))
    tile, grid, splits, per_split = next(
        itertools.chain((p for p, b in zip(plans, blocks) if b >= IG_WAVE_BLOCKS),
                        (p for p, b in zip(plans, blocks) if fills(p, b)), plans[-1:]))
    return IgemmPlan(tile, (*grid, splits), ig_shared_bytes(tile, itemsize), per_split)


def ig_shared_bytes(tile: tuple[int, int, int], itemsize: int) -> int:
    """conv_fwd_igemm's dynamic shared memory: the pipeline's stages, or the epilogue's tile where larger: NCHW
    (bn, bm) with 16 bytes of padding a column, channels-last (bm, bn) with 8 elements a row."""
    bm, bn, stages = tile
    return max(stages * (bm + bn) * IG_ROW_BYTES, bn * (bm * itemsize + IG_VECTOR_BYTES), bm * (bn + 8) * itemsize)


# --- small groups, several a block ------------------------------------------------------------------------
# conv_fwd_igemm_groups (the section of that name at the end of implicit_gemm.cu): groups of 16 or 32 channels in
# and out, 128 bytes of them a block (4 or 2 groups of a 16-bit type, 2 groups of 16 floats as TF32), K chunk = one
# tap x the block's channels; a block-diagonal GEMM with no MMA on padding, x read once for all of a block's groups.
# igemm_forward takes it for the forward and the stride-1 input gradient (the transposed problem: C / G and D / G
# swap) wherever `groups_igemm_refusal` allows.  ResNeXt's rx-512 (32 groups of 16, 14 x 14) fp16 forward,
# PREDICTED (H100): see benchmarks/RESULTS.md, "Small groups, several a block".

IGG_ROW_BYTES = 128                 # implicit_gemm.cu's IGG_ROW_BYTES: a block's channels (in and out) per pixel
# channels per group (in = out) of its instantiations: at least two groups a block (float32: 32 channels, so 16);
# IGG_GROUP_CHANNELS for both kernels, conv_fwd_igemm_groups alone also 8 of a 16-bit type (8 groups a block, a
# K chunk of two taps: see its section), the forward and stride-1 input gradient of ResNeXt's rx-256
IGG_GROUP_CHANNELS = {"float16": (16, 32), "bfloat16": (16, 32), "float32": (16,)}
IGG_FORWARD_CHANNELS = {"float16": (8, 16, 32), "bfloat16": (8, 16, 32), "float32": (16,)}
IGG_ROWS, IGG_STAGES = 128, 3       # pixels of a block; pipeline stages (a K chunk is one tap)


def igemm_groups_channels(dtype) -> int:
    """Input (and output) channels of one conv_fwd_igemm_groups block: 64 of a 16-bit type, 32 floats."""
    return IGG_ROW_BYTES // numpy.dtype(dtype).itemsize


def igemm_groups_tile(channels_per_group: int) -> tuple[int, int, int]:
    """conv_fwd_igemm_groups' template constants (BM, CG, STAGES)."""
    return IGG_ROWS, channels_per_group, IGG_STAGES


def groups_igemm_refusal(spec: ConvSpec, dtype, table=None) -> str | None:
    """Why conv_fwd_igemm_groups cannot run this forward (or the transposed spec of a stride-1 input gradient), or
    None; table IGG_GROUP_CHANNELS: why conv_bwd_weight_igemm_groups cannot run its weight gradient.  Call where
    `igemm_refusal` said yes."""
    # (a tensor-core dtype: `tensor_core_refusal`)
    channels = (IGG_FORWARD_CHANNELS if table is None else table)[numpy.dtype(dtype).name]
    if spec.groups < 2 or spec.channels_per_group not in channels:
        counts = " or ".join(filter(None, (", ".join(map(str, channels[:-1])), str(channels[-1]))))
        return (f"it takes groups of {counts} channels in {numpy.dtype(dtype).name}, not "
                f"{spec.groups} of {spec.channels_per_group}")
    if spec.outputs_per_group != spec.channels_per_group:
        return (f"it takes as many output channels per group as input ones, not {spec.outputs_per_group} from "
                f"{spec.channels_per_group}")
    return None


def few_channels_groups(spec: ConvSpec, dtype, pass_: str | None) -> bool:
    """Whether pass_ ('forward', or 'input' at stride 1: the forward of `transposed_spec`) of a 2-D spec with fewer
    than TC_MIN_CHANNELS channels a group runs on conv_fwd_igemm_groups (8 of a 16-bit type in and out)."""
    if pass_ not in ("forward", "input") or len(spec.kernel_size) != 2 or numpy.dtype(dtype).name not in TC_DTYPES:
        return False
    if pass_ == "input" and tuple(spec.stride) != (1, 1):
        return False
    gemm = spec if pass_ == "forward" else transposed_spec(spec)
    return igemm_refusal(spec, dtype, pass_) is None and groups_igemm_refusal(gemm, dtype) is None


# 'auto' (`few_channels_preferred`) takes conv_fwd_igemm_groups for 8 channels a group from this many
# multiply-adds a pass.  It saves GPU time at any size (PREDICTED H100 rx-256, N 32: the forward's conv_fwd_direct
# 32.6-74.1 us -> channels_last_copies 6.3-13.6 + conv_fwd_igemm_groups 16.5-28.8) but launches the copy of x (or
# grad_output) besides, and the host's 25-30 us a launch leave its wall time host-bound: slower than the direct
# kernel's at rx-256 N 32 (462M) on both models, faster at both ends from N 42 on the H100's and from about N 70 on
# the H200's (N 80, 1.16G: H100 fwd 79.2-179.2 -> 53.5-94.1 us, H200 79.2-179.2 -> 70.6-103.2; N 64: H200's low end
# 63.6 -> 70.6): see RESULTS.md, "8 channels a group on the tensor cores".
IGG_FEW_MIN_MACS = 1_100_000_000


def few_channels_preferred(spec: ConvSpec) -> bool:
    """Whether 'auto' runs the forward or stride-1 input gradient (the same multiply-adds) of a spec with fewer than
    TC_MIN_CHANNELS channels a group on the tensor cores where `few_channels_groups` says they can: only where the
    work outweighs the channels-last copy's launch."""
    macs = spec.n * spec.out_pixels * spec.out_channels * spec.channels_per_group * spec.taps
    return macs >= IGG_FEW_MIN_MACS


def plan_igemm_groups(spec: ConvSpec, dtype) -> IgemmPlan:
    """conv_fwd_igemm_groups' launch: IGG_ROWS pixels by `igemm_groups_channels` channels a block (the last may cover
    fewer groups), no split of K; shared memory for its stages, or its epilogue's tile where larger (NCHW: a column
    of IGG_ROWS elements + 16 bytes a channel; channels-last: IGG_ROWS rows of the channels + 8 elements)."""
    bm, cg, stages = igemm_groups_tile(spec.channels_per_group)
    itemsize, channels = numpy.dtype(dtype).itemsize, igemm_groups_channels(dtype)
    chunk_taps = 2 if cg * itemsize == IG_VECTOR_BYTES else 1   # a group of one vector: two taps a chunk
    shared = max(stages * chunk_taps * (bm + cg) * IGG_ROW_BYTES, channels * (bm * itemsize + IG_VECTOR_BYTES),
                 bm * (channels + 8) * itemsize)
    grid = (ceil_div(spec.n * spec.out_pixels, bm), ceil_div(spec.in_channels, channels), 1)
    return IgemmPlan((bm, cg, stages), grid, shared, ceil_div(spec.taps, chunk_taps))


def _igemm_groups_forward(device, xl, wk, bias, spec: ConvSpec, out):
    """igemm_forward's launch of conv_fwd_igemm_groups (the whole output, NCHW or channels-last)."""
    plan = plan_igemm_groups(spec, xl.dtype)
    nhwc = is_channels_last(out)
    memory = out.transpose(0, 2, 3, 1) if nhwc else out
    whole_vectors = nhwc or spec.out_pixels % vector_elements(xl.dtype) == 0
    KERNELS.launch(device, "conv_fwd_igemm_groups", plan.tile, dtype=xl.dtype,
                   index=index_type(xl.size, out.size, wk.size), grid=plan.grid, block=IG_THREADS,
                   shared_mem=plan.shared_mem, window=spec, x=xl, weight=wk,
                   bias=wk if bias is None else device.ascontiguous(bias), out=memory, n=spec.n, groups=spec.groups,
                   has_bias=bias is not None,
                   vector_store=whole_vectors and _address(out) % IG_VECTOR_BYTES == 0, channels_last_out=nhwc)
    return out


def igemm_forward(device, xl, wk, bias, spec: ConvSpec, out, phase: PhasePlacement | None = None):
    """conv_fwd_igemm: out (n, D, oH, oW), C-contiguous or channels-last (`forward_output`), from xl (n, H, W, C)
    and wk (D, taps, C / G), both C-contiguous and 16-byte aligned (`channels_last`, `weight_view`), bias (D,)
    or None.  Split (`plan_igemm`), the splits' float32 sums (the bias in the first; the output's layout) are added
    in split order and rounded once by the weight gradient's final pass, conv_bwd_weight_igemm_finish, with one
    tap: out's own layout, no permutation.
    With `phase`, out is the whole NCHW C-contiguous grad_input (n, D, H, W) and the (oH, oW) output pixels are a
    phase of its planes: the epilogue, or the final pass, writes them there directly (16-byte vectors where the
    phase's rows are contiguous runs of whole vectors, `PhasePlacement.vector_store`; scalar stores otherwise)."""
    if phase is None and groups_igemm_refusal(spec, xl.dtype) is None:   # small groups: several a block
        return _igemm_groups_forward(device, xl, wk, bias, spec, out)
    if phase is None and device.wgmma and wgmma_gemm.wgmma_preferred(spec, xl.dtype) and \
            wgmma_gemm.wgmma_refusal(spec, xl.dtype, xl.size, out.size, wk.size, is_channels_last(out)) is None:
        return wgmma_gemm.wgmma_forward(device, xl, wk, bias, spec, out)   # Hopper: the same GEMM on wgmma
    plan = plan_igemm(spec, xl.dtype)
    vector = vector_elements(xl.dtype)
    nhwc = phase is None and is_channels_last(out)
    memory = out.transpose(0, 2, 3, 1) if nhwc else out   # the C-contiguous array the kernels write
    if phase is None:   # the whole output: the phase of stride 1 that covers its planes
        whole_vectors = nhwc or spec.out_pixels % vector == 0   # (channels-last: `forward_output` made sure)
        placement = PhasePlacement((0, 0), (1, 1), spec.out_size).arguments()
        sums_shape = memory.shape
    else:
        whole_vectors = phase.vector_store(spec.out_size[1], vector)
        placement = phase.arguments()
        sums_shape = (*memory.shape[:2], *spec.out_size)   # the phase's own (n, D, oH, oW) pixels, contiguous
    # the splits' sums in the GEMM's own output layout
    partial = device.empty((plan.splits if plan.splits > 1 else 0, *sums_shape), numpy.float32)
    index = index_type(xl.size, out.size, wk.size, partial.size)
    KERNELS.launch(device, "conv_fwd_igemm", plan.tile, dtype=xl.dtype, index=index,
                   grid=plan.grid, block=IG_THREADS, shared_mem=plan.shared_mem, window=spec, x=xl, weight=wk,
                   bias=wk if bias is None else device.ascontiguous(bias), out=memory, n=spec.n, groups=spec.groups,
                   channels_per_group=spec.channels_per_group, outputs_per_group=spec.outputs_per_group,
                   has_bias=bias is not None,
                   vector_store=whole_vectors and _address(out) % IG_VECTOR_BYTES == 0, channels_last_out=nhwc,
                   partial=partial, chunks_per_split=plan.chunks_per_split, **placement)
    if plan.splits > 1:
        _add_forward_splits(device, partial, memory, spec, index,
                            IN_PLACE if phase is None else dict(placement, phase_width=spec.out_size[1]))
    return out


def _add_forward_splits(device, partial, memory, spec: ConvSpec, index: str, placement: dict):
    """A split forward's float32 sums, partial (splits, *its output pixels), added in split order and rounded once
    into memory (the array the forward kernel writes) by the weight gradient's final pass with one tap: out's own
    layout (`IN_PLACE`), or a phase's pixels placed in grad_input (`PhasePlacement.arguments` and phase_width)."""
    splits = partial.shape[0]
    KERNELS.launch(device, "conv_bwd_weight_igemm_finish", dtype=memory.dtype, index=index,
                   grid=capped_grid(ceil_div(partial.size // splits, WG_FINISH_BLOCK)), block=WG_FINISH_BLOCK,
                   partial=partial, bias_partial=partial, grad_weight=memory, grad_bias=memory, splits=splits,
                   out_channels=spec.n * spec.out_channels, channels_per_group=spec.out_pixels, taps=1,
                   has_bias=False, **placement)


def implicit_gemm_grad_weight(device, xv, gy, spec: ConvSpec, with_bias: bool = False):
    """(grad_weight (D, C / G, kH, kW) in x's dtype, grad_bias (D,) or None) from xv, a batch view of x, and gy
    (n, D, oH, oW), any strides.  conv_bwd_weight_igemm where `weight_igemm_refusal` allows (it also sums
    grad_bias when `with_bias`; a channels-last gy is read in place), else conv_bwd_weight_tc (gy made
    contiguous; grad_bias None: the caller sums it).  Either adds the splits' float32 sums in split order, then
    rounds once."""
    _check_tensor_cores(spec, xv.dtype, device)
    gy = device.reshape(gy, (spec.n, spec.out_channels, *spec.out_size))
    if weight_igemm_refusal(spec, xv.dtype) is None:
        return _grad_weight_igemm(device, xv, gy, spec, with_bias)
    gy = device.ascontiguous(gy)
    plan = plan_tensor_cores(spec, xv.dtype, "weight")
    rows = spec.channels_per_group * spec.taps
    partial = device.empty((plan.splits, spec.out_channels, rows), numpy.float32)
    KERNELS.launch(device, "conv_bwd_weight_tc", plan.tile, dtype=xv.dtype,
                   index=index_type(extent(xv), gy.size, partial.size), grid=plan.grid, block=plan.threads,
                   window=spec, x=xv, grad_out=gy, partial=partial, n=spec.n, **batch_args("x", xv),
                   groups=spec.groups, channels_per_group=spec.channels_per_group,
                   outputs_per_group=spec.outputs_per_group, chunks_per_split=plan.chunks_per_split)
    total = partial[0] if plan.splits == 1 else device.sum(partial, 0, numpy.float32)
    return device.astype(total, xv.dtype).reshape(spec.weight_shape), None


# --- weight gradient, channels-last -------------------------------------------------------------------------
# conv_bwd_weight_igemm (the end of implicit_gemm.cu): grad_weight as D / G rows by (tap, c) columns, reduced over
# the output pixels from channels-last copies of x and grad_output, 16-byte cp.async into XOR-swizzled stages,
# ldmatrix, WG_STAGES stages; the bias gradient summed by the same blocks; the last split of each output tile to
# finish (counted in `Device.arrival_counters`, one kept int32 array per stream, left at zero by the kernel) adds
# the splits in order and permutes (tap, c) -> (c, tap): one launch, where a separate final pass
# (conv_bwd_weight_igemm_finish, still the forward's) cost a launch of host time and a latency-bound kernel.  TF32 operands are rounded once, by the channels-last copies; the
# fused bias sum adds grad_output's tf32 remainder (`channels_last_with_rest`), keeping float's bits.  Eligible when every 16 bytes of a pixel's channels are one group's.

WG_TILES = {"float16": ((64, 64), (128, 64), (128, 128), (32, 64)),
            "bfloat16": ((64, 64), (128, 64), (128, 128), (32, 64)),
            "float32": ((64, 64), (32, 64))}   # (rows d, columns (tap, c)); warps of 32 x 32, 64 x 32 in 128 rows
WG_WIDE_COLUMNS = 256   # 16-bit groups of 128+ output channels take 128 columns from this many (tap, c) columns
WG_CHUNK = {"float16": 32, "bfloat16": 32, "float32": 16}   # WgTile<T>::BK: the pixels of a K chunk
WG_FINISH_BLOCK = 256
# The blocks of each conv_bwd_weight_igemm tile an SM holds on sm_90 (NVRTC 13's registers with 32-bit indices;
# tests/test_sass.py checks them against the SASS), by element kind: the waves `plan_weight_igemm` splits for.
# The 128 x 128 tile is held to 128 registers (two blocks of 8 warps, its `__launch_bounds__`): at 157 an SM
# held one, and its latency-bound grids (r50-128/256/512, c1d-audio, g2-256) ran 4-5 waves of one block.
WG_KIND = {"float16": "16-bit", "bfloat16": "16-bit", "float32": "tf32"}
WG_BLOCKS_AN_SM = {("16-bit", (64, 64)): 4, ("16-bit", (128, 64)): 3, ("16-bit", (128, 128)): 2,
                   ("16-bit", (32, 64)): 8, ("tf32", (64, 64)): 4, ("tf32", (32, 64)): 6}
# The last split of each tile to arrive finishes the tile in the kernel (`weight_igemm_plan`) while it reads at most
# this many bytes of float sums (splits x the tile): one SM reads them after the last wave, at ~32-64 bytes a clock
# and a load's latency per split (benchmarks.predict's `finish_tail`), where the separate final pass spreads
# them over every SM but costs a launch (1.5-4 us of GPU time, ~30 us of host time).  PREDICTED (H100): up to
# 1 MiB (r50-64's 56 splits of 64 x 64: 8.5-22.3 us against the final pass's 7.2-22.9; 7.2-16.3 since the 64 x 64
# tile's last block reads two splits a trip, `weight_finish_splits`) the tail costs about the GPU time the final
# pass did; above it (128 x 128 tiles of 22-56 splits, 64 x 64 ones of 80-103: 1.3-3.5 MiB) it
# would cost up to 2-3 times the final pass's, which stays.  That pass (a thread an element of the sums, 16 splits
# a trip: implicit_gemm.cu's WG_PASS_SPLITS) is PREDICTED (H100) at 4.0-10.7 us for i-gpu16's 103 splits of 64 x 288
# (11.8-33.8 when it read a split a trip, its loads strided by the permutation).
WG_FINISH_BYTES = 1 << 20


def weight_finish_splits(kernel: str, template_args: list[str], threads: int) -> int:
    """The splits the last block of a tile reads a trip (`wg_finish`'s P, implicit_gemm.cu's WG_FINISH_SPLITS):
    two where conv_bwd_weight_igemm's threads add 32 elements each (its tile BM x BN over its threads: the 64 x 64
    and 32 x 64 tiles), else one (conv_bwd_weight_igemm_groups; and its 128-row tiles, whose 64 elements a thread
    take two passes of 32 at two splits a trip: as many round trips)."""
    if kernel != "conv_bwd_weight_igemm":
        return 1
    return 2 if int(template_args[2]) * int(template_args[3]) // threads == 32 else 1


def weight_igemm_instantiations():
    names = []
    for (dtype, tiles), index in itertools.product(WG_TILES.items(), INDEX_TYPES):
        names += [kernel_name("conv_bwd_weight_igemm", dtype, index, *tile) for tile in tiles]
        names.append(kernel_name("conv_bwd_weight_igemm_finish", dtype, index))
    return names


def weight_igemm_threads(tile: tuple[int, ...]) -> int:
    """conv_bwd_weight_igemm's block: a warp per 32 x 32 of the tile, per 64 x 32 in the 128-row tile."""
    rows, cols = tile
    return rows // (64 if rows >= 128 else 32) * cols


def weight_igemm_refusal(spec: ConvSpec, dtype) -> str | None:
    """Why conv_bwd_weight_igemm cannot run this problem (the generic conv_bwd_weight_tc still can), or None.
    Call after `tensor_core_refusal` said yes."""
    vector = vector_elements(dtype)
    for what, count in (("input", spec.channels_per_group), ("output", spec.outputs_per_group)):
        if count % vector:
            return f"it reads {vector} {what} channels per 16-byte copy, and a group has {count}"
    return None


def plan_weight_igemm(spec: ConvSpec, dtype) -> TensorCorePlan:
    """Tile and grid of conv_bwd_weight_igemm: rows d (BM 32 for at most 32 output channels per group, 128 for
    16-bit groups of 128 or more), columns (tap, c) by 64; the pixels split by the shapes only (never the SM
    count), so that the bits are the same on every run and every GPU: at most as many splits as
    `plan_tensor_cores` takes (about TC_SPLIT_BLOCKS blocks), and of those the count whose waves of the tile
    (PLAN_SMS x `WG_BLOCKS_AN_SM`) times chunks a split are fewest (`fewest_wave_chunks`): never a few blocks
    past a wave, which would run a second, mostly idle, one; then, of at most those splits, the count whose
    busiest SM runs the fewest chunks (`busiest_sm_chunks`)."""
    name = numpy.dtype(dtype).name
    rows, cols = spec.outputs_per_group, spec.taps * spec.channels_per_group
    if rows <= 32:
        tile = (32, 64)
    elif (128, 64) in WG_TILES[name] and rows >= 128:
        tile = (128, 128) if cols >= WG_WIDE_COLUMNS else (128, 64)
    else:
        tile = (64, 64)
    blocks = (ceil_div(rows, tile[0]), spec.groups * ceil_div(cols, tile[1]))
    chunks = max(1, ceil_div(spec.n * spec.out_pixels, WG_CHUNK[name]))
    most = split_reduction(chunks, blocks[0] * blocks[1], TC_SPLIT_BLOCKS, TC_SPLIT_CHUNKS,
                           spec.out_channels * (cols + 1) * 4)[0]
    wave = PLAN_SMS * WG_BLOCKS_AN_SM[WG_KIND[name], tile]
    rule = busiest_sm_chunks if WG_KIND[name] == "16-bit" else fewest_wave_chunks
    splits, per_split = rule(chunks, blocks[0] * blocks[1], wave, most)
    return TensorCorePlan(tile, (*blocks, splits), per_split)


# `busiest_sm_chunks` keeps at least this many blocks on the busiest SM: PREDICTED (H100) fewer cost more latency
# than their chunks save (c1d-audio's 128 x 128 tiles at one block an SM instead of two: 447-672 -> 476-843 us
# fwd+bwd; ct2d-k4s2, ct2d-k2s2 and p-1280 alike).  TF32 keeps the wave rule: its 64 x 64 tile at 3 blocks an SM
# instead of 4 was slower at the high end (r50-64 183.7-339.8 -> 181.7-367.7, r50-128 and p-seed alike).
WG_BUSIEST_BLOCKS = 3


def busiest_sm_chunks(chunks: int, tiles: int, wave: int, most: int) -> tuple[int, int]:
    """(splits, chunks per split) of the weight gradient: of at most the splits `fewest_wave_chunks` takes (so no
    more waves), the count whose busiest SM runs the fewest chunks (its blocks, tiles x splits over PLAN_SMS rounded
    up, times chunks a split) of those that leave it WG_BUSIEST_BLOCKS blocks or more; the more splits on a tie.
    16-bit tiles only (`plan_weight_igemm`).  A wave's blocks do not spread evenly: r50-64's 9 tiles x
    56 splits put 4 blocks of 56 chunks on most SMs (224), 44 splits 3 of 72 (216), and its last block reads 44
    splits of sums, not 56: never a longer tail, nor a final pass the wave rule avoids."""
    first = fewest_wave_chunks(chunks, tiles, wave, most)[0]
    held = [s for s in range(1, first) if ceil_div(tiles * s, PLAN_SMS) >= WG_BUSIEST_BLOCKS]
    splits = min(held + [first], key=lambda s: (ceil_div(tiles * s, PLAN_SMS) * ceil_div(chunks, s), -s))
    per_split = ceil_div(chunks, splits)
    return ceil_div(chunks, per_split), per_split


# conv_bwd_weight_igemm_groups (the last section of implicit_gemm.cu): the weight gradient of the groups that
# conv_fwd_igemm_groups takes (`groups_igemm_refusal`), 128 bytes of their channels (in and out) by WGG_TAPS taps a
# block, each warp on its own group's block-diagonal columns: no MMA on padding, where conv_bwd_weight_igemm's
# 32 x 64 tile runs half its rows (groups of 16) and a quarter of its columns (3 x 3: 144 of 192) on zeros.  Its
# partial sums are conv_bwd_weight_igemm's, finished the same way in the kernel.  PREDICTED (H100): benchmarks/RESULTS.md,
# "Small groups, several a block: the weight gradient".
WGG_TAPS = 2   # implicit_gemm.cu's WGG_TAPS: taps a block


def plan_weight_igemm_groups(spec: ConvSpec, dtype) -> TensorCorePlan:
    """conv_bwd_weight_igemm_groups' launch: tile (CG,) (its template constant), grid (tap blocks of WGG_TAPS,
    blocks of `igemm_groups_channels` channels, splits), the pixels split as `plan_weight_igemm` does (the shapes
    only: the same bits on every run and every GPU).  Threads: IG_THREADS."""
    name = numpy.dtype(dtype).name
    blocks = (ceil_div(spec.taps, WGG_TAPS), ceil_div(spec.in_channels, igemm_groups_channels(dtype)))
    splits, per_split = split_reduction(max(1, ceil_div(spec.n * spec.out_pixels, WG_CHUNK[name])),
                                        blocks[0] * blocks[1], TC_SPLIT_BLOCKS, TC_SPLIT_CHUNKS,
                                        spec.out_channels * (spec.taps * spec.channels_per_group + 1) * 4)
    return TensorCorePlan((spec.channels_per_group,), (*blocks, splits), per_split)


def weight_igemm_plan(spec: ConvSpec, dtype) -> tuple[bool, TensorCorePlan, bool]:
    """(several: conv_bwd_weight_igemm_groups, else conv_bwd_weight_igemm; its plan; whether the last split of each
    tile adds the splits in the kernel (one split: always) or conv_bwd_weight_igemm_finish does after it).  In the
    kernel while the last block's read, splits x the tile's float sums, is within WG_FINISH_BYTES: the shapes
    only decide it, and both give the same bits."""
    several = groups_igemm_refusal(spec, dtype, IGG_GROUP_CHANNELS) is None   # small groups, several a block
    plan = (plan_weight_igemm_groups if several else plan_weight_igemm)(spec, dtype)
    tile = (igemm_groups_channels(dtype) * WGG_TAPS * spec.channels_per_group if several
            else plan.tile[0] * plan.tile[1])
    return several, plan, plan.splits == 1 or plan.splits * tile * 4 <= WG_FINISH_BYTES


def _grad_weight_igemm(device, xv, gy, spec: ConvSpec, with_bias: bool):
    several, plan, finish = weight_igemm_plan(spec, xv.dtype)
    oh, ow = spec.out_size
    x_cl = channels_last(device, xv)
    gy4 = gy.reshape(spec.n, spec.out_channels, oh, ow)
    # TF32 rounded once, in the copies; the fused bias sum of TF32 adds grad_output's remainder too
    if with_bias and xv.dtype == numpy.float32:
        gy_cl, gy_rest = channels_last_with_rest(device, gy4)
    else:
        gy_cl = gy_rest = channels_last(device, gy4)
    cols = spec.taps * spec.channels_per_group
    partial = device.empty((plan.splits, spec.out_channels, cols), numpy.float32)
    bias_partial = device.empty((plan.splits, spec.out_channels), numpy.float32)
    grad_w = device.empty(spec.weight_shape, xv.dtype)
    grad_b = device.empty((spec.out_channels,), xv.dtype) if with_bias else grad_w
    # the last split of each output tile to finish adds the splits in order and writes grad_w and grad_b
    # (`wg_last_arrival`): one count per tile, in the stream's kept array; or the final pass after it
    arrivals = device.arrival_counters(plan.grid[0] * plan.grid[1])
    index = index_type(x_cl.size, gy_cl.size, partial.size)
    common = dict(dtype=xv.dtype, index=index, grid=plan.grid, window=spec, x_cl=x_cl, gy_cl=gy_cl, gy_rest=gy_rest,
                  partial=partial, bias_partial=bias_partial, grad_weight=grad_w, grad_bias=grad_b,
                  arrivals=arrivals, finish=finish, n=spec.n, groups=spec.groups,
                  chunks_per_split=plan.chunks_per_split, has_bias=with_bias)
    if several:
        KERNELS.launch(device, "conv_bwd_weight_igemm_groups", plan.tile, block=IG_THREADS, **common)
    else:
        KERNELS.launch(device, "conv_bwd_weight_igemm", plan.tile, block=weight_igemm_threads(plan.tile),
                       channels_per_group=spec.channels_per_group, outputs_per_group=spec.outputs_per_group,
                       **common)
    if not finish:
        KERNELS.launch(device, "conv_bwd_weight_igemm_finish", dtype=xv.dtype, index=index,
                       grid=capped_grid(ceil_div(grad_w.size, WG_FINISH_BLOCK)), block=WG_FINISH_BLOCK,
                       partial=partial, bias_partial=bias_partial, grad_weight=grad_w, grad_bias=grad_b,
                       splits=plan.splits, out_channels=spec.out_channels, channels_per_group=spec.channels_per_group,
                       taps=spec.taps, has_bias=with_bias, **IN_PLACE)
    return grad_w, (grad_b if with_bias else None)


# --- 3-D, natively ---------------------------------------------------------------------------------------------
# conv_fwd_igemm_3d (ig_forward with a depth axis: per A row its window's (z, y, x), the tap carry c -> s -> r -> q,
# depth padding zero-filled by cp.async): conv3d's forward and its stride-1 input gradient on the tensor cores
# without the lift's depth windows (ops/lift.py: kD / sD times x written and read, the output's transposed copy,
# the slabs' launches).  x is copied once to channels-last 3-D, (n, D, H, W, C): with the (D, H) axes merged,
# channels_last's (n, C, D * H, W) -> (n, D * H, W, C), in one launch with the weight's copy.  Only 32-bit
# indices and the tiles below (CI compiles each instantiation); anything else stays on the lift.

IG_3D_TILES = {"float16": ((256, 64, 4), (128, 64, 4), (64, 64, 4)),
               "bfloat16": ((256, 64, 4), (128, 64, 4), (64, 64, 4)), "float32": ((128, 64, 3), (64, 64, 4))}
IG_3D_NARROW = ((128, 32, 4),)
IG_3D_BITS = 32   # a thread's depth bits (IgDepth): its A rows (BM / 32) x kernel_d at most


def _fits_depth(tile: tuple[int, int, int], kernel_d: int) -> bool:
    return tile[0] * IG_ROW_BYTES // IG_VECTOR_BYTES // IG_THREADS * kernel_d <= IG_3D_BITS


def plan_igemm_3d(spec: ConvSpec, dtype) -> IgemmPlan | None:
    """`plan_igemm` of a 3-D spec on conv_fwd_igemm_3d's tiles whose depth bits hold kernel_d taps a row; None
    where none does (kernel_d past 16: the lift)."""
    kd = spec.kernel_size[0]
    table = {name: tuple(t for t in tiles if _fits_depth(t, kd)) for name, tiles in IG_3D_TILES.items()}
    narrow = tuple(t for t in IG_3D_NARROW if _fits_depth(t, kd))
    cols, name = spec.outputs_per_group, numpy.dtype(dtype).name
    if not (narrow if cols <= 32 else [t for t in table[name] if t[1] <= 64 or cols > 64]):
        return None
    return plan_igemm(spec, dtype, table, narrow)


def igemm_3d_refusal(spec: ConvSpec, dtype, device, pass_: str = "forward") -> str | None:
    """Why conv_fwd_igemm_3d cannot run pass_ ('forward', or 'input': the stride-1 input gradient as the forward
    of `transposed_spec`) of the 3-D spec, or None: the tensor cores' and the channels-last kernel's conditions,
    stride 1 for the input gradient, and 32-bit indices (x, out, the weight and split sums below 2^31 elements)."""
    refusal = tensor_core_refusal(spec, dtype, device) or igemm_refusal(spec, dtype, pass_)
    if refusal:
        return refusal
    if pass_ == "input" and spec.stride != (1, 1, 1):
        return f"its input gradient runs at stride 1 only, not {spec.stride} (strided: the lift)"
    gemm = spec if pass_ == "forward" else transposed_spec(spec)
    plan = plan_igemm_3d(gemm, dtype)
    if plan is None:
        return f"its tiles hold at most {IG_3D_BITS // 2} depth taps, not {spec.kernel_size[0]}"
    sizes = (spec.n * spec.in_channels * math.prod(spec.padded_size),
             spec.n * spec.out_channels * spec.out_pixels * plan.splits,
             spec.n * spec.in_channels * math.prod(spec.in_size) * plan.splits, math.prod(spec.weight_shape))
    if max(sizes) > INT32_MAX:
        return f"it indexes in 32 bits, and this problem has {max(sizes)} elements (the lift takes it)"
    return None


def _as_planes(device, a):
    """a (n, C, D, H, W) as (n, C, D * H, W): a view for C-contiguous and channels-last-3-D memory."""
    n, c, d, h, w = a.shape
    return device.reshape(a, (n, c, d * h, w))


def is_channels_last_3d(a) -> bool:
    """`is_channels_last` of a 5-d array: (n, C, D, H, W) laid out (n, D, H, W, C), torch's channels_last_3d."""
    return a.ndim == 5 and not a.flags.c_contiguous and a.transpose(0, 2, 3, 4, 1).flags.c_contiguous


def implicit_gemm_3d(device, x, weight, bias, spec: ConvSpec):
    """conv3d's forward on conv_fwd_igemm_3d (`igemm_3d_refusal` None): x (n, C, D, H, W), any strides, weight
    (O, C / G, kD, kH, kW), bias (O,) or None.  Out is channels-last 3-D for a channels-last x (with whole 16-byte
    vectors of output channels per group), else C-contiguous."""
    out = device.empty(spec.output_shape, x.dtype)
    if is_channels_last_3d(x) and spec.outputs_per_group % vector_elements(x.dtype) == 0:
        nhwc = device.empty((spec.n, *spec.out_size, spec.out_channels), x.dtype)
        if _address(nhwc) % IG_VECTOR_BYTES == 0:
            out = nhwc.transpose(0, 4, 1, 2, 3)
    xl, wk = channels_last_all(device, (_as_planes(device, x), _as_planes(device, weight)))
    return igemm_forward_3d(device, xl, wk, bias, spec, out)


def implicit_gemm_grad_input_3d(device, gy, weight, spec: ConvSpec, bias=None):
    """conv3d's input gradient at stride 1 (`igemm_3d_refusal(..., 'input')` None), (n, C, D, H, W) C-contiguous:
    conv_fwd_igemm_3d over the transposed window with the weight arranged (C, flipped taps, O / G), as the 2-D
    `weight_view` arranges it; bias (C,) or None added in its epilogue (conv_transpose3d's forward)."""
    g, dg, cg = spec.groups, spec.outputs_per_group, spec.channels_per_group
    kd, kh, kw = spec.kernel_size
    flipped = device.reshape(weight, (g, dg, cg, kd, kh, kw))[..., ::-1, ::-1, ::-1].transpose(0, 2, 1, 3, 4, 5)
    arranged = device.reshape(flipped, (g, cg, dg, kd * kh, kw))   # a view: the flipped kD and kH merge
    gy5 = device.reshape(gy, (spec.n, spec.out_channels, *spec.out_size))
    gy_cl, wk = channels_last_all(device, (_as_planes(device, gy5), arranged))
    out = device.empty(spec.input_shape, gy.dtype)
    return igemm_forward_3d(device, gy_cl, wk, bias, transposed_spec(spec), out)


def igemm_forward_3d(device, xl, wk, bias, spec: ConvSpec, out):
    """conv_fwd_igemm_3d: out (n, O, oD, oH, oW), C-contiguous or channels-last 3-D, from xl (n, D * H, W, C)
    and wk (O, taps, C / G) C-contiguous and 16-byte aligned; split sums as `igemm_forward`'s."""
    plan = plan_igemm_3d(spec, xl.dtype)
    assert plan is not None, "igemm_3d_refusal said yes"
    nhwc = is_channels_last_3d(out)
    memory = out.transpose(0, 2, 3, 4, 1) if nhwc else out   # the C-contiguous array the kernel writes
    whole_vectors = nhwc or spec.out_pixels % vector_elements(xl.dtype) == 0
    partial = device.empty((plan.splits if plan.splits > 1 else 0, *memory.shape), numpy.float32)
    KERNELS.launch(device, "conv_fwd_igemm_3d", plan.tile, dtype=xl.dtype, index="int", grid=plan.grid,
                   block=IG_THREADS, shared_mem=plan.shared_mem, window=spec, x=xl, weight=wk,
                   bias=wk if bias is None else device.ascontiguous(bias), out=memory, n=spec.n, groups=spec.groups,
                   channels_per_group=spec.channels_per_group, outputs_per_group=spec.outputs_per_group,
                   has_bias=bias is not None,
                   vector_store=whole_vectors and _address(out) % IG_VECTOR_BYTES == 0, channels_last_out=nhwc,
                   partial=partial, chunks_per_split=plan.chunks_per_split)
    if plan.splits > 1:
        _add_forward_splits(device, partial, memory, spec, "int", IN_PLACE)
    return out


# --- whole patches a block (patch_conv2d's 16-bit forward) -----------------------------------------------------
# patch_fwd_igemm (the section of that name at the end of implicit_gemm.cu): x (n, C, H, W) read as it lies, a
# block's whole patches at a time, each input element staged once for every tap; the weight staged once per
# persistent block.  ops/patch.py routes the 16-bit forward to it wherever `patch_igemm_refusal` allows, and the
# input gradient at stride 1 wherever `patch_igemm_input_refusal` does (the forward of the transposed convolution:
# grad_output read as it lies, the weight transposed and flipped by the kernel as it stages it).

PT_DTYPES = ("float16", "bfloat16")   # its instantiations: one per dtype, 32-bit indices
PT_ROWS, PT_COLS = 128, 64            # implicit_gemm.cu's PT_ROWS (output pixels a block), PT_COLS (channels a pass)
PT_BLOCKS = IG_WAVE_BLOCKS            # persistent blocks at most (2 an SM of a 132-SM H100; shape-only, as above)
# Its dynamic shared memory at most: two blocks an SM on sm_90 (228 KiB an SM), one on sm_80 / sm_86 (99 KiB a
# block opted in on sm_86 and sm_89)
PT_SHARED_LIMIT = 96 * 1024
# ops/patch.py routes a forward to it only with at least this many groups of patches (two a persistent block): each
# block stages the whole weight once (37 KiB for 32 -> 64 channels 3x3), which one group a block does not repay.
# benchmarks.predict (H100): i-gpu16 (2,048 4x4 patches, 256 groups) fwd 9.3-22.2 us on conv_fwd_igemm and its
# copy, 9.9-13.5 here (its low end +6%); p-1280-gpu16 (160 groups) 7.7-18.5 against 9.9-13.5.
PT_MIN_GROUPS = 2 * PT_BLOCKS


PT_STEP = 32          # implicit_gemm.cu's PT_STEP: a tap's channels a main-loop step (staged padded to a multiple)
PT_ZERO_ROWS = 8


def _odd_vectors(elements: int) -> int:
    """Bytes of implicit_gemm.cu's `pt_pitch`: 16-bit elements in 16-byte vectors, an odd number of them."""
    return ((elements // 8) | 1) * IG_VECTOR_BYTES


def patch_igemm_shared(spec: ConvSpec, patches: int) -> int:
    """patch_fwd_igemm's dynamic shared memory (2-byte elements): weight rows, the rows table, the tile and its zero
    rows (a tap's channels padded to PT_STEP in both), two raw buffers (a patch's x and 32 bytes), the epilogue's
    tile (none of its own where a patch's raw buffer holds it: the kernel's `out_in_raw`)."""
    c, d, taps, plane = spec.in_channels, spec.out_channels, spec.taps, spec.in_size[0] * spec.in_size[1]
    padded = ceil_div(c, PT_STEP) * PT_STEP
    raw_patch, out_patch = c * plane * 2 + 32, PT_COLS * spec.out_pixels * 2
    return (d * _odd_vectors(taps * padded) + taps * PT_ROWS * 4 + (patches * plane + PT_ZERO_ROWS) * _odd_vectors(padded)
            + 2 * patches * raw_patch + (0 if raw_patch >= out_patch else patches * out_patch))


def patch_igemm_refusal(spec: ConvSpec, dtype, shared: bool = True) -> str | None:
    """Why patch_fwd_igemm cannot run this forward, or None when it can: 16-bit, stride 1, dilation 1, one group,
    C and D multiples of 16, a patch's output pixels at most PT_ROWS, 32-bit indices and (`shared`: the forward's
    own) its shared memory within PT_SHARED_LIMIT."""
    if numpy.dtype(dtype).name not in PT_DTYPES:
        return f"it takes float16 and bfloat16, not {numpy.dtype(dtype).name}"
    if spec.nd != 2 or spec.stride != (1, 1) or spec.dilation != (1, 1) or spec.groups != 1:
        return "it takes 2-D windows of stride 1, dilation 1 and one group"
    if spec.in_channels % 16 or spec.out_channels % 16:
        return f"it needs channels in multiples of 16, not {spec.in_channels} -> {spec.out_channels}"
    if not 0 < spec.out_pixels <= PT_ROWS:
        return f"it takes patches of at most {PT_ROWS} output pixels, not {spec.out_pixels}"
    plane = spec.in_size[0] * spec.in_size[1]
    if max(spec.n * spec.in_channels * plane, spec.n * spec.out_channels * spec.out_pixels) > INT32_MAX:
        return "it indexes in 32 bits"
    if shared and patch_igemm_shared(spec, 1) > PT_SHARED_LIMIT:
        return f"its shared memory would pass {PT_SHARED_LIMIT} bytes"
    return None


@dataclasses.dataclass(frozen=True)
class PatchPlan:
    """One patch_fwd_igemm launch: patches a block takes at a time, persistent blocks, dynamic shared memory."""
    patches: int
    blocks: int
    shared_mem: int


def patch_igemm_pays(spec: ConvSpec) -> bool:
    """Whether the forward has the PT_MIN_GROUPS groups of patches from which patch_fwd_igemm is the faster."""
    return ceil_div(spec.n, plan_patch_igemm(spec).patches) >= PT_MIN_GROUPS


def plan_patch_igemm(spec: ConvSpec) -> PatchPlan:
    """As many whole patches as PT_ROWS output pixels hold (fewer where the shared memory would pass its limit),
    and one block per group of them up to PT_BLOCKS, each looping over its share of the groups."""
    patches = PT_ROWS // spec.out_pixels
    while patches > 1 and patch_igemm_shared(spec, patches) > PT_SHARED_LIMIT:
        patches -= 1
    return PatchPlan(patches, max(1, min(PT_BLOCKS, ceil_div(spec.n, patches))), patch_igemm_shared(spec, patches))


def patch_igemm_forward(device, x, weight, bias, spec: ConvSpec, out):
    """out (n, D, oH, oW) C-contiguous from x (..., C, H, W) C-contiguous and 16-byte aligned, weight (D, C, kH, kW)
    C-contiguous, bias (D,) or None: patch_fwd_igemm, one launch (no copy of x or of the weight)."""
    _check_tensor_cores(spec, x.dtype, device, "forward")   # the GPU's: patch_igemm_refusal looks at the problem only
    plan = plan_patch_igemm(spec)
    KERNELS.launch(device, "patch_fwd_igemm", dtype=x.dtype, index="int", grid=plan.blocks, block=IG_THREADS,
                   shared_mem=plan.shared_mem, window=spec, x=x, weight=weight,
                   bias=weight if bias is None else device.ascontiguous(bias), out=out, n=spec.n,
                   channels=spec.in_channels, out_channels=spec.out_channels, patches=plan.patches,
                   has_bias=bias is not None, flipped=False)
    return out


def patch_igemm_input_refusal(spec: ConvSpec, dtype) -> str | None:
    """Why patch_fwd_igemm cannot run the input gradient of the forward spec, or None when it can: stride 1 (the
    gradient is then the stride-1 forward of `transposed_spec`, padded k - 1 - p, which `patch_igemm_refusal`
    judges: grad_output's D channels in, grad_input's C channels and H x W pixels out)."""
    if spec.stride != (1,) * spec.nd:
        return "it takes the input gradient at stride 1"
    return patch_igemm_refusal(transposed_spec(spec), dtype)


def patch_igemm_grad_input(device, gy, weight, spec: ConvSpec, out):
    """grad_input into out (n, C, H, W) C-contiguous from gy (n, D, oH, oW) C-contiguous and 16-byte aligned and the
    forward's weight (D, C, kH, kW) C-contiguous (`patch_igemm_input_refusal` None): patch_fwd_igemm on the transposed
    convolution, the weight transposed and flipped as it is staged; one launch, no copy of gy or of the weight."""
    _check_tensor_cores(spec, gy.dtype, device, "input")
    tspec = transposed_spec(spec)
    plan = plan_patch_igemm(tspec)
    KERNELS.launch(device, "patch_fwd_igemm", dtype=gy.dtype, index="int", grid=plan.blocks, block=IG_THREADS,
                   shared_mem=plan.shared_mem, window=tspec, x=gy, weight=weight, bias=weight, out=out, n=spec.n,
                   channels=tspec.in_channels, out_channels=tspec.out_channels, patches=plan.patches,
                   has_bias=False, flipped=True)
    return out


# --- whole patches a block, the weight gradient (patch_conv2d's 16-bit grad_weight) -----------------------------
# patch_bwd_weight_igemm (the section of that name at the end of implicit_gemm.cu): x and grad_output read as they
# lie (no channels-last copy of either), a block's whole patches a group; each block one tile of grad_weight (PW_ROWS
# output channels x units of one tap and 16 channels) over a fixed split of the groups, its float sums written once;
# conv_bwd_weight_igemm_finish adds the splits in order.  ops/patch.py routes the 16-bit weight gradient to it where
# `patch_weight_refusal` allows and `patch_weight_pays`.

PW_ROWS, PW_UNITS = 64, 6   # implicit_gemm.cu's PW_ROWS (output channels a block), PW_UNITS (units a block at most)
PW_HAND_BYTES = 2 * 2 * 4 * (2 * PW_UNITS + 1) * 32 * 4   # the odd warps' sums handed over (implicit_gemm.cu)
PW_CHUNK = 8                # implicit_gemm.cu's PW_CHUNK: output pixels a 16-byte chunk of the dy tile
PW_BLOCKS = PT_BLOCKS       # blocks (tiles x splits) at most: two an SM of PLAN_SMS, shape-only as above
PW_MIN_GROUPS = PT_MIN_GROUPS   # as the forward: fewer groups than this keep conv_bwd_weight_igemm


@dataclasses.dataclass(frozen=True)
class PatchWeightPlan:
    """One patch_bwd_weight_igemm launch: patches a group, units a tile, grid (splits, d tiles x unit tiles)."""
    patches: int
    tile_units: int
    grid: tuple[int, int]
    shared_mem: int


def _patch_weight_tiles(spec: ConvSpec) -> tuple[int, int]:
    """(units a tile, unit tiles): the (channel slice of 16, tap) units spread evenly over tiles of PW_UNITS."""
    units = spec.in_channels // 16 * spec.taps
    tile_units = ceil_div(units, ceil_div(units, PW_UNITS))
    return tile_units, ceil_div(units, tile_units)


def _pw_dy_pitch(out_pixels: int) -> int:
    """Bytes of implicit_gemm.cu's `pw_dy_pitch`: PW_ROWS 16-byte chunks and the pad that spreads cp.async's."""
    oc = out_pixels // PW_CHUNK
    spread = out_pixels % PW_CHUNK == 0 and oc < 8 and oc & (oc - 1) == 0
    return (PW_ROWS + (8 // oc if spread else 1)) * IG_VECTOR_BYTES


def patch_weight_shared(spec: ConvSpec, patches: int, tile_units: int) -> int:
    """patch_bwd_weight_igemm's dynamic shared memory (2-byte elements): the rows table, the x tile of a tile's
    widest channel slices and its zero rows, the dy tile (the group's output pixels in chunks of PW_CHUNK, whole K
    steps, PW_ROWS channels), two raw buffers of x; where the output pixels are whole chunks two dy tiles (cp.async
    fills them), else one and two raw buffers of grad_output; at least PW_HAND_BYTES, which the odd warps' sums
    take over all of it once the groups are done (a bound no shape meets: a dy tile of 128 output pixels and the x
    tile pass it, so no mutation of it can fail a test)."""
    taps, plane, units = spec.taps, spec.in_size[0] * spec.in_size[1], spec.in_channels // 16 * spec.taps
    slices = max((min(u0 + tile_units, units) - 1) // taps + 1 - u0 // taps for u0 in range(0, units, tile_units))
    x_channels, rows_d = 16 * slices, min(PW_ROWS, spec.out_channels)
    dy_tile = ceil_div(patches * spec.out_pixels, 16) * 2 * _pw_dy_pitch(spec.out_pixels)
    direct = spec.out_pixels % PW_CHUNK == 0
    return max(PW_HAND_BYTES, taps * PT_ROWS * 4 + (patches * plane + PT_ZERO_ROWS) * _odd_vectors(x_channels)
               + (2 if direct else 1) * dy_tile + 2 * patches * (x_channels * plane * 2 + 32)
               + (0 if direct else 2 * patches * (rows_d * spec.out_pixels * 2 + 32)))


def _patch_weight_patches(spec: ConvSpec, tile_units: int) -> int:
    patches = PT_ROWS // spec.out_pixels
    while patches > 1 and patch_weight_shared(spec, patches, tile_units) > PT_SHARED_LIMIT:
        patches -= 1
    return patches


def patch_weight_refusal(spec: ConvSpec, dtype) -> str | None:
    """Why patch_bwd_weight_igemm cannot run this weight gradient, or None: the forward's conditions
    (`patch_igemm_refusal`) but its own shared memory within PT_SHARED_LIMIT, and its float sums (up to PW_BLOCKS
    splits of grad_weight) indexed in 32 bits."""
    why = patch_igemm_refusal(spec, dtype, shared=False)
    if why is None and patch_weight_shared(spec, 1, _patch_weight_tiles(spec)[0]) > PT_SHARED_LIMIT:
        return f"its weight gradient's shared memory would pass {PT_SHARED_LIMIT} bytes"
    if why is None and PW_BLOCKS * spec.out_channels * spec.in_channels * spec.taps > INT32_MAX:
        return "its weight gradient's sums index in 32 bits"
    return why


def plan_patch_weight(spec: ConvSpec) -> PatchWeightPlan:
    """Whole patches a group as the forward (fewer where the shared memory would pass its limit), and as many
    splits of the groups as PW_BLOCKS blocks hold beside the tiles (at most one a group): shape-only, so the bits
    of grad_weight are the same on every GPU."""
    tile_units, unit_tiles = _patch_weight_tiles(spec)
    patches = _patch_weight_patches(spec, tile_units)
    tiles = ceil_div(spec.out_channels, PW_ROWS) * unit_tiles
    splits = max(1, min(ceil_div(spec.n, patches), PW_BLOCKS // tiles))
    return PatchWeightPlan(patches, tile_units, (splits, tiles), patch_weight_shared(spec, patches, tile_units))


def patch_weight_pays(spec: ConvSpec) -> bool:
    """Whether the weight gradient has the PW_MIN_GROUPS groups of patches from which benchmarks.predict ranks
    patch_bwd_weight_igemm faster than conv_bwd_weight_igemm and its copies."""
    return ceil_div(spec.n, plan_patch_weight(spec).patches) >= PW_MIN_GROUPS


def patch_igemm_grad_weight(device, x, gy, spec: ConvSpec, with_bias: bool):
    """(grad_weight (D, C, kH, kW), grad_bias (D,) or None) in x's dtype from x (n, C, H, W) and gy (n, D, oH, oW),
    both C-contiguous and 16-byte aligned: patch_bwd_weight_igemm, then conv_bwd_weight_igemm_finish (the splits
    added in order, rounded once)."""
    _check_tensor_cores(spec, x.dtype, device, "weight")
    plan = plan_patch_weight(spec)
    splits = plan.grid[0]
    partial = device.empty((splits, spec.out_channels, spec.taps * spec.in_channels), numpy.float32)
    bias_partial = device.empty((splits, spec.out_channels), numpy.float32)
    KERNELS.launch(device, "patch_bwd_weight_igemm", dtype=x.dtype, index="int", grid=plan.grid, block=IG_THREADS,
                   shared_mem=plan.shared_mem, window=spec, x=x, grad_out=gy, partial=partial,
                   bias_partial=bias_partial, n=spec.n, channels=spec.in_channels, out_channels=spec.out_channels,
                   patches=plan.patches, tile_units=plan.tile_units, has_bias=with_bias)
    grad_w = device.empty(spec.weight_shape, x.dtype)
    grad_b = device.empty((spec.out_channels,), x.dtype) if with_bias else grad_w
    KERNELS.launch(device, "conv_bwd_weight_igemm_finish", dtype=x.dtype, index="int",
                   grid=capped_grid(ceil_div(grad_w.size, WG_FINISH_BLOCK)), block=WG_FINISH_BLOCK, partial=partial,
                   bias_partial=bias_partial, grad_weight=grad_w, grad_bias=grad_b, splits=splits,
                   out_channels=spec.out_channels, channels_per_group=spec.in_channels, taps=spec.taps,
                   has_bias=with_bias, **IN_PLACE)
    return grad_w, (grad_b if with_bias else None)
