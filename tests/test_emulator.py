"""Self-tests of the CPU kernel emulator (tests/emulator): it must run correct kernels exactly and catch the bugs
GPU kernels have, on kernels written for the purpose (tests/emulator/selftest_kernels/selftest.cu)."""
from __future__ import annotations

import re

import numpy
import pytest

from emulator import (SELFTEST_KERNEL_DIR, EmulatedDevice, EmulatorError, KernelArgumentError, KernelFailure,
                      LaunchConfigError, assert_clean_under_asan, run_under_asan, sanitizer_report)
from emulator._asan import libasan_path

SOURCE = "selftest.cu"
KERNELS = ["record_indices", "take_ticket", "block_sum<float>", "block_sum<double>", "block_sum_missing_loop_sync",
           "rotate_missing_sync", "reverse_dynamic", "read_unwritten_dynamic", "barrier_in_branch",
           "barrier_per_branch", "exit_before_barrier", "shuffle_against_barrier", "warp_ops", "scalars",
           "scale_half", "convert_16bit", "atomics", "write_past_end", "static_shared_past_end",
           "dynamic_shared_past_end", "big_static_shared", "copy_strided", "int_index_overflow",
           "local_array_past_end", "mma_16816<__half>", "mma_16816<__nv_bfloat16>", "mma_1688_tf32",
           "mma_divergent", "vector_copy<float2>", "vector_copy<float4>", "vector_copy<int4>", "vector_copy<uint2>",
           "half_pair_shared", "vector_dynamic_shared", "bounded", "shared_in_helpers", "too_much_shared_in_helpers",
           "last_block_sum<0>", "last_block_sum<1>", "last_block_sum<2>"]
INSTANTIATIONS = [(SOURCE, k) for k in KERNELS]
ORDERS = ("forward", "reverse")


def device(order="forward", **kw) -> EmulatedDevice:
    return EmulatedDevice(order, kernel_dir=SELFTEST_KERNEL_DIR, instantiations=INSTANTIATIONS, **kw)


def launch(order, name, grid, block, args, shared_mem=0):
    device(order).launch(SOURCE, name, grid, block, args, shared_mem)


# ---------------------------------------------------------------------------------------------------------
# Correct kernels run exactly


def test_builtin_variables_on_3d_grids_and_blocks():
    grid, block = (2, 3, 2), (4, 2, 3)
    threads, blocks = 4 * 2 * 3, 2 * 3 * 2
    out = device().empty((blocks, threads, 10), numpy.uint32)
    launch("forward", "record_indices", grid, block, [out])
    for b in range(blocks):
        bx, by, bz = b % 2, b // 2 % 3, b // 6
        for t in range(threads):
            tx, ty, tz = t % 4, t // 4 % 2, t // 8
            assert list(out[b, t, :8]) == [tx, ty, tz, bx, by, bz, 40203, 20302]


@pytest.mark.parametrize("order", ORDERS)
def test_only_the_chosen_blocks_run_in_the_whole_grid(order):
    """blocks=: those blocks run, in their order (reversed in reverse order), with the grid's own gridDim; the
    others leave the output untouched; a block outside the grid is refused; the next launch runs every block."""
    grid, block = (2, 3, 2), (4, 2, 1)
    chosen = [(1, 2, 1), (0, 0, 0), (1, 0, 1)]
    out = device().empty((12, 8, 10), numpy.uint32)
    sampled = device(order, blocks=lambda g: chosen if g == grid else pytest.fail(f"grid {g}"))
    sampled.launch(SOURCE, "record_indices", grid, block, [out])
    ran = [b for b in range(12) if (out[b, :, 6] != 0xFFFFFFFF).all()]
    assert ran == sorted(x + 2 * (y + 3 * z) for x, y, z in chosen)
    assert (out[[b for b in range(12) if b not in ran]] == 0xFFFFFFFF).all()
    for x, y, z in chosen:
        assert list(out[x + 2 * (y + 3 * z), 5, :8]) == [1, 1, 0, x, y, z, 40201, 20302]  # thread 5: (1, 1, 0)
    counter, tickets = numpy.zeros(1, numpy.int32), device().empty(12, numpy.int32)
    device(order, blocks=lambda g: [(2, 0, 0), (0, 0, 0)]).launch(SOURCE, "take_ticket", 3, 4, [counter, tickets])
    if order == "forward":  # block 2 first, then block 0; threads in order
        expected = [4, 5, 6, 7, -1, -1, -1, -1, 0, 1, 2, 3]
    else:                   # the list backwards: block 0 first; threads in reverse
        expected = [3, 2, 1, 0, -1, -1, -1, -1, 7, 6, 5, 4]
    assert tickets.tolist() == expected
    with pytest.raises(LaunchConfigError, match=r"block \(3, 0, 0\) is outside the grid \(3, 1, 1\)"):
        device(order, blocks=lambda g: [(3, 0, 0)]).launch(SOURCE, "take_ticket", 3, 4, [counter, tickets])
    out2 = device().empty((12, 8, 10), numpy.uint32)
    launch(order, "record_indices", grid, block, [out2])
    assert (out2[:, :, 6] == 40201).all()


