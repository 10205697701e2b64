"""What the kernel test files share to cover the bug classes of issue 12 on purpose, for every kernel:

- `per_side_paddings`: padding that differs on one side only, once per side (a kernel that takes the padding of
  one side from another passes wherever the sides are equal);
- `touching_size`: an input size whose last window ends on the last padded row (or column), so that windows
  read the last input row and, with padding there, the row past it (bounds off by one);
- `exact_terms`, `sum_terms`, `strided_sum_terms`, `assert_rounded_once`: 16-bit data whose sums float32 holds
  exactly while a 16-bit accumulator loses low bits, and the check that every result was rounded once;
- `GridLoops`: a few blocks, fewer than the units of work, so that a grid-stride or unit loop that starts at
  threadIdx.x instead of the global index, or does not stride, leaves outputs unwritten;
- `SparseDevice`, `sparse_zeros`: the `long long` instantiations on extents past 2^31 that touch little memory,
  so that an `int` product in their index arithmetic overflows and the emulator's UBSan check fails the launch.

The table of which test covers which class for which kernel is in tests/emulator/README.md.
"""
from __future__ import annotations

import math
import mmap

import numpy

from cupyconv import _kernels
from cupyconv._spec import ceil_div
from emulator import EmulatedDevice, last_block

# ---------------------------------------------------------------------------------------------------------
# Asymmetric padding and windows on the last row and column


SIDE_NAMES = ("top", "bottom", "left", "right")


def per_side_paddings(base: int, changes=None):
    """[(side name, ((top, bottom), (left, right)))] four times: every side `base` but one, which differs.
    changes: the value each side takes when it is the one that differs (default: top and right base + 1, bottom
    and left base - 1, or base + 1 where base is 0), so that both a larger and a smaller side are tried."""
    if changes is None:
        less = base - 1 if base > 0 else base + 1
        changes = (base + 1, less, less, base + 1)
    cases = []
    for k, (name, value) in enumerate(zip(SIDE_NAMES, changes)):
        pad = [base] * 4
        pad[k] = value
        cases.append((name, ((pad[0], pad[1]), (pad[2], pad[3]))))
    return cases


def touching_size(low: int, kernel: int, stride: int = 1, dilation: int = 1, pad=(0, 0)) -> int:
    """The smallest input size >= low whose last window ends exactly on the last padded row: (size + top +
    bottom - extent) divisible by the stride.  With bottom < extent that window reads the last input row, and
    with bottom > 0 the padding row past it too."""
    extent = dilation * (kernel - 1) + 1
    size = max(low, extent - sum(pad))
    while (size + sum(pad) - extent) % stride:
        size += 1
    return size


# ---------------------------------------------------------------------------------------------------------
# Accumulation precision

#: Per 16-bit dtype, the resolution 2^-q of `exact_terms`: float16 values k / 64 and bfloat16 values k / 16 with
#: |k| <= 2^(q + 1) fit the type; their products are multiples of 2^-2q, so float32 holds every sum of a few
#: thousand of them exactly (partial sums below 2^(24 - 2q)), while a 16-bit running sum keeps 11 (8)
#: significant bits and drops the low ones once it passes 2 (float16) or 4 (bfloat16).
EXACT_BITS = {"float16": 6, "bfloat16": 4}


def exact_terms(rng, shape, dtype):
    """Random values in [-2, 2] on the grid of EXACT_BITS[dtype], as dtype.  A kernel that accumulates in float32
    returns exactly the float64 result rounded once to dtype; one that accumulates in dtype misses it, in any
    summation order, on about half the outputs of 9 terms and a quarter of those of 4."""
    dt = numpy_dtype(dtype)
    q = EXACT_BITS[dt.name]
    return (rng.integers(-2 ** (q + 1), 2 ** (q + 1) + 1, shape) / 2.0 ** q).astype(dt)


#: Mantissa bits of the 16-bit types (after the leading 1).
MANTISSA_BITS = {"float16": 10, "bfloat16": 7}


def sum_terms(rng, shape, dtype):
    """Random values +-[1, 2) with every mantissa bit of dtype in use, for short sums of the values themselves
    (fold's overlaps): float32 adds them exactly, while a 16-bit running sum drops low bits as soon as it passes
    2 (where dtype's spacing is twice theirs)."""
    dt = numpy_dtype(dtype)
    bits = MANTISSA_BITS[dt.name]
    values = 1 + rng.integers(0, 2 ** bits, shape) / 2.0 ** bits
    return (values * rng.choice([-1.0, 1.0], shape)).astype(dt)


