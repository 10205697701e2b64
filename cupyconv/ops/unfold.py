"""unfold (im2col) and fold (col2im), torch semantics over (..., C, H, W), forward and backward.

unfold's backward is a fold and fold's backward an unfold, so the module has two passes, not four.

CPU path: im2col is a strided view over the padded input and col2im a loop over the kernel taps (each tap one
vectorised add); conv, depthwise and patch build on these primitives.
GPU path: raw_kernels/unfold.cu, one thread per window for im2col (`unfold_gpu`, also the column builder of
conv and patch), or per run of 16 bytes of output pixels with 16-byte loads and stores where the layout allows
(`unfold_im2col<T, I, RUN>`, RUN = `vector_run`), and a deterministic gather for col2im (`fold_gpu`,
`fold_col2im<T, I, RUN, BIAS>`, BIAS where conv_transpose's bias is added), one thread per position of FOLD_PLANES
planes, or in the 16-bit types per run of 16 bytes of positions with 16-byte loads and stores where the window and
layout allow (stride 1 along x, `fold_run`); both loop over their units on at most UNFOLD_BLOCKS blocks and split
indices by FastDivmod multipliers computed here (`_kernels.fast_divmod_magic`).
"""
from __future__ import annotations

import itertools

import numpy
from numpy.lib.stride_tricks import as_strided

from .. import _replay
from .._arrays import Call, compute_dtype, on_arrays_device
from .._device import _address
from .._kernels import (INDEX_TYPES, KERNEL_DTYPES, KernelFile, element_strides, elementwise_launch, extent,
                        fast_divmod_magic, index_type, kernel_name, stride_args)
from .._spec import ConvSpec, ceil_div
from .._docs import SAME_KIND, numpy_doc
from .._typing import ArrayT, IntOrTuple, Padding
from . import lift


# ---------------------------------------------------------------------------------------------------------
# CPU path; the primitives work over a flat batch x (n, C, H, W)


def zeros_cpu(n, c, h, w, dtype, batch_last=False):
    """A zeroed (n, C, h, w) array; with batch_last its memory order is (C, h, w, n), so that copies over tiny
    planes run along the batch instead of along rows of a few pixels."""
    if batch_last:
        return numpy.zeros((c, h, w, n), dtype=dtype).transpose(3, 0, 1, 2)
    return numpy.zeros((n, c, h, w), dtype=dtype)


def pad_cpu(x, spec: ConvSpec, dtype=None, batch_last=False):
    """x (n, C, H, W) zero-padded to (n, C, Hp, Wp), in `dtype` (default: x's)."""
    (top, _), (left, _) = spec.padding
    n, c, h, w = x.shape
    out = zeros_cpu(n, c, spec.padded_size[0], spec.padded_size[1], dtype or x.dtype, batch_last)
    out[:, :, top:top + h, left:left + w] = x
    return out


def windows_cpu(padded, spec: ConvSpec):
    """Read-only view (n, C, kH, kW, oH, oW) of a padded (n, C, Hp, Wp) array: the im2col matrix, uncopied."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = spec.kernel_size, spec.stride, spec.dilation, spec.out_size
    n, c = padded.shape[:2]
    s = padded.strides
    return as_strided(padded, (n, c, kh, kw, oh, ow),
                      (s[0], s[1], s[2] * dh, s[3] * dw, s[2] * sh, s[3] * sw), writeable=False)


def col2im_cpu(cols, spec: ConvSpec, dtype, batch_last=False):
    """Sum cols (n, C, kH, kW, oH, oW) back onto the input positions they were read from: (n, C, H, W)."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = spec.kernel_size, spec.stride, spec.dilation, spec.out_size
    n, c = cols.shape[:2]
    out = zeros_cpu(n, c, spec.padded_size[0], spec.padded_size[1], dtype, batch_last)
    for i in range(kh):
        for j in range(kw):
            out[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw] += cols[:, :, i, j]
    (top, _), (left, _) = spec.padding
    h, w = spec.in_size
    return out[:, :, top:top + h, left:left + w]


def _flat(a, spec: ConvSpec, trailing: int):
    """a with its leading batch dims flattened into one: (n, *a.shape[-trailing:])."""
    return a.reshape((spec.n, *a.shape[a.ndim - trailing:]))


def unfold_cpu(x, spec: ConvSpec):
    win = windows_cpu(pad_cpu(_flat(x, spec, 3), spec), spec)
    cols = win.reshape(*spec.batch, spec.in_channels * spec.taps, spec.out_pixels)
    # The reshape copies unless the windows are already laid out in order (1x1 kernel, or a single window),
    # where it is a read-only view of the padded copy: hand the caller a writeable array either way.
    return cols if cols.flags.writeable else cols.copy()


