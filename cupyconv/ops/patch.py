"""Patch convolution: the same filters over many tiny patches x (..., C, H, W) -> (..., D, oH, oW).

Padding is applied inside each patch; nothing is read across patches.

CPU path: conv2d's (each patch is its own image).
GPU path (raw_kernels/patch.cu): two algorithms, chosen per pass by `algorithm=`:

- 'fused' (what 'auto' picks for patches of at most FUSED_MAX_PIXELS pixels when the block fits in shared
  memory): a block stages several whole patches with their zero halo and the weight tile in shared memory and
  computes every output channel of their pixels from registers (an implicit GEMM, no column matrix).  Grad
  input is the same kernel on grad_output with transposed, flipped weights; grad weight sums per block slice
  and reduces the slices in a fixed order, so it gives the same bits on every run.
- 'implicit_gemm' (what 'auto' picks, forward and backward, in float16/bfloat16, and float32 with TF32 allowed,
  with at least 16 channels per group, on sm_80+): conv2d's tensor-core kernels, which read the patches through
  the same batch view (grad_output is made contiguous first); the 16-bit forward of many C-contiguous patches at
  stride 1, and the input gradient of many patches at stride 1, run ops/implicit_gemm.py's patch_fwd_igemm instead
  (whole patches a block, x or grad_output read as it lies: `_whole_patches`).
- 'im2col_gemm' (larger patches): the im2col kernel of ops/unfold.py per chunk of patches (within the workspace
  budget) and one batched GEMM with the weight broadcast over the patches (cupy.matmul: one cuBLAS batched call)
  that writes the output straight into its (..., D, oH, oW) layout.

The input is read in place through its strides: its leading dims collapse to at most two (outer, inner) with
their own strides, so e.g. a (B, C, N, H, W) array transposed to (B, N, C, H, W) is not copied.  A batch
whose leading dims need three or more strides is copied to a contiguous array first.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

from .._arrays import Call, compute_dtype, on_arrays_device
from .._device import DEFAULT_SHARED_LIMIT, _address
from .._kernels import (INDEX_TYPES, KERNEL_DTYPES, MAX_GRID, PLAN_SMS, KernelFile, batch_args, batch_view,
                        elementwise_launch, extent, index_type, kernel_name)
from .._spec import (NEEDS, ConvSpec, ceil_div, check_algorithm, check_grad_output, check_needs)
from .._docs import GRADIENTS, SAME_KIND, numpy_doc
from .._typing import ArrayT, Gradients, IntOrTuple, Needs, Padding
from .. import settings
from .conv import (DIRECT_MAX_CHANNELS, WEIGHT_DOC, conv2d_backward_cpu, conv2d_cpu, gemm_weight_grad,
                   grad_input_bytes, transposed_spec, weight_grad_bytes, work_pieces, workspace_scope)
from . import lift
from .implicit_gemm import (IG_VECTOR_BYTES, implicit_gemm_gpu, implicit_gemm_grad_input, implicit_gemm_grad_weight,
                            patch_igemm_forward, patch_igemm_grad_input, patch_igemm_grad_weight,
                            patch_igemm_input_refusal, patch_igemm_pays, patch_igemm_refusal, patch_weight_pays,
                            patch_weight_refusal, sharing_channels_last, stage_backward_copies, tensor_core_refusal)
from .simt_gemm import simt_gemm_gpu, simt_gemm_grad_input, simt_gemm_grad_weight, simt_runs
from .unfold import fold_gpu, unfold_gpu

# ---------------------------------------------------------------------------------------------------------
# CPU path: conv2d's over the flattened leading dims (each patch is its own image)

patch_conv2d_cpu = conv2d_cpu
patch_conv2d_backward_cpu = conv2d_backward_cpu


# ---------------------------------------------------------------------------------------------------------
# GPU path (CuPy on a GPU, or the test emulator): raw_kernels/patch.cu

TILE_KERNELS = ("patch_fwd", "patch_bwd_input")  # templates on (H, W, kH, kW) as well as dtype and index
# (H, W, kH, kW) compiled with constant sizes; GENERIC takes every size at run time.
SPECIALISATIONS = ((4, 4, 3, 3), (8, 8, 3, 3))
GENERIC = (0, 0, 0, 0)
ALGORITHMS = ("auto", "fused", "im2col_gemm", "implicit_gemm")

# Shared with patch.cu (compiled in through KERNELS.defines; the file says what each one does there).
TILES = {"float": (4, 16, 8, 8), "double": (4, 8, 4, 8)}  # register tiles (TM, TN, TK, TD) of PatchTile<T>
MAX_THREADS = 512          # the tile kernels' __launch_bounds__: no plan launches more
KERNELS = KernelFile("patch.cu", defines={
    **{f"PATCH_{name}_{t.upper()}": v for t, tile in TILES.items() for name, v in zip(("TM", "TN", "TK", "TD"), tile)},
    "PATCH_MAX_THREADS": MAX_THREADS})

FUSED_MAX_PIXELS = 256     # 'auto' runs the fused kernels on patches of at most this many pixels (H * W)
TARGET_THREADS = 256       # threads per block the tile kernels aim for when the patches allow
MIN_BLOCKS = 2 * PLAN_SMS  # fewer patches per block below this many blocks (2 per SM)
WEIGHT_MAX_THREADS = 256   # patch_bwd_weight: two blocks of 128-register threads per SM
WEIGHT_BLOCKS = 512        # blocks patch_bwd_weight aims for (slices x weight tiles); fixed, so the slicing
                           # and hence the bits of grad weight depend on the shape only, not on the GPU
WEIGHT_PIXELS = 128        # output pixels per patch_bwd_weight batch, between two barriers


def _tiles(dtype) -> tuple[int, int, int, int]:
    """(TM, TN, TK, TD) of PatchTile<T> for an element dtype."""
    return TILES["double" if compute_dtype(dtype).itemsize == 8 else "float"]


def instantiations():
    tile = [kernel_name(k, d, i, *s) for k, d, i, s in
            itertools.product(TILE_KERNELS, KERNEL_DTYPES, INDEX_TYPES, (*SPECIALISATIONS, GENERIC))]
    plain = [kernel_name(k, d, i) for k, d, i in
             itertools.product(("patch_bwd_weight", "patch_reduce"), KERNEL_DTYPES, INDEX_TYPES)]
    return tile + plain


# --- plans ------------------------------------------------------------------------------------------------

def _sizes(spec: ConvSpec) -> tuple[int, int, int, int]:
    sizes = (*spec.in_size, *spec.kernel_size)
    return sizes if sizes in SPECIALISATIONS else GENERIC


def _group_args(spec: ConvSpec) -> dict:
    return dict(channels_per_group=spec.channels_per_group, outputs_per_group=spec.outputs_per_group)





def _bank_padded(size: int, lanes, itemsize: int) -> int:
    """The smallest stride >= size between patches in shared memory at which the addresses lanes = [(patch,
    offset), ...] of one warp's load meet the fewest bank conflicts (32 banks of 4 bytes)."""
    def conflicts(stride):
        banks = {}
        for patch, offset in lanes:
            address = patch * stride + offset
            banks.setdefault(address * itemsize // 4 % 32, set()).add(address)
        return max(len(addresses) for addresses in banks.values())
    return min(range(size, size + 32), key=lambda stride: (conflicts(stride), stride))


@dataclasses.dataclass(frozen=True)
class TilePlan:
    """A launch of patch_fwd (transposed=False) or patch_bwd_input (transposed=True)."""
    patches: int       # per block
    out_tile: int      # output channels per block (a multiple of TN)
    out_tiles: int     # blocks along the output channels of a group
    chunk: int         # reduced channels staged per step
    patch_stride: int  # shared-memory floats between two patches' tiles
    threads: int
    shared_mem: int

    def args(self) -> dict:
        """The tile kernels' arguments that describe the block."""
        return dict(patches=self.patches, out_tile=self.out_tile, chunk=self.chunk, patch_stride=self.patch_stride)


def plan_tile(spec: ConvSpec, dtype, transposed: bool) -> TilePlan | None:
    """The tile kernels' block shape for spec, or None when no block fits (then only im2col_gemm runs)."""
    tm, tn, _, _ = _tiles(dtype)
    (kh, kw), (dh, dw) = spec.kernel_size, spec.dilation
    if transposed:
        reduce, outs, (dst_h, dst_w), (step_y, step_x) = (spec.outputs_per_group, spec.channels_per_group,
                                                          spec.in_size, (1, 1))
    else:
        reduce, outs, (dst_h, dst_w), (step_y, step_x) = (spec.channels_per_group, spec.outputs_per_group,
                                                          spec.out_size, spec.stride)
    tile_w = (dst_w - 1) * step_x + (kw - 1) * dw + 1
    plane = ((dst_h - 1) * step_y + (kh - 1) * dh + 1) * tile_w
    pixels, taps = dst_h * dst_w, kh * kw
    pixel_groups = ceil_div(pixels, tm)
    if pixel_groups > MAX_THREADS:
        return None
    lanes = ceil_div(max(outs, 1), tn)
    out_tiles = ceil_div(lanes, (MAX_THREADS // pixel_groups))
    lanes = ceil_div(lanes, out_tiles)  # output-channel lanes per block, balanced over the out tiles
    if spec.groups * out_tiles > MAX_GRID[1]:
        return None
    out_tile = lanes * tn
    itemsize = compute_dtype(dtype).itemsize
    budget = DEFAULT_SHARED_LIMIT // itemsize
    per_patch = pixel_groups * lanes  # threads
    patches = min(TARGET_THREADS // per_patch, spec.n // MIN_BLOCKS)
    whole_warps = 32 // math.gcd(32, per_patch)  # patches per block that make whole warps
    patches = max(1, patches - patches % whole_warps if patches >= whole_warps else patches)
    while True:  # the most channels per chunk that fit beside `patches` tiles; halve the patches if none does
        chunk = (budget - patches * 31) // (taps * out_tile + patches * plane)
        if chunk >= 1:
            break
        if patches == 1:
            return None
        patches //= 2
    steps = ceil_div(max(reduce, 1), chunk)
    chunk = ceil_div(max(reduce, 1), steps)  # as few steps as fit, as even as possible
    warp = [(t // pixel_groups % patches, (t % pixel_groups) // dst_w * step_y * tile_w
             + (t % pixel_groups) % dst_w * step_x) for t in range(min(32, per_patch * patches))]
    patch_stride = _bank_padded(chunk * plane, warp, itemsize)
    return TilePlan(patches, out_tile, out_tiles, chunk, patch_stride, per_patch * patches,
                     itemsize * (chunk * taps * out_tile + patches * patch_stride))


@dataclasses.dataclass(frozen=True)
class WeightPlan:
    """A launch of patch_bwd_weight."""
    patches: int       # per batch
    out_tile: int      # output channels per block (a multiple of TD)
    k_tile: int        # weight entries (c, i, j) per block (a multiple of TK)
    weight_tiles: int  # blocks along the weight of one group: d tiles x k tiles
    slices: int        # blocks along the patches, each writing one partial sum
    patch_stride: int
    threads: int
    shared_mem: int


def plan_weight(spec: ConvSpec, dtype) -> WeightPlan | None:
    _, _, tk, tn = _tiles(dtype)
    (kh, kw), (dh, dw), (sh, sw), (oh, ow) = spec.kernel_size, spec.dilation, spec.stride, spec.out_size
    taps, pixels = kh * kw, oh * ow
    k = spec.channels_per_group * taps
    k_all, d_all = ceil_div(k, tk), ceil_div(spec.outputs_per_group, tn)
    d_lanes = min(d_all, max(1, WEIGHT_MAX_THREADS // k_all))
    k_lanes = min(k_all, WEIGHT_MAX_THREADS // d_lanes)
    k_tiles, d_tiles = ceil_div(k_all, k_lanes), ceil_div(d_all, d_lanes)
    k_lanes, d_lanes = ceil_div(k_all, k_tiles), ceil_div(d_all, d_tiles)  # balanced over the tiles
    k_tile, out_tile = k_lanes * tk, d_lanes * tn
    channels = max((min(k, f + k_tile) - 1) // taps - f // taps + 1 for f in range(0, k, k_tile))
    tile_w = (ow - 1) * sw + (kw - 1) * dw + 1
    plane = ((oh - 1) * sh + (kh - 1) * dh + 1) * tile_w
    itemsize = compute_dtype(dtype).itemsize
    per_patch = pixels * (out_tile + 4) + channels * plane
    patches = min(spec.n, max(1, WEIGHT_PIXELS // pixels), DEFAULT_SHARED_LIMIT // itemsize // per_patch)
    if patches < 1:
        return None
    weight_tiles = d_tiles * k_tiles
    if spec.groups * weight_tiles > MAX_GRID[1]:
        return None
    d = spec.out_channels
    slices = min(ceil_div(spec.n, patches), max(1, WEIGHT_BLOCKS // (spec.groups * weight_tiles)),
                 max(1, settings.get_workspace_limit() // (d * k * itemsize)))
    # A warp's loads all fall in one patch, so the patches need no bank padding.
    return WeightPlan(patches, out_tile, k_tile, weight_tiles, slices, channels * plane, k_lanes * d_lanes,
                       itemsize * patches * (pixels * (out_tile + 4) + channels * plane))


def _use_tensor_cores(device, spec: ConvSpec, dtype, algorithm: str) -> bool:
    """Whether a pass runs conv2d's tensor-core kernels: 'auto' picks them wherever they can run."""
    return algorithm == "implicit_gemm" or (algorithm == "auto" and tensor_core_refusal(spec, dtype, device) is None)


def _whole_patches(x, spec: ConvSpec, pass_: str = "forward") -> bool:
    """Whether the tensor-core pass_ ('forward', or 'input' with x the contiguous grad_output) runs patch_fwd_igemm
    (ops/implicit_gemm.py: whole patches a block, x read in place, no channels-last copy): where
    `patch_igemm_refusal` (`patch_igemm_input_refusal`) allows, x is C-contiguous and 16-byte aligned, and there are
    enough patches for its persistent blocks to repay their staging of the weight (`patch_igemm_pays`, of the
    transposed convolution for the input gradient): there benchmarks.predict ranks it faster than conv_fwd_igemm and
    its copy (benchmarks/RESULTS.md, "Whole patches a block" and "The input gradient with whole patches a block")."""
    if pass_ == "forward":
        refusal, gemm = patch_igemm_refusal(spec, x.dtype), spec
    else:
        refusal, gemm = patch_igemm_input_refusal(spec, x.dtype), transposed_spec(spec)
    return refusal is None and x.flags.c_contiguous and _address(x) % IG_VECTOR_BYTES == 0 and patch_igemm_pays(gemm)


def _whole_patches_weight(x, gy, spec: ConvSpec) -> bool:
    """Whether the tensor-core weight gradient runs patch_bwd_weight_igemm (ops/implicit_gemm.py: whole patches a
    block, x and grad_output read in place, no channels-last copies): where `patch_weight_refusal` allows, both are
    C-contiguous and 16-byte aligned, and there are enough groups of patches (`patch_weight_pays`): there
    benchmarks.predict ranks it faster than conv_bwd_weight_igemm and its copies (benchmarks/RESULTS.md, "Whole
    patches a block, the weight gradient")."""
    return (patch_weight_refusal(spec, x.dtype) is None and x.flags.c_contiguous and gy.flags.c_contiguous
            and _address(x) % IG_VECTOR_BYTES == 0 and _address(gy) % IG_VECTOR_BYTES == 0
            and patch_weight_pays(spec))


def _use_simt(spec: ConvSpec, dtype, algorithm: str) -> bool:
    """Whether a pass runs conv2d's strict float32 FMA kernels (ops/simt_gemm.py): what 'implicit_gemm' means for
    float32 with TF32 off, and 'auto''s pick there unless both channels per group are at most
    DIRECT_MAX_CHANNELS (conv2d's direct-kernel range, which stays on the fused kernel).  benchmarks.predict ranks
    them so on the patch cases (32 -> 64 channels, 4x4 and 8x8 patches: the FMA GEMM 0.5-0.6x the fused kernel's
    predicted time forward, 0.4-0.7x forward + backward; benchmarks/RESULTS.md)."""
    if algorithm == "auto":
        return (simt_runs(spec, dtype)
                and max(spec.channels_per_group, spec.outputs_per_group) > DIRECT_MAX_CHANNELS)
    return algorithm == "implicit_gemm" and simt_runs(spec, dtype)


def _use_fused(op: str, algorithm: str, spec: ConvSpec, plan) -> bool:
    """Whether a pass runs the fused kernel: 'auto' picks it for small patches when a block fits."""
    if algorithm == "auto":
        return plan is not None and spec.in_size[0] * spec.in_size[1] <= FUSED_MAX_PIXELS
    if algorithm == "fused" and plan is None:
        raise ValueError(f"{op}: algorithm='fused' has no block that fits {DEFAULT_SHARED_LIMIT} bytes of shared "
                         f"memory for patches {spec.in_size[0]}x{spec.in_size[1]} with kernel "
                         f"{spec.kernel_size[0]}x{spec.kernel_size[1]} and {spec.in_channels} -> {spec.out_channels} "
                         f"channels; use algorithm='im2col_gemm' or 'auto'")
    return algorithm == "fused"


# --- launches ---------------------------------------------------------------------------------------------

def _gemm_row_bytes(spec: ConvSpec, itemsize: int) -> int:
    """Bytes of one output row's columns and product (or grad_output copy): a band's workspace per row."""
    return (spec.in_channels * spec.taps + spec.out_channels) * spec.out_size[1] * itemsize


def patch_conv2d_gpu(device, x, weight, bias, spec: ConvSpec, algorithm: str = "auto"):
    out = device.empty(spec.output_shape, x.dtype)
    xv = batch_view(device, x)
    weight = device.ascontiguous(weight)
    if _use_simt(spec, x.dtype, algorithm):
        return simt_gemm_gpu(device, xv, weight, bias, spec, out)
    if _use_tensor_cores(device, spec, x.dtype, algorithm):
        if _whole_patches(x, spec):
            return patch_igemm_forward(device, x, weight, bias, spec, out)
        return implicit_gemm_gpu(device, xv, weight, bias, spec, out)
    plan = plan_tile(spec, x.dtype, transposed=False)
    if not _use_fused("patch_conv2d", algorithm, spec, plan) or plan is None:  # None: _use_fused said no
        return _forward_gemm(device, xv, weight, bias, spec, out)
    KERNELS.launch(device, "patch_fwd", _sizes(spec), dtype=x.dtype,
                   index=index_type(extent(xv), out.size, weight.size),
                   grid=(ceil_div(spec.n, plan.patches), spec.groups * plan.out_tiles), block=plan.threads,
                   shared_mem=plan.shared_mem, window=spec, x=xv, weight=weight,
                   bias=weight if bias is None else bias, out=out, n=spec.n, **batch_args("x", xv),
                   **_group_args(spec), **plan.args(), has_bias=bias is not None)
    return out


def _forward_gemm(device, xv, weight, bias, spec: ConvSpec, out):
    """out (n, G, D / G, L) = weight (G, D / G, C / G * taps) @ cols (n, G, C / G * taps, L), chunk by chunk."""
    g, pixels = spec.groups, spec.out_pixels
    w = weight.reshape(g, spec.outputs_per_group, -1)
    out5 = out.reshape(*xv.shape[:2], g, spec.outputs_per_group, pixels)
    inner, row = spec.with_batch(xv.shape[1]), _gemm_row_bytes(spec, xv.itemsize)
    for o in range(xv.shape[0]):
        for images, band, rows, piece in work_pieces(inner, spec.cols_bytes(xv.itemsize), 0, row):
            cols = unfold_gpu(device, xv[o, images, :, rows], piece)
            cols = cols.reshape(cols.shape[0], g, -1, piece.out_pixels)
            if band == slice(None):
                device.matmul_strided(w, cols, out5[o, images])
            else:   # a band of one patch's output rows
                product = device.empty((1, g, spec.outputs_per_group, piece.out_pixels), xv.dtype)
                device.copyto(out5[o, images, :, :, band], device.matmul_strided(w, cols, product))
                del product
            del cols   # before the next piece's are allocated: one piece's columns at a time
    if bias is not None:
        device.add(out, bias.reshape(-1, 1, 1))
    return out


def _input_grad_gpu(device, gv, weight, spec: ConvSpec, dtype, algorithm: str):
    out = device.empty(spec.input_shape, dtype)
    plan = plan_tile(spec, dtype, transposed=True)
    if not _use_fused("patch_conv2d_backward", algorithm, spec, plan) or plan is None:  # None: _use_fused said no
        return _input_grad_gemm(device, gv, weight, spec, out)
    KERNELS.launch(device, "patch_bwd_input", _sizes(spec), dtype=dtype,
                   index=index_type(extent(gv), out.size, weight.size),
                   grid=(ceil_div(spec.n, plan.patches), spec.groups * plan.out_tiles), block=plan.threads,
                   shared_mem=plan.shared_mem, window=spec, grad_out=gv, weight=weight, grad_x=out, n=spec.n,
                   **batch_args("g", gv), **_group_args(spec), **plan.args())
    return out


def _input_grad_gemm(device, gv, weight, spec: ConvSpec, out):
    """cols = weight^T (G, C / G * taps, D / G) @ grad_output (n, G, D / G, L), then col2im (a gather)."""
    g, pixels = spec.groups, spec.out_pixels
    wt = weight.reshape(g, spec.outputs_per_group, -1).transpose(0, 2, 1)  # read transposed, not copied
    out5 = out.reshape(*gv.shape[:2], *spec.input_shape[-3:])
    inner = spec.with_batch(gv.shape[1])
    per_patch, fixed, row = grad_input_bytes(spec, gv.itemsize)
    if per_patch > settings.get_workspace_limit():
        device.copyto(out, 0)   # bands of a patch's output rows add up where their windows overlap
    for o in range(gv.shape[0]):
        for images, band, rows, piece in work_pieces(inner, per_patch, fixed, row):
            gy = device.reshape(gv[o, images], (-1, g, spec.outputs_per_group, pixels))[..., band]
            cols = device.empty((gy.shape[0], g, wt.shape[1], piece.out_pixels), gy.dtype)
            device.matmul_strided(wt, gy, cols)
            if band == slice(None):
                fold_gpu(device, cols, piece, out=out5[o, images])
            else:
                device.add(out5[o, images, :, rows], fold_gpu(device, cols, piece))
            del cols   # before the next piece's are allocated: one piece's columns at a time
    return out


def _weight_grad_gpu(device, xv, gy, weight, spec: ConvSpec, algorithm: str):
    dtype = weight.dtype
    out = device.empty(spec.weight_shape, dtype)
    plan = plan_weight(spec, dtype)
    if not _use_fused("patch_conv2d_backward", algorithm, spec, plan) or plan is None:  # None: _use_fused said no
        return _weight_grad_gemm(device, xv, gy, spec, out)
    gv = batch_view(device, gy)
    size = out.size
    partial = device.empty((plan.slices, size), compute_dtype(dtype))
    index = index_type(extent(xv), extent(gv), partial.size)
    KERNELS.launch(device, "patch_bwd_weight", dtype=dtype, index=index,
                   grid=(plan.slices, spec.groups * plan.weight_tiles), block=plan.threads, shared_mem=plan.shared_mem,
                   window=spec, x=xv, grad_out=gv, partial=partial, n=spec.n, **batch_args("x", xv),
                   **batch_args("g", gv), **_group_args(spec), patches=plan.patches, out_tile=plan.out_tile,
                   k_tile=plan.k_tile, patch_stride=plan.patch_stride)
    grid, block = elementwise_launch(size)
    KERNELS.launch(device, "patch_reduce", dtype=dtype, index=index, grid=grid, block=block, partial=partial,
                   out=out, slices=plan.slices, size=size)
    return out


def _weight_grad_gemm(device, xv, gy, spec: ConvSpec, out):
    """conv2d's GEMM weight gradient over the batch view's pieces (x and grad_output chunked alike)."""
    gv = device.reshape(gy, (*xv.shape[:2], *gy.shape[-3:]))
    grad = device.reshape(gv, (*xv.shape[:2], spec.groups, spec.outputs_per_group, spec.out_pixels))
    inner, row = spec.with_batch(xv.shape[1]), _gemm_row_bytes(spec, xv.itemsize)
    pieces = ((xv[o, images, :, rows], grad[o, images, :, :, pixels], piece) for o in range(xv.shape[0])
              for images, pixels, rows, piece in work_pieces(inner, weight_grad_bytes(spec, xv.itemsize), 0, row))
    device.copyto(out, gemm_weight_grad(device, pieces, spec, out.dtype))
    return out


def patch_conv2d_backward_gpu(device, grad_output, x, weight, spec: ConvSpec, needs: frozenset,
                              algorithm: str = "auto"):
    weight = device.ascontiguous(weight)
    gv = batch_view(device, grad_output)
    grad_x = grad_w = grad_b = None
    if _use_simt(spec, x.dtype, algorithm):
        gy = device.ascontiguous(grad_output).reshape(spec.n, spec.out_channels, spec.out_pixels)
        if "input" in needs and spec.stride == (1, 1):
            grad_x = simt_gemm_grad_input(device, gy, weight, spec, transposed_spec(spec),
                                          device.empty(spec.input_shape, x.dtype))
        elif "input" in needs:   # strided: the fused kernel ('auto') or the GEMM and col2im
            fallback = "auto" if algorithm == "auto" else "im2col_gemm"
            grad_x = _input_grad_gpu(device, gv, weight, spec, x.dtype, fallback)
        if "weight" in needs:   # grad_bias too, as the kernel's column sums of the gy it stages
            grad_w, grad_b = simt_gemm_grad_weight(device, batch_view(device, x), gy, spec, "bias" in needs)
    elif _use_tensor_cores(device, spec, x.dtype, algorithm):
        gy = device.ascontiguous(grad_output).reshape(spec.n, spec.out_channels, spec.out_pixels)
        # the whole-patch kernels read gy, x and the weight as they lie: no copies of their own to stage
        whole_input = "input" in needs and _whole_patches(gy, spec, "input")
        whole_weight = "weight" in needs and _whole_patches_weight(x, gy, spec)
        staged = needs - ({"input"} if whole_input else set()) - ({"weight"} if whole_weight else set())
        stage_backward_copies(device, gy, batch_view(device, x), weight, spec, staged)   # their copies in one launch
        if "input" in needs:
            grad_input = patch_igemm_grad_input if whole_input else implicit_gemm_grad_input
            grad_x = grad_input(device, gy, weight, spec, device.empty(spec.input_shape, x.dtype))
        if whole_weight:
            grad_w, grad_b = patch_igemm_grad_weight(device, x, gy, spec, "bias" in needs)
        elif "weight" in needs:
            grad_w, grad_b = implicit_gemm_grad_weight(device, batch_view(device, x), gy, spec, "bias" in needs)
    else:
        if "input" in needs:
            grad_x = _input_grad_gpu(device, gv, weight, spec, x.dtype, algorithm)
        if "weight" in needs:
            grad_w = _weight_grad_gpu(device, batch_view(device, x), grad_output, weight, spec, algorithm)
    if "bias" in needs and grad_b is None:
        grad_b = device.astype(device.sum(gv, (0, 1, 3, 4), compute_dtype(x.dtype)), x.dtype)
    return grad_x, grad_w, grad_b


def patch_conv2d_run(device, x, weight, bias, spec: ConvSpec, algorithm: str = "auto"):
    """patch_conv2d of a checked spec on the CPU path (device None) or the kernels."""
    if device is None:
        return patch_conv2d_cpu(x, weight, bias, spec)
    return patch_conv2d_gpu(device, x, weight, bias, spec, algorithm)


def patch_conv2d_backward_run(device, grad_output, x, weight, spec: ConvSpec, needs: frozenset,
                              algorithm: str = "auto"):
    if device is None:
        return patch_conv2d_backward_cpu(grad_output, x, weight, spec, needs)
    with sharing_channels_last():   # both gradients read one channels-last copy of grad_output
        return patch_conv2d_backward_gpu(device, grad_output, x, weight, spec, needs, algorithm)


# ---------------------------------------------------------------------------------------------------------
# Public API


ALGORITHM_DOC = ("str", "The GPU algorithm, for CuPy arrays and CUDA tensors (the CPU path ignores it): 'fused' (whole "
                 "patches in shared memory); 'im2col_gemm'; 'implicit_gemm', `conv2d`'s tensor-core kernels (same "
                 "conditions); or 'auto' (the default): 'implicit_gemm' where it can run, else 'fused' for patches of "
                 f"at most {FUSED_MAX_PIXELS} pixels whose block fits in shared memory, else 'im2col_gemm'.")
X_DOC = ("array (..., C, H, W)", "The patches.")


@on_arrays_device
def patch_convolve(op: str, nd: int, x, weight, bias, stride, padding, dilation, groups, algorithm,
                   workspace_limit):
    """The public patch convolution `op` over nd spatial dims: checked, run through `lift.forward` with
    patch_conv2d's run entry, wrapped back.  patch_conv1d, patch_conv2d and patch_conv3d are this."""
    call = Call(op, x=x, weight=weight, bias=bias)
    spec = ConvSpec.for_conv(op, call.x, call.weight, call.bias, stride, padding, dilation, groups, nd=nd,
                             leading_dims=True)
    check_algorithm(op, algorithm, ALGORITHMS)
    with workspace_scope(op, workspace_limit):
        return call.wrap(lift.forward(patch_conv2d_run, call.device, call.x, call.weight, call.bias, spec,
                                      algorithm))


@on_arrays_device
def patch_convolve_backward(op: str, nd: int, grad_output, x, weight, stride, padding, dilation, groups, needs,
                            algorithm, workspace_limit):
    """The gradients of the public patch convolution `op` (see `patch_convolve`), through `lift.backward`."""
    call = Call(op, grad_output=grad_output, x=x, weight=weight)
    spec = ConvSpec.for_conv(op, call.x, call.weight, None, stride, padding, dilation, groups, nd=nd,
                             leading_dims=True)
    check_grad_output(op, call.grad_output, spec)
    needs = check_needs(op, needs)
    check_algorithm(op, algorithm, ALGORITHMS)
    with workspace_scope(op, workspace_limit):
        return call.wrap(lift.backward(patch_conv2d_backward_run, call.device, call.grad_output, call.x,
                                       call.weight, spec, needs, algorithm))


@numpy_doc(returns=("array (..., D, oH, oW)", SAME_KIND), x=X_DOC, weight=WEIGHT_DOC, algorithm=ALGORITHM_DOC)
def patch_conv2d(x: ArrayT, weight: ArrayT, bias: ArrayT | None = None, stride: IntOrTuple = 1, padding: Padding = 0,
                 dilation: IntOrTuple = 1, groups: int = 1, *, algorithm: str = "auto",
                 workspace_limit: int | None = None) -> ArrayT:
    """Convolve every patch with the same filters: x (..., C, H, W), any number of leading dims, e.g. (B, P, C, H, W).

    Each patch is its own image: the padding is applied inside every patch and nothing is read across patches.
    Equal to `conv2d` of x reshaped to (-1, C, H, W), its result reshaped back to (..., D, oH, oW).
    """
    return patch_convolve("patch_conv2d", 2, x, weight, bias, stride, padding, dilation, groups, algorithm,
                          workspace_limit)


@numpy_doc(returns=GRADIENTS, x=X_DOC, weight=WEIGHT_DOC, algorithm=ALGORITHM_DOC)
def patch_conv2d_backward(grad_output: ArrayT, x: ArrayT, weight: ArrayT, *, stride: IntOrTuple = 1,
                          padding: Padding = 0, dilation: IntOrTuple = 1, groups: int = 1, needs: Needs = NEEDS,
                          algorithm: str = "auto", workspace_limit: int | None = None) -> Gradients[ArrayT]:
    """The gradients of `patch_conv2d`, computed by hand (no autograd)."""
    return patch_convolve_backward("patch_conv2d_backward", 2, grad_output, x, weight, stride, padding, dilation,
                                   groups, needs, algorithm, workspace_limit)
