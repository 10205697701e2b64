"""The emulator's cp.async and ldmatrix (raw_kernels/async_copy.cuh, tests/emulator/include/emu_async_copy.h) on
self-test kernels (tests/emulator/selftest_kernels/async_copy.cu): correct use gives exact results, in both
thread orders, and each rule broken fails, for copies of 16 (.cg), 8 and 4 bytes (.ca): a missing or too weak
cp.async.wait_group or a missing commit (a plain load or ldmatrix of bytes still in flight fails the launch, and so
does a plain store into them), addresses not aligned to the copy's size, a src-size past the copy or past the input,
a destination past the launch's dynamic shared memory, a partial or divergent warp at ldmatrix.  ldmatrix's lane mapping is checked against the PTX ISA's description,
written out independently here (`expected_ldmatrix`)."""
from __future__ import annotations

import numpy
import pytest

from emulator import (SELFTEST_KERNEL_DIR, EmulatedDevice, KernelFailure, assert_clean_under_asan, run_under_asan,
                      sanitizer_report)
from emulator._asan import libasan_path

SOURCE = "async_copy.cu"
INSTANTIATIONS = [(SOURCE, k) for k in ("async_copy_stages", "ldmatrix_rows", "async_copy_ldmatrix",
                                         "async_copy_dynamic")]
ORDERS = ("forward", "reverse")
# async_copy.cu's Bug
CORRECT, NO_WAIT, WAIT_TOO_FEW, MISALIGNED_SMEM, MISALIGNED_GMEM, SRC_BYTES_17, FULL_ROW_PAST_END, NO_COMMIT, \
    REISSUE, NOT_SHARED, INTO_TAIL, STORE_IN_FLIGHT = range(12)
POISON = 0xFF
SIZES = (16, 8, 4)  # cp_async_cg_16, cp_async_ca_8, cp_async_ca_4


def device(order="forward", **kw) -> EmulatedDevice:
    return EmulatedDevice(order, kernel_dir=SELFTEST_KERNEL_DIR, instantiations=INSTANTIATIONS, **kw)


def i32(v):
    return numpy.int32(v)


# ---------------------------------------------------------------------------------------------------------
# cp.async: groups, waits, zero-fill


def copy_stages(order, bug, rows=75, last_bytes=10, steps=4, size=16):
    """(input, output) of async_copy_stages: rows x 16 random bytes through the three-stage pipeline, by copies
    of `size` bytes."""
    d = device(order)
    data = numpy.random.default_rng(rows + bug).integers(0, 255, (rows, 16), dtype=numpy.uint8)  # never 0xFF
    out = d.empty((32 * steps, 16), numpy.uint8)
    d.launch(SOURCE, "async_copy_stages", 1, 32, [data, out, i32(rows), i32(last_bytes), i32(steps), i32(bug),
                                                               i32(size)])
    return data, out


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("order", ORDERS)
def test_pipeline_copies_and_zero_fills(order, size):
    """The last row's 10 bytes of source: one 16-byte copy with src-size 10, 8-byte copies of 8 and 2 (and a 0),
    4-byte copies of 4, 4, 2 and 0; each zero-fills the rest of its own bytes."""
    data, out = copy_stages(order, CORRECT, size=size)
    numpy.testing.assert_array_equal(out[:74], data[:74])
    numpy.testing.assert_array_equal(out[74], numpy.r_[data[74, :10], numpy.zeros(6, numpy.uint8)])
    assert (out[75:] == 0).all()  # src-size 0: padding rows of zeros


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("bug", [NO_WAIT, WAIT_TOO_FEW, NO_COMMIT], ids=["no_wait", "wait_too_few", "no_commit"])
@pytest.mark.parametrize("order", ORDERS)
def test_data_lands_only_at_its_wait(bug, order, size):
    """Until the wait that retires its group, a copy is in flight: a plain load of its bytes races with the copy's
    write on a GPU (either may come first), so it fails the launch, naming the load's line and the copy's thread and
    line.  wait_group 2 in the three-stage pipeline leaves every step's rows in flight one step too long; without a
    wait (or a commit) nothing lands.  The first load of the kernel is a neighbour's row: thread (tid + 1) % 32's."""
    neighbour = "1" if order == "forward" else "0"  # the first reader is thread 0 (forward) or 31 (reverse)
    with pytest.raises(KernelFailure, match=r"shared load of 1 bytes at 0x[0-9a-f]+, whose word 0x[0-9a-f]+ a "
                       rf"cp.async of thread {neighbour} \(at \S*async_copy.cu:\d+\) still has in flight: no "
                       r"cp.async.wait_group has landed it, so the copy's write races with this access at "
                       r"async_copy.cu:\d+"):
        copy_stages(order, bug, steps=4 if bug == WAIT_TOO_FEW else 1, size=size)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("order", ORDERS)