def strided_sum_terms(count: int, threads: int, dtype):
    """`count` values that threads of a loop `for (e = threadIdx.x; e < count; e += threads)` add up, each in
    its own register, before the block combines them (a bias gradient): 1024 as each thread's first term,
    -1024 as its last one when it has several, 0.25 (half the spacing of float16 at 1024; bfloat16's is 8)
    between.  Float32 keeps every 0.25; a 16-bit register drops them all, and the +-1024 cancel, so the
    lost terms are the whole result."""
    values = numpy.full(count, 0.25)
    first = numpy.arange(min(threads, count))
    last = first + (count - 1 - first) // threads * threads
    values[first], values[last[last != first]] = 1024.0, -1024.0
    return values.astype(numpy_dtype(dtype))


def assert_rounded_once(got, want64, dtype, what=""):
    """got (dtype) is exactly want64 (float64, from the same inputs) rounded to dtype, everywhere."""
    dt = numpy_dtype(dtype)
    expected = numpy.asarray(want64, numpy.float64).astype(dt)
    got = numpy.asarray(got)
    assert got.dtype == dt and got.shape == expected.shape, what
    wrong = got.astype(numpy.float64) != expected.astype(numpy.float64)
    assert not wrong.any(), (f"{what}: {int(wrong.sum())} of {wrong.size} results are not the float32 sum rounded "
                             f"once to {dt.name} (first at {numpy.argwhere(wrong)[0].tolist()}: "
                             f"{got[wrong][0]} != {expected[wrong][0]})")


def numpy_dtype(dtype):
    """A NumPy dtype from a dtype, a type or a name, "bfloat16" (ml_dtypes) included."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        import ml_dtypes
        return numpy.dtype(ml_dtypes.bfloat16)
    return numpy.dtype(dtype)


# ---------------------------------------------------------------------------------------------------------
# Grid-stride and unit loops


class Recorder(EmulatedDevice):
    """An EmulatedDevice that lists the name expressions it launches (`count` of one kernel's launches)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.launches = []

    def launch(self, source, name, *args, **kwargs):
        self.launches.append(name)
        super().launch(source, name, *args, **kwargs)

    def count(self, kernel):
        return sum(name.startswith(kernel + "<") for name in self.launches)

    def copies(self):
        """The channels-last copy launches, by kernel: ["channels_last_copy" (one copy) or "channels_last_copies"
        (two or three), ...]."""
        return [name.split("<")[0] for name in self.launches if name.startswith("channels_last_cop")]


class GridLoops:
    """Launch every capped grid with at most `cap` blocks and every elementwise kernel with blocks of `block`
    threads, and note for each launch the units its grid was capped from.

        loops = GridLoops(monkeypatch, cap=3)
        with _device.use_device(loops.device(EmulatedDevice("reverse"))): ...
        assert loops.looped() >= {"unfold_im2col", ...}

    `looped()` names the kernels launched at least once with more than one block but fewer than their units,
    i.e. whose loops had to take several turns for the grid to cover the work; `capped()` those launched on a
    capped grid at all.
    """

    def __init__(self, monkeypatch, cap: int = 3, block: int = 32):
        from cupyconv.ops import conv, depthwise, patch, unfold
        self.cap, self.block, self.pending, self.launches = cap, block, None, []
        monkeypatch.setattr(_kernels, "GRID_CAP", cap)

        def capped(units):
            self.pending = units
            return max(1, min(units, cap))

        def elementwise(total, block=None):
            return (capped(ceil_div(total, self.block)),), (self.block,)

        for module in (_kernels, conv, depthwise):
            monkeypatch.setattr(module, "capped_grid", capped)
        for module in (conv, depthwise, patch, unfold):
            monkeypatch.setattr(module, "elementwise_launch", elementwise)

    def device(self, inner):
        """`inner` (an EmulatedDevice or a wrapper of one) with its launches noted."""
        loops = self
        launch = inner.launch

        def noting(source, name, grid, block, args, shared_mem=0):
            units, loops.pending = loops.pending, None
            blocks = math.prod(grid) if isinstance(grid, (tuple, list)) else grid
            loops.launches.append((name.split("<")[0], blocks, units))
            launch(source, name, grid, block, args, shared_mem)

        inner.launch = noting
        return inner

    def looped(self) -> set[str]:
        return {name for name, blocks, units in self.launches if units is not None and 1 < blocks < units}

    def capped(self) -> set[str]:
        """The kernels launched on capped grids (those that loop over their units)."""
        return {name for name, _, units in self.launches if units is not None}


# ---------------------------------------------------------------------------------------------------------
# 64-bit index instantiations on extents past 2^31

#: Flag of a mapping whose pages need no swap reservation (Linux), so a mapping larger than memory is accepted.
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)