def fold_cpu(cols, spec: ConvSpec):
    c, (kh, kw), (oh, ow) = spec.in_channels, spec.kernel_size, spec.out_size
    six = _flat(cols, spec, 2).reshape(spec.n, c, kh, kw, oh, ow)
    out = col2im_cpu(six, spec, compute_dtype(cols.dtype))   # a view into the padded sums: return a copy
    return numpy.ascontiguousarray(out.astype(cols.dtype, copy=False)).reshape(*spec.batch, c, *spec.in_size)


# ---------------------------------------------------------------------------------------------------------
# GPU path (CuPy on a GPU, or the test emulator): raw_kernels/unfold.cu

FOLD_PLANES = 8  # planes (image, channel) per thread of fold_col2im: they share its index arithmetic
KERNELS = KernelFile("unfold.cu", defines={"FOLD_PLANES": FOLD_PLANES})
# The most blocks of 256 threads either kernel is launched with: about two waves of an H100 (132 SMs x 8 resident
# blocks), whose threads loop over the windows or pixels, so each pays its set-up (the split of its first index)
# for several units.  tests/bug_classes.py's lift_grid_cap lifts it.
UNFOLD_BLOCKS = 2048


def _launch(units: int):
    """(grid, block) of a grid-stride launch over `units`, at most UNFOLD_BLOCKS blocks."""
    (blocks,), block = elementwise_launch(units)
    return (min(blocks, UNFOLD_BLOCKS),), block


def vector_run(dtype) -> int:
    """Elements of `dtype` in one 16-byte access: the RUN of unfold_im2col's vector instantiation."""
    itemsize = {"bfloat16": 2}.get(dtype) if isinstance(dtype, str) else None   # a name NumPy alone may not know
    return 16 // (itemsize or numpy.dtype(dtype).itemsize)


def fold_run(dtype) -> int:
    """The RUN of fold_col2im's vector instantiation for `dtype`, 1 where it has none: 16-bit types only.  In
    float32 (4 positions a 16-byte vector) the gather of FOLD_PLANES planes a thread is the leaner (9-11 SASS
    instructions a load and a position against about 16 a position and tap), and the model put the vector fold of
    c1d-audio, c3d-mri and g2-256 10-12% higher at its high end (task foldcopy)."""
    run = vector_run(dtype)
    return run if run == 8 else 1   # (8 elements in 16 bytes: a 2-byte type)


def instantiations():
    return [*(kernel_name("unfold_im2col", d, i, run) for d, i in itertools.product(KERNEL_DTYPES, INDEX_TYPES)
              for run in (1, vector_run(d))),
            *(kernel_name("fold_col2im", d, i, run, bias) for d, i in itertools.product(KERNEL_DTYPES, INDEX_TYPES)
              for run in sorted({1, fold_run(d)}) for bias in (False, True))]