def test_a_plain_store_into_a_copy_in_flight_fails(order, size):
    """Thread 7 writes a byte of the next step's stage (row 12, copied by thread 12) while that step's copies are in
    flight: the store and the copy's write are unordered on a GPU (patch_fwd_igemm writing its out tile into the
    raw buffer of the next group's x would be this race: mutation pt-out-in-raw-next-buffer)."""
    with pytest.raises(KernelFailure, match=r"thread \(7,0,0\): shared store of 1 bytes at 0x[0-9a-f]+, whose word "
                       r"0x[0-9a-f]+ a cp.async of thread 12 \(at \S*async_copy.cu:\d+\) still has in flight.* at "
                       r"async_copy.cu:\d+"):
        copy_stages(order, STORE_IN_FLIGHT, size=size)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("bug, message", [
    (MISALIGNED_SMEM, r"cp.async of {s} bytes from 0x[0-9a-f]+ to 0x[0-9a-f]+: both addresses must be {s}-byte "
                      r"aligned"),
    (MISALIGNED_GMEM, r"cp.async of {s} bytes from \S+ to \S+: both addresses must be {s}-byte aligned"),
    (SRC_BYTES_17, r"cp.async of {s} bytes with src-size {s1}: it must be within 0..{s}"),
    (REISSUE, r"cp.async into {s} bytes of shared memory at 0x[0-9a-f]+ that a cp.async of thread 3 \(at "
              r"\S*async_copy.cu:\d+\) still has in flight"),
    (NOT_SHARED, r"cp.async to 0x[0-9a-f]+, which is not shared memory"),
], ids=["misaligned_smem", "misaligned_gmem", "src_size_past_the_copy", "reissue", "not_shared"])
def test_broken_copies_fail(bug, message, size):
    with pytest.raises(KernelFailure, match=r"block \(0,0,0\): thread \(\d+,0,0\): " +
                       message.format(s=size, s1=size + 1) + r".* at \S*async_copy.cu:\d+"):
        copy_stages("forward", bug, size=size)


@pytest.mark.parametrize("size", (16, 8))
def test_a_copy_into_the_tail_of_one_in_flight_fails(size):
    """Every word of a copy is in flight, not only its first: a 4-byte copy into the last word of a 16- or 8-byte
    copy that has not landed fails."""
    with pytest.raises(KernelFailure, match=r"cp.async into 4 bytes of shared memory at 0x[0-9a-f]+ that a cp.async "
                       r"of thread 3 \(at \S*async_copy.cu:\d+\) still has in flight"):
        copy_stages("forward", INTO_TAIL, size=size)


needs_asan = pytest.mark.skipif(libasan_path() is None, reason="g++ has no libasan")

ASAN_SETUP = f"""
import numpy
from emulator import EmulatedDevice, SELFTEST_KERNEL_DIR
d = EmulatedDevice(kernel_dir=SELFTEST_KERNEL_DIR, instantiations={INSTANTIATIONS!r})
assert d.asan
data = numpy.arange(75 * 16, dtype=numpy.uint8).reshape(75, 16)
out = d.empty((128, 16), numpy.uint8)
i = numpy.int32
"""