def sparse_zeros(shape, dtype):
    """A zero array of any size that costs only what is written to it: a private anonymous mapping without swap
    reservation, whose unwritten pages all read the kernel's one zero page.  A 2^31-element input with a few
    rows of data in it, or an output of which one block writes a tile, takes megabytes."""
    dt = numpy_dtype(dtype)
    count = math.prod(shape)
    try:
        buffer = mmap.mmap(-1, max(1, count * dt.itemsize), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
    except OSError as exc:
        raise OSError(f"sparse_zeros{tuple(shape)}: cannot map {count * dt.itemsize / 2**30:.1f} GiB of address "
                      f"space ({exc}); the 64-bit cases need vm.overcommit_memory 0 or 1 and no `ulimit -v`") from exc
    return numpy.frombuffer(buffer, dt, count=count).reshape(shape)


def lift_grid_cap(monkeypatch):
    """Grids as large as CUDA allows, so that the last block of a looping kernel owns its last unit only."""
    from cupyconv.ops import depthwise, unfold
    monkeypatch.setattr(_kernels, "GRID_CAP", _kernels.MAX_GRID[0])
    monkeypatch.setattr(depthwise, "FORWARD_BLOCKS", _kernels.MAX_GRID[0])
    monkeypatch.setattr(unfold, "UNFOLD_BLOCKS", _kernels.MAX_GRID[0])


def splits_of(grid, partial) -> int:
    """How many blocks count in at each arrival slot of a launch (common.cuh's last_arrival): implicit_gemm.cu's
    weight gradients split K over gridDim.z; depthwise.cu's weight gradients write `rows` partial rows a channel
    (their partial buffer's first dimension: the argument two before `arrivals`, after `out`)."""
    return grid[2] if len(grid) == 3 else (partial.shape[0] if partial.ndim == 2 else 1)


class SparseDevice(EmulatedDevice):
    """The GPU path on problems past 2^31 elements, in moments and megabytes: only the last block of every
    launch runs (the one with the highest indices, with lift_grid_cap), and outputs of more than SMALL elements
    are `sparse_zeros` whose last `tail` elements are poisoned (0xFF: NaN), so that what that block writes
    there shows.  `launches`: the name expressions launched."""

    SMALL = 1 << 22

    def __init__(self, order: str = "forward", tail: int = 1024, **options):
        super().__init__(order, blocks=last_block, **options)
        self.tail, self.launches = tail, []

    def empty(self, shape, dtype):
        if math.prod(shape) <= self.SMALL:
            return super().empty(shape, dtype)
        out = sparse_zeros(shape, dtype)
        out.reshape(-1)[-self.tail:].view(numpy.uint8)[...] = 0xFF
        return out

    def arrival_counters(self, size):
        self.arrivals = numpy.zeros(size, numpy.int32)
        return self.arrivals

    def launch(self, source, name, grid, block, args, shared_mem=0):
        self.launches.append(name)
        for i, a in enumerate(args):   # the blocks before the last have all arrived: each count stands at its
            if a is getattr(self, "arrivals", None):   # splits less one, so the last split finishes
                a[...] = splits_of(grid, args[i - 2]) - 1
        super().launch(source, name, grid, block, args, shared_mem)

    def total_memory(self):
        return None   # no limit for the drivers' size check: its arrays cost what is written, not their size


def assert_tail_written(out, expected, dtype, least: int, what=""):
    """The last len(expected) elements of out (flat) that were written (not NaN) match expected (float64, to the
    dtype's rounding); the very last one and at least `least` of them were written.  expected covers at most
    the device's poisoned tail (elsewhere unwritten elements read 0, not NaN)."""
    got = numpy.asarray(out).reshape(-1)[-expected.size:].astype(numpy.float64)
    expected = numpy.asarray(expected, numpy.float64).reshape(-1)
    written = ~numpy.isnan(got)
    assert written[-1] and written.sum() >= least, f"{what}: {int(written.sum())} of the last {got.size} written"
    tolerance = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-5, "float64": 1e-12}[numpy_dtype(dtype).name]
    scale = max(1.0, float(numpy.abs(expected).max()))
    error = float(numpy.abs(got[written] - expected[written]).max())
    assert error <= tolerance * scale, f"{what}: max error {error} (scale {scale})"
