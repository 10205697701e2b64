"""1-D and 3-D problems on the 2-D kernels: the spec and array mappings, and the drivers every convolution runs
(over 1, 2 or 3 dims; they also check sizes first and answer empty problems).

The kernels are 2-D.  A 1-D problem is a 2-D one with a unit height (no copy: a view with a length-1 axis).
A 3-D problem (depth D, H, W) is folded into a 2-D one by its depth taps, exactly:

    y[n, o, z] = sum over c, a of  w[o, c, a] (*) x[n, c, z * sd + a * dd - pad_front]      ((*): 2-D conv in H, W)

so with the "depth windows" v[n, z, (c, a)] = x[n, c, z * sd + a * dd - pad_front] (zero where that depth is
padding), the 3-D convolution of x is the 2-D convolution of v, batch n * oD and C * kD input channels, with
the weight reshaped (O, C / G * kD, kH, kW).  Groups survive the fold: group g's channels (c, a) are the
consecutive range [g * C / G * kD, (g + 1) * C / G * kD).  The backward is the 2-D backward of that problem;
the input gradient of v is summed back onto the depths its planes came from (`depth_fold`), in tap order, so
the result is deterministic.  Every 2-D algorithm (tensor cores included) serves 3-D this way, at the cost of
the depth windows (kD / sd times the input, in chunks within the workspace limit) and one transposed copy of
the output and of grad_output ((n, oD, O, ...) <-> (n, O, oD, ...)).  A chunk is whole images, or where one
image's windows (and gradients) pass half the workspace limit, a slab of one image's output depths: the windows
of output depths z0 <= z < z1 are those of the 2-D problem of batch z1 - z0, and the slabs' input gradients are
summed onto the image's in slab order.

A depthwise 3-D convolution folds into a grouped 2-D one with kD channels per group (it runs conv2d's
kernels, not the depthwise ones).

An op may answer a 3-D pass itself (`forward`/`backward`'s `native`: conv's `native_3d`, the tensor cores'
conv_fwd_igemm_3d for the forward and the stride-1 input gradient); the drivers then skip the depth windows for it.
"""
from __future__ import annotations

import dataclasses
import math

import numpy

from .. import _device, _replay, settings
from .._arrays import compute_dtype
from .._kernels import (ELEMENTWISE_BLOCK, INDEX_TYPES, INT32_MAX, KERNEL_DTYPES, MAX_GRID, KernelFile,
                        element_strides, extent, fast_divmod_magic, index_type, kernel_name)
from .._spec import NEEDS, ConvSpec, batch_chunks, ceil_div


#: The CPU path's array work: `Device`'s array methods on NumPy arrays (it launches no kernel).
NUMPY = _device.Device()
LIFT_RUN = 8       # pixels a thread takes per pass over a plane (lift.cu): a plane's set-up paid once per 8
#: The 3-D fold's data movement on the GPU path: the depth windows and the fold of their gradient, one launch each.
KERNELS = KernelFile("lift.cu", defines={"LIFT_RUN": LIFT_RUN, "LIFT_THREADS": ELEMENTWISE_BLOCK})
# Blocks of a plane's pixels (ELEMENTWISE_BLOCK threads each) at most; the planes take the rest of the grid, their
# loop paying a plane's coordinates once per block and pass.
PLANE_BLOCKS = 64


def instantiations():
    return [kernel_name(kernel, dtype, index) for kernel in ("depth_windows", "depth_fold")
            for dtype in KERNEL_DTYPES for index in INDEX_TYPES]