@needs_asan
@pytest.mark.parametrize("size", (16, 4))
@pytest.mark.parametrize("bug", [CORRECT, FULL_ROW_PAST_END], ids=["zero_fill", "full_row_past_end"])
def test_zero_fill_reads_nothing_past_the_input(bug, size):
    """Padding rows copied with src-size 0 read nothing (clean under ASan, with the pointer one past the input);
    with src-size 16 instead, the copy reads past the input, which a GPU faults on and ASan reports."""
    process = run_under_asan(ASAN_SETUP + f"""
d.launch("async_copy.cu", "async_copy_stages", 1, 32, [data, out, i(75), i(16), i(4), i({bug}), i({size})])
print("not caught")
""")
    if bug == CORRECT:
        assert_clean_under_asan(process)
        assert "not caught" in process.stdout
    else:
        assert "not caught" not in process.stdout
        report = sanitizer_report(process)
        assert report is not None and "heap-buffer-overflow" in report, process.stderr[-3000:]


@needs_asan
@pytest.mark.parametrize("bug", [NO_WAIT, NO_COMMIT], ids=["no_wait", "no_commit"])
def test_poison_until_the_wait_under_asan(bug):
    """The ASan build has no hooks on plain accesses (g++ refuses address and thread together): there a load of
    bytes in flight reads the poison the copy left in its destination until its wait, so the missing wait still
    shows as 0xFF bytes (NaN in a float)."""
    process = run_under_asan(ASAN_SETUP + f"""
d.launch("async_copy.cu", "async_copy_stages", 1, 32, [data, out, i(75), i(16), i(1), i({bug}), i(16)])
print("poisoned" if (out[:32] == 0xFF).all() else "landed")
""")
    assert_clean_under_asan(process)
    assert "poisoned" in process.stdout, process.stdout


# ---------------------------------------------------------------------------------------------------------
# ldmatrix: the PTX ISA's lane mapping, alignment, whole warps


def expected_ldmatrix(tile, rows, pitch, count, trans):
    """What lane l receives in register j, from the PTX ISA's description of ldmatrix .m8n8 .b16: matrix j is
    the 8 rows whose addresses lanes 8 j .. 8 j + 7 give; a lane holds the pair (row l / 4, columns 2 (l % 4)
    and 2 (l % 4) + 1) of it, the lower column in the low 16 bits, or with .trans the pair (rows 2 (l % 4) and
    2 (l % 4) + 1, column l / 4)."""
    flat = tile.reshape(-1)
    out = numpy.zeros((32, 4), numpy.uint32)
    for lane in range(32):
        g, q = divmod(lane, 4)
        for j in range(count):
            matrix = numpy.array([flat[rows[8 * j + i] * pitch:rows[8 * j + i] * pitch + 8] for i in range(8)])
            lo, hi = (matrix[2 * q, g], matrix[2 * q + 1, g]) if trans else (matrix[g, 2 * q], matrix[g, 2 * q + 1])
            out[lane, j] = int(lo) | int(hi) << 16
    return out


def ldmatrix(order, mode, pitch=24, lanes=32, block=32, odd_lane=0, offset=0, seed=0):
    rng = numpy.random.default_rng(seed)
    tile = rng.integers(0, 2**16, 32 * 24, dtype=numpy.uint16)
    rows = rng.permutation(32).astype(numpy.int32)  # each lane's row, anywhere in the tile
    d = device(order)
    out = d.empty((block, 4), numpy.uint32)
    d.launch(SOURCE, "ldmatrix_rows", 1, block, [tile, rows, out, i32(pitch), i32(mode), i32(lanes), i32(odd_lane),
                                                 i32(offset)])
    return out, tile[:32 * pitch], rows


@pytest.mark.parametrize("pitch", [8, 24])
@pytest.mark.parametrize("mode, count, trans", [(0, 4, False), (1, 2, False), (2, 4, True)],
                         ids=["x4", "x2", "x4_trans"])
@pytest.mark.parametrize("order", ORDERS)
def test_ldmatrix_lane_mapping(mode, count, trans, pitch, order):
    out, tile, rows = ldmatrix(order, mode, pitch=pitch, seed=pitch + mode)
    want = expected_ldmatrix(tile, rows, pitch, count, trans)
    numpy.testing.assert_array_equal(out[:, :count], want[:, :count])


