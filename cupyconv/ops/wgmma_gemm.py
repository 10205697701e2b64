"""The 16-bit and TF32 convolution forward on Hopper's warpgroup MMA (raw_kernels/wgmma_conv.cu, conv_fwd_wgmma:
sm_90a only), beside ops/implicit_gemm.py's conv_fwd_igemm, whose channels-last operands it takes (the same copy of
x, the same arranged weight; float32's rounded to tf32 by that copy) and whose GEMM it runs: the tensor cores read
both operands from shared memory by descriptor, with no ldmatrix.

Not an op of its own: `implicit_gemm_gpu` (ops/implicit_gemm.py) calls `igemm_forward`, which hands a forward to
`wgmma_forward` where `wgmma_refusal` allows and the device runs wgmma (`Device.wgmma`: a compute capability 9.0
GPU, for which CudaDevice compiles this file with -arch=sm_90a; opted in by CUPYCONV_WGMMA=1 until a GPU has run
the kernel).
"""
from __future__ import annotations

import numpy

from .._device import _address
from .._kernels import INT32_MAX, PLAN_SMS, KernelFile, kernel_name
from .._spec import ConvSpec, ceil_div

# conv_fwd_wgmma's block: two warpgroups of 128 threads, 128 rows (output pixels), K in rows of 128 bytes (64
# elements) a stage in the 128-byte swizzle, each stage 1024-byte aligned (the planner adds WGC_ALIGN bytes of
# dynamic shared memory for the kernel's rounding up).
KERNELS = KernelFile("wgmma_conv.cu", defines={"WGC_THREADS": 256, "WGC_ROW_BYTES": 128, "WGC_ALIGN": 1024},
                     sm90a=True)
WGC_THREADS = KERNELS.defines["WGC_THREADS"]
WGC_ROW_BYTES = KERNELS.defines["WGC_ROW_BYTES"]
WGC_ALIGN = KERNELS.defines["WGC_ALIGN"]
# (rows, columns, stages) by dtype, widest first, `wgmma_tile` picks: either tile is 128 pixels by 64 channels a
# warpgroup (the kernel's m64n128 with the channels as wgmma's M), 256 x 64 with 160 KiB of stages (one block an
# SM) reading each weight chunk once for 256 pixels.  float32 (TF32) has the 64-column tile only:
# the TF32 cases it serves (r50-64's forward and input gradient, 64 channels) need no other, and a 128-column one
# would cost CI its compile for no case.  A 128-byte row is 32 floats, 4 k8 steps: the 16-bit tiles' pipeline and
# shared memory as they are.
WGC_TILES = {"float16": ((128, 128, 4), (256, 64, 4)), "bfloat16": ((128, 128, 4), (256, 64, 4)),
             "float32": ((256, 64, 4),)}
WGC_VECTOR_BYTES = 16   # a cp.async, and the channels' granule
# 'auto' hands a forward to conv_fwd_wgmma from this many blocks: it has no split of K, so a grid under two waves of
# 132 SMs (conv_fwd_igemm's IG_WAVE_BLOCKS, where that kernel splits K to fill them) stays on conv_fwd_igemm.
WGC_MIN_BLOCKS = 2 * PLAN_SMS


def instantiations():
    """fp16 and bf16 with the two tiles, TF32 with one, 32-bit indices: 5 kernels (64-bit problems stay on
    conv_fwd_igemm)."""
    return [kernel_name("conv_fwd_wgmma", dtype, "int", *tile) for dtype, tiles in WGC_TILES.items()
            for tile in tiles]


def wgmma_tile(spec: ConvSpec, dtype) -> tuple[int, int, int]:
    """128 columns for groups of more than 64 output channels where the dtype has them, else 64."""
    tiles = WGC_TILES[numpy.dtype(dtype).name]
    return tiles[0] if spec.outputs_per_group > 64 else tiles[-1]