def _plane_launch(planes: int, pixels: int):
    """(grid, block) of lift.cu's kernels: blocks over a plane's pixels (x), planes over y."""
    across = max(1, min(PLANE_BLOCKS, -(-pixels // (ELEMENTWISE_BLOCK * LIFT_RUN))))
    return (across, max(1, min(planes, MAX_GRID[1]))), (ELEMENTWISE_BLOCK,)


def arrays(device):
    """Whose array methods (`Device.empty`, `copyto`, `zeros`, ...) an op's array work uses: the device's, or
    NumPy's on the CPU path (device None)."""
    return NUMPY if device is None else device


def empty(device, shape, dtype):
    """An uninitialised array on the op's path (the emulator's is poisoned, so unwritten elements show)."""
    return arrays(device).empty(shape, dtype)


def placeholder(device, shape, dtype, like=None):
    """A read-only array of `shape` without its memory (one element, broadcast): for an argument whose values a
    computation does not read (x of an input gradient, which only needs its shape).  The element is the first of
    `like` (a non-empty array of dtype, as a view: no fill launched, no allocation), else a zero."""
    ops = arrays(device)
    if like is not None and like.size and like.dtype == dtype:
        return ops.xp.broadcast_to(like[(0,) * like.ndim], shape)
    return ops.xp.broadcast_to(ops.zeros((), dtype), shape)


def add_channel_bias(device, out, bias):
    """out (n, C, *spatial) + bias (C,) per channel, added in the compute dtype and rounded once (in place where
    that is out's dtype): the bias of a result whose kernels could not add it in their epilogue."""
    if bias is None:
        return out
    ops = arrays(device)
    total = out if compute_dtype(out.dtype) == out.dtype else ops.astype(out, compute_dtype(out.dtype))
    ops.add(total, bias.reshape(-1, *(1,) * (out.ndim - 2)))
    return ops.astype(total, out.dtype)


# ---------------------------------------------------------------------------------------------------------
# 1-D: a unit height


def unit_height(spec: ConvSpec) -> ConvSpec:
    """The 2-D spec of a 1-D one: height 1, kernel, stride and dilation 1 and no padding along it."""
    return dataclasses.replace(spec, in_size=(1, *spec.in_size), kernel_size=(1, *spec.kernel_size),
                               stride=(1, *spec.stride), dilation=(1, *spec.dilation),
                               padding=((0, 0), *spec.padding), out_size=(1, *spec.out_size))


def with_unit_height(a):
    """(..., L) as a view (..., 1, L)."""
    return a[..., None, :]


# ---------------------------------------------------------------------------------------------------------
# 3-D: depth windows


def depth_spec(spec: ConvSpec, images: int, depths: int | None = None) -> ConvSpec:
    """The 2-D spec of the depth-folded problem over `images` images of a 3-D spec, `depths` output depths of each
    (default all, oD): batch images * depths, C * kD input channels, the (H, W) window."""
    kd, depths = spec.kernel_size[0], spec.out_size[0] if depths is None else depths
    return ConvSpec(spec.op, (images * depths,), spec.in_channels * kd, spec.out_channels, spec.groups,
                    spec.in_size[1:], spec.kernel_size[1:], spec.stride[1:], spec.dilation[1:], spec.padding[1:],
                    spec.out_size[1:])


def depth_weight(weight, spec: ConvSpec):
    """weight (O, C / G, kD, kH, kW) as the depth-folded problem's (O, C / G * kD, kH, kW) (a view)."""
    return weight.reshape(spec.out_channels, spec.channels_per_group * spec.kernel_size[0], *spec.kernel_size[1:])


def depth_window_bytes(spec: ConvSpec, itemsize: int) -> int:
    """Bytes of one image's depth windows: the workspace unit of the 3-D ops."""
    return spec.out_size[0] * spec.in_channels * spec.kernel_size[0] * spec.in_size[1] * spec.in_size[2] * itemsize


def _tap_depths(spec: ConvSpec, tap: int, depths: range):
    """(first input depth, output depth range z0:z1 counted from depths.start) of depth tap `tap` over the output
    depths `depths`: depths.start + z for z0 <= z < z1 reads input depth first + (z - z0) * sd; the others read
    padding."""
    depth, sd, dd, od = spec.in_size[0], spec.stride[0], spec.dilation[0], len(depths)
    offset = tap * dd - spec.padding[0][0] + depths.start * sd   # input depth read by output depth depths.start
    z0 = min(od, ceil_div(max(-offset, 0), sd))
    z1 = max(z0, min(od, ceil_div(depth - offset, sd)))
    return offset + z0 * sd, z0, z1


def depth_windows(device, x, spec: ConvSpec, depths: range | None = None):
    """x (m, C, D, H, W) -> its depth windows of the output depths `depths` (default all), (m * len(depths), C * kD,
    H, W), a new array (zeros for padded depths): one depth_windows launch on the GPU path (planes of fewer than
    2^31 pixels), array copies tap by tap on the CPU path."""
    m, c, _, h, w = x.shape
    kd, sd = spec.kernel_size[0], spec.stride[0]
    depths = range(spec.out_size[0]) if depths is None else depths
    od, ops = len(depths), arrays(device)
    if device is not None and h * w <= INT32_MAX:
        v = ops.empty((m * od, c * kd, h, w), x.dtype)
        if v.size:
            grid, block = _plane_launch(m * od * c * kd, h * w)
            strides = element_strides(x)
            KERNELS.launch(device, "depth_windows", dtype=x.dtype, index=index_type(v.size, extent(x)), grid=grid,
                           block=block, x=x, windows=v, planes=m * od * c * kd, pixels=h * w, width=w,
                           width_magic=fast_divmod_magic(w), channels=c, channels_magic=fast_divmod_magic(c),
                           taps=kd, taps_magic=fast_divmod_magic(kd), out_depths=od,
                           out_depths_magic=fast_divmod_magic(od), depth=spec.in_size[0],
                           **_depth_steps(spec, depths),
                           x_stride_m=strides[0], x_stride_c=strides[1], x_stride_d=strides[2],
                           x_stride_h=strides[3], x_stride_w=strides[4],
                           flat_rows=h == 1 or strides[3] == w * strides[4])
        return v
    v = ops.empty((m, od, c, kd, h, w), x.dtype)
    for tap in range(kd):
        first, z0, z1 = _tap_depths(spec, tap, depths)
        ops.copyto(v[:, :z0, :, tap], 0)
        ops.copyto(v[:, z1:, :, tap], 0)
        if z1 > z0:
            ops.copyto(v[:, z0:z1, :, tap], x[:, :, first:first + (z1 - z0 - 1) * sd + 1:sd].transpose(0, 2, 1, 3, 4))
    return v.reshape(m * od, c * kd, h, w)


def _depth_steps(spec: ConvSpec, depths: range) -> dict:
    """lift.cu's depth arguments: window plane ((m, z), (c, a)) reads input depth z * depth_step + a * tap_depth +
    depth0."""
    return dict(depth_step=spec.stride[0], tap_depth=spec.dilation[0],
                depth0=depths.start * spec.stride[0] - spec.padding[0][0])


def depth_fold(device, g, spec: ConvSpec, dtype):
    """The gradient of the depth windows, g (m * oD, C * kD, H, W), summed back onto the input depths its planes
    were read from: (m, C, D, H, W) in `dtype`.  Sums in the compute dtype, taps in order."""
    m = g.shape[0] // spec.out_size[0]
    out = arrays(device).zeros((m, spec.in_channels, *spec.in_size), compute_dtype(dtype))
    depth_fold_into(device, out, g, spec, range(spec.out_size[0]))
    return arrays(device).astype(out, dtype)


def depth_fold_into(device, out, g, spec: ConvSpec, depths: range) -> None:
    """Add g (m * len(depths), C * kD, H, W), the gradient of the depth windows of the output depths `depths`, onto
    the input depths its planes were read from in out (m, C, D, H, W), contiguous, in the compute dtype, taps in
    order: one depth_fold launch on the GPU path (planes of fewer than 2^31 pixels), array adds tap by tap on the
    CPU path (the same sums in the same order: the same bits)."""
    c, kd, sd, od = spec.in_channels, spec.kernel_size[0], spec.stride[0], len(depths)
    ops = arrays(device)
    pixels = math.prod(spec.in_size[1:])
    if device is not None and pixels <= INT32_MAX:
        if out.size:
            g = ops.ascontiguous(g)
            planes = out.shape[0] * c * spec.in_size[0]
            grid, block = _plane_launch(planes, pixels)
            KERNELS.launch(device, "depth_fold", dtype=g.dtype, index=index_type(g.size, out.size), grid=grid,
                           block=block, g=g, out=out, planes=planes, pixels=pixels, channels=c,
                           channels_magic=fast_divmod_magic(c), taps=kd, out_depths=od, depth=spec.in_size[0],
                           depth_magic=fast_divmod_magic(spec.in_size[0]),
                           depth_step_magic=fast_divmod_magic(spec.stride[0]), **_depth_steps(spec, depths))
        return
    g = ops.reshape(g, (out.shape[0], od, c, kd, *spec.in_size[1:]))
    for tap in range(kd):
        first, z0, z1 = _tap_depths(spec, tap, depths)
        if z1 > z0:
            ops.add(out[:, :, first:first + (z1 - z0 - 1) * sd + 1:sd], g[:, z0:z1, :, tap].transpose(0, 2, 1, 3, 4))


def _depth_first(device, y):
    """(images, O, depth, ...) -> (images * depth, O, ...) (a copy)."""
    y = arrays(device).ascontiguous(y.swapaxes(1, 2))
    return y.reshape(y.shape[0] * y.shape[1], *y.shape[2:])


# ---------------------------------------------------------------------------------------------------------
# Drivers: an op's 2-D runner over a spec of 1, 2 or 3 spatial dims
#   forward(device, x, weight, bias, spec2, algorithm) -> y
#   backward(device, grad_output, x, weight, spec2, needs, algorithm) -> (grad_x, grad_weight, grad_bias)
# device None is the CPU path.  Leading dims of x are one flat batch; the result has the spec's shapes.
# Before anything is allocated the drivers check that the results fit (`prepare`, `check_memory`).  An empty problem
# (`ConvSpec.empty`) gets its result here, the same on every path, without running one: no kernel runs for it, so
# no algorithm's restrictions apply either.


def prepare(device, spec: ConvSpec, dtype, results) -> ConvSpec:
    """The spec a driver runs, checked before anything is allocated: `ConvSpec.clamped` (a huge but valid stride,
    dilation or high padding becomes the small one that reads the same positions), `check_memory` for the results
    of shapes `results`, and on the GPU path a ValueError when the window still passes the kernels' 32-bit
    parameters: a padded plane of 2^31 positions or more along a dim the kernels see (3-D depth is folded in
    Python)."""
    spec = spec.clamped()
    check_memory(device, spec, dtype, results)
    if device is None or spec.empty:
        return spec
    for dim in range(1, 3) if spec.nd == 3 else range(spec.nd):
        if spec.padded_size[dim] > INT32_MAX:
            raise ValueError(f"{spec.op}: the padded input spans {spec.padded_size[dim]} positions along spatial dim "
                             f"{dim} (size {spec.in_size[dim]}, padding {spec.padding[dim]}, kernel "
                             f"{spec.kernel_size[dim]}, dilation {spec.dilation[dim]}); the GPU kernels index a "
                             f"dim with 32-bit ints, at most {INT32_MAX} positions")
    return spec


def check_memory(device, spec: ConvSpec, dtype, results) -> None:
    """Raise MemoryError when the arrays of shapes `results` (in dtype) and the least workspace of the path take
    more than the memory its arrays live in (`_device.total_memory`); the unfold/fold runs call it too.

    The workspace counted is what no path can chunk: one image's depth windows in 3-D, else on the CPU path one
    image's padded copy (every CPU op pads; the kernels read x in place) and one output row's columns (the least
    piece of conv's columns).  So the check never refuses
    a call that fits, and an impossible size (a 2^48-element output; on the CPU path a padding of 2^40) is a
    clear error before the first copy is made, instead of NumPy's or CuPy's MemoryError after it.  MemoryError rather than
    ValueError: the arguments are valid, the machine is too small, and `except MemoryError` keeps working."""
    itemsize, spec = numpy.dtype(dtype).itemsize, spec.clamped()
    arrays = [f"a result {tuple(shape)}" for shape in results]
    nbytes = [math.prod(shape) * itemsize for shape in results]
    if not spec.empty:
        if spec.nd == 3:
            arrays.append("one image's depth windows")
            nbytes.append(depth_window_bytes(spec, itemsize))
        elif device is None:
            arrays.append(f"one image's padded copy {(spec.in_channels, *spec.padded_size)}")
            nbytes.append(spec.in_channels * math.prod(spec.padded_size) * itemsize)
            # The CPU path chunks columns down to one output row's (conv.py `_pieces`), never below.
            row = (spec.in_channels * spec.taps, spec.out_size[-1])
            arrays.append(f"one output row's columns {row}")
            nbytes.append(math.prod(row) * itemsize)
    memory = _device.total_memory(device)
    if memory is not None and sum(nbytes) > memory:
        where = "this machine (the CPU path)" if device is None else f"the {device.name} device"
        parts = " and ".join(f"{a} of {b} bytes" for a, b in zip(arrays, nbytes))
        raise MemoryError(f"{spec.op}: {numpy.dtype(dtype).name} arrays need {sum(nbytes)} bytes: {parts}; more "
                          f"than the {memory} bytes of memory of {where}")


def _empty_forward(device, bias, spec: ConvSpec, dtype):
    ops = arrays(device)
    out = ops.zeros(spec.output_shape, dtype)
    if bias is not None:
        ops.copyto(out, bias.reshape(-1, *(1,) * spec.nd))
    return out


def _empty_backward(device, grad_output, spec: ConvSpec, needs: frozenset, dtype):
    ops = arrays(device)
    grad_x = ops.zeros(spec.input_shape, dtype) if "input" in needs else None
    grad_w = ops.zeros(spec.weight_shape, dtype) if "weight" in needs else None
    grad_b = None
    if "bias" in needs:
        channel_axis = grad_output.ndim - spec.nd - 1
        axes = tuple(a for a in range(grad_output.ndim) if a != channel_axis)
        grad_b = ops.astype(ops.sum(grad_output, axes, compute_dtype(dtype)), dtype)
    return grad_x, grad_w, grad_b


def one_program(device, what: tuple, arrays: tuple, compute):
    """compute(device): an op's whole GPU work on `arrays` (its public call's array arguments, None for an absent
    one), drivers' calls included, replayed as ONE program for the signature `what` (the op, its spec, ...) and
    its arrays (`_replay.replayed`; the drivers inside become part of it).  For an op with work around the drivers
    (conv_transpose: x's zero extension, the bias, the crop of its input gradient): a repeated call is then one
    replay, which `_fastpath` remembers.  compute must read everything through the device it is given."""
    return _replay.replayed(device, what, arrays, compute)


def forward(run, device, x, weight, bias, spec: ConvSpec, algorithm: str = "auto", native=None):
    """run's forward of spec on any rank; on the GPU path replayed for a signature seen before (`_replay`).
    native: None, or native(pass_, device, spec, dtype, algorithm), the op's runner of a 3-D pass that takes the
    3-D spec as is (conv's conv_fwd_igemm_3d), or None where the lift must run it."""
    return _replay.replayed(device, ("forward", run, spec, algorithm, native), (x, weight, bias),
                            lambda device: _forward(run, device, x, weight, bias, spec, algorithm, native))


def _forward(run, device, x, weight, bias, spec: ConvSpec, algorithm: str, native=None):
    spec = prepare(device, spec, x.dtype, [spec.output_shape])
    if spec.empty:
        return _empty_forward(device, bias, spec, x.dtype)
    if spec.nd == 2:
        return run(device, x, weight, bias, spec, algorithm)
    if spec.nd == 1:
        y = run(device, with_unit_height(x), with_unit_height(weight), bias, unit_height(spec), algorithm)
        return y.reshape(spec.output_shape)
    n, od = spec.n, spec.out_size[0]
    x = arrays(device).reshape(x, (n, *spec.input_shape[-4:]))
    runner = None if native is None else native("forward", device, spec, x.dtype, algorithm)
    if runner is not None:   # 3-D natively: no depth windows
        return runner(device, x, weight, bias, spec).reshape(spec.output_shape)
    weight = depth_weight(weight, spec)
    out = empty(device, (n, spec.out_channels, *spec.out_size), x.dtype)
    isz = x.dtype.itemsize
    per_depth = (depth_window_bytes(spec, isz) + math.prod(spec.output_shape[-4:]) * isz) // od   # windows, result
    for images, depths, inner in _depth_chunks(n, od, per_depth):
        m, d = images.stop - images.start, len(depths)
        with settings.workspace_limit(inner):
            y = run(device, depth_windows(device, x[images], spec, depths), weight, bias, depth_spec(spec, m, d),
                    algorithm)
        # (m, O, d, ...) from a view of y (m * d, O, ...): one copy, into the output
        arrays(device).copyto(out[images, :, depths.start:depths.stop],
                              y.reshape(m, d, *y.shape[1:]).swapaxes(1, 2))
        del y
    return out.reshape(spec.output_shape)


def _depth_chunks(n: int, od: int, per_depth: int, per_image: int = 0):
    """The chunks of a 3-D batch of n images of od output depths, (images, output depths, the workspace limit of
    their 2-D run in bytes), whose workspace -- `per_depth` bytes for each output depth of an image (its depth
    windows, grad_output copy, ...) and `per_image` more for each image -- takes at most half the workspace limit;
    the 2-D run gets the rest, so that the two together stay within the limit.  Whole images while two fit the
    limit; else one image at a time in even slabs of output depths, so that the 2-D run keeps half the limit or
    more: a whole image would leave it less, 1 byte once the image passes the limit, and nothing inside could split
    (c3d-mri in fp32: its FMA weight gradient unsplit on 14 blocks).  Only a single output depth that passes half
    the limit still leaves the run less than half (at least 1 byte: its least pieces)."""
    limit = settings.get_workspace_limit()
    if 2 * (od * per_depth + per_image) <= limit:
        pieces = [(images, range(od)) for images in batch_chunks(n, 2 * (od * per_depth + per_image), limit)]
    else:
        slabs = ceil_div(od, max(1, (limit // 2 - per_image) // max(per_depth, 1)))
        bounds = [k * od // slabs for k in range(slabs + 1)]   # even slabs: their sizes differ by one at most
        pieces = [(slice(i, i + 1), range(z0, z1)) for i in range(n) for z0, z1 in zip(bounds, bounds[1:])]
    for images, depths in pieces:
        used = (images.stop - images.start) * (len(depths) * per_depth + per_image)
        yield images, depths, max(1, limit - used)


def _depth_chunk_backward(run, device, gy, x, weight2, spec: ConvSpec, depths: range, needs: frozenset,
                          algorithm: str, grad_x, inner):
    """The 2-D backward (run within the workspace limit `inner`) of the depth windows of output depths `depths` of a
    chunk x (m, C, D, H, W) of a 3-D problem, gy (m, O, len(depths), oH, oW) their grad_output: their input gradient
    is added into grad_x (the chunk's input gradient in the compute dtype, or None); returns the chunk's
    (grad_weight, grad_bias).  The windows and their gradient are freed on return, before the next chunk's are
    built."""
    spec2 = depth_spec(spec, x.shape[0], len(depths))
    v = (depth_windows(device, x, spec, depths) if "weight" in needs
         else placeholder(device, spec2.input_shape, x.dtype))
    with settings.workspace_limit(inner):
        gv, grad_w, grad_b = run(device, _depth_first(device, gy), v, weight2, spec2, needs, algorithm)
    del v
    if grad_x is not None:
        depth_fold_into(device, grad_x, gv, spec, depths)
    return grad_w, grad_b


def backward(run, device, grad_output, x, weight, spec: ConvSpec, needs: frozenset, algorithm: str = "auto",
             native=None, input_bias=None):
    """run's gradients `needs` of spec on any rank; on the GPU path replayed for a signature seen before.
    native: as `forward`'s; its 'input' runner, native(...)(device, grad_output, weight, spec, bias), gives a 3-D
    input gradient without the depth windows, the other gradients still lifted.
    input_bias: None, or (C,) added per channel to the input gradient (conv_transpose's forward: its bias), by the
    kernels' epilogue where run takes it (`run(..., input_bias=)`: conv2d_backward_run), else after them
    (`add_channel_bias`); either way in the compute dtype, rounded once."""
    if input_bias is None:
        return _replay.replayed(device, ("backward", run, spec, needs, algorithm, native), (grad_output, x, weight),
                                lambda device: _backward(run, device, grad_output, x, weight, spec, needs, algorithm,
                                                         native))
    return _replay.replayed(device, ("backward", run, spec, needs, algorithm, native, "input_bias"),
                            (grad_output, x, weight, input_bias),
                            lambda device: _backward(run, device, grad_output, x, weight, spec, needs, algorithm,
                                                     native, input_bias))


def _backward(run, device, grad_output, x, weight, spec: ConvSpec, needs: frozenset, algorithm: str, native=None,
              input_bias=None):
    shapes = (spec.input_shape, spec.weight_shape, (spec.out_channels,))   # of the gradients, in NEEDS order
    spec = prepare(device, spec, x.dtype, [s for name, s in zip(NEEDS, shapes) if name in needs])
    biased = {} if input_bias is None else {"input_bias": input_bias}
    if spec.empty:
        grad_x, grad_w, grad_b = _empty_backward(device, grad_output, spec, needs, x.dtype)
        if grad_x is not None:
            grad_x = add_channel_bias(device, grad_x, input_bias)
        return grad_x, grad_w, grad_b
    if spec.nd == 2:
        return run(device, grad_output, x, weight, spec, needs, algorithm, **biased)
    if spec.nd == 1:
        grads = run(device, with_unit_height(grad_output), with_unit_height(x), with_unit_height(weight),
                    unit_height(spec), needs, algorithm, **biased)
        return tuple(None if g is None else g.reshape(s) for g, s in zip(grads, shapes))
    runner = None if native is None or "input" not in needs else native("input", device, spec, x.dtype, algorithm)
    if runner is None:
        grad_x, grad_w, grad_b = _lifted_backward(run, device, grad_output, x, weight, spec, needs, algorithm)
        if grad_x is not None:
            grad_x = add_channel_bias(device, grad_x, input_bias)
        return grad_x, grad_w, grad_b
    grad_x = runner(device, grad_output, weight, spec, input_bias).reshape(spec.input_shape)   # 3-D natively
    rest = needs - {"input"}
    _, grad_w, grad_b = (_lifted_backward(run, device, grad_output, x, weight, spec, rest, algorithm) if rest
                         else (None, None, None))
    return grad_x, grad_w, grad_b


def _lifted_backward(run, device, grad_output, x, weight, spec: ConvSpec, needs: frozenset, algorithm: str):
    """The 3-D gradients `needs` by the depth windows: the 2-D backward of each chunk's."""
    n, od, ops = spec.n, spec.out_size[0], arrays(device)
    x = ops.reshape(x, (n, *spec.input_shape[-4:]))
    gy = ops.reshape(grad_output, (n, *spec.output_shape[-4:]))
    weight2 = depth_weight(weight, spec)
    grad_x = empty(device, x.shape, x.dtype) if "input" in needs else None
    # Per output depth: its windows (if the weight gradient is asked for), its grad_output copy, and for the input
    # gradient the windows' gradient.  Per image: the input gradient's sum in the compute dtype, unless that is the
    # dtype (then the sums are made in grad_x itself).
    isz, compute = x.dtype.itemsize, compute_dtype(x.dtype)
    windows = depth_window_bytes(spec, isz) // od
    per_depth = ((windows if "weight" in needs else 0) + math.prod(spec.output_shape[-4:]) * isz // od
                 + (windows if "input" in needs else 0))
    separate_sum = "input" in needs and compute != x.dtype
    per_image = math.prod(spec.input_shape[-4:]) * compute.itemsize if separate_sum else 0
    chunks = list(_depth_chunks(n, od, per_depth, per_image))
    sums = [None, None]   # weight and bias gradients, summed over chunks (in the compute dtype if several)
    input_sum = None      # the input gradient of the chunk's images, summed over their slabs of output depths
    for images, depths, inner in chunks:
        if grad_x is not None and depths.start == 0:
            input_sum = (ops.empty((images.stop - images.start, *x.shape[1:]), compute) if separate_sum
                         else grad_x[images])
            ops.copyto(input_sum, 0)
        params = _depth_chunk_backward(run, device, gy[images, :, depths.start:depths.stop], x[images], weight2, spec,
                                       depths, needs, algorithm, input_sum, inner)
        if separate_sum and depths.stop == od:
            ops.copyto(grad_x[images], input_sum)
            input_sum = None
        for i, p in enumerate(params):
            if p is None:
                continue
            if sums[i] is None:   # the first chunk's, in the compute dtype when the others are added to it
                sums[i] = ops.astype(p, compute_dtype(x.dtype)) if len(chunks) > 1 else p
            else:
                ops.add(sums[i], p)
    grad_w, grad_b = (None if s is None else ops.astype(s, x.dtype) for s in sums)
    if grad_x is not None:
        grad_x = grad_x.reshape(spec.input_shape)
    if grad_w is not None:
        grad_w = grad_w.reshape(spec.weight_shape)
    return grad_x, grad_w, grad_b