def test_ldmatrix_feeds_the_mma_fragment_layout():
    """The x4 of a 16 x 16 A tile addressed as CUTLASS does (lane l: row l % 16, columns 8 (l / 16) ..) gives
    mma.cuh's a[0..3]: a[0] = A[g][2q | 2q+1], a[1] = A[g+8][..], a[2] = A[g][2q+8 | 2q+9], a[3] = A[g+8][2q+8 ..];
    the x4.trans of a k-major 16 x 16 B tile (lane l: k row l % 16... as two n halves) gives b[0], b[1]."""
    rng = numpy.random.default_rng(5)
    a = rng.integers(0, 2**16, (16, 16), dtype=numpy.uint16)
    # tile rows: row r of the tile is half a row of A: A[r % 16][8 (r // 16) ..]
    tile = numpy.zeros((32, 24), numpy.uint16)
    for r in range(32):
        tile[r, :8] = a[r % 16, 8 * (r // 16):8 * (r // 16) + 8]
    rows = numpy.arange(32, dtype=numpy.int32)  # lane l addresses tile row l
    d = device()
    out = d.empty((32, 4), numpy.uint32)
    d.launch(SOURCE, "ldmatrix_rows", 1, 32, [tile.reshape(-1), rows, out, i32(24), i32(0), i32(32), i32(0), i32(0)])
    for lane in range(32):
        g, q = divmod(lane, 4)
        fragment = [(a[g, 2 * q], a[g, 2 * q + 1]), (a[g + 8, 2 * q], a[g + 8, 2 * q + 1]),
                    (a[g, 2 * q + 8], a[g, 2 * q + 9]), (a[g + 8, 2 * q + 8], a[g + 8, 2 * q + 9])]
        assert [int(out[lane, j]) for j in range(4)] == [int(lo) | int(hi) << 16 for lo, hi in fragment], lane
    # B (k x n = 16 x 8) stored k-major (row k holds B[k][0..7]): x4.trans over rows k = 0..15 twice gives, per
    # lane, b[0] = B[2q | 2q+1][g] (matrix 0: k 0-7) and b[1] = B[2q+8 | 2q+9][g] (matrix 1: k 8-15)
    b = rng.integers(0, 2**16, (16, 8), dtype=numpy.uint16)
    tile = numpy.zeros((32, 24), numpy.uint16)
    tile[:16, :8] = b
    tile[16:, :8] = b
    out = d.empty((32, 4), numpy.uint32)
    d.launch(SOURCE, "ldmatrix_rows", 1, 32, [tile.reshape(-1), rows, out, i32(24), i32(2), i32(32), i32(0), i32(0)])
    for lane in range(32):
        g, q = divmod(lane, 4)
        fragment = [(b[2 * q, g], b[2 * q + 1, g]), (b[2 * q + 8, g], b[2 * q + 9, g])]
        assert [int(out[lane, j]) for j in range(2)] == [int(lo) | int(hi) << 16 for lo, hi in fragment], lane


@pytest.mark.parametrize("mode", [0, 1, 2], ids=["x4", "x2", "x4_trans"])
def test_ldmatrix_misaligned_row_fails(mode):
    with pytest.raises(KernelFailure, match=r"thread \(9,0,0\): ldmatrix row address 0x[0-9a-f]+ of lane 9 is not "
                       r"16-byte aligned .* at \S*async_copy.cu:\d+"):
        ldmatrix("forward", mode, odd_lane=9, offset=4)  # 8 bytes off


def test_ldmatrix_x2_ignores_the_upper_lanes_addresses():
    """.x2 reads lanes 0-15's addresses only: a misaligned one in lane 20 is never used."""
    out, tile, rows = ldmatrix("forward", 1, odd_lane=20, offset=4)
    numpy.testing.assert_array_equal(out[:, :2], expected_ldmatrix(tile, rows, 24, 2, False)[:, :2])


def test_ldmatrix_needs_the_whole_warp():
    with pytest.raises(KernelFailure, match=r"deadlock: thread \(0,0,0\) waits at a warp operation .*async_copy.cu"
                                            r":\d+, but thread \(\d+,0,0\) of its warp has exited"):
        ldmatrix("forward", 0, lanes=16)
    with pytest.raises(KernelFailure, match=r"ldmatrix in a warp of 16 threads; it needs all 32 lanes"):
        ldmatrix("forward", 0, block=48)


# ---------------------------------------------------------------------------------------------------------
# cp.async feeding ldmatrix


@pytest.mark.parametrize("order", ORDERS)
def test_ldmatrix_of_landed_copies(order):
    rng = numpy.random.default_rng(9)
    tile = rng.integers(0, 2**16, 32 * 8, dtype=numpy.uint16)
    d = device(order)
    out = d.empty((32, 4), numpy.uint32)
    d.launch(SOURCE, "async_copy_ldmatrix", 1, 32, [tile, out, i32(0)])
    numpy.testing.assert_array_equal(out, expected_ldmatrix(tile, numpy.arange(32), 8, 4, False))


@pytest.mark.parametrize("wait, thread", [(-1, r"\d+"), (1, r"(1[6-9]|2\d|3[01])")], ids=["no_wait", "wait_1"])
@pytest.mark.parametrize("order", ORDERS)
def test_ldmatrix_of_copies_in_flight_fails(wait, thread, order):
    """Without a wait every row is in flight; wait_group 1 lands the first group (rows 0-15) but not the second
    (rows 16-31, copied by threads 16-31), which ldmatrix then reads."""
    d = device(order)
    with pytest.raises(KernelFailure, match=r"ldmatrix read of shared memory at 0x[0-9a-f]+ that a cp.async of "
                       rf"thread {thread} \(at \S*async_copy.cu:\d+\) still has in flight"):
        d.launch(SOURCE, "async_copy_ldmatrix", 1, 32, [numpy.zeros(256, numpy.uint16), d.empty((32, 4),
                                                        numpy.uint32), i32(wait)])


# ---------------------------------------------------------------------------------------------------------
# Dynamic shared memory ends at the launch's size


def test_copies_into_dynamic_shared_memory_within_the_launch():
    rng = numpy.random.default_rng(3)
    data = rng.integers(0, 255, (32, 16), dtype=numpy.uint8)
    d = device()
    out = d.empty((32, 16), numpy.uint8)
    d.launch(SOURCE, "async_copy_dynamic", 1, 32, [data, out, i32(0)], shared_mem=32 * 16)
    numpy.testing.assert_array_equal(out, data)


def test_a_copy_past_the_launchs_dynamic_shared_memory_fails():
    """Rows 0-30 of 31 x 16 bytes fit; thread 31's row lies past them, outside the block's shared memory on a GPU."""
    d = device()
    with pytest.raises(KernelFailure, match=r"thread \(31,0,0\): cp.async to 0x[0-9a-f]+, past the dynamic shared "
                       r"memory the launch asked for .* at \S*async_copy.cu:\d+"):
        d.launch(SOURCE, "async_copy_dynamic", 1, 32, [numpy.zeros((32, 16), numpy.uint8),
                                                       d.empty((32, 16), numpy.uint8), i32(0)], shared_mem=31 * 16)


@pytest.mark.parametrize("order", ORDERS)
def test_a_load_past_the_launchs_dynamic_shared_memory_fails(order):
    """Each thread reads the row after its own: thread 31 reads byte 512 of a launch of 512 bytes, outside the
    block's shared memory on a GPU (an illegal address) though the emulator's buffer goes on.  The plain build of a
    file that uses cp.async checks every shared access against the launch's size (the ASan build poisons the rest
    instead: tests/test_emulator.py's test_out_of_bounds_access_fails_under_asan); 16 more bytes make it fit."""
    d = device(order)
    data = numpy.zeros((32, 16), numpy.uint8)
    with pytest.raises(KernelFailure, match=r"thread \(31,0,0\): shared load of 1 bytes at byte 512 of the dynamic "
                       r"shared memory, past the 512 bytes the launch asked for \(a GPU faults: illegal address\) "
                       r"at async_copy.cu:\d+"):
        d.launch(SOURCE, "async_copy_dynamic", 1, 32, [data, d.empty((32, 16), numpy.uint8), i32(16)],
                 shared_mem=32 * 16)
    d.launch(SOURCE, "async_copy_dynamic", 1, 32, [data, d.empty((32, 16), numpy.uint8), i32(16)],
             shared_mem=33 * 16)