@pytest.mark.parametrize("order", ORDERS)
def test_order_of_threads_and_blocks(order):
    counter, tickets = numpy.zeros(1, numpy.int32), device().empty(12, numpy.int32)
    launch(order, "take_ticket", 3, 4, [counter, tickets])
    expected = numpy.arange(12) if order == "forward" else numpy.arange(12)[::-1]
    numpy.testing.assert_array_equal(tickets, expected)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_shared_memory_reduction(order, dtype):
    x = numpy.random.default_rng(1).integers(-1000, 1000, 3 * 128).astype(dtype)
    out = device().empty(3, dtype)
    launch(order, f"block_sum<{'float' if dtype == numpy.float32 else 'double'}>", 3, 128, [x, out])
    numpy.testing.assert_array_equal(out, x.reshape(3, 128).sum(axis=1))


@pytest.mark.parametrize("order", ORDERS)
def test_warp_shuffles_and_votes(order):
    values = numpy.random.default_rng(2).integers(0, 200, 96).astype(numpy.int32)
    out = device().empty((96, 6), numpy.int32)
    launch(order, "warp_ops", 2, 48, [values, out])  # warps of 32 and 16 threads (blocks of 48)
    lanes = numpy.arange(96) % 48 % 32
    for warp in (range(0, 32), range(32, 48), range(48, 80), range(80, 96)):
        w = numpy.array(warp)
        v = values[w]
        # shfl_down sum: lane 0 holds the warp's sum (lanes past the warp's end read poison otherwise)
        if len(w) == 32:
            assert out[w[0], 0] == v.sum()
            numpy.testing.assert_array_equal(out[w, 1], v.sum())
            numpy.testing.assert_array_equal(out[w, 2], v[3])
        ballot = sum(1 << int(lane) for lane, x in zip(lanes[w], v) if x & 1)
        numpy.testing.assert_array_equal(out[w, 3].view(numpy.uint32), ballot)
        numpy.testing.assert_array_equal(out[w, 4], int((v > 100).any()) * 10 + 1)
        numpy.testing.assert_array_equal(out[w, 5], numpy.concatenate([v[:1], v[:-1]]))


def test_dynamic_shared_memory():
    x = numpy.arange(3 * 64, dtype=numpy.float32)
    out = device().empty(3 * 64, numpy.float32)
    launch("forward", "reverse_dynamic", 3, 64, [x, out], shared_mem=64 * 4)
    numpy.testing.assert_array_equal(out, x.reshape(3, 64)[:, ::-1].reshape(-1))


def test_unwritten_shared_memory_is_poisoned():
    out = device().empty(32, numpy.float32)
    out[:] = 0
    launch("forward", "read_unwritten_dynamic", 1, 32, [out], shared_mem=32 * 4)
    assert numpy.isnan(out).all()


def test_scalars_arrive_intact():
    out = device().empty(5, numpy.float64)
    launch("forward", "scalars", 1, 1, [numpy.int32(-7), numpy.int64(-(2**40) - 3), numpy.float32(1.25),
                                         numpy.float64(1e300), numpy.uint32(2**32 - 1), out])
    numpy.testing.assert_array_equal(out, [-7, -(2**40) - 3, 1.25, 1e300, 2**32 - 1])


def test_atomic_add():
    counters = [numpy.zeros(1, t) for t in (numpy.int32, numpy.float32, numpy.float64, numpy.uint32)]
    launch("forward", "atomics", 3, 100, counters)
    assert [c[0] for c in counters] == [300, 150.0, 75.0, 600]


@pytest.mark.parametrize("step", [-1, 3])
def test_strided_views_pass_as_pointers(step):
    x = numpy.arange(300, dtype=numpy.float32)[::step]
    out = device().empty(x.size, numpy.float32)
    launch("forward", "copy_strided", 4, 128, [x, numpy.int64(step), out, numpy.int32(x.size)])
    numpy.testing.assert_array_equal(out, x)


def test_empty_is_poisoned():
    for dtype in (numpy.float16, numpy.float32, numpy.float64):
        assert numpy.isnan(device().empty((3, 5), dtype)).all()
    assert (device().empty(7, numpy.int32) == -1).all()


# ---------------------------------------------------------------------------------------------------------
# 16-bit floats round like the hardware: to nearest even, overflow to inf, subnormals kept


def _bf16_reference(x: numpy.ndarray) -> numpy.ndarray:
    """bfloat16 bits of float32 x by nearest representable value (ties to the even pattern), found by comparing
    distances in float64, independently of the bit trick the emulator uses."""
    bits = x.view(numpy.uint32)
    below = (bits >> 16).astype(numpy.uint32)  # truncation toward zero (same sign)
    above = below + 1

    def value(b16):
        v = (b16.astype(numpy.uint32) << 16).view(numpy.float32).astype(numpy.float64)
        # the first pattern past the largest finite one stands for 2^128, as IEEE's overflow rule says
        return numpy.where((b16 & 0x7FFF) == 0x7F80, numpy.copysign(2.0**128, v), v)

    exact = x.astype(numpy.float64)
    with numpy.errstate(invalid="ignore"):  # the pattern above inf is a NaN: never picked
        d_below, d_above = numpy.abs(exact - value(below)), numpy.abs(exact - value(above))
    pick_above = (d_above < d_below) | ((d_above == d_below) & (above % 2 == 0))
    result = numpy.where(pick_above, above, below).astype(numpy.uint16)
    exact_hit = d_below == 0
    result[exact_hit] = below[exact_hit]
    return result