def wgmma_shared_bytes(tile: tuple[int, int, int]) -> int:
    """The pipeline's stages (the epilogue's (columns, rows + 8) tile fits in them) and the alignment's slack."""
    bm, bn, stages = tile
    return stages * (bm + bn) * WGC_ROW_BYTES + WGC_ALIGN


def wgmma_grid(spec: ConvSpec, dtype) -> tuple[int, int, int]:
    bm, bn, _ = wgmma_tile(spec, dtype)
    return ceil_div(spec.n * spec.out_pixels, bm), spec.groups * ceil_div(spec.outputs_per_group, bn), 1


def wgmma_preferred(spec: ConvSpec, dtype) -> bool:
    """Whether a forward that conv_fwd_wgmma can run (`wgmma_refusal`) runs there on a wgmma device: where the
    model ranks it faster than conv_fwd_igemm (benchmarks/RESULTS.md, "conv_fwd_wgmma" and "TF32 on wgmma"): its
    unsplit grid fills two waves (`WGC_MIN_BLOCKS`) and a group's output channels are one column tile more than
    half used (TF32: the 64-column tile, so 33 to 64 channels).  PREDICTED (H100) slower elsewhere: r50-128's 196
    blocks of 128 x 128 (or 392 of 128 x 64, x read twice) and the patch input gradient's 32 of 64 columns (p-seed
    fwd+bwd 159.4-251.0 -> 162.2-261.7 us)."""
    bm, bn, _ = wgmma_tile(spec, dtype)
    blocks = ceil_div(spec.n * spec.out_pixels, bm) * spec.groups
    return blocks >= WGC_MIN_BLOCKS and bn // 2 < spec.outputs_per_group <= bn


def wgmma_refusal(spec: ConvSpec, dtype, x_size: int, out_size: int, weight_size: int,
                  channels_last_out: bool) -> str | None:
    """Why conv_fwd_wgmma cannot run this forward (x channels-last, the weight arranged: `igemm_refusal` said yes),
    or None: 2-D, a 16-bit dtype or float32 (as TF32: `tensor_core_refusal` made sure it is allowed), an NCHW
    output, 32-bit indices."""
    if len(spec.kernel_size) != 2:
        return "it takes 2-D convolutions only"
    name = numpy.dtype(dtype).name
    if name not in WGC_TILES:
        return f"it takes {', '.join(WGC_TILES)} (as TF32), not {name}"
    vector = WGC_VECTOR_BYTES // numpy.dtype(dtype).itemsize
    if spec.channels_per_group % vector:
        return f"it needs input channels per group in multiples of {vector}, not {spec.channels_per_group}"
    if channels_last_out:
        return "it writes NCHW outputs only"
    if max(x_size, out_size, weight_size) > INT32_MAX:
        return "it takes 32-bit indices only"
    return None


def wgmma_forward(device, xl, wk, bias, spec: ConvSpec, out):
    """conv_fwd_wgmma: out (n, D, oH, oW) C-contiguous from xl (n, H, W, C) and wk (D, taps, C / G), both
    C-contiguous and 16-byte aligned (`channels_last`, `weight_view`; float32 rounded to tf32 there), bias (D,) or
    None; one launch, no split."""
    tile = wgmma_tile(spec, xl.dtype)
    vector = WGC_VECTOR_BYTES // xl.dtype.itemsize
    KERNELS.launch(device, "conv_fwd_wgmma", tile, dtype=xl.dtype, index="int", grid=wgmma_grid(spec, xl.dtype),
                   block=WGC_THREADS, shared_mem=wgmma_shared_bytes(tile), window=spec, x=xl, weight=wk,
                   bias=wk if bias is None else device.ascontiguous(bias), out=out, n=spec.n, groups=spec.groups,
                   channels_per_group=spec.channels_per_group, outputs_per_group=spec.outputs_per_group,
                   has_bias=bias is not None,
                   vector_store=spec.out_pixels % vector == 0 and _address(out) % WGC_VECTOR_BYTES == 0)
    return out
