"""unfold (im2col) and fold (col2im), torch semantics over (..., C, H, W), forward and backward.

The CPU path's im2col is a strided view over the padded input and col2im a loop over the kernel taps (each
tap one vectorised add); conv, depthwise and patch build on these two primitives.
"""
from __future__ import annotations

import itertools

import numpy
from numpy.lib.stride_tricks import as_strided

from .._arrays import Call, compute_dtype
from .._device import INDEX_TYPES, KERNEL_DTYPES, element_strides, elementwise_launch, extent, index_types, kernel_name
from .._spec import ConvSpec


# ---------------------------------------------------------------------------------------------------------
# CPU primitives over a flat batch: x (n, C, H, W)


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
    out = zeros_cpu(n, c, *spec.padded_size, dtype or x.dtype, batch_last)
    out[:, :, top:top + h, left:left + w] = x
    return out


def windows_cpu(padded, spec: ConvSpec):
    """Read-only view (n, C, kH, kW, oH, oW) of a padded (n, C, Hp, Wp) array: the im2col matrix, uncopied."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = spec.kernel, spec.stride, spec.dilation, spec.out_size
    n, c = padded.shape[:2]
    s = padded.strides
    return as_strided(padded, (n, c, kh, kw, oh, ow),
                      (s[0], s[1], s[2] * dh, s[3] * dw, s[2] * sh, s[3] * sw), writeable=False)


def col2im_cpu(cols, spec: ConvSpec, dtype, batch_last=False):
    """Sum cols (n, C, kH, kW, oH, oW) back onto the input positions they were read from: (n, C, H, W)."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = spec.kernel, spec.stride, spec.dilation, spec.out_size
    n, c = cols.shape[:2]
    out = zeros_cpu(n, c, *spec.padded_size, dtype, batch_last)
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
    c, (kh, kw), (oh, ow) = spec.in_channels, spec.kernel, spec.out_size
    six = _flat(cols, spec, 2).reshape(spec.n, c, kh, kw, oh, ow)
    out = col2im_cpu(six, spec, compute_dtype(cols.dtype))
    return out.astype(cols.dtype, copy=False).reshape(*spec.batch, c, *spec.in_size)


# ---------------------------------------------------------------------------------------------------------
# Kernel path (CuPy on a GPU, or the test emulator): raw_kernels/unfold.cu

KERNEL_FILE = "unfold.cu"


def instantiations():
    return [(KERNEL_FILE, kernel_name(k, d, i))
            for k, d, i in itertools.product(("unfold_im2col", "fold_col2im"), KERNEL_DTYPES, INDEX_TYPES)]


def _geometry(spec: ConvSpec):
    """The int geometry arguments shared by both kernels, in their C order."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = spec.kernel, spec.stride, spec.dilation, spec.out_size
    (top, _), (left, _) = spec.padding
    return [numpy.int32(v) for v in (kh, kw, sh, sw, top, left, dh, dw, oh, ow)]


def im2col_kernel(device, x, spec: ConvSpec, rows_first: bool = False):
    """cols of x (..., C, H, W) through the kernel, reading x in place via its strides.

    Layout (n, C * kH * kW, L) like torch, or with rows_first (C * kH * kW, n, L): then each group's rows are
    one matrix over n * L, so a weight gradient is a single GEMM per group.
    """
    c, (h, w), n = spec.in_channels, spec.in_size, spec.n
    x4 = x.reshape(n, c, h, w)
    rows, pixels = c * spec.taps, spec.out_pixels
    if rows_first:
        cols = device.empty((rows, n, pixels), x.dtype)
        image_stride, row_stride = pixels, n * pixels
    else:
        cols = device.empty((n, rows, pixels), x.dtype)
        image_stride, row_stride = rows * pixels, pixels
    windows = n * c * pixels
    if windows:
        index, I = index_types(cols.size, extent(x4))
        grid, block = elementwise_launch(windows)
        device.launch(KERNEL_FILE, kernel_name("unfold_im2col", x.dtype, index), grid, block,
                      [x4, cols, I(n), *(I(s) for s in element_strides(x4)), I(image_stride), I(row_stride),
                       numpy.int32(c), numpy.int32(h), numpy.int32(w), *_geometry(spec)])
    return cols


def col2im_kernel(device, cols, spec: ConvSpec):
    """Fold contiguous cols (n, C * kH * kW, L) into (n, C, H, W) by a deterministic gather."""
    c, (h, w) = spec.in_channels, spec.in_size
    cols = device.xp.ascontiguousarray(cols.reshape(spec.n, c * spec.taps, spec.out_pixels))
    out = device.empty((spec.n, c, h, w), cols.dtype)
    if out.size:
        index, I = index_types(cols.size, out.size)
        grid, block = elementwise_launch(out.size)
        device.launch(KERNEL_FILE, kernel_name("fold_col2im", cols.dtype, index), grid, block,
                      [cols, out, I(spec.n), numpy.int32(c), numpy.int32(h), numpy.int32(w), *_geometry(spec)])
    return out


# ---------------------------------------------------------------------------------------------------------
# Public API


def _unfold(op: str, name: str, x, kernel_size, dilation, padding, stride):
    """unfold, with errors naming `op` and calling the array `name` (fold_backward: grad_output)."""
    call = Call(op, **{name: x})
    x = getattr(call, name)
    spec = ConvSpec.for_unfold(op, x, kernel_size, dilation, padding, stride, name=name)
    if call.device is None:
        return call.wrap(unfold_cpu(x, spec))
    cols = im2col_kernel(call.device, x, spec)
    return call.wrap(cols.reshape(*spec.batch, *cols.shape[1:]))


def _fold(op: str, name: str, size_name: str, cols, output_size, kernel_size, dilation, padding, stride):
    """fold, with errors naming `op` and calling its arguments `name` and `size_name`."""
    call = Call(op, **{name: cols})
    cols = getattr(call, name)
    spec = ConvSpec.for_fold(op, cols, output_size, kernel_size, dilation, padding, stride, name=name,
                             size_name=size_name)
    if call.device is None:
        return call.wrap(fold_cpu(cols, spec))
    out = col2im_kernel(call.device, cols, spec)
    return call.wrap(out.reshape(spec.input_shape))


def unfold(x, kernel_size, dilation=1, padding=0, stride=1):
    """Extract sliding local blocks: x (..., C, H, W) -> (..., C * kH * kW, L), L = oH * oW.

    Same semantics and row order (c, i, j) as `torch.nn.functional.unfold`, with any number of leading dims
    and padding also given per side ((top, bottom), (left, right)), 'same' or 'valid'.
    """
    return _unfold("unfold", "x", x, kernel_size, dilation, padding, stride)


def fold(cols, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """Sum sliding local blocks back: cols (..., C * kH * kW, L) -> (..., C, H, W), (H, W) = output_size.

    Same semantics as `torch.nn.functional.fold`: overlapping entries are summed.
    """
    return _fold("fold", "cols", "output_size", cols, output_size, kernel_size, dilation, padding, stride)


def unfold_backward(grad_output, input_size, kernel_size, dilation=1, padding=0, stride=1):
    """Gradient of unfold with respect to its input of spatial size input_size (H, W): a fold."""
    return _fold("unfold_backward", "grad_output", "input_size", grad_output, input_size, kernel_size, dilation,
                 padding, stride)


def fold_backward(grad_output, kernel_size, dilation=1, padding=0, stride=1):
    """Gradient of fold with respect to its cols: an unfold of grad_output (..., C, H, W)."""
    return _unfold("fold_backward", "grad_output", grad_output, kernel_size, dilation, padding, stride)