def test_half_and_bfloat16_conversions_round_like_hardware():
    rng = numpy.random.default_rng(3)
    special = numpy.array([0.0, -0.0, 1.0, -2.5, numpy.inf, -numpy.inf, 65504.0, 65519.99, 65520.0, 1e6, 5.96e-8,
                           2.98e-8, 2.99e-8, 6.1e-5, 1e-40, 3.4028235e38, -3.39e38], numpy.float32)
    f16 = rng.integers(0, 2**16, 2000, dtype=numpy.uint16).view(numpy.float16)
    f16 = f16[numpy.isfinite(f16)].astype(numpy.float64)
    with numpy.errstate(over="ignore"):  # past 65504 the midpoint is inf, which is fine
        f16_ties = ((f16[:-1] + numpy.nextafter(f16[:-1].astype(numpy.float16), numpy.float16(numpy.inf))
                     .astype(numpy.float64)) / 2).astype(numpy.float32)
    bf16_ties = ((rng.integers(0, 2**16, 1000, dtype=numpy.uint32) << 16) | 0x8000).view(numpy.float32)
    with numpy.errstate(over="ignore"):
        randoms = (rng.standard_normal(2000) * 10.0 ** rng.integers(-45, 39, 2000)).astype(numpy.float32)
    x = numpy.concatenate([special, f16_ties, bf16_ties, randoms]).astype(numpy.float32)
    x = x[~numpy.isnan(x)]
    n = x.size
    d = device()
    half, bf16 = d.empty(n, numpy.float16), d.empty(n, numpy.uint16)
    half_back, bf16_back = d.empty(n, numpy.float32), d.empty(n, numpy.float32)
    launch("forward", "convert_16bit", 7, 64, [x, half, bf16, half_back, bf16_back, numpy.int32(n)])

    with numpy.errstate(over="ignore"):
        numpy.testing.assert_array_equal(half.view(numpy.uint16), x.astype(numpy.float16).view(numpy.uint16))
    numpy.testing.assert_array_equal(half_back, half.astype(numpy.float32))
    numpy.testing.assert_array_equal(bf16, _bf16_reference(x))
    numpy.testing.assert_array_equal(bf16_back, (bf16.astype(numpy.uint32) << 16).view(numpy.float32))
    # NaN stays NaN
    nan = numpy.full(1, numpy.nan, numpy.float32)
    outs = [d.empty(1, t) for t in (numpy.float16, numpy.uint16, numpy.float32, numpy.float32)]
    launch("forward", "convert_16bit", 1, 1, [nan, *outs, numpy.int32(1)])
    assert numpy.isnan(outs[0][0]) and (outs[1][0] & 0x7FFF) > 0x7F80 and numpy.isnan(outs[3][0])


def test_half_arrays_pass_as_half_pointers():
    x = numpy.array([1.0, 2.5, -3.0, 65504.0], numpy.float16)
    out = device().empty(4, numpy.float16)
    launch("forward", "scale_half", 1, 32, [x, out, numpy.float32(0.5), numpy.int32(4)])
    numpy.testing.assert_array_equal(out, x * numpy.float16(0.5))


# ---------------------------------------------------------------------------------------------------------
# Bugs it catches


def test_missing_syncthreads_in_a_loop_gives_a_wrong_sum():
    x = numpy.arange(256, dtype=numpy.float32)
    results = {}
    for order in ORDERS:
        out = device().empty(1, numpy.float32)
        launch(order, "block_sum_missing_loop_sync", 1, 256, [x, out])
        results[order] = out[0]
    assert any(r != x.sum() for r in results.values()), results
    assert results["forward"] != x.sum()  # thread 0 adds partial sums before the other threads made them


@pytest.mark.parametrize("order", ORDERS)
def test_missing_syncthreads_reads_poisoned_shared_memory(order):
    x = numpy.arange(64, dtype=numpy.float32)
    out = device().empty(64, numpy.float32)
    launch(order, "rotate_missing_sync", 1, 64, [x, out])
    assert numpy.isnan(out).any()


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("kernel, pattern", [
    ("barrier_in_branch", r"divergent barrier: .* has exited"),
    ("barrier_per_branch", r"divergent barrier: thread \(0,0,0\) waits at __syncthreads\(\) at .*selftest.cu:\d+, "
                           r"but thread \(1,0,0\) waits at __syncthreads\(\) at .*selftest.cu:\d+"),
    ("shuffle_against_barrier", r"deadlock: .* warp operation .* waits at __syncthreads\(\)"),
], ids=["barrier_in_branch", "barrier_per_branch", "shuffle_against_barrier"])
def test_divergent_barrier_raises(order, kernel, pattern):
    out = device().empty(64, numpy.float32)
    with pytest.raises(KernelFailure, match=pattern):
        launch(order, kernel, 2, 64, [out])


def test_threads_exiting_before_a_barrier_raise():
    with pytest.raises(KernelFailure, match=r"thread \(40,0,0\) has exited"):
        launch("forward", "exit_before_barrier", 1, 64, [device().empty(64, numpy.float32), numpy.int32(40)])
    out = device().empty(64, numpy.float32)  # every thread stays: fine
    launch("forward", "exit_before_barrier", 1, 64, [out, numpy.int32(64)])
    assert (out == 1).all()