def unfold_gpu(device, x, spec: ConvSpec, rows_first: bool = False):
    """cols of x (..., C, H, W) through the kernel, reading x in place via its strides.

    Layout (n, C * kH * kW, L) like torch, or with rows_first (C * kH * kW, n, L): then each group's rows are
    one matrix over n * L, so a weight gradient is a single GEMM per group.
    """
    c, (h, w), n = spec.in_channels, spec.in_size, spec.n
    x4 = device.reshape(x, (n, c, h, w))
    rows, pixels = c * spec.taps, spec.out_pixels
    if rows_first:
        cols = device.empty((rows, n, pixels), x.dtype)
        image_stride, row_stride = pixels, n * pixels
    else:
        cols = device.empty((n, rows, pixels), x.dtype)
        image_stride, row_stride = rows * pixels, pixels
    windows = n * c * pixels
    if not windows:
        return cols
    (oh, ow), index = spec.out_size, index_type(cols.size, extent(x4))
    sx, vector = element_strides(x4), vector_run(x4.dtype)
    # 16-byte accesses need every row of x and of cols to start on a 16-byte boundary, and a run of pixels to be
    # contiguous in x: else one thread per window, through any strides.
    run = vector if (spec.stride[1] == 1 and sx[3] == 1 and ow % vector == 0
                     and all(s % vector == 0 for s in (sx[0], sx[1], sx[2], image_stride, row_stride))
                     and _address(x4) % 16 == 0 and _address(cols) % 16 == 0) else 1
    grid, block = _launch(windows // run)
    KERNELS.launch(device, "unfold_im2col", (run,), dtype=x.dtype, index=index, grid=grid, block=block, window=spec,
                   x=x4, cols=cols, n=n, **stride_args("x", x4, "nchw"), cols_stride_image=image_stride,
                   cols_stride_row=row_stride, channels=c, row_units_magic=fast_divmod_magic(ow // run),
                   out_h_magic=fast_divmod_magic(oh), channels_magic=fast_divmod_magic(c))
    return cols


def fold_gpu(device, cols, spec: ConvSpec, out=None, bias=None):
    """Fold contiguous cols (n, C * kH * kW, L) into (n, C, H, W) by a deterministic gather; into out where given
    (C-contiguous, that shape, cols' dtype: a chunk of a larger result, written in place, no copy).  Both
    instantiations sum each position's taps in the same order, so the vector one (RUN > 1) gives the same bits.
    bias (C,) or None: added to each position's sum before its rounding (conv_transpose's forward)."""
    c, (h, w) = spec.in_channels, spec.in_size
    cols = device.ascontiguous(device.reshape(cols, (spec.n, c * spec.taps, spec.out_pixels)))
    if out is None:
        out = device.empty((spec.n, c, h, w), cols.dtype)
    if out.size:
        (sh, sw), ow, index = spec.stride, spec.out_size[1], index_type(cols.size, out.size)
        # 16-byte accesses need rows of cols and of out that start on 16-byte boundaries, and the V positions of a
        # run to read V consecutive elements of a cols row (stride 1 along x): else one thread per position.
        vector = fold_run(cols.dtype)
        run = vector if (vector > 1 and sw == 1 and w % vector == 0 and ow % vector == 0
                         and _address(cols) % 16 == 0 and _address(out) % 16 == 0) else 1
        units = spec.n * c * h * w // run if run > 1 else ceil_div(spec.n * c, FOLD_PLANES) * h * w
        grid, block = _launch(units)
        KERNELS.launch(device, "fold_col2im", (run, bias is not None), dtype=cols.dtype, index=index, grid=grid,
                       block=block, window=spec, cols=cols, out=out,
                       bias=cols if bias is None else device.ascontiguous(bias), n=spec.n, channels=c,
                       width_magic=fast_divmod_magic(w // run), height_magic=fast_divmod_magic(h),
                       stride_h_magic=fast_divmod_magic(sh), stride_w_magic=fast_divmod_magic(sw),
                       channels_magic=fast_divmod_magic(c))
    return out


# ---------------------------------------------------------------------------------------------------------
# Public API


def _unfold_run(device, x, spec: ConvSpec):
    """cols (*batch, C * taps, L) of x over 1, 2 or 3 spatial dims; 1-D and 3-D through the 2-D kernels
    (ops/lift.py): a unit height, or the depth windows, whose 2-D cols (n, oD, C * taps, oH * oW) are
    reordered to (n, C * taps, oD * oH * oW)."""
    rows, pixels, n, ops = spec.in_channels * spec.taps, spec.out_pixels, spec.n, lift.arrays(device)
    spec = lift.prepare(device, spec, x.dtype, [(*spec.batch, rows, pixels)])
    if spec.nd == 1:
        x, spec2 = lift.with_unit_height(x), lift.unit_height(spec)
    elif spec.nd == 3:
        x = lift.depth_windows(device, ops.reshape(x, (n, *spec.input_shape[-4:])), spec)
        spec2 = lift.depth_spec(spec, n)
    else:
        spec2 = spec
    cols = unfold_cpu(x, spec2) if device is None else unfold_gpu(device, x, spec2)
    if spec.nd == 3:
        cols = cols.reshape(n, spec.out_size[0], rows, spec2.out_pixels).swapaxes(1, 2)
    return ops.reshape(cols, (*spec.batch, rows, pixels))


def _fold_run(device, cols, spec: ConvSpec):
    """The fold of cols (*batch, C * taps, L) into (*batch, C, *in_size), the reverse of `_unfold_run`."""
    rows, n, ops = spec.in_channels * spec.taps, spec.n, lift.arrays(device)
    spec = lift.prepare(device, spec, cols.dtype, [spec.input_shape])
    if spec.nd == 1:
        spec2 = lift.unit_height(spec)
    elif spec.nd == 3:
        spec2 = lift.depth_spec(spec, n)
        cols = ops.reshape(cols, (n, rows, spec.out_size[0], spec2.out_pixels))
        cols = ops.ascontiguous(cols.swapaxes(1, 2))
    else:
        spec2 = spec
    cols = ops.reshape(cols, (*spec2.batch, rows, spec2.out_pixels))
    out = fold_cpu(cols, spec2) if device is None else fold_gpu(device, cols, spec2)
    if spec.nd == 3:
        out = lift.depth_fold(device, out, spec, cols.dtype)
    return ops.reshape(out, spec.input_shape)


@on_arrays_device
def _unfold(op: str, name: str, x, kernel_size, dilation, padding, stride):
    """unfold, with errors naming `op` and calling the array `name` (fold_backward: grad_output)."""
    call = Call(op, **{name: x})
    x = getattr(call, name)
    spec = ConvSpec.for_unfold(op, x, kernel_size, dilation, padding, stride, name=name)
    return call.wrap(_replay.replayed(call.device, ("unfold", spec), (x,),
                                      lambda device: _unfold_run(device, x, spec)))


@on_arrays_device
def _fold(op: str, name: str, size_name: str, cols, output_size, kernel_size, dilation, padding, stride):
    """fold, with errors naming `op` and calling its arguments `name` and `size_name`."""
    call = Call(op, **{name: cols})
    cols = getattr(call, name)
    spec = ConvSpec.for_fold(op, cols, output_size, kernel_size, dilation, padding, stride, name=name,
                             size_name=size_name)
    return call.wrap(_replay.replayed(call.device, ("fold", spec), (cols,),
                                      lambda device: _fold_run(device, cols, spec)))


BLOCKS_DOC = ("array (..., C * taps, L)",
              "taps = the product of kernel_size, L = the number of output positions (oH * oW in 2-D).  " + SAME_KIND)


@numpy_doc(returns=BLOCKS_DOC, x=("array ``(..., C, *spatial)``",
                                  "The input, any number of leading dims: (..., C, H, W) in 2-D, (..., C, L) or "
                                  "(..., C, D, H, W)."))
def unfold(x: ArrayT, kernel_size: IntOrTuple, dilation: IntOrTuple = 1, padding: Padding = 0,
           stride: IntOrTuple = 1) -> ArrayT:
    """Sliding local blocks of x (im2col), like `torch.nn.functional.unfold`.

    Rows in (c, taps in order) order, (c, i, j) in 2-D, as torch's; columns are the output positions in order.
    """
    return _unfold("unfold", "x", x, kernel_size, dilation, padding, stride)


@numpy_doc(returns=("array ``(..., C, *output_size)``", SAME_KIND),
           cols=("array (..., C * taps, L)", "The blocks, laid out as `unfold` returns them."),
           output_size=("int or tuple of int", "The spatial size of the result: (H, W) in 2-D, or 1 or 3 ints."))
def fold(cols: ArrayT, output_size: IntOrTuple, kernel_size: IntOrTuple, dilation: IntOrTuple = 1, padding: Padding = 0,
         stride: IntOrTuple = 1) -> ArrayT:
    """Sum sliding local blocks back into an array (col2im), like `torch.nn.functional.fold`.

    Entries that overlap are summed: fold is the adjoint of `unfold`, not its inverse.
    """
    return _fold("fold", "cols", "output_size", cols, output_size, kernel_size, dilation, padding, stride)


@numpy_doc(returns=("array ``(..., C, *input_size)``", SAME_KIND),
           grad_output=("array (..., C * taps, L)", "The gradient with respect to unfold's output."),
           input_size=("int or tuple of int", "The spatial size of unfold's input: (H, W) in 2-D, or 1 or 3 ints."))
def unfold_backward(grad_output: ArrayT, input_size: IntOrTuple, kernel_size: IntOrTuple, dilation: IntOrTuple = 1,
                    padding: Padding = 0, stride: IntOrTuple = 1) -> ArrayT:
    """The gradient of `unfold` with respect to its input: a `fold` of grad_output."""
    return _fold("unfold_backward", "grad_output", "input_size", grad_output, input_size, kernel_size, dilation,
                 padding, stride)


@numpy_doc(returns=BLOCKS_DOC,
           grad_output=("array ``(..., C, *spatial)``", "The gradient with respect to fold's output."))
def fold_backward(grad_output: ArrayT, kernel_size: IntOrTuple, dilation: IntOrTuple = 1, padding: Padding = 0,
                  stride: IntOrTuple = 1) -> ArrayT:
    """The gradient of `fold` with respect to its cols: an `unfold` of grad_output."""
    return _unfold("fold_backward", "grad_output", grad_output, kernel_size, dilation, padding, stride)