@pytest.mark.parametrize("kernel, args, message", [
    ("static_shared_past_end", lambda: [numpy.zeros(33, numpy.float32), numpy.int32(1)],
     r"thread \(32,0,0\): index 32 out of bounds for type 'float \[32\]' at .*selftest.cu:\d+"),
    ("local_array_past_end", lambda: [numpy.zeros(33, numpy.float32), numpy.int32(5)],
     r"thread \(0,0,0\): index 4 out of bounds for type 'float \[4\]'"),
    ("int_index_overflow", lambda: [numpy.zeros(7, numpy.float32), numpy.int32(50000), numpy.int32(50000)],
     r"signed integer overflow: 50000 \* 50000 in type 'int' at .*selftest.cu:\d+"),
], ids=["static_shared", "local_array", "int_overflow"])
def test_undefined_behaviour_fails_the_launch(kernel, args, message):
    with pytest.raises(KernelFailure, match=message):
        launch("forward", kernel, 1, 33, args())


def _aligned(n, dtype, alignment=16):
    """n elements whose first one is `alignment`-byte aligned (cudaMalloc gives 256, NumPy only what malloc does)."""
    itemsize = numpy.dtype(dtype).itemsize
    buffer = numpy.zeros(n + alignment // itemsize, dtype)
    start = (-buffer.ctypes.data % alignment) // itemsize
    return buffer[start:start + n]


def _line(text: str) -> int:
    """The line of selftest.cu that contains `text` (once)."""
    lines = [i for i, line in enumerate((SELFTEST_KERNEL_DIR / SOURCE).read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (text, lines)
    return lines[0]


def _misaligned(type_name: str, alignment: int, line_text: str) -> str:
    """The message of a misaligned access in thread (0,0,0): the type, its alignment, selftest.cu's line."""
    return (rf"block \(0,0,0\): thread \(0,0,0\): misaligned address 0x[0-9a-f]+ for a [a-z ]+ type "
            rf"'(const )?(struct )?{type_name}', which needs {alignment}-byte alignment .* at "
            rf"\S*selftest.cu:{_line(line_text)}$")


@pytest.mark.parametrize("vector, size", [("float2", 8), ("float4", 16), ("int4", 16), ("uint2", 8)])
def test_misaligned_vector_access_to_global_memory_fails_the_launch(vector, size):
    floats = size // 4
    x = _aligned(33 * floats, numpy.float32)
    x[:] = numpy.arange(x.size)
    out = _aligned(33 * floats, numpy.float32)
    launch("forward", f"vector_copy<{vector}>", 1, 32, [x, out, numpy.int32(floats), numpy.int32(0)])  # aligned
    numpy.testing.assert_array_equal(out[:32 * floats], x[floats:])
    with pytest.raises(KernelFailure, match=_misaligned(vector, size, "const V v = reinterpret_cast")):
        launch("forward", f"vector_copy<{vector}>", 1, 32, [x, out, numpy.int32(1), numpy.int32(0)])
    with pytest.raises(KernelFailure, match=_misaligned(vector, size, "reinterpret_cast<V*>(out")):
        launch("forward", f"vector_copy<{vector}>", 1, 32, [x, out, numpy.int32(0), numpy.int32(1)])


def test_misaligned_vector_access_to_shared_memory_fails_the_launch():
    halves = numpy.arange(64, dtype=numpy.float16)
    out = device().empty(32, numpy.uint32)
    launch("forward", "half_pair_shared", 1, 32, [halves, out, numpy.int32(2)])  # even: 4-byte aligned
    numpy.testing.assert_array_equal(out, numpy.concatenate([halves[2:], numpy.zeros(2, numpy.float16)])
                                     .view(numpy.uint32))
    with pytest.raises(KernelFailure, match=_misaligned("unsigned int", 4, "out[threadIdx.x] = *reinterpret_cast")):
        launch("forward", "half_pair_shared", 1, 32, [halves, out, numpy.int32(1)])
    floats = device().empty(32, numpy.float32)
    launch("forward", "vector_dynamic_shared", 1, 32, [floats, numpy.int32(4)], shared_mem=33 * 16)
    assert (floats == 3).all()
    with pytest.raises(KernelFailure, match=_misaligned("float4", 16, "reinterpret_cast<float4*>(buffer")):
        launch("forward", "vector_dynamic_shared", 1, 32, [floats, numpy.int32(2)], shared_mem=33 * 16)


def test_engine_is_usable_after_a_failure():
    with pytest.raises(KernelFailure):
        launch("forward", "barrier_in_branch", 1, 64, [device().empty(64, numpy.float32)])
    test_shared_memory_reduction("reverse", numpy.float32)


def _scalar_args(**replace):
    args = dict(a=numpy.int32(1), b=numpy.int64(2), c=numpy.float32(3), d=numpy.float64(4), e=numpy.uint32(5),
                out=numpy.zeros(5, numpy.float64))
    args.update(replace)
    return list(args.values())


@pytest.mark.parametrize("replace, message", [
    (dict(a=numpy.int64(1)), r"argument 0 is numpy.int64 but parameter 0 is `int`: pass numpy.int32"),
    (dict(a=1), r"argument 0 is a Python int .* `int`"),
    (dict(b=numpy.int32(2)), r"argument 1 is numpy.int32 but parameter 1 is `long long`"),
    (dict(b=2), r"argument 1 is a Python int"),
    (dict(c=numpy.float64(3)), r"argument 2 is numpy.float64 but parameter 2 is `float`"),
    (dict(c=3.0), r"argument 2 is a Python float"),
    (dict(e=numpy.int32(5)), r"argument 4 is numpy.int32 but parameter 4 is `unsigned int`"),
    (dict(a=numpy.array(1, numpy.int32)), r"argument 0 is a int32 array .* `int`"),
])
def test_scalar_type_mismatch_raises(replace, message):
    with pytest.raises(KernelArgumentError, match=message):
        launch("forward", "scalars", 1, 1, _scalar_args(**replace))


def test_pointer_type_mismatch_raises():
    x32, x64 = numpy.zeros(128, numpy.float32), numpy.zeros(128, numpy.float64)
    with pytest.raises(KernelArgumentError, match=r"argument 0 is a float64 array .* `const float\*`"):
        launch("forward", "block_sum<float>", 1, 128, [x64, numpy.zeros(1, numpy.float32)])
    with pytest.raises(KernelArgumentError, match=r"argument 1 is a float64 array .* `float\*`"):
        launch("forward", "block_sum<float>", 1, 128, [x32, numpy.zeros(1, numpy.float64)])
    with pytest.raises(KernelArgumentError, match=r"argument 1 is a float32 array .* `__half\*`"):
        launch("forward", "scale_half", 1, 32, [numpy.zeros(4, numpy.float16), numpy.zeros(4, numpy.float32),
                                                 numpy.float32(1), numpy.int32(4)])
    with pytest.raises(KernelArgumentError, match=r"`const __half\*`"):  # raw bits are accepted for bf16 only
        launch("forward", "scale_half", 1, 32, [numpy.zeros(4, numpy.uint16), numpy.zeros(4, numpy.float16),
                                                 numpy.float32(1), numpy.int32(4)])
    with pytest.raises(KernelArgumentError, match=r"read-only"):
        launch("forward", "block_sum<float>", 1, 128, [x32, numpy.broadcast_to(numpy.float32(0), (1,))])
    with pytest.raises(KernelArgumentError, match=r"argument 0 is numpy.float32 .* pass an array"):
        launch("forward", "block_sum<float>", 1, 128, [numpy.float32(0), x32])
    with pytest.raises(KernelArgumentError, match=r"takes 2 arguments \(const float\*, float\*\), got 3"):
        launch("forward", "block_sum<float>", 1, 128, [x32, x32, numpy.int32(1)])


@pytest.mark.parametrize("grid, block, message", [
    (1, 1025, r"block \(1025, 1, 1\) has 1025 threads; CUDA allows at most 1024"),
    (1, (32, 32, 2), r"has 2048 threads"),
    (1, (1, 1, 65), r"block.z = 65 exceeds CUDA's limit of 64"),
    ((1, 65536), 32, r"grid.y = 65536 exceeds"),
    (0, 32, r"empty dimension"),
    ((1, 1, 1, 1), 32, r"1 to 3 dimensions"),
])
def test_launch_limits_raise(grid, block, message):
    with pytest.raises(LaunchConfigError, match=message):
        launch("forward", "record_indices", grid, block, [device().empty(10 * 2048, numpy.uint32)])


def test_shared_memory_limits():
    out = device().empty(32, numpy.float32)
    big = device().function(SOURCE, "big_static_shared")
    assert big.shared_size_bytes == 40 * 1024
    big.max_dynamic_shared_size_bytes = 8 * 1024  # as loaded (48 KiB less the static memory), even on a rerun
    launch("forward", "big_static_shared", 1, 32, [out], shared_mem=8 * 1024)  # 40 KiB static + 8 KiB: fits
    assert (out == 2).all()
    # 48 KiB + 4 in all, but not 48 KiB of dynamic memory: CudaDevice does not opt in, and a GPU fails the launch
    with pytest.raises(LaunchConfigError, match=r"big_static_shared asks for 8196 bytes of dynamic shared memory "
                                                r"beside its 40960 static bytes \(49156 in all\), more than its "
                                                r"max_dynamic_shared_size_bytes of 8192"):
        launch("forward", "big_static_shared", 1, 32, [out], shared_mem=8 * 1024 + 4)
    # Past 48 KiB of dynamic memory the device opts in (cupyconv._device.opt_in_shared_memory), up to 227 KiB in all
    launch("forward", "big_static_shared", 1, 32, [out], shared_mem=100 * 1024)
    assert big.max_dynamic_shared_size_bytes == 100 * 1024  # the opt-in stays, as the attribute does on a GPU
    with pytest.raises(LaunchConfigError, match=r"max_dynamic_shared_size_bytes = 192512 is refused: with its "
                                                r"40960 bytes of static shared memory a block may have 232448"):
        launch("forward", "big_static_shared", 1, 32, [out], shared_mem=188 * 1024)
    x = numpy.arange(64, dtype=numpy.float32)
    launch("forward", "reverse_dynamic", 1, 64, [x, device().empty(64, numpy.float32)], shared_mem=227 * 1024)
    with pytest.raises(LaunchConfigError, match=r"= 233472 is refused"):
        launch("forward", "reverse_dynamic", 1, 64, [x, x.copy()], shared_mem=228 * 1024)


def test_static_shared_memory_counts_what_helpers_declare():
    # 8 KiB in the body, 16 KiB in a helper that is not inlined, 8 KiB in an inlined one, 4 KiB at file scope
    assert device().function(SOURCE, "shared_in_helpers").shared_size_bytes == 36 * 1024
    out = device().empty(32, numpy.float32)
    launch("forward", "shared_in_helpers", 1, 32, [out], shared_mem=12 * 1024)  # 48 KiB in all
    assert (out == 7.5).all()
    with pytest.raises(LaunchConfigError, match=r"shared_in_helpers asks for 12292 bytes of dynamic shared memory "
                                                r"beside its 36864 static bytes"):
        launch("forward", "shared_in_helpers", 1, 32, [out], shared_mem=12 * 1024 + 4)
    with pytest.raises(LaunchConfigError, match=r"too_much_shared_in_helpers declares 57344 bytes of static shared "
                                                r"memory; CUDA allows 49152"):
        launch("forward", "too_much_shared_in_helpers", 1, 32, [device().empty(32, numpy.float64)])


def test_more_than_48_kib_of_dynamic_shared_memory_needs_the_opt_in(monkeypatch):
    from cupyconv import _device as cupyconv_device
    kernel = device().function(SOURCE, "reverse_dynamic")
    kernel.max_dynamic_shared_size_bytes = 48 * 1024  # as loaded: 48 KiB less its (no) static memory
    x, out = numpy.arange(64, dtype=numpy.float32), device().empty(64, numpy.float32)
    launch("forward", "reverse_dynamic", 1, 64, [x, out], shared_mem=48 * 1024)
    monkeypatch.setattr(cupyconv_device, "opt_in_shared_memory", lambda kernel, shared_mem: None)
    with pytest.raises(LaunchConfigError, match=r"reverse_dynamic asks for 49153 bytes of dynamic shared memory "
                                                r"beside its 0 static bytes .* after the opt-in"):
        launch("forward", "reverse_dynamic", 1, 64, [x, out], shared_mem=48 * 1024 + 1)
    monkeypatch.undo()  # the device's own step: the same launch runs
    launch("forward", "reverse_dynamic", 1, 64, [x, out], shared_mem=48 * 1024 + 1)
    numpy.testing.assert_array_equal(out, x[::-1])
    assert kernel.max_dynamic_shared_size_bytes == 48 * 1024 + 1


def test_launch_bounds_are_enforced():
    out = device().empty(4 * 64, numpy.float32)
    launch("forward", "bounded", 4, 64, [out])  # __launch_bounds__(SELFTEST_BOUND, 4): 64 threads
    assert (out == 1).all()
    launch("forward", "bounded", 4, (8, 4, 2), [out])
    with pytest.raises(LaunchConfigError, match=r"selftest.cu: bounded is declared __launch_bounds__\(64\) but is "
                                                r"launched with block \(65, 1, 1\), 65 threads"):
        launch("forward", "bounded", 1, 65, [out])
    with pytest.raises(LaunchConfigError, match=r"block \(8, 3, 3\), 72 threads"):
        launch("forward", "bounded", 1, (8, 3, 3), [out])


def test_shipped_kernels_launch_bounds_and_static_shared_memory():
    from cupyconv import _device as cupyconv_device
    bounds = {}
    for source, name in cupyconv_device.all_instantiations():
        bounds.setdefault((source, name.split("<")[0]), EmulatedDevice().function(source, name).launch_bound)
    defines = {source: dict(o[2:].split("=") for o in kernels.options())
               for source, kernels in cupyconv_device.kernel_files().items()}
    # read with the files' -D options
    for kernel in ("conv_fwd_tc", "conv_bwd_input_tc", "conv_bwd_weight_tc"):
        assert bounds[("implicit_gemm.cu", kernel)] == int(defines["implicit_gemm.cu"]["TC_MAX_THREADS"])
    for kernel in ("conv_fwd_igemm", "conv_fwd_igemm_phases"):
        assert bounds[("implicit_gemm.cu", kernel)] == int(defines["implicit_gemm.cu"]["IG_THREADS"])
    assert bounds[("patch.cu", "patch_fwd")] == int(defines["patch.cu"]["PATCH_MAX_THREADS"])
    assert bounds[("unfold.cu", "unfold_im2col")] == 0  # none declared
    # two stages of BM + BN rows of 40 halves or 36 floats (implicit_gemm.cu's TcTile); __half arrays' init guards not counted
    tc = {(t, rows, cols): EmulatedDevice().function("implicit_gemm.cu", f"conv_bwd_input_tc<{t}, int, {rows}, {cols}>")
          .shared_size_bytes for t, rows, cols in (("__half", 128, 64), ("__half", 64, 32), ("float", 64, 64))}
    assert tc == {("__half", 128, 64): 2 * 192 * 40 * 2, ("__half", 64, 32): 2 * 96 * 40 * 2,
                  ("float", 64, 64): 2 * 128 * 36 * 4}


def test_launching_an_unlisted_instantiation_of_a_shipped_kernel_raises():
    with pytest.raises(EmulatorError, match=r"missing from its op's instantiations\(\)"):
        EmulatedDevice().launch("unfold.cu", "unfold_im2col<int, short>", 1, 1, [])


# ---------------------------------------------------------------------------------------------------------
# The library cache


def test_library_is_compiled_once_and_cached(monkeypatch, tmp_path):
    path = device().library_path(SOURCE)
    assert device("reverse").library_path(SOURCE) == path  # shared by every device of the process
    assert path.is_file() and (path.parent / "meta.json").is_file()
    # a fresh cache directory, as in CI: a small file of its own compiles there once
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "tiny.cu").write_text("__global__ void fill(float* out, float v) { out[threadIdx.x] = v; }\n")
    monkeypatch.setenv("CUPYCONV_EMULATOR_CACHE", str(tmp_path / "cache"))
    d = EmulatedDevice(kernel_dir=kernels, instantiations=[("tiny.cu", "fill")])
    out = d.empty(8, numpy.float32)
    d.launch("tiny.cu", "fill", 1, 8, [out, numpy.float32(4)])
    assert (out == 4).all()
    built = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir())
    assert len(built) == 1 and built[0].startswith("tiny-plain-") and d.library_path("tiny.cu").parent.name == built[0]


# ---------------------------------------------------------------------------------------------------------
# AddressSanitizer mode (a child interpreter with libasan preloaded)

needs_asan = pytest.mark.skipif(libasan_path() is None, reason="g++ has no libasan")

ASAN_SETUP = f"""
import numpy
from emulator import EmulatedDevice, SELFTEST_KERNEL_DIR
def device(order="forward"):
    return EmulatedDevice(order, kernel_dir=SELFTEST_KERNEL_DIR, instantiations={INSTANTIATIONS!r})
d = device()
assert d.asan
"""


@needs_asan
def test_correct_kernels_are_clean_under_asan():
    process = run_under_asan(ASAN_SETUP + """
x = numpy.arange(3 * 128, dtype=numpy.float32)
for order in ("forward", "reverse"):
    d = device(order)
    out = d.empty(3, numpy.float32)
    d.launch("selftest.cu", "block_sum<float>", 3, 128, [x, out])
    assert (out == x.reshape(3, 128).sum(axis=1)).all(), out
    o = d.empty((96, 6), numpy.int32)
    d.launch("selftest.cu", "warp_ops", 2, 48, [numpy.arange(96, dtype=numpy.int32), o])
    o = d.empty(128, numpy.float32)
    d.launch("selftest.cu", "reverse_dynamic", 2, 64, [x, o], shared_mem=256)
    assert (o == x[:128].reshape(2, 64)[:, ::-1].reshape(-1)).all()
    for view, stride in ((x[::-1], -1), (x[5:300:3], 3)):  # views read through their strides
        o = d.empty(view.size, numpy.float32)
        d.launch("selftest.cu", "copy_strided", 4, 128, [view, numpy.int64(stride), o, numpy.int32(view.size)])
        assert (o == view).all()
    try:
        d.launch("selftest.cu", "barrier_in_branch", 1, 64, [d.empty(64, numpy.float32)])
    except Exception as e:
        assert "divergent barrier" in str(e)
    else:
        raise AssertionError("no error")
print("clean")
""")
    assert_clean_under_asan(process)
    assert "clean" in process.stdout


@needs_asan
def test_argument_copies_keep_their_alignment_under_asan():
    process = run_under_asan(ASAN_SETUP + """
buffer = numpy.zeros(200, numpy.float32)
start = (-buffer.ctypes.data % 16) // 4
x = buffer[start:start + 132]
o = d.empty(132, numpy.float32)
d.launch("selftest.cu", "vector_copy<float4>", 1, 32, [x, o, numpy.int32(0), numpy.int32(0)])
try:
    d.launch("selftest.cu", "vector_copy<float4>", 1, 32, [x[1:], o, numpy.int32(0), numpy.int32(0)])
except Exception as e:
    assert "misaligned address" in str(e), e
else:
    raise AssertionError("a view 4 bytes past a 16-byte boundary was copied to an aligned buffer")
print("clean")
""")
    assert_clean_under_asan(process)
    assert "clean" in process.stdout


@needs_asan
@pytest.mark.parametrize("launch_code, report", [
    ('d.launch("selftest.cu", "write_past_end", 4, 32, [d.empty(100, numpy.float32), numpy.int32(100)])',
     r"AddressSanitizer: heap-buffer-overflow .*\n.*WRITE of size 4"),
    # a view: the bytes past its end belong to the same NumPy buffer, but not to the argument
    ('d.launch("selftest.cu", "write_past_end", 4, 32, [d.empty(200, numpy.float32)[:100], numpy.int32(100)])',
     r"AddressSanitizer: heap-buffer-overflow"),
    ('d.launch("selftest.cu", "dynamic_shared_past_end", 1, 32, [d.empty(32, numpy.float32)], shared_mem=128)',
     r"AddressSanitizer: use-after-poison .*\n.*READ of size 4"),
], ids=["global", "global_view", "dynamic_shared"])
def test_out_of_bounds_access_fails_under_asan(launch_code, report):
    process = run_under_asan(ASAN_SETUP + launch_code + "\nprint('not caught')\n")
    assert "not caught" not in process.stdout
    assert process.returncode != 0
    found = sanitizer_report(process)
    assert found is not None, process.stderr[-3000:]
    assert re.search(report, found), found
    with pytest.raises(AssertionError, match="sanitizer error"):
        assert_clean_under_asan(process)


def test_asan_mode_needs_the_preloaded_runtime(monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with pytest.raises(EmulatorError, match="libasan preloaded"):
        device(asan=True)


# ---------------------------------------------------------------------------------------------------------
# Tensor-core matrix operations (raw_kernels/mma.cuh): documented fragment layouts, the hardware's operand rounding,
# whole warps.  The sums are the emulator's idealisation (exact products, one rounding): the bit equality below
# is the emulator's contract, checked on the emulator only; a GPU's adder may differ in the last bits (emu_mma.h).


def _mma_inputs(rng, dtype, k):
    a = rng.standard_normal((16, k)).astype(dtype)
    bt = rng.standard_normal((8, k)).astype(dtype)  # B^T
    c = rng.standard_normal((16, 8)).astype(numpy.float32)
    return a, bt, c


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mma_m16n8k16_computes_a_times_b_plus_c(order, dtype):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    t = numpy.float16 if dtype == "float16" else ml_dtypes.bfloat16
    a, bt, c = _mma_inputs(numpy.random.default_rng(0), t, 16)
    expected = (a.astype(numpy.float64) @ bt.astype(numpy.float64).T + c).astype(numpy.float32)
    name = f"mma_16816<{'__half' if dtype == 'float16' else '__nv_bfloat16'}>"
    for swap, exact in ((0, True), (1, False)):
        d = device(order).empty((16, 8), numpy.float32)
        launch(order, name, 1, 32, [a, bt, c, d, numpy.int32(swap)])
        if exact:  # exact products, one rounding of the sum (emulator only): the float64 reference rounded once
            numpy.testing.assert_array_equal(d, expected)
        else:      # a fragment in the wrong register: a different product
            assert numpy.abs(d - expected).max() > 1.0


@pytest.mark.parametrize("order", ORDERS)
def test_mma_tf32_rounds_with_to_tf32_and_truncates_without(order):
    rng = numpy.random.default_rng(1)
    a, bt, c = _mma_inputs(rng, numpy.float32, 8)

    def truncated(x):
        return (x.view(numpy.uint32) & numpy.uint32(0xFFFFE000)).view(numpy.float32)

    def rounded(x):  # to nearest, ties away from zero, on the 13 dropped bits
        return ((x.view(numpy.uint32) + numpy.uint32(0x1000)) & numpy.uint32(0xFFFFE000)).view(numpy.float32)

    for round_, convert in ((1, rounded), (0, truncated)):
        d = device(order).empty((16, 8), numpy.float32)
        launch(order, "mma_1688_tf32", 1, 32, [a, bt, c, d, numpy.int32(round_)])
        expected = convert(a).astype(numpy.float64) @ convert(bt).astype(numpy.float64).T + c
        numpy.testing.assert_array_equal(d, expected.astype(numpy.float32))
    assert not numpy.array_equal(rounded(a), truncated(a))  # the two cases differ on these inputs


def test_mma_needs_every_lane_of_the_warp():
    d = device().empty((64,), numpy.float32)
    with pytest.raises(KernelFailure, match=r"warp operation"):
        launch("forward", "mma_divergent", 1, 64, [d, numpy.int32(16)])
    with pytest.raises(KernelFailure, match=r"mma.sync .* in a warp of 16 threads; it needs all 32 lanes"):
        launch("forward", "mma_divergent", 1, 16, [d, numpy.int32(32)])


# ---------------------------------------------------------------------------------------------------------
# Fences: a block's global stores reach the block that sees its atomic count only through each storing thread's
# __threadfence() (the last block of a split-K, raw_kernels/implicit_gemm.cu's wg_last_arrival)

LAST_BLOCK_ORDERS = {"forward": None, "reverse": None, "shuffled": lambda g: [(2, 0, 0), (4, 0, 0), (0, 0, 0),
                                                                              (3, 0, 0), (1, 0, 0)]}


@pytest.mark.parametrize("order", LAST_BLOCK_ORDERS)
def test_last_block_to_arrive_sums_every_block(order):
    """With every thread fenced, the last block to arrive -- the highest, the lowest or a middle index, as the
    blocks run -- reads every block's values and sets the count back to 0."""
    blocks = LAST_BLOCK_ORDERS[order]
    d = (EmulatedDevice("reverse" if order == "reverse" else "forward", kernel_dir=SELFTEST_KERNEL_DIR,
                        instantiations=INSTANTIATIONS, blocks=blocks))
    partial, out = d.empty((5, 64), numpy.float32), d.empty((64,), numpy.float32)
    arrivals, last = numpy.zeros(1, numpy.int32), numpy.full(1, -1, numpy.int32)
    d.launch(SOURCE, "last_block_sum<1>", 5, 64, [partial, arrivals, out, last])
    assert last[0] == {"forward": 4, "reverse": 0, "shuffled": 1}[order]
    assert arrivals[0] == 0
    numpy.testing.assert_array_equal(out, sum(b * 1000 + numpy.arange(64, dtype=numpy.float32) for b in range(5)))


@pytest.mark.parametrize("fence, thread", [(0, r"\(0,0,0\)"), (2, r"\(1,0,0\)")])
def test_atomic_after_unfenced_stores_fails(fence, thread):
    """No fence, or a fence in thread 0 only: the count would publish stores a GPU may not show the last block."""
    d = device()
    partial, out = d.empty((3, 32), numpy.float32), d.empty((32,), numpy.float32)
    with pytest.raises(KernelFailure, match=rf"block \(0,0,0\): thread \(0,0,0\): atomic after a barrier, but thread "
                                            rf"{thread} did not __threadfence\(\) .*selftest.cu:\d+"):
        d.launch(SOURCE, f"last_block_sum<{fence}>", 3, 32, [partial, numpy.zeros(1, numpy.int32), out,
                                                             numpy.zeros(1, numpy.int32)])
